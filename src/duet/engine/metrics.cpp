#include "duet/engine/metrics.h"

#include <algorithm>

namespace duet {
namespace {

// vLLM's bucket boundaries, so existing dashboards read the same.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                          2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTpotBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                                          1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatencyBuckets = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                                             40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

const std::vector<double> kIterationBuckets = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

std::vector<double> token_buckets() {
  std::vector<double> b;
  for (double x = 1; x <= 1e6; x *= 10) {
    b.push_back(x);
    b.push_back(2 * x);
    b.push_back(5 * x);
  }
  return b;
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size()) {
  std::sort(bounds_.begin(), bounds_.end());
}

void Histogram::observe(double value) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (value <= bounds_[i]) ++counts_[i];
  }
  ++count_;
  sum_ += value;
}

Histogram rank_step_histogram() { return Histogram(kTtftBuckets); }

DeviceMetrics::DeviceMetrics(std::string device_name) : name(std::move(device_name)), step_seconds(kTtftBuckets) {}

EngineMetrics::EngineMetrics()
    : time_to_first_token(kTtftBuckets),
      time_per_output_token(kTpotBuckets),
      inter_token_latency(kTpotBuckets),
      e2e_request_latency(kLatencyBuckets),
      request_queue_time(kLatencyBuckets),
      request_prompt_tokens(token_buckets()),
      request_generation_tokens(token_buckets()),
      iteration_tokens(kIterationBuckets) {}

}  // namespace duet
