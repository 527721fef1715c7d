#include "duet/core/sysinfo.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

namespace duet {
namespace {

namespace fs = std::filesystem;

// Limits at or above this are "no limit" (v1 writes 9223372036854771712, the page counter's top).
constexpr int64_t kNoLimit = int64_t{1} << 62;

std::optional<int64_t> parse_int(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// A "Key:   123 kB" line of /proc/meminfo or /proc/self/status, in bytes; 0 when absent.
int64_t kib_field(const std::string& path, std::string_view key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 && line[key.size()] == ':') {
      std::istringstream fields(line.substr(key.size() + 1));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

// A file holding one number ("max" in v2 for none): the number, kNoLimit for "max", nothing when
// the file is absent or holds something else.
std::optional<int64_t> number_file(const fs::path& path) {
  std::ifstream in(path);
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  if (text == "max") return kNoLimit;
  return parse_int(text);
}

// The sum of `keys` in a "key value" file (memory.stat); 0 for those absent.
int64_t stat_sum(const fs::path& path, std::initializer_list<std::string_view> keys) {
  std::ifstream in(path);
  std::string line;
  int64_t sum = 0;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    const std::string_view key(line.data(), space);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) continue;
    sum += parse_int(std::string_view(line).substr(space + 1)).value_or(0);
  }
  return sum;
}

// One level of the hierarchy: its limit (kNoLimit for none) and what is charged to it.
CgroupMemory read_level(const fs::path& dir, int version) {
  CgroupMemory m;
  m.version = version;
  m.path = dir.string();
  if (version == 2) {
    m.limit_bytes = std::min(number_file(dir / "memory.max").value_or(kNoLimit),
                             number_file(dir / "memory.high").value_or(kNoLimit));
    m.usage_bytes = number_file(dir / "memory.current").value_or(0);
    m.file_bytes = stat_sum(dir / "memory.stat", {"active_file", "inactive_file"});
  } else {
    // hierarchical_memory_limit also holds the ancestors' limits where they are not visible.
    m.limit_bytes = number_file(dir / "memory.limit_in_bytes").value_or(kNoLimit);
    const int64_t hierarchical = stat_sum(dir / "memory.stat", {"hierarchical_memory_limit"});
    if (hierarchical > 0) m.limit_bytes = std::min(m.limit_bytes, hierarchical);
    m.usage_bytes = number_file(dir / "memory.usage_in_bytes").value_or(0);
    m.file_bytes = stat_sum(dir / "memory.stat", {"total_active_file", "total_inactive_file"});
  }
  return m;
}

struct CgroupPlace {
  int version = 0;
  fs::path mount;
  std::string path;  // the process's cgroup, relative to the mount
};

// Where the process's memory cgroup is, from /proc/self/cgroup ("id:controllers:path" lines):
// v1's memory controller where it is mounted (hybrid systems keep memory there), else v2.
std::optional<CgroupPlace> find_cgroup(const SystemFiles& files) {
  std::ifstream in(files.proc + "/self/cgroup");
  const fs::path root = files.cgroup_root();
  std::optional<CgroupPlace> v2;
  std::string line;
  std::error_code ec;
  while (std::getline(in, line)) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    while (!path.empty() && path.front() == '/') path.erase(0, 1);
    if (id == "0" && controllers.empty()) {
      for (const fs::path& mount : {root, root / "unified"}) {
        if (fs::exists(mount / "cgroup.controllers", ec)) {
          v2 = CgroupPlace{2, mount, path};
          break;
        }
      }
      continue;
    }
    std::stringstream list(controllers);
    std::string c;
    while (std::getline(list, c, ',')) {
      if (c == "memory" && fs::is_directory(root / "memory", ec)) return CgroupPlace{1, root / "memory", path};
    }
  }
  return v2;
}

}  // namespace

std::string SystemFiles::cgroup_root() const {
  if (!cgroup.empty()) return cgroup;
  if (const char* dir = std::getenv("DUET_CGROUP_DIR"); dir != nullptr && *dir != '\0') return dir;
  return "/sys/fs/cgroup";
}

int64_t CgroupMemory::headroom_bytes() const {
  return std::clamp<int64_t>(limit_bytes - usage_bytes + file_bytes, 0, limit_bytes);
}

std::optional<CgroupMemory> cgroup_memory(const SystemFiles& files) {
  const std::optional<CgroupPlace> place = find_cgroup(files);
  if (!place) return std::nullopt;
  std::error_code ec;
  fs::path dir = place->mount / place->path;
  // A container without its own cgroup namespace lists a path the mount does not have: the
  // mount's root is its cgroup.
  if (place->path.empty() || !fs::is_directory(dir, ec)) dir = place->mount;
  std::optional<CgroupMemory> tightest;
  for (fs::path level = dir;; level = level.parent_path()) {
    const CgroupMemory m = read_level(level, place->version);
    if (m.limit_bytes < kNoLimit && (!tightest || m.headroom_bytes() < tightest->headroom_bytes())) tightest = m;
    if (level == place->mount || !level.has_relative_path() || level.parent_path() == level) break;
  }
  return tightest;
}

int64_t available_memory_bytes(const SystemFiles& files) {
  const int64_t host = kib_field(files.proc + "/meminfo", "MemAvailable");
  const std::optional<CgroupMemory> cg = cgroup_memory(files);
  if (!cg) return host;
  return host > 0 ? std::min(host, cg->headroom_bytes()) : cg->headroom_bytes();
}

int64_t total_memory_bytes(const SystemFiles& files) {
  const int64_t host = kib_field(files.proc + "/meminfo", "MemTotal");
  const std::optional<CgroupMemory> cg = cgroup_memory(files);
  if (!cg) return host;
  return host > 0 ? std::min(host, cg->limit_bytes) : cg->limit_bytes;
}

ProcessMemory process_memory(const SystemFiles& files) {
  const std::string status = files.proc + "/self/status";
  ProcessMemory m;
  m.resident_bytes = kib_field(status, "VmRSS");
  m.anonymous_bytes = kib_field(status, "RssAnon");
  m.file_bytes = kib_field(status, "RssFile");
  return m;
}

}  // namespace duet
