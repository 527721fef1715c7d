#!/usr/bin/env bash
# usage: messages_test.sh DUET_BINARY WORK_DIR
# Anthropic's Messages API (/v1/messages): the official anthropic client's calls against the chat
# API's answers (messages_client_test.mjs), its Message Batches (message_batches_client_test.mjs),
# the stream's wire format read with curl, thinking blocks with --reasoning-parser, and --api-key
# through Anthropic's x-api-key header.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

require_npm @anthropic-ai/sdk openai ajv

"$duet" make-model --preset tiny --type q8_0 --seed 5 --ctx 4096 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf
start_server main --served-model-name tiny --chat-template deepseek-v3 --tool-call-parser deepseek_v3 \
  --enable-auto-tool-choice || exit 1

if DUET_BASE="http://127.0.0.1:$PORT" DUET_MODEL=tiny NODE_PATH="$here/node_modules" \
   node "$here/messages_client_test.mjs" > node.txt 2>&1; then
  pass "anthropic npm client ($(tail -1 node.txt))"
else
  failed "anthropic npm client"; cat node.txt
fi
if DUET_BASE="http://127.0.0.1:$PORT" DUET_MODEL=tiny NODE_PATH="$here/node_modules" \
   node "$here/message_batches_client_test.mjs" > batches-node.txt 2>&1; then
  pass "anthropic npm client, message batches ($(tail -1 batches-node.txt))"
else
  failed "anthropic npm client, message batches"; cat batches-node.txt
fi

# The stream on the wire: each event's `event:` line names its data's type; no "data: [DONE]".
curl -sN "http://127.0.0.1:$PORT/v1/messages" -H 'Content-Type: application/json' \
  -d '{"model": "tiny", "max_tokens": 4, "temperature": 0, "stream": true, "messages": [{"role": "user", "content": "Hi"}]}' \
  > stream.txt
if $py - stream.txt <<'PY'
import json, sys
blocks = [b for b in open(sys.argv[1]).read().split("\n\n") if b.strip()]
types = []
for b in blocks:
    event, data = b.split("\n")
    assert event.startswith("event: ") and data.startswith("data: "), b
    assert json.loads(data[6:])["type"] == event[7:], b
    types.append(event[7:])
assert types[:3] == ["message_start", "ping", "content_block_start"], types
assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"], types
assert "[DONE]" not in open(sys.argv[1]).read()
PY
then pass "stream wire format"; else failed "stream wire format: $(head -c 400 stream.txt)"; fi
kill "$PID"; wait "$PID" 2>/dev/null

# Thinking (--reasoning-parser deepseek_r1): a thinking block before the text, streamed as
# thinking_delta events. A regex makes the model think, then answer.
cat > plain.jinja <<'JINJA'
{% for m in messages %}{{ m.role }}: {{ m.content }}
{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}
JINJA
start_server think --served-model-name tiny --reasoning-parser deepseek_r1 --chat-template plain.jinja || exit 1
body='{"model": "tiny", "max_tokens": 60, "temperature": 1, "seed": 4, "guided_regex": "<think>[a-z]{4,9}</think>[a-z]{3,8}", "messages": [{"role": "user", "content": "Why?"}]}'
request POST /v1/messages "$body"
cp resp.json think.json
curl -sN "http://127.0.0.1:$PORT/v1/messages" -H 'Content-Type: application/json' -d "${body%\}}, \"stream\": true}" > think.txt
if $py - think.json think.txt <<'PY'
import json, re, sys
m = json.load(open(sys.argv[1]))
assert [b["type"] for b in m["content"]] == ["thinking", "text"], m
thought, answer = m["content"][0]["thinking"], m["content"][1]["text"]
assert re.fullmatch("[a-z]{4,9}", thought) and re.fullmatch("[a-z]{3,8}", answer), (thought, answer)
assert m["stop_reason"] == "end_turn", m
events = [json.loads(b.split("\n")[1][6:]) for b in open(sys.argv[2]).read().split("\n\n") if b.strip()]
deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
assert "".join(d.get("thinking", "") for d in deltas) == thought
assert "".join(d.get("text", "") for d in deltas) == answer
starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
assert starts == ["thinking", "text"], starts
PY
then pass "thinking block, then text (streamed as thinking_delta and text_delta)"
else failed "thinking: $(head -c 400 think.json)"; fi
kill "$PID"; wait "$PID" 2>/dev/null

# --api-key: Anthropic's clients send x-api-key; errors are in Anthropic's shape.
start_server keyed --served-model-name tiny --api-key sekret || exit 1
msg='{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}'
request POST /v1/messages "$msg" -H 'x-api-key: sekret'
ok_status=$STATUS
request POST /v1/messages "$msg" -H 'x-api-key: wrong'
if [ "$ok_status" = 200 ] && [ "$STATUS" = 401 ] &&
   $py -c 'import json; e = json.load(open("resp.json")); assert e["type"] == "error" and e["error"]["type"] == "authentication_error", e'; then
  pass "x-api-key opens /v1/messages; a wrong key gets Anthropic's authentication_error"
else
  failed "x-api-key: $ok_status $STATUS $(head -c 300 resp.json)"
fi
kill "$PID"; wait "$PID" 2>/dev/null

echo "$failures failures"
[ "$failures" -eq 0 ]
