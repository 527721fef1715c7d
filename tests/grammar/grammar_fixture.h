// Helpers of the grammar tests: whole-text matching through the automaton, and a random walk
// that produces texts a grammar accepts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "duet/grammar/automaton.h"
#include "duet/grammar/grammar.h"

namespace duet::grammar::testing {

// True when the grammar accepts exactly `text`.
inline bool matches(Automaton& a, std::string_view text) {
  const int32_t s = a.run(a.start(), text);
  return s != Automaton::kDead && a.accepting(s);
}

inline bool matches(const Grammar& g, std::string_view text) {
  Automaton a(std::make_shared<const Grammar>(g));
  return matches(a, text);
}

// The fewest bytes that lead from `state` to an accepting one (SIZE_MAX past 5000 states).
inline size_t distance_to_end(Automaton& a, int32_t state) {
  std::vector<int32_t> frontier{state};
  std::unordered_set<int32_t> seen{state};
  for (size_t d = 0; !frontier.empty() && seen.size() < 5000; ++d) {
    std::vector<int32_t> next;
    for (int32_t s : frontier) {
      if (a.accepting(s)) return d;
      for (int b = 0; b < 256; ++b) {
        const int32_t n = a.next(s, static_cast<uint8_t>(b));
        if (n != Automaton::kDead && seen.insert(n).second) next.push_back(n);
      }
    }
    frontier = std::move(next);
  }
  return SIZE_MAX;
}

// A random complete match of the grammar: each step takes a random allowed byte, ending with
// probability `end_bias` whenever the grammar may end, and always once `max_bytes` is reached
// and ending is possible. Returns false if no complete match was found within 4 * max_bytes.
inline bool random_match(Automaton& a, std::mt19937& rng, std::string& out, size_t max_bytes = 200,
                         double end_bias = 0.3) {
  out.clear();
  int32_t s = a.start();
  std::vector<uint8_t> allowed;
  while (out.size() < 4 * max_bytes) {
    if (a.accepting(s) && (a.finished(s) || out.size() >= max_bytes ||
                           std::uniform_real_distribution<double>(0, 1)(rng) < end_bias)) {
      return true;
    }
    allowed.clear();
    for (int b = 0; b < 256; ++b) {
      if (a.next(s, static_cast<uint8_t>(b)) != Automaton::kDead) allowed.push_back(static_cast<uint8_t>(b));
    }
    if (allowed.empty()) return false;
    // Past the length budget, take a byte on a shortest way to the end.
    uint8_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    if (out.size() >= max_bytes) {
      size_t best = SIZE_MAX;
      for (uint8_t c : allowed) {
        const size_t d = distance_to_end(a, a.next(s, c));
        if (d < best) {
          best = d;
          pick = c;
        }
      }
    }
    out += static_cast<char>(pick);
    s = a.next(s, pick);
  }
  return false;
}

}  // namespace duet::grammar::testing
