#!/usr/bin/env bash
# usage: server_test.sh DUET_BINARY WORK_DIR
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

require_npm openai

"$duet" make-model --preset tiny --type q8_0 --seed 5 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf

start_server main --api-key secret-key --max-body-bytes 65536 || exit 1
AUTH=(-H "Authorization: Bearer secret-key")
C=/v1/completions
CH=/v1/chat/completions

# --- the basics -------------------------------------------------------------------------------
request GET /health ""
[ "$STATUS" = 200 ] && pass "health 200" || failed "health ($STATUS)"
request GET /ping ""
[ "$STATUS" = 200 ] && grep -q '"status": *"ok"' resp.json && pass "GET /ping 200" || failed "GET /ping ($STATUS)"
request POST /ping '{}'
[ "$STATUS" = 200 ] && pass "POST /ping 200" || failed "POST /ping ($STATUS)"
request GET /version ""
[ "$STATUS" = 200 ] && grep -q '"version"' resp.json && pass "version" || failed "version ($STATUS)"
request GET /v1/models "" "${AUTH[@]}"
if [ "$STATUS" = 200 ] && $py -c "import json;d=json.load(open('resp.json'));assert d['object']=='list' and d['data'][0]['id']=='tiny.gguf'"; then pass "models"; else failed "models ($STATUS)"; fi
request POST $C '{"model": "tiny.gguf", "prompt": "Hello", "max_tokens": 5, "temperature": 0, "ignore_eos": true}' "${AUTH[@]}" -D headers.txt
if [ "$STATUS" = 200 ] && $py - resp.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["object"] == "text_completion" and d["id"].startswith("cmpl-"), d
c = d["choices"][0]
assert c["index"] == 0 and c["finish_reason"] == "length" and isinstance(c["text"], str), c
assert d["usage"]["completion_tokens"] == 5 and d["usage"]["total_tokens"] == d["usage"]["prompt_tokens"] + 5, d
PY
then pass "completion"; else failed "completion ($STATUS: $(head -c 300 resp.json))"; fi
grep -qi "^x-request-id: " headers.txt && pass "X-Request-Id header" || failed "X-Request-Id header"
request POST /tokenize '{"prompt": "Hello world"}' "${AUTH[@]}"
[ "$STATUS" = 200 ] && $py -c "import json;d=json.load(open('resp.json'));assert d['count']==len(d['tokens'])>0" && pass "tokenize" || failed "tokenize ($STATUS)"
ids=$($py -c "import json;print(json.load(open('resp.json'))['tokens'][1:])")
request POST /detokenize "{\"tokens\": $ids}" "${AUTH[@]}"
[ "$STATUS" = 200 ] && grep -q '"prompt": *"Hello world"' resp.json && pass "detokenize" || failed "detokenize ($STATUS $(cat resp.json))"

# streaming with curl: SSE chunks ending in [DONE], usage chunk when asked
curl -s -N "${AUTH[@]}" -H 'Content-Type: application/json' http://127.0.0.1:$PORT$CH \
  -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "stream": true, "temperature": 0, "ignore_eos": true, "stream_options": {"include_usage": true}}' > stream.txt
if $py - stream.txt <<'PY'
import json, sys
events = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert events[-1] == "[DONE]", events[-3:]
chunks = [json.loads(e) for e in events[:-1]]
assert all(c["object"] == "chat.completion.chunk" for c in chunks)
assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length", finals
usage = chunks[-1]
assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6, usage
# One chunk per generated token after the role chunk (as vLLM streams), text or not.
token_chunks = [c for c in chunks[1:] if c["choices"]]
assert len(token_chunks) == 6, len(token_chunks)
PY
then pass "chat stream with curl"; else failed "chat stream with curl: $(head -c 400 stream.txt)"; fi

# --- the official openai client ---------------------------------------------------------------
if DUET_URL="http://127.0.0.1:$PORT/v1" DUET_KEY=secret-key DUET_MODEL=tiny.gguf NODE_PATH="$here/node_modules" \
   node "$here/openai_client_test.mjs" > node.txt 2>&1; then
  pass "openai npm client ($(grep -c '^ok' node.txt) checks)"
else
  failed "openai npm client"; cat node.txt
fi

