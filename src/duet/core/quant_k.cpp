// Reference quantization into the K-quant super-block formats (Q4_K, Q5_K, Q6_K).
//
// These reproduce, bit for bit, the blocks llama.cpp writes when it quantizes without an
// importance matrix (`quantize_q4_K` etc. call `quantize_row_q4_K_ref` when quant_weights is
// NULL; llama-quantize only passes weights when given --imatrix). Every float operation below
// happens in the same order and precision as there, so a change that looks harmless (a
// reassociated sum, a fused multiply-add, lrintf instead of the rounding trick) breaks byte
// identity; tests/core/quant_k_test.cpp holds golden blocks generated with llama.cpp's ggml.
// This file is compiled with -ffp-contract=off for that reason.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "duet/core/quant.h"

namespace duet {
namespace {

// Below this magnitude a group counts as all zero.
constexpr float kGroupMaxEps = 1e-15f;

// Rounds to the nearest integer, ties to even, for |f| < 2^22: adding 1.5 * 2^23 leaves the
// integer in the low mantissa bits. Kept as this trick (not lrintf) so that out-of-range values
// give the same bytes as llama.cpp too.
inline int round_nearest(float f) {
  const float biased = f + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &biased, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

inline int clamp_int(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// Fits x[i] ~ scale * L[i] - offset with L in [0, nmax] and offset >= 0, minimizing the weighted
// squared error: a first guess from the range, then nstep + 1 trial inverse scales
// (rmin + rdelta * k + nmax) / (max - min), each refined by weighted least squares for scale and
// minimum. A better trial replaces the minimum, and later trials start from it. Returns the
// scale and stores the offset (minus the minimum) in *offset. `trial` is scratch of n levels.
// (llama.cpp's make_qkx2_quants with use_mad = false.)
float fit_scale_and_offset(int n, int nmax, const float* x, const float* w, uint8_t* L, float* offset,
                           uint8_t* trial, float rmin, float rdelta, int nstep) {
  float lo = x[0];  // the minimum (never above 0); replaced by better fits below
  float hi = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
    const float wi = w[i];
    sum_w += wi;
    sum_x += wi * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    std::memset(L, 0, static_cast<size_t>(n));
    *offset = -lo;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (hi - lo);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(clamp_int(round_nearest(iscale * (x[i] - lo)), 0, nmax));
    const float diff = scale * static_cast<float>(L[i]) + lo - x[i];
    best_error += w[i] * (diff * diff);
  }
  if (nstep < 1) {
    *offset = -lo;
    return scale;
  }
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(round_nearest(iscale * (x[i] - lo)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      const float wl = w[i] * static_cast<float>(l);
      sum_l += wl;
      sum_l2 += wl * static_cast<float>(l);
      sum_xl += wl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * static_cast<float>(trial[i]) + this_min - x[i];
        error += w[i] * (diff * diff);
      }
      if (error < best_error) {
        std::memcpy(L, trial, static_cast<size_t>(n));
        best_error = error;
        scale = this_scale;
        lo = this_min;
      }
    }
  }
  *offset = -lo;
  return scale;
}

// Fits x[i] ~ scale * (L[i] - nmax) with L in [0, 2 nmax - 1], weighting each element by x[i]^2:
// the scale that maps the largest magnitude to -nmax, then 18 nearby trial scales
// -(nmax + 0.1 k) / max for k = -9..9, k != 0, keeping the one whose least-squares fit explains
// the most. Returns the scale (0 for an all-zero group). (llama.cpp's make_qx_quants with
// rmse_type = 1 and no importance weights.)
float fit_symmetric_scale(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0;
  float max = 0;  // the element of largest magnitude, with its sign
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  // Sums of w x l and w l^2 over the group for one inverse scale, with w = x^2.
  auto sums = [&](float iscale, float* sum_xl, float* sum_l2) {
    float sxl = 0, sl2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(round_nearest(iscale * x[i]), -nmax, nmax - 1);
      const float wi = x[i] * x[i];
      sxl += wi * x[i] * static_cast<float>(l);
      sl2 += wi * static_cast<float>(l) * static_cast<float>(l);
    }
    *sum_xl = sxl;
    *sum_l2 = sl2;
  };
  auto levels = [&](float iscale) {
    for (int i = 0; i < n; ++i) {
      L[i] = static_cast<int8_t>(nmax + clamp_int(round_nearest(iscale * x[i]), -nmax, nmax - 1));
    }
  };
  float iscale = static_cast<float>(-nmax) / max;
  float sum_xl, sum_l2;
  sums(iscale, &sum_xl, &sum_l2);
  levels(iscale);
  float scale = sum_l2 != 0 ? sum_xl / sum_l2 : 0.0f;
  float best = scale * sum_xl;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(k)) / max;
    sums(iscale, &sum_xl, &sum_l2);
    if (sum_l2 > 0 && sum_xl * sum_xl > best * sum_l2) {
      levels(iscale);
      scale = sum_xl / sum_l2;
      best = scale * sum_xl;
    }
  }
  return scale;
}

