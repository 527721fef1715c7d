// AMX (Intel's tile matrix unit, AMX-INT8) for the packed integer GEMM of prefill and batched
// steps; everything else, and any activation rows short of a full tile, comes from the AVX-512
// table. Compiled alone with these flags; called only after CPUID says the machine has AMX and the
// kernel has granted this process the tile state (isa.cpp).
//
// One tile product takes 16 activation rows by one 32-value block against the 16 weight rows of a
// packed group: A is the activations' int8 values (16 rows of 32 bytes, read in place from the Q8A
// blocks with their stride), B the group's block as 8 lines of 64 bytes, line k holding values
// 4k .. 4k + 3 of each of the 16 rows (packed.h's word k, already the layout the unit wants), C the
// 16 x 16 int32 sums. The weights are unpacked to signed bytes once per group and chunk of blocks
// and serve every tile of activation rows; each block's sums are then scaled and added in f32
// exactly as the AVX-512 tile does (the same integer, the same float operations in the same
// order), so a row's result has the same bits whichever kernel ran it and however the batch is
// cut.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "duet/backend/cpu/kernels.h"
#include "duet/backend/cpu/packed.h"

namespace duet::cpu {
namespace {

constexpr int kTileRows = 16;    // activation rows per tile product
constexpr int64_t kChunk = 64;   // blocks of 32 values unpacked at a time: 32 KB of weights
constexpr int kLineBytes = 64;   // one line of B: 4 values of each of 16 weight rows
constexpr int kBlockLines = 8;   // 32 values

// The tile configuration (the layout LDTILECFG reads).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0, tmm1: sums (16 x 16 int32); tmm2, tmm3: activations (16 rows of `a_bytes`); tmm4, tmm5:
// weights (a_bytes / 4 lines of 64 bytes). Whole blocks take a_bytes 32 and one register of each;
// Q6_K, whose two halves of a block have scales of their own, takes 16 bytes on both.
void configure(int a_bytes) {
  TileConfig c;
  for (int t = 0; t < 2; ++t) {
    c.rows[t] = kTileRows;
    c.colsb[t] = 64;
    c.rows[2 + t] = kTileRows;
    c.colsb[2 + t] = static_cast<uint16_t>(a_bytes);
    c.rows[4 + t] = static_cast<uint8_t>(a_bytes / 4);
    c.colsb[4 + t] = kLineBytes;
  }
  _tile_loadconfig(&c);
}

// One thread's unpacked chunk: the lines of each block as signed bytes, and per block the vectors
// its sums are scaled by (scale: d, or d times the sub-block's scale; extra: Q4_1's minimums,
// Q4_K's dmin times the sub-block's min, Q6_K's scale of the second half).
struct Chunk {
  alignas(64) int8_t lines[kChunk * kBlockLines * kLineBytes];
  alignas(64) float scale[kChunk * 16];
  alignas(64) float extra[kChunk * 16];
  alignas(64) int32_t sums[2 * 16 * 16];  // a block's (Q6_K: and its second halves')
};
thread_local Chunk t_chunk;

inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m512 half16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 u8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 i8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Blocks [c0, c0 + n) of a packed group into t_chunk (packed.h has the layouts).
template <DType kType>
void unpack(const uint8_t* group, int64_t c0, int64_t n) {
  Chunk& c = t_chunk;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = c0 + i;
    int8_t* out = c.lines + i * kBlockLines * kLineBytes;
    const auto put = [&](int k, __m512i v) { _mm512_storeu_si512(out + k * kLineBytes, v); };
    if constexpr (kType == DType::kQ8_0) {
      const uint8_t* p = group + static_cast<size_t>(b) * packed_block_bytes(kType);
      _mm512_store_ps(c.scale + 16 * i, half16(p));
      for (int k = 0; k < 8; ++k) put(k, _mm512_xor_si512(load512(p + 32 + 64 * k), _mm512_set1_epi8(-128)));
    } else if constexpr (kType == DType::kQ4_0 || kType == DType::kQ5_0 || kType == DType::kQ4_1) {
      const uint8_t* p = group + static_cast<size_t>(b) * packed_block_bytes(kType);
      _mm512_store_ps(c.scale + 16 * i, half16(p));
      if constexpr (kType == DType::kQ4_1) _mm512_store_ps(c.extra + 16 * i, half16(p + 32 + 256));
      uint64_t high[8] = {};
      if constexpr (kType == DType::kQ5_0) std::memcpy(high, p + 32 + 256, sizeof(high));
      const __m512i offset = _mm512_set1_epi8(kType == DType::kQ4_0 ? 8 : (kType == DType::kQ5_0 ? 16 : 0));
      for (int k = 0; k < 4; ++k) {
        const __m512i z = load512(p + 32 + 64 * k);
        __m512i lo = _mm512_and_si512(z, low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), low4);
        if constexpr (kType == DType::kQ5_0) {
          lo = _mm512_mask_add_epi8(lo, high[k], lo, _mm512_set1_epi8(16));
          hi = _mm512_mask_add_epi8(hi, high[4 + k], hi, _mm512_set1_epi8(16));
        }
        put(k, _mm512_sub_epi8(lo, offset));
        put(4 + k, _mm512_sub_epi8(hi, offset));
      }
    } else if constexpr (kType == DType::kQ4_K) {
      constexpr size_t kScales = 64, kMins = kScales + 128, kQs = kMins + 128;
      const uint8_t* p = group + static_cast<size_t>(b / 8) * packed_block_bytes(kType);
      const int s = static_cast<int>(b % 8);
      _mm512_store_ps(c.scale + 16 * i, _mm512_mul_ps(half16(p), u8x16(p + kScales + 16 * s)));
      _mm512_store_ps(c.extra + 16 * i, _mm512_mul_ps(half16(p + 32), u8x16(p + kMins + 16 * s)));
      const uint8_t* q = p + kQs + static_cast<size_t>(s / 2) * 8 * 64;
      for (int k = 0; k < 8; ++k) {
        const __m512i z = load512(q + 64 * k);
        put(k, _mm512_and_si512((s & 1) ? _mm512_srli_epi16(z, 4) : z, low4));
      }
    } else if constexpr (kType == DType::kQ6_K) {
      constexpr size_t kScales = 32, kQl = kScales + 256, kQh = kQl + 2048;
      const uint8_t* p = group + static_cast<size_t>(b / 8) * packed_block_bytes(kType);
      const int sub = static_cast<int>(b % 8), h = sub / 4, j = sub % 4;
      const __m512 d = half16(p);
      const int g = 8 * h + 2 * j;
      _mm512_store_ps(c.scale + 16 * i, _mm512_mul_ps(d, i8x16(p + kScales + 16 * g)));
      _mm512_store_ps(c.extra + 16 * i, _mm512_mul_ps(d, i8x16(p + kScales + 16 * (g + 1))));
      const __m128i lo_shift = _mm_cvtsi32_si128(4 * (j >> 1));
      for (int k = 0; k < 8; ++k) {
        const __m512i ql = load512(p + kQl + 64 * (16 * h + 8 * (j & 1) + k));
        const __m512i qh = load512(p + kQh + 64 * (8 * h + k));
        const __m512i lo = _mm512_and_si512(_mm512_srl_epi16(ql, lo_shift), low4);
        const __m512i hi = j < 2 ? _mm512_slli_epi16(qh, 4 - 2 * j) : _mm512_srli_epi16(qh, 2 * j - 4);
        put(k, _mm512_sub_epi8(_mm512_or_si512(lo, _mm512_and_si512(hi, _mm512_set1_epi8(0x30))), _mm512_set1_epi8(32)));
      }
    }
  }
}

