#include <gtest/gtest.h>

#include "duet/server/reasoning_parser.h"

namespace duet::server {
namespace {

// Feeds `text` in pieces of `step` bytes and returns (reasoning, content).
std::pair<std::string, std::string> run(bool starts_in_reasoning, const std::string& text, size_t step) {
  ReasoningParser p(starts_in_reasoning);
  std::string reasoning, content;
  for (size_t i = 0; i < text.size(); i += step) {
    ReasoningParser::Delta d = p.push(text.substr(i, step));
    reasoning += d.reasoning;
    content += d.content;
  }
  ReasoningParser::Delta d = p.flush();
  return {reasoning + d.reasoning, content + d.content};
}

TEST(ReasoningParser, SplitsThinkingFromTheAnswerAtAnyChunking) {
  for (size_t step : {1, 2, 3, 7, 100}) {
    EXPECT_EQ(run(false, "<think>\nLet me see.\n</think>\n\nThe answer is 4.", step),
              std::make_pair(std::string("\nLet me see.\n"), std::string("\n\nThe answer is 4."))) << step;
    // The template opened the block: the output never shows <think>.
    EXPECT_EQ(run(true, "Let me see.</think>Four.", step),
              std::make_pair(std::string("Let me see."), std::string("Four."))) << step;
    // No thinking at all.
    EXPECT_EQ(run(false, "Just an answer with < and </ in it.", step),
              std::make_pair(std::string(), std::string("Just an answer with < and </ in it."))) << step;
    // Thinking that never ends is all reasoning.
    EXPECT_EQ(run(true, "still thinking </thi", step), std::make_pair(std::string("still thinking </thi"), std::string()))
        << step;
  }
}

TEST(ReasoningParser, HoldsBackOnlyWhatCouldBeATag) {
  ReasoningParser p(true);
  ReasoningParser::Delta d = p.push("abc</th");
  EXPECT_EQ(d.reasoning, "abc");
  d = p.push("ink>x");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "x");
}

}  // namespace
}  // namespace duet::server
