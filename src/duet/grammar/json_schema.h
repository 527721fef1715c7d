// JSON Schema compiled to a grammar whose every complete match is a JSON text valid under the
// schema. What is covered: type (one or a list), properties with required and
// additionalProperties (false, true or a schema), items / prefixItems (and the older tuple form)
// with minItems / maxItems, enum and const, anyOf / oneOf (as alternatives; a value matching
// several branches of a oneOf would be invalid, so branches should be exclusive), allOf of object
// schemas (merged), $ref into the document ("#", "#/$defs/...", "#/definitions/..."; recursion
// allowed), nullable (OpenAPI), strings with minLength / maxLength, pattern (regex.h) or format
// (date-time, date, time, email, uuid, ipv4, hostname, uri), numbers and integers with
// minimum / maximum and their exclusive forms (number_ranges.h).
//
// Choices where the schema leaves room: properties come in the schema's order; an object with
// `properties` and no `additionalProperties` takes no other property (an object schema without
// `properties` takes any); whitespace between tokens is nothing, one space, or a line break with
// an indent of up to kMaxIndent spaces or tabs, so a model cannot stall in whitespace. Keywords that constrain values in ways the grammar cannot
// express (not, if/then/else, multipleOf, uniqueItems, patternProperties, minProperties,
// contains, ...) are refused with kInvalidArgument naming the keyword and where it is (a JSON
// pointer), rather than ignored into invalid output. Annotations (title, description, default,
// examples, ...) and unknown keywords are ignored.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "duet/grammar/grammar.h"

namespace duet::grammar {

class JsonSchemaCompiler {
 public:
  static constexpr int32_t kMaxIndent = 20;

  // `root` is the document $ref pointers resolve in; it must outlive the compiler.
  JsonSchemaCompiler(GrammarBuilder& builder, const nlohmann::ordered_json& root);

  // A value valid under `schema` (the root, or a part of it at JSON pointer `path`).
  ExprPtr value(const nlohmann::ordered_json& schema, const std::string& path);
  // Any JSON value; any JSON object.
  ExprPtr any_value();
  ExprPtr any_object();
  // Optional whitespace between tokens.
  ExprPtr ws();

 private:
  ExprPtr compile(const nlohmann::ordered_json& schema, const std::string& path);
  ExprPtr typed(const nlohmann::ordered_json& schema, const std::string& type, const std::string& path);
  ExprPtr object(const nlohmann::ordered_json& schema, const std::string& path);
  ExprPtr array(const nlohmann::ordered_json& schema, const std::string& path);
  ExprPtr string(const nlohmann::ordered_json& schema, const std::string& path);
  ExprPtr number(const nlohmann::ordered_json& schema, const std::string& path, bool integer);
  ExprPtr reference(const std::string& ref, const std::string& path);
  ExprPtr common(const std::string& name);
  nlohmann::ordered_json merge_all_of(const nlohmann::ordered_json& schema, const std::string& path);

  GrammarBuilder& b_;
  const nlohmann::ordered_json& root_;
  std::map<std::string, int32_t> rules_;  // common rules and $ref targets by name
  int depth_ = 0;
};

// A grammar for one JSON value valid under `schema`. Throws kInvalidArgument (see above).
Grammar json_schema_grammar(const nlohmann::ordered_json& schema);
// A grammar for any JSON object (response_format json_object).
Grammar json_object_grammar();

}  // namespace duet::grammar
