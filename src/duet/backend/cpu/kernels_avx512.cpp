// AVX-512 (F, BW, VL, VNNI) kernels: the integer GEMM with vpdpbusd and attention at 16 lanes.
// Everything else comes from the AVX2 table, which this machine runs too. Compiled alone with
// these flags; called only after CPUID says the machine has them.
#include <immintrin.h>

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

#define DUET_QGEMM_VNNI 1
#include "duet/backend/cpu/qgemm_x86.inc"
#undef DUET_QGEMM_VNNI

inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Two 256-bit halves in one register; `two` false leaves the upper half zero (an odd last block
// then adds nothing there).
inline __m512i pair_i(__m256i lo, __m256i hi, bool two) {
  return two ? _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1) : _mm512_zextsi256_si512(lo);
}
inline __m512 pair_f(float lo, float hi) { return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1); }

// 512-bit tiles: two consecutive blocks per register, so each vpdpbusd, int-to-float conversion
// and fused multiply-add covers 64 weights instead of 32 (the policies are qgemm_x86.inc's).
template <typename P, int NR, int MR>
void qgemm_tile512(const uint8_t* w, size_t row_bytes, const BlockQ8A* a, int64_t nb, float* y, int64_t ldy) {
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r) {
    for (int i = 0; i < MR; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; b += 2) {
    const bool two = b + 1 < nb;
    __m512i av[MR], corr[MR];
    __m512 da[MR];
    for (int i = 0; i < MR; ++i) {
      const BlockQ8A& a0 = a[i * nb + b];
      const BlockQ8A& a1 = two ? a[i * nb + b + 1] : a0;
      av[i] = pair_i(load256(a0.qs), load256(a1.qs), two);
      corr[i] = pair_i(_mm256_set1_epi32(P::kLaneOffset * a0.sum), _mm256_set1_epi32(P::kLaneOffset * a1.sum), two);
      da[i] = pair_f(a0.d, two ? a1.d : 0.0f);
    }
    for (int r = 0; r < NR; ++r) {
      const auto* blk = reinterpret_cast<const typename P::Block*>(w + static_cast<size_t>(r) * row_bytes) + b;
      const __m512i wq = pair_i(P::weights(blk[0]), two ? P::weights(blk[1]) : _mm256_setzero_si256(), two);
      const __m512 dw = pair_f(_cvtsh_ss(blk[0].d), two ? _cvtsh_ss(blk[1].d) : 0.0f);
      for (int i = 0; i < MR; ++i) {
        const __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, av[i]), corr[i]);
        acc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, da[i]), acc[r][i]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int i = 0; i < MR; ++i) y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
  }
}

// One activation row against weight rows one at a time (decode): rows are read front to back,
// one stream. One accumulator, adding in the tile's order, so a row's result does not depend on
// how many rows share the call (a sequence's logits are the same alone and in a batch).
template <typename P>
void qgemv512(const uint8_t* w, size_t row_bytes, int64_t nw, const BlockQ8A* a, int64_t nb, float* y) {
  for (int64_t j = 0; j < nw; ++j) {
    const auto* blk = reinterpret_cast<const typename P::Block*>(w + static_cast<size_t>(j) * row_bytes);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
      const bool two = b + 1 < nb;
      const BlockQ8A& a0 = a[b];
      const BlockQ8A& a1 = two ? a[b + 1] : a0;
      const __m512i av = pair_i(load256(a0.qs), load256(a1.qs), two);
      const __m512i corr =
          pair_i(_mm256_set1_epi32(P::kLaneOffset * a0.sum), _mm256_set1_epi32(P::kLaneOffset * a1.sum), two);
      const __m512 d = _mm512_mul_ps(pair_f(_cvtsh_ss(blk[b].d), two ? _cvtsh_ss(blk[b + 1].d) : 0.0f),
                                     pair_f(a0.d, two ? a1.d : 0.0f));
      const __m512i wq = pair_i(P::weights(blk[b]), two ? P::weights(blk[b + 1]) : _mm256_setzero_si256(), two);
      const __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, av), corr);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, acc);
    }
    y[j] = _mm512_reduce_add_ps(acc);
  }
}

template <typename P, int MR>
void qgemm_rows512(const uint8_t* w, size_t row_bytes, int64_t nw, const BlockQ8A* a, int64_t nb, float* y,
                   int64_t ldy) {
  int64_t j = 0;
  for (; j + 4 <= nw; j += 4) qgemm_tile512<P, 4, MR>(w + static_cast<size_t>(j) * row_bytes, row_bytes, a, nb, y + j, ldy);
  for (; j < nw; ++j) qgemm_tile512<P, 1, MR>(w + static_cast<size_t>(j) * row_bytes, row_bytes, a, nb, y + j, ldy);
}

template <typename P>
void qgemm_avx512(const uint8_t* w, size_t row_bytes, int64_t nw, const BlockQ8A* a, int64_t m, int64_t nb, float* y,
                  int64_t ldy) {
  int64_t i = 0;
  for (; i + 3 <= m; i += 3) qgemm_rows512<P, 3>(w, row_bytes, nw, a + i * nb, nb, y + i * ldy, ldy);
  for (; i < m; ++i) qgemv512<P>(w, row_bytes, nw, a + i * nb, nb, y + i * ldy);
}

