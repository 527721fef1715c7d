// Batch files (`duet run-batch`, and the server's /v1/batches through batches.h): OpenAI's batch
// file format (one JSON request a line: custom_id, method, url, body) run through the server's own
// request handler, in process, without a socket. Each line becomes the HttpRequest a client would
// have sent (marked `internal`); its reply becomes one output line, in the input's order:
// {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}.
// A line that is not a request (bad JSON, a missing field, a route or method a batch does not run,
// a repeated custom_id, `stream`) gets `response: null` and `error: {code, message}` instead.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "duet/server/http_server.h"

namespace duet::server {

struct BatchRunOptions {
  size_t max_in_flight = 512;  // requests handed to the handler and not answered yet
  // Requests in flight plus answers held back for an earlier line still running: no more lines
  // are read while this many wait (0: 4 x max_in_flight), so that one long request early in a
  // large file does not leave every later answer in memory.
  size_t max_pending = 0;
  // When set, every line's url must be this route (a batch made for one endpoint).
  std::string endpoint;
  // When set, the lines of requests that failed go here and only the others to `out` (OpenAI's
  // output and error files); each file keeps the input's order.
  std::ostream* errors = nullptr;
  // When set and it becomes true: no more lines are sent, and those in flight are told their
  // client went away (the server aborts them); their answers, and the lines already read, are
  // still written. Lines not sent are left out.
  const std::atomic<bool>* cancel = nullptr;
  // When set and it becomes true: as `cancel`, but nothing more is written; the lines not written
  // are left for a later run to send (a server stopping with its batches kept in a folder).
  const std::atomic<bool>* interrupt = nullptr;
  // When set: the lines whose custom_id is here are not sent, written or counted (a batch going on
  // where an earlier run stopped; their answers are already written).
  const std::unordered_set<std::string>* skip = nullptr;
  // When set, a line whose body names no `priority` gets this one.
  std::optional<int32_t> default_priority;
  double progress_seconds = 5.0;  // how often `progress` is called while requests run (0: only at the end)
};

struct BatchRunStats {
  int64_t lines = 0;      // requests read (blank lines not counted)
  int64_t succeeded = 0;  // answered 2xx
  int64_t failed = 0;     // answered otherwise, or not a request
  int64_t prompt_tokens = 0;      // from the replies' usage
  int64_t completion_tokens = 0;
};

// PREFIX and 24 hex digits: a random tag of this process and a counter (batch_req_..., file-...,
// batch_...).
std::string unique_id(const char* prefix);

// The routes a batch line may name (POST only): chat, completions, embeddings, responses and
// Anthropic's messages.
bool batch_route(const std::string& url);

// What is wrong with one line of a batch file: its line number (from 1), an error code
// (invalid_json, invalid_request, invalid_url, duplicate_custom_id) and a message.
struct BatchLineError {
  int64_t line = 0;
  std::string code;
  std::string message;
};

// Every line of `in` that is not a request run_batch_lines would send (with `endpoint` as in
// BatchRunOptions), up to `most` of them; `num_requests` gets the number of non-blank lines.
std::vector<BatchLineError> validate_batch_lines(std::istream& in, const std::string& endpoint, size_t most,
                                                 int64_t* num_requests = nullptr);

// Reads `in` line by line, hands each request to `handler` (at most max_in_flight unanswered at
// once: the handler's queue must admit that many), and writes the output lines to `out` in the
// input's order as soon as each is known. Whatever the handler answers (a 4xx, a 503) is the line's
// answer. Returns when every line is answered; `progress` (optional) sees the counts so far.
BatchRunStats run_batch_lines(std::istream& in, std::ostream& out, const HttpHandler& handler,
                              const BatchRunOptions& options = {},
                              const std::function<void(const BatchRunStats&)>& progress = {});

}  // namespace duet::server
