// Errors inside the Jinja interpreter. They carry the byte offset in the template source where
// they happened; Template turns them into duet::Error (kInvalidArgument) with line and column.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace duet::jinja {

class TemplateError : public std::runtime_error {
 public:
  enum class Kind { kSyntax, kRuntime, kRaised };  // kRaised: the template called raise_exception
  static constexpr size_t kNoPos = static_cast<size_t>(-1);

  TemplateError(Kind kind, const std::string& message, size_t pos = kNoPos)
      : std::runtime_error(message), kind_(kind), pos_(pos) {}
  Kind kind() const { return kind_; }
  size_t pos() const { return pos_; }
  void set_pos_if_unknown(size_t pos) {
    if (pos_ == kNoPos) pos_ = pos;
  }

 private:
  Kind kind_;
  size_t pos_;
};

// A runtime error whose position the evaluator fills in from the expression being evaluated.
template <typename... Args>
[[noreturn]] void runtime_error(fmt::format_string<Args...> format, Args&&... args) {
  throw TemplateError(TemplateError::Kind::kRuntime, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void syntax_error(size_t pos, fmt::format_string<Args...> format, Args&&... args) {
  throw TemplateError(TemplateError::Kind::kSyntax, fmt::format(format, std::forward<Args>(args)...), pos);
}

}  // namespace duet::jinja