// Activation word k (values 4k .. 4k + 3) in every lane, read straight from memory so that the
// broadcast folds into the dot product's operand instead of passing through a general register.
inline __m512i bcast_word(const BlockQ8A& ab, int k) { return _mm512_broadcastd_epi32(_mm_loadu_si32(ab.qs + 4 * k)); }
// 16 bytes at p (one per row of a group: K-quant scales and minimums) as 16 floats, unsigned or
// signed.
inline __m512 u8x16_ps(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 s8x16_ps(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// A tile of four or more activation rows spends long enough on each block of weights that the
// hardware prefetcher falls behind it (5504 x 2048 Q4_0, 16 rows, from memory: 6 GB/s of
// weights, 10 when in cache). The first tile over a group, the one that reads it from memory,
// prefetches the weights ahead as it goes (`ahead`: packed.h's kPrefetchAhead, into L2; the
// later tiles, which find the group in cache, pass 0 and touch the lines they read anyway; a flag
// tested before the prefetches made GCC 12 drop them all, and a test of `ahead` choosing the cache
// level inside a tile made 8 rows of Q8_0 2.4x slower): batched decode steps 1.4x faster, prefill
// unchanged.
// Fewer rows read fast enough for the prefetcher, and prefetching slowed them, but for Q4_0's
// single row (decode): dsc-1.3b Q4_0 tg64 on Zen 5, 2 threads, faster with it in ten
// alternations of twelve, one even (mean +6%); Q8_0's row was not (two of five; Q5_0's and
// Q4_1's not timed; bench/RESULTS.md, 2026-12-05, nineteenth session).
template <DType kType, int MR>
inline void prefetch_ahead(const uint8_t* p, size_t ahead, size_t bytes) {
  if constexpr (MR >= 4 || (MR == 1 && kType == DType::kQ4_0)) prefetch_weights(p, ahead, bytes);
}

// Packed weights (packed.h): one register holds 4 bytes of each of 16 rows, so a vpdpbusd with
// an activation word broadcast to every lane advances 16 outputs by 4 products, and the scale
// conversion and the fused multiply-add happen once per block for 16 outputs. Each lane is one
// output row; it starts at -offset * sum (the unsigned weights' correction, exact in int32) and
// takes the 8 words of the block in two chains, so a row's result is the same for any MR.
// Q5_0's fifth bits come as one 64-bit mask per word: a masked byte add puts 16 on top of the
// nibble where the bit is set.
template <DType kType, int MR>
void packed_tile(const uint8_t* group, const BlockQ8A* a, const float* ds, int64_t nb, float* y, int64_t ldy,
                 __mmask16 mask, size_t ahead) {
  constexpr bool kQ8 = kType == DType::kQ8_0;
  constexpr bool kQ5 = kType == DType::kQ5_0;
  constexpr bool kQ41 = kType == DType::kQ4_1;  // unsigned nibbles times d, plus m * sum(a)
  constexpr size_t kBlockBytes = packed_block_bytes(kType);
  constexpr int kOffset = kQ8 ? 128 : (kQ5 ? 16 : (kQ41 ? 0 : 8));
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + static_cast<size_t>(b) * kBlockBytes;
    prefetch_ahead<kType, MR>(p, ahead, kBlockBytes);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    // w[k] pairs with activation word k (values 4k .. 4k + 3).
    __m512i w[8];
    if constexpr (kQ8) {
      for (int k = 0; k < 8; ++k) w[k] = _mm512_loadu_si512(p + 32 + 64 * k);
    } else {
      for (int k = 0; k < 4; ++k) {
        const __m512i z = _mm512_loadu_si512(p + 32 + 64 * k);
        w[k] = _mm512_and_si512(z, low4);
        w[4 + k] = _mm512_and_si512(_mm512_srli_epi16(z, 4), low4);
      }
      if constexpr (kQ5) {
        uint64_t high[8];
        std::memcpy(high, p + 32 + 256, sizeof(high));
        for (int k = 0; k < 8; ++k) w[k] = _mm512_mask_add_epi8(w[k], high[k], w[k], _mm512_set1_epi8(16));
      }
    }
    for (int i = 0; i < MR; ++i) {
      const BlockQ8A& ab = a[i * nb + b];
      __m512i s0 = _mm512_set1_epi32(-kOffset * ab.sum);
      __m512i s1 = _mm512_setzero_si512();
      for (int k = 0; k < 8; k += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[k], bcast_word(ab, k));
        s1 = _mm512_dpbusd_epi32(s1, w[k + 1], bcast_word(ab, k + 1));
      }
      const __m512i s = _mm512_add_epi32(s0, s1);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(ab.d)), acc[i]);
      if constexpr (kQ41) {
        const __m512 mins = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 256)));
        acc[i] = _mm512_fmadd_ps(mins, _mm512_set1_ps(ds[2 * (i * nb + b) + 1]), acc[i]);  // act_scalars
      }
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(y + i * ldy, mask, acc[i]);
}

