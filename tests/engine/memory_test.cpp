// Memory limits and degradation: the load-time plan and the runtime ladder as decisions over
// numbers, then the engine meeting out-of-memory steps (DUET_FAULT's oom mode, armed here) on a
// tiny f32 model: retried with the same greedy text, degraded rung by rung, or failed with off.
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "duet/backend/fault.h"
#include "duet/core/error.h"
#include "duet/core/sysinfo.h"
#include "duet/engine/memory_plan.h"
#include "engine_fixture.h"

namespace duet {
namespace {

using testing::greedy;
using testing::run_to_completion;
using testing::small_config;
using testing::tiny_model_path;

constexpr int64_t kMiB = int64_t{1} << 20;

MemoryNeeds needs(int64_t available) {
  MemoryNeeds n;
  n.available_bytes = available;
  n.limit_bytes = 1024 * kMiB;
  n.weights_bytes = 600 * kMiB;  // bf16
  n.weights_q8_0_bytes = 320 * kMiB;
  n.kv_dtype = KvDtype::kF16;
  n.kv_bytes = 200 * kMiB;
  n.kv_q8_0_bytes = 107 * kMiB;
  n.kv_what = "one request of 4096 tokens";
  return n;
}

std::string error_of(const MemoryNeeds& n, DegradeMode mode) {
  try {
    plan_memory(n, mode);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    return e.what();
  }
  return "";
}

TEST(MemoryPlan, TheLeastDegradationThatFits) {
  // Fits as it is: nothing degraded.
  MemoryPlan p = plan_memory(needs(900 * kMiB), DegradeMode::kAuto);
  EXPECT_FALSE(p.requantize_weights);
  EXPECT_EQ(p.kv_dtype, KvDtype::kF16);
  EXPECT_EQ(p.needed_bytes, 800 * kMiB);
  // The weights as Q8_0 are enough: the KV cache stays f16.
  p = plan_memory(needs(700 * kMiB), DegradeMode::kAuto);
  EXPECT_TRUE(p.requantize_weights);
  EXPECT_EQ(p.kv_dtype, KvDtype::kF16);
  EXPECT_EQ(p.needed_bytes, 520 * kMiB);
  EXPECT_NE(p.summary.find("re-quantized to Q8_0"), std::string::npos) << p.summary;
  // Both.
  p = plan_memory(needs(450 * kMiB), DegradeMode::kAuto);
  EXPECT_TRUE(p.requantize_weights);
  EXPECT_EQ(p.kv_dtype, KvDtype::kQ8_0);
  EXPECT_EQ(p.needed_bytes, 427 * kMiB);
  // Weights that cannot be re-quantized (already quantized, or an exact-matmul backend): the KV
  // cache alone.
  MemoryNeeds quantized = needs(650 * kMiB);
  quantized.weights_bytes = quantized.weights_q8_0_bytes = 500 * kMiB;
  p = plan_memory(quantized, DegradeMode::kAuto);
  EXPECT_FALSE(p.requantize_weights);
  EXPECT_EQ(p.kv_dtype, KvDtype::kQ8_0);
  MemoryNeeds exact = needs(450 * kMiB);
  exact.can_requantize = false;
  EXPECT_NE(error_of(exact, DegradeMode::kAuto).find("KV as q8_0"), std::string::npos);
  // Unknown room: as configured.
  p = plan_memory(needs(0), DegradeMode::kAuto);
  EXPECT_FALSE(p.requantize_weights);
}

TEST(MemoryPlan, NothingFitsOrDegradationOffIsAnErrorNamingTheNumbers) {
  const std::string e = error_of(needs(400 * kMiB), DegradeMode::kAuto);
  for (const char* part : {"800.0 MiB", "600.0 MiB of weights", "200.0 MiB of KV cache", "one request of 4096 tokens",
                           "400.0 MiB of room under the memory limit of 1024.0 MiB", "still needs 427.0 MiB"}) {
    EXPECT_NE(e.find(part), std::string::npos) << part << " in: " << e;
  }
  // Off: the model as it is, and what auto would have done.
  const std::string off = error_of(needs(700 * kMiB), DegradeMode::kOff);
  for (const char* part : {"needs 800.0 MiB", "700.0 MiB of room", "--degrade-on-oom auto",
                           "weights re-quantized to Q8_0 and a q8_0 KV cache (427.0 MiB)"}) {
    EXPECT_NE(off.find(part), std::string::npos) << part << " in: " << off;
  }
  EXPECT_NO_THROW(plan_memory(needs(900 * kMiB), DegradeMode::kOff));
  EXPECT_EQ(parse_degrade_mode("auto"), DegradeMode::kAuto);
  EXPECT_EQ(parse_degrade_mode("off"), DegradeMode::kOff);
  EXPECT_THROW(parse_degrade_mode("on"), Error);
}

TEST(PressureLadder, ClimbsOneRungPerEventSkippingWhatCannotApply) {
  PressureState s;
  std::vector<PressureRung> rungs;
  for (s.events = 0; s.events < 6; ++s.events) rungs.push_back(next_pressure_rung(s, DegradeMode::kAuto));
  EXPECT_EQ(rungs, (std::vector<PressureRung>{PressureRung::kPause, PressureRung::kShrinkKv, PressureRung::kDegradeKv,
                                              PressureRung::kDegradeWeights, PressureRung::kShrinkKv,
                                              PressureRung::kShrinkKv}));
  // Nothing to shrink and the KV cache already q8_0: the second event degrades the weights.
  s = PressureState{.events = 1, .can_shrink_kv = false, .kv_degradable = false, .weights_degradable = true};
  EXPECT_EQ(next_pressure_rung(s, DegradeMode::kAuto), PressureRung::kDegradeWeights);
  s.weights_degradable = false;
  EXPECT_EQ(next_pressure_rung(s, DegradeMode::kAuto), PressureRung::kFail);
  s.events = 0;
  EXPECT_EQ(next_pressure_rung(s, DegradeMode::kAuto), PressureRung::kPause);  // pausing always applies
  EXPECT_EQ(next_pressure_rung(PressureState{}, DegradeMode::kOff), PressureRung::kFail);
}

std::unique_ptr<LLMEngine> make_engine(const EngineConfig& c) {
  return std::make_unique<LLMEngine>(std::make_shared<const GgufFile>(GgufFile::open(tiny_model_path())), c);
}

const std::vector<std::vector<int32_t>> kPrompts = {{1, 2, 3, 4, 5}, {7, 8, 9}, {20, 21, 22, 23, 24, 25, 26}, {40}};

std::map<std::string, std::vector<int32_t>> run_prompts(LLMEngine& engine, std::map<std::string, std::string>* errors) {
  for (size_t i = 0; i < kPrompts.size(); ++i) engine.add_request("r" + std::to_string(i), kPrompts[i], greedy(12));
  std::map<std::string, std::vector<int32_t>> tokens;
  for (auto& [id, f] : run_to_completion(engine)) {
    EXPECT_TRUE(f.saw_finish) << id;
    if (!f.error.empty() && errors != nullptr) (*errors)[id] = f.error;
    if (!f.outputs.empty()) tokens[id] = f.outputs[0].token_ids;
  }
  return tokens;
}

// One step runs out of memory: its requests are computed again and end with the text they have
// without the fault; admission paused a moment; nothing degraded.
TEST(EngineMemory, AnOutOfMemoryStepIsRetriedWithTheSameText) {
  auto reference = make_engine(small_config());
  const auto expected = run_prompts(*reference, nullptr);
  auto engine = make_engine(small_config());
  arm_fault(FaultSpec{"cpu", 4, FaultMode::kOom});
  std::map<std::string, std::string> errors;
  EXPECT_EQ(run_prompts(*engine, &errors), expected);
  EXPECT_TRUE(errors.empty()) << errors.begin()->second;
  const EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.oom_events_total, 1);
  EXPECT_FALSE(m.weights_degraded);
  EXPECT_FALSE(m.kv_degraded);
  EXPECT_EQ(engine->kv_cache().stats().num_used_blocks, 0);
}

// Event after event, the ladder: pause, shrink the pool, q8_0 KV, Q8_0 weights; every request
// still completes (the text may change once degraded), and later requests are served.
TEST(EngineMemory, RepeatedEventsShrinkThePoolThenDegradeKvAndWeights) {
  auto engine = make_engine(small_config());
  const int32_t blocks = engine->kv_cache().num_usable_blocks();
  const bool kv_can = [&] {
    try {
      return engine->model_config().head_dim % 32 == 0;
    } catch (...) {
      return false;
    }
  }();
  for (int event = 1; event <= 4; ++event) {
    arm_fault(FaultSpec{"cpu", 3, FaultMode::kOom});
    std::map<std::string, std::string> errors;
    const auto out = run_prompts(*engine, &errors);
    EXPECT_TRUE(errors.empty()) << "event " << event << ": " << errors.begin()->second;
    for (const auto& [id, t] : out) EXPECT_EQ(t.size(), 12u) << "event " << event << " " << id;
    const EngineMetrics m = engine->metrics();
    EXPECT_EQ(m.oom_events_total, event);
    if (event == 2) {
      EXPECT_LT(engine->kv_cache().num_usable_blocks(), blocks);
      EXPECT_EQ(m.kv_blocks_withheld, blocks - engine->kv_cache().num_usable_blocks());
    }
    if (event == 3) {
      EXPECT_EQ(m.kv_degraded, kv_can);
    }
    if (event == 4) {
      EXPECT_TRUE(m.weights_degraded || !kv_can);  // without the KV rung, event 3 took the weights
      EXPECT_TRUE(engine->weights_degraded());
    }
  }
}

// Less than 5% of the limit left: a rung a second (pause, then shrink the pool), without a step
// failing; with room again the engine serves as before.
TEST(EngineMemory, LowMemoryUnderTheLimitClimbsTheLadder) {
  auto engine = make_engine(small_config());
  const int32_t blocks = engine->kv_cache().num_usable_blocks();
  set_memory_limit(process_memory().anonymous_bytes);  // no room left
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(2600);
  while (std::chrono::steady_clock::now() < end) {
    engine->health_check();  // idle: the server's loop calls it
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  set_memory_limit(0);
  const EngineMetrics m = engine->metrics();
  EXPECT_GE(m.low_memory_events_total, 2);
  EXPECT_LE(m.low_memory_events_total, 3);  // at most one a second
  EXPECT_EQ(m.oom_events_total, 0);
  EXPECT_LT(engine->kv_cache().num_usable_blocks(), blocks);
  std::map<std::string, std::string> errors;
  EXPECT_EQ(run_prompts(*engine, &errors).size(), kPrompts.size());
  EXPECT_TRUE(errors.empty());
}

// --degrade-on-oom off: the step's requests fail (503's kUnavailable), the others finish, and
// the engine serves the next requests.
TEST(EngineMemory, WithDegradationOffTheStepsRequestsFail) {
  EngineConfig c = small_config();
  c.degrade_on_oom = DegradeMode::kOff;
  auto engine = make_engine(c);
  arm_fault(FaultSpec{"cpu", 4, FaultMode::kOom});
  std::map<std::string, std::string> errors;
  const auto out = run_prompts(*engine, &errors);
  EXPECT_FALSE(errors.empty());
  for (const auto& [id, e] : errors) EXPECT_NE(e.find("out of memory"), std::string::npos) << e;
  EXPECT_EQ(engine->kv_cache().stats().num_used_blocks, 0);
  errors.clear();
  const auto later = run_prompts(*engine, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(later.size(), kPrompts.size());
  EXPECT_FALSE(engine->metrics().weights_degraded);
}

// The engine commits the KV blocks a fresh pool hands out first: by default what one full step
// can take (at most the pool), the number asked for, or none; and the same text either way.
TEST(EngineMemory, CommitsTheFirstKvBlocksAtStartup) {
  EngineConfig config = small_config();
  config.scheduler.max_num_batched_tokens = 64;
  config.scheduler.max_num_seqs = 8;
  auto by_default = make_engine(config);
  const int64_t pool = by_default->kv_cache().config().num_blocks;
  ASSERT_GT(pool, 64 / config.block_size + 8);
  EXPECT_EQ(by_default->kv_committed_blocks(), 64 / config.block_size + 8);
  EXPECT_EQ(kv_commit_auto(config.scheduler, config.block_size), 64 / config.block_size + 8);
  EXPECT_GT(by_default->kv_committed_bytes(), 0) << "MADV_POPULATE_WRITE needs Linux 5.14 or later";
  const auto expected = run_prompts(*by_default, nullptr);
  config.kv_commit_blocks = 0;
  auto none = make_engine(config);
  EXPECT_EQ(none->kv_committed_blocks(), 0);
  EXPECT_EQ(none->kv_committed_bytes(), 0);
  EXPECT_EQ(run_prompts(*none, nullptr), expected);
  config.kv_commit_blocks = pool + 100;
  auto all = make_engine(config);
  EXPECT_EQ(all->kv_committed_blocks(), pool);
  const int64_t block_bytes = by_default->kv_committed_bytes() / by_default->kv_committed_blocks();
  EXPECT_EQ(all->kv_committed_bytes(), pool * block_bytes);
}

// A KV cache in bytes no machine has is refused by name: 2^63 - 1 bytes once summed with the
// weights to a negative need, which the plan took as fitting, and the pool's allocation threw
// std::bad_alloc.
TEST(EngineMemory, AKvCacheNoMachineHasIsRefused) {
  EngineConfig config;
  config.threads = 1;
  for (int64_t bytes : {int64_t{INT64_MAX}, (int64_t{1} << 50) + 1}) {
    config.kv_cache_bytes = bytes;
    try {
      make_engine(config);
      FAIL() << bytes << " bytes accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("more than any machine has"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace duet
