#!/usr/bin/env bash
# The web console: served at / (and not with --no-ui), its files from the binary, then a real
# browser session (console_test.mjs: Debian's Chromium driven by playwright-core). Screenshots go
# to WORK_DIR (console-chat.png, console-metrics.png).
# usage: console_test.sh DUET_BINARY WORK_DIR SOURCE_DIR
set -uo pipefail
duet="$1"
work="$2"
src="$3"
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$src/tests/server/lib.sh"
if [ ! -d "$src/tests/console/node_modules/playwright-core" ]; then
  echo "FAIL: playwright-core is not installed in tests/console (run scripts/install-deps.sh)"; exit 1
fi
if [ ! -x /usr/bin/chromium ]; then echo "FAIL: /usr/bin/chromium is missing (run scripts/install-deps.sh)"; exit 1; fi

# A model slow enough to press stop while it streams, with room for a long reply.
"$duet" make-model --preset tiny --type q8_0 --seed 6 --n-embd 512 --n-ff 1536 --n-layer 6 --n-head 8 --n-head-kv 8 \
  --ctx 4096 -o console.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=console.gguf

start_server noui --no-ui || exit 1
request GET /
[ "$STATUS" = 404 ] && pass "--no-ui: / is 404" || failed "--no-ui: / answered $STATUS"
request GET /console/app.js
[ "$STATUS" = 404 ] && pass "--no-ui: no console files" || failed "--no-ui: /console/app.js answered $STATUS"
kill -TERM "$PID"; wait "$PID"

start_server console || exit 1
for f in / /console/app.js /console/app.css; do
  ctype=$(curl -s -o body -w '%{http_code} %{content_type}' "http://127.0.0.1:$PORT$f")
  case "$f" in /) want=text/html;; *.js) want=text/javascript;; *.css) want=text/css;; esac
  [[ "$ctype" == "200 $want"* ]] && pass "GET $f: $ctype" || failed "GET $f: $ctype"
done
cmp -s body "$src/src/duet/server/console/app.css" && pass "the served file is the source file" || failed "app.css differs"
request GET /console/missing.js
[ "$STATUS" = 404 ] && pass "an unknown console file is 404" || failed "unknown console file: $STATUS"
request POST / '{}'
[ "$STATUS" = 405 ] && pass "POST / is 405" || failed "POST /: $STATUS"

(cd "$src/tests/console" && node console_test.mjs "http://127.0.0.1:$PORT" "$work") && pass "browser session" \
  || failed "browser session"
kill -TERM "$PID"; wait "$PID"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