// Packed Q4_K (packed.h): per sub-block of 32, the 16 rows' scale and min become float vectors
// once (d * scale, dmin * min) and serve every activation row; the min's term uses the
// activation block's sum: acc += dsc * da * sum(q * a) - dm * da * sum(a).
template <int MR>
void packed_tile_q4_k(const uint8_t* group, const BlockQ8A* a, const float* ds, int64_t nb, float* y, int64_t ldy,
                      __mmask16 mask, size_t ahead) {
  constexpr size_t kScales = 64, kMins = kScales + 128, kQs = kMins + 128, kBlockBytes = packed_block_bytes(DType::kQ4_K);
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = group + static_cast<size_t>(sb) * kBlockBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
    for (int s = 0; s < 8; ++s) {
      // Two and three rows too (one has packed_row_q4_k): without, 2048 x 2048 from memory took
      // 0.115-0.14 ms at m = 2 (the row kernel 0.06), with 0.065-0.08 (qgemm_bench, Zen 5). The
      // legacy types at two or three rows read as fast or faster without.
      prefetch_weights(p + s * (kBlockBytes / 8), ahead, kBlockBytes / 8);
      const __m512 dsc = _mm512_mul_ps(d, u8x16_ps(p + kScales + 16 * s));
      const __m512 dm = _mm512_mul_ps(dmin, u8x16_ps(p + kMins + 16 * s));
      const uint8_t* q = p + kQs + static_cast<size_t>(s / 2) * 8 * 64;
      __m512i w[8];
      for (int k = 0; k < 8; ++k) {
        const __m512i z = _mm512_loadu_si512(q + 64 * k);
        w[k] = _mm512_and_si512((s & 1) ? _mm512_srli_epi16(z, 4) : z, low4);
      }
      for (int i = 0; i < MR; ++i) {
        const BlockQ8A& ab = a[i * nb + sb * 8 + s];
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int k = 0; k < 8; k += 2) {
          s0 = _mm512_dpbusd_epi32(s0, w[k], bcast_word(ab, k));
          s1 = _mm512_dpbusd_epi32(s1, w[k + 1], bcast_word(ab, k + 1));
        }
        const float* dab = ds + 2 * (i * nb + sb * 8 + s);  // act_scalars (kernels.h)
        const __m512 da = _mm512_set1_ps(dab[0]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(dsc, da), acc[i]);
        acc[i] = _mm512_fnmadd_ps(dm, _mm512_set1_ps(dab[1]), acc[i]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(y + i * ldy, mask, acc[i]);
}

// Packed Q4_K, one activation row: sub-blocks 2g and 2g + 1 share their words (low and high
// nibbles), so each word is loaded and split once, and four chains of vpdpbusd run side by side.
// The tile at MR = 1 split every word twice and ran two chains: 22-23 GB/s of weights from memory
// on one thread (qgemm_bench, Zen 5), slower than the AVX2 table's row kernel (32), and below a
// thread's share of the bandwidth in decode; this reads 35-40. The float operations are
// packed_tile_q4_k's, in its order, so a row gets the same bits alone as in a tile.
void packed_row_q4_k(const uint8_t* group, const BlockQ8A* a, const float* ds, int64_t nb, float* y, __mmask16 mask) {
  constexpr size_t kScales = 64, kMins = kScales + 128, kQs = kMins + 128, kBlockBytes = packed_block_bytes(DType::kQ4_K);
  __m512 acc = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = group + static_cast<size_t>(sb) * kBlockBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
    for (int g = 0; g < 4; ++g) {
      const BlockQ8A& ae = a[sb * 8 + 2 * g];
      const BlockQ8A& ao = a[sb * 8 + 2 * g + 1];
      const uint8_t* q = p + kQs + static_cast<size_t>(g) * 8 * 64;
      __m512i e0 = _mm512_setzero_si512(), e1 = e0, o0 = e0, o1 = e0;
      for (int k = 0; k < 8; k += 2) {
        const __m512i z0 = _mm512_loadu_si512(q + 64 * k), z1 = _mm512_loadu_si512(q + 64 * (k + 1));
        e0 = _mm512_dpbusd_epi32(e0, _mm512_and_si512(z0, low4), bcast_word(ae, k));
        o0 = _mm512_dpbusd_epi32(o0, _mm512_and_si512(_mm512_srli_epi16(z0, 4), low4), bcast_word(ao, k));
        e1 = _mm512_dpbusd_epi32(e1, _mm512_and_si512(z1, low4), bcast_word(ae, k + 1));
        o1 = _mm512_dpbusd_epi32(o1, _mm512_and_si512(_mm512_srli_epi16(z1, 4), low4), bcast_word(ao, k + 1));
      }
      const __m512i se = _mm512_add_epi32(e0, e1), so = _mm512_add_epi32(o0, o1);
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * g + h;
        const __m512 dsc = _mm512_mul_ps(d, u8x16_ps(p + kScales + 16 * s));
        const __m512 dm = _mm512_mul_ps(dmin, u8x16_ps(p + kMins + 16 * s));
        const float* dab = ds + 2 * (sb * 8 + s);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h == 0 ? se : so), _mm512_mul_ps(dsc, _mm512_set1_ps(dab[0])), acc);
        acc = _mm512_fnmadd_ps(dm, _mm512_set1_ps(dab[1]), acc);
      }
    }
  }
  _mm512_mask_storeu_ps(y, mask, acc);
}

// Packed Q6_K: each 32-value sub-block's weights are rebuilt from the low-nibble and high-pair
// planes as unsigned bytes q (0..63) once per 16 rows and meet the signed activations directly:
// sum((q - 32) a) = sum(q a) - 32 sum(a), the second term from the activation's 16-value half
// sums (`half`, two per block, computed once per call by packed_gemm). Two scale groups per
// sub-block.
// With `saved` (calls of kQ6SavedMinRows activation rows and more), the first tile over a group
// (kSaved 1) stores each sub-block's rebuilt words there (4 KiB a super-block) and the tiles after
// it (kSaved 2) load them: the same integer sums, so the same bits.
constexpr int64_t kQ6SavedMinRows = 12;
constexpr size_t kQ6SavedBlockBytes = 8 * 8 * 64;

template <int MR, int kSaved>
void packed_tile_q6_k(const uint8_t* group, const BlockQ8A* a, const int32_t* half, int64_t nb, float* y,
                      int64_t ldy, __mmask16 mask, size_t ahead, uint8_t* saved) {
  constexpr size_t kScales = 32, kQl = kScales + 256, kQh = kQl + 2048, kBlockBytes = packed_block_bytes(DType::kQ6_K);
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f), high2 = _mm512_set1_epi8(0x30);
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = group + static_cast<size_t>(sb) * kBlockBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 4; ++i) {
        // Whatever MR (unlike the other types): the sub-blocks take the scales and the two planes
        // out of their order in memory, which the hardware prefetcher does not follow (Zen 4, one
        // activation row, 5504 x 2048: 6 GB/s of weights without, 11-15 with; Q4_K_M tg128 at
        // 79% of the bandwidth roofline without, 94% with).
        prefetch_weights(p + (4 * h + i) * (kBlockBytes / 8), ahead, kBlockBytes / 8);
        const __m128i lo_shift = _mm_cvtsi32_si128(4 * (i >> 1));
        uint8_t* keep = kSaved == 0 ? nullptr
                                    : saved + static_cast<size_t>(sb) * kQ6SavedBlockBytes +
                                          static_cast<size_t>(4 * h + i) * 8 * 64;
        __m512i w[8];
        for (int k = 0; k < 8; ++k) {
          if constexpr (kSaved == 2) {
            w[k] = _mm512_loadu_si512(keep + 64 * k);
            continue;
          }
          const __m512i ql = _mm512_loadu_si512(p + kQl + 64 * (16 * h + 8 * (i & 1) + k));
          const __m512i qh = _mm512_loadu_si512(p + kQh + 64 * (8 * h + k));
          const __m512i lo = _mm512_and_si512(_mm512_srl_epi16(ql, lo_shift), low4);
          // The pair at bits 2i..2i+1 moved to bits 4..5 (a left or right shift by |4 - 2i|).
          const __m512i hi = i < 2 ? _mm512_slli_epi16(qh, 4 - 2 * i) : _mm512_srli_epi16(qh, 2 * i - 4);
          w[k] = _mm512_or_si512(lo, _mm512_and_si512(hi, high2));
          if constexpr (kSaved == 1) _mm512_storeu_si512(keep + 64 * k, w[k]);
        }
        const int g = 8 * h + 2 * i;
        const __m512 dsc_lo = _mm512_mul_ps(d, s8x16_ps(p + kScales + 16 * g));
        const __m512 dsc_hi = _mm512_mul_ps(d, s8x16_ps(p + kScales + 16 * (g + 1)));
        for (int r = 0; r < MR; ++r) {
          const int64_t blk = r * nb + sb * 8 + 4 * h + i;
          const BlockQ8A& ab = a[blk];
          __m512i s0 = _mm512_set1_epi32(-32 * half[2 * blk]), s1 = _mm512_set1_epi32(-32 * half[2 * blk + 1]);
          for (int k = 0; k < 4; ++k) {
            s0 = _mm512_dpbusd_epi32(s0, w[k], bcast_word(ab, k));
            s1 = _mm512_dpbusd_epi32(s1, w[4 + k], bcast_word(ab, 4 + k));
          }
          const __m512 da = _mm512_set1_ps(ab.d);
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dsc_lo, da), acc[r]);
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dsc_hi, da), acc[r]);
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(y + i * ldy, mask, acc[i]);
}

