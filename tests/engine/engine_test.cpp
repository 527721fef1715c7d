// The engine against itself and against straightforward references on a tiny f32 model: batched
// output equals one-at-a-time output, seeded sampling does not depend on the batch, and every
// path (prefix caching, chunked prefill, preemption, forks, beams, aborts) returns all blocks.
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "duet/backend/fault.h"

#include "duet/core/error.h"
#include "duet/core/random.h"
#include "engine_fixture.h"

namespace duet {
namespace {

using testing::expect_all_blocks_free;
using testing::Finished;
using testing::greedy;
using testing::id_of;
using testing::run_to_completion;
using testing::sixteen_prompts;
using testing::small_config;
using testing::tiny_model_path;
using testing::tiny_moe_model_path;

std::unique_ptr<LLMEngine> make_engine(const EngineConfig& c, const std::string& model = tiny_model_path()) {
  return std::make_unique<LLMEngine>(std::make_shared<const GgufFile>(GgufFile::open(model)), c);
}

// The process's mapped address space (VmSize), in bytes.
int64_t address_space_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmSize:", 0) == 0) {
      std::istringstream fields(line.substr(7));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

// How the model's parts are placed: all on cpu, or a device map (a pipeline of two devices keeps
// two steps in flight; routed experts on a device of their own).
struct Placed {
  const char* name;
  bool moe;
  const char* device_map;
  const char* moe_experts;
};

EngineConfig placed(EngineConfig c, const Placed& p) {
  if (*p.device_map != '\0') parse_device_map(p.device_map, c.device_map);
  c.device_map.moe_experts = p.moe_experts;
  return c;
}

// On the llama model and on the deepseek2 one (whose cache holds latents, not keys and values),
// on one device and under device maps. The guarded devices' memory is unreadable from the host.
class GreedyBatched : public ::testing::TestWithParam<Placed> {};

TEST_P(GreedyBatched, EqualsOneAtATime) {
  testing::expect_batched_equals_one_at_a_time(GetParam().moe ? tiny_moe_model_path() : tiny_model_path(),
                                               [this](EngineConfig c) { return placed(std::move(c), GetParam()); },
                                               /*place_reference=*/false);
}

INSTANTIATE_TEST_SUITE_P(
    Engine, GreedyBatched,
    ::testing::Values(Placed{"Llama", false, "", ""}, Placed{"Deepseek2", true, "", ""},
                      Placed{"LlamaTwoStages", false, "layers.0-0=guarded:0,layers.1-1=guarded:1", ""},
                      Placed{"LlamaTwoCoreSets", false, "layers.0-0=cpu[0],layers.1-1=cpu[1]", ""},
                      Placed{"Deepseek2TwoStages", true, "layers.0-1=guarded:0,layers.2-2=guarded:1", ""},
                      Placed{"Deepseek2ExpertsApart", true, "", "guarded:1"}),
    [](const ::testing::TestParamInfo<Placed>& p) { return std::string(p.param.name); });

// DeepSeek-V3.2's indexer keys are the cache's V rows: prefix caching, chunked prefill and a pool
// too small for every request keep them with the latents; also with its routed experts on a
// device of their own that the host cannot read (only the indexer's attention needs the host).
TEST(GreedyBatchedSparse, EqualsOneAtATime) {
  testing::expect_batched_equals_one_at_a_time(testing::tiny_sparse_model_path(), [](EngineConfig c) { return c; },
                                               /*place_reference=*/false);
  testing::expect_batched_equals_one_at_a_time(
      testing::tiny_sparse_model_path(),
      [](EngineConfig c) {
        c.device_map.moe_experts = "guarded:1";
        return c;
      },
      /*place_reference=*/false);
}

// The indexer chooses on the host: a device map putting its attention on a device the host cannot
// read is refused at load, naming the layer; its experts may go there.
TEST(SparseAttention, NeedsItsAttentionOnAHostDevice) {
  EngineConfig c = small_config();
  parse_device_map("layers.0-1=cpu,layers.2-2=guarded:0", c.device_map);
  try {
    make_engine(c, testing::tiny_sparse_model_path());
    FAIL() << "an indexer layer loaded on a guarded device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 2's attention is on guarded:0"), std::string::npos) << e.what();
  }
  EngineConfig experts_apart = small_config();
  experts_apart.device_map.moe_experts = "guarded:0";
  auto engine = make_engine(experts_apart, testing::tiny_sparse_model_path());
  engine->add_request("r", sixteen_prompts()[3], greedy(12));
  auto done = run_to_completion(*engine);
  ASSERT_TRUE(done["r"].saw_finish);
  EXPECT_TRUE(done["r"].error.empty()) << done["r"].error;
}

