// Python's operators on template values: arithmetic, ordering, membership and iteration. Every
// failure throws TemplateError with Python's wording ("unsupported operand type(s) for +: 'int'
// and 'str'"), so messages read like the ones Jinja2 users know.
#pragma once

#include <string_view>
#include <vector>

#include "duet/tokenizer/jinja/value.h"

namespace duet::jinja {

// op is one of + - * / // % ** ~
Value binary_op(std::string_view op, const Value& a, const Value& b);
// op is one of - + (unary)
Value unary_op(std::string_view op, const Value& a);
// op is one of == != < <= > >=
bool compare_op(std::string_view op, const Value& a, const Value& b);
// Python's `a < b` for numbers, strings, and lists or tuples of those.
bool python_less(const Value& a, const Value& b);
// `item in container`.
bool contains(const Value& container, const Value& item);
// What a for loop visits: list items, dict keys, string characters; nothing for undefined.
std::vector<Value> iterate(const Value& v);
// Python's len(); throws for values without a length.
int64_t python_len(const Value& v);

// Python's int() of a float: its integer part, or a template error for NaN, infinity and values
// beyond 64 bits.
int64_t float_to_int(double d);

// Refuses a padding or indenting width (the `width` argument of name()) past kMaxStringSize, before
// the string is made.
void check_width(std::string_view name, int64_t width);

}  // namespace duet::jinja
