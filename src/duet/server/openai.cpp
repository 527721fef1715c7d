#include "duet/server/openai.h"

#include <climits>

#include <fmt/format.h>

#include <random>

#include "duet/core/error.h"
#include "duet/core/ordered_json.h"
#include "duet/engine/sampling_json.h"
#include "duet/server/response_format.h"

namespace duet::server {
namespace {

using nlohmann::json;


std::string sse(const json& j) { return "data: " + json_text(j) + "\n\n"; }

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}



void check_messages(const json& messages) {
  if (!messages.is_array()) throw ApiError(400, "messages must be a list of messages", "messages");
  if (messages.empty()) throw ApiError(400, "messages must not be empty", "messages");
  static const std::vector<std::string> kRoles = {"system", "user", "assistant", "tool", "developer", "function"};
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) throw ApiError(400, fmt::format("messages[{}] must be an object", i), "messages");
    const json& role = json_field(m, "role");
    if (!role.is_string() || std::find(kRoles.begin(), kRoles.end(), role.get<std::string>()) == kRoles.end()) {
      throw ApiError(400, fmt::format("messages[{}].role must be one of system, user, assistant, tool, developer", i),
                     "messages");
    }
    const json& calls = json_field(m, "tool_calls");
    if (!calls.is_null()) {
      if (role != "assistant" || !calls.is_array()) {
        throw ApiError(400, fmt::format("messages[{}].tool_calls must be a list, on an assistant message", i), "messages");
      }
      for (size_t k = 0; k < calls.size(); ++k) {
        const json& c = calls[k];
        const json& fn = json_field(c, "function");
        if (!c.is_object() || !fn.is_object() || !json_field(fn, "name").is_string() ||
            !(json_field(fn, "arguments").is_string() || json_field(fn, "arguments").is_object())) {
          throw ApiError(400,
                         fmt::format("messages[{}].tool_calls[{}] must be {{\"id\", \"type\": \"function\", "
                                     "\"function\": {{\"name\", \"arguments\"}}}}", i, k),
                         "messages");
        }
      }
    }
    const json& content = json_field(m, "content");
    if (content.is_string() || (content.is_null() && role == "assistant")) continue;
    if (content.is_array()) {
      for (const json& part : content) {
        if (!part.is_object() || json_field(part, "type") != "text" || !json_field(part, "text").is_string()) {
          throw ApiError(400, fmt::format("messages[{}].content parts must be {{\"type\": \"text\", \"text\": ...}}", i),
                         "messages");
        }
      }
      continue;
    }
    throw ApiError(400, fmt::format("messages[{}].content must be a string or a list of text parts", i), "messages");
  }
}

// Content given as a list of text parts becomes one string, as Hugging Face templates expect;
// tool calls get the shape the templates read (a type, arguments as JSON text).
json flatten_content(const json& messages) {
  json out = messages;
  for (json& m : out) {
    json& content = m["content"];
    if (content.is_array()) {
      std::string text;
      for (const json& part : content) text += part.at("text").get<std::string>();
      content = text;
    }
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (json& c : m["tool_calls"]) {
        if (!c.contains("type")) c["type"] = "function";
        json& args = c["function"]["arguments"];
        if (!args.is_string()) args = args.dump();
      }
    }
  }
  return out;
}

// The tool descriptions into the system prompt: appended to the first system message, or a new
// one first.
json with_tool_prompt(json messages, const std::string& prompt) {
  for (json& m : messages) {
    if (m.value("role", "") == "system" && m["content"].is_string()) {
      m["content"] = m["content"].get<std::string>() + "\n\n" + prompt;
      return messages;
    }
  }
  messages.insert(messages.begin(), json{{"role", "system"}, {"content", prompt}});
  return messages;
}

// The request field an error message starts with: "tools[1].function.name must ..." is about tools.
std::string field_of(const std::string& message) {
  const std::string word = message.substr(0, message.find_first_of(" ,:[."));
  for (char c : word) {
    if (!(std::islower(static_cast<unsigned char>(c)) || c == '_')) return "";
  }
  return word;
}

std::string tool_call_id() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("call_{:016x}{:08x}", rng(), static_cast<uint32_t>(rng()));
}

}  // namespace

std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const json& json_field(const json& body, const char* key) {
  static const json kNull;
  auto it = body.find(key);
  return it == body.end() ? kNull : *it;
}

std::vector<int32_t> token_list(const json& v, const ServedModel& model, const char* param) {
  std::vector<int32_t> ids;
  for (const json& t : v) {
    if (!t.is_number_integer()) throw ApiError(400, fmt::format("{} token ids must be integers", param), param);
    // An unsigned value above INT64_MAX must not wrap into a negative (or any other) id.
    const bool too_big = t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
    const int64_t id = too_big ? -1 : t.get<int64_t>();
    if (too_big || id < 0 || id >= model.vocab_size) {
      throw ApiError(400,
                     fmt::format("token id {} in {} is outside the vocabulary [0, {})", t.dump(), param, model.vocab_size),
                     param);
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

bool get_bool(const json& body, const char* key, bool fallback) {
  const json& v = json_field(body, key);
  if (v.is_null()) return fallback;
  if (!v.is_boolean()) throw ApiError(400, fmt::format("{} must be true or false, got {}", key, v.type_name()), key);
  return v.get<bool>();
}

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)),
      status_(status),
      type_(error_type_for(status)),
      param_(std::move(param)),
      code_(std::move(code)) {}

std::string error_type_for(int status) {
  switch (status) {
    case 400:
    case 404:
    case 405:
    case 413:
    case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return "server_error";
  }
}

void check_metadata(const json& metadata) {
  if (metadata.is_null()) return;
  if (!metadata.is_object() || metadata.size() > 16) {
    throw ApiError(400, "metadata must be an object of at most 16 string values", "metadata");
  }
  for (auto it = metadata.begin(); it != metadata.end(); ++it) {
    if (it.key().size() > 64 || !it.value().is_string() || it.value().get<std::string>().size() > 512) {
      throw ApiError(400, "metadata keys are at most 64 characters, and values strings of at most 512", "metadata");
    }
  }
}

std::string error_body(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type()}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param().empty()) err["param"] = e.param();
  if (!e.code().empty()) err["code"] = e.code();
  return json_text(json{{"error", err}});
}

