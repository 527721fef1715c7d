#include "duet/backend/cpu/packed.h"

#include <cstring>
#include <vector>

#include "duet/backend/cpu/kernels.h"
#include "duet/core/quant.h"

namespace duet::cpu {
namespace {

constexpr size_t kScaleBytes = kPackRows * sizeof(uint16_t);
// Q4_K: offsets within one packed super-block of 16 rows.
constexpr size_t kKDmin = kScaleBytes;
constexpr size_t kKScales = 2 * kScaleBytes;
constexpr size_t kKMins = kKScales + 8 * kPackRows;
constexpr size_t kKQs = kKMins + 8 * kPackRows;
constexpr size_t kKBlockBytes = kKQs + kPackRows * kQK_K / 2;
static_assert(kKBlockBytes == packed_block_bytes(DType::kQ4_K));

// Q6_K: offsets within one packed super-block of 16 rows.
constexpr size_t k6Scales = kScaleBytes;
constexpr size_t k6Ql = k6Scales + 16 * kPackRows;
constexpr size_t k6Qh = k6Ql + kPackRows * kQK_K / 2;
constexpr size_t k6BlockBytes = k6Qh + kPackRows * kQK_K / 4;
static_assert(k6BlockBytes == kPackRows * sizeof(BlockQ6_K), "packed Q6_K keeps the file's size");
static_assert(k6BlockBytes == packed_block_bytes(DType::kQ6_K));

// Q4_0/Q5_0/Q8_0: bytes of quantized values per row and block in the packed words (16 bytes of
// nibbles; Q8_0: 32 bytes), what packing adds to each byte, where they start in a file block
// (after the scale, and Q5_0's 4 bytes of fifth bits), and the packed block's size.
int value_bytes(DType type) { return type == DType::kQ8_0 ? kQK8_0 : 16; }
uint8_t value_offset(DType type) { return type == DType::kQ8_0 ? 0x80 : 0x00; }
size_t value_start(DType type) { return type == DType::kQ5_0 ? 6 : (type == DType::kQ4_1 ? 4 : 2); }
size_t block_bytes(DType type) {
  switch (type) {
    case DType::kQ4_0: return sizeof(BlockQ4_0);
    case DType::kQ4_1: return sizeof(BlockQ4_1);
    case DType::kQ5_0: return sizeof(BlockQ5_0);
    default: return sizeof(BlockQ8_0);
  }
}
// After the words: Q5_0's fifth-bit masks, Q4_1's fp16 minimums.
constexpr size_t kAfterWords = kScaleBytes + kPackRows * 16;
static_assert(packed_block_bytes(DType::kQ4_0) == kAfterWords);
static_assert(packed_block_bytes(DType::kQ4_1) == kAfterWords + kScaleBytes);
static_assert(packed_block_bytes(DType::kQ5_0) == kAfterWords + 64);
static_assert(packed_block_bytes(DType::kQ8_0) == kScaleBytes + kPackRows * kQK8_0);

// The 12 bytes that hold a Q4_K super-block's 8 scales and 8 mins, 6 bits each (the inverse of
// scale_min_k4).
void encode_scale_min_k4(const uint8_t* sc, const uint8_t* m, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
  }
}

void pack_q4_k(const uint8_t* src, size_t row_bytes, int64_t rows, int64_t nsb, uint8_t* dst, int64_t g) {
  uint8_t* out = dst + static_cast<size_t>(g * nsb) * kKBlockBytes;
  for (int64_t sb = 0; sb < nsb; ++sb, out += kKBlockBytes) {
    std::memset(out, 0, kKBlockBytes);
    for (int r = 0; r < kPackRows; ++r) {
      const int64_t row = g * kPackRows + r;
      if (row >= rows) break;
      const auto& blk = reinterpret_cast<const BlockQ4_K*>(src + static_cast<size_t>(row) * row_bytes)[sb];
      std::memcpy(out + 2 * r, &blk.d, 2);
      std::memcpy(out + kKDmin + 2 * r, &blk.dmin, 2);
      for (int s = 0; s < 8; ++s) scale_min_k4(s, blk.scales, out + kKScales + 16 * s + r, out + kKMins + 16 * s + r);
      for (int w = 0; w < 32; ++w) std::memcpy(out + kKQs + 64 * w + 4 * r, blk.qs + 4 * w, 4);
    }
  }
}

void unpack_q4_k(const uint8_t* packed, int64_t rows, int64_t nsb, uint8_t* dst, size_t row_bytes) {
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t g = row / kPackRows;
    const int r = static_cast<int>(row % kPackRows);
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* in = packed + static_cast<size_t>(g * nsb + sb) * kKBlockBytes;
      auto& blk = reinterpret_cast<BlockQ4_K*>(dst + static_cast<size_t>(row) * row_bytes)[sb];
      std::memcpy(&blk.d, in + 2 * r, 2);
      std::memcpy(&blk.dmin, in + kKDmin + 2 * r, 2);
      uint8_t sc[8], m[8];
      for (int s = 0; s < 8; ++s) {
        sc[s] = in[kKScales + 16 * s + r];
        m[s] = in[kKMins + 16 * s + r];
      }
      encode_scale_min_k4(sc, m, blk.scales);
      for (int w = 0; w < 32; ++w) std::memcpy(blk.qs + 4 * w, in + kKQs + 64 * w + 4 * r, 4);
    }
  }
}

