#include "duet/backend/fault.h"
#include "duet/server/api_server.h"

#include <pthread.h>
#include <unistd.h>
#include <signal.h>

#include <algorithm>
#include <charconv>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <iostream>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/comm/mpi.h"
#include "duet/core/energy.h"
#include "duet/core/error.h"
#include "duet/core/log.h"
#include "duet/engine/generation_config.h"
#include "duet/server/batch_runner.h"
#include "duet/server/batches.h"
#include "duet/server/bench_client.h"
#include "duet/server/console_assets.h"
#include "duet/server/conversations.h"
#include "duet/server/embeddings.h"
#include "duet/server/engine_service.h"
#include "duet/server/http_server.h"
#include "duet/server/message_batches.h"
#include "duet/server/messages.h"
#include "duet/server/metrics_text.h"
#include "duet/server/multipart.h"
#include "duet/server/openai.h"
#include "duet/server/response_store.h"
#include "duet/server/responses.h"
#include "duet/server/work_pool.h"

namespace duet::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// A request's ids: the server's own (unique in this process: it names the engine requests and the
// response), and the client's X-Request-Id, which is only echoed and logged beside it.
struct RequestIds {
  std::string id;
  std::string client;  // empty when the client sent none (or one that is not a short printable label)
  // What the X-Request-Id response header carries: the client's label, else the server's id.
  const std::string& header() const { return client.empty() ? id : client; }
};

RequestIds request_ids(const HttpRequest& req) {
  static const uint64_t kProcessTag = std::random_device{}() * 0x9e3779b97f4a7c15ull ^ std::random_device{}();
  static std::atomic<uint64_t> counter{0};
  RequestIds ids;
  ids.id = fmt::format("{:016x}{:08x}", kProcessTag, counter.fetch_add(1) & 0xffffffffu);
  std::string client = req.header("x-request-id");
  const bool printable =
      std::all_of(client.begin(), client.end(), [](char c) { return c >= 0x21 && c <= 0x7e; });
  if (!client.empty() && client.size() <= 128 && printable) ids.client = std::move(client);
  return ids;
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

// vLLM's score and rerank routes (embedding similarity).
bool score_route(const std::string& path) { return path == "/score" || path == "/v1/score"; }
bool rerank_route(const std::string& path) { return path == "/rerank" || path == "/v1/rerank" || path == "/v2/rerank"; }

// The routes whose requests the engine serves (each counted in duet:requests_total).
bool engine_route(const std::string& path) {
  return path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/responses" ||
         path == "/v1/messages" || path == "/v1/embeddings" || score_route(path) || rerank_route(path);
}

// The value of `key` in a request target's query ("/health?model=a&verbose=1"); empty when absent.
std::string query_param(const std::string& target, const std::string& key) {
  const size_t q = target.find('?');
  if (q == std::string::npos) return {};
  const std::string prefix = key + "=";
  for (size_t at = q + 1; at < target.size();) {
    size_t end = target.find('&', at);
    if (end == std::string::npos) end = target.size();
    if (target.compare(at, prefix.size(), prefix) == 0) return target.substr(at + prefix.size(), end - at - prefix.size());
    at = end + 1;
  }
  return {};
}

// The reply channel of a background run with `stream`: the events sent are also kept on its stored
// response (GET /v1/responses/{id}?stream=true), and the run's end finishes those following it.
class RecordingResponder : public ForwardingResponder {
 public:
  RecordingResponder(std::shared_ptr<Responder> inner, std::shared_ptr<StoredResponse> stored)
      : ForwardingResponder(std::move(inner)), stored_(std::move(stored)) {}
  void send(int status, const std::string& content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> headers) override {
    stored_->end_events();  // failed before its stream started
    inner_->send(status, content_type, std::move(body), std::move(headers));
  }
  void send_body(int status, const std::string& content_type, BodySource body,
                 std::vector<std::pair<std::string, std::string>> headers) override {
    stored_->end_events();
    inner_->send_body(status, content_type, std::move(body), std::move(headers));
  }
  void write(std::string chunk) override {
    stored_->record_events(chunk);
    inner_->write(std::move(chunk));
  }
  void finish() override {
    stored_->end_events();
    inner_->finish();
  }

 private:
  std::shared_ptr<StoredResponse> stored_;
};

// A query parameter as a number in [lo, hi]; `fallback` when absent.
int64_t query_number(const HttpRequest& req, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  const std::string v = query_param(req.target, key);
  if (v.empty()) return fallback;
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size() || n < lo || n > hi) {
    throw ApiError(400, fmt::format("{} must be an integer from {} to {}", key, lo, hi), key);
  }
  return n;
}

// The per-request bookkeeping of one completion or chat request; sinks run on the engine
// thread, the responder posts to the connection.
struct CompletionCall {
  std::mutex mutex;
  ParsedRequest parsed;
  std::unique_ptr<OutputBuilder> builder;
  std::shared_ptr<Responder> responder;
  RequestIds request_id;
  std::string path;
  std::string remote;
  size_t remaining = 0;
  std::optional<ApiError> error;
  Clock::time_point start;
  std::optional<Clock::time_point> first_token;
  double queue_seconds = 0.0;
  bool background = false;           // runs on when the client goes (a background response)
  bool detached = false;             // answered already (a background response): no reply at the end
  std::function<void()> on_finish;   // after the last output, under `mutex`, before the reply
  std::shared_ptr<const void> keep;  // what the builder reads besides `parsed`
};

// One model the server serves: its settings, its state, and once loaded its engine service and
// what requests to it need. Everything but `state`, `load_error` and the counters is written once,
// before `state` becomes kReady, and only read after.
struct Served {
  enum State { kLoading, kReady, kFailed };
  ServedModelConfig config;
  std::string name;
  std::atomic<int> state{kLoading};
  std::string load_error;  // under ApiServer::mutex_
  std::shared_ptr<EngineService> service;
  std::unique_ptr<ChatTemplate> chat_template;
  ServedModel model;
  // Its LoRA adapters as clients name them (`model` in a request): the model under the adapter's
  // name and engine slot, and its folder; under ApiServer::mutex_. Entries stay (a request's
  // builder refers to one) and an unloaded adapter's is marked so.
  struct Adapter {
    ServedModel model;
    std::string path;
    bool loaded = true;
  };
  std::deque<Adapter> adapters;
  std::atomic<int64_t> requests_total{0};
  std::atomic<int64_t> requests_failed{0};

  bool ready() const { return state.load(std::memory_order_acquire) == kReady; }
};

class ApiServer {
 public:
  ApiServer(const ServerConfig& config, const std::vector<ServedModelConfig>& models)
      : config_(config),
        cors_(config.cors),
        responses_(static_cast<size_t>(config.responses_store_mib) << 20, config.responses_redis),
        conversations_(static_cast<size_t>(config.responses_store_mib) << 20, config.responses_redis),
        files_(static_cast<size_t>(config.files_store_mib) << 20, config.files_dir),
        uploads_(files_),
        work_(config.api_threads),
        // A batch keeps as many lines in flight as the engines run at once, beside live traffic.
        batches_(files_, [this](HttpRequest&& req, std::shared_ptr<Responder> res) { handle(std::move(req), std::move(res)); },
                 batch_window(models), std::chrono::hours(24), static_cast<size_t>(config.max_running_batches)),
        message_batches_(files_, batches_) {
    for (const ServedModelConfig& m : models) {
      auto s = std::make_unique<Served>();
      s->config = m;
      s->name = m.name();
      served_.push_back(std::move(s));
    }
  }

  void handle(HttpRequest&& req, std::shared_ptr<Responder> res);

  size_t num_models() const { return served_.size(); }
  // The models are loaded: batches run (those a --files-dir kept go on).
  void start_batches() { batches_.start(); }
  // The server is stopping: batches are cancelled (their lines in flight aborted), or with
  // --files-dir, kept to go on with next time.
  void stop_batches() { batches_.stop(); }
  // The server whose connections /metrics counts; set before it starts.
  void set_http(const HttpServer* http) { http_ = http; }
  const Served& served(size_t i) const { return *served_[i]; }

