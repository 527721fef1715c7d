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
// OpenAI's metadata (responses, conversations, batches): at most 16 string values (keys up to 64
// characters, values up to 512); throws ApiError (400, param metadata) otherwise. Null passes.
void check_metadata(const nlohmann::json& metadata);
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
// A reply's JSON text (invalid UTF-8 replaced, as every reply writes it).
std::string json_text(const nlohmann::json& j);
// body[key], or a null value when it is absent.
const nlohmann::json& json_field(const nlohmann::json& body, const char* key);
// body[key] as a bool: `fallback` when absent or null, else a 400 naming the key unless a boolean.
bool get_bool(const nlohmann::json& body, const char* key, bool fallback);


// What the protocol layer needs to know about the served model.
struct ServedModel {
  std::string name;
  int32_t max_model_len = 0;
  int32_t vocab_size = 0;
  int32_t max_logprobs = SamplingParams::kMaxLogprobs;  // --max-logprobs
  int32_t hidden_size = 0;  // an embedding's length
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
  // The LoRA adapter requests under this name run with (the engine's 1-based index; 0: none).
  int32_t lora_adapter = 0;
};

// A prompt given as token ids: a list of integers within the vocabulary; a 400 naming `param`.
std::vector<int32_t> token_list(const nlohmann::json& v, const ServedModel& model, const char* param);
// The prompt ids of chat `messages` rendered by the model's template as /v1/chat/completions
// renders them (with `template_kwargs`, null for none; `continue_final_message` as vLLM's);
// errors name `messages`.
std::vector<int32_t> chat_prompt_ids(const nlohmann::json& messages, bool add_generation_prompt,
                                     const nlohmann::json& template_kwargs, const ServedModel& model,
                                     bool continue_final_message = false);
// vLLM's truncate_prompt_tokens: how many of a prompt's last tokens to keep (k; -1 for the
// context length), 0 when absent. A 400 naming it for anything else.
int64_t truncate_prompt_tokens(const nlohmann::json& body, const ServedModel& model);

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
  bool continuous_usage = false;  // stream_options.continuous_usage_stats (vLLM): usage in every chunk
  bool echo = false;
  bool tokens_as_ids = false;  // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N"
  bool return_token_ids = false;  // vLLM's return_token_ids: prompt_token_ids and token_ids in the reply
  // A completion with echo and logprobs: the logprobs cover the prompt's tokens first (OpenAI's
  // legacy scoring, as lm-evaluation-harness asks), from the engine's prompt logprobs.
  bool echo_logprobs = false;
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

// One choice's generated text read as it arrives: the reasoning split off (--reasoning-parser),
// then the rest read for tool calls as the request asks (DeepSeek's markup, a forced function's
// arguments, a forced list of calls).
class ChoiceParser {
 public:
  ChoiceParser(const ParsedRequest& request, const ServedModel& model);

  struct Delta {
    std::string reasoning;
    std::string content;
    std::vector<ToolCallParser::CallDelta> calls;  // consecutive pieces of one call joined
    bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
  };
  // The next piece of generated text; `finishing` (the last piece) releases what was held back.
  Delta push(const std::string& text, bool finishing);
  // Whether a parser reads the text (a piece may then show nothing yet).
  bool parses() const { return reasoner_.has_value() || tool_output_ != ToolOutput::kNone; }
  bool reasons() const { return reasoner_.has_value(); }
  // The id of call `index` ("call_" and 24 hex digits), made when first asked for.
  const std::string& call_id(size_t index);
  size_t num_calls() const { return call_ids_.size(); }

 private:
  ToolOutput tool_output_;
  std::string tool_name_;
  std::optional<ReasoningParser> reasoner_;
  std::optional<ToolCallParser> tool_parser_;  // kMarkup
  std::vector<std::string> call_ids_;
  std::string tool_text_;  // kArguments and kList: the output so far
};

