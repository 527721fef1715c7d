// ARM NEON kernels with the dot-product extension (ARMv8.2 dotprod, as on Kunpeng 920): the
// integer GEMM with sdot, and f32 GEMM/dot/axpy/RMSNorm with FMA. Compiled only for aarch64,
// with +dotprod for this file alone; chosen only when the CPU reports asimddp.
#include <arm_neon.h>

#include <algorithm>
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

void quantize_q8a(const float* x, BlockQ8A* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK8A; ++b) {
    const float* xb = x + b * kQK8A;
    float32x4_t v[8];
    float32x4_t amax = vdupq_n_f32(0.0f);
    for (int k = 0; k < 8; ++k) {
      v[k] = vld1q_f32(xb + 4 * k);
      amax = vmaxq_f32(amax, vabsq_f32(v[k]));
    }
    const float d = vmaxvq_f32(amax) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32x4_t sum = vdupq_n_s32(0);
    int32x4_t q[8];
    for (int k = 0; k < 8; ++k) {
      q[k] = vcvtnq_s32_f32(vmulq_n_f32(v[k], id));  // round to nearest, ties to even
      sum = vaddq_s32(sum, q[k]);
    }
    for (int k = 0; k < 8; k += 2) {
      const int16x8_t h = vcombine_s16(vmovn_s32(q[k]), vmovn_s32(q[k + 1]));
      vst1_s8(y[b].qs + 4 * k, vmovn_s16(h));
    }
    y[b].d = d;
    y[b].sum = vaddvq_s32(sum);
  }
}

struct Q4_0Policy {
  using Block = BlockQ4_0;
  // The 32 quants in element order as -8..7 (sdot multiplies signed by signed), in two halves.
  static void weights(const Block& b, int8x16_t& lo, int8x16_t& hi) {
    const uint8x16_t bytes = vld1q_u8(b.qs);
    const int8x16_t eight = vdupq_n_s8(8);
    lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(bytes, vdupq_n_u8(0x0f))), eight);
    hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(bytes, 4)), eight);
  }
};

struct Q8_0Policy {
  using Block = BlockQ8_0;
  static void weights(const Block& b, int8x16_t& lo, int8x16_t& hi) {
    lo = vld1q_s8(b.qs);
    hi = vld1q_s8(b.qs + 16);
  }
};

// NR weight rows x MR activation rows, as in the x86 kernel.
template <typename P, int NR, int MR>
void qgemm_tile(const uint8_t* w, size_t row_bytes, const BlockQ8A* a, int64_t nb, float* y, int64_t ldy) {
  float32x4_t acc[NR][MR];
  for (int r = 0; r < NR; ++r) {
    for (int i = 0; i < MR; ++i) acc[r][i] = vdupq_n_f32(0.0f);
  }
  for (int64_t b = 0; b < nb; ++b) {
    int8x16_t alo[MR], ahi[MR];
    for (int i = 0; i < MR; ++i) {
      alo[i] = vld1q_s8(a[i * nb + b].qs);
      ahi[i] = vld1q_s8(a[i * nb + b].qs + 16);
    }
    for (int r = 0; r < NR; ++r) {
      const auto& blk = reinterpret_cast<const typename P::Block*>(w + static_cast<size_t>(r) * row_bytes)[b];
      const float dw = fp16_to_fp32(blk.d);
      int8x16_t wlo, whi;
      P::weights(blk, wlo, whi);
      for (int i = 0; i < MR; ++i) {
        const float d = dw * a[i * nb + b].d;
        const int32x4_t p = vdotq_s32(vdotq_s32(vdupq_n_s32(0), wlo, alo[i]), whi, ahi[i]);
        acc[r][i] = vfmaq_n_f32(acc[r][i], vcvtq_f32_s32(p), d);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int i = 0; i < MR; ++i) y[i * ldy + r] = vaddvq_f32(acc[r][i]);
  }
}

template <typename P, int MR>
void qgemm_rows(const uint8_t* w, size_t row_bytes, int64_t nw, const BlockQ8A* a, int64_t nb, float* y, int64_t ldy) {
  int64_t j = 0;
  for (; j + 4 <= nw; j += 4) qgemm_tile<P, 4, MR>(w + static_cast<size_t>(j) * row_bytes, row_bytes, a, nb, y + j, ldy);
  for (; j < nw; ++j) qgemm_tile<P, 1, MR>(w + static_cast<size_t>(j) * row_bytes, row_bytes, a, nb, y + j, ldy);
}

template <typename P>
void qgemm(const uint8_t* w, size_t row_bytes, int64_t nw, const BlockQ8A* a, int64_t m, int64_t nb, float* y,
           int64_t ldy) {
  int64_t i = 0;
  for (; i + 2 <= m; i += 2) qgemm_rows<P, 2>(w, row_bytes, nw, a + i * nb, nb, y + i * ldy, ldy);
  for (; i < m; ++i) qgemm_rows<P, 1>(w, row_bytes, nw, a + i * nb, nb, y + i * ldy, ldy);
}

// K-quants, one activation row at a time (see kernels_generic.cpp for the layouts).
float dot_q4_k(const BlockQ4_K* w, const BlockQ8A* a, int64_t nb) {
  float32x4_t acc = vdupq_n_f32(0.0f);
  float scalar = 0.0f;
  const uint8x16_t mask = vdupq_n_u8(0x0f);
  for (int64_t s = 0; s < nb / 8; ++s) {
    const float d = fp16_to_fp32(w[s].d);
    const float dmin = fp16_to_fp32(w[s].dmin);
    for (int g = 0; g < 4; ++g) {
      const uint8x16_t b0 = vld1q_u8(w[s].qs + 32 * g);
      const uint8x16_t b1 = vld1q_u8(w[s].qs + 32 * g + 16);
      for (int half = 0; half < 2; ++half) {  // low nibbles: block 2g, high: 2g + 1
        const int j = 2 * g + half;
        uint8_t sc, m;
        scale_min_k4(j, w[s].scales, &sc, &m);
        const BlockQ8A& ab = a[s * 8 + j];
        const int8x16_t q0 = vreinterpretq_s8_u8(half ? vshrq_n_u8(b0, 4) : vandq_u8(b0, mask));
        const int8x16_t q1 = vreinterpretq_s8_u8(half ? vshrq_n_u8(b1, 4) : vandq_u8(b1, mask));
        const int32x4_t p = vdotq_s32(vdotq_s32(vdupq_n_s32(0), q0, vld1q_s8(ab.qs)), q1, vld1q_s8(ab.qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), d * sc * ab.d);
        scalar -= dmin * m * ab.d * static_cast<float>(ab.sum);
      }
    }
  }
  return vaddvq_f32(acc) + scalar;
}

float dot_q6_k(const BlockQ6_K* w, const BlockQ8A* a, int64_t nb) {
  float sum = 0.0f;
  const uint8x16_t mask4 = vdupq_n_u8(0x0f);
  const uint8x16_t mask2 = vdupq_n_u8(0x03);
  const int8x16_t bias = vdupq_n_s8(32);
  for (int64_t s = 0; s < nb / 8; ++s) {
    const float d = fp16_to_fp32(w[s].d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w[s].ql + 64 * h;
      const uint8_t* qh = w[s].qh + 32 * h;
      const int8_t* sc = w[s].scales + 8 * h;
      for (int k = 0; k < 4; ++k) {
        const BlockQ8A& ab = a[s * 8 + 4 * h + k];
        int32_t isum[2];
        for (int part = 0; part < 2; ++part) {  // values 0..15 and 16..31, each with its scale
          const uint8x16_t l = vld1q_u8(ql + 32 * (k & 1) + 16 * part);
          const uint8x16_t low = (k >> 1) ? vshrq_n_u8(l, 4) : vandq_u8(l, mask4);
          const uint8x16_t high = vandq_u8(vshlq_u8(vld1q_u8(qh + 16 * part), vdupq_n_s8(static_cast<int8_t>(-2 * k))), mask2);
          const int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, vshlq_n_u8(high, 4))), bias);
          isum[part] = vaddvq_s32(vdotq_s32(vdupq_n_s32(0), q, vld1q_s8(ab.qs + 16 * part)));
        }
        sum += d * ab.d * static_cast<float>(sc[2 * k] * isum[0] + sc[2 * k + 1] * isum[1]);
      }
    }
  }
  return sum;
}

