// The pushdown matcher of a grammar, determinized lazily. A matcher state is the set of parse
// stacks the input so far allows (each a list of grammar positions, the top one at a byte set;
// a rule reference whose return position would be the end of its alternative pushes nothing, so
// repetitions do not grow the stack), plus whether the input may end here. States are interned
// into ids and each (state, byte) transition is computed once, so advancing over a token, or
// walking the whole vocabulary's trie for a token mask, is mostly table lookups: inside a JSON
// string, every ordinary character leads back to the same state.
#pragma once

#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "duet/grammar/grammar.h"

namespace duet::grammar {

class Automaton {
 public:
  static constexpr int32_t kDead = -1;

  explicit Automaton(std::shared_ptr<const Grammar> grammar);

  const Grammar& grammar() const { return *grammar_; }
  // The state before any input.
  int32_t start() const { return start_; }
  // The state after `byte`, or kDead when the grammar does not allow it.
  int32_t next(int32_t state, uint8_t byte) {
    std::array<int32_t, 256>* row = rows_[static_cast<size_t>(state)].get();
    if (row != nullptr) {
      const int32_t n = (*row)[byte];
      if (n != kUnknown) return n;
    }
    return compute(state, byte);
  }
  // Runs `bytes` from `state`; kDead as soon as one is refused.
  int32_t run(int32_t state, std::string_view bytes);
  // The input may end in this state (a complete match).
  bool accepting(int32_t state) const { return states_[static_cast<size_t>(state)].accept; }
  // Nothing more may follow: accepting, and no stack is left.
  bool finished(int32_t state) const { return states_[static_cast<size_t>(state)].stacks.empty(); }
  // The fewest bytes that complete a match from this state (0 when it is accepting); kNever
  // when none can.
  static constexpr int32_t kNever = Grammar::kNever;
  int32_t distance_to_end(int32_t state);
  size_t num_states() const { return states_.size(); }
  // The stacks of a state, bottom first (tests and debugging).
  const std::vector<std::vector<uint32_t>>& stacks(int32_t state) const { return states_[static_cast<size_t>(state)].stacks; }

 private:
  static constexpr int32_t kUnknown = -2;
  struct State {
    std::vector<std::vector<uint32_t>> stacks;  // sorted, unique
    bool accept = false;
  };

  int32_t compute(int32_t state, uint8_t byte);
  // Moves a stack whose top may be a rule reference or the end of an alternative on to byte
  // sets, adding every resulting stack to `out` (and setting `accept` when one empties).
  // `steps` counts the work of one transition over its calls; past a bound it throws
  // kResourceExhausted.
  void expand(std::vector<uint32_t>& stack, std::vector<std::vector<uint32_t>>& out, bool& accept,
              int64_t& steps) const;
  int32_t intern(State state);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<State> states_;
  std::vector<std::unique_ptr<std::array<int32_t, 256>>> rows_;
  std::vector<int32_t> rest_;      // per position: fewest bytes from it to the end of its alternative
  std::vector<int32_t> distance_;  // per state, -1 until computed
  std::unordered_map<std::string, int32_t> ids_;
  int32_t start_ = kDead;
};

}  // namespace duet::grammar