// A device that fails, or hangs, mid-generation under 16 requests: its parts move to the other
// device (weights loaded again), every request is recomputed, and each greedy output is the one
// of a run without the fault: nothing lost, nothing answered twice.
struct Fault {
  const char* name;
  bool moe;
  const char* device_map;
  const char* moe_experts;
  const char* fault;
};
class FailingOver : public ::testing::TestWithParam<Fault> {};

TEST_P(FailingOver, EveryRequestEndsAsWithoutTheFault) {
  const Fault& f = GetParam();
  const std::string model = f.moe ? tiny_moe_model_path() : tiny_model_path();
  const std::vector<std::vector<int32_t>> prompts = sixteen_prompts();
  EngineConfig c = small_config();
  if (*f.device_map != '\0') parse_device_map(f.device_map, c.device_map);
  c.device_map.moe_experts = f.moe_experts;
  c.health_check_timeout = 0.5;
  const auto run = [&](LLMEngine& engine) {
    for (size_t i = 0; i < prompts.size(); ++i) engine.add_request(id_of(i), prompts[i], greedy(12));
    return run_to_completion(engine);
  };
  auto reference = make_engine(c, model);
  auto expected = run(*reference);

  auto engine = make_engine(c, model);
  const std::string failing = engine->placement().devices.back()->name();
  arm_fault(parse_fault_spec(fmt::format("device={};step=5;{}", failing, f.fault)));
  const auto start = std::chrono::steady_clock::now();
  auto done = run(*engine);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(done[id_of(i)].saw_finish) << i;
    EXPECT_TRUE(done[id_of(i)].error.empty()) << i << ": " << done[id_of(i)].error;
    ASSERT_EQ(done[id_of(i)].outputs.size(), 1u);
    EXPECT_EQ(done[id_of(i)].outputs[0].token_ids, expected[id_of(i)].outputs.at(0).token_ids) << i;
  }
  const EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.device_failovers_total, 1);
  const auto failed = std::find_if(m.devices.begin(), m.devices.end(), [&](const auto& d) { return d.name == failing; });
  ASSERT_NE(failed, m.devices.end());
  EXPECT_TRUE(failed->failed);
  EXPECT_FALSE(failed->failure.empty());
  ASSERT_EQ(engine->placement().devices.size(), 1u);
  EXPECT_NE(engine->placement().devices[0]->name(), failing);
  EXPECT_GT(m.preemptions_total, 0);
  EXPECT_LT(took, 30.0);
  expect_all_blocks_free(*engine);
  std::printf("%s: 16 requests with the fault in %.2f s\n", f.name, took);
}

INSTANTIATE_TEST_SUITE_P(
    Engine, FailingOver,
    ::testing::Values(Fault{"LlamaFails", false, "layers.0-0=guarded:0,layers.1-1=guarded:1", "", "mode=fail"},
                      Fault{"LlamaHangs", false, "layers.0-0=guarded:0,layers.1-1=guarded:1", "", "mode=hang"},
                      Fault{"Deepseek2ExpertsFail", true, "", "guarded:1", "mode=fail"}),
    [](const ::testing::TestParamInfo<Fault>& p) { return std::string(p.param.name); });

TEST(Engine, SeededSamplingDoesNotDependOnTheBatch) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 5;
  p.max_tokens = 16;
  p.ignore_eos = true;
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  auto alone = make_engine(small_config());
  alone->add_request("x", prompt, p);
  const std::vector<int32_t> expected = run_to_completion(*alone)["x"].outputs.at(0).token_ids;

  for (int32_t budget : {2048, 3}) {
    EngineConfig c = small_config();
    c.scheduler.max_num_batched_tokens = budget;
    auto engine = make_engine(c);
    const auto others = sixteen_prompts();
    for (size_t i = 0; i < 7; ++i) {
      SamplingParams q = p;
      q.seed = 100 + i;
      q.temperature = 0.7f;
      engine->add_request(id_of(i), others[i], q);
    }
    engine->add_request("x", prompt, p);
    auto done = run_to_completion(*engine);
    EXPECT_EQ(done["x"].outputs.at(0).token_ids, expected) << "budget " << budget;
  }
  // A different seed gives a different sequence.
  SamplingParams q = p;
  q.seed = 6;
  alone->add_request("y", prompt, q);
  EXPECT_NE(run_to_completion(*alone)["y"].outputs.at(0).token_ids, expected);
}

