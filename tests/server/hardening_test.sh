#!/usr/bin/env bash
# usage: hardening_test.sh DUET_BINARY WORK_DIR
# Hostile requests against the real `duet serve`: each is refused with a clear error, and the
# server stays up and keeps serving (/health 200, a normal request answered) after all of them.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

"$duet" make-model --preset tiny --type q8_0 --seed 5 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf
start_server main --max-body-bytes 4194304 || exit 1
C=/v1/completions
CH=/v1/chat/completions

alive() {
  request GET /health ""
  if [ "$STATUS" = 200 ] && kill -0 "$PID" 2>/dev/null; then pass "alive after $1"; else failed "server down after $1 ($STATUS)"; fi
}

# nested FILE DEPTH PREFIX SUFFIX: a body PREFIX + DEPTH nested objects {"a": ...} + SUFFIX.
nested() {
  $py - "$@" <<'PY'
import sys
path, depth, prefix, suffix = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
open(path, "w").write(prefix + '{"a": ' * depth + "1" + "}" * depth + suffix)
PY
}

# --- JSON nested deeper than the server walks: a 400 naming the field, never a crash ----------
msg='"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2'
nested kwargs.json 30000 "{$msg, \"chat_template_kwargs\": " "}"
expect_error "chat_template_kwargs 30000 deep" 400 invalid_request_error chat_template_kwargs POST $CH @kwargs.json
grep -q "nested more than" resp.json && pass "the error says how deep" || failed "depth error text: $(head -c 300 resp.json)"
alive "a deep chat_template_kwargs"
nested extra.json 30000 '{"messages": [{"role": "user", "content": "Hi", "extra": ' '}], "max_tokens": 2}'
expect_error "a message field 30000 deep" 400 invalid_request_error messages POST $CH @extra.json
grep -q 'messages\[0\].extra' resp.json && pass "the error names the message field" || failed "message depth error: $(head -c 300 resp.json)"
alive "a deep message field"
nested tokenize.json 30000 '{"messages": [{"role": "user", "content": "Hi", "extra": ' '}]}'
expect_error "/tokenize with a message field 30000 deep" 400 invalid_request_error messages POST /tokenize @tokenize.json
nested prompt.json 30000 '{"max_tokens": 2, "prompt": "x", "user_data": ' '}'
expect_error "a completion with an unknown field 30000 deep" 400 invalid_request_error user_data POST $C @prompt.json
$py -c "open('arrays.json', 'w').write('[' * 100000 + ']' * 100000)"
expect_error "a body of 100000 nested lists" 400 invalid_request_error - POST $C @arrays.json
alive "deep bodies"
# Nesting a template may legitimately get (tools' JSON schemas run a dozen levels deep) works.
nested ok.json 40 "{$msg, \"chat_template_kwargs\": " "}"
request POST $CH @ok.json
[ "$STATUS" = 200 ] && pass "chat_template_kwargs 40 deep is accepted" || failed "40 deep ($STATUS: $(head -c 300 resp.json))"

# --- objects of many keys take time linear in their size -----------------------------------
# nlohmann's callback parse searched the parent object each time a child object ended, its
# ordered parse searched each object for every key it added, and the chat template's variables
# were set one search each: 150,000 objects in one field, or 100,000 template variables, took
# minutes (100,000 schema properties 87 s). Each has 20 s here, about a second in use.
$py - <<'PY'
import json
msg = [{"role": "user", "content": "Hi"}]
json.dump({"messages": msg, "max_tokens": 2, "user_data": {str(i): {"a": 1} for i in range(150000)}}, open("wide.json", "w"))
json.dump({"messages": msg, "max_tokens": 2, "chat_template_kwargs": {str(i): "v" for i in range(100000)}},
          open("wide_kwargs.json", "w"))
PY
request POST $CH @wide.json --max-time 20
[ "$STATUS" = 200 ] && pass "a field of 150000 objects, in time" || failed "150000 objects ($STATUS: $(head -c 300 resp.json))"
request POST $CH @wide_kwargs.json --max-time 20
[ "$STATUS" = 200 ] && pass "100000 chat_template_kwargs, in time" || failed "100000 kwargs ($STATUS: $(head -c 300 resp.json))"
alive "wide bodies"