ApiError api_error_from(const std::exception& e) {
  if (const auto* api = dynamic_cast<const ApiError*>(&e)) return *api;
  if (const auto* d = dynamic_cast<const Error*>(&e)) {
    switch (d->code()) {
      case ErrorCode::kInvalidArgument: return ApiError(400, d->what(), error_param(d->what()));
      case ErrorCode::kNotFound: return ApiError(404, d->what());
      case ErrorCode::kResourceExhausted:
      case ErrorCode::kUnavailable: return ApiError(503, d->what());
      default: return ApiError(500, d->what());
    }
  }
  if (dynamic_cast<const json::exception*>(&e) != nullptr) return ApiError(400, e.what());
  return ApiError(500, e.what());
}

// A first pass over the body (nlohmann's SAX events, nothing built) that refuses nesting past
// kMaxJsonDepth, naming where: a callback on the DOM parse did the same, but nlohmann's callback
// parser searches the parent object each time a child object ends, so an object of n objects
// cost n^2 steps (a schema of 100,000 properties: 87 s).
class DepthCheck {
 public:
  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const std::string&) { return value(); }
  bool string(std::string&) { return value(); }
  bool binary(json::binary_t&) { return value(); }
  bool start_object(std::size_t) { return open(false); }
  bool start_array(std::size_t) { return open(true); }
  bool key(std::string& k) {
    open_.back().key = k;
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  template <typename Exception>
  bool parse_error(std::size_t, const std::string&, const Exception&) {
    return false;  // the DOM parse after reports it
  }

 private:
  // An open container: its current key (objects) or element index.
  struct Level {
    bool array = false;
    size_t index = 0;
    std::string key;
  };
  bool value() {
    if (!open_.empty() && open_.back().array) ++open_.back().index;
    return true;
  }
  bool open(bool array) {
    if (static_cast<int>(open_.size()) >= kMaxJsonDepth) {
      const std::string path = where();
      const std::string param = open_.size() > 1 && !open_[0].array ? open_[0].key : std::string();
      throw ApiError(400, fmt::format("{} is nested more than {} levels deep", path.empty() ? "the body" : path,
                                      kMaxJsonDepth),
                     param);
    }
    open_.push_back(Level{array, 0, {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return value();
  }
  std::string where() const {
    std::string path;
    for (size_t i = 0; i < open_.size() && i <= 4; ++i) {
      const Level& l = open_[i];
      if (i == 4) {
        path += "...";
      } else if (l.array) {
        path += fmt::format("[{}]", l.index);
      } else {
        path += (path.empty() ? "" : ".") + l.key;
      }
    }
    return path;
  }

  std::vector<Level> open_;
};

json parse_json_body(const std::string& text) {
  DepthCheck depth;
  json::sax_parse(text, &depth);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // parse errors, and numbers beyond double's range (out_of_range 406)
    throw ApiError(400, fmt::format("the body is not valid JSON: {}", e.what()));
  }
}

int64_t truncate_prompt_tokens(const json& body, const ServedModel& model) {
  const json& v = json_field(body, "truncate_prompt_tokens");
  if (v.is_null()) return 0;
  if (!v.is_number_integer() || (v.get<int64_t>() < 1 && v.get<int64_t>() != -1)) {
    throw ApiError(400, "truncate_prompt_tokens must be a positive integer, or -1 for the context length",
                   "truncate_prompt_tokens");
  }
  return v.get<int64_t>() == -1 ? model.max_model_len : v.get<int64_t>();
}

std::vector<int32_t> chat_prompt_ids(const json& messages, bool add_generation_prompt, const json& template_kwargs,
                                     const ServedModel& model, bool continue_final_message) {
  json chat = {{"messages", messages}, {"add_generation_prompt", add_generation_prompt}, {"max_tokens", 1},
               {"continue_final_message", continue_final_message}};
  if (!template_kwargs.is_null()) chat["chat_template_kwargs"] = template_kwargs;
  try {
    return parse_request(chat.dump(), model, true).prompts.front();
  } catch (const ApiError& e) {
    throw ApiError(e.status(), e.what(), "messages", e.code());  // max_tokens is ours, not the client's
  }
}

ParsedRequest parse_request(const std::string& body_text, const ServedModel& model, bool chat) {
  return parse_request(parse_json_body(body_text), body_text, model, chat);
}

ParsedRequest parse_request(const json& body, const std::string& body_text, const ServedModel& model, bool chat) {
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object");
  const json& model_name = json_field(body, "model");
  if (!model_name.is_null()) {
    if (!model_name.is_string()) throw ApiError(400, "model must be a string", "model");
    if (model_name.get<std::string>() != model.name) {
      throw ApiError(404, fmt::format("The model `{}` does not exist.", model_name.get<std::string>()), "model",
                     "model_not_found");
    }
  }
  ParsedRequest r;
  r.chat = chat;
  r.stream = get_bool(body, "stream", false);
  const json& so = json_field(body, "stream_options");
  if (!so.is_null()) {
    if (!so.is_object()) throw ApiError(400, "stream_options must be an object", "stream_options");
    r.include_usage = get_bool(so, "include_usage", false);
    r.continuous_usage = r.include_usage && get_bool(so, "continuous_usage_stats", false);
  }
  r.echo = get_bool(body, "echo", false);
  const json& priority = json_field(body, "priority");
  if (!priority.is_null()) {
    if (!priority.is_number_integer()) throw ApiError(400, "priority must be an integer", "priority");
    const bool fits = priority.is_number_unsigned() ? priority.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)
                                                    : priority.get<int64_t>() >= INT32_MIN &&
                                                          priority.get<int64_t>() <= INT32_MAX;
    if (!fits) {
      throw ApiError(400, fmt::format("priority is {}, expected an integer in [{}, {}]", priority.dump(), INT32_MIN,
                                      INT32_MAX),
                     "priority");
    }
    r.priority = static_cast<int32_t>(priority.get<int64_t>());
  }
  const json& user = json_field(body, "user");
  if (!user.is_null() && !user.is_string()) throw ApiError(400, "user must be a string", "user");
  const json& as_ids = json_field(body, "return_tokens_as_token_ids");
  if (!as_ids.is_null() && !as_ids.is_boolean()) {
    throw ApiError(400, "return_tokens_as_token_ids must be true or false", "return_tokens_as_token_ids");
  }
  r.tokens_as_ids = as_ids.is_boolean() && as_ids.get<bool>();
  r.return_token_ids = get_bool(body, "return_token_ids", false);

  SamplingParams defaults = model.defaults;
  if (!chat) defaults.max_tokens = 16;  // OpenAI's default for completions
  try {
    r.params = sampling_params_from_json(body, defaults);
    r.params.lora_adapter = model.lora_adapter;
  } catch (const Error& e) {
    throw ApiError(400, e.what(), error_param(e.what()));
  }
  if (r.stream && r.params.ranks_candidates()) {
    throw ApiError(400, "best_of cannot be streamed: the best candidates are known only when all have finished", "best_of");
  }
  // vLLM's bad_words: each word, and the word after a space when that is other tokens of the same
  // count (a word within the text), as token sequences the sampler keeps the output from ending.
  const json& bad_words = json_field(body, "bad_words");
  if (!bad_words.is_null()) {
    if (!bad_words.is_array()) throw ApiError(400, "bad_words must be a list of strings", "bad_words");
    for (const json& w : bad_words) {
      if (!w.is_string()) throw ApiError(400, "bad_words must be a list of strings", "bad_words");
      const std::string& text = w.get_ref<const std::string&>();
      const size_t first = text.find_first_not_of(" \t\r\n");
      if (first == std::string::npos) throw ApiError(400, "bad_words has an empty word", "bad_words");
      const std::string word = text.substr(first);
      std::vector<int32_t> plain = model.tokenizer->encode(word, false, true);
      std::vector<int32_t> spaced = model.tokenizer->encode(" " + word, false, true);
      if (plain.empty()) continue;
      const bool other_word = !spaced.empty() && spaced.front() != plain.front() && spaced.size() == plain.size();
      r.params.bad_words_token_ids.push_back(std::move(plain));
      if (other_word) r.params.bad_words_token_ids.push_back(std::move(spaced));
    }
  }
  if (!chat && r.echo && r.params.logprobs) {
    r.echo_logprobs = true;
    const int32_t want = *r.params.logprobs, have = r.params.prompt_logprobs.value_or(0);
    r.params.prompt_logprobs = want < 0 || have < 0 ? -1 : std::max(have, want);  // -1: the whole vocabulary
  }
  if (chat && json_field(body, "logprobs").is_number()) {
    throw ApiError(400, "logprobs must be true or false for chat completions (use top_logprobs for the count)",
                   "logprobs");
  }
  // The fields whose key order matters (schemas), read again keeping it.
  const nlohmann::ordered_json ordered = parse_ordered_json(body_text);  // valid JSON: parse_json_body read it
  std::optional<RequestedOutput> requested;
  try {
    requested = structured_output_spec(ordered);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), field_of(e.what()));
  }

  if (chat) {
    const json& messages = json_field(body, "messages");
    check_messages(messages);
    if (model.chat_template == nullptr) throw ApiError(400, "the model has no chat template", "messages");
    ToolRequest tools;
    try {
      tools = parse_tool_request(ordered);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), field_of(e.what()));
    }
    const bool forced = tools.choice == ToolChoice::kRequired || tools.choice == ToolChoice::kNamed;
    if (forced && requested) {
      throw ApiError(400, fmt::format("tool_choice {} cannot be combined with {}", tools.choice == ToolChoice::kNamed ?
                                      "naming a function" : "required", requested->field), "tool_choice");
    }
    if (tools.choice == ToolChoice::kAuto && (!model.tool_parser || !model.auto_tool_choice)) {
      throw ApiError(400, "\"auto\" tool choice requires the server to run with --enable-auto-tool-choice and "
                          "--tool-call-parser (or send tool_choice \"none\", \"required\" or a named function)",
                     "tool_choice");
    }
    json vars = json::object();
    const json& kwargs = json_field(body, "chat_template_kwargs");
    if (!kwargs.is_null()) {
      if (!kwargs.is_object()) throw ApiError(400, "chat_template_kwargs must be an object", "chat_template_kwargs");
      vars = kwargs;
    }
    // vLLM's continue_final_message: the last message left open for the model to go on with (an
    // assistant's answer begun by the client), so no generation prompt after it.
    const bool continue_final = get_bool(body, "continue_final_message", false);
    if (continue_final && get_bool(body, "add_generation_prompt", false)) {
      throw ApiError(400, "continue_final_message and add_generation_prompt cannot both be true", "continue_final_message");
    }
    vars["add_generation_prompt"] = get_bool(body, "add_generation_prompt", !continue_final);
    vars["bos_token"] = model.bos_text;
    vars["eos_token"] = model.eos_text;
    json rendered_messages = flatten_content(messages);
    nlohmann::ordered_json ordered_vars = to_ordered_json(vars);
    if (tools.choice != ToolChoice::kNone) {
      // A template that renders `tools` gets them; for one that does not (DeepSeek's own), the
      // descriptions go into the system prompt in the format the output is read in.
      if (model.chat_template->source().find("tools") != std::string::npos) {
        ordered_vars["tools"] = tools.tools;
      } else {
        std::vector<ToolFunction> shown = tools.functions;
        if (tools.choice == ToolChoice::kNamed) {
          std::erase_if(shown, [&](const ToolFunction& f) { return f.name != tools.named; });
        }
        rendered_messages = with_tool_prompt(std::move(rendered_messages), tool_system_prompt(shown, model.tool_parser));
      }
    }
    std::string prompt;
    try {
      prompt = model.chat_template->render(to_ordered_json(rendered_messages), ordered_vars);
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("the chat template refused these messages: {}", e.what()), "messages");
    }
    if (continue_final) {
      // The rendering ends where the last message's text does (its end-of-turn markup cut off).
      const json& last = rendered_messages.back();
      if (!last.contains("content") || !last["content"].is_string() || last["content"].get_ref<const std::string&>().empty()) {
        throw ApiError(400, "continue_final_message needs a last message with text to continue", "messages");
      }
      std::string text = last["content"].get<std::string>();
      size_t at = prompt.rfind(text);
      if (at == std::string::npos) {
        // Templates that trim a message's text render it without its outer whitespace.
        const size_t b = text.find_first_not_of(" \t\r\n"), e = text.find_last_not_of(" \t\r\n");
        text = b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
        at = text.empty() ? std::string::npos : prompt.rfind(text);
      }
      if (at == std::string::npos) {
        throw ApiError(400, "continue_final_message: the chat template does not render the last message's text as it "
                            "is, so there is no place to continue it from", "messages");
      }
      prompt.resize(at + text.size());
    }
    r.starts_in_reasoning = model.reasoning_parser && (ends_with(prompt, "<think>\n") || ends_with(prompt, "<think>"));
    r.prompts.push_back(model.tokenizer->encode(prompt, false, true));
    if (r.echo) {
      const json& last = messages.back();
      r.echo_texts.push_back(last.value("role", "") == "assistant" && last["content"].is_string()
                                 ? last["content"].get<std::string>()
                                 : std::string());
    }
    // How the output becomes tool calls, and what forces one.
    if (forced) {
      if (model.grammars == nullptr) throw ApiError(500, "structured output is not set up for this model");
      std::vector<ToolFunction> allowed = tools.functions;
      if (tools.choice == ToolChoice::kNamed) {
        std::erase_if(allowed, [&](const ToolFunction& f) { return f.name != tools.named; });
      }
      const std::string key = fmt::format("tools {} {} {} {}", model.tool_parser ? static_cast<int>(*model.tool_parser) : -1,
                                          tools.parallel, tools.named, tools.tools.dump());
      try {
        if (model.tool_parser) {
          // A named function is called once.
          const bool parallel = tools.parallel && tools.choice == ToolChoice::kRequired;
          r.tool_output = ToolOutput::kMarkup;
          r.params.grammar = model.grammars->get_or_build(
              key, [&] { return tool_markup_grammar(*model.tool_parser, allowed, parallel); });
        } else if (tools.choice == ToolChoice::kNamed) {
          r.tool_output = ToolOutput::kArguments;
          r.tool_name = tools.named;
          r.params.grammar = model.grammars->get_or_build(key, [&] { return tool_arguments_grammar(allowed.front()); });
        } else {
          r.tool_output = ToolOutput::kList;
          r.params.grammar = model.grammars->get_or_build(key, [&] { return tool_list_grammar(allowed, tools.parallel); });
        }
      } catch (const Error& e) {
        throw ApiError(400, e.what(), "tools");
      }
    } else if (tools.choice == ToolChoice::kAuto) {
      r.tool_output = ToolOutput::kMarkup;
    }
    // The markup may be made of special tokens: keep their text for the parser.
    if (r.tool_output == ToolOutput::kMarkup) r.params.skip_special_tokens = false;
  } else {
    const json& prompt = json_field(body, "prompt");
    // Fill in the middle: the prompt is the text before the hole, `suffix` the text after it, in
    // the model's markers (DeepSeek-Coder: BOS <｜fim▁begin｜>prefix<｜fim▁hole｜>suffix<｜fim▁end｜>).
    const json& suffix = json_field(body, "suffix");
    if (!suffix.is_null() && !suffix.is_string()) throw ApiError(400, "suffix must be a string", "suffix");
    const bool fim = suffix.is_string() && !suffix.get_ref<const std::string&>().empty();
    const Tokenizer& tok = *model.tokenizer;
    if (fim && (tok.fim_pre_id() < 0 || tok.fim_suf_id() < 0 || tok.fim_mid_id() < 0)) {
      throw ApiError(400,
                     "suffix (fill in the middle) needs a model whose vocabulary has fill-in-the-middle tokens "
                     "(DeepSeek-Coder's <｜fim▁begin｜>, <｜fim▁hole｜>, <｜fim▁end｜>); this one has none",
                     "suffix");
    }
    if (fim && r.echo) throw ApiError(400, "echo cannot be combined with suffix (fill in the middle)", "echo");
    auto add_text = [&](const std::string& text) {
      if (fim) {
        std::vector<int32_t> ids;
        if (tok.add_bos()) ids.push_back(tok.bos_id());
        ids.push_back(tok.fim_pre_id());
        for (int32_t id : tok.encode(text, false, true)) ids.push_back(id);
        ids.push_back(tok.fim_suf_id());
        for (int32_t id : tok.encode(suffix.get<std::string>(), false, true)) ids.push_back(id);
        ids.push_back(tok.fim_mid_id());
        r.prompts.push_back(std::move(ids));
      } else {
        r.prompts.push_back(tok.encode(text, true, true));
      }
      r.echo_texts.push_back(text);
    };
    if (fim && !(prompt.is_string() || (prompt.is_array() && !prompt.empty() && prompt[0].is_string()))) {
      throw ApiError(400, "with suffix, prompt must be text (a string or a list of strings), not token ids", "prompt");
    }
    if (prompt.is_string()) {
      add_text(prompt.get<std::string>());
    } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
      r.prompts.push_back(token_list(prompt, model, "prompt"));
      r.echo_texts.push_back(model.tokenizer->decode(r.prompts.back(), true));
    } else if (prompt.is_array() && !prompt.empty()) {
      // Checked before anything is tokenized: each prompt is an engine request of its own.
      if (model.max_prompts > 0 && static_cast<int64_t>(prompt.size()) > model.max_prompts) {
        throw ApiError(400,
                       fmt::format("prompt is a list of {} prompts, more than the {} one request may have (each "
                                   "waits as a request of its own: --max-queued-requests)",
                                   prompt.size(), model.max_prompts),
                       "prompt");
      }
      for (const json& p : prompt) {
        if (p.is_string()) {
          add_text(p.get<std::string>());
        } else if (p.is_array() && !fim) {
          r.prompts.push_back(token_list(p, model, "prompt"));
          r.echo_texts.push_back(model.tokenizer->decode(r.prompts.back(), true));
        } else {
          throw ApiError(400, "prompt must be a string, a list of strings, or token ids", "prompt");
        }
      }
    } else {
      throw ApiError(400, "prompt must be a non-empty string, a list of strings, or token ids", "prompt");
    }
  }
  if (requested && model.grammars == nullptr) {
    throw ApiError(500, "structured output is not set up for this model");
  }
  if (requested) {
    try {
      r.params.grammar = model.grammars->get(requested->spec);
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("{}: {}", requested->field, e.what()), requested->field);
    }
  }
  // Only the last tokens of each prompt, when asked (left truncation, as vLLM's).
  if (const int64_t keep = truncate_prompt_tokens(body, model); keep > 0) {
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      std::vector<int32_t>& p = r.prompts[i];
      if (static_cast<int64_t>(p.size()) <= keep) continue;
      p.erase(p.begin(), p.end() - keep);
      if (!chat && i < r.echo_texts.size()) r.echo_texts[i] = model.tokenizer->decode(p, true);
    }
  }
  // A reasoning model thinks first; the constraint applies to the answer after it.
  if (r.params.grammar && r.starts_in_reasoning) r.params.grammar_after = "</think>";
  const bool max_given = !json_field(body, "max_tokens").is_null() || !json_field(body, "max_completion_tokens").is_null();
  for (const std::vector<int32_t>& p : r.prompts) {
    const int64_t n = static_cast<int64_t>(p.size());
    if (n == 0) throw ApiError(400, "the prompt is empty", chat ? "messages" : "prompt");
    if (n >= model.max_model_len) {
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} tokens. "
                                 "Please reduce the length of the {}.",
                                 model.max_model_len, n, chat ? "messages" : "prompt"),
                     chat ? "messages" : "prompt", "context_length_exceeded");
    }
    if (!max_given && chat) {
      r.params.max_tokens = static_cast<int32_t>(model.max_model_len - n);
    } else if (n + r.params.max_tokens > model.max_model_len) {
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                 "({} in the {}, {} in the completion). Please reduce the length of the {} or completion.",
                                 model.max_model_len, n + r.params.max_tokens, n, chat ? "messages" : "prompt",
                                 r.params.max_tokens, chat ? "messages" : "prompt"),
                     "max_tokens", "context_length_exceeded");
    }
  }
  try {
    r.params.validate(model.vocab_size, model.max_logprobs);
    r.params.resolve_logprobs(model.vocab_size);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), error_param(e.what()));
  }
  return r;
}

