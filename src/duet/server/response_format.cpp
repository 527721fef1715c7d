#include "duet/server/response_format.h"

#include <vector>

#include "duet/core/error.h"

namespace duet::server {
namespace {

using json = nlohmann::ordered_json;
using grammar::ConstraintKind;
using grammar::StructuredOutputSpec;

StructuredOutputSpec schema_spec(const json& schema, const char* field) {
  if (schema.is_string()) return {ConstraintKind::kJsonSchema, schema.get<std::string>()};
  if (schema.is_object() || schema.is_boolean()) return {ConstraintKind::kJsonSchema, schema.dump()};
  fail(ErrorCode::kInvalidArgument, "{} must be a JSON schema (an object)", field);
}

StructuredOutputSpec text_spec(const json& v, ConstraintKind kind, const char* field) {
  if (!v.is_string() || v.get<std::string>().empty()) fail(ErrorCode::kInvalidArgument, "{} must be a non-empty string", field);
  return {kind, v.get<std::string>()};
}

StructuredOutputSpec choice_spec(const json& v, const char* field) {
  if (!v.is_array() || v.empty()) fail(ErrorCode::kInvalidArgument, "{} must be a non-empty list of strings", field);
  for (const json& c : v) {
    if (!c.is_string() || c.get<std::string>().empty()) fail(ErrorCode::kInvalidArgument, "{} must be a list of non-empty strings", field);
  }
  return {ConstraintKind::kChoice, v.dump()};
}

}  // namespace

std::optional<RequestedOutput> structured_output_spec(const json& body) {
  std::vector<std::pair<const char*, StructuredOutputSpec>> found;
  auto present = [&](const char* key) { return body.contains(key) && !body.at(key).is_null(); };
  if (present("response_format")) {
    const json& rf = body.at("response_format");
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
      fail(ErrorCode::kInvalidArgument, "response_format must be an object with a type (text, json_object or json_schema)");
    }
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_object") {
      found.emplace_back("response_format", StructuredOutputSpec{ConstraintKind::kJsonObject, {}});
    } else if (type == "json_schema") {
      const json js = rf.value("json_schema", json());
      if (!js.is_object() || !js.contains("schema")) {
        fail(ErrorCode::kInvalidArgument, "response_format json_schema must be {{\"name\": ..., \"schema\": {{...}}}}");
      }
      found.emplace_back("response_format", schema_spec(js["schema"], "response_format"));
    } else if (type != "text") {
      fail(ErrorCode::kInvalidArgument, "response_format type is '{}', expected text, json_object or json_schema", type);
    }
  }
  if (present("guided_json")) found.emplace_back("guided_json", schema_spec(body.at("guided_json"), "guided_json"));
  if (present("guided_regex")) {
    found.emplace_back("guided_regex", text_spec(body.at("guided_regex"), ConstraintKind::kRegex, "guided_regex"));
  }
  if (present("guided_choice")) found.emplace_back("guided_choice", choice_spec(body.at("guided_choice"), "guided_choice"));
  if (present("guided_grammar")) {
    found.emplace_back("guided_grammar", text_spec(body.at("guided_grammar"), ConstraintKind::kGrammar, "guided_grammar"));
  }
  if (present("structured_outputs")) {
    const json& so = body.at("structured_outputs");
    if (!so.is_object()) fail(ErrorCode::kInvalidArgument, "structured_outputs must be an object");
    for (auto it = so.begin(); it != so.end(); ++it) {
      if (it.value().is_null()) continue;
      const std::string& k = it.key();
      if (k == "json") {
        found.emplace_back("structured_outputs", schema_spec(it.value(), "structured_outputs"));
      } else if (k == "regex") {
        found.emplace_back("structured_outputs", text_spec(it.value(), ConstraintKind::kRegex, "structured_outputs"));
      } else if (k == "choice") {
        found.emplace_back("structured_outputs", choice_spec(it.value(), "structured_outputs"));
      } else if (k == "grammar") {
        found.emplace_back("structured_outputs", text_spec(it.value(), ConstraintKind::kGrammar, "structured_outputs"));
      } else if (k == "json_object" && it.value() == json(true)) {
        found.emplace_back("structured_outputs", StructuredOutputSpec{ConstraintKind::kJsonObject, {}});
      }
    }
  }
  if (found.size() > 1) {
    fail(ErrorCode::kInvalidArgument, "{} cannot be combined with {}: give one output constraint", found[1].first,
         found[0].first);
  }
  if (found.empty()) return std::nullopt;
  return RequestedOutput{found.front().first, found.front().second};
}

}  // namespace duet::server
