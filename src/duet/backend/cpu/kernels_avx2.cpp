// AVX2 + FMA + F16C kernels. This file alone is compiled with those flags; it is only called
// after CPUID says the machine has them.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "duet/backend/cpu/kernels.h"
#include "duet/backend/cpu/packed.h"
#include "duet/core/quant.h"

namespace duet::cpu {
namespace {

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
template <typename T>
const T* row_at(const void* base, int64_t j, int64_t ld) {
  if constexpr (std::is_same_v<T, BlockQ8_0>) return static_cast<const T*>(base) + j * ld / kQK8_0;
  return static_cast<const T*>(base) + j * ld;
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
    _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) kv[j] = load8(kr[j], c, n); \
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

template <typename T, int MR>
void scores_rows(const float* q, int64_t ldq, const void* k, int64_t ldk, int64_t nk, int64_t dk, float scale,
                 float* s, int64_t lds) {
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) scores_tile<T, MR, 4>(q, ldq, row_at<T>(k, j, ldk), ldk, dk, scale, s + j, lds);
  switch (nk - j) {
    case 3: scores_tile<T, MR, 3>(q, ldq, row_at<T>(k, j, ldk), ldk, dk, scale, s + j, lds); break;
    case 2: scores_tile<T, MR, 2>(q, ldq, row_at<T>(k, j, ldk), ldk, dk, scale, s + j, lds); break;
    case 1: scores_tile<T, MR, 1>(q, ldq, row_at<T>(k, j, ldk), ldk, dk, scale, s + j, lds); break;
    default: break;
  }
}

template <typename T>
void attn_scores(const float* q, int64_t ldq, int64_t rows, const void* k, int64_t ldk, int64_t nk, int64_t dk,
                 float scale, float* s, int64_t lds) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) scores_rows<T, 2>(q + r * ldq, ldq, k, ldk, nk, dk, scale, s + r * lds, lds);
  if (r < rows) scores_rows<T, 1>(q + r * ldq, ldq, k, ldk, nk, dk, scale, s + r * lds, lds);
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
    __m256 vv[W];
#pragma GCC unroll 16
    for (int w = 0; w < W; ++w) vv[w] = load8(vj, c0 + 8 * w, cols - 8 * w);
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

template <typename T, int MR>
void values_rows(const float* p, int64_t ldp, const void* v, int64_t ldv, int64_t nk, int64_t dv, float* o,
                 int64_t ldo, bool accumulate) {
  int64_t c = 0;
  for (; c + 32 <= dv; c += 32) values_tile<T, MR, 4, 32>(p, ldp, v, ldv, c, nk, o + c, ldo, accumulate, 0);
  for (; c + 8 <= dv; c += 8) values_tile<T, MR, 1, 8>(p, ldp, v, ldv, c, nk, o + c, ldo, accumulate, 0);
  if (c < dv) values_tile<T, MR, 1, 0>(p, ldp, v, ldv, c, nk, o + c, ldo, accumulate, dv - c);
}

template <typename T>
void attn_values(const float* p, int64_t ldp, int64_t rows, const void* v, int64_t ldv, int64_t nk, int64_t dv,
                 float* o, int64_t ldo, bool accumulate) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) values_rows<T, 2>(p + r * ldp, ldp, v, ldv, nk, dv, o + r * ldo, ldo, accumulate);
  if (r < rows) values_rows<T, 1>(p + r * ldp, ldp, v, ldv, nk, dv, o + r * ldo, ldo, accumulate);
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