void pack_q6_k(const uint8_t* src, size_t row_bytes, int64_t rows, int64_t nsb, uint8_t* dst, int64_t g) {
  uint8_t* out = dst + static_cast<size_t>(g * nsb) * k6BlockBytes;
  for (int64_t sb = 0; sb < nsb; ++sb, out += k6BlockBytes) {
    std::memset(out, 0, k6BlockBytes);
    for (int r = 0; r < kPackRows; ++r) {
      const int64_t row = g * kPackRows + r;
      if (row >= rows) break;
      const auto& blk = reinterpret_cast<const BlockQ6_K*>(src + static_cast<size_t>(row) * row_bytes)[sb];
      std::memcpy(out + 2 * r, &blk.d, 2);
      for (int s = 0; s < 16; ++s) std::memcpy(out + k6Scales + 16 * s + r, &blk.scales[s], 1);
      for (int w = 0; w < 32; ++w) std::memcpy(out + k6Ql + 64 * w + 4 * r, blk.ql + 4 * w, 4);
      for (int w = 0; w < 16; ++w) std::memcpy(out + k6Qh + 64 * w + 4 * r, blk.qh + 4 * w, 4);
    }
  }
}

void unpack_q6_k(const uint8_t* packed, int64_t rows, int64_t nsb, uint8_t* dst, size_t row_bytes) {
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t g = row / kPackRows;
    const int r = static_cast<int>(row % kPackRows);
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* in = packed + static_cast<size_t>(g * nsb + sb) * k6BlockBytes;
      auto& blk = reinterpret_cast<BlockQ6_K*>(dst + static_cast<size_t>(row) * row_bytes)[sb];
      std::memcpy(&blk.d, in + 2 * r, 2);
      for (int s = 0; s < 16; ++s) std::memcpy(&blk.scales[s], in + k6Scales + 16 * s + r, 1);
      for (int w = 0; w < 32; ++w) std::memcpy(blk.ql + 4 * w, in + k6Ql + 64 * w + 4 * r, 4);
      for (int w = 0; w < 16; ++w) std::memcpy(blk.qh + 4 * w, in + k6Qh + 64 * w + 4 * r, 4);
    }
  }
}

}  // namespace

bool packable(DType type) {
  return type == DType::kQ4_0 || type == DType::kQ4_1 || type == DType::kQ8_0 || type == DType::kQ5_0 ||
         type == DType::kQ4_K || type == DType::kQ6_K;
}

size_t packed_bytes(DType type, int64_t rows, int64_t nb) {
  const int64_t groups = (rows + kPackRows - 1) / kPackRows;
  if (type == DType::kQ4_K) return static_cast<size_t>(groups * (nb / 8)) * kKBlockBytes;
  if (type == DType::kQ6_K) return static_cast<size_t>(groups * (nb / 8)) * k6BlockBytes;
  return static_cast<size_t>(groups * nb) * packed_block_bytes(type);
}

