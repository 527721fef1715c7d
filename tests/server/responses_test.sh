#!/usr/bin/env bash
# usage: responses_test.sh DUET_BINARY WORK_DIR
# The Responses API (/v1/responses): the official openai client's calls (responses_client_test.mjs),
# the wire format of a stream read with curl, reasoning items with --reasoning-parser, the stored
# responses' routes and their refusals, a background stream read again from a sequence number, and
# a server that keeps none (--responses-store-mib 0).
# Conversations (/v1/conversations) and item references (conversations_client_test.mjs).
# Also /v1/embeddings through the openai client (embeddings_client_test.mjs).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

require_npm openai ajv

# A context long enough for a background run that is still going when it is cancelled.
"$duet" make-model --preset tiny --type q8_0 --seed 5 --ctx 32768 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf
start_server main --chat-template deepseek-v3 --tool-call-parser deepseek_v3 --enable-auto-tool-choice || exit 1

if DUET_URL="http://127.0.0.1:$PORT/v1" DUET_MODEL=tiny.gguf NODE_PATH="$here/node_modules" \
   node "$here/responses_client_test.mjs" > node.txt 2>&1; then
  pass "openai npm client ($(grep -c '^ok' node.txt) checks)"
else
  failed "openai npm client"; cat node.txt
fi

if DUET_URL="http://127.0.0.1:$PORT/v1" DUET_MODEL=tiny.gguf NODE_PATH="$here/node_modules" \
   node "$here/conversations_client_test.mjs" > conversations.txt 2>&1; then
  pass "conversations and item references through the openai npm client ($(grep -c '^ok' conversations.txt) checks)"
else
  failed "conversations through the openai npm client"; cat conversations.txt
fi
# The client deleted its conversation; one more is kept, and /metrics counts it.
request POST /v1/conversations '{"items": [{"role": "user", "content": "kept"}]}'
curl -s "http://127.0.0.1:$PORT/metrics" > conv_metrics.txt
if grep -qE '^duet:conversations\{model_name="tiny.gguf"\} 1$' conv_metrics.txt &&
   grep -qE '^duet:conversations_bytes\{model_name="tiny.gguf"\} [1-9]' conv_metrics.txt; then
  pass "duet:conversations and duet:conversations_bytes in /metrics"
else
  failed "conversation metrics: $(grep conversations conv_metrics.txt)"
fi

# The stream on the wire: each event's `event:` line names its data's type, and there is no
# "data: [DONE]" (that is the chat API's end).
curl -sN "http://127.0.0.1:$PORT/v1/responses" -H 'Content-Type: application/json' \
  -d '{"input": "Hello", "max_output_tokens": 4, "temperature": 0, "stream": true}' > stream.txt
if $py - stream.txt <<'PY'
import json, sys
blocks = [b for b in open(sys.argv[1]).read().split("\n\n") if b.strip()]
assert len(blocks) >= 8, len(blocks)
for b in blocks:
    lines = b.split("\n")
    assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), b
    data = json.loads(lines[1][6:])
    assert data["type"] == lines[0][7:], b
assert json.loads(blocks[-1].split("\n")[1][6:])["response"]["usage"]["output_tokens"] == 4
PY
then pass "stream wire format"; else failed "stream wire format: $(head -c 400 stream.txt)"; fi

# The stored responses' routes: methods and unknown ids are refused with OpenAI's error shape.
expect_error "GET an unknown response" 404 invalid_request_error response_id GET /v1/responses/resp_nothing
expect_error "POST to a response" 405 invalid_request_error - POST /v1/responses/resp_nothing '{}'
expect_error "an unknown action" 404 invalid_request_error - GET /v1/responses/resp_nothing/other
expect_error "PUT /v1/responses" 405 invalid_request_error - PUT /v1/responses '{}'
expect_error "GET /v1/conversations" 405 invalid_request_error - GET /v1/conversations
expect_error "an unknown conversation" 404 invalid_request_error conversation_id GET /v1/conversations/conv_nothing
expect_error "a conversation's unknown route" 404 invalid_request_error - GET /v1/conversations/conv_nothing/other
expect_error "PUT to a conversation's items" 405 invalid_request_error - PUT /v1/conversations/conv_nothing/items '{}'
request POST /v1/responses '{"input": "Hi", "max_output_tokens": 2}'
id=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
expect_error "input items: a bad limit" 400 invalid_request_error limit GET "/v1/responses/$id/input_items?limit=500"
expect_error "input items: a bad order" 400 invalid_request_error order GET "/v1/responses/$id/input_items?order=up"
request GET "/v1/responses/$id/input_items?order=asc&limit=1"
if [ "$STATUS" = 200 ] && $py - resp.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["object"] == "list" and len(r["data"]) == 1 and r["has_more"] is False, r
assert r["data"][0]["content"] == [{"type": "input_text", "text": "Hi"}], r
PY
then pass "input items"; else failed "input items: $STATUS $(head -c 300 resp.json)"; fi
request DELETE "/v1/responses/$id"
[ "$STATUS" = 200 ] && grep -q '"deleted":true' resp.json && pass "DELETE" || failed "DELETE: $STATUS $(cat resp.json)"
request GET "/v1/responses/$id"
[ "$STATUS" = 404 ] && pass "deleted is gone" || failed "deleted response: $STATUS"

