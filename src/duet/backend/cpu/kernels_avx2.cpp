// AVX2 + FMA + F16C kernels. This file alone is compiled with those flags; it is only called
// after CPUID says the machine has them.
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

#include "duet/backend/cpu/cache_rows.inc"

#include "duet/backend/cpu/hsum_x86.inc"

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
  float sum = hsum_ps(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
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
      float s = hsum_ps(acc[i][j]);
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

// index_totals (kernels.h), a group of 16 keys (two vectors, a lane each) and 4 heads at a time:
// each score one fma chain over the dimensions in order, as the generic kernel's, no reductions.
void index_totals(const float* q, int64_t heads, int64_t d, const float* keys16, int64_t n, const float* w,
                  float* total) {
  const __m256 zero = _mm256_setzero_ps();
  const int64_t groups = (n + 15) / 16;
  for (int64_t g = 0; g < groups; ++g) {
    const float* k0 = keys16 + g * d * 16;
    const float* k1 = k0 + 8;
    __m256 t0 = zero, t1 = zero;
    int64_t h = 0;
    for (; h + 4 <= heads; h += 4) {
      __m256 a0[4] = {zero, zero, zero, zero}, a1[4] = {zero, zero, zero, zero};
      const float* qh = q + h * d;
      for (int64_t p = 0; p < d; ++p) {
        const __m256 kv0 = _mm256_loadu_ps(k0 + p * 16), kv1 = _mm256_loadu_ps(k1 + p * 16);
        for (int i = 0; i < 4; ++i) {
          const __m256 qv = _mm256_broadcast_ss(qh + i * d + p);
          a0[i] = _mm256_fmadd_ps(qv, kv0, a0[i]);
          a1[i] = _mm256_fmadd_ps(qv, kv1, a1[i]);
        }
      }
      for (int i = 0; i < 4; ++i) {
        const __m256 wv = _mm256_broadcast_ss(w + h + i);
        t0 = _mm256_fmadd_ps(wv, _mm256_max_ps(a0[i], zero), t0);
        t1 = _mm256_fmadd_ps(wv, _mm256_max_ps(a1[i], zero), t1);
      }
    }
    for (; h < heads; ++h) {
      __m256 a0 = zero, a1 = zero;
      for (int64_t p = 0; p < d; ++p) {
        const __m256 qv = _mm256_broadcast_ss(q + h * d + p);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + p * 16), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + p * 16), a1);
      }
      const __m256 wv = _mm256_broadcast_ss(w + h);
      t0 = _mm256_fmadd_ps(wv, _mm256_max_ps(a0, zero), t0);
      t1 = _mm256_fmadd_ps(wv, _mm256_max_ps(a1, zero), t1);
    }
    alignas(32) float out[16];
    _mm256_store_ps(out, t0);
    _mm256_store_ps(out + 8, t1);
    const int64_t s0 = g * 16;
    std::copy_n(out, std::min<int64_t>(16, n - s0), total + s0);
  }
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
  // Sum of squares in double, as the reference does (each square is exact in double), in sixteen
  // chains: one chain of 2,048 dependent adds took 2.4 us, the serial part of every decode step's
  // two norms per layer.
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    for (int c = 0; c < 4; ++c) {
      const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + j + 4 * c));
      acc[c] = _mm256_fmadd_pd(v, v, acc[c]);
    }
  }
  const __m256d both = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
  const __m128d pair = _mm_add_pd(_mm256_castpd256_pd128(both), _mm256_extractf128_pd(both, 1));
  double sum = _mm_cvtsd_f64(_mm_add_sd(pair, _mm_unpackhi_pd(pair, pair)));
  for (; j < n; ++j) sum += static_cast<double>(x[j]) * x[j];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
  const __m256 sv = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _mm256_loadu_ps(w + i)));
  }
  for (; i < n; ++i) y[i] = x[i] * scale * w[i];
}