// Packed Q6_K, one activation row: the four sub-blocks of each half super-block together, so
// each low-nibble word is loaded once for two sub-blocks and each high-pair word once for four,
// and eight chains of vpdpbusd run side by side. Those reads leave memory order (the two planes
// of a half at once), so the row asks for the weights two super-blocks ahead itself (one
// super-block ahead, or three: less): 24-33 -> 33-40 GB/s of weights from memory on one thread
// (qgemm_bench, Zen 5, against the tile at MR = 1, with prefetcht0). On Zen 4 prefetcht0 held it
// to 9.6 GB/s (8.4 without a prefetch), into L2 (prefetch_weights) it reads 25-26 (5632 x 2048,
// 0.95 -> 0.36 ms a call; one super-block ahead 16, three or four 25). The float operations are
// packed_tile_q6_k's, in its order (sub-block by sub-block, low group then high), so a row gets
// the same bits alone.
void packed_row_q6_k(const uint8_t* group, const BlockQ8A* a, const int32_t* half, int64_t nb, float* y,
                     __mmask16 mask) {
  constexpr size_t kScales = 32, kQl = kScales + 256, kQh = kQl + 2048, kBlockBytes = packed_block_bytes(DType::kQ6_K);
  const __m512i low4 = _mm512_set1_epi8(0x0f), high2 = _mm512_set1_epi8(0x30);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = group + static_cast<size_t>(sb) * kBlockBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    for (int h = 0; h < 2; ++h) {
      prefetch_weights(p + 4 * h * (kBlockBytes / 8), 2 * kBlockBytes, kBlockBytes / 2);
      const int64_t blk = sb * 8 + 4 * h;
      // sum[i][g]: sub-block i's values 16g.. (words 4g..4g + 3), from -32 x their half sum.
      __m512i sum[4][2];
      for (int i = 0; i < 4; ++i) {
        for (int g = 0; g < 2; ++g) sum[i][g] = _mm512_set1_epi32(-32 * half[2 * (blk + i) + g]);
      }
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m512i qa = _mm512_loadu_si512(p + kQl + 64 * (16 * h + k));
        const __m512i qb = _mm512_loadu_si512(p + kQl + 64 * (16 * h + 8 + k));
        const __m512i qh = _mm512_loadu_si512(p + kQh + 64 * (8 * h + k));
        const __m512i w[4] = {
            _mm512_or_si512(_mm512_and_si512(qa, low4), _mm512_and_si512(_mm512_slli_epi16(qh, 4), high2)),
            _mm512_or_si512(_mm512_and_si512(qb, low4), _mm512_and_si512(_mm512_slli_epi16(qh, 2), high2)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(qa, 4), low4), _mm512_and_si512(qh, high2)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(qb, 4), low4),
                            _mm512_and_si512(_mm512_srli_epi16(qh, 2), high2))};
        for (int i = 0; i < 4; ++i) sum[i][k / 4] = _mm512_dpbusd_epi32(sum[i][k / 4], w[i], bcast_word(a[blk + i], k));
      }
      for (int i = 0; i < 4; ++i) {
        const uint8_t* sc = p + kScales + 16 * (8 * h + 2 * i);
        const __m512 da = _mm512_set1_ps(a[blk + i].d);
        const __m512 dsc_lo = _mm512_mul_ps(d, s8x16_ps(sc)), dsc_hi = _mm512_mul_ps(d, s8x16_ps(sc + 16));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i][0]), _mm512_mul_ps(dsc_lo, da), acc);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i][1]), _mm512_mul_ps(dsc_hi, da), acc);
      }
    }
  }
  _mm512_mask_storeu_ps(y, mask, acc);
}

// One tile of MR activation rows against one 16-row group, whatever the type. `side`: Q6_K's
// half sums (int32, from the backend) or Q4_K's and Q4_1's act_scalars (float, made by
// packed_gemm), the first activation row's; nullptr for the other types.
template <DType kType, int MR>
void tile(const uint8_t* group, const BlockQ8A* a, const void* side, int64_t nb, float* y, int64_t ldy,
          __mmask16 mask, size_t ahead, uint8_t* saved = nullptr, bool first = false) {
  if constexpr (kType == DType::kQ4_K && MR == 1) {
    packed_row_q4_k(group, a, static_cast<const float*>(side), nb, y, mask);
  } else if constexpr (kType == DType::kQ4_K) {
    packed_tile_q4_k<MR>(group, a, static_cast<const float*>(side), nb, y, ldy, mask, ahead);
  } else if constexpr (kType == DType::kQ6_K && MR == 1) {
    packed_row_q6_k(group, a, static_cast<const int32_t*>(side), nb, y, mask);
  } else if constexpr (kType == DType::kQ6_K) {
    const auto* h = static_cast<const int32_t*>(side);
    if (saved == nullptr) return packed_tile_q6_k<MR, 0>(group, a, h, nb, y, ldy, mask, ahead, nullptr);
    if (first) return packed_tile_q6_k<MR, 1>(group, a, h, nb, y, ldy, mask, ahead, saved);
    packed_tile_q6_k<MR, 2>(group, a, h, nb, y, ldy, mask, ahead, saved);
  } else {
    packed_tile<kType, MR>(group, a, static_cast<const float*>(side), nb, y, ldy, mask, ahead);
  }
}

