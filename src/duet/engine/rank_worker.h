// What every rank but rank 0 runs: its share of the model (its stage's layers, its tensor
// shard), stepped by rank 0. See docs/ARCHITECTURE.md, "Ranks".
#pragma once

#include <memory>

#include "duet/engine/llm_engine.h"

namespace duet {

// Loads this rank's share of the model in `file` as `config` places it (config.parallel set,
// rank != 0), tells rank 0 how many KV blocks it has room for, then runs what rank 0 sends: a KV
// cache to make, micro-batches (launched in the same order as on rank 0, up to the executor's
// depth in flight), pings (answered at once), and the stop. Returns 0 after the stop; throws
// kUnavailable when rank 0 sends nothing for the world communicator's timeout while idle, or a
// step cannot reach another rank in that time.
int run_rank_worker(std::shared_ptr<const GgufFile> file, const EngineConfig& config);

}  // namespace duet
