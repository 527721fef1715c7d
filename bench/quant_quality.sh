#!/bin/bash
# What each `duet quantize` type costs in quality, as a markdown table:
#
#   bench/quant_quality.sh [--duet build/duet] [-t THREADS] [--max-tokens 1024] [--types "..."] \
#       BASE.gguf|FOLDER [WORK_DIR]
#
# Quantizes BASE to every type (awq4 calibrates on the built-in corpus's first 512 tokens), then
# runs `duet kl-divergence BASE QUANT` on the second half of the built-in corpus (text the
# calibration did not see) and prints one row per type: bits per weight, mean KL divergence of the
# next-token distributions with its standard error, 99th percentile, top-1 agreement, perplexity.
set -euo pipefail

duet="$(cd "$(dirname "$0")/.." && pwd)/build/duet"
threads=$(nproc)
max_tokens=1024
types="q8_0 q6_k q4_k_m q4_k q4_0 q4_1 awq4"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --duet) duet="$2"; shift 2 ;;
    -t) threads="$2"; shift 2 ;;
    --max-tokens) max_tokens="$2"; shift 2 ;;
    --types) types="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    -*) echo "quant_quality.sh: unknown option $1" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
[ ${#args[@]} -ge 1 ] || { sed -n '2,10p' "$0"; exit 2; }
base="${args[0]}"
work="${args[1]:-$(mktemp -d)}"
mkdir -p "$work"

echo "| type | bits/weight | mean KL | 99th pct KL | top-1 same | perplexity (base) |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for t in $types; do
  out="$work/quant-$t.gguf"
  "$duet" quantize "$base" "$out" --type "$t" -t "$threads" 2> "$work/quantize-$t.log"
  json=$("$duet" kl-divergence "$base" "$out" --max-tokens "$max_tokens" -t "$threads" --json 2> /dev/null)
  bpw=$("$duet" inspect "$out" | sed -nE 's/^parameters: .*, ([0-9.]+) bits per weight$/\1/p')
  /usr/bin/python3 - "$t" "$json" "$bpw" <<'PY'
import json, sys
t, r, bpw = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] or "?"
print(f"| {t} | {bpw} | {r['kl_mean']:.5f} ± {r['kl_stderr']:.1g} | {r['kl_p99']:.4f} | "
      f"{100 * r['top1_agreement']:.1f}% | {r['ppl_quant']:.2f} ({r['ppl_base']:.2f}) |")
PY
done
echo "(work files in $work)" >&2