# --- grammars that recursed: a 400 each, in time, and the server serves on ---------------------
# 100,000 nested groups in a guided_regex or guided_grammar, 100,000 optional items in a row, or a
# chain of 100,000 rules overflowed the stack (the server ended) or took minutes.
$py - <<'PY'
import json
n = 100000
chain = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(n)) + f"r{n} ::= \"a\"\n"
for name, extra in {"regex_groups": {"guided_regex": "(" * n + "a" + ")" * n},
                    "regex_optional": {"guided_regex": "a?" * n},
                    "grammar_groups": {"guided_grammar": "root ::= " + "(" * n + '"a"' + ")" * n},
                    "grammar_chain": {"guided_grammar": chain}}.items():
    json.dump({"prompt": "x", "max_tokens": 2} | extra, open(f"{name}.json", "w"))
PY
for name in regex_groups regex_optional grammar_groups grammar_chain; do
  request POST $C @$name.json --max-time 20
  [ "$STATUS" = 400 ] && grep -qE "nested|too complex" resp.json && pass "$name: 400 in time" \
    || failed "$name ($STATUS: $(head -c 300 resp.json))"
done
alive "hostile grammars"

# --- integers beyond 32 bits: a 400 naming the parameter, never a silent wrap ------------------
# 4294967296 is 2^32: cast to 32 bits it was token 0 (or priority 0); 2^64 - 1 read as a signed
# 64-bit number was -1.
expect_error "logit_bias key 2^32" 400 invalid_request_error logit_bias POST $C '{"prompt": "x", "max_tokens": 2, "logit_bias": {"4294967296": 5}}'
expect_error "logit_bias key 2^63" 400 invalid_request_error logit_bias POST $C '{"prompt": "x", "max_tokens": 2, "logit_bias": {"9223372036854775808": 5}}'
expect_error "stop_token_ids 2^32" 400 invalid_request_error stop_token_ids POST $C '{"prompt": "x", "max_tokens": 2, "stop_token_ids": [4294967296]}'
expect_error "stop_token_ids 2^64 - 1" 400 invalid_request_error stop_token_ids POST $C '{"prompt": "x", "max_tokens": 2, "stop_token_ids": [18446744073709551615]}'
expect_error "priority 2^32" 400 invalid_request_error priority POST $C '{"prompt": "x", "max_tokens": 2, "priority": 4294967296}'
expect_error "priority -2^32" 400 invalid_request_error priority POST $C '{"prompt": "x", "max_tokens": 2, "priority": -4294967296}'
expect_error "prompt token id 2^64 - 1" 400 invalid_request_error prompt POST $C '{"prompt": [18446744073709551615], "max_tokens": 2}'
grep -q "18446744073709551615" resp.json && pass "the error shows the id as sent" || failed "prompt id error: $(head -c 300 resp.json)"
expect_error "detokenize 2^32" 400 invalid_request_error tokens POST /detokenize '{"tokens": [4294967296]}'
alive "integers beyond 32 bits"

# --- a field of the wrong JSON type: a 400 naming it, in duet's words ---------------------------
# These answered with nlohmann's own text ("[json.exception.type_error.302] type must be string,
# but is object") and no parameter; fuzz_openai_request, which wants duet's errors, failed on the
# first.
expect_error "a tool whose type is an object" 400 invalid_request_error tools POST $CH '{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": {}, "function": {"name": "f"}}]}'
expect_error "a schema's nullable as a string" 400 invalid_request_error response_format POST $CH '{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "nullable": "x"}}}}'
grep -q "nullable must be true or false" resp.json && pass "the error names nullable" || failed "nullable error: $(head -c 300 resp.json)"
expect_error "/tokenize add_generation_prompt as a string" 400 invalid_request_error add_generation_prompt POST /tokenize '{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "x"}'
expect_error "/tokenize add_special_tokens as a list" 400 invalid_request_error add_special_tokens POST /tokenize '{"prompt": "x", "add_special_tokens": [1]}'
alive "fields of the wrong type"

# --- a list of prompts is that many requests: more than --max-queued-requests (1024 here) in one
# body is refused before anything is tokenized (2000 were once all queued as one request).
$py -c "import json; open('many.json', 'w').write(json.dumps({'prompt': ['x'] * 2000, 'max_tokens': 1}))"
expect_error "2000 prompts in one request" 400 invalid_request_error prompt POST $C @many.json
grep -q "2000 prompts" resp.json && pass "the error gives the count" || failed "many prompts: $(head -c 300 resp.json)"
alive "a list of 2000 prompts"

request POST $C '{"prompt": "Hello", "max_tokens": 3, "temperature": 0}'
[ "$STATUS" = 200 ] && pass "a normal request still works" || failed "normal request after hostile ones ($STATUS)"
alive "every hostile request"

