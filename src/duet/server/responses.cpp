#include "duet/server/responses.h"

#include <algorithm>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "duet/core/ordered_json.h"

namespace duet::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// An item id: the prefix OpenAI uses for the kind ("msg_", "rs_", "fc_") and 32 hex digits.
std::string new_id(const char* prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

// A message's content as text: a string, or a list of text parts.
std::string content_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw ApiError(400, where + ".content must be a string or a list of content parts", "input");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    const json& type = json_field(part, "type");
    if (!type.is_string()) {
      throw ApiError(400, fmt::format("{}.content[{}] must be an object with a type (input_text)", where, k), "input");
    }
    const std::string t = type.get<std::string>();
    if ((t == "input_text" || t == "output_text" || t == "text") && json_field(part, "text").is_string()) {
      text += part["text"].get<std::string>();
    } else if (t == "refusal" && json_field(part, "refusal").is_string()) {
      text += part["refusal"].get<std::string>();
    } else if (t == "input_image" || t == "input_file" || t == "input_audio") {
      throw ApiError(400, fmt::format("{}.content[{}] is {}: the models this server runs read text only", where, k, t),
                     "input");
    } else {
      throw ApiError(400, fmt::format("{}.content[{}] must be {{\"type\": \"input_text\", \"text\": ...}}", where, k),
                     "input");
    }
  }
  return text;
}

const json& string_field(const json& item, const char* key, const std::string& where) {
  const json& v = json_field(item, key);
  if (!v.is_string()) throw ApiError(400, fmt::format("{}.{} must be a string", where, key), "input");
  return v;
}

}  // namespace

void read_input_items(const json& input, json& messages, json& items, const ItemLookup& lookup) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    items.push_back({{"id", new_id("msg_")},
                     {"type", "message"},
                     {"role", "user"},
                     {"status", "completed"},
                     {"content", json::array({{{"type", "input_text"}, {"text", input}}})}});
    return;
  }
  if (!input.is_array()) throw ApiError(400, "input must be a string or a list of input items", "input");
  // A reasoning item's text goes with the assistant message that follows it (reasoning_content,
  // which templates that keep the thinking of the current turn read; DeepSeek-V3.2's does).
  std::string reasoning;
  const auto take_reasoning = [&](json& message) {
    if (!reasoning.empty() && !message.contains("reasoning_content")) message["reasoning_content"] = reasoning;
    reasoning.clear();
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string where = fmt::format("input[{}]", i);
    const json* given = &input[i];
    if (!given->is_object()) throw ApiError(400, where + " must be an object", "input");
    if (json_field(*given, "type") == "item_reference") {
      // An item of the conversation or the previous response, by its id: read as that item.
      const json& ref = json_field(*given, "id");
      const json* found = ref.is_string() && lookup ? lookup(ref.get<std::string>()) : nullptr;
      if (found == nullptr) {
        throw ApiError(400, fmt::format("{} refers to {}, which is not an item of the conversation or of the previous "
                                        "response", where, ref.dump()), "input");
      }
      given = found;
    }
    const json& item = *given;
    const json& type_field = json_field(item, "type");
    if (!type_field.is_null() && !type_field.is_string()) throw ApiError(400, where + ".type must be a string", "input");
    const std::string type = type_field.is_string() ? type_field.get<std::string>() : "message";
    json kept = item;
    if (!kept.contains("id")) kept["id"] = new_id(type == "function_call" ? "fc_" : type == "reasoning" ? "rs_" : "msg_");
    if (type == "message") {
      const json& role = json_field(item, "role");
      static const std::vector<std::string> kRoles = {"user", "assistant", "system", "developer"};
      if (!role.is_string() || std::find(kRoles.begin(), kRoles.end(), role.get<std::string>()) == kRoles.end()) {
        throw ApiError(400, where + ".role must be user, assistant, system or developer", "input");
      }
      const std::string r = role.get<std::string>();
      const std::string text = content_text(json_field(item, "content"), where);
      // DeepSeek's templates know system, user and assistant: a developer message is the system's.
      messages.push_back({{"role", r == "developer" ? "system" : r}, {"content", text}});
      if (r == "assistant") take_reasoning(messages.back());
      reasoning.clear();
      kept["type"] = "message";
      if (kept["content"].is_string()) {
        kept["content"] = json::array({{{"type", r == "assistant" ? "output_text" : "input_text"}, {"text", text}}});
      }
    } else if (type == "function_call") {
      json call = {{"id", string_field(item, "call_id", where)},
                   {"type", "function"},
                   {"function", {{"name", string_field(item, "name", where)},
                                 {"arguments", string_field(item, "arguments", where)}}}};
      // Calls after the assistant's text (or after other calls) belong to the same message.
      if (!messages.empty() && messages.back().value("role", "") == "assistant") {
        json& last = messages.back();
        if (!last.contains("tool_calls")) last["tool_calls"] = json::array();
        last["tool_calls"].push_back(std::move(call));
      } else {
        messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({std::move(call)})}});
      }
      take_reasoning(messages.back());
    } else if (type == "function_call_output") {
      const json& output = json_field(item, "output");
      const std::string text = output.is_string() ? output.get<std::string>() : content_text(output, where + ".output");
      messages.push_back({{"role", "tool"}, {"tool_call_id", string_field(item, "call_id", where)}, {"content", text}});
      reasoning.clear();
    } else if (type == "reasoning") {
      // Its text (content's reasoning_text, else the summary) for the next assistant message;
      // templates leave out thinking before the last user message.
      for (const char* field : {"content", "summary"}) {
        const json& parts = json_field(item, field);
        if (!parts.is_array()) continue;
        for (const json& part : parts) {
          const json& text = json_field(part, "text");
          if (text.is_string()) reasoning += text.get<std::string>();
        }
        if (!reasoning.empty()) break;
      }
    } else {
      throw ApiError(400,
                     fmt::format("{} is of type {}, which this server does not serve (message, function_call, "
                                 "function_call_output, reasoning and item_reference are)", where, type),
                     "input");
    }
    items.push_back(std::move(kept));
  }
}

