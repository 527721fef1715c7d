// The pieces of builtin_corpus(), one list per source file.
#pragma once

#include <string_view>
#include <vector>

namespace duet {

std::vector<std::string_view> builtin_corpus_prose();
std::vector<std::string_view> builtin_corpus_code();

}  // namespace duet
