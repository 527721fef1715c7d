// The decoder that llama-like architectures share (llama, qwen2): token embedding; per layer
// RMSNorm, q/k/v projections (with biases where the architecture has them), RoPE, paged causal
// attention (optionally over a sliding window), output projection and residual, RMSNorm, SwiGLU
// and residual; then the output norm and head (tied or separate). An architecture derives from
// LlamaLikeModel, reads its own hyper-parameters (rope layout and scaling, windows) on top of
// read_common_config(), binds its tensors with bind_common_weights() and inherits forward().
#pragma once

#include <memory>
#include <vector>

#include "duet/model/hparams.h"
#include "duet/model/model.h"
#include "duet/model/weights.h"

namespace duet {

struct LlamaLikeLayer {
  const float* attn_norm = nullptr;
  WeightView wq, wk, wv, wo;
  // Biases of the q, k and v projections (qwen2); null for an architecture without them.
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* ffn_norm = nullptr;
  WeightView w_gate, w_up, w_down;
  // > 0: a token at position p attends only to positions p - sliding_window + 1 .. p.
  int64_t sliding_window = 0;
};

class LlamaLikeModel : public Model {
 public:
  const ModelConfig& config() const override { return config_; }
  void forward(const BatchInput& batch, PagedKvCache& cache, float* logits) override;

 protected:
  LlamaLikeModel(std::shared_ptr<const GgufFile> file, Backend& backend);

  // Fills config_ with what every llama-like architecture reads from "<arch>.*" keys: sizes,
  // heads (GQA), head size, rms eps, context, rope.dimension_count and rope.freq_base, vocabulary
  // and tied embeddings. Leaves the rope mode and scaling to the architecture.
  HParams read_common_config();
  // Reads "<arch>.rope.scaling.type" (or the older rope.scale_linear): "none" or "linear" into
  // config_.rope_scaling_factor and rope.freq_scale; throws kUnsupported naming the key for
  // another type.
  void read_linear_rope_scaling(const HParams& hp);
  // Binds the token embedding, every layer's tensors (with blk.N.attn_{q,k,v}.bias when
  // qkv_bias), the output norm and the head, then reports every problem at once.
  void bind_common_weights(bool qkv_bias);

  std::shared_ptr<const GgufFile> file_;
  Backend& backend_;
  WeightBinder weights_;
  ModelConfig config_;
  WeightView token_embd_;
  std::vector<LlamaLikeLayer> layers_;
  const float* output_norm_ = nullptr;
  WeightView output_;
  std::unique_ptr<PreparedWeights> prepared_;  // the backend's copies of the matmul weights

 private:
  // Adds `bias` (dim floats) to each of `rows` rows of y.
  void add_bias(float* y, const float* bias, int64_t rows, int64_t dim);
  // The step's attention batch for layers with a sliding window of `window` positions: every
  // token whose window starts after position 0 becomes a sequence of its own whose block table
  // lists the cache slots of its window (block size 1), so the backend's paged attention sees
  // exactly the window; the other tokens of a sequence stay one causal sequence.
  const PagedAttentionBatch& window_batch(const BatchInput& batch, const PagedKvCache& cache, int64_t window);

  // Activation scratch, sized for the largest step seen so far.
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_;
  // Sliding-window attention batch of the current step, and the window it was built for.
  PagedAttentionBatch window_batch_;
  std::vector<int32_t> window_slots_;
  int64_t window_batch_for_ = 0;
};

}  // namespace duet