// Rows of the packed matrix in groups of 16, activation rows in tiles of kMR (then the rest).
template <DType kType, int kMR>
void packed_gemm(const uint8_t* packed, int64_t nw, const BlockQ8A* a, const int32_t* half, int64_t m, int64_t nb,
                 float* y, int64_t ldy) {
  const size_t group_bytes = packed_bytes(kType, kPackRows, nb);
  constexpr bool kScalars = kType == DType::kQ4_K || kType == DType::kQ4_1;
  const float* scalars = kScalars ? act_scalars(a, m * nb) : nullptr;
  auto side_of = [&](int64_t i) -> const void* {
    if constexpr (kType == DType::kQ6_K) return half + 2 * i * nb;
    if constexpr (kScalars) return scalars + 2 * i * nb;
    return nullptr;
  };
  // Q6_K's saved words (packed_tile_q6_k), made by the first tile over each group.
  uint8_t* saved = nullptr;
  if constexpr (kType == DType::kQ6_K) {
    thread_local std::vector<uint8_t> buffer;
    if (m >= kQ6SavedMinRows) {
      const size_t bytes = static_cast<size_t>(nb / 8) * kQ6SavedBlockBytes;
      if (buffer.size() < bytes) buffer.resize(bytes);
      saved = buffer.data();
    }
  }
  for (int64_t j = 0; j < nw; j += kPackRows) {
    const uint8_t* group = packed + static_cast<size_t>(j / kPackRows) * group_bytes;
    const int64_t valid = std::min<int64_t>(kPackRows, nw - j);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
    int64_t i = 0;
    const auto ahead = [&] { return i == 0 ? kPrefetchAhead : 0; };  // the first tile over the group
    for (; i + kMR <= m; i += kMR) {
      tile<kType, kMR>(group, a + i * nb, side_of(i), nb, y + i * ldy + j, ldy, mask, ahead(), saved, i == 0);
    }
    const BlockQ8A* at = a + i * nb;
    const void* ht = side_of(i);
    float* yt = y + i * ldy + j;
    switch (m - i) {
      case 15: if constexpr (kMR > 15) tile<kType, 15>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 14: if constexpr (kMR > 14) tile<kType, 14>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 13: if constexpr (kMR > 13) tile<kType, 13>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 12: if constexpr (kMR > 12) tile<kType, 12>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 11: if constexpr (kMR > 11) tile<kType, 11>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 10: if constexpr (kMR > 10) tile<kType, 10>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 9: if constexpr (kMR > 9) tile<kType, 9>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 8: if constexpr (kMR > 8) tile<kType, 8>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 7: if constexpr (kMR > 7) tile<kType, 7>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 6: if constexpr (kMR > 6) tile<kType, 6>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 5: if constexpr (kMR > 5) tile<kType, 5>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 4: if constexpr (kMR > 4) tile<kType, 4>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 3: if constexpr (kMR > 3) tile<kType, 3>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 2: if constexpr (kMR > 2) tile<kType, 2>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      case 1: tile<kType, 1>(group, at, ht, nb, yt, ldy, mask, ahead(), saved); break;
      default: break;
    }
  }
}

// Attention over f32 rows at 16 lanes.
inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xffff : (1u << n) - 1u); }

// The reduction tree of one 16-lane sum, for four vectors at once: each result is
// ((x[i] + x[i + 8]) + (x[i + 4] + x[i + 12])) paired over i = 0..3 as (0 + 2) + (1 + 3), the same
// tree for every vector, so a score does not depend on the scores computed beside it.
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4e));  // lanes (0 + 2, 1 + 3) of each quarter
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xb1));  // lane 0 of each quarter: the sum
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                         0, 0), t));
}

// Elements c.. of a cache row as 16 f32 lanes (m: the lanes that exist; q8_0 rows hold whole
// blocks, so their 16 never straddle one), and row j of a cache buffer with rows ld elements apart.
inline __m512 load16(const float* p, int64_t c, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p + c); }
inline __m512 load16(const uint16_t* p, int64_t c, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p + c));
}
inline __m512 load16(const BlockQ8_0* p, int64_t c, __mmask16) {
  const BlockQ8_0& b = p[c / kQK8_0];
  const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + c % kQK8_0))));
  return _mm512_mul_ps(v, _mm512_set1_ps(_cvtsh_ss(b.d)));
}

// The 32 values of a q8_0 cache block as two vectors of load16's values (each quant times the
// block's scale in f32), the scale converted once for both.
inline void load32_q8_0(const BlockQ8_0& b, __m512& lo, __m512& hi) {
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(b.d));
  lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)))), d);
  hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16)))), d);
}

// MR query rows x NR keys, every dot an FMA chain per lane over the dimensions.
template <typename T, int MR, int NR>
void scores_tile(const float* q, int64_t ldq, const void* k, int64_t ldk, int64_t dk, float scale, float* s,
                 int64_t lds) {
  __m512 acc[MR][4];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  const T* kr[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) kr[j] = row_at<T>(k, j, ldk);
  // The body twice (full vectors, then the tail), not a lambda: one that captured acc would keep
  // it in memory.
#define DUET_SCORES_STEP(c, m)                                                      \
  {                                                                                 \
    __m512 kv[NR];                                                                  \
    _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) kv[j] = load16(kr[j], c, m); \
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {                          \
      const __m512 qv = _mm512_maskz_loadu_ps(m, q + r * ldq + c);                  \
      _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_fmadd_ps(qv, kv[j], acc[r][j]); \
    }                                                                               \
  }
  int64_t c = 0;
  if constexpr (std::is_same_v<T, BlockQ8_0>) {
    // q8_0 keys a block at a time, its scale converted once for its two vectors (load32_q8_0:
    // load16's values): each sum takes the same FMAs in the same order as two steps of 16.
    for (; c + 32 <= dk; c += 32) {
      __m512 lo[NR], hi[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) load32_q8_0(kr[j][c / kQK8_0], lo[j], hi[j]);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const __m512 qlo = _mm512_loadu_ps(q + r * ldq + c), qhi = _mm512_loadu_ps(q + r * ldq + c + 16);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_fmadd_ps(qhi, hi[j], _mm512_fmadd_ps(qlo, lo[j], acc[r][j]));
      }
    }
  }
  for (; c + 16 <= dk; c += 16) DUET_SCORES_STEP(c, 0xffff)
  if (c < dk) DUET_SCORES_STEP(c, tail_mask(dk - c))
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
  for (; r + 4 <= rows; r += 4) scores_rows<T, 4>(q + r * ldq, ldq, k, ldk, nk, dk, scale, s + r * lds, lds);
  switch (rows - r) {
    case 3: scores_rows<T, 3>(q + r * ldq, ldq, k, ldk, nk, dk, scale, s + r * lds, lds); break;
    case 2: scores_rows<T, 2>(q + r * ldq, ldq, k, ldk, nk, dk, scale, s + r * lds, lds); break;
    case 1: scores_rows<T, 1>(q + r * ldq, ldq, k, ldk, nk, dk, scale, s + r * lds, lds); break;
    default: break;
  }
}

