// The qwen3 architecture: DeepSeek-R1-0528-Qwen3-8B (Hugging Face Qwen3ForCausalLM). The llama
// decoder (llama_like.h) with three differences from qwen2: no q/k/v biases; an RMSNorm over each
// query and each key head (blk.N.attn_q_norm.weight and attn_k_norm.weight, head_dim values each,
// the model's rms eps) between the projection and rope; and a head size of its own
// (qwen3.attention.key_length: 128 for every Qwen3, whatever hidden_size / heads is). RoPE in the
// NEOX layout as qwen2 (llama.cpp's converter keeps Hugging Face's q/k rows). Rope scaling: none,
// linear or YaRN; R1-0528-Qwen3-8B's config asks for YaRN x4 over 32,768 positions with an
// attn_factor that cancels YaRN's magnitude factor.
#include "duet/model/qwen3.h"

#include "duet/model/llama_like.h"

namespace duet {
namespace {

class Qwen3Model final : public LlamaLikeModel {
 public:
  Qwen3Model(std::shared_ptr<const GgufFile> file, Placement placement)
      : LlamaLikeModel(std::move(file), std::move(placement)) {
    const HParams hp = read_common_config();
    config_.rope.mode = RopeMode::kNeox;
    read_rope_scaling(hp);
    bind_common_weights({.qk_norm = true});
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen3_model(std::shared_ptr<const GgufFile> file, Placement placement) {
  return std::make_unique<Qwen3Model>(std::move(file), std::move(placement));
}

}  // namespace duet
