// Synthetic llama and qwen2 models: the hyper-parameters of a preset and deterministic random
// weights, for tests, benchmarks and the demo. Values depend only on (seed, tensor name, row), so
// the same seed gives the same underlying weights in every type and with any number of threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "duet/core/dtype.h"
#include "duet/core/thread_pool.h"
#include "duet/formats/gguf_writer.h"

namespace duet {

struct SyntheticSpec {
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t intermediate_size = 0;
  int64_t num_vocab = 0;
  int64_t context_length = 0;
  double rope_base = 10000.0;
  double rope_scale = 1.0;  // linear factor; 1 writes no scaling keys
  double rms_norm_eps = 1e-6;
  bool tied = false;  // no output.weight: the head reuses the token embedding
  // "llama", or "qwen2": f32 biases on q, k and v (blk.N.attn_{q,k,v}.bias), qwen2.* keys.
  std::string architecture = "llama";
  // qwen2 only: a sliding attention window of this many positions (0: none) on the layers from
  // max_window_layers on (qwen2.attention.sliding_window, qwen2.attention.max_window_layers).
  int64_t sliding_window = 0;
  int64_t max_window_layers = 0;
};

// A preset by name (see synthetic_preset_names()); throws kInvalidArgument for another name.
SyntheticSpec synthetic_preset(const std::string& name);
// "tiny", "deepseek-coder-1.3b", "qwen2-tiny", "r1-distill-qwen-1.5b", "r1-distill-qwen-7b".
std::vector<std::string> synthetic_preset_names();

// Adds the <architecture>.* hyper-parameters, general.architecture/file_type and every weight
// tensor (norms and biases in f32, matrices in `type`) to `w`. The pool fills tensors while `w`
// writes, so it must outlive the write. Throws kInvalidArgument for inconsistent dimensions or an
// unknown architecture.
void add_synthetic_model(GgufWriter& w, const SyntheticSpec& spec, DType type, uint64_t seed, ThreadPool& pool);

// The same; kept for the callers written when llama was the only architecture.
inline void add_synthetic_llama(GgufWriter& w, const SyntheticSpec& spec, DType type, uint64_t seed,
                                ThreadPool& pool) {
  add_synthetic_model(w, spec, type, seed, pool);
}

}  // namespace duet
