#!/usr/bin/env bash
# usage: batch_window_test.sh DUET_BINARY WORK_DIR
# The batching window (--batch-wait-ms) against a real server: a lone new request waits the
# window for company, one at the token threshold does not, requests that arrive within the window
# share it, a running stream goes on while a new request is held, and it is off by default.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

"$duet" make-model --preset tiny --type q8_0 --seed 5 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf
body='{"prompt": "Hello there", "max_tokens": 1, "temperature": 0}'

# seconds BODY: the wall time of one completion
seconds() { curl -s -o /dev/null -w '%{time_total}' -H 'Content-Type: application/json' --data-binary "$1" "http://127.0.0.1:$PORT/v1/completions"; }
at_least() { $py -c "import sys; sys.exit(0 if float('$1') >= float('$2') else 1)"; }

start_server window --batch-wait-ms 1500 --batch-wait-tokens 64 || exit 1
t=$(seconds "$body")
at_least "$t" 1.5 && pass "a lone request waits the window ($t s)" || failed "a lone request took $t s, expected >= 1.5"
long=$($py -c "import json; print(json.dumps({'prompt': ' '.join(['word'] * 80), 'max_tokens': 1, 'temperature': 0}))")
t=$(seconds "$long")
at_least "$t" 1.5 && failed "a request over --batch-wait-tokens waited ($t s)" || pass "a request over the token threshold does not wait ($t s)"

# Three requests sent 0.3 s apart: all three finish together, about 1.5 s after the first.
clients=()
for i in 1 2 3; do
  curl -s -o "r$i.json" -w '%{time_total}\n' -H 'Content-Type: application/json' --data-binary "$body" \
    "http://127.0.0.1:$PORT/v1/completions" > "t$i.txt" &
  clients+=($!)
  sleep 0.3
done
wait "${clients[@]}"
t1=$(cat t1.txt); t3=$(cat t3.txt)
if at_least "$t1" 1.5 && $py -c "import sys; sys.exit(0 if float('$t3') < 1.5 else 1)" \
   && grep -q '"text"' r1.json && grep -q '"text"' r3.json; then
  pass "requests within the window share it (first $t1 s, third $t3 s)"
else
  failed "window sharing: first $t1 s, third $t3 s"
fi

kill "$PID"

# A running stream is never paused by the window: while a new request is held for 1.5 s, the
# stream's chunks keep coming (no gap near the window), and the new one still waits the window.
# (A larger model with a longer context, so the stream outlasts the windows.)
"$duet" make-model --preset tiny --type q8_0 --seed 6 --n-embd 512 --n-ff 1536 --n-layer 6 --n-head 8 --n-head-kv 8 \
  --ctx 4096 -o long.gguf 2> /dev/null || { echo "make-model long failed"; exit 1; }
model_file=long.gguf
start_server stream --batch-wait-ms 1500 --batch-wait-tokens 64 || exit 1
if $py - "$PORT" <<'PY'
import http.client, json, sys, threading, time
port = int(sys.argv[1])
stream = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
stream.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon", "max_tokens": 4000, "ignore_eos": True,
               "stream": True, "temperature": 0}), {"Content-Type": "application/json"})
resp = stream.getresponse()
assert resp.status == 200, resp.status
arrivals = []
def read_stream():  # the time each chunk arrives, read as it comes
    try:
        for line in resp:
            if line.startswith(b"data: {"):
                arrivals.append(time.monotonic())
    except Exception:
        pass
threading.Thread(target=read_stream, daemon=True).start()
while not arrivals:
    time.sleep(0.01)
time.sleep(1.6)                        # past the stream's own window
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
t0 = time.monotonic()
c.request("POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 1}), {"Content-Type": "application/json"})
r = c.getresponse()
r.read()
t1 = time.monotonic()
during = [t for t in arrivals if t0 <= t <= t1]
gaps = [b - a for a, b in zip([t0] + during, during + [t1])]
print(f"new request {t1 - t0:.2f} s, {len(during)} stream chunks meanwhile, longest gap {max(gaps):.3f} s")
stream.close()
assert r.status == 200, r.status
assert t1 - t0 >= 1.4, t1 - t0
assert len(during) > 10 and max(gaps) < 0.75, max(gaps)
PY
then pass "a running stream goes on while a new request is held"; else failed "a running stream paused for the window"; fi
kill "$PID"
model_file=tiny.gguf

start_server nowindow || exit 1
t=$(seconds "$body")
at_least "$t" 1.5 && failed "without the window a request waited ($t s)" || pass "no window by default ($t s)"
kill "$PID"

if "$duet" serve --model tiny.gguf --port 0 --batch-wait-ms -5 > bad.out 2> bad.err; then
  failed "a negative --batch-wait-ms was accepted"
else
  grep -q "batch_wait_ms" bad.err && pass "a negative --batch-wait-ms is refused" || failed "message: $(cat bad.err)"
fi
printf 'batch_wait_ms: 1500\nbatch_wait_tokens: 64\n' > window.yaml
start_server yaml --config window.yaml || exit 1
t=$(seconds "$body")
at_least "$t" 1.5 && pass "batch_wait_ms in the config file ($t s)" || failed "batch_wait_ms from the config file: $t s"
kill "$PID"
echo "$failures failures"
[ "$failures" -eq 0 ]
