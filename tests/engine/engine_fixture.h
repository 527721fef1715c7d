// A tiny synthetic model with a real tokenizer, written once per test binary, and helpers to run
// requests through an engine to completion.
#pragma once

#include <functional>
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
// deepseek32-tiny (DeepSeek-V3.2's indexer) keeping each query's 6 best positions, Q8_0.
const std::string& tiny_sparse_model_path();

struct Finished {
  std::vector<CompletionDelta> outputs;  // accumulated per index: whole text and token ids
  bool saw_finish = false;
  std::string error;
  std::vector<PromptLogprob> prompt_logprobs;  // SamplingParams::prompt_logprobs
  int prompt_logprob_outputs = 0;              // outputs that carried them (once, when asked for)
};

// Steps the engine until nothing is unfinished; returns the accumulated output per request id.
std::map<std::string, Finished> run_to_completion(LLMEngine& engine, int max_steps = 100000);

EngineConfig small_config(int64_t kv_tokens = 4096);

// 16 prompts of 1 to 50 tokens; the first six share a 17-token prefix, so prefix caching hits.
std::vector<std::vector<int32_t>> sixteen_prompts();
// Greedy decoding of exactly max_tokens tokens (eos ignored).
SamplingParams greedy(int32_t max_tokens);
// Request ids: "r0", "r1", ...
std::string id_of(size_t i);
// Every KV block is back in the pool (gtest expectations).
void expect_all_blocks_free(const LLMEngine& e);

// The engine against itself: sixteen_prompts(), greedy, run together under several configurations
// (prefix caching on and off, chunked prefill, a tiny KV pool that preempts, both) give each
// request the tokens it gets alone. `place` puts an engine's model on its devices (a device map);
// the one-at-a-time reference runs on the CPU, or placed the same way when `place_reference`.
void expect_batched_equals_one_at_a_time(const std::string& model, const std::function<EngineConfig(EngineConfig)>& place,
                                         bool place_reference);

}  // namespace duet::testing
