#include "duet/server/api_server.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/core/energy.h"
#include "duet/core/error.h"
#include "duet/core/log.h"
#include "duet/engine/generation_config.h"
#include "duet/server/console_assets.h"
#include "duet/server/engine_service.h"
#include "duet/server/http_server.h"
#include "duet/server/metrics_text.h"
#include "duet/server/openai.h"

namespace duet::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string random_hex(size_t bytes) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string out;
  while (out.size() < 2 * bytes) out += fmt::format("{:016x}", rng());
  return out.substr(0, 2 * bytes);
}

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ApiError api_error_from_output(const RequestOutput& o) {
  switch (o.error_code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kResourceExhausted: return ApiError(400, o.error);
    case ErrorCode::kUnavailable: return ApiError(503, o.error);
    default: return ApiError(500, o.error);
  }
}

// The per-request bookkeeping of one completion or chat request; sinks run on the engine
// thread, the responder posts to the connection.
struct CompletionCall {
  std::mutex mutex;
  ParsedRequest parsed;
  std::unique_ptr<ResponseBuilder> builder;
  std::shared_ptr<Responder> responder;
  std::string request_id;
  std::string path;
  std::string remote;
  size_t remaining = 0;
  std::optional<ApiError> error;
  Clock::time_point start;
  std::optional<Clock::time_point> first_token;
  double queue_seconds = 0.0;
};

class ApiServer {
 public:
  explicit ApiServer(const ServerConfig& config) : config_(config) {}

  void handle(HttpRequest&& req, std::shared_ptr<Responder> res);

  // Called once the model is loaded.
  void set_ready(std::shared_ptr<EngineService> service, std::unique_ptr<ChatTemplate> chat_template) {
    SamplingParams defaults = model_sampling_defaults(service->engine().file());
    std::lock_guard<std::mutex> lock(mutex_);
    service_ = std::move(service);
    chat_template_ = std::move(chat_template);
    const LLMEngine& engine = service_->engine();
    model_.defaults = std::move(defaults);
    const Tokenizer& tok = engine.tokenizer();
    model_.name = served_name();
    model_.max_model_len = engine.max_model_len();
    model_.vocab_size = static_cast<int32_t>(engine.model_config().num_vocab);
    model_.tokenizer = &tok;
    model_.chat_template = chat_template_.get();
    model_.bos_text = tok.bos_id() >= 0 ? tok.token_text(tok.bos_id()) : std::string();
    model_.eos_text = tok.eos_id() >= 0 ? tok.token_text(tok.eos_id()) : std::string();
    model_.reasoning_parser = config_.reasoning_parser == "deepseek_r1";
    ready_ = true;
  }
  void set_load_error(const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    load_error_ = message;
  }
  std::string served_name() const {
    if (!config_.served_model_name.empty()) return config_.served_model_name;
    // The file's name, or the folder's ("models/DeepSeek-V2-Lite/" serves as DeepSeek-V2-Lite).
    const std::filesystem::path model = std::filesystem::path(config_.model).lexically_normal();
    return (model.has_filename() ? model : model.parent_path()).filename().string();
  }

 private:
  void send_json(const std::shared_ptr<Responder>& res, int status, const json& body, const std::string& rid,
                 std::vector<std::pair<std::string, std::string>> headers = {}) {
    headers.emplace_back("X-Request-Id", rid);
    res->send(status, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace), std::move(headers));
  }
  void send_error(const std::shared_ptr<Responder>& res, const ApiError& e, const std::string& rid,
                  std::vector<std::pair<std::string, std::string>> headers = {}) {
    headers.emplace_back("X-Request-Id", rid);
    res->send(e.status(), "application/json", error_body(e), std::move(headers));
  }
  void access_log(const HttpRequest& req, int status, const std::string& rid, Clock::time_point start,
                  json extra = json::object()) {
    if (req.path == "/health" || req.path == "/metrics") return;
    json fields = {{"request_id", rid},
                   {"method", req.method},
                   {"path", req.path},
                   {"status", status},
                   {"client", req.remote},
                   {"total_time", seconds_between(start, Clock::now())}};
    for (auto it = extra.begin(); it != extra.end(); ++it) fields[it.key()] = it.value();
    log_record("request", fields);
  }
  bool authorized(const HttpRequest& req) const {
    if (config_.api_keys.empty()) return true;
    const std::string auth = req.header("authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) != 0) return false;
    const std::string key = auth.substr(prefix.size());
    return std::find(config_.api_keys.begin(), config_.api_keys.end(), key) != config_.api_keys.end();
  }
  std::shared_ptr<EngineService> service() {
    std::lock_guard<std::mutex> lock(mutex_);
    return service_;
  }

  void completions(HttpRequest&& req, std::shared_ptr<Responder> res, bool chat, const std::string& rid,
                   Clock::time_point start);
  json tokenize(const HttpRequest& req);
  json detokenize(const HttpRequest& req);
  std::string metrics();

  const ServerConfig& config_;
  std::mutex mutex_;
  std::atomic<bool> ready_{false};
  std::string load_error_;
  std::shared_ptr<EngineService> service_;
  std::unique_ptr<ChatTemplate> chat_template_;
  ServedModel model_;
  std::atomic<int64_t> requests_total_{0};
  std::atomic<int64_t> requests_failed_{0};
  std::mutex utilization_mutex_;
  Clock::time_point last_scrape_ = Clock::now();
  double last_busy_ = 0.0;
  double utilization_ = 0.0;
  EnergyMeter energy_;
};