// The integer sums of one block of the unpacked chunk (weights `w`) for 16 activation rows (`ab`,
// rows `stride` bytes apart) into sums[0 .. 256) (Q6_K's second halves into sums[256 .. 512)).
// (The tile intrinsics take register numbers as literals.) Issuing the next block's products
// before scaling this one's sums, on the second set of registers, measured no faster: on the
// machine measured the tile unit and the vector scaling do not overlap.
template <DType kType>
inline void block_sums(const BlockQ8A* ab, int64_t stride, const int8_t* w, int32_t* sums) {
  if constexpr (kType == DType::kQ6_K) {
    _tile_loadd(2, ab->qs, stride);
    _tile_loadd(3, ab->qs + 16, stride);
    _tile_loadd(4, w, kLineBytes);
    _tile_loadd(5, w + 4 * kLineBytes, kLineBytes);
    _tile_zero(0);
    _tile_zero(1);
    _tile_dpbssd(0, 2, 4);
    _tile_dpbssd(1, 3, 5);
    _tile_stored(0, sums, 64);
    _tile_stored(1, sums + 256, 64);
  } else {
    _tile_loadd(2, ab->qs, stride);
    _tile_loadd(4, w, kLineBytes);
    _tile_zero(0);
    _tile_dpbssd(0, 2, 4);
    _tile_stored(0, sums, 64);
  }
}