# --- malformed requests: each gets its status and error type; nothing else is hurt -----------
long_prompt=$($py -c "print(' '.join(['word'] * 400))")
expect_error "invalid JSON" 400 invalid_request_error - POST $C '{"prompt": ' "${AUTH[@]}"
expect_error "body not an object" 400 invalid_request_error - POST $C '[1, 2]' "${AUTH[@]}"
expect_error "no prompt" 400 invalid_request_error prompt POST $C '{"max_tokens": 3}' "${AUTH[@]}"
expect_error "prompt is a number" 400 invalid_request_error prompt POST $C '{"prompt": 5}' "${AUTH[@]}"
expect_error "prompt token out of range" 400 invalid_request_error prompt POST $C '{"prompt": [1, 99999999]}' "${AUTH[@]}"
expect_error "max_tokens not a number" 400 invalid_request_error max_tokens POST $C '{"prompt": "x", "max_tokens": "ten"}' "${AUTH[@]}"
expect_error "max_tokens zero" 400 invalid_request_error max_tokens POST $C '{"prompt": "x", "max_tokens": 0}' "${AUTH[@]}"
expect_error "max_tokens negative" 400 invalid_request_error max_tokens POST $C '{"prompt": "x", "max_tokens": -5}' "${AUTH[@]}"
expect_error "temperature negative" 400 invalid_request_error temperature POST $C '{"prompt": "x", "temperature": -1}' "${AUTH[@]}"
expect_error "temperature a string" 400 invalid_request_error temperature POST $C '{"prompt": "x", "temperature": "hot"}' "${AUTH[@]}"
expect_error "top_p above 1" 400 invalid_request_error top_p POST $C '{"prompt": "x", "top_p": 1.5}' "${AUTH[@]}"
expect_error "top_p zero" 400 invalid_request_error top_p POST $C '{"prompt": "x", "top_p": 0}' "${AUTH[@]}"
expect_error "top_k below -1" 400 invalid_request_error top_k POST $C '{"prompt": "x", "top_k": -2}' "${AUTH[@]}"
expect_error "min_p above 1" 400 invalid_request_error min_p POST $C '{"prompt": "x", "min_p": 2}' "${AUTH[@]}"
expect_error "n zero" 400 invalid_request_error n POST $C '{"prompt": "x", "n": 0}' "${AUTH[@]}"
expect_error "presence_penalty too big" 400 invalid_request_error presence_penalty POST $C '{"prompt": "x", "presence_penalty": 5}' "${AUTH[@]}"
expect_error "frequency_penalty too small" 400 invalid_request_error frequency_penalty POST $C '{"prompt": "x", "frequency_penalty": -3}' "${AUTH[@]}"
expect_error "repetition_penalty zero" 400 invalid_request_error repetition_penalty POST $C '{"prompt": "x", "repetition_penalty": 0}' "${AUTH[@]}"
expect_error "logit_bias bad key" 400 invalid_request_error logit_bias POST $C '{"prompt": "x", "logit_bias": {"abc": 1}}' "${AUTH[@]}"
expect_error "logit_bias too big" 400 invalid_request_error logit_bias POST $C '{"prompt": "x", "logit_bias": {"5": 500}}' "${AUTH[@]}"
expect_error "stop not a string" 400 invalid_request_error stop POST $C '{"prompt": "x", "stop": 5}' "${AUTH[@]}"
expect_error "stop_token_ids not ids" 400 invalid_request_error stop_token_ids POST $C '{"prompt": "x", "stop_token_ids": ["a"]}' "${AUTH[@]}"
expect_error "logprobs too many" 400 invalid_request_error logprobs POST $C '{"prompt": "x", "logprobs": 50}' "${AUTH[@]}"
expect_error "seed not an integer" 400 invalid_request_error seed POST $C '{"prompt": "x", "seed": "x"}' "${AUTH[@]}"
expect_error "stream not a bool" 400 invalid_request_error stream POST $C '{"prompt": "x", "stream": "yes"}' "${AUTH[@]}"
expect_error "min_tokens above max_tokens" 400 invalid_request_error min_tokens POST $C '{"prompt": "x", "max_tokens": 2, "min_tokens": 5}' "${AUTH[@]}"
expect_error "unknown model" 404 invalid_request_error model POST $C '{"model": "nope", "prompt": "x"}' "${AUTH[@]}"
expect_error "prompt longer than the context" 400 invalid_request_error prompt POST $C "{\"prompt\": \"$long_prompt\"}" "${AUTH[@]}"
grep -q "maximum context length is 256 tokens" resp.json && grep -qE "prompt has [0-9]+ tokens" resp.json \
  && pass "context error names both numbers" || failed "context error names both numbers: $(cat resp.json)"
