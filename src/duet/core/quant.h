// Half-precision conversions and the block-quantized formats, defined once. The reference
// (scalar) quantize and dequantize functions here are the spec that SIMD kernels are tested
// against; they are bit-compatible with the GGUF formats.
#pragma once

#include <cstdint>
#include <cstring>

#include "duet/core/dtype.h"

namespace duet {

// IEEE half <-> float, round to nearest even.
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);

// bfloat16 <-> float, round to nearest even (NaN kept quiet).
inline float bf16_to_fp32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint16_t fp32_to_bf16(float f);

constexpr int kQK4_0 = 32;
constexpr int kQK8_0 = 32;

struct BlockQ4_0 {
  uint16_t d;                 // fp16 scale
  uint8_t qs[kQK4_0 / 2];     // element j in the low nibble of qs[j], element j+16 in the high
};
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block must be 18 bytes");

struct BlockQ8_0 {
  uint16_t d;                 // fp16 scale
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must be 34 bytes");

// K-quants: super-blocks of 256 elements (GGUF Q4_K, Q5_K, Q6_K).
constexpr int kQK_K = 256;
constexpr int kKScaleSize = 12;

struct BlockQ4_K {
  uint16_t d;                   // fp16 super-block scale of the 6-bit scales
  uint16_t dmin;                // fp16 super-block scale of the 6-bit mins
  uint8_t scales[kKScaleSize];  // 8 scales and 8 mins, 6 bits each, packed
  uint8_t qs[kQK_K / 2];        // 4-bit quants
};
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block must be 144 bytes");

struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];  // high bit of each quant
  uint8_t qs[kQK_K / 2];  // low 4 bits
};
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block must be 176 bytes");

struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];       // low 4 bits
  uint8_t qh[kQK_K / 4];       // high 2 bits
  int8_t scales[kQK_K / 16];   // one 8-bit scale per 16 elements
  uint16_t d;                  // fp16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block must be 210 bytes");

// The j-th (0..7) 6-bit scale and min packed in a Q4_K/Q5_K super-block's `scales`.
void scale_min_k4(int j, const uint8_t* scales, uint8_t* scale, uint8_t* min);
void dequantize_row_q4_k_ref(const BlockQ4_K* x, float* y, int64_t n);
void dequantize_row_q5_k_ref(const BlockQ5_K* x, float* y, int64_t n);
void dequantize_row_q6_k_ref(const BlockQ6_K* x, float* y, int64_t n);

// Reference K-quant quantization (quant_k.cpp), `n` a multiple of 256: byte for byte what
// llama.cpp writes without an importance matrix (its quantize_row_q{4,5,6}_K_ref).
void quantize_row_q4_k_ref(const float* x, BlockQ4_K* y, int64_t n);
void quantize_row_q5_k_ref(const float* x, BlockQ5_K* y, int64_t n);
void quantize_row_q6_k_ref(const float* x, BlockQ6_K* y, int64_t n);

// The other legacy 32-element formats: llama.cpp's quantizer falls back to them for rows that are
// not a multiple of 256 (a Q4_K_M file of DeepSeek-Coder-1.3B has Q5_0). Q4_1 (int4 with a
// minimum per 32) is also what AWQ int4 becomes, so it is quantized too; Q5_0 and Q5_1 are read
// only.
struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 minimum
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block must be 20 bytes");

struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // fifth bit of each quant (bit j for element j)
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block must be 22 bytes");

struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block must be 24 bytes");

// Q4_1 per block: d = (max - min) / 15, m = min, q = round((x - min) / d) (GGML's reference).
void quantize_row_q4_1_ref(const float* x, BlockQ4_1* y, int64_t n);
void dequantize_row_q4_1_ref(const BlockQ4_1* x, float* y, int64_t n);
void dequantize_row_q5_0_ref(const BlockQ5_0* x, float* y, int64_t n);
void dequantize_row_q5_1_ref(const BlockQ5_1* x, float* y, int64_t n);

// DeepSeek's FP8 weights in memory (DType::kFP8_E4M3_B128): per 128 values of a row, the f32
// scale of their checkpoint block (`weight_scale_inv`: the weight is e4m3 value * scale), then
// the 128 e4m3 codes; a row's last block may be shorter (the scale, then the codes left).
constexpr int kQKFP8 = 128;
struct BlockFP8 {
  float d;
  uint8_t qs[kQKFP8];
};
static_assert(sizeof(BlockFP8) == 132, "FP8 block must be 132 bytes");

// e4m3 (the "fn" variant: no infinities, S.1111.111 is NaN), as DeepSeek's checkpoints store it.
float fp8_e4m3_to_fp32(uint8_t v);
// Row of `n` FP8 values: each value decoded exactly and multiplied by its block's scale in f32
// (one rounding, the f32 product of the two).
void dequantize_row_fp8_ref(const void* x, float* y, int64_t n);

// Reference conversions of `n` elements (n a multiple of the type's block size).
void quantize_row_q4_0_ref(const float* x, BlockQ4_0* y, int64_t n);
void quantize_row_q8_0_ref(const float* x, BlockQ8_0* y, int64_t n);
void dequantize_row_q4_0_ref(const BlockQ4_0* x, float* y, int64_t n);
void dequantize_row_q8_0_ref(const BlockQ8_0* x, float* y, int64_t n);

// Rows of Q4_0, Q5_0 or Q8_0 blocks as Q8_0 blocks of the same values: each block keeps its scale
// and its quants become the signed integers they stand for (q - 8, q - 16), which int8 holds, so
// every element decodes to the same float. Returns false (writing nothing) for any other type.
bool convert_row_to_q8_0_exact(DType type, const void* src, BlockQ8_0* dst, int64_t n);

// Converts `n` floats into `type` (f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q5_k, q6_k) at `dst`
// (row_size(type, n) bytes).
void quantize_row_ref(DType type, const float* x, void* dst, int64_t n);
// Converts `n` elements of `type` (any computable type, K-quants included) at `src` to floats.
void dequantize_row_ref(DType type, const void* src, float* y, int64_t n);

}  // namespace duet
