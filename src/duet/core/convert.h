// Checkpoint formats the CPU computes in another block format, converted once at load (in
// memory; the files are used as they are):
//   DeepSeek-V3's FP8: e4m3 weights with one float `weight_scale_inv` per 128 x 128 block (the
//     weight is fp8 * scale) are kept as they are, in rows that carry their blocks' scales
//     (kFP8_E4M3_B128), or, where asked for (DUET_FP8=q8_0) or for block sizes other than 128, become
//     Q8_0, an int8 per value with an fp16 scale per 32, which the integer kernels run directly. Rounding to 8 bits per 32 values costs at most half a step
//     (the block's largest value / 127) plus the step's rounding to fp16, against e4m3's own
//     3-bit mantissa.
//   AutoAWQ int4 (W4A16, the GEMM layout): w = (q - zero) * scale per group of input channels
//     becomes Q4_1 (d = scale, m = -scale * zero) along each output row, exact but for m's
//     rounding to fp16 (under 1/2048 of it).
// And the other way, for writing such checkpoints (`duet make-model --format hf`): f32 weights to
// FP8 blocks and to AutoAWQ int4, as DeepSeek's and AutoAWQ's quantizers lay them out.
#pragma once

#include <cstdint>

#include "duet/core/quant.h"

namespace duet {

// `rows` x `cols` e4m3 weights (row-major) with scales [ceil(rows / 128), ceil(cols / 128)] as
// they are, into rows of FP8 blocks (DType::kFP8_E4M3_B128, row_size(.., cols) bytes each): every
// row gets its block's scale before each 128 of its codes. Nothing is rounded.
void fp8_blocks_to_rows(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols, uint8_t* out);

// `rows` x `cols` e4m3 weights (row-major) with scales [ceil(rows / block), ceil(cols / block)]
// into rows of Q8_0 (cols a multiple of 32).
void fp8_blocks_to_q8_0(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols, int64_t block,
                        BlockQ8_0* out);

// AutoAWQ tensors of a linear layer with `in` inputs and `out` outputs: qweight int32 [in, out / 8]
// and qzeros int32 [in / group, out / 8] (eight 4-bit values per int32 in AWQ's order 0, 2, 4,
// 6, 1, 3, 5, 7), scales fp16 [in / group, out]. Writes `out` rows of in / 32 Q4_1 blocks (group
// a multiple of 32).
void awq_to_q4_1(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int64_t in, int64_t out,
                 int64_t group, BlockQ4_1* rows);


// The e4m3 code nearest to v (ties to the even code), saturating at +-448; NaN becomes 0x7F.
uint8_t fp32_to_fp8_e4m3(float v);
// The value of that code: v on e4m3's grid (nearest, ties to the even code), saturating at
// +-448; NaN stays NaN. Bit operations, for activations (fp32_to_fp8_e4m3 searches a table).
float fp8_e4m3_round(float v);
// DeepSeek's activation FP8 with power-of-two scales (its inference code's act_quant with
// scale_fmt "ue8m0"), in place: each block of `block` values of x [n] (the last may be shorter)
// gets s = 2^ceil(log2(max(amax, 1e-4) * (1 / 448))) in f32, amax its largest magnitude, and
// each value becomes s * fp8_e4m3_round(x / s): the values its e4m3 codes and scale stand for.
void fp8_act_round_trip(float* x, int64_t n, int64_t block);
// The code of fp8_e4m3_round(v) (its sign kept, -0 too): the same code as fp32_to_fp8_e4m3, by
// bit operations; NaN becomes 0x7F.
uint8_t fp8_e4m3_encode(float v);
// A row of the fp8 KV cache (KvDtype::kFp8) of `n` values: each whole 128 values a BlockFP8 whose
// scale is fp8_act_round_trip's s for them and whose codes are fp8_e4m3_encode(x / s); the n % 128
// values after them as IEEE halves (round to nearest even). fp8_kv_row_bytes(n) bytes.
size_t fp8_kv_row_bytes(int64_t n);
void quantize_row_fp8_kv_ref(const float* x, void* y, int64_t n);
// Its values: s * e4m3 value per block (exact: s is a power of two), the halves widened; equal to
// x after fp8_act_round_trip(x, whole blocks, 128) and the rest's rounding to f16.
void dequantize_row_fp8_kv_ref(const void* y, float* x, int64_t n);
// The Walsh-Hadamard transform of x [n] in place (n a power of two), unnormalized, in Sylvester's
// (natural) order: butterflies (x[j], x[j + h]) -> (x[j] + x[j + h], x[j] - x[j + h]) for h = 1, 2,
// 4, ... < n, in f32, as DeepSeek's reference transform does.
void hadamard_transform(float* x, int64_t n);
// `rows` x `cols` f32 weights (row-major) as e4m3 codes `q` [rows, cols] with one scale per
// block x block tile, scale_inv [ceil(rows / block), ceil(cols / block)], such that weight ~
// fp8 * scale: each tile's largest magnitude maps to 448 (an all-zero tile gets scale 1).
void fp8_blocks_from_f32(const float* w, int64_t rows, int64_t cols, int64_t block, uint8_t* q, float* scale_inv);
// A linear layer's f32 weight [out, in] (row-major, PyTorch's order) in AutoAWQ's GEMM layout
// (what awq_to_q4_1 reads): per group of `group` inputs and per output, scale = (max - min) / 15
// rounded to fp16, zero = round(-min / scale) in [0, 15], q = clamp(round(w / scale) + zero).
// qweight [in, out / 8], qzeros [in / group, out / 8], scales [in / group, out].
void awq_from_f32(const float* w, int64_t in, int64_t out, int64_t group, int32_t* qweight, int32_t* qzeros,
                  uint16_t* scales);

}  // namespace duet
