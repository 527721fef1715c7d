#include "duet/model/llama_like.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "duet/core/error.h"

namespace duet {

namespace {
// Scratch slots of a device's workspace.
enum Scratch { kH, kQ, kK, kV, kAttn, kGate, kUp, kLoraMid, kLoraOut };
}  // namespace

LlamaLikeModel::LlamaLikeModel(std::shared_ptr<const GgufFile> file, Placement placement)
    : Model(std::move(file), std::move(placement)), weights_(*file_) {}

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

void LlamaLikeModel::read_rope_scaling(const HParams& hp) {
  ModelConfig& c = config_;
  const std::string scaling = hp.string_or("rope.scaling.type", hp.has("rope.scale_linear") ? "linear" : "none");
  if (scaling == "linear") {
    c.rope_scaling_factor = hp.has("rope.scaling.factor") ? hp.float_or("rope.scaling.factor", 1.0)
                                                          : hp.float_or("rope.scale_linear", 1.0);
    if (!(c.rope_scaling_factor > 0.0)) {
      fail(ErrorCode::kInvalidArgument, "'{}': rope scaling factor is {}, expected a positive number", file_->path(),
           c.rope_scaling_factor);
    }
  } else if (scaling == "yarn") {
    const double factor = hp.float_or("rope.scaling.factor", 1.0);
    const double orig = hp.float_or("rope.scaling.original_context_length", 0.0);
    const double attn_factor = hp.float_or("rope.scaling.yarn_attn_factor", 1.0);
    const double ext_factor = hp.float_or("rope.scaling.yarn_ext_factor", 1.0);
    RopeParams& r = c.rope;
    r.yarn_beta_fast = hp.float_or("rope.scaling.yarn_beta_fast", 32.0);
    r.yarn_beta_slow = hp.float_or("rope.scaling.yarn_beta_slow", 1.0);
    if (!(factor >= 1.0) || !(orig > 0.0) || !(attn_factor > 0.0) || !(r.yarn_beta_fast > r.yarn_beta_slow) ||
        !(r.yarn_beta_slow > 0.0)) {
      fail(ErrorCode::kInvalidArgument,
           "'{}': YaRN needs {} >= 1, {} > 0, {} > 0 and {} > {} > 0; found {}, {}, {}, {}, {}", file_->path(),
           hp.key("rope.scaling.factor"), hp.key("rope.scaling.original_context_length"),
           hp.key("rope.scaling.yarn_attn_factor"), hp.key("rope.scaling.yarn_beta_fast"),
           hp.key("rope.scaling.yarn_beta_slow"), factor, orig, attn_factor, r.yarn_beta_fast, r.yarn_beta_slow);
    }
    if (ext_factor != 1.0) {
      fail(ErrorCode::kUnsupported, "'{}': {} is {}; only 1 (YaRN's ramp as published) is implemented",
           file_->path(), hp.key("rope.scaling.yarn_ext_factor"), ext_factor);
    }
    c.rope_scaling_factor = factor;
    r.yarn_orig_ctx = orig;
    r.attn_factor = attn_factor * (factor > 1.0 ? 1.0 + 0.1 * std::log(factor) : 1.0);
  } else if (scaling != "none") {
    fail(ErrorCode::kUnsupported, "'{}': {} '{}' is not supported for {} (expected linear, yarn or none)",
         file_->path(), hp.key("rope.scaling.type"), scaling, c.architecture);
  }
  c.rope.freq_scale = 1.0 / c.rope_scaling_factor;
}

void LlamaLikeModel::bind_common_weights(Extras extras) {
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
    if (extras.qkv_bias) {
      L.bq = weights_.vector(p + "attn_q.bias", q_dim);
      L.bk = weights_.vector(p + "attn_k.bias", c.kv_dim());
      L.bv = weights_.vector(p + "attn_v.bias", c.kv_dim());
    }
    if (extras.qk_norm) {
      L.q_norm = weights_.vector(p + "attn_q_norm.weight", c.head_dim);
      L.k_norm = weights_.vector(p + "attn_k_norm.weight", c.head_dim);
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
    const WeightView f = weights_.vector("rope_freqs.weight", c.rope.dim / 2);
    if (f.data != nullptr) config_.rope.freq_factors.assign(f32(f), f32(f) + c.rope.dim / 2);
  }
  weights_.finish();
  shard_weights();

  // The forward pass as parts, and each device's tensors.
  x_ = add_carried("x", d * static_cast<int64_t>(sizeof(float)));
  std::vector<std::pair<PartId, WeightRef>> tensors;
  const PartId embed{PartKind::kEmbed, -1}, head{PartKind::kHead, -1};
  add_part(embed, {}, {x_}, [this](PartContext& ctx) { this->embed(ctx); });
  tensors.push_back({embed, {&token_embd_, false}});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LlamaLikeLayer& L = layers_[static_cast<size_t>(l)];
    const PartId attn{PartKind::kAttention, l}, ffn{PartKind::kFeedForward, l};
    add_part(attn, {x_}, {x_}, [this, l](PartContext& ctx) { attention(l, ctx); });
    add_part(ffn, {x_}, {x_}, [this, l](PartContext& ctx) { feed_forward(l, ctx); });
    for (WeightView* v : {&L.attn_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm}) tensors.push_back({attn, {v, false}});
    for (WeightView* v : {&L.wq, &L.wk, &L.wv, &L.wo}) tensors.push_back({attn, {v, true}});
    tensors.push_back({ffn, {&L.ffn_norm, false}});
    for (WeightView* v : {&L.w_gate, &L.w_up, &L.w_down}) tensors.push_back({ffn, {v, true}});
  }
  add_part(head, {x_}, {}, [this](PartContext& ctx) { this->head(ctx); });
  tensors.push_back({head, {&output_norm_, false}});
  tensors.push_back({head, {&output_, true}});
  LoraShape lora;
  lora.architecture = c.architecture;
  lora.num_layers = c.num_layers;
  lora.num_heads = c.num_heads;
  lora.num_kv_heads = c.num_kv_heads;
  lora.permuted_qk = c.rope.mode == RopeMode::kNormal;
  lora.set(LoraModule::kQ, d, q_dim);
  lora.set(LoraModule::kK, d, c.kv_dim());
  lora.set(LoraModule::kV, d, c.kv_dim());
  lora.set(LoraModule::kO, q_dim, d);
  lora.set(LoraModule::kGate, d, c.intermediate_size);
  lora.set(LoraModule::kUp, d, c.intermediate_size);
  lora.set(LoraModule::kDown, c.intermediate_size, d);
  load_weights(tensors);
  enable_lora(lora);
}

