// The deepseek2 architecture (DeepSeek-V2/V2-Lite/V2.5/V3/R1), written after Hugging Face's
// modeling_deepseek for V2 and V3, on llama.cpp's GGUF layout.
//
// Attention is MLA. The cache holds, per token and layer, the compressed latent c (kv_lora_rank
// floats, after kv_a_layernorm) followed by the rope part of the key k_pe (qk_rope_head_dim
// floats, rotated): 576 floats for V2/V3 instead of 2 x heads x head size. Keys and values are
// never decompressed: with W_UK / W_UV the per-head halves of kv_b,
//   q_nope . k_nope = q_nope . (W_UK c) = (W_UK^T q_nope) . c
//   out_h = W_UV (sum_j p_j c_j),
// so each head's query becomes [W_UK^T q_nope, q_pe] against the cache rows [c, k_pe], all heads
// share that one "kv head", the value is the first kv_lora_rank floats of the same row, and W_UV
// is applied after attention. The PyTorch reference decompresses K and V the plain way, so the
// two formulations check each other.
//
// Two GGUF layouts of kv_b: attn_kv_b [heads * (nope + v), kv_lora_rank] as converted before
// 2025, or (llama.cpp's converter since) attn_k_b [heads, kv_lora_rank, nope] (W_UK^T already)
// and attn_v_b [heads, v, kv_lora_rank] (W_UV), where key_length / value_length describe the
// latent MQA (kv_lora_rank + rope, kv_lora_rank) and key_length_mla / value_length_mla the heads.
//
// Feed-forward: leading_dense_block_count dense SwiGLU layers, then mixture-of-experts layers:
// a router (softmax scores for V2, sigmoid + e_score_correction_bias for choosing in V3),
// optionally limited to the best expert groups, top-k experts weighted (normalized and/or
// scaled as the version does), plus shared experts.
#include "duet/model/deepseek2.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "duet/core/error.h"
#include "duet/core/quant.h"
#include "duet/model/hparams.h"
#include "duet/model/weights.h"

namespace duet {
namespace {

enum class Gating { kSoftmax = 1, kSigmoid = 2 };

struct Ds2Params {
  int64_t q_lora_rank = 0;  // 0: a direct query projection (V2-Lite)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope = 0;
  int64_t qk_rope = 0;
  int64_t v_head_dim = 0;
  int64_t num_dense_layers = 0;
  int64_t num_experts = 0;
  int64_t num_shared_experts = 0;
  int64_t num_experts_used = 0;
  int64_t expert_ff = 0;
  int64_t num_groups = 1;
  int64_t num_groups_used = 1;
  double routed_scaling = 1.0;
  bool norm_topk = false;
  Gating gating = Gating::kSoftmax;
  float softmax_scale = 0.0f;
};

struct Ds2Layer {
  const float* attn_norm = nullptr;
  WeightView wq;                      // direct query projection, or
  WeightView wq_a, wq_b;              // the low-rank one
  const float* q_a_norm = nullptr;
  WeightView wkv_a;                   // -> [kv_lora_rank + qk_rope]
  const float* kv_a_norm = nullptr;
  WeightView wkv_b;                   // [heads * (nope + v), kv_lora_rank], or
  WeightView wk_b, wv_b;              // [heads * kv_lora_rank, nope] and [heads * v, kv_lora_rank]
  std::vector<float> wk_absorbed;     // per head: W_UK^T as [kv_lora_rank, nope], f32
  WeightView wo;
  const float* ffn_norm = nullptr;
  bool moe = false;
  WeightView w_gate, w_up, w_down;    // dense layers
  WeightView router;                  // [experts, hidden]
  const float* router_bias = nullptr;  // e_score_correction_bias (V3)
  WeightView gate_exps, up_exps, down_exps;
  WeightView gate_shexp, up_shexp, down_shexp;
};

// Rows [first, first + rows) of a weight matrix as a matrix of its own.
WeightView row_slice(const WeightView& w, int64_t first, int64_t rows) {
  return WeightView{w.name, w.type, rows, w.cols, w.row(first)};
}

class Deepseek2Model final : public Model {
 public:
  Deepseek2Model(std::shared_ptr<const GgufFile> file, Backend& backend)
      : file_(std::move(file)), backend_(backend), weights_(*file_) {
    read_config();
    bind_weights();
  }