namespace {

// A function tool of the Responses API ({"type": "function", "name", "parameters", ...}) as the
// chat API's ({"type": "function", "function": {...}}).
ordered_json chat_tools(const ordered_json& tools) {
  if (!tools.is_array()) throw ApiError(400, "tools must be a list of function tools", "tools");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    if (!t.is_object()) throw ApiError(400, fmt::format("tools[{}] must be an object", i), "tools");
    auto type = t.find("type");
    if (type == t.end() || *type != "function") {
      throw ApiError(400,
                     fmt::format("tools[{}] is {}: this server calls functions only ({{\"type\": \"function\", "
                                 "\"name\", \"parameters\"}})",
                                 i, type == t.end() ? std::string("without a type") : "a " + type->dump() + " tool"),
                     "tools");
    }
    ordered_json fn = ordered_json::object();
    for (const char* key : {"name", "description", "parameters", "strict"}) {
      auto it = t.find(key);
      if (it != t.end() && !it->is_null()) fn[key] = *it;
    }
    if (!fn.contains("name") || !fn["name"].is_string()) {
      throw ApiError(400, fmt::format("tools[{}].name must be a string", i), "tools");
    }
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

ordered_json chat_tool_choice(const ordered_json& choice) {
  if (choice.is_string()) return choice;
  if (choice.is_object()) {
    auto type = choice.find("type");
    auto name = choice.find("name");
    if (type != choice.end() && *type == "function" && name != choice.end() && name->is_string()) {
      return {{"type", "function"}, {"function", {{"name", *name}}}};
    }
  }
  throw ApiError(400, "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}",
                 "tool_choice");
}

// text.format as the chat API's response_format (nothing for plain text).
std::optional<ordered_json> chat_response_format(const ordered_json& text) {
  if (!text.is_object()) throw ApiError(400, "text must be an object such as {\"format\": {\"type\": \"text\"}}", "text");
  auto verbosity = text.find("verbosity");
  if (verbosity != text.end() && !verbosity->is_null() &&
      !(*verbosity == "low" || *verbosity == "medium" || *verbosity == "high")) {
    throw ApiError(400, "text.verbosity must be low, medium or high", "text");
  }
  auto format = text.find("format");
  if (format == text.end() || format->is_null()) return std::nullopt;
  const ordered_json& f = *format;
  auto type = f.is_object() ? f.find("type") : f.end();
  if (type == f.end() || !type->is_string()) {
    throw ApiError(400, "text.format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                        "{\"type\": \"json_schema\", \"name\", \"schema\"}",
                   "text");
  }
  if (*type == "text") return std::nullopt;
  if (*type == "json_object") return ordered_json{{"type", "json_object"}};
  if (*type == "json_schema") {
    ordered_json spec = ordered_json::object();
    for (const char* key : {"name", "description", "schema", "strict"}) {
      auto it = f.find(key);
      if (it != f.end() && !it->is_null()) spec[key] = *it;
    }
    if (!spec.contains("schema")) throw ApiError(400, "text.format.schema is required for json_schema", "text");
    if (!spec.contains("name")) spec["name"] = "response";
    return ordered_json{{"type", "json_schema"}, {"json_schema", std::move(spec)}};
  }
  throw ApiError(400, fmt::format("text.format.type {} is not served (text, json_object or json_schema)", type->dump()),
                 "text");
}


// The chat parser's parameter names as the Responses API's.
ApiError renamed(const ApiError& e) {
  std::string param = e.param();
  if (param == "messages") param = "input";
  if (param == "max_tokens") param = "max_output_tokens";
  if (param == "response_format") param = "text";
  std::string message = e.what();
  for (size_t at = 0; (at = message.find("the messages", at)) != std::string::npos; at += 9) {
    message.replace(at, 12, "the input");
  }
  return ApiError(e.status(), message, param, e.code());
}

}  // namespace

json StoredResponse::response() const {
  std::function<json()> snapshot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!snapshot_) return response_;
    snapshot = snapshot_;
  }
  return snapshot();
}

