// A tiny synthetic model with a real tokenizer, written once per test binary, and helpers to run
// requests through an engine to completion.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "duet/engine/llm_engine.h"

namespace duet::testing {

// Path of a tiny f32 llama GGUF (vocabulary 384 from the built-in corpus), written on first use.
const std::string& tiny_model_path();
// The tiny llama model with 400 rows of logits but the 384-token tokenizer: the rows past the
// tokenizer are padding, as in models whose vocabulary is rounded up (Qwen2's 151,646 tokens
// over 152,064 rows).
const std::string& padded_vocab_model_path();
// The same tokenizer on a q8_0 deepseek2 model (MLA over a latent cache, 8 routed experts, V3
// routing): deepseek2-tiny-v3 with vocabulary 384.
const std::string& tiny_moe_model_path();
// The same with one multi-token-prediction layer (DeepSeek-V3's MTP, for speculative decoding).
const std::string& tiny_mtp_model_path();

struct Finished {
  std::vector<CompletionDelta> outputs;  // accumulated per index: whole text and token ids
  bool saw_finish = false;
  std::string error;
};

// Steps the engine until nothing is unfinished; returns the accumulated output per request id.
std::map<std::string, Finished> run_to_completion(LLMEngine& engine, int max_steps = 100000);

EngineConfig small_config(int64_t kv_tokens = 4096);

}  // namespace duet::testing
