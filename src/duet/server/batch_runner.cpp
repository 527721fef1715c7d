#include "duet/server/batch_runner.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <istream>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <unordered_set>

#include <fmt/format.h>

#include "duet/core/ordered_json.h"

namespace duet::server {

using ojson = nlohmann::ordered_json;

std::string unique_id(const char* prefix) {
  static const uint64_t kProcessTag = std::random_device{}() * 0x9e3779b97f4a7c15ull ^ std::random_device{}();
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}{:016x}{:08x}", prefix, kProcessTag, counter.fetch_add(1) & 0xffffffffu);
}

bool batch_route(const std::string& url) {
  return url == "/v1/chat/completions" || url == "/v1/completions" || url == "/v1/embeddings" || url == "/v1/responses" ||
         url == "/v1/messages";
}

namespace {

using Clock = std::chrono::steady_clock;

std::string error_line(const ojson& custom_id, const std::string& code, const std::string& message) {
  ojson line;
  line["id"] = unique_id("batch_req_");
  line["custom_id"] = custom_id;
  line["response"] = nullptr;
  line["error"] = {{"code", code}, {"message", message}};
  return line.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

// One line read: a request to send, or (not a request) what is wrong with it.
struct Line {
  int64_t index = 0;
  ojson custom_id;
  std::optional<HttpRequest> request;
  std::string code, message;  // when it is not a request
};

// The line numbered `number` (from 1) as a request, or why it is not one. `seen` holds the
// custom_ids so far.
Line parse_line(const std::string& text, int64_t number, std::unordered_set<std::string>& seen,
                const std::string& endpoint, std::optional<int32_t> default_priority = std::nullopt) {
  Line line;
  auto refuse = [&](const std::string& code, const std::string& message) {
    line.code = code;
    line.message = fmt::format("line {}: {}", number, message);
    return line;
  };
  ojson v;
  try {
    v = parse_ordered_json(text);
  } catch (const std::exception& e) {
    return refuse("invalid_json", fmt::format("not JSON: {}", e.what()));
  }
  if (!v.is_object()) return refuse("invalid_request", "a request is an object with custom_id, method, url and body");
  if (v.contains("custom_id")) line.custom_id = v["custom_id"];
  if (!line.custom_id.is_string() || line.custom_id.get_ref<const std::string&>().empty()) {
    line.custom_id = nullptr;
    return refuse("invalid_request", "custom_id must be a non-empty string");
  }
  if (!seen.insert(line.custom_id.get<std::string>()).second) {
    return refuse("duplicate_custom_id", fmt::format("custom_id '{}' was used by an earlier line",
                                                      line.custom_id.get<std::string>()));
  }
  if (!v.contains("method") || !v["method"].is_string() || v["method"].get<std::string>() != "POST") {
    return refuse("invalid_request", "method must be \"POST\"");
  }
  const std::string url = v.contains("url") && v["url"].is_string() ? v["url"].get<std::string>() : std::string();
  if (!batch_route(url)) {
    return refuse("invalid_url", fmt::format("url '{}' is not one a batch runs (/v1/chat/completions, /v1/completions, "
                                             "/v1/embeddings, /v1/responses, /v1/messages)", url));
  }
  if (!endpoint.empty() && url != endpoint) {
    return refuse("invalid_url", fmt::format("url '{}' is not the batch's endpoint '{}'", url, endpoint));
  }
  if (!v.contains("body") || !v["body"].is_object()) return refuse("invalid_request", "body must be a JSON object");
  ojson& body = v["body"];
  if (body.contains("stream") && body["stream"] != false && !body["stream"].is_null()) {
    return refuse("invalid_request", "a batch does not stream: leave out 'stream' or set it to false");
  }
  if (body.contains("background") && body["background"] == true) {
    return refuse("invalid_request", "a batch does not run background responses: leave out 'background'");
  }
  if (default_priority && !body.contains("priority")) body["priority"] = *default_priority;
  HttpRequest& req = line.request.emplace();
  req.method = "POST";
  req.target = url;
  req.path = url;
  req.headers["content-type"] = "application/json";
  req.body = body.dump(-1, ' ', false, ojson::error_handler_t::replace);
  req.remote = "batch";
  req.internal = true;
  return line;
}

class Runner;

// The reply channel of one line's request: the answer goes back to the runner.
class BatchResponder : public Responder {
 public:
  BatchResponder(Runner* runner, int64_t index) : runner_(runner), index_(index) {}
  void send(int status, const std::string& content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> headers) override;
  // Lines with `stream` are refused before they are sent, so a stream here is a route that
  // streams unasked: its events are kept and answered as one text body.
  void start_stream(int status, const std::string& content_type,
                    std::vector<std::pair<std::string, std::string>> headers) override {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_status_ = status;
    stream_headers_ = std::move(headers);
    (void)content_type;
  }
  void write(std::string chunk) override {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_body_ += chunk;
  }
  void finish() override;
  // The batch goes away only when it is cancelled (go_away).
  void on_disconnect(std::function<void()> callback) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!gone_) {
        on_gone_ = std::move(callback);
        return;
      }
    }
    callback();
  }
  bool disconnected() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return gone_;
  }
  // The run was cancelled: what the handler registered with on_disconnect runs (now, or when it
  // registers).
  void go_away() {
    std::function<void()> callback;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gone_ = true;
      callback = std::move(on_gone_);
    }
    if (callback) callback();
  }

 private:
  Runner* runner_;
  int64_t index_;
  mutable std::mutex mutex_;
  int stream_status_ = 0;
  std::string stream_body_;
  std::vector<std::pair<std::string, std::string>> stream_headers_;
  bool gone_ = false;
  std::function<void()> on_gone_;
};

