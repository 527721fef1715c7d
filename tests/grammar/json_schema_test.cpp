// JSON Schema grammars: random complete matches parse as JSON and keep the schema's structure
// (the full validation against an independent validator runs in the server tests, with ajv).
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/grammar/json_schema.h"
#include "duet/grammar/structured_output.h"
#include "grammar_fixture.h"

namespace duet::grammar {
namespace {

using Json = nlohmann::ordered_json;
using testing::matches;
using testing::random_match;

std::vector<Json> samples(const Json& schema, int count, uint32_t seed = 1) {
  Automaton a(std::make_shared<const Grammar>(json_schema_grammar(schema)));
  std::mt19937 rng(seed);
  std::vector<Json> out;
  for (int i = 0; i < count; ++i) {
    std::string text;
    EXPECT_TRUE(random_match(a, rng, text, 300, 0.2)) << schema.dump();
    try {
      out.push_back(Json::parse(text));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not JSON: " << text << " (" << e.what() << ")";
    }
  }
  return out;
}

TEST(JsonSchema, ObjectsKeepRequiredAndDeclaredProperties) {
  const Json schema = Json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 8},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "tags": {"type": "array", "items": {"enum": ["a", "b", 3, null]}, "maxItems": 3},
      "ok": {"type": "boolean"}
    },
    "required": ["name", "age"]
  })");
  for (const Json& v : samples(schema, 200)) {
    ASSERT_TRUE(v.is_object()) << v.dump();
    ASSERT_TRUE(v.contains("name") && v.contains("age")) << v.dump();
    for (auto it = v.begin(); it != v.end(); ++it) {
      ASSERT_TRUE(schema["properties"].contains(it.key())) << v.dump();
    }
    const std::string name = v["name"].get<std::string>();
    ASSERT_GE(name.size(), 1u);
    ASSERT_TRUE(v["age"].is_number_integer() && v["age"].get<int>() >= 0 && v["age"].get<int>() <= 150) << v.dump();
    if (v.contains("tags")) {
      ASSERT_LE(v["tags"].size(), 3u);
      for (const Json& t : v["tags"]) ASSERT_TRUE(t == "a" || t == "b" || t == 3 || t.is_null()) << v.dump();
    }
  }
}

TEST(JsonSchema, PropertiesComeInOrderAndOptionalOnesMaySkip) {
  const Json schema = Json::parse(R"({"properties": {"a": {"const": 1}, "b": {"const": 2}, "c": {"const": 3}},
                                      "required": ["c"]})");
  const Grammar g = json_schema_grammar(schema);
  for (const char* ok : {R"({"c":3})", R"({"a":1,"c":3})", R"({"a": 1, "b": 2, "c": 3})", "{ \"b\":2 ,\n  \"c\" : 3 }"}) {
    EXPECT_TRUE(matches(g, ok)) << ok;
  }
  for (const char* bad : {R"({})", R"({"c":3,"a":1})", R"({"a":1})", R"({"c":3,})", R"({"c":3,"d":4})", R"({"c":4})"}) {
    EXPECT_FALSE(matches(g, bad)) << bad;
  }
}

TEST(JsonSchema, AdditionalPropertiesRefsAndRecursion) {
  const Json schema = Json::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "number"},
                                                     "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                       "required": ["v"]}},
    "type": "object",
    "properties": {"root": {"$ref": "#/$defs/node"}},
    "additionalProperties": {"type": "string", "maxLength": 3},
    "required": ["root"]
  })");
  const Grammar g = json_schema_grammar(schema);
  EXPECT_TRUE(matches(g, R"({"root":{"v":1,"kids":[{"v":2.5},{"v":-3,"kids":[]}]},"x":"ab","y":""})"));
  EXPECT_FALSE(matches(g, R"({"root":{"v":1},"x":"abcd"})"));
  EXPECT_FALSE(matches(g, R"({"root":{"kids":[]}})"));
  for (const Json& v : samples(schema, 100, 4)) ASSERT_TRUE(v["root"].contains("v")) << v.dump();
}

TEST(JsonSchema, AnyOfTypeListsNullableAndAllOf) {
  const Grammar g = json_schema_grammar(Json::parse(R"({
    "type": "object",
    "properties": {
      "id": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[A-Z]{2}\\d{3}$"}]},
      "note": {"type": ["string", "null"]},
      "score": {"type": "number", "nullable": true, "minimum": 0, "maximum": 1},
      "both": {"allOf": [{"type": "object", "properties": {"p": {"type": "integer"}}, "required": ["p"]},
                         {"properties": {"q": {"type": "boolean"}}, "required": ["q"]}]}
    },
    "required": ["id", "note", "score", "both"]
  })"));
  EXPECT_TRUE(matches(g, R"({"id":12,"note":null,"score":0.25,"both":{"p":1,"q":true}})"));
  EXPECT_TRUE(matches(g, R"({"id":"AB123","note":"x","score":null,"both":{"p":-4,"q":false}})"));
  EXPECT_FALSE(matches(g, R"({"id":"AB12","note":"x","score":null,"both":{"p":1,"q":true}})"));
  EXPECT_FALSE(matches(g, R"({"id":1,"note":null,"score":1.5,"both":{"p":1,"q":true}})"));
  EXPECT_FALSE(matches(g, R"({"id":1,"note":null,"score":1,"both":{"p":1}})"));
}

