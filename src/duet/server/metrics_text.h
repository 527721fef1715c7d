// /metrics in the Prometheus text format (0.0.4), under vLLM's metric names and meanings so
// existing dashboards work, plus duet's own: KV fragmentation, device utilization, failure ratio.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "duet/engine/metrics.h"

namespace duet::server {

struct ServerCounters {
  int64_t requests_total = 0;   // completion and chat requests received
  int64_t requests_failed = 0;  // of those, answered with an error (4xx from the engine or 5xx)
  // Joules per device since the server started, for the devices whose energy the machine
  // exposes (RAPL); empty where it exposes none, and then the metric is absent, not zero.
  std::vector<std::pair<std::string, double>> energy_joules;
  // The HTTP server's (under the first model, as energy): open connections, and accepts that
  // failed for want of file descriptors or memory. -1: not given, and the metric is absent.
  int64_t http_connections = -1;
  int64_t http_accept_failures = -1;
  // The responses kept for /v1/responses (under the first model too): how many, and their bytes.
  int64_t stored_responses = -1;
  int64_t conversations = -1;       // /v1/conversations kept (-1: not reported)
  int64_t conversation_bytes = 0;
  int64_t stored_response_bytes = -1;
  // The Files and Batch APIs (under the first model too): the files' bytes (-1: the routes are
  // off), and the batches in each status (every status, zeros included).
  int64_t files_bytes = -1;
  std::vector<std::pair<std::string, int64_t>> batches;
};

// One served model's metrics, labelled model_name="name".
struct ModelMetrics {
  std::string name;
  EngineMetrics engine;
  ServerCounters counters;
};

// Every model's samples of a metric under one HELP/TYPE header, as the format requires.
std::string render_metrics(const std::vector<ModelMetrics>& models);
std::string render_metrics(const EngineMetrics& m, const ServerCounters& s, const std::string& model_name);

}  // namespace duet::server
