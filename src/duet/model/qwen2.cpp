// The qwen2 architecture: DeepSeek-R1-Distill-Qwen 1.5B/7B/14B/32B (Hugging Face
// Qwen2ForCausalLM). The llama decoder (llama_like.h) with biases on the q, k and v projections,
// RoPE in the NEOX layout (llama.cpp's converter stores qwen2's q/k rows as Hugging Face has them,
// so rope rotates the halves (x[i], x[i + d/2]) of each head), and optional sliding-window
// attention:
//   qwen2.attention.sliding_window      W > 0: windowed layers let position p see p - W + 1 .. p
//                                       (Hugging Face's sliding-window mask); absent or 0: none
//   qwen2.attention.use_sliding_window  bool, default true when W is present (HF
//                                       use_sliding_window; false for R1-Distill-Qwen)
//   qwen2.attention.max_window_layers   layers l >= this use the window (HF max_window_layers),
//                                       default 0: all of them
// llama.cpp's converter writes none of these for qwen2, so its files get full attention, which is
// what R1-Distill-Qwen uses. Rope scaling: none, linear or YaRN (Qwen2.5's long-context setting);
// other types are refused with the key named.
#include "duet/model/qwen2.h"

#include "duet/core/error.h"
#include "duet/model/llama_like.h"

namespace duet {
namespace {

class Qwen2Model final : public LlamaLikeModel {
 public:
  Qwen2Model(std::shared_ptr<const GgufFile> file, Placement placement)
      : LlamaLikeModel(std::move(file), std::move(placement)) {
    const HParams hp = read_common_config();
    config_.rope.mode = RopeMode::kNeox;
    read_rope_scaling(hp);
    const int64_t window = read_sliding_window(hp);
    bind_common_weights({.qkv_bias = true});
    if (window > 0) {
      for (int64_t l = first_window_layer_; l < config_.num_layers; ++l) {
        layers_[static_cast<size_t>(l)].sliding_window = window;
      }
    }
  }

 private:
  // The window size, or 0 when no layer has one; sets first_window_layer_.
  int64_t read_sliding_window(const HParams& hp) {
    const GgufFile& f = *file_;
    const int64_t window = hp.int_or("attention.sliding_window", 0);
    if (window < 0) {
      fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, expected a window size (0: none)", f.path(),
           hp.key("attention.sliding_window"), window);
    }
    if (window == 0 || !f.get_bool_or(hp.key("attention.use_sliding_window"), true)) return 0;
    first_window_layer_ = hp.int_or("attention.max_window_layers", 0);
    if (first_window_layer_ < 0) {
      fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, expected a layer count", f.path(),
           hp.key("attention.max_window_layers"), first_window_layer_);
    }
    return window;
  }

  int64_t first_window_layer_ = 0;
};

}  // namespace

std::unique_ptr<Model> make_qwen2_model(std::shared_ptr<const GgufFile> file, Placement placement) {
  return std::make_unique<Qwen2Model>(std::move(file), std::move(placement));
}

}  // namespace duet
