#include "duet/grammar/regex.h"

#include <fmt/format.h>

#include "duet/core/error.h"

namespace duet::grammar {
namespace {

constexpr int32_t kMaxCount = 10000;  // the largest {n,m} bound taken

CodepointRanges digit_ranges() { return {{'0', '9'}}; }
CodepointRanges word_ranges() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
CodepointRanges space_ranges() {
  return {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
          {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + static_cast<size_t>(len) > s.size()) {
      fail(ErrorCode::kInvalidArgument, "the regular expression is not valid UTF-8 at byte {}", i);
    }
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return out;
}

class RegexParser {
 public:
  RegexParser(std::string_view pattern, RegexTarget target) : text_(decode_utf8(pattern)), target_(target) {}

  ExprPtr parse() {
    if (peek('^')) ++pos_;
    ExprPtr e = alternation();
    if (pos_ < text_.size()) error(")", "an unmatched ')'");
    return e;
  }

 private:
  [[noreturn]] void error(std::string_view what, std::string_view found) const {
    fail(ErrorCode::kInvalidArgument, "regular expression: expected {} at character {}, found {}", what, pos_, found);
  }
  [[noreturn]] void unsupported(std::string_view what) const {
    fail(ErrorCode::kInvalidArgument, "regular expression: {} at character {} is not supported", what, pos_);
  }
  bool peek(uint32_t c) const { return pos_ < text_.size() && text_[pos_] == c; }
  bool at_end() const { return pos_ >= text_.size(); }

  ExprPtr chars(const CodepointRanges& ranges) const {
    return target_ == RegexTarget::kJsonString ? json_string_char(ranges) : codepoints(ranges);
  }

  ExprPtr alternation() {
    std::vector<ExprPtr> alts{concatenation()};
    while (peek('|')) {
      ++pos_;
      alts.push_back(concatenation());
    }
    return alt(std::move(alts));
  }

  ExprPtr concatenation() {
    std::vector<ExprPtr> items;
    while (!at_end() && !peek('|') && !peek(')')) {
      if (peek('$')) {
        ++pos_;
        if (!at_end() && !peek('|') && !peek(')')) unsupported("'$' before the end of the pattern");
        continue;
      }
      if (peek('^')) unsupported("'^' after the start of the pattern");
      ExprPtr atom_expr = atom();
      items.push_back(quantified(std::move(atom_expr)));
    }
    if (items.empty()) return empty();
    return seq(std::move(items));
  }

  int32_t number() {
    if (at_end() || text_[pos_] < '0' || text_[pos_] > '9') error("a number", at_end() ? "the end" : "another character");
    int64_t v = 0;
    while (!at_end() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      v = v * 10 + (text_[pos_++] - '0');
      if (v > kMaxCount) unsupported(fmt::format("a repetition count above {}", kMaxCount));
    }
    return static_cast<int32_t>(v);
  }

  ExprPtr quantified(ExprPtr e) {
    if (at_end()) return e;
    int32_t min = 1, max = 1;
    const uint32_t c = text_[pos_];
    if (c == '*') {
      min = 0, max = -1, ++pos_;
    } else if (c == '+') {
      min = 1, max = -1, ++pos_;
    } else if (c == '?') {
      min = 0, max = 1, ++pos_;
    } else if (c == '{') {
      // {n}, {n,}, {n,m}; a '{' that starts none of them is a literal brace, as in ECMAScript's
      // web-compatibility grammar.
      const size_t save = pos_;
      ++pos_;
      if (at_end() || text_[pos_] < '0' || text_[pos_] > '9') {
        pos_ = save;
        return e;
      }
      min = number();
      max = min;
      if (peek(',')) {
        ++pos_;
        max = peek('}') ? -1 : number();
      }
      if (!peek('}')) error("'}'", "another character");
      ++pos_;
      if (max >= 0 && max < min) unsupported(fmt::format("the repetition {{{},{}}}", min, max));
    } else {
      return e;
    }
    if (peek('?')) ++pos_;  // lazy: same strings
    if (!at_end() && (peek('*') || peek('+') || peek('?') || peek('{'))) {
      if (!peek('{')) error("an atom", "a second quantifier");
    }
    return repeat(std::move(e), min, max);
  }

  ExprPtr atom() {
    const uint32_t c = text_[pos_];
    switch (c) {
      case '(': return group();
      case '[': return chars(char_class());
      case '.':
        ++pos_;
        return chars(normalize_ranges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}, true));
      case '\\': return escape();
      case '*':
      case '+':
      case '?': error("an atom", fmt::format("the quantifier '{}'", static_cast<char>(c)));
      case ')': error("an atom", "')'");
      default: ++pos_; return chars({{c, c}});
    }
  }

  ExprPtr group() {
    if (++depth_ > kMaxGroupDepth) unsupported(fmt::format("a group nested more than {} deep", kMaxGroupDepth));
    ++pos_;  // (
    if (peek('?')) {
      ++pos_;
      if (peek(':')) {
        ++pos_;
      } else if (peek('<') && pos_ + 1 < text_.size() && text_[pos_ + 1] != '=' && text_[pos_ + 1] != '!') {
        while (!at_end() && !peek('>')) ++pos_;
        if (at_end()) error("'>' closing the group name", "the end");
        ++pos_;
      } else {
        unsupported("a lookaround or group flag '(?'");
      }
    }
    ExprPtr inner = alternation();
    if (!peek(')')) error("')'", at_end() ? "the end" : "another character");
    ++pos_;
    --depth_;
    return inner;
  }