class Runner {
 public:
  Runner(std::istream& in, std::ostream& out, const HttpHandler& handler, const BatchRunOptions& options,
         const std::function<void(const BatchRunStats&)>& progress)
      : in_(in), out_(out), handler_(handler), options_(options), progress_(progress) {}

  BatchRunStats run();
  void answered(int64_t index, int status, const std::string& body,
                const std::vector<std::pair<std::string, std::string>>& headers);

 private:
  // The next request line of the input (blank lines skipped); nullopt at its end.
  std::optional<Line> read_line();
  bool interrupted() const { return options_.interrupt != nullptr && options_.interrupt->load(); }
  bool cancelled() const { return (options_.cancel != nullptr && options_.cancel->load()) || interrupted(); }

  std::istream& in_;
  std::ostream& out_;
  const HttpHandler& handler_;
  const BatchRunOptions options_;
  const std::function<void(const BatchRunStats&)>& progress_;
  int64_t line_number_ = 0;
  int64_t next_index_ = 0;
  std::unordered_set<std::string> seen_;

  struct Sent {
    ojson custom_id;
    std::weak_ptr<BatchResponder> responder;
  };
  struct Answer {
    bool failed = false;
    std::string line;
  };
  std::mutex mutex_;
  std::condition_variable changed_;
  BatchRunStats stats_;
  size_t in_flight_ = 0;
  std::map<int64_t, Answer> ready_;  // output lines not written yet
  std::map<int64_t, Sent> sent_;     // the requests in flight
};

void BatchResponder::send(int status, const std::string&, std::string body,
                          std::vector<std::pair<std::string, std::string>> headers) {
  runner_->answered(index_, status, body, headers);
}

void BatchResponder::finish() {
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  int status = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    status = stream_status_;
    body = std::move(stream_body_);
    headers = std::move(stream_headers_);
  }
  runner_->answered(index_, status, body, headers);
}

std::optional<Line> Runner::read_line() {
  std::string text;
  while (std::getline(in_, text)) {
    ++line_number_;
    const auto first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) continue;
    Line line = parse_line(text, line_number_, seen_, options_.endpoint, options_.default_priority);
    if (line.request && options_.skip != nullptr && options_.skip->count(line.custom_id.get<std::string>()) > 0) {
      continue;
    }
    line.index = next_index_++;
    return line;
  }
  return std::nullopt;
}

void Runner::answered(int64_t index, int status, const std::string& body,
                      const std::vector<std::pair<std::string, std::string>>& headers) {
  std::lock_guard<std::mutex> lock(mutex_);
  --in_flight_;
  auto it = sent_.find(index);
  std::string request_id;
  for (const auto& [name, value] : headers) {
    if (name.size() == 12 && std::equal(name.begin(), name.end(), "x-request-id",
                                        [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; })) {
      request_id = value;
    }
  }
  ojson reply;
  try {
    reply = parse_ordered_json(body);
  } catch (const std::exception&) {
    reply = body;  // not JSON (no route answers so): kept as text
  }
  const bool ok = status >= 200 && status < 300;
  if (ok && reply.is_object() && reply.contains("usage") && reply["usage"].is_object()) {
    const ojson& u = reply["usage"];
    auto count = [&](const char* a, const char* b) -> int64_t {
      for (const char* key : {a, b}) {
        if (u.contains(key) && u[key].is_number_integer()) return u[key].get<int64_t>();
      }
      return 0;
    };
    stats_.prompt_tokens += count("prompt_tokens", "input_tokens");
    stats_.completion_tokens += count("completion_tokens", "output_tokens");
  }
  ++(ok ? stats_.succeeded : stats_.failed);
  ojson line;
  line["id"] = request_id.empty() ? unique_id("batch_req_") : "batch_req_" + request_id;
  line["custom_id"] = it != sent_.end() ? it->second.custom_id : ojson(nullptr);
  line["response"] = {{"status_code", status}, {"request_id", request_id}, {"body", std::move(reply)}};
  line["error"] = nullptr;
  ready_[index] = {!ok, line.dump(-1, ' ', false, ojson::error_handler_t::replace)};
  if (it != sent_.end()) sent_.erase(it);
  changed_.notify_all();
}

