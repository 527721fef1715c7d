// The OpenAI request parser: a body of /v1/chat/completions (first input byte odd) or
// /v1/completions (even) parsed and validated against a served model with the DeepSeek-V3 chat
// template, tool calls and structured output, as the server does before anything reaches the
// engine. Bad bodies must be ApiErrors (a 4xx naming the parameter) or duet::Errors.
#include "duet/core/error.h"
#include "duet/grammar/structured_output.h"
#include "duet/server/openai.h"
#include "duet/tokenizer/chat_template.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet;
  if (size == 0) return 0;
  static const ChatTemplate chat_template = builtin_chat_template(BuiltinChatFormat::kDeepSeekV3);
  static grammar::GrammarCache grammars(16);
  static const server::ServedModel model = [] {
    server::ServedModel m;
    m.name = "fuzz";
    m.max_model_len = 512;
    m.vocab_size = fuzz::tiny_tokenizer().vocab_size();
    m.tokenizer = &fuzz::tiny_tokenizer();
    m.chat_template = &chat_template;
    m.bos_text = "<｜begin▁of▁sentence｜>";
    m.eos_text = "<｜end▁of▁sentence｜>";
    m.grammars = &grammars;
    m.tool_parser = server::ToolCallFormat::kDeepSeekV3;
    m.auto_tool_choice = true;
    m.max_prompts = 16;
    return m;
  }();
  const bool chat = (data[0] & 1) != 0;
  try {
    const server::ParsedRequest r = server::parse_request(std::string(fuzz::as_text(data + 1, size - 1)), model, chat);
    for (const auto& prompt : r.prompts) {
      for (int32_t id : prompt) {
        if (id < 0 || id >= model.vocab_size) __builtin_trap();  // the engine would get a bad id
      }
    }
  } catch (const server::ApiError&) {
  } catch (const Error&) {
  }
  return 0;
}
