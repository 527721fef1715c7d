// The device map: logits under any valid map are the same bits as on one device (layers split at
// every point, embed and lm_head apart, attention apart from the feed-forward, routed experts on
// their own device; llama, qwen2 and deepseek2 V2/V3 in every weight type they compute with),
// and every bad map is refused before anything is loaded, naming the key and the numbers.
//
// Most maps use guarded devices (CPU devices whose memory is unreadable outside their own ops and
// copies), so the same runs prove that no path reads a device buffer from the host.
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "duet/backend/cuda_device.h"
#include "duet/core/error.h"
#include "duet/model/executor.h"
#include "model_fixture.h"

namespace duet {
namespace {

struct Arch {
  std::string name;
  SyntheticSpec spec;
  std::vector<std::string> types;  // written directly (f32 ... q4_0), or quantized by `duet quantize`
};

bool written_directly(const std::string& type) {
  return type == "f32" || type == "f16" || type == "bf16" || type == "q8_0" || type == "q4_0";
}

SyntheticSpec four_layers(const std::string& preset) {
  SyntheticSpec s = synthetic_preset(preset);
  s.num_layers = 4;
  return s;
}

std::vector<Arch> archs() {
  // Hidden 256 so that the K-quants (super-blocks of 256) apply to llama and qwen2.
  SyntheticSpec llama = four_layers("tiny");
  llama.hidden_size = 256;
  llama.intermediate_size = 512;
  SyntheticSpec qwen2 = four_layers("qwen2-tiny");
  qwen2.hidden_size = 256;
  qwen2.intermediate_size = 512;
  qwen2.sliding_window = 5;  // windowed attention from layer 2 on (its batch is built per step)
  qwen2.max_window_layers = 2;
  const std::vector<std::string> dense = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q5_k", "q6_k"};
  const std::vector<std::string> mla = {"f32", "f16", "bf16", "q8_0", "q4_0"};
  return {{"llama", llama, dense},
          {"qwen2", qwen2, dense},
          {"deepseek2_v2", four_layers("deepseek2-tiny-v2"), mla},
          {"deepseek2_v3", four_layers("deepseek2-tiny-v3"), mla}};
}

struct Map {
  std::string device_map;
  std::vector<std::string> override_tensor;
  std::string moe_experts;
  bool moe_only = false;  // meaningful for a model with routed experts only
};

std::vector<Map> maps() {
  std::vector<Map> m;
  for (int split = 1; split < 4; ++split) {  // two stages, split at every layer
    m.push_back({fmt::format("layers.0-{}=guarded:0,layers.{}-3=guarded:1", split - 1, split), {}, {}});
  }
  // Three devices; embed and lm_head on the third, in the seeds' key spelling.
  m.push_back({R"({"embed": "guarded:2", "transformer.layers.0-1": "guarded:0", "model.layers.2-3": "guarded:1",
                   "lm_head": "guarded:2"})",
               {}, {}});
  // Attention on one device, the feed-forward on another.
  m.push_back({"layers.0-3=guarded:0", {"ffn_|exp_probs_b=guarded:1"}, {}});
  // Routed experts on their own device, alone and under a pipeline.
  m.push_back({"layers.0-3=guarded:0", {}, "guarded:1", true});
  m.push_back({"layers.0-1=guarded:0,layers.2-3=guarded:1", {"ffn_.*_exps=guarded:2"}, {}, true});
  // Real CPU devices: each core its own pinned pool.
  m.push_back({"layers.0-1=cpu[0],layers.2-3=cpu[1]", {}, {}});
  return m;
}

class PlacementTest : public ModelFileTest {
 protected:
  // The model in `type`: written by the synthetic writer, or its f32 file quantized by duet.
  std::string model_in(const Arch& a, const std::string& type) {
    const std::string name = a.name + "_" + type + ".gguf";
    if (written_directly(type)) {
      DType t = DType::kF32;
      for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
        if (dtype_name(d) == type || (type == "bf16" && d == DType::kBF16)) t = d;
      }
      return write_model(name, t, a.spec);
    }
    const std::string f32 = write_model(a.name + "_src.gguf", DType::kF32, a.spec);
    const std::string out = (dir_ / name).string();
    const std::string cmd = std::string(DUET_BINARY_DIR) + "/duet quantize --type " + type + " -t 2 " + f32 + " " + out +
                            " > /dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) throw Error(ErrorCode::kInternal, "failed: " + cmd);
    return out;
  }

  std::unique_ptr<Model> load_mapped(const std::string& path, const Map& m, DeviceRegistry& devices) {
    DeviceMapSpec spec;
    parse_device_map(m.device_map, spec);
    for (const std::string& o : m.override_tensor) parse_override_tensor(o, spec);
    spec.moe_experts = m.moe_experts;
    auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
    Placement p = plan_model_placement(*file, spec, devices, KvBudget{}, KvDtype::kF16);
    return load_model(file, std::move(p));
  }

  // A 13-token prefill (logits at every position), then four single-token steps.
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
};