  // Called once model i is loaded.
  void set_ready(size_t i, std::shared_ptr<EngineService> service, std::unique_ptr<ChatTemplate> chat_template) {
    Served& s = *served_[i];
    SamplingParams defaults = model_sampling_defaults(service->engine().file());
    std::lock_guard<std::mutex> lock(mutex_);
    s.service = std::move(service);
    s.chat_template = std::move(chat_template);
    const LLMEngine& engine = s.service->engine();
    ServedModel& model = s.model;
    model.defaults = std::move(defaults);
    const Tokenizer& tok = engine.tokenizer();
    model.name = s.name;
    model.max_model_len = engine.max_model_len();
    model.max_logprobs = engine.max_logprobs();
    model.vocab_size = static_cast<int32_t>(engine.model_config().num_vocab);
    model.hidden_size = static_cast<int32_t>(engine.model_config().hidden_size);
    model.tokenizer = &tok;
    model.chat_template = s.chat_template.get();
    model.bos_text = tok.bos_id() >= 0 ? tok.token_text(tok.bos_id()) : std::string();
    model.eos_text = tok.eos_id() >= 0 ? tok.token_text(tok.eos_id()) : std::string();
    model.reasoning_parser = s.config.reasoning_parser == "deepseek_r1";
    model.grammars = &grammars_;
    model.tool_parser = tool_call_format(s.config.tool_call_parser);
    model.auto_tool_choice = s.config.enable_auto_tool_choice;
    model.max_prompts = config_.max_queued_requests;
    s.adapters.clear();
    for (const auto& [index, source] : engine.lora_adapters()) add_adapter(s, index, source);
    s.state.store(Served::kReady, std::memory_order_release);
  }
  // Lists an adapter the engine holds in `slot` under s (mutex_ held).
  void add_adapter(Served& s, int32_t slot, const LoraSource& source) {
    Served::Adapter& a = s.adapters.emplace_back();
    a.model = s.model;
    a.model.name = source.name;
    a.model.lora_adapter = slot;
    a.path = source.path;
  }
  void set_load_error(size_t i, const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    served_[i]->load_error = message;
    served_[i]->state.store(Served::kFailed, std::memory_order_release);
  }

 private:
  void send_json(const std::shared_ptr<Responder>& res, int status, const json& body, const RequestIds& rid,
                 std::vector<std::pair<std::string, std::string>> headers = {}) {
    headers.emplace_back("X-Request-Id", rid.header());
    res->send(status, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace), std::move(headers));
  }
  void send_error(const std::shared_ptr<Responder>& res, const ApiError& e, const RequestIds& rid,
                  std::vector<std::pair<std::string, std::string>> headers = {}) {
    headers.emplace_back("X-Request-Id", rid.header());
    res->send(e.status(), "application/json", error_body(e), std::move(headers));
  }
  void access_log(const HttpRequest& req, int status, const RequestIds& rid, Clock::time_point start,
                  json extra = json::object()) {
    if (req.path == "/health" || req.path == "/metrics") return;
    json fields = {{"request_id", rid.id},
                   {"method", req.method},
                   {"path", req.path},
                   {"status", status},
                   {"client", req.remote},
                   {"total_time", seconds_between(start, Clock::now())}};
    if (!rid.client.empty()) fields["client_request_id"] = rid.client;
    for (auto it = extra.begin(); it != extra.end(); ++it) fields[it.key()] = it.value();
    log_record("request", fields);
  }
  bool authorized(const HttpRequest& req) const {
    if (config_.api_keys.empty()) return true;
    // OpenAI's clients send "Authorization: Bearer KEY", Anthropic's "x-api-key: KEY".
    const std::string auth = req.header("authorization");
    const std::string prefix = "Bearer ";
    const std::string key = auth.rfind(prefix, 0) == 0 ? auth.substr(prefix.size()) : req.header("x-api-key");
    if (key.empty()) return false;
    return std::find(config_.api_keys.begin(), config_.api_keys.end(), key) != config_.api_keys.end();
  }
  bool any_ready() const {
    return std::any_of(served_.begin(), served_.end(), [](const auto& s) { return s->ready(); });
  }
  Served* find(const std::string& name) {
    for (auto& s : served_) {
      if (s->name == name) return s.get();
    }
    return nullptr;
  }
  // What a request's `model` names: a served model, and the name it runs as (the model itself, or
  // one of its LoRA adapters).
  struct Route {
    Served& served;
    const ServedModel& model;
  };
  // `name` as a served model's or a ready model's adapter's; nullopt when no such name is served.
  std::optional<Route> find_route(const std::string& name) {
    for (auto& s : served_) {
      if (s->name == name) return Route{*s, s->model};
      if (!s->ready()) continue;
      std::lock_guard<std::mutex> lock(mutex_);
      for (const Served::Adapter& a : s->adapters) {
        if (a.loaded && a.model.name == name) return Route{*s, a.model};
      }
    }
    return std::nullopt;
  }
  // The model a request body names (the first model when it names none), ready to serve it.
  // Throws ApiError: 404 for a model not served, 503 for one still loading or that failed.
  Route route(const json& body);
  // /health: one model's state, or (no ?model=) the server's: up while any model serves.
  void health(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid);
  // "ok", "loading", "failed" or "unhealthy", and why when not ok.
  std::pair<std::string, std::string> status_of(const Served& s);

  // The routes that parse and tokenize, on a work pool thread.
  void work(HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid, Clock::time_point start);
  void reply_error(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid,
                   Clock::time_point start, const std::exception& e, Served* s);
  void completions(const Route& to, const json& body, HttpRequest&& req, std::shared_ptr<Responder> res, bool chat,
                   const RequestIds& rid, Clock::time_point start);
  // POST /v1/responses: the chat request it means, on the same path; kept in responses_.
  void responses(const Route& to, const json& body, HttpRequest&& req, std::shared_ptr<Responder> res,
                 const RequestIds& rid, Clock::time_point start);
  // POST /score, /rerank (and their /v1/, /v2/ forms): embeddings of the texts, their cosines.
  void score(const Route& to, const json& body, bool rerank, HttpRequest&& req, std::shared_ptr<Responder> res,
             const RequestIds& rid, Clock::time_point start);
  // POST /v1/embeddings: one engine request per input, finished once its prompt is computed.
  // POST /v1/messages: Anthropic's Messages API, the chat request it means on the same path.
  void messages(const Route& to, const json& body, HttpRequest&& req, std::shared_ptr<Responder> res,
                const RequestIds& rid, Clock::time_point start);
  void embeddings(const Route& to, const json& body, HttpRequest&& req, std::shared_ptr<Responder> res,
                  const RequestIds& rid, Clock::time_point start);
  // OpenAI's Files API for batches: POST and GET /v1/files, GET and DELETE /v1/files/{id}, GET
  // /v1/files/{id}/content.
  void files_route(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid);
  // OpenAI's Batch API: POST and GET /v1/batches, GET /v1/batches/{id}, POST .../cancel.
  void batches_route(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid);
  void message_batches_route(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid);
  void uploads_route(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid);
  static size_t batch_window(const std::vector<ServedModelConfig>& models) {
    size_t n = 0;
    for (const ServedModelConfig& m : models) n += static_cast<size_t>(std::max(1, m.engine.scheduler.max_num_seqs));
    return n;
  }
  // GET and DELETE /v1/responses/{id}, GET .../input_items, POST .../cancel.
  void stored_response(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid);
  // /v1/conversations and its items (ConversationStore).
  void conversations_route(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid);
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's, with
  // --allow-runtime-lora-updating): the engine loads or unloads between steps; the answer is
  // vLLM's text.
  void update_lora(Served& s, const std::string& path, const json& body, const std::shared_ptr<Responder>& res,
                   const RequestIds& rid);
  // Submits a call's prompts to the engine; its reply goes out when the last one finished.
  void submit(Served& s, std::shared_ptr<CompletionCall> call, const HttpRequest& req, const std::shared_ptr<Responder>& res,
              const RequestIds& rid, Clock::time_point start);
  json tokenize(const ServedModel& model, const json& body);
  json detokenize(const ServedModel& model, const json& body);
  std::string metrics();
  // Each device's state (ok or failed, and why), its health probes, and the failovers so far.
  static json device_health(const EngineMetrics& m) {
    json devices = json::array();
    for (const DeviceMetrics& d : m.devices) {
      json e = {{"name", d.name}, {"state", d.failed ? "failed" : "ok"}, {"probes", d.probes},
                {"probe_failures", d.probe_failures}};
      if (d.failed) e["reason"] = d.failure;
      if (d.last_probe_age_seconds >= 0.0) e["last_probe_seconds_ago"] = d.last_probe_age_seconds;
      devices.push_back(std::move(e));
    }
    return {{"devices", std::move(devices)}, {"failovers", m.device_failovers_total}};
  }
  // POST /admin/fault {"device": NAME, "step": N, "mode": "fail|hang|oom"}: arms a device fault
  // (tests, drills). Only with --api-key set, and only for a request that carries one.
  void admin_fault(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid) {
    if (config_.api_keys.empty()) throw ApiError(403, "the admin routes need the server to run with --api-key");
    if (!authorized(req)) {
      throw ApiError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'", "", "invalid_api_key");
    }
    if (req.method != "POST") throw ApiError(405, "use POST /admin/fault");
    const json body = parse_json_body(req.body);
    if (!body.is_object()) throw ApiError(400, "the body must be a JSON object {device, step, mode}");
    std::string spec;
    for (const char* key : {"device", "step", "mode"}) {
      if (!body.contains(key)) continue;
      const json& v = body[key];
      if (!(v.is_string() || v.is_number_integer())) throw ApiError(400, fmt::format("'{}' must be a string or an integer", key), key);
      spec += fmt::format("{}={};", key, v.is_string() ? v.get<std::string>() : std::to_string(v.get<int64_t>()));
    }
    FaultSpec fault;
    try {
      fault = parse_fault_spec(spec);
    } catch (const Error& e) {
      throw ApiError(400, e.what());
    }
    arm_fault(fault);
    spdlog::warn("fault armed through /admin/fault: device {} at its unit of work {} from now, mode {}", fault.device,
                 fault.step, fault_mode_name(fault.mode));
    send_json(res, 200, {{"armed", {{"device", fault.device}, {"step", fault.step}, {"mode", fault_mode_name(fault.mode)}}}},
              rid);
  }

  const ServerConfig& config_;
  const Cors cors_;
  const HttpServer* http_ = nullptr;  // for its counts in /metrics
  std::mutex mutex_;
  std::vector<std::unique_ptr<Served>> served_;  // in the configuration's order; the first is the default
  grammar::GrammarCache grammars_;
  ResponseStore responses_;
  ConversationStore conversations_;
  FileStore files_;
  UploadStore uploads_;  // after files_, whose room it holds
  EnergyMeter energy_;
  WorkPool work_;  // its threads stop before anything they use goes
  BatchManager batches_;  // its lines in flight are answered (by work_ and the engines) before the rest goes
  MessageBatches message_batches_;  // Anthropic's view of batches_
};

