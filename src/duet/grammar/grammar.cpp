#include "duet/grammar/grammar.h"

#include <algorithm>
#include <bit>
#include <deque>
#include <functional>
#include <queue>
#include <unordered_map>

#include <fmt/format.h>

#include "duet/core/error.h"

namespace duet::grammar {

ByteSet ByteSet::of(uint8_t b) {
  ByteSet s;
  s.add(b);
  return s;
}

ByteSet ByteSet::range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.add_range(lo, hi);
  return s;
}

void ByteSet::add_range(uint8_t lo, uint8_t hi) {
  for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
}

void ByteSet::add(const ByteSet& other) {
  for (size_t i = 0; i < bits.size(); ++i) bits[i] |= other.bits[i];
}

int ByteSet::count() const {
  int n = 0;
  for (uint64_t w : bits) n += std::popcount(w);
  return n;
}

namespace {

ExprPtr make(Expr e) { return std::make_shared<const Expr>(std::move(e)); }

}  // namespace

ExprPtr empty() { return make(Expr{}); }

ExprPtr bytes(const ByteSet& set) {
  Expr e;
  e.kind = Expr::Kind::kBytes;
  e.bytes = set;
  return make(std::move(e));
}

ExprPtr literal(std::string text) {
  if (text.empty()) return empty();
  Expr e;
  e.kind = Expr::Kind::kLiteral;
  e.text = std::move(text);
  return make(std::move(e));
}

ExprPtr seq(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items.front();
  Expr e;
  e.kind = Expr::Kind::kSeq;
  e.items = std::move(items);
  return make(std::move(e));
}

ExprPtr alt(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items.front();
  Expr e;
  e.kind = Expr::Kind::kAlt;
  e.items = std::move(items);
  return make(std::move(e));
}

ExprPtr ref(int32_t rule) {
  Expr e;
  e.kind = Expr::Kind::kRef;
  e.rule = rule;
  return make(std::move(e));
}

ExprPtr repeat(ExprPtr item, int32_t min, int32_t max) {
  if (min < 0 || (max >= 0 && max < min)) {
    fail(ErrorCode::kInvalidArgument, "a repetition {{{},{}}} has its bounds the wrong way round", min, max);
  }
  if (max == 0) return empty();
  if (min == 1 && max == 1) return item;
  Expr e;
  e.kind = Expr::Kind::kRepeat;
  e.items = {std::move(item)};
  e.min = min;
  e.max = max;
  return make(std::move(e));
}

std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

CodepointRanges normalize_ranges(CodepointRanges ranges, bool negate) {
  constexpr uint32_t kMax = 0x10FFFF;
  CodepointRanges clipped;
  for (auto [lo, hi] : ranges) {
    if (lo > hi || lo > kMax) continue;
    clipped.emplace_back(lo, std::min(hi, kMax));
  }
  std::sort(clipped.begin(), clipped.end());
  CodepointRanges merged;
  for (auto r : clipped) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  if (!negate) return merged;
  CodepointRanges out;
  uint32_t next = 0;
  for (auto [lo, hi] : merged) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMax) out.emplace_back(next, kMax);
  return out;
}