template <typename Block, float (*Dot)(const Block*, const BlockQ8A*, int64_t)>
void qgemm_k(const uint8_t* w, size_t row_bytes, int64_t nw, const BlockQ8A* a, int64_t m, int64_t nb, float* y,
             int64_t ldy) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < nw; ++j) {
      y[i * ldy + j] = Dot(reinterpret_cast<const Block*>(w + static_cast<size_t>(j) * row_bytes), a + i * nb, nb);
    }
  }
}

float dot_f32(const float* a, const float* b, int64_t n) {
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
    acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
  }
  float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
  for (; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

// KV cache rows to f32 for attention (exact, as the scalar conversions).
void dequantize_f16(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + i))));
  for (; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

void dequantize_q8_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t k = 0; k < n / kQK8_0; ++k) {
    const float d = fp16_to_fp32(b[k].d);
    for (int u = 0; u < kQK8_0; u += 8) {
      const int16x8_t w = vmovl_s8(vld1_s8(b[k].qs + u));
      vst1q_f32(y + k * kQK8_0 + u, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), d));
      vst1q_f32(y + k * kQK8_0 + u + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), d));
    }
  }
}

void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

// MR rows of x against NR rows of w.
template <int MR, int NR>
void micro(const float* w, const float* x, int64_t k, float* y, int64_t ldy) {
  float32x4_t acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = vdupq_n_f32(0.0f);
  int64_t p = 0;
  for (; p + 4 <= k; p += 4) {
    float32x4_t xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = vld1q_f32(x + i * k + p);
    for (int j = 0; j < NR; ++j) {
      const float32x4_t wv = vld1q_f32(w + j * k + p);
      for (int i = 0; i < MR; ++i) acc[i][j] = vfmaq_f32(acc[i][j], xv[i], wv);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = vaddvq_f32(acc[i][j]);
      for (int64_t q = p; q < k; ++q) s += x[i * k + q] * w[j * k + q];
      y[i * ldy + j] = s;
    }
  }
}

template <int MR>
void row_block(const float* w, int64_t nw, const float* x, int64_t k, float* y, int64_t ldy) {
  int64_t j = 0;
  for (; j + 4 <= nw; j += 4) micro<MR, 4>(w + j * k, x, k, y + j, ldy);
  for (; j < nw; ++j) micro<MR, 1>(w + j * k, x, k, y + j, ldy);
}

void gemm_f32(const float* w, int64_t nw, const float* x, int64_t m, int64_t k, float* y, int64_t ldy) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) row_block<4>(w, nw, x + i * k, k, y + i * ldy, ldy);
  for (; i < m; ++i) row_block<1>(w, nw, x + i * k, k, y + i * ldy, ldy);
}

// e^x for 4 lanes, as exp8 in kernels_avx2.cpp: x = k ln 2 + r, a degree-6 polynomial for e^r
// (Cephes' expf coefficients), 2^k through the exponent bits in two halves; x clamped to +-88.
inline float32x4_t exp4(float32x4_t x) {
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-88.0f)), vdupq_n_f32(88.0f));
  const float32x4_t k = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
  float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, k, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), vmulq_f32(p, r), r);
  const int32x4_t ki = vcvtnq_s32_f32(k);
  const int32x4_t k1 = vshrq_n_s32(ki, 1);
  const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k1, vdupq_n_s32(127)), 23));
  const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vsubq_s32(ki, k1), vdupq_n_s32(127)), 23));
  return vmulq_f32(vmulq_f32(p, s1), s2);
}

// Sum of squares in double, as the reference does (each square is exact in double), in eight
// chains rather than one of n dependent adds.
void rms_norm_f32(const float* x, const float* w, float* y, int64_t n, float eps) {
  float64x2_t acc[4] = {vdupq_n_f64(0.0), vdupq_n_f64(0.0), vdupq_n_f64(0.0), vdupq_n_f64(0.0)};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const float32x4_t a = vld1q_f32(x + j), b = vld1q_f32(x + j + 4);
    const float64x2_t v[4] = {vcvt_f64_f32(vget_low_f32(a)), vcvt_high_f64_f32(a), vcvt_f64_f32(vget_low_f32(b)),
                              vcvt_high_f64_f32(b)};
    for (int c = 0; c < 4; ++c) acc[c] = vfmaq_f64(acc[c], v[c], v[c]);
  }
  double sum = vaddvq_f64(vaddq_f64(vaddq_f64(acc[0], acc[1]), vaddq_f64(acc[2], acc[3])));
  for (; j < n; ++j) sum += static_cast<double>(x[j]) * x[j];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
  const float32x4_t sv = vdupq_n_f32(scale);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_f32(vmulq_f32(vld1q_f32(x + i), sv), vld1q_f32(w + i)));
  for (; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void silu_mul_f32(const float* g, const float* u, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t gv = vld1q_f32(g + i);
    const float32x4_t e = exp4(vnegq_f32(gv));
    vst1q_f32(y + i, vmulq_f32(vdivq_f32(gv, vaddq_f32(vdupq_n_f32(1.0f), e)), vld1q_f32(u + i)));
  }
  for (; i < n; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

// Attention over f32 rows at 4 lanes. One lane sum's tree: (x[0] + x[2]) + (x[1] + x[3]).
inline float reduce(float32x4_t v) { return vpadds_f32(vadd_f32(vget_low_f32(v), vget_high_f32(v))); }

// Elements c..c+3 of a cache row as f32 (q8_0 rows hold whole blocks), element c alone, and row
// j of a cache buffer with rows ld elements apart.
inline float32x4_t load4(const float* p, int64_t c) { return vld1q_f32(p + c); }
inline float32x4_t load4(const uint16_t* p, int64_t c) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + c))); }
// A q8_0 block's scale as f32, by the hardware's f16 conversion (exact, as fp16_to_fp32).
inline float q8_scale(const BlockQ8_0& b) {
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(b.d))), 0);
}
inline float32x4_t load4(const BlockQ8_0* p, int64_t c) {
  const BlockQ8_0& b = p[c / kQK8_0];
  // The four quants in one 32-bit load, widened in registers (not four byte loads and inserts).
  int32_t bytes;
  std::memcpy(&bytes, b.qs + c % kQK8_0, 4);
  const int32x4_t v = vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(bytes)))));
  return vmulq_n_f32(vcvtq_f32_s32(v), q8_scale(b));
}
inline float load1(const float* p, int64_t c) { return p[c]; }
inline float load1(const uint16_t* p, int64_t c) { return fp16_to_fp32(p[c]); }
inline float load1(const BlockQ8_0* p, int64_t c) {
  return fp16_to_fp32(p[c / kQK8_0].d) * static_cast<float>(p[c / kQK8_0].qs[c % kQK8_0]);
}

// MR query rows x NR keys: per lane an FMA chain over the dimensions, the reduction, then the
// last dk % 4 dimensions in order.
template <typename T, int MR, int NR>
void scores_tile(const float* q, int64_t ldq, const void* k, int64_t ldk, int64_t dk, float scale, float* s,
                 int64_t lds) {
  float32x4_t acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) acc[r][j] = vdupq_n_f32(0.0f);
  int64_t c = 0;
  for (; c + 4 <= dk; c += 4) {
    float32x4_t kv[NR];
    for (int j = 0; j < NR; ++j) kv[j] = load4(row_at<T>(k, j, ldk), c);
    for (int r = 0; r < MR; ++r) {
      const float32x4_t qv = vld1q_f32(q + r * ldq + c);
      for (int j = 0; j < NR; ++j) acc[r][j] = vfmaq_f32(acc[r][j], qv, kv[j]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NR; ++j) {
      float sum = reduce(acc[r][j]);
      for (int64_t t = c; t < dk; ++t) sum = std::fma(q[r * ldq + t], load1(row_at<T>(k, j, ldk), t), sum);
      s[r * lds + j] = sum * scale;
    }
  }
}