void ApiServer::handle(HttpRequest&& req, std::shared_ptr<Responder> res) {
  const auto start = Clock::now();
  const RequestIds rid = request_ids(req);
  const std::string& path = req.path;
  // Browser pages of other origins: the preflight is answered before authentication, and every
  // other reply to an allowed origin says so (errors too, so that the page can read them).
  if (Cors::is_preflight(req)) return cors_.answer_preflight(req, *res);
  res = with_headers(std::move(res), cors_.reply_headers(req.header("origin")));
  // Anthropic's routes, and Anthropic's clients anywhere, get errors in Anthropic's shape, wherever
  // they are found.
  if (path.rfind("/v1/messages", 0) == 0 || anthropic_client(req)) res = std::make_shared<AnthropicErrors>(std::move(res));
  try {
    // /ping: vLLM's name of the same check (GET or POST, as load balancers such as SageMaker's ask).
    if (path == "/health" || path == "/ping") return health(req, res, rid);
    if (path == "/health/devices") {
      const std::string which = query_param(req.target, "model");
      Served* s = which.empty() ? served_.front().get() : find(which);
      if (s == nullptr) throw ApiError(404, "no model is served as " + which, "model", "model_not_found");
      if (!s->ready()) throw ApiError(503, fmt::format("the model `{}` is not loaded", s->name));
      json body = device_health(s->service->metrics());
      body["status"] = s->service->healthy() ? "ok" : "unhealthy";
      return send_json(res, s->service->healthy() ? 200 : 503, body, rid);
    }
    if (path == "/admin/fault") return admin_fault(req, res, rid);
    if (path == "/version") {
      send_json(res, 200, {{"version", DUET_VERSION}}, rid);
      return access_log(req, 200, rid, start);
    }
    if (path == "/metrics") {
      if (!any_ready()) return send_error(res, ApiError(503, "no model is loaded yet"), rid);
      return res->send(200, "text/plain; version=0.0.4; charset=utf-8", metrics(), {{"X-Request-Id", rid.header()}});
    }
    // The web console: static files built into the binary; its page calls the API like any client.
    if (!config_.no_ui && (path == "/" || path.rfind("/console/", 0) == 0)) {
      const ConsoleAsset* asset = find_console_asset(path);
      if (asset == nullptr) throw ApiError(404, fmt::format("no console file {}", path), "", "not_found");
      if (req.method != "GET" && req.method != "HEAD") throw ApiError(405, fmt::format("use GET {}", path));
      return res->send(200, std::string(asset->content_type), std::string(asset->body),
                       {{"X-Request-Id", rid.header()}, {"Cache-Control", "no-cache"}});
    }
    const bool api = path.rfind("/v1/", 0) == 0 || path.rfind("/v2/", 0) == 0 || path == "/tokenize" ||
                     path == "/detokenize" || score_route(path) || rerank_route(path);
    if (!api) throw ApiError(404, fmt::format("no route for {} {}", req.method, path), "", "not_found");
    // A batch's lines carry no key: the batch was authorized when it was made.
    if (!req.internal && !authorized(req)) {
      throw ApiError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'", "", "invalid_api_key");
    }
    if (!any_ready()) {
      throw ApiError(503, served_.size() == 1 ? "the model is still loading" : "no model is loaded yet");
    }
    if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
      if (req.method != "GET") throw ApiError(405, fmt::format("use GET {}", path));
      // A LoRA adapter as vLLM lists it: its folder as root, the model it runs on as parent.
      auto model_json = [](const Served& s, const Served::Adapter* adapter) {
        const ServedModel& m = adapter != nullptr ? adapter->model : s.model;
        return json{{"id", m.name},
                    {"object", "model"},
                    {"created", unix_now()},
                    {"owned_by", "duet"},
                    {"root", adapter != nullptr ? adapter->path : s.config.model},
                    {"parent", adapter != nullptr ? json(s.name) : json(nullptr)},
                    {"max_model_len", m.max_model_len}};
      };
      const auto listing = [&](const Served& s) {
        json out = json::array({model_json(s, nullptr)});
        std::lock_guard<std::mutex> lock(mutex_);
        for (const Served::Adapter& a : s.adapters) {
          if (a.loaded) out.push_back(model_json(s, &a));
        }
        return out;
      };
      // Anthropic's clients get Anthropic's model objects: {type, id, display_name, created_at}.
      const bool anthropic = anthropic_client(req);
      const auto shaped = [&](json m) {
        if (!anthropic) return m;
        return json{{"type", "model"}, {"id", m["id"]}, {"display_name", m["id"]},
                    {"created_at", anthropic_time(m["created"].get<int64_t>())}};
      };
      if (path != "/v1/models") {
        // GET /v1/models/{id}: one model (a served name may hold a slash, as Hugging Face's do).
        const std::string name = path.substr(std::string("/v1/models/").size());
        for (const auto& s : served_) {
          if (!s->ready()) continue;
          for (json& m : listing(*s)) {
            if (m["id"] == name) {
              send_json(res, 200, shaped(std::move(m)), rid);
              return access_log(req, 200, rid, start);
            }
          }
        }
        throw ApiError(404, fmt::format("The model `{}` does not exist.", name), "model", "model_not_found");
      }
      // The models that serve (one still loading, or that failed to load, is not listed), each
      // followed by its adapters.
      json data = json::array();
      for (const auto& s : served_) {
        if (!s->ready()) continue;
        for (json& m : listing(*s)) data.push_back(shaped(std::move(m)));
      }
      if (anthropic) {
        // Anthropic's page: every model at once (a server serves a few).
        send_json(res, 200,
                  {{"data", data},
                   {"has_more", false},
                   {"first_id", data.empty() ? json(nullptr) : data.front()["id"]},
                   {"last_id", data.empty() ? json(nullptr) : data.back()["id"]}},
                  rid);
        return access_log(req, 200, rid, start);
      }
      send_json(res, 200, {{"object", "list"}, {"data", data}}, rid);
      return access_log(req, 200, rid, start);
    }
    if (path.rfind("/v1/responses/", 0) == 0) {
      stored_response(req, res, rid);
      return access_log(req, 200, rid, start);
    }
    if (path == "/v1/conversations" || path.rfind("/v1/conversations/", 0) == 0) {
      conversations_route(req, res, rid);
      return access_log(req, 200, rid, start);
    }
    if (path == "/v1/files" || path.rfind("/v1/files/", 0) == 0) {
      files_route(req, res, rid);
      return access_log(req, 200, rid, start);
    }
    if (path == "/v1/batches" || path.rfind("/v1/batches/", 0) == 0) {
      batches_route(req, res, rid);
      return access_log(req, 200, rid, start);
    }
    if (path == "/v1/messages/batches" || path.rfind("/v1/messages/batches/", 0) == 0) {
      message_batches_route(req, res, rid);
      return access_log(req, 200, rid, start);
    }
    if (path == "/v1/uploads" || path.rfind("/v1/uploads/", 0) == 0) {
      uploads_route(req, res, rid);
      return access_log(req, 200, rid, start);
    }
    const bool completion = engine_route(path);
    if (!completion && path != "/tokenize" && path != "/detokenize" && path != "/v1/load_lora_adapter" &&
        path != "/v1/unload_lora_adapter" && path != "/v1/messages/count_tokens") {
      throw ApiError(404, fmt::format("no route for {} {}", req.method, path), "", "not_found");
    }
    if (req.method != "POST") throw ApiError(405, fmt::format("use POST {}", path));
    // Parsing, chat templates and tokenizing go to the work pool: this I/O thread is free again
    // at once for other connections (/health, streams).
    const size_t most = req.internal ? SIZE_MAX : static_cast<size_t>(std::max<int64_t>(1, config_.max_queued_requests));
    auto task = [this, req = std::move(req), res, rid, start]() mutable { work(req, res, rid, start); };
    if (!work_.post(std::move(task), most)) {
      throw ApiError(503, fmt::format("{} requests are already waiting to be parsed (the limit is {}); retry later",
                                      work_.num_waiting(), config_.max_queued_requests));
    }
  } catch (const std::exception& e) {
    // Refused before it was routed: counted against the first model (once any model serves).
    const bool completion = engine_route(path);
    Served* first = completion && any_ready() ? served_.front().get() : nullptr;
    if (first != nullptr) ++first->requests_total;
    reply_error(req, res, rid, start, e, first);
  }
}

