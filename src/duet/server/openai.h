// The OpenAI protocol: request bodies of /v1/completions and /v1/chat/completions turned into
// engine requests (with errors that name the parameter), and engine outputs turned into the
// response and stream-chunk shapes vLLM returns.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "duet/engine/request.h"
#include "duet/engine/sampling_params.h"
#include "duet/grammar/structured_output.h"
#include "duet/server/reasoning_parser.h"
#include "duet/server/tool_calls.h"
#include "duet/server/tool_parser.h"
#include "duet/tokenizer/chat_template.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet::server {

// An error answered with OpenAI's body {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {});
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string type_;
  std::string param_;
  std::string code_;
};

// The error type OpenAI uses for a status: 400/404/413/422 invalid_request_error,
// 401 authentication_error, 429 rate_limit_error, 503 service_unavailable_error, else server_error.
std::string error_type_for(int status);
std::string error_body(const ApiError& e);
// A duet::Error from validation or the engine as an API error (400 for invalid arguments, with
// the parameter named in the message as `param`).
ApiError api_error_from(const std::exception& e);

// The most levels of nesting a request body may have (the body object is level 1). Request fields
// are copied and converted recursively (chat template variables, messages), so deeper bodies are
// refused when they are parsed.
constexpr int kMaxJsonDepth = 64;
// Parses a request body (nlohmann's parser itself does not recurse). Throws ApiError 400 for
// text that is not JSON, and for nesting deeper than kMaxJsonDepth, naming where it goes too deep
// (`param` is the top-level field).
nlohmann::json parse_json_body(const std::string& text);
// body[key] as a bool: `fallback` when absent or null, else a 400 naming the key unless a boolean.
bool get_bool(const nlohmann::json& body, const char* key, bool fallback);

// What the protocol layer needs to know about the served model.
struct ServedModel {
  std::string name;
  int32_t max_model_len = 0;
  int32_t vocab_size = 0;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  std::string bos_text;
  std::string eos_text;
  SamplingParams defaults;       // from the model's generation config, if any
  bool reasoning_parser = false;  // --reasoning-parser deepseek_r1
  grammar::GrammarCache* grammars = nullptr;   // compiled structured-output constraints
  std::optional<ToolCallFormat> tool_parser;   // --tool-call-parser
  bool auto_tool_choice = false;               // --enable-auto-tool-choice
  // The most prompts one completion request may list (each is an engine request that waits on its
  // own: --max-queued-requests); 0 for no limit.
  int64_t max_prompts = 0;
};

// How a chat request's output becomes tool calls.
enum class ToolOutput {
  kNone,       // plain content
  kMarkup,     // DeepSeek's markup, read by the tool-call parser (auto, or forced in markup)
  kArguments,  // the output is the named function's arguments (forced, no parser)
  kList,       // the output is a JSON list of {"name", "parameters"} (required, no parser)
};

struct ParsedRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  int32_t priority = 0;
  std::vector<std::vector<int32_t>> prompts;  // one engine request each
  std::vector<std::string> echo_texts;        // prepended to each prompt's outputs when echo
  SamplingParams params;
  bool starts_in_reasoning = false;            // chat: the rendered prompt ends inside <think>
  ToolOutput tool_output = ToolOutput::kNone;
  std::string tool_name;                       // kArguments: the function
};

// Parses and validates a request body. Throws ApiError (400 naming the parameter, 404 for an
// unknown model).
ParsedRequest parse_request(const std::string& body, const ServedModel& model, bool chat);
// The same over a body already parsed (by parse_json_body) from `body_text` (read again where key
// order matters: schemas).
ParsedRequest parse_request(const nlohmann::json& body, const std::string& body_text, const ServedModel& model,
                            bool chat);

// Turns the outputs of one HTTP request's engine requests (one per prompt) into the response.
class ResponseBuilder {
 public:
  ResponseBuilder(const ParsedRequest& request, const ServedModel& model, std::string id, int64_t created);

  // Streaming: the SSE events ("data: {...}\n\n") for one engine output of prompt `prompt`.
  std::string stream_events(size_t prompt, const RequestOutput& output);
  // The usage chunk (when asked for) and "data: [DONE]".
  std::string stream_end();
  // An error event in the middle of a stream.
  static std::string stream_error(const ApiError& e);

  // Non-streaming: collects outputs, then renders the whole response.
  void accumulate(size_t prompt, const RequestOutput& output);
  std::string final_body();

  int64_t prompt_tokens() const;
  int64_t completion_tokens() const { return completion_tokens_; }
  const std::string& last_finish_reason() const { return last_finish_reason_; }

 private:
  struct Choice {
    std::string text;
    std::string reasoning;
    std::vector<int32_t> token_ids;
    std::vector<SampledToken> logprobs;
    std::string finish_reason;
    nlohmann::json stop_reason;
    bool started = false;  // streaming: the first chunk (role / echo) went out
    std::optional<ReasoningParser> reasoner;
    std::optional<ToolCallParser> tool_parser;  // kMarkup
    std::vector<std::string> tool_ids;          // one per call seen
    std::string tool_text;                      // kList: the whole output
  };
  struct ToolDelta {
    std::string content;
    std::vector<ToolCallParser::CallDelta> calls;
  };

  // Content (after reasoning is split off) as content and tool-call deltas; `finishing` releases
  // whatever the parser held back.
  ToolDelta tool_delta(Choice& c, const std::string& content, bool finishing);
  nlohmann::json tool_calls_json(Choice& c, const std::vector<ToolCallParser::CallDelta>& calls, bool streaming);

  Choice& choice(size_t prompt, int32_t index);
  size_t choice_index(size_t prompt, int32_t index) const;
  nlohmann::json chunk(const nlohmann::json& choices) const;
  nlohmann::json logprobs_json(const std::vector<SampledToken>& lps, size_t text_offset) const;
  nlohmann::json stop_reason_json(const CompletionDelta& d) const;
  nlohmann::json usage() const;

  const ParsedRequest& request_;
  const ServedModel& model_;
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;
  std::vector<int32_t> prompt_lengths_;
  int64_t completion_tokens_ = 0;
  std::string last_finish_reason_;
};

}  // namespace duet::server