void StoredResponse::finish(json response, json conversation) {
  std::lock_guard<std::mutex> lock(mutex_);
  response_ = std::move(response);
  messages = std::move(conversation);
  snapshot_ = nullptr;
  cancel_ = nullptr;
  bytes_ = json_text(response_).size() + json_text(messages).size() + json_text(input_items).size();
}

bool StoredResponse::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<bool>(snapshot_);
}

void StoredResponse::set_running(std::function<json()> snapshot, std::function<void()> cancel) {
  std::lock_guard<std::mutex> lock(mutex_);
  snapshot_ = std::move(snapshot);
  cancel_ = std::move(cancel);
  bytes_ = json_text(input_items).size();
}

bool StoredResponse::cancel() {
  std::function<void()> cancel;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancel = cancel_;
  }
  if (!cancel) return false;
  cancel();
  return true;
}

void StoredResponse::mark_deleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  deleted_ = true;
}

bool StoredResponse::deleted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return deleted_;
}

size_t StoredResponse::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_ + event_bytes_;
}

void StoredResponse::keep_events() {
  std::lock_guard<std::mutex> lock(mutex_);
  keeps_events_ = true;
}

bool StoredResponse::keeps_events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return keeps_events_;
}

void StoredResponse::record_events(const std::string& chunk) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!keeps_events_ || events_ended_) return;
  for (size_t pos = 0; pos < chunk.size();) {
    size_t end = chunk.find("\n\n", pos);
    end = end == std::string::npos ? chunk.size() : end + 2;
    std::string text = chunk.substr(pos, end - pos);
    pos = end;
    // Its number: the data line's sequence_number (the builder numbers every event).
    int64_t number = events_.empty() ? 0 : events_.back().first + 1;
    const size_t data = text.find("data: ");
    if (data != std::string::npos) {
      const json fields = json::parse(text.substr(data + 6), nullptr, false);
      if (fields.is_object() && fields.contains("sequence_number") && fields["sequence_number"].is_number_integer()) {
        number = fields["sequence_number"].get<int64_t>();
      }
    }
    // Passed on under the lock, so that a follower that joins now gets every event once, in order.
    for (auto it = followers_.begin(); it != followers_.end();) {
      if (it->second->disconnected()) {
        it = followers_.erase(it);
        continue;
      }
      if (number > it->first) it->second->write(text);
      ++it;
    }
    event_bytes_ += text.size();
    events_.emplace_back(number, std::move(text));
  }
}

