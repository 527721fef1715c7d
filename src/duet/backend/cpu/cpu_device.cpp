// The CPU devices: `cpu` (the whole machine), `cpu:N` (a NUMA node) and `cpu[...]` (a core
// set), and a host device over a given backend. Their memory is host memory, so host code may
// read it, and copies between them are memcpy.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <thread>

#include "duet/backend/device.h"
#include "duet/core/error.h"
#include "duet/core/memory.h"
#include "duet/core/numa.h"
#include "duet/core/sysinfo.h"

namespace duet {
namespace {

class AnonymousOwner final : public DeviceBuffer::Owner {
 public:
  explicit AnonymousOwner(AnonymousMemory m) : memory(std::move(m)) {}
  AnonymousMemory memory;
};

// Tensors a host device keeps: its prepared copies, the copies it made, and the count of the
// mapped bytes it uses in place (of which file_bytes are read from a file's mapping).
class HostWeights final : public LoadedWeights {
 public:
  HostWeights(std::function<void(int64_t, int64_t)> count) : count_(std::move(count)) {}
  ~HostWeights() override { count_(-mapped_bytes, -file_bytes); }
  std::unique_ptr<PreparedWeights> prepared;
  DeviceBuffer copies;
  int64_t mapped_bytes = 0;
  int64_t file_bytes = 0;

 private:
  std::function<void(int64_t, int64_t)> count_;
};

class HostDevice final : public Device {
 public:
  HostDevice(std::string name, std::string kind, std::unique_ptr<Backend> owned, Backend* backend,
             std::vector<int> cpus, MemoryPlacement memory, bool copy_weights)
      : Device(std::move(name)),
        kind_(std::move(kind)),
        owned_(std::move(owned)),
        backend_(backend != nullptr ? backend : owned_.get()),
        cpus_(std::move(cpus)),
        memory_(memory),
        copy_weights_(copy_weights),
        topology_(numa_topology()) {}

  DeviceInfo info() const override {
    DeviceInfo d;
    d.name = name();
    d.kind = kind_;
    d.cpus = cpus_;
    d.threads = backend_->num_threads();
    d.node = memory_.kind == MemoryPlacement::Kind::kNode ? memory_.node : -1;
    // What is available (lowered to the cgroup's room, see sysinfo.h), less the model file's
    // pages this device reads in place: the page cache holds them, and counts them as free.
    const int64_t available = available_memory_bytes();
    if (d.node >= 0) {
      for (size_t i = 0; i < topology_.nodes.size(); ++i) {
        if (topology_.nodes[i] != d.node) continue;
        d.memory_bytes = topology_.node_memory_bytes[i];
        d.free_bytes = available > 0 ? std::min(topology_.node_free_bytes[i], available) : topology_.node_free_bytes[i];
      }
    } else {
      d.memory_bytes = total_memory_bytes();
      d.free_bytes = available;
    }
    d.free_bytes = std::max<int64_t>(0, d.free_bytes - file_bytes_.load());
    if (d.cpus.empty()) {
      for (const std::vector<int>& node : topology_.node_cpus) d.cpus.insert(d.cpus.end(), node.begin(), node.end());
      std::sort(d.cpus.begin(), d.cpus.end());
    }
    return d;
  }

  Backend& backend() override { return *backend_; }
  bool host_accessible() const override { return true; }

  DeviceBuffer allocate(size_t bytes, MemoryKind kind) override {
    // Huge pages requested for the KV cache: attention reads a sequence's rows block by block.
    AnonymousMemory m(std::max<size_t>(bytes, 1), /*huge_pages=*/kind == MemoryKind::kKv);
    place_memory(m.data(), m.size(), memory_, topology_);
    void* data = m.data();
    return DeviceBuffer(this, data, bytes, kind, std::make_unique<AnonymousOwner>(std::move(m)));
  }

  void copy_from_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

