#!/usr/bin/env bash
# usage: redis_test.sh DUET_BINARY WORK_DIR
# The Redis KV tier (--kv-cache-redis) against a real redis-server started here on a free port
# (its own directory, killed at the end): a restarted server gets prefix hits from Redis (its
# computed tokens drop, from the metrics); two servers share blocks; corrupt values, another
# model's and another cache dtype's blocks are never used; killing (and stopping) Redis under
# load fails no request, and every greedy text equals the one of a server without Redis. Then the
# Responses API's store in Redis (--responses-redis): restarts, three servers, Redis gone; conversations
# across servers.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

if ! command -v redis-server > /dev/null || ! command -v redis-cli > /dev/null; then
  echo "redis-server is not installed (run scripts/install-deps.sh)"
  exit 1
fi
"$duet" make-model --preset tiny --type q8_0 --seed 5 -o model.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
"$duet" make-model --preset tiny --type q8_0 --seed 6 -o other.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=model.gguf

redis_port=$($py -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
REDIS_PID=""
start_redis() {
  mkdir -p redis
  redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work/redis" --save "" --appendonly no \
    > "redis/redis-$1.log" 2>&1 &
  REDIS_PID=$!
  pids+=("$REDIS_PID")
  for _ in $(seq 1 100); do
    rcli ping 2> /dev/null | grep -q PONG && return 0
    sleep 0.05
  done
  echo "redis-server did not start:"; cat "redis/redis-$1.log"; exit 1
}
rcli() { redis-cli -p "$redis_port" "$@"; }
url="redis://127.0.0.1:$redis_port"

metric() {  # metric NAME [LABEL=VALUE]: the sample's value on the running server
  curl -s "http://127.0.0.1:$PORT/metrics" > metrics.txt
  $py - metrics.txt "$1" "${2:-}" <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families
name, label = sys.argv[2], sys.argv[3]
total = 0.0
for f in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in f.samples:
        if s.name == name and (not label or s.labels.get(label.split("=")[0]) == label.split("=")[1]):
            total += s.value
print(int(total))
PY
}
computed() { metric vllm:iteration_tokens_total_sum; }
client() {  # client SET OUT [CONCURRENCY]
  $py "$here/redis_client.py" "$PORT" "$1" "$2" "${3:-4}" > "$2.log" 2>&1 || { cat "$2.log"; return 1; }
}
same() {  # same NAME A B: the texts of two runs are equal
  if $py -c 'import json, sys; a, b = (json.load(open(f)) for f in sys.argv[1:3]); assert a and a == b, (a, b)' "$2" "$3"
  then pass "$1"; else failed "$1: $2 and $3 differ"; fi
}
# Waits until the writer has stored what it queued: the bytes written stop growing.
settle() {
  local last=-1 now
  for _ in $(seq 1 50); do
    now=$(metric duet:kv_redis_bytes_total dir=write)
    [ "$now" = "$last" ] && [ "$now" != 0 ] && return 0
    last=$now
    sleep 0.2
  done
}
start() {  # start NAME ARGS...
  start_server "$@" --served-model-name m || exit 1
}

# Reference: no Redis (prompt sets 0 to 5 differ in their prefixes).
start plain
client all plain.json || failed "requests without Redis"
for salt in 1 2 3 4 5; do client "all:$salt" "plain-$salt.json" || failed "requests without Redis"; done
kill "$PID"

start_redis 1
# 1. A server computes set a and writes its blocks; a restarted one gets them back.
start first --kv-cache-redis "$url"
client a first.json || failed "first server's requests"
settle
first_computed=$(computed)
first_written=$(metric duet:kv_redis_bytes_total dir=write)
kill "$PID"; wait "$PID" 2> /dev/null
keys=$(rcli --scan --pattern 'duet:kv:v1:*' | wc -l)
[ "$keys" -gt 0 ] && [ "$first_written" -gt 0 ] && pass "blocks written to Redis ($keys keys, $first_written bytes)" \
  || failed "no blocks in Redis ($keys keys, $first_written bytes)"
ttl=$(rcli ttl "$(rcli --scan --pattern 'duet:kv:v1:*' | head -1)")
[ "$ttl" -gt 0 ] && [ "$ttl" -le 86400 ] && pass "keys have a TTL ($ttl s)" || failed "key TTL is $ttl"

start restarted --kv-cache-redis "$url"
client a restarted.json || failed "restarted server's requests"
hits=$(metric duet:kv_redis_hits_total)
restarted_computed=$(computed)
read_bytes=$(metric duet:kv_redis_bytes_total dir=read)
echo "computed tokens: first $first_computed, restarted $restarted_computed; $hits block hits, $read_bytes bytes read"
[ "$hits" -gt 0 ] && [ "$read_bytes" -gt 0 ] && [ $((restarted_computed * 2)) -lt "$first_computed" ] \
  && pass "a restarted server gets prefix hits from Redis: computed tokens $first_computed -> $restarted_computed" \
  || failed "restarted server: $hits hits, computed $restarted_computed vs $first_computed"
same "restarted server's texts equal the first's" first.json restarted.json
$py -c 'import json, sys; p, r = (json.load(open(f)) for f in sys.argv[1:3]); assert all(p[k] == r[k] for k in r)' \
  plain.json restarted.json && pass "texts from Redis blocks equal those without Redis" || failed "texts differ from plain"
kill "$PID"; wait "$PID" 2> /dev/null

# 2. Two servers at once: what one computes, the other reads.
start one --kv-cache-redis "$url"
port_one=$PORT; pid_one=$PID
start two --kv-cache-redis "$url"
port_two=$PORT; pid_two=$PID
PORT=$port_one
client b one.json || failed "server one's requests"
settle
one_computed=$(computed)
PORT=$port_two
client b two.json || failed "server two's requests"
two_hits=$(metric duet:kv_redis_hits_total)
two_computed=$(computed)
[ "$two_hits" -gt 0 ] && [ $((two_computed * 2)) -lt "$one_computed" ] \
  && pass "two servers share blocks: the second gets $two_hits hits, computes $two_computed tokens vs $one_computed" \
  || failed "second server: $two_hits hits, computed $two_computed vs $one_computed"
same "both servers' texts are equal" one.json two.json
kill "$pid_one" "$pid_two"; wait "$pid_one" "$pid_two" 2> /dev/null

# 3. Blocks of another model (same shapes, other weights) or another cache dtype never match.
v=0
for variant in "other model:--model other.gguf" "f32 cache:--kv-cache-dtype f32" "block size 8:--block-size 8"; do
  name=${variant%%:*}
  v=$((v + 1))
  read -r -a extra <<< "${variant#*:}"
  if [ "${extra[0]}" = "--model" ]; then model_file=${extra[1]}; extra=(); fi
  start "foreign-$v" --kv-cache-redis "$url" "${extra[@]}"
  client all "foreign-$v.json" || { failed "$name: requests"; tail -5 "foreign-$v.err"; }
  foreign_hits=$(metric duet:kv_redis_hits_total)
  [ "$foreign_hits" = 0 ] && pass "$name: no block of the others used" || failed "$name: $foreign_hits hits"
  kill "$PID"; wait "$PID" 2> /dev/null
  model_file=model.gguf
done

# 4. Corrupt values under the right keys: never used (counted as errors), the texts unchanged.
n=0
for key in $(rcli --scan --pattern 'duet:kv:v1:*'); do
  case $((n % 3)) in
    0) rcli set "$key" "garbage" keepttl > /dev/null ;;
    1) rcli setrange "$key" 200 "XXXX" > /dev/null ;;                # a few bytes of the payload
    2) rcli eval "redis.call('set', KEYS[1], string.sub(redis.call('get', KEYS[1]), 1, 100))" 1 "$key" > /dev/null ;;
  esac
  n=$((n + 1))