void StoredResponse::end_events() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!keeps_events_ || events_ended_) return;
  events_ended_ = true;
  for (auto& [after, res] : followers_) res->finish();
  followers_.clear();
}

bool StoredResponse::follow_events(int64_t starting_after, const std::shared_ptr<Responder>& res) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!keeps_events_) return false;
  for (const auto& [number, text] : events_) {
    if (number > starting_after) res->write(text);
  }
  if (events_ended_) {
    res->finish();
  } else {
    followers_.emplace_back(starting_after, res);
  }
  return true;
}

ResponsesRequest parse_responses_request(const json& body, const std::string& body_text,
                                         const std::function<std::shared_ptr<StoredResponse>(const std::string&)>& previous,
                                         const std::function<json(const std::string&)>& conversation_items) {
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object");
  // The chat API's names for what the Responses API names otherwise.
  static const std::vector<std::pair<const char*, const char*>> kChatOnly = {
      {"messages", "send the conversation as input"},
      {"max_tokens", "the Responses API calls it max_output_tokens"},
      {"max_completion_tokens", "the Responses API calls it max_output_tokens"},
      {"response_format", "the Responses API takes it as text.format"},
      {"logprobs", "ask with include: [\"message.output_text.logprobs\"] and top_logprobs"},
      {"n", "a response has one output"},
      {"prompt", "stored prompt templates are not served: send input and instructions"},
  };
  for (const auto& [key, why] : kChatOnly) {
    if (!json_field(body, key).is_null()) throw ApiError(400, fmt::format("{} is not a parameter here: {}", key, why), key);
  }
  ResponsesRequest r;
  r.stream = get_bool(body, "stream", false);
  r.store = get_bool(body, "store", true);
  r.background = get_bool(body, "background", false);
  if (r.background && !r.store) throw ApiError(400, "background responses must be stored (store: true)", "background");
  const json& truncation = json_field(body, "truncation");
  if (!truncation.is_null() && truncation != "auto" && truncation != "disabled") {
    throw ApiError(400, "truncation must be \"auto\" or \"disabled\"", "truncation");
  }
  r.truncate = truncation == "auto";
  const json& instructions = json_field(body, "instructions");
  if (!instructions.is_null() && !instructions.is_string()) {
    throw ApiError(400, "instructions must be a string", "instructions");
  }
  check_metadata(json_field(body, "metadata"));
  const json& include = json_field(body, "include");
  bool logprobs = false;
  if (!include.is_null()) {
    if (!include.is_array()) throw ApiError(400, "include must be a list of strings", "include");
    for (const json& v : include) {
      if (!v.is_string()) throw ApiError(400, "include must be a list of strings", "include");
      logprobs = logprobs || v == "message.output_text.logprobs";
    }
  }
  for (const char* key : {"reasoning", "stream_options"}) {
    const json& v = json_field(body, key);
    if (!v.is_null() && !v.is_object()) throw ApiError(400, fmt::format("{} must be an object", key), key);
  }
  const json& effort = json_field(json_field(body, "reasoning"), "effort");
  if (!effort.is_null() && !(effort == "minimal" || effort == "low" || effort == "medium" || effort == "high")) {
    throw ApiError(400, "reasoning.effort must be minimal, low, medium or high", "reasoning");
  }

  // The conversation: an earlier response's, or a conversation object's items, then this turn's
  // input. Item references find the items of either.
  json conversation = json::array();
  json earlier_items = json::array();
  const json& prev = json_field(body, "previous_response_id");
  const json& conv = json_field(body, "conversation");
  if (!conv.is_null()) {
    const json& id = conv.is_object() ? json_field(conv, "id") : conv;
    if (!id.is_string() || id.get_ref<const std::string&>().empty()) {
      throw ApiError(400, "conversation must be a conversation's id, or {\"id\": ...}", "conversation");
    }
    if (!prev.is_null()) {
      throw ApiError(400, "give conversation or previous_response_id, not both", "conversation");
    }
    if (!conversation_items) throw ApiError(400, "this server keeps no conversations", "conversation");
    r.conversation_id = id.get<std::string>();
    earlier_items = conversation_items(r.conversation_id);
    json unused = json::array();
    read_input_items(earlier_items, conversation, unused);
  }
  if (!prev.is_null()) {
    if (!prev.is_string()) throw ApiError(400, "previous_response_id must be a string", "previous_response_id");
    const std::shared_ptr<StoredResponse> p = previous(prev.get<std::string>());
    if (p == nullptr) {
      throw ApiError(404, fmt::format("Previous response with id '{}' not found.", prev.get<std::string>()),
                     "previous_response_id", "previous_response_not_found");
    }
    if (p->running()) {
      throw ApiError(400, fmt::format("the previous response '{}' has not finished yet", prev.get<std::string>()),
                     "previous_response_id");
    }
    const std::string status = p->response().value("status", "");
    if (status != "completed" && status != "incomplete") {
      throw ApiError(400,
                     fmt::format("the previous response '{}' did not complete ({}): continue from one that did",
                                 prev.get<std::string>(), status),
                     "previous_response_id");
    }
    conversation = p->messages;
    earlier_items = p->input_items;
    const json output = p->response().value("output", json::array());
    earlier_items.insert(earlier_items.end(), output.begin(), output.end());
  }
  const json& input = json_field(body, "input");
  if (input.is_null()) throw ApiError(400, "input is required: a string or a list of input items", "input");
  r.input_items = json::array();
  read_input_items(input, conversation, r.input_items, [&earlier_items](const std::string& id) -> const json* {
    for (const json& item : earlier_items) {
      if (item.is_object() && item.value("id", "") == id) return &item;
    }
    return nullptr;
  });
  r.conversation = conversation;

  // The chat body. Schemas (tools, text.format) keep their key order: read again in order.
  const ordered_json ordered = parse_ordered_json(body_text);
  ordered_json chat = ordered_json::object();
  if (body.contains("model")) chat["model"] = body["model"];
  ordered_json messages = ordered_json::array();
  if (instructions.is_string()) messages.push_back({{"role", "system"}, {"content", instructions.get<std::string>()}});
  for (const json& m : conversation) messages.push_back(to_ordered_json(m));
  chat["messages"] = std::move(messages);
  if (!json_field(body, "max_output_tokens").is_null()) chat["max_tokens"] = body["max_output_tokens"];
  auto tools = ordered.find("tools");
  if (tools != ordered.end() && !tools->is_null()) chat["tools"] = chat_tools(*tools);
  auto choice = ordered.find("tool_choice");
  if (choice != ordered.end() && !choice->is_null()) chat["tool_choice"] = chat_tool_choice(*choice);
  auto text = ordered.find("text");
  if (text != ordered.end() && !text->is_null()) {
    if (auto format = chat_response_format(*text)) chat["response_format"] = std::move(*format);
  }
  if (logprobs) chat["logprobs"] = true;
  // Sampling settings the chat API reads the same way (the last few are vLLM's and duet's own).
  for (const char* key : {"temperature", "top_p", "top_logprobs", "parallel_tool_calls", "user", "seed", "stop",
                          "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias",
                          "stop_token_ids", "min_tokens", "ignore_eos", "priority", "chat_template_kwargs",
                          "skip_special_tokens", "include_stop_str_in_output", "guided_json", "guided_regex",
                          "guided_choice", "guided_grammar", "structured_outputs", "allowed_token_ids", "bad_words",
                          "cache_salt"}) {
    auto it = ordered.find(key);
    if (it != ordered.end() && !it->is_null()) chat[key] = *it;
  }
  if (r.stream) chat["stream"] = true;
  r.chat_body = std::move(chat);

  // What the response object repeats.
  auto or_null = [&](const char* key) { return json_field(body, key); };
  r.echo = {{"instructions", or_null("instructions")},
            {"max_output_tokens", or_null("max_output_tokens")},
            {"max_tool_calls", or_null("max_tool_calls")},
            {"metadata", body.contains("metadata") && !body["metadata"].is_null() ? body["metadata"] : json::object()},
            {"parallel_tool_calls", get_bool(body, "parallel_tool_calls", true)},
            {"previous_response_id", or_null("previous_response_id")},
            {"reasoning", body.contains("reasoning") && !body["reasoning"].is_null() ? body["reasoning"]
                                                                                     : json{{"effort", nullptr}, {"summary", nullptr}}},
            {"service_tier", "default"},
            {"store", r.store},
            {"background", r.background},
            {"text", body.contains("text") && !body["text"].is_null() ? body["text"] : json{{"format", {{"type", "text"}}}}},
            {"tool_choice", body.contains("tool_choice") && !body["tool_choice"].is_null() ? body["tool_choice"] : json("auto")},
            {"tools", body.contains("tools") && body["tools"].is_array() ? body["tools"] : json::array()},
            {"top_logprobs", or_null("top_logprobs")},
            {"truncation", r.truncate ? "auto" : "disabled"},
            {"user", or_null("user")},
            {"conversation", r.conversation_id.empty() ? json(nullptr) : json{{"id", r.conversation_id}}}};
  return r;
}

