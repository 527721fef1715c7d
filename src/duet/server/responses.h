// OpenAI's Responses API (/v1/responses). A request becomes the chat request it means (the
// instructions, the conversation of an earlier response, this turn's input items, function tools
// and the text format), served by the same engine path as /v1/chat/completions; the output comes
// back as typed items (reasoning, a message, function calls) in the response object or as its
// stream of typed events. Responses are kept (StoredResponse, in a ResponseStore:
// response_store.h) for previous_response_id, GET and background runs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "duet/server/http_server.h"
#include "duet/server/openai.h"

namespace duet::server {

// A response as kept: the object as returned (or, while it runs in the background, a way to read
// it now and to cancel it), this turn's input items, and the conversation it ends (chat messages
// without the instructions, which a later turn does not inherit).
struct StoredResponse {
  std::string id;
  nlohmann::json input_items;
  nlohmann::json messages;  // set once it finished

  // The response object now; safe from any thread.
  nlohmann::json response() const;
  // Finished: the final object and the conversation (what a later turn continues).
  void finish(nlohmann::json response, nlohmann::json conversation);
  bool running() const;
  // While it runs: how to read it and how to stop it (both called without the store's lock).
  void set_running(std::function<nlohmann::json()> snapshot, std::function<void()> cancel);
  // Asks a running response to stop; false when it already finished.
  bool cancel();
  // Deleted (DELETE /v1/responses/{id}): a run that finishes later is not kept again.
  void mark_deleted();
  bool deleted() const;
  size_t bytes() const;

  // A background run with `stream`: its events are kept as they are sent (GET
  // /v1/responses/{id}?stream=true replays them and follows the rest). Called once, before the
  // first event.
  void keep_events();
  bool keeps_events() const;
  // The events in `chunk` (whole "event: ...\ndata: {...}\n\n" texts) are kept and passed on to
  // those following the run.
  void record_events(const std::string& chunk);
  // The run ended: the followers' streams finish.
  void end_events();
  // Writes the kept events numbered after `starting_after` (-1: all) to `res`, whose stream has
  // started, then the later ones as they come, and finishes it when the run ends. False, writing
  // nothing, when this response keeps no events.
  bool follow_events(int64_t starting_after, const std::shared_ptr<Responder>& res);

 private:
  mutable std::mutex mutex_;
  nlohmann::json response_;
  std::function<nlohmann::json()> snapshot_;
  std::function<void()> cancel_;
  size_t bytes_ = 0;
  bool deleted_ = false;
  bool keeps_events_ = false;
  bool events_ended_ = false;
  std::vector<std::pair<int64_t, std::string>> events_;  // (sequence_number, text), in order
  size_t event_bytes_ = 0;
  std::vector<std::pair<int64_t, std::shared_ptr<Responder>>> followers_;  // (starting_after, stream)
};

// An earlier item by its id (an item_reference's), or null.
using ItemLookup = std::function<const nlohmann::json*(const std::string&)>;

// Input items (a string, or a list of items) as chat messages, appended to `messages`, and as
// items with ids, appended to `items`; item references are looked up in `lookup`. Throws ApiError
// (400, param input) naming the item.
void read_input_items(const nlohmann::json& input, nlohmann::json& messages, nlohmann::json& items,
                      const ItemLookup& lookup = {});

// A /v1/responses request, read.
struct ResponsesRequest {
  nlohmann::ordered_json chat_body;  // the /v1/chat/completions body it means
  nlohmann::json input_items;        // this turn's input, as items with ids (GET .../input_items)
  nlohmann::json conversation;       // the earlier turns and this input, as chat messages
  nlohmann::json echo;               // the request's settings the response object repeats
  bool stream = false;
  bool store = true;
  bool background = false;
  bool truncate = false;             // truncation "auto": drop the oldest turns past the context
  std::string conversation_id;       // a conversation it continues and adds its items to
};

// Reads a request body (already parsed by parse_json_body from `body_text`). `previous` finds an
// earlier response (nullptr when none is kept); `conversation` gives a conversation's items (and
// throws ApiError 404 for one that is not kept). Throws ApiError naming the Responses parameter.
ResponsesRequest parse_responses_request(
    const nlohmann::json& body, const std::string& body_text,
    const std::function<std::shared_ptr<StoredResponse>(const std::string&)>& previous,
    const std::function<nlohmann::json(const std::string&)>& conversation = {});

// The chat request of `r` parsed for the model: the errors of the chat parser name the Responses
// parameters (input, max_output_tokens, text). With truncation "auto", the oldest messages of the
// conversation go (whole turns) until the prompt fits.
ParsedRequest parse_responses_chat(ResponsesRequest& r, const ServedModel& model);

// The output of one response: items opened as the text arrives (reasoning, then the message, then
// function calls), each with its own events.
class ResponsesBuilder : public OutputBuilder {
 public:
  ResponsesBuilder(const ParsedRequest& request, const ServedModel& model, const ResponsesRequest& r, std::string id,
                   int64_t created);

  // response.created and response.in_progress ("event: ...\ndata: {...}\n\n").
  std::string stream_start() override;
  std::string stream_events(size_t prompt, const RequestOutput& output) override;
  // The items' closing events and response.completed, .incomplete or (after `error`) .failed.
  std::string stream_end(const ApiError* error) override;
  void accumulate(size_t prompt, const RequestOutput& output) override;
  std::string final_body() override;

  int64_t prompt_tokens() const override { return prompt_tokens_; }
  int64_t completion_tokens() const override { return completion_tokens_; }
  const std::string& last_finish_reason() const override { return finish_reason_; }

  // The response object as it stands; `error` marks it failed.
  nlohmann::json response(const ApiError* error = nullptr) const;
  // The output as the assistant's chat message (its text and calls; reasoning left out, as
  // DeepSeek's templates leave it out of earlier turns).
  nlohmann::json output_message() const;
  // Records a failure (a non-streamed request, a background run).
  void fail(const ApiError& error) { error_ = error; }

 private:
  struct Item {
    std::string type;  // "reasoning", "message" or "function_call"
    std::string id;
    std::string text;  // reasoning and message
    nlohmann::json logprobs = nlohmann::json::array();
    size_t call_index = 0;  // function_call
    std::string call_id, name, arguments;
    std::string status = "in_progress";
  };

  // Adds an event of `type` (with its sequence number) to events_.
  void event(const std::string& type, nlohmann::json fields);
  nlohmann::json item_json(const Item& item) const;
  // Closes the open item (its done events); `status` completed or incomplete.
  void close(const std::string& status);
  // The open item of `type`, opening one (and closing another) when needed.
  Item& open(const std::string& type);
  void add(const CompletionDelta& d);
  std::string status() const;

  const ParsedRequest& request_;
  const ServedModel& model_;
  const nlohmann::json echo_;
  std::string id_;
  int64_t created_;
  std::vector<Item> items_;
  std::optional<size_t> open_;  // the item being written
  std::string events_;          // events made since they were last taken
  int64_t sequence_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  int64_t completion_tokens_ = 0;
  int64_t reasoning_tokens_ = 0;
  std::string finish_reason_;
  bool started_ = false;  // an output came (a background response is queued until then)
  bool finished_ = false;
  std::optional<ApiError> error_;
  std::vector<SampledToken> pending_logprobs_;  // tokens whose text the parser holds back
  ChoiceParser parser_;
};

}  // namespace duet::server
