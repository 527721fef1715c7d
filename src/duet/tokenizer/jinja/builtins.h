// The names a template can use without defining them: filters, tests, global functions and the
// methods of str, dict and list values. Tables are built once and only read afterwards.
#pragma once

#include <string_view>

#include "duet/tokenizer/jinja/value.h"

namespace duet::jinja {

class Interpreter;

// Filters (builtin_filters.cpp). `input` may be undefined (default, length, ...).
bool is_filter(std::string_view name);
Value apply_filter(Interpreter& interp, std::string_view name, const Value& input, const CallArgs& args);

// Tests (builtin_tests.cpp).
bool is_test(std::string_view name);
bool apply_test(Interpreter& interp, std::string_view name, const Value& value, const CallArgs& args);

// Global functions (builtin_globals.cpp): range, dict, namespace, raise_exception, strftime_now;
// nullptr for other names.
const Value* find_global(std::string_view name);

// Methods (builtin_methods.cpp). has_method is true for the methods a value's type has,
// including those the sandbox forbids (list.append, dict.update, ...), which fail when called,
// as in Hugging Face's ImmutableSandboxedEnvironment.
bool has_method(const Value& object, std::string_view name);
bool is_unsafe_method(const Value& object, std::string_view name);
Value call_method(const Value& object, std::string_view name, const CallArgs& args);

}  // namespace duet::jinja
