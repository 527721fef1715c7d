#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEEDS LIMIT WORK [RANDOM_SEED]
# Runs a libFuzzer target over the seed corpus SEEDS (read only: new inputs go to WORK/corpus),
# first running every seed, then mutating for LIMIT: "300s" is a time, "20000" a number of
# inputs. RANDOM_SEED seeds libFuzzer's mutations. `make test` gives a number of inputs and seed
# 1 and starts from the seeds alone (WORK/corpus emptied), so a slow machine explores as far as a
# fast one (libFuzzer's choices still vary a little from run to run: coverage of code that reads
# the clock or random ids differs). Without a seed every run explores anew. Exits non-zero, printing the input that failed and the report, when the target crashes,
# leaks, times out (10 s for one input) or exceeds 2 GiB.
set -u
fuzzer=$1 seeds=$2 limit=$3 work=$4 random_seed=${5:-0}
name=$(basename "$fuzzer")
if [ ! -d "$seeds" ] || [ -z "$(ls -A "$seeds")" ]; then
  echo "FAIL: $name: no seed corpus in $seeds" >&2
  exit 1
fi
case "$limit" in
  *s) limit_flag="-max_total_time=${limit%s}" what="in ${limit%s} s" ;;
  *) limit_flag="-runs=$limit" what="(a fixed count, seed $random_seed)"
     rm -rf "$work/corpus" ;;
esac
rm -rf "$work/artifacts"
mkdir -p "$work/corpus" "$work/artifacts"
log="$work/log"
"$fuzzer" -seed="$random_seed" "$limit_flag" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
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
echo "ok: $name: ${runs:-?} inputs $what, $(ls "$seeds" | wc -l) seeds, ${cov:-cov: ?}, no finding"
