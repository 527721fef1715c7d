// Whole models on the GPU: the logits of llama, qwen2 and deepseek2 (V2 and V3: MLA and MoE) on
// `cuda:0` against the CPU (exact matmul) for every weight type the synthetic writer makes, a
// 13-token prefill then four decode steps; hybrid maps (layers split between cuda:0 and cpu, the
// routed experts on cpu); and a decode step's batch invariance on cuda:0. Tolerance: the largest
// logit difference over the largest logit magnitude, 1e-3 for f32 weights, 3e-2 for the others
// (prefill rounds weights and activations to f16 for the tensor cores), and the same greedy token
// at every decode step. Without a GPU: skipped (exit 77) with the runtime's reason.
#include <cstdio>
#include <cstring>

#include <gtest/gtest.h>

#include "duet/backend/cuda_device.h"
#include "duet/backend/devices.h"
#include "duet/model/placement.h"
#include "model_fixture.h"

namespace duet {
namespace {

SyntheticSpec four_layers(const std::string& preset) {
  SyntheticSpec s = synthetic_preset(preset);
  s.num_layers = 4;
  return s;
}

struct Arch {
  std::string name;
  SyntheticSpec spec;
};

std::vector<Arch> archs() {
  SyntheticSpec llama = four_layers("tiny");
  llama.hidden_size = 256;
  llama.intermediate_size = 512;
  SyntheticSpec qwen2 = four_layers("qwen2-tiny");
  qwen2.hidden_size = 256;
  qwen2.intermediate_size = 512;
  return {{"llama", llama}, {"qwen2", qwen2}, {"deepseek2_v2", four_layers("deepseek2-tiny-v2")},
          {"deepseek2_v3", four_layers("deepseek2-tiny-v3")}};
}

class CudaModelTest : public ModelFileTest {
 protected:
  std::unique_ptr<Model> load_mapped(const std::string& path, const std::string& device_map,
                                     const std::string& moe_experts, DeviceRegistry& devices) {
    DeviceMapSpec spec;
    parse_device_map(device_map, spec);
    spec.moe_experts = moe_experts;
    auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
    Placement p = plan_model_placement(*file, spec, devices, KvBudget{int64_t{64} << 20, 0.3}, KvDtype::kF16);
    return load_model(file, std::move(p));
  }

  // A 13-token prefill (every position's logits), then four single-token steps.
  static std::vector<float> run(Model& model) {
    const std::vector<int32_t> prompt = {1, 7, 33, 90, 5, 200, 17, 3, 64, 128, 11, 250, 42};
    const std::vector<int32_t> next = {9, 300, 2, 77};
    const int64_t vocab = model.config().num_vocab;
    std::vector<float> out(static_cast<size_t>((prompt.size() + next.size()) * vocab));
    SequenceRunner runner(model, static_cast<int64_t>(prompt.size() + next.size()), 4);
    runner.forward(prompt, 0, out.data(), true);
    for (size_t i = 0; i < next.size(); ++i) {
      runner.forward(std::span<const int32_t>(&next[i], 1), static_cast<int64_t>(prompt.size() + i),
                     out.data() + (prompt.size() + i) * vocab, false);
    }
    return out;
  }

  static void expect_close(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab, double tol,
                           const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    double diff = 0.0, mag = 1e-30;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << " logit " << i;
      diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
      mag = std::max(mag, std::fabs(static_cast<double>(want[i])));
    }
    EXPECT_LE(diff / mag, tol) << what;
    const auto rows = static_cast<int64_t>(got.size()) / vocab;
    for (int64_t r = 13; r < rows; ++r) {  // the decode steps choose the same greedy token
      const float* g = got.data() + r * vocab;
      const float* w = want.data() + r * vocab;
      EXPECT_EQ(std::max_element(g, g + vocab) - g, std::max_element(w, w + vocab) - w) << what << " step " << r;
    }
    std::printf("%s: relative logit difference %.3g\n", what.c_str(), diff / mag);
  }
};

TEST_F(CudaModelTest, LogitsOnTheGpuMatchTheCpu) {
  for (const Arch& a : archs()) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
      const std::string path = write_model(a.name + "_" + std::string(dtype_name(t)) + ".gguf", t, a.spec);
      backend_ = make_cpu_backend(2, MatmulMode::kExact);
      const std::vector<float> want = run(*load(path));
      const int64_t vocab = load(path)->config().num_vocab;
      const double tol = t == DType::kF32 ? 1e-3 : 3e-2;
      DeviceRegistry devices;
      expect_close(run(*load_mapped(path, "layers.0-3=cuda:0,embed=cuda:0,lm_head=cuda:0", "", devices)), want, vocab,
                   tol, a.name + " " + std::string(dtype_name(t)) + " on cuda:0");
      expect_close(run(*load_mapped(path, "layers.0-1=cuda:0,layers.2-3=cpu", "", devices)), want, vocab, tol,
                   a.name + " " + std::string(dtype_name(t)) + " layers split cuda:0 + cpu");
      if (a.spec.num_experts > 0) {
        expect_close(run(*load_mapped(path, "layers.0-3=cuda:0", "cpu", devices)), want, vocab, tol,
                     a.name + " " + std::string(dtype_name(t)) + " experts on cpu");
      }
    }
  }
}

// Two sequences decoding in one step give each the logits it gets alone (quantized weights: the
// GEMV and attention compute each row alone, so the bits are the same).
TEST_F(CudaModelTest, ADecodeStepIsBatchInvariant) {
  for (const Arch& a : archs()) {
    const std::string path = write_model(a.name + "_bi.gguf", DType::kQ8_0, a.spec);
    DeviceRegistry devices;
    const std::unique_ptr<Model> model = load_mapped(path, "layers.0-3=cuda:0,embed=cuda:0,lm_head=cuda:0", "", devices);
    const int64_t vocab = model->config().num_vocab;
    const std::vector<int32_t> t0 = {0, 1}, t1 = {2, 3};  // blocks of 4 tokens
    const std::vector<int32_t> s0 = {3, 1, 4, 1, 5}, s1 = {2, 7, 1};
    auto cache = model->new_kv_cache(4, 4, KvDtype::kF16);
    // Prefill both, then one decode token each: alone, then together.
    for (const auto& [s, t] : {std::pair{&s0, &t0}, std::pair{&s1, &t1}}) {
      BatchInput b;
      b.attention.block_size = 4;
      b.add_sequence(*s, 0, *t, BatchInput::Logits::kLast);
      std::vector<float> l(static_cast<size_t>(vocab));
      model->forward(b, *cache, l.data());
    }
    std::vector<float> alone(static_cast<size_t>(2 * vocab)), together(alone.size());
    const std::vector<int32_t> d0 = {9}, d1 = {8};
    for (int i = 0; i < 2; ++i) {
      BatchInput b;
      b.attention.block_size = 4;
      b.add_sequence(i == 0 ? d0 : d1, i == 0 ? 5 : 3, i == 0 ? t0 : t1, BatchInput::Logits::kLast);
      model->forward(b, *cache, alone.data() + i * vocab);
    }
    BatchInput both;
    both.attention.block_size = 4;
    both.add_sequence(d0, 5, t0, BatchInput::Logits::kLast);
    both.add_sequence(d1, 3, t1, BatchInput::Logits::kLast);
    model->forward(both, *cache, together.data());
    EXPECT_EQ(std::memcmp(alone.data(), together.data(), alone.size() * sizeof(float)), 0) << a.name;
  }
}

}  // namespace
}  // namespace duet