void LlamaLikeModel::shard_weights() {
  const ModelConfig& c = config_;
  heads_ = c.num_heads;
  kv_heads_ = c.num_kv_heads;
  ff_ = c.intermediate_size;
  vocab_ = vocab_share_ = c.num_vocab;
  const int T = placement_.tensor_size();
  if (T == 1) return;
  const ParallelGroup& g = *placement_.parallel;
  tensor_ = &g.tensor();
  // Whole kv heads per rank, and the query heads that read them.
  const auto [kv0, kvn] = g.shard(c.num_kv_heads, 1, "the kv heads");
  const int64_t group = c.num_heads / c.num_kv_heads;
  const int64_t hd = c.head_dim;
  const int64_t h0 = kv0 * group;
  heads_ = kvn * group;
  kv_heads_ = kvn;
  const auto [f0, fn] = g.shard(c.intermediate_size, 1, "the feed-forward size");
  ff_ = fn;
  const auto rows = [](int64_t r0, int64_t n) { return LoraShard{r0, n, 0, -1}; };
  const auto cols = [](int64_t c0, int64_t n) { return LoraShard{0, -1, c0, n}; };
  lora_shards_[static_cast<size_t>(LoraModule::kQ)] = rows(h0 * hd, heads_ * hd);
  lora_shards_[static_cast<size_t>(LoraModule::kK)] = rows(kv0 * hd, kvn * hd);
  lora_shards_[static_cast<size_t>(LoraModule::kV)] = rows(kv0 * hd, kvn * hd);
  lora_shards_[static_cast<size_t>(LoraModule::kO)] = cols(h0 * hd, heads_ * hd);
  lora_shards_[static_cast<size_t>(LoraModule::kGate)] = rows(f0, fn);
  lora_shards_[static_cast<size_t>(LoraModule::kUp)] = rows(f0, fn);
  lora_shards_[static_cast<size_t>(LoraModule::kDown)] = cols(f0, fn);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LlamaLikeLayer& L = layers_[static_cast<size_t>(l)];
    if (placement_.device({PartKind::kAttention, l}).remote_rank() < 0) {
      L.wq = WeightShards::rows(L.wq, h0 * hd, heads_ * hd);
      L.wk = WeightShards::rows(L.wk, kv0 * hd, kvn * hd);
      L.wv = WeightShards::rows(L.wv, kv0 * hd, kvn * hd);
      L.bq = WeightShards::elements(L.bq, h0 * hd, heads_ * hd);
      L.bk = WeightShards::elements(L.bk, kv0 * hd, kvn * hd);
      L.bv = WeightShards::elements(L.bv, kv0 * hd, kvn * hd);
      L.wo = shards_.columns(L.wo, h0 * hd, heads_ * hd);
    }
    if (placement_.device({PartKind::kFeedForward, l}).remote_rank() < 0) {
      L.w_gate = WeightShards::rows(L.w_gate, f0, fn);
      L.w_up = WeightShards::rows(L.w_up, f0, fn);
      L.w_down = shards_.columns(L.w_down, f0, fn);
    }
  }
  // The head by vocabulary: equal shares (the last may be short), gathered after the matmul.
  vocab_share_ = (c.num_vocab + T - 1) / T;
  vocab0_ = std::min<int64_t>(c.num_vocab, vocab_share_ * g.tensor_rank());
  vocab_ = std::min<int64_t>(c.num_vocab, vocab0_ + vocab_share_) - vocab0_;
  output_ = WeightShards::rows(output_, vocab0_, vocab_);
}

