// The tool-call parser on DeepSeek's V3 and V3.1 markup: the whole text at once, and the same
// text cut into pieces at every position, give the same content and calls.
#include <gtest/gtest.h>

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

TEST(ToolCallParser, FormatNames) {
  EXPECT_EQ(tool_call_format("deepseek_v3"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(tool_call_format("deepseek_v31"), ToolCallFormat::kDeepSeekV31);
  EXPECT_FALSE(tool_call_format("hermes").has_value());
}

}  // namespace
}  // namespace duet::server