  // After a backslash, outside or inside a class: a class escape (ranges) or one character.
  // Returns true with `ranges` set for \d \w \s and their negations.
  uint32_t escaped_char(bool in_class, CodepointRanges& ranges, bool& is_class) {
    is_class = false;
    ++pos_;  // backslash
    if (at_end()) error("a character after '\\'", "the end");
    const uint32_t c = text_[pos_++];
    auto hex = [&](int digits) {
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i) {
        if (at_end()) error("a hexadecimal digit", "the end");
        const uint32_t h = text_[pos_++];
        int d = h >= '0' && h <= '9' ? static_cast<int>(h - '0') : h >= 'a' && h <= 'f' ? static_cast<int>(h - 'a' + 10)
                : h >= 'A' && h <= 'F' ? static_cast<int>(h - 'A' + 10) : -1;
        if (d < 0) error("a hexadecimal digit", "another character");
        v = v * 16 + static_cast<uint32_t>(d);
      }
      return v;
    };
    switch (c) {
      case 'd': is_class = true; ranges = digit_ranges(); return 0;
      case 'D': is_class = true; ranges = normalize_ranges(digit_ranges(), true); return 0;
      case 'w': is_class = true; ranges = word_ranges(); return 0;
      case 'W': is_class = true; ranges = normalize_ranges(word_ranges(), true); return 0;
      case 's': is_class = true; ranges = space_ranges(); return 0;
      case 'S': is_class = true; ranges = normalize_ranges(space_ranges(), true); return 0;
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': return hex(2);
      case 'u':
        if (peek('{')) {
          ++pos_;
          uint32_t v = 0;
          while (!peek('}')) {
            if (at_end()) error("'}'", "the end");
            v = v * 16 + hex(1);
            if (v > 0x10FFFF) unsupported("a code point above U+10FFFF");
          }
          ++pos_;
          return v;
        }
        return hex(4);
      case 'b':
        if (in_class) return '\b';
        --pos_;
        unsupported("the word boundary \\b");
      case 'B': --pos_; unsupported("\\B");
      case 'p':
      case 'P': --pos_; unsupported("a Unicode property class");
      case 'k': --pos_; unsupported("a named backreference");
      case 'c': --pos_; unsupported("a control escape \\c");
      default:
        if (c >= '1' && c <= '9') {
          --pos_;
          unsupported("a backreference");
        }
        return c;  // an escaped character stands for itself
    }
  }

  ExprPtr escape() {
    CodepointRanges ranges;
    bool is_class = false;
    const uint32_t c = escaped_char(false, ranges, is_class);
    if (is_class) return chars(ranges);
    return chars({{c, c}});
  }

  CodepointRanges char_class() {
    ++pos_;  // [
    bool negate = false;
    if (peek('^')) {
      negate = true;
      ++pos_;
    }
    CodepointRanges ranges;
    while (true) {
      if (at_end()) error("']'", "the end");
      if (peek(']')) break;
      uint32_t lo = 0;
      bool is_class = false;
      CodepointRanges cls;
      if (peek('\\')) {
        lo = escaped_char(true, cls, is_class);
      } else {
        lo = text_[pos_++];
      }
      if (is_class) {
        ranges.insert(ranges.end(), cls.begin(), cls.end());
        continue;
      }
      if (peek('-') && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi = 0;
        if (peek('\\')) {
          hi = escaped_char(true, cls, is_class);
          if (is_class) unsupported("a class escape as the end of a range");
        } else {
          hi = text_[pos_++];
        }
        if (hi < lo) unsupported(fmt::format("the range from U+{:04X} down to U+{:04X}", lo, hi));
        ranges.emplace_back(lo, hi);
      } else {
        ranges.emplace_back(lo, lo);
      }
    }
    ++pos_;  // ]
    return normalize_ranges(std::move(ranges), negate);
  }

  std::vector<uint32_t> text_;
  RegexTarget target_;
  size_t pos_ = 0;
  int depth_ = 0;  // groups open
};

}  // namespace

ExprPtr json_string_char(const CodepointRanges& ranges) {
  const CodepointRanges all = normalize_ranges(ranges);
  auto has = [&](uint32_t cp) {
    for (auto [lo, hi] : all) {
      if (cp >= lo && cp <= hi) return true;
    }
    return false;
  };
  // Characters JSON takes as they are: everything but '"', '\' and U+0000..U+001F.
  CodepointRanges plain;
  for (auto [lo, hi] : all) {
    for (auto [a, b] : normalize_ranges({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}})) {
      const uint32_t l = std::max(lo, a), h = std::min(hi, b);
      if (l <= h) plain.emplace_back(l, h);
    }
  }
  std::vector<ExprPtr> alts;
  if (!plain.empty()) alts.push_back(codepoints(plain));
  if (has('"')) alts.push_back(literal("\\\""));
  if (has('\\')) alts.push_back(literal("\\\\"));
  for (uint32_t c = 0; c < 0x20; ++c) {
    if (!has(c)) continue;
    switch (c) {
      case '\b': alts.push_back(literal("\\b")); break;
      case '\f': alts.push_back(literal("\\f")); break;
      case '\n': alts.push_back(literal("\\n")); break;
      case '\r': alts.push_back(literal("\\r")); break;
      case '\t': alts.push_back(literal("\\t")); break;
      default: alts.push_back(literal(fmt::format("\\u{:04x}", c)));
    }
  }
  if (alts.empty()) return codepoints({});
  return alt(std::move(alts));
}

ExprPtr regex_expr(std::string_view pattern, RegexTarget target) { return RegexParser(pattern, target).parse(); }

}  // namespace duet::grammar
