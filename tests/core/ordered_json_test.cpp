#include "duet/core/ordered_json.h"
#include "duet/core/json_excerpt.h"

#include <random>
#include <string>

#include <gtest/gtest.h>

namespace duet {
namespace {

using nlohmann::ordered_json;

// What nlohmann's own ordered parse gives, on documents with every kind of value, nesting, key
// orders that differ from sorted, and repeated keys (first place, last value).
TEST(OrderedJsonTest, ParsesAsNlohmannsOrderedParse) {
  const char* docs[] = {
      "null", "true", "-12", "18446744073709551615", "2.5e-3", "\"x\\u00e9\"", "[]", "{}",
      R"({"z": 1, "a": [1, {"y": null, "b": [true, false]}], "m": {"q": "s", "c": {}}})",
      R"({"k": 1, "j": 2, "k": 3})",
      R"({"a": {"x": 1}, "b": 2, "a": {"y": 2}, "c": [{"d": 1, "d": [2]}]})",
      R"([{"b": 1, "a": 2}, [[], {}], "s", -0.0])",
  };
  for (const char* doc : docs) {
    const ordered_json want = ordered_json::parse(doc);
    const ordered_json got = parse_ordered_json(doc);
    EXPECT_EQ(got.dump(), want.dump()) << doc;
    EXPECT_EQ(to_ordered_json(nlohmann::json::parse(doc)).dump(), nlohmann::json::parse(doc).dump()) << doc;
  }
  // Random objects with repeated keys among thousands.
  std::mt19937 rng(7);
  std::string doc = "{";
  for (int i = 0; i < 5000; ++i) {
    doc += (i ? ", \"" : "\"") + std::to_string(rng() % 3000) + "\": " + std::to_string(i);
  }
  doc += "}";
  EXPECT_EQ(parse_ordered_json(doc).dump(), ordered_json::parse(doc).dump());
}

TEST(OrderedJsonTest, ErrorsAreNlohmanns) {
  EXPECT_THROW(parse_ordered_json("{\"a\": }"), nlohmann::json::parse_error);
  EXPECT_THROW(parse_ordered_json("[1, 2"), nlohmann::json::parse_error);
  EXPECT_THROW(parse_ordered_json("{} x"), nlohmann::json::parse_error);
  EXPECT_THROW(parse_ordered_json(""), nlohmann::json::parse_error);
  EXPECT_THROW(parse_ordered_json("1e999"), nlohmann::json::out_of_range);
}

TEST(JsonExcerpt, ShortAndShallowWhateverTheValue) {
  EXPECT_EQ(json_excerpt(nlohmann::json::parse(R"({"a": [1, "x", null]})")), R"({"a": [1, "x", null]})");
  EXPECT_EQ(json_excerpt(nlohmann::ordered_json::parse(R"({"b": 1, "a": 2})")), R"({"b": 1, "a": 2})");
  EXPECT_EQ(json_excerpt(nlohmann::json(42)), "42");
  // 1,000,000 levels (parsed without recursion; dump() would recurse once per level).
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  EXPECT_EQ(json_excerpt(nlohmann::json::parse(deep)), "[[[[[[[[[...]]]]]]]]]");
  const std::string wide = json_excerpt(nlohmann::json(std::vector<int>(100000, 7)), 50);
  EXPECT_LE(wide.size(), 56u) << wide;
  EXPECT_EQ(wide.substr(0, 7), "[7, 7, ");
  EXPECT_EQ(wide.substr(wide.size() - 3), "...");
}

}  // namespace
}  // namespace duet
