#!/usr/bin/env bash
# usage: bench/speculative_bench.sh DUET MODEL METHOD K [ROUNDS] [-- more generate options]
# Single-stream decoding with and without speculative decoding (METHOD ngram or mtp, K drafts) on
# a prompt that repeats itself, as code under edit does: `duet generate` greedy, 256 tokens,
# ignoring EOS, runs alternating (plain, drafts, plain, ...) so a shared machine's load falls on
# both alike. Prints each run's generation tok/s and the drafts' line, then the median of each and
# their ratio; the outputs of both must be identical (greedy), or it exits 1.
set -euo pipefail
duet="$1" model="$2" method="$3" k="$4" rounds="${5:-3}"
shift $(( $# < 5 ? $# : 5 ))
[ "${1:-}" = "--" ] && shift
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
prompt='def total_price(items, tax_rate):
    total = 0
    for item in items:
        total += item.price * item.quantity
    return total * (1 + tax_rate)


def total_weight(items):
    total = 0
    for item in items:
        total += item.weight * item.quantity
    return total


# The same two functions, with `total` renamed to `acc`:
def total_price(items, tax_rate):
    acc = 0
    for item in items:
        acc += item.price * item.quantity
    return acc * (1 + tax_rate)


def total_weight(items):
'
run() {  # run NAME ARGS...
  local name="$1"; shift
  "$duet" generate --model "$model" -p "$prompt" -n 256 --temperature 0 --ignore-eos "$@" > "$work/$name.txt" 2> "$work/$name.err"
  local tps; tps=$(grep -oE 'generation: [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok/s\)' "$work/$name.err" | grep -oE '[0-9.]+ tok/s' | cut -d' ' -f1)
  [ -n "$tps" ] || { echo "duet generate failed: $(tail -2 "$work/$name.err")" >&2; exit 1; }
  echo "$name $tps tok/s $(grep -o 'speculative.*' "$work/$name.err" || true)"
  echo "$tps"
}
plain=() spec=()
for r in $(seq 1 "$rounds"); do
  out=$(run "plain$r" "$@") || exit 1; echo "$out" | head -1; plain+=("$(echo "$out" | tail -1)")
  out=$(run "spec$r" --speculative-method "$method" --num-speculative-tokens "$k" "$@") || exit 1; echo "$out" | head -1; spec+=("$(echo "$out" | tail -1)")
  cmp -s "$work/plain$r.txt" "$work/spec$r.txt" || { echo "outputs differ in round $r"; exit 1; }
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mp=$(median "${plain[@]}") ms=$(median "${spec[@]}")
echo "median: without drafts $mp tok/s, with $method K=$k $ms tok/s, ratio $(awk -v a="$ms" -v b="$mp" 'BEGIN {printf "%.2f", a / b}')"
