// Scalar reference kernels: the spec every SIMD kernel is tested against. Never optimized.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "duet/backend/cpu/kernels.h"
#include "duet/core/quant.h"

namespace duet::cpu {
namespace {

#include "duet/backend/cpu/cache_rows.inc"

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

void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

// Element c of a cache row as f32 (exact for every type).
inline float elem(const float* p, int64_t c) { return p[c]; }
inline float elem(const uint16_t* p, int64_t c) { return fp16_to_fp32(p[c]); }
inline float elem(const BlockQ8_0* p, int64_t c) {
  return static_cast<float>(static_cast<double>(fp16_to_fp32(p[c / kQK8_0].d)) * p[c / kQK8_0].qs[c % kQK8_0]);
}

template <typename T>
void attn_scores(const float* q, int64_t ldq, int64_t rows, const void* k, int64_t ldk, int64_t nk, int64_t dk,
                 float scale, float* s, int64_t lds) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < nk; ++j) {
      const T* kj = row_at<T>(k, j, ldk);
      float sum = 0.0f;
      for (int64_t c = 0; c < dk; ++c) sum = std::fma(q[r * ldq + c], elem(kj, c), sum);
      s[r * lds + j] = sum * scale;
    }
  }
}

float exp_sum_f32(float* x, int64_t n, float m) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - m);
    sum += x[j];
  }
  return sum;
}

template <typename T>
void attn_values(const float* p, int64_t ldp, int64_t rows, const void* v, int64_t ldv, int64_t nk, int64_t dv,
                 float* o, int64_t ldo, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < dv; ++c) {
      float acc = accumulate ? o[r * ldo + c] : 0.0f;
      for (int64_t j = 0; j < nk; ++j) acc = std::fma(p[r * ldp + j], elem(row_at<T>(v, j, ldv), c), acc);
      o[r * ldo + c] = acc;
    }
  }
}

void scale_add_f32(float* y, float a, const float* x, float b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(x[i], b, y[i] * a);
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

void quantize_q8a(const float* x, BlockQ8A* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK8A; ++b) {
    const float* xb = x + b * kQK8A;
    float amax = 0.0f;
    for (int j = 0; j < kQK8A; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < kQK8A; ++j) {
      const int q = static_cast<int>(std::nearbyint(xb[j] * id));
      y[b].qs[j] = static_cast<int8_t>(q);
      sum += q;
    }
    y[b].d = d;
    y[b].sum = sum;
  }
}

// One dot product: per block, the exact integer sum times both scales.
template <typename Block, typename Quant>
float qdot(const Block* w, const BlockQ8A* a, int64_t nb, Quant quant) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < kQK8A; ++j) isum += quant(w[b], j) * a[b].qs[j];
    sum += fp16_to_fp32(w[b].d) * a[b].d * static_cast<float>(isum);
  }
  return sum;
}

template <typename Block, typename Quant>
void qgemm(const uint8_t* w, size_t row_bytes, int64_t nw, const BlockQ8A* a, int64_t m, int64_t nb, float* y,
           int64_t ldy, Quant quant) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < nw; ++j) {
      y[i * ldy + j] = qdot(reinterpret_cast<const Block*>(w + static_cast<size_t>(j) * row_bytes), a + i * nb, nb, quant);
    }
  }
}

void gemm_q4_0_q8a(const uint8_t* w, size_t row_bytes, int64_t nw, const BlockQ8A* a, int64_t m, int64_t nb, float* y,
                   int64_t ldy) {
  qgemm<BlockQ4_0>(w, row_bytes, nw, a, m, nb, y, ldy, [](const BlockQ4_0& b, int j) {
    return j < 16 ? (b.qs[j] & 0x0f) - 8 : (b.qs[j - 16] >> 4) - 8;
  });
}

// K-quants: one weight super-block of 256 against 8 activation blocks of 32.
float qdot_q4_k(const BlockQ4_K* w, const BlockQ8A* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t s = 0; s < nb / 8; ++s) {
    const float d = fp16_to_fp32(w[s].d);
    const float dmin = fp16_to_fp32(w[s].dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      scale_min_k4(j, w[s].scales, &sc, &m);
      const BlockQ8A& ab = a[s * 8 + j];
      const uint8_t* q = w[s].qs + 32 * (j / 2);
      int32_t isum = 0;
      for (int e = 0; e < 32; ++e) isum += (j % 2 == 0 ? q[e] & 0x0f : q[e] >> 4) * ab.qs[e];
      sum += d * sc * ab.d * static_cast<float>(isum) - dmin * m * ab.d * static_cast<float>(ab.sum);
    }
  }
  return sum;
}

float qdot_q6_k(const BlockQ6_K* w, const BlockQ8A* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t s = 0; s < nb / 8; ++s) {
    const float d = fp16_to_fp32(w[s].d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w[s].ql + 64 * h;
      const uint8_t* qh = w[s].qh + 32 * h;
      const int8_t* sc = w[s].scales + 8 * h;
      for (int k = 0; k < 4; ++k) {  // a quarter of 32 values: ql nibble (k & 1, k >> 1), qh bits 2k
        const BlockQ8A& ab = a[s * 8 + 4 * h + k];
        int32_t isum[2] = {0, 0};
        for (int e = 0; e < 32; ++e) {
          const int low = (ql[e + 32 * (k & 1)] >> (4 * (k >> 1))) & 0x0f;
          const int q = (low | (((qh[e] >> (2 * k)) & 3) << 4)) - 32;
          isum[e / 16] += q * ab.qs[e];
        }
        sum += d * ab.d * static_cast<float>(sc[2 * k] * isum[0] + sc[2 * k + 1] * isum[1]);
      }
    }
  }
  return sum;
}

