// Everything `duet serve` is configured by: command-line flags, or a YAML file (--config) whose
// keys are the flag names with underscores; flags given on the command line win.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "duet/core/log.h"
#include "duet/engine/llm_engine.h"
#include "duet/server/http_server.h"

namespace duet::server {

struct ServerConfig {
  std::string model;                  // GGUF file
  std::string served_model_name;      // the name clients use (default: the file name)
  HttpServerConfig http;
  std::vector<std::string> api_keys;  // empty: no authentication
  EngineConfig engine;
  int64_t max_queued_requests = 1024;  // waiting requests beyond this get 503 + Retry-After
  int shutdown_timeout_seconds = 30;   // SIGTERM: time in-flight requests get to finish
  std::string reasoning_parser;        // "" or "deepseek_r1"
  std::string chat_template_file;      // overrides the model's template
  std::string log_level = "info";
  LogFormat log_format = LogFormat::kText;
  std::string log_file;
  bool no_ui = false;                  // true: no web console at /
};

// Applies a YAML config file to `config`, skipping the keys in `set_on_command_line` (flag
// names with underscores, as in the file). Throws kInvalidArgument naming an unknown key or a
// value of the wrong type, and kNotFound for a missing file.
void apply_config_file(const std::string& path, ServerConfig& config,
                       const std::vector<std::string>& set_on_command_line);

// Keys the config file accepts.
const std::vector<std::string>& config_keys();

}  // namespace duet::server
