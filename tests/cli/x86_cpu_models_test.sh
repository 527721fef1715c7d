#!/usr/bin/env bash
# duet on x86 CPUs narrower than the host, as QEMU's user mode models them: an AMD EPYC Milan (Zen
# 3: AVX2, FMA and F16C, emulated from QEMU 7.2 on; neither AVX-512 nor AVX-VNNI) and an Intel
# Westmere (SSE4.2, no AVX). DUET_FORCE_ISA on a wider host runs a narrower kernel table, but an
# instruction the compiler took from a wider target anywhere else (an inline function or a
# template instantiated in a kernel file and kept by the linker for everyone) still runs there;
# on these CPUs it faults. Checked here: no such function in the binaries (objdump); on the Zen 3
# the table duet selects (avx2), the AVX-512 and AVX-VNNI tables reported unavailable, the AVX2
# kernel and CPU backend tests, and greedy generation with Q8_0, Q4_0 and Q4_K_M models (prefill
# through the tiles, decode through the single rows, three sequences at once) giving the token
# ids that the AVX2 table gives on the host; on the Westmere the generic table and its ids.
# usage: x86_cpu_models_test.sh DUET BACKEND_TEST WORK_DIR
set -uo pipefail
duet="$1"
backend_test="$2"
work="$3"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work" && mkdir -p "$work" || exit 1
cd "$work" || exit 1
source "$here/lib.sh"
py=/usr/bin/python3

qemu="$(command -v qemu-x86_64)" || {
  echo "skipped: no qemu-x86_64 (Debian's qemu-user, scripts/install-deps.sh) to model narrower x86 CPUs"
  exit 77
}
# The emulated CPUs; their warnings about host-only CPUID bits are left out of the logs.
zen3() { "$qemu" -cpu EPYC-Milan "$@"; }
westmere() { "$qemu" -cpu Westmere "$@"; }
quiet() { grep -v "TCG doesn't support requested feature" "$1"; }

# Statically, every path at once: functions the linker may share between files (outside the
# anonymous namespaces) hold no AVX-512 instruction (zmm or mask registers, the upper 16 xmm/ymm)
# and no VEX-encoded one (AVX), but the kernel tables' own constructors and the FP8 AVX2 kernels,
# reached only where the CPU has them. A template or inline function compiled in a kernel file
# and kept for everyone would.
# only_in NAME LISTING PATTERN ALLOWED KIND WHERE: objdump's LISTING has instructions matching
# PATTERN (KIND), and only in anonymous namespaces and functions matching ALLOWED (WHERE).
only_in() {
  awk -v pattern="$3" '
    /^[0-9a-f]+ <.*>:$/ { fn = $0; next }
    $0 ~ pattern { if (!(fn in seen)) { seen[fn] = 1; print fn } }' "$2" > found.txt
  grep -v -e "(anonymous namespace)" found.txt | grep -v -E "$4" > shared.txt
  if [ ! -s found.txt ]; then
    failed "$1: no $5 instruction found at all (is objdump reading it?)"
  elif [ -s shared.txt ]; then
    failed "$1: $5 instructions in functions other files may share"
    head -20 shared.txt
  else
    pass "$1: $5 instructions only in $6"
  fi
}
tables='<duet::cpu::kernels_(avx2|avxvnni|avx512|amx)\(\)( \[clone [.a-z0-9]+\])?>:$'
for binary in "$duet" "$backend_test"; do
  name="$(basename "$binary")"
  objdump -d --no-show-raw-insn -C "$binary" > listing.txt
  only_in "$name" listing.txt '%zmm|%k[1-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])' '<duet::cpu::kernels_(avx512|amx)\(\)' \
    AVX-512 "the AVX-512 and AMX tables"
  only_in "$name" listing.txt '\tv[a-z]|%ymm' "$tables|<duet::cpu::(dequantize|gemv)_fp8_avx2\\(" AVX \
    "the x86 kernel files"
done
rm -f listing.txt

# Models of two layers at a width the packed kernels take (K-quants want multiples of 256).
shape=(--preset tiny --n-embd 512 --n-ff 1536 --n-head 8 --n-head-kv 8 --n-layer 2 --seed 3)
"$duet" make-model "${shape[@]}" --type q8_0 -o q8_0.gguf > /dev/null 2> err.txt || { cat err.txt; exit 1; }
"$duet" make-model "${shape[@]}" --type q4_0 -o q4_0.gguf > /dev/null 2> err.txt || { cat err.txt; exit 1; }
"$duet" make-model "${shape[@]}" --type f32 -o f32.gguf > /dev/null 2> err.txt || { cat err.txt; exit 1; }
"$duet" quantize --type q4_k_m f32.gguf q4_k_m.gguf > /dev/null 2> err.txt || { cat err.txt; exit 1; }