  const ModelConfig& config() const override { return config_; }
  int64_t cache_k_dim() const override { return p_.kv_lora_rank + p_.qk_rope; }
  int64_t cache_v_dim() const override { return 0; }
  std::pair<int64_t, int64_t> cache_head_dims() const override { return {cache_k_dim(), p_.kv_lora_rank}; }

  void forward(const BatchInput& batch, PagedKvCache& cache, float* logits) override;

 private:
  void read_config();
  void bind_weights();
  void attention(const Ds2Layer& L, int64_t layer, const BatchInput& batch, PagedKvCache& cache);
  void feed_forward(const Ds2Layer& L, int64_t n);
  void mlp(const WeightView& gate, const WeightView& up, const WeightView& down, const float* in, int64_t rows,
           float* out);
  void route(const Ds2Layer& L, int64_t n);

  std::shared_ptr<const GgufFile> file_;
  Backend& backend_;
  WeightBinder weights_;
  ModelConfig config_;
  Ds2Params p_;
  RopeParams rope_;
  WeightView token_embd_;
  std::vector<Ds2Layer> layers_;
  const float* output_norm_ = nullptr;
  WeightView output_;
  std::unique_ptr<PreparedWeights> prepared_;  // the backend's copies of the matmul weights

  // Scratch, sized for the largest step seen so far.
  std::vector<float> x_, h_, q_, qa_, kv_, qm_, lat_, attn_, tmp_in_, tmp_out_, ffn_, gate_, up_, logits_r_;
  std::vector<int32_t> choice_;  // [n, k] experts per token
  std::vector<float> weight_;    // [n, k] their weights
};

void Deepseek2Model::read_config() {
  const GgufFile& f = *file_;
  ModelConfig& c = config_;
  c.architecture = f.get_string("general.architecture");
  c.name = f.get_string_or("general.name", "");
  const HParams hp(f, c.architecture);
  c.hidden_size = hp.positive("embedding_length");
  c.num_layers = hp.layer_count("block_count");
  c.intermediate_size = hp.positive("feed_forward_length");
  c.num_heads = hp.positive("attention.head_count");
  c.num_kv_heads = c.num_heads;
  c.context_length = hp.int_or("context_length", 4096);
  c.rms_norm_eps = static_cast<float>(hp.float_or("attention.layer_norm_rms_epsilon", 1e-6));
  p_.q_lora_rank = hp.int_or("attention.q_lora_rank", 0);
  p_.kv_lora_rank = hp.positive("attention.kv_lora_rank");
  // Files with the split kv_b say the heads' sizes under *_mla (their key_length is the latent's).
  const bool mla_keys = hp.has("attention.key_length_mla");
  const std::string key_key = mla_keys ? "attention.key_length_mla" : "attention.key_length";
  const int64_t key_length = hp.positive(key_key);
  p_.v_head_dim = hp.positive(mla_keys ? "attention.value_length_mla" : "attention.value_length");
  p_.qk_rope = hp.positive("rope.dimension_count");
  p_.qk_nope = key_length - p_.qk_rope;
  if (p_.qk_nope <= 0 || p_.qk_rope % 2 != 0) {
    fail(ErrorCode::kInvalidArgument, "'{}': {} is {} and {} is {}: expected an even rope part smaller than the key",
         f.path(), hp.key(key_key), key_length, hp.key("rope.dimension_count"), p_.qk_rope);
  }
  if (mla_keys && hp.int_or("attention.key_length", p_.kv_lora_rank + p_.qk_rope) != p_.kv_lora_rank + p_.qk_rope) {
    fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, expected {} (kv_lora_rank {} + rope {}) beside {}", f.path(),
         hp.key("attention.key_length"), hp.int_or("attention.key_length", 0), p_.kv_lora_rank + p_.qk_rope,
         p_.kv_lora_rank, p_.qk_rope, hp.key(key_key));
  }
  c.head_dim = key_length;
  p_.num_dense_layers = hp.int_or("leading_dense_block_count", 0);
  p_.num_experts = hp.int_or("expert_count", 0);
  p_.num_shared_experts = hp.int_or("expert_shared_count", 0);
  p_.num_experts_used = hp.int_or("expert_used_count", 0);
  p_.expert_ff = hp.int_or("expert_feed_forward_length", 0);
  p_.num_groups = std::max<int64_t>(1, hp.int_or("expert_group_count", 1));
  p_.num_groups_used = std::max<int64_t>(1, hp.int_or("expert_group_used_count", p_.num_groups));
  p_.routed_scaling = hp.float_or("expert_weights_scale", 1.0);
  p_.norm_topk = f.get_bool_or(hp.key("expert_weights_norm"), false);
  const int64_t gating = hp.int_or("expert_gating_func", 1);  // absent in older V2 files: softmax
  if (gating != 1 && gating != 2) {
    fail(ErrorCode::kUnsupported, "'{}': {} is {} (expected 1 softmax or 2 sigmoid)", f.path(),
         hp.key("expert_gating_func"), gating);
  }
  p_.gating = static_cast<Gating>(gating);
  if (p_.num_dense_layers < c.num_layers) {
    if (p_.num_experts <= 0 || p_.num_experts_used <= 0 || p_.num_experts_used > p_.num_experts || p_.expert_ff <= 0) {
      fail(ErrorCode::kInvalidArgument, "'{}': mixture-of-experts layers need {} ({}) >= {} ({}) > 0 and {} > 0",
           f.path(), hp.key("expert_count"), p_.num_experts, hp.key("expert_used_count"), p_.num_experts_used,
           hp.key("expert_feed_forward_length"));
    }
    if (p_.num_experts % p_.num_groups != 0 || p_.num_groups_used > p_.num_groups) {
      fail(ErrorCode::kInvalidArgument, "'{}': {} experts cannot split into {} groups of which {} are used", f.path(),
           p_.num_experts, p_.num_groups, p_.num_groups_used);
    }
  }
  // RoPE on adjacent pairs of the rope part (the checkpoints' own layout), optionally YaRN.
  rope_.mode = RopeMode::kNormal;
  rope_.dim = p_.qk_rope;
  rope_.freq_base = hp.float_or("rope.freq_base", 10000.0);
  double mscale = 1.0;
  const std::string scaling = hp.string_or("rope.scaling.type", "none");
  if (scaling == "yarn") {
    const double factor = hp.float_or("rope.scaling.factor", 1.0);
    if (!(factor >= 1.0)) {
      fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, expected >= 1", f.path(), hp.key("rope.scaling.factor"), factor);
    }
    rope_.freq_scale = 1.0 / factor;
    rope_.yarn_orig_ctx = hp.float_or("rope.scaling.original_context_length", static_cast<double>(c.context_length));
    // yarn_log_multiplier is 0.1 * mscale_all_dim; with mscale == mscale_all_dim (every DeepSeek
    // release) the rotary's own magnitude factor is 1 and only the softmax scale grows.
    const double log_mul = hp.float_or("rope.scaling.yarn_log_multiplier", 0.0);
    mscale = factor > 1.0 ? 1.0 + log_mul * std::log(factor) : 1.0;
    c.rope_scaling_factor = factor;
  } else if (scaling != "none") {
    fail(ErrorCode::kUnsupported, "'{}': {} '{}' is not supported for deepseek2 (expected yarn or none)", f.path(),
         hp.key("rope.scaling.type"), scaling);
  }
  c.rope = rope_;
  p_.softmax_scale = static_cast<float>(mscale * mscale / std::sqrt(static_cast<double>(key_length)));
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  c.num_vocab = hp.int_or("vocab_size", embd != nullptr && embd->shape.size() == 2 ? embd->shape[1] : 0);
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
}

void Deepseek2Model::bind_weights() {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, H = c.num_heads;
  const int64_t q_dim = H * (p_.qk_nope + p_.qk_rope);
  token_embd_ = weights_.matrix("token_embd.weight", c.num_vocab, d);
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Ds2Layer& L = layers_[static_cast<size_t>(l)];
    const std::string pre = "blk." + std::to_string(l) + ".";
    L.attn_norm = weights_.vector(pre + "attn_norm.weight", d);
    if (p_.q_lora_rank > 0) {
      L.wq_a = weights_.matrix(pre + "attn_q_a.weight", p_.q_lora_rank, d);
      L.q_a_norm = weights_.vector(pre + "attn_q_a_norm.weight", p_.q_lora_rank);
      L.wq_b = weights_.matrix(pre + "attn_q_b.weight", q_dim, p_.q_lora_rank);
    } else {
      L.wq = weights_.matrix(pre + "attn_q.weight", q_dim, d);
    }
    L.wkv_a = weights_.matrix(pre + "attn_kv_a_mqa.weight", p_.kv_lora_rank + p_.qk_rope, d);
    L.kv_a_norm = weights_.vector(pre + "attn_kv_a_norm.weight", p_.kv_lora_rank);
    if (weights_.has(pre + "attn_kv_b.weight") || !weights_.has(pre + "attn_k_b.weight")) {
      L.wkv_b = weights_.matrix(pre + "attn_kv_b.weight", H * (p_.qk_nope + p_.v_head_dim), p_.kv_lora_rank);
    } else {
      L.wk_b = weights_.experts(pre + "attn_k_b.weight", H, p_.kv_lora_rank, p_.qk_nope);
      L.wv_b = weights_.experts(pre + "attn_v_b.weight", H, p_.v_head_dim, p_.kv_lora_rank);
    }
    L.wo = weights_.matrix(pre + "attn_output.weight", d, H * p_.v_head_dim);
    L.ffn_norm = weights_.vector(pre + "ffn_norm.weight", d);
    L.moe = l >= p_.num_dense_layers;
    if (!L.moe) {
      L.w_gate = weights_.matrix(pre + "ffn_gate.weight", c.intermediate_size, d);
      L.w_up = weights_.matrix(pre + "ffn_up.weight", c.intermediate_size, d);
      L.w_down = weights_.matrix(pre + "ffn_down.weight", d, c.intermediate_size);
      continue;
    }
    L.router = weights_.matrix(pre + "ffn_gate_inp.weight", p_.num_experts, d);
    if (p_.gating == Gating::kSigmoid && weights_.has(pre + "exp_probs_b.bias")) {
      L.router_bias = weights_.vector(pre + "exp_probs_b.bias", p_.num_experts);
    }
    L.gate_exps = weights_.experts(pre + "ffn_gate_exps.weight", p_.num_experts, p_.expert_ff, d);
    L.up_exps = weights_.experts(pre + "ffn_up_exps.weight", p_.num_experts, p_.expert_ff, d);
    L.down_exps = weights_.experts(pre + "ffn_down_exps.weight", p_.num_experts, d, p_.expert_ff);
    if (p_.num_shared_experts > 0) {
      const int64_t ff = p_.expert_ff * p_.num_shared_experts;
      L.gate_shexp = weights_.matrix(pre + "ffn_gate_shexp.weight", ff, d);
      L.up_shexp = weights_.matrix(pre + "ffn_up_shexp.weight", ff, d);
      L.down_shexp = weights_.matrix(pre + "ffn_down_shexp.weight", d, ff);
    }
  }
  output_norm_ = weights_.vector("output_norm.weight", d);
  output_ = c.tied_embeddings ? token_embd_ : weights_.matrix("output.weight", c.num_vocab, d);
  weights_.finish();