# --- one request's own failure: its sampled token is a padding row of the logits, which has no --
# text, so making its output fails. That request gets the error; the engine stays healthy (it once
# marked itself failed for good, and every later request got 503).
kill -TERM "$PID"; wait "$PID"
"$duet" make-model --preset tiny --type q8_0 --seed 5 --padded-vocab 16 -o padded.gguf 2> /dev/null || { echo "make-model padded failed"; exit 1; }
model_file=padded.gguf
start_server padded || exit 1
expect_error "a padding token forced by logit_bias" 500 server_error - POST $C '{"prompt": "Hello", "max_tokens": 4, "logit_bias": {"515": 100}}'
alive "a request that failed while its output was made"
curl -s -N -H 'Content-Type: application/json' "http://127.0.0.1:$PORT$C" \
  -d '{"prompt": "Hello", "max_tokens": 4, "stream": true, "logit_bias": {"515": 100}}' > padded_stream.txt
if $py - padded_stream.txt <<'PY'
import json, sys
events = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert events[-1] == "[DONE]", events
assert any("error" in json.loads(e) for e in events[:-1]), events
PY
then pass "the stream ends with the request's error"; else failed "padded stream: $(head -c 300 padded_stream.txt)"; fi
request POST $C '{"prompt": "Hello", "max_tokens": 4, "temperature": 0}'
[ "$STATUS" = 200 ] && pass "the next request is served" || failed "after a failed request ($STATUS: $(head -c 300 resp.json))"

# --- a slower model: requests that overlap -----------------------------------------------------
kill -TERM "$PID"; wait "$PID"
"$duet" make-model --preset tiny --type q8_0 --seed 6 --n-embd 512 --n-ff 1536 --n-layer 6 --n-head 8 --n-head-kv 8 \
  --ctx 4096 -o slow.gguf 2> /dev/null || { echo "make-model slow failed"; exit 1; }
model_file=slow.gguf
start_server slow --log-format json --log-file access.log || exit 1