std::pair<std::string, std::string> ApiServer::status_of(const Served& s) {
  switch (s.state.load(std::memory_order_acquire)) {
    case Served::kLoading: return {"loading", ""};
    case Served::kFailed: {
      std::lock_guard<std::mutex> lock(mutex_);
      return {"failed", s.load_error};
    }
    default: break;
  }
  if (!s.service->healthy()) return {"unhealthy", s.service->unhealthy_reason()};
  return {"ok", ""};
}

void ApiServer::health(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid) {
  const std::string which = query_param(req.target, "model");
  const std::string v = query_param(req.target, "verbose");
  const bool verbose = v == "1" || v == "true";
  auto body_of = [verbose](const Served& s, const std::pair<std::string, std::string>& st) {
    json b = {{"status", st.first}};
    if (st.first != "ok") b["reason"] = st.second;
    if (verbose && s.ready()) b.update(device_health(s.service->metrics()));
    return b;
  };
  if (!which.empty()) {
    Served* s = find(which);
    if (s == nullptr) return send_json(res, 404, {{"status", "unknown"}, {"reason", "no model is served as " + which}}, rid);
    const auto st = status_of(*s);
    return send_json(res, st.first == "ok" ? 200 : 503, body_of(*s, st), rid);
  }
  if (served_.size() == 1) {
    const auto st = status_of(*served_.front());
    return send_json(res, st.first == "ok" ? 200 : 503, body_of(*served_.front(), st), rid);
  }
  // Up while any model serves (one that failed or is still loading leaves the others up), each
  // model's own state listed.
  json models = json::object();
  size_t ok = 0, loading = 0;
  for (const auto& s : served_) {
    const auto st = status_of(*s);
    ok += st.first == "ok" ? 1 : 0;
    loading += st.first == "loading" ? 1 : 0;
    models[s->name] = body_of(*s, st);
  }
  const std::string status = ok == served_.size() ? "ok" : ok > 0 ? "degraded" : loading > 0 ? "loading" : "failed";
  send_json(res, ok > 0 ? 200 : 503, {{"status", status}, {"models", models}}, rid);
}

ApiServer::Route ApiServer::route(const json& body) {
  Served* s = served_.front().get();
  const ServedModel* model = &s->model;
  if (body.is_object() && body.contains("model") && body["model"].is_string()) {
    const std::string name = body["model"].get<std::string>();
    const std::optional<Route> to = find_route(name);
    if (!to) throw ApiError(404, fmt::format("The model `{}` does not exist.", name), "model", "model_not_found");
    s = &to->served;
    model = &to->model;
  }
  if (!s->ready()) {
    const auto st = status_of(*s);
    throw ApiError(503, st.first == "loading" ? fmt::format("the model `{}` is still loading", s->name)
                                              : fmt::format("the model `{}` failed to load: {}", s->name, st.second));
  }
  return Route{*s, *model};
}

void ApiServer::work(HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid,
                     Clock::time_point start) {
  const std::string& path = req.path;
  const bool completion = engine_route(path);
  Served* counted = nullptr;  // the model the request is counted against, once routed
  try {
    const json body = parse_json_body(req.body);
    const Route to = route(body);
    if (completion) {
      counted = &to.served;
      ++to.served.requests_total;
      if (path == "/v1/responses") return responses(to, body, std::move(req), res, rid, start);
      if (path == "/v1/messages") return messages(to, body, std::move(req), res, rid, start);
      if (path == "/v1/embeddings") return embeddings(to, body, std::move(req), res, rid, start);
      if (score_route(path) || rerank_route(path)) return score(to, body, rerank_route(path), std::move(req), res, rid, start);
      return completions(to, body, std::move(req), res, path == "/v1/chat/completions", rid, start);
    }
    if (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter") {
      update_lora(to.served, path, body, res, rid);
      return access_log(req, 200, rid, start);
    }
    if (path == "/v1/messages/count_tokens") {
      // Anthropic's: the prompt's tokens, as the message would be rendered and tokenized.
      const ParsedRequest parsed = parse_messages_chat(parse_messages_request(body, req.body, true), to.model);
      send_json(res, 200, {{"input_tokens", parsed.prompts.empty() ? 0 : parsed.prompts.front().size()}}, rid);
      return access_log(req, 200, rid, start);
    }
    send_json(res, 200, path == "/tokenize" ? tokenize(to.model, body) : detokenize(to.model, body), rid);
    access_log(req, 200, rid, start);
  } catch (const std::exception& e) {
    if (completion && counted == nullptr) {
      // Not routed (a body that does not parse, a model not served): the first model's.
      counted = served_.front().get();
      ++counted->requests_total;
    }
    reply_error(req, res, rid, start, e, counted);
  }
}

void ApiServer::reply_error(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid,
                            Clock::time_point start, const std::exception& e, Served* s) {
  const ApiError err = api_error_from(e);
  if (s != nullptr && err.status() >= 400) ++s->requests_failed;
  std::vector<std::pair<std::string, std::string>> headers;
  if (err.status() == 503) headers.emplace_back("Retry-After", "1");
  send_error(res, err, rid, headers);
  access_log(req, err.status(), rid, start, {{"error", err.what()}});
}

void ApiServer::completions(const Route& to, const json& body, HttpRequest&& req, std::shared_ptr<Responder> res,
                            bool chat, const RequestIds& rid, Clock::time_point start) {
  auto call = std::make_shared<CompletionCall>();
  call->parsed = parse_request(body, req.body, to.model, chat);
  call->builder = std::make_unique<ResponseBuilder>(call->parsed, to.model, (chat ? "chatcmpl-" : "cmpl-") + rid.id, unix_now());
  submit(to.served, std::move(call), req, res, rid, start);
}

void ApiServer::responses(const Route& to, const json& body, HttpRequest&& req, std::shared_ptr<Responder> res,
                          const RequestIds& rid, Clock::time_point start) {
  Served& s = to.served;
  auto previous = [this](const std::string& id) -> std::shared_ptr<StoredResponse> {
    if (!responses_.enabled()) {
      throw ApiError(400, "previous_response_id needs the server to keep responses (it runs with --responses-store-mib 0)",
                     "previous_response_id");
    }
    return responses_.get(id);
  };
  auto conversation = [this](const std::string& id) {
    if (!conversations_.enabled()) {
      throw ApiError(400, "conversation needs the server to keep conversations (it runs with --responses-store-mib 0)",
                     "conversation");
    }
    return conversations_.items(id);
  };
  auto rr = std::make_shared<ResponsesRequest>(parse_responses_request(body, req.body, previous, conversation));
  if (rr->background && !responses_.enabled()) {
    throw ApiError(400, "background responses need the server to keep responses (it runs with --responses-store-mib 0)",
                   "background");
  }
  auto call = std::make_shared<CompletionCall>();
  call->parsed = parse_responses_chat(*rr, to.model);
  auto builder = std::make_unique<ResponsesBuilder>(call->parsed, to.model, *rr, "resp_" + rid.id, unix_now());
  ResponsesBuilder* b = builder.get();
  call->builder = std::move(builder);
  std::shared_ptr<StoredResponse> stored;
  if (rr->store && responses_.enabled()) {
    stored = std::make_shared<StoredResponse>();
    stored->id = "resp_" + rid.id;
    stored->input_items = rr->input_items;
  }
  if (stored || !rr->conversation_id.empty()) {
    call->on_finish = [this, stored, rr, b, call = std::weak_ptr<CompletionCall>(call)] {
      auto c = call.lock();
      const json response = b->response(c && c->error ? &*c->error : nullptr);
      if (stored) {
        json conversation = rr->conversation;
        conversation.push_back(b->output_message());
        stored->finish(response, std::move(conversation));
        responses_.put(stored);
      }
      // A conversation takes the turn's input and output items once it completed (or stopped at
      // its token limit), as OpenAI adds them.
      const std::string status = response.value("status", "");
      if (!rr->conversation_id.empty() && (status == "completed" || status == "incomplete")) {
        json items = rr->input_items;
        for (const json& item : response.value("output", json::array())) items.push_back(item);
        conversations_.append(rr->conversation_id, items);
      }
    };
  }
  if (rr->background) {
    // Answered now; the run goes on without the connection, read with GET and stopped with cancel.
    std::weak_ptr<CompletionCall> weak_call = call;
    std::weak_ptr<EngineService> weak_svc = s.service;
    const std::string engine_id = rid.id + "-0";
    stored->set_running(
        [weak_call, b] {
          auto c = weak_call.lock();
          if (!c) return json::object();
          std::lock_guard<std::mutex> lock(c->mutex);
          return b->response();
        },
        [weak_svc, engine_id] {
          if (auto svc = weak_svc.lock()) svc->abort(engine_id);
        });
    responses_.put(stored);
    call->background = true;
    call->detached = !rr->stream;
  }
  const json first = b->response();
  std::shared_ptr<Responder> reply = res;
  if (rr->background && rr->stream) {
    // Its events are kept, so that a client that lost the stream reads it again from where it was.
    stored->keep_events();
    reply = std::make_shared<RecordingResponder>(res, stored);
  }
  try {
    submit(s, call, req, reply, rid, start);
  } catch (...) {
    if (stored) responses_.erase(stored->id);
    throw;
  }
  if (call->detached) send_json(res, 200, first, rid);
}

