#include "duet/server/server_config.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include <yaml-cpp/yaml.h>

#include "duet/core/error.h"
#include "duet/core/sysinfo.h"
#include "duet/core/thread_pool.h"
#include "duet/kvstore/redis_url.h"

namespace duet::server {
namespace {

template <typename T>
T scalar(const YAML::Node& node, const std::string& key, const char* expected) {
  if (!node.IsScalar()) fail(ErrorCode::kInvalidArgument, "config key '{}' must be {}", key, expected);
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    fail(ErrorCode::kInvalidArgument, "config key '{}' is '{}', expected {}", key, node.as<std::string>(), expected);
  }
}

// A list of strings, or one string holding a JSON list or names separated by commas (as the flag).
std::vector<std::string> strings(const YAML::Node& node, const std::string& key) {
  if (node.IsScalar()) return parse_cors_list(node.as<std::string>(), key);
  if (!node.IsSequence()) fail(ErrorCode::kInvalidArgument, "config key '{}' must be a list of strings", key);
  std::vector<std::string> out;
  for (const auto& item : node) out.push_back(scalar<std::string>(item, key, "a list of strings"));
  return out;
}

using Setter = std::function<void(const YAML::Node&, ServerConfig&, const std::string&)>;

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = {
      {"model", [](auto& n, auto& c, auto& k) { c.model = scalar<std::string>(n, k, "a path"); }},
      {"served_model_name", [](auto& n, auto& c, auto& k) { c.served_model_name = scalar<std::string>(n, k, "a name"); }},
      {"host", [](auto& n, auto& c, auto& k) { c.http.host = scalar<std::string>(n, k, "an address"); }},
      {"port", [](auto& n, auto& c, auto& k) { c.http.port = scalar<uint16_t>(n, k, "a port number"); }},
      {"api_key",
       [](auto& n, auto& c, auto& k) {
         c.api_keys.clear();
         if (n.IsSequence()) {
           for (const auto& item : n) c.api_keys.push_back(scalar<std::string>(item, k, "a list of keys"));
         } else {
           c.api_keys.push_back(scalar<std::string>(n, k, "a key or a list of keys"));
         }
       }},
      {"max_model_len", [](auto& n, auto& c, auto& k) { c.engine.max_model_len = scalar<int32_t>(n, k, "an integer"); }},
      {"max_logprobs", [](auto& n, auto& c, auto& k) { c.engine.max_logprobs = scalar<int32_t>(n, k, "an integer"); }},
      {"speculative_method",
       [](auto& n, auto& c, auto& k) {
         c.engine.speculative.method = parse_speculative_method(scalar<std::string>(n, k, "ngram, mtp or none"));
       }},
      {"num_speculative_tokens",
       [](auto& n, auto& c, auto& k) { c.engine.speculative.num_speculative_tokens = scalar<int32_t>(n, k, "an integer"); }},
      {"prompt_lookup_min",
       [](auto& n, auto& c, auto& k) { c.engine.speculative.prompt_lookup_min = scalar<int32_t>(n, k, "an integer"); }},
      {"prompt_lookup_max",
       [](auto& n, auto& c, auto& k) { c.engine.speculative.prompt_lookup_max = scalar<int32_t>(n, k, "an integer"); }},
      {"batch_wait_ms",
       [](auto& n, auto& c, auto& k) { c.engine.scheduler.batch_wait_ms = scalar<double>(n, k, "milliseconds"); }},
      {"batch_wait_tokens",
       [](auto& n, auto& c, auto& k) { c.engine.scheduler.batch_wait_tokens = scalar<int32_t>(n, k, "an integer"); }},
      {"max_num_seqs",
       [](auto& n, auto& c, auto& k) { c.engine.scheduler.max_num_seqs = scalar<int32_t>(n, k, "an integer"); }},
      {"max_num_batched_tokens",
       [](auto& n, auto& c, auto& k) { c.engine.scheduler.max_num_batched_tokens = scalar<int32_t>(n, k, "an integer"); }},
      {"block_size", [](auto& n, auto& c, auto& k) { c.engine.block_size = scalar<int32_t>(n, k, "an integer"); }},
      {"kv_cache_memory", [](auto& n, auto& c, auto& k) { c.engine.kv_cache_bytes = scalar<int64_t>(n, k, "bytes"); }},
      {"kv_cache_dtype",
       [](auto& n, auto& c, auto& k) { c.engine.kv_cache_dtype = parse_kv_dtype(scalar<std::string>(n, k, "f16, q8_0, fp8 or f32")); }},
      {"memory_limit",
       [](auto& n, auto& c, auto& k) {
         c.engine.memory_limit_bytes = parse_memory_size(scalar<std::string>(n, k, "bytes or a size such as 2G"));
       }},
      {"degrade_on_oom",
       [](auto& n, auto& c, auto& k) { c.engine.degrade_on_oom = parse_degrade_mode(scalar<std::string>(n, k, "auto or off")); }},
      {"memory_utilization",
       [](auto& n, auto& c, auto& k) { c.engine.memory_utilization = scalar<double>(n, k, "a fraction"); }},
      {"no_prefix_caching",
       [](auto& n, auto& c, auto& k) { c.engine.enable_prefix_caching = !scalar<bool>(n, k, "true or false"); }},
      {"threads", [](auto& n, auto& c, auto& k) { c.engine.threads = scalar<int>(n, k, "an integer"); }},
      {"no_ui", [](auto& n, auto& c, auto& k) { c.no_ui = scalar<bool>(n, k, "true or false"); }},
      {"allow_runtime_lora_updating",
       [](auto& n, auto& c, auto& k) { c.allow_runtime_lora_updating = scalar<bool>(n, k, "true or false"); }},
      {"health_check_interval",
       [](auto& n, auto& c, auto& k) { c.engine.health_check_interval = scalar<double>(n, k, "seconds"); }},
      {"health_check_timeout",
       [](auto& n, auto& c, auto& k) { c.engine.health_check_timeout = scalar<double>(n, k, "seconds"); }},
      {"lora_modules",
       [](auto& n, auto& c, auto& k) {
         // A list of NAME=PATH strings or {name, path} maps (or one of them).
         c.engine.lora_adapters.clear();
         const auto one = [&](const YAML::Node& item) {
           if (item.IsMap()) {
             const std::string name = item["name"] ? scalar<std::string>(item["name"], k, "a name") : std::string();
             const std::string path = item["path"] ? scalar<std::string>(item["path"], k, "a path") : std::string();
             if (name.empty() || path.empty()) {
               fail(ErrorCode::kInvalidArgument, "config key '{}': an adapter needs a name and a path", k);
             }
             c.engine.lora_adapters.push_back(LoraSource{name, path});
           } else {
             c.engine.lora_adapters.push_back(parse_lora_source(scalar<std::string>(item, k, "NAME=PATH")));
           }
         };
         if (n.IsSequence()) {
           for (const auto& item : n) one(item);
         } else {
           one(n);
         }
       }},
      {"spare_devices",
       [](auto& n, auto& c, auto& k) {
         c.engine.spare_devices.clear();
         if (n.IsSequence()) {
           for (const auto& item : n) c.engine.spare_devices.push_back(scalar<std::string>(item, k, "a device name"));
         } else {
           c.engine.spare_devices.push_back(scalar<std::string>(n, k, "a device name or a list of them"));
         }
       }},
      {"kv_cache_redis",
       [](auto& n, auto& c, auto& k) { c.engine.kv_cache_redis.url = scalar<std::string>(n, k, "a redis:// URL"); }},
      {"kv_cache_redis_ttl",
       [](auto& n, auto& c, auto& k) { c.engine.kv_cache_redis.ttl_seconds = scalar<int64_t>(n, k, "seconds"); }},
      {"kv_cache_redis_max_memory",
       [](auto& n, auto& c, auto& k) { c.engine.kv_cache_redis.max_memory_bytes = scalar<int64_t>(n, k, "bytes"); }},
      {"kv_cache_redis_timeout_ms",
       [](auto& n, auto& c, auto& k) { c.engine.kv_cache_redis.timeout_ms = scalar<double>(n, k, "milliseconds"); }},
      {"worker_spin_us",
       [](auto& n, auto& c, auto& k) {
         const int64_t us = scalar<int64_t>(n, k, "microseconds");
         if (us < 0) fail(ErrorCode::kInvalidArgument, "config key 'worker_spin_us' is {}, expected 0 or more", us);
         ThreadPool::set_default_idle_spin(std::chrono::microseconds(us));
       }},
      {"http_threads", [](auto& n, auto& c, auto& k) { c.http.io_threads = scalar<int>(n, k, "an integer"); }},
      {"api_threads", [](auto& n, auto& c, auto& k) { c.api_threads = scalar<int>(n, k, "an integer"); }},
      {"dtype",
       [](auto& n, auto& c, auto& k) {
         const std::string v = scalar<std::string>(n, k, "a dtype");
         if (v != "auto" && v != "float32") {
           fail(ErrorCode::kInvalidArgument, "config key 'dtype' is '{}': the CPU backend computes in float32 "
                "(expected auto or float32)", v);
         }
       }},
      {"quantization",
       [](auto& n, auto& c, auto& k) {
         const std::string v = scalar<std::string>(n, k, "a quantization");
         if (v != "none" && v != "auto") {
           fail(ErrorCode::kInvalidArgument, "config key 'quantization' is '{}': weights are used in the type the "
                "file stores them (expected auto or none)", v);
         }
       }},
      // device_map: a mapping of keys to devices (layers.A-B, transformer.layers.A-B,
      // model.layers.A-B, embed, lm_head), or one string as --device-map takes it.
      {"device_map",
       [](auto& n, auto& c, auto& k) {
         DeviceMapSpec& spec = c.engine.device_map;
         spec.automatic = false;
         spec.device.clear();
         spec.rules.clear();
         if (n.IsMap()) {
           for (const auto& entry : n) {
             const std::string key = entry.first.template as<std::string>();
             spec.rules.push_back({key, scalar<std::string>(entry.second, k + "." + key, "a device name")});
           }
         } else {
           parse_device_map(scalar<std::string>(n, k, "a mapping of keys to devices, or a device map string"), spec);
         }
       }},
      {"override_tensor",
       [](auto& n, auto& c, auto& k) {
         c.engine.device_map.tensor_rules.clear();
         if (n.IsSequence()) {
           for (const auto& item : n) parse_override_tensor(scalar<std::string>(item, k, "PATTERN=DEVICE"), c.engine.device_map);
         } else {
           parse_override_tensor(scalar<std::string>(n, k, "PATTERN=DEVICE or a list of them"), c.engine.device_map);
         }
       }},
      {"moe_experts",
       [](auto& n, auto& c, auto& k) { c.engine.device_map.moe_experts = scalar<std::string>(n, k, "a device name"); }},
      {"max_queued_requests",
       [](auto& n, auto& c, auto& k) { c.max_queued_requests = scalar<int64_t>(n, k, "an integer"); }},
      {"max_body_bytes", [](auto& n, auto& c, auto& k) { c.http.max_body_bytes = scalar<uint64_t>(n, k, "bytes"); }},
      {"responses_store_mib",
       [](auto& n, auto& c, auto& k) { c.responses_store_mib = scalar<int64_t>(n, k, "MiB"); }},
      {"files_store_mib", [](auto& n, auto& c, auto& k) { c.files_store_mib = scalar<int64_t>(n, k, "MiB"); }},
      {"files_dir", [](auto& n, auto& c, auto& k) { c.files_dir = scalar<std::string>(n, k, "a folder"); }},
      {"max_running_batches",
       [](auto& n, auto& c, auto& k) { c.max_running_batches = scalar<int64_t>(n, k, "an integer"); }},
      {"responses_redis",
       [](auto& n, auto& c, auto& k) { c.responses_redis = scalar<std::string>(n, k, "a redis:// URL"); }},
      {"shutdown_timeout",
       [](auto& n, auto& c, auto& k) { c.shutdown_timeout_seconds = scalar<int>(n, k, "seconds"); }},
      {"reasoning_parser",
       [](auto& n, auto& c, auto& k) { c.reasoning_parser = scalar<std::string>(n, k, "a parser name"); }},
      {"tool_call_parser",
       [](auto& n, auto& c, auto& k) { c.tool_call_parser = scalar<std::string>(n, k, "a parser name"); }},
      {"enable_auto_tool_choice",
       [](auto& n, auto& c, auto& k) { c.enable_auto_tool_choice = scalar<bool>(n, k, "true or false"); }},
      {"chat_template", [](auto& n, auto& c, auto& k) { c.chat_template_file = scalar<std::string>(n, k, "a path"); }},
      {"log_level", [](auto& n, auto& c, auto& k) { c.log_level = scalar<std::string>(n, k, "a level"); }},
      {"log_format",
       [](auto& n, auto& c, auto& k) {
         const std::string v = scalar<std::string>(n, k, "text or json");
         if (v != "text" && v != "json") fail(ErrorCode::kInvalidArgument, "config key 'log_format' is '{}', expected text or json", v);
         c.log_format = v == "json" ? LogFormat::kJson : LogFormat::kText;
       }},
      {"log_file", [](auto& n, auto& c, auto& k) { c.log_file = scalar<std::string>(n, k, "a path"); }},
      {"ssl_certfile", [](auto& n, auto& c, auto& k) { c.http.tls_cert_file = scalar<std::string>(n, k, "a path"); }},
      {"ssl_keyfile", [](auto& n, auto& c, auto& k) { c.http.tls_key_file = scalar<std::string>(n, k, "a path"); }},
      {"ssl_ca_certs", [](auto& n, auto& c, auto& k) { c.http.tls_ca_file = scalar<std::string>(n, k, "a path"); }},
      {"ssl_cert_reqs", [](auto& n, auto& c, auto& k) { c.http.tls_client_certs = scalar<int>(n, k, "0, 1 or 2"); }},
      {"allowed_origins", [](auto& n, auto& c, auto& k) { c.cors.allowed_origins = strings(n, k); }},
      {"allowed_methods", [](auto& n, auto& c, auto& k) { c.cors.allowed_methods = strings(n, k); }},
      {"allowed_headers", [](auto& n, auto& c, auto& k) { c.cors.allowed_headers = strings(n, k); }},
      {"allow_credentials",
       [](auto& n, auto& c, auto& k) { c.cors.allow_credentials = scalar<bool>(n, k, "true or false"); }},
  };
  return table;
}

