#!/usr/bin/env bash
# The web console: served at / (and not with --no-ui), its files from the binary, then a real
# browser session (console_test.mjs: Debian's Chromium driven by playwright-core). Screenshots go
# to WORK_DIR (console-chat.png, console-metrics.png). Then CORS: the console's page calls two other
# servers from the browser (cors_test.mjs), one that allows its origin and one that does not.
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

# CORS: the console server's page calls a server that allows its origin and one that does not,
# in the browser (cors_test.mjs); curl asks the preflights the browser does not show.
page_pid=$PID page_url="http://127.0.0.1:$PORT"
start_server closed --allowed-origins '["http://other.example"]' || exit 1
closed_pid=$PID closed_url="http://127.0.0.1:$PORT"
start_server open --api-key cors-key --allowed-origins "[\"$page_url\"]" --allowed-methods POST,GET \
  --allowed-headers '["Authorization", "Content-Type"]' || exit 1
(cd "$src/tests/console" && node cors_test.mjs "$page_url" "http://127.0.0.1:$PORT" "$closed_url" cors-key) \
  && pass "cross-origin calls in the browser" || failed "cross-origin calls in the browser"
preflight() {  # preflight ORIGIN METHOD HEADERS: prints the status and the allowed origin
  curl -s -o preflight.txt -D preflight.hdr -w "%{http_code}" -X OPTIONS "http://127.0.0.1:$PORT/v1/completions" \
    -H "Origin: $1" -H "Access-Control-Request-Method: $2" -H "Access-Control-Request-Headers: $3"
  echo " $(grep -i '^access-control-allow-origin:' preflight.hdr | tr -d '\r' | cut -d' ' -f2)"
}
[ "$(preflight "$page_url" POST authorization)" = "200 $page_url" ] && pass "preflight of the allowed origin: 200" \
  || failed "allowed preflight: $(cat preflight.hdr preflight.txt)"
[ "$(preflight http://evil.example POST authorization)" = "400 " ] && grep -q "Disallowed CORS origin" preflight.txt \
  && pass "preflight of another origin: 400, no Allow-Origin" || failed "other origin's preflight: $(cat preflight.txt)"
[ "$(preflight "$page_url" DELETE authorization)" = "400 $page_url" ] && grep -q "method" preflight.txt \
  && pass "preflight of a method not allowed: 400" || failed "DELETE preflight: $(cat preflight.txt)"
[ "$(preflight "$page_url" POST x-secret)" = "400 $page_url" ] && grep -q "headers" preflight.txt \
  && pass "preflight of a header not allowed: 400" || failed "x-secret preflight: $(cat preflight.txt)"
status=$(curl -s -o models.json -D models.hdr -w "%{http_code}" "http://127.0.0.1:$PORT/v1/models" \
  -H "Origin: http://evil.example" -H "Authorization: Bearer cors-key")
[ "$status" = 200 ] && ! grep -qi "^access-control" models.hdr \
  && pass "a request of another origin is served without CORS headers" || failed "other origin's GET: $(cat models.hdr)"
kill -TERM "$PID" "$closed_pid" "$page_pid"; wait "$PID" "$closed_pid" "$page_pid"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
