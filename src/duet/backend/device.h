// Devices: what a model runs on. A device owns memory (counted by kind), runs ops on it (its
// Backend), has a queue of work that runs while other devices run theirs, and moves data to and
// from the host and other devices only through its own copies. Buffers belong to one device; a
// device's ops take only its buffers. See docs/ARCHITECTURE.md, "Devices and the device map".
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "duet/backend/backend.h"

namespace duet {

enum class MemoryKind { kWeights = 0, kKv = 1, kScratch = 2 };
inline constexpr int kNumMemoryKinds = 3;
// "weights", "kv" or "scratch".
std::string_view memory_kind_name(MemoryKind kind);

class Device;

// Memory of one device, given back when destroyed. Host code reads or writes it directly only
// when the device is host_accessible(); otherwise through the device's ops and copies.
class DeviceBuffer {
 public:
  // What frees the memory (a device's own allocation); destroyed with the buffer.
  struct Owner {
    virtual ~Owner() = default;
  };

  DeviceBuffer() = default;
  DeviceBuffer(Device* device, void* data, size_t size, MemoryKind kind, std::unique_ptr<Owner> owner);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  Device* device() const { return device_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void reset();

  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
  MemoryKind kind_ = MemoryKind::kScratch;
  std::unique_ptr<Owner> owner_;
};

// What `duet devices` lists of a device.
struct DeviceInfo {
  std::string name;
  std::string kind;            // cpu (the whole machine), numa (a node), cores (a core set), guarded, cuda
  int64_t memory_bytes = 0;    // total memory it can use (0: unknown)
  int64_t free_bytes = 0;      // of which available now (0: unknown)
  std::vector<int> cpus;       // cores it runs on (CPU devices)
  int node = -1;               // NUMA node (cpu:N)
  int threads = 0;
};

// A model tensor as a device loads it: the device may point view->data at a copy in its memory.
// `matmul`: the tensor is multiplied by (the device may prepare it for that).
struct WeightRef {
  WeightView* view = nullptr;
  bool matmul = false;
};

// What a device keeps for the tensors it loaded; destroying it releases them.
class LoadedWeights {
 public:
  virtual ~LoadedWeights() = default;
};

// A step's ops captured once and replayed as one launch (a CUDA graph). The executor gives the
// device a step's ops as a function with a key for its shapes (batch-size bucket, context class);
// the device checks on every step that the ops would launch exactly what was captured (see
// backend/cuda/graph_plan.h) and otherwise runs them as plain launches. See docs/ARCHITECTURE.md,
// "CUDA backend".
class StepGraphs {
 public:
  struct Key {
    int64_t num_seqs = 0;
    int64_t context = 0;
  };
  enum class Ran { kPlain, kCaptured, kReplayed };
  struct Stats {
    int64_t plain = 0, captures = 0, replays = 0, mismatches = 0, capture_failures = 0;
  };
  virtual ~StepGraphs() = default;
  // Runs `ops` (the step's ops on this device, nothing else; it may be called more than once per
  // step, and a call may record the ops without launching them). Throws what `ops` throws.
  virtual Ran run(const Key& key, const std::function<void()>& ops) = 0;
  // Drops every graph.
  virtual void clear() = 0;
  virtual Stats stats() const = 0;
};

class Device {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Device(std::string name);
  virtual ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const std::string& name() const { return name_; }
  virtual DeviceInfo info() const = 0;
  // The ops, on this device's memory.
  virtual Backend& backend() = 0;
  // Whether host code may read and write this device's memory directly (the CPU devices).
  virtual bool host_accessible() const = 0;
  // The world rank whose process runs this device's parts, when that is another process (a
  // pipeline stage of another rank: nothing of it is allocated or loaded here); -1 for a device
  // of this process.
  virtual int remote_rank() const { return -1; }
  // `bytes` of this device's memory, counted under `kind`. Throws kResourceExhausted naming the
  // device and the size.
  virtual DeviceBuffer allocate(size_t bytes, MemoryKind kind) = 0;
  // Copies; each returns when the data is in place. dst (or src) is in this device's memory.
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  // dst in this device's memory, src in `from`'s.
  virtual void copy_from_device(Device& from, void* dst, const void* src, size_t bytes);
  // Loads the tensors of the model parts placed here (in place, prepared, or copied into this
  // device's memory, repointing the views); the handle keeps them.
  virtual std::unique_ptr<LoadedWeights> load_weights(std::span<const WeightRef> tensors) = 0;
  // Decode steps as graphs, when this device has them and they are on (CUDA: DUET_CUDA_GRAPHS,
  // default on); null otherwise.
  virtual StepGraphs* step_graphs() { return nullptr; }

  // Runs `work` on this device's own thread (started on first use), after the work submitted
  // before it. `work` must not throw.
  void submit(std::function<void()> work);