TEST(Engine, StopStringsSplitAcrossTokensAreCaught) {
  auto engine = make_engine(small_config());
  const std::vector<int32_t> prompt = engine->tokenizer().encode("def main():\n    return", true, false);
  engine->add_request("full", prompt, greedy(24));
  const CompletionDelta full = run_to_completion(*engine)["full"].outputs.at(0);
  // A stop string made of the last character one token emitted and the first two characters
  // that come after it, whose first occurrence in the text is exactly there.
  IncrementalDetokenizer detok(engine->tokenizer());
  std::string text;
  std::string stop;
  size_t at = std::string::npos;
  for (size_t k = 0; k + 1 < full.token_ids.size() && stop.empty(); ++k) {
    text += detok.push(full.token_ids[k]);
    if (text.empty() || text.size() + 2 > full.text.size()) continue;
    const std::string candidate = full.text.substr(text.size() - 1, 3);
    const bool ascii = std::all_of(candidate.begin(), candidate.end(), [](char c) { return c > ' ' && c < 127; });
    if (ascii && full.text.find(candidate) == text.size() - 1) {
      stop = candidate;
      at = text.size() - 1;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no stop string spanning two tokens in: " << full.text;
  for (bool include : {false, true}) {
    SamplingParams p = greedy(24);
    p.stop = {"never matches this", stop};
    p.include_stop_str_in_output = include;
    engine->add_request("stopped", prompt, p);
    const CompletionDelta got = run_to_completion(*engine)["stopped"].outputs.at(0);
    EXPECT_EQ(got.text, full.text.substr(0, at + (include ? stop.size() : 0))) << "include " << include;
    EXPECT_EQ(got.finish_reason, FinishReason::kStop);
    EXPECT_EQ(got.stop_reason, stop);
    EXPECT_LT(got.token_ids.size(), full.token_ids.size());
  }
  expect_all_blocks_free(*engine);
}

TEST(Engine, ParallelSamplingSharesThePromptAndMatchesSingleRequests) {
  auto engine = make_engine(small_config());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 37) % 380);
  SamplingParams p;
  p.n = 3;
  p.seed = 11;
  p.temperature = 1.0f;
  p.max_tokens = 8;
  p.ignore_eos = true;
  engine->add_request("n3", prompt, p);
  int32_t peak_blocks = 0;
  std::map<std::string, Finished> done;
  while (engine->has_unfinished()) {
    for (RequestOutput& o : engine->step()) {
      for (CompletionDelta& d : o.outputs) {
        auto& outs = done[o.request_id].outputs;
        if (outs.size() <= static_cast<size_t>(d.index)) outs.resize(static_cast<size_t>(d.index) + 1);
        auto& acc = outs[static_cast<size_t>(d.index)];
        acc.token_ids.insert(acc.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
      }
    }
    peak_blocks = std::max(peak_blocks, engine->kv_cache().stats().num_used_blocks);
  }
  ASSERT_EQ(done["n3"].outputs.size(), 3u);
  // 40 prompt tokens are 10 blocks of 4, shared; 3 choices of 8 tokens need 2-3 blocks each.
  EXPECT_LE(peak_blocks, 10 + 3 * 3);
  // Choice i samples with its own generator, seeded with seed + i * 0x9e3779b97f4a7c15.
  for (int32_t i = 0; i < 3; ++i) {
    SamplingParams single = p;
    single.n = 1;
    single.seed = 11 + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i);
    engine->add_request("single", prompt, single);
    EXPECT_EQ(run_to_completion(*engine)["single"].outputs.at(0).token_ids,
              done["n3"].outputs[static_cast<size_t>(i)].token_ids)
        << "choice " << i;
  }
  std::set<std::vector<int32_t>> distinct;
  for (const auto& o : done["n3"].outputs) distinct.insert(o.token_ids);
  EXPECT_EQ(distinct.size(), 3u);
  expect_all_blocks_free(*engine);
}

