// AVX2 + FMA + F16C kernels. This file alone is compiled with those flags; it is only called
// after CPUID says the machine has them.
#include <immintrin.h>

#include <cmath>

#include "duet/backend/cpu/kernels.h"
#include "duet/core/quant.h"

namespace duet::cpu {
namespace {

inline float hsum(__m256 v) {  // (qgemm_x86.inc has its own copy for the VNNI file)
  __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 shuf = _mm_movehdup_ps(lo);
  __m128 sums = _mm_add_ps(lo, shuf);
  shuf = _mm_movehl_ps(shuf, sums);
  sums = _mm_add_ss(sums, shuf);
  return _mm_cvtss_f32(sums);
}

void dequantize_f16(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  }
  for (; i < n; ++i) y[i] = _cvtsh_ss(x[i]);
}

void dequantize_bf16(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
  }
  for (; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
}

void dequantize_q8_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
    for (int j = 0; j < kQK8_0; j += 8) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qs + j));
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
      _mm256_storeu_ps(y + i * kQK8_0 + j, _mm256_mul_ps(v, d));
    }
  }
}

void dequantize_q4_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
    const __m128i lo = _mm_and_si128(bytes, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    float* out = y + i * kQK4_0;
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int p = 0; p < 4; ++p) {
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[p]));
      _mm256_storeu_ps(out + 8 * p, _mm256_mul_ps(_mm256_sub_ps(v, eight), d));
    }
  }
}

float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// MR rows of x against NR rows of w, each output one dot product of length k.
template <int MR, int NR>
inline void micro(const float* w, const float* x, int64_t k, float* y, int64_t ldy) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    __m256 xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = _mm256_loadu_ps(x + i * k + p);
    for (int j = 0; j < NR; ++j) {
      const __m256 wv = _mm256_loadu_ps(w + j * k + p);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t q = p; q < k; ++q) s += x[i * k + q] * w[j * k + q];
      y[i * ldy + j] = s;
    }
  }
}

template <int MR>
inline void row_block(const float* w, int64_t nw, const float* x, int64_t k, float* y, int64_t ldy) {
  int64_t j = 0;
  for (; j + 4 <= nw; j += 4) micro<MR, 4>(w + j * k, x, k, y + j, ldy);
  for (; j < nw; ++j) micro<MR, 1>(w + j * k, x, k, y + j, ldy);
}

void gemm_f32(const float* w, int64_t nw, const float* x, int64_t m, int64_t k, float* y, int64_t ldy) {
  int64_t i = 0;
  for (; i + 3 <= m; i += 3) row_block<3>(w, nw, x + i * k, k, y + i * ldy, ldy);
  for (; i < m; ++i) row_block<1>(w, nw, x + i * k, k, y + i * ldy, ldy);
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

void rms_norm_f32(const float* x, const float* w, float* y, int64_t n, float eps) {
  // Sum of squares in double, as the reference does, so both agree to the last bit of scale.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
  const __m256 sv = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _mm256_loadu_ps(w + i)));
  }
  for (; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void silu_mul_f32(const float* g, const float* u, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

#define DUET_QGEMM_VNNI 0
#include "duet/backend/cpu/qgemm_x86.inc"
#undef DUET_QGEMM_VNNI

}  // namespace

const Kernels& kernels_avx2() {
  // The other formats use the generic conversion until they get kernels of their own.
  const Kernels& g = kernels_generic();
  static const Kernels k{
      .isa = Isa::kAvx2,
      .dequantize_f16 = dequantize_f16,
      .dequantize_bf16 = dequantize_bf16,
      .dequantize_q8_0 = dequantize_q8_0,
      .dequantize_q4_0 = dequantize_q4_0,
      .dequantize_q4_1 = g.dequantize_q4_1,
      .dequantize_q5_0 = g.dequantize_q5_0,
      .dequantize_q5_1 = g.dequantize_q5_1,
      .dequantize_q4_k = g.dequantize_q4_k,
      .dequantize_q5_k = g.dequantize_q5_k,
      .dequantize_q6_k = g.dequantize_q6_k,
      .gemm_f32 = gemm_f32,
      .dot_f32 = dot_f32,
      .axpy_f32 = axpy_f32,
      .rms_norm_f32 = rms_norm_f32,
      .silu_mul_f32 = silu_mul_f32,
      .quantize_q8a = quantize_q8a_x86,
      .gemm_q4_0_q8a = qgemm_x86<Q4_0Policy>,
      .gemm_q8_0_q8a = qgemm_x86<Q8_0Policy>,
      .gemm_q4_k_q8a = qgemm_k_x86<BlockQ4_K, dot_q4_k>,
      .gemm_q6_k_q8a = qgemm_k_x86<BlockQ6_K, dot_q6_k>,
      .gemm_q4_0x16_q8a = nullptr,
      .gemm_q8_0x16_q8a = nullptr,
      .gemm_q4_kx16_q8a = nullptr,
      .gemm_q5_0x16_q8a = nullptr,
  };
  return k;
}

}  // namespace duet::cpu
