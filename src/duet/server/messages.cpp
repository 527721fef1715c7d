#include "duet/server/messages.h"

#include <algorithm>
#include <ctime>
#include <utility>

#include <fmt/format.h>

#include "duet/core/ordered_json.h"

namespace duet::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// A message's content: a string, or a list of blocks. Throws ApiError naming messages.
const json& blocks_of(const json& content, const std::string& where) {
  if (!content.is_string() && !content.is_array()) {
    throw ApiError(400, where + ".content must be a string or a list of content blocks", "messages");
  }
  return content;
}

// A text block's, or a tool_result's content, as text (a string, or text blocks).
std::string text_of(const json& content, const std::string& where) {
  if (content.is_null()) return {};
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw ApiError(400, where + " must be a string or a list of text blocks", "messages");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const json& b = content[k];
    if (json_field(b, "type") != "text" || !json_field(b, "text").is_string()) {
      throw ApiError(400, fmt::format("{}[{}] must be {{\"type\": \"text\", \"text\": ...}}", where, k), "messages");
    }
    text += b["text"].get<std::string>();
  }
  return text;
}

// One Anthropic message as chat messages (appended): a user's text, and its tool results as tool
// messages, in the order given; an assistant's text and tool uses as one message with tool calls,
// its thinking as reasoning_content (which templates that keep the current turn's thinking read,
// as DeepSeek-V3.2's does; the others leave it out).
void read_message(const json& m, size_t i, json& out) {
  const std::string where = fmt::format("messages[{}]", i);
  if (!m.is_object()) throw ApiError(400, where + " must be an object", "messages");
  const json& role = json_field(m, "role");
  if (role != "user" && role != "assistant") throw ApiError(400, where + ".role must be user or assistant", "messages");
  const json& content = blocks_of(json_field(m, "content"), where);
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content}});
    return;
  }
  std::string text, thinking;
  json calls = json::array();
  const auto flush_text = [&] {
    if (role == "user" && !text.empty()) out.push_back({{"role", "user"}, {"content", std::exchange(text, {})}});
  };
  for (size_t k = 0; k < content.size(); ++k) {
    const json& b = content[k];
    const std::string at = fmt::format("{}.content[{}]", where, k);
    const json& type = json_field(b, "type");
    if (!type.is_string()) throw ApiError(400, at + " must be an object with a type", "messages");
    const std::string t = type.get<std::string>();
    if (t == "text") {
      if (!json_field(b, "text").is_string()) throw ApiError(400, at + ".text must be a string", "messages");
      text += b["text"].get<std::string>();
    } else if (t == "tool_use" && role == "assistant") {
      const json& id = json_field(b, "id");
      const json& name = json_field(b, "name");
      const json& input = json_field(b, "input");
      if (!id.is_string() || !name.is_string() || !(input.is_object() || input.is_null())) {
        throw ApiError(400, at + " must be {\"type\": \"tool_use\", \"id\", \"name\", \"input\": {...}}", "messages");
      }
      calls.push_back({{"id", id},
                       {"type", "function"},
                       {"function", {{"name", name}, {"arguments", input.is_null() ? "{}" : input.dump()}}}});
    } else if (t == "tool_result" && role == "user") {
      const json& id = json_field(b, "tool_use_id");
      if (!id.is_string()) throw ApiError(400, at + ".tool_use_id must be a string", "messages");
      flush_text();
      std::string result = text_of(json_field(b, "content"), at + ".content");
      if (json_field(b, "is_error") == true) result = "Error: " + result;
      out.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
    } else if (t == "thinking" && role == "assistant") {
      if (json_field(b, "thinking").is_string()) thinking += b["thinking"].get<std::string>();
    } else if (t == "redacted_thinking" && role == "assistant") {
      // Nothing a template could show.
    } else if (t == "image" || t == "document" || t == "search_result") {
      throw ApiError(400, fmt::format("{} is {}: the models this server runs read text only", at, t), "messages");
    } else {
      throw ApiError(400, fmt::format("{} is a {} block, which a {} message here does not take (text{})", at, t,
                                      role.get<std::string>(),
                                      role == "user" ? ", tool_result" : ", tool_use, thinking"),
                     "messages");
    }
  }
  if (role == "user") {
    flush_text();
    return;
  }
  json msg = {{"role", "assistant"}, {"content", calls.empty() || !text.empty() ? json(text) : json(nullptr)}};
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  if (!thinking.empty()) msg["reasoning_content"] = std::move(thinking);
  out.push_back(std::move(msg));
}

// The chat parser's parameter names as the Messages API's.
ApiError renamed(const ApiError& e) {
  std::string param = e.param();
  if (param == "stop") param = "stop_sequences";
  if (param == "response_format") param = "tools";
  return ApiError(e.status(), e.what(), param, e.code());
}