// best_of: the n candidates of the highest log probability per token, out of best_of drawn as n
// choices would be, reported whole once all have finished, with none of the others' tokens.
TEST(Engine, BestOfReturnsTheCandidatesWithTheHighestLogprobPerToken) {
  auto engine = make_engine(small_config());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back((i * 53) % 380);
  SamplingParams all;
  all.n = 6;
  all.seed = 5;
  all.temperature = 1.3f;
  all.max_tokens = 9;
  all.ignore_eos = true;
  // Candidates of different lengths: a few ids end one.
  for (int32_t t = 0; t < 380; t += 23) all.stop_token_ids.push_back(t);
  all.logprobs = 0;
  engine->add_request("all", prompt, all);
  const std::vector<CompletionDelta> candidates = run_to_completion(*engine)["all"].outputs;
  ASSERT_EQ(candidates.size(), 6u);
  std::vector<std::pair<double, size_t>> ranked;
  std::set<size_t> lengths;
  for (size_t i = 0; i < candidates.size(); ++i) {
    double sum = 0.0;
    for (const SampledToken& t : candidates[i].logprobs) sum += t.logprob;
    ranked.emplace_back(-sum / static_cast<double>(candidates[i].token_ids.size()), i);
    lengths.insert(candidates[i].token_ids.size());
  }
  EXPECT_GT(lengths.size(), 1u) << "the candidates should differ in length";
  std::stable_sort(ranked.begin(), ranked.end());
  EXPECT_NE((std::set<size_t>{ranked[0].second, ranked[1].second}), (std::set<size_t>{0, 1}))
      << "the best should not be the first drawn, or the ranking is not seen";

  SamplingParams best = all;
  best.logprobs.reset();
  best.n = 2;
  best.best_of = 6;
  engine->add_request("best", prompt, best);
  std::vector<CompletionDelta> got;
  while (engine->has_unfinished()) {
    for (RequestOutput& o : engine->step()) {
      if (!o.finished) {
        EXPECT_TRUE(o.outputs.empty()) << "nothing is reported before every candidate has finished";
      }
      for (CompletionDelta& d : o.outputs) got.push_back(d);
    }
  }
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const CompletionDelta& want = candidates[ranked[i].second];
    EXPECT_EQ(got[i].index, static_cast<int32_t>(i));
    EXPECT_EQ(got[i].token_ids, want.token_ids) << "choice " << i;
    EXPECT_EQ(got[i].text, want.text);
    EXPECT_EQ(got[i].finish_reason, want.finish_reason);
    EXPECT_TRUE(got[i].logprobs.empty());
    EXPECT_NEAR(got[i].cumulative_logprob, -ranked[i].first * static_cast<double>(want.token_ids.size()), 1e-6);
  }
  // With logprobs asked for, each chosen candidate's come whole.
  best.logprobs = 1;
  engine->add_request("best_lp", prompt, best);
  const std::vector<CompletionDelta> with_lp = run_to_completion(*engine)["best_lp"].outputs;
  ASSERT_EQ(with_lp.size(), 2u);
  EXPECT_EQ(with_lp[0].token_ids, got[0].token_ids);
  EXPECT_EQ(with_lp[0].logprobs.size(), with_lp[0].token_ids.size());
  expect_all_blocks_free(*engine);
  // Refused: fewer candidates than choices, more than the engine runs at once, with beams.
  best.logprobs.reset();
  best.best_of = 1;
  EXPECT_THROW(engine->add_request("few", prompt, best), Error);
  best.best_of = 10000;
  EXPECT_THROW(engine->add_request("many", prompt, best), Error);
  best.best_of = 4;
  best.use_beam_search = true;
  best.temperature = 0.0f;
  EXPECT_THROW(engine->add_request("beams", prompt, best), Error);
}

// Beam search written the plain way: every beam recomputes its whole sequence, no cache
// sharing, no forks.
struct RefHypothesis {
  std::vector<int32_t> tokens;
  double cumulative = 0.0;
  double score = 0.0;
};

std::vector<RefHypothesis> reference_beam_search(Model& model, const std::vector<int32_t>& prompt, int32_t width,
                                                 int32_t max_tokens, float length_penalty,
                                                 const std::vector<int32_t>& eos) {
  const int64_t vocab = model.config().num_vocab;
  auto score = [&](double cum, int64_t len) { return cum / std::pow(static_cast<double>(len), length_penalty); };
  std::vector<RefHypothesis> beams = {RefHypothesis{}};
  std::vector<RefHypothesis> finished;
  for (int32_t step = 1;; ++step) {
    struct Cand {
      size_t beam;
      int32_t token;
      double cumulative;
    };
    std::vector<Cand> cands;
    for (size_t b = 0; b < beams.size(); ++b) {
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), beams[b].tokens.begin(), beams[b].tokens.end());
      SequenceRunner runner(model, static_cast<int64_t>(seq.size()));
      std::vector<float> logits(static_cast<size_t>(vocab));
      runner.forward(seq, 0, logits.data(), false);
      for (const TokenLogprob& t : Sampler::top_logprobs(logits, 2 * width)) {
        cands.push_back(Cand{b, t.token_id, beams[b].cumulative + t.logprob});
      }
    }
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.cumulative > b.cumulative; });
    std::vector<RefHypothesis> next;
    for (size_t rank = 0; rank < cands.size() && static_cast<int32_t>(next.size()) < width; ++rank) {
      RefHypothesis h = beams[cands[rank].beam];
      h.tokens.push_back(cands[rank].token);
      h.cumulative = cands[rank].cumulative;
      h.score = score(h.cumulative, step);
      if (std::find(eos.begin(), eos.end(), cands[rank].token) != eos.end()) {
        if (static_cast<int32_t>(rank) < width) finished.push_back(h);
        continue;
      }
      next.push_back(h);
    }
    std::stable_sort(finished.begin(), finished.end(), [](const auto& a, const auto& b) { return a.score > b.score; });
    bool done = next.empty() || step >= max_tokens;
    if (!done && static_cast<int32_t>(finished.size()) >= width) {
      double best_live = -INFINITY;
      for (const auto& h : next) best_live = std::max(best_live, h.score);
      done = best_live <= finished[static_cast<size_t>(width) - 1].score;
    }
    if (done && step >= max_tokens) {
      finished.insert(finished.end(), next.begin(), next.end());
      std::stable_sort(finished.begin(), finished.end(), [](const auto& a, const auto& b) { return a.score > b.score; });
    }
    if (done) break;
    beams = next;
  }
  finished.resize(std::min<size_t>(finished.size(), static_cast<size_t>(width)));
  return finished;
}

