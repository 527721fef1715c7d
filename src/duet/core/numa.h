// NUMA placement for the CPU backend, from the machine's own description in
// /sys/devices/system/node (no library needed). `--numa` (or DUET_NUMA) chooses the policy:
//   (unset) or none: the kernel decides, as for any program;
//   distribute: worker threads pinned round-robin over the nodes' CPUs, and the memory duet
//               allocates for the model (packed weight copies, the KV cache) interleaved over
//               every node, so all memory controllers serve the weight stream (what a 4-node
//               Kunpeng 920 needs); weights used in place from a mapped file stay in the page
//               cache where the kernel read them;
//   isolate:    threads pinned to the CPUs of the first node this process may run on, and those
//               same allocations bound to that node (one engine per node, several processes per
//               machine).
// On a machine with one node both only pin the threads.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace duet {

enum class NumaMode { kNone, kDistribute, kIsolate };

// "none", "distribute" or "isolate"; throws kInvalidArgument naming `what` for another value.
NumaMode parse_numa_mode(std::string_view name, std::string_view what = "--numa");
// DUET_NUMA=none|distribute|isolate (default none); throws kInvalidArgument for another value.
NumaMode numa_mode_from_env();
// The process's policy: the one set by set_numa_mode (the --numa flag), else DUET_NUMA's. Read
// when a backend or a KV cache is made.
NumaMode numa_mode();
void set_numa_mode(NumaMode mode);

struct NumaTopology {
  std::vector<int> nodes;                  // node ids with CPUs this process may use
  std::vector<std::vector<int>> node_cpus;  // their CPUs, in the same order
  std::vector<int64_t> node_memory_bytes;   // their MemTotal (0 where /sys does not say)
  std::vector<int64_t> node_free_bytes;     // their MemFree + FilePages (what can be had)
};

// Parses a kernel CPU list ("0-3,8,10-11"); throws kInvalidArgument on malformed text.
std::vector<int> parse_cpu_list(std::string_view text);
// The nodes and CPUs of this machine that this process's affinity allows (one node holding every
// allowed CPU where /sys has no node information).
NumaTopology numa_topology();
// The CPU each of the pool's threads is pinned to (index 0 is the calling thread, which is not
// pinned); empty for kNone.
std::vector<int> numa_thread_cpus(NumaMode mode, const NumaTopology& topo, int num_threads);
// Sets the memory policy of [p, p + bytes) (page aligned, not touched yet) for the mode:
// interleave over every node, or bind to the first. Does nothing for kNone or one node. Returns
// false when the kernel refused (the pages then go where they are first touched).
bool numa_place(void* p, size_t bytes, NumaMode mode, const NumaTopology& topo);
// Where a device's pages go: wherever the kernel puts them, interleaved over every node, or on one
// node. place_memory sets [p, p + bytes) (page aligned, not touched yet) accordingly; false when
// the kernel refused (the pages then go where they are first touched). Nothing to do on a
// machine with one node.
struct MemoryPlacement {
  enum class Kind { kDefault, kInterleave, kNode };
  Kind kind = Kind::kDefault;
  int node = -1;
};
// The placement `--numa` (numa_mode()) gives the whole-machine CPU device.
MemoryPlacement memory_placement_for(NumaMode mode, const NumaTopology& topo);
bool place_memory(void* p, size_t bytes, const MemoryPlacement& placement, const NumaTopology& topo);

// Pins the calling thread to one CPU; false when refused (the thread then runs anywhere).
bool pin_current_thread(int cpu);

}  // namespace duet
