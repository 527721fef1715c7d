#include "duet/backend/devices.h"

#include <algorithm>
#include <charconv>

#include "duet/backend/cuda_device.h"
#include "duet/core/error.h"
#include "duet/core/numa.h"
#include "duet/core/sysinfo.h"

namespace duet {
namespace {

constexpr const char* kForms = "cpu, cpu:N (a NUMA node), cpu[0-3,8] (cores), guarded:N or cuda:N";

int parse_index(std::string_view full, std::string_view digits) {
  int v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || v < 0) {
    fail(ErrorCode::kInvalidArgument, "device '{}' does not parse: '{}' is not a device number (expected {})", full,
         digits, kForms);
  }
  return v;
}

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

const NumaTopology& topology() {
  static const NumaTopology topo = numa_topology();
  return topo;
}

}  // namespace

DeviceName parse_device_name(std::string_view name) {
  DeviceName d;
  if (name == "cpu") {
    d.text = "cpu";
    return d;
  }
  const auto with_index = [&](std::string_view prefix, DeviceName::Kind kind) {
    d.kind = kind;
    d.index = parse_index(name, name.substr(prefix.size()));
    d.text = std::string(prefix) + std::to_string(d.index);
    return d;
  };
  if (name.rfind("cpu:", 0) == 0) return with_index("cpu:", DeviceName::Kind::kNumaNode);
  if (name.rfind("guarded:", 0) == 0) return with_index("guarded:", DeviceName::Kind::kGuarded);
  if (name.rfind("cuda:", 0) == 0) return with_index("cuda:", DeviceName::Kind::kCuda);
  if (name.rfind("cpu[", 0) == 0 && name.back() == ']') {
    d.kind = DeviceName::Kind::kCores;
    try {
      d.cpus = parse_cpu_list(name.substr(4, name.size() - 5));
    } catch (const Error& e) {
      fail(ErrorCode::kInvalidArgument, "device '{}' does not parse: {}", name, e.what());
    }
    std::sort(d.cpus.begin(), d.cpus.end());
    d.cpus.erase(std::unique(d.cpus.begin(), d.cpus.end()), d.cpus.end());
    if (d.cpus.empty()) fail(ErrorCode::kInvalidArgument, "device '{}' names no cores", name);
    d.text = "cpu[" + join_ints(d.cpus) + "]";
    return d;
  }
  if (name == "cuda") fail(ErrorCode::kInvalidArgument, "device 'cuda' needs a number: cuda:0, cuda:1, ...");
  fail(ErrorCode::kInvalidArgument, "device '{}' is not known (expected {})", name, kForms);
}

MachineDevices machine_devices() {
  MachineDevices m;
  m.backends["cpu"] = true;
  m.backends["cuda"] = cuda_backend_built();
  DeviceRegistry registry;
  m.devices.push_back(registry.describe("cpu"));
  const NumaTopology& topo = topology();
  for (int node : topo.nodes) m.devices.push_back(registry.describe("cpu:" + std::to_string(node)));
  if (cuda_backend_built()) {
    const CudaDeviceCount gpus = probe_cuda_devices();
    m.cuda_error = gpus.error;
    for (int i = 0; i < gpus.count; ++i) m.devices.push_back(describe_cuda_device(i));
  }
  return m;
}

DeviceName DeviceRegistry::check(std::string_view name) const {
  DeviceName d = parse_device_name(name);
  const NumaTopology& topo = topology();
  switch (d.kind) {
    case DeviceName::Kind::kCpu:
    case DeviceName::Kind::kGuarded: break;
    case DeviceName::Kind::kNumaNode:
      if (std::find(topo.nodes.begin(), topo.nodes.end(), d.index) == topo.nodes.end()) {
        std::string nodes;
        for (int n : topo.nodes) nodes += (nodes.empty() ? "cpu:" : ", cpu:") + std::to_string(n);
        fail(ErrorCode::kInvalidArgument, "device '{}': this machine has no NUMA node {} with cores this process may use "
             "(it has {})", d.text, d.index, nodes);
      }
      break;
    case DeviceName::Kind::kCores: {
      std::vector<int> allowed;
      for (const std::vector<int>& cpus : topo.node_cpus) allowed.insert(allowed.end(), cpus.begin(), cpus.end());
      for (int c : d.cpus) {
        if (std::find(allowed.begin(), allowed.end(), c) == allowed.end()) {
          std::sort(allowed.begin(), allowed.end());
          fail(ErrorCode::kInvalidArgument, "device '{}': core {} is not one this process may run on (cores {})", d.text,
               c, join_ints(allowed));
        }
      }
      break;
    }
    case DeviceName::Kind::kCuda: {
      if (!cuda_backend_built()) {
        fail(ErrorCode::kInvalidArgument,
             "device '{}': this build has no CUDA backend (`duet devices` lists what it has)", d.text);
      }
      const CudaDeviceCount gpus = probe_cuda_devices();
      if (gpus.count == 0) {
        fail(ErrorCode::kInvalidArgument, "device '{}': the CUDA runtime finds no GPU: {}", d.text, gpus.error);
      }
      if (d.index >= gpus.count) {
        fail(ErrorCode::kInvalidArgument, "device '{}': this machine has {} GPU{} (cuda:0 to cuda:{})", d.text,
             gpus.count, gpus.count == 1 ? "" : "s", gpus.count - 1);
      }
      break;
    }
  }
  return d;
}