void pack_rows16(DType type, const uint8_t* src, size_t row_bytes, int64_t rows, int64_t nb, uint8_t* dst,
                 int64_t group_begin, int64_t group_end) {
  if (type == DType::kQ4_K || type == DType::kQ6_K) {
    for (int64_t g = group_begin; g < group_end; ++g) {
      (type == DType::kQ4_K ? pack_q4_k : pack_q6_k)(src, row_bytes, rows, nb / 8, dst, g);
    }
    return;
  }
  const size_t pbytes = packed_block_bytes(type);
  const size_t bbytes = block_bytes(type);
  const int words = value_bytes(type) / 4;
  const uint8_t offset = value_offset(type);
  for (int64_t g = group_begin; g < group_end; ++g) {
    uint8_t* out = dst + static_cast<size_t>(g * nb) * pbytes;
    for (int64_t b = 0; b < nb; ++b, out += pbytes) {
      std::memset(out, 0, pbytes);
      for (int r = 0; r < kPackRows; ++r) {
        const int64_t row = g * kPackRows + r;
        if (row >= rows) break;
        // Every block type starts with the fp16 scale.
        const uint8_t* blk = src + static_cast<size_t>(row) * row_bytes + static_cast<size_t>(b) * bbytes;
        std::memcpy(out + 2 * r, blk, 2);
        const uint8_t* qs = blk + value_start(type);
        for (int k = 0; k < words; ++k) {
          uint8_t* word = out + kScaleBytes + 64 * k + 4 * r;
          for (int t = 0; t < 4; ++t) word[t] = static_cast<uint8_t>(qs[4 * k + t] + offset);
        }
        if (type == DType::kQ4_1) std::memcpy(out + kAfterWords + 2 * r, blk + 2, 2);
        if (type == DType::kQ5_0) {
          uint32_t qh;
          std::memcpy(&qh, blk + 2, 4);
          for (int j = 0; j < 8; ++j) {
            // Mask j < 4: values 4j + t; mask 4 + j: values 16 + 4j + t.
            const int first = j < 4 ? 4 * j : 16 + 4 * (j - 4);
            uint8_t* mask = out + kAfterWords + 8 * j;
            for (int t = 0; t < 4; ++t) {
              if ((qh >> (first + t)) & 1u) mask[(4 * r + t) / 8] |= static_cast<uint8_t>(1u << ((4 * r + t) % 8));
            }
          }
        }
      }
    }
  }
}

void unpack_rows16(DType type, const uint8_t* packed, int64_t rows, int64_t nb, uint8_t* dst, size_t row_bytes) {
  if (type == DType::kQ4_K) return unpack_q4_k(packed, rows, nb / 8, dst, row_bytes);
  if (type == DType::kQ6_K) return unpack_q6_k(packed, rows, nb / 8, dst, row_bytes);
  const size_t pbytes = packed_block_bytes(type);
  const size_t bbytes = block_bytes(type);
  const int words = value_bytes(type) / 4;
  const uint8_t offset = value_offset(type);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t g = row / kPackRows;
    const int r = static_cast<int>(row % kPackRows);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* in = packed + static_cast<size_t>(g * nb + b) * pbytes;
      uint8_t* blk = dst + static_cast<size_t>(row) * row_bytes + static_cast<size_t>(b) * bbytes;
      std::memcpy(blk, in + 2 * r, 2);
      for (int k = 0; k < words; ++k) {
        const uint8_t* word = in + kScaleBytes + 64 * k + 4 * r;
        for (int t = 0; t < 4; ++t) blk[value_start(type) + 4 * k + t] = static_cast<uint8_t>(word[t] - offset);
      }
      if (type == DType::kQ4_1) std::memcpy(blk + 2, in + kAfterWords + 2 * r, 2);
      if (type == DType::kQ5_0) {
        uint32_t qh = 0;
        for (int j = 0; j < 8; ++j) {
          const int first = j < 4 ? 4 * j : 16 + 4 * (j - 4);
          const uint8_t* mask = in + kAfterWords + 8 * j;
          for (int t = 0; t < 4; ++t) {
            if ((mask[(4 * r + t) / 8] >> ((4 * r + t) % 8)) & 1u) qh |= 1u << (first + t);
          }
        }
        std::memcpy(blk + 2, &qh, 4);
      }
    }
  }
}

const float* act_scalars(const BlockQ8A* a, int64_t n) {
  thread_local std::vector<float> ds;
  if (ds.size() < static_cast<size_t>(2 * n)) ds.resize(static_cast<size_t>(2 * n));
  for (int64_t b = 0; b < n; ++b) {
    ds[2 * b] = a[b].d;
    ds[2 * b + 1] = a[b].d * static_cast<float>(a[b].sum);
  }
  return ds.data();
}

}  // namespace duet::cpu
