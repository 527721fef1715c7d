#!/bin/bash
# One device against a pipeline of devices on the same model and cores, in alternation:
#
#   bench/device_map.sh [--rounds 2] [--duet build/duet] [--base OTHER_DUET] \
#       [--map "layers.0-11=cpu[0],layers.12-23=cpu[1]"] [-t 2] MODEL.gguf
#
# Each round runs, for `cpu` with -t threads and for the map (default: the layers halved over
# cpu[0] and cpu[1]): offline throughput at 16 streams (`bench throughput`, 64 requests of 64 in /
# 32 out), serving at 16 streams (`duet serve` driven by `bench serve`, 64 requests of 64 / 32),
# and single-stream decode (`bench -p 0 -n 32`). With --base, that binary's `cpu` runs too (the
# same work on a build from before a change: no regression). The table gives each configuration's
# mean over the rounds and its ratio to `cpu`; the per-device busy and copy times of the last
# throughput run of the map follow it.
set -euo pipefail

rounds=2
threads=2
duet="$(cd "$(dirname "$0")/.." && pwd)/build/duet"
base=""
map=""
model=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duet) duet="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    --map) map="$2"; shift 2 ;;
    -t) threads="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) echo "device_map.sh: unknown option $1" >&2; exit 2 ;;
    *) model="$1"; shift ;;
  esac
done
[ -n "$model" ] || { echo "usage: bench/device_map.sh [options] MODEL.gguf (--help)" >&2; exit 2; }
[ -x "$duet" ] || { echo "device_map.sh: $duet is not built (make build)" >&2; exit 2; }
if [ -z "$map" ]; then
  layers=$("$duet" inspect "$model" | grep -oE '\.block_count = [0-9]+' | grep -oE '[0-9]+$')
  half=$((layers / 2))
  map="layers.0-$((half - 1))=cpu[0],layers.$half-$((layers - 1))=cpu[1]"
fi
out="${BENCH_OUT:-$(mktemp -d)}"
mkdir -p "$out"
# The table reads every row appended to rows.txt: an earlier run's would enter it, so refused.
if [ -e "$out/rows.txt" ]; then
  echo "device_map.sh: $out already holds an earlier run's rows.txt; set BENCH_OUT to a new or empty folder" >&2
  exit 2
fi
vocab=$("$duet" inspect "$model" | grep -oE 'tokenizer: .* ([0-9]+) tokens' | grep -oE '[0-9]+ tokens' | grep -oE '[0-9]+')

configs=("cpu|$duet|-t $threads" "map|$duet|--device-map $map")
[ -n "$base" ] && configs=("base cpu|$base|-t $threads" "${configs[@]}")

# serve_once BINARY ARGS...: output tokens/s and p99 TTFT (ms) of one serving run.
serve_once() {
  local bin="$1"; shift
  "$bin" serve --model "$model" --served-model-name m --port 0 --max-num-seqs 16 "$@" > "$out/serve.out" 2> "$out/serve.err" &
  local pid=$!
  for _ in $(seq 1 600); do grep -q "duet: ready" "$out/serve.err" 2>/dev/null && break; sleep 0.1; done
  local port
  port=$(grep -oE "listening on http://127.0.0.1:[0-9]+" "$out/serve.err" | grep -oE "[0-9]+$" | head -1)
  "$duet" bench serve --base-url "http://127.0.0.1:$port" --model m -c 16 -n 64 --input-len 64 --output-len 32 \
    --token-ids --vocab-size "$vocab" --json "$out/serve.json" > /dev/null
  kill -TERM "$pid"; wait "$pid" || true
  /usr/bin/python3 -c "import json; d=json.load(open('$out/serve.json')); print(d['output_throughput'], d['p99_ttft_ms'], d['failed'] if 'failed' in d else 0)"
}

for r in $(seq 1 "$rounds"); do
  for c in "${configs[@]}"; do
    IFS='|' read -r label bin args <<< "$c"
    # shellcheck disable=SC2086
    tput=$("$bin" bench throughput --model "$model" --num-prompts 64 --input-len 64 --output-len 32 --max-num-seqs 16 $args 2> /dev/null \
      | tee "$out/throughput-$label.txt" | grep -oE '[0-9.]+ output tokens/s' | grep -oE '^[0-9.]+')
    # shellcheck disable=SC2086
    serve=$(serve_once "$bin" $args)
    # shellcheck disable=SC2086
    decode=$("$bin" bench --model "$model" -p 0 -n 32 -r 2 -o jsonl $args 2> /dev/null | /usr/bin/python3 -c \
      "import json, sys; print([json.loads(l)['avg_ts'] for l in sys.stdin if l.strip()][0])")
    echo "$r|$label|$tput|$serve|$decode" | tee -a "$out/rows.txt"
  done
done

/usr/bin/python3 - "$out/rows.txt" <<'PY'
import sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r, label, tput, serve, decode = line.strip().split("|")
    s = serve.split()
    rows[label].append((float(tput), float(s[0]), float(s[1]), float(decode)))
mean = {k: [sum(v[i] for v in vs) / len(vs) for i in range(4)] for k, vs in rows.items()}
ref = mean["cpu"]
print("| config | throughput, 16 streams (out tok/s) | serving, 16 streams (out tok/s) | p99 TTFT (ms) | decode, 1 stream (tok/s) |")
print("| --- | --- | --- | --- | --- |")
for k, m in mean.items():
    print(f"| {k} | {m[0]:.1f} ({m[0] / ref[0]:.2f}x) | {m[1]:.1f} ({m[1] / ref[1]:.2f}x) | {m[2]:.0f} | {m[3]:.1f} ({m[3] / ref[3]:.2f}x) |")
PY
echo "map: $map"
grep '^Device' "$out/throughput-map.txt" || true
echo "raw rows: $out/rows.txt"