TEST_F(PlacementTest, LogitsAreTheSameBitsUnderEveryMap) {
  int compared = 0;
  for (const Arch& a : archs()) {
    const bool moe = a.spec.num_experts > 0;
    for (const std::string& type : a.types) {
      const std::string path = model_in(a, type);
      const std::vector<float> want = run(*load(path));
      for (const Map& m : maps()) {
        if (m.moe_only && !moe) continue;
        DeviceRegistry devices;
        const std::unique_ptr<Model> model = load_mapped(path, m, devices);
        ASSERT_GT(model->placement().devices.size(), 1u);
        const std::vector<float> got = run(*model);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << a.name << " " << type << " map " << m.device_map << " " << m.moe_experts
            << " (max diff " << max_diff(got.data(), want.data(), static_cast<int64_t>(got.size())) << ")";
        ++compared;
      }
    }
  }
  std::printf("%d maps x models x types compared bit for bit\n", compared);
}

// Two sequences in one step, cut into two micro-batches in flight at once, give the logits of the
// step as one batch on one device.
TEST_F(PlacementTest, MicroBatchesInFlightGiveTheBatchsLogits) {
  for (const Arch& a : archs()) {
    const std::string path = write_model(a.name + "_mb.gguf", DType::kQ8_0, a.spec);
    const std::unique_ptr<Model> one = load(path);
    DeviceRegistry devices;
    const std::unique_ptr<Model> two = load_mapped(path, Map{"layers.0-1=guarded:0,layers.2-3=guarded:1", {}, {}},
                                                   devices);
    const int64_t vocab = one->config().num_vocab;
    const std::vector<int32_t> s0 = {3, 1, 4, 1, 5, 9, 2, 6}, s1 = {2, 7, 1, 8, 2, 8};
    const std::vector<int32_t> t0 = {0, 1}, t1 = {2, 3};  // block tables, blocks of 4 tokens
    BatchInput both;
    both.attention.block_size = 4;
    both.add_sequence(s0, 0, t0, BatchInput::Logits::kAll);
    both.add_sequence(s1, 0, t1, BatchInput::Logits::kAll);
    std::vector<float> want(static_cast<size_t>(both.logits_rows.size() * vocab));
    auto cache1 = one->new_kv_cache(4, 4, KvDtype::kF16);
    one->forward(both, *cache1, want.data());

    std::vector<BatchInput> mbs(2);
    for (BatchInput& b : mbs) b.attention.block_size = 4;
    mbs[0].add_sequence(s0, 0, t0, BatchInput::Logits::kAll);
    mbs[1].add_sequence(s1, 0, t1, BatchInput::Logits::kAll);
    std::vector<float> got(want.size());
    auto cache2 = two->new_kv_cache(4, 4, KvDtype::kF16);
    Executor executor(*two);
    executor.run(mbs, *cache2, got.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << a.name;
  }
}

// A part that throws fails its micro-batch (the error comes out of wait), and the executor and
// its devices go on working.
TEST_F(PlacementTest, AFailingMicroBatchFailsAloneAndTheNextRuns) {
  const std::string path = write_model("fail.gguf", DType::kF32, archs()[0].spec);
  DeviceRegistry devices;
  const std::unique_ptr<Model> model = load_mapped(path, Map{"layers.0-1=guarded:0,layers.2-3=guarded:1", {}, {}},
                                                   devices);
  auto cache = model->new_kv_cache(4, 4, KvDtype::kF16);
  const int64_t vocab = model->config().num_vocab;
  BatchInput bad;
  bad.attention.block_size = 4;
  const std::vector<int32_t> table = {0};
  bad.add_sequence(std::vector<int32_t>{1, 2}, 0, table, BatchInput::Logits::kLast);
  bad.logits_rows = {7};  // not a row of the batch: the head refuses it
  std::vector<float> logits(static_cast<size_t>(vocab));
  EXPECT_THROW(model->forward(bad, *cache, logits.data()), Error);
  BatchInput good;
  good.attention.block_size = 4;
  good.add_sequence(std::vector<int32_t>{1, 2}, 0, table, BatchInput::Logits::kLast);
  EXPECT_NO_THROW(model->forward(good, *cache, logits.data()));
}

// Two models over one device (a model replaced after a failover, whose last micro-batches are still
// on the spare's queue, and the new one, run on the caller's thread): their ops never interleave
// on the device (the guarded device refuses an op that begins while another caller's runs), and
// both give the logits they give alone.
TEST_F(PlacementTest, TwoModelsOnOneDeviceTakeTurns) {
  const std::string path = write_model("turns.gguf", DType::kQ8_0, archs()[0].spec);
  DeviceRegistry devices;
  const std::unique_ptr<Model> two = load_mapped(path, Map{"layers.0-1=guarded:0,layers.2-3=guarded:1", {}, {}},
                                                 devices);
  const std::unique_ptr<Model> solo = load_mapped(path, Map{"layers.0-3=guarded:0", {}, {}}, devices);
  ASSERT_EQ(solo->placement().devices.size(), 1u);
  ASSERT_EQ(solo->placement().devices[0].get(), two->placement().devices[0].get());
  const int64_t vocab = two->config().num_vocab;
  constexpr int kMicroBatches = 4, kTokens = 64, kBlock = 4;
  std::vector<BatchInput> mbs(kMicroBatches);
  std::vector<std::vector<int32_t>> tables(kMicroBatches);
  for (int m = 0; m < kMicroBatches; ++m) {
    std::vector<int32_t> tokens;
    for (int t = 0; t < kTokens; ++t) tokens.push_back((m * 31 + t * 7) % 200 + 1);
    for (int b = 0; b < kTokens / kBlock; ++b) tables[m].push_back(m * (kTokens / kBlock) + b);
    mbs[m].attention.block_size = kBlock;
    mbs[m].add_sequence(tokens, 0, tables[m], BatchInput::Logits::kLast);
  }
  const int64_t blocks = kMicroBatches * kTokens / kBlock;
  std::vector<float> want(static_cast<size_t>(kMicroBatches * vocab));
  {
    auto cache = solo->new_kv_cache(blocks, kBlock, KvDtype::kF16);
    for (int m = 0; m < kMicroBatches; ++m) solo->forward(mbs[m], *cache, want.data() + m * vocab);
  }
  auto cache_two = two->new_kv_cache(blocks, kBlock, KvDtype::kF16);
  auto cache_solo = solo->new_kv_cache(blocks, kBlock, KvDtype::kF16);
  for (int round = 0; round < 3; ++round) {
    std::vector<float> got_two(want.size()), got_solo(want.size());
    Executor executor(*two);
    std::vector<uint64_t> tickets;
    for (int m = 0; m < kMicroBatches; ++m) {
      tickets.push_back(executor.launch(mbs[m], *cache_two, {}, got_two.data() + m * vocab));
    }
    // Meanwhile, on this thread.
    for (int m = 0; m < kMicroBatches; ++m) {
      ASSERT_NO_THROW(solo->forward(mbs[m], *cache_solo, got_solo.data() + m * vocab)) << "round " << round;
    }
    for (uint64_t t : tickets) ASSERT_NO_THROW(executor.wait(t)) << "round " << round;
    EXPECT_EQ(std::memcmp(got_two.data(), want.data(), want.size() * sizeof(float)), 0) << "round " << round;
    EXPECT_EQ(std::memcmp(got_solo.data(), want.data(), want.size() * sizeof(float)), 0) << "round " << round;
  }
}

// --- bad maps -----------------------------------------------------------------------------

class BadMapTest : public ModelFileTest {
 protected:
  void SetUp() override {
    ModelFileTest::SetUp();
    llama_ = write_model("llama.gguf", DType::kQ8_0, four_layers("tiny"));
    moe_ = write_model("moe.gguf", DType::kQ8_0, four_layers("deepseek2-tiny-v3"));
  }

  // The map is refused with a message holding every one of `parts`, and no device was made.
  void expect_refused(const std::string& path, const std::string& device_map, std::vector<std::string> parts,
                      const std::vector<std::string>& override_tensor = {}, const std::string& moe_experts = "",
                      int64_t kv_bytes = 0) {
    DeviceRegistry devices;
    try {
      DeviceMapSpec spec;
      if (!device_map.empty()) parse_device_map(device_map, spec);
      for (const std::string& o : override_tensor) parse_override_tensor(o, spec);
      spec.moe_experts = moe_experts;
      const GgufFile file = GgufFile::open(path);
      plan_model_placement(file, spec, devices, KvBudget{kv_bytes, 0.3}, KvDtype::kF16);
      ADD_FAILURE() << "map '" << device_map << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      std::printf("refused: %s\n", e.what());
    }
    EXPECT_TRUE(devices.made().empty()) << "a device was made for a refused map";
  }

  std::string llama_, moe_;
};

TEST_F(BadMapTest, EveryBadMapIsRefusedBeforeLoading) {
  expect_refused(llama_, "layers.0-1=cpu:7,layers.2-3=cpu", {"layers.0-1", "cpu:7", "NUMA node 7"});
  expect_refused(llama_, "layers.0-1=gpu:0,layers.2-3=cpu", {"layers.0-1", "gpu:0", "not known"});
  if (!cuda_backend_built()) {
    expect_refused(llama_, "layers.0-1=cuda:0,layers.2-3=cpu", {"cuda:0", "no CUDA backend"});
  } else if (probe_cuda_devices().count == 0) {
    expect_refused(llama_, "layers.0-1=cuda:0,layers.2-3=cpu", {"cuda:0", "finds no GPU", "cudaGetDeviceCount"});
  }
  expect_refused(llama_, "layers.0-1=cpu[0],layers.2-3=cpu[4096]", {"cpu[4096]", "core 4096"});
  expect_refused(llama_, "layers.0-2=guarded:0,layers.2-3=guarded:1", {"layers.0-2", "layers.2-3", "both place layers 2"});
  expect_refused(llama_, "layers.0-0=guarded:0,layers.3-3=guarded:1", {"leaves layers 1-2 out", "4 layers"});
  expect_refused(llama_, "layers.0-1=guarded:0,layers.2-5=guarded:1", {"layers.2-5", "names layer 5", "4 layers (0-3)"});
  expect_refused(llama_, "layer.0-3=guarded:0", {"layer.0-3", "does not parse"});
  expect_refused(llama_, "layers.3-1=guarded:0", {"layers.3-1", "does not parse"});
  expect_refused(llama_, "embed=guarded:0,embed=guarded:1,layers.0-3=guarded:0", {"places embed twice"});
  expect_refused(llama_, "layers.0-1=cpu,layers.2-3=cpu[0]", {"cpu and cpu[0]", "share core 0"});
  expect_refused(llama_, "layers.0-3=guarded:0", {"'blk.0.ffn_gate.weight' on guarded:1", "blk.0 feed-forward"},
                 {"ffn_gate=guarded:1"});
  expect_refused(llama_, "layers.0-3=guarded:0", {"'ffn_.*_exps'", "matches no tensor"}, {"ffn_.*_exps=guarded:1"});
  const auto start = std::chrono::steady_clock::now();
  expect_refused(llama_, "layers.0-3=guarded:0", {"'(.*)*(.*)*(.*)*(.*)*z'", "matches no tensor"},
                 {"(.*)*(.*)*(.*)*(.*)*z=guarded:1"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  expect_refused(llama_, "", {"--moe-experts", "no routed experts"}, {}, "guarded:1");
  expect_refused(moe_, "layers.0-3=guarded:0", {"--moe-experts", "guarded:9x"}, {}, "guarded:9x");
  // More than a device's memory: a KV budget past the machine's.
  expect_refused(llama_, "layers.0-1=cpu[0],layers.2-3=cpu[1]", {"does not fit cpu[0]", "KV cache"}, {}, "",
                 int64_t{1} << 50);
}

TEST(DeviceMapText, ParsesEveryForm) {
  DeviceMapSpec s;
  parse_device_map("layers.0-11=cpu[0-3,8], transformer.layers.12-23 = cpu:1,embed=cpu", s);
  ASSERT_EQ(s.rules.size(), 3u);
  EXPECT_EQ(s.rules[0].key, "layers.0-11");
  EXPECT_EQ(s.rules[0].device, "cpu[0-3,8]");
  EXPECT_EQ(s.rules[1].key, "transformer.layers.12-23");
  EXPECT_EQ(s.rules[1].device, "cpu:1");
  DeviceMapSpec j;
  parse_device_map(R"({"model.layers.0-3": "cpu:0", "lm_head": "cpu:1"})", j);
  ASSERT_EQ(j.rules.size(), 2u);
  EXPECT_EQ(j.rules[1].key, "lm_head");
  DeviceMapSpec a;
  parse_device_map(" auto ", a);
  EXPECT_TRUE(a.automatic);
  DeviceMapSpec o;
  parse_override_tensor("ffn_.*_exps=cpu,blk\\.[0-9]{1,2}\\.attn_.*=cpu:1", o);
  ASSERT_EQ(o.tensor_rules.size(), 2u);
  EXPECT_EQ(o.tensor_rules[1].pattern, "blk\\.[0-9]{1,2}\\.attn_.*");
  DeviceMapSpec e;
  parse_override_tensor("a\\[1=cpu,b\\{=cpu:1", e);  // escaped brackets open nothing
  ASSERT_EQ(e.tensor_rules.size(), 2u);
  EXPECT_EQ(e.tensor_rules[1].device, "cpu:1");
  for (const char* bad : {"", "layers.0-3", "=cpu", "layers.0-3=", R"({"layers.0-3": 5})", "{not json"}) {
    DeviceMapSpec b;
    EXPECT_THROW(parse_device_map(bad, b), Error) << bad;
  }
  DeviceMapSpec b;
  EXPECT_THROW(parse_override_tensor("ffn_(=cpu", b), Error);
  // An unclosed bracket took the rest of the map with it, and the whole map was dropped: every
  // part went to the default device without a word.
  for (const char* bad : {"layers.0-3=cpu[0", "layers.0-1=cpu[0,layers.2-3=cpu"}) {
    DeviceMapSpec u;
    try {
      parse_device_map(bad, u);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("is not closed"), std::string::npos) << err.what();
    }
  }
  EXPECT_THROW(parse_override_tensor("ffn_[up=cpu", b), Error);
  // Patterns std::regex could not take: 20,000 nested groups overflowed its compiler's stack,
  // and nested unlimited repeats searched one name for minutes. Both are answered at once.
  const std::string nested = std::string(20000, '(') + "x" + std::string(20000, ')');
  try {
    parse_override_tensor(nested + "=cpu", b);
    ADD_FAILURE() << "20,000 nested groups were accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("too deeply nested"), std::string::npos) << err.what();
  }
  // A JSON key given twice is refused as the KEY=DEVICE form's is (the parse kept the last).
  DeviceMapSpec twice;
  try {
    parse_device_map(R"({"layers.0-3": "cpu", "embed": "cpu", "layers.0-3": "cpu:0"})", twice);
    ADD_FAILURE() << "a repeated JSON key was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("gives key 'layers.0-3' twice"), std::string::npos) << err.what();
  }
}

TEST(DeviceMapText, AutoSplitsByspeedWithinMemory) {
  EXPECT_EQ(split_layers(24, {1.0, 1.0}, {1000, 1000}, 10), (std::vector<int64_t>{12, 12}));
  EXPECT_EQ(split_layers(24, {3.0, 1.0}, {1000, 1000}, 10), (std::vector<int64_t>{18, 6}));
  EXPECT_EQ(split_layers(24, {3.0, 1.0}, {100, 1000}, 10), (std::vector<int64_t>{10, 14}));  // capped by memory
  EXPECT_EQ(split_layers(5, {1.0, 1.0, 1.0}, {1000, 1000, 1000}, 10), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_THROW(split_layers(24, {1.0, 1.0}, {100, 100}, 10), Error);
}

TEST_F(BadMapTest, ThePlanNamesEachDevicesPartsAndBytes) {
  DeviceRegistry devices;
  DeviceMapSpec spec;
  parse_device_map("embed=guarded:0,layers.0-1=guarded:0,layers.2-3=guarded:1", spec);
  spec.moe_experts = "guarded:2";
  const GgufFile file = GgufFile::open(moe_);
  const Placement p = plan_model_placement(file, spec, devices, KvBudget{}, KvDtype::kF16);
  const std::string plan = p.describe();
  std::printf("%s", plan.c_str());
  // In the order the forward pass reaches them; the experts' device holds no KV.
  EXPECT_NE(plan.find("guarded:0: embed, layers 0-1; weights"), std::string::npos) << plan;
  EXPECT_NE(plan.find("guarded:2: layers 1-3 (experts); weights"), std::string::npos) << plan;  // layer 0 is dense
  EXPECT_NE(plan.find("guarded:1: layers 2-3, lm_head; weights"), std::string::npos) << plan;
  ASSERT_EQ(p.devices.size(), 3u);
  EXPECT_EQ(p.devices[1]->name(), "guarded:2");
  EXPECT_EQ(p.kv_bytes_per_token[1], 0);
  EXPECT_EQ(p.kv_bytes_per_token[0], p.kv_bytes_per_token[2]);
  for (int64_t b : p.weight_bytes) EXPECT_GT(b, 0);
  // x into guarded:1 once; rows and routing out to the experts and their sum back, per MoE layer.
  EXPECT_EQ(p.num_copies, 1 + 2 * 3);
}

}  // namespace
}  // namespace duet