ChoiceParser::ChoiceParser(const ParsedRequest& request, const ServedModel& model)
    : tool_output_(request.tool_output), tool_name_(request.tool_name) {
  if (request.chat && model.reasoning_parser) reasoner_.emplace(request.starts_in_reasoning);
  if (tool_output_ == ToolOutput::kMarkup && model.tool_parser) tool_parser_.emplace(*model.tool_parser);
}

const std::string& ChoiceParser::call_id(size_t index) {
  while (call_ids_.size() <= index) call_ids_.push_back(tool_call_id());
  return call_ids_[index];
}

ChoiceParser::Delta ChoiceParser::push(const std::string& text, bool finishing) {
  Delta out;
  std::string content = text;
  if (reasoner_) {
    ReasoningParser::Delta rd = reasoner_->push(text);
    if (finishing) {
      ReasoningParser::Delta tail = reasoner_->flush();
      rd.reasoning += tail.reasoning;
      rd.content += tail.content;
    }
    out.reasoning = std::move(rd.reasoning);
    content = std::move(rd.content);
  }
  auto add_calls = [&out](const std::vector<ToolCallParser::CallDelta>& calls) {
    for (const ToolCallParser::CallDelta& d : calls) {
      if (!out.calls.empty() && out.calls.back().index == d.index && !d.name) {
        out.calls.back().arguments += d.arguments;
      } else {
        out.calls.push_back(d);
      }
    }
  };
  switch (tool_output_) {
    case ToolOutput::kNone: out.content = std::move(content); break;
    case ToolOutput::kMarkup: {
      if (!tool_parser_) {
        out.content = std::move(content);
        break;
      }
      ToolCallParser::Delta a = tool_parser_->push(content);
      out.content = std::move(a.content);
      add_calls(a.calls);
      if (finishing) {
        ToolCallParser::Delta b = tool_parser_->flush();
        out.content += b.content;
        add_calls(b.calls);
      }
      break;
    }
    case ToolOutput::kArguments:
      if (!content.empty()) {
        out.calls.push_back({0, tool_text_.empty() ? std::optional<std::string>(tool_name_) : std::nullopt, content});
      }
      tool_text_ += content;
      break;
    case ToolOutput::kList: {
      tool_text_ += content;
      if (!finishing) break;
      const json list = json::parse(tool_text_, nullptr, false);
      if (!list.is_array()) {
        out.content = tool_text_;  // cut short (max_tokens): what there is, as text
        break;
      }
      for (size_t i = 0; i < list.size(); ++i) {  // the grammar made each an object with a name
        const json& call = list[i];
        const bool named = call.is_object() && call.contains("name") && call["name"].is_string();
        out.calls.push_back({i, named ? call["name"].get<std::string>() : std::string(),
                             call.is_object() && call.contains("parameters") ? call["parameters"].dump() : std::string("{}")});
      }
      break;
    }
  }
  return out;
}