// Packed weights (packed.h) with 256-bit registers: each 64-byte word is two halves of 8 rows.
// vpmaddubsw multiplies the unsigned weight bytes by an activation word broadcast to every lane
// and adds the pairs in 16 bits; the 16-bit sums of several words add up before vpmaddwd widens
// them to int32 (a nibble times an int8 activation, |a| <= 127, is at most 15 * 127 * 2 = 3810
// per pair, so all eight products of a 32-value block fit 2^15; Q5_0's 31 allow four). Q8_0 goes
// through the sign trick (|w| times a with w's sign), its unsigned form would saturate.
// One activation row (decode) takes the group's 16 rows in one pass: every cache line is read
// once and each broadcast activation word serves both halves. Tiles of 4 activation rows
// (prefill, batches) take one half at a time, each weight word unpacked once for the four.
// Integer sums are exact and every float operation is the same in both shapes, so a row's
// result does not depend on the batch.
// Read straight from memory, so the broadcast does not pass through a general register.
inline __m256i bcast_word(const BlockQ8A& ab, int k) { return _mm256_broadcastd_epi32(_mm_loadu_si32(ab.qs + 4 * k)); }
inline __m256i load_word(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256 load_f16x8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// Q5_0's fifth bits of half h of word j: 32 mask bits spread to 16 on the 32 bytes they belong to.
inline __m256i fifth_bits(const uint8_t* masks, int j, int h) {
  uint32_t bits;
  std::memcpy(&bits, masks + 8 * j + 4 * h, 4);
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                        3, 3, 3, 3, 3, 3);
  const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)), shuf), select);
  return _mm256_and_si256(_mm256_cmpeq_epi8(v, select), _mm256_set1_epi8(16));
}

// Pins a running sum in a register at this point: integer adds are associative, and GCC would
// otherwise regroup a block's products into one tree, computing all of them first and spilling.
inline void chain(__m256i& v) { __asm__("" : "+x"(v)); }

inline void store_half(__m256 v, float* y, int64_t valid) {
  if (valid >= 8) return _mm256_storeu_ps(y, v);
  float out[8];
  _mm256_storeu_ps(out, v);
  for (int64_t r = 0; r < valid; ++r) y[r] = out[r];
}

// Both halves of a 16-row group: rows 0..7 from lo, 8..15 from hi; `valid` rows exist.
inline void store_rows16(__m256 lo, __m256 hi, float* y, int64_t valid) {
  store_half(lo, y, valid);
  if (valid > 8) store_half(hi, y + 8, valid - 8);
}

// Q4_0, Q4_1, Q5_0 and Q8_0 blocks of 16 rows: their size, what the unsigned weights carry on top
// of the signed value (taken off as offset * sum(a)), and how many words (two products each) add
// up in 16 bits before widening.
template <DType kType>
struct Legacy {
  static constexpr bool kQ8 = kType == DType::kQ8_0;
  static constexpr bool kQ5 = kType == DType::kQ5_0;
  static constexpr bool kQ41 = kType == DType::kQ4_1;  // unsigned nibbles times d, plus m * sum(a)
  static constexpr size_t kBlockBytes =
      kQ8 ? 32 + 16 * 32 : (kQ5 ? 32 + 16 * 16 + 64 : (kQ41 ? 64 + 16 * 16 : 32 + 16 * 16));
  static constexpr int kOffset = kQ8 ? 0 : (kQ5 ? 16 : (kQ41 ? 0 : 8));
  static constexpr int kChain = kQ5 ? 2 : 4;
};

// Half h of word k of a 4- or 5-bit block: the values 4k.. (low nibbles) and 16 + 4k.. (high).
template <DType kType>
inline void nibbles(const uint8_t* p, int k, int h, __m256i& lo, __m256i& hi) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i z = load_word(p + 32 + 64 * k + 32 * h);
  lo = _mm256_and_si256(z, low4);
  hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), low4);
  if constexpr (kType == DType::kQ5_0) {
    lo = _mm256_or_si256(lo, fifth_bits(p + 32 + 256, k, h));
    hi = _mm256_or_si256(hi, fifth_bits(p + 32 + 256, 4 + k, h));
  }
}