done
start corrupt --kv-cache-redis "$url"
client all corrupt.json || failed "requests over corrupt blocks"
corrupt_hits=$(metric duet:kv_redis_hits_total)
corrupt_errors=$(metric duet:kv_redis_errors_total)
[ "$corrupt_hits" = 0 ] && [ "$corrupt_errors" -gt 0 ] \
  && pass "$n corrupt blocks refused ($corrupt_errors counted as errors)" \
  || failed "corrupt blocks: $corrupt_hits hits, $corrupt_errors errors"
same "texts over corrupt blocks equal those without Redis" plain.json corrupt.json
kill "$PID"; wait "$PID" 2> /dev/null
rcli flushall > /dev/null

# 5. Redis killed under load, then stopped (hangs), then back: no request fails, texts unchanged.
# Each wave has prompts the server has not seen, so that it fetches and writes.
start load --kv-cache-redis "$url"
client all warm.json 8 || failed "requests before the kill"
( client all:1 during-kill.json 8 ) & load_client=$!
sleep 0.3
kill -9 "$REDIS_PID"
wait "$load_client" && pass "no request failed while Redis was killed" || failed "requests failed while Redis was killed"
same "texts while Redis was killed equal those without Redis" plain-1.json during-kill.json
client all:2 redis-down.json 8 || failed "requests with Redis down"
same "texts with Redis down equal those without Redis" plain-2.json redis-down.json
errors=$(metric duet:kv_redis_errors_total)
[ "$errors" -gt 0 ] && grep -q "lost redis://" load.err && pass "Redis down logged and counted ($errors errors)" \
  || failed "no error counted with Redis down"
