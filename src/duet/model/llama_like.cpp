#include "duet/model/llama_like.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "duet/core/error.h"

namespace duet {

LlamaLikeModel::LlamaLikeModel(std::shared_ptr<const GgufFile> file, Backend& backend)
    : file_(std::move(file)), backend_(backend), weights_(*file_) {}

HParams LlamaLikeModel::read_common_config() {
  const GgufFile& f = *file_;
  ModelConfig& c = config_;
  c.architecture = f.get_string("general.architecture");
  c.name = f.get_string_or("general.name", "");
  const HParams hp(f, c.architecture);
  c.hidden_size = hp.positive("embedding_length");
  c.num_layers = hp.layer_count("block_count");
  c.intermediate_size = hp.positive("feed_forward_length");
  c.num_heads = hp.positive("attention.head_count");
  c.num_kv_heads = hp.has("attention.head_count_kv") ? hp.positive("attention.head_count_kv") : c.num_heads;
  c.context_length = hp.int_or("context_length", 2048);
  c.rms_norm_eps = static_cast<float>(hp.float_or("attention.layer_norm_rms_epsilon", 1e-6));
  if (c.num_heads % c.num_kv_heads != 0) {
    fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, not a multiple of {} = {}", f.path(),
         hp.key("attention.head_count"), c.num_heads, hp.key("attention.head_count_kv"), c.num_kv_heads);
  }
  c.head_dim = hp.has("attention.key_length") ? hp.positive("attention.key_length") : c.hidden_size / c.num_heads;
  if (hp.int_or("attention.value_length", c.head_dim) != c.head_dim) {
    fail(ErrorCode::kUnsupported, "'{}': {} with key_length {} != value_length {} is not supported", f.path(),
         c.architecture, c.head_dim, hp.int_or("attention.value_length", c.head_dim));
  }
  c.rope.dim = hp.int_or("rope.dimension_count", c.head_dim);
  if (c.rope.dim <= 0 || c.rope.dim > c.head_dim || c.rope.dim % 2 != 0) {
    fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, expected an even number up to the head size {}", f.path(),
         hp.key("rope.dimension_count"), c.rope.dim, c.head_dim);
  }
  c.rope.freq_base = hp.float_or("rope.freq_base", 10000.0);
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  const int64_t vocab_from_tensor = embd != nullptr && embd->shape.size() == 2 ? embd->shape[1] : 0;
  c.num_vocab = hp.int_or("vocab_size", vocab_from_tensor);
  if (c.num_vocab <= 0 && f.has("tokenizer.ggml.tokens")) {
    c.num_vocab = static_cast<int64_t>(f.get_string_array("tokenizer.ggml.tokens").size());
  }
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  return hp;
}

void LlamaLikeModel::read_linear_rope_scaling(const HParams& hp) {
  ModelConfig& c = config_;
  const std::string scaling = hp.string_or("rope.scaling.type", hp.has("rope.scale_linear") ? "linear" : "none");
  if (scaling == "linear") {
    c.rope_scaling_factor = hp.has("rope.scaling.factor") ? hp.float_or("rope.scaling.factor", 1.0)
                                                          : hp.float_or("rope.scale_linear", 1.0);
    if (!(c.rope_scaling_factor > 0.0)) {
      fail(ErrorCode::kInvalidArgument, "'{}': rope scaling factor is {}, expected a positive number", file_->path(),
           c.rope_scaling_factor);
    }
  } else if (scaling != "none") {
    fail(ErrorCode::kUnsupported, "'{}': {} '{}' is not supported for {} (expected linear or none)", file_->path(),
         hp.key("rope.scaling.type"), scaling, c.architecture);
  }
  c.rope.freq_scale = 1.0 / c.rope_scaling_factor;
}