// Q8_0: the signed weights of half h of word k, and their absolute values.
inline void q8_word(const uint8_t* p, int k, int h, __m256i& w, __m256i& wabs) {
  w = _mm256_xor_si256(load_word(p + 32 + 64 * k + 32 * h), _mm256_set1_epi8(-128));
  wabs = _mm256_sign_epi8(w, w);
}

// acc += isum * (d * da) for one block, and Q4_1's minimum term (the same operations for every
// tile shape).
template <DType kType>
inline __m256 legacy_fma(__m256 acc, __m256i isum, const uint8_t* p, int h, const BlockQ8A& ab) {
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(load_f16x8(p + 16 * h), _mm256_set1_ps(ab.d)), acc);
  if constexpr (Legacy<kType>::kQ41) {
    acc = _mm256_fmadd_ps(load_f16x8(p + 32 + 256 + 16 * h), _mm256_set1_ps(ab.d * static_cast<float>(ab.sum)), acc);
  }
  return acc;
}

// One activation row against all 16 rows of a group.
template <DType kType>
void packed_row16(const uint8_t* group, const BlockQ8A* a, const int32_t*, int64_t nb, float* y, int64_t valid) {
  using L = Legacy<kType>;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + static_cast<size_t>(b) * L::kBlockBytes;
    const BlockQ8A& ab = a[b];
    __m256i i0 = _mm256_set1_epi32(-L::kOffset * ab.sum), i1 = i0;
    if constexpr (L::kQ8) {
      for (int k = 0; k < 8; ++k) {
        const __m256i bw = bcast_word(ab, k);
        __m256i w, wabs;
        q8_word(p, k, 0, w, wabs);
        i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(bw, w)), ones));
        q8_word(p, k, 1, w, wabs);
        i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(bw, w)), ones));
      }
    } else {
      for (int k0 = 0; k0 < 4; k0 += L::kChain) {
        __m256i t0 = _mm256_setzero_si256(), t1 = _mm256_setzero_si256();
        for (int k = k0; k < k0 + L::kChain; ++k) {
          const __m256i blo = bcast_word(ab, k), bhi = bcast_word(ab, 4 + k);
          __m256i lo, hi;
          nibbles<kType>(p, k, 0, lo, hi);
          t0 = _mm256_add_epi16(t0, _mm256_add_epi16(_mm256_maddubs_epi16(lo, blo), _mm256_maddubs_epi16(hi, bhi)));
          nibbles<kType>(p, k, 1, lo, hi);
          t1 = _mm256_add_epi16(t1, _mm256_add_epi16(_mm256_maddubs_epi16(lo, blo), _mm256_maddubs_epi16(hi, bhi)));
          chain(t0);
          chain(t1);
        }
        i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(t0, ones));
        i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(t1, ones));
      }
    }
    acc0 = legacy_fma<kType>(acc0, i0, p, 0, ab);
    acc1 = legacy_fma<kType>(acc1, i1, p, 1, ab);
  }
  store_rows16(acc0, acc1, y, valid);
}

