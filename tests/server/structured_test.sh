#!/usr/bin/env bash
# usage: structured_test.sh DUET_BINARY WORK_DIR SHARED_TESTDATA
# Tool calls (DeepSeek V3 markup, V3.1 markup with the published V3.1 template when the shared
# test data is there, V3.2's DSML with its built-in encoding, and without a parser) and structured output, through the official openai
# client, validated with ajv.
set -uo pipefail
shared="${3:-}"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

require_npm openai ajv ajv-formats

# A tiny model with a context long enough for tool descriptions spelled out byte by byte.
"$duet" make-model --preset tiny --type q8_0 --seed 5 --ctx 4096 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf

run_node() {  # run_node NAME SCRIPT [ENV...]
  local name="$1" script="$2"; shift 2
  if env "$@" DUET_URL="http://127.0.0.1:$PORT/v1" DUET_MODEL=tiny.gguf NODE_PATH="$here/node_modules" \
     node "$here/$script" > "$name.txt" 2>&1; then
    pass "$name ($(grep -c '^ok' "$name.txt") checks)"
  else
    failed "$name"; cat "$name.txt"
  fi
}

start_server v3 --chat-template deepseek-v3 --tool-call-parser deepseek_v3 \
  --enable-auto-tool-choice || exit 1
run_node "structured output" structured_client_test.mjs
run_node "tool calls (deepseek_v3)" tools_client_test.mjs DUET_PARSER=deepseek_v3
kill "$PID"

start_server plain --chat-template deepseek-v3 || exit 1
run_node "tool calls without a parser" tools_client_test.mjs DUET_PARSER=none
kill "$PID"

# DeepSeek-V3.2: its encoding (built in) and DSML markup.
start_server v32 --chat-template deepseek-v32 --tool-call-parser deepseek_v32 \
  --enable-auto-tool-choice || exit 1
run_node "tool calls (deepseek_v32, DSML)" tools_client_test.mjs DUET_PARSER=deepseek_v32
kill "$PID"

template="$shared/chat-templates/deepseek-v3.1.jinja"
if [ -f "$template" ]; then
  start_server v31 --chat-template "$template" --tool-call-parser deepseek_v31 \
    --enable-auto-tool-choice || exit 1
  run_node "tool calls (deepseek_v31, published V3.1 template)" tools_client_test.mjs DUET_PARSER=deepseek_v31
  kill "$PID"
else
  echo "note: $template is absent; the V3.1 template run is left out"
fi

# Bad server flags are refused at start.
if "$duet" serve --model tiny.gguf --port 0 --tool-call-parser hermes > bad.out 2> bad.err; then
  failed "unknown --tool-call-parser accepted"
else
  grep -q "deepseek_v31" bad.err && pass "unknown --tool-call-parser refused" || failed "unknown parser message: $(cat bad.err)"
fi
if "$duet" serve --model tiny.gguf --port 0 --enable-auto-tool-choice > bad.out 2> bad.err; then
  failed "--enable-auto-tool-choice without a parser accepted"
else
  pass "--enable-auto-tool-choice needs a parser"
fi

echo "$failures failures"
[ "$failures" -eq 0 ]