  // W_UK^T of every head, once, as [kv_lora_rank, nope] in f32: the k half of kv_b transposed,
  // or attn_k_b as it is. W_UV is then the v half of kv_b, or attn_v_b.
  const int64_t rank = p_.kv_lora_rank, nope = p_.qk_nope, vd = p_.v_head_dim;
  std::vector<float> row(static_cast<size_t>(rank));
  for (Ds2Layer& L : layers_) {
    L.wk_absorbed.assign(static_cast<size_t>(H * rank * nope), 0.0f);
    if (L.wk_b.data != nullptr) {
      for (int64_t r = 0; r < H * rank; ++r) {
        dequantize_row_ref(L.wk_b.type, L.wk_b.row(r), L.wk_absorbed.data() + r * nope, nope);
      }
      continue;
    }
    for (int64_t h = 0; h < H; ++h) {
      float* dst = L.wk_absorbed.data() + h * rank * nope;
      for (int64_t i = 0; i < nope; ++i) {
        dequantize_row_ref(L.wkv_b.type, L.wkv_b.row(h * (nope + vd) + i), row.data(), rank);
        for (int64_t r = 0; r < rank; ++r) dst[r * nope + i] = row[static_cast<size_t>(r)];
      }
    }
  }

  // Experts and heads are row ranges of these (the backend serves them from the same copies).
  std::vector<WeightView> matmul_weights;
  for (const Ds2Layer& L : layers_) {
    for (const WeightView* w : {&L.wq, &L.wq_a, &L.wq_b, &L.wkv_a, &L.wkv_b, &L.wv_b, &L.wo, &L.w_gate, &L.w_up, &L.w_down,
                                &L.router, &L.gate_exps, &L.up_exps, &L.down_exps, &L.gate_shexp, &L.up_shexp,
                                &L.down_shexp}) {
      if (w->data != nullptr) matmul_weights.push_back(*w);
    }
  }
  matmul_weights.push_back(output_);
  prepared_ = backend_.prepare_weights(matmul_weights);
}

