#include "duet/server/tool_calls.h"

#include <algorithm>

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/grammar/json_schema.h"

namespace duet::server {
namespace {

using grammar::ExprPtr;
using grammar::GrammarBuilder;
using grammar::JsonSchemaCompiler;
using grammar::alt;
using grammar::literal;
using grammar::seq;
using Json = nlohmann::ordered_json;

using namespace markup;

// The arguments of `f` as an expression of `b` (each function's schema is its own $ref root).
ExprPtr arguments(GrammarBuilder& b, const ToolFunction& f, std::vector<std::unique_ptr<JsonSchemaCompiler>>& keep) {
  keep.push_back(std::make_unique<JsonSchemaCompiler>(b, f.parameters));
  JsonSchemaCompiler& c = *keep.back();
  try {
    if (f.parameters.empty()) return c.any_object();
    return c.value(f.parameters, "");
  } catch (const Error& e) {
    fail(ErrorCode::kInvalidArgument, "tools: the parameters of function '{}': {}", f.name, e.what());
  }
}

// DSML text (a string="true" parameter's value): any text but the closing tag's start "</｜";
// so it cannot end in '<' either.
ExprPtr dsml_text() {
  using grammar::codepoints;
  using grammar::normalize_ranges;
  const ExprPtr not_lt = codepoints(normalize_ranges({{'<', '<'}}, true));
  const ExprPtr not_slash = codepoints(normalize_ranges({{'/', '/'}}, true));
  const ExprPtr not_bar = codepoints(normalize_ranges({{0xFF5C, 0xFF5C}}, true));
  return grammar::star(alt({not_lt, seq({literal("<"), not_slash}), seq({literal("</"), not_bar})}));
}

constexpr const char* kStringConstraints[] = {"minLength", "maxLength", "pattern", "format"};

// One DSML parameter `key` whose value is valid under `schema`: text for a string (string
// "true"), JSON for the rest (string "false"); both where the schema allows strings and more.
ExprPtr dsml_parameter(JsonSchemaCompiler& c, const std::string& key, const Json& schema, const std::string& path) {
  const std::string open = fmt::format("{} name=\"{}\" string=", kDsmlParameter, key);
  const ExprPtr close = literal(std::string(kDsmlParameterEnd));
  auto text = [&](ExprPtr value) { return seq({literal(open + "\"true\">"), std::move(value), close}); };
  auto json = [&] { return seq({literal(open + "\"false\">"), c.value(schema, path), close}); };
  if (!schema.is_object()) return alt({text(dsml_text()), json()});
  // Fixed strings: the choices as text (a const alone where there is one, as the schema compiler
  // takes it, else the enum's).
  std::vector<Json> choices;
  if (schema.contains("const")) {
    choices.push_back(schema["const"]);
  } else if (schema.contains("enum") && schema["enum"].is_array()) {
    choices.assign(schema["enum"].begin(), schema["enum"].end());
  }
  if (!choices.empty() && std::all_of(choices.begin(), choices.end(), [](const Json& v) { return v.is_string(); })) {
    std::vector<ExprPtr> options;
    for (const Json& v : choices) options.push_back(literal(v.get<std::string>()));
    return text(alt(std::move(options)));
  }
  // A string with a length, pattern or format goes as JSON (string="false", which the encoding
  // reads as JSON too), where the schema compiler holds it to them.
  const bool constrained = std::any_of(std::begin(kStringConstraints), std::end(kStringConstraints),
                                       [&](const char* k) { return schema.contains(k); });
  const auto type = schema.find("type");
  if (type != schema.end() && type->is_string()) {
    return *type == "string" && !constrained ? text(dsml_text()) : json();
  }
  const bool may_be_string = type == schema.end() || !type->is_array() ||
                             std::any_of(type->begin(), type->end(), [](const Json& t) { return t == "string"; });
  return may_be_string && !constrained ? alt({text(dsml_text()), json()}) : json();
}

// A DSML call of `f`: its declared parameters in their order (the required ones always, the
// others when chosen), or any parameters for a function that declares none.
ExprPtr dsml_call(GrammarBuilder& b, const ToolFunction& f, std::vector<std::unique_ptr<JsonSchemaCompiler>>& keep) {
  keep.push_back(std::make_unique<JsonSchemaCompiler>(b, f.parameters));
  JsonSchemaCompiler& c = *keep.back();
  const ExprPtr newline = literal("\n");
  ExprPtr body;
  try {
    const auto properties = f.parameters.find("properties");
    if (properties != f.parameters.end() && properties->is_object() && !properties->empty()) {
      std::vector<ExprPtr> items;
      bool any_required = false;
      for (const auto& [key, schema] : properties->items()) {
        const auto required = f.parameters.find("required");
        const bool is_required = required != f.parameters.end() && required->is_array() &&
                                 std::find(required->begin(), required->end(), Json(key)) != required->end();
        any_required = any_required || is_required;
        ExprPtr item = seq({dsml_parameter(c, key, schema, "/properties/" + key), newline});
        items.push_back(is_required ? item : grammar::optional(item));
      }
      body = seq(std::move(items));
      // No parameters at all: the published encoding's empty line.
      if (!any_required) body = alt({body, newline});
    } else {
      const ExprPtr name = grammar::plus(grammar::codepoints(grammar::normalize_ranges({{'"', '"'}, {'<', '>'}}, true)));
      const ExprPtr close = literal(std::string(kDsmlParameterEnd));
      const ExprPtr open = literal(std::string(kDsmlParameter) + " name=\"");
      const ExprPtr any = alt({seq({open, name, literal("\" string=\"true\">"), dsml_text(), close}),
                               seq({open, name, literal("\" string=\"false\">"), c.any_value(), close})});
      body = alt({grammar::star(seq({any, newline})), newline});
    }
  } catch (const Error& e) {
    fail(ErrorCode::kInvalidArgument, "tools: the parameters of function '{}': {}", f.name, e.what());
  }
  return seq({literal(fmt::format("{} name=\"{}\">\n", kDsmlInvoke, f.name)), body, literal(std::string(kDsmlInvokeEnd))});
}

std::string parameters_text(const ToolFunction& f) {
  return f.parameters.empty() ? std::string("{\"type\": \"object\"}") : f.parameters.dump();
}

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

}  // namespace

ToolRequest parse_tool_request(const Json& body) {
  ToolRequest r;
  const auto tools = body.find("tools");
  if (tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) fail(ErrorCode::kInvalidArgument, "tools must be a list of tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const bool is_function_type = t.is_object() && (!t.contains("type") || t["type"] == "function");
      if (!is_function_type || !t.contains("function") ||
          !t["function"].is_object()) {
        fail(ErrorCode::kInvalidArgument, "tools[{}] must be {{\"type\": \"function\", \"function\": {{...}}}}", i);
      }
      const Json& f = t["function"];
      ToolFunction fn;
      if (!f.contains("name") || !f["name"].is_string() || !valid_name(f["name"].get<std::string>())) {
        fail(ErrorCode::kInvalidArgument, "tools[{}].function.name must be 1 to 64 letters, digits, '_' or '-'", i);
      }
      fn.name = f["name"].get<std::string>();
      for (const ToolFunction& other : r.functions) {
        if (other.name == fn.name) fail(ErrorCode::kInvalidArgument, "tools[{}].function.name '{}' is declared twice", i, fn.name);
      }
      if (f.contains("description") && !f["description"].is_null()) {
        if (!f["description"].is_string()) fail(ErrorCode::kInvalidArgument, "tools[{}].function.description must be a string", i);
        fn.description = f["description"].get<std::string>();
      }
      fn.parameters = Json::object();
      if (f.contains("parameters") && !f["parameters"].is_null()) {
        if (!f["parameters"].is_object()) {
          fail(ErrorCode::kInvalidArgument, "tools[{}].function.parameters must be a JSON schema object", i);
        }
        fn.parameters = f["parameters"];
      }
      r.functions.push_back(std::move(fn));
    }
    r.tools = *tools;
  }
  r.choice = r.functions.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  const auto choice = body.find("tool_choice");
  if (choice != body.end() && !choice->is_null()) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "none") {
        r.choice = ToolChoice::kNone;
      } else if (c == "auto") {
        r.choice = ToolChoice::kAuto;
      } else if (c == "required") {
        r.choice = ToolChoice::kRequired;
      } else {
        fail(ErrorCode::kInvalidArgument, "tool_choice is '{}', expected none, auto, required or a named function", c);
      }
    } else if (choice->is_object() && choice->contains("function") && (*choice)["function"].is_object() &&
               (*choice)["function"].contains("name") && (*choice)["function"]["name"].is_string()) {
      r.choice = ToolChoice::kNamed;
      r.named = (*choice)["function"]["name"].get<std::string>();
    } else {
      fail(ErrorCode::kInvalidArgument,
           "tool_choice must be none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}");
    }
    if (r.choice != ToolChoice::kNone && r.functions.empty()) {
      fail(ErrorCode::kInvalidArgument, "tool_choice asks for a tool call but the request has no tools");
    }
    if (r.choice == ToolChoice::kNamed &&
        std::none_of(r.functions.begin(), r.functions.end(), [&](const ToolFunction& f) { return f.name == r.named; })) {
      fail(ErrorCode::kInvalidArgument, "tool_choice names the function '{}', which is not among the tools", r.named);
    }
  }
  const auto parallel = body.find("parallel_tool_calls");
  if (parallel != body.end() && !parallel->is_null()) {
    if (!parallel->is_boolean()) fail(ErrorCode::kInvalidArgument, "parallel_tool_calls must be true or false");
    r.parallel = parallel->get<bool>();
  }
  return r;
}