// e^x for 16 lanes: kernels_avx2.cpp's exp8 (Cephes' polynomial, 2^k in two halves) at 16 lanes,
// the same operations lane for lane.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.0f)), _mm512_set1_ps(88.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i ki = _mm512_cvtps_epi32(k);
  const __m512i k1 = _mm512_srai_epi32(ki, 1);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, _mm512_set1_epi32(127)), 23));
  const __m512 s2 = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ki, k1), _mm512_set1_epi32(127)), 23));
  return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

// Lanes sum over the vectors in order (the tail's missing lanes add nothing), then one tree.
float exp_sum_f32(float* x, int64_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = tail_mask(n - j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + j), mv));
    _mm512_mask_storeu_ps(x + j, mask, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mask, e));
  }
  const __m512 zero = _mm512_setzero_ps();
  return _mm_cvtss_f32(reduce4(sum, zero, zero, zero));
}

// kernels_avx2.cpp's silu_mul at 16 lanes, with the same bits: its last n % 8 elements through
// std::exp as there (the 8 lanes before them masked here, the same operations lane for lane).
void silu_mul_f32(const float* g, const float* u, float* y, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const int64_t vec = n - n % 8;
  for (int64_t j = 0; j < vec; j += 16) {
    const __mmask16 mask = tail_mask(vec - j);
    const __m512 gv = _mm512_maskz_loadu_ps(mask, g + j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    _mm512_mask_storeu_ps(y + j, mask,
                          _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(mask, u + j)));
  }
  for (int64_t i = vec; i < n; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

// MR rows x W vectors of columns in registers while the keys go by in order (4 x 4 with the
// values' loads and the broadcast weight fit the 32 registers; 3 x 8 would spill).
template <typename T, int MR, int W, bool kTail>
void values_tile(const float* p, int64_t ldp, const void* v, int64_t ldv, int64_t c0, int64_t nk, float* o,
                 int64_t ldo, bool accumulate, __mmask16 tail) {
  const __mmask16 last = kTail ? tail : 0xffff;
  // Whole q8_0 blocks: values_rows steps its columns from 0 by 256, 64 and 16, so a q8_0 tile of
  // an even number of vectors without a tail starts on a block.
  constexpr bool kWholeQ8Blocks = std::is_same_v<T, BlockQ8_0> && !kTail && W % 2 == 0;
  // A masked load with an empty mask when not accumulating: one form for both, which keeps the
  // accumulators in registers (a conditional here makes GCC mirror them on the stack).
  __m512 acc[MR][W];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int w = 0; w < W; ++w) {
      acc[r][w] = _mm512_maskz_loadu_ps(accumulate ? (w == W - 1 ? last : 0xffff) : 0, o + r * ldo + 16 * w);
    }
  for (int64_t j = 0; j < nk; ++j) {
    const T* vj = row_at<T>(v, j, ldv);
    if constexpr (MR == 1) {  // each value used once: loaded where it is used
      const __m512 pj = _mm512_set1_ps(p[j]);
      if constexpr (kWholeQ8Blocks) {
        // A q8_0 row's blocks (c0 is a multiple of 32 here): each scale converted once for its
        // two vectors, load16's values (the same products).
        const BlockQ8_0* blocks = vj + c0 / kQK8_0;
#pragma GCC unroll 8
        for (int k = 0; k < W / 2; ++k) {
          __m512 lo, hi;
          load32_q8_0(blocks[k], lo, hi);
          acc[0][2 * k] = _mm512_fmadd_ps(pj, lo, acc[0][2 * k]);
          acc[0][2 * k + 1] = _mm512_fmadd_ps(pj, hi, acc[0][2 * k + 1]);
        }
        continue;
      }
#pragma GCC unroll 16
      for (int w = 0; w < W; ++w) {
        acc[0][w] = _mm512_fmadd_ps(pj, load16(vj, c0 + 16 * w, w == W - 1 ? last : 0xffff), acc[0][w]);
      }
      continue;
    }
    __m512 vv[W];
    if constexpr (kWholeQ8Blocks) {
#pragma GCC unroll 8
      for (int k = 0; k < W / 2; ++k) load32_q8_0(vj[c0 / kQK8_0 + k], vv[2 * k], vv[2 * k + 1]);
    } else {
#pragma GCC unroll 16
      for (int w = 0; w < W; ++w) vv[w] = load16(vj, c0 + 16 * w, w == W - 1 ? last : 0xffff);
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 pj = _mm512_set1_ps(p[r * ldp + j]);
#pragma GCC unroll 16
      for (int w = 0; w < W; ++w) acc[r][w] = _mm512_fmadd_ps(pj, vv[w], acc[r][w]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int w = 0; w < W; ++w) _mm512_mask_storeu_ps(o + r * ldo + 16 * w, w == W - 1 ? last : 0xffff, acc[r][w]);
}

template <typename T, int MR>
void values_rows(const float* p, int64_t ldp, const void* v, int64_t ldv, int64_t nk, int64_t dv, float* o,
                 int64_t ldo, bool accumulate) {
  int64_t c = 0;
  // One row takes 256 columns a pass: each value row is read in two strips rather than eight of
  // 64 columns (MLA's W_UK^T product in decode, rows read from memory: strips of 64 down the
  // rows leave the hardware prefetchers behind).
  if constexpr (MR == 1) {
    for (; c + 256 <= dv; c += 256) values_tile<T, 1, 16, false>(p, ldp, v, ldv, c, nk, o + c, ldo, accumulate, 0);
  }
  for (; c + 64 <= dv; c += 64) values_tile<T, MR, 4, false>(p, ldp, v, ldv, c, nk, o + c, ldo, accumulate, 0);
  for (; c + 16 <= dv; c += 16) values_tile<T, MR, 1, false>(p, ldp, v, ldv, c, nk, o + c, ldo, accumulate, 0);
  if (c < dv) values_tile<T, MR, 1, true>(p, ldp, v, ldv, c, nk, o + c, ldo, accumulate, tail_mask(dv - c));
}

template <typename T>
void attn_values(const float* p, int64_t ldp, int64_t rows, const void* v, int64_t ldv, int64_t nk, int64_t dv,
                 float* o, int64_t ldo, bool accumulate) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) values_rows<T, 4>(p + r * ldp, ldp, v, ldv, nk, dv, o + r * ldo, ldo, accumulate);
  for (; r < rows; ++r) values_rows<T, 1>(p + r * ldp, ldp, v, ldv, nk, dv, o + r * ldo, ldo, accumulate);
}

// attn_scores for one query row per head, head h's keys at columns [h * dk, (h + 1) * dk) of
// each cache row: every key row read once, from its start to its end, all heads at once (one head
// down the rows and then the next reads each row in strips, which the hardware prefetchers follow
// far worse: measured). Four heads at a time share reduce4, so each dot has attn_scores' chain
// and tree.
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
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      // Head by head, so the row is read in address order (the prefetchers follow that best).
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        if (i >= nh) break;
        const T* kh = col_at(row, (h0 + i) * dk);
        const float* qh = q + (h0 + i) * ldq;
        int64_t c = 0;
        if constexpr (std::is_same_v<T, BlockQ8_0>) {  // a block at a time (dk is whole blocks)
          for (; c < dk; c += kQK8_0) {
            __m512 lo, hi;
            load32_q8_0(kh[c / kQK8_0], lo, hi);
            acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(qh + c), lo, acc[i]);
            acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(qh + c + 16), hi, acc[i]);
          }
        }
        for (; c + 16 <= dk; c += 16) acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(qh + c), load16(kh, c, 0xffff), acc[i]);
        if (c < dk) {
          const __mmask16 m = tail_mask(dk - c);
          acc[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qh + c), load16(kh, c, m), acc[i]);
        }
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
      const __m512 pj = _mm512_set1_ps(p[h * ldp + j]);
      int64_t c = 0;
      if constexpr (std::is_same_v<T, BlockQ8_0>) {  // a block at a time (dv is whole blocks)
        for (; c < dv; c += kQK8_0) {
          __m512 lo, hi;
          load32_q8_0(vh[c / kQK8_0], lo, hi);
          _mm512_storeu_ps(oh + c, _mm512_fmadd_ps(pj, lo, _mm512_loadu_ps(oh + c)));
          _mm512_storeu_ps(oh + c + 16, _mm512_fmadd_ps(pj, hi, _mm512_loadu_ps(oh + c + 16)));
        }
      }
      for (; c + 16 <= dv; c += 16) _mm512_storeu_ps(oh + c, _mm512_fmadd_ps(pj, load16(vh, c, 0xffff), _mm512_loadu_ps(oh + c)));
      if (c < dv) {
        const __mmask16 m = tail_mask(dv - c);
        _mm512_mask_storeu_ps(oh + c, m, _mm512_fmadd_ps(pj, load16(vh, c, m), _mm512_maskz_loadu_ps(m, oh + c)));
      }
    }
  }
}