void Deepseek2Model::forward(const BatchInput& batch, PagedKvCache& cache, float* logits) {
  const ModelConfig& c = config_;
  batch.validate(c.num_vocab, cache.num_slots());
  const int64_t n = batch.num_tokens();
  const int64_t d = c.hidden_size;
  x_.resize(static_cast<size_t>(n * d));
  h_.resize(static_cast<size_t>(n * d));
  backend_.get_rows(token_embd_, batch.token_ids.data(), n, x_.data());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const Ds2Layer& L = layers_[static_cast<size_t>(l)];
    backend_.rms_norm(x_.data(), L.attn_norm, h_.data(), n, d, c.rms_norm_eps);
    attention(L, l, batch, cache);  // reads h_, adds into x_
    backend_.rms_norm(x_.data(), L.ffn_norm, h_.data(), n, d, c.rms_norm_eps);
    feed_forward(L, n);             // reads h_, adds into x_
  }
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  if (rows == 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src = batch.logits_rows[static_cast<size_t>(r)];
    backend_.rms_norm(x_.data() + src * d, output_norm_, h_.data() + r * d, 1, d, c.rms_norm_eps);
  }
  backend_.matmul(output_, h_.data(), rows, logits);
}

void Deepseek2Model::attention(const Ds2Layer& L, int64_t layer, const BatchInput& batch, PagedKvCache& cache) {
  const ModelConfig& c = config_;
  const int64_t n = batch.num_tokens();
  const int64_t H = c.num_heads, nope = p_.qk_nope, rope = p_.qk_rope, rank = p_.kv_lora_rank, vd = p_.v_head_dim;
  const int64_t qk = nope + rope, row = rank + rope;
  q_.resize(static_cast<size_t>(n * H * qk));
  if (p_.q_lora_rank > 0) {
    qa_.resize(static_cast<size_t>(n * p_.q_lora_rank));
    backend_.matmul(L.wq_a, h_.data(), n, qa_.data());
    backend_.rms_norm(qa_.data(), L.q_a_norm, qa_.data(), n, p_.q_lora_rank, c.rms_norm_eps);
    backend_.matmul(L.wq_b, qa_.data(), n, q_.data());
  } else {
    backend_.matmul(L.wq, h_.data(), n, q_.data());
  }
  // The cache row of each token: [kv_a_layernorm(c), rope(k_pe)].
  kv_.resize(static_cast<size_t>(n * row));
  backend_.matmul(L.wkv_a, h_.data(), n, kv_.data());
  for (int64_t t = 0; t < n; ++t) {
    float* r = kv_.data() + t * row;
    backend_.rms_norm(r, L.kv_a_norm, r, 1, rank, c.rms_norm_eps);
  }
  RopeParams k_rope = rope_;
  k_rope.offset = rank;
  backend_.rope(kv_.data(), n, 1, row, batch.positions.data(), k_rope);
  RopeParams q_rope = rope_;
  q_rope.offset = nope;
  backend_.rope(q_.data(), n, H, qk, batch.positions.data(), q_rope);
  backend_.store_kv(kv_.data(), batch.slot_mapping.data(), n, row, cache.k(layer), cache.dtype());

  // Absorbed queries [n, H, rank + rope]: W_UK^T q_nope per head, then q_pe.
  qm_.resize(static_cast<size_t>(n * H * row));
  tmp_in_.resize(static_cast<size_t>(n * std::max(nope, rank)));
  tmp_out_.resize(static_cast<size_t>(n * std::max(rank, vd)));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t t = 0; t < n; ++t) std::copy_n(q_.data() + (t * H + h) * qk, nope, tmp_in_.data() + t * nope);
    const WeightView wk{"w_uk", DType::kF32, rank, nope, L.wk_absorbed.data() + h * rank * nope};
    backend_.matmul(wk, tmp_in_.data(), n, tmp_out_.data());
    for (int64_t t = 0; t < n; ++t) {
      float* dst = qm_.data() + (t * H + h) * row;
      std::copy_n(tmp_out_.data() + t * rank, rank, dst);
      std::copy_n(q_.data() + (t * H + h) * qk + nope, rope, dst + rank);
    }
  }
  lat_.resize(static_cast<size_t>(n * H * rank));
  const Backend::AttentionShape shape{H, 1, row, rank, row, row, cache.dtype()};
  backend_.paged_attention(qm_.data(), cache.k(layer), cache.k(layer), lat_.data(), batch.attention, shape,
                           p_.softmax_scale);
  // Per head, the latent output through W_UV (the v rows of kv_b).
  attn_.resize(static_cast<size_t>(n * H * vd));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t t = 0; t < n; ++t) std::copy_n(lat_.data() + (t * H + h) * rank, rank, tmp_in_.data() + t * rank);
    const WeightView w_uv =
        L.wv_b.data != nullptr ? row_slice(L.wv_b, h * vd, vd) : row_slice(L.wkv_b, h * (nope + vd) + nope, vd);
    backend_.matmul(w_uv, tmp_in_.data(), n, tmp_out_.data());
    for (int64_t t = 0; t < n; ++t) std::copy_n(tmp_out_.data() + t * vd, vd, attn_.data() + (t * H + h) * vd);
  }
  ffn_.resize(static_cast<size_t>(n * c.hidden_size));
  backend_.matmul(L.wo, attn_.data(), n, ffn_.data());
  backend_.add(x_.data(), ffn_.data(), n * c.hidden_size);
}

