// A few threads for the CPU work of requests (parsing bodies, rendering chat templates,
// tokenizing), so that the HTTP I/O threads only read, write and queue: a large prompt being
// tokenized never holds up /health or another request's stream.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace duet::server {

class WorkPool {
 public:
  explicit WorkPool(int num_threads);
  // Drops what has not started and joins the threads (after the tasks running now end).
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues `task` (which must not throw); false, with nothing queued, when `max_waiting` tasks
  // already wait.
  bool post(std::function<void()> task, size_t max_waiting);
  size_t num_waiting() const;
  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void run();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace duet::server