ExprPtr codepoints(const CodepointRanges& input) {
  // Split each range until every piece is one run of byte ranges, as in the classic UTF-8
  // automaton construction: first by encoded length, then wherever the ranges of the trailing
  // continuation bytes would not be full.
  struct Range {
    uint32_t lo, hi;
  };
  std::vector<Range> work;
  for (auto [lo, hi] : normalize_ranges(input)) {
    // Surrogates are not characters.
    if (lo <= 0xDFFF && hi >= 0xD800) {
      if (lo < 0xD800) work.push_back({lo, 0xD7FF});
      if (hi > 0xDFFF) work.push_back({0xE000, hi});
    } else {
      work.push_back({lo, hi});
    }
  }
  ByteSet single;
  std::vector<ExprPtr> multi;
  while (!work.empty()) {
    Range r = work.back();
    work.pop_back();
    bool split = false;
    for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
      if (r.lo <= boundary && r.hi > boundary) {
        work.push_back({r.lo, boundary});
        work.push_back({boundary + 1, r.hi});
        split = true;
        break;
      }
    }
    if (split) continue;
    if (r.hi < 0x80) {
      single.add_range(static_cast<uint8_t>(r.lo), static_cast<uint8_t>(r.hi));
      continue;
    }
    const int len = r.hi < 0x800 ? 2 : r.hi < 0x10000 ? 3 : 4;
    for (int i = 1; i < len; ++i) {
      const uint32_t m = (1u << (6 * i)) - 1;
      if ((r.lo & ~m) != (r.hi & ~m)) {
        if ((r.lo & m) != 0) {
          work.push_back({r.lo, r.lo | m});
          work.push_back({(r.lo | m) + 1, r.hi});
          split = true;
          break;
        }
        if ((r.hi & m) != m) {
          work.push_back({r.lo, (r.hi & ~m) - 1});
          work.push_back({r.hi & ~m, r.hi});
          split = true;
          break;
        }
      }
    }
    if (split) continue;
    const std::string a = utf8_encode(r.lo);
    const std::string b = utf8_encode(r.hi);
    std::vector<ExprPtr> parts;
    for (size_t i = 0; i < a.size(); ++i) {
      parts.push_back(bytes(ByteSet::range(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]))));
    }
    multi.push_back(seq(std::move(parts)));
  }
  std::vector<ExprPtr> alts;
  if (!single.empty() || multi.empty()) alts.push_back(bytes(single));
  std::reverse(multi.begin(), multi.end());
  for (auto& m : multi) alts.push_back(std::move(m));
  return alt(std::move(alts));
}

// ---- lowering --------------------------------------------------------------------------------

namespace {

struct ByteSetHash {
  size_t operator()(const ByteSet& s) const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (uint64_t w : s.bits) h = (h ^ w) * 0x100000001b3ull;
    return static_cast<size_t>(h);
  }
};

class Lowerer {
 public:
  explicit Lowerer(std::vector<std::pair<std::string, ExprPtr>> rules) : rules_(std::move(rules)) {}

  void run(std::vector<Grammar::Element>& elements, std::vector<std::vector<uint32_t>>& alternatives,
           std::vector<std::string>& names, std::vector<ByteSet>& byte_sets, std::vector<std::string>& literals) {
    for (size_t r = 0; r < rules_.size(); ++r) queue_.push_back(static_cast<int32_t>(r));
    alternatives_.resize(rules_.size());
    while (!queue_.empty()) {
      const int32_t rule = queue_.front();
      queue_.pop_front();
      const ExprPtr body = rules_[static_cast<size_t>(rule)].second;
      if (!body) continue;  // declared, never defined: an error if anything refers to it
      current_ = rule;
      std::vector<ExprPtr> alts;
      if (body->kind == Expr::Kind::kAlt) {
        alts = body->items;
      } else {
        alts = {body};
      }
      for (const ExprPtr& a : alts) {
        alternatives_[static_cast<size_t>(rule)].push_back(static_cast<uint32_t>(elements_.size()));
        emit(*a);
        push({Grammar::Kind::kEnd, 0});
      }
    }
    elements = std::move(elements_);
    alternatives = std::move(alternatives_);
    names.clear();
    for (auto& [name, body] : rules_) names.push_back(name);
    byte_sets = std::move(byte_sets_);
    literals = std::move(literals_);
  }

 private:
  void push(Grammar::Element e) {
    if (elements_.size() >= GrammarBuilder::kMaxElements) {
      fail(ErrorCode::kInvalidArgument, "the grammar is too large: more than {} elements after expanding repetitions",
           GrammarBuilder::kMaxElements);
    }
    elements_.push_back(e);
  }

