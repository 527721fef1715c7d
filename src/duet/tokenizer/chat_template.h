// Chat templates: turn a conversation (OpenAI-style messages) into the prompt text a model was
// trained on, the way Hugging Face's `apply_chat_template` does: the model's Jinja template,
// rendered with trim_blocks and lstrip_blocks on.
//
//   ChatTemplate t = chat_template_for(gguf);            // the file's template, or a built-in one
//   ChatSpecialTokens tok = chat_special_tokens(gguf);
//   std::string prompt = t.render(messages, {{"bos_token", tok.bos_token},
//                                            {"eos_token", tok.eos_token},
//                                            {"add_generation_prompt", true}});
//
// Templates are parsed once and rendered many times; render() is safe to call from several
// threads at once. Every failure is a duet::Error with kInvalidArgument: a syntax error names
// the line and column, and a template's raise_exception("...") becomes an error with its text.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "duet/formats/gguf.h"
#include "duet/tokenizer/jinja/template.h"

namespace duet {

class ChatTemplate {
 public:
  // Parses a Jinja chat template. `name` is how errors refer to it.
  static ChatTemplate parse(std::string source, std::string name = "chat template");

  // Renders `messages` (a JSON array of objects with role, content, and optionally name,
  // tool_calls, reasoning_content, ...). The template sees:
  //   messages               the messages;
  //   add_generation_prompt  false unless `vars` says otherwise;
  //   tools, documents       none unless `vars` gives them (as Hugging Face passes them);
  //   every entry of `vars`  bos_token, eos_token, chat_template_kwargs such as thinking=true.
  // A content given as a list of parts ([{"type": "text", "text": ...}]) is joined into one
  // string, parts separated by "\n", unless the template iterates over message contents itself
  // (then it gets the list); parts that are not text are refused.
  // ordered_json keeps the key order of the request (tool schemas print in that order); plain
  // nlohmann::json sorts keys.
  std::string render(const nlohmann::ordered_json& messages,
                     const nlohmann::ordered_json& vars = nlohmann::ordered_json::object()) const;
  std::string render(const nlohmann::json& messages, const nlohmann::json& vars = nlohmann::json::object()) const;

  const std::string& source() const { return *source_; }
  const std::string& name() const { return template_->name(); }
  // True when the template loops over `message.content` itself (OpenAI content-part lists).
  bool iterates_content() const { return iterates_content_; }

 private:
  ChatTemplate() = default;
  std::string render_value(jinja::Value messages, jinja::Value vars) const;

  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const jinja::Template> template_;
  bool iterates_content_ = false;
};

// The chat formats duet knows without a template in the model file.
enum class BuiltinChatFormat {
  kDeepSeekLLM,    // DeepSeek-LLM chat and DeepSeek-V2 / Coder-V2: "User: ...\n\nAssistant: ..."
  kDeepSeekCoder,  // DeepSeek-Coder instruct: "### Instruction:\n...\n### Response:\n..."
  kDeepSeekV3,     // DeepSeek-V2.5 / V3: "<｜User｜>...<｜Assistant｜>..."
  kDeepSeekR1,     // DeepSeek-R1 and its distills: as V3, the generation prompt opens "<think>\n"
  kDeepSeekV32,    // DeepSeek-V3.2: its published encoding, DSML tool calls, thinking on request
};

std::string_view builtin_chat_format_name(BuiltinChatFormat format);  // "deepseek-v3", ...
std::string_view builtin_chat_template_source(BuiltinChatFormat format);
ChatTemplate builtin_chat_template(BuiltinChatFormat format);

// Which built-in format fits a model file, from its metadata:
//   0. architecture deepseek32: DeepSeek-V3.2 (its releases carry no template);
//   1. a vocabulary with both "<｜User｜>" and "<｜Assistant｜>" tokens: DeepSeek-V3, or
//      DeepSeek-R1 when general.name has "R1" as a word (DeepSeek-R1, R1-Distill-...) or the
//      pre-tokenizer is "deepseek-r1-qwen";
//   2. else pre-tokenizer "deepseek-coder", or a llama-architecture model whose general.name
//      has "coder" in it: DeepSeek-Coder instruct;
//   3. else: DeepSeek-LLM chat (DeepSeek-LLM, DeepSeek-V2, Coder-V2 and anything unknown).
BuiltinChatFormat builtin_chat_format_for(const GgufFile& file);

// The file's tokenizer.chat_template when it has one, else the built-in template that
// builtin_chat_format_for picks.
ChatTemplate chat_template_for(const GgufFile& file);

// The text of the model's BOS and EOS tokens (tokenizer.ggml.tokens at tokenizer.ggml.bos_token_id
// and eos_token_id); empty when the file has no such token.
struct ChatSpecialTokens {
  std::string bos_token;
  std::string eos_token;
};
ChatSpecialTokens chat_special_tokens(const GgufFile& file);

}  // namespace duet
