// The engine service (the engine on its own thread behind the server): what goes wrong for one
// request stays with that request. A sink (the code that turns a request's outputs into HTTP:
// JSON, logging) that throws fails its own request, and the service stays healthy for the rest;
// nothing a sink throws may end the process.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "duet/server/engine_service.h"
#include "engine_fixture.h"

namespace duet::server {
namespace {

using namespace std::chrono_literals;
using testing::greedy;

std::shared_ptr<EngineService> make_service() {
  auto engine = std::make_unique<LLMEngine>(
      std::make_shared<const GgufFile>(GgufFile::open(testing::tiny_model_path())), testing::small_config());
  return std::make_shared<EngineService>(std::move(engine));
}

// Collects one request's outputs; wait() returns once the final one came.
class Collector {
 public:
  EngineService::Sink sink() {
    return [this](RequestOutput&& o) {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const CompletionDelta& d : o.outputs) tokens_ += static_cast<int>(d.token_ids.size());
      if (!o.error.empty()) error_ = o.error;
      if (o.finished) {
        finished_ = true;
        done_.notify_all();
      }
    };
  }
  bool wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    return done_.wait_for(lock, 60s, [&] { return finished_; });
  }
  int tokens() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return tokens_;
  }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_;
  bool finished_ = false;
  int tokens_ = 0;
  std::string error_;
};

bool settles(const EngineService& s) {
  for (int i = 0; i < 6000 && s.num_unfinished() != 0; ++i) std::this_thread::sleep_for(10ms);
  return s.num_unfinished() == 0;
}

TEST(EngineService, ASinkThatThrowsFailsOnlyItsRequest) {
  auto service = make_service();
  std::atomic<int> calls{0};
  Collector before, after;
  ASSERT_TRUE(service->submit("before", {1, 2, 3}, greedy(40), 0, before.sink()));
  ASSERT_TRUE(service->submit("throws", {4, 5}, greedy(40), 0, [&](RequestOutput&&) {
    ++calls;
    throw std::runtime_error("formatting this output failed");
  }));
  ASSERT_TRUE(service->submit("after", {6, 7}, greedy(40), 0, after.sink()));
  ASSERT_TRUE(before.wait());
  ASSERT_TRUE(after.wait());
  EXPECT_TRUE(service->healthy()) << service->unhealthy_reason();
  EXPECT_EQ(before.error(), "");
  EXPECT_EQ(after.error(), "");
  EXPECT_EQ(before.tokens(), 40);
  EXPECT_EQ(after.tokens(), 40);
  EXPECT_TRUE(settles(*service));
  // The failed request was taken out of the engine at once (its sink is never called again) and
  // holds no KV blocks.
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(service->metrics().kv_blocks_used, 0);
  Collector later;
  ASSERT_TRUE(service->submit("later", {8}, greedy(3), 0, later.sink()));
  ASSERT_TRUE(later.wait());
  EXPECT_EQ(later.tokens(), 3);
  EXPECT_TRUE(service->healthy());
}

TEST(EngineService, ASinkThatThrowsOnARefusedRequestDoesNotEndTheProcess) {
  auto service = make_service();
  // The engine refuses an empty prompt; reporting that through a sink that throws something other
  // than duet::Error once escaped the engine thread, and std::terminate ended the process.
  ASSERT_TRUE(service->submit("empty", {}, greedy(4), 0, [](RequestOutput&&) { throw std::logic_error("boom"); }));
  ASSERT_TRUE(service->submit("oov", {1, 100000}, greedy(4), 0, [](RequestOutput&&) { throw 42; }));
  Collector fine;
  ASSERT_TRUE(service->submit("fine", {1, 2}, greedy(5), 0, fine.sink()));
  ASSERT_TRUE(fine.wait());
  EXPECT_EQ(fine.tokens(), 5);
  EXPECT_TRUE(service->healthy()) << service->unhealthy_reason();
  EXPECT_TRUE(settles(*service));
}

}  // namespace
}  // namespace duet::server