  int64_t memory_used(MemoryKind kind) const { return used_[static_cast<int>(kind)].load(); }
  // Time spent running work on this device: recorded by whoever runs it (the executor).
  void record_busy(Clock::time_point start, Clock::time_point end);
  double busy_seconds_total() const;
  // Copies into this device from other devices or the host during steps (part of the busy time).
  void record_copy(double seconds, int64_t bytes);
  double copy_seconds_total() const { return copy_ns_.load() * 1e-9; }
  int64_t copy_bytes_total() const { return copy_bytes_.load(); }
  // Busy time over wall time in the last 10 seconds (or since the device was made, if less).
  double utilization() const;

  // The device's ops run one caller at a time (a backend keeps scratch between its ops): whoever
  // runs a unit of work here (a segment, a probe, an MTP draft) holds this for it. Work of one
  // executor is ordered anyway; this keeps a replaced executor's last micro-batch (after a
  // failover) from running on the spare at the same time as the new one's, and two models on
  // one device from running at once.
  [[nodiscard]] std::unique_lock<std::mutex> hold() { return std::unique_lock<std::mutex>(use_mutex_); }

  // Health. Whoever runs work here calls begin_work() before each unit (a segment of one
  // micro-batch) and heartbeat() as it goes; begin_work throws DeviceFailure once the device
  // failed, and applies a fault injected for this device (backend/fault.h). A device is failed
  // when its work threw DeviceFailure or when whoever waits for it declares it failed (it made no
  // progress for too long); a failed device stays failed, and an injected hang then returns.
  void begin_work();
  void heartbeat() { last_progress_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed); }
  Clock::time_point last_progress() const { return Clock::time_point(Clock::duration(last_progress_ns_.load())); }
  void mark_failed(const std::string& reason);
  bool failed() const { return failed_.load(); }
  std::string failure() const;
  // A probe: a small round trip through this device's memory on its queue (after the work queued
  // before it). Returns at once; probe_state() tells when it is done and whether it passed.
  void start_probe();
  struct ProbeState {
    bool outstanding = false;               // started and not done yet
    Clock::time_point started, finished;    // of the last probe
    int64_t probes = 0, failures = 0;
    bool last_failed = false;
    std::string last_error;
  };
  ProbeState probe_state() const;

 protected:
  // Copies each distinct tensor of `tensors` (by its data; the largest view of it) into one
  // allocation of this device's weights memory, each at a multiple of `align`, through
  // copy_from_host, and points the views at the copies. Returns the allocation (empty: nothing
  // to copy).
  DeviceBuffer copy_weights_in(std::span<const WeightRef> tensors, size_t align);
  // Called on the queue's thread before its first work (a CPU device pins it to its first core).
  virtual void on_queue_start() {}
  void count_memory(MemoryKind kind, int64_t delta) { used_[static_cast<int>(kind)] += delta; }

 private:
  friend class DeviceBuffer;
  void run_queue();

  std::string name_;
  std::atomic<int64_t> used_[kNumMemoryKinds] = {};
  // The queue.
  std::mutex queue_mutex_;
  std::condition_variable queue_wake_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
  std::mutex use_mutex_;  // hold()
  // Busy intervals of the last 10 s, and the total.
  mutable std::mutex busy_mutex_;
  std::deque<std::pair<Clock::time_point, Clock::time_point>> busy_;
  double busy_total_ = 0.0;
  // Health.
  std::atomic<int64_t> last_progress_ns_{Clock::now().time_since_epoch().count()};
  std::atomic<bool> failed_{false};
  mutable std::mutex health_mutex_;
  std::condition_variable health_changed_;
  std::string failure_;
  ProbeState probe_;
  std::atomic<int64_t> copy_ns_{0};
  std::atomic<int64_t> copy_bytes_{0};
  Clock::time_point created_ = Clock::now();
};

// The CPU as a device: host memory, a CPU backend.
// `cpu`: the whole machine, `threads` threads (<= 0: all), pinned and placed as --numa says.
std::shared_ptr<Device> make_cpu_device(int threads, MatmulMode mode = default_matmul_mode());
// `cpu:N` or `cpu[...]`: one thread per core of `cpus`, each pinned; memory placed as `memory`
// says. With `copy_weights`, tensors the backend does not pack are copied into that memory (a
// NUMA node's device keeps its weights on its node).
std::shared_ptr<Device> make_cpu_device(std::string name, std::string kind, std::vector<int> cpus,
                                        MemoryPlacement memory, bool copy_weights,
                                        MatmulMode mode = default_matmul_mode());
// A host device over an existing backend (not owned: it must outlive the device), named `cpu`.
std::shared_ptr<Device> make_host_device(Backend& backend);
// `guarded:N`: a CPU device (one thread) whose memory is mapped inaccessible except inside its own
// ops, copies and weight loading, so host code that reads a device buffer crashes. For tests.
std::shared_ptr<Device> make_guarded_device(std::string name, MatmulMode mode = default_matmul_mode());

}  // namespace duet