// What the engine outputs of one HTTP request become on the wire.
class OutputBuilder {
 public:
  virtual ~OutputBuilder() = default;
  // Streaming: the events that open the stream, before any output.
  virtual std::string stream_start() { return {}; }
  // Streaming: the events for one engine output of prompt `prompt`.
  virtual std::string stream_events(size_t prompt, const RequestOutput& output) = 0;
  // The events that end a stream; `error` when the request failed on the way.
  virtual std::string stream_end(const ApiError* error) = 0;
  // Non-streaming: collects outputs, then renders the whole response.
  virtual void accumulate(size_t prompt, const RequestOutput& output) = 0;
  virtual std::string final_body() = 0;
  // Non-streaming, once every output came: why the response cannot be given (nothing by default).
  virtual std::optional<ApiError> failure() const { return std::nullopt; }

  virtual int64_t prompt_tokens() const = 0;
  virtual int64_t completion_tokens() const = 0;
  virtual const std::string& last_finish_reason() const = 0;
};

// /v1/completions and /v1/chat/completions: the response and stream-chunk shapes vLLM returns.
class ResponseBuilder : public OutputBuilder {
 public:
  ResponseBuilder(const ParsedRequest& request, const ServedModel& model, std::string id, int64_t created);

  // "data: {...}\n\n" events.
  std::string stream_events(size_t prompt, const RequestOutput& output) override;
  // An error event if `error`, the usage chunk (when asked for) and "data: [DONE]".
  std::string stream_end(const ApiError* error) override;
  void accumulate(size_t prompt, const RequestOutput& output) override;
  std::string final_body() override;

  int64_t prompt_tokens() const override;
  int64_t completion_tokens() const override { return completion_tokens_; }
  const std::string& last_finish_reason() const override { return last_finish_reason_; }

 private:
  struct Choice {
    explicit Choice(ChoiceParser p) : parser(std::move(p)) {}
    std::string text;
    std::vector<int32_t> token_ids;
    std::vector<SampledToken> logprobs;
    std::string finish_reason;
    nlohmann::json stop_reason;
    bool started = false;  // streaming: the first chunk (role / echo) went out
    bool prompt_ids_sent = false;  // streaming with return_token_ids: the prompt's ids went out
    bool prompt_logprobs_sent = false;  // streaming: the prompt's logprobs went out
    ChoiceParser parser;
  };

  nlohmann::json tool_calls_json(Choice& c, const std::vector<ToolCallParser::CallDelta>& calls, bool streaming);
  Choice& choice(size_t prompt, int32_t index);
  size_t choice_index(size_t prompt, int32_t index) const;
  nlohmann::json chunk(const nlohmann::json& choices) const;
  nlohmann::json stop_reason_json(const CompletionDelta& d) const;
  nlohmann::json logprobs_json(const std::vector<SampledToken>& lps, size_t text_offset,
                               const std::vector<PromptLogprob>* prompt = nullptr, size_t prompt_index = 0) const;
  nlohmann::json prompt_logprobs_json(size_t prompt) const;
  void keep_prompt_logprobs(size_t prompt, const RequestOutput& output);
  nlohmann::json usage() const;

  const ParsedRequest& request_;
  const ServedModel& model_;
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;
  std::vector<int32_t> prompt_lengths_;
  std::vector<int32_t> cached_lengths_;  // each prompt's tokens found in the prefix cache
  std::vector<std::vector<PromptLogprob>> prompt_logprobs_;  // each prompt's, once the engine gave them
  void count_cached(size_t prompt, const RequestOutput& output);
  int64_t completion_tokens_ = 0;
  std::string last_finish_reason_;
};

// Chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs"}...]}'s list.
nlohmann::json chat_logprobs(const Tokenizer& tokenizer, const std::vector<SampledToken>& logprobs,
                             bool tokens_as_ids = false);
// An OpenAI error body as a stream event ("data: {...}\n\n").
std::string stream_error_event(const ApiError& e);

}  // namespace duet::server