// KV cache rows to f32 at 16 lanes (attention converts a tile's keys once for all its rows).
void dequantize_f16(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)));
  }
}

// FP8 rows (kernels_fp8.h) at 16 lanes: each code placed in a half as the AVX2 decoder places it
// (sign at 15, value bits at 7..13, all-ones value bits a half NaN), widened, and multiplied by
// 256 * the block's scale: one rounding, the reference's bits.
void dequantize_fp8(const void* src, float* y, int64_t n) {
  const auto* block = static_cast<const uint8_t*>(src);
  const __m512i keep = _mm512_set1_epi16(static_cast<short>(0xBF80)), one = _mm512_set1_epi16(0x0080),
                nan_bit = _mm512_set1_epi16(0x4000);
  for (int64_t b0 = 0; b0 < n; b0 += kQKFP8, block += sizeof(BlockFP8)) {
    float d;
    std::memcpy(&d, block, sizeof d);
    const __m512 s256 = _mm512_set1_ps(d * 256.0f);
    const int64_t len = std::min<int64_t>(kQKFP8, n - b0);
    int64_t j = 0;
    for (; j + 32 <= len; j += 32) {  // 32 codes in one register of halves
      const __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + sizeof(float) + j)));
      __m512i h = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(c, 8), 1), keep);
      h = _mm512_or_si512(h, _mm512_and_si512(_mm512_add_epi16(h, one), nan_bit));
      _mm512_storeu_ps(y + b0 + j, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), s256));
      _mm512_storeu_ps(y + b0 + j + 16, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), s256));
    }
    for (; j < len; j += 16) {
      const __mmask16 m = tail_mask(len - j);
      const __m256i c = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, block + sizeof(float) + j));
      __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(c, 8), 1), _mm512_castsi512_si256(keep));
      h = _mm256_or_si256(h, _mm256_and_si256(_mm256_add_epi16(h, _mm512_castsi512_si256(one)),
                                              _mm512_castsi512_si256(nan_bit)));
      _mm512_mask_storeu_ps(y + b0 + j, m, _mm512_mul_ps(_mm512_cvtph_ps(h), s256));
    }
  }
}

void dequantize_q8_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t c = 0; c < n; c += 16) _mm512_storeu_ps(y + c, load16(b, c, 0xffff));
}

