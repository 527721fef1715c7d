#include "duet/engine/llm.h"

#include <map>
#include <thread>

#include "duet/core/error.h"

namespace duet {

LLM::LLM(const std::string& model_path, const EngineConfig& config)
    : engine_(LLMEngine::from_file(model_path, config)) {}

std::vector<int32_t> LLM::tokenize(const std::string& text) const {
  return engine_->tokenizer().encode(text, true, true);
}

std::vector<GenerationResult> LLM::generate(const std::vector<PromptInput>& prompts,
                                            const std::vector<SamplingParams>& params,
                                            const std::function<void(size_t, size_t)>& on_progress) {
  if (params.size() != 1 && params.size() != prompts.size()) {
    fail(ErrorCode::kInvalidArgument, "{} sampling parameter sets for {} prompts (expected 1 or {})", params.size(),
         prompts.size(), prompts.size());
  }
  std::vector<GenerationResult> results(prompts.size());
  std::map<std::string, size_t> slot;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const SamplingParams& p = params.size() == 1 ? params.front() : params[i];
    GenerationResult& res = results[i];
    res.request_id = "offline-" + std::to_string(next_id_++);
    res.prompt_token_ids = prompts[i].token_ids ? *prompts[i].token_ids : tokenize(prompts[i].text);
    try {
      engine_->add_request(res.request_id, res.prompt_token_ids, p);
    } catch (const Error& e) {
      for (const auto& [id, index] : slot) engine_->abort_request(id);
      while (engine_->has_unfinished()) engine_->step();
      throw Error(e.code(), fmt::format("prompt {}: {}", i, e.what()));
    }
    const int32_t width = p.n;
    res.outputs.resize(static_cast<size_t>(width));
    for (int32_t k = 0; k < width; ++k) res.outputs[static_cast<size_t>(k)].index = k;
    slot[res.request_id] = i;
  }
  size_t done = 0;
  while (engine_->has_unfinished()) {
    if (const auto until = engine_->batch_wait_deadline()) std::this_thread::sleep_until(*until);
    for (RequestOutput& o : engine_->step()) {
      GenerationResult& res = results[slot.at(o.request_id)];
      res.num_cached_tokens = o.num_cached_tokens;
      if (!o.error.empty()) res.error = o.error;
      for (CompletionDelta& d : o.outputs) {
        if (d.index < 0 || d.index >= static_cast<int32_t>(res.outputs.size())) continue;
        CompletionResult& c = res.outputs[static_cast<size_t>(d.index)];
        c.text += d.text;
        c.token_ids.insert(c.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
        c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
        c.cumulative_logprob = d.cumulative_logprob;
        if (d.finish_reason) {
          c.finish_reason = *d.finish_reason;
          c.stop_reason = d.stop_reason;
        }
      }
      if (o.finished && on_progress) on_progress(++done, prompts.size());
    }
  }
  return results;
}

}  // namespace duet
