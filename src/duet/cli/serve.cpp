// `duet serve --model PATH [--host 127.0.0.1] [--port 8000] [--config duet.yaml] ...`: the
// OpenAI-compatible server.
#include <pthread.h>
#include <signal.h>

#include <tuple>

#include <fmt/format.h>

#include "duet/cli/commands.h"
#include "duet/cli/engine_options.h"
#include "duet/core/error.h"
#include "duet/core/log.h"
#include "duet/server/api_server.h"

namespace duet::cli {
namespace {

struct ServeOptions {
  server::ServerConfig config;
  EngineOptions engine;
  std::string config_file;
  std::string log_format = "text";
  std::vector<std::string> models;  // --model, once per model
  std::vector<std::string> names;   // --served-model-name, in the same order
  std::string allowed_origins, allowed_methods, allowed_headers;  // as given: a JSON list or commas
};

// The options serve and run-batch share: the models, how requests to them are read, logging and
// the engine.
void add_model_options(CLI::App* cmd, ServeOptions& o) {
  server::ServerConfig& c = o.config;
  cmd->add_option("-m,--model", o.models,
                  "GGUF model file or Hugging Face model folder (again for more models, served side by side)");
  cmd->add_option("--config", o.config_file, "YAML file with these settings (keys: the flag names with _)");
  cmd->add_option("--served-model-name", o.names,
                  "Model name clients use (default: the file name); once per --model, in the same order");
  cmd->add_option("--api-threads", c.api_threads,
                  "Threads that parse request bodies, render chat templates and tokenize")
      ->capture_default_str();
  cmd->add_option("--reasoning-parser", c.reasoning_parser, "deepseek_r1: thinking goes to reasoning_content");
  cmd->add_option("--tool-call-parser", c.tool_call_parser,
                  "deepseek_v3, deepseek_v31 or deepseek_v32: tool calls in the output become OpenAI tool_calls");
  cmd->add_flag("--enable-auto-tool-choice", c.enable_auto_tool_choice,
                "Accept tool_choice \"auto\" (the model decides; needs --tool-call-parser)");
  cmd->add_option("--chat-template", c.chat_template_file,
                  "Jinja chat template file overriding the model's, or a built-in format: deepseek-llm, deepseek-coder, "
                  "deepseek-v3, deepseek-r1, deepseek-v32");
  cmd->add_option("--log-format", o.log_format, "text or json")->capture_default_str();
  cmd->add_option("--log-file", c.log_file, "Append logs to this file instead of stderr");
  add_engine_options(cmd, o.engine);
}

// The configuration the options describe, the YAML file's settings under the flags given, and
// logging configured. Throws Error for settings that cannot start.
void resolve_config(CLI::App* cmd, CLI::App& app, ServeOptions& o) {
  server::ServerConfig& cfg = o.config;
  cfg.engine = o.engine.resolve();
  if (!o.models.empty()) {
    cfg.model = o.models.front();
    cfg.more_models.assign(o.models.begin() + 1, o.models.end());
  }
  if (!o.names.empty()) {
    cfg.served_model_name = o.names.front();
    cfg.more_served_model_names.assign(o.names.begin() + 1, o.names.end());
  }
  if (o.log_format != "text" && o.log_format != "json") {
    fail(ErrorCode::kInvalidArgument, "--log-format is '{}', expected text or json", o.log_format);
  }
  cfg.log_format = o.log_format == "json" ? LogFormat::kJson : LogFormat::kText;
  for (auto [flag, text, list] : {std::tuple{"--allowed-origins", &o.allowed_origins, &cfg.cors.allowed_origins},
                                  std::tuple{"--allowed-methods", &o.allowed_methods, &cfg.cors.allowed_methods},
                                  std::tuple{"--allowed-headers", &o.allowed_headers, &cfg.cors.allowed_headers}}) {
    const CLI::Option* opt = cmd->get_option_no_throw(flag);
    if (opt != nullptr && opt->count() > 0) *list = server::parse_cors_list(*text, flag);
  }
  if (!o.config_file.empty()) {
    // Flags given on the command line win over the file.
    std::vector<std::string> given;
    for (const CLI::Option* opt : cmd->get_options()) {
      if (opt->count() == 0 || opt->get_lnames().empty()) continue;
      std::string key = opt->get_lnames().front();
      for (char& ch : key) ch = ch == '-' ? '_' : ch;
      given.push_back(key);
    }
    server::apply_config_file(o.config_file, cfg, given);
  }
  // Refuses a missing model, repeated names, or names without models.
  const size_t num_models = cfg.served_models().size();
  cfg.check();
  const ParallelConfig& pc = o.engine.parallel.config;
  if (num_models > 1 && pc.tensor_parallel * pc.pipeline_parallel > 1) {
    fail(ErrorCode::kInvalidArgument, "{} models with --tensor-parallel-size {} x --pipeline-parallel-size {}: a "
         "job over several ranks serves one model (start one job per model)", num_models, pc.tensor_parallel,
         pc.pipeline_parallel);
  }
  const CLI::Option* level = app.get_option("--log-level");
  configure_logging(level->count() > 0 ? level->as<std::string>() : cfg.log_level, cfg.log_format, cfg.log_file);
}

}  // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  auto o = std::make_shared<ServeOptions>();
  server::ServerConfig& c = o->config;
  add_model_options(cmd, *o);
  cmd->add_option("--max-queued-requests", c.max_queued_requests, "Waiting requests before new ones get 503")
      ->capture_default_str();
  cmd->add_option("--host", c.http.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", c.http.port, "Port (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", c.api_keys, "Accept only requests with 'Authorization: Bearer KEY' (repeatable)");
  cmd->add_option("--ssl-certfile", c.http.tls_cert_file, "Serve HTTPS with this certificate chain (PEM; with --ssl-keyfile)");
  cmd->add_option("--ssl-keyfile", c.http.tls_key_file, "The private key of --ssl-certfile (PEM, unencrypted)");
  cmd->add_option("--ssl-ca-certs", c.http.tls_ca_file, "CA certificates (PEM) that clients' certificates are checked against");
  cmd->add_option("--ssl-cert-reqs", c.http.tls_client_certs,
                  "Client certificates: 0 not asked for, 1 checked when sent, 2 required (needs --ssl-ca-certs)")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", c.http.max_body_bytes, "Largest request body (413 above)")->capture_default_str();
  cmd->add_option("--responses-store-mib", c.responses_store_mib,
                  "Memory for /v1/responses kept for previous_response_id, GET and background runs (0: keep none)")
      ->capture_default_str();
  cmd->add_option("--files-store-mib", c.files_store_mib,
                  "Room for /v1/files: batch input files and the results of /v1/batches, in memory or in --files-dir "
                  "(0: no files or batches)")
      ->capture_default_str();
  cmd->add_option("--max-running-batches", c.max_running_batches,
                  "/v1/batches that run at once, each with as many lines in flight as the engines run sequences "
                  "(the others wait their turn)")
      ->capture_default_str();
  cmd->add_option("--files-dir", c.files_dir,
                  "Keep /v1/files and /v1/batches in this folder: they outlive restarts, and a batch that was "
                  "running goes on where it stopped (one server per folder)");
  cmd->add_option("--responses-redis", c.responses_redis,
                  "Keep finished /v1/responses in Redis too (redis://HOST:PORT[/DB]): they outlive restarts, and "
                  "servers on the same Redis share them");
  cmd->add_option("--http-threads", c.http.io_threads, "Threads serving connections")->capture_default_str();
  cmd->add_option("--shutdown-timeout", c.shutdown_timeout_seconds, "Seconds in-flight requests get on SIGTERM")
      ->capture_default_str();
  cmd->add_flag("--no-ui", c.no_ui, "Do not serve the web console at /");
  cmd->add_flag("--allow-runtime-lora-updating", c.allow_runtime_lora_updating,
                "Accept POST /v1/load_lora_adapter and /v1/unload_lora_adapter (LoRA adapters loaded from a path "
                "the client names: only where clients may read the server's files)");
  cmd->add_option("--allowed-origins", o->allowed_origins,
                  "Origins whose browser pages may call the API (CORS): a JSON list or comma-separated (default: "
                  "[\"*\"], any)");
  cmd->add_option("--allowed-methods", o->allowed_methods, "Methods such pages may use (default: [\"*\"])");
  cmd->add_option("--allowed-headers", o->allowed_headers, "Request headers such pages may send (default: [\"*\"])");
  cmd->add_flag("--allow-credentials", c.cors.allow_credentials, "Let such pages send cookies and HTTP authentication");
  cmd->add_option("--batch-wait-ms", o->engine.config.scheduler.batch_wait_ms,
                  "Batching window: hold new requests up to this long for more to join them (0: off)")
      ->capture_default_str();
  cmd->add_option("--batch-wait-tokens", o->engine.config.scheduler.batch_wait_tokens,
                  "The window holds new requests while they have fewer prompt tokens (0: --max-num-batched-tokens)")
      ->capture_default_str();

  cmd->callback([cmd, o, &app, &exit_code] {
    server::ServerConfig& cfg = o->config;
    resolve_config(cmd, app, *o);
    // SIGTERM, SIGINT and SIGHUP are the server's to take (sigwait in run_server): blocked before
    // MPI starts its threads, which inherit the mask.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    cfg.engine.parallel = start_parallel(o->engine.parallel);
    if (is_worker(cfg.engine.parallel)) {
      // Every rank but 0 runs its share of the model for rank 0's engine; only rank 0 listens.
      exit_code = run_worker_rank(cfg.model, cfg.engine);
      return;
    }
    exit_code = server::run_server(cfg);
  });
}

void add_run_batch_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "run-batch", "Run a file of requests in OpenAI's batch format (JSON lines: custom_id, method, url, body) and "
                   "write one result line per request");
  auto o = std::make_shared<ServeOptions>();
  auto files = std::make_shared<std::pair<std::string, std::string>>();
  cmd->add_option("-i,--input-file", files->first,
                  "The requests, one JSON object a line: a file, '-' (stdin) or an http(s) URL (read with GET)")
      ->required();
  cmd->add_option("-o,--output-file", files->second,
                  "Where the results go, in the input's order: a file, '-' (stdout) or an http(s) URL (sent with PUT)")
      ->required();
  add_model_options(cmd, *o);
  o->config.log_level = "warn";  // the file's requests are not logged one by one unless asked
  cmd->callback([cmd, o, files, &app, &exit_code] {
    server::ServerConfig& cfg = o->config;
    resolve_config(cmd, app, *o);
    cfg.engine.parallel = start_parallel(o->engine.parallel);
    exit_code = is_worker(cfg.engine.parallel) ? run_worker_rank(cfg.model, cfg.engine)
                                               : server::run_batch(cfg, files->first, files->second);
    cfg.engine.parallel.reset();  // the ranks' communicators go before main finalizes MPI
  });
}

}  // namespace duet::cli
