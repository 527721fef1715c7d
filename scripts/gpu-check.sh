#!/usr/bin/env bash
# The CUDA backend checked on a machine with an NVIDIA GPU, in one command that fits in 8 minutes
# on an H200: installs what is missing, builds for this GPU, runs the CUDA tests, compares logits
# on cuda:0 with the CPU on a DeepSeek-Coder-1.3B-shaped and a DeepSeek-V2-Lite-shaped model and a
# small DeepSeek-V3-shaped FP8 folder,
# benchmarks decode (batch 1 and 64, with decode graphs on and off), prefill and 64-stream
# serving, and writes a summary
# (pass/fail per step, numbers against the GPU's HBM bandwidth and tensor-core peak) to
# $OUT/gpu-check.md and $OUT/gpu-check.json ($BUILD_DIR when OUT is not set).
#
# usage: scripts/gpu-check.sh [BUILD_DIR]          (default build-gpu)
#
# DUET_GPU_CHECK_DRY_RUN=1 stubs the GPU part, to test the script where there is no GPU: no
# nvidia-smi, no build (BUILD_DIR must hold a build), the test device guarded:0 (a CPU device whose
# memory the host cannot read) stands for cuda:0, tiny models and short runs; the summary says so
# and its numbers are not GPU measurements.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build-gpu}"
dry="${DUET_GPU_CHECK_DRY_RUN:-0}"
out="${OUT:-$build}"
work="$build/gpu-check"
mkdir -p "$out" "$work" || exit 1
start=$(date +%s)
py=/usr/bin/python3
status=0
steps=()    # "name|pass/fail/skip|detail"
numbers=()  # "key|value"

log() { echo "gpu-check [$(( $(date +%s) - start ))s]: $*" >&2; }
step() { steps+=("$1|$2|$3"); log "$1: $2 $3"; [ "$2" = fail ] && status=1; return 0; }
number() { numbers+=("$1|$2"); }
# run SECONDS LOGFILE CMD...: the command under a time limit, its output in LOGFILE.
run() {
  local limit="$1" logfile="$2"
  shift 2
  timeout --kill-after=10 "$limit" "$@" > "$logfile" 2>&1
}

# --- what this machine is ------------------------------------------------------------------
if [ "$dry" = 1 ]; then
  gpu_name="dry run (no GPU: guarded:0 stands for cuda:0)"
  arch=90
  device="guarded:0"
  step gpu skip "DUET_GPU_CHECK_DRY_RUN=1: GPU part stubbed"
else
  if ! command -v nvidia-smi > /dev/null; then
    step gpu fail "nvidia-smi not found: no NVIDIA driver on this machine"
  fi
  gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)"
  arch="${cap/./}"
  [ -n "$arch" ] || arch=90
  device="cuda:0"
  step gpu pass "$gpu_name (sm_$arch)"
fi
# Peaks per GPU: HBM bytes/s and dense bf16 tensor-core FLOP/s (the vendors' data sheets).
case "$gpu_name" in
  *H200*) hbm=4.8e12; tc=989e12 ;;
  *H100*SXM* | *H100\ 80GB\ HBM3*) hbm=3.35e12; tc=989e12 ;;
  *H100*) hbm=2.0e12; tc=756e12 ;;
  *A100*80GB*) hbm=2.039e12; tc=312e12 ;;
  *A100*) hbm=1.555e12; tc=312e12 ;;
  *) hbm=""; tc="" ;;
esac

# --- install and build ----------------------------------------------------------------------
if [ "$dry" = 1 ]; then
  step build skip "dry run: using the build in $build"
else
  # What this script needs; the project's installer runs only when something is missing (it
  # needs the network, which a lent GPU machine may not have).
  missing=""
  for tool in cmake g++ pkg-config curl /usr/bin/python3; do command -v "$tool" > /dev/null || missing="$missing $tool"; done
  if [ -z "$missing" ]; then
    step deps pass "already installed"
  elif run 300 "$work/deps.log" "$root/scripts/install-deps.sh"; then
    step deps pass "installed:$missing"
  else
    step deps fail "missing:$missing (see $work/deps.log)"
  fi
  nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  if [ ! -x "$nvcc" ]; then step build fail "nvcc not found (the CUDA 13 toolkit is needed)"; fi
  if run 60 "$work/configure.log" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc" &&
     run 240 "$work/build.log" cmake --build "$build" -j"$(nproc)" --target duet cuda_plan_test cuda_graph_plan_test \
       cuda_ops_test cuda_model_test cuda_engine_test; then
    step build pass "sm_$arch in $(( $(date +%s) - start ))s"
  else
    step build fail "see $work/build.log"
  fi