grammar::Grammar tool_markup_grammar(ToolCallFormat format, const std::vector<ToolFunction>& functions, bool parallel) {
  GrammarBuilder b;
  std::vector<std::unique_ptr<JsonSchemaCompiler>> compilers;
  std::vector<ExprPtr> calls;
  if (format == ToolCallFormat::kDeepSeekV32) {
    // After a blank line, as the published encoding writes a call after (empty) content.
    for (const ToolFunction& f : functions) calls.push_back(dsml_call(b, f, compilers));
    const int32_t call = b.add("call", alt(std::move(calls)));
    const ExprPtr more = parallel ? grammar::star(seq({literal("\n"), grammar::ref(call)})) : grammar::empty();
    const int32_t root = b.add("root", seq({literal(fmt::format("\n\n{}\n", kDsmlCallsBegin)), grammar::ref(call), more,
                                            literal(fmt::format("\n{}", kDsmlCallsEnd))}));
    return std::move(b).build(root);
  }
  for (const ToolFunction& f : functions) {
    const ExprPtr args = arguments(b, f, compilers);
    if (format == ToolCallFormat::kDeepSeekV3) {
      calls.push_back(seq({literal(fmt::format("{}function{}{}\n```json\n", kCallBegin, kSep, f.name)), args,
                           literal(fmt::format("\n```{}", kCallEnd))}));
    } else {
      calls.push_back(seq({literal(fmt::format("{}{}{}", kCallBegin, f.name, kSep)), args, literal(std::string(kCallEnd))}));
    }
  }
  const int32_t call = b.add("call", alt(std::move(calls)));
  const ExprPtr separator = format == ToolCallFormat::kDeepSeekV3 ? literal("\n") : grammar::empty();
  const ExprPtr more = parallel ? grammar::star(seq({separator, grammar::ref(call)})) : grammar::empty();
  const int32_t root = b.add("root", seq({literal(std::string(kCallsBegin)), grammar::ref(call), more,
                                          literal(std::string(kCallsEnd))}));
  return std::move(b).build(root);
}