void ApiServer::messages(const Route& to, const json& body, HttpRequest&& req, std::shared_ptr<Responder> res,
                         const RequestIds& rid, Clock::time_point start) {
  auto call = std::make_shared<CompletionCall>();
  auto request = std::make_shared<MessagesRequest>(parse_messages_request(body, req.body));
  call->parsed = parse_messages_chat(*request, to.model);
  call->builder = std::make_unique<MessagesBuilder>(call->parsed, to.model, *request, "msg_" + rid.id);
  call->keep = request;
  submit(to.served, std::move(call), req, res, rid, start);
}

void ApiServer::embeddings(const Route& to, const json& body, HttpRequest&& req, std::shared_ptr<Responder> res,
                           const RequestIds& rid, Clock::time_point start) {
  auto call = std::make_shared<CompletionCall>();
  auto request = std::make_shared<EmbeddingsRequest>(parse_embeddings_request(body, to.model));
  call->parsed = request->parsed;
  call->builder = std::make_unique<EmbeddingsBuilder>(*request, to.model);
  call->keep = request;
  submit(to.served, std::move(call), req, res, rid, start);
}

void ApiServer::score(const Route& to, const json& body, bool rerank, HttpRequest&& req, std::shared_ptr<Responder> res,
                      const RequestIds& rid, Clock::time_point start) {
  auto call = std::make_shared<CompletionCall>();
  auto request = std::make_shared<ScoreRequest>(parse_score_request(body, to.model, rerank));
  call->parsed = request->embed.parsed;
  call->builder = std::make_unique<ScoreBuilder>(*request, to.model, rid.id, unix_now());
  call->keep = request;
  submit(to.served, std::move(call), req, res, rid, start);
}

void ApiServer::update_lora(Served& s, const std::string& path, const json& body, const std::shared_ptr<Responder>& res,
                            const RequestIds& rid) {
  const bool load = path == "/v1/load_lora_adapter";
  if (!config_.allow_runtime_lora_updating) {
    throw ApiError(404, fmt::format("POST {} needs the server started with --allow-runtime-lora-updating", path), "",
                   "not_found");
  }
  const auto text = [&](const char* key) {
    const json& v = json_field(body, key);
    if (!v.is_string() || v.get<std::string>().empty()) throw ApiError(400, fmt::format("{} must be a non-empty string", key), key);
    return v.get<std::string>();
  };
  const std::string name = text("lora_name");
  const LoraSource source{name, load ? text("lora_path") : std::string()};
  if (load) {
    bool taken = false;
    for (const auto& other : served_) taken = taken || other->name == name;
    if (taken || find_route(name)) {
      throw ApiError(400, fmt::format("The lora adapter '{}' has already been loaded.", name), "lora_name");
    }
  }
  int32_t slot = 0;
  std::future<void> done = s.service->call([&](LLMEngine& engine) {
    if (load) {
      slot = engine.load_lora_adapter(source);
    } else {
      engine.unload_lora_adapter(name);
    }
  });
  try {
    done.get();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kNotFound && !load) {
      throw ApiError(404, fmt::format("The lora adapter '{}' cannot be found.", name), "lora_name", "not_found");
    }
    throw ApiError(e.code() == ErrorCode::kUnavailable ? 503 : 400, e.what(), load ? "lora_path" : "lora_name");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (load) {
      add_adapter(s, slot, source);
    } else {
      for (Served::Adapter& a : s.adapters) {
        if (a.model.name == name) a.loaded = false;
      }
    }
  }
  res->send(200, "text/plain; charset=utf-8",
            fmt::format("Success: LoRA adapter '{}' {} successfully.", name, load ? "added" : "removed"),
            {{"X-Request-Id", rid.header()}});
}

void ApiServer::conversations_route(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid) {
  // /v1/conversations[/{id}[/items[/{item_id}]]]
  if (!conversations_.enabled()) throw ApiError(400, "the server keeps no conversations (it runs with --responses-store-mib 0)");
  const std::string& m = req.method;
  const auto refuse = [&](const char* allowed) {
    throw ApiError(405, fmt::format("no route for {} {} ({})", m, req.path, allowed));
  };
  if (req.path == "/v1/conversations") {
    if (m != "POST") refuse("POST /v1/conversations");
    return send_json(res, 200, conversations_.create(parse_json_body(req.body)), rid);
  }
  std::vector<std::string> parts;
  std::string rest = req.path.substr(std::string("/v1/conversations/").size());
  for (size_t at = 0; at <= rest.size();) {
    const size_t slash = std::min(rest.find('/', at), rest.size());
    parts.push_back(rest.substr(at, slash - at));
    at = slash + 1;
  }
  if (parts.empty() || parts[0].empty() || parts.size() > 3 || (parts.size() >= 2 && parts[1] != "items") ||
      (parts.size() == 3 && parts[2].empty())) {
    throw ApiError(404, fmt::format("no route for {} {}", m, req.path), "", "not_found");
  }
  const std::string& id = parts[0];
  if (parts.size() == 1) {
    if (m == "GET") return send_json(res, 200, conversations_.get(id), rid);
    if (m == "POST") return send_json(res, 200, conversations_.update(id, parse_json_body(req.body)), rid);
    if (m == "DELETE") return send_json(res, 200, conversations_.erase(id), rid);
    refuse("GET, POST or DELETE /v1/conversations/ID");
  }
  if (parts.size() == 2) {
    if (m == "GET") {
      return send_json(res, 200,
                       conversations_.list_items(id, query_param(req.target, "order"), query_param(req.target, "after"),
                                                 query_number(req, "limit", 20, 1, 100)),
                       rid);
    }
    if (m == "POST") return send_json(res, 200, conversations_.add_items(id, parse_json_body(req.body)), rid);
    refuse("GET or POST /v1/conversations/ID/items");
  }
  if (m == "GET") return send_json(res, 200, conversations_.get_item(id, parts[2]), rid);
  if (m == "DELETE") return send_json(res, 200, conversations_.delete_item(id, parts[2]), rid);
  refuse("GET or DELETE /v1/conversations/ID/items/ITEM");
}

void ApiServer::stored_response(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid) {
  // /v1/responses/{id}[/input_items|/cancel]
  std::string rest = req.path.substr(std::string("/v1/responses/").size());
  std::string action;
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    action = rest.substr(slash + 1);
    rest.resize(slash);
  }
  const std::string& id = rest;
  const bool known = (action.empty() && (req.method == "GET" || req.method == "DELETE")) ||
                     (action == "input_items" && req.method == "GET") || (action == "cancel" && req.method == "POST");
  if (!known) {
    throw ApiError(action.empty() || action == "input_items" || action == "cancel" ? 405 : 404,
                   fmt::format("no route for {} {} (GET or DELETE /v1/responses/ID, GET .../input_items, POST "
                               ".../cancel)", req.method, req.path),
                   "", action.empty() || action == "input_items" || action == "cancel" ? "" : "not_found");
  }
  std::shared_ptr<StoredResponse> r = responses_.get(id);
  if (r == nullptr) {
    throw ApiError(404,
                   responses_.enabled()
                       ? fmt::format("Response with id '{}' not found.", id)
                       : fmt::format("Response with id '{}' not found: the server keeps no responses "
                                     "(--responses-store-mib 0)", id),
                   "response_id", "not_found");
  }
  if (req.method == "GET" && action.empty() && query_param(req.target, "stream") == "true") {
    // The run's events again, after `starting_after`, and the rest as they come.
    const int64_t after = query_number(req, "starting_after", -1, -1, INT64_MAX);
    if (!r->keeps_events()) {
      throw ApiError(400, fmt::format("the response '{}' has no events to stream: only a response made with background "
                                      "and stream keeps them (and only on the server that ran it)", id), "stream");
    }
    res->start_stream(200, "text/event-stream", {{"X-Request-Id", rid.header()}});
    r->follow_events(after, res);
    return;
  }
  if (action == "input_items") {
    return send_json(res, 200,
                     list_page(r->input_items, query_param(req.target, "order"), query_param(req.target, "after"),
                               query_number(req, "limit", 20, 1, 100), "response"),
                     rid);
  }
  if (req.method == "DELETE") {
    r->mark_deleted();
    r->cancel();
    responses_.erase(id);
    return send_json(res, 200, {{"id", id}, {"object", "response"}, {"deleted", true}}, rid);
  }
  if (action == "cancel" && r->cancel()) {
    // The engine ends the run at its next step: the answer waits for that (on a work thread).
    auto task = [this, r, res, rid] {
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (r->running() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      send_json(res, 200, r->response(), rid);
    };
    if (work_.post(std::move(task), static_cast<size_t>(std::max<int64_t>(1, config_.max_queued_requests)))) return;
  }
  send_json(res, 200, r->response(), rid);
}

