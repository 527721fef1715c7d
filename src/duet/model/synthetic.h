// Synthetic llama models: the hyper-parameters of a preset and deterministic random weights, for
// tests, benchmarks and the demo. Values depend only on (seed, tensor name, row), so the same
// seed gives the same underlying weights in every type and with any number of threads.
#pragma once

#include <cstdint>
#include <string>

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
};

// "tiny" or "deepseek-coder-1.3b"; throws kInvalidArgument for another name.
SyntheticSpec synthetic_preset(const std::string& name);

// Adds the llama.* hyper-parameters, general.architecture/file_type and every weight tensor
// (norms in f32, matrices in `type`) to `w`. The pool fills tensors while `w` writes, so it must
// outlive the write. Throws kInvalidArgument for inconsistent dimensions.
void add_synthetic_llama(GgufWriter& w, const SyntheticSpec& spec, DType type, uint64_t seed, ThreadPool& pool);

}  // namespace duet