  uint32_t intern(const ByteSet& set) {
    auto [it, inserted] = byte_set_ids_.emplace(set, static_cast<uint32_t>(byte_sets_.size()));
    if (inserted) byte_sets_.push_back(set);
    return it->second;
  }

  int32_t helper(std::string_view suffix, ExprPtr body) {
    const int32_t id = static_cast<int32_t>(rules_.size());
    rules_.emplace_back(fmt::format("{}-{}{}", rules_[static_cast<size_t>(current_)].first, suffix, id), std::move(body));
    alternatives_.emplace_back();
    queue_.push_back(id);
    return id;
  }

  // An item of a repetition as one element when it is one, else as a helper rule.
  ExprPtr simple(const ExprPtr& item) {
    switch (item->kind) {
      case Expr::Kind::kBytes:
      case Expr::Kind::kRef: return item;
      case Expr::Kind::kLiteral:
        if (item->text.size() == 1) return item;
        break;
      default: break;
    }
    return ref(helper("g", item));
  }

  void emit(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kEmpty: return;
      case Expr::Kind::kBytes: push({Grammar::Kind::kBytes, intern(e.bytes)}); return;
      case Expr::Kind::kLiteral:
        literals_.push_back(e.text);
        for (char c : e.text) push({Grammar::Kind::kBytes, intern(ByteSet::of(static_cast<uint8_t>(c)))});
        return;
      case Expr::Kind::kSeq:
        for (const ExprPtr& item : e.items) emit(*item);
        return;
      case Expr::Kind::kRef:
        if (e.rule < 0 || static_cast<size_t>(e.rule) >= rules_.size()) {
          fail(ErrorCode::kInternal, "grammar rule reference {} out of range", e.rule);
        }
        push({Grammar::Kind::kRule, static_cast<uint32_t>(e.rule)});
        return;
      case Expr::Kind::kAlt: {
        if (e.items.empty()) {
          push({Grammar::Kind::kBytes, intern(ByteSet{})});  // matches nothing
          return;
        }
        auto self = std::make_shared<const Expr>(e);
        push({Grammar::Kind::kRule, static_cast<uint32_t>(helper("a", self))});
        return;
      }
      case Expr::Kind::kRepeat: {
        const ExprPtr x = simple(e.items.front());
        for (int32_t i = 0; i < e.min; ++i) emit(*x);
        if (e.max < 0) {
          const int32_t s = helper("star", nullptr);
          rules_[static_cast<size_t>(s)].second = alt({seq({x, ref(s)}), empty()});
          push({Grammar::Kind::kRule, static_cast<uint32_t>(s)});
        } else if (e.max > e.min) {
          int32_t inner = helper("opt", alt({x, empty()}));
          for (int32_t k = e.max - e.min - 1; k > 0; --k) {
            if (elements_.size() + static_cast<size_t>(k) >= GrammarBuilder::kMaxElements) {
              fail(ErrorCode::kInvalidArgument, "the grammar is too large: a repetition up to {} times", e.max);
            }
            inner = helper("opt", alt({seq({x, ref(inner)}), empty()}));
          }
          push({Grammar::Kind::kRule, static_cast<uint32_t>(inner)});
        }
        return;
      }
    }
  }

  std::vector<std::pair<std::string, ExprPtr>> rules_;
  std::deque<int32_t> queue_;
  int32_t current_ = 0;
  std::vector<Grammar::Element> elements_;
  std::vector<std::vector<uint32_t>> alternatives_;
  std::vector<ByteSet> byte_sets_;
  std::unordered_map<ByteSet, uint32_t, ByteSetHash> byte_set_ids_;
  std::vector<std::string> literals_;
};

}  // namespace

int32_t GrammarBuilder::declare(std::string name) {
  rules_.push_back(RuleDef{std::move(name), nullptr});
  return static_cast<int32_t>(rules_.size() - 1);
}

void GrammarBuilder::define(int32_t rule, ExprPtr body) { rules_.at(static_cast<size_t>(rule)).body = std::move(body); }