// The keys an entry of `models:` may set: the model's own file, name, engine and chat handling.
bool per_model_key(const std::string& key) {
  static const std::set<std::string> kServerWide = {"host", "port", "api_key", "no_ui", "allow_runtime_lora_updating", "worker_spin_us",
                                                     "http_threads", "api_threads", "max_queued_requests",
                                                     "max_body_bytes", "responses_store_mib", "files_store_mib", "files_dir", "max_running_batches", "responses_redis", "shutdown_timeout", "log_level",
                                                     "log_format", "log_file", "allowed_origins",
                                                     "allowed_methods", "allowed_headers", "allow_credentials",
                                                     "ssl_certfile", "ssl_keyfile", "ssl_ca_certs", "ssl_cert_reqs"};
  return kServerWide.count(key) == 0;
}

ServedModelConfig served_model_from(const ServerConfig& c, const std::string& model, const std::string& name) {
  ServedModelConfig m;
  m.model = model;
  m.served_model_name = name;
  m.engine = c.engine;
  m.chat_template_file = c.chat_template_file;
  m.reasoning_parser = c.reasoning_parser;
  m.tool_call_parser = c.tool_call_parser;
  m.enable_auto_tool_choice = c.enable_auto_tool_choice;
  return m;
}

void apply_models(const YAML::Node& list, ServerConfig& config) {
  if (!list.IsSequence() || list.size() == 0) {
    fail(ErrorCode::kInvalidArgument, "config key 'models' must be a list of mappings (each with 'model')");
  }
  config.models.clear();
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node& entry = list[i];
    if (!entry.IsMap()) fail(ErrorCode::kInvalidArgument, "models[{}] must be a mapping (with 'model')", i);
    ServerConfig c = config;  // the defaults, as set so far
    c.model.clear();
    c.served_model_name.clear();
    for (const auto& kv : entry) {
      const std::string key = kv.first.as<std::string>();
      auto it = setters().find(key);
      if (it == setters().end() || !per_model_key(key) || key == "models") {
        fail(ErrorCode::kInvalidArgument, "models[{}]: '{}' is not a per-model key{}", i, key,
             it == setters().end() ? "" : " (it is the server's: set it at the top level)");
      }
      try {
        it->second(kv.second, c, key);
      } catch (const Error& e) {
        fail(e.code(), "models[{}]: {}", i, e.what());
      }
    }
    if (c.model.empty()) fail(ErrorCode::kInvalidArgument, "models[{}] has no 'model' (a GGUF file or folder)", i);
    config.models.push_back(served_model_from(c, c.model, c.served_model_name));
  }
}

}  // namespace

