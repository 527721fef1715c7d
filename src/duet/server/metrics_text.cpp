#include "duet/server/metrics_text.h"

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

class Writer {
 public:
  explicit Writer(std::string model) : labels_(fmt::format("model_name=\"{}\"", escape_label(model))) {}

  void header(const std::string& name, const char* type, const char* help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const std::string& name, double value, const std::string& extra = {}) {
    out_ += fmt::format("{}{{{}{}}} {}\n", name, labels_, extra.empty() ? "" : "," + extra, value);
  }
  void scalar(const std::string& name, const char* type, const char* help, double value) {
    header(name, type, help);
    sample(name, value);
  }
  void histogram(const std::string& name, const char* help, const Histogram& h) {
    header(name, "histogram", help);
    for (size_t i = 0; i < h.upper_bounds().size(); ++i) {
      sample(name + "_bucket", static_cast<double>(h.counts()[i]), fmt::format("le=\"{}\"", h.upper_bounds()[i]));
    }
    sample(name + "_bucket", static_cast<double>(h.count()), "le=\"+Inf\"");
    sample(name + "_sum", h.sum());
    sample(name + "_count", static_cast<double>(h.count()));
  }
  std::string str() && { return std::move(out_); }

 private:
  std::string labels_;
  std::string out_;
};

}  // namespace

std::string render_metrics(const EngineMetrics& m, const ServerCounters& s, const std::string& model_name) {
  Writer w(model_name);
  w.scalar("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
           m.num_requests_running);
  w.scalar("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", m.num_requests_waiting);
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
  w.scalar("duet:kv_cache_fragmentation_ratio", "gauge",
           "KV token slots allocated to sequences but not filled, over slots allocated.", m.kv_fragmentation);
  w.header("duet:device_utilization_ratio", "gauge", "Share of wall time each device spent computing.");
  w.sample("duet:device_utilization_ratio", s.device_utilization, "device=\"cpu\"");
  w.scalar("duet:request_failure_ratio", "gauge", "Requests answered with an error, over all requests.",
           s.requests_total == 0 ? 0.0 : static_cast<double>(s.requests_failed) / static_cast<double>(s.requests_total));
  w.scalar("duet:kv_cache_blocks", "gauge", "KV cache blocks in the pool.", m.kv_blocks_total);
  if (!s.energy_joules.empty()) {
    w.header("duet:energy_joules_total", "counter", "Energy each device used since the server started (RAPL).");
    for (const auto& [device, joules] : s.energy_joules) {
      w.sample("duet:energy_joules_total", joules, fmt::format("device=\"{}\"", escape_label(device)));
    }
  }
  w.scalar("duet:requests_total", "counter", "Completion and chat requests received.",
           static_cast<double>(s.requests_total));
  w.scalar("duet:request_failures_total", "counter", "Completion and chat requests answered with an error.",
           static_cast<double>(s.requests_failed));
  return std::move(w).str();
}

}  // namespace duet::server
