// AVX-512 (F, BW, VL, VNNI) kernels: the integer GEMM with vpdpbusd. Everything else comes from
// the AVX2 table, which this machine runs too. Compiled alone with these flags; called only
// after CPUID says the machine has them.
#include <immintrin.h>

#include "duet/backend/cpu/kernels.h"
#include "duet/core/quant.h"

namespace duet::cpu {
namespace {

#define DUET_QGEMM_VNNI 1
#include "duet/backend/cpu/qgemm_x86.inc"
#undef DUET_QGEMM_VNNI

}  // namespace

const Kernels& kernels_avx512() {
  static const Kernels k = [] {
    Kernels t = kernels_avx2();
    t.isa = Isa::kAvx512;
    t.quantize_q8a = quantize_q8a_x86;
    t.gemm_q4_0_q8a = qgemm_x86<Q4_0Policy>;
    t.gemm_q8_0_q8a = qgemm_x86<Q8_0Policy>;
    t.gemm_q4_k_q8a = qgemm_k_x86<BlockQ4_K, dot_q4_k>;
    t.gemm_q6_k_q8a = qgemm_k_x86<BlockQ6_K, dot_q6_k>;
    return t;
  }();
  return k;
}

}  // namespace duet::cpu