  std::unique_ptr<LoadedWeights> load_weights(std::span<const WeightRef> tensors) override {
    auto loaded = std::make_unique<HostWeights>([this](int64_t mapped, int64_t file) {
      count_memory(MemoryKind::kWeights, mapped);
      file_bytes_ += file;
    });
    // Each distinct tensor once (a tied head is the embedding), and whether any use needs its
    // bytes here rather than only a packed copy.
    std::map<const void*, std::pair<size_t, bool>> sources;
    for (const WeightRef& r : tensors) {
      auto& [bytes, copy] = sources[r.view->data];
      bytes = static_cast<size_t>(r.view->rows) * r.view->row_bytes();
      copy = copy || !(r.matmul && backend_->packs(*r.view));
    }
    std::map<const void*, void*> moved;
    if (copy_weights_) {
      size_t total = 0;
      for (const auto& [src, info] : sources) {
        if (info.second) total += (info.first + 63) / 64 * 64;
      }
      if (total > 0) {
        loaded->copies = allocate(total, MemoryKind::kWeights);
        auto* dst = loaded->copies.as<unsigned char>();
        for (const auto& [src, info] : sources) {
          if (!info.second) continue;
          std::memcpy(dst, src, info.first);
          release_pages(src, info.first);
          moved[src] = dst;
          dst += (info.first + 63) / 64 * 64;
        }
      }
    }
    for (const WeightRef& r : tensors) {
      const auto it = moved.find(r.view->data);
      if (it != moved.end()) r.view->data = it->second;
    }
    // Those read in place from a file's mapping will sit in the page cache, which the free memory
    // the host reports counts as free (see info()).
    std::vector<std::pair<const void*, size_t>> in_place;
    for (const auto& [src, info] : sources) {
      if (moved.count(src) != 0) continue;
      loaded->mapped_bytes += static_cast<int64_t>(info.first);
      if (info.second) in_place.emplace_back(src, info.first);
    }
    loaded->file_bytes = static_cast<int64_t>(file_backed_bytes(in_place));
    count_memory(MemoryKind::kWeights, loaded->mapped_bytes);
    file_bytes_ += loaded->file_bytes;
    std::vector<WeightView> matmuls;
    for (const WeightRef& r : tensors) {
      if (r.matmul) matmuls.push_back(*r.view);
    }
    loaded->prepared = backend_->prepare_weights(matmuls);
    return loaded;
  }

 protected:
  void on_queue_start() override {
    if (!cpus_.empty()) pin_current_thread(cpus_.front());
  }

 private:
  std::string kind_;
  std::unique_ptr<Backend> owned_;
  Backend* backend_;
  std::vector<int> cpus_;
  MemoryPlacement memory_;
  bool copy_weights_;
  NumaTopology topology_;
  std::atomic<int64_t> file_bytes_{0};  // weights read in place from files' mappings
};

}  // namespace

std::shared_ptr<Device> make_cpu_device(int threads, MatmulMode mode) {
  const NumaTopology topo = numa_topology();
  return std::make_shared<HostDevice>("cpu", "cpu", make_cpu_backend(threads, mode), nullptr, std::vector<int>{},
                                      memory_placement_for(numa_mode(), topo), false);
}

std::shared_ptr<Device> make_cpu_device(std::string name, std::string kind, std::vector<int> cpus,
                                        MemoryPlacement memory, bool copy_weights, MatmulMode mode) {
  if (cpus.empty()) fail(ErrorCode::kInvalidArgument, "device '{}' has no cores", name);
  CpuBackendOptions o;
  o.cpus = cpus;
  o.memory = memory;
  o.mode = mode;
  return std::make_shared<HostDevice>(std::move(name), std::move(kind), make_cpu_backend(o), nullptr, std::move(cpus),
                                      memory, copy_weights);
}

std::shared_ptr<Device> make_host_device(Backend& backend) {
  return std::make_shared<HostDevice>("cpu", "cpu", nullptr, &backend, std::vector<int>{}, MemoryPlacement{}, false);
}

}  // namespace duet