// MR activation rows against half h (8 rows) of a group.
template <DType kType, int MR>
void packed_half(const uint8_t* group, int h, const BlockQ8A* a, const int32_t*, int64_t nb, float* y, int64_t ldy,
                 int64_t valid) {
  using L = Legacy<kType>;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + static_cast<size_t>(b) * L::kBlockBytes;
    // The offset's correction joins after the first chain, so the sums are not live during it.
    __m256i isum[MR];
    if constexpr (L::kQ8) {
      for (int i = 0; i < MR; ++i) isum[i] = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        __m256i w, wabs;
        q8_word(p, k, h, w, wabs);
        for (int i = 0; i < MR; ++i) {
          const __m256i t = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(bcast_word(a[i * nb + b], k), w));
          isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(t, ones));
          chain(isum[i]);
        }
      }
    } else {
      for (int k0 = 0; k0 < 4; k0 += L::kChain) {
        __m256i t[MR];
        for (int i = 0; i < MR; ++i) t[i] = _mm256_setzero_si256();
        for (int k = k0; k < k0 + L::kChain; ++k) {
          __m256i lo, hi;
          nibbles<kType>(p, k, h, lo, hi);
          for (int i = 0; i < MR; ++i) {
            const BlockQ8A& ab = a[i * nb + b];
            t[i] = _mm256_add_epi16(t[i], _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast_word(ab, k)),
                                                           _mm256_maddubs_epi16(hi, bcast_word(ab, 4 + k))));
            chain(t[i]);
          }
        }
        for (int i = 0; i < MR; ++i) {
          const __m256i s = _mm256_madd_epi16(t[i], ones);
          isum[i] = k0 == 0 ? _mm256_add_epi32(s, _mm256_set1_epi32(-L::kOffset * a[i * nb + b].sum))
                            : _mm256_add_epi32(isum[i], s);
          if constexpr (L::kChain < 4) chain(isum[i]);
        }
      }
    }
    for (int i = 0; i < MR; ++i) acc[i] = legacy_fma<kType>(acc[i], isum[i], p, h, a[i * nb + b]);
  }
  for (int i = 0; i < MR; ++i) store_half(acc[i], y + i * ldy, valid);
}

// Packed Q4_K: per sub-block, d * scale and dmin * min as vectors of 8 rows;
// acc += dsc * da * sum(q * a) - dm * da * sum(a), sub-block after sub-block.
constexpr size_t kK4Scales = 64, kK4Mins = kK4Scales + 128, kK4Qs = kK4Mins + 128, kK4BlockBytes = kK4Qs + 16 * 128;
inline __m256 u8x8_ps(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// Sub-block s of the super-block at p, half h: its 16-bit pair sums `t` made int32 and scaled.
inline __m256 q4_k_fma(__m256 acc, __m256i t, const uint8_t* p, int s, int h, const BlockQ8A& ab) {
  const __m256 dsc = _mm256_mul_ps(load_f16x8(p + 16 * h), u8x8_ps(p + kK4Scales + 16 * s + 8 * h));
  const __m256 dm = _mm256_mul_ps(load_f16x8(p + 32 + 16 * h), u8x8_ps(p + kK4Mins + 16 * s + 8 * h));
  const __m256i isum = _mm256_madd_epi16(t, _mm256_set1_epi16(1));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dsc, _mm256_set1_ps(ab.d)), acc);
  return _mm256_fnmadd_ps(dm, _mm256_set1_ps(ab.d * static_cast<float>(ab.sum)), acc);
}

// One activation row against all 16 rows: sub-blocks 2g and 2g + 1 share their words (low and
// high nibbles), so each word is loaded once.
void packed_row16_q4_k(const uint8_t* group, const BlockQ8A* a, const int32_t*, int64_t nb, float* y, int64_t valid) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = group + static_cast<size_t>(sb) * kK4BlockBytes;
    for (int g = 0; g < 4; ++g) {
      const BlockQ8A& ae = a[sb * 8 + 2 * g];
      const BlockQ8A& ao = a[sb * 8 + 2 * g + 1];
      const uint8_t* q = p + kK4Qs + static_cast<size_t>(g) * 8 * 64;
      __m256i te0 = _mm256_setzero_si256(), te1 = te0, to0 = te0, to1 = te0;
      for (int k = 0; k < 8; ++k) {
        const __m256i be = bcast_word(ae, k), bo = bcast_word(ao, k);
        const __m256i z0 = load_word(q + 64 * k), z1 = load_word(q + 64 * k + 32);
        te0 = _mm256_add_epi16(te0, _mm256_maddubs_epi16(_mm256_and_si256(z0, low4), be));
        te1 = _mm256_add_epi16(te1, _mm256_maddubs_epi16(_mm256_and_si256(z1, low4), be));
        to0 = _mm256_add_epi16(to0, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(z0, 4), low4), bo));
        to1 = _mm256_add_epi16(to1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(z1, 4), low4), bo));
        chain(te0);
        chain(te1);
        chain(to0);
        chain(to1);
      }
      acc0 = q4_k_fma(acc0, te0, p, 2 * g, 0, ae);
      acc1 = q4_k_fma(acc1, te1, p, 2 * g, 1, ae);
      acc0 = q4_k_fma(acc0, to0, p, 2 * g + 1, 0, ao);
      acc1 = q4_k_fma(acc1, to1, p, 2 * g + 1, 1, ao);
    }
  }
  store_rows16(acc0, acc1, y, valid);
}

