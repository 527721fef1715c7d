// Device names, the devices this machine has, and the registry that makes each device once.
//   cpu          the whole machine (--threads, --numa as for a single device)
//   cpu:N        NUMA node N: its cores in a pinned pool, its memory bound to the node
//   cpu[0-3,8]   those cores, one pinned thread each
//   guarded:N    the guarded test device (backend/device.h)
//   cuda:N       GPU N (when this build has the CUDA backend)
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "duet/backend/device.h"

namespace duet {

struct DeviceName {
  enum class Kind { kCpu, kNumaNode, kCores, kGuarded, kCuda };
  Kind kind = Kind::kCpu;
  int index = -1;         // cpu:N, guarded:N, cuda:N
  std::vector<int> cpus;  // cpu[...]
  std::string text;       // the canonical spelling
};

// Parses a device name; throws kInvalidArgument naming it and the forms accepted.
DeviceName parse_device_name(std::string_view name);

// What this machine has and this build can run, for `duet devices`.
struct MachineDevices {
  std::map<std::string, bool> backends;  // cpu, cuda: compiled into this build
  std::vector<DeviceInfo> devices;       // cpu, then each NUMA node (cpu:N), then GPUs
  std::string cuda_error;                // why no GPU is listed, when the CUDA backend is built
};
MachineDevices machine_devices();

// Makes devices by name, each once, checked against this machine.
class DeviceRegistry {
 public:
  struct Options {
    int threads = 0;  // threads of `cpu` (<= 0: all)
    MatmulMode mode = default_matmul_mode();
  };
  DeviceRegistry() : DeviceRegistry(Options{}) {}
  explicit DeviceRegistry(Options options) : options_(options) {}

  // Throws kInvalidArgument for a name that does not parse or a device this machine (or build)
  // lacks, naming it and what there is; does not make the device.
  DeviceName check(std::string_view name) const;
  // The device of that name, made on first use.
  std::shared_ptr<Device> get(std::string_view name);
  // What `name` would offer (memory, cores) without making it.
  DeviceInfo describe(std::string_view name) const;
  // Every device made so far, in order.
  const std::vector<std::shared_ptr<Device>>& made() const { return made_; }
  const Options& options() const { return options_; }

 private:
  Options options_;
  std::vector<std::shared_ptr<Device>> made_;
};

}  // namespace duet
