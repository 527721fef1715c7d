#include "duet/grammar/automaton.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "duet/core/error.h"

namespace duet::grammar {
namespace {

// Bounds the memory one grammar's automaton may take (a row of transitions is 1 KiB).
constexpr size_t kMaxStates = 200000;
// Rule references and ends of rules one transition of the matcher may pass through without
// reading a byte, over all its stacks (an optional item in a row is two, and each stack that
// reads the byte walks the ones after it): past it one request would hold the engine for seconds.
constexpr int64_t kMaxExpandSteps = 1 << 16;

std::string key_of(const std::vector<std::vector<uint32_t>>& stacks, bool accept) {
  size_t words = 1;
  for (const auto& s : stacks) words += 1 + s.size();
  std::string key(words * sizeof(uint32_t), '\0');
  char* p = key.data();
  auto put = [&p](uint32_t v) {
    std::memcpy(p, &v, sizeof v);
    p += sizeof v;
  };
  put(accept ? 1u : 0u);
  for (const auto& s : stacks) {
    put(static_cast<uint32_t>(s.size()));
    for (uint32_t v : s) put(v);
  }
  return key;
}

}  // namespace

Automaton::Automaton(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  // Fewest bytes from each position to the end of its alternative.
  const Grammar& g = *grammar_;
  auto element_cost = [&](uint32_t pos) -> int64_t {
    const Grammar::Element& e = g.at(pos);
    if (e.kind == Grammar::Kind::kBytes) return g.byte_set(e.value).empty() ? kNever : 1;
    if (e.kind == Grammar::Kind::kRule) return g.min_bytes(e.value);
    return 0;
  };
  rest_.assign(g.num_elements(), 0);
  for (size_t p = g.num_elements(); p-- > 0;) {
    if (g.at(static_cast<uint32_t>(p)).kind == Grammar::Kind::kEnd) continue;
    rest_[p] = static_cast<int32_t>(std::min<int64_t>(element_cost(static_cast<uint32_t>(p)) + rest_[p + 1], kNever));
  }
  State s;
  int64_t steps = 0;
  for (uint32_t a : grammar_->alternatives(grammar_->root())) {
    std::vector<uint32_t> stack{a};
    expand(stack, s.stacks, s.accept, steps);
  }
  std::sort(s.stacks.begin(), s.stacks.end());
  s.stacks.erase(std::unique(s.stacks.begin(), s.stacks.end()), s.stacks.end());
  start_ = intern(std::move(s));
}

void Automaton::expand(std::vector<uint32_t>& s, std::vector<std::vector<uint32_t>>& out, bool& accept,
                       int64_t& steps) const {
  // The closure walked with a list of its own (a recursion per rule reference and end of rule
  // overflowed the stack on 100,000 optional items in a row): each step expands the stack's
  // top, pushes or pops one position, and leaves `s` as it found it once the list is empty.
  struct Step {
    enum Kind : uint8_t { kExpand, kPush, kPop } kind;
    uint32_t pos = 0;
  };
  std::vector<Step> todo{{Step::kExpand}};
  while (!todo.empty()) {
    const Step step = todo.back();
    todo.pop_back();
    if (step.kind == Step::kPush) {
      s.push_back(step.pos);
      continue;
    }
    if (step.kind == Step::kPop) {
      s.pop_back();
      continue;
    }
    if (++steps > kMaxExpandSteps) {
      fail(ErrorCode::kResourceExhausted, "the grammar passes through more than {} rule references and ends of rules "
           "without reading a byte (too complex for one request)", kMaxExpandSteps);
    }
    const uint32_t pos = s.back();
    const Grammar::Element& e = grammar_->at(pos);
    switch (e.kind) {
      case Grammar::Kind::kBytes: out.push_back(s); break;
      case Grammar::Kind::kEnd:
        // Return to the caller's continuation, then put this frame back.
        s.pop_back();
        todo.push_back({Step::kPush, pos});
        if (s.empty()) {
          accept = true;
        } else {
          todo.push_back({Step::kExpand});
        }
        break;
      case Grammar::Kind::kRule: {
        s.pop_back();
        // A reference at the end of its alternative returns straight to the caller's caller.
        const bool tail = grammar_->at(pos + 1).kind == Grammar::Kind::kEnd;
        if (!tail) s.push_back(pos + 1);
        // Run last to first: each alternative pushed, expanded and popped; then the frame restored.
        todo.push_back({Step::kPush, pos});
        if (!tail) todo.push_back({Step::kPop});
        const auto& alternatives = grammar_->alternatives(e.value);
        for (auto a = alternatives.rbegin(); a != alternatives.rend(); ++a) {
          todo.push_back({Step::kPop});
          todo.push_back({Step::kExpand});
          todo.push_back({Step::kPush, *a});
        }
        break;
      }
    }
  }
}

int32_t Automaton::intern(State state) {
  if (state.stacks.empty() && !state.accept) return kDead;
  std::string key = key_of(state.stacks, state.accept);
  auto it = ids_.find(key);
  if (it != ids_.end()) return it->second;
  if (states_.size() >= kMaxStates) {
    fail(ErrorCode::kResourceExhausted, "the grammar's matcher reached {} states (nesting too deep for one request)",
         kMaxStates);
  }
  const int32_t id = static_cast<int32_t>(states_.size());
  states_.push_back(std::move(state));
  rows_.emplace_back();
  ids_.emplace(std::move(key), id);
  return id;
}

int32_t Automaton::compute(int32_t state, uint8_t byte) {
  const std::vector<std::vector<uint32_t>> stacks = states_[static_cast<size_t>(state)].stacks;
  State next;
  std::vector<uint32_t> s;
  int64_t steps = 0;
  for (const auto& stack : stacks) {
    const Grammar::Element& top = grammar_->at(stack.back());
    if (!grammar_->byte_set(top.value).has(byte)) continue;
    s = stack;
    s.back() += 1;
    expand(s, next.stacks, next.accept, steps);
  }
  std::sort(next.stacks.begin(), next.stacks.end());
  next.stacks.erase(std::unique(next.stacks.begin(), next.stacks.end()), next.stacks.end());
  const int32_t id = intern(std::move(next));
  auto& row = rows_[static_cast<size_t>(state)];
  if (!row) {
    row = std::make_unique<std::array<int32_t, 256>>();
    row->fill(kUnknown);
  }
  (*row)[byte] = id;
  return id;
}

int32_t Automaton::distance_to_end(int32_t state) {
  if (distance_.size() < states_.size()) distance_.resize(states_.size(), -1);
  int32_t& d = distance_[static_cast<size_t>(state)];
  if (d >= 0) return d;
  const State& s = states_[static_cast<size_t>(state)];
  int64_t best = s.accept ? 0 : kNever;
  for (const auto& stack : s.stacks) {
    // The top continues its alternative, and each frame below continues its own after it.
    int64_t sum = 0;
    for (uint32_t pos : stack) sum += rest_[pos];
    best = std::min(best, sum);
  }
  d = static_cast<int32_t>(std::min<int64_t>(best, kNever));
  return d;
}

int32_t Automaton::run(int32_t state, std::string_view bytes) {
  for (char c : bytes) {
    if (state == kDead) return kDead;
    state = next(state, static_cast<uint8_t>(c));
  }
  return state;
}

}  // namespace duet::grammar
