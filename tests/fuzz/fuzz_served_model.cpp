#include "fuzz_served_model.h"

#include "duet/grammar/structured_output.h"
#include "duet/tokenizer/chat_template.h"
#include "fuzz_common.h"

namespace duet::fuzz {

namespace {

server::ServedModel make_model(const ChatTemplate& chat_template, grammar::GrammarCache& grammars,
                               server::ToolCallFormat tool_parser) {
  server::ServedModel m;
  m.name = "fuzz";
  m.max_model_len = 512;
  m.vocab_size = tiny_tokenizer().vocab_size();
  m.tokenizer = &tiny_tokenizer();
  m.chat_template = &chat_template;
  m.bos_text = "<｜begin▁of▁sentence｜>";
  m.eos_text = "<｜end▁of▁sentence｜>";
  m.grammars = &grammars;
  m.tool_parser = tool_parser;
  m.auto_tool_choice = true;
  m.max_prompts = 16;
  return m;
}

}  // namespace

const server::ServedModel& served_model(bool dsml) {
  static const ChatTemplate v3_template = builtin_chat_template(BuiltinChatFormat::kDeepSeekV3);
  static const ChatTemplate v32_template = builtin_chat_template(BuiltinChatFormat::kDeepSeekV32);
  static grammar::GrammarCache grammars(16);
  static const server::ServedModel v3_model = make_model(v3_template, grammars, server::ToolCallFormat::kDeepSeekV3);
  static const server::ServedModel v32_model = make_model(v32_template, grammars, server::ToolCallFormat::kDeepSeekV32);
  return dsml ? v32_model : v3_model;
}

}  // namespace duet::fuzz
