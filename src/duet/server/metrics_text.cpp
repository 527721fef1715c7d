#include "duet/server/metrics_text.h"

#include <chrono>
#include <map>

#include <fmt/format.h>

namespace duet::server {
namespace {

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// Writes metric families; the samples of a family written again (for another model) join those
// already under its header.
class Writer {
 public:
  void set_model(const std::string& model) { labels_ = fmt::format("model_name=\"{}\"", escape_label(model)); }

  void header(const std::string& name, const char* type, const char* help) {
    auto [it, fresh] = index_.try_emplace(name, families_.size());
    if (fresh) families_.push_back(fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type));
    current_ = it->second;
  }
  void sample(const std::string& name, double value, const std::string& extra = {}) {
    families_[current_] += fmt::format("{}{{{}{}}} {}\n", name, labels_, extra.empty() ? "" : "," + extra, value);
  }
  void scalar(const std::string& name, const char* type, const char* help, double value) {
    header(name, type, help);
    sample(name, value);
  }
  void histogram(const std::string& name, const char* help, const Histogram& h) {
    header(name, "histogram", help);
    histogram_samples(name, h, {});
  }
  // A histogram's samples with more labels (`extra`, "device=\"cpu\""), under a header written once.
  void histogram_samples(const std::string& name, const Histogram& h, const std::string& extra) {
    const std::string more = extra.empty() ? "" : extra + ",";
    for (size_t i = 0; i < h.upper_bounds().size(); ++i) {
      sample(name + "_bucket", static_cast<double>(h.counts()[i]), fmt::format("{}le=\"{}\"", more, h.upper_bounds()[i]));
    }
    sample(name + "_bucket", static_cast<double>(h.count()), more + "le=\"+Inf\"");
    sample(name + "_sum", h.sum(), extra);
    sample(name + "_count", static_cast<double>(h.count()), extra);
  }
  std::string str() const {
    std::string out;
    for (const std::string& f : families_) out += f;
    return out;
  }