# truncate_prompt_tokens (vLLM's): the last k tokens of the prompt, so the same long one fits.
request POST $C "{\"prompt\": \"$long_prompt\", \"max_tokens\": 2, \"truncate_prompt_tokens\": 10}" "${AUTH[@]}"
[ "$STATUS" = 200 ] && $py -c "import json; u = json.load(open('resp.json'))['usage']; assert u['prompt_tokens'] == 10, u" \
  && pass "truncate_prompt_tokens keeps the last tokens" || failed "truncate_prompt_tokens: $STATUS $(head -c 300 resp.json)"
request POST $CH '{"messages": [{"role": "user", "content": "Hello there, how are you?"}], "max_tokens": 2, "truncate_prompt_tokens": 4}' "${AUTH[@]}"
[ "$STATUS" = 200 ] && $py -c "import json; u = json.load(open('resp.json'))['usage']; assert u['prompt_tokens'] == 4, u" \
  && pass "truncate_prompt_tokens on a chat" || failed "truncate_prompt_tokens on a chat: $STATUS $(head -c 300 resp.json)"
expect_error "truncate_prompt_tokens zero" 400 invalid_request_error truncate_prompt_tokens POST $C '{"prompt": "x", "truncate_prompt_tokens": 0}' "${AUTH[@]}"
expect_error "prompt plus max_tokens over the context" 400 invalid_request_error max_tokens POST $C '{"prompt": "x", "max_tokens": 1000}' "${AUTH[@]}"
expect_error "chat without messages" 400 invalid_request_error messages POST $CH '{"max_tokens": 3}' "${AUTH[@]}"
expect_error "chat with no messages" 400 invalid_request_error messages POST $CH '{"messages": []}' "${AUTH[@]}"
expect_error "chat with an unknown role" 400 invalid_request_error messages POST $CH '{"messages": [{"role": "wizard", "content": "x"}]}' "${AUTH[@]}"
expect_error "chat content a number" 400 invalid_request_error messages POST $CH '{"messages": [{"role": "user", "content": 5}]}' "${AUTH[@]}"
expect_error "chat logprobs as a number" 400 invalid_request_error logprobs POST $CH '{"messages": [{"role": "user", "content": "x"}], "logprobs": 3}' "${AUTH[@]}"
expect_error "unknown route" 404 invalid_request_error - GET /v1/nothing "" "${AUTH[@]}"
expect_error "wrong method" 405 invalid_request_error - POST /v1/models '{}' "${AUTH[@]}"
expect_error "no API key" 401 authentication_error - POST $C '{"prompt": "x"}'
expect_error "wrong API key" 401 authentication_error - POST $C '{"prompt": "x"}' -H "Authorization: Bearer wrong"
big=$($py -c "print('{\"prompt\": \"' + 'a' * 70000 + '\"}')")
expect_error "body over the limit" 413 invalid_request_error - POST $C "$big" "${AUTH[@]}"
printf 'GARBAGE\r\n\r\n' > garbage.txt
raw=$($py - "$PORT" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"NOT AN HTTP REQUEST\r\n\r\n")
print(s.recv(4096).decode(errors="replace").split("\r\n")[0])
PY
)
[[ "$raw" == "HTTP/1.1 400"* ]] && pass "malformed HTTP gets 400" || failed "malformed HTTP: $raw"
# "Expect: 100-continue" (curl sends it for bodies over 1 MiB): the go-ahead comes at once, and a
# body over the limit is refused before it is sent. The server ignored the header, so curl waited
# for its timeout (1 s by default; 5 s here) before sending the body.
expect_100() {  # expect_100 BODY_ARGS...: prints "STATUS SECONDS"
  curl -s -o resp.json -w "%{http_code} %{time_total}" --expect100-timeout 5 -X POST "http://127.0.0.1:$PORT$C" \
    -H "Expect: 100-continue" -H "Content-Type: application/json" "${AUTH[@]}" "$@"
}
got=$(expect_100 -d '{"prompt": "Hello", "max_tokens": 2}')
[ "${got% *}" = 200 ] && $py -c "import sys; sys.exit(0 if float('${got#* }') < 2 else 1)" \
  && pass "Expect: 100-continue is answered at once (${got#* } s)" || failed "Expect: 100-continue: $got"
