#include "duet/core/env.h"

#include <cstdlib>
#include <string>

#include "duet/core/error.h"

namespace duet {

size_t env_choice(const char* name, std::initializer_list<std::string_view> choices) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  std::string expected;
  size_t i = 0;
  for (const std::string_view c : choices) {
    if (c == v) return i;
    expected += std::string(i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + std::string(c);
    ++i;
  }
  fail(ErrorCode::kInvalidArgument, "{} is '{}', expected {}", name, v, expected);
}

}  // namespace duet