template <typename T, int MR>
void scores_rows(const float* q, int64_t ldq, const void* k, int64_t ldk, int64_t nk, int64_t dk, float scale,
                 float* s, int64_t lds) {
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) scores_tile<T, MR, 4>(q, ldq, row_at<T>(k, j, ldk), ldk, dk, scale, s + j, lds);
  for (; j < nk; ++j) scores_tile<T, MR, 1>(q, ldq, row_at<T>(k, j, ldk), ldk, dk, scale, s + j, lds);
}

template <typename T>
void attn_scores(const float* q, int64_t ldq, int64_t rows, const void* k, int64_t ldk, int64_t nk, int64_t dk,
                 float scale, float* s, int64_t lds) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) scores_rows<T, 4>(q + r * ldq, ldq, k, ldk, nk, dk, scale, s + r * lds, lds);
  for (; r < rows; ++r) scores_rows<T, 1>(q + r * ldq, ldq, k, ldk, nk, dk, scale, s + r * lds, lds);
}

// Lanes sum over the vectors in order, the reduction, then the tail in order; the tail goes
// through the same exp4 (padded), so an element's value does not depend on where the row ends.
float exp_sum_f32(float* x, int64_t n, float m) {
  const float32x4_t mv = vdupq_n_f32(m);
  float32x4_t sv = vdupq_n_f32(0.0f);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + j), mv));
    vst1q_f32(x + j, e);
    sv = vaddq_f32(sv, e);
  }
  float sum = reduce(sv);
  if (j < n) {
    float tail[4];
    for (int t = 0; t < 4; ++t) tail[t] = j + t < n ? x[j + t] : m;
    vst1q_f32(tail, exp4(vsubq_f32(vld1q_f32(tail), mv)));
    for (int64_t t = j; t < n; ++t) {
      x[t] = tail[t - j];
      sum += x[t];
    }
  }
  return sum;
}

// MR rows x W vectors of columns in registers while the keys go by in order.
template <typename T, int MR, int W>
void values_tile(const float* p, int64_t ldp, const void* v, int64_t ldv, int64_t c0, int64_t nk, float* o,
                 int64_t ldo, bool accumulate) {
  float32x4_t acc[MR][W];
  for (int r = 0; r < MR; ++r)
    for (int w = 0; w < W; ++w) acc[r][w] = accumulate ? vld1q_f32(o + r * ldo + 4 * w) : vdupq_n_f32(0.0f);
  // One q8_0 block (values_rows steps its columns from 0 by 32): its bytes loaded and widened
  // together and its scale converted once, load4's values (the same products).
  constexpr bool kWholeQ8Block = std::is_same_v<T, BlockQ8_0> && W == 8;
  for (int64_t j = 0; j < nk; ++j) {
    const T* vj = row_at<T>(v, j, ldv);
    float32x4_t vv[W];
    if constexpr (kWholeQ8Block) {
      const BlockQ8_0& b = vj[c0 / kQK8_0];
      const float d = q8_scale(b);
      for (int h = 0; h < 2; ++h) {
        const int8x16_t q = vld1q_s8(b.qs + 16 * h);
        const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
        vv[4 * h + 0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d);
        vv[4 * h + 1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), d);
        vv[4 * h + 2] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d);
        vv[4 * h + 3] = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), d);
      }
    } else {
      for (int w = 0; w < W; ++w) vv[w] = load4(vj, c0 + 4 * w);
    }
    for (int r = 0; r < MR; ++r) {
      const float pj = p[r * ldp + j];
      for (int w = 0; w < W; ++w) acc[r][w] = vfmaq_n_f32(acc[r][w], vv[w], pj);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int w = 0; w < W; ++w) vst1q_f32(o + r * ldo + 4 * w, acc[r][w]);
}

template <typename T, int MR>
void values_rows(const float* p, int64_t ldp, const void* v, int64_t ldv, int64_t nk, int64_t dv, float* o,
                 int64_t ldo, bool accumulate) {
  int64_t c = 0;
  for (; c + 32 <= dv; c += 32) values_tile<T, MR, 8>(p, ldp, v, ldv, c, nk, o + c, ldo, accumulate);
  for (; c + 4 <= dv; c += 4) values_tile<T, MR, 1>(p, ldp, v, ldv, c, nk, o + c, ldo, accumulate);
  for (; c < dv; ++c) {
    for (int r = 0; r < MR; ++r) {
      float acc = accumulate ? o[r * ldo + c] : 0.0f;
      for (int64_t j = 0; j < nk; ++j) acc = std::fma(p[r * ldp + j], load1(row_at<T>(v, j, ldv), c), acc);
      o[r * ldo + c] = acc;
    }
  }
}

template <typename T>
void attn_values(const float* p, int64_t ldp, int64_t rows, const void* v, int64_t ldv, int64_t nk, int64_t dv,
                 float* o, int64_t ldo, bool accumulate) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) values_rows<T, 2>(p + r * ldp, ldp, v, ldv, nk, dv, o + r * ldo, ldo, accumulate);
  for (; r < rows; ++r) values_rows<T, 1>(p + r * ldp, ldp, v, ldv, nk, dv, o + r * ldo, ldo, accumulate);
}

// attn_scores for one query row per head, head h's keys at columns [h * dk, (h + 1) * dk) of
// each cache row: every key row read once, in address order, all heads (as the x86 kernels do;
// one head down the rows and then the next reads each row in strips). Each dot is
// scores_tile's chain, reduction and tail, so the bits of attn_scores called head by head.
template <typename T>
void attn_scores_heads(const float* q, int64_t ldq, int64_t heads, const void* k, int64_t ldk, int64_t nk, int64_t dk,
                       float scale, float* s, int64_t lds) {
  const int64_t body = dk & ~int64_t{3};
  for (int64_t j = 0; j < nk; ++j) {
    const T* row = row_at<T>(k, j, ldk);
    for (int64_t h = 0; h < heads; ++h) {
      const T* kh = col_at(row, h * dk);
      const float* qh = q + h * ldq;
      float32x4_t acc = vdupq_n_f32(0.0f);
      for (int64_t c = 0; c < body; c += 4) acc = vfmaq_f32(acc, vld1q_f32(qh + c), load4(kh, c));
      float sum = reduce(acc);
      for (int64_t t = body; t < dk; ++t) sum = std::fma(qh[t], load1(kh, t), sum);
      s[h * lds + j] = sum * scale;
    }
  }
}

// attn_values for one weight row per head, head h's values at columns [h * dv, (h + 1) * dv):
// each value row read once, all heads, the sums kept in o between rows (each element the same
// FMA chain over j as values_rows').
template <typename T>
void attn_values_heads(const float* p, int64_t ldp, int64_t heads, const void* v, int64_t ldv, int64_t nk, int64_t dv,
                       float* o, int64_t ldo, bool accumulate) {
  if (!accumulate) {
    for (int64_t h = 0; h < heads; ++h) std::fill_n(o + h * ldo, dv, 0.0f);
  }
  const int64_t body = dv & ~int64_t{3};
  for (int64_t j = 0; j < nk; ++j) {
    const T* row = row_at<T>(v, j, ldv);
    for (int64_t h = 0; h < heads; ++h) {
      const T* vh = col_at(row, h * dv);
      float* oh = o + h * ldo;
      const float pj = p[h * ldp + j];
      for (int64_t c = 0; c < body; c += 4) vst1q_f32(oh + c, vfmaq_n_f32(vld1q_f32(oh + c), load4(vh, c), pj));
      for (int64_t c = body; c < dv; ++c) oh[c] = std::fma(pj, load1(vh, c), oh[c]);
    }
  }
}

void scale_add_f32(float* y, float a, const float* x, float b, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vmulq_n_f32(vld1q_f32(y + i), a), vld1q_f32(x + i), b));
  for (; i < n; ++i) y[i] = std::fma(x[i], b, y[i] * a);
}

