#include "duet/engine/request.h"

namespace duet {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

Sequence::Sequence(SeqId id_, int32_t index_, std::vector<int32_t> tokens_, int32_t num_prompt_tokens_, uint64_t seed)
    : id(id_), index(index_), tokens(std::move(tokens_)), num_prompt_tokens(num_prompt_tokens_), rng(seed) {}

Sequence::Sequence(const Sequence& parent, SeqId id_, int32_t index_, uint64_t seed)
    : id(id_),
      index(index_),
      tokens(parent.tokens),
      num_prompt_tokens(parent.num_prompt_tokens),
      num_computed_tokens(parent.num_computed_tokens),
      rng(seed),
      cumulative_logprob(parent.cumulative_logprob),
      logprobs(parent.logprobs),
      text(parent.text),
      text_reported(parent.text_reported),
      tokens_reported(parent.tokens_reported),
      matcher(parent.matcher ? std::make_unique<grammar::GrammarMatcher>(*parent.matcher) : nullptr),
      grammar_active(parent.grammar_active),
      grammar_pending(parent.grammar_pending),
      grammar_steered(parent.grammar_steered) {}

std::vector<Sequence*> Request::live_seqs() const {
  std::vector<Sequence*> live;
  for (const auto& s : seqs) {
    if (!s->finished()) live.push_back(s.get());
  }
  return live;
}

bool Request::finished() const { return live_seqs().empty(); }

}  // namespace duet
