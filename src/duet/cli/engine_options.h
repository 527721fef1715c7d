// The engine options shared by the commands that run the engine (generate, bench throughput,
// and later serve).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "duet/cli/parallel.h"
#include "duet/engine/llm_engine.h"

namespace duet::cli {

// --device-map, --override-tensor and --moe-experts: where a model's parts run.
struct PlacementOptions {
  std::string device_map;
  std::vector<std::string> override_tensor;
  std::string moe_experts;

  // Throws kInvalidArgument naming what does not parse.
  DeviceMapSpec spec() const;
};
void add_placement_options(CLI::App* cmd, PlacementOptions& o);

struct EngineOptions {
  EngineConfig config;
  PlacementOptions placement;
  bool no_prefix_caching = false;
  bool no_chunked_prefill = false;
  std::string policy = "fcfs";
  std::string speculative_method = "none";
  std::vector<std::string> lora_modules;  // --lora-modules, as given
  ParallelOptions parallel;

  // Applies the flags that invert defaults and the device map; throws kInvalidArgument for a bad
  // policy or map. Does not start the ranks (start_parallel(parallel) does).
  EngineConfig resolve() const;
};

void add_engine_options(CLI::App* cmd, EngineOptions& o);
// --kv-cache-dtype f16|q8_0|f32 (default f16), for the commands that run a model.
void add_kv_dtype_option(CLI::App* cmd, KvDtype& dtype);
// --numa none|distribute|isolate: the process's NUMA placement (core/numa.h), set when parsed.
void add_numa_option(CLI::App* cmd);

}  // namespace duet::cli