// Anthropic's error types by status.
const char* anthropic_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status < 500 ? "invalid_request_error" : "api_error";
  }
}

}  // namespace

std::string anthropic_time(int64_t unix_seconds) {
  const std::time_t t = unix_seconds;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string anthropic_error_body(const ApiError& e) {
  return json_text({{"type", "error"}, {"error", {{"type", anthropic_type(e.status())}, {"message", e.what()}}}});
}

void AnthropicErrors::send(int status, const std::string& content_type, std::string body,
                           std::vector<std::pair<std::string, std::string>> headers) {
  if (status >= 400) {
    // This server's error shape ({"error": {"message", ...}}) in Anthropic's.
    const json j = json::parse(body, nullptr, false);
    const json& message = json_field(json_field(j, "error"), "message");
    body = anthropic_error_body(ApiError(status, message.is_string() ? message.get<std::string>() : body));
  }
  inner_->send(status, content_type, std::move(body), std::move(headers));
}

MessagesRequest parse_messages_request(const json& body, const std::string& body_text, bool counting) {
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object");
  MessagesRequest r;
  const ordered_json ordered = parse_ordered_json(body_text);
  ordered_json chat = ordered_json::object();
  if (body.contains("model")) chat["model"] = body["model"];
  const json& max_tokens = json_field(body, "max_tokens");
  if (!counting && (!max_tokens.is_number_integer() || max_tokens.get<int64_t>() < 1)) {
    throw ApiError(400, "max_tokens is required: the most tokens to generate, an integer >= 1", "max_tokens");
  }
  chat["max_tokens"] = counting ? json(1) : max_tokens;

  json messages = json::array();
  const json& system = json_field(body, "system");
  if (!system.is_null()) {
    std::string text;
    try {
      text = text_of(system, "system");
    } catch (const ApiError& e) {
      throw ApiError(400, e.what(), "system");
    }
    messages.push_back({{"role", "system"}, {"content", text}});
  }
  const json& given = json_field(body, "messages");
  if (!given.is_array() || given.empty()) throw ApiError(400, "messages must be a non-empty list of messages", "messages");
  for (size_t i = 0; i < given.size(); ++i) read_message(given[i], i, messages);
  ordered_json ordered_messages = ordered_json::array();
  for (const json& m : messages) ordered_messages.push_back(to_ordered_json(m));
  chat["messages"] = std::move(ordered_messages);

  const json& stops = json_field(body, "stop_sequences");
  if (!stops.is_null()) {
    if (!stops.is_array() || !std::all_of(stops.begin(), stops.end(), [](const json& s) { return s.is_string(); })) {
      throw ApiError(400, "stop_sequences must be a list of strings", "stop_sequences");
    }
    for (const json& s : stops) r.stop_sequences.push_back(s.get<std::string>());
    chat["stop"] = stops;
  }
  for (const char* key : {"temperature", "top_p", "top_k"}) {
    const json& v = json_field(body, key);
    if (v.is_null()) continue;
    if (!v.is_number()) throw ApiError(400, fmt::format("{} must be a number", key), key);
    chat[key] = v;
  }
  const json& temperature = json_field(body, "temperature");
  if (temperature.is_number() && (temperature.get<double>() < 0.0 || temperature.get<double>() > 1.0)) {
    throw ApiError(400, "temperature must be in [0, 1]", "temperature");
  }
  r.stream = get_bool(body, "stream", false);
  if (r.stream) chat["stream"] = true;

  // Tools: {name, description, input_schema} as function tools (schemas in their key order).
  const auto tools = ordered.find("tools");
  if (tools != ordered.end() && !tools->is_null()) {
    if (!tools->is_array()) throw ApiError(400, "tools must be a list of tools", "tools");
    ordered_json functions = ordered_json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const ordered_json& t = (*tools)[i];
      const auto type = t.is_object() ? t.find("type") : t.end();
      if (type != t.end() && !type->is_null() && *type != "custom") {
        throw ApiError(400, fmt::format("tools[{}] is of type {}: only client tools (name, input_schema) are served",
                                        i, type->dump()), "tools");
      }
      const auto name = t.is_object() ? t.find("name") : t.end();
      const auto schema = t.is_object() ? t.find("input_schema") : t.end();
      if (name == t.end() || !name->is_string() || schema == t.end() || !schema->is_object()) {
        throw ApiError(400, fmt::format("tools[{}] must be {{\"name\", \"input_schema\": {{...}}}}", i), "tools");
      }
      ordered_json fn = {{"name", *name}};
      if (const auto d = t.find("description"); d != t.end() && d->is_string()) fn["description"] = *d;
      fn["parameters"] = *schema;
      functions.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    if (!functions.empty()) chat["tools"] = std::move(functions);
  }
  const json& choice = json_field(body, "tool_choice");
  if (!choice.is_null()) {
    const json& type = json_field(choice, "type");
    if (type == "auto") {
      chat["tool_choice"] = "auto";
    } else if (type == "any") {
      chat["tool_choice"] = "required";
    } else if (type == "none") {
      chat["tool_choice"] = "none";
    } else if (type == "tool" && json_field(choice, "name").is_string()) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", choice["name"]}}}};
    } else {
      throw ApiError(400, "tool_choice must be {\"type\": \"auto\", \"any\", \"none\"} or {\"type\": \"tool\", \"name\"}",
                     "tool_choice");
    }
    if (json_field(choice, "disable_parallel_tool_use") == true) chat["parallel_tool_calls"] = false;
  }
  // Extended thinking: DeepSeek-V3.1's template thinks when asked (chat_template_kwargs.thinking);
  // an R1 model always thinks.
  const json& thinking = json_field(body, "thinking");
  if (!thinking.is_null()) {
    const json& type = json_field(thinking, "type");
    if (type != "enabled" && type != "disabled") {
      throw ApiError(400, "thinking must be {\"type\": \"enabled\", \"budget_tokens\"} or {\"type\": \"disabled\"}",
                     "thinking");
    }
    chat["chat_template_kwargs"] = {{"thinking", type == "enabled"}};
  }
  const json& user = json_field(json_field(body, "metadata"), "user_id");
  if (user.is_string()) chat["user"] = user;
  // The chat API's extra sampling and structured-output fields, as vLLM's clients send them along.
  for (const char* key : {"seed", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias",
                          "stop_token_ids", "min_tokens", "ignore_eos", "priority", "skip_special_tokens",
                          "include_stop_str_in_output", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                          "structured_outputs", "allowed_token_ids", "bad_words", "cache_salt"}) {
    const auto it = ordered.find(key);
    if (it != ordered.end() && !it->is_null()) chat[key] = *it;
  }
  if (!thinking.is_null()) {
    // thinking wins over the template variables a client also sent.
  } else if (const auto kw = ordered.find("chat_template_kwargs"); kw != ordered.end() && !kw->is_null()) {
    chat["chat_template_kwargs"] = *kw;
  }
  r.chat_body = std::move(chat);
  return r;
}

