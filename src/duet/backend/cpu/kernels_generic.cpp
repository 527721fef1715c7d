// Scalar reference kernels: the spec every SIMD kernel is tested against. Never optimized.
#include <cmath>

#include "duet/backend/cpu/kernels.h"
#include "duet/core/quant.h"

namespace duet::cpu {
namespace {

void dequantize_f16(const void* src, float* y, int64_t n) { dequantize_row_ref(DType::kF16, src, y, n); }
void dequantize_bf16(const void* src, float* y, int64_t n) { dequantize_row_ref(DType::kBF16, src, y, n); }
void dequantize_q8_0(const void* src, float* y, int64_t n) { dequantize_row_ref(DType::kQ8_0, src, y, n); }
void dequantize_q4_0(const void* src, float* y, int64_t n) { dequantize_row_ref(DType::kQ4_0, src, y, n); }
void dequantize_q4_1(const void* src, float* y, int64_t n) { dequantize_row_ref(DType::kQ4_1, src, y, n); }
void dequantize_q5_0(const void* src, float* y, int64_t n) { dequantize_row_ref(DType::kQ5_0, src, y, n); }
void dequantize_q5_1(const void* src, float* y, int64_t n) { dequantize_row_ref(DType::kQ5_1, src, y, n); }
void dequantize_q4_k(const void* src, float* y, int64_t n) { dequantize_row_ref(DType::kQ4_K, src, y, n); }
void dequantize_q5_k(const void* src, float* y, int64_t n) { dequantize_row_ref(DType::kQ5_K, src, y, n); }
void dequantize_q6_k(const void* src, float* y, int64_t n) { dequantize_row_ref(DType::kQ6_K, src, y, n); }

float dot_f32(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void gemm_f32(const float* w, int64_t nw, const float* x, int64_t m, int64_t k, float* y, int64_t ldy) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < nw; ++j) y[i * ldy + j] = dot_f32(x + i * k, w + j * k, k);
  }
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void rms_norm_f32(const float* x, const float* w, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void silu_mul_f32(const float* g, const float* u, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace

const Kernels& kernels_generic() {
  static const Kernels k{
      Isa::kGeneric,   dequantize_f16,  dequantize_bf16, dequantize_q8_0, dequantize_q4_0,
      dequantize_q4_1, dequantize_q5_0, dequantize_q5_1, dequantize_q4_k, dequantize_q5_k,
      dequantize_q6_k, gemm_f32,        dot_f32,         axpy_f32,        rms_norm_f32,
      silu_mul_f32,
  };
  return k;
}

}  // namespace duet::cpu
