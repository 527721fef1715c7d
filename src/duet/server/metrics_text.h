// /metrics in the Prometheus text format (0.0.4), under vLLM's metric names and meanings so
// existing dashboards work, plus duet's own: KV fragmentation, device utilization, failure ratio.
#pragma once

#include <cstdint>
#include <string>

#include "duet/engine/metrics.h"

namespace duet::server {

struct ServerCounters {
  int64_t requests_total = 0;   // completion and chat requests received
  int64_t requests_failed = 0;  // of those, answered with an error (4xx from the engine or 5xx)
};

std::string render_metrics(const EngineMetrics& m, const ServerCounters& s, const std::string& model_name);

}  // namespace duet::server
