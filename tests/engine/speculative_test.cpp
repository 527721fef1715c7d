// Speculative decoding against decoding without it: greedy and seeded outputs are the same token
// for token (on llama and on deepseek2), the sampled distribution is the same by a chi-square
// test over many unseeded runs, and drafts are counted in the metrics. The prompts repeat
// themselves, so prompt lookup finds drafts.
#include <cmath>
#include <cstdio>
#include <map>

#include <gtest/gtest.h>

#include "duet/engine/speculative.h"
#include "duet/grammar/structured_output.h"
#include "duet/model/placement.h"
#include "engine_fixture.h"

namespace duet {
namespace {

using testing::Finished;
using testing::run_to_completion;
using testing::small_config;
using testing::tiny_model_path;
using testing::tiny_moe_model_path;
using testing::tiny_mtp_model_path;

std::unique_ptr<LLMEngine> make_engine(const std::string& model, int32_t k, int64_t kv_tokens = 4096,
                                       const char* device_map = "",
                                       SpeculativeMethod method = SpeculativeMethod::kNgram) {
  EngineConfig c = small_config(kv_tokens);
  if (*device_map != '\0') parse_device_map(device_map, c.device_map);
  if (k > 0) {
    c.speculative.method = method;
    c.speculative.num_speculative_tokens = k;
    c.speculative.prompt_lookup_min = 1;
  }
  return std::make_unique<LLMEngine>(std::make_shared<const GgufFile>(GgufFile::open(model)), c);
}

// Prompts that repeat a phrase, as code under edit repeats itself.
std::vector<std::vector<int32_t>> repeating_prompts(const Tokenizer& tok) {
  std::vector<std::vector<int32_t>> out;
  for (const char* text : {"def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
                           "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(",
                           "the cache holds the blocks; the cache holds the", "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n"}) {
    out.push_back(tok.encode(text, true, false));
  }
  return out;
}

std::map<std::string, Finished> run(LLMEngine& e, const std::vector<std::vector<int32_t>>& prompts,
                                    const SamplingParams& p) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams q = p;
    if (p.seed) q.seed = *p.seed + i;
    e.add_request("r" + std::to_string(i), prompts[i], q);
  }
  return run_to_completion(e);
}

// On llama and deepseek2, on one device and on a pipeline of two (two steps in flight: a request
// in flight gets no drafts until its step is verified).
struct Placed {
  const char* name;
  bool moe;
  const char* device_map;
};

class SameOutput : public ::testing::TestWithParam<Placed> {};

