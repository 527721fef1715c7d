// Everything `duet serve` is configured by: command-line flags, or a YAML file (--config) whose
// keys are the flag names with underscores; flags given on the command line win.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "duet/core/log.h"
#include "duet/engine/llm_engine.h"
#include "duet/server/cors.h"
#include "duet/server/http_server.h"

namespace duet::server {

// One model the server serves: its file, the name clients use, its engine (device map, limits,
// KV cache) and how its chats are rendered and its output read.
struct ServedModelConfig {
  std::string model;              // GGUF file or Hugging Face folder
  std::string served_model_name;  // empty: the file's (or folder's) name
  EngineConfig engine;
  std::string chat_template_file;
  std::string reasoning_parser;
  std::string tool_call_parser;
  bool enable_auto_tool_choice = false;

  // The name clients send as `model`.
  std::string name() const;
};

struct ServerConfig {
  // The model, or with more_models and `models` below the defaults every model starts from:
  // model, served_model_name, engine, chat_template_file, reasoning_parser, tool_call_parser,
  // enable_auto_tool_choice.
  std::string model;                  // GGUF file
  std::string served_model_name;      // the name clients use (default: the file name)
  std::vector<std::string> more_models;             // --model given again: more models, same settings
  std::vector<std::string> more_served_model_names;  // --served-model-name given again, in --model order
  std::vector<ServedModelConfig> models;             // `models:` in the config file, each over the defaults
  HttpServerConfig http;
  std::vector<std::string> api_keys;  // empty: no authentication
  EngineConfig engine;
  int64_t max_queued_requests = 1024;  // waiting requests beyond this get 503 + Retry-After
  int api_threads = 2;                 // threads that parse bodies, render chat templates, tokenize
  int64_t responses_store_mib = 256;   // /v1/responses kept for previous_response_id and GET; 0: none
  int64_t files_store_mib = 256;       // /v1/files (batch inputs and results) in memory; 0: no files or batches
  std::string files_dir;               // when set, files and batches are kept there (restarts), bounded by files_store_mib
  int64_t max_running_batches = 1;     // /v1/batches that run at once
  std::string responses_redis;         // redis://HOST:PORT[/DB]: kept there too (restarts, replicas)
  int shutdown_timeout_seconds = 30;   // SIGTERM: time in-flight requests get to finish
  std::string reasoning_parser;        // "" or "deepseek_r1"
  std::string tool_call_parser;        // "", "deepseek_v3", "deepseek_v31" or "deepseek_v32"
  bool enable_auto_tool_choice = false;  // tool_choice "auto": the model decides, the parser reads
  std::string chat_template_file;      // overrides the model's template (a file, or a built-in format's name)
  std::string log_level = "info";
  LogFormat log_format = LogFormat::kText;
  std::string log_file;
  bool no_ui = false;                  // true: no web console at /
  bool allow_runtime_lora_updating = false;  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter
  CorsConfig cors;                     // browser pages of other origins (every origin by default)

  // The models to serve, in order: `models` from the config file, or else `model` and
  // more_models (named by served_model_name and more_served_model_names in order). Throws
  // kInvalidArgument when there is none, a model has no file, two share a name, or more names
  // than models are given.
  std::vector<ServedModelConfig> served_models() const;
  // Throws kInvalidArgument for a server setting no server could run with, from a flag or the
  // config file alike: an empty API key, no queue (every request waits in it first), a body
  // limit of 0 bytes, fewer than one HTTP or API thread, an empty CORS list or entry, or HTTPS
  // half configured (a certificate without its key, client certificates without CAs).
  void check() const;
};

// Applies a YAML config file to `config`, skipping the keys in `set_on_command_line` (flag
// names with underscores, as in the file). `models:` (a list of mappings, each with `model` and
// any of the per-model keys) is applied last: each entry starts from the settings as they are
// then, and its own keys win; `--model` on the command line replaces the list. Throws
// kInvalidArgument naming an unknown key or a value of the wrong type, and kNotFound for a
// missing file.
void apply_config_file(const std::string& path, ServerConfig& config,
                       const std::vector<std::string>& set_on_command_line);

// Keys the config file accepts.
const std::vector<std::string>& config_keys();

}  // namespace duet::server
