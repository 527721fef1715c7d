// `duet serve --model PATH [--host 127.0.0.1] [--port 8000] [--config duet.yaml] ...`: the
// OpenAI-compatible server.
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
};

}  // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  auto o = std::make_shared<ServeOptions>();
  server::ServerConfig& c = o->config;
  cmd->add_option("-m,--model", c.model, "GGUF model file or Hugging Face model folder");
  cmd->add_option("--config", o->config_file, "YAML file with these settings (keys: the flag names with _)");
  cmd->add_option("--served-model-name", c.served_model_name, "Model name clients use (default: the file name)");
  cmd->add_option("--host", c.http.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", c.http.port, "Port (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", c.api_keys, "Accept only requests with 'Authorization: Bearer KEY' (repeatable)");
  cmd->add_option("--max-queued-requests", c.max_queued_requests, "Waiting requests before new ones get 503")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", c.http.max_body_bytes, "Largest request body (413 above)")->capture_default_str();
  cmd->add_option("--http-threads", c.http.io_threads, "Threads serving connections")->capture_default_str();
  cmd->add_option("--shutdown-timeout", c.shutdown_timeout_seconds, "Seconds in-flight requests get on SIGTERM")
      ->capture_default_str();
  cmd->add_option("--reasoning-parser", c.reasoning_parser, "deepseek_r1: thinking goes to reasoning_content");
  cmd->add_option("--chat-template", c.chat_template_file, "Jinja chat template file overriding the model's");
  cmd->add_option("--log-format", o->log_format, "text or json")->capture_default_str();
  cmd->add_option("--log-file", c.log_file, "Append logs to this file instead of stderr");
  cmd->add_flag("--no-ui", c.no_ui, "Do not serve the web console at /");
  add_engine_options(cmd, o->engine);

  cmd->callback([cmd, o, &app, &exit_code] {
    server::ServerConfig& cfg = o->config;
    cfg.engine = o->engine.resolve();
    if (o->log_format != "text" && o->log_format != "json") {
      fail(ErrorCode::kInvalidArgument, "--log-format is '{}', expected text or json", o->log_format);
    }
    cfg.log_format = o->log_format == "json" ? LogFormat::kJson : LogFormat::kText;
    if (!o->config_file.empty()) {
      // Flags given on the command line win over the file.
      std::vector<std::string> given;
      for (const CLI::Option* opt : cmd->get_options()) {
        if (opt->count() == 0 || opt->get_lnames().empty()) continue;
        std::string key = opt->get_lnames().front();
        for (char& ch : key) ch = ch == '-' ? '_' : ch;
        given.push_back(key);
      }
      server::apply_config_file(o->config_file, cfg, given);
    }
    if (cfg.model.empty()) fail(ErrorCode::kInvalidArgument, "--model is required (or 'model' in --config)");
    const CLI::Option* level = app.get_option("--log-level");
    configure_logging(level->count() > 0 ? level->as<std::string>() : cfg.log_level, cfg.log_format, cfg.log_file);
    exit_code = server::run_server(cfg);
  });
}

}  // namespace duet::cli