const PagedAttentionBatch& LlamaLikeModel::window_batch(const BatchInput& batch, const PagedKvCache& cache,
                                                        int64_t window) const {
  for (const BatchInput::Windowed& w : batch.windowed) {
    if (w.window == window) return w.attention;
  }
  const PagedAttentionBatch& full = batch.attention;
  // No token sees past its window: plain causal attention is exact.
  bool needed = false;
  for (const PagedSequence& ps : full.seqs) needed = needed || ps.context_len > window;
  if (!needed) return full;
  if (cache.num_slots() > std::numeric_limits<int32_t>::max()) {
    fail(ErrorCode::kUnsupported, "sliding-window attention lists cache slots as int32; the cache has {} slots",
         cache.num_slots());
  }
  BatchInput::Windowed& out = batch.windowed.emplace_back();
  out.window = window;
  const int64_t bs = full.block_size;
  // First the slots of every sequence's window union, so the tables below can point into them.
  std::vector<size_t> first_slot(full.seqs.size());
  for (size_t s = 0; s < full.seqs.size(); ++s) {
    const PagedSequence& ps = full.seqs[s];
    const int64_t pos0 = ps.context_len - ps.num_tokens;  // position of the first new token
    const int64_t lo = std::max<int64_t>(0, pos0 - window + 1);
    first_slot[s] = out.slots.size();
    for (int64_t p = lo; p < ps.context_len; ++p) {
      out.slots.push_back(static_cast<int32_t>(ps.slot(p, bs)));
    }
  }
  PagedAttentionBatch& wb = out.attention;
  wb.block_size = 1;
  wb.num_tokens = full.num_tokens;
  for (size_t s = 0; s < full.seqs.size(); ++s) {
    const PagedSequence& ps = full.seqs[s];
    const int64_t pos0 = ps.context_len - ps.num_tokens;
    const int64_t lo = std::max<int64_t>(0, pos0 - window + 1);
    const int32_t* slots = out.slots.data() + first_slot[s];  // slots[i] holds position lo + i
    // Tokens at positions < window see everything before them: one causal sequence.
    const int32_t num_full = static_cast<int32_t>(std::clamp<int64_t>(window - pos0, 0, ps.num_tokens));
    if (num_full > 0) {
      const int32_t len = static_cast<int32_t>(pos0 + num_full);
      wb.seqs.push_back(PagedSequence{ps.token_start, num_full, len, slots, len});
    }
    for (int32_t i = num_full; i < ps.num_tokens; ++i) {
      const int64_t pos = pos0 + i;
      const int64_t start = pos - window + 1;
      const int32_t len = static_cast<int32_t>(window);
      wb.seqs.push_back(PagedSequence{ps.token_start + i, 1, len, slots + (start - lo), len});
    }
  }
  return wb;
}

