// A grammar bound to a vocabulary (CompiledGrammar: its automaton and the token masks of the
// states met so far, shared by every sequence that uses the grammar) and one sequence's position
// in it (GrammarMatcher).
//
//   auto compiled = std::make_shared<CompiledGrammar>(grammar, vocabulary);
//   GrammarMatcher m(compiled);
//   const TokenMask& allowed = m.mask();    // before sampling: bit i set = token i allowed
//   m.accept_token(sampled);                // after
//   if (m.finished()) ...                   // the grammar is complete; nothing else may follow
//
// Not thread-safe: the engine thread owns both (a mask is computed once per state and kept).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "duet/grammar/automaton.h"
#include "duet/grammar/vocabulary.h"

namespace duet::grammar {

// One bit per token id, low bit of word 0 first.
using TokenMask = std::vector<uint64_t>;
inline bool mask_has(const TokenMask& m, int32_t id) { return (m[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; }

class CompiledGrammar {
 public:
  // Masks kept per grammar at most (bytes); past it the cache starts over.
  static constexpr size_t kMaxMaskCacheBytes = size_t{64} << 20;

  CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary);

  Automaton& automaton() { return automaton_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // The tokens allowed in `state`: tokens whose bytes the grammar accepts from there, and the
  // end tokens when it may end there.
  const TokenMask& mask(int32_t state);
  // The allowed tokens after which at most `budget` more tokens can complete the grammar (for
  // the last tokens of max_tokens, so that the output still ends as a complete match): mask()
  // itself when every allowed token leaves that much room or when none does (the output cannot
  // be completed in time), else a copy without the tokens that need more, in `scratch`
  // (`restricted` tells which).
  const TokenMask& mask_within(int32_t state, int32_t budget, TokenMask& scratch, bool& restricted);
  // Tokens it takes at most to complete the grammar from `state`: the bytes of its shortest
  // completion (a byte-level vocabulary has a token per byte) and an end token, none once the
  // grammar has ended.
  int32_t tokens_to_end(int32_t state);
  // The state after `token`; Automaton::kDead when it is not allowed (end tokens included).
  int32_t advance(int32_t state, int32_t token);
  size_t num_cached_masks() const { return num_cached_; }

 private:
  struct MaskEntry {
    TokenMask mask;
    int32_t max_tokens_to_end = 0;  // over the allowed tokens, of the state each leads to
  };
  MaskEntry& entry(int32_t state);
  void compute_mask(int32_t state, MaskEntry& entry);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  Automaton automaton_;
  std::vector<TokenVocabulary::ControlToken> control_;  // control tokens a literal names
  std::vector<std::unique_ptr<MaskEntry>> masks_;        // by state
  size_t num_cached_ = 0;
  std::vector<int32_t> walk_;                              // state per trie depth
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<CompiledGrammar> grammar);

  // Advances over a token; false (and nothing changes) when the grammar does not allow it.
  bool accept_token(int32_t token);
  // Advances over bytes; false (and nothing changes) when they are not allowed.
  bool accept_bytes(std::string_view bytes);
  const TokenMask& mask() { return grammar_->mask(state_); }
  // mask() narrowed so that at most `budget` tokens after the next one complete the grammar.
  const TokenMask& mask_within(int32_t budget, TokenMask& scratch, bool& restricted) {
    return grammar_->mask_within(state_, budget, scratch, restricted);
  }
  // The grammar may end here (end tokens allowed).
  bool can_end() const { return grammar_->automaton().accepting(state_); }
  // The grammar has ended: nothing but an end token may follow.
  bool finished() const { return grammar_->automaton().finished(state_); }
  int32_t state() const { return state_; }
  CompiledGrammar& grammar() { return *grammar_; }

 private:
  std::shared_ptr<CompiledGrammar> grammar_;
  int32_t state_;
};

}  // namespace duet::grammar
