// FP8 weights (DType::kFP8_E4M3_B128: e4m3 codes with the f32 scale of each 128 of a row) on the
// CPU, per instruction set. e4m3 is decoded exactly: the code's 7 value bits placed in an IEEE
// half (sign at 15, exponent and mantissa at 7..13) are the e4m3 value / 256 (e4m3's exponent
// bias is 7, half's 15; subnormals line up too), which F16C / AVX-512 / NEON widen to f32 exactly;
// S.1111.111 becomes a half NaN. The weight is then the f32 product with 256 * scale, one
// rounding: the same value as the scalar reference (dequantize_row_fp8_ref), so long as 256 *
// scale is finite (the loader refuses scales of 2^100 and more).
//
// gemv_fp8 multiplies the rows in place (a few activation rows: decode); each output has the
// bits that gemm_f32 of the same table gives on the dequantized rows (the same per-lane FMA
// chains and reduction), so the CPU backend may take either path for any m and a sequence's
// logits do not depend on it. Rows are a multiple of 8 long (as every checkpoint's are): then
// gemm_f32 has no scalar tail, whose rounding (fused or not) is the compiler's choice.
#pragma once

#include <cstddef>
#include <cstdint>

namespace duet::cpu {

// y[i * ldy + j] = dot(x row i, dequantized weight row j) for i < m, j < nw; weight rows start
// `row_bytes` apart at `w`, activation rows are k floats each, k a multiple of kFp8GemvStep.
constexpr int64_t kFp8GemvStep = 8;
using Fp8GemvFn = void (*)(const uint8_t* w, size_t row_bytes, int64_t nw, const float* x, int64_t m, int64_t k,
                           float* y, int64_t ldy);

void dequantize_fp8_generic(const void* src, float* y, int64_t n);
void gemv_fp8_generic(const uint8_t* w, size_t row_bytes, int64_t nw, const float* x, int64_t m, int64_t k, float* y,
                      int64_t ldy);
#if defined(__x86_64__)
void dequantize_fp8_avx2(const void* src, float* y, int64_t n);
void gemv_fp8_avx2(const uint8_t* w, size_t row_bytes, int64_t nw, const float* x, int64_t m, int64_t k, float* y,
                   int64_t ldy);
#endif
#if defined(__aarch64__)
void dequantize_fp8_neon(const void* src, float* y, int64_t n);
void gemv_fp8_neon(const uint8_t* w, size_t row_bytes, int64_t nw, const float* x, int64_t m, int64_t k, float* y,
                   int64_t ldy);
#endif

}  // namespace duet::cpu