# Two clients send the same X-Request-Id; the first leaves after its first chunk. The second must
# run to its end: the header is the client's label, not the engine's id (it once was, so the second
# request was refused as a duplicate, and an abort for one could hit the other).
if $py - "$PORT" <<'PY'
import json, socket, sys
port = int(sys.argv[1])
def open_stream(max_tokens):
    body = json.dumps({"prompt": "Hello", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: same-id\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return s
def read_until(s, marker, got=b""):
    while marker not in got:
        part = s.recv(65536)
        if not part:
            break
        got += part
    return got
a = open_stream(3000)
head_a = read_until(a, b"data: ")
b = open_stream(60)
got_b = read_until(b, b"data: [DONE]")
a.close()
head, _, stream = got_b.partition(b"\r\n\r\n")
assert b" 200 " in head.split(b"\r\n")[0], head
assert b"x-request-id: same-id" in head.lower(), head  # the client's header is echoed
events = [l[6:] for l in stream.decode(errors="replace").split("\n") if l.startswith("data: ")]
assert events[-1] == "[DONE]", events[-3:]
chunks = [json.loads(e) for e in events[:-1]]
assert not any("error" in c for c in chunks), [c for c in chunks if "error" in c]
finals = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
assert finals == ["length"], finals
ids_a = [json.loads(l[6:])["id"] for l in head_a.decode(errors="replace").split("\n") if l.startswith("data: {")]
assert ids_a and ids_a[0] != chunks[0]["id"], (ids_a, chunks[0]["id"])  # the server's own ids differ
PY
then pass "two clients with one X-Request-Id both run"; else failed "a shared X-Request-Id"; fi
alive "a shared X-Request-Id"
for _ in $(seq 1 100); do  # the first request's access line comes when its abort is processed
  [ "$(grep -c '"client_request_id":"same-id"' access.log)" -ge 2 ] && break
  sleep 0.05
done
if $py - access.log <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
same = [l for l in lines if l.get("msg") == "request" and l.get("client_request_id") == "same-id"]
assert len(same) == 2, same
assert same[0]["request_id"] != same[1]["request_id"], same
PY
then pass "the access log keeps the server's id beside the client's"; else failed "access log ids: $(grep same-id access.log)"; fi

# --- each prompt of a list counts against --max-queued-requests -------------------------------
kill -TERM "$PID"; wait "$PID"
start_server queue --max-num-seqs 1 --max-queued-requests 4 || exit 1
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^$1\{" | awk '{print $2}' | head -1; }
rm -f long_started release
# One long request holds the only sequence slot until `release` appears.
$py - "$PORT" <<'PY' &
import os, socket, sys, time
body = b'{"prompt": "Hello", "max_tokens": 3000, "stream": true, "ignore_eos": true}'
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
          + str(len(body)).encode() + b"\r\n\r\n" + body)
got = b""
while b"data: " not in got:
    got += s.recv(4096)
open("long_started", "w").close()
for _ in range(1200):
    if os.path.exists("release"):
        break
    time.sleep(0.05)
s.close()
PY
holder=$!
for _ in $(seq 1 300); do [ -f long_started ] && break; sleep 0.05; done
curl -s -o three.json -w '%{http_code}' -H 'Content-Type: application/json' "http://127.0.0.1:$PORT$C" \
  -d '{"prompt": ["a", "b", "c"], "max_tokens": 2}' > three.status &
three=$!
for _ in $(seq 1 200); do [ "$(metric vllm:num_requests_waiting)" = "3" ] && break; sleep 0.05; done
[ "$(metric vllm:num_requests_waiting)" = "3" ] && pass "three prompts wait as three requests" || failed "waiting: $(metric vllm:num_requests_waiting)"
expect_error "two more prompts over a limit of 4" 503 service_unavailable_error - POST $C '{"prompt": ["d", "e"], "max_tokens": 2}'
expect_error "five prompts in one request, limit 4" 400 invalid_request_error prompt POST $C '{"prompt": ["1", "2", "3", "4", "5"], "max_tokens": 2}'
touch release
wait "$holder" "$three"
[ "$(cat three.status)" = 200 ] && pass "the three waiting prompts finish" || failed "three prompts: $(cat three.status) $(head -c 300 three.json)"
alive "the queue limit"

# --- large prompts are tokenized off the I/O threads: /health answers while they are ----------
# Three 20 MB prompts against two I/O threads: the tokenizing once ran on those threads, and
# /health waited seconds for it. (20 MB, so that it takes seconds on a fast machine too: three of
# 5 MB took 1.5 s on an Intel Xeon of 2026, too short for this check.)
kill -TERM "$PID"; wait "$PID"
model_file=tiny.gguf
start_server big --max-body-bytes 25165824 --http-threads 2 || exit 1
$py - <<'PY'
import json
import random
# Words of random hex digits and letters, none repeated often (a tokenizer that caches words
# would make a repeated text cheap).
rng = random.Random(1)
prompt = " ".join(f"{rng.getrandbits(28):07x}" for _ in range(20_000_000 // 8))[:20_000_000]
open("big.json", "w").write(json.dumps({"prompt": prompt, "max_tokens": 1}))
PY
big=()
for i in 1 2 3; do
  curl -s -o big$i.json -w '%{http_code} %{time_total}' -H 'Content-Type: application/json' -H 'Expect:' \
    --data-binary @big.json "http://127.0.0.1:$PORT$C" > big$i.status &
  big+=($!)
done
sleep 1  # the bodies are sent at once (no Expect: 100-continue) and being tokenized by now
health=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' "http://127.0.0.1:$PORT/health")
wait "${big[@]}"
if $py - "$health" big1.status big2.status big3.status <<'PY'
import sys
code, latency = sys.argv[1].split()
slowest = 0.0
for f in sys.argv[2:]:
    status, seconds = open(f).read().split()
    assert status == "400", (f, status)  # tokenized, then found longer than the context
    slowest = max(slowest, float(seconds))
print(f"/health {code} in {float(latency):.3f} s; the large prompts took up to {slowest:.1f} s")
assert slowest >= 2.0, "the prompts were tokenized too fast for this check to tell anything"
assert code == "200" and float(latency) < min(1.0, slowest / 4), (code, latency, slowest)
PY
then pass "/health answers while large prompts are tokenized"; else failed "/health waited for the tokenizer ($health)"; fi
grep -q "context_length_exceeded" big1.json && pass "the large prompt is refused after tokenizing" || failed "large prompt: $(head -c 300 big1.json)"
kill -TERM "$PID"; wait "$PID"

# --- out of file descriptors: connections wait, the server neither spins nor floods its log ---
# With 64 open files at most, 100 idle connections exhaust them; the acceptor retried each failed
# accept at once, spinning a core and writing a log line per try (190,000 in 3 s). Now one line
# for the episode, little CPU, and the connections are served once others close.
printf '#!/bin/sh\nulimit -n 64 || exit 1\nexec "%s" "$@"\n' "$duet" > few_files.sh && chmod +x few_files.sh
duet="$work/few_files.sh" start_server files || exit 1
grep -q "at most 64 files may be open" files.err && pass "a low open-file limit is reported at start" \
  || failed "no warning of the open-file limit: $(head -c 300 files.err)"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
before=$(cpu_ticks "$PID")
$py - "$PORT" <<'PY' > files_held.txt
import socket, sys, time
port = int(sys.argv[1])
held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
time.sleep(3)
# The last one waited in the listen queue while the files were gone: it is served once the
# others close.
last = held.pop()
for s in held:
    s.close()
last.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
print(last.recv(100).split(b"\r\n")[0].decode())
PY
after=$(cpu_ticks "$PID")
ticks=$(getconf CLK_TCK)
grep -q "HTTP/1.1 200" files_held.txt && pass "a connection queued while files ran out is served after" \
  || failed "the queued connection: $(cat files_held.txt)"
[ $((after - before)) -lt "$ticks" ] && pass "no spinning: $((after - before)) ticks of CPU in 3 s" \
  || failed "the server used $((after - before)) ticks of CPU (of $ticks a second) while out of files"
n_failed=$(grep -c "accept failed" files.err)
[ "$n_failed" = 1 ] && grep -q "accepting connections again" files.err && pass "one log line for the episode, one when it ends" \
  || failed "$n_failed accept failures logged: $(grep -m3 accept files.err)"
request GET /health ""
[ "$STATUS" = 200 ] && pass "serves after running out of files" || failed "after running out of files ($STATUS)"
curl -s "http://127.0.0.1:$PORT/metrics" > files_metrics.txt
accept_failures=$(grep -E '^duet:http_accept_failures_total\{' files_metrics.txt | awk '{print $2}')
grep -qE '^duet:http_connections\{[^}]*\} [0-9]' files_metrics.txt && [ "${accept_failures:-0}" -ge 1 ] 2>/dev/null \
  && pass "/metrics counts the failed accepts ($accept_failures) and the open connections" \
  || failed "accept metrics: $(grep http_ files_metrics.txt)"
kill -TERM "$PID"; wait "$PID"

# --- memory: a container's limit, not the host's free memory, sizes the KV pool --------------
# A cgroup tree written here (DUET_CGROUP_DIR): a v2 root and a v1 memory controller, each with a
# limit leaving 256 MiB (the host's own cgroup path is not in it, so its root is read, as in a
# container). With --memory-utilization 0.5, the pool takes half of that less the model file's
# pages read in place: at most 128 MiB, where the host's free memory gave gigabytes.
cg="$work/cgroup"
mkdir -p "$cg/memory"
echo "memory" > "$cg/cgroup.controllers"
echo $((1 << 30)) > "$cg/memory.max"
echo $((768 << 20)) > "$cg/memory.current"
printf 'anon 1\nactive_file 0\ninactive_file 0\n' > "$cg/memory.stat"
echo $((1 << 30)) > "$cg/memory/memory.limit_in_bytes"
echo $((768 << 20)) > "$cg/memory/memory.usage_in_bytes"
printf 'hierarchical_memory_limit %d\ntotal_active_file 0\ntotal_inactive_file 0\n' $((1 << 30)) > "$cg/memory/memory.stat"
kv_mib() { grep -oE "KV blocks of [0-9]+ tokens \([0-9.]+ MiB" "$1" | grep -oE "[0-9.]+ MiB" | grep -oE "[0-9.]+"; }
DUET_CGROUP_DIR="$cg" SERVER_KV_ARGS="" start_server limited --memory-utilization 0.5 || exit 1
limited=$(kv_mib limited.err)
kill -TERM "$PID"; wait "$PID"
SERVER_KV_ARGS="" start_server host --memory-utilization 0.5 || exit 1
host=$(kv_mib host.err)
kill -TERM "$PID"; wait "$PID"
if $py -c "import sys; l, h = float('$limited'), float('$host'); sys.exit(0 if 100 <= l <= 128 and h > 4 * l else 1)"; then
  pass "the KV pool fits the cgroup's limit ($limited MiB; $host MiB without it)"
else
  failed "KV pool under a cgroup limit of 256 MiB free: '$limited' MiB (expected 100-128), host '$host' MiB"
fi
grep -qE "resident .* after loading" limited.err && pass "the resident size is logged at start-up" \
  || failed "no resident size in the start-up log: $(grep engine: limited.err | head -3)"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