void LlamaLikeModel::bind_common_weights(bool qkv_bias) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size;
  const int64_t q_dim = c.num_heads * c.head_dim;
  token_embd_ = weights_.matrix("token_embd.weight", c.num_vocab, d);
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LlamaLikeLayer& L = layers_[static_cast<size_t>(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    L.attn_norm = weights_.vector(p + "attn_norm.weight", d);
    L.wq = weights_.matrix(p + "attn_q.weight", q_dim, d);
    L.wk = weights_.matrix(p + "attn_k.weight", c.kv_dim(), d);
    L.wv = weights_.matrix(p + "attn_v.weight", c.kv_dim(), d);
    if (qkv_bias) {
      L.bq = weights_.vector(p + "attn_q.bias", q_dim);
      L.bk = weights_.vector(p + "attn_k.bias", c.kv_dim());
      L.bv = weights_.vector(p + "attn_v.bias", c.kv_dim());
    }
    L.wo = weights_.matrix(p + "attn_output.weight", d, q_dim);
    L.ffn_norm = weights_.vector(p + "ffn_norm.weight", d);
    L.w_gate = weights_.matrix(p + "ffn_gate.weight", c.intermediate_size, d);
    L.w_up = weights_.matrix(p + "ffn_up.weight", c.intermediate_size, d);
    L.w_down = weights_.matrix(p + "ffn_down.weight", d, c.intermediate_size);
  }
  output_norm_ = weights_.vector("output_norm.weight", d);
  output_ = c.tied_embeddings ? token_embd_ : weights_.matrix("output.weight", c.num_vocab, d);
  // llama3 rope scaling (DeepSeek-R1-Distill-Llama): a frequency divisor per rotated pair.
  if (weights_.has("rope_freqs.weight")) {
    const float* f = weights_.vector("rope_freqs.weight", c.rope.dim / 2);
    if (f != nullptr) config_.rope.freq_factors.assign(f, f + c.rope.dim / 2);
  }
  weights_.finish();

  std::vector<WeightView> matmul_weights;
  for (const LlamaLikeLayer& L : layers_) {
    matmul_weights.insert(matmul_weights.end(), {L.wq, L.wk, L.wv, L.wo, L.w_gate, L.w_up, L.w_down});
  }
  matmul_weights.push_back(output_);
  prepared_ = backend_.prepare_weights(matmul_weights);
}

void LlamaLikeModel::add_bias(float* y, const float* bias, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) backend_.add(y + r * dim, bias, dim);
}

const PagedAttentionBatch& LlamaLikeModel::window_batch(const BatchInput& batch, const PagedKvCache& cache,
                                                        int64_t window) {
  const PagedAttentionBatch& full = batch.attention;
  // No token sees past its window: plain causal attention is exact.
  bool needed = false;
  for (const PagedSequence& ps : full.seqs) needed = needed || ps.context_len > window;
  if (!needed) return full;
  if (cache.num_slots() > std::numeric_limits<int32_t>::max()) {
    fail(ErrorCode::kUnsupported, "sliding-window attention lists cache slots as int32; the cache has {} slots",
         cache.num_slots());
  }
  const int64_t bs = full.block_size;
  // First the slots of every sequence's window union, so the tables below can point into them.
  window_slots_.clear();
  std::vector<size_t> first_slot(full.seqs.size());
  for (size_t s = 0; s < full.seqs.size(); ++s) {
    const PagedSequence& ps = full.seqs[s];
    const int64_t pos0 = ps.context_len - ps.num_tokens;  // position of the first new token
    const int64_t lo = std::max<int64_t>(0, pos0 - window + 1);
    first_slot[s] = window_slots_.size();
    for (int64_t p = lo; p < ps.context_len; ++p) {
      window_slots_.push_back(static_cast<int32_t>(static_cast<int64_t>(ps.block_table[p / bs]) * bs + p % bs));
    }
  }
  window_batch_.seqs.clear();
  window_batch_.block_size = 1;
  window_batch_.num_tokens = full.num_tokens;
  for (size_t s = 0; s < full.seqs.size(); ++s) {
    const PagedSequence& ps = full.seqs[s];
    const int64_t pos0 = ps.context_len - ps.num_tokens;
    const int64_t lo = std::max<int64_t>(0, pos0 - window + 1);
    const int32_t* slots = window_slots_.data() + first_slot[s];  // slots[i] holds position lo + i
    // Tokens at positions < window see everything before them: one causal sequence.
    const int32_t num_full = static_cast<int32_t>(std::clamp<int64_t>(window - pos0, 0, ps.num_tokens));
    if (num_full > 0) {
      const int32_t len = static_cast<int32_t>(pos0 + num_full);
      window_batch_.seqs.push_back(PagedSequence{ps.token_start, num_full, len, slots, len});
    }
    for (int32_t i = num_full; i < ps.num_tokens; ++i) {
      const int64_t pos = pos0 + i;
      const int64_t start = pos - window + 1;
      const int32_t len = static_cast<int32_t>(window);
      window_batch_.seqs.push_back(PagedSequence{ps.token_start + i, 1, len, slots + (start - lo), len});
    }
  }
  return window_batch_;
}