TEST_P(SameOutput, GreedyAndSeededOutputsEqualDecodingWithoutDrafts) {
  const std::string model = GetParam().moe ? tiny_moe_model_path() : tiny_model_path();
  for (bool greedy : {true, false}) {
    SamplingParams p;
    p.max_tokens = 48;
    p.ignore_eos = true;
    if (greedy) {
      p.temperature = 0.0f;
    } else {
      p.temperature = 0.3f;
      p.top_k = 4;
      p.seed = 11;
      p.logprobs = 2;
    }
    auto plain = make_engine(model, 0);
    const auto expected = run(*plain, repeating_prompts(plain->tokenizer()), p);
    // (On two guarded devices, slow by design, one K.)
    const std::vector<int32_t> ks = *GetParam().device_map == '\0' ? std::vector<int32_t>{1, 3, 5} : std::vector<int32_t>{3};
    for (int32_t k : ks) {
      auto spec = make_engine(model, k, 4096, GetParam().device_map);
      const auto got = run(*spec, repeating_prompts(spec->tokenizer()), p);
      for (const auto& [id, f] : expected) {
        const CompletionDelta& a = f.outputs.at(0);
        const CompletionDelta& b = got.at(id).outputs.at(0);
        ASSERT_EQ(a.token_ids, b.token_ids) << id << " k=" << k << (greedy ? " greedy" : " seeded");
        EXPECT_EQ(a.text, b.text);
        ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
        for (size_t t = 0; t < a.logprobs.size(); ++t) EXPECT_EQ(a.logprobs[t].logprob, b.logprobs[t].logprob);
      }
      const EngineMetrics m = spec->metrics();
      EXPECT_GT(m.spec_decode_num_drafts_total, 0);
      // A random model's samples rarely repeat a phrase; its greedy output does.
      if (greedy) {
        EXPECT_GT(m.spec_decode_num_accepted_tokens_total, 0) << "k=" << k;
      }
      EXPECT_LE(m.spec_decode_num_accepted_tokens_total, m.spec_decode_num_draft_tokens_total);
      int64_t per_pos = 0;
      for (int64_t v : m.spec_decode_num_accepted_tokens_per_pos) per_pos += v;
      EXPECT_EQ(per_pos, m.spec_decode_num_accepted_tokens_total);
      // Fewer steps than tokens: the point of it.
      EXPECT_EQ(m.generation_tokens_total, 48 * 4);
      EXPECT_EQ(spec->kv_cache().stats().num_used_blocks, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Speculative, SameOutput,
    ::testing::Values(Placed{"Llama", false, ""}, Placed{"Deepseek2", true, ""},
                      Placed{"LlamaTwoStages", false, "layers.0-0=guarded:0,layers.1-1=guarded:1"},
                      Placed{"Deepseek2TwoStages", true, "layers.0-1=guarded:0,layers.2-2=guarded:1"}),
    [](const ::testing::TestParamInfo<Placed>& p) { return std::string(p.param.name); });

// MTP drafting (the model's own multi-token-prediction layer) on deepseek2: the same outputs, and
// with a KV pool so small that requests are preempted and recomputed, and prefixes shared.
TEST(Speculative, MtpDraftsGiveTheSameOutput) {
  const std::string& model = tiny_mtp_model_path();
  for (bool greedy : {true, false}) {
    SamplingParams p;
    p.max_tokens = 40;
    p.ignore_eos = true;
    if (greedy) {
      p.temperature = 0.0f;
    } else {
      p.temperature = 0.8f;
      p.top_k = 5;
      p.seed = 3;
    }
    auto plain = make_engine(model, 0);
    std::vector<std::vector<int32_t>> prompts = repeating_prompts(plain->tokenizer());
    prompts.push_back(prompts.front());  // a prefix-cache hit on the first one's blocks
    const auto expected = run(*plain, prompts, p);
    for (auto [k, kv_tokens] : {std::pair{1, 4096}, {3, 4096}, {4, 96}}) {
      auto spec = make_engine(model, k, kv_tokens, "", SpeculativeMethod::kMtp);
      const auto got = run(*spec, prompts, p);
      for (const auto& [id, f] : expected) {
        ASSERT_EQ(f.outputs.at(0).token_ids, got.at(id).outputs.at(0).token_ids)
            << id << " k=" << k << " kv " << kv_tokens << (greedy ? " greedy" : " seeded");
      }
      const EngineMetrics m = spec->metrics();
      EXPECT_GT(m.spec_decode_num_drafts_total, 0);
      EXPECT_GT(m.spec_decode_num_draft_tokens_total, m.spec_decode_num_drafts_total * (k > 1 ? 1 : 0));
      EXPECT_LE(m.spec_decode_num_accepted_tokens_total, m.spec_decode_num_draft_tokens_total);
      if (kv_tokens < 4096) {
        EXPECT_GT(m.preemptions_total, 0) << "k=" << k;
      }
      EXPECT_EQ(spec->kv_cache().stats().num_used_blocks, 0);
      std::printf("mtp k=%d %s: %lld drafts, %lld draft tokens, %lld accepted\n", k, greedy ? "greedy" : "seeded",
                  static_cast<long long>(m.spec_decode_num_drafts_total),
                  static_cast<long long>(m.spec_decode_num_draft_tokens_total),
                  static_cast<long long>(m.spec_decode_num_accepted_tokens_total));
    }
  }
}

TEST(Speculative, MtpNeedsAnMtpLayer) {
  for (const std::string& model : {tiny_model_path(), tiny_moe_model_path()}) {
    try {
      make_engine(model, 2, 4096, "", SpeculativeMethod::kMtp);
      ADD_FAILURE() << model << ": mtp accepted without an MTP layer";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("no multi-token-prediction layer"), std::string::npos) << e.what();
    }
  }
}

// The prompt is the model's own greedy continuation, so prompt lookup drafts what the model finds
// likely and drafts are both kept and refused often. 500 unseeded runs of 8 tokens each way;
// (position, token) counts are compared by a chi-square test of homogeneity. A verifier that kept
// drafts it should refuse, or drew the replacement from the wrong distribution, moves these counts
// far past the bound. (A random MTP layer's drafts are nearly always refused: there the test
// holds the replacement tokens to the distribution.)
void expect_same_distribution(const std::string& model, SpeculativeMethod method) {
  const std::vector<int32_t> prompt = [&] {
    auto e = make_engine(model, 0);
    std::vector<int32_t> ids = e->tokenizer().encode("a b", true, false);
    SamplingParams g;
    g.temperature = 0.0f;
    g.max_tokens = 48;
    g.ignore_eos = true;
    e->add_request("g", ids, g);
    const auto out = run_to_completion(*e);
    const auto& more = out.at("g").outputs.at(0).token_ids;
    ids.insert(ids.end(), more.begin(), more.end());
    return ids;
  }();
  constexpr int kRuns = 500;
  constexpr int kTokens = 8;
  auto count = [&](int32_t k) {
    auto e = make_engine(model, k, 1 << 16, "", method);
    SamplingParams p;
    p.max_tokens = kTokens;
    p.ignore_eos = true;
    p.temperature = 1.0f;
    p.top_k = 3;
    for (int i = 0; i < kRuns; ++i) e->add_request("s" + std::to_string(i), prompt, p);
    std::map<int32_t, int64_t> counts;
    for (const auto& [id, f] : run_to_completion(*e)) {
      const auto& ids = f.outputs.at(0).token_ids;
      EXPECT_EQ(ids.size(), static_cast<size_t>(kTokens));
      for (size_t t = 1; t < ids.size(); ++t) ++counts[static_cast<int32_t>(t) * 100000 + ids[t]];
    }
    return std::make_pair(counts, e->metrics());
  };
  const auto [a, ma] = count(0);
  const auto [b, mb] = count(4);
  EXPECT_EQ(ma.spec_decode_num_draft_tokens_total, 0);
  ASSERT_GT(mb.spec_decode_num_draft_tokens_total, 0);
  const double acceptance = static_cast<double>(mb.spec_decode_num_accepted_tokens_total) /
                            static_cast<double>(mb.spec_decode_num_draft_tokens_total);
  if (method == SpeculativeMethod::kNgram) {
    EXPECT_GT(acceptance, 0.05);  // both outcomes of verification happen often
  }
  EXPECT_LT(acceptance, 0.95);
  // Cells seen at least 10 times in both runs together, the rest pooled.
  double chi2 = 0.0;
  int dof = -1;
  int64_t rest_a = 0, rest_b = 0;
  const double na = kRuns * (kTokens - 1.0), nb = na;
  std::map<int32_t, std::pair<int64_t, int64_t>> both;
  for (auto [t, c] : a) both[t].first = c;
  for (auto [t, c] : b) both[t].second = c;
  auto add = [&](double ca, double cb) {
    const double total = ca + cb;
    const double ea = total * na / (na + nb), eb = total * nb / (na + nb);
    chi2 += (ca - ea) * (ca - ea) / ea + (cb - eb) * (cb - eb) / eb;
    ++dof;
  };
  for (auto [t, c] : both) {
    if (c.first + c.second >= 10) {
      add(static_cast<double>(c.first), static_cast<double>(c.second));
    } else {
      rest_a += c.first;
      rest_b += c.second;
    }
  }
  if (rest_a + rest_b > 0) add(static_cast<double>(rest_a), static_cast<double>(rest_b));
  ASSERT_GT(dof, 0);
  // The 99.99th percentile of chi-square with dof degrees of freedom (Wilson-Hilferty).
  const double z = 3.72;  // 99.99%
  const double limit = dof * std::pow(1.0 - 2.0 / (9.0 * dof) + z * std::sqrt(2.0 / (9.0 * dof)), 3.0);
  EXPECT_LT(chi2, limit) << "dof " << dof;
  std::printf("%s: acceptance %.3f, chi-square %.1f with %d degrees of freedom (bound %.1f)\n",
              std::string(speculative_method_name(method)).c_str(), acceptance, chi2, dof, limit);
}

TEST(Speculative, SampledTokensFollowTheSameDistribution) {
  expect_same_distribution(tiny_model_path(), SpeculativeMethod::kNgram);
}

TEST(Speculative, MtpSampledTokensFollowTheSameDistribution) {
  expect_same_distribution(tiny_mtp_model_path(), SpeculativeMethod::kMtp);
}

TEST(Speculative, DraftsRespectStructuredOutputAndStops) {
  auto plain = make_engine(tiny_model_path(), 0);
  auto spec = make_engine(tiny_model_path(), 4);
  SamplingParams p;
  p.max_tokens = 60;
  p.temperature = 0.0f;
  p.grammar = std::make_shared<const grammar::Grammar>(
      grammar::compile_structured_output({grammar::ConstraintKind::kRegex, "(ab ){3,20}done"}));
  const auto prompt = plain->tokenizer().encode("ab ab ab ab ab", true, false);
  plain->add_request("g", prompt, p);
  spec->add_request("g", prompt, p);
  SamplingParams s;
  s.max_tokens = 40;
  s.temperature = 0.0f;
  s.ignore_eos = true;
  s.stop = {"b a"};
  plain->add_request("s", prompt, s);
  spec->add_request("s", prompt, s);
  const auto a = run_to_completion(*plain);
  const auto b = run_to_completion(*spec);
  for (const char* id : {"g", "s"}) {
    EXPECT_EQ(a.at(id).outputs.at(0).text, b.at(id).outputs.at(0).text) << id;
    EXPECT_EQ(a.at(id).outputs.at(0).finish_reason, b.at(id).outputs.at(0).finish_reason) << id;
  }
  EXPECT_EQ(spec->kv_cache().stats().num_used_blocks, 0);
}

TEST(Speculative, NgramProposals) {
  const std::vector<int32_t> t = {1, 2, 3, 4, 9, 1, 2, 3};
  EXPECT_EQ(propose_ngram(t, 3, 1, 3), (std::vector<int32_t>{4, 9, 1}));
  EXPECT_EQ(propose_ngram(t, 1, 1, 3), (std::vector<int32_t>{4}));
  EXPECT_TRUE(propose_ngram(t, 3, 4, 4).empty());             // "9 1 2 3" never occurred before
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{5, 6, 7}, 3, 1, 3).empty());
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{7, 7, 7}, 4, 1, 2), (std::vector<int32_t>{7}));
  EXPECT_THROW(parse_speculative_method("eagle"), Error);
}

}  // namespace
}  // namespace duet