ParsedRequest parse_responses_chat(ResponsesRequest& r, const ServedModel& model) {
  // Turn boundaries: each user message after the instructions starts one.
  ordered_json& messages = r.chat_body["messages"];
  const size_t first = !messages.empty() && messages[0]["role"] == "system" ? 1 : 0;
  std::vector<size_t> turns;  // where each turn that may go starts
  for (size_t i = first; i < messages.size(); ++i) {
    if (messages[i]["role"] == "user" && i > first) turns.push_back(i);
  }
  auto parse_dropping = [&](size_t dropped) {
    ordered_json body = r.chat_body;
    if (dropped > 0) {
      ordered_json& m = body["messages"];
      m.erase(m.begin() + static_cast<std::ptrdiff_t>(first), m.begin() + static_cast<std::ptrdiff_t>(turns[dropped - 1]));
    }
    const std::string text = body.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
    return parse_request(parse_json_body(text), text, model, true);
  };
  auto too_long = [](const ApiError& e) { return e.code() == "context_length_exceeded"; };
  try {
    return parse_dropping(0);
  } catch (const ApiError& e) {
    if (!r.truncate || !too_long(e) || turns.empty()) throw renamed(e);
  }
  // The fewest earlier turns to drop (a binary search: each try renders and tokenizes).
  size_t lo = 1, hi = turns.size();
  std::optional<ParsedRequest> best;
  std::optional<ApiError> last;
  while (lo <= hi) {
    const size_t mid = lo + (hi - lo) / 2;
    try {
      best = parse_dropping(mid);
      hi = mid - 1;
    } catch (const ApiError& e) {
      if (!too_long(e)) throw renamed(e);
      last = e;
      lo = mid + 1;
    }
  }
  if (!best) throw renamed(*last);
  return std::move(*best);
}

