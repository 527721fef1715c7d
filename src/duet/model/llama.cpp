// The llama architecture: DeepSeek-LLM 7B/67B, DeepSeek-Coder, DeepSeek-R1-Distill-Llama.
// Token embedding, RMSNorm, RoPE (frequency base, linear or YaRN scaling, llama3's per-pair
// divisors) on the GGUF q/k layout (or
// Hugging Face's, when a folder says duet.rope.layout = neox),
// grouped-query causal attention, SwiGLU, output norm and head (tied or separate); the decoder
// itself is llama_like.h's.
#include "duet/model/llama.h"

#include "duet/core/error.h"
#include "duet/model/llama_like.h"

namespace duet {
namespace {

class LlamaModel final : public LlamaLikeModel {
 public:
  LlamaModel(std::shared_ptr<const GgufFile> file, Placement placement)
      : LlamaLikeModel(std::move(file), std::move(placement)) {
    const HParams hp = read_common_config();
    // llama.cpp's converter permutes the q/k rows so that rope rotates adjacent pairs; a Hugging
    // Face folder keeps them as they are (rotating halves) and says so in duet.rope.layout.
    const std::string layout = file_->get_string_or("duet.rope.layout", "normal");
    if (layout != "normal" && layout != "neox") {
      fail(ErrorCode::kInvalidArgument, "'{}': duet.rope.layout is '{}', expected normal or neox", file_->path(), layout);
    }
    config_.rope.mode = layout == "neox" ? RopeMode::kNeox : RopeMode::kNormal;
    read_rope_scaling(hp);
    bind_common_weights({});
  }
};

}  // namespace

std::unique_ptr<Model> make_llama_model(std::shared_ptr<const GgufFile> file, Placement placement) {
  return std::make_unique<LlamaModel>(std::move(file), std::move(placement));
}

}  // namespace duet
