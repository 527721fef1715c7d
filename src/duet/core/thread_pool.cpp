#include "duet/core/thread_pool.h"

#include <algorithm>
#include <utility>

#include "duet/core/numa.h"

namespace duet {
namespace {

// A waiting thread first spins (short gaps between the ops of one forward pass are bridged
// without a futex round trip), then yields its core (when the machine is oversubscribed, the
// thread it waits for may need that core), and a worker finally sleeps: after idle_spin() of
// polling, or at once when that is 0.
constexpr int kSpinIterations = 2000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::atomic<int64_t> g_default_idle_spin_us{ThreadPool::kDefaultIdleSpin.count()};

}  // namespace

void ThreadPool::set_default_idle_spin(std::chrono::microseconds spin) {
  g_default_idle_spin_us.store(std::max<int64_t>(0, spin.count()));
}

std::chrono::microseconds ThreadPool::default_idle_spin() {
  return std::chrono::microseconds(g_default_idle_spin_us.load());
}

ThreadPool::ThreadPool(int num_threads, std::vector<int> cpus) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  num_threads_ = num_threads;
  workers_.reserve(static_cast<size_t>(num_threads_ - 1));
  for (int i = 1; i < num_threads_; ++i) {
    const int cpu = static_cast<size_t>(i) < cpus.size() ? cpus[static_cast<size_t>(i)] : -1;
    workers_.emplace_back([this, i, cpu] {
      if (cpu >= 0) pin_current_thread(cpu);
      worker(i);
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    const int64_t spin_ns = idle_spin_ns_.load(std::memory_order_relaxed);
    const auto park_at = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin_ns);
    for (int spin = 0; gen == seen && spin_ns > 0; ++spin) {
      if (spin % 64 == 0 && std::chrono::steady_clock::now() >= park_at) break;
      if (spin < kSpinIterations) cpu_relax();
      else std::this_thread::yield();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    try {
      (*job_)(index, num_threads_);
    } catch (...) {
      // Kept for the caller; an exception must not leave this thread (that ends the process).
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!worker_error_) worker_error_ = std::current_exception();
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (num_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  worker_error_ = nullptr;
  pending_.store(num_threads_ - 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  std::exception_ptr error;
  try {
    fn(0, num_threads_);
  } catch (...) {
    error = std::current_exception();  // rethrown once the workers are done with the job
  }
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpinIterations) cpu_relax();
    else std::this_thread::yield();
  }
  job_ = nullptr;
  if (!error) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    error = std::exchange(worker_error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_ranges(n, grain, [&](int, int64_t begin, int64_t end) { fn(begin, end); });
}

void ThreadPool::parallel_ranges(int64_t n, int64_t grain, const std::function<void(int, int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (num_threads_ == 1 || n <= grain) {
    fn(0, 0, n);
    return;
  }
  // Ranges of whole chunks claimed from a shared counter, each a share of what is left (1 / (1.5 x
  // threads) of it, at least one chunk): large claims first, few atomics, and single chunks at
  // the end, so a thread that runs slower (a core shared with another process, a remote memory
  // node) takes less and the op ends when the work does. Fixed claims of an eighth of the op
  // (two threads) left a descheduled thread's claim for the other to wait on: with two busy
  // processes beside a 2-thread decode on 2 cores, 10-18 tokens/s against 17 with these. Each
  // claim is a new place in memory for the hardware prefetcher to find: a third of what is left
  // rather than a quarter (two threads) decoded dsc-1.3b faster in 14 of 17 alternated rounds
  // (Q4_0 +1.8% on average; beside two busy processes too), and a half or an eighth did worse.
  const int64_t num_chunks = (n + grain - 1) / grain;
  const int64_t share = std::max<int64_t>(2, 3 * int64_t{num_threads_} / 2);
  std::atomic<int64_t> next{0};
  run([&](int tid, int) {
    int64_t c = next.load(std::memory_order_relaxed);
    while (c < num_chunks) {
      const int64_t take = std::max<int64_t>(1, (num_chunks - c) / share);
      if (!next.compare_exchange_weak(c, c + take, std::memory_order_relaxed)) continue;  // c reloaded
      fn(tid, c * grain, std::min(n, (c + take) * grain));
      c = next.load(std::memory_order_relaxed);
    }
  });
}

}  // namespace duet