void ApiServer::files_route(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid) {
  if (!files_.enabled()) throw ApiError(400, "the server keeps no files (it runs with --files-store-mib 0)");
  const std::string& path = req.path;
  if (path == "/v1/files") {
    if (req.method == "GET") {
      const std::string order = query_param(req.target, "order");
      return send_json(res, 200, files_.list(query_param(req.target, "purpose"), order.empty() ? "desc" : order,
                                             query_param(req.target, "after"), query_number(req, "limit", 10000, 1, 10000)),
                       rid);
    }
    if (req.method != "POST") throw ApiError(405, "use POST /v1/files (an upload) or GET /v1/files (the list)");
    const std::vector<FormPart> parts = parse_multipart(req.header("content-type"), req.body);
    const FormPart* file = nullptr;
    std::string purpose;
    json expires_after;  // OpenAI's clients send the object as the fields expires_after[anchor] and [seconds]
    for (const FormPart& p : parts) {
      if (p.name == "file" && file == nullptr) file = &p;
      if (p.name == "purpose") purpose = std::string(p.data);
      if (p.name == "expires_after[anchor]") expires_after["anchor"] = std::string(p.data);
      if (p.name == "expires_after[seconds]") {
        const std::string text(p.data);
        const bool digits = !text.empty() && text.size() < 12 && text.find_first_not_of("0123456789") == std::string::npos;
        expires_after["seconds"] = digits ? json(std::stoll(text)) : json(text);
      }
    }
    if (file == nullptr) throw ApiError(400, "the upload has no 'file' part", "file");
    if (purpose != "batch") {
      throw ApiError(400, fmt::format("purpose is '{}': duet keeps files for batches, purpose 'batch'", purpose.substr(0, 64)),
                     "purpose");
    }
    const StoredFile f = files_.put({file->filename.empty() ? "file" : file->filename, purpose,
                                     expires_after_seconds(expires_after, "expires_after")},
                                    std::string(file->data));
    return send_json(res, 200, f.to_json(), rid);
  }
  std::string id = path.substr(std::string("/v1/files/").size());
  const bool content = id.size() > 8 && id.compare(id.size() - 8, 8, "/content") == 0;
  if (content) id.resize(id.size() - 8);
  const auto f = files_.get(id);
  if (!f || id.find('/') != std::string::npos) throw ApiError(404, fmt::format("No such File object: {}", id), "file_id");
  if (content) {
    if (req.method != "GET") throw ApiError(405, fmt::format("use GET {}", path));
    std::optional<BodySource> body = files_.open_content(id);
    if (!body) throw ApiError(404, fmt::format("No such File object: {}", id), "file_id");
    return res->send_body(200, "application/octet-stream", std::move(*body), {{"X-Request-Id", rid.header()}});
  }
  if (req.method == "GET") return send_json(res, 200, f->to_json(), rid);
  if (req.method != "DELETE") throw ApiError(405, fmt::format("use GET or DELETE {}", path));
  files_.erase(id);
  send_json(res, 200, {{"id", id}, {"object", "file"}, {"deleted", true}}, rid);
}

void ApiServer::uploads_route(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid) {
  if (!files_.enabled()) throw ApiError(400, "the server keeps no files (it runs with --files-store-mib 0)");
  if (req.method != "POST") throw ApiError(405, fmt::format("use POST {}", req.path));
  const std::string& path = req.path;
  if (path == "/v1/uploads") return send_json(res, 200, uploads_.create(parse_json_body(req.body)), rid);
  std::string rest = path.substr(std::string("/v1/uploads/").size());
  const size_t slash = rest.find('/');
  const std::string id = rest.substr(0, slash);
  const std::string action = slash == std::string::npos ? std::string() : rest.substr(slash + 1);
  if (action == "parts") {
    const std::vector<FormPart> parts = parse_multipart(req.header("content-type"), req.body);
    const FormPart* data = nullptr;
    for (const FormPart& p : parts) {
      if (p.name == "data" && data == nullptr) data = &p;
    }
    if (data == nullptr) throw ApiError(400, "the part's upload has no 'data' field", "data");
    return send_json(res, 200, uploads_.add_part(id, data->data), rid);
  }
  if (action == "complete") return send_json(res, 200, uploads_.complete(id, parse_json_body(req.body)), rid);
  if (action == "cancel") return send_json(res, 200, uploads_.cancel(id), rid);
  throw ApiError(404, fmt::format("no route for {} {}", req.method, path), "", "not_found");
}

void ApiServer::batches_route(const HttpRequest& req, const std::shared_ptr<Responder>& res, const RequestIds& rid) {
  if (!files_.enabled()) throw ApiError(400, "the server runs no batches (it runs with --files-store-mib 0)");
  const std::string& path = req.path;
  if (path == "/v1/batches") {
    if (req.method == "GET") {
      return send_json(res, 200, batches_.list(query_param(req.target, "after"), query_number(req, "limit", 20, 1, 100)),
                       rid);
    }
    if (req.method != "POST") throw ApiError(405, "use POST /v1/batches (a new batch) or GET /v1/batches (the list)");
    return send_json(res, 200, batches_.create(parse_json_body(req.body)), rid);
  }
  std::string id = path.substr(std::string("/v1/batches/").size());
  const bool cancel = id.size() > 7 && id.compare(id.size() - 7, 7, "/cancel") == 0;
  if (cancel) {
    id.resize(id.size() - 7);
    if (req.method != "POST") throw ApiError(405, fmt::format("use POST {}", path));
    return send_json(res, 200, batches_.cancel(id), rid);
  }
  if (req.method != "GET") throw ApiError(405, fmt::format("use GET {}", path));
  send_json(res, 200, batches_.get(id), rid);
}

// Anthropic's Message Batches: POST and GET /v1/messages/batches, GET and DELETE
// /v1/messages/batches/{id}, POST .../cancel, GET .../results (JSON lines).
void ApiServer::message_batches_route(const HttpRequest& req, const std::shared_ptr<Responder>& res,
                                      const RequestIds& rid) {
  if (!files_.enabled()) throw ApiError(400, "the server runs no batches (it runs with --files-store-mib 0)");
  const std::string& path = req.path;
  const std::string root = "/v1/messages/batches";
  if (path == root) {
    if (req.method == "GET") {
      return send_json(res, 200,
                       message_batches_.list(query_param(req.target, "before_id"), query_param(req.target, "after_id"),
                                             query_number(req, "limit", 20, 1, 1000)),
                       rid);
    }
    if (req.method != "POST") throw ApiError(405, fmt::format("use POST {} (a new batch) or GET {} (the list)", root, root));
    return send_json(res, 200, message_batches_.create(parse_json_body(req.body)), rid);
  }
  std::string id = path.substr(root.size() + 1);
  const size_t slash = id.find('/');
  const std::string action = slash == std::string::npos ? std::string() : id.substr(slash + 1);
  id.resize(std::min(id.size(), slash));
  if (action == "cancel") {
    if (req.method != "POST") throw ApiError(405, fmt::format("use POST {}", path));
    return send_json(res, 200, message_batches_.cancel(id), rid);
  }
  if (action == "results") {
    if (req.method != "GET") throw ApiError(405, fmt::format("use GET {}", path));
    return res->send(200, "application/x-jsonl", message_batches_.results(id), {{"X-Request-Id", rid.header()}});
  }
  if (!action.empty()) throw ApiError(404, fmt::format("no route for {} {}", req.method, path), "", "not_found");
  if (req.method == "GET") return send_json(res, 200, message_batches_.get(id), rid);
  if (req.method != "DELETE") throw ApiError(405, fmt::format("use GET or DELETE {}", path));
  send_json(res, 200, message_batches_.erase(id), rid);
}

