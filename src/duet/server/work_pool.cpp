#include "duet/server/work_pool.h"

#include <algorithm>

#include "duet/core/log.h"

namespace duet::server {

WorkPool::WorkPool(int num_threads) {
  for (int i = 0; i < std::max(1, num_threads); ++i) threads_.emplace_back([this] { run(); });
}

WorkPool::~WorkPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    tasks_.clear();
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool WorkPool::post(std::function<void()> task, size_t max_waiting) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_ || tasks_.size() >= max_waiting) return false;
    tasks_.push_back(std::move(task));
  }
  wake_.notify_one();
  return true;
}

size_t WorkPool::num_waiting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.size();
}

void WorkPool::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (stop_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    try {
      task();
    } catch (const std::exception& e) {
      spdlog::error("a request's work failed outside its handler: {}", e.what());
    } catch (...) {
      spdlog::error("a request's work failed outside its handler (an unknown exception)");
    }
  }
}

}  // namespace duet::server