# /v1/embeddings on the same server (their values against the reference: tests/reference).
if DUET_URL="http://127.0.0.1:$PORT/v1" DUET_MODEL=tiny.gguf DUET_HIDDEN=128 NODE_PATH="$here/node_modules" \
   node "$here/embeddings_client_test.mjs" > embeddings.txt 2>&1; then
  pass "embeddings with the openai npm client ($(grep -c '^ok' embeddings.txt) checks)"
else
  failed "embeddings with the openai npm client"; cat embeddings.txt
fi

# truncation "auto": a conversation past the context loses its oldest turns instead of failing.
long=$($py -c "print(' '.join(['word'] * 9000))")
request POST /v1/responses "{\"input\": \"$long\", \"max_output_tokens\": 2, \"temperature\": 0}"
id=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
request POST /v1/responses "{\"input\": \"$long\", \"previous_response_id\": \"$id\", \"max_output_tokens\": 2}"
[ "$STATUS" = 400 ] && grep -q context_length_exceeded resp.json && pass "too long without truncation: 400" \
  || failed "too long without truncation: $STATUS $(head -c 300 resp.json)"
request POST /v1/responses "{\"input\": \"$long\", \"previous_response_id\": \"$id\", \"max_output_tokens\": 2, \"truncation\": \"auto\"}"
if [ "$STATUS" = 200 ] && $py - resp.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["truncation"] == "auto" and r["usage"]["output_tokens"] == 2, r
assert 18000 <= r["usage"]["input_tokens"] < 27000, r["usage"]  # the first turn went, this one stayed
PY
then pass "truncation auto drops the oldest turn"; else failed "truncation auto: $STATUS $(head -c 300 resp.json)"; fi

# A background run with stream, read again (GET ?stream=true&starting_after=N) while it runs: the
# events after N, the same as the first stream's, to its end.
curl -sN "http://127.0.0.1:$PORT/v1/responses" -H 'Content-Type: application/json' \
  -d '{"input": "hi", "background": true, "stream": true, "max_output_tokens": 3000, "temperature": 0}' > first.sse &
first_pid=$!
rid=""
for _ in $(seq 1 100); do
  rid=$(grep -o '"id":"resp_[0-9a-f]*"' first.sse 2>/dev/null | head -1 | cut -d'"' -f4)
  [ -n "$rid" ] && break
  sleep 0.02
done
curl -sN "http://127.0.0.1:$PORT/v1/responses/$rid?stream=true&starting_after=5" > again.sse
wait "$first_pid"
curl -sN "http://127.0.0.1:$PORT/v1/responses/$rid?stream=true" > all.sse
if [ -n "$rid" ] && $py - <<'PY'
import json
def events(p):
    return [e for e in open(p).read().split("\n\n") if e.strip()]
first, again, everything = events("first.sse"), events("again.sse"), events("all.sse")
numbers = [json.loads(e.split("data: ", 1)[1])["sequence_number"] for e in first]
assert numbers == list(range(len(first))), numbers[:10]
assert len(first) > 100, len(first)
assert again == first[6:], (len(again), len(first))
assert everything == first, (len(everything), len(first))
assert first[-1].split("\n")[0] in ("event: response.completed", "event: response.incomplete"), first[-1][:80]
PY
then pass "a background stream read again from sequence number 5, and whole after its end"
else failed "background stream replay ($rid): $(wc -l < first.sse) / $(wc -l < again.sse) lines"; fi
request POST /v1/responses '{"input": "hi", "max_output_tokens": 2}'
plain=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
expect_error "stream=true of a response that kept no events" 400 invalid_request_error stream \
  GET "/v1/responses/$plain?stream=true"
expect_error "a starting_after that is not a number" 400 invalid_request_error starting_after \
  GET "/v1/responses/$rid?stream=true&starting_after=x"
kill "$PID"

