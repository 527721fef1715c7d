#!/usr/bin/env bash
# An ARMv8.0 CPU without the dot-product extension (qemu's Cortex-A72: Kunpeng 916, the first
# Graviton): the NEON table, built with +dotprod, must report itself unavailable, and the generic
# table must pass the kernel and CPU backend tests there. An sdot/udot that leaked out of the NEON
# kernel files (an inline function or template compiled there and kept by the linker for every
# caller) faults on this CPU; objdump looks for one on every path at once, the run on the paths
# the tests take.
# usage: armv8_0_test.sh OBJDUMP KERNELS_TEST CPU_BACKEND_TEST
set -uo pipefail
objdump="$1"
kernels_test="$2"
cpu_backend_test="$3"
source "$(cd "$(dirname "$0")" && pwd)/../cli/lib.sh"  # pass, failed, failures
qemu() { qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu cortex-a72 "$@"; }
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

for binary in "$kernels_test" "$cpu_backend_test"; do
  name="$(basename "$binary")"
  "$objdump" -d --no-show-raw-insn -C "$binary" | awk '
    /^[0-9a-f]+ <.*>:$/ { fn = $0; next }
    /\t[su]dot\t/ { if (!(fn in seen)) { seen[fn] = 1; print fn } }' > "$log"
  if [ ! -s "$log" ]; then
    failed "$name: no sdot or udot at all (is objdump reading it?)"
  elif grep -v "(anonymous namespace)" "$log" | grep -q .; then
    failed "$name: sdot/udot in functions other files may share"
    grep -v "(anonymous namespace)" "$log" | head -20
  else
    pass "$name: sdot and udot only in the NEON kernel files' own functions"
  fi
done

qemu "$kernels_test" --isa=neon > "$log" 2>&1
rc=$?
if [ "$rc" = 77 ] && grep -q "the neon kernels were not run: this CPU cannot run them" "$log"; then
  pass "the NEON table is reported unavailable on a CPU without dotprod"
else
  failed "kernels_test --isa=neon on a Cortex-A72 exited $rc"
  tail -20 "$log"
fi
# Isa.* expects the NEON table these binaries were built to test; here it must not be there.
if qemu "$kernels_test" --gtest_filter=-Isa.* --gtest_brief=1 > "$log" 2>&1; then
  pass "the kernel tests on the generic table"
else
  failed "the kernel tests on a Cortex-A72"
  tail -40 "$log"
fi
if qemu "$cpu_backend_test" --gtest_brief=1 > "$log" 2>&1; then
  pass "the CPU backend tests on the generic table"
else
  failed "the CPU backend tests on a Cortex-A72"
  tail -40 "$log"
fi
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
