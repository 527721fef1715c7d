// `duet devices [--json]`: the devices this machine has (the whole CPU, each NUMA node with its
// cores and memory, GPUs with their memory) and the backends this build was compiled with.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/backend/devices.h"
#include "duet/cli/commands.h"
#include "duet/cli/units.h"

namespace duet::cli {
namespace {

// "0-3,8" for a sorted core list.
std::string core_ranges(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + (i == j ? std::to_string(cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]));
    i = j + 1;
  }
  return out;
}

int run_devices(bool json) {
  const MachineDevices m = machine_devices();
  if (json) {
    nlohmann::ordered_json out;
    out["backends"] = nlohmann::ordered_json::object();
    for (const auto& [name, built] : m.backends) out["backends"][name] = built;
    out["devices"] = nlohmann::ordered_json::array();
    for (const DeviceInfo& d : m.devices) {
      nlohmann::ordered_json j = {{"name", d.name},         {"kind", d.kind},   {"memory_bytes", d.memory_bytes},
                                  {"free_bytes", d.free_bytes}, {"cpus", d.cpus}, {"threads", d.threads}};
      if (d.node >= 0) j["node"] = d.node;
      out["devices"].push_back(j);
    }
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  std::string backends;
  for (const auto& [name, built] : m.backends) backends += fmt::format("{}{} ({})", backends.empty() ? "" : ", ", name, built ? "built" : "not built");
  fmt::print("backends: {}\n", backends);
  if (!m.cuda_error.empty()) fmt::print("cuda: no GPU: {}\n", m.cuda_error);
  fmt::print("devices:\n");
  for (const DeviceInfo& d : m.devices) {
    if (d.cpus.empty()) {  // a GPU
      fmt::print("  {:<8} {:<6} {} memory, {} available\n", d.name, d.kind,
                 human_bytes(static_cast<double>(d.memory_bytes)), human_bytes(static_cast<double>(d.free_bytes)));
      continue;
    }
    fmt::print("  {:<8} {:<6} {} core{} ({}), {} memory, {} available\n", d.name, d.kind, d.cpus.size(),
               d.cpus.size() == 1 ? "" : "s", core_ranges(d.cpus), human_bytes(static_cast<double>(d.memory_bytes)),
               human_bytes(static_cast<double>(d.free_bytes)));
  }
  fmt::print("also: cpu[LIST] for any set of those cores (cpu[0-3,8]); guarded:N, a test device\n");
  return 0;
}

}  // namespace

void add_devices_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("devices", "List this machine's devices (CPU, NUMA nodes, GPUs) and this build's backends");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print JSON: {\"backends\": {...}, \"devices\": [...]}");
  cmd->callback([json, &exit_code] { exit_code = run_devices(*json); });
}

}  // namespace duet::cli
