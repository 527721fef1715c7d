// Energy counters of the machine's devices, where the machine exposes them: RAPL package domains
// under /sys/class/powercap on x86 (Intel, and AMD Zen through the same driver) for the CPU. NVML
// for GPUs comes with the CUDA backend (not built yet). A machine without counters has none, and
// callers show nothing rather than zero.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace duet {

class EnergyMeter {
 public:
  // Reads `root` (by default $DUET_POWERCAP_DIR, else /sys/class/powercap): every top-level
  // intel-rapl:N zone whose name starts with "package" and whose energy_uj this process can read
  // counts for device "cpu".
  explicit EnergyMeter(std::string root = default_root());

  static std::string default_root();

  bool available() const { return !zones_.empty(); }

  // Joules each device used since this meter was made, in device order ("cpu"). Each counter
  // wraps at its max_energy_range_uj; a wrap between two calls is counted, so call this more
  // often than a counter can wrap (minutes at full power; a Prometheus scrape is enough).
  std::vector<std::pair<std::string, double>> joules();

 private:
  struct Zone {
    std::string device;
    std::string energy_path;
    uint64_t max_range_uj = 0;
    uint64_t last_uj = 0;
    double joules = 0.0;
  };
  std::mutex mutex_;
  std::vector<Zone> zones_;
};

}  // namespace duet
