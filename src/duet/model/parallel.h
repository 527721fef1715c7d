// Several processes (ranks) running one model: tensor parallelism (the ranks of a stage each hold
// a shard of every part: attention heads, feed-forward columns, the head's vocabulary, a MoE
// layer's routed experts, and add their partial results with an allreduce) and pipeline
// parallelism (stages of consecutive layers, each on its own ranks; the carried buffers go from
// stage to stage point to point). World rank r is tensor rank r % T of stage r / T; rank 0 runs
// the scheduler and the sampler, and sends every step to the others. See docs/ARCHITECTURE.md,
// "Ranks: tensor, pipeline and expert parallelism".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "duet/backend/device.h"
#include "duet/comm/communicator.h"

namespace duet {

struct ParallelConfig {
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int world_size() const { return tensor_parallel * pipeline_parallel; }
};

// This process's place among the ranks, and the communicators it uses.
class ParallelGroup {
 public:
  // `world`: every rank (size T x P, else kInvalidArgument naming both). Makes the stage's
  // tensor-parallel communicator (shared memory for its collectives when the stage's ranks share
  // this machine and `shm` is set). Collective over every rank.
  ParallelGroup(std::unique_ptr<Communicator> world, ParallelConfig config, bool shm = true);
  ~ParallelGroup();

  Communicator& world() const { return *world_; }
  // The ranks of this stage (tensor parallelism).
  Communicator& tensor() const { return *tensor_; }
  const ParallelConfig& config() const { return config_; }
  int rank() const { return world_->rank(); }
  int stage() const { return world_->rank() / config_.tensor_parallel; }
  int tensor_rank() const { return world_->rank() % config_.tensor_parallel; }
  int tensor_size() const { return config_.tensor_parallel; }
  int num_stages() const { return config_.pipeline_parallel; }
  int rank_of(int stage, int tensor_rank) const { return stage * config_.tensor_parallel + tensor_rank; }
  // Layers [first, end) of `stage`, for a model of num_layers layers: as even as they go, the
  // first stages taking one more when they do not divide.
  static std::pair<int64_t, int64_t> stage_layers(int64_t num_layers, int stage, int num_stages);
  // The rows [first, first + count) of `total` that tensor rank `t` holds, in whole `unit`s (a
  // head, a block of a quantized type): an even share. Throws kInvalidArgument naming `what` when
  // total is not a multiple of tensor_size() x unit.
  std::pair<int64_t, int64_t> shard(int64_t total, int64_t unit, const std::string& what) const;

 private:
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<Communicator> tensor_;
  ParallelConfig config_;
};

// Another rank's stage as a device of this process's placement: its parts run there, so this
// process loads nothing for them, allocates nothing on it, and the executor sends it the carried
// buffers its parts read and receives the ones they write (see Executor).
std::shared_ptr<Device> make_rank_device(int stage, int world_rank);

}  // namespace duet
