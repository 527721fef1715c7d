#!/usr/bin/env bash
# usage: failover_test.sh DUET_BINARY WORK_DIR
# A model over two devices; one of them fails (DUET_FAULT) or hangs (POST /admin/fault) in the
# middle of 16 concurrent greedy requests. Every request must complete with the text it gets
# without the fault, the server must stay healthy, and the failover must be counted, reported on
# /health/devices and logged with its recovery time (under 30 s).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

"$duet" make-model --preset tiny --type q8_0 --seed 7 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf
MAP="layers.0-0=guarded:0,layers.1-1=guarded:1"
KEY=admin-key

# sixteen NAME: 16 concurrent greedy completions; their texts, by prompt, in NAME.json.
sixteen() {
  local name="$1" pids=() i
  for i in $(seq 0 15); do
    curl -s -H 'Content-Type: application/json' -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT/v1/completions" \
      -d "{\"prompt\": \"request $i: the numbers $i, $((i * 7)), $((i * 13))\", \"max_tokens\": 24, \"temperature\": 0, \"ignore_eos\": true}" \
      -o "$name.$i.json" &
    pids+=($!)
  done
  wait "${pids[@]}"
  $py - "$name" <<'PY'
import json, sys
name = sys.argv[1]
texts = {}
for i in range(16):
    body = json.load(open(f"{name}.{i}.json"))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length", body
    assert body["usage"]["completion_tokens"] == 24, body
    texts[i] = choice["text"]
json.dump(texts, open(f"{name}.json", "w"))
PY
}

metric() { curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^$1( |\{)" | head -1 | awk '{print $NF}'; }

# Without a fault: the texts to expect.
start_server plain --device-map "$MAP" --api-key "$KEY" || exit 1
if sixteen expected; then pass "16 requests without a fault"; else failed "16 requests without a fault"; fi
kill -TERM "$PID"; wait "$PID"

# check NAME SERVER [TO]: the texts equal the expected ones, the server is healthy, one failover
# counted, guarded:1's parts moved to TO (default guarded:0, the map's other device).
check() {
  local name="$1" server="$2" to="${3:-guarded:0}"
  if $py - expected.json "$name.json" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
bad = [k for k in a if a[k] != b.get(k)]
assert not bad, f"requests {bad} differ"
PY
  then pass "$name: every request ends as without the fault"; else failed "$name: texts differ"; fi
  request GET /health ""
  [ "$STATUS" = 200 ] && pass "$name: /health 200 after the failover" || failed "$name: /health $STATUS"
  request GET /health/devices ""
  if [ "$STATUS" = 200 ] && $py - resp.json "$to" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["failovers"] == 1, d
states = {x["name"]: x for x in d["devices"]}
assert states["guarded:1"]["state"] == "failed" and states["guarded:1"]["reason"], d
assert states["guarded:0"]["state"] == "ok", d
assert states[sys.argv[2]]["state"] == "ok", d
PY
  then pass "$name: /health/devices shows guarded:1 failed"; else failed "$name: /health/devices $(head -c 400 resp.json)"; fi
  [ "$(metric duet:device_failovers_total)" = "1" ] && pass "$name: duet:device_failovers_total 1" \
    || failed "$name: failovers $(metric duet:device_failovers_total)"
  [ "$(metric 'duet:device_up\{model_name="tiny.gguf",device="guarded:1"\}')" = "0" ] && pass "$name: duet:device_up 0 for guarded:1" \
    || failed "$name: device_up $(metric 'duet:device_up\{model_name="tiny.gguf",device="guarded:1"\}')"
  local took
  took=$(grep -oE "failed over to $to in [0-9.]+ s" "$server.err" | grep -oE "[0-9.]+ s" | grep -oE "[0-9.]+")
  if [ -n "$took" ] && $py -c "import sys; sys.exit(0 if float('$took') < 30 else 1)"; then
    pass "$name: recovered in $took s"
  else
    failed "$name: recovery time '$took'"; tail -5 "$server.err"
  fi
}

# A device that fails at its 10th unit of work (DUET_FAULT at start-up).
DUET_FAULT="device=guarded:1;step=10;mode=fail" start_server failing --device-map "$MAP" --api-key "$KEY" || exit 1
sixteen failing && check failing failing || failed "failing: requests"
kill -TERM "$PID"; wait "$PID"

# The same fault with a spare outside the map: guarded:1's parts go to guarded:2. A spare this
# machine cannot have is refused at start, by name.
DUET_FAULT="device=guarded:1;step=10;mode=fail" start_server spare --device-map "$MAP" --api-key "$KEY" \
  --spare-devices guarded:2 || exit 1
sixteen spare && check spare spare guarded:2 || failed "spare: requests"
kill -TERM "$PID"; wait "$PID"
for bad in x cpu:77 "cpu[9999]"; do
  timeout 60 "$duet" serve --model tiny.gguf --port 0 --device-map "$MAP" --spare-devices "guarded:2,$bad" > bad.out 2> bad.err
  [ $? -eq 1 ] && grep -qF -- "--spare-devices: device '$bad'" bad.err && pass "--spare-devices $bad refused at start" \
    || failed "--spare-devices $bad: $(tail -2 bad.err)"
done

# A device that hangs (armed through the admin route, behind the API key).
start_server hanging --device-map "$MAP" --api-key "$KEY" --health-check-timeout 2 || exit 1
request POST /admin/fault '{"device": "guarded:1", "step": 10, "mode": "hang"}'
[ "$STATUS" = 401 ] && pass "/admin/fault needs the API key" || failed "/admin/fault without a key: $STATUS"
request POST /admin/fault '{"device": "guarded:1", "step": 10, "mode": "sideways"}' -H "Authorization: Bearer $KEY"
[ "$STATUS" = 400 ] && grep -q "sideways" resp.json && pass "/admin/fault refuses a bad mode" || failed "bad mode: $STATUS"
request POST /admin/fault '{"device": "guarded:1", "step": 10, "mode": "hang"}' -H "Authorization: Bearer $KEY"
[ "$STATUS" = 200 ] && pass "/admin/fault arms a hang" || failed "/admin/fault: $STATUS $(cat resp.json)"
sixteen hanging && check hanging hanging || failed "hanging: requests"
kill -TERM "$PID"; wait "$PID" && pass "the server stops cleanly after a hang" || failed "exit after a hang ($?)"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
