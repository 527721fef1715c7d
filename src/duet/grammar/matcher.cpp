#include "duet/grammar/matcher.h"

#include <algorithm>
#include <bit>

namespace duet::grammar {

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary)
    : grammar_(grammar), vocabulary_(std::move(vocabulary)), automaton_(std::move(grammar)) {
  for (const TokenVocabulary::ControlToken& c : vocabulary_->control_tokens()) {
    const auto& lits = grammar_->literals();
    if (std::any_of(lits.begin(), lits.end(), [&](const std::string& l) { return l.find(c.text) != std::string::npos; })) {
      control_.push_back(c);
    }
  }
}

CompiledGrammar::MaskEntry& CompiledGrammar::entry(int32_t state) {
  if (masks_.size() <= static_cast<size_t>(state)) masks_.resize(automaton_.num_states());
  if (!masks_[static_cast<size_t>(state)]) {
    const size_t bytes = vocabulary_->num_mask_words() * sizeof(uint64_t);
    if ((num_cached_ + 1) * bytes > kMaxMaskCacheBytes) {
      for (auto& m : masks_) m.reset();
      num_cached_ = 0;
    }
    auto e = std::make_unique<MaskEntry>();
    e->mask.assign(vocabulary_->num_mask_words(), 0);
    compute_mask(state, *e);
    // Computing may have added states; the slot is looked up again.
    if (masks_.size() <= static_cast<size_t>(state)) masks_.resize(automaton_.num_states());
    masks_[static_cast<size_t>(state)] = std::move(e);
    ++num_cached_;
  }
  return *masks_[static_cast<size_t>(state)];
}

const TokenMask& CompiledGrammar::mask(int32_t state) { return entry(state).mask; }

int32_t CompiledGrammar::tokens_to_end(int32_t state) {
  if (automaton_.finished(state)) return 0;
  const int32_t d = automaton_.distance_to_end(state);
  return d >= Automaton::kNever ? Automaton::kNever : d + 1;
}

void CompiledGrammar::compute_mask(int32_t state, MaskEntry& entry) {
  TokenMask& mask = entry.mask;
  int32_t& worst = entry.max_tokens_to_end;
  const std::vector<TokenVocabulary::Node>& nodes = vocabulary_->nodes();
  const std::vector<int32_t>& ids = vocabulary_->sorted_ids();
  auto set = [&mask](int32_t id) { mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); };
  // One pass over the trie in depth-first order: walk_[d] is the state after the node's first
  // d bytes; a refused prefix skips its subtree.
  walk_.assign(1, state);
  size_t i = 0;
  while (i < nodes.size()) {
    const TokenVocabulary::Node& n = nodes[i];
    walk_.resize(n.depth);
    const int32_t s = automaton_.next(walk_.back(), n.byte);
    if (s == Automaton::kDead) {
      i = n.subtree_end;
      continue;
    }
    if (n.token_end > n.token_begin) {
      for (uint32_t t = n.token_begin; t < n.token_end; ++t) set(ids[t]);
      worst = std::max(worst, tokens_to_end(s));
    }
    walk_.push_back(s);
    ++i;
  }
  for (const TokenVocabulary::ControlToken& c : control_) {
    const int32_t s = automaton_.run(state, c.text);
    if (s != Automaton::kDead) {
      set(c.id);
      worst = std::max(worst, tokens_to_end(s));
    }
  }
  if (automaton_.accepting(state)) {
    for (int32_t id : vocabulary_->end_ids()) {
      if (id >= 0 && id < vocabulary_->num_vocab()) set(id);
    }
  }
}

const TokenMask& CompiledGrammar::mask_within(int32_t state, int32_t budget, TokenMask& scratch, bool& restricted) {
  restricted = false;
  const MaskEntry& e = entry(state);
  if (e.max_tokens_to_end <= budget) return e.mask;
  scratch = e.mask;
  bool any = false;
  for (size_t w = 0; w < scratch.size(); ++w) {
    for (uint64_t bits = scratch[w]; bits != 0; bits &= bits - 1) {
      const auto id = static_cast<int32_t>(w * 64 + static_cast<size_t>(std::countr_zero(bits)));
      if (vocabulary_->is_end(id)) {
        any = true;
        continue;
      }
      const int32_t next = advance(state, id);
      if (next == Automaton::kDead || tokens_to_end(next) > budget) {
        scratch[w] &= ~(uint64_t{1} << (id & 63));
        restricted = true;
      } else {
        any = true;
      }
    }
  }
  if (!any) {
    restricted = false;
    return e.mask;
  }
  return scratch;
}

int32_t CompiledGrammar::advance(int32_t state, int32_t token) {
  if (token < 0 || token >= vocabulary_->num_vocab()) return Automaton::kDead;
  if (vocabulary_->is_end(token)) return Automaton::kDead;
  if (vocabulary_->is_control(token) &&
      std::none_of(control_.begin(), control_.end(), [token](const auto& c) { return c.id == token; })) {
    return Automaton::kDead;  // a control token the grammar does not name
  }
  const std::string& b = vocabulary_->bytes(token);
  if (b.empty()) return Automaton::kDead;
  return automaton_.run(state, b);
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), state_(grammar_->automaton().start()) {}

bool GrammarMatcher::accept_token(int32_t token) {
  const int32_t next = grammar_->advance(state_, token);
  if (next == Automaton::kDead) return false;
  state_ = next;
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  const int32_t next = grammar_->automaton().run(state_, bytes);
  if (next == Automaton::kDead) return false;
  state_ = next;
  return true;
}

}  // namespace duet::grammar
