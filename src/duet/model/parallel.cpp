#include "duet/model/parallel.h"

#include "duet/comm/shm_communicator.h"
#include "duet/core/error.h"

namespace duet {

ParallelGroup::ParallelGroup(std::unique_ptr<Communicator> world, ParallelConfig config, bool shm)
    : world_(std::move(world)), config_(config) {
  if (config_.tensor_parallel < 1 || config_.pipeline_parallel < 1) {
    fail(ErrorCode::kInvalidArgument, "--tensor-parallel-size {} and --pipeline-parallel-size {} must be at least 1",
         config_.tensor_parallel, config_.pipeline_parallel);
  }
  if (world_->size() != config_.world_size()) {
    fail(ErrorCode::kInvalidArgument,
         "--tensor-parallel-size {} x --pipeline-parallel-size {} is {} ranks, but the job has {} (mpirun -np {})",
         config_.tensor_parallel, config_.pipeline_parallel, config_.world_size(), world_->size(),
         config_.world_size());
  }
  tensor_ = world_->split(stage(), tensor_rank());
  if (shm && tensor_->size() > 1 && tensor_->same_host()) tensor_ = make_shm_communicator(std::move(tensor_));
}

ParallelGroup::~ParallelGroup() = default;

std::pair<int64_t, int64_t> ParallelGroup::stage_layers(int64_t num_layers, int stage, int num_stages) {
  const int64_t base = num_layers / num_stages, extra = num_layers % num_stages;
  const int64_t first = stage * base + std::min<int64_t>(stage, extra);
  return {first, first + base + (stage < extra ? 1 : 0)};
}

std::pair<int64_t, int64_t> ParallelGroup::shard(int64_t total, int64_t unit, const std::string& what) const {
  const int64_t t = config_.tensor_parallel;
  if (total % (t * unit) != 0) {
    fail(ErrorCode::kInvalidArgument,
         "tensor parallelism over {} ranks splits {} ({}) in {} equal shares of whole units of {}: {} is not a "
         "multiple of {}",
         t, what, total, t, unit, total, t * unit);
  }
  const int64_t count = total / t;
  return {count * tensor_rank(), count};
}

namespace {

class RankDevice final : public Device {
 public:
  RankDevice(int stage, int rank) : Device("rank:" + std::to_string(rank)), stage_(stage), rank_(rank) {}
  DeviceInfo info() const override {
    DeviceInfo i;
    i.name = name();
    i.kind = "rank";
    i.node = stage_;
    return i;
  }
  Backend& backend() override { refuse("run an op"); }
  bool host_accessible() const override { return false; }
  int remote_rank() const override { return rank_; }
  DeviceBuffer allocate(size_t, MemoryKind) override { refuse("allocate memory"); }
  void copy_from_host(void*, const void*, size_t) override { refuse("copy"); }
  void copy_to_host(void*, const void*, size_t) override { refuse("copy"); }
  // Another process loads these.
  std::unique_ptr<LoadedWeights> load_weights(std::span<const WeightRef>) override { return nullptr; }

 private:
  [[noreturn]] void refuse(const char* what) const {
    fail(ErrorCode::kInternal, "cannot {} on {}: stage {} runs in another process", what, name(), stage_);
  }
  int stage_;
  int rank_;
};

}  // namespace

std::shared_ptr<Device> make_rank_device(int stage, int world_rank) {
  return std::make_shared<RankDevice>(stage, world_rank);
}

}  // namespace duet
