#include "duet/backend/backend.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "duet/core/convert.h"
#include "duet/core/error.h"

namespace duet {

size_t kv_row_bytes(KvDtype dtype, int64_t dim) {
  switch (dtype) {
    case KvDtype::kF32: return static_cast<size_t>(dim) * 4;
    case KvDtype::kF16: return static_cast<size_t>(dim) * 2;
    case KvDtype::kQ8_0:
      if (dim % 32 != 0) {
        fail(ErrorCode::kInvalidArgument, "a q8_0 KV cache holds rows of whole 32-value blocks, not {} values", dim);
      }
      return row_size(DType::kQ8_0, dim);
    case KvDtype::kFp8: return fp8_kv_row_bytes(dim);
  }
  return 0;
}

std::string_view kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32: return "f32";
    case KvDtype::kF16: return "f16";
    case KvDtype::kQ8_0: return "q8_0";
    case KvDtype::kFp8: return "fp8";
  }
  return "?";
}

KvDtype parse_kv_dtype(std::string_view name) {
  if (name == "f16") return KvDtype::kF16;
  if (name == "f32") return KvDtype::kF32;
  if (name == "q8_0") return KvDtype::kQ8_0;
  if (name == "fp8") return KvDtype::kFp8;
  fail(ErrorCode::kInvalidArgument, "KV cache type is '{}', expected f16, q8_0, fp8 or f32", name);
}

void check_head_rows(const WeightView& w, const HeadRows& s) {
  if (s.heads < 0 || s.rows < 0 || s.first_row < 0 || (s.heads > 1 && s.row_step < s.rows) ||
      (s.heads > 0 && s.first_row + (s.heads - 1) * s.row_step + s.rows > w.rows)) {
    fail(ErrorCode::kInvalidArgument, "{} heads of {} rows every {} from row {} do not lie within the {} rows of '{}'",
         s.heads, s.rows, s.row_step, s.first_row, w.rows, w.name);
  }
}

void check_shared_parts(std::span<const Backend::MatmulPart> parts) {
  for (const Backend::MatmulPart& p : parts) {
    if (p.w.cols != parts.front().w.cols) {
      fail(ErrorCode::kInvalidArgument, "'{}' has {} columns and '{}' {}: one activation cannot multiply both",
           parts.front().w.name, parts.front().w.cols, p.w.name, p.w.cols);
    }
  }
}

void Backend::matmul_shared(std::span<const MatmulPart> parts, const float* x, int64_t m) {
  check_shared_parts(parts);
  for (const MatmulPart& p : parts) matmul(p.w, x, m, p.y);
}

void index_topk_of_totals(const float* total, int64_t n, int64_t K, int32_t* out, std::vector<int32_t>& order) {
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const auto better = [&](int32_t a, int32_t b) { return total[a] > total[b] || (total[a] == total[b] && a < b); };
  std::nth_element(order.begin(), order.begin() + K - 1, order.end(), better);
  std::sort(order.begin(), order.begin() + K);
  std::copy_n(order.begin(), K, out);
}

void Backend::index_fp8_round(float* x, int64_t rows, int64_t d) {
  const auto hs = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * d;
    hadamard_transform(row, d);
    for (int64_t i = 0; i < d; ++i) row[i] *= hs;
    fp8_act_round_trip(row, d, 128);
  }
}

void Backend::index_topk(const float* q, const void* cache, KvDtype dtype, const int64_t* slots, int64_t C,
                         const float* w, int64_t m, int64_t heads, int64_t d, int64_t last0, int64_t K, int32_t* out) {
  std::vector<float> keys(static_cast<size_t>(C * d));
  load_kv(cache, dtype, slots, C, d, keys.data());
  std::vector<float> total(static_cast<size_t>(C));
  std::vector<int32_t> order;
  for (int64_t j = 0; j < m; ++j) {
    const int64_t n = last0 + j + 1;
    const float* qj = q + j * heads * d;
    for (int64_t s = 0; s < n; ++s) {
      float t = 0.0f;
      for (int64_t h = 0; h < heads; ++h) {
        float score = 0.0f;
        for (int64_t p = 0; p < d; ++p) score = std::fma(qj[h * d + p], keys[s * d + p], score);
        t = std::fma(w[j * heads + h], std::max(0.0f, score), t);
      }
      total[static_cast<size_t>(s)] = t;
    }
    index_topk_of_totals(total.data(), n, K, out + j * K, order);
  }
}

void Backend::matmul_heads(const WeightView& w, const HeadRows& s, const float* x, int64_t x_stride, int64_t x_head,
                           int64_t m, float* y, int64_t y_stride, int64_t y_head, float* scratch) {
  check_head_rows(w, s);
  float* in = scratch;
  float* out = scratch + m * w.cols;
  for (int64_t h = 0; h < s.heads; ++h) {
    copy_2d(x + h * x_head, x_stride, in, w.cols, m, w.cols);
    matmul(w.rows_from(s.first_row + h * s.row_step, s.rows), in, m, out);
    copy_2d(out, s.rows, y + h * y_head, y_stride, m, s.rows);
  }
}

void Backend::load_kv(const void*, KvDtype, const int64_t*, int64_t, int64_t, float*) {
  fail(ErrorCode::kUnsupported, "the {} backend does not read KV cache rows back", name());
}

void Backend::matmul_heads_t(const WeightView& w, const HeadRows& s, const float*, int64_t, int64_t, int64_t, float*,
                             int64_t, int64_t) {
  check_head_rows(w, s);
  fail(ErrorCode::kUnsupported, "the {} backend has no transposed product of '{}' per head", name(), w.name);
}

}  // namespace duet