void Deepseek2Model::mlp(const WeightView& gate, const WeightView& up, const WeightView& down, const float* in,
                         int64_t rows, float* out) {
  gate_.resize(static_cast<size_t>(rows * gate.rows));
  up_.resize(static_cast<size_t>(rows * up.rows));
  backend_.matmul(gate, in, rows, gate_.data());
  backend_.matmul(up, in, rows, up_.data());
  backend_.silu_mul(gate_.data(), up_.data(), gate_.data(), rows * gate.rows);
  backend_.matmul(down, gate_.data(), rows, out);
}

// Picks each token's experts and their weights into choice_ / weight_ (HF's MoEGate).
void Deepseek2Model::route(const Ds2Layer& L, int64_t n) {
  const int64_t E = p_.num_experts, k = p_.num_experts_used, G = p_.num_groups, per_group = E / G;
  logits_r_.resize(static_cast<size_t>(n * E));
  backend_.matmul(L.router, h_.data(), n, logits_r_.data());
  choice_.resize(static_cast<size_t>(n * k));
  weight_.resize(static_cast<size_t>(n * k));
  std::vector<double> score(static_cast<size_t>(E)), pick(static_cast<size_t>(E));
  std::vector<double> group_score(static_cast<size_t>(G));
  std::vector<int64_t> order(static_cast<size_t>(std::max(E, G)));
  for (int64_t t = 0; t < n; ++t) {
    const float* lg = logits_r_.data() + t * E;
    if (p_.gating == Gating::kSoftmax) {
      const double max = *std::max_element(lg, lg + E);
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) sum += (score[e] = std::exp(lg[e] - max));
      for (int64_t e = 0; e < E; ++e) score[e] /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e) score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(lg[e])));
    }
    // What the choice ranks: V3 adds the correction bias; the weights stay the unbiased scores.
    for (int64_t e = 0; e < E; ++e) pick[e] = score[e] + (L.router_bias != nullptr ? L.router_bias[e] : 0.0);
    if (G > 1) {
      // Group scores: V2 the best expert of the group, V3 the sum of the best two.
      for (int64_t g = 0; g < G; ++g) {
        const double* s = pick.data() + g * per_group;
        if (p_.gating == Gating::kSoftmax) {
          group_score[g] = *std::max_element(s, s + per_group);
        } else {
          double a = -INFINITY, b = -INFINITY;
          for (int64_t i = 0; i < per_group; ++i) {
            if (s[i] > a) {
              b = a;
              a = s[i];
            } else if (s[i] > b) {
              b = s[i];
            }
          }
          group_score[g] = a + (per_group > 1 ? b : 0.0);
        }
      }
      std::iota(order.begin(), order.begin() + G, 0);
      std::stable_sort(order.begin(), order.begin() + G, [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
      std::vector<bool> keep(static_cast<size_t>(G), false);
      for (int64_t g = 0; g < p_.num_groups_used; ++g) keep[static_cast<size_t>(order[g])] = true;
      // Experts of the other groups cannot be chosen.
      for (int64_t e = 0; e < E; ++e) {
        if (!keep[static_cast<size_t>(e / per_group)]) pick[e] = -INFINITY;
      }
    }
    std::iota(order.begin(), order.begin() + E, 0);
    std::partial_sort(order.begin(), order.begin() + k, order.begin() + E,
                      [&](int64_t a, int64_t b) { return pick[a] > pick[b] || (pick[a] == pick[b] && a < b); });
    double total = 0.0;
    for (int64_t i = 0; i < k; ++i) total += score[order[i]];
    for (int64_t i = 0; i < k; ++i) {
      double w = score[order[i]];
      if (k > 1 && p_.norm_topk) {
        w /= total + 1e-20;
        if (p_.gating == Gating::kSigmoid) w *= p_.routed_scaling;  // V3 scales after normalizing
      } else {
        w *= p_.routed_scaling;
      }
      choice_[static_cast<size_t>(t * k + i)] = static_cast<int32_t>(order[i]);
      weight_[static_cast<size_t>(t * k + i)] = static_cast<float>(w);
    }
  }
}

