// A compiled Jinja template: parsed once, rendered many times, from several threads at once.
//
//   jinja::Template t("Hello {{ name }}!", {.trim_blocks = true, .lstrip_blocks = true});
//   std::string s = t.render(nlohmann::json{{"name", "duet"}});
//
// The language is Jinja2's, as Hugging Face chat templates use it (see jinja/README.md for what
// is supported). Errors are duet::Error with kInvalidArgument and a message that names the
// template, the line and column, and what went wrong.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "duet/tokenizer/jinja/value.h"

namespace duet::jinja {

struct Stmt;

struct TemplateOptions {
  bool trim_blocks = false;            // drop the first newline after a block tag
  bool lstrip_blocks = false;          // drop spaces and tabs before a block tag at a line start
  bool keep_trailing_newline = false;  // Jinja2 drops one trailing newline of the source by default
};

class Template {
 public:
  // Parses `source`. `name` is how error messages call the template ("chat template").
  explicit Template(std::string_view source, TemplateOptions options = {}, std::string name = "template");

  // Renders with the variables of `context`, a dict (see from_json). Besides them the template
  // sees the globals range, dict, namespace, raise_exception and strftime_now.
  std::string render(const Value& context) const;
  std::string render(const nlohmann::json& context) const;

  const std::string& name() const { return name_; }
  const TemplateOptions& options() const { return options_; }

 private:
  std::string source_;  // newline-normalized, as positions refer to it
  std::string name_;
  TemplateOptions options_;
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
};

// "line 3, column 7" for a byte offset into `source` (columns count code points, from 1).
std::string describe_position(std::string_view source, size_t pos);

}  // namespace duet::jinja