TEST(JsonSchema, ArraysWithBoundsAndTuples) {
  const Grammar g = json_schema_grammar(Json::parse(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})"));
  EXPECT_FALSE(matches(g, "[1]"));
  EXPECT_TRUE(matches(g, "[1, 2]"));
  EXPECT_TRUE(matches(g, "[1,2,3]"));
  EXPECT_FALSE(matches(g, "[1,2,3,4]"));
  const Grammar t = json_schema_grammar(Json::parse(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": false})"));
  EXPECT_TRUE(matches(t, R"(["a", true])"));
  EXPECT_TRUE(matches(t, R"(["a"])"));
  EXPECT_TRUE(matches(t, R"([])"));
  EXPECT_FALSE(matches(t, R"(["a", true, 1])"));
  EXPECT_FALSE(matches(t, R"([true])"));
}

TEST(JsonSchema, StringsFormatsAndEscapes) {
  const Grammar g = json_schema_grammar(Json::parse(R"({"type": "string"})"));
  EXPECT_TRUE(matches(g, R"("a \"quoted\" \\ \n \u00e9 é")"));
  EXPECT_FALSE(matches(g, "\"raw\nnewline\""));
  EXPECT_FALSE(matches(g, R"("\q")"));
  EXPECT_FALSE(matches(g, R"("\ud800")"));  // a lone surrogate
  const Grammar d = json_schema_grammar(Json::parse(R"({"type": "string", "format": "date-time"})"));
  EXPECT_TRUE(matches(d, R"("2024-02-28T13:45:00Z")"));
  EXPECT_TRUE(matches(d, R"("2024-02-28T13:45:00.123+05:30")"));
  EXPECT_FALSE(matches(d, R"("2024-13-01T00:00:00Z")"));
  const Grammar e = json_schema_grammar(Json::parse(R"({"type": "string", "format": "email"})"));
  EXPECT_TRUE(matches(e, R"("ann.lee@example.com")"));
  EXPECT_FALSE(matches(e, R"("not an email")"));
}

TEST(JsonSchema, JsonObjectResponseFormat) {
  const Grammar g = json_object_grammar();
  EXPECT_TRUE(matches(g, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_FALSE(matches(g, "[1]"));
  EXPECT_FALSE(matches(g, R"({"a": 1,})"));
}

TEST(JsonSchema, RefusesWhatItCannotGuarantee) {
  auto message = [](const char* text) {
    try {
      json_schema_grammar(Json::parse(text));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message(R"({"type": "integer", "multipleOf": 3})").find("multipleOf"), std::string::npos);
  EXPECT_NE(message(R"({"properties": {"a": {"not": {"type": "string"}}}})").find("/properties/a"), std::string::npos);
  EXPECT_NE(message(R"({"type": "array", "uniqueItems": true})").find("uniqueItems"), std::string::npos);
  EXPECT_NE(message(R"({"$ref": "#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(message(R"({"type": "strin"})").find("unknown type"), std::string::npos);
  EXPECT_NE(message(R"J({"type": "string", "pattern": "(?=x)"})J").find("pattern"), std::string::npos);
  EXPECT_NE(message(R"({"type": "integer", "minimum": 5, "maximum": 1})").find("no integer"), std::string::npos);
}

TEST(StructuredOutput, CompilesEveryKindAndCaches) {
  EXPECT_TRUE(matches(compile_structured_output({ConstraintKind::kChoice, R"(["yes", "no"])"}), "no"));
  EXPECT_FALSE(matches(compile_structured_output({ConstraintKind::kChoice, R"(["yes", "no"])"}), "maybe"));
  EXPECT_TRUE(matches(compile_structured_output({ConstraintKind::kRegex, "[0-9]{3}"}), "123"));
  EXPECT_TRUE(matches(compile_structured_output({ConstraintKind::kGrammar, "root ::= \"x\"+"}), "xxx"));
  EXPECT_TRUE(matches(compile_structured_output({ConstraintKind::kJsonSchema, R"({"type": "boolean"})"}), "true"));
  EXPECT_THROW(compile_structured_output({ConstraintKind::kJsonSchema, "{not json"}), Error);
  EXPECT_THROW(compile_structured_output({ConstraintKind::kChoice, "[]"}), Error);
  GrammarCache cache(2);
  auto a = cache.get({ConstraintKind::kRegex, "a"});
  EXPECT_EQ(cache.get({ConstraintKind::kRegex, "a"}), a);
  cache.get({ConstraintKind::kRegex, "b"});
  cache.get({ConstraintKind::kRegex, "c"});
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_NE(cache.get({ConstraintKind::kRegex, "a"}), a);  // dropped, compiled again
}

}  // namespace
}  // namespace duet::grammar
