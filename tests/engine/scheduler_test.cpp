// The scheduler with fake token ids and no model: budgets, chunking, running-first order,
// preemption of the newest request when blocks run out, the sequence limit, the batching window.
#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "duet/engine/scheduler.h"

namespace duet {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void make(int32_t num_blocks, SchedulerConfig sc) {
    KvCacheConfig kc;
    kc.block_size = 4;
    kc.num_blocks = num_blocks;
    kv_ = std::make_unique<KvCacheManager>(kc);
    scheduler_ = std::make_unique<Scheduler>(sc, *kv_);
  }

  Request* add(const std::string& id, int32_t prompt_len, int32_t priority = 0, Clock::time_point arrival = {}) {
    auto r = std::make_unique<Request>();
    r->id = id;
    r->times.arrival = arrival;
    r->arrival_order = next_arrival_++;
    r->priority = priority;
    for (int32_t i = 0; i < prompt_len; ++i) r->prompt_ids.push_back(1000 * static_cast<int32_t>(next_arrival_) + i);
    r->seqs.push_back(std::make_unique<Sequence>(next_seq_++, 0, r->prompt_ids, prompt_len, 0));
    Request* raw = r.get();
    scheduler_->add(std::move(r));
    return raw;
  }

  // One step: schedule, mark the tokens computed, append a fake token to every sampled sequence.
  SchedulerOutput step() {
    SchedulerOutput out = scheduler_->schedule();
    scheduler_->on_step_done(out);
    for (const ScheduledSequence& s : out.scheduled) {
      if (s.sample) s.seq->tokens.push_back(7);
    }
    return out;
  }

  int32_t tokens_for(const SchedulerOutput& out, const Request* r) {
    int32_t n = 0;
    for (const ScheduledSequence& s : out.scheduled) {
      if (s.request == r) n += s.num_new_tokens;
    }
    return n;
  }

  void TearDown() override {
    for (const char* id : {"a", "b", "c", "d"}) scheduler_->remove(id);
    EXPECT_EQ(kv_->stats().num_used_blocks, 0);
  }

  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t next_arrival_ = 0;
  SeqId next_seq_ = 0;
};

TEST_F(SchedulerTest, ChunksPromptsUnderTheTokenBudget) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 16;
  make(64, sc);
  Request* a = add("a", 10);
  Request* b = add("b", 10);
  SchedulerOutput s1 = step();
  EXPECT_EQ(s1.num_batched_tokens, 16);
  EXPECT_EQ(tokens_for(s1, a), 10);
  EXPECT_EQ(tokens_for(s1, b), 6);  // chunked
  EXPECT_TRUE(s1.scheduled[0].sample);
  EXPECT_FALSE(s1.scheduled[1].sample);
  SchedulerOutput s2 = step();
  EXPECT_EQ(tokens_for(s2, a), 1);  // decode first
  EXPECT_EQ(tokens_for(s2, b), 4);  // the rest of the prompt
  EXPECT_TRUE(s2.scheduled[1].sample);
}

TEST_F(SchedulerTest, WithoutChunkingALongPromptWaitsForRoom) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 16;
  sc.enable_chunked_prefill = false;
  make(64, sc);
  Request* a = add("a", 10);
  Request* b = add("b", 10);
  SchedulerOutput s1 = step();
  EXPECT_EQ(tokens_for(s1, a), 10);
  EXPECT_EQ(tokens_for(s1, b), 0);
  SchedulerOutput s2 = step();
  EXPECT_EQ(tokens_for(s2, a), 1);
  EXPECT_EQ(tokens_for(s2, b), 10);
}