// e^x for 8 lanes: x = k ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, so r is exact), e^r
// by a degree-6 polynomial (Cephes' expf coefficients), times 2^k through the exponent bits.
// Within 2 ulp of the true value for |x| <= 87; x is clamped to +-88 (e^-88 is about 6e-39).
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.0f)), _mm256_set1_ps(88.0f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^k: k + 127 in the exponent field; k in [-127, 127], so split it in two halves to stay normal.
  const __m256i ki = _mm256_cvtps_epi32(k);
  const __m256i k1 = _mm256_srai_epi32(ki, 1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, _mm256_set1_epi32(127)), 23));
  const __m256 s2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ki, k1), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

void silu_mul_f32(const float* g, const float* u, float* y, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

// Attention over f32 rows at 8 lanes. Loads of the last n < 8 elements of a row, zeros after.
inline __m256i tail_mask8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline __m256 load8(const float* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail_mask8(n));
}
inline void store8(float* p, __m256 v, int64_t n) {
  if (n >= 8) return _mm256_storeu_ps(p, v);
  _mm256_maskstore_ps(p, tail_mask8(n), v);
}

// The reduction tree of one 8-lane sum, for four vectors at once: each result is
// ((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7])), the same tree for every
// vector, so a score does not depend on the scores computed beside it.
inline __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ac = _mm256_add_ps(_mm256_permute2f128_ps(a, c, 0x20), _mm256_permute2f128_ps(a, c, 0x31));
  const __m256 bd = _mm256_add_ps(_mm256_permute2f128_ps(b, d, 0x20), _mm256_permute2f128_ps(b, d, 0x31));
  // [A0 + A2, B0 + B2, A1 + A3, B1 + B3 | the same for C and D]
  __m256 t = _mm256_add_ps(_mm256_unpacklo_ps(ac, bd), _mm256_unpackhi_ps(ac, bd));
  t = _mm256_add_ps(t, _mm256_permute_ps(t, 0x4e));  // [A, B, .., .. | C, D, .., ..]
  return _mm_castpd_ps(
      _mm_unpacklo_pd(_mm_castps_pd(_mm256_castps256_ps128(t)), _mm_castps_pd(_mm256_extractf128_ps(t, 1))));
}

// Elements c.. (n of them, up to 8) of a cache row as f32 lanes, zeros after; q8_0 rows hold
// whole blocks. Row j of a cache buffer with rows ld elements apart.
inline __m256 load8(const float* p, int64_t c, int64_t n) { return load8(p + c, n); }
inline __m256 load8(const uint16_t* p, int64_t c, int64_t n) {
  if (n >= 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + c)));
  alignas(16) uint16_t tail[8] = {};
  for (int64_t i = 0; i < n; ++i) tail[i] = p[c + i];
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tail)));
}
inline __m256 load8(const BlockQ8_0* p, int64_t c, int64_t) {
  const BlockQ8_0& b = p[c / kQK8_0];
  const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + c % kQK8_0))));
  return _mm256_mul_ps(v, _mm256_set1_ps(_cvtsh_ss(b.d)));
}

// The 32 values of a q8_0 cache block as four vectors of load8's values (each quant times the
// block's scale in f32), the scale converted once for all four.
inline void load32_q8_0(const BlockQ8_0& b, __m256 v[4]) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(b.d));
  for (int i = 0; i < 4; ++i) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * i));
    v[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
  }
}

// v, held in a register: a load the compiler would otherwise fold into each FMA that uses it,
// loading it again for every row of a tile (ten loads for eight FMAs in the 2 x 4 tiles below,
// which then wait on the load ports rather than the FMA units).
inline __m256 in_register(__m256 v) {
  asm("" : "+x"(v));
  return v;
}

