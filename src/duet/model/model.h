// The architecture seam: a model declares its hyper-parameters, binds its weights by name and
// runs its forward pass in Backend ops. Architectures register in registry.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "duet/backend/backend.h"
#include "duet/formats/gguf.h"

namespace duet {

struct ModelConfig {
  std::string architecture;  // general.architecture
  std::string name;          // general.name, if any
  int64_t num_vocab = 0;
  int64_t context_length = 0;  // the training context
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  float rms_norm_eps = 1e-6f;
  RopeParams rope;
  double rope_scaling_factor = 1.0;  // linear factor (rope.freq_scale = 1 / factor)
  bool tied_embeddings = false;

  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

// A contiguous per-sequence KV cache: for each layer, K and V rows of kv_dim floats for positions
// 0..capacity-1. (The paged, shared cache belongs to the engine.)
class ContiguousKvCache {
 public:
  ContiguousKvCache(int64_t num_layers, int64_t capacity, int64_t kv_dim);
  int64_t capacity() const { return capacity_; }
  float* k(int64_t layer) { return k_[static_cast<size_t>(layer)].data(); }
  float* v(int64_t layer) { return v_[static_cast<size_t>(layer)].data(); }

 private:
  int64_t capacity_;
  std::vector<std::vector<float>> k_;
  std::vector<std::vector<float>> v_;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;

  // Runs `tokens` (at positions pos0, pos0+1, ...) through the model, writing their K/V into
  // `cache`. Writes the logits of the last token to `logits` ([num_vocab]), or of every token
  // ([tokens.size(), num_vocab]) when `all_logits`. Throws kInvalidArgument when the tokens do not
  // fit in the cache or an id is outside the vocabulary.
  virtual void forward(std::span<const int32_t> tokens, int64_t pos0, ContiguousKvCache& cache, float* logits,
                       bool all_logits) = 0;

  std::unique_ptr<ContiguousKvCache> new_cache(int64_t capacity) const {
    const ModelConfig& c = config();
    return std::make_unique<ContiguousKvCache>(c.num_layers, capacity, c.kv_dim());
  }
};

// Reads the architecture from general.architecture and builds that model over the file's
// weights (used in place; `file` is kept alive by the model). Throws kUnsupported for an unknown
// architecture and kInvalidArgument listing every missing or mismatched tensor.
std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file, Backend& backend);

// Architectures this build can run.
std::vector<std::string> supported_architectures();

}  // namespace duet
