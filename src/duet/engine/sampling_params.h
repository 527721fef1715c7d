// Every sampling option a request can carry, under vLLM's names and meanings.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "duet/grammar/grammar.h"

namespace duet {

// The first parameter that validation rejects: `param` is its OpenAI/vLLM field name (what an
// HTTP 400 reports as `param`), `message` begins with that name and says the value and the
// allowed range, e.g. "top_p is 1.5, expected a number in (0, 1]".
struct InvalidParam {
  std::string param;
  std::string message;
};

struct SamplingParams {
  static constexpr int32_t kMaxLogprobs = 20;     // OpenAI's and vLLM's default limit
  static constexpr float kMaxLogitBias = 100.0f;  // OpenAI: logit_bias values in [-100, 100]

  int32_t n = 1;                   // completions per prompt (sharing the prompt's KV blocks)
  // OpenAI's best_of: candidates generated per prompt, of which the n with the highest log
  // probability per token are returned, whole, once all have finished (0: n). Not streamed.
  int32_t best_of = 0;
  float temperature = 1.0f;        // 0: greedy
  float top_p = 1.0f;              // nucleus: smallest set with this probability mass
  int32_t top_k = 0;               // 0 or -1: no limit; otherwise exactly k tokens (ties: lower id)
  float min_p = 0.0f;              // drop tokens below min_p * p(most likely)
  float repetition_penalty = 1.0f;  // > 1 discourages tokens seen in prompt or output
  float presence_penalty = 0.0f;   // subtracted once from tokens present in the output
  float frequency_penalty = 0.0f;  // subtracted per occurrence in the output
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the raw logits (a repeated id adds up)
  // vLLM's allowed_token_ids: when not empty, only these tokens are sampled (the others -inf).
  std::vector<int32_t> allowed_token_ids;
  // vLLM's bad_words, as token sequences (the server tokenizes the words): the last token of a
  // sequence is never sampled where the output so far ends with the tokens before it (a sequence
  // of one token is never sampled).
  std::vector<std::vector<int32_t>> bad_words_token_ids;
  std::optional<uint64_t> seed;    // same seed, same output, whatever else is in the batch
  std::vector<std::string> stop;   // stop strings, matched across token boundaries
  std::vector<int32_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  int32_t min_tokens = 0;          // eos and stop_token_ids are masked until this many tokens
  int32_t max_tokens = 16;
  std::optional<int32_t> logprobs;  // top logprobs per output token (0: the chosen token's only)
  // vLLM's prompt_logprobs: each prompt token's logprob given those before it, its rank, and the
  // this many most likely tokens there (0: the prompt token's only). Such a request computes its
  // whole prompt (no prefix-cache reuse), every row's logits.
  std::optional<int32_t> prompt_logprobs;
  // Beam search with beam width `n`, ranking beams by the raw log-probabilities of the model
  // (Sampler::top_logprobs), as vLLM's beam search does. The sampling options (temperature,
  // top_p, top_k, min_p, seed, penalties, logit_bias) do not apply to it and are accepted and
  // ignored rather than rejected, so clients that always send a temperature still work.
  bool use_beam_search = false;
  float length_penalty = 1.0f;     // beam score = cumulative logprob / length^length_penalty
  bool skip_special_tokens = true;
  // Structured output: the output must be a complete match of this grammar. Only the tokens it
  // allows are sampled, end tokens only where it may end, and the sequence finishes (stop) as
  // soon as nothing more may follow. Not with beam search.
  std::shared_ptr<const grammar::Grammar> grammar;
  // The grammar applies to the output after the first occurrence of this text (a reasoning
  // model's "</think>"); empty: from the first token.
  std::string grammar_after;
  // Embeddings (/v1/embeddings): no token is generated; the request finishes once its prompt is
  // computed, with the last prompt token's final normalised hidden state as its output
  // (RequestOutput::embedding). Only with n = 1 and no beam search; the rest is not used.
  bool embedding = false;
  // The LoRA adapter the request runs with: 0 the base model, i the engine's i-th adapter
  // (EngineConfig::lora_adapters, 1-based). add_request refuses one the engine does not have.
  int32_t lora_adapter = 0;
  // vLLM's cache_salt: the request's KV blocks are cached under this salt, so only requests with
  // the same salt (and adapter) reuse them; empty shares with every request without one.
  std::string cache_salt;

  // Throws kInvalidArgument with InvalidParam::message of the first bad parameter.
  // vocab_size bounds logit_bias and stop_token_ids ids (<= 0: not checked). max_logprobs bounds
  // logprobs and prompt_logprobs (vLLM's --max-logprobs); -1: the whole vocabulary, and then -1
  // asks for all of it (resolved_logprobs).
  void validate(int32_t vocab_size = 0, int32_t max_logprobs = kMaxLogprobs) const;
  // The same checks without throwing: the first bad parameter, or nothing when all are valid.
  std::optional<InvalidParam> find_invalid(int32_t vocab_size = 0, int32_t max_logprobs = kMaxLogprobs) const;
  // logprobs and prompt_logprobs with -1 (the whole vocabulary) made vocab_size.
  void resolve_logprobs(int32_t vocab_size);
  bool greedy() const { return temperature == 0.0f; }
  // Sequences generated per prompt: n, or best_of candidates.
  int32_t candidates() const { return std::max(n, best_of); }
  // best_of past n: the candidates are ranked, so each sampled token's logprob is needed.
  bool ranks_candidates() const { return best_of > n; }
};

}  // namespace duet