void Deepseek2Model::feed_forward(const Ds2Layer& L, int64_t n) {
  const int64_t d = config_.hidden_size;
  ffn_.assign(static_cast<size_t>(n * d), 0.0f);
  if (!L.moe) {
    mlp(L.w_gate, L.w_up, L.w_down, h_.data(), n, ffn_.data());
    backend_.add(x_.data(), ffn_.data(), n * d);
    return;
  }
  route(L, n);
  const int64_t k = p_.num_experts_used, ff = p_.expert_ff;
  // Each expert runs once on the rows of the tokens that chose it.
  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(p_.num_experts));
  for (int64_t i = 0; i < n * k; ++i) tokens[static_cast<size_t>(choice_[static_cast<size_t>(i)])].push_back(i);
  std::vector<float> in, out;
  for (int64_t e = 0; e < p_.num_experts; ++e) {
    const std::vector<int64_t>& picks = tokens[static_cast<size_t>(e)];
    if (picks.empty()) continue;
    const int64_t m = static_cast<int64_t>(picks.size());
    in.resize(static_cast<size_t>(m * d));
    out.resize(static_cast<size_t>(m * d));
    for (int64_t r = 0; r < m; ++r) std::copy_n(h_.data() + (picks[r] / k) * d, d, in.data() + r * d);
    mlp(row_slice(L.gate_exps, e * ff, ff), row_slice(L.up_exps, e * ff, ff), row_slice(L.down_exps, e * d, d),
        in.data(), m, out.data());
    for (int64_t r = 0; r < m; ++r) {
      const float w = weight_[static_cast<size_t>(picks[r])];
      float* dst = ffn_.data() + (picks[r] / k) * d;
      for (int64_t j = 0; j < d; ++j) dst[j] += w * out[static_cast<size_t>(r * d + j)];
    }
  }
  if (p_.num_shared_experts > 0) {
    out.resize(static_cast<size_t>(n * d));
    mlp(L.gate_shexp, L.up_shexp, L.down_shexp, h_.data(), n, out.data());
    backend_.add(ffn_.data(), out.data(), n * d);
  }
  backend_.add(x_.data(), ffn_.data(), n * d);
}

}  // namespace

std::unique_ptr<Model> make_deepseek2_model(std::shared_ptr<const GgufFile> file, Backend& backend) {
  return std::make_unique<Deepseek2Model>(std::move(file), backend);
}

}  // namespace duet
