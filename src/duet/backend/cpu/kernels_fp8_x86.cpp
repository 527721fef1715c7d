// FP8 weights with AVX2 + FMA + F16C (kernels_fp8.h), for the AVX2 table and the AVX-512 one
// (whose gemm_f32 is AVX2's: gemv_fp8 must give its bits; its rows decode at 16 lanes in
// kernels_avx512.cpp). Compiled with the AVX2 file's flags.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "duet/backend/cpu/kernels_fp8.h"
#include "duet/core/quant.h"

namespace duet::cpu {
namespace {

// kernels_avx2.cpp's reduction, order for order.
#include "duet/backend/cpu/hsum_x86.inc"

// Eight e4m3 codes times `s256` (256 * the block's scale): see kernels_fp8.h.
inline __m256 decode8(const uint8_t* codes, __m256 s256) {
  const __m128i c = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  // The code in the high byte, shifted back by one with its sign: sign at 15 (and 14), the value
  // bits at 7..13; bit 14 cleared.
  __m128i h = _mm_and_si128(_mm_srai_epi16(_mm_slli_epi16(c, 8), 1), _mm_set1_epi16(static_cast<short>(0xBF80)));
  // Value bits all ones (NaN) carry into bit 14 when 1 is added at bit 7: a half NaN then.
  h = _mm_or_si128(h, _mm_and_si128(_mm_add_epi16(h, _mm_set1_epi16(0x0080)), _mm_set1_epi16(0x4000)));
  return _mm256_mul_ps(_mm256_cvtph_ps(h), s256);
}

inline float block_scale(const uint8_t* block) {
  float d;
  std::memcpy(&d, block, sizeof d);
  return d;
}

// MR activation rows against NR weight rows: kernels_avx2.cpp's micro<MR, NR> with the weights
// decoded as they are read (k a multiple of 8: no tail).
template <int MR, int NR>
void micro(const uint8_t* w, size_t row_bytes, const float* x, int64_t k, float* y, int64_t ldy) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t b0 = 0; b0 < k; b0 += kQKFP8) {
    const int64_t end = std::min<int64_t>(b0 + kQKFP8, k);
    const uint8_t* codes[NR];
    __m256 s256[NR];
    for (int j = 0; j < NR; ++j) {
      const uint8_t* block = w + j * row_bytes + (b0 / kQKFP8) * sizeof(BlockFP8);
      s256[j] = _mm256_set1_ps(block_scale(block) * 256.0f);
      codes[j] = block + sizeof(float) - b0;
    }
    for (int64_t p = b0; p < end; p += 8) {
      __m256 xv[MR];
      for (int i = 0; i < MR; ++i) xv[i] = _mm256_loadu_ps(x + i * k + p);
      for (int j = 0; j < NR; ++j) {
        const __m256 wv = decode8(codes[j] + p, s256[j]);
        for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = hsum_ps(acc[i][j]);
}

template <int MR>
void row_block(const uint8_t* w, size_t row_bytes, int64_t nw, const float* x, int64_t k, float* y, int64_t ldy) {
  int64_t j = 0;
  for (; j + 4 <= nw; j += 4) micro<MR, 4>(w + j * row_bytes, row_bytes, x, k, y + j, ldy);
  for (; j < nw; ++j) micro<MR, 1>(w + j * row_bytes, row_bytes, x, k, y + j, ldy);
}

}  // namespace

void dequantize_fp8_avx2(const void* src, float* y, int64_t n) {
  const auto* block = static_cast<const uint8_t*>(src);
  for (int64_t b0 = 0; b0 < n; b0 += kQKFP8, block += sizeof(BlockFP8)) {
    const float d = block_scale(block);
    const __m256 s256 = _mm256_set1_ps(d * 256.0f);
    const int64_t len = std::min<int64_t>(kQKFP8, n - b0);
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) {  // decode8's operations on 16 codes at once
      const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + sizeof(float) + j)));
      __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(c, 8), 1),
                                   _mm256_set1_epi16(static_cast<short>(0xBF80)));
      h = _mm256_or_si256(h, _mm256_and_si256(_mm256_add_epi16(h, _mm256_set1_epi16(0x0080)), _mm256_set1_epi16(0x4000)));
      _mm256_storeu_ps(y + b0 + j, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s256));
      _mm256_storeu_ps(y + b0 + j + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s256));
    }
    for (; j + 8 <= len; j += 8) _mm256_storeu_ps(y + b0 + j, decode8(block + sizeof(float) + j, s256));
    for (; j < len; ++j) y[b0 + j] = fp8_e4m3_to_fp32(block[sizeof(float) + j]) * d;
  }
}

void gemv_fp8_avx2(const uint8_t* w, size_t row_bytes, int64_t nw, const float* x, int64_t m, int64_t k, float* y,
                   int64_t ldy) {
  int64_t i = 0;
  for (; i + 3 <= m; i += 3) row_block<3>(w, row_bytes, nw, x + i * k, k, y + i * ldy, ldy);
  for (; i < m; ++i) row_block<1>(w, row_bytes, nw, x + i * k, k, y + i * ldy, ldy);
}

}  // namespace duet::cpu
