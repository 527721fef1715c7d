// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens), which DeepSeek's own API
// and vLLM also serve, so that clients written for it (the anthropic SDKs, coding agents) run on
// duet. A request becomes the chat request it means (system, messages with text, tool_use and
// tool_result blocks, tools, tool_choice, stop_sequences, thinking), served by the same engine
// path as /v1/chat/completions; the output comes back as content blocks (thinking, text,
// tool_use) in a message object, or as Anthropic's stream of events.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "duet/server/http_server.h"
#include "duet/server/openai.h"

namespace duet::server {

// A /v1/messages request, read.
struct MessagesRequest {
  nlohmann::ordered_json chat_body;          // the /v1/chat/completions body it means
  std::vector<std::string> stop_sequences;   // stop_reason "stop_sequence" when one of them ended it
  bool stream = false;
};

// Reads a request body (parsed by parse_json_body from `body_text`). Throws ApiError naming the
// Messages API's parameter. `counting` (/v1/messages/count_tokens): max_tokens is not asked for.
MessagesRequest parse_messages_request(const nlohmann::json& body, const std::string& body_text, bool counting = false);
// The chat request of `r` parsed for the model, the chat parser's errors naming the Messages API's
// parameters. A max_tokens past the rest of the context is the rest of the context.
ParsedRequest parse_messages_chat(const MessagesRequest& r, const ServedModel& model);

// Anthropic's error body ({"type": "error", "error": {"type", "message"}}) for an error of this
// server (its status picks the type).
std::string anthropic_error_body(const ApiError& e);

// Unix seconds as Anthropic writes times: RFC 3339 in UTC ("2026-12-07T03:18:39Z").
std::string anthropic_time(int64_t unix_seconds);

// Whether a request comes from Anthropic's clients, which send `anthropic-version` on every call
// (GET /v1/models then answers in Anthropic's shape, and errors anywhere do).
inline bool anthropic_client(const HttpRequest& req) { return !req.header("anthropic-version").empty(); }

// A reply channel whose error answers (status 400 and up, a JSON body of this server's shape) go
// out in Anthropic's shape: every error of a /v1/messages request, wherever it was found.
class AnthropicErrors final : public ForwardingResponder {
 public:
  using ForwardingResponder::ForwardingResponder;
  void send(int status, const std::string& content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> headers) override;
};

// The output of one message: content blocks opened as the text arrives (thinking, then text, then
// tool uses), each with its events when streamed.
class MessagesBuilder : public OutputBuilder {
 public:
  MessagesBuilder(const ParsedRequest& request, const ServedModel& model, const MessagesRequest& r, std::string id);

  // message_start and a ping ("event: ...\ndata: {...}\n\n").
  std::string stream_start() override;
  std::string stream_events(size_t prompt, const RequestOutput& output) override;
  // The open block's content_block_stop, message_delta and message_stop, or (after `error`) an
  // error event.
  std::string stream_end(const ApiError* error) override;
  void accumulate(size_t prompt, const RequestOutput& output) override;
  std::string final_body() override;

  int64_t prompt_tokens() const override { return prompt_tokens_; }
  int64_t completion_tokens() const override { return completion_tokens_; }
  const std::string& last_finish_reason() const override { return finish_reason_; }

  // The message object as it stands.
  nlohmann::json message() const;

 private:
  struct Block {
    std::string type;  // "thinking", "text" or "tool_use"
    std::string text;  // thinking and text; a tool use's input as JSON text
    std::string id, name;
    size_t call_index = 0;
  };
  void event(const std::string& type, nlohmann::json fields);
  nlohmann::json block_json(const Block& b, bool streaming_start) const;
  // The open block if it is of `type` (not a tool use), else a new one, its content_block_start sent.
  Block& open(const std::string& type, std::string id = {}, std::string name = {});
  void close();
  void add(const CompletionDelta& d);

  const ParsedRequest& request_;
  const ServedModel& model_;
  std::vector<std::string> stop_sequences_;
  std::string id_;
  ChoiceParser parser_;
  std::vector<Block> blocks_;
  std::optional<size_t> open_;
  std::string events_;
  int64_t prompt_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  int64_t completion_tokens_ = 0;
  std::string finish_reason_;
  std::string stop_reason_;                  // Anthropic's, once finished
  std::optional<std::string> stop_sequence_;  // the one that ended it
  bool finished_ = false;
};

}  // namespace duet::server