ResponsesBuilder::ResponsesBuilder(const ParsedRequest& request, const ServedModel& model, const ResponsesRequest& r,
                                   std::string id, int64_t created)
    : request_(request),
      model_(model),
      echo_(r.echo),
      id_(std::move(id)),
      created_(created),
      parser_(request, model) {
  if (!request.prompts.empty()) prompt_tokens_ = static_cast<int64_t>(request.prompts.front().size());
}

void ResponsesBuilder::event(const std::string& type, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = sequence_++;
  events_ += "event: " + type + "\ndata: " + json_text(fields) + "\n\n";
}

json ResponsesBuilder::item_json(const Item& it) const {
  const bool adding = it.status == "in_progress";
  if (it.type == "function_call") {
    return {{"id", it.id}, {"type", "function_call"}, {"call_id", it.call_id}, {"name", it.name},
            {"arguments", it.arguments}, {"status", it.status}};
  }
  if (it.type == "reasoning") {
    json content = adding ? json::array() : json::array({{{"type", "reasoning_text"}, {"text", it.text}}});
    return {{"id", it.id}, {"type", "reasoning"}, {"summary", json::array()}, {"content", content},
            {"encrypted_content", nullptr}, {"status", it.status}};
  }
  json content = adding ? json::array()
                        : json::array({{{"type", "output_text"}, {"text", it.text}, {"annotations", json::array()},
                                        {"logprobs", it.logprobs}}});
  return {{"id", it.id}, {"type", "message"}, {"role", "assistant"}, {"status", it.status}, {"content", content}};
}

