#include "duet/core/numa.h"

#include <linux/mempolicy.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "duet/core/error.h"

namespace duet {

NumaMode parse_numa_mode(std::string_view name, std::string_view what) {
  if (name == "none") return NumaMode::kNone;
  if (name == "distribute") return NumaMode::kDistribute;
  if (name == "isolate") return NumaMode::kIsolate;
  fail(ErrorCode::kInvalidArgument, "{} is '{}' (expected none, distribute or isolate)", what, name);
}

NumaMode numa_mode_from_env() {
  const char* env = std::getenv("DUET_NUMA");
  if (env == nullptr || *env == '\0') return NumaMode::kNone;
  return parse_numa_mode(env, "DUET_NUMA");
}

namespace {
std::atomic<int> g_numa_mode{-1};  // -1: not set, take DUET_NUMA
}  // namespace

NumaMode numa_mode() {
  const int m = g_numa_mode.load(std::memory_order_relaxed);
  return m < 0 ? numa_mode_from_env() : static_cast<NumaMode>(m);
}

void set_numa_mode(NumaMode mode) { g_numa_mode.store(static_cast<int>(mode), std::memory_order_relaxed); }

std::vector<int> parse_cpu_list(std::string_view text) {
  std::vector<int> cpus;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    auto number = [&](std::string_view s) {
      int v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec != std::errc() || end != s.data() + s.size() || s.empty() || v < 0) {
        fail(ErrorCode::kInvalidArgument, "bad CPU list '{}': '{}' is not a CPU number", text, s);
      }
      return v;
    };
    const int first = number(item.substr(0, dash));
    const int last = dash == std::string_view::npos ? first : number(item.substr(dash + 1));
    if (last < first) fail(ErrorCode::kInvalidArgument, "bad CPU list '{}': range '{}' runs backwards", text, item);
    for (int c = first; c <= last; ++c) cpus.push_back(c);
    pos = comma + 1;
  }
  return cpus;
}

NumaTopology numa_topology() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &allowed);
  }
  NumaTopology topo;
  std::error_code ec;
  std::vector<std::pair<int, std::vector<int>>> found;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4) continue;
    int node = 0;
    const auto [end, err] = std::from_chars(name.data() + 4, name.data() + name.size(), node);
    if (err != std::errc() || end != name.data() + name.size()) continue;
    std::ifstream in(entry.path() / "cpulist");
    std::string list;
    std::getline(in, list);
    std::vector<int> cpus;
    for (int c : parse_cpu_list(list)) {
      if (c < CPU_SETSIZE && CPU_ISSET(c, &allowed)) cpus.push_back(c);
    }
    if (!cpus.empty()) found.emplace_back(node, std::move(cpus));
  }
  std::sort(found.begin(), found.end());
  for (auto& [node, cpus] : found) {
    topo.nodes.push_back(node);
    topo.node_cpus.push_back(std::move(cpus));
    // "Node 0 MemTotal:       32768 kB"
    int64_t total = 0, free = 0, file = 0;
    std::ifstream in("/sys/devices/system/node/node" + std::to_string(node) + "/meminfo");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string word, key;
      int64_t kib = 0;
      fields >> word >> word >> key >> kib;
      if (key == "MemTotal:") total = kib * 1024;
      if (key == "MemFree:") free = kib * 1024;
      if (key == "FilePages:") file = kib * 1024;
    }
    topo.node_memory_bytes.push_back(total);
    topo.node_free_bytes.push_back(free + file);
  }
  if (topo.nodes.empty()) {
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    }
    topo.nodes.push_back(0);
    topo.node_cpus.push_back(std::move(cpus));
    topo.node_memory_bytes.push_back(0);
    topo.node_free_bytes.push_back(0);
  }
  return topo;
}

std::vector<int> numa_thread_cpus(NumaMode mode, const NumaTopology& topo, int num_threads) {
  std::vector<int> cpus;
  if (mode == NumaMode::kNone || topo.nodes.empty()) return cpus;
  if (mode == NumaMode::kIsolate) {
    const std::vector<int>& node = topo.node_cpus.front();
    for (int t = 0; t < num_threads; ++t) cpus.push_back(node[static_cast<size_t>(t) % node.size()]);
    return cpus;
  }
  // Round-robin over the nodes, and within a node over its CPUs in order.
  std::vector<size_t> next(topo.nodes.size(), 0);
  for (int t = 0; t < num_threads; ++t) {
    const size_t n = static_cast<size_t>(t) % topo.nodes.size();
    const std::vector<int>& node = topo.node_cpus[n];
    cpus.push_back(node[next[n]++ % node.size()]);
  }
  return cpus;
}

bool numa_place(void* p, size_t bytes, NumaMode mode, const NumaTopology& topo) {
  return place_memory(p, bytes, memory_placement_for(mode, topo), topo);
}

MemoryPlacement memory_placement_for(NumaMode mode, const NumaTopology& topo) {
  if (mode == NumaMode::kDistribute) return MemoryPlacement{MemoryPlacement::Kind::kInterleave, -1};
  if (mode == NumaMode::kIsolate && !topo.nodes.empty()) return MemoryPlacement{MemoryPlacement::Kind::kNode, topo.nodes[0]};
  return MemoryPlacement{};
}

bool place_memory(void* p, size_t bytes, const MemoryPlacement& placement, const NumaTopology& topo) {
  if (placement.kind == MemoryPlacement::Kind::kDefault || topo.nodes.size() < 2 || bytes == 0) return true;
  unsigned long mask[16] = {};  // up to 1024 nodes
  int policy = MPOL_BIND;
  if (placement.kind == MemoryPlacement::Kind::kInterleave) {
    policy = MPOL_INTERLEAVE;
    for (int node : topo.nodes) {
      if (node < 1024) mask[node / 64] |= 1UL << (node % 64);
    }
  } else if (placement.node >= 0 && placement.node < 1024) {
    mask[placement.node / 64] |= 1UL << (placement.node % 64);
  }
  return ::syscall(SYS_mbind, p, bytes, policy, mask, 1024 + 1, 0) == 0;
}

bool pin_current_thread(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace duet
