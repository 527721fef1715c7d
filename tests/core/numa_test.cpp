// NUMA placement: CPU lists as the kernel writes them, thread placement per mode on a made-up
// two-node machine, and this machine's own description.
#include <sched.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/core/numa.h"
#include "duet/core/thread_pool.h"

namespace duet {
namespace {

TEST(Numa, ParsesCpuLists) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), (std::vector<int>{5}));
  EXPECT_TRUE(parse_cpu_list("").empty());
  for (const char* bad : {"1-", "a", "3-1", "1,,2", "-2"}) {
    EXPECT_THROW(parse_cpu_list(bad), Error) << bad;
  }
}

TEST(Numa, PlacesThreadsPerMode) {
  NumaTopology two;
  two.nodes = {0, 1};
  two.node_cpus = {{0, 1, 2, 3}, {4, 5, 6, 7}};
  EXPECT_TRUE(numa_thread_cpus(NumaMode::kNone, two, 4).empty());
  // distribute: alternate nodes, each node's CPUs in order.
  EXPECT_EQ(numa_thread_cpus(NumaMode::kDistribute, two, 6), (std::vector<int>{0, 4, 1, 5, 2, 6}));
  // isolate: the first node only, wrapping when there are more threads than its CPUs.
  EXPECT_EQ(numa_thread_cpus(NumaMode::kIsolate, two, 6), (std::vector<int>{0, 1, 2, 3, 0, 1}));
}

TEST(Numa, ReadsThisMachineAndReadsTheMode) {
  const NumaTopology topo = numa_topology();
  ASSERT_FALSE(topo.nodes.empty());
  ASSERT_EQ(topo.nodes.size(), topo.node_cpus.size());
  size_t cpus = 0;
  for (const auto& node : topo.node_cpus) {
    EXPECT_FALSE(node.empty());
    cpus += node.size();
  }
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  EXPECT_EQ(cpus, static_cast<size_t>(CPU_COUNT(&allowed)));

  ::setenv("DUET_NUMA", "distribute", 1);
  EXPECT_EQ(numa_mode_from_env(), NumaMode::kDistribute);
  ::setenv("DUET_NUMA", "isolate", 1);
  EXPECT_EQ(numa_mode_from_env(), NumaMode::kIsolate);
  ::setenv("DUET_NUMA", "sideways", 1);
  EXPECT_THROW(numa_mode_from_env(), Error);
  ::unsetenv("DUET_NUMA");
  EXPECT_EQ(numa_mode_from_env(), NumaMode::kNone);
  // The flag's setting wins over the environment.
  ::setenv("DUET_NUMA", "isolate", 1);
  EXPECT_EQ(numa_mode(), NumaMode::kIsolate);
  set_numa_mode(parse_numa_mode("distribute"));
  EXPECT_EQ(numa_mode(), NumaMode::kDistribute);
  set_numa_mode(NumaMode::kNone);
  EXPECT_EQ(numa_mode(), NumaMode::kNone);
  ::unsetenv("DUET_NUMA");
  EXPECT_THROW(parse_numa_mode("sideways"), Error);
}

TEST(Numa, PinnedWorkersRunOnTheirCpu) {
  const NumaTopology topo = numa_topology();
  const std::vector<int> cpus = numa_thread_cpus(NumaMode::kIsolate, topo, 3);
  ThreadPool pool(3, cpus);
  std::vector<int> seen(3, -1);
  pool.run([&](int t, int) { seen[static_cast<size_t>(t)] = sched_getcpu(); });
  EXPECT_EQ(seen[1], cpus[1]);
  EXPECT_EQ(seen[2], cpus[2]);
}

}  // namespace
}  // namespace duet