void ApiServer::handle(HttpRequest&& req, std::shared_ptr<Responder> res) {
  const auto start = Clock::now();
  std::string rid = req.header("x-request-id");
  if (rid.empty() || rid.size() > 128) rid = random_hex(16);
  const std::string& path = req.path;
  try {
    if (path == "/health") {
      if (!ready_) {
        std::lock_guard<std::mutex> lock(mutex_);
        const bool failed = !load_error_.empty();
        return send_json(res, 503, {{"status", failed ? "failed" : "loading"}, {"reason", load_error_}}, rid);
      }
      auto svc = service();
      if (!svc->healthy()) return send_json(res, 503, {{"status", "unhealthy"}, {"reason", svc->unhealthy_reason()}}, rid);
      return send_json(res, 200, {{"status", "ok"}}, rid);
    }
    if (path == "/version") {
      send_json(res, 200, {{"version", DUET_VERSION}}, rid);
      return access_log(req, 200, rid, start);
    }
    if (path == "/metrics") {
      if (!ready_) return send_error(res, ApiError(503, "the model is loading"), rid);
      return res->send(200, "text/plain; version=0.0.4; charset=utf-8", metrics(), {{"X-Request-Id", rid}});
    }
    // The web console: static files built into the binary; its page calls the API like any client.
    if (!config_.no_ui && (path == "/" || path.rfind("/console/", 0) == 0)) {
      const ConsoleAsset* asset = find_console_asset(path);
      if (asset == nullptr) throw ApiError(404, fmt::format("no console file {}", path), "", "not_found");
      if (req.method != "GET" && req.method != "HEAD") throw ApiError(405, fmt::format("use GET {}", path));
      return res->send(200, std::string(asset->content_type), std::string(asset->body),
                       {{"X-Request-Id", rid}, {"Cache-Control", "no-cache"}});
    }
    const bool api = path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
    if (!api) throw ApiError(404, fmt::format("no route for {} {}", req.method, path), "", "not_found");
    if (!authorized(req)) {
      throw ApiError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'", "", "invalid_api_key");
    }
    if (!ready_) throw ApiError(503, "the model is still loading");
    if (path == "/v1/models") {
      if (req.method != "GET") throw ApiError(405, "use GET /v1/models");
      const json model = {{"id", model_.name},
                          {"object", "model"},
                          {"created", unix_now()},
                          {"owned_by", "duet"},
                          {"root", config_.model},
                          {"max_model_len", model_.max_model_len}};
      send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}}, rid);
      return access_log(req, 200, rid, start);
    }
    const bool chat = path == "/v1/chat/completions";
    if (chat || path == "/v1/completions") {
      if (req.method != "POST") throw ApiError(405, fmt::format("use POST {}", path));
      ++requests_total_;
      return completions(std::move(req), res, chat, rid, start);
    }
    if (path == "/tokenize" || path == "/detokenize") {
      if (req.method != "POST") throw ApiError(405, fmt::format("use POST {}", path));
      send_json(res, 200, path == "/tokenize" ? tokenize(req) : detokenize(req), rid);
      return access_log(req, 200, rid, start);
    }
    throw ApiError(404, fmt::format("no route for {} {}", req.method, path), "", "not_found");
  } catch (const std::exception& e) {
    const ApiError err = api_error_from(e);
    if (err.status() >= 500 || (path == "/v1/completions" || path == "/v1/chat/completions")) {
      if (err.status() >= 400 && ready_ && (path == "/v1/completions" || path == "/v1/chat/completions")) {
        ++requests_failed_;
      }
    }
    std::vector<std::pair<std::string, std::string>> headers;
    if (err.status() == 503) headers.emplace_back("Retry-After", "1");
    send_error(res, err, rid, headers);
    access_log(req, err.status(), rid, start, {{"error", err.what()}});
  }
}

