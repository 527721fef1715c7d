#include "duet/tokenizer/chat_template.h"

#include "duet/core/error.h"
#include "duet/core/regex.h"

namespace duet {
namespace {

// Hugging Face renders chat templates with these settings.
constexpr jinja::TemplateOptions kHfOptions{.trim_blocks = true, .lstrip_blocks = true, .keep_trailing_newline = false};

// Does the template loop over a message's content ({% for part in message['content'] %})?
bool detect_content_loop(const std::string& source) {
  static const Regex kLoop(R"(\{%-?\s*for\s+\w+(\s*,\s*\w+)*\s+in\s+[\w.\[\]'"]*content\b)");
  return kLoop.search(source);
}

// Joins a list of content parts into one string.
jinja::Value flatten_content(const jinja::Value& content, size_t message_index) {
  std::string text;
  bool first = true;
  for (const jinja::Value& part : content.as_list().items) {
    const jinja::Value* type = part.is_dict() ? part.as_dict().find("type") : nullptr;
    const jinja::Value* part_text = part.is_dict() ? part.as_dict().find("text") : nullptr;
    if (!type || !type->is_string() || type->as_string() != "text" || !part_text || !part_text->is_string()) {
      fail(ErrorCode::kInvalidArgument,
           "message {}: content part {} is not supported: only parts of type 'text' with a string 'text' are",
           message_index, type && type->is_string() ? "of type '" + type->as_string() + "'" : part.repr());
    }
    if (!first) text += '\n';
    text += part_text->as_string();
    first = false;
  }
  if (static_cast<int64_t>(text.size()) > jinja::kMaxStringSize) {
    fail(ErrorCode::kInvalidArgument, "message {}: its content parts make {} bytes, more than a template takes ({})",
         message_index, text.size(), jinja::kMaxStringSize);
  }
  return jinja::Value(std::move(text));
}

}  // namespace

ChatTemplate ChatTemplate::parse(std::string source, std::string name) {
  ChatTemplate t;
  t.template_ = std::make_shared<const jinja::Template>(source, kHfOptions, std::move(name));
  t.iterates_content_ = detect_content_loop(source);
  t.source_ = std::make_shared<const std::string>(std::move(source));
  return t;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& vars) const {
  return render_value(jinja::from_json(messages), jinja::from_json(vars));
}

std::string ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& vars) const {
  return render_value(jinja::from_json(messages), jinja::from_json(vars));
}

std::string ChatTemplate::render_value(jinja::Value messages, jinja::Value vars) const {
  if (!messages.is_list()) fail(ErrorCode::kInvalidArgument, "messages must be a JSON array, got {}", messages.type_name());
  if (!vars.is_dict() && !vars.is_none()) {
    fail(ErrorCode::kInvalidArgument, "chat template variables must be a JSON object, got {}", vars.type_name());
  }
  auto& items = messages.as_list().items;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_dict()) fail(ErrorCode::kInvalidArgument, "message {} must be a JSON object, got {}", i, items[i].type_name());
    const jinja::Value* content = items[i].as_dict().find("content");
    if (content && content->is_list() && !iterates_content_) items[i].as_dict().set("content", flatten_content(*content, i));
  }
  // The variables (their keys distinct: a JSON object's), then the defaults they leave unset:
  // each set() searches the dict, so setting thousands of variables one by one took seconds.
  jinja::Value context = vars.is_dict() ? std::move(vars) : jinja::Value::dict();
  jinja::DictData& ctx = context.as_dict();
  if (!ctx.find("tools")) ctx.set("tools", jinja::Value::none());
  if (!ctx.find("documents")) ctx.set("documents", jinja::Value::none());
  if (!ctx.find("add_generation_prompt")) ctx.set("add_generation_prompt", jinja::Value(false));
  ctx.set("messages", std::move(messages));
  return template_->render(context);
}

ChatSpecialTokens chat_special_tokens(const GgufFile& file) {
  ChatSpecialTokens out;
  const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != GgufType::kArray) return out;
  const auto& items = std::get<GgufArray>(tokens->value).items;
  auto text_of = [&](std::string_view key) -> std::string {
    const int64_t id = file.get_int_or(key, -1);
    if (id < 0 || id >= static_cast<int64_t>(items.size())) return {};
    const auto* s = std::get_if<std::string>(&items[static_cast<size_t>(id)].value);
    return s ? *s : std::string();
  };
  out.bos_token = text_of("tokenizer.ggml.bos_token_id");
  out.eos_token = text_of("tokenizer.ggml.eos_token_id");
  return out;
}

BuiltinChatFormat builtin_chat_format_for(const GgufFile& file) {
  bool has_user = false, has_assistant = false;
  if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens"); tokens && tokens->type == GgufType::kArray) {
    for (const GgufValue& token : std::get<GgufArray>(tokens->value).items) {
      const auto* s = std::get_if<std::string>(&token.value);
      if (!s) continue;
      has_user = has_user || *s == "<｜User｜>";
      has_assistant = has_assistant || *s == "<｜Assistant｜>";
    }
  }
  const std::string name = file.get_string_or("general.name", "");
  const std::string pre = file.get_string_or("tokenizer.ggml.pre", "");
  const std::string arch = file.get_string_or("general.architecture", "");
  if (arch == "deepseek32") return BuiltinChatFormat::kDeepSeekV32;
  if (has_user && has_assistant) {
    static const Regex kR1(R"((^|[^A-Za-z0-9])[Rr]1([^0-9]|$))");
    if (pre == "deepseek-r1-qwen" || kR1.search(name)) return BuiltinChatFormat::kDeepSeekR1;
    return BuiltinChatFormat::kDeepSeekV3;
  }
  std::string lower_name = name;
  for (char& c : lower_name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (pre == "deepseek-coder" || (arch == "llama" && lower_name.find("coder") != std::string::npos)) {
    return BuiltinChatFormat::kDeepSeekCoder;
  }
  return BuiltinChatFormat::kDeepSeekLLM;
}

ChatTemplate chat_template_for(const GgufFile& file) {
  const std::string source = file.get_string_or("tokenizer.chat_template", "");
  if (!source.empty()) return ChatTemplate::parse(source, "tokenizer.chat_template of " + file.path());
  return builtin_chat_template(builtin_chat_format_for(file));
}

ChatTemplate builtin_chat_template(BuiltinChatFormat format) {
  return ChatTemplate::parse(std::string(builtin_chat_template_source(format)),
                             fmt::format("built-in {} chat template", builtin_chat_format_name(format)));
}

}  // namespace duet
