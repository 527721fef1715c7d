// The decoder that llama-like architectures share (llama, qwen2, qwen3): token embedding; per layer
// RMSNorm, q/k/v projections (with biases where the architecture has them, and an RMSNorm of each
// query and key head where it has that: qwen3), RoPE, paged causal
// attention (optionally over a sliding window), output projection and residual, RMSNorm, SwiGLU
// and residual; then the output norm and head (tied or separate). An architecture derives from
// LlamaLikeModel, reads its own hyper-parameters (rope layout and scaling, windows) on top of
// read_common_config(), and binds its tensors with bind_common_weights(), which also lays out the
// forward pass as parts (embed, each layer's attention and feed-forward, head) on their devices.
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "duet/model/hparams.h"
#include "duet/model/model.h"
#include "duet/model/shard.h"
#include "duet/model/weights.h"

namespace duet {

struct LlamaLikeLayer {
  WeightView attn_norm;
  WeightView wq, wk, wv, wo;
  // Biases of the q, k and v projections (qwen2); no data for an architecture without them.
  WeightView bq, bk, bv;
  // RMSNorm weights over each query and key head's values, applied before rope (qwen3); no data
  // for an architecture without them.
  WeightView q_norm, k_norm;
  WeightView ffn_norm;
  WeightView w_gate, w_up, w_down;
  // > 0: a token at position p attends only to positions p - sliding_window + 1 .. p.
  int64_t sliding_window = 0;
};

class LlamaLikeModel : public Model {
 public:
  const ModelConfig& config() const override { return config_; }
  // Under tensor parallelism a rank caches only its kv heads.
  int64_t cache_k_dim() const override { return kv_heads_ * config_.head_dim; }
  int64_t cache_v_dim() const override { return kv_heads_ * config_.head_dim; }

 protected:
  LlamaLikeModel(std::shared_ptr<const GgufFile> file, Placement placement);

  // Fills config_ with what every llama-like architecture reads from "<arch>.*" keys: sizes,
  // heads (GQA), head size, rms eps, context, rope.dimension_count and rope.freq_base, vocabulary
  // and tied embeddings. Leaves the rope mode and scaling to the architecture.
  HParams read_common_config();
  // Reads "<arch>.rope.scaling.type" (or the older rope.scale_linear): "none", "linear", or
  // "yarn" (rope.scaling.factor over rope.scaling.original_context_length, the optional
  // rope.scaling.yarn_beta_fast / yarn_beta_slow, and rope.scaling.yarn_attn_factor, which
  // multiplies YaRN's own magnitude factor 0.1 ln(factor) + 1 as llama.cpp's rope does) into
  // config_.rope_scaling_factor and config_.rope; throws kUnsupported naming the key for another
  // type.
  void read_rope_scaling(const HParams& hp);
  // The tensors an architecture has beyond llama's.
  struct Extras {
    bool qkv_bias = false;  // blk.N.attn_{q,k,v}.bias
    bool qk_norm = false;   // blk.N.attn_{q,k}_norm.weight, [head_dim] each
  };
  // Binds the token embedding, every layer's tensors (with `extras`), the output norm and the
  // head, reports every problem at once, lays out the parts and has each device load its parts'
  // tensors.
  void bind_common_weights(Extras extras);

  WeightBinder weights_;
  ModelConfig config_;
  WeightView token_embd_;
  std::vector<LlamaLikeLayer> layers_;
  WeightView output_norm_;
  WeightView output_;

 private:
  void embed(PartContext& c) const;
  // Model::add_lora with this model's scratch slots.
  void add_lora(PartContext& c, int64_t layer, std::initializer_list<LoraOutput> outputs, const float* in) const;
  const WeightView* lora_base(int64_t layer, LoraModule module) const override;
  LoraShard lora_shard(LoraModule module) const override { return lora_shards_[static_cast<size_t>(module)]; }
  void attention(int64_t layer, PartContext& c) const;
  void feed_forward(int64_t layer, PartContext& c) const;
  void head(PartContext& c) const;
  // The step's attention batch for layers with a sliding window of `window` positions: every
  // token whose window starts after position 0 becomes a sequence of its own whose block table
  // lists the cache slots of its window (block size 1), so the backend's paged attention sees
  // exactly the window; the other tokens of a sequence stay one causal sequence. Kept in the
  // batch for the step's other windowed layers.
  const PagedAttentionBatch& window_batch(const BatchInput& batch, const PagedKvCache& cache, int64_t window) const;

  // This rank's shard under tensor parallelism (everything with one rank): query heads from
  // head0_, kv heads, feed-forward rows, and the vocabulary rows [vocab0_, vocab0_ + vocab_) of
  // the head, whose logits are gathered in shares of vocab_share_.
  void shard_weights();
  Communicator* tensor_ = nullptr;  // null: one rank
  int64_t heads_ = 0, kv_heads_ = 0, ff_ = 0, vocab0_ = 0, vocab_ = 0, vocab_share_ = 0;
  WeightShards shards_;
  std::array<LoraShard, kNumLoraModules> lora_shards_{};  // the same rows and columns as the base's

  int x_ = 0;  // the carried residual stream, [n, hidden]
};

}  // namespace duet
