#!/usr/bin/env bash
# usage: degrade_test.sh DUET_BINARY WORK_DIR
# Out of memory is not fatal. A bf16 model started under a --memory-limit it does not fit in:
# the server starts with its weights re-quantized to Q8_0, says so in its log and /metrics,
# answers, and stays under the limit; the same limit with --degrade-on-oom off is a start-up
# error naming the numbers (exit status 1, no signal). At run time, a step that runs out of
# memory (DUET_FAULT mode oom, and POST /admin/fault) is computed again with the same text, or
# (off) fails its requests alone; /health stays 200 and later requests are served; repeated
# events shrink the KV pool and degrade the KV cache and the weights.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

# 12 layers of 512, bf16: 98 MiB of weights (53 MiB as Q8_0); with the 32 MiB KV pool of
# start_server it needs 130 MiB as it is and 85 MiB degraded.
"$duet" make-model --preset tiny --type bf16 --n-embd 512 --layers 12 --n-ff 2048 --n-head 8 --n-head-kv 8 --seed 3 \
  -o big.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=big.gguf
LIMIT=120M
KEY=admin-key

metric() { curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^$1( |\{)" | head -1 | awk '{print $NF}'; }
degraded() { metric "duet:degraded\{model_name=\"big.gguf\",what=\"$1\"\}"; }
complete() {  # complete NAME PROMPT: a greedy completion of 12 tokens into NAME.json; its status
  curl -s -o "$1.json" -w '%{http_code}' -H 'Content-Type: application/json' -H "Authorization: Bearer $KEY" \
    "http://127.0.0.1:$PORT/v1/completions" \
    -d "{\"prompt\": \"$2\", \"max_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true}"
}
text() { $py -c "import json,sys; print(json.load(open(sys.argv[1]))['choices'][0]['text'])" "$1.json"; }

# --- at load: degraded to fit --------------------------------------------------------------
start_server limited --memory-limit "$LIMIT" || exit 1
grep -q "re-quantized to Q8_0" limited.err && grep -qE "needs .* as it is .*memory limit of 120.0 MiB" limited.err \
  && pass "the log says the weights were re-quantized to fit the limit" \
  || failed "no degradation in the log: $(grep memory: limited.err | head -3)"
[ "$(degraded weights)" = "1" ] && pass "duet:degraded{what=weights} 1" || failed "degraded weights: '$(degraded weights)'"
[ "$(degraded kv)" = "0" ] && pass "duet:degraded{what=kv} 0" || failed "degraded kv: '$(degraded kv)'"
for i in 1 2 3; do
  code=$(complete limited$i "a degraded model answers $i")
  [ "$code" = 200 ] || failed "completion $i under the limit: $code $(head -c 300 limited$i.json)"
done
answer=$(text limited3)
[ "$code" = 200 ] && [ -n "$answer" ] && pass "the degraded server answers (${#answer} characters)"
rss=$(awk '/VmRSS/ {print $2}' /proc/$PID/status)
if [ -n "$rss" ] && [ "$rss" -lt $((120 * 1024)) ]; then
  pass "resident $((rss / 1024)) MiB after requests, under the 120 MiB limit"
else
  failed "resident ${rss:-?} KiB over the limit of 120 MiB"
fi
kill -TERM "$PID"; wait "$PID"

# --- the same limit with degradation off: a clear start-up error, not a crash ---------------
"$duet" serve --model big.gguf --port 0 --kv-cache-memory 33554432 --threads 1 --memory-limit "$LIMIT" \
  --degrade-on-oom off > off.out 2> off.err
status=$?
if [ "$status" = 1 ] && grep -q "does not fit in memory" off.err && grep -qE "needs 1[23][0-9]\.[0-9] MiB" off.err \
  && grep -q "memory limit of 120.0 MiB" off.err && grep -q -- "--degrade-on-oom auto" off.err; then
  pass "--degrade-on-oom off: exit status 1 with the numbers ($(grep -oE 'needs [0-9.]+ MiB' off.err | head -1))"
else
  failed "--degrade-on-oom off: status $status: $(tail -3 off.err)"
fi
[ "$status" -lt 128 ] && pass "no signal ended it" || failed "ended by a signal ($status)"
printf 'model: big.gguf\nmemory_limit: 120M\ndegrade_on_oom: "off"\nkv_cache_memory: 33554432\n' > off.yaml
"$duet" serve --config off.yaml --port 0 --threads 1 > yaml.out 2> yaml.err
[ $? = 1 ] && grep -q "does not fit in memory" yaml.err && pass "memory_limit and degrade_on_oom in the YAML" \
  || failed "YAML keys: $(tail -2 yaml.err)"

# --- at run time: a step out of memory is computed again ------------------------------------
four() {  # four NAME: four concurrent greedy completions
  local pids=() i
  for i in 0 1 2 3; do
    complete "$1.$i" "request $i: the numbers $i, $((i * 7)), $((i * 13))" > "$1.$i.code" &
    pids+=($!)
  done
  wait "${pids[@]}"
}
start_server plain --api-key "$KEY" || exit 1
four expected
kill -TERM "$PID"; wait "$PID"

DUET_FAULT="device=cpu;step=6;mode=oom" start_server retried --api-key "$KEY" || exit 1
four retried
same=0
for i in 0 1 2 3; do
  [ "$(cat retried.$i.code)" = 200 ] && [ "$(text retried.$i)" = "$(text expected.$i)" ] && same=$((same + 1))
done
[ "$same" = 4 ] && pass "an out-of-memory step: all 4 requests end with the text they have without it" \
  || failed "retried: $same of 4 as without the fault"
grep -q "ran out of memory" retried.err && pass "the event is logged" || failed "no log line for the event"
[ "$(metric duet:oom_events_total)" = "1" ] && pass "duet:oom_events_total 1" || failed "oom events $(metric duet:oom_events_total)"
request GET /health ""
[ "$STATUS" = 200 ] && pass "/health 200 after the event" || failed "/health $STATUS"
[ "$(complete later "a later request")" = 200 ] && pass "a later request is served" || failed "later: $(cat later.json)"

# Repeated events through the admin route climb the ladder: shrink, q8_0 KV, Q8_0 weights.
for round in 2 3 4; do
  request POST /admin/fault '{"device": "cpu", "step": 2, "mode": "oom"}' -H "Authorization: Bearer $KEY"
  [ "$STATUS" = 200 ] || failed "arming oom: $STATUS"
  code=$(complete round$round "round $round")
  [ "$code" = 200 ] || failed "round $round: $code $(head -c 300 round$round.json)"
done
[ "$(metric duet:oom_events_total)" = "4" ] && pass "four events counted" || failed "events $(metric duet:oom_events_total)"
grep -q "the KV pool shrinks" retried.err && [ "$(metric 'duet:kv_cache_blocks_withheld\{model_name="big.gguf"\}')" != "0" ] \
  && pass "the second event shrank the KV pool" || failed "no shrink: $(grep memory: retried.err | tail -3)"
[ "$(degraded kv)" = "1" ] && pass "the third: duet:degraded{what=kv} 1" || failed "kv not degraded: $(grep memory: retried.err | tail -2)"
[ "$(degraded weights)" = "1" ] && pass "the fourth: duet:degraded{what=weights} 1" || failed "weights not degraded"
request GET /health ""
[ "$STATUS" = 200 ] && [ "$(complete last "after the ladder")" = 200 ] && pass "still healthy and serving" \
  || failed "after the ladder: /health $STATUS, $(cat last.json)"
kill -TERM "$PID"; wait "$PID" && pass "stops cleanly" || failed "exit status $?"

# --- at run time: the room under the limit running low (a cgroup tree written here) ------------
# 256 MiB of room under 1 GiB, then 24 MiB (under 5%): once a second the server climbs a rung
# (pause, shrink the pool, q8_0 KV, Q8_0 weights) while it still answers; room again, it goes on.
cg="$work/cgroup"
mkdir -p "$cg"
echo "memory" > "$cg/cgroup.controllers"
echo $((1 << 30)) > "$cg/memory.max"
echo $((768 << 20)) > "$cg/memory.current"
printf 'anon 1\nactive_file 0\ninactive_file 0\n' > "$cg/memory.stat"
DUET_CGROUP_DIR="$cg" start_server pressed --api-key "$KEY" || exit 1
[ "$(complete pressed1 "with room")" = 200 ] && [ "$(metric duet:low_memory_events_total)" = "0" ] \
  && pass "with room: no low-memory event" || failed "with room: $(metric duet:low_memory_events_total) events"
echo $((1000 << 20)) > "$cg/memory.current"
for _ in $(seq 1 200); do
  [ "$(degraded weights)" = "1" ] && break
  sleep 0.1
done
events=$(metric duet:low_memory_events_total)
if [ "$(degraded kv)" = "1" ] && [ "$(degraded weights)" = "1" ] && [ "${events:-0}" -ge 4 ] \
  && [ "$(metric 'duet:kv_cache_blocks_withheld\{model_name="big.gguf"\}')" != "0" ] \
  && grep -q "less than 5%" pressed.err; then
  pass "low on memory: $events events shrank the pool and degraded KV and weights"
else
  failed "low memory: events '$events', kv '$(degraded kv)', weights '$(degraded weights)': $(grep memory: pressed.err | tail -3)"
fi
echo $((768 << 20)) > "$cg/memory.current"
request GET /health ""
[ "$STATUS" = 200 ] && [ "$(complete pressed2 "room again")" = 200 ] && pass "room again: /health 200 and served" \
  || failed "after the pressure: /health $STATUS, $(cat pressed2.json)"
kill -TERM "$PID"; wait "$PID"

# --- off at run time: only that step's requests fail ----------------------------------------
DUET_FAULT="device=cpu;step=6;mode=oom" start_server failing --api-key "$KEY" --degrade-on-oom off || exit 1
four failing
bad=0
for i in 0 1 2 3; do [ "$(cat failing.$i.code)" = 200 ] || bad=$((bad + 1)); done
if [ "$bad" -ge 1 ] && grep -q "out of memory" failing.*.json; then
  pass "off: the step's requests fail ($bad of 4) with the error"
else
  failed "off: $bad failed; $(cat failing.0.json | head -c 200)"
fi
request GET /health ""
[ "$STATUS" = 200 ] && [ "$(complete after "after the failure")" = 200 ] && pass "off: /health 200 and later requests served" \
  || failed "off: /health $STATUS, $(cat after.json)"
[ "$(degraded weights)" = "0" ] && pass "off: nothing degraded" || failed "off degraded weights"
kill -TERM "$PID"; wait "$PID"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
