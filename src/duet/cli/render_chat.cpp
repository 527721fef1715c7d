// `duet render-chat (--model FILE | --template FILE) --messages FILE [--var NAME=JSON ...]
// [--no-generation-prompt]`: prints the prompt a conversation becomes under a chat template,
// exactly as the server would feed it to the tokenizer (no newline added).
//
// The template is --template's file, else the model's tokenizer.chat_template, else the built-in
// DeepSeek template that fits the model. bos_token and eos_token come from the model's
// vocabulary (with --template alone they are undefined unless given by --var).
// add_generation_prompt is true unless --no-generation-prompt. --messages takes a JSON array of
// messages, or an OpenAI chat request ({"messages", "tools", "chat_template_kwargs"}); "-" reads
// standard input. --var values are JSON (thinking=true, n=3, 'x="text"'); a value that is not
// valid JSON is taken as a string (bos_token=<s>). --var wins over everything else.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "duet/cli/commands.h"
#include "duet/core/error.h"
#include "duet/engine/model_path.h"
#include "duet/formats/gguf.h"
#include "duet/tokenizer/chat_template.h"

namespace duet::cli {
namespace {

using nlohmann::ordered_json;

struct RenderChatOptions {
  std::string model;
  std::string template_file;
  std::string messages_file;
  std::vector<std::string> vars;
  bool add_generation_prompt = true;
};

std::string read_text(const std::string& path) {
  std::stringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::kNotFound, "cannot read '{}'", path);
  ss << in.rdbuf();
  return ss.str();
}

ordered_json parse_json_file(const std::string& path) {
  const std::string text = read_text(path);
  try {
    return ordered_json::parse(text);
  } catch (const ordered_json::parse_error& e) {
    fail(ErrorCode::kInvalidArgument, "'{}' is not valid JSON: {}", path, e.what());
  }
}

int run_render_chat(const RenderChatOptions& o) {
  if (o.model.empty() && o.template_file.empty()) fail(ErrorCode::kInvalidArgument, "give --model or --template (or both)");
  ordered_json vars = ordered_json::object();
  std::optional<GgufFile> file;
  if (!o.model.empty()) {
    file = open_model_path(o.model);
    const ChatSpecialTokens tokens = chat_special_tokens(*file);
    vars["bos_token"] = tokens.bos_token;
    vars["eos_token"] = tokens.eos_token;
  }
  const ChatTemplate chat_template = o.template_file.empty()
                                         ? chat_template_for(*file)
                                         : ChatTemplate::parse(read_text(o.template_file), o.template_file);
  vars["add_generation_prompt"] = o.add_generation_prompt;

  ordered_json messages = parse_json_file(o.messages_file);
  if (messages.is_object()) {  // an OpenAI chat request body
    if (!messages.contains("messages")) {
      fail(ErrorCode::kInvalidArgument, "'{}' is a JSON object without \"messages\"", o.messages_file);
    }
    if (messages.contains("tools")) vars["tools"] = messages["tools"];
    if (messages.contains("chat_template_kwargs")) {
      const ordered_json& kwargs = messages["chat_template_kwargs"];
      if (!kwargs.is_object()) fail(ErrorCode::kInvalidArgument, "chat_template_kwargs in '{}' must be an object", o.messages_file);
      for (auto it = kwargs.begin(); it != kwargs.end(); ++it) vars[it.key()] = it.value();
    }
    messages = ordered_json(messages["messages"]);
  }
  for (const std::string& var : o.vars) {
    const size_t eq = var.find('=');
    if (eq == std::string::npos || eq == 0) fail(ErrorCode::kInvalidArgument, "--var '{}' is not NAME=VALUE", var);
    const std::string value = var.substr(eq + 1);
    ordered_json parsed = ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
    vars[var.substr(0, eq)] = parsed.is_discarded() ? ordered_json(value) : parsed;
  }
  const std::string prompt = chat_template.render(messages, vars);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return 0;
}

}  // namespace

void add_render_chat_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("render-chat", "Print the prompt a conversation becomes under a chat template");
  auto o = std::make_shared<RenderChatOptions>();
  cmd->add_option("-m,--model", o->model, "GGUF file or Hugging Face folder: its chat template (or a built-in one) and BOS/EOS tokens");
  cmd->add_option("-t,--template", o->template_file, "Jinja chat template file (instead of the model's)");
  cmd->add_option("--messages", o->messages_file, "JSON file: an array of messages or an OpenAI chat request; - for stdin")
      ->required();
  cmd->add_option("--var", o->vars, "NAME=JSON: a template variable (thinking=true); repeatable");
  cmd->add_flag("--add-generation-prompt,!--no-generation-prompt", o->add_generation_prompt,
                "End with the assistant's turn opening (default) or not");
  cmd->callback([o, &exit_code] { exit_code = run_render_chat(*o); });
}

}  // namespace duet::cli
