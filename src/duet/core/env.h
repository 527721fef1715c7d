// Settings read from the environment (DUET_MATMUL, DUET_INDEXER, ...).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string_view>

namespace duet {

// The index in `choices` of environment variable `name`'s value: 0 (choices' first, the default)
// when it is unset or empty; throws kInvalidArgument naming the variable, its value and the
// choices for any other value.
size_t env_choice(const char* name, std::initializer_list<std::string_view> choices);

}  // namespace duet
