// The client side of `duet bench serve`: sends streaming completion requests to any
// OpenAI-compatible server (duet's, llama.cpp's llama-server, vLLM) and times every token the way
// vLLM's serving benchmark does. All connections live on one thread with one io_context (async
// Beast, C++20 coroutines); each of the `max_concurrency` workers keeps one keep-alive connection
// and sends its requests one after the other, so thousands of streams need thousands of sockets
// and no threads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace duet::server {

// "http[s]://host[:port][/prefix]".
struct BaseUrl {
  bool tls = false;  // https
  std::string host;
  uint16_t port = 80;  // 443 for https
  std::string path_prefix;  // without a trailing '/', empty for none
};
BaseUrl parse_base_url(const std::string& url);

// Incremental parser of a text/event-stream body: feed it the bytes as they arrive, split
// anywhere (inside a line, inside "\r\n"), and it returns each event once its blank line came.
// Comments (": keep-alive") are skipped; multi-line data is joined with '\n'. llama.cpp's
// non-standard "error: {...}" line becomes an event of type "error".
class SseParser {
 public:
  struct Event {
    std::string type = "message";  // from "event:", or "error"
    std::string data;
  };

  void feed(std::string_view bytes, std::vector<Event>& events);
  // The body ended: an event that still lacks its blank line is returned too.
  void finish(std::vector<Event>& events);

 private:
  void line(std::string_view text, std::vector<Event>& events);
  void dispatch(std::vector<Event>& events);

  std::string line_;  // the current line so far
  bool after_cr_ = false;
  bool has_data_ = false;
  Event event_;
};

// One request: its JSON body, the fewest output tokens that count as success (max_tokens with
// ignore_eos; 0 for no check), and whether a reply without any choice chunk fails (as in vLLM:
// no TTFT).
struct BenchRequest {
  std::string body;
  int64_t min_output_tokens = 0;
  bool require_text = true;
};

// What happened to one request. Times are seconds; `start` is measured from the benchmark's
// start, the others from `start`.
struct BenchResult {
  bool success = false;
  std::string error;            // why it failed
  double start = 0.0;           // when it was sent (connect included, as in vLLM)
  double ttft = 0.0;            // to the first chunk with a choice (a token, text or not)
  double latency = 0.0;         // to "data: [DONE]" (or the end of the body without it)
  std::vector<double> itl;      // between consecutive chunks with a choice
  int64_t prompt_tokens = -1;   // usage.prompt_tokens, -1 when the server sent no usage
  int64_t output_tokens = 0;    // usage.completion_tokens, else the number of choice chunks
  bool usage_reported = false;
  int64_t num_text_chunks = 0;  // choice chunks with non-empty text
};

struct BenchClientConfig {
  BaseUrl url;
  std::string endpoint = "/v1/completions";
  std::string api_key;             // sent as "Authorization: Bearer KEY" when set
  int64_t max_concurrency = 0;     // requests in flight at most; 0: no limit
  double timeout_seconds = 600.0;  // a connection silent this long fails its request
  std::string ca_file;             // https: CAs (PEM) trusted besides the system's
};

struct BenchRun {
  std::vector<BenchResult> results;  // in the order of the requests
  double duration_seconds = 0.0;     // from the start to the end of the last request
};

// One GET of url.path_prefix + path (http_call with 5 s of stall; over TLS for https, trusting the
// system's CAs and those of ca_file). Returns the body of a 200 answer, or nullopt for anything
// else (no server, another status, a certificate not trusted).
std::optional<std::string> http_get(const BaseUrl& url, const std::string& path, const std::string& api_key = {},
                                    const std::string& ca_file = {});

// An HTTP exchange's answer.
struct HttpReply {
  int status = 0;
  std::string body;
};

// One request of `method` ("GET" or "PUT", with `body`) to url.path_prefix + path ("/" when both
// are empty), over TLS for https (the system's CAs and those of ca_file). A read or write that
// makes no progress for `stall_seconds` fails; the answer's body has no size limit; `api_key`, when
// set, goes as "Authorization: Bearer KEY". Throws
// kUnavailable naming the URL when the host does not resolve, connect or answer.
HttpReply http_call(const std::string& method, const BaseUrl& url, const std::string& path, std::string body = {},
                    double stall_seconds = 60.0, const std::string& ca_file = {}, const std::string& api_key = {});

// The energy a server reports: the sum of duet:energy_joules_total over its devices in a
// /metrics text, or nullopt when the text has no such metric (the machine exposes no counter, or
// the server is not duet).
std::optional<double> energy_joules_in_metrics(std::string_view metrics_text);

// Sends every request, request i not before send_times[i] seconds after the start (and only
// when fewer than max_concurrency are in flight), and waits for all of them. `on_done(n)` runs on
// the I/O thread after the n-th request finished. Throws kUnavailable when the host does not
// resolve and kResourceExhausted when the open-file limit is below the concurrency.
BenchRun run_bench_requests(const BenchClientConfig& config, const std::vector<BenchRequest>& requests,
                            const std::vector<double>& send_times,
                            const std::function<void(size_t)>& on_done = {});

}  // namespace duet::server