TEST(Engine, BeamSearchMatchesAStraightforwardReference) {
  auto file = std::make_shared<const GgufFile>(GgufFile::open(tiny_model_path()));
  auto backend = make_cpu_backend(1);
  auto model = load_model(file, *backend);
  for (float length_penalty : {1.0f, 0.5f}) {
    for (int32_t width : {1, 3}) {
      auto engine = make_engine(small_config());
      const std::vector<int32_t> prompt = {10, 20, 30, 40, 50, 60, 70};
      SamplingParams p;
      p.use_beam_search = true;
      p.n = width;
      p.max_tokens = 7;
      p.length_penalty = length_penalty;
      engine->add_request("beam", prompt, p);
      const Finished got = run_to_completion(*engine)["beam"];
      const std::vector<RefHypothesis> want =
          reference_beam_search(*model, prompt, width, 7, length_penalty, engine->tokenizer().stop_ids());
      ASSERT_EQ(got.outputs.size(), want.size()) << "width " << width;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got.outputs[i].token_ids, want[i].tokens) << "width " << width << " lp " << length_penalty << " #" << i;
        EXPECT_NEAR(got.outputs[i].cumulative_logprob, want[i].cumulative, 1e-4);
      }
      expect_all_blocks_free(*engine);
    }
  }
}

// Also with two steps in flight on a pipeline of two devices (an abort of a request in flight
// waits for its step).
class Aborting : public ::testing::TestWithParam<const char*> {};

TEST_P(Aborting, AtRandomPointsLeavesNoBlocksInUse) {
  Rng rng(99);
  for (int round = 0; round < 3; ++round) {
    EngineConfig c = small_config(round == 0 ? 4096 : 60 * 4);
    c.scheduler.max_num_batched_tokens = round == 2 ? 9 : 2048;
    if (*GetParam() != '\0') parse_device_map(GetParam(), c.device_map);
    auto engine = make_engine(c);
    const auto prompts = sixteen_prompts();
    std::set<std::string> open;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SamplingParams p;
      p.max_tokens = 4 + static_cast<int32_t>(rng.next() % 20);
      p.ignore_eos = true;
      p.seed = i;
      if (i % 5 == 1) p.n = 2;
      if (i % 7 == 3) {
        p.use_beam_search = true;
        p.n = 2;
      }
      engine->add_request(id_of(i), prompts[i], p);
      open.insert(id_of(i));
    }
    std::map<std::string, bool> finished;
    while (engine->has_unfinished()) {
      if (!open.empty() && rng.next() % 3 == 0) {
        auto it = open.begin();
        std::advance(it, static_cast<long>(rng.next() % open.size()));
        EXPECT_TRUE(engine->abort_request(*it));
        open.erase(it);
      }
      for (const RequestOutput& o : engine->step()) {
        if (o.finished) {
          EXPECT_FALSE(finished[o.request_id]) << "finished twice: " << o.request_id;
          finished[o.request_id] = true;
          open.erase(o.request_id);
        }
      }
    }
    EXPECT_EQ(finished.size(), prompts.size()) << "round " << round;
    EXPECT_FALSE(engine->abort_request("r0"));
    expect_all_blocks_free(*engine);
  }
}

INSTANTIATE_TEST_SUITE_P(Engine, Aborting, ::testing::Values("", "layers.0-0=guarded:0,layers.1-1=guarded:1"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(*p.param == '\0' ? "OneDevice" : "TwoStages");
                         });

