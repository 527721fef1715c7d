// The batching window in the engine: new requests held by it make an empty step (not a request
// that cannot fit), the engine says until when a caller may sleep only while nothing else runs,
// and held requests run once the window closes or enough tokens have joined.
#include <gtest/gtest.h>

#include "engine_fixture.h"

namespace duet {
namespace {

using testing::run_to_completion;
using testing::small_config;
using testing::tiny_model_path;

std::unique_ptr<LLMEngine> engine_with_window(double ms, int32_t tokens) {
  EngineConfig c = small_config();
  c.scheduler.batch_wait_ms = ms;
  c.scheduler.batch_wait_tokens = tokens;
  return std::make_unique<LLMEngine>(std::make_shared<const GgufFile>(GgufFile::open(tiny_model_path())), c);
}

SamplingParams short_greedy(int32_t max_tokens = 3) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

TEST(BatchingWindow, HeldRequestsMakeEmptyStepsUntilEnoughJoin) {
  auto e = engine_with_window(10000.0, 20);
  EXPECT_FALSE(e->batch_wait_deadline().has_value());  // nothing waiting
  const auto before = Clock::now();
  e->add_request("a", std::vector<int32_t>(8, 5), short_greedy());
  const std::optional<Clock::time_point> d = e->batch_wait_deadline();
  ASSERT_TRUE(d.has_value());
  EXPECT_GE(*d, before + std::chrono::milliseconds(10000));
  EXPECT_LE(*d, Clock::now() + std::chrono::milliseconds(10000));
  // Held: the step computes nothing and fails nothing.
  EXPECT_TRUE(e->step().empty());
  EXPECT_EQ(e->scheduler().waiting().size(), 1u);
  EXPECT_EQ(e->scheduler().running().size(), 0u);
  e->add_request("b", std::vector<int32_t>(8, 6), short_greedy());
  EXPECT_EQ(e->batch_wait_deadline(), d);
  // At 20 tokens the window closes, and all three prompts go in one step.
  e->add_request("c", std::vector<int32_t>(8, 7), short_greedy());
  EXPECT_FALSE(e->batch_wait_deadline().has_value());
  const std::vector<RequestOutput> first = e->step();
  EXPECT_EQ(e->scheduler().running().size(), 3u);
  ASSERT_EQ(first.size(), 3u);
  for (const RequestOutput& o : first) EXPECT_EQ(o.outputs.at(0).token_ids.size(), 1u) << o.request_id;
  const auto done = run_to_completion(*e);
  for (const char* id : {"a", "b", "c"}) {
    EXPECT_EQ(done.at(id).outputs.at(0).token_ids.size(), 2u) << id;
    EXPECT_TRUE(done.at(id).error.empty()) << id;
  }
}

TEST(BatchingWindow, RunningRequestsGoOnWhileANewOneIsHeld) {
  auto e = engine_with_window(300.0, 1000);
  e->add_request("long", std::vector<int32_t>(8, 5), short_greedy(40));
  // Past the window of "long" itself (it has nothing to wait with).
  run_to_completion(*e, 2);
  ASSERT_EQ(e->scheduler().running().size(), 1u);
  const auto held_at = Clock::now();
  e->add_request("new", std::vector<int32_t>(4, 9), short_greedy());
  // Something runs: no reason for the caller to sleep, and steps decode "long" alone.
  EXPECT_FALSE(e->batch_wait_deadline().has_value());
  int64_t generated = e->metrics().generation_tokens_total;
  for (int i = 0; i < 3; ++i) e->step();
  if (Clock::now() < held_at + std::chrono::milliseconds(300)) {
    EXPECT_EQ(e->metrics().generation_tokens_total, generated + 3);
    EXPECT_EQ(e->scheduler().waiting().size(), 1u);
  }
  const auto done = run_to_completion(*e);
  EXPECT_EQ(done.at("new").outputs.at(0).token_ids.size(), 3u);
  EXPECT_GE(Clock::now(), held_at + std::chrono::milliseconds(300));
}

}  // namespace
}  // namespace duet