head -c 2000000 /dev/zero | tr '\0' 'a' > huge_body.txt
got=$(expect_100 --data-binary @huge_body.txt)
[ "${got% *}" = 413 ] && $py -c "import sys; sys.exit(0 if float('${got#* }') < 2 else 1)" \
  && pass "a body over the limit is refused before it is sent (${got#* } s)" || failed "Expect with a large body: $got"
request GET /health ""
[ "$STATUS" = 200 ] && pass "still healthy after bad requests" || failed "health after bad requests ($STATUS)"
request POST $C '{"prompt": "Hello", "max_tokens": 3, "temperature": 0}' "${AUTH[@]}"
[ "$STATUS" = 200 ] && pass "a normal request still works" || failed "normal request after bad ones ($STATUS)"

metric() { curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^$1\{" | awk '{print $2}' | head -1; }

# --- /metrics parses as Prometheus text, with vLLM's names ------------------------------------
curl -s "http://127.0.0.1:$PORT/metrics" > metrics.txt
if $py - metrics.txt <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
need = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter", "vllm:request_success": "counter",
        "vllm:num_preemptions": "counter", "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
        "vllm:time_to_first_token_seconds": "histogram", "vllm:time_per_output_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram", "vllm:request_prompt_tokens": "histogram",
        "vllm:request_generation_tokens": "histogram", "vllm:iteration_tokens_total": "histogram",
        "duet:kv_cache_fragmentation_ratio": "gauge",
        "duet:device_utilization_ratio": "gauge", "duet:request_failure_ratio": "gauge",
        "duet:device_memory_used_bytes": "gauge", "duet:device_busy_seconds": "counter",
        "duet:device_step_seconds": "histogram", "duet:requests": "counter", "duet:request_failures": "counter"}
for name, kind in need.items():
    assert name in fams, f"missing {name}"
    assert fams[name].type == kind, f"{name} is {fams[name].type}"
    for s in fams[name].samples:
        assert s.labels.get("model_name") == "tiny.gguf", s
gen = [s.value for s in fams["vllm:generation_tokens"].samples][0]
assert gen >= 5, gen
ttft = fams["vllm:time_to_first_token_seconds"].samples
count = [s.value for s in ttft if s.name.endswith("_count")][0]
inf = [s.value for s in ttft if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"][0]
assert count == inf and count >= 3, (count, inf)
assert [s.value for s in fams["duet:request_failure_ratio"].samples][0] > 0
# One device, cpu: its memory by kind (the mapped weights, the KV pool), its busy time and steps.
mem = {s.labels["kind"]: s.value for s in fams["duet:device_memory_used_bytes"].samples if s.labels["device"] == "cpu"}
assert set(mem) == {"weights", "kv", "scratch"} and mem["weights"] > 100000 and mem["kv"] > 0, mem
util = [s.value for s in fams["duet:device_utilization_ratio"].samples if s.labels["device"] == "cpu"]
assert len(util) == 1 and 0.0 <= util[0] <= 1.0, util
assert [s.value for s in fams["duet:device_busy_seconds"].samples if s.labels["device"] == "cpu"][0] > 0
steps = [s.value for s in fams["duet:device_step_seconds"].samples if s.name.endswith("_count") and s.labels["device"] == "cpu"]
assert steps and steps[0] >= 5, steps
requests = [s.value for s in fams["duet:requests"].samples if s.name.endswith("_total")][0]
failures = [s.value for s in fams["duet:request_failures"].samples if s.name.endswith("_total")][0]
assert 0 < failures < requests, (failures, requests)
assert abs(failures / requests - [s.value for s in fams["duet:request_failure_ratio"].samples][0]) < 1e-9
PY
then pass "metrics parse with prometheus_client"; else failed "metrics format"; head -40 metrics.txt; fi

# --- SIGTERM drains: a request in flight finishes, then the server exits 0 --------------------
curl -s "${AUTH[@]}" -H 'Content-Type: application/json' http://127.0.0.1:$PORT$C \
  -d '{"prompt": "Hello", "max_tokens": 60, "ignore_eos": true, "temperature": 0}' -o drained.json -w '%{http_code}' > drained.status &
curl_pid=$!
sleep 0.3
kill -TERM "$PID"
wait "$curl_pid"
wait "$PID"; rc=$?
[ "$rc" = 0 ] && pass "SIGTERM exits 0" || failed "SIGTERM exit status $rc"
if [ "$(cat drained.status)" = 200 ] && $py -c "import json;d=json.load(open('drained.json'));assert d['usage']['completion_tokens']==60"; then
  pass "in-flight request finished during the drain"
else
  failed "drain: $(cat drained.status) $(head -c 300 drained.json)"
fi
grep -q "duet: stopped" main.err && pass "stopped message" || failed "no stopped message"

# --- an IPv6 address: served, and written in brackets in the URLs the server prints -----------
if $py -c "import socket; socket.socket(socket.AF_INET6).bind(('::1', 0))" 2> /dev/null; then
  "$duet" serve --model tiny.gguf --host ::1 --port 0 --kv-cache-memory 33554432 > v6.out 2> v6.err &
  v6_pid=$!; pids+=("$v6_pid")
  for _ in $(seq 1 100); do grep -q "duet: ready" v6.err && break; sleep 0.1; done
  v6_port=$(grep -oE "listening on http://\[::1\]:[0-9]+" v6.err | grep -oE "[0-9]+$")
  [ -n "$v6_port" ] && [ "$(curl -s -g -o /dev/null -w '%{http_code}' "http://[::1]:$v6_port/health")" = 200 ] \
    && pass "IPv6: listening on http://[::1]:$v6_port, /health 200" || failed "IPv6: $(head -3 v6.err)"
  kill -TERM "$v6_pid"; wait "$v6_pid"
else
  echo "note: this machine has no IPv6 loopback; the IPv6 listening check did not run"
fi

# --- --config: YAML with the flags' names; flags on the command line win; unknown keys refused --
cat > duet.yaml <<'YAML'
served_model_name: from-config
api_key: [k1, k2]
max_num_seqs: 8
port: 1
allowed_origins: [http://a.example]
YAML
start_server config --config duet.yaml || exit 1
request GET /v1/models "" -H "Authorization: Bearer k2"
grep -q '"id": *"from-config"' resp.json && pass "config file applied" || failed "config file: $STATUS $(cat resp.json)"
for origin in http://a.example:200 http://b.example:400; do
  got=$(curl -s -o /dev/null -w "%{http_code}" -X OPTIONS "http://127.0.0.1:$PORT/v1/models" -H "Origin: ${origin%:*}" \
    -H "Access-Control-Request-Method: GET")
  [ "$got" = "${origin##*:}" ] && pass "allowed_origins from the file: ${origin%:*} preflight $got" \
    || failed "allowed_origins: ${origin%:*} preflight $got"
done
kill -TERM "$PID"; wait "$PID"
echo "max_num_seq: 8" > bad.yaml
"$duet" serve --model tiny.gguf --config bad.yaml > bad.out 2> bad.err; rc=$?
[ "$rc" = 1 ] && grep -q "unknown key 'max_num_seq'" bad.err && pass "unknown config key refused" || failed "bad config: $rc $(cat bad.err)"
echo "max_num_seqs: many" > bad.yaml
"$duet" serve --model tiny.gguf --config bad.yaml > bad.out 2> bad.err; rc=$?
[ "$rc" = 1 ] && grep -q "max_num_seqs" bad.err && pass "bad config value refused" || failed "bad config value: $rc $(cat bad.err)"
# Settings no server could run with, from the file or a flag alike (they started a server that
# answered every request 503, 413 or 401).
while IFS='|' read -r yaml flag message; do
  echo "$yaml" > bad.yaml
  timeout 60 "$duet" serve --model tiny.gguf --port 0 --config bad.yaml > bad.out 2> bad.err; rc=$?
  [ "$rc" = 1 ] && grep -qF -- "$message" bad.err && pass "config '$yaml' refused" || failed "config '$yaml': $rc $(tail -1 bad.err)"
  read -r -a args <<< "$flag"
  [ "$flag" = "--api-key k1 --api-key ''" ] && args=(--api-key k1 --api-key "")
  timeout 60 "$duet" serve --model tiny.gguf --port 0 "${args[@]}" > bad.out 2> bad.err; rc=$?
  [ "$rc" = 1 ] && grep -qF -- "$message" bad.err && pass "flags '$flag' refused" || failed "flags '$flag': $rc $(tail -1 bad.err)"
done <<'CASES'
max_queued_requests: 0|--max-queued-requests 0|--max-queued-requests is 0, expected 1 or more
max_body_bytes: 0|--max-body-bytes 0|--max-body-bytes is 0, expected 1 or more
http_threads: 0|--http-threads 0|--http-threads is 0, expected 1 or more
api_threads: -1|--api-threads -1|--api-threads is -1, expected 1 or more
api_key: [k1, '']|--api-key k1 --api-key ''|--api-key is empty
allowed_origins: []|--allowed-origins []|--allowed-origins is empty
allowed_methods: ['']|--allowed-methods ,|--allowed-methods has an empty entry
allowed_headers: '[1]'|--allowed-headers [1]|every entry must be a string
CASES

# --- --reasoning-parser deepseek_r1 with a template that opens <think> ------------------------
cat > think.jinja <<'JINJA'
{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}
{% endfor %}{% if add_generation_prompt %}assistant: <think>
{% endif %}
JINJA
start_server think --reasoning-parser deepseek_r1 --chat-template think.jinja || exit 1
request POST $CH '{"messages": [{"role": "user", "content": "Why?"}], "max_tokens": 12, "temperature": 0, "ignore_eos": true}'
cp resp.json think.json
curl -s -N -H 'Content-Type: application/json' http://127.0.0.1:$PORT$CH \
  -d '{"messages": [{"role": "user", "content": "Why?"}], "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stream": true}' > think_stream.txt
if [ "$STATUS" = 200 ] && $py - think.json think_stream.txt <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["choices"][0]["message"]
assert m["content"] == "" and m["reasoning_content"], m  # no </think> yet: all of it is thinking
events = [json.loads(l[6:]) for l in open(sys.argv[2]).read().split("\n") if l.startswith("data: {")]
streamed = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in events if c["choices"])
assert streamed == m["reasoning_content"], (streamed, m["reasoning_content"])
assert "<think>" not in streamed
PY
then pass "reasoning_content (message and stream deltas)"; else failed "reasoning parser: $(head -c 300 think.json)"; fi
kill -TERM "$PID"; wait "$PID"

# --- a slower model: disconnects, the queue limit, JSON access logs --------------------------
"$duet" make-model --preset tiny --type q8_0 --seed 6 --n-embd 512 --n-ff 1536 --n-layer 6 --n-head 8 --n-head-kv 8 \
  --ctx 4096 -o slow.gguf 2> /dev/null || { echo "make-model slow failed"; exit 1; }
model_file=slow.gguf

# A client that goes away in the middle of a stream: its request is aborted within a step or two
# and its blocks are freed. Measured in tokens generated after the disconnect: the server's count,
# less the tokens the client received (each chunk lists its own, logprobs 0; all that had arrived
# before it closed are read), less the other request's. The steps are made long (a 2000-token
# prompt computed 256 tokens a step beside the stream, about 150 ms a step here), so that
# scheduling delays on a loaded machine are a small part of a step: the client leaves just after
# a slow step's token, and at most the step then computing and the next one may add a token.
start_server disconnect --max-num-seqs 2 --max-num-batched-tokens 256 || exit 1
before_tokens=$(metric vllm:generation_tokens_total)
counts=$($py - "$PORT" <<'PY'
import json, random, socket, sys, time
port = int(sys.argv[1])
def post(body):
    s = socket.create_connection(("127.0.0.1", port))
    body = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return s
stream = post({"prompt": "Hello", "max_tokens": 3000, "stream": True, "ignore_eos": True, "logprobs": 0})
got = b""
while b"data: {" not in got:
    got += stream.recv(65536)
# A prompt never seen before (no prefix cache hit), computed in chunks in the same steps.
other = post({"prompt": [random.randrange(10, 500) for _ in range(2000)], "max_tokens": 1})
last = time.monotonic()
while True:  # until a token comes after a slow step
    events = got.count(b"data: {")
    chunk = stream.recv(65536)
    if not chunk:
        sys.exit("the stream ended before the steps slowed down")
    got += chunk
    if got.count(b"data: {") == events:
        continue
    now = time.monotonic()
    if now - last > 0.04:
        break
    last = now
stream.setblocking(False)
try:
    while True:
        chunk = stream.recv(65536)
        if not chunk:
            break
        got += chunk
except BlockingIOError:
    pass
stream.close()
received = 0
for line in got.split(b"\n"):
    if line.startswith(b"data: {"):
        try:
            received += len(json.loads(line[6:])["choices"][0]["logprobs"]["tokens"])
        except ValueError:
            pass  # an event cut short: its tokens count as generated after the disconnect
reply = b""
while True:
    chunk = other.recv(65536)
    if not chunk:
        break
    reply += chunk
print(received, json.loads(reply[reply.index(b"\r\n\r\n") + 4:])["usage"]["completion_tokens"])
PY
)
read -r received other_tokens <<< "$counts"
freed=no
for _ in $(seq 1 100); do
  if [ "$(metric vllm:num_requests_running)" = "0" ] && [ "$(metric vllm:kv_cache_usage_perc)" = "0" ]; then freed=yes; break; fi
  sleep 0.05
done
[ "$freed" = yes ] && pass "disconnect frees blocks" || failed "disconnect: running=$(metric vllm:num_requests_running) kv=$(metric vllm:kv_cache_usage_perc)"
aborted=$(curl -s "http://127.0.0.1:$PORT/metrics" | grep 'finished_reason="abort"' | awk '{print $2}')
generated=$(metric vllm:generation_tokens_total)
after=$(( ${generated%.*} - ${before_tokens%.*} - ${received:-0} - ${other_tokens:-0} ))
if [ "${aborted:-0}" = "1" ] && [ "${received:-0}" -ge 2 ] && [ "$after" -ge 0 ] && [ "$after" -le 2 ]; then
  pass "disconnect aborted the request ($received tokens received, $after generated after the disconnect)"
else
  failed "disconnect: abort=$aborted, '$counts' tokens received (stream, other), $after generated after the disconnect (at most 2)"
fi
kill -TERM "$PID"; wait "$PID"

start_server limited --max-queued-requests 1 --max-num-seqs 1 --log-format json --log-file access.log || exit 1
bg=()
# 40 requests at once, long enough (3000 tokens) that they are cut off before the one running
# ends: one runs, one waits, and the others find the queue full. Their answers are checked, not a
# request sent after them, which a fast machine could let in once the first had ended.
rm -f limited_*.txt
for i in $(seq 1 40); do
  curl -s -H 'Content-Type: application/json' http://127.0.0.1:$PORT$C -D "limited_$i.txt" \
    -d '{"prompt": "Hello", "max_tokens": 3000, "ignore_eos": true}' -o /dev/null &
  bg+=($!)
done
# Until one of them has been refused with its Retry-After (both looked for in the same file: curl
# writes the header lines as they arrive, so a file may hold the status line before the rest).
refused=""
for _ in $(seq 1 400); do
  for f in $(grep -l "^HTTP/1.1 503" limited_*.txt 2>/dev/null); do
    grep -qi "^retry-after:" "$f" && refused="$f" && break
  done
  [ -n "$refused" ] && break
  sleep 0.05
done
if [ -n "$refused" ]; then pass "queue full gets 503 with Retry-After"; else
  failed "queue limit (no request refused with 503 and Retry-After: $(cat limited_1.txt 2>/dev/null | head -1))"; fi
for p in "${bg[@]}"; do kill "$p" 2>/dev/null; done  # their requests are aborted
wait "${bg[@]}" 2>/dev/null
for _ in $(seq 1 200); do
  [ "$(metric vllm:num_requests_running)" = "0" ] && [ "$(metric vllm:num_requests_waiting)" = "0" ] && break
  sleep 0.05
done
# ignore_eos: the JSON access log check below needs one request that ran to its length (a sampled
# token from the tiny model is its end of text about once in a hundred such requests).
request POST $C '{"prompt": "Hello", "max_tokens": 3, "ignore_eos": true}'
[ "$STATUS" = 200 ] && pass "served again once the queue is empty" || failed "after the queue limit ($STATUS)"
kill -TERM "$PID"; wait "$PID"
if $py - access.log <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
reqs = [l for l in lines if l.get("msg") == "request" and l.get("path") == "/v1/completions"]
assert len(reqs) >= 4, len(reqs)
ok = [r for r in reqs if r["status"] == 200 and r.get("finish_reason") == "length"]  # one that ran to its end
assert ok, reqs
for key in ("ts", "level", "request_id", "status", "prompt_tokens", "generated_tokens", "queue_time", "ttft", "total_time", "finish_reason"):
    assert key in ok[0], (key, ok[0])
assert any(r["status"] == 503 for r in reqs)
PY
then pass "JSON access log lines"; else failed "JSON access log"; head -5 access.log; fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
