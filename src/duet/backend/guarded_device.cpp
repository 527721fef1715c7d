// The guarded test device: a CPU device whose memory lies in one region that stays mapped
// PROT_NONE except while the device itself works on it (its ops, its copies, loading its
// weights). Host code that reads or writes one of its buffers outside those crashes at once, so
// a test run on it proves a path keeps the device discipline.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "duet/backend/device.h"
#include "duet/core/error.h"

namespace duet {
namespace {

constexpr size_t kRegionBytes = size_t{16} << 30;  // address space only (MAP_NORESERVE)
constexpr size_t kAlign = 64;

class GuardedDevice;

// Opens the region while an op runs, and refuses an op while another caller's runs (whoever runs
// work on a device holds it: Device::hold).
class GuardedBackend final : public ForwardingBackend {
 public:
  GuardedBackend(Backend& inner, GuardedDevice& device) : ForwardingBackend(inner), device_(device) {}
  std::string name() const override { return "guarded " + ForwardingBackend::name(); }

 protected:
  void enter() override;
  void leave() override;

 private:
  GuardedDevice& device_;
  std::atomic<int> in_op_{0};
};

class GuardedDevice final : public Device {
 public:
  GuardedDevice(std::string name, MatmulMode mode)
      : Device(std::move(name)), inner_(make_cpu_backend(1, mode)), backend_(*inner_, *this) {
    void* p = ::mmap(nullptr, kRegionBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fail(ErrorCode::kResourceExhausted, "{}: cannot reserve its region: {}", this->name(), std::strerror(errno));
    }
    base_ = static_cast<unsigned char*>(p);
    free_[0] = kRegionBytes;
  }
  ~GuardedDevice() override { ::munmap(base_, kRegionBytes); }

  DeviceInfo info() const override {
    DeviceInfo d;
    d.name = name();
    d.kind = "guarded";
    d.memory_bytes = static_cast<int64_t>(kRegionBytes);
    d.free_bytes = static_cast<int64_t>(kRegionBytes) - memory_used(MemoryKind::kWeights) -
                   memory_used(MemoryKind::kKv) - memory_used(MemoryKind::kScratch);
    d.threads = 1;
    return d;
  }
  Backend& backend() override { return backend_; }
  bool host_accessible() const override { return false; }

  DeviceBuffer allocate(size_t bytes, MemoryKind kind) override {
    const size_t size = std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      const size_t offset = it->first, left = it->second - size;
      free_.erase(it);
      if (left > 0) free_[offset + size] = left;
      high_ = std::max(high_, offset + size);
      if (open_ > 0) protect(PROT_READ | PROT_WRITE);
      return DeviceBuffer(this, base_ + offset, bytes, kind, std::make_unique<Allocation>(*this, offset, size));
    }
    fail(ErrorCode::kResourceExhausted, "{}: no room for {} bytes in its {} byte region", name(), bytes, kRegionBytes);
  }

  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    const Open open(*this);
    std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    const Open open(*this);
    std::memcpy(dst, src, bytes);
  }

  // Every tensor copied into the region (the views repointed), then prepared by the backend.
  std::unique_ptr<LoadedWeights> load_weights(std::span<const WeightRef> tensors) override {
    auto loaded = std::make_unique<Loaded>();
    loaded->copies = copy_weights_in(tensors, kAlign);
    std::vector<WeightView> matmuls;
    for (const WeightRef& r : tensors) {
      if (r.matmul) matmuls.push_back(*r.view);
    }
    loaded->prepared = backend_.prepare_weights(matmuls);
    return loaded;
  }

  // Nested opens (an op inside a copy) keep the region open until the outermost closes.
  void open() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (open_++ == 0) protect(PROT_READ | PROT_WRITE);
  }
  void close() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (--open_ == 0) protect(PROT_NONE);
  }

 private:
  struct Loaded final : LoadedWeights {
    DeviceBuffer copies;
    std::unique_ptr<PreparedWeights> prepared;
  };
  class Allocation final : public DeviceBuffer::Owner {
   public:
    Allocation(GuardedDevice& d, size_t offset, size_t size) : d_(d), offset_(offset), size_(size) {}
    ~Allocation() override { d_.release(offset_, size_); }

   private:
    GuardedDevice& d_;
    size_t offset_, size_;
  };
  class Open {
   public:
    explicit Open(GuardedDevice& d) : d_(d) { d_.open(); }
    ~Open() { d_.close(); }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    GuardedDevice& d_;
  };

  void release(size_t offset, size_t size) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto [it, inserted] = free_.emplace(offset, size);
    // Merge with the free neighbours.
    if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }
  // The used part of the region (whole pages up to the high-water mark); mutex_ held.
  void protect(int prot) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t bytes = (high_ + page - 1) / page * page;
    if (bytes > 0 && ::mprotect(base_, bytes, prot) != 0) {
      fail(ErrorCode::kInternal, "{}: mprotect failed: {}", name(), std::strerror(errno));
    }
  }

  std::unique_ptr<Backend> inner_;
  GuardedBackend backend_;
  unsigned char* base_ = nullptr;
  std::mutex mutex_;
  std::map<size_t, size_t> free_;  // offset -> size
  size_t high_ = 0;
  int open_ = 0;
};

void GuardedBackend::enter() {
  if (in_op_.fetch_add(1) != 0) {
    in_op_.fetch_sub(1);
    fail(ErrorCode::kInternal, "{}: an op began while another caller's op ran (work on a device holds it)",
         device_.name());
  }
  device_.open();
}
void GuardedBackend::leave() {
  device_.close();
  in_op_.fetch_sub(1);
}

}  // namespace

std::shared_ptr<Device> make_guarded_device(std::string name, MatmulMode mode) {
  return std::make_shared<GuardedDevice>(std::move(name), mode);
}

}  // namespace duet
