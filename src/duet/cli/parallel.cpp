#include "duet/cli/parallel.h"

#include "duet/comm/mpi.h"
#include "duet/core/error.h"
#include "duet/core/log.h"
#include "duet/engine/model_path.h"
#include "duet/engine/rank_worker.h"

namespace duet::cli {

void add_parallel_options(CLI::App* cmd, ParallelOptions& o) {
  cmd->add_option("--tensor-parallel-size,--tp", o.config.tensor_parallel,
                  "Ranks that split every layer (attention heads, feed-forward columns, experts, vocabulary); "
                  "run under mpirun -np TP x PP")
      ->capture_default_str();
  cmd->add_option("--pipeline-parallel-size,--pp", o.config.pipeline_parallel,
                  "Pipeline stages of consecutive layers, each on its own ranks")
      ->capture_default_str();
  cmd->add_option("--rank-timeout", o.rank_timeout,
                  "Seconds a rank waits for another (a step, a heartbeat) before the job fails")
      ->capture_default_str();
  cmd->add_flag("--no-shm-collectives", o.no_shm,
                "Tensor-parallel collectives through MPI even between ranks on one machine");
}

std::shared_ptr<ParallelGroup> start_parallel(const ParallelOptions& o) {
  const int want = o.config.world_size();
  if (!launched_by_mpi()) {
    if (want > 1) {
      fail(ErrorCode::kInvalidArgument,
           "--tensor-parallel-size {} x --pipeline-parallel-size {} needs {} ranks: start it with mpirun -np {} duet ...",
           o.config.tensor_parallel, o.config.pipeline_parallel, want, want);
    }
    return nullptr;
  }
  if (!(o.rank_timeout > 0.0)) fail(ErrorCode::kInvalidArgument, "--rank-timeout is {}, expected seconds > 0", o.rank_timeout);
  std::unique_ptr<Communicator> world = init_mpi_world();
  if (world->size() == 1 && want == 1) return nullptr;
  world->set_timeout(std::chrono::duration_cast<Communicator::Duration>(std::chrono::duration<double>(o.rank_timeout)));
  auto group = std::make_shared<ParallelGroup>(std::move(world), o.config, !o.no_shm);
  spdlog::info("rank {} of {}: stage {} of {}, tensor rank {} of {} ({} collectives)", group->rank(),
               group->world().size(), group->stage(), group->num_stages(), group->tensor_rank(), group->tensor_size(),
               group->tensor().name());
  return group;
}

int run_worker_rank(const std::string& model, const EngineConfig& config) {
  return run_rank_worker(std::make_shared<const GgufFile>(open_model_path(model)), config);
}

int run_worker_rank(const std::string& model, int threads, const DeviceMapSpec& map, KvDtype kv_dtype,
                    std::shared_ptr<ParallelGroup> parallel) {
  EngineConfig config;
  config.threads = threads;
  config.device_map = map;
  config.kv_cache_dtype = kv_dtype;
  config.parallel = std::move(parallel);
  return run_worker_rank(model, config);
}

}  // namespace duet::cli
