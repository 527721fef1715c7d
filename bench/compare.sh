#!/bin/bash
# duet against llama.cpp on the same GGUF files, in alternation, one engine at a time:
#
#   bench/compare.sh [-t THREADS] [-p 512] [-n 128] [-r 3] [--rounds 2] [--duet build/duet] \
#       LLAMA_BENCH MODEL.gguf [MODEL.gguf ...]
#
# LLAMA_BENCH is llama.cpp's llama-bench (or a build directory holding bin/llama-bench). Each round
# runs `duet bench` then `llama-bench` on every model with the same -p/-n/-r/-t, both with
# `-o jsonl`; the table at the end gives each engine's mean over the rounds and duet's ratio.
# The raw JSON lines stay in $BENCH_OUT (default: a temporary directory, printed at the end).
set -euo pipefail

threads=$(nproc)
prompt=512
gen=128
reps=3
rounds=2
duet="$(cd "$(dirname "$0")/.." && pwd)/build/duet"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t) threads="$2"; shift 2 ;;
    -p) prompt="$2"; shift 2 ;;
    -n) gen="$2"; shift 2 ;;
    -r) reps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --duet) duet="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    -*) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ ${#args[@]} -lt 2 ]; then
  echo "usage: bench/compare.sh [options] LLAMA_BENCH MODEL.gguf [MODEL.gguf ...] (--help)" >&2
  exit 2
fi
llama="${args[0]}"
[ -d "$llama" ] && llama="$llama/bin/llama-bench"
[ -x "$llama" ] || { echo "compare.sh: $llama is not an executable llama-bench" >&2; exit 2; }
[ -x "$duet" ] || { echo "compare.sh: $duet is not built (make build)" >&2; exit 2; }
models=("${args[@]:1}")
for m in "${models[@]}"; do [ -f "$m" ] || { echo "compare.sh: no model file $m" >&2; exit 2; }; done

out="${BENCH_OUT:-$(mktemp -d)}"
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  for m in "${models[@]}"; do
    name=$(basename "$m")
    echo "round $round: duet on $name" >&2
    "$duet" bench -m "$m" -p "$prompt" -n "$gen" -r "$reps" -t "$threads" -o jsonl >> "$out/duet.jsonl"
    echo "round $round: llama.cpp on $name" >&2
    "$llama" -m "$m" -p "$prompt" -n "$gen" -r "$reps" -t "$threads" -o jsonl 2>/dev/null >> "$out/llama.jsonl"
  done
done

/usr/bin/python3 - "$out/duet.jsonl" "$out/llama.jsonl" "$threads" <<'PY'
import json, os, statistics, sys

def load(path):
    runs = {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        test = f"pp{j['n_prompt']}" if j["n_prompt"] > 0 else f"tg{j['n_gen']}"
        runs.setdefault((os.path.basename(j["model_filename"]), test), []).append(j["avg_ts"])
    return runs

duet, llama = load(sys.argv[1]), load(sys.argv[2])
print(f"| model | test | threads | duet t/s | llama.cpp t/s | duet / llama.cpp |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for key in sorted(duet):
    d = statistics.mean(duet[key])
    l = statistics.mean(llama[key]) if key in llama else float("nan")
    print(f"| {key[0]} | {key[1]} | {sys.argv[3]} | {d:.2f} | {l:.2f} | {d / l:.2f}x |")
PY
echo "raw results: $out" >&2