std::string ServedModelConfig::name() const {
  if (!served_model_name.empty()) return served_model_name;
  // The file's name, or the folder's ("models/DeepSeek-V2-Lite/" serves as DeepSeek-V2-Lite).
  const std::filesystem::path path = std::filesystem::path(model).lexically_normal();
  return (path.has_filename() ? path : path.parent_path()).filename().string();
}

std::vector<ServedModelConfig> ServerConfig::served_models() const {
  std::vector<ServedModelConfig> out = models;
  if (out.empty()) {
    if (model.empty()) fail(ErrorCode::kInvalidArgument, "--model is required (or 'model' or 'models' in --config)");
    const size_t num_names = (served_model_name.empty() ? 0 : 1) + more_served_model_names.size();
    if (num_names > 1 + more_models.size()) {
      fail(ErrorCode::kInvalidArgument, "{} served model names for {} models (--served-model-name is given once per "
           "--model, in the same order)", num_names, 1 + more_models.size());
    }
    out.push_back(served_model_from(*this, model, served_model_name));
    for (size_t i = 0; i < more_models.size(); ++i) {
      const std::string name = i < more_served_model_names.size() ? more_served_model_names[i] : std::string();
      out.push_back(served_model_from(*this, more_models[i], name));
    }
  }
  std::set<std::string> names;
  for (const ServedModelConfig& m : out) {
    if (!names.insert(m.name()).second) {
      fail(ErrorCode::kInvalidArgument, "two models are served as '{}': give each its own served_model_name", m.name());
    }
  }
  // A request names a LoRA adapter as its model: no adapter may share a name with a model or
  // another adapter.
  for (const ServedModelConfig& m : out) {
    for (const LoraSource& a : m.engine.lora_adapters) {
      if (!names.insert(a.name).second) {
        fail(ErrorCode::kInvalidArgument, "the LoRA adapter '{}' of '{}' has a name already served (a model's or "
             "another adapter's): clients name adapters as models, so each needs its own", a.name, m.name());
      }
    }
  }
  return out;
}

