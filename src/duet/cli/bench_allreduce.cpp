// `mpirun -np N duet bench allreduce [--sizes 4096,...] [-r 200] [--json]`: the latency of
// allreduce_sum over every rank, through MPI and through the shared-memory path, for each size
// (bytes of floats), alternating the two in every round; rank 0 prints the median of each and
// which is faster.
#include <algorithm>
#include <chrono>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/cli/bench_commands.h"
#include "duet/comm/mpi.h"
#include "duet/comm/shm_communicator.h"
#include "duet/core/error.h"

namespace duet::cli {
namespace {

struct AllreduceOptions {
  std::vector<int64_t> sizes{4096, 16384, 65536, 262144, 1048576, 4194304};
  int repetitions = 200;
  bool json = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run_allreduce(const AllreduceOptions& o) {
  if (!launched_by_mpi()) fail(ErrorCode::kInvalidArgument, "bench allreduce runs under mpirun -np N (N >= 2)");
  if (o.repetitions < 1) fail(ErrorCode::kInvalidArgument, "-r is {}, expected at least 1", o.repetitions);
  std::unique_ptr<Communicator> world = init_mpi_world();
  if (world->size() < 2) fail(ErrorCode::kInvalidArgument, "bench allreduce needs 2 or more ranks, mpirun gave 1");
  world->set_timeout(std::chrono::seconds(60));
  int64_t largest = 0;
  for (int64_t s : o.sizes) {
    if (s < 4 || s % 4 != 0) fail(ErrorCode::kInvalidArgument, "--sizes: {} is not a positive multiple of 4 bytes", s);
    largest = std::max(largest, s);
  }
  std::unique_ptr<Communicator> mpi = world->split(0, world->rank());
  std::unique_ptr<Communicator> shm = world->same_host() ? make_shm_communicator(world->split(0, world->rank()),
                                                                                 static_cast<size_t>(largest))
                                                         : nullptr;
  nlohmann::json rows = nlohmann::json::array();
  if (world->rank() == 0 && !o.json) {
    fmt::print("| bytes | ranks | MPI (us) | shared memory (us) | faster |\n| ---: | ---: | ---: | ---: | --- |\n");
  }
  for (int64_t bytes : o.sizes) {
    const int64_t count = bytes / 4;
    std::vector<float> data(static_cast<size_t>(count), 1.0f);
    std::vector<double> t_mpi, t_shm;
    const auto time_one = [&](Communicator& c) {
      c.barrier();
      const auto start = std::chrono::steady_clock::now();
      c.allreduce_sum(data.data(), count);
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    };
    for (int r = 0; r < o.repetitions + 5; ++r) {  // 5 warm-up rounds
      const double a = time_one(*mpi);
      const double b = shm ? time_one(*shm) : 0.0;
      if (r >= 5) {
        t_mpi.push_back(a);
        t_shm.push_back(b);
      }
      std::fill(data.begin(), data.end(), 1.0f);
    }
    const double m_mpi = median(t_mpi), m_shm = shm ? median(t_shm) : 0.0;
    if (world->rank() != 0) continue;
    const char* faster = !shm ? "mpi (ranks on several machines)" : m_shm < m_mpi ? "shared memory" : "mpi";
    if (o.json) {
      rows.push_back({{"bytes", bytes}, {"ranks", world->size()}, {"mpi_us", m_mpi}, {"shm_us", m_shm}, {"faster", faster}});
    } else {
      fmt::print("| {} | {} | {:.1f} | {:.1f} | {} |\n", bytes, world->size(), m_mpi, m_shm, faster);
    }
    std::fflush(stdout);
  }
  if (world->rank() == 0 && o.json) fmt::print("{}\n", rows.dump());
  shm.reset();
  mpi.reset();
  world.reset();
  return 0;
}

}  // namespace

void add_bench_allreduce_command(CLI::App* bench, int& exit_code) {
  auto* cmd = bench->add_subcommand("allreduce", "Allreduce latency by size, MPI against shared memory (under mpirun)");
  auto o = std::make_shared<AllreduceOptions>();
  cmd->add_option("--sizes", o->sizes, "Message sizes in bytes (comma separated)")->delimiter(',')->capture_default_str();
  cmd->add_option("-r,--repetitions", o->repetitions, "Timed rounds per size")->capture_default_str();
  cmd->add_flag("--json", o->json, "One JSON array instead of a table");
  cmd->callback([o, &exit_code] { exit_code = run_allreduce(*o); });
}

}  // namespace duet::cli
