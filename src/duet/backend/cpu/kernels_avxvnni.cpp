// AVX2 with AVX-VNNI (the 256-bit vpdpbusd without AVX-512: Intel's E-core Xeons such as Sierra
// Forest, and its client cores since Alder Lake): the AVX2 table with its integer GEMMs, plain
// and packed, on vpdpbusd, which adds the byte products into int32 lanes in one instruction
// (vpmaddubsw, vpmaddwd and an add take three, and Q8_0's sign trick more). Compiled alone with these
// flags; called only after CPUID says the machine has them.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "duet/backend/cpu/kernels.h"
#include "duet/backend/cpu/packed.h"
#include "duet/core/quant.h"

namespace duet::cpu {
namespace {

#define DUET_QGEMM_VNNI 1
#include "duet/backend/cpu/qgemm_x86.inc"
#undef DUET_QGEMM_VNNI

#define DUET_AVX2_VNNI 1
#include "duet/backend/cpu/packed_avx2.inc"
#undef DUET_AVX2_VNNI

}  // namespace

const Kernels& kernels_avxvnni() {
  static const Kernels k = [] {
    Kernels t = kernels_avx2();
    t.isa = Isa::kAvxVnni;
    t.quantize_q8a = quantize_q8a_x86;
    t.gemm_q4_0_q8a = qgemm_x86<Q4_0Policy>;
    t.gemm_q8_0_q8a = qgemm_x86<Q8_0Policy>;
    t.gemm_q4_k_q8a = qgemm_k_x86<BlockQ4_K, dot_q4_k>;
    t.gemm_q6_k_q8a = qgemm_k_x86<BlockQ6_K, dot_q6_k>;
    t.gemm_q4_0x16_q8a = packed_gemm_of<DType::kQ4_0>();
    t.gemm_q8_0x16_q8a = packed_gemm_of<DType::kQ8_0>();
    t.gemm_q4_kx16_q8a = packed_gemm_of<DType::kQ4_K>();
    t.gemm_q5_0x16_q8a = packed_gemm_of<DType::kQ5_0>();
    t.gemm_q6_kx16_q8a = packed_gemm_of<DType::kQ6_K>();
    t.gemm_q4_1x16_q8a = packed_gemm_of<DType::kQ4_1>();
    return t;
  }();
  return k;
}

}  // namespace duet::cpu
