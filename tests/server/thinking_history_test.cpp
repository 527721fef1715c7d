// The thinking of the current turn through the Responses and Messages APIs: a reasoning item
// (Responses) or a thinking block (Anthropic's Messages) becomes the reasoning_content of the
// assistant message it belongs to, so that DeepSeek-V3.2's format, which keeps the thinking after
// the last user message (interleaved with tool calls), gets it; earlier turns' thinking is left out.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "duet/server/messages.h"
#include "duet/server/responses.h"
#include "duet/tokenizer/chat_template.h"

namespace duet::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string render_v32(const json& messages) {
  const ChatTemplate t = builtin_chat_template(BuiltinChatFormat::kDeepSeekV32);
  return t.render(ordered_json::parse(messages.dump()),
                  {{"bos_token", "<s>"}, {"add_generation_prompt", true}, {"thinking", true}});
}

const std::string kCallMarkup =
    "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
    "</｜DSML｜function_calls><｜end▁of▁sentence｜>\n\n<function_results>\n<result>sunny</result>\n"
    "</function_results>\n\n<think>";

TEST(ThinkingHistory, ResponsesReasoningItemsGoWithTheNextAssistantMessage) {
  const json input = json::parse(R"([
    {"type": "message", "role": "user", "content": "Hi"},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "old"}]},
    {"type": "message", "role": "assistant", "content": "Hello"},
    {"type": "message", "role": "user", "content": "Weather?"},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "I need "},
                                                     {"type": "reasoning_text", "text": "the tool."}]},
    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
    {"type": "function_call_output", "call_id": "c1", "output": "sunny"}])");
  json messages = json::array(), items = json::array();
  read_input_items(input, messages, items);
  ASSERT_EQ(messages.size(), 5u);
  EXPECT_EQ(messages[1]["reasoning_content"], "old");
  EXPECT_EQ(messages[3]["reasoning_content"], "I need the tool.");
  EXPECT_FALSE(messages[4].contains("reasoning_content"));
  EXPECT_EQ(items.size(), input.size());
  // V3.2 in thinking mode: the earlier turn's thinking is left out, this turn's is kept.
  EXPECT_EQ(render_v32(messages), "<s><｜User｜>Hi<｜Assistant｜></think>Hello<｜end▁of▁sentence｜><｜User｜>Weather?"
                                  "<｜Assistant｜><think>I need the tool.</think>" + kCallMarkup);
  // A reasoning item that no assistant item follows is dropped.
  json m2 = json::array(), i2 = json::array();
  read_input_items(json::parse(R"([{"type": "reasoning", "summary": [{"text": "lost"}]},
                                   {"type": "message", "role": "user", "content": "q"},
                                   {"type": "message", "role": "assistant", "content": "a"}])"), m2, i2);
  ASSERT_EQ(m2.size(), 2u);
  EXPECT_FALSE(m2[1].contains("reasoning_content"));
}

TEST(ThinkingHistory, AnthropicThinkingBlocksAreTheAssistantsReasoning) {
  const std::string body = R"({"model": "m", "max_tokens": 16, "thinking": {"type": "enabled", "budget_tokens": 1024},
    "messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "I need the tool.", "signature": ""},
        {"type": "redacted_thinking", "data": "xyz"},
        {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "sunny"}]}]})";
  const MessagesRequest r = parse_messages_request(json::parse(body), body);
  const ordered_json& messages = r.chat_body["messages"];
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_EQ(messages[1]["reasoning_content"], "I need the tool.");
  EXPECT_EQ(r.chat_body["chat_template_kwargs"]["thinking"], true);
  EXPECT_EQ(render_v32(json::parse(messages.dump())),
            "<s><｜User｜>Weather?<｜Assistant｜><think>I need the tool.</think>" + kCallMarkup);
}

}  // namespace
}  // namespace duet::server
