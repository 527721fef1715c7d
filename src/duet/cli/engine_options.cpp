#include "duet/cli/engine_options.h"

#include <chrono>

#include "duet/core/error.h"
#include "duet/core/numa.h"
#include "duet/core/sysinfo.h"
#include "duet/core/thread_pool.h"
#include "duet/kvstore/redis_url.h"

namespace duet::cli {

DeviceMapSpec PlacementOptions::spec() const {
  DeviceMapSpec s;
  if (!device_map.empty()) parse_device_map(device_map, s);
  for (const std::string& o : override_tensor) parse_override_tensor(o, s);
  s.moe_experts = moe_experts;
  return s;
}

void add_placement_options(CLI::App* cmd, PlacementOptions& o) {
  cmd->add_option("--device-map", o.device_map,
                  "Where the model's parts run: auto, JSON ({\"layers.0-11\": \"cpu:0\", ...}) or "
                  "KEY=DEVICE,... with keys layers.A-B (also transformer.layers.A-B, model.layers.A-B), embed, "
                  "lm_head and devices cpu, cpu:N (a NUMA node), cpu[0-3,8] (cores); default: all on cpu");
  cmd->add_option("--override-tensor", o.override_tensor,
                  "PATTERN=DEVICE: tensors whose name matches the regex go to DEVICE (the first match wins); "
                  "may be repeated or comma-separated");
  cmd->add_option("--moe-experts", o.moe_experts,
                  "Device for a MoE model's routed experts (the rest as the map says)");
}

EngineConfig EngineOptions::resolve() const {
  EngineConfig c = config;
  c.device_map = placement.spec();
  if (!c.kv_cache_redis.url.empty()) parse_redis_url(c.kv_cache_redis.url);  // a bad URL fails before loading
  if (no_prefix_caching) c.enable_prefix_caching = false;
  if (no_chunked_prefill) c.scheduler.enable_chunked_prefill = false;
  c.speculative.method = parse_speculative_method(speculative_method);
  validate_speculative_config(c.speculative);
  for (const std::string& m : lora_modules) c.lora_adapters.push_back(parse_lora_source(m));
  if (policy == "fcfs") {
    c.scheduler.policy = SchedulingPolicy::kFcfs;
  } else if (policy == "priority") {
    c.scheduler.policy = SchedulingPolicy::kPriority;
  } else {
    fail(ErrorCode::kInvalidArgument, "--scheduling-policy is '{}', expected fcfs or priority", policy);
  }
  return c;
}

void add_kv_dtype_option(CLI::App* cmd, KvDtype& dtype) {
  cmd->add_option_function<std::string>(
         "--kv-cache-dtype", [&dtype](const std::string& v) { dtype = parse_kv_dtype(v); },
         "KV cache element type: f16 (half of f32), q8_0 (a quarter), fp8 (e4m3 per 128 with a power-of-two "
         "scale, DeepSeek's deployed cache) or f32")
      ->default_str(std::string(kv_dtype_name(dtype)));
}

void add_numa_option(CLI::App* cmd) {
  cmd->add_option_function<std::string>(
      "--numa", [](const std::string& v) { set_numa_mode(parse_numa_mode(v)); },
      "none, distribute (threads and pages over every node) or isolate (the first node only); default: "
      "DUET_NUMA, else none");
}

void add_worker_spin_option(CLI::App* cmd) {
  cmd->add_option_function<int64_t>(
         "--worker-spin-us",
         [](int64_t us) {
           if (us < 0) fail(ErrorCode::kInvalidArgument, "--worker-spin-us is {}, expected 0 or more", us);
           ThreadPool::set_default_idle_spin(std::chrono::microseconds(us));
         },
         "Microseconds an idle worker thread polls for work before it parks (0: at once); parked threads cost "
         "no CPU time")
      ->default_str(std::to_string(ThreadPool::kDefaultIdleSpin.count()));
}

void add_engine_options(CLI::App* cmd, EngineOptions& o) {
  cmd->add_option("-t,--threads", o.config.threads, "Threads of the cpu device (default: all)");
  add_placement_options(cmd, o.placement);
  add_parallel_options(cmd, o.parallel);
  add_numa_option(cmd);
  add_worker_spin_option(cmd);
  add_kv_dtype_option(cmd, o.config.kv_cache_dtype);
  cmd->add_option("--block-size", o.config.block_size, "Tokens per KV cache block")->capture_default_str();
  cmd->add_option("--kv-cache-memory", o.config.kv_cache_bytes, "Bytes for the KV cache (default: from --memory-utilization)");
  cmd->add_option("--memory-utilization", o.config.memory_utilization,
                  "Share of available memory for the KV cache when --kv-cache-memory is not given")
      ->capture_default_str();
  cmd->add_option_function<int64_t>(
         "--kv-commit-blocks",
         [&o](int64_t n) {
           if (n < 0) fail(ErrorCode::kInvalidArgument, "--kv-commit-blocks is {}, expected 0 or more", n);
           o.config.kv_commit_blocks = n;
         },
         "KV blocks whose memory is committed at startup rather than at their first write (0: none; default: what "
         "one full step can take, --max-num-batched-tokens / --block-size + --max-num-seqs)")
      ->default_str("auto");
  cmd->add_option_function<std::string>(
      "--memory-limit", [&o](const std::string& v) { o.config.memory_limit_bytes = parse_memory_size(v); },
      "Memory the process may take, in bytes or with K, M, G, T (powers of 1024, e.g. 2G); the engine honours the "
      "least of this and its cgroup's limit");
  cmd->add_option_function<std::string>(
         "--degrade-on-oom", [&o](const std::string& v) { o.config.degrade_on_oom = parse_degrade_mode(v); },
         "auto: a model that does not fit in memory gets its float weights re-quantized to Q8_0 and/or a q8_0 KV cache, "
         "and memory running out in a step is met by pausing, shrinking the KV pool and degrading; off: fail instead")
      ->default_str("auto");
  cmd->add_flag("--no-prefix-caching", o.no_prefix_caching, "Do not reuse the KV blocks of shared prompt prefixes");
  cmd->add_option("--max-num-batched-tokens", o.config.scheduler.max_num_batched_tokens, "Tokens computed per step")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", o.config.scheduler.max_num_seqs, "Sequences running at once")->capture_default_str();
  cmd->add_option("--max-model-len", o.config.max_model_len, "Longest prompt + output (default: the model's context)");
  cmd->add_option("--max-logprobs", o.config.max_logprobs,
                  "Most top logprobs a request may ask for per token (logprobs, top_logprobs, prompt_logprobs); -1: the "
                  "whole vocabulary, which logprobs -1 then asks for")
      ->capture_default_str();
  cmd->add_flag("--no-chunked-prefill", o.no_chunked_prefill, "Compute each prompt in one step");
  cmd->add_option("--scheduling-policy", o.policy, "fcfs or priority")->capture_default_str();
  cmd->add_option("--speculative-method", o.speculative_method,
                  "Speculative decoding: ngram (prompt lookup), mtp (DeepSeek-V3's own layer) or none")
      ->capture_default_str();
  cmd->add_option("--num-speculative-tokens", o.config.speculative.num_speculative_tokens,
                  "Speculative decoding: drafts per sequence and step (1 to 16)")
      ->capture_default_str();
  cmd->add_option("--prompt-lookup-min", o.config.speculative.prompt_lookup_min,
                  "ngram: the shortest suffix looked up")->capture_default_str();
  cmd->add_option("--prompt-lookup-max", o.config.speculative.prompt_lookup_max,
                  "ngram: the longest suffix looked up")->capture_default_str();
  cmd->add_option("--lora-modules", o.lora_modules,
                  "LoRA adapters served beside the model, NAME=PATH (a PEFT adapter folder) or {\"name\": ..., "
                  "\"path\": ...}, one or more: a request runs with one by naming it as its model");
  cmd->add_option("--health-check-interval", o.config.health_check_interval,
                  "Seconds between health probes of each device of a model over several devices (0: none)")
      ->capture_default_str();
  cmd->add_option("--health-check-timeout", o.config.health_check_timeout,
                  "Seconds a device may make no progress on a probe or a step before it is failed (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--kv-cache-redis", o.config.kv_cache_redis.url,
                  "redis://HOST:PORT[/DB]: keep full prefix-cache blocks in Redis, shared by restarts and replicas");
  cmd->add_option("--kv-cache-redis-ttl", o.config.kv_cache_redis.ttl_seconds,
                  "Seconds a block stays in Redis (a hit refreshes it)")
      ->capture_default_str();
  cmd->add_option("--kv-cache-redis-max-memory", o.config.kv_cache_redis.max_memory_bytes,
                  "Bytes: sets Redis' maxmemory with the volatile-lru policy at connect (default: Redis' own setting)");
  cmd->add_option("--kv-cache-redis-timeout-ms", o.config.kv_cache_redis.timeout_ms,
                  "Milliseconds a new request waits for its blocks from Redis before it computes them")
      ->capture_default_str();
  cmd->add_option("--spare-devices", o.config.spare_devices,
                  "Devices that take a failed device's parts, in order (default: another device of the map)")
      ->delimiter(',');
}

}  // namespace duet::cli
