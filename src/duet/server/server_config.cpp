#include "duet/server/server_config.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>

#include <yaml-cpp/yaml.h>

#include "duet/core/error.h"
#include "duet/core/thread_pool.h"

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
      {"max_num_seqs",
       [](auto& n, auto& c, auto& k) { c.engine.scheduler.max_num_seqs = scalar<int32_t>(n, k, "an integer"); }},
      {"max_num_batched_tokens",
       [](auto& n, auto& c, auto& k) { c.engine.scheduler.max_num_batched_tokens = scalar<int32_t>(n, k, "an integer"); }},
      {"block_size", [](auto& n, auto& c, auto& k) { c.engine.block_size = scalar<int32_t>(n, k, "an integer"); }},
      {"kv_cache_memory", [](auto& n, auto& c, auto& k) { c.engine.kv_cache_bytes = scalar<int64_t>(n, k, "bytes"); }},
      {"kv_cache_dtype",
       [](auto& n, auto& c, auto& k) { c.engine.kv_cache_dtype = parse_kv_dtype(scalar<std::string>(n, k, "f16 or f32")); }},
      {"memory_utilization",
       [](auto& n, auto& c, auto& k) { c.engine.memory_utilization = scalar<double>(n, k, "a fraction"); }},
      {"no_prefix_caching",
       [](auto& n, auto& c, auto& k) { c.engine.enable_prefix_caching = !scalar<bool>(n, k, "true or false"); }},
      {"threads", [](auto& n, auto& c, auto& k) { c.engine.threads = scalar<int>(n, k, "an integer"); }},
      {"no_ui", [](auto& n, auto& c, auto& k) { c.no_ui = scalar<bool>(n, k, "true or false"); }},
      {"worker_spin_us",
       [](auto& n, auto& c, auto& k) {
         const int64_t us = scalar<int64_t>(n, k, "microseconds");
         if (us < 0) fail(ErrorCode::kInvalidArgument, "config key 'worker_spin_us' is {}, expected 0 or more", us);
         ThreadPool::set_default_idle_spin(std::chrono::microseconds(us));
       }},
      {"http_threads", [](auto& n, auto& c, auto& k) { c.http.io_threads = scalar<int>(n, k, "an integer"); }},
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
      {"device_map",
       [](auto& n, auto& c, auto& k) {
         const std::string v = scalar<std::string>(n, k, "a device map");
         if (v != "cpu") fail(ErrorCode::kUnsupported, "config key 'device_map' is '{}': only 'cpu' is available", v);
       }},
      {"max_queued_requests",
       [](auto& n, auto& c, auto& k) { c.max_queued_requests = scalar<int64_t>(n, k, "an integer"); }},
      {"max_body_bytes", [](auto& n, auto& c, auto& k) { c.http.max_body_bytes = scalar<uint64_t>(n, k, "bytes"); }},
      {"shutdown_timeout",
       [](auto& n, auto& c, auto& k) { c.shutdown_timeout_seconds = scalar<int>(n, k, "seconds"); }},
      {"reasoning_parser",
       [](auto& n, auto& c, auto& k) { c.reasoning_parser = scalar<std::string>(n, k, "a parser name"); }},
      {"chat_template", [](auto& n, auto& c, auto& k) { c.chat_template_file = scalar<std::string>(n, k, "a path"); }},
      {"log_level", [](auto& n, auto& c, auto& k) { c.log_level = scalar<std::string>(n, k, "a level"); }},
      {"log_format",
       [](auto& n, auto& c, auto& k) {
         const std::string v = scalar<std::string>(n, k, "text or json");
         if (v != "text" && v != "json") fail(ErrorCode::kInvalidArgument, "config key 'log_format' is '{}', expected text or json", v);
         c.log_format = v == "json" ? LogFormat::kJson : LogFormat::kText;
       }},
      {"log_file", [](auto& n, auto& c, auto& k) { c.log_file = scalar<std::string>(n, k, "a path"); }},
  };
  return table;
}

}  // namespace

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& [name, setter] : setters()) k.push_back(name);
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
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
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
}

}  // namespace duet::server