// MR query rows x NR keys, every dot an FMA chain per lane over the dimensions (2 x 4 tiles fit
// the 16 registers with the keys' loads).
template <typename T, int MR, int NR>
void scores_tile(const float* q, int64_t ldq, const void* k, int64_t ldk, int64_t dk, float scale, float* s,
                 int64_t lds) {
  __m256 acc[MR][4];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
  const T* kr[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) kr[j] = row_at<T>(k, j, ldk);
  // The body twice (full vectors, then the tail), not a lambda: one that captured acc would keep
  // it in memory.
#define DUET_SCORES_STEP(c, n)                                                      \
  {                                                                                 \
    __m256 kv[NR];                                                                  \
    _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) kv[j] = in_register(load8(kr[j], c, n)); \
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {                          \
      const __m256 qv = load8(q + r * ldq + c, n);                                  \
      _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) acc[r][j] = _mm256_fmadd_ps(qv, kv[j], acc[r][j]); \
    }                                                                               \
  }
  int64_t c = 0;
  for (; c + 8 <= dk; c += 8) DUET_SCORES_STEP(c, 8)
  if (c < dk) DUET_SCORES_STEP(c, dk - c)
#undef DUET_SCORES_STEP
  const __m128 sc = _mm_set1_ps(scale);
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    const __m128 v = _mm_mul_ps(reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), sc);
    if constexpr (NR == 4) {
      _mm_storeu_ps(s + r * lds, v);
    } else {
      alignas(16) float out[4];
      _mm_store_ps(out, v);
      for (int j = 0; j < NR; ++j) s[r * lds + j] = out[j];
    }
  }
}

// NR keys against every query row: the keys stay in L1 while the rows (which may not fit there:
// MLA's 16 heads of 576) go by, each row pair's tile in registers.
template <typename T, int NR>
void scores_keys(const float* q, int64_t ldq, int64_t rows, const void* k, int64_t ldk, int64_t dk, float scale,
                 float* s, int64_t lds) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) scores_tile<T, 2, NR>(q + r * ldq, ldq, k, ldk, dk, scale, s + r * lds, lds);
  if (r < rows) scores_tile<T, 1, NR>(q + r * ldq, ldq, k, ldk, dk, scale, s + r * lds, lds);
}

// Every score is the same chain and tree whichever tile computes it, so the keys go outside.
template <typename T>
void attn_scores(const float* q, int64_t ldq, int64_t rows, const void* k, int64_t ldk, int64_t nk, int64_t dk,
                 float scale, float* s, int64_t lds) {
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) scores_keys<T, 4>(q, ldq, rows, row_at<T>(k, j, ldk), ldk, dk, scale, s + j, lds);
  switch (nk - j) {
    case 3: scores_keys<T, 3>(q, ldq, rows, row_at<T>(k, j, ldk), ldk, dk, scale, s + j, lds); break;
    case 2: scores_keys<T, 2>(q, ldq, rows, row_at<T>(k, j, ldk), ldk, dk, scale, s + j, lds); break;
    case 1: scores_keys<T, 1>(q, ldq, rows, row_at<T>(k, j, ldk), ldk, dk, scale, s + j, lds); break;
    default: break;
  }
}

// Lanes sum over the vectors in order (the tail's missing lanes add nothing), then one tree.
float exp_sum_f32(float* x, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(load8(x + j, n - j), mv));
    store8(x + j, e, n - j);
    sum = _mm256_add_ps(sum, n - j >= 8 ? e : _mm256_and_ps(e, _mm256_castsi256_ps(tail_mask8(n - j))));
  }
  const __m256 zero = _mm256_setzero_ps();
  return _mm_cvtss_f32(reduce4(sum, zero, zero, zero));
}