namespace {

// A token as logprobs name it: its text, or "token_id:N" (vLLM's return_tokens_as_token_ids).
std::string logprob_token(const Tokenizer& tok, int32_t id, bool as_id) {
  return as_id ? fmt::format("token_id:{}", id) : tok.token_to_piece(id, true);
}

}  // namespace

json chat_logprobs(const Tokenizer& tok, const std::vector<SampledToken>& lps, bool tokens_as_ids) {
  auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  };
  json content = json::array();
  for (const SampledToken& t : lps) {
    const std::string piece = logprob_token(tok, t.token_id, tokens_as_ids);
    json top = json::array();
    for (const TokenLogprob& c : t.top) {
      const std::string p = logprob_token(tok, c.token_id, tokens_as_ids);
      top.push_back({{"token", p}, {"logprob", c.logprob}, {"bytes", bytes_of(p)}});
    }
    content.push_back({{"token", piece}, {"logprob", t.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}});
  }
  return content;
}

std::string stream_error_event(const ApiError& e) { return "data: " + error_body(e) + "\n\n"; }

ResponseBuilder::ResponseBuilder(const ParsedRequest& request, const ServedModel& model, std::string id,
                                 int64_t created)
    : request_(request), model_(model), id_(std::move(id)), created_(created) {
  const size_t width = static_cast<size_t>(request.params.n);
  choices_.reserve(request.prompts.size() * width);
  for (size_t i = 0; i < request.prompts.size() * width; ++i) choices_.emplace_back(ChoiceParser(request, model));
  for (const auto& p : request.prompts) prompt_lengths_.push_back(static_cast<int32_t>(p.size()));
  cached_lengths_.assign(prompt_lengths_.size(), 0);
  prompt_logprobs_.resize(request.prompts.size());
}