// index_totals (kernels.h), a group of 16 keys (four registers, a lane each) and 4 heads at a
// time: each score one fma chain over the dimensions in order, as the generic kernel's, four
// dimensions' query values loaded together and taken by lane. maxnm, not max: the formula's
// max(0, NaN) is 0.
template <int L>
void index_dim(float32x4_t (&a)[4][4], const float32x4_t (&qv)[4], const float* kp) {
  const float32x4_t kv[4] = {vld1q_f32(kp), vld1q_f32(kp + 4), vld1q_f32(kp + 8), vld1q_f32(kp + 12)};
  for (int i = 0; i < 4; ++i) {
    for (int c = 0; c < 4; ++c) a[i][c] = vfmaq_laneq_f32(a[i][c], kv[c], qv[i], L);
  }
}

void index_totals(const float* q, int64_t heads, int64_t d, const float* keys16, int64_t n, const float* w,
                  float* total) {
  const float32x4_t zero = vdupq_n_f32(0.0f);
  const int64_t groups = (n + 15) / 16;
  for (int64_t g = 0; g < groups; ++g) {
    const float* k = keys16 + g * d * 16;
    float32x4_t t[4] = {zero, zero, zero, zero};
    for (int64_t h = 0; h < heads;) {
      const int hn = heads - h >= 4 ? 4 : 1;
      float32x4_t a[4][4];
      for (auto& r : a) r[0] = r[1] = r[2] = r[3] = zero;
      const float* qh = q + h * d;
      int64_t p = 0;
      if (hn == 4) {
        for (; p + 4 <= d; p += 4) {
          const float32x4_t qv[4] = {vld1q_f32(qh + p), vld1q_f32(qh + d + p), vld1q_f32(qh + 2 * d + p),
                                     vld1q_f32(qh + 3 * d + p)};
          index_dim<0>(a, qv, k + p * 16);
          index_dim<1>(a, qv, k + (p + 1) * 16);
          index_dim<2>(a, qv, k + (p + 2) * 16);
          index_dim<3>(a, qv, k + (p + 3) * 16);
        }
      }
      for (; p < d; ++p) {
        for (int i = 0; i < hn; ++i) {
          for (int c = 0; c < 4; ++c) a[i][c] = vfmaq_n_f32(a[i][c], vld1q_f32(k + p * 16 + 4 * c), qh[i * d + p]);
        }
      }
      for (int i = 0; i < hn; ++i) {
        for (int c = 0; c < 4; ++c) t[c] = vfmaq_n_f32(t[c], vmaxnmq_f32(a[i][c], zero), w[h + i]);
      }
      h += hn;
    }
    alignas(16) float out[16];
    for (int c = 0; c < 4; ++c) vst1q_f32(out + 4 * c, t[c]);
    const int64_t s0 = g * 16;
    std::copy_n(out, std::min<int64_t>(16, n - s0), total + s0);
  }
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
  for (; i < n; ++i) y[i] += a * x[i];
}

// Packed weights (packed.h): each 64-byte word is four registers of four rows, and sdot by lane
// multiplies a register's four rows by one 4-byte activation word. Weights enter as signed
// bytes: Q4_0's nibbles as 0..15 with 8 * sum taken off in int32 (Q5_0's as 0..31 with 16 *
// sum), Q8_0's values shifted back. A row's result is computed the same way for any MR (batch
// invariance).

// Q5_0's fifth bits for rows 4q..4q+3 of one word: 16 bits of its 64-bit mask, one per byte.
inline uint8x16_t fifth_bits(const uint8_t* masks, int word, int q) {
  uint16_t bits;
  std::memcpy(&bits, masks + 8 * word + 2 * q, 2);
  const uint8x16_t spread = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(bits)), vdup_n_u8(static_cast<uint8_t>(bits >> 8)));
  const uint8x16_t select = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  return vandq_u8(vtstq_u8(spread, select), vdupq_n_u8(16));
}

// The eight sdots of one activation block (values a0, a1) against one register of four rows,
// added to s.
inline int32x4_t dot_block(int32x4_t s, const int8x16_t* w, int8x16_t a0, int8x16_t a1) {
  s = vdotq_laneq_s32(s, w[0], a0, 0);
  s = vdotq_laneq_s32(s, w[1], a0, 1);
  s = vdotq_laneq_s32(s, w[2], a0, 2);
  s = vdotq_laneq_s32(s, w[3], a0, 3);
  s = vdotq_laneq_s32(s, w[4], a1, 0);
  s = vdotq_laneq_s32(s, w[5], a1, 1);
  s = vdotq_laneq_s32(s, w[6], a1, 2);
  return vdotq_laneq_s32(s, w[7], a1, 3);
}

inline float32x4_t load_fp16x4(const uint8_t* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
}

inline void store_rows(float32x4_t (&acc)[4], float* y, int64_t valid) {
  float out[16];
  for (int q = 0; q < 4; ++q) vst1q_f32(out + 4 * q, acc[q]);
  std::copy_n(out, valid, y);
}

// The sums of a tile of MR activation rows, quarter q of row i at acc[q][i], to rows of y: the
// first kRows of them (a tile whose last slab is partial).
template <int MR, int kRows = MR>
inline void store_tile(float32x4_t (&acc)[4][MR], float* y, int64_t ldy, int64_t valid) {
  for (int i = 0; i < kRows; ++i) {
    float32x4_t row[4] = {acc[0][i], acc[1][i], acc[2][i], acc[3][i]};
    store_rows(row, y + i * ldy, valid);
  }
}

// In a tile's loop over its activation rows: keeps each row's loads after the previous row's
// work. Hoisted together, several rows' activation loads take the registers that the rows'
// sums need, and GCC spills the sums to the stack on every block.
inline void row_order_point() { __asm__ volatile("" ::: "memory"); }

// A register of zeros or of one repeated byte, made where it is used: GCC otherwise hoists such
// constants out of the tile's loops, where they hold registers that the tile's sums need.
inline int32x4_t zeros_here() {
  int32x4_t z;
  __asm__ volatile("movi %0.4s, #0" : "=w"(z));
  return z;
}
template <uint8_t kByte>
inline uint8x16_t bytes_here() {
  uint8x16_t v;
  __asm__ volatile("movi %0.16b, %1" : "=w"(v) : "i"(kByte));
  return v;
}

// The legacy types' layout constants: block bytes per 16 rows, and the offset the unsigned
// weights carry (taken off as offset * sum(a); Q8_0's values are shifted back instead).
template <DType kType>
struct LegacyNeon {
  static constexpr bool kQ8 = kType == DType::kQ8_0;
  static constexpr bool kQ5 = kType == DType::kQ5_0;
  static constexpr bool kQ41 = kType == DType::kQ4_1;  // unsigned nibbles times d, plus m * sum(a)
  static constexpr size_t kBlockBytes = packed_block_bytes(kType);
  static constexpr int kOffset = kQ8 ? 0 : (kQ5 ? 16 : (kQ41 ? 0 : 8));
};

