#include "duet/backend/cpu/packed.h"

#include <cstring>

#include "duet/core/quant.h"

namespace duet::cpu {
namespace {

constexpr size_t kScaleBytes = kPackRows * sizeof(uint16_t);

// Bytes of quantized values per row and block in the packed words (Q4_0: 16 bytes of nibbles;
// Q8_0: 32 bytes), and what packing adds to each byte.
int value_bytes(DType type) { return type == DType::kQ4_0 ? kQK4_0 / 2 : kQK8_0; }
uint8_t value_offset(DType type) { return type == DType::kQ8_0 ? 0x80 : 0x00; }
size_t block_bytes(DType type) { return type == DType::kQ4_0 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0); }

}  // namespace

bool packable(DType type) { return type == DType::kQ4_0 || type == DType::kQ8_0; }

size_t packed_block_bytes(DType type) { return kScaleBytes + static_cast<size_t>(kPackRows * value_bytes(type)); }

size_t packed_bytes(DType type, int64_t rows, int64_t nb) {
  const int64_t groups = (rows + kPackRows - 1) / kPackRows;
  return static_cast<size_t>(groups * nb) * packed_block_bytes(type);
}

void pack_rows16(DType type, const uint8_t* src, size_t row_bytes, int64_t rows, int64_t nb, uint8_t* dst,
                 int64_t group_begin, int64_t group_end) {
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
        // Both block types start with the fp16 scale, then the values.
        const uint8_t* blk = src + static_cast<size_t>(row) * row_bytes + static_cast<size_t>(b) * bbytes;
        std::memcpy(out + 2 * r, blk, 2);
        const uint8_t* qs = blk + 2;
        for (int k = 0; k < words; ++k) {
          uint8_t* word = out + kScaleBytes + 64 * k + 4 * r;
          for (int t = 0; t < 4; ++t) word[t] = static_cast<uint8_t>(qs[4 * k + t] + offset);
        }
      }
    }
  }
}

void unpack_rows16(DType type, const uint8_t* packed, int64_t rows, int64_t nb, uint8_t* dst, size_t row_bytes) {
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
        for (int t = 0; t < 4; ++t) blk[2 + 4 * k + t] = static_cast<uint8_t>(word[t] - offset);
      }
    }
  }
}

}  // namespace duet::cpu
