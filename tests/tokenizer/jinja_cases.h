// Small templates with the output Jinja2 gives for them. jinja_test checks duet against the
// expected strings; jinja_crosscheck_test renders the same table with Python's jinja2 (set up
// as Hugging Face sets it up) and checks the expected strings themselves.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace duet::testing {

struct JinjaCase {
  std::string name;
  std::string source;
  std::string vars = "{}";              // JSON object: the variables to render with
  std::optional<std::string> expected;  // nullopt: rendering (or parsing) fails
  std::string error = "";               // for failures: a substring of duet's message
  bool trim_blocks = true;              // Hugging Face's settings unless a case says otherwise
  bool lstrip_blocks = true;
  bool crosscheck = true;  // false where Python prints differently on purpose (see the case)
};

const std::vector<JinjaCase>& jinja_cases();

}  // namespace duet::testing