void ServerConfig::check() const {
  for (const std::string& key : api_keys) {
    if (key.empty()) fail(ErrorCode::kInvalidArgument, "--api-key is empty: a client cannot send an empty key");
  }
  if (max_queued_requests < 1) {
    fail(ErrorCode::kInvalidArgument, "--max-queued-requests is {}, expected 1 or more (every request waits in the "
         "queue before it runs, so with none every request gets 503)", max_queued_requests);
  }
  if (http.max_body_bytes < 1) {
    fail(ErrorCode::kInvalidArgument, "--max-body-bytes is 0, expected 1 or more (every request would get 413)");
  }
  if (files_store_mib < 0) {
    fail(ErrorCode::kInvalidArgument, "--files-store-mib is {}, expected 0 (no files or batches) or more", files_store_mib);
  }
  if (max_running_batches < 1 || max_running_batches > 64) {
    fail(ErrorCode::kInvalidArgument, "--max-running-batches is {}, expected 1 to 64", max_running_batches);
  }
  if (!files_dir.empty() && files_store_mib == 0) {
    fail(ErrorCode::kInvalidArgument, "--files-dir keeps files and batches, but --files-store-mib 0 keeps none");
  }
  if (responses_store_mib < 0) {
    fail(ErrorCode::kInvalidArgument, "--responses-store-mib is {}, expected 0 (keep none) or more", responses_store_mib);
  }
  if (!responses_redis.empty()) {
    if (responses_store_mib == 0) {
      fail(ErrorCode::kInvalidArgument, "--responses-redis keeps responses, but --responses-store-mib 0 keeps none");
    }
    parse_redis_url(responses_redis);  // a bad URL fails at start
  }
  if (http.io_threads < 1) fail(ErrorCode::kInvalidArgument, "--http-threads is {}, expected 1 or more", http.io_threads);
  if (api_threads < 1) fail(ErrorCode::kInvalidArgument, "--api-threads is {}, expected 1 or more", api_threads);
  cors.check();
  if (http.tls_cert_file.empty() != http.tls_key_file.empty()) {
    fail(ErrorCode::kInvalidArgument, "HTTPS needs both --ssl-certfile and --ssl-keyfile (only {} is given)",
         http.tls_cert_file.empty() ? "--ssl-keyfile" : "--ssl-certfile");
  }
  if (http.tls_client_certs < 0 || http.tls_client_certs > 2) {
    fail(ErrorCode::kInvalidArgument, "--ssl-cert-reqs is {}, expected 0 (none), 1 (optional) or 2 (required)",
         http.tls_client_certs);
  }
  if (http.tls_client_certs > 0 && (http.tls_cert_file.empty() || http.tls_ca_file.empty())) {
    fail(ErrorCode::kInvalidArgument, "--ssl-cert-reqs {} needs HTTPS (--ssl-certfile, --ssl-keyfile) and "
         "--ssl-ca-certs to check client certificates against", http.tls_client_certs);
  }
}

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& [name, setter] : setters()) k.push_back(name);
    k.push_back("models");
    std::sort(k.begin(), k.end());
    return k;
  }();
  return keys;
}

