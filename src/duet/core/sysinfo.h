// Facts about the machine the engine sizes itself by: the memory it may still take (the host's
// MemAvailable, lowered to the headroom of the cgroup it runs in) and what the process holds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace duet {

// Where the memory facts are read: /proc (meminfo, self/cgroup, self/status) and the cgroup
// file system's mount point. Tests point both at trees they write; DUET_CGROUP_DIR replaces the
// cgroup root for a whole process (a server started with a fake limit).
struct SystemFiles {
  std::string proc = "/proc";
  std::string cgroup;  // empty: $DUET_CGROUP_DIR, else /sys/fs/cgroup

  std::string cgroup_root() const;
};

// The memory cgroup this process is in, v2 (memory.max, memory.current, memory.stat's
// active_file + inactive_file) or v1 (memory.limit_in_bytes, memory.usage_in_bytes, memory.stat's
// total_active_file + total_inactive_file), at the level of the hierarchy, from the process's
// own cgroup up to the root, whose limit leaves the least room.
struct CgroupMemory {
  int version = 0;            // 1 or 2
  std::string path;           // the limiting cgroup's folder
  int64_t limit_bytes = 0;    // its limit
  int64_t usage_bytes = 0;    // charged to it now, page cache included
  int64_t file_bytes = 0;     // of which page cache it can drop (as MemAvailable counts it)

  // What can still be charged before the limit is reached (the file cache counted as free).
  int64_t headroom_bytes() const;
};

// The limiting level of this process's memory cgroup, or nothing where no level has a limit (or
// no memory cgroup is mounted). A process whose cgroup path is not under the mount (a container
// that sees its own cgroup as the root) reads the mount's root.
std::optional<CgroupMemory> cgroup_memory(const SystemFiles& files = {});

// MemAvailable from /proc/meminfo, lowered to the cgroup's headroom where a limit is set, in
// bytes; 0 when neither can be read.
int64_t available_memory_bytes(const SystemFiles& files = {});
// MemTotal from /proc/meminfo, lowered to the cgroup's limit where one is set; 0 when unknown.
int64_t total_memory_bytes(const SystemFiles& files = {});

// What this process holds in memory now (/proc/self/status): VmRSS, split into RssAnon (its own
// pages: copies, caches, the heap) and RssFile (mapped file pages: weights used in place).
struct ProcessMemory {
  int64_t resident_bytes = 0;
  int64_t anonymous_bytes = 0;
  int64_t file_bytes = 0;
};
ProcessMemory process_memory(const SystemFiles& files = {});

}  // namespace duet
