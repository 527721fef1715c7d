// Regular expressions as grammar expressions: the ECMAScript syntax JSON Schema's `pattern`
// uses (and vLLM's guided_regex): literals, escapes (\d \w \s and their negations, \n \t \xHH
// \uHHHH \u{...}), classes with ranges and negation, `.`, groups ((...), (?:...), (?<name>...)),
// alternation and the quantifiers * + ? {n} {n,} {n,m} (lazy forms match the same strings).
// Anchors ^ and $ are accepted at the ends only: the grammar always matches the whole text,
// which for a pattern means a subset of the strings it allows (a full match is also a match).
// Refused with kInvalidArgument naming the place: lookarounds, backreferences, \b and \B,
// Unicode property classes, anchors inside.
#pragma once

#include <string_view>

#include "duet/grammar/grammar.h"

namespace duet::grammar {

enum class RegexTarget {
  kText,        // the characters themselves (guided_regex)
  kJsonString,  // the inside of a JSON string: '"', '\' and control characters as escapes
};

ExprPtr regex_expr(std::string_view pattern, RegexTarget target = RegexTarget::kText);

// The inside of a JSON string holding one character of `ranges` (escaped as JSON requires:
// \" \\ \n \t ..., other control characters as \u00XX).
ExprPtr json_string_char(const CodepointRanges& ranges);

}  // namespace duet::grammar