// The eight registers of rows 4q..4q+3 of the block at p, as signed bytes for sdot. With
// kSixteenths (Q4_0 only) the nibbles become signed values times 16 instead: x ^ 8 is x - 8 as a
// 4-bit two's complement number, so (z ^ 0x88) << 4 and (z ^ 0x88) & 0xf0 are 16 (x - 8) as
// bytes. The sums then need no offset and come out 16 times too large, which the conversion to
// float divides back exactly (they are multiples of 16): the same floats as the offset form, for
// three instructions more per register of weights and two fewer per activation row.
template <DType kType, bool kSixteenths = false>
inline void quarter_words(const uint8_t* p, int q, int8x16_t (&w)[8]) {
  static_assert(!kSixteenths || kType == DType::kQ4_0, "only Q4_0's nibbles have the signed form");
  if constexpr (LegacyNeon<kType>::kQ8) {
    for (int k = 0; k < 8; ++k) w[k] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p + 32 + 64 * k + 16 * q), vdupq_n_u8(0x80)));
  } else if constexpr (kSixteenths) {
    const uint8x16_t x88 = bytes_here<0x88>(), xf0 = bytes_here<0xf0>();
    for (int k = 0; k < 4; ++k) {
      const uint8x16_t z = veorq_u8(vld1q_u8(p + 32 + 64 * k + 16 * q), x88);
      w[k] = vreinterpretq_s8_u8(vshlq_n_u8(z, 4));
      w[4 + k] = vreinterpretq_s8_u8(vandq_u8(z, xf0));
    }
  } else {
    for (int k = 0; k < 4; ++k) {
      const uint8x16_t z = vld1q_u8(p + 32 + 64 * k + 16 * q);
      uint8x16_t lo = vandq_u8(z, vdupq_n_u8(0x0f));
      uint8x16_t hi = vshrq_n_u8(z, 4);
      if constexpr (LegacyNeon<kType>::kQ5) {
        lo = vorrq_u8(lo, fifth_bits(p + 32 + 256, k, q));
        hi = vorrq_u8(hi, fifth_bits(p + 32 + 256, 4 + k, q));
      }
      w[k] = vreinterpretq_s8_u8(lo);
      w[4 + k] = vreinterpretq_s8_u8(hi);
    }
  }
}

// acc += (block's integer sum for one activation row, values a0 and a1) * scale (dw * da), and
// Q4_1's minimum term (dsum: da * sum(a) in every lane): the same float operations in every tile
// shape, so a row's result does not depend on the batch. The sum starts at `init`: zero, or
// -offset * sum(a) for the unsigned weights (kSixteenths: the signed form, which needs none).
template <DType kType, bool kSixteenths>
inline float32x4_t legacy_core(float32x4_t acc, const int8x16_t (&w)[8], int8x16_t a0, int8x16_t a1, int32x4_t init,
                               float32x4_t scale, const uint8_t* p, int q, float32x4_t dsum) {
  const int32x4_t isum = dot_block(init, w, a0, a1);
  const float32x4_t sum = kSixteenths ? vcvtq_n_f32_s32(isum, 4) : vcvtq_f32_s32(isum);
  acc = vfmaq_f32(acc, sum, scale);
  if constexpr (LegacyNeon<kType>::kQ41) acc = vfmaq_f32(acc, load_fp16x4(p + 32 + 256 + 8 * q), dsum);
  return acc;
}

// legacy_core for one row's block ab, the offset form.
template <DType kType>
inline float32x4_t legacy_fma(float32x4_t acc, const int8x16_t (&w)[8], float32x4_t dw, const uint8_t* p, int q,
                              const BlockQ8A& ab) {
  return legacy_core<kType, false>(acc, w, vld1q_s8(ab.qs), vld1q_s8(ab.qs + 16),
                                   vdupq_n_s32(-LegacyNeon<kType>::kOffset * ab.sum), vmulq_n_f32(dw, ab.d), p, q,
                                   vdupq_n_f32(ab.d * static_cast<float>(ab.sum)));
}

// Four activation rows' blocks b side by side, as the legacy tiles read them: the four scales in
// one register (each row's d * dw is a multiply by a lane), the four sums, and each row's 32
// values, which one load pair brings in. packed_gemm lays a call's rows out this way once for
// every group and tile of the call.
struct alignas(16) Q8Slab {
  float d[4];
  int32_t sum[4];
  int8_t qs[4][kQK8A];
};

// The calling thread's slabs for `count` blocks: one buffer for every type's calls (they do not
// nest), kept and grown as the largest call needs.
inline Q8Slab* slab_buffer(size_t count) {
  thread_local std::vector<Q8Slab> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// A last slab of 1-3 rows has zeros in its other lanes (which the tiles do not use).
inline void make_slabs(const BlockQ8A* a, int64_t rows, int64_t nb, Q8Slab* out) {
  for (int64_t t = 0; t < (rows + 3) / 4; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      Q8Slab& s = out[t * nb + b];
      for (int l = 0; l < 4; ++l) {
        if (4 * t + l >= rows) {
          s.d[l] = 0.0f;
          s.sum[l] = 0;
          std::memset(s.qs[l], 0, kQK8A);
          continue;
        }
        const BlockQ8A& ab = a[(4 * t + l) * nb + b];
        s.d[l] = ab.d;
        s.sum[l] = ab.sum;
        std::memcpy(s.qs[l], ab.qs, kQK8A);
      }
    }
  }
}

// One activation row (decode) against all 16 rows of a group: each block's four quarters in
// turn, the whole block read once.
template <DType kType>
void packed_row16(const uint8_t* group, const BlockQ8A* a, const Q8Slab*, int64_t nb, float* y, int64_t,
                  int64_t valid) {
  using L = LegacyNeon<kType>;
  float32x4_t acc[4];
  for (int q = 0; q < 4; ++q) acc[q] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + static_cast<size_t>(b) * L::kBlockBytes;
    for (int q = 0; q < 4; ++q) {
      int8x16_t w[8];
      quarter_words<kType>(p, q, w);
      acc[q] = legacy_fma<kType>(acc[q], w, load_fp16x4(p + 8 * q), p, q, a[b]);
    }
  }
  store_rows(acc, y, valid);
}

// legacy_fma for row kLane of a slab: the same integer sum and float operations (d4's lane is
// the row's d; dsum4's lane its d * sum, Q4_1's minimum term; nsum4's lane -offset * sum).
template <DType kType, bool kSixteenths, int kLane>
inline float32x4_t slab_fma(float32x4_t acc, const int8x16_t (&w)[8], float32x4_t dw, const uint8_t* p, int q,
                            const Q8Slab& s, float32x4_t d4, float32x4_t dsum4, int32x4_t nsum4) {
  constexpr bool kOffsetSum = !kSixteenths && LegacyNeon<kType>::kOffset != 0;
  return legacy_core<kType, kSixteenths>(acc, w, vld1q_s8(s.qs[kLane]), vld1q_s8(s.qs[kLane] + 16),
                                         kOffsetSum ? vdupq_laneq_s32(nsum4, kLane) : zeros_here(),
                                         vmulq_laneq_f32(dw, d4, kLane), p, q, vdupq_laneq_f32(dsum4, kLane));
}

