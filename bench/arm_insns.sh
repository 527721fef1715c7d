#!/bin/sh
# Instructions per decode step on aarch64 (the NEON kernels), counted under qemu: builds the model
# layer and bench/decode_steps.cpp for aarch64 (tests/arm with -DDUET_ARM_DECODE=ON) and a qemu
# plugin that counts executed instructions (bench/qemu_insn_count.c), then runs each model twice
# on one thread, decoding D and D + M tokens after the same prompt. The difference over M is the
# instructions of one decode step (load and prefill cancel out), a figure no shared machine blurs.
# With --x86 BUILD (a build folder of this machine's duet, with bench/decode_steps), the same count
# for x86-64 under qemu-x86_64 -cpu max, whose TCG offers AVX2 and FMA but not AVX-512 or AVX-VNNI:
# the AVX2 kernels, counted the same way.
#
#   bench/arm_insns.sh [--prompt 4] [--decode 2] [--more 4] [--x86 build] MODEL.gguf...
#
# Needs g++-aarch64-linux-gnu and qemu-user (scripts/install-deps.sh installs both).
set -eu

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${ARM_DIR:-$root/build-arm}"
prompt=4
decode=2
x86=""
more=4
while [ $# -gt 0 ]; do
  case "$1" in
    --prompt) prompt="$2"; shift 2 ;;
    --decode) decode="$2"; shift 2 ;;
    --more) more="$2"; shift 2 ;;
    --x86) x86="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "arm_insns.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "usage: bench/arm_insns.sh [--prompt N] [--decode N] [--more N] [--x86 BUILD] MODEL.gguf..." >&2; exit 2; }
[ "$more" -ge 1 ] || { echo "arm_insns.sh: --more must be at least 1" >&2; exit 2; }

cmake -S "$root/tests/arm" -B "$build" -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-linux-gnu.cmake" \
  -DDUET_ARM_DECODE=ON > /dev/null
cmake --build "$build" -j"${JOBS:-2}" --target arm_decode_steps > /dev/null
plugin="$build/qemu_insn_count.so"
cc -O2 -shared -fPIC -o "$plugin" "$root/bench/qemu_insn_count.c"

if [ -n "$x86" ] && [ ! -x "$x86/bench/decode_steps" ]; then
  echo "arm_insns.sh: no $x86/bench/decode_steps (cmake --build $x86 --target decode_steps)" >&2
  exit 2
fi

# run ISA MODEL N: the decode of N tokens under the counter; prints its output, the count last.
run() {
  if [ "$1" = aarch64 ]; then
    out="$(qemu-aarch64 -L /usr/aarch64-linux-gnu -plugin "$plugin" "$build/arm_decode_steps" "$2" \
      --prompt "$prompt" --decode "$3" -t 1 2>&1)" || { echo "$out" >&2; return 1; }
  else
    out="$(qemu-x86_64 -cpu max -plugin "$plugin" "$x86/bench/decode_steps" "$2" \
      --prompt "$prompt" --decode "$3" -t 1 2>&1)" || { echo "$out" >&2; return 1; }
  fi
  echo "$out"
}

printf '| model | kernels | bytes | instructions per decode step | per byte of the file | decoded |\n'
printf '| --- | --- | ---: | ---: | ---: | --- |\n'
for model in "$@"; do
 for isa in aarch64 ${x86:+x86-64}; do
  short="$(run "$isa" "$model" "$decode")"
  long="$(run "$isa" "$model" $((decode + more)))"
  a="$(echo "$short" | sed -n 's/.*insns: \([0-9]*\).*/\1/p')"
  b="$(echo "$long" | sed -n 's/.*insns: \([0-9]*\).*/\1/p')"
  [ -n "$a" ] && [ -n "$b" ] || { echo "arm_insns.sh: no count from the plugin for $model" >&2; exit 1; }
  bytes="$(stat -c %s "$model")"
  tokens="$(echo "$long" | sed -n 's/^decoded: *//p')"
  kernels="$(echo "$long" | sed -n 's/^backend //p')"
  awk -v m="$(basename "$model")" -v k="$kernels" -v a="$a" -v b="$b" -v n="$more" -v bytes="$bytes" -v t="$tokens" \
    'BEGIN { per = (b - a) / n; printf "| %s | %s | %d | %.0f | %.3f | %s |\n", m, k, bytes, per, per / bytes, t }'
 done
done