template <typename Block, float (*Dot)(const Block*, const BlockQ8A*, int64_t)>
void qgemm_k(const uint8_t* w, size_t row_bytes, int64_t nw, const BlockQ8A* a, int64_t m, int64_t nb, float* y,
             int64_t ldy) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < nw; ++j) {
      y[i * ldy + j] = Dot(reinterpret_cast<const Block*>(w + static_cast<size_t>(j) * row_bytes), a + i * nb, nb);
    }
  }
}

void gemm_q8_0_q8a(const uint8_t* w, size_t row_bytes, int64_t nw, const BlockQ8A* a, int64_t m, int64_t nb, float* y,
                   int64_t ldy) {
  qgemm<BlockQ8_0>(w, row_bytes, nw, a, m, nb, y, ldy, [](const BlockQ8_0& b, int j) { return int{b.qs[j]}; });
}

void index_totals(const float* q, int64_t heads, int64_t d, const float* keys16, int64_t n, const float* w,
                  float* total) {
  for (int64_t s = 0; s < n; ++s) {
    const float* key = keys16 + (s / 16) * d * 16 + s % 16;
    float t = 0.0f;
    for (int64_t h = 0; h < heads; ++h) {
      float score = 0.0f;
      for (int64_t p = 0; p < d; ++p) score = std::fma(q[h * d + p], key[p * 16], score);
      t = std::fma(w[h], std::max(0.0f, score), t);
    }
    total[s] = t;
  }
}

}  // namespace

void index_keys16(const float* keys, int64_t n, int64_t d, float* keys16) {
  // Group by group, written in order (the 16 rows of a group are read side by side); only the
  // last group's missing keys are zeroed.
  for (int64_t g = 0; g * 16 < n; ++g) {
    const int64_t rows = std::min<int64_t>(16, n - g * 16);
    const float* src = keys + g * 16 * d;
    float* dst = keys16 + g * 16 * d;
    for (int64_t p = 0; p < d; ++p) {
      for (int64_t j = 0; j < rows; ++j) dst[p * 16 + j] = src[j * d + p];
      for (int64_t j = rows; j < 16; ++j) dst[p * 16 + j] = 0.0f;
    }
  }
}

void dequantize_fp8_generic(const void* src, float* y, int64_t n) { dequantize_row_fp8_ref(src, y, n); }

// dot_f32 of each activation row with each weight row dequantized a block at a time.
void gemv_fp8_generic(const uint8_t* w, size_t row_bytes, int64_t nw, const float* x, int64_t m, int64_t k, float* y,
                      int64_t ldy) {
  float block[kQKFP8];
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < nw; ++j) {
      const uint8_t* row = w + static_cast<size_t>(j) * row_bytes;
      float sum = 0.0f;
      for (int64_t b0 = 0; b0 < k; b0 += kQKFP8) {
        const int64_t len = std::min<int64_t>(kQKFP8, k - b0);
        dequantize_row_fp8_ref(row + (b0 / kQKFP8) * sizeof(BlockFP8), block, len);
        for (int64_t c = 0; c < len; ++c) sum += x[i * k + b0 + c] * block[c];
      }
      y[i * ldy + j] = sum;
    }
  }
}

const Kernels& kernels_generic() {
  static const Kernels k{
      .isa = Isa::kGeneric,
      .dequantize_f16 = dequantize_f16,
      .dequantize_bf16 = dequantize_bf16,
      .dequantize_q8_0 = dequantize_q8_0,
      .dequantize_q4_0 = dequantize_q4_0,
      .dequantize_q4_1 = dequantize_q4_1,
      .dequantize_q5_0 = dequantize_q5_0,
      .dequantize_q5_1 = dequantize_q5_1,
      .dequantize_q4_k = dequantize_q4_k,
      .dequantize_q5_k = dequantize_q5_k,
      .dequantize_q6_k = dequantize_q6_k,
      .gemm_f32 = gemm_f32,
      .dot_f32 = dot_f32,
      .axpy_f32 = axpy_f32,
      .f32_to_f16 = f32_to_f16,
      .attn_scores = {attn_scores<float>, attn_scores<uint16_t>, attn_scores<BlockQ8_0>},
      .exp_sum_f32 = exp_sum_f32,
      .attn_values = {attn_values<float>, attn_values<uint16_t>, attn_values<BlockQ8_0>},
      .attn_scores_heads = {},  // attention calls attn_scores head by head
      .attn_values_heads = {},
      .scale_add_f32 = scale_add_f32,
      .rms_norm_f32 = rms_norm_f32,
      .silu_mul_f32 = silu_mul_f32,
      .quantize_q8a = quantize_q8a,
      .gemm_q4_0_q8a = gemm_q4_0_q8a,
      .gemm_q8_0_q8a = gemm_q8_0_q8a,
      .gemm_q4_k_q8a = qgemm_k<BlockQ4_K, qdot_q4_k>,
      .gemm_q6_k_q8a = qgemm_k<BlockQ6_K, qdot_q6_k>,
      .gemm_q4_0x16_q8a = nullptr,
      .gemm_q8_0x16_q8a = nullptr,
      .gemm_q4_kx16_q8a = nullptr,
      .gemm_q5_0x16_q8a = nullptr,
      .gemm_q6_kx16_q8a = nullptr,
      .gemm_q4_1x16_q8a = nullptr,
      .dequantize_fp8 = dequantize_fp8_generic,
      .gemv_fp8 = gemv_fp8_generic,
      .dequantize_kv_fp8 = dequantize_kv_fp8<dequantize_fp8_generic, dequantize_f16>,
      .index_totals = index_totals,
  };
  return k;
}

}  // namespace duet::cpu