TEST_F(SchedulerTest, PreemptsTheNewestWhenBlocksRunOut) {
  SchedulerConfig sc;
  make(6, sc);  // 24 token slots
  Request* a = add("a", 8);  // 2 blocks + growth
  Request* b = add("b", 8);
  Request* c = add("c", 6);
  SchedulerOutput s1 = step();  // a: 3 blocks (8 + 1 slot), b: 3? all fit: 2+2+2 blocks
  EXPECT_EQ(s1.num_preempted, 0);
  // Each decode step needs a new block every 4 tokens; soon the pool is exhausted.
  int preempted = 0;
  for (int i = 0; i < 12 && preempted == 0; ++i) preempted += step().num_preempted;
  ASSERT_GT(preempted, 0);
  // The newest request (c) was preempted first: it waits, with nothing computed.
  EXPECT_FALSE(c->running);
  EXPECT_EQ(c->seqs[0]->num_computed_tokens, 0);
  EXPECT_EQ(c->num_preemptions, 1);
  EXPECT_TRUE(a->running);
  EXPECT_EQ(scheduler_->num_preemptions(), preempted);
  EXPECT_EQ(scheduler_->find("c"), c);  // found where it waits now (TearDown removes it from there)
  EXPECT_EQ(scheduler_->find("a"), a);
  (void)b;
}

TEST_F(SchedulerTest, RespectsTheSequenceLimit) {
  SchedulerConfig sc;
  sc.max_num_seqs = 2;
  make(64, sc);
  add("a", 3);
  add("b", 3);
  Request* c = add("c", 3);
  step();
  EXPECT_EQ(scheduler_->running().size(), 2u);
  EXPECT_FALSE(c->running);
  EXPECT_EQ(scheduler_->num_running_seqs(), 2);
}

TEST_F(SchedulerTest, PriorityPolicyAdmitsLowerValuesFirst) {
  SchedulerConfig sc;
  sc.max_num_seqs = 1;
  sc.policy = SchedulingPolicy::kPriority;
  make(64, sc);
  add("a", 3, 2);
  Request* b = add("b", 3, 0);
  SchedulerOutput s = step();
  ASSERT_EQ(s.scheduled.size(), 1u);
  EXPECT_EQ(s.scheduled[0].request, b);
}

TEST_F(SchedulerTest, RemovingFreesEverything) {
  SchedulerConfig sc;
  make(16, sc);
  add("a", 9);
  add("b", 5);
  step();
  step();
  EXPECT_GT(kv_->stats().num_used_blocks, 0);
  EXPECT_NE(scheduler_->remove("a"), nullptr);
  EXPECT_NE(scheduler_->remove("b"), nullptr);
  EXPECT_EQ(scheduler_->remove("b"), nullptr);
  EXPECT_FALSE(scheduler_->has_unfinished());
}

// Requests are found and removed by id in constant time: a client's list of many prompts, or the
// disconnect that aborts all of them, costs the engine thread linear time, not quadratic. 100,000
// waiting requests were once found one by one with a scan each (5e9 comparisons, minutes); the
// bound below is hundreds of times what the work takes, for a busy machine.
TEST_F(SchedulerTest, FindsAndRemovesManyRequestsByIdInConstantTime) {
  SchedulerConfig sc;
  sc.max_num_seqs = 4;
  make(64, sc);
  constexpr int kNum = 100000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kNum; ++i) add("w" + std::to_string(i), 3);
  step();  // four of them run; the rest wait
  EXPECT_EQ(scheduler_->running().size(), 4u);
  EXPECT_EQ(scheduler_->waiting().size(), static_cast<size_t>(kNum - 4));
  for (int i = 0; i < kNum; ++i) {
    const std::string id = "w" + std::to_string(i);
    const Request* r = scheduler_->find(id);
    ASSERT_NE(r, nullptr) << id;
    ASSERT_EQ(r->id, id);
  }
  EXPECT_EQ(scheduler_->find("w" + std::to_string(kNum)), nullptr);
  // Removed from the middle outwards (the worst order for a scan from either end).
  for (int k = 0; k < kNum; ++k) {
    const int i = kNum / 2 + (k % 2 == 0 ? k / 2 : -(k + 1) / 2);
    ASSERT_NE(scheduler_->remove("w" + std::to_string(i)), nullptr) << i;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(scheduler_->has_unfinished());
  EXPECT_EQ(scheduler_->find("w0"), nullptr);
  EXPECT_LT(seconds, 10.0);
}

