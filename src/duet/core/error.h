// The one error type of duet: a code plus a message that names the thing, what was expected,
// what was found, and where. Thrown by loading, config and parsing code; caught at the edges.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace duet {

enum class ErrorCode {
  kInvalidArgument,
  kNotFound,
  kUnsupported,
  kResourceExhausted,
  kUnavailable,
  kDataLoss,  // a file is truncated or corrupt
  kInternal,
};

std::string_view error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// Throws an Error with a message formatted by fmt.
template <typename... Args>
[[noreturn]] void fail(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace duet
