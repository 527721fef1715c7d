// --tensor-parallel-size, --pipeline-parallel-size and the rank options of the commands that run
// a model (serve, generate, logits, bench), and starting the ranks under mpirun.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "duet/engine/llm_engine.h"
#include "duet/model/parallel.h"

namespace duet::cli {

struct ParallelOptions {
  ParallelConfig config;
  double rank_timeout = 60.0;  // seconds a rank waits for another before it gives up
  bool no_shm = false;         // collectives through MPI even between ranks of one machine
};
void add_parallel_options(CLI::App* cmd, ParallelOptions& o);

// The ranks of this job, or null for one process (no flags and no launcher, or mpirun -np 1
// without them). Throws kInvalidArgument when the sizes ask for several ranks without mpirun,
// or do not multiply to the number mpirun started.
std::shared_ptr<ParallelGroup> start_parallel(const ParallelOptions& o);

// Whether this process is a rank other than 0 (it then runs run_worker_rank).
inline bool is_worker(const std::shared_ptr<ParallelGroup>& g) { return g != nullptr && g->rank() != 0; }

// A rank other than 0: opens `model` and runs this rank's parts of it with `config` (its
// `parallel` set) until rank 0 stops the ranks; returns the process's exit code.
int run_worker_rank(const std::string& model, const EngineConfig& config);
// The same for a command that runs the model without an engine (bench, logits): a worker's
// engine settings from its threads, map and KV type.
int run_worker_rank(const std::string& model, int threads, const DeviceMapSpec& map, KvDtype kv_dtype,
                    std::shared_ptr<ParallelGroup> parallel);

}  // namespace duet::cli
