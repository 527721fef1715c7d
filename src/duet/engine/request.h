// A request and its sequences as the engine tracks them, and what the engine reports back.
// A request starts with one sequence holding its prompt; with n > 1 or beam search it fans out
// into several once the prompt is computed, the new sequences sharing the prompt's KV blocks.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "duet/cache/kv_cache_manager.h"
#include "duet/core/error.h"
#include "duet/core/random.h"
#include "duet/engine/sampler.h"
#include "duet/engine/sampling_params.h"
#include "duet/engine/stop_strings.h"
#include "duet/grammar/matcher.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet {

using Clock = std::chrono::steady_clock;

enum class FinishReason { kStop, kLength, kAbort, kError };
std::string_view finish_reason_name(FinishReason reason);  // "stop", "length", "abort", "error"

struct Sequence {
  Sequence(SeqId id, int32_t index, std::vector<int32_t> tokens, int32_t num_prompt_tokens, uint64_t seed);
  // A copy of `parent` under a new id and index (same tokens, text state and generator state
  // reseeded from `seed`); the KV blocks are shared separately through the cache manager.
  Sequence(const Sequence& parent, SeqId id, int32_t index, uint64_t seed);

  SeqId id;
  int32_t index;                  // the choice index within its request
  std::vector<int32_t> tokens;    // prompt, then output
  int32_t num_prompt_tokens;
  int32_t num_computed_tokens = 0;  // tokens whose K/V are in the cache
  Rng rng;
  double cumulative_logprob = 0.0;
  std::vector<SampledToken> logprobs;  // one per output token, when requested
  std::optional<FinishReason> finish_reason;
  std::string stop_reason;        // the stop string or token that ended it

  // Output text: detokenized incrementally, stop strings applied.
  std::unique_ptr<IncrementalDetokenizer> detokenizer;
  std::unique_ptr<StopStringMatcher> stop_matcher;
  std::string text;               // emitted so far
  size_t text_reported = 0;       // bytes of `text` already reported
  size_t tokens_reported = 0;     // output tokens already reported
  bool finish_reported = false;   // the finish reason has been reported

  // Speculative decoding: tokens proposed to follow `tokens`, computed in the next step with
  // them and verified when its logits come back (cleared then, or when the sequence is preempted).
  std::vector<int32_t> draft;

  // Structured output: where the output is in the request's grammar (null without one). Until
  // the grammar applies (params.grammar_after not seen yet), the output text so far.
  std::unique_ptr<grammar::GrammarMatcher> matcher;
  bool grammar_active = false;
  std::string grammar_pending;
  // The end of max_tokens narrowed the grammar's choices toward its shortest completion (the
  // output is complete, and finishes as "length").
  bool grammar_steered = false;

  int32_t num_output_tokens() const { return static_cast<int32_t>(tokens.size()) - num_prompt_tokens; }
  std::span<const int32_t> output_ids() const {
    return std::span<const int32_t>(tokens).subspan(static_cast<size_t>(num_prompt_tokens));
  }
  bool finished() const { return finish_reason.has_value(); }
};

// A finished beam-search hypothesis: it holds no KV blocks any more.
struct BeamHypothesis {
  std::vector<int32_t> output_ids;
  std::vector<SampledToken> logprobs;
  double cumulative_logprob = 0.0;
  double score = 0.0;
  FinishReason finish_reason = FinishReason::kStop;
  std::string stop_reason;
};

struct RequestTimes {
  Clock::time_point arrival;
  std::optional<Clock::time_point> first_scheduled;
  std::optional<Clock::time_point> first_token;
  std::optional<Clock::time_point> last_token;
  std::optional<Clock::time_point> finished;
};

// The log-probability of a prompt token under the model given the tokens before it (vLLM's
// prompt_logprobs): its rank in the vocabulary (1: the most likely) and the most likely tokens.
struct PromptLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<TokenLogprob> top;
};

struct Request {
  std::string id;
  int64_t arrival_order = 0;      // ties in priority go to the earlier request
  int32_t priority = 0;           // lower runs first (vLLM's convention)
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  // Where its sequences' prefix-cache chains start (chain_hashes' salt): from its LoRA adapter and
  // cache_salt; 0 for the base model without a salt.
  uint64_t prefix_salt = 0;
  std::vector<std::unique_ptr<Sequence>> seqs;  // live and finished
  std::vector<BeamHypothesis> beam_hypotheses;  // beam search: finished hypotheses
  bool fanned_out = false;        // n > 1 / beam search: the prompt sequence has been forked
  bool running = false;           // in the scheduler's running list (else waiting)
  bool in_flight = false;         // scheduled in a step whose results are not processed yet
  int32_t num_cached_tokens = 0;  // prompt tokens found in the prefix cache at first admission
  std::vector<float> embedding;   // SamplingParams::embedding: the output, once the prompt is computed
  // SamplingParams::prompt_logprobs: entry i is prompt position i + 1's (position 0 has none).
  // Positions are recorded once (a preempted request's recomputed prompt adds nothing); the whole
  // list goes out in one output, once every position is in.
  std::vector<PromptLogprob> prompt_logprobs;
  int32_t num_prompt_logprobs = 0;
  bool prompt_logprobs_sent = false;
  int32_t num_preemptions = 0;
  int32_t num_oom_retries = 0;    // steps of it that ran out of memory and were computed again
  RequestTimes times;
  std::string error;              // set when it ended with FinishReason::kError
  ErrorCode error_code = ErrorCode::kInternal;  // and what kind of failure it was

  // Sequences still generating.
  std::vector<Sequence*> live_seqs() const;
  bool finished() const;
  int32_t width() const { return params.candidates(); }  // sequences after fan-out
};

// What one step produced for one request: new text and tokens per sequence since the last
// report, and, once finished, the reason. Beam search reports only when it finishes, with the
// n best hypotheses as whole outputs.
struct CompletionDelta {
  int32_t index = 0;
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<SampledToken> logprobs;
  double cumulative_logprob = 0.0;
  std::optional<FinishReason> finish_reason;
  std::string stop_reason;
};

struct RequestOutput {
  std::string request_id;
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;
  std::vector<CompletionDelta> outputs;
  // An embedding request's output (SamplingParams::embedding), in the output that finishes it: the
  // last prompt token's final normalised hidden state, hidden_size floats.
  std::vector<float> embedding;
  // SamplingParams::prompt_logprobs, in one output (the one with the first token): prompt
  // positions 1 onwards (position 0 has none).
  std::vector<PromptLogprob> prompt_logprobs;
  bool has_prompt_logprobs = false;
  bool finished = false;
  std::string error;  // the message when a request failed
  ErrorCode error_code = ErrorCode::kInternal;  // what kind of failure, when error is set
  // Set when finished: seconds from arrival to first scheduling and to the first token (-1 if
  // it never got there).
  double queue_seconds = -1.0;
  double ttft_seconds = -1.0;
};

}  // namespace duet
