#!/bin/bash
# duet against llama.cpp and ik_llama.cpp on the same GGUF files, in alternation, one engine at a
# time, and one table of ratios per engine:
#
#   bench/compare.sh [-t THREADS] [-p 512] [-n 128] [-d 0] [-r 3] [--rounds 2] [--duet build/duet] \
#       [--llama LLAMA] [--ik IK_LLAMA] [--ik-args "--run-time-repack 1"] MODEL.gguf [MODEL.gguf ...]
#   bench/compare.sh [options] LLAMA MODEL.gguf [...]      (the older form: LLAMA first)
#
# LLAMA and IK_LLAMA are a llama-bench binary or a build directory holding bin/llama-bench. -p, -n
# and -d take comma separated lists; -d is llama-bench's depth (the tests run after that many
# tokens of context: "tg128 @ d8192"). An engine whose llama-bench has no -d gets its depth tests
# another way: ik_llama.cpp's `-gp D,N` (N tokens generated after a D-token prompt, only the
# generation timed) or llama-batched-bench beside it (its S_TG for -npp D -ntg N -npl 1); prompt
# tests at depth are then left out for it. ik_llama.cpp runs with its defaults (flash attention,
# MLA 3, fused MoE) plus --ik-args (default: --run-time-repack 1, its row-interleaved repacking
# at load; some of its builds refuse the short -rtr 1). A llama-bench without jsonl output is
# read through its json.
# Each round runs `duet bench` and then every engine on each model with the same -t/-r; the tables
# give each engine's mean over the rounds and duet's ratio, and (two rounds or more, one result
# per round) the lowest, highest and median of the rounds' own ratios. Raw JSON lines stay in
# $BENCH_OUT (default: a temporary directory, printed at the end; a folder holding an earlier
# run's lines is refused, as they would enter the means).
set -euo pipefail

threads=$(nproc)
prompt=512
gen=128
depth=0
reps=3
rounds=2
duet="$(cd "$(dirname "$0")/.." && pwd)/build/duet"
llama=""
ik=""
ik_args="--run-time-repack 1"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t) threads="$2"; shift 2 ;;
    -p) prompt="$2"; shift 2 ;;
    -n) gen="$2"; shift 2 ;;
    -d) depth="$2"; shift 2 ;;
    -r) reps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --duet) duet="$2"; shift 2 ;;
    --llama) llama="$2"; shift 2 ;;
    --ik) ik="$2"; shift 2 ;;
    --ik-args) ik_args="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    -*) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