// MR rows x W vectors of columns in registers while the keys go by in order (2 x 4 fit the 16
// registers with the values' loads and the broadcast weight; 3 x 4 would spill).
template <typename T, int MR, int W, int kCols>
void values_tile(const float* p, int64_t ldp, const void* v, int64_t ldv, int64_t c0, int64_t nk, float* o,
                 int64_t ldo, bool accumulate, int64_t tail_cols) {
  const int64_t cols = kCols > 0 ? kCols : tail_cols;
  // Whole q8_0 blocks: attn_values steps its columns from 0 by 96 and 32, so a q8_0 tile of a
  // multiple of 32 columns starts on a block.
  constexpr bool kWholeQ8Blocks = std::is_same_v<T, BlockQ8_0> && kCols > 0 && kCols % 32 == 0;
  // A masked load with an empty mask when not accumulating: one form for both, which keeps the
  // accumulators in registers (a conditional here makes GCC mirror them on the stack).
  const __m256i none = _mm256_setzero_si256();
  __m256 acc[MR][W];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int w = 0; w < W; ++w) {
      acc[r][w] = _mm256_maskload_ps(o + r * ldo + 8 * w, accumulate ? tail_mask8(cols - 8 * w) : none);
    }
  for (int64_t j = 0; j < nk; ++j) {
    const T* vj = row_at<T>(v, j, ldv);
    if constexpr (MR == 1) {  // each value used once: loaded where it is used
      const __m256 pj = _mm256_broadcast_ss(p + j);
      if constexpr (kWholeQ8Blocks) {
        // A q8_0 row's blocks (c0 is a multiple of 32 here): each scale converted once for its
        // four vectors, load8's values (the same products).
        const BlockQ8_0* blocks = vj + c0 / kQK8_0;
#pragma GCC unroll 4
        for (int k = 0; k < W / 4; ++k) {
          __m256 vq[4];
          load32_q8_0(blocks[k], vq);
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) acc[0][4 * k + i] = _mm256_fmadd_ps(pj, vq[i], acc[0][4 * k + i]);
        }
        continue;
      }
#pragma GCC unroll 16
      for (int w = 0; w < W; ++w) {
        acc[0][w] = _mm256_fmadd_ps(pj, in_register(load8(vj, c0 + 8 * w, cols - 8 * w)), acc[0][w]);
      }
      continue;
    }
    __m256 vv[W];
    if constexpr (kWholeQ8Blocks) {
#pragma GCC unroll 4
      for (int k = 0; k < W / 4; ++k) load32_q8_0(vj[c0 / kQK8_0 + k], vv + 4 * k);
    } else {
#pragma GCC unroll 16
      for (int w = 0; w < W; ++w) vv[w] = in_register(load8(vj, c0 + 8 * w, cols - 8 * w));
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m256 pj = _mm256_broadcast_ss(p + r * ldp + j);
#pragma GCC unroll 16
      for (int w = 0; w < W; ++w) acc[r][w] = _mm256_fmadd_ps(pj, vv[w], acc[r][w]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int w = 0; w < W; ++w) store8(o + r * ldo + 8 * w, acc[r][w], cols - 8 * w);
}

// Columns [c, c + W x 8) (or the tail's `tail` columns) of every row: those columns of the values
// stay in L1 while the rows go by.
template <typename T, int W, int kCols>
void values_cols(const float* p, int64_t ldp, int64_t rows, const void* v, int64_t ldv, int64_t c, int64_t nk,
                 float* o, int64_t ldo, bool accumulate, int64_t tail) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) values_tile<T, 2, W, kCols>(p + r * ldp, ldp, v, ldv, c, nk, o + r * ldo + c, ldo, accumulate, tail);
  if (r < rows) values_tile<T, 1, W, kCols>(p + r * ldp, ldp, v, ldv, c, nk, o + r * ldo + c, ldo, accumulate, tail);
}

// Each element is one FMA chain over the keys whichever tile computes it, so the columns go
// outside.
template <typename T>
void attn_values(const float* p, int64_t ldp, int64_t rows, const void* v, int64_t ldv, int64_t nk, int64_t dv,
                 float* o, int64_t ldo, bool accumulate) {
  int64_t c = 0;
  // One row takes 96 columns a pass (kernels_avx512.cpp's values_rows says why).
  if (rows == 1) {
    for (; c + 96 <= dv; c += 96) values_tile<T, 1, 12, 96>(p, ldp, v, ldv, c, nk, o + c, ldo, accumulate, 0);
  }
  for (; c + 32 <= dv; c += 32) values_cols<T, 4, 32>(p, ldp, rows, v, ldv, c, nk, o, ldo, accumulate, 0);
  for (; c + 8 <= dv; c += 8) values_cols<T, 1, 8>(p, ldp, rows, v, ldv, c, nk, o, ldo, accumulate, 0);
  if (c < dv) values_cols<T, 1, 0>(p, ldp, rows, v, ldv, c, nk, o, ldo, accumulate, dv - c);
}