DeviceInfo DeviceRegistry::describe(std::string_view name) const {
  const DeviceName d = check(name);
  for (const auto& dev : made_) {
    if (dev->name() == d.text) return dev->info();
  }
  const NumaTopology& topo = topology();
  DeviceInfo info;
  info.name = d.text;
  switch (d.kind) {
    case DeviceName::Kind::kCpu:
      info.kind = "cpu";
      for (const std::vector<int>& cpus : topo.node_cpus) info.cpus.insert(info.cpus.end(), cpus.begin(), cpus.end());
      std::sort(info.cpus.begin(), info.cpus.end());
      info.threads = options_.threads > 0 ? options_.threads : static_cast<int>(info.cpus.size());
      info.memory_bytes = total_memory_bytes();
      info.free_bytes = available_memory_bytes();
      break;
    case DeviceName::Kind::kNumaNode:
      for (size_t i = 0; i < topo.nodes.size(); ++i) {
        if (topo.nodes[i] != d.index) continue;
        info.kind = "numa";
        info.node = d.index;
        info.cpus = topo.node_cpus[i];
        info.threads = static_cast<int>(info.cpus.size());
        // A machine without node memory figures (no /sys/devices/system/node) is one node.
        info.memory_bytes = topo.node_memory_bytes[i] > 0 ? topo.node_memory_bytes[i] : total_memory_bytes();
        info.free_bytes = topo.node_memory_bytes[i] > 0 ? topo.node_free_bytes[i] : available_memory_bytes();
      }
      break;
    case DeviceName::Kind::kCores:
      info.kind = "cores";
      info.cpus = d.cpus;
      info.threads = static_cast<int>(d.cpus.size());
      info.memory_bytes = total_memory_bytes();
      info.free_bytes = available_memory_bytes();
      break;
    case DeviceName::Kind::kGuarded:
      info.kind = "guarded";
      info.threads = 1;
      info.memory_bytes = int64_t{16} << 30;
      info.free_bytes = info.memory_bytes;
      break;
    case DeviceName::Kind::kCuda: return describe_cuda_device(d.index);
  }
  return info;
}

std::shared_ptr<Device> DeviceRegistry::get(std::string_view name) {
  const DeviceName d = check(name);
  for (const auto& dev : made_) {
    if (dev->name() == d.text) return dev;
  }
  std::shared_ptr<Device> dev;
  switch (d.kind) {
    case DeviceName::Kind::kCpu: dev = make_cpu_device(options_.threads, options_.mode); break;
    case DeviceName::Kind::kNumaNode: {
      const DeviceInfo info = describe(d.text);
      dev = make_cpu_device(d.text, "numa", info.cpus, MemoryPlacement{MemoryPlacement::Kind::kNode, d.index},
                            /*copy_weights=*/true, options_.mode);
      break;
    }
    case DeviceName::Kind::kCores:
      dev = make_cpu_device(d.text, "cores", d.cpus, MemoryPlacement{}, /*copy_weights=*/false, options_.mode);
      break;
    case DeviceName::Kind::kGuarded: dev = make_guarded_device(d.text, options_.mode); break;
    case DeviceName::Kind::kCuda: dev = make_cuda_device(d.index, options_.mode); break;
  }
  made_.push_back(dev);
  return dev;
}

}  // namespace duet
