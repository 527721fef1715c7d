#include "duet/core/sysinfo.h"

#include <fstream>
#include <sstream>
#include <string>

namespace duet {

namespace {

// A "Key:   123 kB" line of /proc/meminfo, in bytes; 0 when absent.
int64_t meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      std::istringstream fields(line.substr(key.size()));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

}  // namespace

int64_t available_memory_bytes() { return meminfo_bytes("MemAvailable:"); }

int64_t total_memory_bytes() { return meminfo_bytes("MemTotal:"); }

}  // namespace duet