 private:
  std::string labels_;
  std::vector<std::string> families_;  // header and samples, in the order first written
  std::map<std::string, size_t> index_;
  size_t current_ = 0;
};

void write_model(Writer& w, const EngineMetrics& m, const ServerCounters& s) {
  w.scalar("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
           m.num_requests_running);
  w.scalar("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", m.num_requests_waiting);
  if (m.lora_adapters_loaded > 0) {
    // vLLM's: the adapters of running and waiting requests as labels, the time as the value.
    w.header("vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
    w.sample("vllm:lora_requests_info",
             std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(),
             fmt::format("max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"",
                         m.max_loras, escape_label(fmt::format("{}", fmt::join(m.running_lora_adapters, ","))),
                         escape_label(fmt::format("{}", fmt::join(m.waiting_lora_adapters, ",")))));
  }
  w.scalar("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", m.kv_cache_usage);
  w.scalar("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
           static_cast<double>(m.prompt_tokens_total));
  w.scalar("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
           static_cast<double>(m.generation_tokens_total));
  w.header("vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (const char* reason : {"stop", "length", "abort"}) {
    auto it = m.requests_finished_total.find(reason);
    w.sample("vllm:request_success_total", it == m.requests_finished_total.end() ? 0.0 : static_cast<double>(it->second),
             fmt::format("finished_reason=\"{}\"", reason));
  }
  w.scalar("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
           static_cast<double>(m.preemptions_total));
  w.scalar("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
           static_cast<double>(m.prefix_cache_queries_total));
  w.scalar("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
           static_cast<double>(m.prefix_cache_hits_total));
  w.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", m.time_to_first_token);
  w.histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
              m.time_per_output_token);
  w.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", m.inter_token_latency);
  w.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", m.e2e_request_latency);
  w.histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
              m.request_queue_time);
  w.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", m.request_prompt_tokens);
  w.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", m.request_generation_tokens);
  w.histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", m.iteration_tokens);
  w.scalar("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.",
           static_cast<double>(m.spec_decode_num_drafts_total));
  w.scalar("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
           static_cast<double>(m.spec_decode_num_draft_tokens_total));
  w.scalar("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
           static_cast<double>(m.spec_decode_num_accepted_tokens_total));
  w.header("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.");
  for (size_t i = 0; i < m.spec_decode_num_accepted_tokens_per_pos.size(); ++i) {
    w.sample("vllm:spec_decode_num_accepted_tokens_per_pos_total",
             static_cast<double>(m.spec_decode_num_accepted_tokens_per_pos[i]), fmt::format("position=\"{}\"", i));
  }
  w.scalar("duet:kv_cache_fragmentation_ratio", "gauge",
           "KV token slots allocated to sequences but not filled, over slots allocated.", m.kv_fragmentation);
  // Per device of the model's placement.
  const auto device = [](const DeviceMetrics& d) { return fmt::format("device=\"{}\"", escape_label(d.name)); };
  w.header("duet:device_utilization_ratio", "gauge",
           "Share of wall time each device spent computing, over the last 10 seconds.");
  for (const DeviceMetrics& d : m.devices) w.sample("duet:device_utilization_ratio", d.utilization, device(d));
  w.header("duet:device_busy_seconds_total", "counter", "Seconds each device spent computing.");
  for (const DeviceMetrics& d : m.devices) w.sample("duet:device_busy_seconds_total", d.busy_seconds_total, device(d));
  w.header("duet:device_copy_seconds_total", "counter", "Seconds each device spent copying data in from other devices.");
  for (const DeviceMetrics& d : m.devices) w.sample("duet:device_copy_seconds_total", d.copy_seconds_total, device(d));
  w.header("duet:device_copy_bytes_total", "counter", "Bytes copied into each device from other devices.");
  for (const DeviceMetrics& d : m.devices) {
    w.sample("duet:device_copy_bytes_total", static_cast<double>(d.copy_bytes_total), device(d));
  }
  w.header("duet:device_memory_used_bytes", "gauge", "Memory each device holds, by kind: weights, kv, scratch.");
  for (const DeviceMetrics& d : m.devices) {
    for (int k = 0; k < 3; ++k) {
      static const char* kKinds[] = {"weights", "kv", "scratch"};
      w.sample("duet:device_memory_used_bytes", static_cast<double>(d.memory_bytes[k]),
               fmt::format("{},kind=\"{}\"", device(d), kKinds[k]));
    }
  }
  w.header("duet:device_up", "gauge", "1 while a device is healthy, 0 once it failed (its parts moved to a spare).");
  for (const DeviceMetrics& d : m.devices) w.sample("duet:device_up", d.failed ? 0.0 : 1.0, device(d));
  w.scalar("duet:device_failovers_total", "counter", "Devices that failed and whose parts moved to a spare.",
           static_cast<double>(m.device_failovers_total));
  w.header("duet:degraded", "gauge",
           "1 while a part is degraded to fit in memory (what: weights re-quantized to Q8_0, kv: a q8_0 KV cache).");
  w.sample("duet:degraded", m.weights_degraded ? 1.0 : 0.0, "what=\"weights\"");
  w.sample("duet:degraded", m.kv_degraded ? 1.0 : 0.0, "what=\"kv\"");
  w.scalar("duet:oom_events_total", "counter", "Steps that ran out of memory (each met by pausing, shrinking, "
           "degrading or failing the step).", static_cast<double>(m.oom_events_total));
  w.scalar("duet:low_memory_events_total", "counter", "Times the room under the memory limit fell below 5% of it "
           "(each met by pausing, shrinking or degrading).", static_cast<double>(m.low_memory_events_total));
  w.scalar("duet:kv_cache_blocks_withheld", "gauge", "KV cache blocks taken out of the pool to return their memory.",
           m.kv_blocks_withheld);
  w.scalar("duet:kv_redis_hits_total", "counter", "KV blocks fetched from Redis and used (--kv-cache-redis).",
           static_cast<double>(m.kv_redis_hits_total));
  w.scalar("duet:kv_redis_misses_total", "counter",
           "KV blocks looked up in Redis and not used: absent, refused by their check, or not in time.",
           static_cast<double>(m.kv_redis_misses_total));
  w.header("duet:kv_redis_bytes_total", "counter", "Bytes of KV blocks read from and written to Redis.");
  w.sample("duet:kv_redis_bytes_total", static_cast<double>(m.kv_redis_read_bytes_total), "dir=\"read\"");
  w.sample("duet:kv_redis_bytes_total", static_cast<double>(m.kv_redis_written_bytes_total), "dir=\"write\"");
  w.scalar("duet:kv_redis_errors_total", "counter",
           "Failed Redis connections and commands, and blocks from Redis that failed their check.",
           static_cast<double>(m.kv_redis_errors_total));
  w.header("duet:device_step_seconds", "histogram", "Time each device spent on one step's parts (per stage).");
  for (const DeviceMetrics& d : m.devices) w.histogram_samples("duet:device_step_seconds", d.step_seconds, device(d));
  if (m.parallel) {
    w.header("duet:rank_step_seconds", "histogram", "Time each rank spent on its share of one step.");
    for (size_t r = 0; r < m.rank_step_seconds.size(); ++r) {
      w.histogram_samples("duet:rank_step_seconds", m.rank_step_seconds[r], fmt::format("rank=\"{}\"", r));
    }
    w.header("duet:collective_latency_seconds", "histogram",
             "Latency of rank 0's collectives and point-to-point transfers between ranks, by operation.");
    for (int op = 0; op < kNumCollectiveOps; ++op) {
      const CollectiveStats::Histogram& h = m.collectives.ops[op];
      const std::string label = fmt::format("op=\"{}\"", collective_op_name(static_cast<CollectiveOp>(op)));
      uint64_t cumulative = 0;
      for (int b = 0; b < CollectiveStats::kNumBuckets; ++b) {
        cumulative += h.buckets[b];
        w.sample("duet:collective_latency_seconds_bucket", static_cast<double>(cumulative),
                 fmt::format("{},le=\"{}\"", label, CollectiveStats::kBounds[b]));
      }
      w.sample("duet:collective_latency_seconds_bucket", static_cast<double>(h.count), label + ",le=\"+Inf\"");
      w.sample("duet:collective_latency_seconds_sum", h.sum, label);
      w.sample("duet:collective_latency_seconds_count", static_cast<double>(h.count), label);
    }
  }
  w.scalar("duet:request_failure_ratio", "gauge", "Requests answered with an error, over all requests.",
           s.requests_total == 0 ? 0.0 : static_cast<double>(s.requests_failed) / static_cast<double>(s.requests_total));
  w.scalar("duet:kv_cache_blocks", "gauge", "KV cache blocks in the pool.", m.kv_blocks_total);
  if (!s.energy_joules.empty()) {
    w.header("duet:energy_joules_total", "counter", "Energy each device used since the server started (RAPL).");
    for (const auto& [device, joules] : s.energy_joules) {
      w.sample("duet:energy_joules_total", joules, fmt::format("device=\"{}\"", escape_label(device)));
    }
  }
  if (s.http_connections >= 0) {
    w.scalar("duet:http_connections", "gauge", "Open HTTP connections.", static_cast<double>(s.http_connections));
  }
  if (s.http_accept_failures >= 0) {
    w.scalar("duet:http_accept_failures_total", "counter",
             "Connections the server could not accept for want of file descriptors or memory (they waited).",
             static_cast<double>(s.http_accept_failures));
  }
  if (s.stored_responses >= 0) {
    w.scalar("duet:stored_responses", "gauge", "Responses kept for previous_response_id, GET and background runs.",
             static_cast<double>(s.stored_responses));
    w.scalar("duet:stored_responses_bytes", "gauge", "The kept responses' size (--responses-store-mib bounds it).",
             static_cast<double>(s.stored_response_bytes));
  }
  if (s.conversations >= 0) {
    w.scalar("duet:conversations", "gauge", "Conversations of /v1/conversations kept.", static_cast<double>(s.conversations));
    w.scalar("duet:conversations_bytes", "gauge",
             "The kept conversations' size (--responses-store-mib bounds it, apart from the responses').",
             static_cast<double>(s.conversation_bytes));
  }
  if (s.files_bytes >= 0) {
    w.scalar("duet:files_bytes", "gauge", "The contents of /v1/files: batch inputs and results (--files-store-mib bounds it).",
             static_cast<double>(s.files_bytes));
    w.header("duet:batches", "gauge", "Batches of /v1/batches in each status.");
    for (const auto& [status, n] : s.batches) {
      w.sample("duet:batches", static_cast<double>(n), fmt::format("status=\"{}\"", escape_label(status)));
    }
  }
  w.scalar("duet:requests_total", "counter", "Completion, chat, responses, messages and embeddings requests received.",
           static_cast<double>(s.requests_total));
  w.scalar("duet:request_failures_total", "counter",
           "Completion, chat, responses, messages and embeddings requests answered with an error.",
           static_cast<double>(s.requests_failed));
}

}  // namespace

std::string render_metrics(const std::vector<ModelMetrics>& models) {
  Writer w;
  for (const ModelMetrics& mm : models) {
    w.set_model(mm.name);
    write_model(w, mm.engine, mm.counters);
  }
  return w.str();
}

std::string render_metrics(const EngineMetrics& m, const ServerCounters& s, const std::string& model_name) {
  return render_metrics({ModelMetrics{model_name, m, s}});
}

}  // namespace duet::server
