// Hugging Face config.json and generation_config.json translated to the GGUF metadata keys that
// llama.cpp's converter writes (general.*, <arch>.*), so that a model folder reads like a GGUF
// file. Supported: LlamaForCausalLM (llama), Qwen2ForCausalLM (qwen2), Qwen3ForCausalLM (qwen3),
// DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (deepseek2), DeepseekV32ForCausalLM (deepseek32). A
// setting duet cannot honour (another rope scaling, an activation other than SiLU, biases llama has
// no slot for, ...) is refused here with the config key named, never dropped.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "duet/formats/gguf.h"

namespace duet {

using GgufMetadata = std::vector<std::pair<std::string, GgufValue>>;

// Parses a JSON file. Throws kNotFound when it is absent and kDataLoss naming the file and the
// byte offset when it does not parse.
nlohmann::json read_json_file(const std::string& path);

struct HfModelConfig {
  std::string architecture;     // the GGUF name: "llama", "qwen2", "qwen3", "deepseek2" or "deepseek32"
  std::string hf_architecture;  // "LlamaForCausalLM", ...
  int64_t num_layers = 0;       // num_hidden_layers
  int64_t num_mtp_layers = 0;   // DeepSeek-V3's multi-token-prediction layers, numbered after them
  int64_t num_experts = 0;      // routed experts (deepseek2), 0 for a dense model
  bool tied_embeddings = false;  // tie_word_embeddings: lm_head is the token embedding
  // llama3 rope scaling: each rotated pair's frequency divisor (GGUF's rope_freqs.weight).
  std::vector<float> rope_freq_factors;
  // quantization_config: DeepSeek's FP8 (e4m3 weights, one scale per fp8_block x fp8_block) or
  // AutoAWQ int4 (GEMM layout, zero points, awq_group inputs per scale); 0 when not.
  int64_t fp8_block = 0;
  int64_t awq_group = 0;
  GgufMetadata metadata;        // general.architecture, general.name, <arch>.* keys
};

// Llama 3 rope scaling (R1-Distill-Llama) as each rotated pair's frequency divisor, GGUF's
// rope_freqs.weight: pairs faster than original_context / high_freq_factor keep their frequency,
// those slower than original_context / low_freq_factor are divided by `factor`, the ones between
// blend the two. head_dim / 2 values.
std::vector<float> llama3_rope_freq_factors(double theta, int64_t head_dim, double factor, double low_freq_factor,
                                            double high_freq_factor, double original_context);

// Translates `config_path` (a config.json). `name` becomes general.name. Throws kNotFound for a
// missing file, kInvalidArgument naming a missing or ill-typed key, kUnsupported naming an
// unknown architecture (with the supported list) or a setting duet does not implement.
HfModelConfig read_hf_config(const std::string& config_path, const std::string& name);

// The Hugging Face architectures read_hf_config accepts.
std::vector<std::string> supported_hf_architectures();

// generation_config.json (when the file exists) as duet.generation.* keys: temperature, top_p,
// top_k, repetition_penalty, do_sample, bos_token_id and eos_token_ids (one id or a list).
void add_hf_generation_config(const std::string& path, GgufMetadata& metadata);

}  // namespace duet