// attn_scores for one query row per head, head h's keys at columns [h * dk, (h + 1) * dk) of
// each cache row: every key row read once, in address order, all heads (kernels_avx512.cpp's
// reasons); four heads share reduce4, so each dot has attn_scores' chain and tree.
template <typename T>
void attn_scores_heads(const float* q, int64_t ldq, int64_t heads, const void* k, int64_t ldk, int64_t nk, int64_t dk,
                       float scale, float* s, int64_t lds) {
  const __m128 sc = _mm_set1_ps(scale);
  for (int64_t j = 0; j < nk; ++j) {
    const T* row = row_at<T>(k, j, ldk);
    if constexpr (std::is_same_v<T, BlockQ8_0>) {
      if (j + kQ8RowsAhead < nk) prefetch_q8_row(k, j + kQ8RowsAhead, ldk, heads * dk);
    }
    for (int64_t h0 = 0; h0 < heads; h0 += 4) {
      const int nh = static_cast<int>(std::min<int64_t>(4, heads - h0));
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        if (i >= nh) break;
        const T* kh = col_at(row, (h0 + i) * dk);
        const float* qh = q + (h0 + i) * ldq;
        int64_t c = 0;
        if constexpr (std::is_same_v<T, BlockQ8_0>) {  // a block at a time (dk is whole blocks)
          for (; c < dk; c += kQK8_0) {
            __m256 kv[4];
            load32_q8_0(kh[c / kQK8_0], kv);
            for (int w = 0; w < 4; ++w) acc[i] = _mm256_fmadd_ps(load8(qh + c + 8 * w, 8), kv[w], acc[i]);
          }
        }
        for (; c + 8 <= dk; c += 8) acc[i] = _mm256_fmadd_ps(load8(qh + c, 8), load8(kh, c, 8), acc[i]);
        if (c < dk) acc[i] = _mm256_fmadd_ps(load8(qh + c, dk - c), load8(kh, c, dk - c), acc[i]);
      }
      alignas(16) float out[4];
      _mm_store_ps(out, _mm_mul_ps(reduce4(acc[0], acc[1], acc[2], acc[3]), sc));
      for (int i = 0; i < nh; ++i) s[(h0 + i) * lds + j] = out[i];
    }
  }
}

// attn_values for one weight row per head, head h's values at columns [h * dv, (h + 1) * dv):
// each value row read once, all heads, the sums kept in o between rows (each element the same
// FMA chain over j as attn_values').
template <typename T>
void attn_values_heads(const float* p, int64_t ldp, int64_t heads, const void* v, int64_t ldv, int64_t nk, int64_t dv,
                       float* o, int64_t ldo, bool accumulate) {
  if (!accumulate) {
    for (int64_t h = 0; h < heads; ++h) std::fill_n(o + h * ldo, dv, 0.0f);
  }
  for (int64_t j = 0; j < nk; ++j) {
    const T* row = row_at<T>(v, j, ldv);
    if constexpr (std::is_same_v<T, BlockQ8_0>) {
      if (j + kQ8RowsAhead < nk) prefetch_q8_row(v, j + kQ8RowsAhead, ldv, heads * dv);
    }
    for (int64_t h = 0; h < heads; ++h) {
      const T* vh = col_at(row, h * dv);
      float* oh = o + h * ldo;
      const __m256 pj = _mm256_broadcast_ss(p + h * ldp + j);
      if constexpr (std::is_same_v<T, BlockQ8_0>) {  // a block at a time (dv is whole blocks)
        for (int64_t c = 0; c < dv; c += kQK8_0) {
          __m256 vv[4];
          load32_q8_0(vh[c / kQK8_0], vv);
          for (int w = 0; w < 4; ++w) store8(oh + c + 8 * w, _mm256_fmadd_ps(pj, vv[w], load8(oh + c + 8 * w, 8)), 8);
        }
        continue;
      }
      for (int64_t c = 0; c < dv; c += 8) {
        const int64_t n = std::min<int64_t>(8, dv - c);
        store8(oh + c, _mm256_fmadd_ps(pj, load8(vh, c, n), load8(oh + c, n)), n);
      }
    }
  }
}