// Removing a waiting request keeps the order of the others.
TEST_F(SchedulerTest, RemovalKeepsTheWaitingOrder) {
  SchedulerConfig sc;
  sc.max_num_seqs = 1;
  make(64, sc);
  add("a", 3);
  add("b", 3);
  add("c", 3);
  add("d", 3);
  step();  // a runs
  EXPECT_NE(scheduler_->remove("c"), nullptr);
  ASSERT_EQ(scheduler_->waiting().size(), 2u);
  EXPECT_EQ(scheduler_->waiting().front()->id, "b");
  EXPECT_EQ(scheduler_->waiting().back()->id, "d");
  EXPECT_NE(scheduler_->remove("a"), nullptr);
  step();  // b runs now
  ASSERT_EQ(scheduler_->running().size(), 1u);
  EXPECT_EQ(scheduler_->running().front()->id, "b");
  EXPECT_EQ(scheduler_->find("d")->id, "d");
}

}  // namespace
}  // namespace duet

namespace duet {
namespace {

SchedulerConfig window_config(double ms, int32_t tokens) {
  SchedulerConfig sc;
  sc.batch_wait_ms = ms;
  sc.batch_wait_tokens = tokens;
  return sc;
}

TEST_F(SchedulerTest, TheBatchingWindowHoldsFewNewRequestsWhileRunningOnesGoOn) {
  make(64, window_config(10000.0, 16));
  const Clock::time_point now = Clock::now();
  // A request whose window closed long ago is not held.
  Request* a = add("a", 4, 0, now - std::chrono::seconds(20));
  EXPECT_FALSE(scheduler_->batch_window_end().has_value());
  SchedulerOutput s1 = step();
  EXPECT_EQ(tokens_for(s1, a), 4);
  EXPECT_FALSE(s1.held_new);
  // A new one is held for the window while the running one decodes on.
  Request* b = add("b", 4, 0, now);
  const std::optional<Clock::time_point> end = scheduler_->batch_window_end();
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(*end, now + std::chrono::milliseconds(10000));
  SchedulerOutput s2 = step();
  EXPECT_TRUE(s2.held_new);
  EXPECT_EQ(tokens_for(s2, a), 1);
  EXPECT_EQ(tokens_for(s2, b), 0);
  // More joining keeps the first one's deadline while they stay under 16 tokens...
  Request* c = add("c", 4, 0, now + std::chrono::milliseconds(5));
  EXPECT_EQ(scheduler_->batch_window_end(), end);
  EXPECT_EQ(tokens_for(step(), c), 0);
  // ...and at 16 tokens the window closes: all three start in the same step.
  Request* d = add("d", 8, 0, now + std::chrono::milliseconds(9));
  EXPECT_FALSE(scheduler_->batch_window_end().has_value());
  SchedulerOutput s4 = step();
  EXPECT_FALSE(s4.held_new);
  EXPECT_EQ(tokens_for(s4, a), 1);
  EXPECT_EQ(tokens_for(s4, b), 4);
  EXPECT_EQ(tokens_for(s4, c), 4);
  EXPECT_EQ(tokens_for(s4, d), 8);
}

TEST_F(SchedulerTest, TheBatchingWindowIsOffByDefaultAndCountsTheStepBudget) {
  make(64, SchedulerConfig{});
  add("a", 4, 0, Clock::now());
  EXPECT_FALSE(scheduler_->batch_window_end().has_value());
  EXPECT_EQ(step().num_batched_tokens, 4);
  scheduler_->remove("a");
  // batch_wait_tokens 0: the threshold is max_num_batched_tokens.
  SchedulerConfig sc = window_config(10000.0, 0);
  sc.max_num_batched_tokens = 12;
  make(64, sc);
  add("a", 8, 0, Clock::now());
  EXPECT_TRUE(scheduler_->batch_window_end().has_value());
  EXPECT_TRUE(step().empty());
  add("b", 4, 0, Clock::now());
  EXPECT_FALSE(scheduler_->batch_window_end().has_value());
  EXPECT_EQ(step().num_batched_tokens, 12);
}

TEST_F(SchedulerTest, TheBatchingWindowNeverHoldsAPreemptedRequest) {
  make(6, window_config(10000.0, 100));  // 24 token slots: decoding soon runs out of them
  // Arrived long ago: admitted at once.
  const Clock::time_point long_ago = Clock::now() - std::chrono::seconds(60);
  add("a", 8, 0, long_ago);
  add("b", 8, 0, long_ago);
  Request* c = add("c", 6, 0, long_ago);
  step();
  ASSERT_TRUE(c->times.first_scheduled.has_value());
  int preempted = 0;
  for (int i = 0; i < 12 && preempted == 0; ++i) preempted += step().num_preempted;
  ASSERT_GT(preempted, 0);
  ASSERT_FALSE(c->running);
  // A new request opens a window; the preempted one is not held by it.
  c->times.arrival = Clock::now();
  add("d", 2, 0, Clock::now());
  EXPECT_TRUE(scheduler_->batch_window_end().has_value());
  scheduler_->remove("a");  // room again
  SchedulerOutput s = step();
  EXPECT_GT(tokens_for(s, c), 0);
  EXPECT_TRUE(s.held_new);
}

TEST(SchedulerConfigTest, BadBatchingWindowsAreRefused) {
  KvCacheConfig kc;
  kc.num_blocks = 4;
  KvCacheManager kv(kc);
  for (SchedulerConfig sc : {window_config(-1.0, 0), window_config(20000.0, 0), window_config(5.0, -3)}) {
    EXPECT_THROW(Scheduler(sc, kv), Error);
  }
}

}  // namespace
}  // namespace duet