void ApiServer::submit(Served& s, std::shared_ptr<CompletionCall> call, const HttpRequest& req,
                       const std::shared_ptr<Responder>& res, const RequestIds& rid, Clock::time_point start) {
  const std::shared_ptr<EngineService>& svc = s.service;
  // Every prompt waits as a request of its own, so each counts against the limit.
  const int64_t waiting = svc->num_waiting();
  const auto adding = static_cast<int64_t>(call->parsed.prompts.size());
  if (!req.internal && waiting + adding > config_.max_queued_requests) {
    throw ApiError(503, fmt::format("{} requests are already waiting and this one adds {} (the limit is {}); retry later",
                                    waiting, adding, config_.max_queued_requests));
  }
  if (!svc->healthy()) throw ApiError(503, "the engine is unhealthy: " + svc->unhealthy_reason());
  call->responder = res;
  call->request_id = rid;
  call->path = req.path;
  call->remote = req.remote;
  call->start = start;
  call->remaining = call->parsed.prompts.size();
  if (call->parsed.stream) {
    res->start_stream(200, "text/event-stream", {{"X-Request-Id", rid.header()}});
    std::string events = call->builder->stream_start();
    if (!events.empty()) res->write(std::move(events));
  }

  std::vector<std::string> ids;
  for (size_t i = 0; i < call->parsed.prompts.size(); ++i) ids.push_back(fmt::format("{}-{}", rid.id, i));
  std::weak_ptr<EngineService> weak = svc;
  // A background response runs on without its client.
  if (!call->background) {
    res->on_disconnect([weak, ids] {
      if (auto s = weak.lock()) {
        for (const std::string& id : ids) s->abort(id);
      }
    });
  }

  auto finish = [this, call, served = &s, req_copy = HttpRequest{req.method, req.target, req.path, {}, {}, req.remote}] {
    // Runs once, on the engine thread, after the last prompt finished.
    std::lock_guard<std::mutex> lock(call->mutex);
    if (!call->error && !call->parsed.stream) call->error = call->builder->failure();
    const int status = call->error ? call->error->status() : 200;
    if (call->error) ++served->requests_failed;
    if (call->on_finish) call->on_finish();
    if (call->detached) {
      // Answered when it started.
    } else if (call->parsed.stream) {
      call->responder->write(call->builder->stream_end(call->error ? &*call->error : nullptr));
      call->responder->finish();
    } else if (call->error) {
      send_error(call->responder, *call->error, call->request_id);
    } else {
      call->responder->send(200, "application/json", call->builder->final_body(), {{"X-Request-Id", call->request_id.header()}});
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

json ApiServer::tokenize(const ServedModel& model, const json& body) {
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object");
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    const bool continue_final = get_bool(body, "continue_final_message", false);
    ids = chat_prompt_ids(body["messages"], get_bool(body, "add_generation_prompt", !continue_final),
                          json_field(body, "chat_template_kwargs"), model, continue_final);
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    const bool add_special = get_bool(body, "add_special_tokens", true);
    ids = model.tokenizer->encode(body["prompt"].get<std::string>(), add_special, true);
  } else {
    throw ApiError(400, "give prompt (a string) or messages", "prompt");
  }
  json out = {{"count", ids.size()}, {"max_model_len", model.max_model_len}, {"tokens", ids}};
  // vLLM's return_token_strs: each token's vocabulary entry as the tokenizer holds it.
  if (get_bool(body, "return_token_strs", false)) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(model.tokenizer->token_text(id));
    out["token_strs"] = std::move(strs);
  }
  return out;
}

json ApiServer::detokenize(const ServedModel& model, const json& body) {
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
    throw ApiError(400, "tokens must be a list of token ids", "tokens");
  }
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= model.vocab_size) {
      throw ApiError(400, fmt::format("tokens must be token ids in [0, {})", model.vocab_size), "tokens");
    }
    ids.push_back(t.get<int32_t>());
  }
  return {{"prompt", model.tokenizer->decode(ids, false)}};
}

std::string ApiServer::metrics() {
  std::vector<ModelMetrics> all;
  for (const auto& s : served_) {
    if (!s->ready()) continue;
    ModelMetrics mm{s->name, s->service->metrics(), {}};
    mm.counters.requests_total = s->requests_total.load();
    mm.counters.requests_failed = s->requests_failed.load();
    // The machine's energy and the HTTP server's counts are the server's: under the first model
    // that serves.
    if (all.empty() && energy_.available()) mm.counters.energy_joules = energy_.joules();
    if (all.empty() && http_ != nullptr) {
      mm.counters.http_connections = http_->open_connections();
      mm.counters.http_accept_failures = http_->accept_failures();
    }
    if (all.empty()) {
      mm.counters.stored_responses = static_cast<int64_t>(responses_.size());
      mm.counters.stored_response_bytes = static_cast<int64_t>(responses_.bytes());
      if (conversations_.enabled()) {
        mm.counters.conversations = static_cast<int64_t>(conversations_.size());
        mm.counters.conversation_bytes = static_cast<int64_t>(conversations_.bytes());
      }
      if (files_.enabled()) {
        mm.counters.files_bytes = static_cast<int64_t>(files_.bytes());
        mm.counters.batches = batches_.counts();
      }
    }
    all.push_back(std::move(mm));
  }
  return render_metrics(all);
}

std::unique_ptr<ChatTemplate> load_chat_template(const ServedModelConfig& config, const GgufFile& file) {
  if (config.chat_template_file.empty()) return std::make_unique<ChatTemplate>(chat_template_for(file));
  if (!std::filesystem::exists(config.chat_template_file)) {
    for (BuiltinChatFormat f : {BuiltinChatFormat::kDeepSeekLLM, BuiltinChatFormat::kDeepSeekCoder,
                                BuiltinChatFormat::kDeepSeekV3, BuiltinChatFormat::kDeepSeekR1,
                                BuiltinChatFormat::kDeepSeekV32}) {
      if (builtin_chat_format_name(f) == config.chat_template_file) {
        return std::make_unique<ChatTemplate>(builtin_chat_template(f));
      }
    }
  }
  std::ifstream in(config.chat_template_file);
  if (!in) fail(ErrorCode::kNotFound, "cannot read --chat-template '{}' (expected a file, or deepseek-llm, deepseek-coder, deepseek-v3, deepseek-r1 or deepseek-v32)", config.chat_template_file);
  std::stringstream ss;
  ss << in.rdbuf();
  return std::make_unique<ChatTemplate>(ChatTemplate::parse(ss.str()));
}

// SIGHUP: logrotate moved the log file away; go on in a new file of the same name.
void reopen_log_after_sighup() {
  try {
    const std::string path = reopen_log_file();
    if (!path.empty()) spdlog::info("opened the log file {} again (SIGHUP)", path);
  } catch (const Error& e) {
    spdlog::error("SIGHUP: {}; logging goes on in the old file", e.what());
    fmt::print(stderr, "duet: {}\n", e.what());
  }
}

// Refuses settings a served model cannot start with (before anything loads).
void check_served_models(const std::vector<ServedModelConfig>& models) {
  for (const ServedModelConfig& m : models) {
    if (!m.reasoning_parser.empty() && m.reasoning_parser != "deepseek_r1") {
      fail(ErrorCode::kInvalidArgument, "--reasoning-parser '{}' is not known (expected deepseek_r1)", m.reasoning_parser);
    }
    if (!m.tool_call_parser.empty() && !tool_call_format(m.tool_call_parser)) {
      fail(ErrorCode::kInvalidArgument, "--tool-call-parser '{}' is not known (expected deepseek_v3, deepseek_v31 or deepseek_v32)",
           m.tool_call_parser);
    }
    if (m.enable_auto_tool_choice && m.tool_call_parser.empty()) {
      fail(ErrorCode::kInvalidArgument, "--enable-auto-tool-choice needs --tool-call-parser");
    }
  }
}

// What loading the served models came to.
struct LoadOutcome {
  std::string served_names, failed_names;  // quoted, comma-separated
  int64_t kv_blocks = 0;
  std::exception_ptr first_error;  // of the first model that failed
};

// Loads each model on its own into `api`: one that fails is marked so and leaves the others.
LoadOutcome load_models(ApiServer& api, const std::vector<ServedModelConfig>& models) {
  LoadOutcome out;
  for (size_t i = 0; i < models.size(); ++i) {
    const ServedModelConfig& m = models[i];
    try {
      auto engine = LLMEngine::from_file(m.model, m.engine);
      auto chat_template = load_chat_template(m, engine->file());
      const int64_t blocks = engine->num_kv_blocks();
      api.set_ready(i, std::make_shared<EngineService>(std::move(engine)), std::move(chat_template));
      out.kv_blocks += blocks;
      out.served_names += fmt::format("{}'{}'", out.served_names.empty() ? "" : ", ", m.name());
      if (models.size() > 1) spdlog::info("model '{}' loaded from {} ({} KV blocks)", m.name(), m.model, blocks);
    } catch (const std::exception& e) {
      if (!out.first_error) out.first_error = std::current_exception();
      api.set_load_error(i, e.what());
      out.failed_names += fmt::format("{}'{}'", out.failed_names.empty() ? "" : ", ", m.name());
      if (models.size() > 1) {
        spdlog::error("model '{}' failed to load: {}", m.name(), e.what());
        fmt::print(stderr, "duet: model '{}' failed to load: {}\n", m.name(), e.what());
      }
    }
  }
  return out;
}

}  // namespace

