// A context-free grammar over bytes: the one form every structured-output constraint compiles to
// (JSON Schema, regular expressions, choices, GBNF text, tool-call formats). Compilers build
// expressions (Expr), a GrammarBuilder lowers them into rules whose alternatives are flat
// sequences of byte sets and rule references, and the matcher (matcher.h) walks those.
//
//   GrammarBuilder b;
//   const int32_t digits = b.add("digits", repeat(bytes(ByteSet::range('0', '9')), 1, 3));
//   Grammar g = std::move(b).build(b.add("root", seq({literal("n="), ref(digits)})));
//
// Working on bytes keeps tokens simple (a token is its bytes, whatever characters it splits):
// a class of Unicode code points becomes the alternatives of its UTF-8 byte sequences
// (codepoints() below).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace duet::grammar {

// A set of bytes: the terminal of the grammar.
struct ByteSet {
  std::array<uint64_t, 4> bits{};

  static ByteSet of(uint8_t b);
  static ByteSet range(uint8_t lo, uint8_t hi);
  void add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi);
  void add(const ByteSet& other);
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  int count() const;
  bool operator==(const ByteSet&) const = default;
};

// An expression of the grammar, as the compilers build it. Immutable and shared.
struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;
struct Expr {
  enum class Kind { kEmpty, kBytes, kLiteral, kSeq, kAlt, kRef, kRepeat };
  Kind kind = Kind::kEmpty;
  ByteSet bytes;               // kBytes
  std::string text;            // kLiteral: these bytes in order
  std::vector<ExprPtr> items;  // kSeq, kAlt; kRepeat: the one repeated item
  int32_t rule = -1;           // kRef
  int32_t min = 0;             // kRepeat
  int32_t max = -1;            // kRepeat: -1 is unbounded
};

ExprPtr empty();
ExprPtr bytes(const ByteSet& set);
ExprPtr literal(std::string text);
ExprPtr seq(std::vector<ExprPtr> items);
ExprPtr alt(std::vector<ExprPtr> items);
ExprPtr ref(int32_t rule);
ExprPtr repeat(ExprPtr item, int32_t min, int32_t max);  // max -1: unbounded
inline ExprPtr optional(ExprPtr item) { return repeat(std::move(item), 0, 1); }
inline ExprPtr star(ExprPtr item) { return repeat(std::move(item), 0, -1); }
inline ExprPtr plus(ExprPtr item) { return repeat(std::move(item), 1, -1); }

// The deepest nesting of groups the text parsers (regex, GBNF) take. They, and the lowering of
// the expressions they build, recurse once per level: 100,000 nested parentheses in a client's
// guided_regex or guided_grammar ended the server with a stack overflow.
inline constexpr int kMaxGroupDepth = 128;

// Code point ranges [first, second], inclusive.
using CodepointRanges = std::vector<std::pair<uint32_t, uint32_t>>;
// Sorts, merges and clips ranges to [0, 0x10FFFF]; with `negate`, the complement.
CodepointRanges normalize_ranges(CodepointRanges ranges, bool negate = false);
// One character from the ranges, as the alternatives of its UTF-8 encodings (surrogates
// U+D800..U+DFFF are never produced). Empty ranges give an expression that matches nothing.
ExprPtr codepoints(const CodepointRanges& ranges);
// The UTF-8 encoding of one code point.
std::string utf8_encode(uint32_t cp);

// The lowered grammar. Positions index a flat array of elements; every alternative of a rule is
// a run of elements that ends with kEnd.
class Grammar {
 public:
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  struct Element {
    Kind kind;
    uint32_t value;  // kBytes: byte set index; kRule: rule id
  };

  // A length no match reaches: min_bytes of a rule nothing matches (an empty byte set on every
  // path), and sums past it.
  static constexpr int32_t kNever = INT32_MAX / 4;

  const Element& at(uint32_t pos) const { return elements_[pos]; }
  // The fewest bytes a match of the rule takes (0: it can match the empty string).
  int32_t min_bytes(uint32_t rule) const { return min_bytes_[rule]; }
  const ByteSet& byte_set(uint32_t index) const { return byte_sets_[index]; }
  std::span<const uint32_t> alternatives(uint32_t rule) const { return alternatives_[rule]; }
  const std::string& rule_name(uint32_t rule) const { return rule_names_[rule]; }
  uint32_t root() const { return root_; }
  size_t num_rules() const { return alternatives_.size(); }
  size_t num_elements() const { return elements_.size(); }
  // Literal texts the compilers used (control tokens of a vocabulary whose text appears in one
  // of them may be produced, e.g. the tool-call markers; other control tokens never are).
  const std::vector<std::string>& literals() const { return literals_; }
  // The rules in GBNF notation, for debugging and tests.
  std::string to_gbnf() const;

 private:
  friend class GrammarBuilder;
  std::vector<Element> elements_;
  std::vector<std::vector<uint32_t>> alternatives_;
  std::vector<std::string> rule_names_;
  std::vector<ByteSet> byte_sets_;
  std::vector<std::string> literals_;
  std::vector<int32_t> min_bytes_;
  uint32_t root_ = 0;
};

class GrammarBuilder {
 public:
  // The most elements a grammar may lower to (bounded repetitions expand): a larger one is refused.
  static constexpr size_t kMaxElements = 1 << 20;

  // A rule to define later (for recursion); names need not be unique (helpers get suffixes).
  int32_t declare(std::string name);
  void define(int32_t rule, ExprPtr body);
  int32_t add(std::string name, ExprPtr body);
  bool defined(int32_t rule) const;
  const std::string& name(int32_t rule) const { return rules_[static_cast<size_t>(rule)].name; }

  // Lowers every rule. Throws kInvalidArgument for a rule referenced but never defined, a rule
  // that can reach itself without consuming input (left recursion, or repeating something that
  // can be empty), and a grammar over kMaxElements.
  Grammar build(int32_t root) &&;

 private:
  struct RuleDef {
    std::string name;
    ExprPtr body;
  };
  std::vector<RuleDef> rules_;
};

}  // namespace duet::grammar
