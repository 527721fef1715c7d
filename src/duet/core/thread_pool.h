// One persistent pool of worker threads. The calling thread takes part as thread 0, so a pool of
// one thread runs everything inline. A job that throws, on any thread, is carried back: run()
// returns only when every thread has finished the job, then rethrows (the caller's own exception
// first, else the first worker's).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace duet {

class ThreadPool {
 public:
  // num_threads <= 0 picks the number of hardware threads. Worker i (1 <= i < num_threads) is
  // pinned to cpus[i] when cpus has an entry for it (the calling thread, 0, is never pinned).
  explicit ThreadPool(int num_threads = 0, std::vector<int> cpus = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // How long an idle worker keeps polling for the next job (spinning, then yielding its core)
  // before it parks on a futex until woken; 0 parks at once. Polling bridges the short gaps
  // between the ops of one forward pass; parking makes an idle server cost no CPU time.
  void set_idle_spin(std::chrono::microseconds spin) { idle_spin_ns_.store(spin.count() * 1000); }
  std::chrono::microseconds idle_spin() const { return std::chrono::microseconds(idle_spin_ns_.load() / 1000); }
  static constexpr std::chrono::microseconds kDefaultIdleSpin{250};
  // The idle spin of pools made from now on (--worker-spin-us); kDefaultIdleSpin until set.
  static void set_default_idle_spin(std::chrono::microseconds spin);
  static std::chrono::microseconds default_idle_spin();

  // Runs fn(thread_index, num_threads) once on every thread and returns when all have finished;
  // rethrows what fn threw on any of them.
  void run(const std::function<void(int, int)>& fn);

  // Calls fn(begin, end) over [0, n) in ranges of whole chunks of `grain` (the last may be
  // shorter), claimed by the threads as they go, so a thread may get several or none.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
  // The same, with the index of the thread that runs each range (for that thread's scratch).
  void parallel_ranges(int64_t n, int64_t grain, const std::function<void(int, int64_t, int64_t)>& fn);

 private:
  void worker(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> idle_spin_ns_{default_idle_spin().count() * 1000};
  const std::function<void(int, int)>* job_ = nullptr;
  std::mutex error_mutex_;
  std::exception_ptr worker_error_;  // the first a worker threw in the current job
};

}  // namespace duet
