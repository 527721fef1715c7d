// Grammar text in GBNF, the EBNF dialect llama.cpp and xgrammar read (vLLM's guided_grammar):
//
//   root   ::= answer ("," ws answer)*
//   answer ::= "yes" | "no" | [0-9]+ | [^\n]{1,20}   # comments run to the end of the line
//   ws     ::= [ \t]?
//
// Rules are `name ::= alternatives` (a rule runs until the next `name ::=`); items are "literals"
// and [classes] with the escapes \n \r \t \\ \" \] \xHH \uHHHH \UHHHHHHHH, `.` for any character,
// rule names, groups, and the quantifiers * + ? {m} {m,} {m,n}. The rule `root` is the start.
#pragma once

#include <string_view>

#include "duet/grammar/grammar.h"

namespace duet::grammar {

// Throws kInvalidArgument naming the line and column of a syntax error, an undefined rule, a
// missing root, or a left-recursive rule.
Grammar parse_gbnf(std::string_view text);

}  // namespace duet::grammar