// A block's sums (at `sums`) scaled into acc, one vector of 16 outputs per activation row (`ab`:
// the first row's block, the others nb blocks apart).
template <DType kType>
inline void scale_block(const BlockQ8A* ab, int64_t nb, const int32_t* sums, const float* scale_p,
                        const float* extra_p, __m512* acc) {
  const __m512 scale = _mm512_load_ps(scale_p);
  const __m512 extra = _mm512_load_ps(extra_p);
  for (int r = 0; r < kTileRows; ++r) {
    const BlockQ8A& x = ab[r * nb];
    const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(sums + 16 * r));
    acc[r] = _mm512_fmadd_ps(s, _mm512_mul_ps(scale, _mm512_set1_ps(x.d)), acc[r]);
    if constexpr (kType == DType::kQ4_1) {
      acc[r] = _mm512_fmadd_ps(extra, _mm512_set1_ps(x.d * static_cast<float>(x.sum)), acc[r]);
    } else if constexpr (kType == DType::kQ4_K) {
      acc[r] = _mm512_fnmadd_ps(extra, _mm512_set1_ps(x.d * static_cast<float>(x.sum)), acc[r]);
    } else if constexpr (kType == DType::kQ6_K) {
      const __m512 s1 = _mm512_cvtepi32_ps(_mm512_load_si512(sums + 256 + 16 * r));
      acc[r] = _mm512_fmadd_ps(s1, _mm512_mul_ps(extra, _mm512_set1_ps(x.d)), acc[r]);
    }
  }
}

// 16 activation rows (from `a`, rows nb blocks apart) by blocks [c0, c0 + n) of the unpacked
// chunk, added to acc, a block at a time.
template <DType kType>
void tile_rows(const BlockQ8A* a, int64_t nb, int64_t c0, int64_t n, __m512* acc) {
  Chunk& c = t_chunk;
  const int64_t stride = nb * static_cast<int64_t>(sizeof(BlockQ8A));
  for (int64_t i = 0; i < n; ++i) {
    block_sums<kType>(a + c0 + i, stride, c.lines + i * kBlockLines * kLineBytes, c.sums);
    scale_block<kType>(a + c0 + i, nb, c.sums, c.scale + 16 * i, c.extra + 16 * i, acc);
  }
}

// Fewer activation rows than this go to the AVX-512 kernel whole: one tile's worth does not repay
// unpacking the weights for the unit (16 rows, dsc-1.3b Q4_0 on 2 threads: 193 tokens/s on the
// unit against 225 on the vector kernel; 32 rows: 254 against 238).
constexpr int64_t kMinRows = 2 * kTileRows;

// The packed GEMM (PackedGemmFn): whole tiles of 16 activation rows on the tile unit, the rest of
// the rows through the AVX-512 kernel.
template <DType kType>
void amx_gemm(const uint8_t* packed, int64_t nw, const BlockQ8A* a, const int32_t* half, int64_t m, int64_t nb,
              float* y, int64_t ldy) {
  static const PackedGemmFn rest = packed_gemm_fn(kernels_avx512(), kType);
  const int64_t full = m < kMinRows ? 0 : m / kTileRows * kTileRows;
  if (full > 0) {
    configure(kType == DType::kQ6_K ? 16 : 32);
    const size_t group_bytes = packed_bytes(kType, kPackRows, nb);
    for (int64_t j = 0; j < nw; j += kPackRows) {
      const uint8_t* group = packed + static_cast<size_t>(j / kPackRows) * group_bytes;
      const __mmask16 mask = static_cast<__mmask16>((1u << std::min<int64_t>(kPackRows, nw - j)) - 1u);
      for (int64_t c0 = 0; c0 < nb; c0 += kChunk) {
        const int64_t n = std::min(kChunk, nb - c0);
        unpack<kType>(group, c0, n);
        for (int64_t i = 0; i < full; i += kTileRows) {
          float* yi = y + i * ldy + j;
          __m512 acc[kTileRows];
          for (int r = 0; r < kTileRows; ++r) {
            acc[r] = c0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, yi + r * ldy);
          }
          tile_rows<kType>(a + i * nb, nb, c0, n, acc);
          for (int r = 0; r < kTileRows; ++r) _mm512_mask_storeu_ps(yi + r * ldy, mask, acc[r]);
        }
      }
    }
    _tile_release();
  }
  if (full < m) {
    rest(packed, nw, a + full * nb, kType == DType::kQ6_K ? half + 2 * full * nb : nullptr, m - full, nb,
         y + full * ldy, ldy);
  }
}

}  // namespace

const Kernels& kernels_amx() {
  static const Kernels k = [] {
    Kernels t = kernels_avx512();
    t.isa = Isa::kAmx;
    t.packed_act_rows = 128;
    t.gemm_q4_0x16_q8a = amx_gemm<DType::kQ4_0>;
    t.gemm_q8_0x16_q8a = amx_gemm<DType::kQ8_0>;
    t.gemm_q4_kx16_q8a = amx_gemm<DType::kQ4_K>;
    t.gemm_q5_0x16_q8a = amx_gemm<DType::kQ5_0>;
    t.gemm_q6_kx16_q8a = amx_gemm<DType::kQ6_K>;
    t.gemm_q4_1x16_q8a = amx_gemm<DType::kQ4_1>;
    return t;
  }();
  return k;
}

}  // namespace duet::cpu
