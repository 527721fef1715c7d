// FP8 weights with NEON (kernels_fp8.h): gemv_fp8 gives the bits of kernels_neon.cpp's gemm_f32
// on the dequantized rows. Compiled with the NEON file's flags.
#include <arm_neon.h>

#include <algorithm>
#include <cstring>

#include "duet/backend/cpu/kernels_fp8.h"
#include "duet/core/quant.h"

namespace duet::cpu {
namespace {

// Eight e4m3 codes times `s256` (256 * the block's scale), as two vectors of four.
inline void decode8(const uint8_t* codes, float32x4_t s256, float32x4_t* lo, float32x4_t* hi) {
  // The code in the high byte, shifted back by one with its sign: sign at 15 (and 14), the value
  // bits at 7..13; bit 14 cleared; value bits all ones (NaN) carry into bit 14 when 1 is added at
  // bit 7, a half NaN then.
  const int16x8_t shifted = vshrq_n_s16(vreinterpretq_s16_u16(vshll_n_u8(vld1_u8(codes), 8)), 1);
  uint16x8_t h = vandq_u16(vreinterpretq_u16_s16(shifted), vdupq_n_u16(0xBF80));
  h = vorrq_u16(h, vandq_u16(vaddq_u16(h, vdupq_n_u16(0x0080)), vdupq_n_u16(0x4000)));
  const float16x8_t f = vreinterpretq_f16_u16(h);
  *lo = vmulq_f32(vcvt_f32_f16(vget_low_f16(f)), s256);
  *hi = vmulq_f32(vcvt_high_f32_f16(f), s256);
}

inline float block_scale(const uint8_t* block) {
  float d;
  std::memcpy(&d, block, sizeof d);
  return d;
}

// MR activation rows against NR weight rows: kernels_neon.cpp's micro<MR, NR> (one chain of four
// lanes per output, steps of 4) with the weights decoded as they are read, eight at a time (k a
// multiple of 8: no tail).
template <int MR, int NR>
void micro(const uint8_t* w, size_t row_bytes, const float* x, int64_t k, float* y, int64_t ldy) {
  float32x4_t acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = vdupq_n_f32(0.0f);
  for (int64_t b0 = 0; b0 < k; b0 += kQKFP8) {
    const int64_t end = std::min<int64_t>(b0 + kQKFP8, k);
    const uint8_t* block[NR];
    float32x4_t s256[NR];
    for (int j = 0; j < NR; ++j) {
      block[j] = w + j * row_bytes + (b0 / kQKFP8) * sizeof(BlockFP8);
      s256[j] = vdupq_n_f32(block_scale(block[j]) * 256.0f);
    }
    for (int64_t p = b0; p < end; p += 8) {
      float32x4_t x0[MR], x1[MR];
      for (int i = 0; i < MR; ++i) {
        x0[i] = vld1q_f32(x + i * k + p);
        x1[i] = vld1q_f32(x + i * k + p + 4);
      }
      for (int j = 0; j < NR; ++j) {
        float32x4_t lo, hi;
        decode8(block[j] + sizeof(float) + (p - b0), s256[j], &lo, &hi);
        for (int i = 0; i < MR; ++i) acc[i][j] = vfmaq_f32(vfmaq_f32(acc[i][j], x0[i], lo), x1[i], hi);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = vaddvq_f32(acc[i][j]);
}

template <int MR>
void row_block(const uint8_t* w, size_t row_bytes, int64_t nw, const float* x, int64_t k, float* y, int64_t ldy) {
  int64_t j = 0;
  for (; j + 4 <= nw; j += 4) micro<MR, 4>(w + j * row_bytes, row_bytes, x, k, y + j, ldy);
  for (; j < nw; ++j) micro<MR, 1>(w + j * row_bytes, row_bytes, x, k, y + j, ldy);
}

}  // namespace

void dequantize_fp8_neon(const void* src, float* y, int64_t n) {
  const auto* block = static_cast<const uint8_t*>(src);
  for (int64_t b0 = 0; b0 < n; b0 += kQKFP8, block += sizeof(BlockFP8)) {
    const float d = block_scale(block);
    const float32x4_t s256 = vdupq_n_f32(d * 256.0f);
    const int64_t len = std::min<int64_t>(kQKFP8, n - b0);
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
      float32x4_t lo, hi;
      decode8(block + sizeof(float) + j, s256, &lo, &hi);
      vst1q_f32(y + b0 + j, lo);
      vst1q_f32(y + b0 + j + 4, hi);
    }
    for (; j < len; ++j) y[b0 + j] = fp8_e4m3_to_fp32(block[sizeof(float) + j]) * d;
  }
}

void gemv_fp8_neon(const uint8_t* w, size_t row_bytes, int64_t nw, const float* x, int64_t m, int64_t k, float* y,
                   int64_t ldy) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) row_block<4>(w, row_bytes, nw, x + i * k, k, y + i * ldy, ldy);
  for (; i < m; ++i) row_block<1>(w, row_bytes, nw, x + i * k, k, y + i * ldy, ldy);
}

}  // namespace duet::cpu