int32_t GrammarBuilder::add(std::string name, ExprPtr body) {
  const int32_t id = declare(std::move(name));
  define(id, std::move(body));
  return id;
}

bool GrammarBuilder::defined(int32_t rule) const { return rules_.at(static_cast<size_t>(rule)).body != nullptr; }

namespace {

// The fewest bytes per rule, by Knuth's form of Dijkstra's shortest paths over the grammar: a
// rule's least length is final when it is the smallest of the alternatives whose references are
// all final. Linear but for the heap (passes over every rule until none changed took one pass
// per link of a chain of rules: 100,000 rules, 10^10 steps).
std::vector<int32_t> fewest_bytes(const Grammar& g) {
  constexpr int64_t kNever = Grammar::kNever;
  std::vector<int32_t> rule_min(g.num_rules(), Grammar::kNever);
  std::vector<uint32_t> owner;                                 // per alternative: its rule
  std::vector<int64_t> partial;                                // per alternative: bytes of its final parts
  std::vector<size_t> pending;                                 // per alternative: references not yet final
  std::vector<std::vector<uint32_t>> named_in(g.num_rules());  // per rule: alternatives naming it
  using Candidate = std::pair<int64_t, uint32_t>;              // (length, rule)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> ready;
  for (uint32_t r = 0; r < g.num_rules(); ++r) {
    for (uint32_t a : g.alternatives(r)) {
      const auto alt = static_cast<uint32_t>(owner.size());
      owner.push_back(r);
      int64_t bytes = 0;
      size_t refs = 0;
      for (uint32_t p = a; g.at(p).kind != Grammar::Kind::kEnd; ++p) {
        const Grammar::Element& e = g.at(p);
        if (e.kind == Grammar::Kind::kRule) {
          ++refs;
          named_in[e.value].push_back(alt);
        } else {
          bytes = std::min<int64_t>(bytes + (g.byte_set(e.value).empty() ? kNever : 1), kNever);
        }
      }
      partial.push_back(bytes);
      pending.push_back(refs);
      if (refs == 0) ready.emplace(bytes, r);
    }
  }
  std::vector<bool> done(g.num_rules(), false);
  while (!ready.empty()) {
    const auto [length, r] = ready.top();
    ready.pop();
    if (done[r] || length >= kNever) continue;
    done[r] = true;
    rule_min[r] = static_cast<int32_t>(length);
    for (uint32_t alt : named_in[r]) {
      partial[alt] = std::min<int64_t>(partial[alt] + length, kNever);
      if (--pending[alt] == 0 && !done[owner[alt]]) ready.emplace(partial[alt], owner[alt]);
    }
  }
  return rule_min;
}

}  // namespace