TEST(Engine, PriorityPolicyRunsLowerValuesFirst) {
  EngineConfig c = small_config();
  c.scheduler.max_num_seqs = 1;
  c.scheduler.policy = SchedulingPolicy::kPriority;
  auto engine = make_engine(c);
  engine->add_request("late", {1, 2, 3}, greedy(3), 5);
  engine->add_request("first", {4, 5, 6}, greedy(3), 0);
  engine->add_request("second", {7, 8, 9}, greedy(3), 1);
  std::vector<std::string> order;
  while (engine->has_unfinished()) {
    for (const RequestOutput& o : engine->step()) {
      if (o.finished) order.push_back(o.request_id);
    }
  }
  EXPECT_EQ(order, (std::vector<std::string>{"first", "second", "late"}));
}

TEST(Engine, BadRequestsAreRefusedOrFailAloneWhileOthersFinish) {
  EngineConfig c = small_config(8 * 4);  // 8 blocks of 4 tokens
  c.max_model_len = 64;
  auto engine = make_engine(c);
  try {
    engine->add_request("long", std::vector<int32_t>(64, 5), greedy(4));
    FAIL() << "a prompt as long as the context was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("64"), std::string::npos) << e.what();
  }
  SamplingParams bad = greedy(4);
  bad.top_p = 2.0f;
  EXPECT_THROW(engine->add_request("bad", {1}, bad), Error);
  EXPECT_THROW(engine->add_request("empty", {}, greedy(4)), Error);
  EXPECT_THROW(engine->add_request("oov", {1, 100000}, greedy(4)), Error);
  // Fits to start, but cannot grow inside 8 blocks: it must end with an error, alone.
  engine->add_request("grows", std::vector<int32_t>(27, 3), greedy(30));
  engine->add_request("fine", {1, 2, 3}, greedy(3));
  EXPECT_THROW(engine->add_request("fine", {1}, greedy(1)), Error);  // id in use
  auto done = run_to_completion(*engine, 10000);
  EXPECT_FALSE(engine->has_unfinished());
  EXPECT_FALSE(done["grows"].error.empty());
  EXPECT_TRUE(done["fine"].error.empty());
  EXPECT_EQ(done["fine"].outputs.at(0).token_ids.size(), 3u);
  expect_all_blocks_free(*engine);
}

// A failure while one request's output is made (here: its sampled token is a padding row of the
// model's logits, which the tokenizer has no text for, so the detokenizer throws) fails that
// request alone: the step returns, the request ends with an error and frees its blocks, and the
// requests beside it go on to their ends. Once, such a throw left step() and the server marked
// the whole engine failed.
TEST(Engine, AFailureInOneRequestsOutputFailsThatRequestAlone) {
  auto engine = make_engine(small_config(), testing::padded_vocab_model_path());
  ASSERT_GT(engine->model_config().num_vocab, engine->tokenizer().vocab_size());
  const int32_t padding = static_cast<int32_t>(engine->tokenizer().vocab_size()) + 3;
  SamplingParams forced = greedy(6);
  forced.logit_bias = {{padding, 100.0f}};
  engine->add_request("before", {1, 2, 3}, greedy(8));
  engine->add_request("padded", {4, 5, 6}, forced);
  engine->add_request("after", {7, 8}, greedy(8));
  std::map<std::string, Finished> done;
  EXPECT_NO_THROW(done = run_to_completion(*engine, 1000));
  EXPECT_FALSE(engine->has_unfinished());
  ASSERT_TRUE(done["padded"].saw_finish);
  EXPECT_NE(done["padded"].error.find(std::to_string(padding)), std::string::npos) << done["padded"].error;
  ASSERT_FALSE(done["padded"].outputs.empty());
  EXPECT_EQ(done["padded"].outputs[0].finish_reason, FinishReason::kError);
  for (const char* id : {"before", "after"}) {
    EXPECT_TRUE(done[id].error.empty()) << id << ": " << done[id].error;
    ASSERT_EQ(done[id].outputs.size(), 1u) << id;
    EXPECT_EQ(done[id].outputs[0].token_ids.size(), 8u) << id;
  }
  expect_all_blocks_free(*engine);
  EXPECT_EQ(engine->metrics().requests_finished_total.at("error"), 1);
  // The engine takes new requests as before.
  engine->add_request("later", {9}, greedy(2));
  EXPECT_EQ(run_to_completion(*engine)["later"].outputs.at(0).token_ids.size(), 2u);
}

// Ends the child of a death test at once (no test teardown), removing the model file it wrote.
[[noreturn]] void child_exit(int code) {
  std::error_code ec;
  std::filesystem::remove(tiny_model_path(), ec);
  std::_Exit(code);
}

// Memory that runs out while a step computes fails that step's requests, cleanly: the process goes
// on, their blocks are freed, and the engine serves the next request. Run in a child process
// whose address space is capped (RLIMIT_AS) just above what it holds before a long prompt's step.