fi
duet="$build/duet"
if [ ! -x "$duet" ]; then
  step binary fail "$duet was not built"
fi

# --- the CUDA tests -------------------------------------------------------------------------
if [ -x "$duet" ]; then
  run 150 "$work/ctest.log" ctest --test-dir "$build" -R '^cuda_' --output-on-failure
  rc=$?
  passed=$(grep -c " Passed " "$work/ctest.log")
  skipped=$(grep -c "\*\*\*Skipped" "$work/ctest.log")
  failed=$(grep -c "\*\*\*Failed\|Timeout" "$work/ctest.log")
  number cuda_tests_passed "$passed"
  number cuda_tests_skipped "$skipped"
  if [ "$rc" -ne 0 ] || [ "$failed" -gt 0 ]; then
    step cuda_tests fail "$passed passed, $failed failed, $skipped skipped (see $work/ctest.log)"
  elif [ "$dry" != 1 ] && [ "$skipped" -gt 0 ]; then
    step cuda_tests fail "$skipped skipped on a machine with a GPU"
  else
    step cuda_tests pass "$passed passed, $skipped skipped"
  fi
fi

# --- the models ------------------------------------------------------------------------------
if [ "$dry" = 1 ]; then
  coder_args=(--preset tiny)
  v2_args=(--preset deepseek2-tiny-v2)
else
  coder_args=(--preset deepseek-coder-1.3b)
  v2_args=(--preset deepseek-v2-lite --layers 8)  # V2-Lite's shape, 8 of its 27 layers
fi
coder="$work/coder-q4_0.gguf"
v2="$work/v2-q4_0.gguf"
# The third: DeepSeek's block FP8 as a Hugging Face folder (MLA, MoE), kept as FP8 on the GPU.
v3fp8_args=(--preset deepseek2-tiny-v3 --format hf --type fp8)
model_file() { [ "$1" = v3fp8 ] && echo "$work/v3-fp8" || echo "$work/$1-q4_0.gguf"; }
for m in coder v2 v3fp8; do
  file="$(model_file "$m")"
  case "$m" in
    coder) args=("${coder_args[@]}" --type q4_0) ;;
    v2) args=("${v2_args[@]}" --type q4_0) ;;
    *) args=("${v3fp8_args[@]}") ;;
  esac
  if [ -x "$duet" ] && [ ! -e "$file" ]; then
    run 120 "$work/make-$m.log" "$duet" make-model "${args[@]}" --seed 1 -o "$file" || step "make_$m" fail "see $work/make-$m.log"
  fi
done

# Logits of a 40-token prompt at every position on the device and on the CPU (exact matmul,
# for whatever runs on the CPU in either): the top logits must agree within 3e-2 of the largest
# magnitude, and where the device's top token differs, it must be a near tie on the CPU (within
# that tolerance of the CPU's top logit).
[ "$dry" = 1 ] && vocab_cap=500 || vocab_cap=30000  # below the vocabulary of every model but v3fp8
for m in coder v2 v3fp8; do
  file="$(model_file "$m")"
  [ -e "$file" ] || continue
  cap=$vocab_cap
  [ "$m" = v3fp8 ] && cap=500  # a tiny preset's vocabulary of 512
  tokens="$($py -c "print(','.join(str((11 + 37 * i) % $cap) for i in range(40)))")"
  ok=1
  DUET_MATMUL=exact run 120 "$work/logits-$m-cpu.jsonl" "$duet" logits -m "$file" --tokens "$tokens" --top 20 --all-positions || ok=0
  DUET_MATMUL=exact run 120 "$work/logits-$m-gpu.jsonl" "$duet" logits -m "$file" --tokens "$tokens" --top 20 --all-positions --device-map "$device" || ok=0
  if [ "$ok" = 1 ] && detail="$($py - "$work/logits-$m-cpu.jsonl" "$work/logits-$m-gpu.jsonl" <<'PY'
