// Tensor element types. The numeric values are GGML's type ids, so a GGUF tensor's type field maps
// to this enum directly; names and block geometry follow the GGUF specification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace duet {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  // duet's own, in memory only (never in a GGUF file): DeepSeek's FP8 weights as they are, e4m3
  // codes with the f32 scale of their 128 x 128 checkpoint block. A row is blocks of 128 values
  // (BlockFP8: the scale, then 128 codes; quant.h), so any row range (an expert, a head) carries
  // its scales; a row whose length is not a multiple of 128 ends in a shorter block (the scale
  // and the remaining codes). One byte per weight plus 4 bytes per 128 of a row.
  kFP8_E4M3_B128 = 1000,
};

struct DTypeTraits {
  std::string_view name;   // lower-case, as `duet inspect` prints it: "q4_0", "bf16"
  int64_t block_size;      // elements per block (1 for plain types)
  size_t type_size;        // bytes per block
  bool can_compute;        // duet has kernels for it (dequantize + matmul)
};

// Traits of a known type, or nullopt for an id this build does not know.
std::optional<DTypeTraits> dtype_traits(uint32_t id);
// Traits of a known type; throws kInvalidArgument for an unknown one.
const DTypeTraits& traits(DType type);
std::string_view dtype_name(DType type);
// Parses "f32", "q8_0", ... (case-insensitive); nullopt when unknown.
std::optional<DType> parse_dtype(std::string_view name);

// Bytes of one row of `n` elements; `n` must be a multiple of the block size (but for
// kFP8_E4M3_B128, whose last block may be shorter).
size_t row_size(DType type, int64_t n);

}  // namespace duet