ResponsesBuilder::Item& ResponsesBuilder::open(const std::string& type) {
  if (open_ && items_[*open_].type == type) return items_[*open_];
  close("completed");
  Item it;
  it.type = type;
  it.id = new_id(type == "reasoning" ? "rs_" : type == "message" ? "msg_" : "fc_");
  items_.push_back(std::move(it));
  open_ = items_.size() - 1;
  const Item& item = items_.back();
  event("response.output_item.added", {{"output_index", *open_}, {"item", item_json(item)}});
  if (type != "function_call") {
    json part = type == "message" ? json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()},
                                         {"logprobs", json::array()}}
                                  : json{{"type", "reasoning_text"}, {"text", ""}};
    event("response.content_part.added",
          {{"item_id", item.id}, {"output_index", *open_}, {"content_index", 0}, {"part", std::move(part)}});
  }
  return items_.back();
}

void ResponsesBuilder::close(const std::string& status) {
  if (!open_) return;
  const size_t index = *open_;
  open_.reset();
  Item& it = items_[index];
  it.status = status;
  if (it.type == "function_call") {
    event("response.function_call_arguments.done",
          {{"item_id", it.id}, {"output_index", index}, {"name", it.name}, {"arguments", it.arguments}});
  } else {
    const json done = item_json(it);
    if (it.type == "message") {
      event("response.output_text.done", {{"item_id", it.id}, {"output_index", index}, {"content_index", 0},
                                          {"text", it.text}, {"logprobs", it.logprobs}});
    } else {
      event("response.reasoning_text.done",
            {{"item_id", it.id}, {"output_index", index}, {"content_index", 0}, {"text", it.text}});
    }
    event("response.content_part.done",
          {{"item_id", it.id}, {"output_index", index}, {"content_index", 0}, {"part", done["content"][0]}});
  }
  event("response.output_item.done", {{"output_index", index}, {"item", item_json(it)}});
}

void ResponsesBuilder::add(const CompletionDelta& d) {
  if (finished_) return;
  const auto n = static_cast<int64_t>(d.token_ids.size());
  completion_tokens_ += n;
  const bool finishing = d.finish_reason.has_value();
  ChoiceParser::Delta pd = parser_.push(d.text, finishing);
  if (request_.params.logprobs && !d.logprobs.empty()) {
    pending_logprobs_.insert(pending_logprobs_.end(), d.logprobs.begin(), d.logprobs.end());
  }
  if (!pd.reasoning.empty()) {
    Item& it = open("reasoning");
    it.text += pd.reasoning;
    event("response.reasoning_text.delta",
          {{"item_id", it.id}, {"output_index", *open_}, {"content_index", 0}, {"delta", pd.reasoning}});
    if (pd.content.empty() && pd.calls.empty()) {
      reasoning_tokens_ += n;
      pending_logprobs_.clear();  // the thinking's tokens: not the message's
    }
  }
  if (!pd.content.empty()) {
    Item& it = open("message");
    json lp = model_.tokenizer != nullptr ? chat_logprobs(*model_.tokenizer, pending_logprobs_) : json::array();
    pending_logprobs_.clear();
    for (const json& t : lp) it.logprobs.push_back(t);
    it.text += pd.content;
    event("response.output_text.delta", {{"item_id", it.id}, {"output_index", *open_}, {"content_index", 0},
                                         {"delta", pd.content}, {"logprobs", std::move(lp)}});
  }
  for (const ToolCallParser::CallDelta& c : pd.calls) {
    if (c.name) {
      close("completed");
      Item it;
      it.type = "function_call";
      it.id = new_id("fc_");
      it.call_index = c.index;
      it.call_id = parser_.call_id(c.index);
      it.name = *c.name;
      items_.push_back(std::move(it));
      open_ = items_.size() - 1;
      event("response.output_item.added", {{"output_index", *open_}, {"item", item_json(items_.back())}});
    }
    if (!open_ || items_[*open_].type != "function_call" || items_[*open_].call_index != c.index) continue;
    Item& it = items_[*open_];
    if (c.arguments.empty()) continue;
    it.arguments += c.arguments;
    event("response.function_call_arguments.delta", {{"item_id", it.id}, {"output_index", *open_}, {"delta", c.arguments}});
  }
  if (finishing) {
    finish_reason_ = std::string(finish_reason_name(*d.finish_reason));
    if (finish_reason_ == "stop" && parser_.num_calls() > 0) finish_reason_ = "tool_calls";
    if (items_.empty()) open("message");  // nothing said: an empty message
    close(finish_reason_ == "length" ? "incomplete" : "completed");
    finished_ = true;
  }
}