if ! DUET_FORCE_ISA=avx2 "$duet" bench -m q8_0.gguf -p 8 -n 2 -r 1 -t 1 > host.txt 2> err.txt; then
  echo "skipped: this host cannot run the AVX2 table to compare with: $(tail -3 err.txt)"
  exit 77
fi
# emulated_bench CPU: duet bench under the emulated CPU, into bench.txt (exit status in bench_rc).
emulated_bench() {
  "$1" "$duet" bench -m q8_0.gguf -p 8 -n 2 -r 1 -t 2 > bench.txt 2> err.txt
  bench_rc=$?
}
# chosen_table TABLE WHAT: that run named TABLE.
chosen_table() {
  if [ "$bench_rc" = 0 ] && grep -q "cpu ($1)" bench.txt; then
    pass "duet selects the $1 table on $2"
  else
    failed "duet bench on $2 (exit $bench_rc)"
    cat bench.txt
    quiet err.txt | tail -20
  fi
}
emulated_bench zen3
if [ "$bench_rc" = 0 ] && grep -q "cpu (generic)" bench.txt; then
  echo "skipped: this qemu-x86_64 does not emulate AVX2 (QEMU 7.2 and later do): duet chose the generic table"
  exit 77
fi
chosen_table avx2 "a CPU without AVX-512"

for isa in avx512 avxvnni; do
  zen3 "$backend_test" --isa="$isa" > isa.txt 2> err.txt
  rc=$?
  if [ "$rc" = 77 ] && grep -q "this CPU cannot run them" isa.txt; then
    pass "the $isa table is reported unavailable"
  else
    failed "backend_test --isa=$isa exited $rc where that table cannot run"
    tail -5 isa.txt
  fi
done

# The AVX2 kernels and the CPU backend's ops (matmul of every type, attention, MoE, FP8) against
# their references, as on the host (--isa=avx2: the generic table and the AVX2 one).
if zen3 "$backend_test" --isa=avx2 --gtest_filter='Kernels.*:CpuBackend.*' --gtest_brief=1 > kernels.txt 2> err.txt; then
  pass "the AVX2 kernel and CPU backend tests"
else
  failed "the AVX2 kernel and CPU backend tests"
  tail -40 kernels.txt
  quiet err.txt | tail -20
fi

# Three prompts, one past 16 tokens (the Q8_0 xor tiles) and all past 4 (the group tiles), decoded
# together; greedy, so the ids are the model's, and the same whatever the batch (the kernels' bits
# do not depend on it).
$py - > prompts.jsonl <<'PY'
import json
for p in ["The quick brown fox jumps over the lazy dog and keeps running far away into the forest",
          "Once upon a time, in a land far away",
          "def add(a, b):\n    return a + b\n\nprint(add(2, 3))"]:
    print(json.dumps({"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": True}))
PY
# same_ids CPU ISA MODEL: generation under the emulated CPU gives the ids of the host's ISA table.
same_ids() {
  local cpu="$1" isa="$2" model="$3"
  if ! DUET_FORCE_ISA="$isa" "$duet" generate -m "$model.gguf" --prompts-file prompts.jsonl -t 2 \
      -o "host-$isa-$model.jsonl" > /dev/null 2> err.txt; then
    failed "$model: generate on the host's $isa table"
    cat err.txt
    return
  fi
  if ! "$cpu" "$duet" generate -m "$model.gguf" --prompts-file prompts.jsonl -t 2 -o "$cpu-$model.jsonl" > /dev/null \
      2> err.txt; then
    failed "$model: generate on the emulated $cpu"
    quiet err.txt | tail -20
    return
  fi
  if $py - "host-$isa-$model.jsonl" "$cpu-$model.jsonl" <<'PY'
import json, sys
def ids(path):
    return {r["index"]: r["token_ids"] for r in map(json.loads, open(path))}
host, emulated = ids(sys.argv[1]), ids(sys.argv[2])
assert sorted(host) == [0, 1, 2], host
assert all(len(v) == 16 for v in host.values()), host
assert emulated == host, (host, emulated)
PY
  then pass "$model on the emulated $cpu: the host's $isa token ids"; else failed "$model on the emulated $cpu: not the host's $isa token ids"; fi
}
for model in q8_0 q4_0 q4_k_m; do same_ids zen3 avx2 "$model"; done

# A CPU without AVX: the generic table, and its ids on the host.
emulated_bench westmere
chosen_table generic "a CPU without AVX"
same_ids westmere generic q8_0

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