void ApiServer::completions(HttpRequest&& req, std::shared_ptr<Responder> res, bool chat, const std::string& rid,
                            Clock::time_point start) {
  auto svc = service();
  auto call = std::make_shared<CompletionCall>();
  call->parsed = parse_request(req.body, model_, chat);
  if (svc->num_waiting() >= config_.max_queued_requests) {
    throw ApiError(503, fmt::format("{} requests are already waiting (the limit is {}); retry later", svc->num_waiting(),
                                    config_.max_queued_requests));
  }
  if (!svc->healthy()) throw ApiError(503, "the engine is unhealthy: " + svc->unhealthy_reason());
  call->builder = std::make_unique<ResponseBuilder>(call->parsed, model_, (chat ? "chatcmpl-" : "cmpl-") + rid, unix_now());
  call->responder = res;
  call->request_id = rid;
  call->path = req.path;
  call->remote = req.remote;
  call->start = start;
  call->remaining = call->parsed.prompts.size();
  if (call->parsed.stream) res->start_stream(200, "text/event-stream", {{"X-Request-Id", rid}});

  std::vector<std::string> ids;
  for (size_t i = 0; i < call->parsed.prompts.size(); ++i) ids.push_back(fmt::format("{}-{}", rid, i));
  std::weak_ptr<EngineService> weak = svc;
  res->on_disconnect([weak, ids] {
    if (auto s = weak.lock()) {
      for (const std::string& id : ids) s->abort(id);
    }
  });

  auto finish = [this, call, req_copy = HttpRequest{req.method, req.target, req.path, {}, {}, req.remote}] {
    // Runs once, on the engine thread, after the last prompt finished.
    const int status = call->error ? call->error->status() : 200;
    if (call->error) ++requests_failed_;
    if (call->parsed.stream) {
      if (call->error) call->responder->write(ResponseBuilder::stream_error(*call->error));
      call->responder->write(call->builder->stream_end());
      call->responder->finish();
    } else if (call->error) {
      send_error(call->responder, *call->error, call->request_id);
    } else {
      call->responder->send(200, "application/json", call->builder->final_body(), {{"X-Request-Id", call->request_id}});
    }
    json extra = {{"prompt_tokens", call->builder->prompt_tokens()},
                  {"generated_tokens", call->builder->completion_tokens()},
                  {"queue_time", call->queue_seconds},
                  {"finish_reason", call->builder->last_finish_reason()},
                  {"stream", call->parsed.stream}};
    if (call->first_token) extra["ttft"] = seconds_between(call->start, *call->first_token);
    if (call->error) extra["error"] = call->error->what();
    access_log(req_copy, status, call->request_id, call->start, extra);
  };

  for (size_t i = 0; i < call->parsed.prompts.size(); ++i) {
    auto sink = [call, i, finish](RequestOutput&& o) {
      bool done = false;
      {
        std::lock_guard<std::mutex> lock(call->mutex);
        if (!o.error.empty() && !call->error) call->error = api_error_from_output(o);
        bool has_tokens = false;
        for (const CompletionDelta& d : o.outputs) has_tokens = has_tokens || !d.token_ids.empty();
        if (has_tokens && !call->first_token) call->first_token = Clock::now();
        if (call->parsed.stream) {
          std::string events = call->builder->stream_events(i, o);
          if (!events.empty()) call->responder->write(std::move(events));
        } else {
          call->builder->accumulate(i, o);
        }
        if (o.finished) {
          call->queue_seconds = std::max(call->queue_seconds, o.queue_seconds);
          done = --call->remaining == 0;
        }
      }
      if (done) finish();
    };
    if (!svc->submit(ids[i], call->parsed.prompts[i], call->parsed.params, call->parsed.priority, sink)) {
      for (size_t j = 0; j < i; ++j) svc->abort(ids[j]);
      if (i == 0) throw ApiError(503, "the server is not accepting requests (shutting down or unhealthy)");
      // Already-submitted prompts finish as aborted; the rest are counted as failed.
      std::lock_guard<std::mutex> lock(call->mutex);
      call->error = ApiError(503, "the server stopped accepting requests");
      call->remaining -= call->parsed.prompts.size() - i;
      break;
    }
  }
}