import json, sys
def rows(path):
    out = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert len(a) == len(b) and a, f"{len(a)} and {len(b)} positions"
def top(r):
    return {int(i): float(v) for i, v in r["top"]}
tol = 3e-2
worst, mag, same, far = 0.0, 1e-30, 0, 0
tops = []
for ra, rb in zip(a, b):
    ta, tb = top(ra), top(rb)
    tops.append((ta, tb))
    for i, v in ta.items():
        mag = max(mag, abs(v))
        if i in tb:
            worst = max(worst, abs(v - tb[i]))
for ta, tb in tops:
    best_a = max(ta, key=ta.get); best_b = max(tb, key=tb.get)
    same += best_a == best_b
    if best_a != best_b and (best_b not in ta or ta[best_a] - ta[best_b] > tol * mag):
        far += 1
rel = worst / mag
print(f"relative difference {rel:.3g}, same top token at {same}/{len(a)} positions, {far} not near ties")
sys.exit(0 if rel <= tol and far == 0 else 1)
PY
)"; then
    step "logits_$m" pass "$detail"
  else
    step "logits_$m" fail "${detail:-see $work/logits-$m-*.jsonl}"
  fi
done

# --- benchmarks ------------------------------------------------------------------------------
if [ "$dry" = 1 ]; then p=32; n=8; reps=1; streams=4; prompts=8; else p=512; n=128; reps=2; streams=64; prompts=128; fi
if [ -f "$coder" ]; then
  if run 120 "$work/bench.jsonl" "$duet" bench -m "$coder" -p "$p" -n "$n" -r "$reps" -o jsonl --device-map "$device"; then
    pp="$($py -c 'import json,sys; print(round(next(json.loads(l)["avg_ts"] for l in open(sys.argv[1]) if l.startswith("{") and json.loads(l)["n_gen"] == 0), 1))' "$work/bench.jsonl")"
    tg="$($py -c 'import json,sys; print(round(next(json.loads(l)["avg_ts"] for l in open(sys.argv[1]) if l.startswith("{") and json.loads(l)["n_prompt"] == 0), 1))' "$work/bench.jsonl")"
    number prefill_tokens_per_s "$pp"
    number decode_b1_tokens_per_s "$tg"
    step bench_pp_tg pass "pp$p $pp t/s, tg$n $tg t/s"
  else
    step bench_pp_tg fail "see $work/bench.jsonl"
  fi
  # Decode without graphs (DUET_CUDA_GRAPHS=0: every op its own launch), for the ratio.
  if DUET_CUDA_GRAPHS=0 run 120 "$work/bench-nographs.jsonl" "$duet" bench -m "$coder" -p "$p" -n "$n" -r "$reps" \
       -o jsonl --device-map "$device"; then
    tg0="$($py -c 'import json,sys; print(round(next(json.loads(l)["avg_ts"] for l in open(sys.argv[1]) if l.startswith("{") and json.loads(l)["n_prompt"] == 0), 1))' "$work/bench-nographs.jsonl")"
    number decode_b1_tokens_per_s_no_graphs "$tg0"
    step bench_tg_no_graphs pass "tg$n $tg0 t/s without decode graphs (${tg:-?} with)"
  else
    step bench_tg_no_graphs fail "see $work/bench-nographs.jsonl"
  fi
  if run 150 "$work/throughput.log" "$duet" bench throughput -m "$coder" --num-prompts "$streams" --input-len 32 \
       --output-len "$n" --device-map "$device"; then
    b64="$(grep -oE '[0-9.]+ (output|generated) tokens/s' "$work/throughput.log" | head -1 | cut -d' ' -f1)"
    number decode_b64_tokens_per_s "${b64:-?}"
    step bench_decode_b64 pass "${b64:-?} generated tokens/s over $streams sequences"
  else
    step bench_decode_b64 fail "see $work/throughput.log"
  fi
  if DUET_CUDA_GRAPHS=0 run 150 "$work/throughput-nographs.log" "$duet" bench throughput -m "$coder" \
       --num-prompts "$streams" --input-len 32 --output-len "$n" --device-map "$device"; then
    b64n="$(grep -oE '[0-9.]+ (output|generated) tokens/s' "$work/throughput-nographs.log" | head -1 | cut -d' ' -f1)"
    number decode_b64_tokens_per_s_no_graphs "${b64n:-?}"
    step bench_decode_b64_no_graphs pass "${b64n:-?} generated tokens/s over $streams sequences without decode graphs"
  else
    step bench_decode_b64_no_graphs fail "see $work/throughput-nographs.log"
  fi
  # 64 streams against duet serve on the device.
  "$duet" serve --model "$coder" --served-model-name gpu-check --host 127.0.0.1 --port 0 --device-map "$device" \
    --no-ui > "$work/serve.log" 2>&1 &
  server=$!
  url=""
  for _ in $(seq 120); do
    url="$(grep -oE 'listening on http://[0-9.:]+' "$work/serve.log" | head -1 | sed 's/listening on //')"
    if [ -n "$url" ] && curl -sf "$url/health" > /dev/null 2>&1; then break; fi
    sleep 0.5
  done
  if [ -n "$url" ] && run 150 "$work/serve-bench.log" "$duet" bench serve --base-url "$url" --model gpu-check \
       --token-ids --vocab-size "$vocab_cap" -c "$streams" -n "$prompts" --input-len 128 --output-len "$n" --json "$work/serve.json"; then
    tput="$($py -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["output_throughput"], 1))' "$work/serve.json" 2>/dev/null)"
    number serve_output_tokens_per_s "${tput:-?}"
    step bench_serve pass "$streams streams: ${tput:-?} output tokens/s"
  else
    step bench_serve fail "see $work/serve.log and $work/serve-bench.log"
  fi
  kill "$server" 2> /dev/null
  wait "$server" 2> /dev/null
fi

# Against the roofline: decode reads every weight byte once per token; prefill does 2 FLOPs per
# parameter per token (q4_0: 4.5 bits per parameter).
if [ -n "${tg:-}" ] && [ -f "$coder" ]; then
  bytes=$(stat -c %s "$coder")
  if [ -n "$hbm" ]; then
    number decode_b1_hbm_fraction "$($py -c "print(round($tg * $bytes / $hbm, 3))")"
  fi
  if [ -n "$tc" ] && [ -n "${pp:-}" ]; then
    number prefill_tensor_core_fraction "$($py -c "print(round($pp * 2 * $bytes * 8 / 4.5 / $tc, 3))")"
  fi
fi

# --- the summary -----------------------------------------------------------------------------
elapsed=$(( $(date +%s) - start ))
{
  echo "# gpu-check"
  echo
  if [ "$dry" = 1 ]; then
    echo "**DRY RUN** (DUET_GPU_CHECK_DRY_RUN=1): the GPU part was stubbed: no GPU build, guarded:0 stood"
    echo "for cuda:0, tiny models. Nothing here is a GPU measurement."
    echo
  fi
  echo "GPU: $gpu_name; device $device; ${elapsed}s; result: $([ $status = 0 ] && echo PASS || echo FAIL)"
  echo "Peaks: HBM ${hbm:-unknown} B/s, bf16 tensor cores ${tc:-unknown} FLOP/s"
  echo
  echo "| step | result | detail |"
  echo "| --- | --- | --- |"
  for s in "${steps[@]}"; do IFS='|' read -r a b c <<< "$s"; echo "| $a | $b | $c |"; done
  echo
  echo "| number | value |"
  echo "| --- | --- |"
  for s in "${numbers[@]}"; do IFS='|' read -r a b <<< "$s"; echo "| $a | $b |"; done
} > "$out/gpu-check.md"
{
  printf '{"dry_run": %s, "gpu": "%s", "device": "%s", "seconds": %s, "pass": %s, "steps": [' \
    "$([ "$dry" = 1 ] && echo true || echo false)" "$gpu_name" "$device" "$elapsed" "$([ $status = 0 ] && echo true || echo false)"
  sep=""
  for s in "${steps[@]}"; do
    IFS='|' read -r a b c <<< "$s"
    printf '%s{"name": "%s", "result": "%s", "detail": "%s"}' "$sep" "$a" "$b" "${c//\"/\'}"
    sep=", "
  done
  printf '], "numbers": {'
  sep=""
  for s in "${numbers[@]}"; do IFS='|' read -r a b <<< "$s"; printf '%s"%s": "%s"' "$sep" "$a" "$b"; sep=", "; done
  printf '}}\n'
} > "$out/gpu-check.json"
cat "$out/gpu-check.md"
exit $status