// MR activation rows (prefill, batches; 16, 8 or 4 in slabs of four, of the last slab its first
// kLast rows) against a group: one quarter (4 rows) at a time over a chunk of kTileBlocks blocks,
// so a quarter's eight weight registers serve all MR rows and the MR sums stay in registers; the
// chunk's weights and activations (about 30 KB for 16 rows) stay in L1 for the four quarters'
// passes. A row costs its eight sdots and five instructions more a quarter: a load pair, the
// sum's zero (or offset), the conversion, the scale's multiply by a lane of its slab, the fused
// add.
// A batch's 2 or 3 rows past its slabs of four (a batch of 2 or 3, or 6 = 4 + 2) take one tile
// of 4 whose last lanes are left out (kLast 2 or 3; packed_gemm), where row by row each row
// unpacked every weight word again.
constexpr int64_t kTileBlocks = 32;
template <DType kType, int MR, int kLast = 4>
void packed_tile(const uint8_t* group, const BlockQ8A*, const Q8Slab* slabs, int64_t nb, float* y, int64_t ldy,
                 int64_t valid) {
  static_assert(MR % 4 == 0 && kLast >= 1 && kLast <= 4, "slabs of four, the last one's first kLast rows");
  using L = LegacyNeon<kType>;
  constexpr bool kSixteenths = kType == DType::kQ4_0;
  float32x4_t acc[4][MR];
  for (int q = 0; q < 4; ++q) {
    for (int i = 0; i < MR; ++i) acc[q][i] = vdupq_n_f32(0.0f);
  }
  for (int64_t b0 = 0; b0 < nb; b0 += kTileBlocks) {
    const int64_t b1 = std::min(nb, b0 + kTileBlocks);
    for (int q = 0; q < 4; ++q) {
      float32x4_t r[MR];
      for (int i = 0; i < MR; ++i) r[i] = acc[q][i];
      for (int64_t b = b0; b < b1; ++b) {
        const uint8_t* p = group + static_cast<size_t>(b) * L::kBlockBytes;
        const float32x4_t dw = load_fp16x4(p + 8 * q);
        int8x16_t w[8];
        quarter_words<kType, kSixteenths>(p, q, w);
#pragma GCC unroll 4
        for (int t = 0; t < MR / 4; ++t) {
          const Q8Slab& sl = slabs[t * nb + b];
          const float32x4_t d4 = vld1q_f32(sl.d);
          float32x4_t dsum4 = d4;
          int32x4_t nsum4 = vdupq_n_s32(0);
          if constexpr (L::kQ41) dsum4 = vmulq_f32(d4, vcvtq_f32_s32(vld1q_s32(sl.sum)));
          if constexpr (L::kOffset != 0 && !kSixteenths) nsum4 = vmulq_n_s32(vld1q_s32(sl.sum), -L::kOffset);
          float32x4_t* rt = r + 4 * t;
          const int lanes = t + 1 < MR / 4 ? 4 : kLast;  // a constant once the loop is unrolled
          rt[0] = slab_fma<kType, kSixteenths, 0>(rt[0], w, dw, p, q, sl, d4, dsum4, nsum4);
          row_order_point();
          if (lanes > 1) rt[1] = slab_fma<kType, kSixteenths, 1>(rt[1], w, dw, p, q, sl, d4, dsum4, nsum4);
          row_order_point();
          if (lanes > 2) rt[2] = slab_fma<kType, kSixteenths, 2>(rt[2], w, dw, p, q, sl, d4, dsum4, nsum4);
          row_order_point();
          if (lanes > 3) rt[3] = slab_fma<kType, kSixteenths, 3>(rt[3], w, dw, p, q, sl, d4, dsum4, nsum4);
          row_order_point();
        }
      }
      for (int i = 0; i < MR; ++i) acc[q][i] = r[i];
    }
  }
  store_tile<MR, MR - 4 + kLast>(acc, y, ldy, valid);
}

// One sub-block of Q4_K for row kLane of a slab: the operations of the tile's other form, with the
// row's d and d * sum as lanes.
// One sub-block of Q4_K for one activation row (values a0 and a1): r += sum(q * a) * dscd (dsc *
// da) - dm * dsum (da * sum(a) in every lane), whichever tile form calls it.
inline float32x4_t q4_k_core(float32x4_t r, const int8x16_t (&w)[8], int8x16_t a0, int8x16_t a1, int32x4_t zero,
                             float32x4_t dscd, float32x4_t dm_q, float32x4_t dsum) {
  r = vfmaq_f32(r, vcvtq_f32_s32(dot_block(zero, w, a0, a1)), dscd);
  return vfmsq_f32(r, dm_q, dsum);
}
template <int kLane>
inline float32x4_t q4_k_slab_fma(float32x4_t r, const int8x16_t (&w)[8], const Q8Slab& sl, float32x4_t dsc_q,
                                 float32x4_t dm_q, float32x4_t d4, float32x4_t dsum4) {
  return q4_k_core(r, w, vld1q_s8(sl.qs[kLane]), vld1q_s8(sl.qs[kLane] + 16), zeros_here(),
                   vmulq_laneq_f32(dsc_q, d4, kLane), dm_q, vdupq_laneq_f32(dsum4, kLane));
}

