// The engine's batch invariance on cuda:0: engine_test's check (sixteen requests together, under
// prefix caching, chunked prefill and preemption, give each the greedy tokens it gets alone) with
// the whole model on the GPU, on the llama model and the deepseek2 one (MLA, routed experts), with
// decode graphs on and off (DUET_CUDA_GRAPHS). Matmuls run row by row (DUET_MATMUL=exact), the
// CUDA backend's batch-invariant mode: its default prefill path (cuBLAS over f16 tiles) gives a row
// bits that depend on the rows beside it. With graphs on, the engine's decode steps must have been
// replayed from graphs. Without a GPU: skipped (exit 77) with the runtime's reason.
#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>

#include "duet/backend/cuda_device.h"
#include "duet/backend/devices.h"
#include "engine_fixture.h"

namespace duet {
namespace {

struct Case {
  const char* name;
  bool moe;
  bool graphs;
};

class CudaGreedyBatched : public ::testing::TestWithParam<Case> {};

TEST_P(CudaGreedyBatched, EqualsOneAtATime) {
  const Case& c = GetParam();
  ::setenv("DUET_MATMUL", "exact", 1);  // read by each engine's devices
  ::setenv("DUET_CUDA_GRAPHS", c.graphs ? "1" : "0", 1);
  const std::string model = c.moe ? testing::tiny_moe_model_path() : testing::tiny_model_path();
  testing::expect_batched_equals_one_at_a_time(
      model,
      [](EngineConfig e) {
        parse_device_map("cuda:0", e.device_map);
        return e;
      },
      /*place_reference=*/true);

  // The decode steps of a run on cuda:0 went through the device's graphs (or, off, nothing did).
  EngineConfig e = testing::small_config();
  parse_device_map("cuda:0", e.device_map);
  LLMEngine engine(std::make_shared<const GgufFile>(GgufFile::open(model)), e);
  const std::vector<std::vector<int32_t>> prompts = testing::sixteen_prompts();
  for (size_t i = 0; i < 5; ++i) engine.add_request(testing::id_of(i), prompts[i], testing::greedy(12));
  testing::run_to_completion(engine);
  StepGraphs* graphs = engine.placement().devices.at(0)->step_graphs();
  if (!c.graphs) {
    EXPECT_EQ(graphs, nullptr);
    return;
  }
  ASSERT_NE(graphs, nullptr);
  const StepGraphs::Stats s = graphs->stats();
  std::printf("%s: %lld captures, %lld replays, %lld plain, %lld mismatches\n", c.name,
              static_cast<long long>(s.captures), static_cast<long long>(s.replays), static_cast<long long>(s.plain),
              static_cast<long long>(s.mismatches));
  EXPECT_GT(s.captures, 0);
  EXPECT_GT(s.replays, 5);
  EXPECT_EQ(s.capture_failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Engine, CudaGreedyBatched,
                         ::testing::Values(Case{"LlamaGraphs", false, true}, Case{"LlamaNoGraphs", false, false},
                                           Case{"Deepseek2Graphs", true, true}, Case{"Deepseek2NoGraphs", true, false}),
                         [](const ::testing::TestParamInfo<Case>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace duet