# The older form: the first argument is llama.cpp's llama-bench or build directory.
if [ -z "$llama" ] && [ -z "$ik" ] && [ ${#args[@]} -ge 2 ] && { [ -d "${args[0]}" ] || [ -x "${args[0]}" ]; }; then
  llama="${args[0]}"
  args=("${args[@]:1}")
fi
if [ ${#args[@]} -lt 1 ] || { [ -z "$llama" ] && [ -z "$ik" ]; }; then
  echo "usage: bench/compare.sh [options] [--llama LLAMA] [--ik IK_LLAMA] MODEL.gguf [MODEL.gguf ...] (--help)" >&2
  exit 2
fi
bench_of() {  # a llama-bench binary, from it or from a build directory
  local b="$1"
  [ -d "$b" ] && b="$b/bin/llama-bench"
  [ -x "$b" ] || { echo "compare.sh: $1 is not an executable llama-bench or a build directory with one" >&2; exit 2; }
  echo "$b"
}
engines=()
declare -A bench_bin engine_args
if [ -n "$llama" ]; then engines+=(llama.cpp); bench_bin[llama.cpp]=$(bench_of "$llama"); engine_args[llama.cpp]=""; fi
if [ -n "$ik" ]; then engines+=(ik_llama.cpp); bench_bin[ik_llama.cpp]=$(bench_of "$ik"); engine_args[ik_llama.cpp]="$ik_args"; fi
[ -x "$duet" ] || { echo "compare.sh: $duet is not built (make build)" >&2; exit 2; }
models=("${args[@]}")
for m in "${models[@]}"; do [ -f "$m" ] || { echo "compare.sh: no model file $m" >&2; exit 2; }; done

IFS=, read -r -a depths <<< "$depth"
IFS=, read -r -a gens <<< "$gen"
has_depth_zero=0
deep=()
for d in "${depths[@]}"; do if [ "$d" -eq 0 ]; then has_depth_zero=1; else deep+=("$d"); fi; done

out="${BENCH_OUT:-$(mktemp -d)}"
mkdir -p "$out"
# Each engine's lines are appended to its file, and the tables average every line in it: rounds
# left there by an earlier run would enter the means, so a folder that holds some is refused.
if compgen -G "$out/*.jsonl" > /dev/null; then
  echo "compare.sh: $out already holds an earlier run's results (*.jsonl); set BENCH_OUT to a new or empty folder" >&2
  exit 2
fi

# llama-bench's output as JSON lines: its jsonl as it is, or its json (one array) split.
to_lines() {
  /usr/bin/python3 -c 'import json,sys
t = sys.stdin.read().strip()
rows = json.loads(t) if t.startswith("[") else [json.loads(l) for l in t.splitlines() if l.startswith("{")]
for r in rows: print(json.dumps(r))'
}

# One engine on one model: every test as llama-bench JSON lines (n_depth added where the tool
# has none), appended to $out/ENGINE.jsonl.
run_engine() {
  local name="$1" m="$2" bin="${bench_bin[$1]}" extra="${engine_args[$1]}"
  local help ofmt=jsonl
  help=$("$bin" --help 2>&1 || true)
  grep -q "jsonl" <<< "$help" || ofmt=json  # a llama-bench without jsonl output (some ik_llama.cpp builds)
  # shellcheck disable=SC2086
  if grep -q -- "--n-depth" <<< "$help"; then
    "$bin" -m "$m" -p "$prompt" -n "$gen" -d "$depth" -r "$reps" -t "$threads" $extra -o "$ofmt" 2>/dev/null | to_lines >> "$out/$name.jsonl"
    return
  fi
  if [ "$has_depth_zero" -eq 1 ]; then
    "$bin" -m "$m" -p "$prompt" -n "$gen" -r "$reps" -t "$threads" $extra -o "$ofmt" 2>/dev/null | to_lines >> "$out/$name.jsonl"
  fi
  [ ${#deep[@]} -eq 0 ] && return
  local d n
  if grep -q -- "-gp <pp,tg>" <<< "$help"; then
    for d in "${deep[@]}"; do
      for n in "${gens[@]}"; do
        [ "$n" -gt 0 ] || continue
        "$bin" -m "$m" -p 0 -n 0 -gp "$d,$n" -r "$reps" -t "$threads" $extra -o "$ofmt" 2>/dev/null | to_lines |
          /usr/bin/python3 -c 'import json,sys
for l in sys.stdin:
    if l.startswith("{"):
        j = json.loads(l); j["n_depth"], j["n_prompt"] = j["n_prompt"], 0; print(json.dumps(j))' >> "$out/$name.jsonl"
      done
    done
    return
  fi
  local batched
  batched="$(dirname "$bin")/llama-batched-bench"
  if [ ! -x "$batched" ]; then
    echo "compare.sh: $name's llama-bench has no -d and no llama-batched-bench beside it: its depth tests are left out" >&2
    return
  fi
  for d in "${deep[@]}"; do
    for n in "${gens[@]}"; do
      [ "$n" -gt 0 ] || continue
      for _ in $(seq 1 "$reps"); do
        "$batched" -m "$m" -c $((d + n + 16)) -b 2048 -ub 512 -npp "$d" -ntg "$n" -npl 1 -t "$threads" \
            --output-format jsonl 2>&1 |
          /usr/bin/python3 -c 'import json,sys
m, d, n = sys.argv[1:4]
for l in sys.stdin:
    if l.startswith("{"):
        j = json.loads(l)
        print(json.dumps({"model_filename": m, "n_prompt": 0, "n_gen": int(n), "n_depth": int(d), "avg_ts": j["speed_tg"]}))' \
            "$m" "$d" "$n" >> "$out/$name.jsonl"
      done
    done
  done
  echo "compare.sh: $name: depth tests from llama-batched-bench (its llama-bench has no -d); prompts at depth left out" >&2
}

for round in $(seq 1 "$rounds"); do
  for m in "${models[@]}"; do
    name=$(basename "$m")
    echo "round $round: duet on $name" >&2
    "$duet" bench -m "$m" -p "$prompt" -n "$gen" -d "$depth" -r "$reps" -t "$threads" -o jsonl >> "$out/duet.jsonl"
    for e in "${engines[@]}"; do
      echo "round $round: $e on $name" >&2
      run_engine "$e" "$m"
    done
  done
done

/usr/bin/python3 - "$out" "$threads" "${engines[@]}" <<'PY'
import json, os, statistics, sys

out, threads, engines = sys.argv[1], sys.argv[2], sys.argv[3:]

def load(path):
    runs = {}
    if not os.path.exists(path):
        return runs
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        test = f"pp{j['n_prompt']}" if j["n_prompt"] > 0 else f"tg{j['n_gen']}"
        if j.get("n_depth", 0) > 0:
            test += f" @ d{j['n_depth']}"
        runs.setdefault((os.path.basename(j["model_filename"]), test), []).append(j["avg_ts"])
    return runs

duet = load(os.path.join(out, "duet.jsonl"))
for e in engines:
    other = load(os.path.join(out, e + ".jsonl"))
    print(f"\n{e} ({threads} threads)\n")
    print(f"| model | test | duet t/s | {e} t/s | duet / {e} | per round |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for key in sorted(duet):
        d = statistics.mean(duet[key])
        if key in other:
            o = statistics.mean(other[key])
            # Each round ran both engines within minutes of each other: the spread of the rounds'
            # own ratios says how much the host moved the mean's ratio.
            rounds = ""
            if len(duet[key]) == len(other[key]) > 1:
                r = [a / b for a, b in zip(duet[key], other[key])]
                rounds = f"{min(r):.2f}-{max(r):.2f}x, median {statistics.median(r):.2f}x"
            print(f"| {key[0]} | {key[1]} | {d:.2f} | {o:.2f} | {d / o:.2f}x | {rounds or '-'} |")
        else:
            print(f"| {key[0]} | {key[1]} | {d:.2f} | - | - | - |")
PY
echo "raw results: $out" >&2
