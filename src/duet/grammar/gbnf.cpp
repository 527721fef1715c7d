#include "duet/grammar/gbnf.h"

#include <cstdint>
#include <map>

#include <fmt/format.h>

#include "duet/core/error.h"

namespace duet::grammar {
namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
}

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  Grammar parse() {
    skip_space();
    if (at_end()) fail(ErrorCode::kInvalidArgument, "the grammar is empty (expected rules such as root ::= ...)");
    while (!at_end()) {
      const size_t start = pos_;
      const std::string name = parse_name();
      skip_space();
      if (!consume("::=")) {
        if (peek(':')) error("'::=' after the rule name (Lark's ':' grammars are not supported; use GBNF)");
        error("'::=' after the rule name");
      }
      const int32_t id = rule_id(name, start);
      if (b_.defined(id)) error(fmt::format("one definition of rule '{}' (it is defined twice)", name));
      b_.define(id, parse_alternatives(false));
    }
    auto root = ids_.find("root");
    if (root == ids_.end() || !b_.defined(root->second)) {
      fail(ErrorCode::kInvalidArgument, "the grammar has no rule named 'root'");
    }
    for (const auto& [name, id] : ids_) {
      if (!b_.defined(id)) {
        const auto [line, column] = line_col(first_use_.at(name));
        fail(ErrorCode::kInvalidArgument, "grammar rule '{}' is used at line {}, column {} but never defined", name, line,
             column);
      }
    }
    return std::move(b_).build(root->second);
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  bool peek(char c) const { return pos_ < text_.size() && text_[pos_] == c; }
  bool consume(std::string_view s) {
    if (text_.substr(pos_, s.size()) == s) {
      pos_ += s.size();
      return true;
    }
    return false;
  }

  std::pair<int, int> line_col(size_t at) const {
    int line = 1, column = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return {line, column};
  }

  [[noreturn]] void error(const std::string& expected) const {
    const auto [line, column] = line_col(pos_);
    if (item_start_ != SIZE_MAX) {
      const auto [l, c] = line_col(item_start_);
      fail(ErrorCode::kInvalidArgument, "grammar syntax error at line {}, column {}: expected {} (in the item that starts "
           "at line {}, column {}), found {}", line, column, expected, l, c,
           at_end() ? "the end" : fmt::format("'{}'", text_.substr(pos_, std::min<size_t>(12, text_.size() - pos_))));
    }
    std::string found = at_end() ? "the end" : fmt::format("'{}'", text_.substr(pos_, std::min<size_t>(12, text_.size() - pos_)));
    fail(ErrorCode::kInvalidArgument, "grammar syntax error at line {}, column {}: expected {}, found {}", line, column,
         expected, found);
  }

  void skip_space() {
    while (!at_end()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (!at_end() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(text_[pos_])) ++pos_;
    if (pos_ == start) error("a rule name");
    return std::string(text_.substr(start, pos_ - start));
  }

  int32_t rule_id(const std::string& name, size_t at) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const int32_t id = b_.declare(name);
    ids_.emplace(name, id);
    first_use_.emplace(name, at);
    return id;
  }

  // A name followed by ::= starts the next rule.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < text_.size() && is_name_char(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t' || text_[p] == '\n' || text_[p] == '\r')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  ExprPtr parse_alternatives(bool nested) {
    std::vector<ExprPtr> alts{parse_sequence(nested)};
    while (peek('|')) {
      ++pos_;
      alts.push_back(parse_sequence(nested));
    }
    return alt(std::move(alts));
  }

  ExprPtr parse_sequence(bool nested) {
    std::vector<ExprPtr> items;
    while (true) {
      skip_space();
      if (at_end() || peek('|') || peek(')')) break;
      if (!nested && at_rule_start()) break;
      ExprPtr item = parse_item();
      items.push_back(parse_quantifier(std::move(item)));
    }
    if (items.empty()) return empty();
    return seq(std::move(items));
  }

  int32_t parse_count() {
    const size_t start = pos_;
    int64_t v = 0;
    while (!at_end() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      v = v * 10 + (text_[pos_++] - '0');
      if (v > 100000) error("a repetition count up to 100000");
    }
    if (pos_ == start) error("a number");
    return static_cast<int32_t>(v);
  }

  ExprPtr parse_quantifier(ExprPtr item) {
    if (peek('*')) return ++pos_, star(std::move(item));
    if (peek('+')) return ++pos_, plus(std::move(item));
    if (peek('?')) return ++pos_, optional(std::move(item));
    if (peek('{')) {
      ++pos_;
      skip_space();
      const int32_t min = parse_count();
      int32_t max = min;
      skip_space();
      if (peek(',')) {
        ++pos_;
        skip_space();
        max = peek('}') ? -1 : parse_count();
        skip_space();
      }
      if (!peek('}')) error("'}'");
      ++pos_;
      if (max >= 0 && max < min) error(fmt::format("a repetition whose maximum is at least its minimum {}", min));
      return repeat(std::move(item), min, max);
    }
    return item;
  }

  uint32_t parse_char() {
    if (at_end()) error("a character");
    const auto c = static_cast<uint8_t>(text_[pos_]);
    if (c == '\\') {
      ++pos_;
      if (at_end()) error("an escape");
      const char e = text_[pos_++];
      auto hex = [&](int n) {
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
          if (at_end()) error("a hexadecimal digit");
          const char h = text_[pos_++];
          const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (d < 0) error("a hexadecimal digit");
          v = v * 16 + static_cast<uint32_t>(d);
        }
        return v;
      };
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/': return static_cast<uint32_t>(e);
        default: --pos_; error("one of the escapes \\n \\r \\t \\\\ \\\" \\[ \\] \\- \\xHH \\uHHHH \\UHHHHHHHH");
      }
    }
    // One UTF-8 character.
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + static_cast<size_t>(len) > text_.size()) error("valid UTF-8");
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text_[pos_ + static_cast<size_t>(k)]) & 0x3F);
    pos_ += static_cast<size_t>(len);
    return cp;
  }

  ExprPtr parse_item() {
    const char c = text_[pos_];
    item_start_ = pos_;
    ExprPtr e = parse_item_at(c);
    item_start_ = SIZE_MAX;
    return e;
  }

  ExprPtr parse_item_at(char c) {
    if (c == '"') {
      ++pos_;
      std::string s;
      while (!peek('"')) {
        if (at_end() || peek('\n')) error("'\"' closing the literal");
        s += utf8_encode(parse_char());
      }
      ++pos_;
      return literal(std::move(s));
    }
    if (c == '[') {
      ++pos_;
      bool negate = false;
      if (peek('^')) {
        negate = true;
        ++pos_;
      }
      CodepointRanges ranges;
      while (!peek(']')) {
        if (at_end()) error("']' closing the class");
        const uint32_t lo = parse_char();
        uint32_t hi = lo;
        if (peek('-') && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
          ++pos_;
          hi = parse_char();
          if (hi < lo) error("a range whose end is not below its start");
        }
        ranges.emplace_back(lo, hi);
      }
      ++pos_;
      return codepoints(normalize_ranges(std::move(ranges), negate));
    }
    if (c == '.') {
      ++pos_;
      return codepoints({{0, 0x10FFFF}});
    }
    if (c == '(') {
      if (++depth_ > kMaxGroupDepth) error(fmt::format("at most {} nested groups", kMaxGroupDepth));
      ++pos_;
      item_start_ = SIZE_MAX;
      ExprPtr inner = parse_alternatives(true);
      skip_space();
      if (!peek(')')) error("')'");
      ++pos_;
      --depth_;
      return inner;
    }
    if (is_name_char(c)) {
      item_start_ = SIZE_MAX;
      const size_t at = pos_;
      return ref(rule_id(parse_name(), at));
    }
    item_start_ = SIZE_MAX;
    error("a literal, a [class], '.', '(' or a rule name");
  }

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;  // groups open
  size_t item_start_ = SIZE_MAX;  // where the literal or class being read starts
  GrammarBuilder b_;
  std::map<std::string, int32_t> ids_;
  std::map<std::string, size_t> first_use_;
};

}  // namespace

Grammar parse_gbnf(std::string_view text) { return GbnfParser(text).parse(); }

}  // namespace duet::grammar