// Packed Q4_K: d * scale and dmin * min of the group's 16 rows converted once per super-block
// (a vector of 16 scale bytes at a time), each pair of sub-blocks' nibbles loaded once (low
// nibbles the first, high the second); per sub-block of 32 and register of 4 rows,
// acc += dsc * da * sum(q * a) - dm * da * sum(a).
template <DType kType, int MR>
void packed_tile_q4_k(const uint8_t* group, const BlockQ8A* a, const Q8Slab* slabs, int64_t nb, float* y,
                      int64_t ldy, int64_t valid) {
  // Whole slabs of four rows read their blocks from the slabs (scale and d * sum as lanes); one
  // row reads its blocks as they are.
  constexpr bool kSlabRows = MR % 4 == 0;
  constexpr size_t kScales = 64, kMins = kScales + 128, kQs = kMins + 128, kBlockBytes = packed_block_bytes(DType::kQ4_K);
  // Keeping a pair's raw nibble bytes in registers fits with one activation row; with four, the
  // accumulators need the registers and the bytes are loaded again for the second sub-block.
  constexpr bool kKeepBytes = MR == 1;
  float32x4_t acc[4][MR];
  for (int q = 0; q < 4; ++q) {
    for (int i = 0; i < MR; ++i) acc[q][i] = vdupq_n_f32(0.0f);
  }
  alignas(16) float dsc[8][16], dm[8][16], asum[MR][8];
  // Bytes 0..15 of a vector as four f32 vectors.
  const auto widen = [](uint8x16_t v, float32x4_t (&f)[4]) {
    const uint16x8_t lo = vmovl_u8(vget_low_u8(v)), hi = vmovl_high_u8(v);
    f[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
    f[1] = vcvtq_f32_u32(vmovl_high_u16(lo));
    f[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
    f[3] = vcvtq_f32_u32(vmovl_high_u16(hi));
  };
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = group + static_cast<size_t>(sb) * kBlockBytes;
    float32x4_t d[4], dmin[4];
    for (int q = 0; q < 4; ++q) {
      d[q] = load_fp16x4(p + 8 * q);
      dmin[q] = load_fp16x4(p + 32 + 8 * q);
    }
    for (int s = 0; s < 8; ++s) {
      float32x4_t f[4];
      widen(vld1q_u8(p + kScales + 16 * s), f);
      for (int q = 0; q < 4; ++q) vst1q_f32(dsc[s] + 4 * q, vmulq_f32(d[q], f[q]));
      widen(vld1q_u8(p + kMins + 16 * s), f);
      for (int q = 0; q < 4; ++q) vst1q_f32(dm[s] + 4 * q, vmulq_f32(dmin[q], f[q]));
    }
    if constexpr (!kSlabRows) {
      for (int i = 0; i < MR; ++i) {
        for (int s = 0; s < 8; ++s) {
          const BlockQ8A& ab = a[i * nb + sb * 8 + s];
          asum[i][s] = ab.d * static_cast<float>(ab.sum);
        }
      }
    }
    for (int q = 0; q < 4; ++q) {
      float32x4_t r[MR];
      for (int i = 0; i < MR; ++i) r[i] = acc[q][i];
      for (int t = 0; t < 4; ++t) {
        const uint8_t* qs = p + kQs + static_cast<size_t>(t) * 8 * 64 + 16 * q;
        uint8x16_t z[8];
        int8x16_t w[8];
        for (int k = 0; k < 8; ++k) {
          z[k] = vld1q_u8(qs + 64 * k);
          w[k] = vreinterpretq_s8_u8(vandq_u8(z[k], vdupq_n_u8(0x0f)));
        }
        for (int h = 0; h < 2; ++h) {
          const int s = 2 * t + h;
          if (h == 1) {
            for (int k = 0; k < 8; ++k) {
              w[k] = vreinterpretq_s8_u8(vshrq_n_u8(kKeepBytes ? z[k] : vld1q_u8(qs + 64 * k), 4));
            }
          }
          const float32x4_t dsc_q = vld1q_f32(dsc[s] + 4 * q), dm_q = vld1q_f32(dm[s] + 4 * q);
          if constexpr (kSlabRows) {
#pragma GCC unroll 4
            for (int u = 0; u < MR / 4; ++u) {
              const Q8Slab& sl = slabs[u * nb + sb * 8 + s];
              const float32x4_t d4 = vld1q_f32(sl.d);
              const float32x4_t dsum4 = vmulq_f32(d4, vcvtq_f32_s32(vld1q_s32(sl.sum)));
              float32x4_t* ru = r + 4 * u;
              ru[0] = q4_k_slab_fma<0>(ru[0], w, sl, dsc_q, dm_q, d4, dsum4);
              row_order_point();
              ru[1] = q4_k_slab_fma<1>(ru[1], w, sl, dsc_q, dm_q, d4, dsum4);
              row_order_point();
              ru[2] = q4_k_slab_fma<2>(ru[2], w, sl, dsc_q, dm_q, d4, dsum4);
              row_order_point();
              ru[3] = q4_k_slab_fma<3>(ru[3], w, sl, dsc_q, dm_q, d4, dsum4);
              row_order_point();
            }
          } else {
            for (int i = 0; i < MR; ++i) {
              const BlockQ8A& ab = a[i * nb + sb * 8 + s];
              r[i] = q4_k_core(r[i], w, vld1q_s8(ab.qs), vld1q_s8(ab.qs + 16), vdupq_n_s32(0),
                               vmulq_n_f32(dsc_q, ab.d), dm_q, vdupq_n_f32(asum[i][s]));
              row_order_point();
            }
          }
        }
      }
      for (int i = 0; i < MR; ++i) acc[q][i] = r[i];
    }
  }
  store_tile<MR>(acc, y, ldy, valid);
}

// One sub-block of Q6_K for row kLane of a slab: the operations of the tile's other form, with
// the row's d as a lane.
// One sub-block of Q6_K for one activation row (values a0 and a1): the sums of its two 16-value
// scale groups, each times its scale (dsc * da), whichever tile form calls it.
inline float32x4_t q6_k_core(float32x4_t r, const int8x16_t (&w)[8], int8x16_t a0, int8x16_t a1, int32x4_t zero0,
                             int32x4_t zero1, float32x4_t dscd_lo, float32x4_t dscd_hi) {
  int32x4_t s0 = vdotq_laneq_s32(zero0, w[0], a0, 0);
  s0 = vdotq_laneq_s32(s0, w[1], a0, 1);
  s0 = vdotq_laneq_s32(s0, w[2], a0, 2);
  s0 = vdotq_laneq_s32(s0, w[3], a0, 3);
  int32x4_t s1 = vdotq_laneq_s32(zero1, w[4], a1, 0);
  s1 = vdotq_laneq_s32(s1, w[5], a1, 1);
  s1 = vdotq_laneq_s32(s1, w[6], a1, 2);
  s1 = vdotq_laneq_s32(s1, w[7], a1, 3);
  r = vfmaq_f32(r, vcvtq_f32_s32(s0), dscd_lo);
  return vfmaq_f32(r, vcvtq_f32_s32(s1), dscd_hi);
}
template <int kLane>
inline float32x4_t q6_k_slab_fma(float32x4_t r, const int8x16_t (&w)[8], const Q8Slab& sl, float32x4_t dsc_lo,
                                 float32x4_t dsc_hi, float32x4_t d4) {
  return q6_k_core(r, w, vld1q_s8(sl.qs[kLane]), vld1q_s8(sl.qs[kLane] + 16), zeros_here(), zeros_here(),
                   vmulq_laneq_f32(dsc_lo, d4, kLane), vmulq_laneq_f32(dsc_hi, d4, kLane));
}

// Packed Q6_K: the 6-bit values rebuilt as unsigned q (0..63) from the nibble and bit-pair
// planes (the pair shifted into bits 4..5 over the nibble with one sli), then q - 32 as signed
// bytes, so sdot needs no correction; one sum per 16-value scale group (words 0..3 and 4..7 of
// the sub-block). d * scale of the group's 16 rows is converted once per super-block; with one
// activation row the bit-pair plane's eight registers stay loaded for the four sub-blocks that
// share it.
template <DType kType, int MR>
void packed_tile_q6_k(const uint8_t* group, const BlockQ8A* a, const Q8Slab* slabs, int64_t nb, float* y,
                      int64_t ldy, int64_t valid) {
  constexpr bool kSlabRows = MR % 4 == 0;  // as in packed_tile_q4_k
  constexpr size_t kScales = 32, kQl = kScales + 256, kQh = kQl + 2048, kBlockBytes = packed_block_bytes(DType::kQ6_K);
  constexpr bool kKeepBits = MR == 1;
  float32x4_t acc[4][MR];
  for (int q = 0; q < 4; ++q) {
    for (int i = 0; i < MR; ++i) acc[q][i] = vdupq_n_f32(0.0f);
  }
  alignas(16) float dsc[16][16];
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = group + static_cast<size_t>(sb) * kBlockBytes;
    float32x4_t d[4];
    for (int q = 0; q < 4; ++q) d[q] = load_fp16x4(p + 8 * q);
    for (int g = 0; g < 16; ++g) {
      const int8x16_t v = vld1q_s8(reinterpret_cast<const int8_t*>(p + kScales + 16 * g));
      const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
      vst1q_f32(dsc[g] + 0, vmulq_f32(d[0], vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)))));
      vst1q_f32(dsc[g] + 4, vmulq_f32(d[1], vcvtq_f32_s32(vmovl_high_s16(lo))));
      vst1q_f32(dsc[g] + 8, vmulq_f32(d[2], vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)))));
      vst1q_f32(dsc[g] + 12, vmulq_f32(d[3], vcvtq_f32_s32(vmovl_high_s16(hi))));
    }
    for (int q = 0; q < 4; ++q) {
      float32x4_t r[MR];
      for (int i = 0; i < MR; ++i) r[i] = acc[q][i];
      for (int h = 0; h < 2; ++h) {
        uint8x16_t qh[8];
        if constexpr (kKeepBits) {
          for (int k = 0; k < 8; ++k) qh[k] = vld1q_u8(p + kQh + 64 * (8 * h + k) + 16 * q);
        }
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
          int8x16_t w[8];
#pragma GCC unroll 8
          for (int k = 0; k < 8; ++k) {
            const uint8x16_t ql = vld1q_u8(p + kQl + 64 * (16 * h + 8 * (s & 1) + k) + 16 * q);
            const uint8x16_t bits = kKeepBits ? qh[k] : vld1q_u8(p + kQh + 64 * (8 * h + k) + 16 * q);
            // The nibble in bits 0..3 (the low nibble for s 0 and 1, the high for 2 and 3), the
            // bit pair 2s..2s+1 of qh in bits 0..1.
            const uint8x16_t nib = (s >> 1) ? vshrq_n_u8(ql, 4) : ql;
            uint8x16_t pair;
            switch (s) {
              case 0: pair = vandq_u8(bits, vdupq_n_u8(3)); break;
              case 1: pair = vandq_u8(vshrq_n_u8(bits, 2), vdupq_n_u8(3)); break;
              case 2: pair = vandq_u8(vshrq_n_u8(bits, 4), vdupq_n_u8(3)); break;
              default: pair = vshrq_n_u8(bits, 6); break;
            }
            w[k] = vsubq_s8(vreinterpretq_s8_u8(vsliq_n_u8(nib, pair, 4)), vdupq_n_s8(32));
          }
          const int g = 8 * h + 2 * s;
          const float32x4_t dsc_lo = vld1q_f32(dsc[g] + 4 * q), dsc_hi = vld1q_f32(dsc[g + 1] + 4 * q);
          if constexpr (kSlabRows) {
#pragma GCC unroll 4
            for (int u = 0; u < MR / 4; ++u) {
              const Q8Slab& sl = slabs[u * nb + sb * 8 + 4 * h + s];
              const float32x4_t d4 = vld1q_f32(sl.d);
              float32x4_t* ru = r + 4 * u;
              ru[0] = q6_k_slab_fma<0>(ru[0], w, sl, dsc_lo, dsc_hi, d4);
              row_order_point();
              ru[1] = q6_k_slab_fma<1>(ru[1], w, sl, dsc_lo, dsc_hi, d4);
              row_order_point();
              ru[2] = q6_k_slab_fma<2>(ru[2], w, sl, dsc_lo, dsc_hi, d4);
              row_order_point();
              ru[3] = q6_k_slab_fma<3>(ru[3], w, sl, dsc_lo, dsc_hi, d4);
              row_order_point();
            }
          } else {
            for (int i = 0; i < MR; ++i) {
              const BlockQ8A& ab = a[i * nb + sb * 8 + 4 * h + s];
              r[i] = q6_k_core(r[i], w, vld1q_s8(ab.qs), vld1q_s8(ab.qs + 16), vdupq_n_s32(0), vdupq_n_s32(0),
                               vmulq_n_f32(dsc_lo, ab.d), vmulq_n_f32(dsc_hi, ab.d));
              row_order_point();
            }
          }
        }
      }
      for (int i = 0; i < MR; ++i) acc[q][i] = r[i];
    }
  }
  store_tile<MR>(acc, y, ldy, valid);
}

