#include "duet/server/engine_service.h"

#include <algorithm>
#include <chrono>

#include "duet/core/error.h"
#include "duet/core/log.h"

namespace duet::server {

EngineService::EngineService(std::unique_ptr<LLMEngine> engine) : engine_(std::move(engine)) {
  thread_ = std::thread([this] { loop(); });
}

EngineService::~EngineService() { shutdown(); }

bool EngineService::submit(const std::string& id, std::vector<int32_t> prompt_ids, const SamplingParams& params,
                           int32_t priority, Sink sink) {
  if (!admitting_.load() || !healthy_.load()) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) return false;
    commands_.push_back(Command{Command::Kind::kAdd, id, std::move(prompt_ids), params, priority, std::move(sink), nullptr});
    ++queued_adds_;
  }
  ++unfinished_;
  wake_.notify_one();
  return true;
}

void EngineService::abort(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    commands_.push_back(Command{Command::Kind::kAbort, id, {}, {}, 0, nullptr, nullptr});
  }
  wake_.notify_one();
}

std::future<void> EngineService::call(std::function<void(LLMEngine&)> fn) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> result = done->get_future();
  Command c{Command::Kind::kCall, {}, {}, {}, 0, nullptr, nullptr};
  c.call = [fn = std::move(fn), done](LLMEngine* engine) {
    try {
      if (engine == nullptr) fail(ErrorCode::kUnavailable, "the engine is unhealthy or stopping");
      fn(*engine);
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) {
      c.call(nullptr);
      return result;
    }
    commands_.push_back(std::move(c));
  }
  wake_.notify_one();
  return result;
}

std::string EngineService::unhealthy_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return unhealthy_reason_;
}

int64_t EngineService::num_waiting() const { return queued_adds_.load() + engine_waiting_.load(); }

void EngineService::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  admitting_ = false;
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool EngineService::deliver(const std::string& id, Sink& sink, RequestOutput&& output) noexcept {
  // A sink formats and sends one request's outputs: what it throws is that request's failure, not
  // the engine's, and must not leave this thread (that would end the process).
  try {
    sink(std::move(output));
    return true;
  } catch (const std::exception& e) {
    spdlog::error("request '{}' failed while its output was sent, it is aborted: {}", id, e.what());
  } catch (...) {
    spdlog::error("request '{}' failed while its output was sent (an unknown exception), it is aborted", id);
  }
  return false;
}

void EngineService::refuse(Command& c, std::string message, ErrorCode code) {
  RequestOutput o;
  o.request_id = c.id;
  o.finished = true;
  o.error = std::move(message);
  o.error_code = code;
  deliver(c.id, c.sink, std::move(o));
  --unfinished_;
}

void EngineService::fail_all(const std::string& message) {
  for (auto& [id, sink] : sinks_) {
    RequestOutput o;
    o.request_id = id;
    o.finished = true;
    o.error = message;
    o.error_code = ErrorCode::kUnavailable;
    deliver(id, sink, std::move(o));
    --unfinished_;
  }
  sinks_.clear();
}

void EngineService::fail_in_flight(const std::string& reason) {
  const std::lock_guard<std::recursive_mutex> sinks(sinks_mutex_);
  if (!healthy_) return;
  become_unhealthy(reason, reason);
}

void EngineService::become_unhealthy(const std::string& reason, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    unhealthy_reason_ = reason;
  }
  healthy_ = false;
  admitting_ = false;
  fail_all(message);
}