ParsedRequest parse_messages_chat(const MessagesRequest& r, const ServedModel& model) {
  const auto parse = [&](const ordered_json& chat) {
    const std::string text = chat.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
    return parse_request(parse_json_body(text), text, model, true);
  };
  try {
    return parse(r.chat_body);
  } catch (const ApiError& e) {
    if (e.code() != "context_length_exceeded" || e.param() != "max_tokens") throw renamed(e);
  }
  // max_tokens past the rest of the context: Anthropic's clients ask for their own limit (a coding
  // agent 32,000), a ceiling rather than a wish, so the rest of the context it is.
  ordered_json chat = r.chat_body;
  chat.erase("max_tokens");
  try {
    return parse(chat);
  } catch (const ApiError& e) {
    throw renamed(e);
  }
}

MessagesBuilder::MessagesBuilder(const ParsedRequest& request, const ServedModel& model, const MessagesRequest& r,
                                 std::string id)
    : request_(request), model_(model), stop_sequences_(r.stop_sequences), id_(std::move(id)), parser_(request, model) {
  if (!request.prompts.empty()) prompt_tokens_ = static_cast<int64_t>(request.prompts.front().size());
}

void MessagesBuilder::event(const std::string& type, json fields) {
  fields["type"] = type;
  events_ += "event: " + type + "\ndata: " + json_text(fields) + "\n\n";
}