// MR activation rows against half h.
template <DType kType, int MR>
void packed_half_q4_k(const uint8_t* group, int h, const BlockQ8A* a, const int32_t*, int64_t nb, float* y,
                      int64_t ldy, int64_t valid) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = group + static_cast<size_t>(sb) * kK4BlockBytes;
    for (int s = 0; s < 8; ++s) {
      const uint8_t* q = p + kK4Qs + static_cast<size_t>(s / 2) * 8 * 64 + 32 * h;
      __m256i t[MR];
      for (int i = 0; i < MR; ++i) t[i] = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        const __m256i z = load_word(q + 64 * k);
        const __m256i w = _mm256_and_si256((s & 1) ? _mm256_srli_epi16(z, 4) : z, low4);
        for (int i = 0; i < MR; ++i) {
          t[i] = _mm256_add_epi16(t[i], _mm256_maddubs_epi16(w, bcast_word(a[i * nb + sb * 8 + s], k)));
          chain(t[i]);
        }
      }
      for (int i = 0; i < MR; ++i) acc[i] = q4_k_fma(acc[i], t[i], p, s, h, a[i * nb + sb * 8 + s]);
    }
  }
  for (int i = 0; i < MR; ++i) store_half(acc[i], y + i * ldy, valid);
}

// Packed Q6_K's 6-bit values (0..63, as unsigned bytes) of word k, half h, of sub-block s of
// the super-block's half hh: rebuilt from the low-nibble and high-pair planes.
inline __m256i q6_word(const uint8_t* p, int hh, int s, int k, int h) {
  constexpr size_t kQl = 32 + 256, kQh = kQl + 2048;
  const __m256i low4 = _mm256_set1_epi8(0x0f), high2 = _mm256_set1_epi8(0x30);
  const __m256i ql = load_word(p + kQl + 64 * (16 * hh + 8 * (s & 1) + k) + 32 * h);
  const __m256i qh = load_word(p + kQh + 64 * (8 * hh + k) + 32 * h);
  const __m256i lo = _mm256_and_si256(s >= 2 ? _mm256_srli_epi16(ql, 4) : ql, low4);
  // The pair at bits 2s..2s+1 moved to bits 4..5.
  const __m256i hi = s == 0 ? _mm256_slli_epi16(qh, 4)
                     : s == 1 ? _mm256_slli_epi16(qh, 2)
                     : s == 2 ? qh
                              : _mm256_srli_epi16(qh, 2);
  return _mm256_or_si256(lo, _mm256_and_si256(hi, high2));
}

