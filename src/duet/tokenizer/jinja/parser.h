// Turns the token stream into a syntax tree, following Jinja2's grammar and operator precedence
// (lowest first): `x if c else y`, or, and, not, comparisons and in/not in, + -, ~, * / // %,
// **, unary - +, then postfix .attr [key] [a:b] (args), | filter and `is` test.
#pragma once

#include <vector>

#include "duet/tokenizer/jinja/ast.h"
#include "duet/tokenizer/jinja/lexer.h"

namespace duet::jinja {

// Throws TemplateError (kSyntax) with the position of the offending token.
Body parse_template(const std::vector<Token>& tokens);

}  // namespace duet::jinja