namespace duet {
namespace {

TEST_F(SchedulerTest, DraftsRideWithTheirSequenceUnderTheBudgetAndCountOnlyOnceKept) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 8;
  make(64, sc);
  Request* a = add("a", 4);
  step();  // the prompt; a fake token is appended
  Sequence& seq = *a->seqs[0];
  ASSERT_EQ(seq.num_computed_tokens, 4);
  seq.draft = {11, 12, 13};
  SchedulerOutput s = scheduler_->schedule();
  ASSERT_EQ(s.scheduled.size(), 1u);
  EXPECT_EQ(s.scheduled[0].num_new_tokens, 4);  // the last token and three drafts
  EXPECT_EQ(s.scheduled[0].num_draft_tokens, 3);
  EXPECT_TRUE(s.scheduled[0].sample);
  scheduler_->on_step_done(s);
  EXPECT_EQ(seq.num_computed_tokens, 5);  // drafts not yet
  // Two drafts kept, then the model's own token: 4 + 1 + 2 computed, one new token to compute.
  seq.tokens.insert(seq.tokens.end(), {11, 12, 7});
  scheduler_->accept_drafts(seq, 2);
  EXPECT_EQ(seq.num_computed_tokens, 7);
  EXPECT_EQ(static_cast<int32_t>(seq.tokens.size()) - seq.num_computed_tokens, 1);
  // The slots of the rejected draft are written over by the next step.
  seq.draft = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  Request* b = add("b", 5);
  SchedulerOutput t = scheduler_->schedule();
  ASSERT_EQ(t.scheduled.size(), 1u);  // the budget is spent: b waits
  EXPECT_EQ(t.scheduled[0].num_new_tokens, 8);  // 1 + 7 drafts
  EXPECT_EQ(t.scheduled[0].num_draft_tokens, 7);
  EXPECT_EQ(tokens_for(t, b), 0);
  EXPECT_EQ(t.num_batched_tokens, 8);
  scheduler_->on_step_done(t);
  EXPECT_EQ(seq.num_computed_tokens, 8);
}

TEST_F(SchedulerTest, PreemptionDropsDrafts) {
  SchedulerConfig sc;
  make(6, sc);  // 24 token slots
  Request* a = add("a", 8);
  add("b", 8);
  Request* c = add("c", 6);
  step();
  c->seqs[0]->draft = {1, 2};
  int preempted = 0;
  for (int i = 0; i < 12 && preempted == 0; ++i) preempted += step().num_preempted;
  ASSERT_GT(preempted, 0);
  ASSERT_FALSE(c->running);
  EXPECT_TRUE(c->seqs[0]->draft.empty());
  (void)a;
}

}  // namespace
}  // namespace duet
