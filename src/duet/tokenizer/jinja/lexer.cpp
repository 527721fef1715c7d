#include "duet/tokenizer/jinja/lexer.h"

#include <array>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/jinja/pystring.h"
#include "duet/tokenizer/unicode.h"

namespace duet::jinja {
namespace {

constexpr size_t npos = std::string_view::npos;

// Length of the Python whitespace character at s[pos], or 0.
size_t space_len(std::string_view s, size_t pos) {
  const unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return is_python_space(c) ? 1 : 0;
  uint32_t cp = 0;
  const size_t len = decode_utf8(s, pos, cp);
  return len && is_python_space(cp) ? len : 0;
}

size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    const size_t len = space_len(s, pos);
    if (!len) break;
    pos += len;
  }
  return pos;
}

bool all_space(std::string_view s) { return skip_space(s, 0) == s.size(); }

void append_utf8_checked(std::string& out, uint32_t cp, size_t pos) {
  if (cp > 0x10FFFF) syntax_error(pos, "illegal Unicode character in string literal");
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = kReplacementChar;  // a lone surrogate cannot be UTF-8
  append_utf8(out, cp);
}

class Lexer {
 public:
  Lexer(std::string_view src, const LexOptions& options) : src_(src), options_(options) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t start = find_tag_start(pos_);
      if (start == npos) {
        emit_data(pos_, src_.substr(pos_));
        break;
      }
      const char kind = src_[start + 1];
      const char sign = start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+') ? src_[start + 2] : 0;
      const size_t after_begin = start + 2 + (sign ? 1 : 0);
      const size_t raw_end = kind == '%' ? match_raw_begin(after_begin) : npos;
      emit_data(pos_, strip_before_tag(src_.substr(pos_, start - pos_), sign, kind != '{'));
      if (kind == '#') {
        lex_comment(start, after_begin);
      } else if (raw_end != npos) {
        line_starting_ = src_[raw_end - 1] == '\n';
        lex_raw_body(start, raw_end);
      } else {
        lex_tag(kind, start, after_begin);
      }
    }
    tokens_.push_back(Token{TokenKind::kEof, src_.size(), "", 0, 0.0});
    return std::move(tokens_);
  }

 private:
  size_t find_tag_start(size_t from) const {
    for (size_t i = src_.find('{', from); i != npos && i + 1 < src_.size(); i = src_.find('{', i + 1)) {
      const char c = src_[i + 1];
      if (c == '{' || c == '%' || c == '#') return i;
    }
    return npos;
  }

  // Whitespace control on the text before a tag: "-" strips all trailing whitespace;
  // lstrip_blocks strips spaces before a block tag or comment that starts its line.
  std::string_view strip_before_tag(std::string_view text, char sign, bool block_or_comment) const {
    if (sign == '-') return python_strip(text, false, true, std::nullopt);
    if (sign != '+' && options_.lstrip_blocks && block_or_comment) {
      const size_t nl = text.rfind('\n');
      const size_t line_start = nl == npos ? 0 : nl + 1;
      if ((line_start > 0 || line_starting_) && line_start < text.size() && all_space(text.substr(line_start))) {
        return text.substr(0, line_start);
      }
    }
    return text;
  }

  void emit_data(size_t pos, std::string_view text) {
    if (!text.empty()) tokens_.push_back(Token{TokenKind::kData, pos, std::string(text), 0, 0.0});
  }

  // Where the end of a block tag at `pos` ends (after whitespace control and trim_blocks), or
  // npos when there is no block end at `pos`.
  size_t match_block_end(size_t pos, bool allow_trim) const {
    if (src_.compare(pos, 3, "+%}") == 0) return pos + 3;
    if (src_.compare(pos, 3, "-%}") == 0) return skip_space(src_, pos + 3);
    if (src_.compare(pos, 2, "%}") == 0) {
      size_t end = pos + 2;
      if (allow_trim && options_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
      return end;
    }
    return npos;
  }

  // `{% raw %}`: where the opening tag ends, or npos when the tag is not a raw tag.
  size_t match_raw_begin(size_t pos) const {
    pos = skip_space(src_, pos);
    if (src_.compare(pos, 3, "raw") != 0) return npos;
    pos = skip_space(src_, pos + 3);
    if (src_.compare(pos, 3, "-%}") == 0) return skip_space(src_, pos + 3);
    if (src_.compare(pos, 2, "%}") == 0) return pos + 2;  // no trim_blocks after {% raw %}
    return npos;
  }

  void lex_raw_body(size_t tag_start, size_t body_start) {
    for (size_t at = src_.find("{%", body_start); at != npos; at = src_.find("{%", at + 1)) {
      const char sign = at + 2 < src_.size() && (src_[at + 2] == '-' || src_[at + 2] == '+') ? src_[at + 2] : 0;
      size_t p = skip_space(src_, at + 2 + (sign ? 1 : 0));
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p = skip_space(src_, p + 6);
      const size_t end = match_block_end(p, true);
      if (end == npos) continue;
      emit_data(body_start, strip_before_tag(src_.substr(body_start, at - body_start), sign, true));
      line_starting_ = src_[end - 1] == '\n';
      pos_ = end;
      return;
    }
    syntax_error(tag_start, "missing end of raw directive");
  }

  void lex_comment(size_t start, size_t body_start) {
    const size_t close = src_.find("#}", body_start);
    if (close == npos) syntax_error(start, "missing end of comment tag");
    size_t end = close + 2;
    const char before = close > body_start ? src_[close - 1] : 0;
    if (before == '-') {
      end = skip_space(src_, end);
    } else if (before != '+' && options_.trim_blocks && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    line_starting_ = src_[end - 1] == '\n';
    pos_ = end;
  }

  void lex_tag(char kind, size_t start, size_t pos) {
    const bool is_block = kind == '%';
    tokens_.push_back(Token{is_block ? TokenKind::kBlockBegin : TokenKind::kVarBegin, start, "", 0, 0.0});
    std::vector<char> brackets;
    while (true) {
      pos = skip_space(src_, pos);
      if (pos >= src_.size()) {
        syntax_error(start, "unexpected end of template, the tag opened here is never closed (expected '{}')",
                     is_block ? "%}" : "}}");
      }
      if (brackets.empty()) {
        size_t end = npos;
        if (is_block) {
          end = match_block_end(pos, true);
        } else if (src_.compare(pos, 3, "-}}") == 0) {
          end = skip_space(src_, pos + 3);
        } else if (src_.compare(pos, 2, "}}") == 0) {
          end = pos + 2;
        }
        if (end != npos) {
          tokens_.push_back(Token{is_block ? TokenKind::kBlockEnd : TokenKind::kVarEnd, pos, "", 0, 0.0});
          line_starting_ = src_[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      pos = lex_token(pos, brackets);
    }
  }

  // Lexes one token at `pos` and returns where it ends.
  size_t lex_token(size_t pos, std::vector<char>& brackets) {
    const char c = src_[pos];
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(pos);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = pos;
      while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
      tokens_.push_back(Token{TokenKind::kName, pos, std::string(src_.substr(pos, end - pos)), 0, 0.0});
      return end;
    }
    if (c == '\'' || c == '"') return lex_string(pos);
    static constexpr std::array<std::string_view, 4> kTwoChar = {"**", "//", "==", "!="};
    static constexpr std::array<std::string_view, 2> kTwoCharCmp = {">=", "<="};
    for (std::string_view op : kTwoChar) {
      if (src_.compare(pos, 2, op) == 0) return emit_operator(pos, op);
    }
    for (std::string_view op : kTwoCharCmp) {
      if (src_.compare(pos, 2, op) == 0) return emit_operator(pos, op);
    }
    static constexpr std::string_view kSingle = "+-/*%~[](){}><=.:|,;";
    if (kSingle.find(c) == npos) {
      uint32_t cp = static_cast<unsigned char>(c);
      decode_utf8(src_, pos, cp);
      std::string shown;
      append_utf8(shown, cp);
      syntax_error(pos, "unexpected character '{}'", shown);
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) syntax_error(pos, "unexpected '{}'", c);
      if (brackets.back() != c) syntax_error(pos, "unexpected '{}', expected '{}'", c, brackets.back());
      brackets.pop_back();
    }
    return emit_operator(pos, src_.substr(pos, 1));
  }

  size_t emit_operator(size_t pos, std::string_view op) {
    tokens_.push_back(Token{TokenKind::kOperator, pos, std::string(op), 0, 0.0});
    return pos + op.size();
  }

  // Digits with optional "_" separators; returns the end.
  size_t scan_digits(size_t pos, int base) const {
    auto is_digit = [base](char c) {
      if (base == 16) return std::isxdigit(static_cast<unsigned char>(c)) != 0;
      return c >= '0' && c < static_cast<char>('0' + base);
    };
    size_t end = pos;
    while (end < src_.size() && (is_digit(src_[end]) || (src_[end] == '_' && end > pos && end + 1 < src_.size() &&
                                                          is_digit(src_[end + 1])))) {
      ++end;
    }
    return end;
  }

  size_t lex_number(size_t pos) {
    auto without_underscores = [](std::string_view s) {
      std::string out;
      for (char ch : s) {
        if (ch != '_') out += ch;
      }
      return out;
    };
    if (src_[pos] == '0' && pos + 1 < src_.size()) {
      const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[pos + 1])));
      const int base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (base) {
        size_t digits = pos + 2;
        if (digits < src_.size() && src_[digits] == '_') ++digits;
        const size_t end = scan_digits(digits, base);
        if (end == digits) syntax_error(pos, "invalid integer literal");
        const std::string text = without_underscores(src_.substr(digits, end - digits));
        errno = 0;
        const unsigned long long value = std::strtoull(text.c_str(), nullptr, base);
        if (errno == ERANGE || value > static_cast<unsigned long long>(std::numeric_limits<int64_t>::max())) {
          syntax_error(pos, "integer literal {} is out of the 64-bit range", src_.substr(pos, end - pos));
        }
        tokens_.push_back(Token{TokenKind::kInt, pos, text, static_cast<int64_t>(value), 0.0});
        return end;
      }
    }
    size_t end = scan_digits(pos, 10);
    bool is_float = false;
    const bool after_dot = pos > 0 && src_[pos - 1] == '.';  // "x.0.1" is item access, not a float
    if (!after_dot && end + 1 < src_.size() && src_[end] == '.' && std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      end = scan_digits(end + 1, 10);
      is_float = true;
    }
    if (!after_dot && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t exp = end + 1;
      if (exp < src_.size() && (src_[exp] == '+' || src_[exp] == '-')) ++exp;
      if (exp < src_.size() && std::isdigit(static_cast<unsigned char>(src_[exp]))) {
        end = scan_digits(exp, 10);
        is_float = true;
      }
    }
    const std::string text = without_underscores(src_.substr(pos, end - pos));
    if (is_float) {
      // As Python's float(): a literal beyond the double range is inf, not an error.
      tokens_.push_back(Token{TokenKind::kFloat, pos, text, 0, std::strtod(text.c_str(), nullptr)});
    } else {
      try {
        tokens_.push_back(Token{TokenKind::kInt, pos, text, std::stoll(text), 0.0});
      } catch (const std::out_of_range&) {
        syntax_error(pos, "integer literal {} is out of the 64-bit range", text);
      }
    }
    return end;
  }

  size_t lex_string(size_t pos) {
    const char quote = src_[pos];
    std::string value;
    size_t i = pos + 1;
    while (true) {
      if (i >= src_.size()) syntax_error(pos, "unterminated string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) syntax_error(pos, "unterminated string literal");
      i = lex_escape(i, value);
    }
    tokens_.push_back(Token{TokenKind::kString, pos, std::move(value), 0, 0.0});
    return i + 1;
  }

  // Python's escapes (Jinja2 decodes string literals with "unicode-escape"); returns the end.
  size_t lex_escape(size_t i, std::string& value) {
    const char e = src_[i + 1];
    auto hex = [&](size_t start, size_t count) {
      uint32_t cp = 0;
      for (size_t k = 0; k < count; ++k) {
        const size_t at = start + k;
        if (at >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[at]))) {
          syntax_error(i, "truncated \\{} escape in string literal", e);
        }
        const char h = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[at])));
        cp = cp * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
      }
      return cp;
    };
    switch (e) {
      case '\\': value += '\\'; return i + 2;
      case '\'': value += '\''; return i + 2;
      case '"': value += '"'; return i + 2;
      case 'a': value += '\a'; return i + 2;
      case 'b': value += '\b'; return i + 2;
      case 'f': value += '\f'; return i + 2;
      case 'n': value += '\n'; return i + 2;
      case 'r': value += '\r'; return i + 2;
      case 't': value += '\t'; return i + 2;
      case 'v': value += '\v'; return i + 2;
      case '\n': return i + 2;  // line continuation
      case 'x': append_utf8_checked(value, hex(i + 2, 2), i); return i + 4;
      case 'u': append_utf8_checked(value, hex(i + 2, 4), i); return i + 6;
      case 'U': append_utf8_checked(value, hex(i + 2, 8), i); return i + 10;
      default: break;
    }
    if (e >= '0' && e <= '7') {
      uint32_t cp = 0;
      size_t k = i + 1;
      for (; k < i + 4 && k < src_.size() && src_[k] >= '0' && src_[k] <= '7'; ++k) cp = cp * 8 + static_cast<uint32_t>(src_[k] - '0');
      append_utf8_checked(value, cp, i);
      return k;
    }
    value += '\\';  // unknown escapes stay as they are
    return i + 1;
  }

  std::string_view src_;
  LexOptions options_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::string normalize_template_source(std::string_view source, bool keep_trailing_newline) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::vector<Token> tokenize(std::string_view source, const LexOptions& options) {
  return Lexer(source, options).run();
}

std::string describe_token(const Token& token) {
  switch (token.kind) {
    case TokenKind::kData: return "template data";
    case TokenKind::kVarBegin: return "begin of print statement '{{'";
    case TokenKind::kVarEnd: return "end of print statement '}}'";
    case TokenKind::kBlockBegin: return "begin of statement block '{%'";
    case TokenKind::kBlockEnd: return "end of statement block '%}'";
    case TokenKind::kName: return fmt::format("'{}'", token.text);
    case TokenKind::kString: return "string literal";
    case TokenKind::kInt: case TokenKind::kFloat: return "number " + token.text;
    case TokenKind::kOperator: return fmt::format("'{}'", token.text);
    case TokenKind::kEof: return "end of template";
  }
  return "token";
}

}  // namespace duet::jinja