# Reasoning (--reasoning-parser deepseek_r1): the thinking is a reasoning item before the message,
# streamed as reasoning_text events. A regex makes the model think, then answer.
cat > plain.jinja <<'JINJA'
{% for m in messages %}{{ m.role }}: {{ m.content }}
{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}
JINJA
start_server think --reasoning-parser deepseek_r1 --chat-template plain.jinja || exit 1
body='{"input": "Why?", "max_output_tokens": 60, "temperature": 1, "seed": 4, "guided_regex": "<think>[a-z]{4,9}</think>[a-z]{3,8}"}'
request POST /v1/responses "$body"
cp resp.json think.json
curl -sN "http://127.0.0.1:$PORT/v1/responses" -H 'Content-Type: application/json' \
  -d "${body%\}}, \"stream\": true}" > think_stream.txt
if $py - think.json think_stream.txt <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "completed", r
kinds = [i["type"] for i in r["output"]]
assert kinds == ["reasoning", "message"], kinds
thought = r["output"][0]["content"][0]["text"]
answer = r["output"][1]["content"][0]["text"]
assert re.fullmatch("[a-z]{4,9}", thought) and re.fullmatch("[a-z]{3,8}", answer), (thought, answer)
assert 0 < r["usage"]["output_tokens_details"]["reasoning_tokens"] < r["usage"]["output_tokens"], r["usage"]
events = [json.loads(b.split("\n")[1][6:]) for b in open(sys.argv[2]).read().split("\n\n") if b.strip()]
thinking = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
said = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
assert (thinking, said) == (thought, answer), (thinking, said)
done = [e for e in events if e["type"] == "response.reasoning_text.done"]
assert len(done) == 1 and done[0]["text"] == thought, done
PY
then pass "reasoning item"; else failed "reasoning item: $(head -c 600 think.json)"; fi
kill "$PID"

# A store of 1 MiB: the least recently used responses go once it is full; /metrics counts them.
start_server small --responses-store-mib 1 || exit 1
big=$($py -c "print(' '.join(['word'] * 12000))")  # 60 KB, kept twice (input and conversation)
ids=()
for i in 1 2 3 4 5 6 7 8 9 10; do
  # The same long text each time (the prefix cache makes it cheap), the number last.
  request POST /v1/responses "{\"input\": \"$big $i\", \"max_output_tokens\": 1}"
  ids+=("$($py -c 'import json; print(json.load(open("resp.json"))["id"])')")
  request GET "/v1/responses/${ids[0]}"  # the first, used after each: it stays
done
kept=""
for id in "${ids[@]}"; do request GET "/v1/responses/$id"; kept+="$STATUS "; done
curl -s "http://127.0.0.1:$PORT/metrics" > small_metrics.txt
count=$(grep -E '^duet:stored_responses\{' small_metrics.txt | awk '{print $2}')
bytes=$(grep -E '^duet:stored_responses_bytes\{' small_metrics.txt | awk '{print $2}')
if [[ "$kept" =~ ^200\ 404\ 404\ .*200\ 200\ $ ]] && [ "${count%.*}" -ge 3 ] && [ "${count%.*}" -le 8 ] &&
   $py -c "import sys; assert 0 < float('$bytes') <= 1048576" 2>/dev/null; then
  pass "the store keeps what fits, least recently used out first ($kept; $count kept, $bytes bytes)"
else
  failed "store budget: $kept; count $count, bytes $bytes"
fi
kill "$PID"

# A server that keeps no responses: they are answered, and what needs them is refused clearly.
start_server nostore --responses-store-mib 0 || exit 1
request POST /v1/responses '{"input": "Hi", "max_output_tokens": 2}'
id=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
[ "$STATUS" = 200 ] && pass "answered without a store" || failed "no store: $STATUS $(cat resp.json)"
request GET "/v1/responses/$id"
[ "$STATUS" = 404 ] && grep -q 'responses-store-mib 0' resp.json && pass "GET says the server keeps none" \
  || failed "GET without a store: $STATUS $(cat resp.json)"
expect_error "previous_response_id without a store" 400 invalid_request_error previous_response_id \
  POST /v1/responses "{\"input\": \"x\", \"previous_response_id\": \"$id\"}"
expect_error "background without a store" 400 invalid_request_error background \
  POST /v1/responses '{"input": "x", "background": true}'
expect_error "conversation without a store" 400 invalid_request_error conversation \
  POST /v1/responses '{"input": "x", "conversation": "conv_x"}'
expect_error "no conversations without a store" 400 invalid_request_error - POST /v1/conversations '{}'
kill "$PID"
if "$duet" serve --model tiny.gguf --port 0 --responses-store-mib -1 > bad.out 2> bad.err; then
  failed "a negative --responses-store-mib accepted"
else
  grep -q -- "--responses-store-mib" bad.err && pass "a negative store size is refused" || failed "store size message: $(cat bad.err)"
fi

echo "$failures failures"
[ "$failures" -eq 0 ]
