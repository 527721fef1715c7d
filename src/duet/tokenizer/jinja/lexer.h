// Splits a template into template data and the tokens inside {{ }} and {% %}, applying
// whitespace control ({%- -%}, {{- -}}, {%+ +%}), trim_blocks and lstrip_blocks the way Jinja2's
// lexer does. Comments are dropped; {% raw %} bodies become template data.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace duet::jinja {

struct LexOptions {
  bool trim_blocks = false;    // drop the first newline after a block tag or comment
  bool lstrip_blocks = false;  // drop spaces and tabs before a block tag or comment at a line start
};

enum class TokenKind : uint8_t {
  kData,        // template text
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,      // text holds the value with escapes resolved
  kInt,
  kFloat,
  kOperator,    // text holds the operator
  kEof,
};

struct Token {
  TokenKind kind = TokenKind::kEof;
  size_t pos = 0;  // byte offset in the source
  std::string text;
  int64_t int_value = 0;
  double float_value = 0.0;
};

// Newlines normalized to \n and, unless keep_trailing_newline, one trailing newline dropped, as
// Jinja2 does.
std::string normalize_template_source(std::string_view source, bool keep_trailing_newline);

// Throws TemplateError (kSyntax) with the position of the offending character.
std::vector<Token> tokenize(std::string_view source, const LexOptions& options);

std::string describe_token(const Token& token);  // for error messages: "'}'", "end of print statement"

}  // namespace duet::jinja
