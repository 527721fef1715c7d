#!/usr/bin/env bash
# usage: bench/batch_wait.sh DUET MODEL STREAMS RATE "WAIT_MS ..." [ROUNDS]
# The batching window's effect: for each --batch-wait-ms value in turn (ROUNDS times, alternating),
# starts `duet serve` on MODEL and drives it with `duet bench serve`: STREAMS requests in flight
# at most, NUM_PROMPTS requests (default 2 x STREAMS, or STREAMS from 64 streams up) arriving as
# a Poisson process at RATE per second, 128 random prompt tokens and 32 generated each. One line
# per run: throughput and TTFT/ITL p50/p99.
set -euo pipefail
duet="$1" model="$2" streams="$3" rate="$4" waits="$5" rounds="${6:-1}"
n="${NUM_PROMPTS:-$(( streams >= 64 ? streams : 2 * streams ))}"
work=$(mktemp -d)
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
vocab=$("$duet" inspect "$model" 2>/dev/null | grep -oE 'vocab_size = [0-9]+' | grep -oE '[0-9]+' | head -1)
for r in $(seq 1 "$rounds"); do
  for w in $waits; do
    "$duet" serve --model "$model" --served-model-name bench --port 0 --batch-wait-ms "$w" --max-num-seqs "$streams" \
      > "$work/serve.out" 2> "$work/serve.err" &
    pid=$!
    for _ in $(seq 1 600); do grep -q "duet: ready" "$work/serve.err" && break; sleep 0.1; done
    port=$(grep -oE "listening on http://127.0.0.1:[0-9]+" "$work/serve.err" | grep -oE "[0-9]+$" | head -1)
    "$duet" bench serve --base-url "http://127.0.0.1:$port" --model bench -c "$streams" -n "$n" \
      --input-len 128 --output-len 32 --request-rate "$rate" --seed "$r" --token-ids --vocab-size "${vocab:-32000}" \
      --percentiles 50,99 --json "$work/r.json" > /dev/null
    kill "$pid"; wait "$pid" 2>/dev/null || true
    /usr/bin/python3 - "$work/r.json" "$w" "$streams" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"streams {sys.argv[3]} wait {sys.argv[2]:>3} ms: {r['output_throughput']:7.1f} out tok/s "
      f"{r['total_token_throughput']:7.1f} total tok/s  TTFT p50 {r['p50_ttft_ms']:8.0f} p99 {r['p99_ttft_ms']:8.0f} ms  "
      f"ITL p50 {r['p50_itl_ms']:6.0f} p99 {r['p99_itl_ms']:6.0f} ms")
PY
  done
done