// Packed Q6_K, half h: the 6-bit values rebuilt as unsigned bytes q (0..63) from the nibble and
// bit-pair planes, multiplied with the signed activations; sum((q - 32) a) = sum(q a) - 32 sum(a)
// with the activation's 16-value half sums from `half` (one scale group each). Two words' 16-bit
// sums fit before widening (2 * 63 * 127 * 2 < 2^15).
template <DType kType, int MR>
void packed_half_q6_k(const uint8_t* group, int h, const BlockQ8A* a, const int32_t* half, int64_t nb, float* y,
                      int64_t ldy, int64_t valid) {
  constexpr size_t kScales = 32, kQl = kScales + 256, kQh = kQl + 2048, kBlockBytes = kQh + 1024;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0f), high2 = _mm256_set1_epi8(0x30);
  const auto scales8 = [](const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  };
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = group + static_cast<size_t>(sb) * kBlockBytes;
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
    for (int hh = 0; hh < 2; ++hh) {
      for (int s = 0; s < 4; ++s) {
        const __m128i lo_shift = _mm_cvtsi32_si128(4 * (s >> 1));
        __m256i w[8];
        for (int k = 0; k < 8; ++k) {
          const __m256i ql = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(p + kQl + 64 * (16 * hh + 8 * (s & 1) + k) + 32 * h));
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kQh + 64 * (8 * hh + k) + 32 * h));
          const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, lo_shift), low4);
          const __m256i hi = s < 2 ? _mm256_slli_epi16(qh, 4 - 2 * s) : _mm256_srli_epi16(qh, 2 * s - 4);
          w[k] = _mm256_or_si256(lo, _mm256_and_si256(hi, high2));
        }
        const int g = 8 * hh + 2 * s;
        const __m256 dsc_lo = _mm256_mul_ps(d, scales8(p + kScales + 16 * g + 8 * h));
        const __m256 dsc_hi = _mm256_mul_ps(d, scales8(p + kScales + 16 * (g + 1) + 8 * h));
        for (int i = 0; i < MR; ++i) {
          const int64_t blk = i * nb + sb * 8 + 4 * hh + s;
          const BlockQ8A& ab = a[blk];
          __m256i s0 = _mm256_set1_epi32(-32 * half[2 * blk]), s1 = _mm256_set1_epi32(-32 * half[2 * blk + 1]);
          for (int k = 0; k < 4; k += 2) {
            const __m256i t0 = _mm256_add_epi16(_mm256_maddubs_epi16(w[k], bcast_word(ab, k)),
                                                _mm256_maddubs_epi16(w[k + 1], bcast_word(ab, k + 1)));
            const __m256i t1 = _mm256_add_epi16(_mm256_maddubs_epi16(w[4 + k], bcast_word(ab, 4 + k)),
                                                _mm256_maddubs_epi16(w[5 + k], bcast_word(ab, 5 + k)));
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(t0, ones));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(t1, ones));
          }
          const __m256 da = _mm256_set1_ps(ab.d);
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(dsc_lo, da), acc[i]);
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(dsc_hi, da), acc[i]);
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i) store_half(acc[i], y + i * ldy, valid);
}

// Q6_K, one activation row against all 16 rows: per 32-value sub-block, each word's 6-bit
// values are rebuilt for both halves and meet one broadcast activation word; two words' 16-bit
// sums fit before widening. The float operations are the half kernel's, in its order.
template <int kS>
inline void q6_sub_block16(const uint8_t* p, int hh, const BlockQ8A& ab, const int32_t* hs, __m256& acc0,
                           __m256& acc1) {
  constexpr size_t kScales = 32;
  const __m256i ones = _mm256_set1_epi16(1);
  // [group][half]: values 0..15 (words 0..3) and 16..31 (words 4..7) have their own scales.
  __m256i sum[2][2];
  for (int g = 0; g < 2; ++g) sum[g][0] = sum[g][1] = _mm256_set1_epi32(-32 * hs[g]);
  for (int k0 = 0; k0 < 8; k0 += 2) {
    __m256i t0 = _mm256_setzero_si256(), t1 = _mm256_setzero_si256();
    for (int k = k0; k < k0 + 2; ++k) {
      const __m256i b = bcast_word(ab, k);
      t0 = _mm256_add_epi16(t0, _mm256_maddubs_epi16(q6_word(p, hh, kS, k, 0), b));
      t1 = _mm256_add_epi16(t1, _mm256_maddubs_epi16(q6_word(p, hh, kS, k, 1), b));
      chain(t0);
      chain(t1);
    }
    sum[k0 / 4][0] = _mm256_add_epi32(sum[k0 / 4][0], _mm256_madd_epi16(t0, ones));
    sum[k0 / 4][1] = _mm256_add_epi32(sum[k0 / 4][1], _mm256_madd_epi16(t1, ones));
  }
  const int g = 8 * hh + 2 * kS;
  const __m256 da = _mm256_set1_ps(ab.d);
  __m256* acc[2] = {&acc0, &acc1};
  for (int h = 0; h < 2; ++h) {
    const __m256 d = load_f16x8(p + 16 * h);
    for (int gg = 0; gg < 2; ++gg) {
      const __m256 dsc = _mm256_mul_ps(
          d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                 _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + kScales + 16 * (g + gg) + 8 * h)))));
      *acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[gg][h]), _mm256_mul_ps(dsc, da), *acc[h]);
    }
  }
}