// Packs eight 6-bit scales and eight 6-bit mins into the 12 bytes of a Q4_K/Q5_K super-block:
// bytes 0-3 hold scales 0-3, bytes 4-7 mins 0-3, bytes 8-11 the low nibbles of scales and mins
// 4-7, whose top two bits go into the top bits of bytes 0-3 (scales) and 4-7 (mins).
void pack_scales_mins(const uint8_t* ls, const uint8_t* lm, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(ls[j] | ((ls[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(lm[j] | ((lm[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((ls[j + 4] & 0x0f) | ((lm[j + 4] & 0x0f) << 4));
  }
}

// The common part of Q4_K and Q5_K: eight groups of 32 with a scale and a minimum each,
// quantized to 6 bits against the super-block's fp16 `d` and `dmin`; then each element's level
// in [0, nmax] against the rounded scales. Writes d, dmin, scales and the levels L[256].
template <int kNmax>
void quantize_superblock_with_mins(const float* x, float rmin, int nstep, uint16_t* d_out, uint16_t* dmin_out,
                                   uint8_t* scales_out, uint8_t* L) {
  constexpr int kGroups = kQK_K / 32;
  float scales[kGroups];
  float mins[kGroups];
  float weights[32];
  uint8_t trial[32];
  float max_scale = 0;  // scales are positive: the minimum is taken out
  float max_min = 0;
  for (int j = 0; j < kGroups; ++j) {
    const float* xg = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xg[l] * xg[l];
    const float rms = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = rms + std::fabs(xg[l]);
    scales[j] = fit_scale_and_offset(32, kNmax, xg, weights, L + 32 * j, &mins[j], trial, rmin, 0.1f, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[kGroups], lm[kGroups];
  for (int j = 0; j < kGroups; ++j) {
    // Through uint8_t first, as llama.cpp does: a (never expected) negative level wraps, then clamps.
    ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(round_nearest(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(round_nearest(inv_min * mins[j])));
  }
  pack_scales_mins(ls, lm, scales_out);
  *d_out = fp32_to_fp16(max_scale / 63.f);
  *dmin_out = fp32_to_fp16(max_min / 63.f);

  const float d_all = fp16_to_fp32(*d_out);
  const float dmin_all = fp16_to_fp32(*dmin_out);
  for (int j = 0; j < kGroups; ++j) {
    const float d = d_all * static_cast<float>(ls[j]);
    if (d == 0.0f) continue;  // keeps the levels of the group's own fit, as llama.cpp does
    const float dm = dmin_all * static_cast<float>(lm[j]);
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] = static_cast<uint8_t>(clamp_int(round_nearest((x[32 * j + l] + dm) / d), 0, kNmax));
    }
  }
}

}  // namespace

void quantize_row_q4_k_ref(const float* x, BlockQ4_K* y, int64_t n) {
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    BlockQ4_K& b = y[i];
    quantize_superblock_with_mins<15>(x, -1.0f, 20, &b.d, &b.dmin, b.scales, L);
    // Byte l of each 32-byte chunk: element l of the chunk's first group (low nibble) and of
    // its second group (high nibble).
    for (int c = 0; c < kQK_K / 64; ++c) {
      for (int l = 0; l < 32; ++l) {
        b.qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
      }
    }
  }
}

void quantize_row_q5_k_ref(const float* x, BlockQ5_K* y, int64_t n) {
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    BlockQ5_K& b = y[i];
    quantize_superblock_with_mins<31>(x, -0.5f, 15, &b.d, &b.dmin, b.scales, L);
    // Low nibbles as in Q4_K; the fifth bit of element l of group g goes to bit g of qh[l].
    std::memset(b.qh, 0, sizeof b.qh);
    for (int c = 0; c < kQK_K / 64; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l];
        const int hi = L[64 * c + 32 + l];
        b.qs[32 * c + l] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
        b.qh[l] = static_cast<uint8_t>(b.qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
}

void quantize_row_q6_k_ref(const float* x, BlockQ6_K* y, int64_t n) {
  constexpr int kGroups = kQK_K / 16;
  int8_t L[kQK_K];
  float scales[kGroups];
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    BlockQ6_K& b = y[i];
    float max_scale = 0;  // the scale of largest magnitude, with its sign
    float max_abs_scale = 0;
    for (int g = 0; g < kGroups; ++g) {
      scales[g] = fit_symmetric_scale(16, 32, x + 16 * g, L + 16 * g);
      const float a = std::fabs(scales[g]);
      if (a > max_abs_scale) {
        max_abs_scale = a;
        max_scale = scales[g];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&b, 0, sizeof b);
      continue;
    }
    const float iscale = -128.f / max_scale;
    b.d = fp32_to_fp16(1 / iscale);
    for (int g = 0; g < kGroups; ++g) {
      b.scales[g] = static_cast<int8_t>(std::min(127, round_nearest(iscale * scales[g])));
    }
    const float d_all = fp16_to_fp32(b.d);
    for (int g = 0; g < kGroups; ++g) {
      const float d = d_all * static_cast<float>(b.scales[g]);
      if (d == 0.0f) continue;  // keeps the group's own levels, as llama.cpp does
      for (int l = 0; l < 16; ++l) {
        L[16 * g + l] = static_cast<int8_t>(32 + clamp_int(round_nearest(x[16 * g + l] / d), -32, 31));
      }
    }
    // Each half of 128: ql[l] holds elements l (low) and l+64 (high), ql[l+32] elements l+32
    // and l+96; qh[l] the top two bits of l, l+32, l+64, l+96 at bits 0, 2, 4, 6.
    for (int h = 0; h < 2; ++h) {
      const int8_t* Lh = L + 128 * h;
      uint8_t* ql = b.ql + 64 * h;
      uint8_t* qh = b.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0x0f) | ((q3 & 0x0f) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0x0f) | ((q4 & 0x0f) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

}  // namespace duet