void scale_add_f32(float* y, float a, const float* x, float b, int64_t n) {
  const __m512 av = _mm512_set1_ps(a), bv = _mm512_set1_ps(b);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), bv,
                                          _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), av)));
  }
}

// index_totals (kernels.h) with 512-bit vectors: two groups of 16 keys (a vector each) and 4
// heads at a time, each score one fma chain over the dimensions in order: the generic kernel's
// bits.
void index_totals(const float* q, int64_t heads, int64_t d, const float* keys16, int64_t n, const float* w,
                  float* total) {
  const __m512 zero = _mm512_setzero_ps();
  const int64_t groups = (n + 15) / 16;
  for (int64_t g = 0; g < groups; g += 2) {
    const float* k0 = keys16 + g * d * 16;
    const float* k1 = g + 1 < groups ? k0 + d * 16 : k0;
    __m512 t0 = zero, t1 = zero;
    int64_t h = 0;
    for (; h + 4 <= heads; h += 4) {
      __m512 a0[4] = {zero, zero, zero, zero}, a1[4] = {zero, zero, zero, zero};
      const float* qh = q + h * d;
      for (int64_t p = 0; p < d; ++p) {
        const __m512 kv0 = _mm512_loadu_ps(k0 + p * 16), kv1 = _mm512_loadu_ps(k1 + p * 16);
        for (int i = 0; i < 4; ++i) {
          const __m512 qv = _mm512_set1_ps(qh[i * d + p]);
          a0[i] = _mm512_fmadd_ps(qv, kv0, a0[i]);
          a1[i] = _mm512_fmadd_ps(qv, kv1, a1[i]);
        }
      }
      for (int i = 0; i < 4; ++i) {
        const __m512 wv = _mm512_set1_ps(w[h + i]);
        t0 = _mm512_fmadd_ps(wv, _mm512_max_ps(a0[i], zero), t0);
        t1 = _mm512_fmadd_ps(wv, _mm512_max_ps(a1[i], zero), t1);
      }
    }
    for (; h < heads; ++h) {
      __m512 a0 = zero, a1 = zero;
      for (int64_t p = 0; p < d; ++p) {
        const __m512 qv = _mm512_set1_ps(q[h * d + p]);
        a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + p * 16), a0);
        a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k1 + p * 16), a1);
      }
      const __m512 wv = _mm512_set1_ps(w[h]);
      t0 = _mm512_fmadd_ps(wv, _mm512_max_ps(a0, zero), t0);
      t1 = _mm512_fmadd_ps(wv, _mm512_max_ps(a1, zero), t1);
    }
    alignas(64) float out[32];
    _mm512_store_ps(out, t0);
    _mm512_store_ps(out + 16, t1);
    const int64_t s0 = g * 16;
    std::copy_n(out, std::min<int64_t>(32, n - s0), total + s0);
  }
}

}  // namespace

const Kernels& kernels_avx512() {
  static const Kernels k = [] {
    Kernels t = kernels_avx2();
    t.isa = Isa::kAvx512;
    t.packed_act_rows = 64;  // not the AVX2 table's 256 (kernels_avx2.cpp): slower here
    t.attn_scores[kAttnF32] = attn_scores<float>;
    t.attn_scores[kAttnF16] = attn_scores<uint16_t>;
    t.attn_scores[kAttnQ8_0] = attn_scores<BlockQ8_0>;
    t.exp_sum_f32 = exp_sum_f32;
    t.silu_mul_f32 = silu_mul_f32;
    t.index_totals = index_totals;
    t.attn_values[kAttnF32] = attn_values<float>;
    t.attn_values[kAttnF16] = attn_values<uint16_t>;
    t.attn_values[kAttnQ8_0] = attn_values<BlockQ8_0>;
    t.attn_scores_heads[kAttnF32] = attn_scores_heads<float>;
    t.attn_scores_heads[kAttnF16] = attn_scores_heads<uint16_t>;
    t.attn_scores_heads[kAttnQ8_0] = attn_scores_heads<BlockQ8_0>;
    t.attn_values_heads[kAttnF32] = attn_values_heads<float>;
    t.attn_values_heads[kAttnF16] = attn_values_heads<uint16_t>;
    t.attn_values_heads[kAttnQ8_0] = attn_values_heads<BlockQ8_0>;
    t.dequantize_f16 = dequantize_f16;
    t.dequantize_fp8 = dequantize_fp8;
    t.dequantize_kv_fp8 = dequantize_kv_fp8<dequantize_fp8, dequantize_f16>;
    t.dequantize_q8_0 = dequantize_q8_0;
    t.scale_add_f32 = scale_add_f32;
    t.quantize_q8a = quantize_q8a_x86;
    t.gemm_q4_0_q8a = qgemm_avx512<Q4_0Policy>;
    t.gemm_q8_0_q8a = qgemm_avx512<Q8_0Policy>;
    t.gemm_q4_k_q8a = qgemm_k_x86<BlockQ4_K, dot_q4_k>;
    t.gemm_q6_k_q8a = qgemm_k_x86<BlockQ6_K, dot_q6_k>;
    // Activation rows per tile: 16 for Q4_0 and Q8_0 (each unpacked block serves a 16-sequence
    // decode step); 12 for Q4_K (qgemm_bench, Zen 4, 5632 x 2048: 64 rows 4.78 -> 4.65 ms against
    // 6, 32 rows 2.44 -> 2.36, 16 rows 1.20 -> 1.17; 8 gained nothing); 6 for Q6_K, whose two scale
    // vectors a sub-block take registers too (12 gained nothing); 8 for the others.
    t.gemm_q4_0x16_q8a = packed_gemm<DType::kQ4_0, 16>;
    t.gemm_q8_0x16_q8a = packed_gemm<DType::kQ8_0, 16>;
    t.gemm_q4_kx16_q8a = packed_gemm<DType::kQ4_K, 12>;
    t.gemm_q5_0x16_q8a = packed_gemm<DType::kQ5_0, 8>;
    t.gemm_q6_kx16_q8a = packed_gemm<DType::kQ6_K, 6>;
    t.gemm_q4_1x16_q8a = packed_gemm<DType::kQ4_1, 8>;
    return t;
  }();
  return k;
}

}  // namespace duet::cpu