json ApiServer::tokenize(const HttpRequest& req) {
  const json body = parse_json_body(req.body);
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object");
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    ParsedRequest p = parse_request(json{{"messages", body["messages"]},
                                         {"add_generation_prompt", body.value("add_generation_prompt", true)},
                                         {"max_tokens", 1}}
                                        .dump(),
                                    model_, true);
    ids = p.prompts.front();
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    const bool add_special = body.value("add_special_tokens", true);
    ids = model_.tokenizer->encode(body["prompt"].get<std::string>(), add_special, true);
  } else {
    throw ApiError(400, "give prompt (a string) or messages", "prompt");
  }
  return {{"count", ids.size()}, {"max_model_len", model_.max_model_len}, {"tokens", ids}};
}

json ApiServer::detokenize(const HttpRequest& req) {
  const json body = parse_json_body(req.body);
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
    throw ApiError(400, "tokens must be a list of token ids", "tokens");
  }
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= model_.vocab_size) {
      throw ApiError(400, fmt::format("tokens must be token ids in [0, {})", model_.vocab_size), "tokens");
    }
    ids.push_back(t.get<int32_t>());
  }
  return {{"prompt", model_.tokenizer->decode(ids, false)}};
}

std::string ApiServer::metrics() {
  auto svc = service();
  const EngineMetrics m = svc->metrics();
  ServerCounters counters;
  counters.requests_total = requests_total_.load();
  counters.requests_failed = requests_failed_.load();
  {
    std::lock_guard<std::mutex> lock(utilization_mutex_);
    const auto now = Clock::now();
    const double wall = seconds_between(last_scrape_, now);
    if (wall >= 1.0) {
      utilization_ = std::min(1.0, std::max(0.0, (m.busy_seconds_total - last_busy_) / wall));
      last_busy_ = m.busy_seconds_total;
      last_scrape_ = now;
    }
    counters.device_utilization = utilization_;
  }
  if (energy_.available()) counters.energy_joules = energy_.joules();
  return render_metrics(m, counters, model_.name);
}

std::unique_ptr<ChatTemplate> load_chat_template(const ServerConfig& config, const GgufFile& file) {
  if (config.chat_template_file.empty()) return std::make_unique<ChatTemplate>(chat_template_for(file));
  std::ifstream in(config.chat_template_file);
  if (!in) fail(ErrorCode::kNotFound, "cannot read --chat-template '{}'", config.chat_template_file);
  std::stringstream ss;
  ss << in.rdbuf();
  return std::make_unique<ChatTemplate>(ChatTemplate::parse(ss.str()));
}

}  // namespace

int run_server(const ServerConfig& config) {
  if (!config.reasoning_parser.empty() && config.reasoning_parser != "deepseek_r1") {
    fail(ErrorCode::kInvalidArgument, "--reasoning-parser '{}' is not known (expected deepseek_r1)",
         config.reasoning_parser);
  }
  // Termination signals are taken by sigwait below, in this thread only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  ApiServer api(config);
  HttpServer http(config.http, [&api](HttpRequest&& req, std::shared_ptr<Responder> res) { api.handle(std::move(req), res); });
  http.start();
  fmt::print(stderr, "duet: listening on http://{}:{} (model {} loading)\n", config.http.host, http.port(),
             api.served_name());
  std::fflush(stderr);

  std::shared_ptr<EngineService> service;
  try {
    const auto load_start = Clock::now();
    auto engine = LLMEngine::from_file(config.model, config.engine);
    auto chat_template = load_chat_template(config, engine->file());
    const int64_t kv_blocks = engine->num_kv_blocks();
    service = std::make_shared<EngineService>(std::move(engine));
    api.set_ready(service, std::move(chat_template));
    fmt::print(stderr, "duet: ready in {:.1f} s: serving '{}' on http://{}:{} ({} KV blocks)\n",
               seconds_between(load_start, Clock::now()), api.served_name(), config.http.host, http.port(), kv_blocks);
    std::fflush(stderr);
  } catch (const std::exception& e) {
    api.set_load_error(e.what());
    http.stop();
    throw;
  }

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("received signal {}: draining for up to {} s", signal_number, config.shutdown_timeout_seconds);
  fmt::print(stderr, "duet: stopping (signal {}), letting {} requests finish\n", signal_number,
             service->num_unfinished());
  http.stop_accepting();
  service->stop_admitting();
  const auto deadline = Clock::now() + std::chrono::seconds(config.shutdown_timeout_seconds);
  while (service->num_unfinished() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int64_t left = service->num_unfinished();
  service->shutdown();  // aborts whatever is still running
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the last replies go out
  http.stop();
  fmt::print(stderr, "duet: stopped ({} requests aborted at the deadline)\n", left);
  return 0;
}

}  // namespace duet::server