int run_server(const ServerConfig& config) {
  const std::vector<ServedModelConfig> models = config.served_models();
  check_served_models(models);
  // Termination signals, and SIGHUP (open the log file again), are taken by sigwait below, in this
  // thread only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  ApiServer api(config, models);
  HttpServer http(config.http, [&api](HttpRequest&& req, std::shared_ptr<Responder> res) { api.handle(std::move(req), res); });
  api.set_http(&http);
  http.start();
  std::string names;
  for (const ServedModelConfig& m : models) names += (names.empty() ? "" : ", ") + m.name();
  // An IPv6 address goes in brackets in a URL.
  const std::string url = fmt::format("{}://{}:{}", http.scheme(),
                                      config.http.host.find(':') == std::string::npos ? config.http.host
                                                                                      : "[" + config.http.host + "]",
                                      http.port());
  fmt::print(stderr, "duet: listening on {} (model{} {} loading)\n", url,
             models.size() > 1 ? "s" : "", names);
  std::fflush(stderr);

  // Each model loads on its own; one that fails leaves the others serving. The server stops only
  // when none loads (with the first model's error).
  const auto load_start = Clock::now();
  const LoadOutcome loaded = load_models(api, models);
  const std::string& served_names = loaded.served_names;
  const std::string& failed_names = loaded.failed_names;
  const int64_t kv_blocks = loaded.kv_blocks;
  if (served_names.empty()) {
    http.stop();
    std::rethrow_exception(loaded.first_error);
  }
  fmt::print(stderr, "duet: ready in {:.1f} s: serving {} on {} ({} KV blocks){}\n",
             seconds_between(load_start, Clock::now()), served_names, url, kv_blocks,
             failed_names.empty() ? "" : "; failed to load: " + failed_names);
  std::fflush(stderr);
  api.start_batches();

  std::vector<std::shared_ptr<EngineService>> services;
  for (size_t i = 0; i < api.num_models(); ++i) {
    if (api.served(i).ready()) services.push_back(api.served(i).service);
  }
  const auto unfinished = [&] {
    int64_t n = 0;
    for (const auto& s : services) n += s->num_unfinished();
    return n;
  };
  int signal_number = 0;
  // A model over several ranks (mpirun): the job is that model's.
  std::shared_ptr<EngineService> service;
  for (const auto& s : services) {
    if (s->engine().parallel()) service = s;
  }
  if (service) {
    // Over several ranks the job ends as a whole: mpirun sends SIGTERM when another rank ended
    // (or it was stopped itself) and SIGKILL a moment later, so there is no time to drain. What
    // is in flight gets its 503 at once, and a failed rank (noticed by a step or a heartbeat)
    // ends this rank too, non-zero, so that a supervisor restarts the job.
    for (;;) {
      const timespec tick{0, 100'000'000};
      signal_number = sigtimedwait(&signals, nullptr, &tick);
      if (signal_number == SIGHUP) {
        reopen_log_after_sighup();
        signal_number = 0;
      } else if (signal_number > 0) {
        service->fail_in_flight(fmt::format("the job is stopping (signal {} from the launcher: a rank ended or the "
                                            "job was stopped)", signal_number));
      }
      if (!service->healthy()) break;
    }
    const std::string reason = service->unhealthy_reason();
    fmt::print(stderr, "duet: the job cannot go on: {}\n", reason);
    std::fflush(stderr);
    // The 503s go out, and /health says unhealthy, for a moment (unless SIGKILL comes first).
    std::this_thread::sleep_for(std::chrono::seconds(signal_number > 0 ? 0 : 2));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    http.stop();
    std::fflush(stdout);
    std::fflush(stderr);
    // Every rank ends now, this one with status 3 (what mpirun exits with); nothing waits for the
    // engine thread, which may be stuck on the rank that is gone.
    mpi_abort(3);
    return 3;
  }
  while (sigwait(&signals, &signal_number) == 0 && signal_number == SIGHUP) reopen_log_after_sighup();
  spdlog::info("received signal {}: draining for up to {} s", signal_number, config.shutdown_timeout_seconds);
  fmt::print(stderr, "duet: stopping (signal {}), letting {} requests finish\n", signal_number, unfinished());
  http.stop_accepting();
  api.stop_batches();
  for (const auto& s : services) s->stop_admitting();
  const auto deadline = Clock::now() + std::chrono::seconds(config.shutdown_timeout_seconds);
  while (unfinished() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int64_t left = unfinished();
  for (const auto& s : services) s->shutdown();  // aborts whatever is still running
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the last replies go out
  http.stop();
  fmt::print(stderr, "duet: stopped ({} requests aborted at the deadline)\n", left);
  return 0;
}

int run_batch(const ServerConfig& given, const std::string& input, const std::string& output) {
  // Nobody but the file sends requests: no keys, no console, and nothing kept for later reads.
  ServerConfig config = given;
  config.api_keys.clear();
  config.no_ui = true;
  config.responses_store_mib = 0;
  config.responses_redis.clear();
  config.files_store_mib = 0;
  config.files_dir.clear();
  const std::vector<ServedModelConfig> models = config.served_models();
  check_served_models(models);
  // Both files are opened before the models load, so that a wrong path fails at once. An http(s)
  // URL is read with GET now, and the results are sent with PUT at the end (vLLM's way to reach
  // object stores: a presigned URL).
  auto is_url = [](const std::string& s) { return s.starts_with("http://") || s.starts_with("https://"); };
  std::ifstream in_file;
  std::istringstream in_fetched;
  if (is_url(input)) {
    HttpReply got = http_call("GET", parse_base_url(input), "", {}, 60.0);
    if (got.status != 200) {
      fail(ErrorCode::kNotFound, "cannot read the batch input '{}': GET answered {}", input, got.status);
    }
    in_fetched.str(std::move(got.body));
  } else if (input != "-") {
    in_file.open(input);
    if (!in_file) fail(ErrorCode::kNotFound, "cannot read the batch input '{}': {}", input, std::strerror(errno));
  }
  std::ofstream out_file;
  std::ostringstream out_collected;
  if (!is_url(output) && output != "-") {
    out_file.open(output, std::ios::out | std::ios::trunc);
    if (!out_file) fail(ErrorCode::kUnavailable, "cannot write the batch output '{}': {}", output, std::strerror(errno));
  }
  std::istream& in = is_url(input) ? in_fetched : input == "-" ? std::cin : static_cast<std::istream&>(in_file);
  std::ostream& out = is_url(output)  ? out_collected
                      : output == "-" ? std::cout
                                      : static_cast<std::ostream&>(out_file);

  ApiServer api(config, models);
  const auto load_start = Clock::now();
  const LoadOutcome loaded = load_models(api, models);
  if (loaded.first_error) std::rethrow_exception(loaded.first_error);  // each line may name any model
  fmt::print(stderr, "duet: ready in {:.1f} s: running the batch {} on {} ({} KV blocks)\n",
             seconds_between(load_start, Clock::now()), input == "-" ? "from stdin" : "'" + input + "'",
             loaded.served_names, loaded.kv_blocks);
  std::fflush(stderr);

  // As many requests in flight as the engines keep busy twice over (vLLM's window).
  BatchRunOptions options;
  options.max_in_flight = 0;
  for (const ServedModelConfig& m : models) {
    options.max_in_flight += 2 * static_cast<size_t>(std::max(1, m.engine.scheduler.max_num_seqs));
  }
  const auto start = Clock::now();
  const BatchRunStats stats = run_batch_lines(
      in, out, [&api](HttpRequest&& req, std::shared_ptr<Responder> res) { api.handle(std::move(req), std::move(res)); },
      options, [&](const BatchRunStats& s) {
        fmt::print(stderr, "duet: run-batch: {} of {} requests done ({} failed), {:.1f} s\n", s.succeeded + s.failed,
                   s.lines, s.failed, seconds_between(start, Clock::now()));
        std::fflush(stderr);
      });
  out.flush();
  const bool written = static_cast<bool>(out);
  for (size_t i = 0; i < api.num_models(); ++i) api.served(i).service->shutdown();
  const double seconds = seconds_between(start, Clock::now());
  fmt::print(stderr,
             "duet: run-batch: {} requests, {} succeeded, {} failed in {:.1f} s; {} prompt and {} generated tokens "
             "({:.1f} generated tokens/s)\n",
             stats.lines, stats.succeeded, stats.failed, seconds, stats.prompt_tokens, stats.completion_tokens,
             seconds > 0 ? static_cast<double>(stats.completion_tokens) / seconds : 0.0);
  if (!written) fail(ErrorCode::kUnavailable, "writing the batch output '{}' failed: {}", output, std::strerror(errno));
  if (is_url(output)) {
    // Three tries; the results are not lost when none succeeds.
    std::string error;
    for (int attempt = 1; attempt <= 3; ++attempt) {
      try {
        const HttpReply put = http_call("PUT", parse_base_url(output), "", out_collected.str(), 60.0);
        if (put.status >= 200 && put.status < 300) return stats.failed > 0 ? 1 : 0;
        error = fmt::format("PUT answered {}", put.status);
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (attempt < 3) std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    const std::string kept = fmt::format("run-batch-output-{}.jsonl", getpid());
    std::ofstream save(kept);
    save << out_collected.str();
    fail(ErrorCode::kUnavailable, "cannot send the batch output to '{}' ({}); the results are in {}", output, error,
         save ? kept : std::string("no file either (it could not be written)"));
  }
  return stats.failed > 0 ? 1 : 0;
}

}  // namespace duet::server
