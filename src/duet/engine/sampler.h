// Next-token choice for one sequence from its row of logits, with every option of
// SamplingParams. Stateless apart from the generator the caller passes in: each sequence owns
// its Rng, so a seeded request samples the same tokens whatever else shares the batch.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "duet/core/random.h"
#include "duet/engine/sampling_params.h"

namespace duet {

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token_id = 0;
  // Of the chosen token, under the model's raw distribution. Computed only when
  // params.logprobs is set (it costs a pass of exp over the vocabulary); 0 otherwise.
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;    // the `logprobs` most likely tokens (raw), most likely first
};

// What the penalties and min_tokens need to know about the sequence so far.
struct SequenceContext {
  std::span<const int32_t> prompt_ids;
  std::span<const int32_t> output_ids;
  std::span<const int32_t> eos_ids;  // the model's end ids (masked under min_tokens unless ignore_eos)
  // Structured output: one bit per token id (bit i of word i / 64), set for the tokens the
  // grammar allows; empty when every token is allowed.
  std::span<const uint64_t> allowed_tokens = {};
};

class Sampler {
 public:
  // Chooses the next token. `logits` is the model's raw row (num_vocab floats); it is not
  // modified. Order of processing (vLLM's): logit_bias, min_tokens masking, repetition /
  // presence / frequency penalties, then greedy argmax, or temperature, top-k, top-p, min-p and
  // a draw from `rng`. Logprobs are those of the raw logits (before any processing).
  //
  // Details:
  // - Greedy (temperature 0) takes the argmax, ties to the lower id, and draws nothing from
  //   `rng`; every other call draws exactly one rng.uniform(), so a seeded sequence's stream
  //   depends only on its own steps.
  // - top-k keeps exactly k tokens (ties at the k-th value: lower ids first). top-p is taken
  //   over the top-k set renormalized: the smallest prefix, most likely first, whose mass
  //   reaches top_p (at least one token). min-p then drops tokens below min_p * p(most likely).
  // - Tokens below exp(-87) of the most likely one (after temperature) count as probability 0.
  // - Ids out of [0, num_vocab) in logit_bias, stop ids and the context are ignored (validate()
  //   rejects them at the door; nothing here throws for one bad request).
  // - params.allowed_token_ids (when not empty), the bad_words sequences that the output ends
  //   with the start of, and ctx.allowed_tokens (when given) set the tokens they rule out to -inf
  //   after the penalties.
  // - When processing leaves every token at -inf (min_tokens masking the whole vocabulary), the
  //   argmax of the raw logits is returned (of the allowed tokens, when ctx.allowed_tokens is
  //   given).
  SampledToken sample(std::span<const float> logits, const SamplingParams& params, const SequenceContext& ctx,
                      Rng& rng);

  // The k most likely tokens of the raw logits with their log-probabilities, most likely first
  // (ties: lower id first). Used by beam search and logprobs. O(num_vocab + k log k).
  static std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int32_t k);
  // log(sum(exp(logits))): a token's logprob is its logit minus this. The maximum (-inf or +inf)
  // when no logit is finite.
  static double log_normalizer(std::span<const float> logits);

  // The logits after logit_bias, min_tokens masking and the penalties, before temperature: the
  // row greedy takes the argmax of. A view of this sampler's buffer, valid until the next call.
  // For tests and debugging; sample() itself skips the copy when nothing applies.
  std::span<const float> processed_logits(std::span<const float> logits, const SamplingParams& params,
                                          const SequenceContext& ctx);

 private:
  // Applies the processing; returns `logits` itself when nothing applies, else work_.
  const float* process(std::span<const float> logits, const SamplingParams& params, const SequenceContext& ctx);
  int32_t draw(const float* x, int32_t num_vocab, const SamplingParams& params, Rng& rng);
  int32_t draw_sorted(double total, const SamplingParams& params, Rng& rng);
  size_t draw_dense(float* e, size_t n, double total, const SamplingParams& params, Rng& rng);

  std::vector<float> work_;                     // processed logits, then their exps; reused
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<int32_t> candidate_ids_;          // ids of a large top-k set whose values are in work_
  std::vector<float> select_scratch_;           // block maxima for the top-k selection
  std::vector<double> block_sums_;              // mass per block of a dense draw
  std::vector<std::pair<float, int32_t>> bucket_;  // a dense top-p's collection space (never shrinks)
  // Occurrence counting for the penalties: a token is seen this call when stamp_[id] == epoch_
  // (no clearing between calls), count_[id] is then its count in the output.
  std::vector<uint32_t> stamp_;
  std::vector<int32_t> count_;
  std::vector<int32_t> touched_;
  std::vector<int32_t> banned_;                       // bad_words' tokens masked this call
  std::vector<std::pair<int32_t, float>> kept_;       // allowed_token_ids' values while the row is masked
  uint32_t epoch_ = 0;
};

}  // namespace duet