void ResponseBuilder::keep_prompt_logprobs(size_t prompt, const RequestOutput& output) {
  if (output.has_prompt_logprobs && prompt < prompt_logprobs_.size()) prompt_logprobs_[prompt] = output.prompt_logprobs;
}

// vLLM's prompt_logprobs: null for the first token, then per token {id: {logprob, rank,
// decoded_token}} for the prompt's token and the most likely ones.
json ResponseBuilder::prompt_logprobs_json(size_t prompt) const {
  const Tokenizer& tok = *model_.tokenizer;
  json out = json::array({nullptr});
  for (const PromptLogprob& p : prompt_logprobs_.at(prompt)) {
    json entry = json::object();
    for (size_t i = 0; i < p.top.size(); ++i) {
      entry[std::to_string(p.top[i].token_id)] = {{"logprob", p.top[i].logprob}, {"rank", i + 1},
                                                  {"decoded_token", logprob_token(tok, p.top[i].token_id, request_.tokens_as_ids)}};
    }
    entry[std::to_string(p.token_id)] = {{"logprob", p.logprob}, {"rank", p.rank},
                                         {"decoded_token", logprob_token(tok, p.token_id, request_.tokens_as_ids)}};
    out.push_back(std::move(entry));
  }
  return out;
}

json ResponseBuilder::tool_calls_json(Choice& c, const std::vector<ToolCallParser::CallDelta>& calls, bool streaming) {
  json out = json::array();
  for (const ToolCallParser::CallDelta& d : calls) {
    if (d.name) {
      json call = {{"id", c.parser.call_id(d.index)},
                   {"type", "function"},
                   {"function", {{"name", *d.name}, {"arguments", d.arguments}}}};
      if (streaming) call["index"] = d.index;
      out.push_back(std::move(call));
    } else if (streaming) {
      out.push_back({{"index", d.index}, {"function", {{"arguments", d.arguments}}}});
    } else if (!out.empty()) {
      out.back()["function"]["arguments"] = out.back()["function"]["arguments"].get<std::string>() + d.arguments;
    }
  }
  return out;
}