void out_of_memory_step_child(const char* device_map) {
  EngineConfig c = small_config();
  c.scheduler.max_num_batched_tokens = 4096;
  c.max_model_len = 4096;
  if (*device_map != '\0') parse_device_map(device_map, c.device_map);
  auto engine = make_engine(c);
  engine->add_request("warm", {1, 2, 3}, greedy(2));
  run_to_completion(*engine);
  std::vector<int32_t> long_prompt(2000);
  for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = static_cast<int32_t>(i % 300);
  engine->add_request("long", long_prompt, greedy(2));
  rlimit saved{};
  getrlimit(RLIMIT_AS, &saved);
  rlimit capped = saved;
  capped.rlim_cur = static_cast<rlim_t>(address_space_bytes() + (4 << 20));
  if (setrlimit(RLIMIT_AS, &capped) != 0) child_exit(3);
  std::map<std::string, Finished> done;
  try {
    done = run_to_completion(*engine, 100);
  } catch (...) {
    child_exit(4);  // the step's failure left step()
  }
  setrlimit(RLIMIT_AS, &saved);
  if (!done["long"].saw_finish || done["long"].error.find("long") == std::string::npos) {
    std::fprintf(stderr, "long: finished %d, error '%s'\n", done["long"].saw_finish ? 1 : 0, done["long"].error.c_str());
    child_exit(5);
  }
  if (engine->kv_cache().stats().num_used_blocks != 0) child_exit(6);
  engine->add_request("after", {4, 5}, greedy(3));
  if (run_to_completion(*engine)["after"].outputs.at(0).token_ids.size() != 3) child_exit(7);
  child_exit(0);
}

TEST(EngineDeathTest, AnOutOfMemoryStepFailsItsRequestsAndTheEngineGoesOn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(out_of_memory_step_child(""), ::testing::ExitedWithCode(0), "");
}

// The same when the step runs as micro-batches on two devices' queues: the failure is carried
// from the queue that ran out to the step's finish, and only that step's requests fail. (CPU core
// sets: a guarded device reserves its memory up front, so the cap would not bite there.)
TEST(EngineDeathTest, AnOutOfMemoryStepOnTwoStagesFailsItsRequestsAndTheEngineGoesOn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(out_of_memory_step_child("layers.0-0=cpu[0],layers.1-1=cpu[1]"), ::testing::ExitedWithCode(0), "");
}

TEST(Engine, MetricsCountWhatRan) {
  auto engine = make_engine(small_config());
  const auto prompts = sixteen_prompts();
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < 4; ++i) {
    engine->add_request(id_of(i), prompts[i], greedy(5));
    prompt_tokens += static_cast<int64_t>(prompts[i].size());
  }
  run_to_completion(*engine);
  const EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.prompt_tokens_total, prompt_tokens);
  EXPECT_EQ(m.generation_tokens_total, 4 * 5);
  EXPECT_EQ(m.requests_finished_total.at("length"), 4);
  EXPECT_EQ(m.time_to_first_token.count(), 4);
  EXPECT_EQ(m.e2e_request_latency.count(), 4);
  EXPECT_EQ(m.request_generation_tokens.sum(), 20.0);
  // Every prompt token and every output token but the last went through a step.
  EXPECT_EQ(m.iteration_tokens.sum(), static_cast<double>(prompt_tokens + 4 * 4));
  EXPECT_GE(m.iteration_tokens.count(), 5);
  EXPECT_EQ(m.time_per_output_token.count(), 4);
  EXPECT_EQ(m.inter_token_latency.count(), 4 * 4);
  EXPECT_EQ(m.num_requests_running, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_GT(m.prefix_cache_queries_total, 0);
}

TEST(Engine, LogprobsAndMinTokens) {
  auto engine = make_engine(small_config());
  SamplingParams p = greedy(6);
  p.logprobs = 3;
  p.ignore_eos = false;
  p.min_tokens = 6;
  engine->add_request("lp", {5, 6, 7}, p);
  const CompletionDelta out = run_to_completion(*engine)["lp"].outputs.at(0);
  ASSERT_EQ(out.token_ids.size(), 6u);  // min_tokens = max_tokens: no early eos
  ASSERT_EQ(out.logprobs.size(), 6u);
  double cumulative = 0.0;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(out.logprobs[i].token_id, out.token_ids[i]);
    ASSERT_EQ(out.logprobs[i].top.size(), 3u);
    EXPECT_EQ(out.logprobs[i].top[0].token_id, out.token_ids[i]);  // greedy picks the most likely
    EXPECT_LE(out.logprobs[i].logprob, 0.0f);
    cumulative += out.logprobs[i].logprob;
  }
  EXPECT_NEAR(out.cumulative_logprob, cumulative, 1e-4);
}

