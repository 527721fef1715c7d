#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace duet {

// A regular expression run by PCRE2, for patterns and texts that come from outside (a model
// file's chat template, a flag). PCRE2 keeps its backtracking on the heap, refuses nesting past
// 250 levels when it compiles, and stops a match at a step limit; std::regex recursed once per
// character matched and per nesting level, so a long run of spaces in a template or 20,000 nested
// groups in a flag overflowed the stack, and nested repeats such as (.*)*(.*)*z ran for minutes.
class Regex {
 public:
  // Throws kInvalidArgument "WHAT 'PATTERN' is not a valid regular expression (at offset N): ...".
  explicit Regex(std::string_view pattern, std::string_view what = "pattern");
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Whether the pattern matches somewhere in `text` (std::regex_search's meaning). Safe to call
  // from several threads at once. Throws kInvalidArgument when one match passes the step limit.
  bool search(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// PCRE2's text for one of its error codes (compile errors and negative match results).
std::string pcre2_error_message(int code);

}  // namespace duet
