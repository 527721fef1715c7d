// The tool-call parser on DeepSeek's V3, V3.1 and V3.2 (DSML) markup: the whole text at once, and
// the same text cut into pieces at every position, give the same content and calls. For DSML, the
// grammar that forces a call (tool_markup_grammar) is checked too: random texts it accepts parse
// into calls whose arguments are JSON valid under each function's parameters.
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../grammar/grammar_fixture.h"
#include "duet/server/tool_calls.h"
#include "duet/server/tool_parser.h"

namespace duet::server {
namespace {

struct Parsed {
  std::string content;
  std::vector<ToolCallParser::Call> calls;  // from the deltas
};

Parsed feed(ToolCallFormat format, const std::vector<std::string>& pieces) {
  ToolCallParser p(format);
  Parsed out;
  auto take = [&](const ToolCallParser::Delta& d) {
    out.content += d.content;
    for (const ToolCallParser::CallDelta& c : d.calls) {
      if (c.name) {
        EXPECT_EQ(c.index, out.calls.size());
        out.calls.push_back({*c.name, {}});
      }
      EXPECT_LT(c.index, out.calls.size());
      out.calls[c.index].arguments += c.arguments;
    }
  };
  for (const std::string& piece : pieces) take(p.push(piece));
  take(p.flush());
  EXPECT_EQ(p.calls().size(), out.calls.size());
  for (size_t i = 0; i < out.calls.size() && i < p.calls().size(); ++i) {
    EXPECT_EQ(p.calls()[i].name, out.calls[i].name);
    EXPECT_EQ(p.calls()[i].arguments, out.calls[i].arguments);
  }
  return out;
}

// Every way of cutting `text` in two and in three places (byte positions, so UTF-8 is cut too).
void expect_same_in_pieces(ToolCallFormat format, const std::string& text, const Parsed& whole) {
  for (size_t i = 0; i <= text.size(); ++i) {
    const Parsed two = feed(format, {text.substr(0, i), text.substr(i)});
    ASSERT_EQ(two.content, whole.content) << "cut at " << i;
    ASSERT_EQ(two.calls.size(), whole.calls.size()) << "cut at " << i;
    for (size_t k = 0; k < whole.calls.size(); ++k) {
      ASSERT_EQ(two.calls[k].name, whole.calls[k].name) << "cut at " << i;
      ASSERT_EQ(two.calls[k].arguments, whole.calls[k].arguments) << "cut at " << i;
    }
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  const Parsed each = feed(format, bytes);
  EXPECT_EQ(each.content, whole.content);
  ASSERT_EQ(each.calls.size(), whole.calls.size());
  for (size_t k = 0; k < whole.calls.size(); ++k) EXPECT_EQ(each.calls[k].arguments, whole.calls[k].arguments);
}

TEST(ToolCallParser, DeepSeekV3Markup) {
  const std::string text =
      "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Paris\", \"note\": \"a ``` fence\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function"
      "<｜tool▁sep｜>get_time\n```json\n{\"tz\": \"Asia/Tokyo\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const Parsed whole = feed(ToolCallFormat::kDeepSeekV3, {text});
  EXPECT_EQ(whole.content, "Let me look.");
  ASSERT_EQ(whole.calls.size(), 2u);
  EXPECT_EQ(whole.calls[0].name, "get_weather");
  EXPECT_EQ(whole.calls[0].arguments, "{\"city\": \"Paris\", \"note\": \"a ``` fence\"}");
  EXPECT_EQ(whole.calls[1].name, "get_time");
  EXPECT_EQ(whole.calls[1].arguments, "{\"tz\": \"Asia/Tokyo\"}");
  expect_same_in_pieces(ToolCallFormat::kDeepSeekV3, text, whole);
}

TEST(ToolCallParser, DeepSeekV31Markup) {
  const std::string text =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"北京\"}<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const Parsed whole = feed(ToolCallFormat::kDeepSeekV31, {text});
  EXPECT_EQ(whole.content, "");
  ASSERT_EQ(whole.calls.size(), 2u);
  EXPECT_EQ(whole.calls[0].arguments, "{\"city\": \"北京\"}");
  EXPECT_EQ(whole.calls[1].name, "get_time");
  EXPECT_EQ(whole.calls[1].arguments, "{}");
  expect_same_in_pieces(ToolCallFormat::kDeepSeekV31, text, whole);
}

TEST(ToolCallParser, TextThatOnlyLooksLikeAMarkerIsContent) {
  const std::string text = "a < b and <｜tool is not a marker; neither is <｜tool▁calls▁begin";
  const Parsed whole = feed(ToolCallFormat::kDeepSeekV3, {text});
  EXPECT_EQ(whole.content, text);
  EXPECT_TRUE(whole.calls.empty());
  expect_same_in_pieces(ToolCallFormat::kDeepSeekV3, text, whole);
}

TEST(ToolCallParser, OutputCutShortKeepsWhatArrived) {
  const Parsed p = feed(ToolCallFormat::kDeepSeekV31,
                        {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": [1, 2"});
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "f");
  EXPECT_EQ(p.calls[0].arguments, "{\"a\": [1, 2");
  // A call without the list marker, and text after the list, which is dropped.
  const Parsed q = feed(ToolCallFormat::kDeepSeekV31, {"<｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
                                                       "<｜tool▁calls▁end｜>trailing"});
  ASSERT_EQ(q.calls.size(), 1u);
  EXPECT_EQ(q.calls[0].name, "g");
  EXPECT_EQ(q.content, "");
}

// DeepSeek-V3.2's DSML: the arguments come out as the published encoding reads them back
// ({"KEY": value, ...}: text values as JSON strings, the others as written).
TEST(ToolCallParser, DeepSeekV32Markup) {
  const std::string text =
      "Let me look.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">北京 \"south\"\\\nline\ttab</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"units\": [\"c\", null]}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"echo\">\n<｜DSML｜parameter name=\"text\" string=\"true\">a < b </ c</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>";
  const Parsed whole = feed(ToolCallFormat::kDeepSeekV32, {text});
  EXPECT_EQ(whole.content, "Let me look.");
  ASSERT_EQ(whole.calls.size(), 3u);
  EXPECT_EQ(whole.calls[0].name, "get_weather");
  EXPECT_EQ(whole.calls[0].arguments,
            "{\"city\": \"北京 \\\"south\\\"\\\\\\nline\\ttab\", \"days\": 3, \"opts\": {\"units\": [\"c\", null]}}");
  EXPECT_EQ(nlohmann::json::parse(whole.calls[0].arguments),
            nlohmann::json::parse(R"({"city": "北京 \"south\"\\\nline\ttab", "days": 3, "opts": {"units": ["c", null]}})"));
  EXPECT_EQ(whole.calls[1].name, "now");
  EXPECT_EQ(whole.calls[1].arguments, "{}");
  EXPECT_EQ(whole.calls[2].arguments, "{\"text\": \"a < b </ c\"}");
  expect_same_in_pieces(ToolCallFormat::kDeepSeekV32, text, whole);
  // Without the blank line, and with text after the block (dropped).
  const Parsed bare = feed(ToolCallFormat::kDeepSeekV32,
                           {"<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" "
                            "string=\"false\">true</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>after"});
  EXPECT_EQ(bare.content, "");
  ASSERT_EQ(bare.calls.size(), 1u);
  EXPECT_EQ(bare.calls[0].arguments, "{\"x\": true}");
}

TEST(ToolCallParser, DeepSeekV32TextThatOnlyLooksLikeMarkup) {
  const std::string text = "Use <｜DSML｜ tags like <｜DSML｜function_call, or a blank line:\n\n<b>bold</b>\n\n";
  const Parsed whole = feed(ToolCallFormat::kDeepSeekV32, {text});
  EXPECT_EQ(whole.content, text);
  EXPECT_TRUE(whole.calls.empty());
  expect_same_in_pieces(ToolCallFormat::kDeepSeekV32, text, whole);
  // Cut short inside a text value: what arrived, escaped.
  const Parsed cut = feed(ToolCallFormat::kDeepSeekV32, {"\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n"
                                                         "<｜DSML｜parameter name=\"q\" string=\"true\">say \"hi"});
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, "{\"q\": \"say \\\"hi");
}

// Random texts the forcing grammar accepts parse into calls of the declared functions whose
// arguments are JSON objects valid under the declared parameters (the types, the required ones,
// enum choices, a string's length held by the JSON form).
TEST(ToolCallParser, DeepSeekV32GrammarGivesValidCalls) {
  using nlohmann::ordered_json;
  std::vector<ToolFunction> functions(2);
  functions[0].name = "get_weather";
  functions[0].parameters = ordered_json::parse(R"({"type": "object", "properties": {
      "city": {"type": "string"}, "code": {"type": "string", "maxLength": 3}, "days": {"type": "integer"},
      "unit": {"enum": ["c", "f"]}, "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
      "required": ["city", "days"]})");
  functions[1].name = "opt";
  functions[1].parameters = ordered_json::parse(R"({"type": "object", "properties": {"n": {"type": "number"}}})");
  const std::string begin = "\n\n<｜DSML｜function_calls>\n", end = "\n</｜DSML｜function_calls>";
  for (const bool parallel : {false, true}) {
    const grammar::Grammar g = tool_markup_grammar(ToolCallFormat::kDeepSeekV32, functions, parallel);
    grammar::Automaton a(std::make_shared<const grammar::Grammar>(g));
    std::mt19937 rng(parallel ? 7 : 3);
    size_t seen_calls = 0, seen_empty = 0, seen_text = 0;
    for (int i = 0; i < 60; ++i) {
      std::string text;
      ASSERT_TRUE(grammar::testing::random_match(a, rng, text, 300, 0.3)) << i;
      ASSERT_EQ(text.rfind(begin, 0), 0u) << text;
      const Parsed p = feed(ToolCallFormat::kDeepSeekV32, {text});
      EXPECT_EQ(p.content, "") << text;
      ASSERT_GE(p.calls.size(), 1u) << text;
      if (!parallel) {
        ASSERT_EQ(p.calls.size(), 1u) << text;
      }
      for (const auto& c : p.calls) {
        ++seen_calls;
        const auto args = nlohmann::json::parse(c.arguments, nullptr, false);
        ASSERT_TRUE(args.is_object()) << c.name << ": " << c.arguments << "\n" << text;
        if (c.name == "get_weather") {
          ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << c.arguments;
          ASSERT_TRUE(args.contains("days") && args["days"].is_number_integer()) << c.arguments;
          seen_text += !args["city"].get<std::string>().empty();
          if (args.contains("code")) {
            EXPECT_LE(args["code"].get<std::string>().size(), 3u) << c.arguments;
          }
          if (args.contains("unit")) {
            EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << c.arguments;
          }
          if (args.contains("tags")) {
            EXPECT_LE(args["tags"].size(), 2u) << c.arguments;
          }
        } else {
          ASSERT_EQ(c.name, "opt");
          if (args.contains("n")) {
            EXPECT_TRUE(args["n"].is_number()) << c.arguments;
          }
          if (args.empty()) ++seen_empty;
        }
      }
    }
    EXPECT_GT(seen_calls, parallel ? 60u : 59u);
    EXPECT_GT(seen_empty, 0u);
    EXPECT_GT(seen_text, 0u);
    // Markup outside the grammar: an undeclared function, a required parameter left out, a text
    // value for an integer, a length the schema forbids.
    const std::string city = "<｜DSML｜parameter name=\"city\" string=\"true\">x</｜DSML｜parameter>\n";
    const std::string days = "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n";
    auto weather = [&](const std::string& params) {
      return begin + "<｜DSML｜invoke name=\"get_weather\">\n" + params + "</｜DSML｜invoke>" + end;
    };
    EXPECT_TRUE(grammar::testing::matches(a, weather(city + days)));
    EXPECT_TRUE(grammar::testing::matches(
        a, weather(city + "<｜DSML｜parameter name=\"code\" string=\"false\">\"abc\"</｜DSML｜parameter>\n" + days)));
    EXPECT_FALSE(grammar::testing::matches(
        a, weather(city + "<｜DSML｜parameter name=\"code\" string=\"false\">\"abcd\"</｜DSML｜parameter>\n" + days)));
    EXPECT_FALSE(grammar::testing::matches(a, weather(city)));
    EXPECT_FALSE(grammar::testing::matches(
        a, weather(city + "<｜DSML｜parameter name=\"days\" string=\"true\">2</｜DSML｜parameter>\n")));
    EXPECT_FALSE(grammar::testing::matches(a, begin + "<｜DSML｜invoke name=\"other\">\n\n</｜DSML｜invoke>" + end));
    // No parameters: the encoding's empty line (or none).
    EXPECT_TRUE(grammar::testing::matches(a, begin + "<｜DSML｜invoke name=\"opt\">\n\n</｜DSML｜invoke>" + end));
    EXPECT_TRUE(grammar::testing::matches(a, begin + "<｜DSML｜invoke name=\"opt\">\n</｜DSML｜invoke>" + end));
    EXPECT_EQ(grammar::testing::matches(a, begin + "<｜DSML｜invoke name=\"opt\">\n\n</｜DSML｜invoke>\n" +
                                              "<｜DSML｜invoke name=\"opt\">\n\n</｜DSML｜invoke>" + end),
              parallel);
  }
  // A const with an enum beside it: the const alone.
  std::vector<ToolFunction> fixed(1);
  fixed[0].name = "mode";
  fixed[0].parameters = ordered_json::parse(
      R"({"type": "object", "properties": {"m": {"type": "string", "const": "b", "enum": ["a", "b"]}}, "required": ["m"]})");
  grammar::Automaton m(std::make_shared<const grammar::Grammar>(tool_markup_grammar(ToolCallFormat::kDeepSeekV32, fixed, false)));
  auto mode = [&](const std::string& v) {
    return begin + "<｜DSML｜invoke name=\"mode\">\n<｜DSML｜parameter name=\"m\" string=\"true\">" + v +
           "</｜DSML｜parameter>\n</｜DSML｜invoke>" + end;
  };
  EXPECT_TRUE(grammar::testing::matches(m, mode("b")));
  EXPECT_FALSE(grammar::testing::matches(m, mode("a")));
  // A function without declared parameters takes any, text or JSON.
  std::vector<ToolFunction> free(1);
  free[0].name = "now";
  free[0].parameters = ordered_json::object();
  grammar::Automaton f(std::make_shared<const grammar::Grammar>(tool_markup_grammar(ToolCallFormat::kDeepSeekV32, free, true)));
  EXPECT_TRUE(grammar::testing::matches(
      f, begin + "<｜DSML｜invoke name=\"now\">\n<｜DSML｜parameter name=\"tz\" string=\"true\">UTC</｜DSML｜parameter>\n"
                 "<｜DSML｜parameter name=\"x\" string=\"false\">[1, {\"a\": null}]</｜DSML｜parameter>\n</｜DSML｜invoke>" + end));
  EXPECT_FALSE(grammar::testing::matches(
      f, begin + "<｜DSML｜invoke name=\"now\">\n<｜DSML｜parameter name=\"x\" string=\"false\">[1,</｜DSML｜parameter>\n"
                 "</｜DSML｜invoke>" + end));
}

TEST(ToolCallParser, FormatNames) {
  EXPECT_EQ(tool_call_format("deepseek_v3"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(tool_call_format("deepseek_v31"), ToolCallFormat::kDeepSeekV31);
  EXPECT_EQ(tool_call_format("deepseek_v32"), ToolCallFormat::kDeepSeekV32);
  EXPECT_FALSE(tool_call_format("hermes").has_value());
}

}  // namespace
}  // namespace duet::server
