// The engine's side of structured output: the model's vocabulary as grammars see it (built on
// the first constrained request), each grammar bound to it once and shared by every sequence
// that uses it (so token masks computed for one request serve the next), and a matcher per
// sequence. Engine thread only.
#pragma once

#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "duet/grammar/matcher.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet {

class StructuredOutputs {
 public:
  // Grammars kept bound (with their automata and masks) after their last request.
  static constexpr size_t kCapacity = 64;

  StructuredOutputs(const Tokenizer& tokenizer, int32_t num_vocab, std::vector<int32_t> end_ids);

  // A matcher at the start of `grammar`.
  std::unique_ptr<grammar::GrammarMatcher> matcher(const std::shared_ptr<const grammar::Grammar>& grammar);
  const grammar::TokenVocabulary& vocabulary();

 private:
  const Tokenizer& tokenizer_;
  int32_t num_vocab_;
  std::vector<int32_t> end_ids_;
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary_;
  using Entry = std::pair<std::shared_ptr<const grammar::Grammar>, std::shared_ptr<grammar::CompiledGrammar>>;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<const grammar::Grammar*, std::list<Entry>::iterator> index_;
};

}  // namespace duet
