// --tensor-parallel-size, --pipeline-parallel-size and the rank options of the commands that run
// a model (serve, generate, logits, bench), and starting the ranks under mpirun.
#pragma once

#include <memory>

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

// Whether this process is a rank other than 0 (it then runs run_rank_worker).
inline bool is_worker(const std::shared_ptr<ParallelGroup>& g) { return g != nullptr && g->rank() != 0; }

}  // namespace duet::cli
