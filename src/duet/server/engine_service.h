// The engine on its own thread behind a request queue. Network threads submit requests and
// aborts; the engine thread steps the engine and hands each request's outputs to its sink
// (which must not block: it posts to the connection). A sink that throws fails its own request
// (aborted, its sink dropped); a step that throws marks the engine unhealthy: it stops admitting
// and fails whatever is in flight.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "duet/engine/llm_engine.h"

namespace duet::server {

class EngineService {
 public:
  using Sink = std::function<void(RequestOutput&&)>;

  explicit EngineService(std::unique_ptr<LLMEngine> engine);
  ~EngineService();

  // Queues a request; its outputs go to `sink` on the engine thread, the last one with
  // finished = true (also when it fails: error set). Returns false when the service is not
  // admitting (unhealthy or stopping).
  bool submit(const std::string& id, std::vector<int32_t> prompt_ids, const SamplingParams& params, int32_t priority,
              Sink sink);
  // Aborts a request (no-op if it already finished); its sink gets a final output.
  void abort(const std::string& id);
  // Runs `fn` on the engine thread between steps, in order with the requests submitted before it
  // (loading or unloading a LoRA adapter); the future holds what it threw. An unhealthy or
  // stopping engine does not run it: the future holds an Error (kUnavailable).
  std::future<void> call(std::function<void(LLMEngine&)> fn);

  bool healthy() const { return healthy_.load(); }
  std::string unhealthy_reason() const;
  // Requests submitted and not finished yet (queued in the service or in the engine).
  int64_t num_unfinished() const { return unfinished_.load(); }
  // Requests waiting to be scheduled (the engine's waiting queue plus what is not added yet).
  int64_t num_waiting() const;
  // Stops admitting new requests (drain); those in flight continue.
  void stop_admitting() { admitting_ = false; }
  // Aborts everything in flight and stops the engine thread.
  void shutdown();
  // From any thread, at once (the engine thread may be stuck waiting for a rank that is gone):
  // marks the engine unhealthy with `reason` and ends every request in flight with it (503).
  void fail_in_flight(const std::string& reason);

  const LLMEngine& engine() const { return *engine_; }
  EngineMetrics metrics() const { return engine_->metrics(); }

 private:
  struct Command {
    enum class Kind { kAdd, kAbort, kCall } kind;
    std::string id;
    std::vector<int32_t> prompt_ids;
    SamplingParams params;
    int32_t priority = 0;
    Sink sink;
    std::function<void(LLMEngine*)> call;  // kCall: null when refused
  };

  void loop();
  // Gives `output` to a request's sink; false when the sink threw (logged; the request is then
  // the caller's to end).
  static bool deliver(const std::string& id, Sink& sink, RequestOutput&& output) noexcept;
  // Ends a request that was not added, through its sink.
  void refuse(Command& c, std::string message, ErrorCode code);
  void fail_all(const std::string& message);

  // Marks the engine unhealthy and fails what is in flight (sinks_mutex_ held).
  void become_unhealthy(const std::string& reason, const std::string& message);

  std::unique_ptr<LLMEngine> engine_;
  std::thread thread_;
  // Guards sinks_ (and their delivery), which fail_in_flight reaches from another thread.
  std::recursive_mutex sinks_mutex_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Command> commands_;
  bool stop_ = false;
  std::atomic<bool> healthy_{true};
  std::atomic<bool> admitting_{true};
  std::atomic<int64_t> unfinished_{0};
  std::atomic<int64_t> engine_waiting_{0};
  std::atomic<int64_t> queued_adds_{0};  // add commands not taken by the engine thread yet
  std::string unhealthy_reason_;
  std::unordered_map<std::string, Sink> sinks_;  // engine thread only
};

}  // namespace duet::server