size_t ResponseBuilder::choice_index(size_t prompt, int32_t index) const {
  return prompt * static_cast<size_t>(request_.params.n) + static_cast<size_t>(index);
}

ResponseBuilder::Choice& ResponseBuilder::choice(size_t prompt, int32_t index) {
  return choices_.at(choice_index(prompt, index));
}

int64_t ResponseBuilder::prompt_tokens() const {
  int64_t n = 0;
  for (int32_t l : prompt_lengths_) n += l;
  return n;
}

void ResponseBuilder::count_cached(size_t prompt, const RequestOutput& output) {
  if (prompt < cached_lengths_.size()) cached_lengths_[prompt] = std::max(cached_lengths_[prompt], output.num_cached_tokens);
}

json ResponseBuilder::usage() const {
  int64_t cached = 0;
  for (int32_t c : cached_lengths_) cached += c;
  return {{"prompt_tokens", prompt_tokens()},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt_tokens() + completion_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json ResponseBuilder::chunk(const json& choices) const {
  json j = {{"id", id_},
            {"object", request_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_.name},
            {"choices", choices}};
  if (request_.include_usage) j["usage"] = request_.continuous_usage ? usage() : json(nullptr);
  return j;
}

json ResponseBuilder::stop_reason_json(const CompletionDelta& d) const {
  if (d.stop_reason.empty()) return nullptr;
  for (int32_t id : request_.params.stop_token_ids) {
    if (std::to_string(id) == d.stop_reason) return id;
  }
  return d.stop_reason;
}

json ResponseBuilder::logprobs_json(const std::vector<SampledToken>& lps, size_t text_offset,
                                    const std::vector<PromptLogprob>* prompt, size_t prompt_index) const {
  const Tokenizer& tok = *model_.tokenizer;
  const bool as_ids = request_.tokens_as_ids;
  if (request_.chat) return {{"content", chat_logprobs(tok, lps, as_ids)}};
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  size_t offset = text_offset;
  if (prompt != nullptr && prompt_index < request_.prompts.size()) {
    // echo with logprobs: the prompt's tokens first, the first with none (nothing before it). The
    // offsets run over the prompt's pieces from 0; the output's go on from `text_offset`, where
    // its text starts after the echoed prompt.
    const std::vector<int32_t>& ids = request_.prompts[prompt_index];
    const int32_t k = request_.params.logprobs.value_or(0);
    size_t at = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string piece = tok.token_to_piece(ids[i], true);
      tokens.push_back(as_ids ? logprob_token(tok, ids[i], true) : piece);
      offsets.push_back(std::min(at, text_offset));
      at += tok.token_to_piece(ids[i], false).size();  // control tokens are not in the echoed text
      if (i == 0 || i - 1 >= prompt->size()) {
        token_logprobs.push_back(nullptr);
        top_logprobs.push_back(nullptr);
        continue;
      }
      const PromptLogprob& p = (*prompt)[i - 1];
      token_logprobs.push_back(p.logprob);
      json top = json::object();
      for (size_t t = 0; t < p.top.size() && static_cast<int32_t>(t) < k; ++t) {
        top[logprob_token(tok, p.top[t].token_id, as_ids)] = p.top[t].logprob;
      }
      top[logprob_token(tok, p.token_id, as_ids)] = p.logprob;
      top_logprobs.push_back(std::move(top));
    }
  }
  for (const SampledToken& t : lps) {
    const std::string piece = tok.token_to_piece(t.token_id, true);
    tokens.push_back(as_ids ? logprob_token(tok, t.token_id, true) : piece);
    token_logprobs.push_back(t.logprob);
    json top = json::object();
    for (const TokenLogprob& c : t.top) top[logprob_token(tok, c.token_id, as_ids)] = c.logprob;
    top_logprobs.push_back(top);
    offsets.push_back(offset);
    offset += piece.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", offsets}};
}

std::string ResponseBuilder::stream_events(size_t prompt, const RequestOutput& output) {
  count_cached(prompt, output);
  keep_prompt_logprobs(prompt, output);
  std::string events;
  for (const CompletionDelta& d : output.outputs) {
    Choice& c = choice(prompt, d.index);
    const size_t index = choice_index(prompt, d.index);
    completion_tokens_ += static_cast<int64_t>(d.token_ids.size());
    std::string text = d.text;
    if (!c.started) {
      c.started = true;
      if (request_.echo && prompt < request_.echo_texts.size()) text = request_.echo_texts[prompt] + text;
      if (request_.chat) {
        json first = chunk(json::array({{{"index", index},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}}));
        if (request_.return_token_ids && prompt < request_.prompts.size()) first["prompt_token_ids"] = request_.prompts[prompt];
        if (request_.params.prompt_logprobs) first["prompt_logprobs"] = prompt_logprobs_json(prompt);
        events += sse(first);
      }
    }
    // One chunk per generated token, as vLLM streams, even when the token adds no text yet (part
    // of a UTF-8 character, text held back by a stop string, a token that prints nothing); only
    // a token the reasoning or tool-call parser consumed whole (the thinking tags, markers, text
    // held back as a possible marker) sends nothing.
    const bool finishing = d.finish_reason.has_value();
    ChoiceParser::Delta pd = c.parser.push(text, finishing);
    std::string reasoning = std::move(pd.reasoning);
    text = std::move(pd.content);
    const std::vector<ToolCallParser::CallDelta>& calls = pd.calls;
    const bool consumed = c.parser.parses() && text.empty() && reasoning.empty() && calls.empty();
    // With return_token_ids every token goes out, so that the chunks' ids add up to the output's.
    const bool ids = request_.return_token_ids && !d.token_ids.empty();
    if (!finishing && d.logprobs.empty() && !ids && (d.token_ids.empty() || consumed)) continue;
    json ch = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (request_.chat) {
      json delta = json::object();
      if (!text.empty() || (reasoning.empty() && calls.empty())) delta["content"] = text;
      if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
      if (!calls.empty()) delta["tool_calls"] = tool_calls_json(c, calls, true);
      if (finishing && text.empty() && reasoning.empty() && calls.empty()) delta = json::object();
      ch["delta"] = delta;
    } else {
      ch["text"] = text;
    }
    const bool echo_first = request_.echo_logprobs && !c.prompt_logprobs_sent;
    if (request_.params.logprobs && (!d.logprobs.empty() || echo_first)) {
      const size_t echoed = prompt < request_.echo_texts.size() ? request_.echo_texts[prompt].size() : 0;
      ch["logprobs"] = logprobs_json(d.logprobs, echo_first ? echoed : c.text.size(),
                                     echo_first ? &prompt_logprobs_[prompt] : nullptr, prompt);
    }
    if (!request_.chat && request_.params.prompt_logprobs && !c.prompt_logprobs_sent) {
      ch["prompt_logprobs"] = prompt_logprobs_json(prompt);
    }
    c.prompt_logprobs_sent = true;
    if (request_.return_token_ids) {
      // The completion's first chunk carries its prompt's ids; every chunk its tokens'.
      if (!request_.chat && !c.prompt_ids_sent && prompt < request_.prompts.size()) ch["prompt_token_ids"] = request_.prompts[prompt];
      c.prompt_ids_sent = true;
      ch["token_ids"] = d.token_ids;
    }
    c.text += text;
    if (finishing) {
      std::string reason(finish_reason_name(*d.finish_reason));
      if (reason == "stop" && c.parser.num_calls() > 0) reason = "tool_calls";
      ch["finish_reason"] = reason;
      ch["stop_reason"] = stop_reason_json(d);
      last_finish_reason_ = reason;
    }
    events += sse(chunk(json::array({ch})));
  }
  return events;
}

std::string ResponseBuilder::stream_end(const ApiError* error) {
  std::string events = error ? stream_error_event(*error) : std::string();
  if (request_.include_usage) {
    json j = chunk(json::array());
    j["usage"] = usage();
    events += sse(j);
  }
  return events + "data: [DONE]\n\n";
}

void ResponseBuilder::accumulate(size_t prompt, const RequestOutput& output) {
  count_cached(prompt, output);
  keep_prompt_logprobs(prompt, output);
  for (const CompletionDelta& d : output.outputs) {
    Choice& c = choice(prompt, d.index);
    c.text += d.text;
    c.token_ids.insert(c.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
    c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    completion_tokens_ += static_cast<int64_t>(d.token_ids.size());
    if (d.finish_reason) {
      c.finish_reason = finish_reason_name(*d.finish_reason);
      c.stop_reason = stop_reason_json(d);
      last_finish_reason_ = c.finish_reason;
    }
  }
}

std::string ResponseBuilder::final_body() {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    const size_t prompt = i / static_cast<size_t>(request_.params.n);
    std::string text = c.text;
    std::string echo;
    if (request_.echo && prompt < request_.echo_texts.size()) echo = request_.echo_texts[prompt];
    json ch = {{"index", i},
               {"logprobs", nullptr},
               {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)},
               {"stop_reason", c.stop_reason}};
    if (request_.params.logprobs) {
      ch["logprobs"] = logprobs_json(c.logprobs, echo.size(), request_.echo_logprobs ? &prompt_logprobs_[prompt] : nullptr, prompt);
    }
    if (!request_.chat && request_.params.prompt_logprobs) ch["prompt_logprobs"] = prompt_logprobs_json(prompt);
    if (request_.return_token_ids) {
      if (!request_.chat && prompt < request_.prompts.size()) ch["prompt_token_ids"] = request_.prompts[prompt];
      ch["token_ids"] = c.token_ids;
    }
    if (request_.chat) {
      json message = {{"role", "assistant"}};
      ChoiceParser::Delta pd = c.parser.push(text, true);
      if (c.parser.reasons()) message["reasoning_content"] = pd.reasoning;
      text = std::move(pd.content);
      const json calls = tool_calls_json(c, pd.calls, false);
      message["content"] = echo + text;
      if (!calls.empty()) {
        if (message["content"] == "") message["content"] = nullptr;
        message["tool_calls"] = calls;
        if (c.finish_reason == "stop") {
          ch["finish_reason"] = "tool_calls";
          last_finish_reason_ = "tool_calls";
        }
      }
      ch["message"] = message;
    } else {
      ch["text"] = echo + text;
    }
    choices.push_back(ch);
  }
  json j = {{"id", id_},
            {"object", request_.chat ? "chat.completion" : "text_completion"},
            {"created", created_},
            {"model", model_.name},
            {"choices", choices},
            {"usage", usage()}};
  if (request_.return_token_ids && request_.chat && !request_.prompts.empty()) j["prompt_token_ids"] = request_.prompts[0];
  if (request_.chat && request_.params.prompt_logprobs && !prompt_logprobs_.empty()) j["prompt_logprobs"] = prompt_logprobs_json(0);
  return json_text(j);
}

}  // namespace duet::server