void LlamaLikeModel::add_lora(PartContext& c, int64_t layer, std::initializer_list<LoraOutput> outputs,
                              const float* in) const {
  Model::add_lora(c, layer, outputs, in, kLoraMid, kLoraOut);
}

const WeightView* LlamaLikeModel::lora_base(int64_t layer, LoraModule module) const {
  const LlamaLikeLayer& L = layers_[static_cast<size_t>(layer)];
  switch (module) {
    case LoraModule::kQ: return &L.wq;
    case LoraModule::kK: return &L.wk;
    case LoraModule::kV: return &L.wv;
    case LoraModule::kO: return &L.wo;
    case LoraModule::kGate: return &L.w_gate;
    case LoraModule::kUp: return &L.w_up;
    case LoraModule::kDown: return &L.w_down;
    default: return nullptr;  // deepseek2's
  }
}

void LlamaLikeModel::embed(PartContext& c) const {
  c.ops.get_rows(token_embd_, c.batch.token_ids.data(), c.batch.num_tokens(), c.buffer<float>(x_));
}

void LlamaLikeModel::attention(int64_t layer, PartContext& c) const {
  const ModelConfig& cfg = config_;
  const LlamaLikeLayer& L = layers_[static_cast<size_t>(layer)];
  const BatchInput& batch = c.batch;
  Backend& ops = c.ops;
  const int64_t n = batch.num_tokens();
  const int64_t d = cfg.hidden_size;
  const int64_t q_dim = heads_ * cfg.head_dim;  // this rank's heads
  const int64_t kv_dim = kv_heads_ * cfg.head_dim;
  float* x = c.buffer<float>(x_);
  float* h = c.scratch.f32(kH, n * d);
  float* q = c.scratch.f32(kQ, n * q_dim);
  float* k = c.scratch.f32(kK, n * kv_dim);
  float* v = c.scratch.f32(kV, n * kv_dim);
  float* attn = c.scratch.f32(kAttn, n * q_dim);
  const auto add_bias = [&](float* y, const WeightView& bias, int64_t dim) {
    if (bias.data == nullptr) return;
    for (int64_t r = 0; r < n; ++r) ops.add(y + r * dim, f32(bias), dim);
  };
  ops.rms_norm(x, f32(L.attn_norm), h, n, d, cfg.rms_norm_eps);
  const Backend::MatmulPart qkv[] = {{L.wq, q}, {L.wk, k}, {L.wv, v}};
  ops.matmul_shared(qkv, h, n);
  add_lora(c, layer, {{LoraModule::kQ, q}, {LoraModule::kK, k}, {LoraModule::kV, v}}, h);
  add_bias(q, L.bq, q_dim);
  add_bias(k, L.bk, kv_dim);
  add_bias(v, L.bv, kv_dim);
  // Each head of q and k normalized on its own (qwen3), before rope.
  if (L.q_norm.data != nullptr) ops.rms_norm(q, f32(L.q_norm), q, n * heads_, cfg.head_dim, cfg.rms_norm_eps);
  if (L.k_norm.data != nullptr) ops.rms_norm(k, f32(L.k_norm), k, n * kv_heads_, cfg.head_dim, cfg.rms_norm_eps);
  ops.rope(q, n, heads_, cfg.head_dim, batch.positions.data(), cfg.rope);
  ops.rope(k, n, kv_heads_, cfg.head_dim, batch.positions.data(), cfg.rope);
  ops.store_kv(k, batch.slot_mapping.data(), n, kv_dim, c.cache.k(layer), c.cache.dtype());
  ops.store_kv(v, batch.slot_mapping.data(), n, kv_dim, c.cache.v(layer), c.cache.dtype());
  const PagedAttentionBatch& att = L.sliding_window > 0 ? window_batch(batch, c.cache, L.sliding_window) : batch.attention;
  const Backend::AttentionShape shape{heads_, kv_heads_, cfg.head_dim, cfg.head_dim, kv_dim, kv_dim, c.cache.dtype()};
  const float scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
  ops.paged_attention(q, c.cache.k(layer), c.cache.v(layer), attn, att, shape, scale);
  ops.matmul(L.wo, attn, n, h);
  add_lora(c, layer, {{LoraModule::kO, h}}, attn);
  if (tensor_ != nullptr) tensor_->allreduce_sum(h, n * d);  // every rank's heads
  ops.add(x, h, n * d);
}