// Prompt logprobs: each position once, whatever the chunking, the preemptions (a tiny KV pool
// recomputes prompts) and the prefix cache, the same as one request computed whole alone; and
// against the logits of the prompt's rows straight from the model.
TEST(Engine, PromptLogprobsAreTheSameUnderChunksPreemptionAndTheCache) {
  const std::vector<std::vector<int32_t>> prompts = sixteen_prompts();
  auto request = [](int32_t i) {
    SamplingParams p = greedy(12);
    p.prompt_logprobs = 2;
    if (i % 5 == 1) p.n = 2;
    if (i % 7 == 3) {
      p.use_beam_search = true;
      p.n = 2;
    }
    return p;
  };
  EngineConfig whole = small_config();
  whole.enable_prefix_caching = false;
  auto alone = make_engine(whole);
  std::vector<Finished> expected;
  for (size_t i = 0; i < prompts.size(); ++i) {
    alone->add_request(id_of(i), prompts[i], request(static_cast<int32_t>(i)));
    expected.push_back(run_to_completion(*alone)[id_of(i)]);
    ASSERT_EQ(expected.back().prompt_logprob_outputs, 1) << i;
    ASSERT_EQ(expected.back().prompt_logprobs.size(), prompts[i].size() - 1) << i;
  }
  // The reference of the reference: the model's logits for every row of one prompt.
  {
    auto backend = make_cpu_backend(1);
    auto model = load_model(std::make_shared<const GgufFile>(GgufFile::open(tiny_model_path())), *backend);
    const std::vector<int32_t>& p = prompts[3];
    const size_t vocab = static_cast<size_t>(model->config().num_vocab);
    std::vector<float> logits(p.size() * vocab);
    SequenceRunner runner(*model, static_cast<int64_t>(p.size()));
    runner.forward(p, 0, logits.data(), true);
    for (size_t i = 1; i < p.size(); ++i) {
      const float* row = logits.data() + (i - 1) * vocab;
      const float m = *std::max_element(row, row + vocab);
      double sum = 0.0;
      for (size_t t = 0; t < vocab; ++t) sum += std::exp(static_cast<double>(row[t]) - m);
      const PromptLogprob& got = expected[3].prompt_logprobs[i - 1];
      EXPECT_EQ(got.token_id, p[i]);
      EXPECT_NEAR(got.logprob, row[p[i]] - m - std::log(sum), 1e-4) << i;
      EXPECT_EQ(got.rank, 1 + std::count_if(row, row + vocab, [&](float v) { return v > row[p[i]]; })) << i;
      ASSERT_EQ(got.top.size(), 2u);
      EXPECT_EQ(got.top[0].token_id, static_cast<int32_t>(std::max_element(row, row + vocab) - row)) << i;
    }
  }
  EngineConfig tight = small_config(40 * 4);
  tight.scheduler.max_num_batched_tokens = 16;
  auto engine = make_engine(tight);
  // A first request without prompt logprobs leaves its prompt in the cache.
  engine->add_request("cached", prompts[0], greedy(2));
  run_to_completion(*engine);
  for (size_t i = 0; i < prompts.size(); ++i) engine->add_request(id_of(i), prompts[i], request(static_cast<int32_t>(i)));
  auto done = run_to_completion(*engine);
  EXPECT_GT(engine->metrics().preemptions_total, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Finished& f = done[id_of(i)];
    ASSERT_TRUE(f.saw_finish) << i;
    EXPECT_EQ(f.prompt_logprob_outputs, 1) << i;
    ASSERT_EQ(f.prompt_logprobs.size(), expected[i].prompt_logprobs.size()) << i;
    for (size_t k = 0; k < f.prompt_logprobs.size(); ++k) {
      const PromptLogprob& a = f.prompt_logprobs[k];
      const PromptLogprob& b = expected[i].prompt_logprobs[k];
      EXPECT_EQ(a.token_id, b.token_id) << i << " " << k;
      EXPECT_NEAR(a.logprob, b.logprob, 1e-4) << i << " " << k;
      EXPECT_EQ(a.rank, b.rank) << i << " " << k;
      ASSERT_EQ(a.top.size(), 2u);
      EXPECT_EQ(a.top[0].token_id, b.top[0].token_id) << i << " " << k;
    }
    ASSERT_EQ(f.outputs.size(), expected[i].outputs.size()) << i;
    for (size_t c = 0; c < f.outputs.size(); ++c) EXPECT_EQ(f.outputs[c].token_ids, expected[i].outputs[c].token_ids) << i;
  }
  expect_all_blocks_free(*engine);
}

}  // namespace
}  // namespace duet
