#include "duet/backend/backend.h"

namespace duet {

// enter() before an op, leave() when it returns or throws.
class ForwardingBackend::Scope {
 public:
  explicit Scope(ForwardingBackend& b) : b_(b) { b_.enter(); }
  ~Scope() { b_.leave(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  ForwardingBackend& b_;
};

void ForwardingBackend::matmul(const WeightView& w, const float* x, int64_t m, float* y) {
  const Scope s(*this);
  inner_.matmul(w, x, m, y);
}

void ForwardingBackend::matmul_heads(const WeightView& w, const HeadRows& s, const float* x, int64_t x_stride,
                                     int64_t x_head, int64_t m, float* y, int64_t y_stride, int64_t y_head,
                                     float* scratch) {
  const Scope sc(*this);
  inner_.matmul_heads(w, s, x, x_stride, x_head, m, y, y_stride, y_head, scratch);
}

void ForwardingBackend::matmul_heads_t(const WeightView& w, const HeadRows& s, const float* x, int64_t x_stride,
                                       int64_t x_head, int64_t m, float* y, int64_t y_stride, int64_t y_head) {
  const Scope sc(*this);
  inner_.matmul_heads_t(w, s, x, x_stride, x_head, m, y, y_stride, y_head);
}

std::unique_ptr<PreparedWeights> ForwardingBackend::prepare_weights(const std::vector<WeightView>& weights) {
  const Scope s(*this);
  return inner_.prepare_weights(weights);
}

void ForwardingBackend::get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* y) {
  const Scope s(*this);
  inner_.get_rows(w, ids, n, y);
}

void ForwardingBackend::rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t dim, float eps) {
  const Scope s(*this);
  inner_.rms_norm(x, weight, y, rows, dim, eps);
}

void ForwardingBackend::rope(float* x, int64_t rows, int64_t num_heads, int64_t head_dim, const int32_t* positions,
                             const RopeParams& p) {
  const Scope s(*this);
  inner_.rope(x, rows, num_heads, head_dim, positions, p);
}

void ForwardingBackend::silu_mul(const float* gate, const float* up, float* y, int64_t n) {
  const Scope s(*this);
  inner_.silu_mul(gate, up, y, n);
}

void ForwardingBackend::add(float* y, const float* x, int64_t n) {
  const Scope s(*this);
  inner_.add(y, x, n);
}

void ForwardingBackend::store_kv(const float* rows, const int64_t* slots, int64_t n, int64_t row_dim, void* cache,
                                 KvDtype dtype) {
  const Scope s(*this);
  inner_.store_kv(rows, slots, n, row_dim, cache, dtype);
}

void ForwardingBackend::load_kv(const void* cache, KvDtype dtype, const int64_t* slots, int64_t n, int64_t row_dim,
                                float* rows) {
  const Scope s(*this);
  inner_.load_kv(cache, dtype, slots, n, row_dim, rows);
}

void ForwardingBackend::paged_attention(const float* q, const void* k_cache, const void* v_cache, float* out,
                                        const PagedAttentionBatch& batch, const AttentionShape& shape, float scale) {
  const Scope s(*this);
  inner_.paged_attention(q, k_cache, v_cache, out, batch, shape, scale);
}

void ForwardingBackend::copy_blocks(void* cache, const std::vector<std::pair<int32_t, int32_t>>& copies,
                                    int64_t block_bytes) {
  const Scope s(*this);
  inner_.copy_blocks(cache, copies, block_bytes);
}

void ForwardingBackend::copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                                int64_t cols) {
  const Scope s(*this);
  inner_.copy_2d(src, src_stride, dst, dst_stride, rows, cols);
}

void ForwardingBackend::moe_route(const float* logits, int64_t n, const MoeRouting& r, int32_t* ids, float* weights) {
  const Scope s(*this);
  inner_.moe_route(logits, n, r, ids, weights);
}

void ForwardingBackend::moe_experts(const MoeExperts& w, const float* x, const int32_t* ids, const float* weights,
                                    int64_t n, int64_t k, float* out) {
  const Scope s(*this);
  inner_.moe_experts(w, x, ids, weights, n, k, out);
}

void ForwardingBackend::index_fp8_round(float* x, int64_t rows, int64_t d) {
  const Scope s(*this);
  inner_.index_fp8_round(x, rows, d);
}

void ForwardingBackend::index_topk(const float* q, const void* cache, KvDtype dtype, const int64_t* slots, int64_t C,
                                   const float* w, int64_t m, int64_t heads, int64_t d, int64_t last0, int64_t K,
                                   int32_t* out) {
  const Scope s(*this);
  inner_.index_topk(q, cache, dtype, slots, C, w, m, heads, d, last0, K, out);
}

}  // namespace duet
