#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEEDS SECONDS WORK [RANDOM_SEED]
# Runs a libFuzzer target for SECONDS over the seed corpus SEEDS (read only: new inputs go to
# WORK/corpus), first running every seed. RANDOM_SEED fixes libFuzzer's mutations (make test
# gives 1, so a run explores the same inputs each time); without it every run explores anew. Exits non-zero, printing the input that failed and the
# report, when the target crashes, leaks, times out (10 s for one input) or exceeds 2 GiB.
set -u
fuzzer=$1 seeds=$2 seconds=$3 work=$4 random_seed=${5:-0}
name=$(basename "$fuzzer")
if [ ! -d "$seeds" ] || [ -z "$(ls -A "$seeds")" ]; then
  echo "FAIL: $name: no seed corpus in $seeds" >&2
  exit 1
fi
rm -rf "$work/artifacts"
mkdir -p "$work/corpus" "$work/artifacts"
log="$work/log"
"$fuzzer" -seed="$random_seed" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$work/corpus" "$seeds" > "$log" 2>&1
rc=$?
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
if [ $rc -ne 0 ]; then
  echo "FAIL: $name (exit $rc) after ${runs:-?} inputs; the report:" >&2
  grep -v '^#[0-9]' "$log" | tail -60 >&2
  for a in "$work"/artifacts/*; do
    [ -f "$a" ] || continue
    echo "the input: $a ($(stat -c %s "$a") bytes); fix the code, then add it to $seeds" >&2
    head -c 400 "$a" | od -c | head -12 >&2
  done
  exit 1
fi
echo "ok: $name: ${runs:-?} inputs in ${seconds} s, $(ls "$seeds" | wc -l) seeds, ${cov:-cov: ?}, no finding"