json MessagesBuilder::block_json(const Block& b, bool streaming_start) const {
  if (b.type == "thinking") return {{"type", "thinking"}, {"thinking", streaming_start ? "" : b.text}, {"signature", ""}};
  if (b.type == "text") return {{"type", "text"}, {"text", streaming_start ? "" : b.text}};
  json input = json::object();
  if (!streaming_start && !b.text.empty()) {
    input = json::parse(b.text, nullptr, false);
    if (!input.is_object()) input = json::object();  // arguments that are no JSON object: none
  }
  return {{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", std::move(input)}};
}

MessagesBuilder::Block& MessagesBuilder::open(const std::string& type, std::string id, std::string name) {
  if (open_ && blocks_[*open_].type == type && type != "tool_use") return blocks_[*open_];
  close();
  Block b;
  b.type = type;
  b.id = std::move(id);
  b.name = std::move(name);
  blocks_.push_back(std::move(b));
  open_ = blocks_.size() - 1;
  event("content_block_start", {{"index", *open_}, {"content_block", block_json(blocks_.back(), true)}});
  return blocks_.back();
}

void MessagesBuilder::close() {
  if (!open_) return;
  event("content_block_stop", {{"index", *open_}});
  open_.reset();
}

void MessagesBuilder::add(const CompletionDelta& d) {
  if (finished_) return;
  completion_tokens_ += static_cast<int64_t>(d.token_ids.size());
  const bool finishing = d.finish_reason.has_value();
  const ChoiceParser::Delta pd = parser_.push(d.text, finishing);
  // Thinking and text: a thinking_delta or text_delta of the block of that type.
  for (const auto& [type, text] : {std::pair{"thinking", &pd.reasoning}, std::pair{"text", &pd.content}}) {
    if (text->empty()) continue;
    open(type).text += *text;
    event("content_block_delta", {{"index", *open_}, {"delta", {{"type", std::string(type) + "_delta"}, {type, *text}}}});
  }
  for (const ToolCallParser::CallDelta& c : pd.calls) {
    if (c.name) {
      // Anthropic's ids are toolu_...; the call's own id keeps its hex digits.
      const std::string& call = parser_.call_id(c.index);
      open("tool_use", "toolu_" + call.substr(call.find('_') + 1), *c.name).call_index = c.index;
    }
    if (!open_ || blocks_[*open_].type != "tool_use" || blocks_[*open_].call_index != c.index || c.arguments.empty()) continue;
    blocks_[*open_].text += c.arguments;
    event("content_block_delta",
          {{"index", *open_}, {"delta", {{"type", "input_json_delta"}, {"partial_json", c.arguments}}}});
  }
  if (!finishing) return;
  finished_ = true;
  finish_reason_ = std::string(finish_reason_name(*d.finish_reason));
  if (finish_reason_ == "abort") {
    stop_reason_.clear();  // cancelled before it finished (a batch cancelled): no stop_reason, null
  } else if (finish_reason_ == "length") {
    stop_reason_ = "max_tokens";
  } else if (parser_.num_calls() > 0) {
    stop_reason_ = "tool_use";
  } else if (std::find(stop_sequences_.begin(), stop_sequences_.end(), d.stop_reason) != stop_sequences_.end()) {
    stop_reason_ = "stop_sequence";
    stop_sequence_ = d.stop_reason;
  } else {
    stop_reason_ = "end_turn";
  }
  if (blocks_.empty()) open("text");  // nothing said: an empty text block
  close();
}

json MessagesBuilder::message() const {
  json content = json::array();
  for (const Block& b : blocks_) content.push_back(block_json(b, false));
  return {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_.name},
          {"content", std::move(content)},
          {"stop_reason", finished_ && !stop_reason_.empty() ? json(stop_reason_) : json(nullptr)},
          {"stop_sequence", stop_sequence_ ? json(*stop_sequence_) : json(nullptr)},
          {"usage",
           {{"input_tokens", prompt_tokens_},
            {"output_tokens", completion_tokens_},
            {"cache_read_input_tokens", cached_tokens_},
            {"cache_creation_input_tokens", 0}}}};
}

std::string MessagesBuilder::stream_start() {
  json m = message();
  m["content"] = json::array();
  event("message_start", {{"message", std::move(m)}});
  event("ping", json::object());
  return std::exchange(events_, {});
}

std::string MessagesBuilder::stream_events(size_t /*prompt*/, const RequestOutput& output) {
  if (output.num_prompt_tokens > 0) prompt_tokens_ = output.num_prompt_tokens;
  cached_tokens_ = std::max<int64_t>(cached_tokens_, output.num_cached_tokens);
  for (const CompletionDelta& d : output.outputs) add(d);
  return std::exchange(events_, {});
}

std::string MessagesBuilder::stream_end(const ApiError* error) {
  if (error) {
    close();
    events_ += "event: error\ndata: " + anthropic_error_body(*error) + "\n\n";
    return std::exchange(events_, {});
  }
  close();
  event("message_delta", {{"delta", {{"stop_reason", !finished_ ? json("end_turn") : stop_reason_.empty() ? json(nullptr) : json(stop_reason_)},
                                     {"stop_sequence", stop_sequence_ ? json(*stop_sequence_) : json(nullptr)}}},
                          {"usage", {{"output_tokens", completion_tokens_}}}});
  event("message_stop", json::object());
  return std::exchange(events_, {});
}

void MessagesBuilder::accumulate(size_t prompt, const RequestOutput& output) {
  stream_events(prompt, output);
  events_.clear();
}

std::string MessagesBuilder::final_body() { return json_text(message()); }

}  // namespace duet::server
