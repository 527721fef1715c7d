// The statistics the server exports, as plain counters, gauges and histograms (Prometheus
// semantics: cumulative buckets, sum and count). Updated by the engine thread once per step and
// read by others through snapshot().
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "duet/comm/communicator.h"
#include <string>
#include <vector>

namespace duet {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  const std::vector<double>& upper_bounds() const { return bounds_; }
  // counts()[i]: observations <= upper_bounds()[i] (cumulative); count() includes +Inf.
  const std::vector<int64_t>& counts() const { return counts_; }
  int64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  double sum_ = 0.0;
};

// A histogram for one rank's step times (the buckets of the devices' step times).
Histogram rank_step_histogram();

// One device of the model's placement.
struct DeviceMetrics {
  explicit DeviceMetrics(std::string device_name);
  std::string name;
  double utilization = 0.0;                // busy time over wall time, the last 10 s
  double busy_seconds_total = 0.0;
  double copy_seconds_total = 0.0;         // copies into it from other devices (part of busy)
  int64_t copy_bytes_total = 0;
  int64_t memory_bytes[3] = {0, 0, 0};     // weights, kv, scratch (MemoryKind's order)
  Histogram step_seconds;                  // per step: the time its parts took on this device
  // Health.
  bool failed = false;                     // failed, its parts moved to a spare
  std::string failure;                     // why
  int64_t probes = 0, probe_failures = 0;  // health probes run, and of those failed
  double last_probe_age_seconds = -1.0;    // since the last probe finished (-1: none yet)
};

struct EngineMetrics {
  EngineMetrics();

  // Counters.
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t preemptions_total = 0;
  int64_t prefix_cache_queries_total = 0;  // tokens
  int64_t prefix_cache_hits_total = 0;     // tokens
  std::map<std::string, int64_t> requests_finished_total;  // by finish reason
  // Speculative decoding: sequences whose drafts a step verified, drafts, drafts kept, and drafts
  // kept by position (index 0: the first draft of a run).
  int64_t spec_decode_num_drafts_total = 0;
  int64_t spec_decode_num_draft_tokens_total = 0;
  int64_t spec_decode_num_accepted_tokens_total = 0;
  std::vector<int64_t> spec_decode_num_accepted_tokens_per_pos;
  // Gauges.
  int32_t num_requests_running = 0;
  int32_t num_requests_waiting = 0;
  // LoRA (vLLM's lora_requests_info): the adapters loaded, and the names of those that running
  // and waiting requests use (sorted, each once).
  int32_t lora_adapters_loaded = 0;
  int32_t max_loras = 0;  // how many may be loaded at once (and run in one batch)
  std::vector<std::string> running_lora_adapters;
  std::vector<std::string> waiting_lora_adapters;
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_used = 0;
  double kv_cache_usage = 0.0;       // used blocks / all blocks
  double kv_fragmentation = 0.0;     // unfilled slots / allocated slots
  double busy_seconds_total = 0.0;   // time spent in forward passes
  // Histograms, in seconds or tokens.
  Histogram time_to_first_token;
  Histogram time_per_output_token;
  Histogram inter_token_latency;
  Histogram e2e_request_latency;
  Histogram request_queue_time;
  Histogram request_prompt_tokens;
  Histogram request_generation_tokens;
  Histogram iteration_tokens;  // tokens computed per step (its count: the steps)
  int64_t device_failovers_total = 0;  // devices failed and their parts moved to a spare
  // Memory (see memory_plan.h): what is degraded now, out-of-memory events met in steps, and the
  // KV blocks withheld from the pool to return their memory.
  bool weights_degraded = false;
  bool kv_degraded = false;
  int64_t oom_events_total = 0;
  int64_t low_memory_events_total = 0;  // the room under the limit below 5% of it
  int32_t kv_blocks_withheld = 0;
  // The Redis KV tier: blocks fetched and used, blocks looked up and not used, value bytes read
  // and written, failed connections/commands and refused values.
  int64_t kv_redis_hits_total = 0;
  int64_t kv_redis_misses_total = 0;
  int64_t kv_redis_read_bytes_total = 0;
  int64_t kv_redis_written_bytes_total = 0;
  int64_t kv_redis_errors_total = 0;
  std::vector<DeviceMetrics> devices;  // every device the model ran on, in the order first used
  // Over several ranks: each rank's time on its share of each step (index: world rank), and the
  // latency of this process's collectives by operation.
  std::vector<Histogram> rank_step_seconds;
  bool parallel = false;
  CollectiveStats collectives;
};

// The engine's metrics behind a mutex.
class MetricsRegistry {
 public:
  template <typename F>
  void update(F&& f) {
    std::lock_guard<std::mutex> lock(mutex_);
    f(metrics_);
  }
  EngineMetrics snapshot() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return metrics_;
  }

 private:
  mutable std::mutex mutex_;
  EngineMetrics metrics_;
};

}  // namespace duet
