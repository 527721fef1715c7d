#include "fuzz_served_model.h"

#include "duet/grammar/structured_output.h"
#include "duet/tokenizer/chat_template.h"
#include "fuzz_common.h"

namespace duet::fuzz {

const server::ServedModel& served_model() {
  static const ChatTemplate chat_template = builtin_chat_template(BuiltinChatFormat::kDeepSeekV3);
  static grammar::GrammarCache grammars(16);
  static const server::ServedModel model = [] {
    server::ServedModel m;
    m.name = "fuzz";
    m.max_model_len = 512;
    m.vocab_size = tiny_tokenizer().vocab_size();
    m.tokenizer = &tiny_tokenizer();
    m.chat_template = &chat_template;
    m.bos_text = "<｜begin▁of▁sentence｜>";
    m.eos_text = "<｜end▁of▁sentence｜>";
    m.grammars = &grammars;
    m.tool_parser = server::ToolCallFormat::kDeepSeekV3;
    m.auto_tool_choice = true;
    m.max_prompts = 16;
    return m;
  }();
  return model;
}

}  // namespace duet::fuzz