BatchRunStats Runner::run() {
  const size_t most = std::max<size_t>(1, options_.max_in_flight);
  const size_t pending = options_.max_pending > 0 ? std::max(most, options_.max_pending) : 4 * most;
  std::ostream& errors = options_.errors != nullptr ? *options_.errors : out_;
  int64_t next_to_write = 0;
  std::optional<Line> next;
  bool eof = false;
  bool stopped = false;  // cancelled, and those in flight told so
  auto last_progress = Clock::now();
  for (;;) {
    if (!stopped && cancelled()) {
      // No more lines; those in flight are aborted by their handler and still answer.
      stopped = true;
      eof = true;
      next.reset();
      std::vector<std::shared_ptr<BatchResponder>> going;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto& [index, sent] : sent_) {
          if (auto r = sent.responder.lock()) going.push_back(std::move(r));
        }
      }
      for (auto& r : going) r->go_away();
    }
    if (!eof && !next) {
      next = read_line();
      eof = !next;
    }
    std::vector<Answer> lines;
    std::optional<HttpRequest> to_send;
    std::shared_ptr<BatchResponder> responder;
    bool done = false;
    BatchRunStats stats;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (next && !next->request) {
        // Not a request: answered as it is read.
        ++stats_.lines;
        ++stats_.failed;
        ready_[next->index] = {true, error_line(next->custom_id, next->code, next->message)};
        next.reset();
      }
      auto room = [&] { return in_flight_ < most && in_flight_ + ready_.size() < pending; };
      auto can_act = [&] {
        return ready_.count(next_to_write) > 0 || (room() && next) || (eof && !next && in_flight_ == 0) ||
               (!stopped && cancelled());
      };
      if (eof || next) {
        changed_.wait_for(lock, std::chrono::milliseconds(200), can_act);
      }
      for (auto it = ready_.find(next_to_write); it != ready_.end(); it = ready_.find(next_to_write)) {
        lines.push_back(std::move(it->second));
        ready_.erase(it);
        ++next_to_write;
      }
      if (room() && next && !cancelled()) {
        responder = std::make_shared<BatchResponder>(this, next->index);
        to_send = std::move(next->request);
        ++stats_.lines;
        sent_.emplace(next->index, Sent{std::move(next->custom_id), responder});
        next.reset();
        ++in_flight_;
      }
      done = eof && !next && in_flight_ == 0 && ready_.empty() && !responder;
      stats = stats_;
    }
    if (interrupted()) lines.clear();  // left for the next run
    for (const Answer& a : lines) (a.failed ? errors : out_) << a.line << '\n';
    if (!lines.empty()) {
      out_.flush();
      errors.flush();
    }
    if (responder) handler_(std::move(*to_send), std::move(responder));
    if (progress_ && options_.progress_seconds > 0 && Clock::now() - last_progress >=
                                                          std::chrono::duration<double>(options_.progress_seconds)) {
      last_progress = Clock::now();
      progress_(stats);
    }
    if (done) break;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (progress_) progress_(stats_);
  return stats_;
}

}  // namespace

std::vector<BatchLineError> validate_batch_lines(std::istream& in, const std::string& endpoint, size_t most,
                                                 int64_t* num_requests) {
  std::vector<BatchLineError> errors;
  std::unordered_set<std::string> seen;
  std::string text;
  int64_t number = 0, requests = 0;
  while (std::getline(in, text)) {
    ++number;
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    ++requests;
    Line line = parse_line(text, number, seen, endpoint);
    if (!line.request && errors.size() < most) errors.push_back({number, line.code, line.message});
  }
  if (num_requests != nullptr) *num_requests = requests;
  return errors;
}

BatchRunStats run_batch_lines(std::istream& in, std::ostream& out, const HttpHandler& handler,
                              const BatchRunOptions& options, const std::function<void(const BatchRunStats&)>& progress) {
  Runner runner(in, out, handler, options, progress);
  return runner.run();
}

}  // namespace duet::server