Grammar GrammarBuilder::build(int32_t root) && {
  if (root < 0 || static_cast<size_t>(root) >= rules_.size()) fail(ErrorCode::kInternal, "grammar root {} out of range", root);
  std::vector<std::pair<std::string, ExprPtr>> rules;
  for (RuleDef& r : rules_) rules.emplace_back(std::move(r.name), std::move(r.body));
  const size_t num_user_rules = rules.size();
  std::vector<bool> user_defined(num_user_rules);
  for (size_t i = 0; i < num_user_rules; ++i) user_defined[i] = rules[i].second != nullptr;

  Grammar g;
  Lowerer(std::move(rules)).run(g.elements_, g.alternatives_, g.rule_names_, g.byte_sets_, g.literals_);
  g.root_ = static_cast<uint32_t>(root);

  // Every referenced rule must be defined.
  for (const Grammar::Element& e : g.elements_) {
    if (e.kind == Grammar::Kind::kRule && g.alternatives_[e.value].empty()) {
      fail(ErrorCode::kInvalidArgument, "grammar rule '{}' is used but never defined", g.rule_names_[e.value]);
    }
  }
  if (g.alternatives_[g.root_].empty()) fail(ErrorCode::kInvalidArgument, "grammar rule '{}' is never defined", g.rule_names_[g.root_]);

  g.min_bytes_ = fewest_bytes(g);
  const size_t n = g.alternatives_.size();
  std::vector<bool> nullable(n);
  for (size_t r = 0; r < n; ++r) nullable[r] = g.min_bytes_[r] == 0;
  // A rule reachable from itself through references preceded only by nullable rules would make
  // the matcher expand forever.
  std::vector<std::vector<uint32_t>> left(n);
  for (size_t r = 0; r < n; ++r) {
    for (uint32_t pos : g.alternatives_[r]) {
      for (uint32_t p = pos; g.elements_[p].kind == Grammar::Kind::kRule; ++p) {
        left[r].push_back(g.elements_[p].value);
        if (!nullable[g.elements_[p].value]) break;
      }
    }
  }
  // Depth-first, with its own stack (a chain of 100,000 rules, each naming the next, recursed
  // as deep and ended the server with a stack overflow): path holds the rules on the way down,
  // next_edge the index of each one's next left reference to follow.
  std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<uint32_t> path;
  std::vector<size_t> next_edge;
  for (size_t root = 0; root < n; ++root) {
    if (color[root] != 0) continue;
    color[root] = 1;
    path.push_back(static_cast<uint32_t>(root));
    next_edge.push_back(0);
    while (!path.empty()) {
      const uint32_t r = path.back();
      if (next_edge.back() == left[r].size()) {
        color[r] = 2;
        path.pop_back();
        next_edge.pop_back();
        continue;
      }
      const uint32_t s = left[r][next_edge.back()++];
      if (color[s] == 1) {
        std::string cycle;
        const auto from = std::find(path.begin(), path.end(), s);
        for (auto it = from; it != path.end(); ++it) cycle += g.rule_names_[*it] + " -> ";
        cycle += g.rule_names_[s];
        fail(ErrorCode::kInvalidArgument,
             "grammar rule '{}' can reach itself without consuming input ({}): left recursion, or a repetition of "
             "something that can be empty",
             g.rule_names_[s], cycle);
      }
      if (color[s] == 0) {
        color[s] = 1;
        path.push_back(s);
        next_edge.push_back(0);
      }
    }
  }
  return g;
}

// ---- printing --------------------------------------------------------------------------------

namespace {

std::string byte_text(int b) {
  if (b == '\\' || b == ']' || b == '-' || b == '^' || b == '"') return fmt::format("\\{}", static_cast<char>(b));
  if (b >= 0x20 && b < 0x7F) return std::string(1, static_cast<char>(b));
  return fmt::format("\\x{:02X}", b);
}

std::string set_text(const ByteSet& s) {
  const int n = s.count();
  if (n == 1) {
    for (int b = 0; b < 256; ++b) {
      if (s.has(static_cast<uint8_t>(b))) {
        if (b == '"' || b == '\\') return fmt::format("\"\\{}\"", static_cast<char>(b));
        if (b >= 0x20 && b < 0x7F) return fmt::format("\"{}\"", static_cast<char>(b));
        return fmt::format("[\\x{:02X}]", b);
      }
    }
  }
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!s.has(static_cast<uint8_t>(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && s.has(static_cast<uint8_t>(e + 1))) ++e;
    out += byte_text(b);
    if (e > b) {
      out += '-';
      out += byte_text(e);
    }
    b = e + 1;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::to_gbnf() const {
  std::string out;
  for (size_t r = 0; r < alternatives_.size(); ++r) {
    out += rule_names_[r] + " ::=";
    for (size_t a = 0; a < alternatives_[r].size(); ++a) {
      if (a > 0) out += " |";
      uint32_t p = alternatives_[r][a];
      if (elements_[p].kind == Kind::kEnd) out += " \"\"";
      for (; elements_[p].kind != Kind::kEnd; ++p) {
        const Element& e = elements_[p];
        out += " ";
        out += e.kind == Kind::kRule ? rule_names_[e.value] : set_text(byte_sets_[e.value]);
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace duet::grammar