void packed_row16_q6_k(const uint8_t* group, const BlockQ8A* a, const int32_t* half, int64_t nb, float* y,
                       int64_t valid) {
  constexpr size_t kBlockBytes = 32 + 256 + 2048 + 1024;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = group + static_cast<size_t>(sb) * kBlockBytes;
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t blk = sb * 8 + 4 * hh;
      q6_sub_block16<0>(p, hh, a[blk], half + 2 * blk, acc0, acc1);
      q6_sub_block16<1>(p, hh, a[blk + 1], half + 2 * (blk + 1), acc0, acc1);
      q6_sub_block16<2>(p, hh, a[blk + 2], half + 2 * (blk + 2), acc0, acc1);
      q6_sub_block16<3>(p, hh, a[blk + 3], half + 2 * (blk + 3), acc0, acc1);
    }
  }
  store_rows16(acc0, acc1, y, valid);
}

using HalfFn = void (*)(const uint8_t*, int, const BlockQ8A*, const int32_t*, int64_t, float*, int64_t, int64_t);
using RowFn = void (*)(const uint8_t*, const BlockQ8A*, const int32_t*, int64_t, float*, int64_t);

template <DType kType, HalfFn Tile4, RowFn Row>
void packed_gemm_avx2(const uint8_t* packed, int64_t nw, const BlockQ8A* a, const int32_t* half, int64_t m, int64_t nb,
                      float* y, int64_t ldy) {
  const size_t group_bytes = packed_bytes(kType, kPackRows, nb);
  auto half_of = [&](int64_t i) { return kType == DType::kQ6_K ? half + 2 * i * nb : nullptr; };
  const int64_t m4 = m / 4 * 4;
  for (int64_t j = 0; j < nw; j += kPackRows) {
    const uint8_t* group = packed + static_cast<size_t>(j / kPackRows) * group_bytes;
    for (int h = 0; h < 2 && m4 > 0; ++h) {
      const int64_t valid = std::min<int64_t>(8, nw - j - 8 * h);
      if (valid <= 0) break;
      for (int64_t i = 0; i < m4; i += 4) Tile4(group, h, a + i * nb, half_of(i), nb, y + j + 8 * h + i * ldy, ldy, valid);
    }
    for (int64_t i = m4; i < m; ++i) Row(group, a + i * nb, half_of(i), nb, y + j + i * ldy, nw - j);
  }
}

template <DType kType>
constexpr PackedGemmFn packed_gemm_of() {
  if constexpr (kType == DType::kQ4_K) {
    return packed_gemm_avx2<kType, packed_half_q4_k<kType, 4>, packed_row16_q4_k>;
  } else if constexpr (kType == DType::kQ6_K) {
    return packed_gemm_avx2<kType, packed_half_q6_k<kType, 4>, packed_row16_q6_k>;
  } else {
    return packed_gemm_avx2<kType, packed_half<kType, 4>, packed_row16<kType>>;
  }
}

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
      .dequantize_fp8 = dequantize_fp8_avx2,
      .gemv_fp8 = gemv_fp8_avx2,
  };
  return k;
}

}  // namespace duet::cpu