grammar::Grammar tool_arguments_grammar(const ToolFunction& function) {
  GrammarBuilder b;
  std::vector<std::unique_ptr<JsonSchemaCompiler>> compilers;
  const int32_t root = b.add("root", arguments(b, function, compilers));
  return std::move(b).build(root);
}

grammar::Grammar tool_list_grammar(const std::vector<ToolFunction>& functions, bool parallel) {
  GrammarBuilder b;
  std::vector<std::unique_ptr<JsonSchemaCompiler>> compilers;
  std::vector<ExprPtr> items;
  for (const ToolFunction& f : functions) {
    const ExprPtr args = arguments(b, f, compilers);
    items.push_back(seq({literal(fmt::format("{{\"name\": {}, \"parameters\": ", Json(f.name).dump())), args, literal("}")}));
  }
  const int32_t item = b.add("call", alt(std::move(items)));
  const ExprPtr more = parallel ? grammar::star(seq({literal(", "), grammar::ref(item)})) : grammar::empty();
  const int32_t root = b.add("root", seq({literal("["), grammar::ref(item), more, literal("]")}));
  return std::move(b).build(root);
}

std::string tool_system_prompt(const std::vector<ToolFunction>& functions, std::optional<ToolCallFormat> format) {
  std::string out = "## Tools\nYou can call the following tools.\n";
  for (const ToolFunction& f : functions) {
    out += fmt::format("\n### {}\n", f.name);
    if (!f.description.empty()) out += fmt::format("Description: {}\n", f.description);
    out += fmt::format("\nParameters: {}\n", parameters_text(f));
  }
  out += "\nTo call tools, answer in exactly this format:\n";
  if (!format) {
    out += "[{\"name\": TOOL_NAME, \"parameters\": ARGUMENTS}]\n"
           "a JSON list with one object per call, where TOOL_NAME is one of the tools above and ARGUMENTS is a JSON "
           "object valid under its Parameters.";
  } else if (*format == ToolCallFormat::kDeepSeekV32) {
    out += fmt::format("{}\n<｜DSML｜invoke name=\"TOOL_NAME\">\n<｜DSML｜parameter name=\"NAME\" string=\"true\">TEXT"
                       "{}\n<｜DSML｜parameter name=\"NAME2\" string=\"false\">JSON{}\n</｜DSML｜invoke>\n{}\n",
                       kDsmlCallsBegin, kDsmlParameterEnd, kDsmlParameterEnd, kDsmlCallsEnd);
    out += "Further calls go before the final end marker, one invoke per line. TOOL_NAME is one of the tools above; "
           "each argument is a parameter: text as it is with string=\"true\", other values (numbers, booleans, lists, "
           "objects) as JSON with string=\"false\".";
  } else if (*format == ToolCallFormat::kDeepSeekV3) {
    out += fmt::format("{}{}function{}TOOL_NAME\n```json\nARGUMENTS\n```{}{}\n", kCallsBegin, kCallBegin, kSep, kCallEnd,
                       kCallsEnd);
    out += "Further calls go before the final end marker, one per line. TOOL_NAME is one of the tools above and "
           "ARGUMENTS is a JSON object valid under its Parameters.";
  } else {
    out += fmt::format("{}{}TOOL_NAME{}ARGUMENTS{}{}\n", kCallsBegin, kCallBegin, kSep, kCallEnd, kCallsEnd);
    out += "Further calls follow directly, before the final end marker. TOOL_NAME is one of the tools above and "
           "ARGUMENTS is a JSON object valid under its Parameters.";
  }
  return out;
}

}  // namespace duet::server
