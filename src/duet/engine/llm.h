// The offline API, in the spirit of vLLM's LLM class: construct from a model file and an engine
// config, then generate for many prompts at once; the engine batches them continuously.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "duet/engine/llm_engine.h"

namespace duet {

struct CompletionResult {
  int32_t index = 0;
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<SampledToken> logprobs;  // when requested
  double cumulative_logprob = 0.0;
  FinishReason finish_reason = FinishReason::kStop;
  std::string stop_reason;
};

struct GenerationResult {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  int32_t num_cached_tokens = 0;
  std::vector<CompletionResult> outputs;  // by index
  std::string error;                      // set when the request failed
};

// One prompt: text (tokenized with the model's tokenizer, BOS as its metadata says, special
// tokens parsed) or token ids.
struct PromptInput {
  std::string text;
  std::optional<std::vector<int32_t>> token_ids;
};

class LLM {
 public:
  LLM(const std::string& model_path, const EngineConfig& config);

  // Runs every prompt through the engine at once and returns the results in input order.
  // `params` has one entry for all prompts or one per prompt. Throws kInvalidArgument naming the
  // prompt for a prompt the engine refuses, before anything runs. `on_progress(done, total)` is
  // called as requests finish.
  std::vector<GenerationResult> generate(const std::vector<PromptInput>& prompts,
                                         const std::vector<SamplingParams>& params,
                                         const std::function<void(size_t, size_t)>& on_progress = nullptr);

  LLMEngine& engine() { return *engine_; }
  std::vector<int32_t> tokenize(const std::string& text) const;

 private:
  std::unique_ptr<LLMEngine> engine_;
  int64_t next_id_ = 0;
};

}  // namespace duet
