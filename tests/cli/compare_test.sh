#!/bin/bash
# bench/compare.sh's tables, with stand-in engines whose tokens/s are known: a fake `duet` and a
# fake llama-bench that print llama-bench JSON lines, their figures changing from round to round.
# Checks the means, the ratio of the means and the per-round ratios' range and median.
#   compare_test.sh ROOT WORKDIR
set -u
root="$1" work="$2"
rm -rf "$work" && mkdir -p "$work/bin" && cd "$work" || exit 1
. "$root/tests/cli/lib.sh"

# Each engine counts its runs in a file, and its figures follow the count (one run per round).
cat > bin/duet <<'SH'
#!/bin/bash
# duet bench -m M -p P -n N -d D -r R -t T -o jsonl: rounds give pp 100, 300, 200 and tg 30, 30, 30.
c=$(( $(cat "$(dirname "$0")/duet.count" 2>/dev/null || echo 0) + 1 )); echo "$c" > "$(dirname "$0")/duet.count"
pp=(0 100 300 200)
m="$3"
echo "{\"model_filename\": \"$m\", \"n_prompt\": 64, \"n_gen\": 0, \"n_depth\": 0, \"avg_ts\": ${pp[$c]}}"
echo "{\"model_filename\": \"$m\", \"n_prompt\": 0, \"n_gen\": 16, \"n_depth\": 0, \"avg_ts\": 30}"
SH
cat > bin/llama-bench <<'SH'
#!/bin/bash
# llama-bench: pp 50, 100, 100 and tg 20, 24, 16 over the rounds.
if [ "${1:-}" = "--help" ]; then echo "  -o, --output <csv|json|jsonl|md|sql>"; echo "  -d, --n-depth <n>"; exit 0; fi
c=$(( $(cat "$(dirname "$0")/llama.count" 2>/dev/null || echo 0) + 1 )); echo "$c" > "$(dirname "$0")/llama.count"
pp=(0 50 100 100); tg=(0 20 24 16)
m="$2"
echo "{\"model_filename\": \"$m\", \"n_prompt\": 64, \"n_gen\": 0, \"n_depth\": 0, \"avg_ts\": ${pp[$c]}}"
echo "{\"model_filename\": \"$m\", \"n_prompt\": 0, \"n_gen\": 16, \"n_depth\": 0, \"avg_ts\": ${tg[$c]}}"
SH
chmod +x bin/duet bin/llama-bench
: > model.gguf

expect_ok "three rounds" env BENCH_OUT="$work/out3" bash "$root/bench/compare.sh" -t 1 -p 64 -n 16 -r 1 --rounds 3 \
  --duet "$work/bin/duet" --llama "$work/bin/llama-bench" model.gguf
cp out.txt three.txt
# pp: duet's mean 200, llama.cpp's 83.33, 2.40x; per round 2.00, 3.00, 2.00.
contains "the ratio of the means" '\| model.gguf \| pp64 \| 200.00 \| 83.33 \| 2.40x \|' three.txt
contains "the rounds' range and median" '\| pp64 \|.*\| 2.00-3.00x, median 2.00x \|' three.txt
# tg: 30 against 20; per round 1.50, 1.25, 1.88 (30 / 16 = 1.875).
contains "tg's rounds" '\| tg16 \| 30.00 \| 20.00 \| 1.50x \| 1.25-1.88x, median 1.50x \|' three.txt
contains "the header names the column" '\| duet / llama.cpp \| per round \|' three.txt

rm -f bin/*.count
expect_ok "one round" env BENCH_OUT="$work/out1" bash "$root/bench/compare.sh" -t 1 -p 64 -n 16 -r 1 --rounds 1 \
  --duet "$work/bin/duet" --llama "$work/bin/llama-bench" model.gguf
contains "one round has no range" '\| pp64 \| 100.00 \| 50.00 \| 2.00x \| - \|' out.txt

# A folder that holds a run's lines is refused (exit 2, a usage error): they would enter the means.
BENCH_OUT="$work/out1" bash "$root/bench/compare.sh" --rounds 1 --duet "$work/bin/duet" \
  --llama "$work/bin/llama-bench" model.gguf > out.txt 2> err.txt
rc=$?
if [ "$rc" -eq 2 ] && grep -q "already holds an earlier run" err.txt; then pass "an earlier run's folder is refused"
else failed "an earlier run's folder is refused (exit $rc)"; cat err.txt; fi

[ "$failures" -eq 0 ] || { echo "$failures failed"; exit 1; }
echo "all passed"
