#include "duet/tokenizer/jinja/template.h"

#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/tokenizer/jinja/ast.h"
#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/jinja/interpreter.h"
#include "duet/tokenizer/jinja/lexer.h"
#include "duet/tokenizer/jinja/parser.h"
#include "duet/tokenizer/jinja/pystring.h"

namespace duet::jinja {
namespace {

Error to_duet_error(const TemplateError& e, std::string_view source, const std::string& name) {
  const std::string where =
      e.pos() == TemplateError::kNoPos ? std::string() : " at " + describe_position(source, e.pos());
  switch (e.kind()) {
    case TemplateError::Kind::kSyntax:
      return Error(ErrorCode::kInvalidArgument, fmt::format("{}: syntax error{}: {}", name, where, e.what()));
    case TemplateError::Kind::kRaised:
      return Error(ErrorCode::kInvalidArgument, fmt::format("{} raised an error{}: {}", name, where, e.what()));
    case TemplateError::Kind::kRuntime:
      break;
  }
  return Error(ErrorCode::kInvalidArgument, fmt::format("{}: error{}: {}", name, where, e.what()));
}

}  // namespace

std::string describe_position(std::string_view source, size_t pos) {
  pos = std::min(pos, source.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < pos; ++i) {
    if (source[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  const size_t column = codepoint_count(source.substr(line_start, pos - line_start)) + 1;
  return fmt::format("line {}, column {}", line, column);
}

Template::Template(std::string_view source, TemplateOptions options, std::string name)
    : source_(normalize_template_source(source, options.keep_trailing_newline)), name_(std::move(name)), options_(options) {
  try {
    const std::vector<Token> tokens = tokenize(source_, LexOptions{options.trim_blocks, options.lstrip_blocks});
    body_ = std::make_shared<const Body>(parse_template(tokens));
  } catch (const TemplateError& e) {
    throw to_duet_error(e, source_, name_);
  }
}

std::string Template::render(const Value& context) const {
  if (!context.is_dict()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: the variables to render with must be a dict, got '{}'", name_, context.type_name()));
  }
  std::string out;
  try {
    Interpreter interp(context);
    interp.render(*body_, out);
  } catch (const TemplateError& e) {
    throw to_duet_error(e, source_, name_);
  }
  return out;
}

std::string Template::render(const nlohmann::json& context) const {
  if (context.is_null()) return render(Value::dict());
  return render(from_json(context));
}

}  // namespace duet::jinja