start_redis 2
sleep 6  # the back-off is at most 5 s
before=$(metric duet:kv_redis_bytes_total dir=write)
client all:3 back.json 8 || failed "requests after Redis came back"
settle
after=$(metric duet:kv_redis_bytes_total dir=write)
[ "$after" -gt "$before" ] && grep -q "connected to .* again" load.err \
  && pass "the writer reconnected and writes again ($before -> $after bytes)" \
  || failed "no writes after Redis came back ($before -> $after bytes)"
same "texts after Redis came back equal those without Redis" plain-3.json back.json
misses=$(metric duet:kv_redis_misses_total)
kill -STOP "$REDIS_PID"
start_time=$(date +%s.%N)
client all:4 stopped.json 8 || failed "requests with Redis stopped"
took=$($py -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$start_time")
kill -CONT "$REDIS_PID"
same "texts with Redis stopped equal those without Redis" plain-4.json stopped.json
missed=$(( $(metric duet:kv_redis_misses_total) - misses ))
$py -c "import sys; sys.exit(0 if float(sys.argv[1]) < 20 and int(sys.argv[2]) > 0 else 1)" "$took" "$missed" \
  && pass "requests with Redis stopped (not answering) finished in $took s, $missed blocks missed" \
  || failed "requests took $took s with Redis stopped ($missed blocks missed)"
client all:5 after-stop.json 8 || failed "requests after Redis answered again"
same "texts after Redis answered again equal those without Redis" plain-5.json after-stop.json
kill "$PID"; wait "$PID" 2> /dev/null

# 5b. DeepSeek-V3.2 (deepseek32 keeping 6 positions a query): the indexer's keys are the blocks'
# V rows, so a restarted server's prefix hits bring them back with the latents; its texts (every
# token past the 6th chosen by them) equal those of a server without Redis.
rcli flushall > /dev/null
"$duet" make-model --preset deepseek32-tiny --index-topk 6 --type q8_0 --seed 5 -o v32.gguf 2> /dev/null \
  || failed "make-model deepseek32"
model_file=v32.gguf
start v32-plain
client a v32-plain.json || failed "deepseek32: requests without Redis"
kill "$PID"; wait "$PID" 2> /dev/null
start v32-first --kv-cache-redis "$url"
client a v32-first.json || failed "deepseek32: first server's requests"
settle
kill "$PID"; wait "$PID" 2> /dev/null
start v32-restarted --kv-cache-redis "$url"
client a v32-restarted.json || failed "deepseek32: restarted server's requests"
v32_hits=$(metric duet:kv_redis_hits_total)
[ "$v32_hits" -gt 0 ] && pass "deepseek32: a restarted server gets $v32_hits block hits from Redis" \
  || failed "deepseek32: no hits from Redis"
same "deepseek32: texts from Redis blocks equal those without Redis" v32-plain.json v32-restarted.json
kill "$PID"; wait "$PID" 2> /dev/null
model_file=model.gguf

# 6. The size cap: Redis' maxmemory with volatile-lru, set by duet; old blocks are evicted.
rcli flushall > /dev/null
cap=$(( $(rcli info memory | grep -oE "^used_memory:[0-9]+" | cut -d: -f2) + 800000 ))  # Redis' own use + 800 kB
start capped --kv-cache-redis "$url" --kv-cache-redis-max-memory $cap
[ "$(rcli config get maxmemory | tail -1)" = "$cap" ] && [ "$(rcli config get maxmemory-policy | tail -1)" = volatile-lru ] \
  && pass "the cap is set in Redis (maxmemory $cap, volatile-lru)" || failed "maxmemory not set: $(rcli config get maxmemory)"
for salt in 0 1 2 3; do client "all:$salt" "capped-$salt.json" 8 || failed "requests under the cap"; done
settle
evicted=$(rcli info stats | grep -oE "evicted_keys:[0-9]+" | cut -d: -f2)
used=$(rcli info memory | grep -oE "^used_memory:[0-9]+" | cut -d: -f2)
written=$(metric duet:kv_redis_bytes_total dir=write)
[ "$evicted" -gt 0 ] && [ "$used" -le $((cap + cap / 5)) ] && [ "$written" -gt "$cap" ] \
  && pass "Redis stays under the cap: $written bytes written, $used bytes used, $evicted blocks evicted" \
  || failed "cap: $written bytes written, $used used, $evicted evicted"
same "texts under the cap equal those without Redis" plain-3.json capped-3.json
kill "$PID"; wait "$PID" 2> /dev/null
rcli config set maxmemory 0 > /dev/null

# 7. Responses in Redis (--responses-redis): one outlives its server; a second server reads it
# and continues its conversation as the chat of the whole conversation; a deletion on a third
# server reaches the second, which still had it in memory.
rcli ping 2> /dev/null | grep -q PONG || start_redis responses
rid() { $py -c 'import json; print(json.load(open("resp.json"))["id"])'; }
text() { $py -c 'import json; r = json.load(open("resp.json")); print("".join(c["text"] for i in r["output"] if i["type"] == "message" for c in i["content"]))'; }
start_server resp_a --responses-redis "$url" || exit 1
request POST /v1/responses '{"input": "Name a colour.", "max_output_tokens": 6, "temperature": 0}'
first=$(rid); first_text=$(text)
kill "$PID"; wait "$PID" 2> /dev/null
start_server resp_b --responses-redis "$url" || exit 1
port_b=$PORT; pid_b=$PID
request GET "/v1/responses/$first"
[ "$STATUS" = 200 ] && [ "$(text)" = "$first_text" ] && pass "a response outlives its server" \
  || failed "response after a restart: $STATUS $(head -c 300 resp.json)"
request POST /v1/responses "{\"previous_response_id\": \"$first\", \"input\": \"And another?\", \"max_output_tokens\": 6, \"temperature\": 0}"
second=$(rid); second_text=$(text)
request POST /v1/chat/completions "$($py -c 'import json, sys; print(json.dumps({"messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": sys.argv[1]}, {"role": "user", "content": "And another?"}], "max_tokens": 6, "temperature": 0}))' "$first_text")"
chat_text=$($py -c 'import json; print(json.load(open("resp.json"))["choices"][0]["message"]["content"])')
[ -n "$second" ] && [ "$second_text" = "$chat_text" ] && pass "another server continues the conversation" \
  || failed "continued on another server: '$second_text' against '$chat_text'"
start_server resp_c --responses-redis "$url" || exit 1
request GET "/v1/responses/$second"
[ "$STATUS" = 200 ] && pass "a third server reads it" || failed "third server: $STATUS"
request DELETE "/v1/responses/$second"
PORT=$port_b
request GET "/v1/responses/$second"
[ "$STATUS" = 404 ] && pass "a deletion on one server reaches another" || failed "deleted elsewhere: $STATUS $(head -c 200 resp.json)"
ttl=$(rcli ttl "duet:response:$first")
[ "${ttl:-0}" -gt $((29 * 86400)) ] && pass "kept for 30 days (TTL $ttl s)" || failed "TTL of a response: $ttl"
# Conversations too: made on one server, continued by a response on another, whose items the first
# then lists; deleted on one, gone on the other.
port_c=$PORT
request POST /v1/conversations '{"items": [{"role": "user", "content": "Name a colour."}]}'
conv=$(rid)
PORT=$port_b
request POST /v1/responses "{\"conversation\": \"$conv\", \"input\": \"And another?\", \"max_output_tokens\": 4, \"temperature\": 0}"
conv_status=$STATUS
sleep 0.3  # the writer's queue
PORT=$port_c
request GET "/v1/conversations/$conv/items?order=asc"
items=$($py -c 'import json; print(" ".join(i["role"] for i in json.load(open("resp.json"))["data"]))' 2> /dev/null)
[ "$conv_status" = 200 ] && [ "$items" = "user user assistant" ] && pass "a conversation made on one server is continued on another and read back on the first" \
  || failed "conversation across servers: $conv_status '$items' $(head -c 200 resp.json)"
ttl=$(rcli ttl "duet:conversation:$conv")
[ "${ttl:-0}" -gt $((29 * 86400)) ] && pass "a conversation kept for 30 days (TTL $ttl s)" || failed "TTL of a conversation: $ttl"
request DELETE "/v1/conversations/$conv"
sleep 0.3
PORT=$port_b
request GET "/v1/conversations/$conv"
[ "$STATUS" = 404 ] && pass "a conversation deleted on one server is gone on another" || failed "conversation deleted elsewhere: $STATUS"
kill "$PID" "$pid_b"; wait "$PID" "$pid_b" 2> /dev/null
# Redis gone: the server goes on from its memory.
start_server resp_d --responses-redis "$url" || exit 1
request POST /v1/responses '{"input": "Hi", "max_output_tokens": 2}'
kept=$(rid)
kill "$REDIS_PID"; wait "$REDIS_PID" 2> /dev/null
request GET "/v1/responses/$kept"
[ "$STATUS" = 200 ] && pass "Redis gone: a response from memory" || failed "Redis gone, GET: $STATUS"
request POST /v1/responses "{\"previous_response_id\": \"$kept\", \"input\": \"More\", \"max_output_tokens\": 2}"
[ "$STATUS" = 200 ] && pass "Redis gone: a conversation goes on" || failed "Redis gone, previous_response_id: $STATUS $(head -c 200 resp.json)"
kill "$PID"; wait "$PID" 2> /dev/null

# 8. Bad settings are refused at start.
refused() {  # refused NAME PATTERN ARGS...
  local name="$1" pattern="$2"; shift 2
  if "$duet" serve --model model.gguf --port 0 "$@" > bad.out 2> bad.err; then
    failed "$name accepted"
  else
    grep -q -- "$pattern" bad.err && pass "$name refused" || failed "$name: $(cat bad.err)"
  fi
}
refused "a URL of another scheme" "not a redis:// URL" --kv-cache-redis http://127.0.0.1:6379
refused "a bad port" "port '99999'" --kv-cache-redis redis://127.0.0.1:99999
refused "no prefix caching" "prefix caching is off" --kv-cache-redis "$url" --no-prefix-caching --kv-cache-memory 33554432
refused "a zero TTL" "expected 1 or more" --kv-cache-redis "$url" --kv-cache-redis-ttl 0 --kv-cache-memory 33554432
refused "responses in Redis without a store" "responses-store-mib 0" --responses-redis "$url" --responses-store-mib 0
refused "a bad responses URL" "not a redis:// URL" --responses-redis http://127.0.0.1:6379
printf 'kv_cache_redis: "ftp://x"\n' > bad.yaml
refused "a bad URL in the YAML" "not a redis:// URL" --config bad.yaml --kv-cache-memory 33554432
echo "$failures failures"
[ "$failures" -eq 0 ]