void LlamaLikeModel::feed_forward(int64_t layer, PartContext& c) const {
  const ModelConfig& cfg = config_;
  const LlamaLikeLayer& L = layers_[static_cast<size_t>(layer)];
  Backend& ops = c.ops;
  const int64_t n = c.batch.num_tokens();
  const int64_t d = cfg.hidden_size, ff = ff_;
  float* x = c.buffer<float>(x_);
  float* h = c.scratch.f32(kH, n * d);
  float* gate = c.scratch.f32(kGate, n * ff);
  float* up = c.scratch.f32(kUp, n * ff);
  ops.rms_norm(x, f32(L.ffn_norm), h, n, d, cfg.rms_norm_eps);
  const Backend::MatmulPart gate_up[] = {{L.w_gate, gate}, {L.w_up, up}};
  ops.matmul_shared(gate_up, h, n);
  add_lora(c, layer, {{LoraModule::kGate, gate}, {LoraModule::kUp, up}}, h);
  ops.silu_mul(gate, up, gate, n * ff);
  ops.matmul(L.w_down, gate, n, h);
  add_lora(c, layer, {{LoraModule::kDown, h}}, gate);
  if (tensor_ != nullptr) tensor_->allreduce_sum(h, n * d);  // every rank's share of the columns
  ops.add(x, h, n * d);
}

// Only the rows that need logits go through the output norm and head.
void LlamaLikeModel::head(PartContext& c) const {
  const ModelConfig& cfg = config_;
  const BatchInput& batch = c.batch;
  const int64_t n = batch.num_tokens(), d = cfg.hidden_size;
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  if (rows == 0) return;
  const float* x = c.buffer<float>(x_);
  float* h = c.scratch.f32(kH, rows * d);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src = batch.logits_rows[static_cast<size_t>(r)];
    if (src < 0 || src >= n) fail(ErrorCode::kInternal, "logits row {} outside the batch of {}", src, n);
    c.ops.rms_norm(x + src * d, f32(output_norm_), h + r * d, 1, d, cfg.rms_norm_eps);
  }
  if (tensor_ == nullptr) {
    c.ops.matmul(output_, h, rows, c.logits);
  } else {
    // This rank's share of the vocabulary, then every rank's, row by row.
    const int T = tensor_->size();
    float* mine = c.scratch.f32(kQ, rows * vocab_share_);
    float* all = c.scratch.f32(kAttn, rows * vocab_share_ * T);
    if (vocab_ > 0) c.ops.matmul(output_, h, rows, mine);
    tensor_->allgather(mine, all, float_bytes(rows * vocab_share_));
    for (int t = 0; t < T; ++t) {
      const int64_t v0 = std::min<int64_t>(cfg.num_vocab, vocab_share_ * t);
      const int64_t count = std::min<int64_t>(cfg.num_vocab, v0 + vocab_share_) - v0;
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(all + (t * rows + r) * vocab_share_, count, c.logits + r * cfg.num_vocab + v0);
      }
    }
  }
  write_hidden_rows(c, h);
}

}  // namespace duet