void LlamaLikeModel::forward(const BatchInput& batch, PagedKvCache& cache, float* logits) {
  const ModelConfig& c = config_;
  batch.validate(c.num_vocab, cache.num_slots());
  const int64_t n = batch.num_tokens();
  const int64_t d = c.hidden_size;
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.kv_dim();
  x_.resize(static_cast<size_t>(n * d));
  h_.resize(static_cast<size_t>(n * d));
  q_.resize(static_cast<size_t>(n * q_dim));
  k_.resize(static_cast<size_t>(n * kv_dim));
  v_.resize(static_cast<size_t>(n * kv_dim));
  attn_.resize(static_cast<size_t>(n * q_dim));
  gate_.resize(static_cast<size_t>(n * c.intermediate_size));
  up_.resize(static_cast<size_t>(n * c.intermediate_size));
  window_batch_for_ = 0;

  backend_.get_rows(token_embd_, batch.token_ids.data(), n, x_.data());
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LlamaLikeLayer& L = layers_[static_cast<size_t>(l)];
    backend_.rms_norm(x_.data(), L.attn_norm, h_.data(), n, d, c.rms_norm_eps);
    backend_.matmul(L.wq, h_.data(), n, q_.data());
    backend_.matmul(L.wk, h_.data(), n, k_.data());
    backend_.matmul(L.wv, h_.data(), n, v_.data());
    if (L.bq != nullptr) add_bias(q_.data(), L.bq, n, q_dim);
    if (L.bk != nullptr) add_bias(k_.data(), L.bk, n, kv_dim);
    if (L.bv != nullptr) add_bias(v_.data(), L.bv, n, kv_dim);
    backend_.rope(q_.data(), n, c.num_heads, c.head_dim, batch.positions.data(), c.rope);
    backend_.rope(k_.data(), n, c.num_kv_heads, c.head_dim, batch.positions.data(), c.rope);
    backend_.store_kv(k_.data(), batch.slot_mapping.data(), n, kv_dim, cache.k(l), cache.dtype());
    backend_.store_kv(v_.data(), batch.slot_mapping.data(), n, kv_dim, cache.v(l), cache.dtype());
    const PagedAttentionBatch* attention = &batch.attention;
    if (L.sliding_window > 0) {
      if (window_batch_for_ != L.sliding_window) {
        attention = &window_batch(batch, cache, L.sliding_window);
        window_batch_for_ = attention == &batch.attention ? 0 : L.sliding_window;
      } else {
        attention = &window_batch_;
      }
    }
    const Backend::AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, c.head_dim, kv_dim, kv_dim,
                                        cache.dtype()};
    backend_.paged_attention(q_.data(), cache.k(l), cache.v(l), attn_.data(), *attention, shape, scale);
    backend_.matmul(L.wo, attn_.data(), n, h_.data());
    backend_.add(x_.data(), h_.data(), n * d);

    backend_.rms_norm(x_.data(), L.ffn_norm, h_.data(), n, d, c.rms_norm_eps);
    backend_.matmul(L.w_gate, h_.data(), n, gate_.data());
    backend_.matmul(L.w_up, h_.data(), n, up_.data());
    backend_.silu_mul(gate_.data(), up_.data(), gate_.data(), n * c.intermediate_size);
    backend_.matmul(L.w_down, gate_.data(), n, h_.data());
    backend_.add(x_.data(), h_.data(), n * d);
  }
  // Only the rows that need logits go through the output norm and head.
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  if (rows == 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src = batch.logits_rows[static_cast<size_t>(r)];
    if (src < 0 || src >= n) fail(ErrorCode::kInternal, "logits row {} outside the batch of {}", src, n);
    backend_.rms_norm(x_.data() + src * d, output_norm_, h_.data() + r * d, 1, d, c.rms_norm_eps);
  }
  backend_.matmul(output_, h_.data(), rows, logits);
}

}  // namespace duet
