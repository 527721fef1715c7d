#include "duet/backend/device.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "duet/backend/fault.h"
#include "duet/core/error.h"

namespace duet {

std::string_view memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kWeights: return "weights";
    case MemoryKind::kKv: return "kv";
    case MemoryKind::kScratch: return "scratch";
  }
  return "?";
}

DeviceBuffer::DeviceBuffer(Device* device, void* data, size_t size, MemoryKind kind, std::unique_ptr<Owner> owner)
    : device_(device), data_(data), size_(size), kind_(kind), owner_(std::move(owner)) {
  if (device_ != nullptr) device_->count_memory(kind_, static_cast<int64_t>(size_));
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      kind_(other.kind_),
      owner_(std::move(other.owner_)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    kind_ = other.kind_;
    owner_ = std::move(other.owner_);
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (device_ != nullptr) device_->count_memory(kind_, -static_cast<int64_t>(size_));
  owner_.reset();
  device_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

Device::Device(std::string name) : name_(std::move(name)) {}

Device::~Device() {
  mark_failed("the device was shut down");  // an injected hang returns
  {
    const std::lock_guard<std::mutex> lock(queue_mutex_);
    stop_ = true;
  }
  queue_wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Device::copy_from_device(Device& from, void* dst, const void* src, size_t bytes) {
  if (host_accessible() && from.host_accessible()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // Through the host: the source device's copy out, this device's copy in.
  std::vector<unsigned char> staging(bytes);
  from.copy_to_host(staging.data(), src, bytes);
  copy_from_host(dst, staging.data(), bytes);
}

void Device::submit(std::function<void()> work) {
  {
    const std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push_back(std::move(work));
    if (!thread_.joinable()) thread_ = std::thread([this] { run_queue(); });
  }
  queue_wake_.notify_one();
}

void Device::run_queue() {
  on_queue_start();
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

namespace {
constexpr std::chrono::seconds kUtilizationWindow{10};
}  // namespace

void Device::record_busy(Clock::time_point start, Clock::time_point end) {
  const std::lock_guard<std::mutex> lock(busy_mutex_);
  busy_total_ += std::chrono::duration<double>(end - start).count();
  busy_.emplace_back(start, end);
  while (!busy_.empty() && busy_.front().second < end - kUtilizationWindow) busy_.pop_front();
}

void Device::record_copy(double seconds, int64_t bytes) {
  copy_ns_ += static_cast<int64_t>(seconds * 1e9);
  copy_bytes_ += bytes;
}

double Device::busy_seconds_total() const {
  const std::lock_guard<std::mutex> lock(busy_mutex_);
  return busy_total_;
}

double Device::utilization() const {
  const Clock::time_point now = Clock::now();
  const Clock::time_point from = std::max(now - std::chrono::duration_cast<Clock::duration>(kUtilizationWindow), created_);
  const double wall = std::chrono::duration<double>(now - from).count();
  if (wall <= 0.0) return 0.0;
  double busy = 0.0;
  const std::lock_guard<std::mutex> lock(busy_mutex_);
  for (const auto& [start, end] : busy_) {
    const auto a = std::max(start, from), b = std::min(end, now);
    if (b > a) busy += std::chrono::duration<double>(b - a).count();
  }
  return std::min(1.0, busy / wall);
}

void Device::begin_work() {
  heartbeat();
  if (failed()) throw DeviceFailure(name_, failure());
  FaultMode mode;
  if (!take_fault(name_, mode)) return;
  switch (mode) {
    case FaultMode::kFail:
      mark_failed("injected fault (mode=fail)");
      throw DeviceFailure(name_, failure());
    case FaultMode::kOom:
      fail(ErrorCode::kResourceExhausted, "{}: out of memory (injected fault, mode=oom)", name_);
    case FaultMode::kHang: {
      // Stops here, making no progress, until someone declares the device failed.
      std::unique_lock<std::mutex> lock(health_mutex_);
      health_changed_.wait(lock, [&] { return failed_.load(); });
      throw DeviceFailure(name_, failure_);
    }
  }
}

void Device::mark_failed(const std::string& reason) {
  {
    const std::lock_guard<std::mutex> lock(health_mutex_);
    if (failed_.load()) return;
    failure_ = reason;
    failed_.store(true);
  }
  health_changed_.notify_all();
}

std::string Device::failure() const {
  const std::lock_guard<std::mutex> lock(health_mutex_);
  return failure_;
}

DeviceBuffer Device::copy_weights_in(std::span<const WeightRef> tensors, size_t align) {
  std::map<const void*, size_t> sizes;
  for (const WeightRef& r : tensors) {
    if (r.view->data == nullptr) continue;
    size_t& bytes = sizes[r.view->data];
    bytes = std::max(bytes, static_cast<size_t>(r.view->rows) * r.view->row_bytes());
  }
  const auto aligned = [&](size_t bytes) { return (bytes + align - 1) / align * align; };
  size_t total = 0;
  for (const auto& [src, bytes] : sizes) total += aligned(bytes);
  if (total == 0) return DeviceBuffer();
  DeviceBuffer copies = allocate(total, MemoryKind::kWeights);
  std::map<const void*, void*> moved;
  auto* dst = copies.as<unsigned char>();
  for (const auto& [src, bytes] : sizes) {
    copy_from_host(dst, src, bytes);
    moved[src] = dst;
    dst += aligned(bytes);
  }
  for (const WeightRef& r : tensors) {
    if (r.view->data != nullptr) r.view->data = moved.at(r.view->data);
  }
  return copies;
}

void Device::start_probe() {
  {
    const std::lock_guard<std::mutex> lock(health_mutex_);
    if (probe_.outstanding) return;
    probe_.outstanding = true;
    probe_.started = Clock::now();
  }
  submit([this] {
    std::string error;
    try {
      if (failed()) throw DeviceFailure(name_, failure());
      const std::unique_lock<std::mutex> held = hold();
      // A pattern through the device's memory and back.
      unsigned char pattern[64], back[64] = {};
      for (size_t i = 0; i < sizeof(pattern); ++i) pattern[i] = static_cast<unsigned char>(i * 37 + 11);
      DeviceBuffer buf = allocate(sizeof(pattern), MemoryKind::kScratch);
      copy_from_host(buf.data(), pattern, sizeof(pattern));
      copy_to_host(back, buf.data(), sizeof(back));
      if (std::memcmp(pattern, back, sizeof(pattern)) != 0) error = "the probe read back other bytes than it wrote";
    } catch (const std::exception& e) {
      error = e.what();
    }
    heartbeat();
    const std::lock_guard<std::mutex> lock(health_mutex_);
    probe_.outstanding = false;
    probe_.finished = Clock::now();
    ++probe_.probes;
    probe_.last_failed = !error.empty();
    if (!error.empty()) {
      ++probe_.failures;
      probe_.last_error = error;
    }
  });
}

Device::ProbeState Device::probe_state() const {
  const std::lock_guard<std::mutex> lock(health_mutex_);
  return probe_;
}

}  // namespace duet
