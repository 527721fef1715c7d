#!/usr/bin/env bash
# Energy and idling: duet:energy_joules_total is absent where the machine exposes no counter (not
# zero), and counts a RAPL package counter (a powercap tree written here, given by
# DUET_POWERCAP_DIR) with its wraps; `bench serve` turns it into joules per output token; and an
# idle server's threads park, so it uses no CPU time.
# usage: energy_test.sh DUET_BINARY WORK_DIR
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"
"$duet" make-model --preset tiny --type q8_0 --seed 1 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^$1\{" | awk '{print $2}' | head -1; }

# No counter: the metric is absent.
DUET_POWERCAP_DIR="$work/none" start_server none || exit 1
request POST /v1/completions '{"prompt": "Hello", "max_tokens": 2}'
curl -s "http://127.0.0.1:$PORT/metrics" > none.txt
if [ -s none.txt ] && ! grep -q "duet:energy_joules_total" none.txt; then pass "no counter: no energy metric"; else
  failed "no counter: $(grep energy none.txt)"; fi
"$duet" bench serve --model tiny.gguf --base-url "http://127.0.0.1:$PORT" -n 4 -c 2 --input-len 8 --output-len 4 \
  --json none-bench.json > none-bench.txt 2> none-bench.err
if grep -q "reports no duet:energy_joules_total" none-bench.err && ! grep -q "Energy" none-bench.txt &&
   $py -c "import json,sys; r=json.load(open('none-bench.json')); sys.exit(r['energy_joules'] is not None)"; then
  pass "bench serve without a counter: no energy figures"; else failed "bench serve without a counter"; cat none-bench.err; fi

kill -TERM "$PID"; wait "$PID"

# Idle: after the requests, the server's threads (two compute threads here, so a worker that
# could spin) park. CPU time of every thread over 2 idle seconds stays under 2% of one core
# (40 ms), with the default spin and with --worker-spin-us 0; a bad value is refused. The time
# comes from each thread's schedstat (nanoseconds it ran) where the kernel keeps it, else from
# utime + stime in clock ticks (which charge a whole tick to a thread that ran a moment at it).
cpu_ns() {
  if [ -r "/proc/$1/schedstat" ]; then
    cat /proc/"$1"/task/*/schedstat 2> /dev/null | awk '{s += $1} END {printf "%d\n", s}'
  else
    awk -v hz="$(getconf CLK_TCK)" '{printf "%d\n", ($14 + $15) * 1e9 / hz}' "/proc/$1/stat"
  fi
}
for spin in 250 0; do
  SERVER_THREADS=2 DUET_POWERCAP_DIR="$work/none" start_server "spin$spin" --worker-spin-us "$spin" || exit 1
  request POST /v1/completions '{"prompt": "Hello", "max_tokens": 8}'
  [ "$STATUS" = 200 ] || failed "a request with --worker-spin-us $spin ($STATUS)"
  sleep 0.5
  before=$(cpu_ns "$PID"); sleep 2; after=$(cpu_ns "$PID")
  used_ms=$(( (after - before) / 1000000 ))
  if [ "$used_ms" -le 40 ]; then pass "idle server (spin $spin us) used $used_ms ms of CPU in 2 s"; else
    failed "idle server (spin $spin us) used $used_ms ms of CPU in 2 s (40 at most)"; fi
  kill -TERM "$PID"; wait "$PID"
done
"$duet" serve --model tiny.gguf --worker-spin-us -5 > bad.out 2> bad.err
[ $? -eq 1 ] && grep -q "worker-spin-us is -5, expected 0 or more" bad.err && pass "--worker-spin-us -5 refused" \
  || failed "--worker-spin-us -5: $(cat bad.err)"

# A RAPL tree: package 0 counts, its core sub-zone does not; package 1 wraps.
mkdir -p rapl/intel-rapl:0/intel-rapl:0:0 rapl/intel-rapl:1 rapl/intel-rapl:0:0
zone() { echo "$2" > "rapl/$1/name"; echo 1000000000 > "rapl/$1/max_energy_range_uj"; echo "$3" > "rapl/$1/energy_uj"; }
zone intel-rapl:0 package-0 5000000
zone intel-rapl:0:0 core 100
zone intel-rapl:1 package-1 999000000
DUET_POWERCAP_DIR="$work/rapl" start_server rapl || exit 1
curl -s "http://127.0.0.1:$PORT/metrics" > rapl0.txt
grep -q '^# TYPE duet:energy_joules_total counter' rapl0.txt && [ "$(metric duet:energy_joules_total)" = 0 ] \
  && pass "energy counter starts at 0 J" || failed "energy at start: $(grep energy rapl0.txt)"
echo 7500000 > rapl/intel-rapl:0/energy_uj        # +2.5 J
echo 999999999 > rapl/intel-rapl:0:0/energy_uj     # a sub-zone: not counted
echo 1500000 > rapl/intel-rapl:1/energy_uj        # wrapped: +1 J to the top, +1.5 J after
got=$(metric duet:energy_joules_total)
$py -c "import sys; sys.exit(abs(float('$got') - 5.0) > 1e-6)" && pass "energy counts packages and wraps (5 J)" \
  || failed "energy: expected 5 J, got $got"
grep -q 'duet:energy_joules_total{model_name="tiny.gguf",device="cpu"}' <(curl -s "http://127.0.0.1:$PORT/metrics") \
  && pass "energy labelled device=cpu" || failed "energy labels"
# bench serve: joules per output token from the counter's rise between its two reads of /metrics,
# before the run and after it. The package counter becomes a FIFO that gives each read 1 J more
# than the last, so the rise is at least 1 J however the run and the writer are scheduled (a file
# rewritten every 50 ms once rose by 0 J over a one-second run on a loaded machine). A value can
# be lost when a read closes the FIFO just as the writer opens it again (the writer ignores
# SIGPIPE for that), so the rise is a whole number of joules, not always 1.
rm rapl/intel-rapl:0/energy_uj && mkfifo rapl/intel-rapl:0/energy_uj
( trap '' PIPE; uj=7500000
  while :; do uj=$((uj + 1000000)); echo "$uj" 2> /dev/null > rapl/intel-rapl:0/energy_uj; done ) &
writer=$!
timeout 120 "$duet" bench serve --model tiny.gguf --base-url "http://127.0.0.1:$PORT" -n 8 -c 2 --request-rate 8 \
  --input-len 8 --output-len 16 --json rapl-bench.json > rapl-bench.txt 2> rapl-bench.err
kill "$writer"; wait "$writer" 2> /dev/null
if grep -q "Energy per output token (J/tok):" rapl-bench.txt && $py - rapl-bench.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
e = r["energy_joules"]
assert e >= 1 and abs(e - round(e)) < 1e-9, e
assert abs(r["joules_per_output_token"] - e / r["total_output_tokens"]) < 1e-9, r
PY
then pass "bench serve reports joules per output token"; else failed "bench serve energy"; cat rapl-bench.txt rapl-bench.err | tail -20; fi
kill -TERM "$PID"; wait "$PID"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