using TileFn = void (*)(const uint8_t*, const BlockQ8A*, const Q8Slab*, int64_t, float*, int64_t, int64_t);

// (NEON's Q6_K takes its values as signed bytes, so it needs no half sums.)
// The tiles read the activation rows as slabs, laid out once per call in a buffer of the calling
// thread; one row reads its blocks as they are. Tail2 and Tail3 (where the type has them) take 2
// or 3 rows past the slabs of four in one tile. Instructions per call under qemu (512 x 2048),
// rows one by one -> one tile, 2 / 3 / 7 rows: Q8_0 -17% / -31% / -17%; Q5_0 -42% / -57% / -39%;
// Q4_1 -5% / -18% / -9%; Q4_K -26% / -37% / -23%; Q6_K -34% / -48% / -30%; Q4_0 3 and 7 rows -16%
// and -8%, 2 rows +1% (its single row unpacks less; Q4_0 keeps it).
template <DType kType, TileFn Tile16, TileFn Tile8, TileFn Tile4, TileFn Tile1, TileFn Tail2 = nullptr,
          TileFn Tail3 = nullptr>
void packed_gemm(const uint8_t* packed, int64_t nw, const BlockQ8A* a, const int32_t*, int64_t m, int64_t nb, float* y,
                 int64_t ldy) {
  const size_t group_bytes = packed_bytes(kType, kPackRows, nb);
  const int64_t m4 = m / 4 * 4;
  const TileFn tail_fn = m - m4 == 2 ? Tail2 : m - m4 == 3 ? Tail3 : nullptr;
  const int64_t tail = tail_fn != nullptr ? m - m4 : 0;
  // The legacy types' tail tiles read a last, partial slab; the K-quants' read their rows as they are.
  const int64_t slab_rows = m4 + (kType == DType::kQ4_K || kType == DType::kQ6_K ? 0 : tail);
  const Q8Slab* slabs = nullptr;
  if (slab_rows > 0) {
    Q8Slab* buffer = slab_buffer(static_cast<size_t>((slab_rows + 3) / 4 * nb));
    make_slabs(a, slab_rows, nb, buffer);
    slabs = buffer;
  }
  const auto slab = [&](int64_t i) { return slabs != nullptr ? slabs + i / 4 * nb : nullptr; };
  for (int64_t j = 0; j < nw; j += kPackRows) {
    const uint8_t* group = packed + static_cast<size_t>(j / kPackRows) * group_bytes;
    const int64_t valid = std::min<int64_t>(kPackRows, nw - j);
    int64_t i = 0;
    for (; i + 16 <= m; i += 16) Tile16(group, a + i * nb, slab(i), nb, y + i * ldy + j, ldy, valid);
    for (; i + 8 <= m; i += 8) Tile8(group, a + i * nb, slab(i), nb, y + i * ldy + j, ldy, valid);
    for (; i + 4 <= m; i += 4) Tile4(group, a + i * nb, slab(i), nb, y + i * ldy + j, ldy, valid);
    if (tail > 0) {
      tail_fn(group, a + i * nb, slab(i), nb, y + i * ldy + j, ldy, valid);
      i += tail;
    }
    for (; i < m; ++i) Tile1(group, a + i * nb, nullptr, nb, y + i * ldy + j, ldy, valid);
  }
}

template <DType kType>
constexpr PackedGemmFn packed_gemm_of() {
  if constexpr (kType == DType::kQ4_K) {
    return packed_gemm<kType, packed_tile_q4_k<kType, 16>, packed_tile_q4_k<kType, 8>, packed_tile_q4_k<kType, 4>,
                       packed_tile_q4_k<kType, 1>, packed_tile_q4_k<kType, 2>, packed_tile_q4_k<kType, 3>>;
  } else if constexpr (kType == DType::kQ6_K) {
    return packed_gemm<kType, packed_tile_q6_k<kType, 16>, packed_tile_q6_k<kType, 8>, packed_tile_q6_k<kType, 4>,
                       packed_tile_q6_k<kType, 1>, packed_tile_q6_k<kType, 2>, packed_tile_q6_k<kType, 3>>;
  } else {
    constexpr TileFn kTail2 = kType == DType::kQ4_0 ? nullptr : packed_tile<kType, 4, 2>;
    return packed_gemm<kType, packed_tile<kType, 16>, packed_tile<kType, 8>, packed_tile<kType, 4>, packed_row16<kType>,
                       kTail2, packed_tile<kType, 4, 3>>;
  }
}

}  // namespace

const Kernels& kernels_neon() {
  static const Kernels k = [] {
    Kernels t = kernels_generic();
    t.isa = Isa::kNeon;
    t.gemm_f32 = gemm_f32;
    t.dot_f32 = dot_f32;
    t.axpy_f32 = axpy_f32;
    t.rms_norm_f32 = rms_norm_f32;
    t.silu_mul_f32 = silu_mul_f32;
    t.f32_to_f16 = f32_to_f16;
    t.dequantize_f16 = dequantize_f16;
    t.dequantize_q8_0 = dequantize_q8_0;
    t.attn_scores[kAttnF32] = attn_scores<float>;
    t.attn_scores[kAttnF16] = attn_scores<uint16_t>;
    t.attn_scores[kAttnQ8_0] = attn_scores<BlockQ8_0>;
    t.exp_sum_f32 = exp_sum_f32;
    t.attn_values[kAttnF32] = attn_values<float>;
    t.attn_values[kAttnF16] = attn_values<uint16_t>;
    t.attn_values[kAttnQ8_0] = attn_values<BlockQ8_0>;
    t.attn_scores_heads[kAttnF32] = attn_scores_heads<float>;
    t.attn_scores_heads[kAttnF16] = attn_scores_heads<uint16_t>;
    t.attn_scores_heads[kAttnQ8_0] = attn_scores_heads<BlockQ8_0>;
    t.attn_values_heads[kAttnF32] = attn_values_heads<float>;
    t.attn_values_heads[kAttnF16] = attn_values_heads<uint16_t>;
    t.attn_values_heads[kAttnQ8_0] = attn_values_heads<BlockQ8_0>;
    t.scale_add_f32 = scale_add_f32;
    t.quantize_q8a = quantize_q8a;
    t.gemm_q4_0_q8a = qgemm<Q4_0Policy>;
    t.gemm_q8_0_q8a = qgemm<Q8_0Policy>;
    t.gemm_q4_k_q8a = qgemm_k<BlockQ4_K, dot_q4_k>;
    t.gemm_q6_k_q8a = qgemm_k<BlockQ6_K, dot_q6_k>;
    t.gemm_q4_0x16_q8a = packed_gemm_of<DType::kQ4_0>();
    t.gemm_q8_0x16_q8a = packed_gemm_of<DType::kQ8_0>();
    t.gemm_q5_0x16_q8a = packed_gemm_of<DType::kQ5_0>();
    t.gemm_q4_kx16_q8a = packed_gemm_of<DType::kQ4_K>();
    t.gemm_q6_kx16_q8a = packed_gemm_of<DType::kQ6_K>();
    t.gemm_q4_1x16_q8a = packed_gemm_of<DType::kQ4_1>();
    t.dequantize_fp8 = dequantize_fp8_neon;
    t.dequantize_kv_fp8 = dequantize_kv_fp8<dequantize_fp8_neon, dequantize_f16>;
    t.gemv_fp8 = gemv_fp8_neon;
    t.index_totals = index_totals;
    return t;
  }();
  return k;
}

}  // namespace duet::cpu
