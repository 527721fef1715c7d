#include "duet/comm/shm_communicator.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "duet/core/error.h"

namespace duet {
namespace {

using Clock = std::chrono::steady_clock;

// Per rank, on cache lines of their own: the last operation it has written its part for, and
// the last one it has finished reading the others' parts of.
struct alignas(64) Counter {
  std::atomic<uint64_t> value{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory counters must be lock-free");

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(std::unique_ptr<Communicator> base, size_t max_bytes)
      : base_(std::move(base)), max_bytes_((max_bytes + 63) / 64 * 64) {
    set_timeout(base_->timeout());
    const int n = base_->size();
    header_bytes_ = static_cast<size_t>(2 * n) * sizeof(Counter);
    bytes_ = header_bytes_ + static_cast<size_t>(n) * max_bytes_;
    // Rank 0 makes the segment before anyone learns its name; the others open it after.
    char name[64] = {};
    static std::atomic<int> serial{0};
    int fd = -1;
    if (base_->rank() == 0) {
      std::snprintf(name, sizeof(name), "/duet-shm-%d-%d", static_cast<int>(getpid()), serial++);
      fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
      if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
        close(fd);
        shm_unlink(name);
        fd = -1;
      }
      if (fd < 0) name[0] = '\0';  // tells the others
    }
    base_->broadcast(name, sizeof(name), 0);
    if (name[0] == '\0') {
      fail(ErrorCode::kResourceExhausted, "shared memory of {} bytes for {} ranks could not be made", bytes_, n);
    }
    if (base_->rank() != 0) fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) fail(ErrorCode::kUnavailable, "shm_open('{}') on rank {}: {}", name, base_->rank(), std::strerror(errno));
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    base_->barrier();  // everyone has it mapped
    if (base_->rank() == 0) shm_unlink(name);
    if (p == MAP_FAILED) fail(ErrorCode::kUnavailable, "mmap of '{}' on rank {}: {}", name, base_->rank(), std::strerror(errno));
    base_addr_ = static_cast<uint8_t*>(p);
    arrive_ = reinterpret_cast<Counter*>(base_addr_);
    depart_ = arrive_ + n;
  }
  ~ShmCommunicator() override {
    if (base_addr_ != nullptr) munmap(base_addr_, bytes_);
  }

  int rank() const override { return base_->rank(); }
  int size() const override { return base_->size(); }
  std::string name() const override { return "shm+" + base_->name(); }
  bool same_host() const override { return true; }

  void allreduce_sum(float* data, int64_t count) override {
    const size_t bytes = float_bytes(count);
    if (bytes > max_bytes_) return base().allreduce_sum(data, count);
    const auto start = Clock::now();
    exchange("allreduce", data, bytes, [&] {
      // In rank order, as every communicator adds.
      std::memcpy(data, slot(0), bytes);
      for (int r = 1; r < size(); ++r) {
        const float* part = reinterpret_cast<const float*>(slot(r));
        for (int64_t i = 0; i < count; ++i) data[i] += part[i];
      }
    });
    record_collective(CollectiveOp::kAllreduce, seconds_since(start));
  }

  void allgather(const void* send, void* recv, size_t bytes) override {
    if (bytes > max_bytes_) return base().allgather(send, recv, bytes);
    const auto start = Clock::now();
    exchange("allgather", send, bytes, [&] {
      for (int r = 0; r < size(); ++r) std::memcpy(static_cast<uint8_t*>(recv) + static_cast<size_t>(r) * bytes, slot(r), bytes);
    });
    record_collective(CollectiveOp::kAllgather, seconds_since(start));
  }

  void all_to_all(const void* send, void* recv, size_t bytes) override {
    const size_t total = bytes * static_cast<size_t>(size());
    if (total > max_bytes_) return base().all_to_all(send, recv, bytes);
    const auto start = Clock::now();
    exchange("all_to_all", send, total, [&] {
      for (int r = 0; r < size(); ++r) {
        std::memcpy(static_cast<uint8_t*>(recv) + static_cast<size_t>(r) * bytes,
                    slot(r) + static_cast<size_t>(rank()) * bytes, bytes);
      }
    });
    record_collective(CollectiveOp::kAllToAll, seconds_since(start));
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (bytes > max_bytes_) return base().broadcast(data, bytes, root);
    const auto start = Clock::now();
    exchange("broadcast", data, rank() == root ? bytes : 0, [&] {
      if (rank() != root) std::memcpy(data, slot(root), bytes);
    });
    record_collective(CollectiveOp::kBroadcast, seconds_since(start));
  }

  void barrier() override {
    const auto start = Clock::now();
    exchange("barrier", nullptr, 0, [] {});
    record_collective(CollectiveOp::kBarrier, seconds_since(start));
  }

  void send(const void* data, size_t bytes, int dst, int tag) override { base().send(data, bytes, dst, tag); }
  void recv(void* data, size_t bytes, int src, int tag) override { base().recv(data, bytes, src, tag); }
  bool recv_message(std::vector<uint8_t>& out, int src, int tag, Duration timeout) override {
    return base().recv_message(out, src, tag, timeout);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return make_shm_communicator(base().split(color, key), max_bytes_);
  }

 private:
  // The communicator underneath, with this one's deadline.
  Communicator& base() {
    base_->set_timeout(timeout());
    return *base_;
  }
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
  const uint8_t* slot(int r) const { return base_addr_ + header_bytes_ + static_cast<size_t>(r) * max_bytes_; }
  uint8_t* slot(int r) { return base_addr_ + header_bytes_ + static_cast<size_t>(r) * max_bytes_; }

  // Waits until every rank's counter has reached `value`.
  void wait_all(Counter* counters, uint64_t value, const char* what, Clock::time_point start) {
    const auto deadline = start + timeout();
    for (int r = 0; r < size(); ++r) {
      for (int spins = 0; counters[r].value.load(std::memory_order_acquire) < value; ++spins) {
        if (spins < 256) continue;
        if ((spins & 255) == 0 && Clock::now() >= deadline) timed_out(what, r, Clock::now() - start);
        if (spins < 1 << 16) {
          sched_yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
    }
  }

  // One operation: wait until everyone has read the previous one's parts, write mine, wait for
  // everyone's, read, and say so.
  void exchange(const char* what, const void* mine, size_t bytes, const std::function<void()>& read) {
    check_usable(what);
    const auto start = Clock::now();
    const uint64_t op = ++op_;
    wait_all(depart_, op - 1, what, start);
    if (bytes > 0 && mine != slot(rank())) std::memcpy(slot(rank()), mine, bytes);
    arrive_[rank()].value.store(op, std::memory_order_release);
    wait_all(arrive_, op, what, start);
    read();
    depart_[rank()].value.store(op, std::memory_order_release);
  }

  std::unique_ptr<Communicator> base_;
  size_t max_bytes_;
  size_t header_bytes_ = 0;
  size_t bytes_ = 0;
  uint8_t* base_addr_ = nullptr;
  Counter* arrive_ = nullptr;
  Counter* depart_ = nullptr;
  uint64_t op_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_shm_communicator(std::unique_ptr<Communicator> base, size_t max_bytes) {
  if (!base->same_host()) {
    fail(ErrorCode::kInvalidArgument, "a shared-memory communicator needs every rank on one machine; '{}' spans several",
         base->name());
  }
  return std::make_unique<ShmCommunicator>(std::move(base), max_bytes);
}

}  // namespace duet