void apply_config_file(const std::string& path, ServerConfig& config,
                       const std::vector<std::string>& set_on_command_line) {
  if (!std::filesystem::exists(path)) fail(ErrorCode::kNotFound, "config file '{}' does not exist", path);
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    fail(ErrorCode::kInvalidArgument, "config file '{}' is not valid YAML: {}", path, e.what());
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) fail(ErrorCode::kInvalidArgument, "config file '{}' must be a mapping of keys to values", path);
  const bool models_on_command_line =
      std::find(set_on_command_line.begin(), set_on_command_line.end(), "model") != set_on_command_line.end();
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
    if (key == "models") {
      if (root["model"]) fail(ErrorCode::kInvalidArgument, "config file '{}': give 'model' or 'models', not both", path);
      continue;  // last, over the settings of the whole file
    }
    auto it = setters().find(key);
    if (it == setters().end()) {
      std::string known;
      for (const std::string& k : config_keys()) known += (known.empty() ? "" : ", ") + k;
      fail(ErrorCode::kInvalidArgument, "config file '{}': unknown key '{}' (known keys: {})", path, key, known);
    }
    if (std::find(set_on_command_line.begin(), set_on_command_line.end(), key) != set_on_command_line.end()) continue;
    try {
      it->second(entry.second, config, key);
    } catch (const Error& e) {
      fail(e.code(), "config file '{}': {}", path, e.what());
    }
  }
  if (root["models"] && !models_on_command_line) {
    try {
      apply_models(root["models"], config);
    } catch (const Error& e) {
      fail(e.code(), "config file '{}': {}", path, e.what());
    }
  }
}

}  // namespace duet::server
