#include "duet/engine/structured_output.h"

namespace duet {

StructuredOutputs::StructuredOutputs(const Tokenizer& tokenizer, int32_t num_vocab, std::vector<int32_t> end_ids)
    : tokenizer_(tokenizer), num_vocab_(num_vocab), end_ids_(std::move(end_ids)) {}

const grammar::TokenVocabulary& StructuredOutputs::vocabulary() {
  if (!vocabulary_) vocabulary_ = std::make_shared<const grammar::TokenVocabulary>(tokenizer_, num_vocab_, end_ids_);
  return *vocabulary_;
}

std::unique_ptr<grammar::GrammarMatcher> StructuredOutputs::matcher(const std::shared_ptr<const grammar::Grammar>& g) {
  vocabulary();
  auto it = index_.find(g.get());
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
  } else {
    lru_.emplace_front(g, std::make_shared<grammar::CompiledGrammar>(g, vocabulary_));
    index_[g.get()] = lru_.begin();
    while (lru_.size() > kCapacity) {
      index_.erase(lru_.back().first.get());
      lru_.pop_back();
    }
  }
  return std::make_unique<grammar::GrammarMatcher>(lru_.front().second);
}

}  // namespace duet