void EngineService::loop() {
  // Over several ranks, an idle engine checks every second that the other ranks still answer.
  const auto heartbeat = std::chrono::seconds(1);
  for (;;) {
    std::deque<Command> batch;
    bool stopping = false;
    bool idle = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const auto ready = [&] { return stop_ || !commands_.empty() || (healthy_ && engine_->has_unfinished()); };
      // Idle, the loop still wakes for the other ranks' heartbeat and the devices' health probes.
      const double interval = engine_->config().health_check_interval;
      if (engine_->parallel()) {
        idle = !wake_.wait_for(lock, heartbeat, ready);
      } else if (interval > 0.0) {
        wake_.wait_for(lock, std::chrono::duration<double>(std::min(interval, 1.0)), ready);
      } else {
        wake_.wait(lock, ready);
      }
      batch.swap(commands_);
      stopping = stop_;
    }
    // The sinks are locked except while the engine computes (which may wait for other ranks), so
    // fail_in_flight can always reach them.
    std::unique_lock<std::recursive_mutex> sinks(sinks_mutex_);
    if (idle && healthy_) {
      sinks.unlock();
      try {
        engine_->check_ranks();
      } catch (const std::exception& e) {
        spdlog::error("a rank does not answer, the engine is now unhealthy: {}", e.what());
        sinks.lock();
        if (healthy_) become_unhealthy(e.what(), std::string("engine failure: ") + e.what());
      }
      continue;
    }
    for (Command& c : batch) {
      if (c.kind == Command::Kind::kAdd) {
        if (stopping || !healthy_) {
          refuse(c, stopping ? "the server is shutting down" : "the engine is unhealthy", ErrorCode::kUnavailable);
          continue;
        }
        // Whatever adding one request throws refuses that request only.
        try {
          engine_->add_request(c.id, std::move(c.prompt_ids), c.params, c.priority);
        } catch (const Error& e) {
          refuse(c, e.what(), e.code());
          continue;
        } catch (const std::exception& e) {
          refuse(c, e.what(), ErrorCode::kInternal);
          continue;
        }
        sinks_.emplace(c.id, std::move(c.sink));
      } else if (c.kind == Command::Kind::kCall) {
        c.call(stopping || !healthy_ ? nullptr : engine_.get());
      } else if (healthy_) {
        engine_->abort_request(c.id);
      }
    }
    // The adds of this batch now wait in the engine (or were refused): count them there, then
    // no longer as queued (in that order, so num_waiting() never misses them).
    int64_t adds = 0;
    for (const Command& c : batch) adds += c.kind == Command::Kind::kAdd ? 1 : 0;
    engine_waiting_ = static_cast<int64_t>(engine_->scheduler().waiting().size());
    queued_adds_ -= adds;
    if (stopping) {
      if (healthy_) {
        for (const auto& [id, sink] : sinks_) engine_->abort_request(id);
      }
    }
    if (healthy_ && !engine_->has_unfinished()) {
      try {
        engine_->health_check();  // (a step checks them itself)
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          unhealthy_reason_ = e.what();
        }
        healthy_ = false;
        admitting_ = false;
        spdlog::error("a device failed and could not be replaced, the engine is now unhealthy: {}", e.what());
      }
    }
    if (healthy_ && !stopping) {
      // The batching window holds the only requests there are: sleep until it closes, or until
      // another request (or an abort) arrives, then decide again.
      if (const std::optional<Clock::time_point> until = engine_->batch_wait_deadline()) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait_until(lock, *until, [&] { return stop_ || !commands_.empty(); });
        continue;
      }
    }
    if (healthy_ && engine_->has_unfinished()) {
      try {
        sinks.unlock();
        std::vector<RequestOutput> outputs = engine_->step();
        sinks.lock();
        if (!healthy_) continue;  // failed meanwhile (fail_in_flight): the requests have their errors
        for (RequestOutput& o : outputs) {
          auto it = sinks_.find(o.request_id);
          if (it == sinks_.end()) continue;
          const bool finished = o.finished;
          const bool delivered = deliver(it->first, it->second, std::move(o));
          if (!delivered && !finished) engine_->abort_request(it->first);  // its last output goes nowhere
          if (finished || !delivered) {
            sinks_.erase(it);
            --unfinished_;
          }
        }
        int64_t waiting = static_cast<int64_t>(engine_->scheduler().waiting().size());
        engine_waiting_ = waiting;
      } catch (const std::exception& e) {
        // A fault inside a step is not one request's fault: the engine cannot be trusted any more.
        if (!sinks.owns_lock()) sinks.lock();
        spdlog::error("engine step failed, the engine is now unhealthy: {}", e.what());
        if (healthy_) become_unhealthy(e.what(), std::string("engine failure: ") + e.what());
      }
    }
    if (stopping && (sinks_.empty() || !healthy_)) {
      fail_all("the server is shutting down");
      return;
    }
  }
}

}  // namespace duet::server