void scale_add_f32(float* y, float a, const float* x, float b, int64_t n) {
  const __m256 av = _mm256_set1_ps(a), bv = _mm256_set1_ps(b);
  for (int64_t i = 0; i < n; i += 8) {
    store8(y + i, _mm256_fmadd_ps(load8(x + i, n - i), bv, _mm256_mul_ps(load8(y + i, n - i), av)), n - i);
  }
}

#define DUET_QGEMM_VNNI 0
#include "duet/backend/cpu/qgemm_x86.inc"
#undef DUET_QGEMM_VNNI

#define DUET_AVX2_VNNI 0
#include "duet/backend/cpu/packed_avx2.inc"
#undef DUET_AVX2_VNNI

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
      .f32_to_f16 = f32_to_f16,
      .attn_scores = {attn_scores<float>, attn_scores<uint16_t>, attn_scores<BlockQ8_0>},
      .exp_sum_f32 = exp_sum_f32,
      .attn_values = {attn_values<float>, attn_values<uint16_t>, attn_values<BlockQ8_0>},
      .attn_scores_heads = {attn_scores_heads<float>, attn_scores_heads<uint16_t>, attn_scores_heads<BlockQ8_0>},
      .attn_values_heads = {attn_values_heads<float>, attn_values_heads<uint16_t>, attn_values_heads<BlockQ8_0>},
      .scale_add_f32 = scale_add_f32,
      .rms_norm_f32 = rms_norm_f32,
      .silu_mul_f32 = silu_mul_f32,
      .quantize_q8a = quantize_q8a_x86,
      .gemm_q4_0_q8a = qgemm_x86<Q4_0Policy>,
      .gemm_q8_0_q8a = qgemm_x86<Q8_0Policy>,
      .gemm_q4_k_q8a = qgemm_k_x86<BlockQ4_K, dot_q4_k>,
      .gemm_q6_k_q8a = qgemm_k_x86<BlockQ6_K, dot_q6_k>,
      .gemm_q4_0x16_q8a = packed_gemm_of<DType::kQ4_0>(),
      .gemm_q8_0x16_q8a = packed_gemm_of<DType::kQ8_0>(),
      .gemm_q4_kx16_q8a = packed_gemm_of<DType::kQ4_K>(),
      .gemm_q5_0x16_q8a = packed_gemm_of<DType::kQ5_0>(),
      .gemm_q6_kx16_q8a = packed_gemm_of<DType::kQ6_K>(),
      .gemm_q4_1x16_q8a = packed_gemm_of<DType::kQ4_1>(),
      // 256 activation rows a call (64 before, 32 before that; the AVX-VNNI table copies it, the
      // AVX-512 table keeps 64): a group's first tile over each half, which makes the saved words
      // (Q8_0's |w| and masks, Q4_K's and Q5_0's unpacked words) at about twice a reader's cost
      // per product, runs once per 256 rows instead of 64. pp512 on Zen 5, 2 threads, alternated
      // (bench/RESULTS.md, 2026-12-05, twenty-first session), 64 -> 256 rows: AVX2 Q8_0 faster in
      // 16 of 23 rounds (medians of ten 133.7 -> 136.3 tokens/s), Q4_K_M in 3 of 4 (159 -> 175),
      // Q4_0 the same (191 -> 195), and a 16-stream Q4_0 server load too; AVX-VNNI faster in 6
      // of 9 (Q8_0, Q4_0, Q4_K_M); AVX-512 slower in 7 of 9.
      .packed_act_rows = 256,
      .dequantize_fp8 = dequantize_fp8_avx2,
      .gemv_fp8 = gemv_fp8_avx2,
      .dequantize_kv_fp8 = dequantize_kv_fp8<dequantize_fp8_avx2, dequantize_f16>,
      .index_totals = index_totals,
  };
  return k;
}

}  // namespace duet::cpu