std::string ResponsesBuilder::status() const {
  if (error_) return "failed";
  if (!finished_) return started_ || !echo_.value("background", false) ? "in_progress" : "queued";
  if (finish_reason_ == "length") return "incomplete";
  if (finish_reason_ == "abort") return "cancelled";
  if (finish_reason_ == "error") return "failed";
  return "completed";
}

json ResponsesBuilder::response(const ApiError* error) const {
  json r = echo_;
  const std::string st = error ? "failed" : status();
  r["id"] = id_;
  r["object"] = "response";
  r["created_at"] = created_;
  r["model"] = model_.name;
  r["status"] = st;
  r["temperature"] = request_.params.temperature;
  r["top_p"] = request_.params.top_p;
  json output = json::array();
  for (const Item& it : items_) output.push_back(item_json(it));
  r["output"] = std::move(output);
  const ApiError* e = error ? error : error_ ? &*error_ : nullptr;
  r["error"] = e ? json{{"code", e->code().empty() ? e->type() : e->code()}, {"message", e->what()}} : json(nullptr);
  r["incomplete_details"] = st == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr);
  r["usage"] = {{"input_tokens", prompt_tokens_},
                {"input_tokens_details", {{"cached_tokens", cached_tokens_}}},
                {"output_tokens", completion_tokens_},
                {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}},
                {"total_tokens", prompt_tokens_ + completion_tokens_}};
  return r;
}

json ResponsesBuilder::output_message() const {
  std::string text;
  json calls = json::array();
  for (const Item& it : items_) {
    if (it.type == "message") text += it.text;
    if (it.type == "function_call") {
      calls.push_back({{"id", it.call_id}, {"type", "function"}, {"function", {{"name", it.name}, {"arguments", it.arguments}}}});
    }
  }
  json m = {{"role", "assistant"}, {"content", calls.empty() || !text.empty() ? json(text) : json(nullptr)}};
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  return m;
}

std::string ResponsesBuilder::stream_start() {
  event("response.created", {{"response", response()}});
  event("response.in_progress", {{"response", response()}});
  return std::exchange(events_, {});
}

std::string ResponsesBuilder::stream_events(size_t /*prompt*/, const RequestOutput& output) {
  started_ = true;
  if (output.num_prompt_tokens > 0) prompt_tokens_ = output.num_prompt_tokens;
  cached_tokens_ = std::max<int64_t>(cached_tokens_, output.num_cached_tokens);
  for (const CompletionDelta& d : output.outputs) add(d);
  return std::exchange(events_, {});
}

std::string ResponsesBuilder::stream_end(const ApiError* error) {
  if (error) {
    error_ = *error;
    close("incomplete");
    event("error", {{"code", error->code().empty() ? error->type() : error->code()},
                    {"message", error->what()},
                    {"param", error->param().empty() ? json(nullptr) : json(error->param())}});
    event("response.failed", {{"response", response()}});
  } else {
    close("incomplete");  // only when the engine stopped without a last output
    const std::string st = status();
    event(st == "completed" ? "response.completed" : st == "failed" ? "response.failed" : "response.incomplete",
          {{"response", response()}});
  }
  return std::exchange(events_, {});
}

void ResponsesBuilder::accumulate(size_t prompt, const RequestOutput& output) { stream_events(prompt, output); }

std::string ResponsesBuilder::final_body() { return json_text(response()); }

}  // namespace duet::server
