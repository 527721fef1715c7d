// The Jinja interpreter: the input is a chat template, parsed and rendered over a conversation
// with a tool call, a tool result, reasoning, and template variables as clients send them.
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/tokenizer/chat_template.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet;
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": null, "reasoning_content": "Call the tool.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    {"role": "user", "content": [{"type": "text", "text": "Thanks"}, {"type": "text", "text": "!"}]}])");
  static const nlohmann::ordered_json vars = nlohmann::ordered_json::parse(R"({
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "thinking": true,
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]})");
  try {
    const ChatTemplate t = ChatTemplate::parse(std::string(fuzz::as_text(data, size)));
    (void)t.render(messages, vars);
  } catch (const Error&) {
  }
  return 0;
}
