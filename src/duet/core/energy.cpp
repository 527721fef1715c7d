#include "duet/core/energy.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

namespace duet {
namespace {

std::optional<uint64_t> read_u64(const std::string& path) {
  std::ifstream in(path);
  uint64_t v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

}  // namespace

std::string EnergyMeter::default_root() {
  if (const char* dir = std::getenv("DUET_POWERCAP_DIR"); dir != nullptr && *dir != '\0') return dir;
  return "/sys/class/powercap";
}

EnergyMeter::EnergyMeter(std::string root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> dirs;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (const fs::path& dir : dirs) {
    const std::string name = dir.filename().string();
    // intel-rapl:0 is a package; intel-rapl:0:0 (core, uncore, dram) is a part of one.
    if (name.rfind("intel-rapl:", 0) != 0 || name.find(':', 11) != std::string::npos) continue;
    if (read_line((dir / "name").string()).rfind("package", 0) != 0) continue;
    Zone z;
    z.device = "cpu";
    z.energy_path = (dir / "energy_uj").string();
    const std::optional<uint64_t> now = read_u64(z.energy_path);  // unreadable (root only): skipped
    const std::optional<uint64_t> range = read_u64((dir / "max_energy_range_uj").string());
    if (!now || !range || *range == 0) continue;
    z.last_uj = *now;
    z.max_range_uj = *range;
    zones_.push_back(std::move(z));
  }
}

std::vector<std::pair<std::string, double>> EnergyMeter::joules() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, double>> out;
  for (Zone& z : zones_) {
    if (const std::optional<uint64_t> now = read_u64(z.energy_path)) {
      // The counter runs from 0 to max_energy_range_uj and starts again.
      const uint64_t delta = *now >= z.last_uj ? *now - z.last_uj : z.max_range_uj - z.last_uj + *now;
      z.joules += static_cast<double>(delta) * 1e-6;
      z.last_uj = *now;
    }
    if (out.empty() || out.back().first != z.device) out.emplace_back(z.device, 0.0);
    out.back().second += z.joules;
  }
  return out;
}

}  // namespace duet
