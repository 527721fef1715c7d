#include "duet/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

namespace duet {
namespace {

const float kInf = std::numeric_limits<float>::infinity();

// ---- independent references: plain loops, full sorts, std::exp in double ----

std::vector<double> softmax(const std::vector<float>& logits, double temperature = 1.0) {
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - m) / temperature);
  for (double& v : p) v /= sum;
  return p;
}

std::vector<double> log_softmax(const std::vector<float>& logits) {
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(l - m);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - m - std::log(sum);
  return out;
}

// The distribution the sampler must draw from (no penalties): temperature, top-k (exactly k,
// ties to lower ids), top-p over the renormalized top-k set, then min-p.
std::vector<double> reference_distribution(const std::vector<float>& logits, const SamplingParams& params) {
  const size_t n = logits.size();
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = n;
  if (params.top_k > 0) keep = std::min<size_t>(keep, params.top_k);
  const double m = logits[order[0]];
  std::vector<double> p(keep);
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((logits[order[i]] - m) / params.temperature);
  for (double& v : p) v /= sum;
  if (params.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += p[i];
      if (cumulative >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  while (keep > 1 && p[keep - 1] < params.min_p * p[0]) --keep;
  std::vector<double> out(n, 0.0);
  double mass = 0.0;
  for (size_t i = 0; i < keep; ++i) mass += p[i];
  for (size_t i = 0; i < keep; ++i) out[order[i]] = p[i] / mass;
  return out;
}

// Chi-square of observed counts against expected probabilities, over the bins with mass.
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs, int64_t draws) {
  double chi2 = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] == 0.0) continue;
    const double expected = probs[i] * static_cast<double>(draws);
    const double d = static_cast<double>(counts[i]) - expected;
    chi2 += d * d / expected;
  }
  return chi2;
}

// Chi-square over bins with an expected count of at least 20 (smaller ones merged into one);
// `dof` receives the degrees of freedom.
double chi_square_merged(const std::vector<int64_t>& counts, const std::vector<double>& probs, int64_t draws,
                         int64_t& dof) {
  double chi2 = 0.0, small_p = 0.0;
  int64_t small_count = 0, bins = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double expected = probs[i] * static_cast<double>(draws);
    if (probs[i] == 0.0) continue;
    if (expected < 20.0) {
      small_p += probs[i];
      small_count += counts[i];
      continue;
    }
    const double d = static_cast<double>(counts[i]) - expected;
    chi2 += d * d / expected;
    ++bins;
  }
  if (small_p > 0.0) {
    const double expected = small_p * static_cast<double>(draws);
    const double d = static_cast<double>(small_count) - expected;
    chi2 += d * d / expected;
    ++bins;
  }
  dof = bins - 1;
  return chi2;
}

std::vector<float> random_logits(size_t n, uint64_t seed, double scale = 3.0) {
  Rng rng(seed);
  std::vector<float> out(n);
  for (float& v : out) {
    // A sum of uniforms: roughly normal, deterministic everywhere.
    double s = 0.0;
    for (int k = 0; k < 4; ++k) s += rng.uniform();
    v = static_cast<float>((s - 2.0) * scale);
  }
  return out;
}

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(p > 0 ? static_cast<float>(std::log(p)) : -kInf);
  return out;
}

SamplingParams greedy_params() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

// Draws `draws` tokens with fresh state per draw from one generator; counts per token.
std::vector<int64_t> histogram(Sampler& sampler, const std::vector<float>& logits, const SamplingParams& params,
                               int64_t draws, uint64_t seed, const SequenceContext& ctx = {}) {
  Rng rng(seed);
  std::vector<int64_t> counts(logits.size(), 0);
  for (int64_t i = 0; i < draws; ++i) ++counts[sampler.sample(logits, params, ctx, rng).token_id];
  return counts;
}

bool same_state(Rng a, Rng b) { return a.next() == b.next() && a.next() == b.next(); }

// ---- greedy ----

TEST(Sampler, GreedyPicksArgmaxAndTiesToLowestId) {
  Sampler sampler;
  for (size_t n : {1, 7, 255, 256, 257, 1000, 4097, 32000}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      std::vector<float> logits = random_logits(n, seed * 100 + n);
      Rng rng(seed);
      const Rng before = rng;
      const int32_t want = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      EXPECT_EQ(sampler.sample(logits, greedy_params(), {}, rng).token_id, want) << "n=" << n;
      EXPECT_TRUE(same_state(rng, before)) << "greedy must not draw";
    }
  }
  // Ties, within a block and across blocks of the scan.
  std::vector<float> flat(1000, 0.5f);
  Rng rng(1);
  EXPECT_EQ(sampler.sample(flat, greedy_params(), {}, rng).token_id, 0);
  flat[700] = flat[300] = flat[301] = 2.0f;
  EXPECT_EQ(sampler.sample(flat, greedy_params(), {}, rng).token_id, 300);
  std::vector<float> with_inf(300, -kInf);
  EXPECT_EQ(sampler.sample(with_inf, greedy_params(), {}, rng).token_id, 0);
  with_inf[299] = -1e30f;
  EXPECT_EQ(sampler.sample(with_inf, greedy_params(), {}, rng).token_id, 299);
  with_inf[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(sampler.sample(with_inf, greedy_params(), {}, rng).token_id, 299);
}

// ---- temperature ----

TEST(Sampler, TemperatureMatchesSoftmaxOverManyDraws) {
  Sampler sampler;
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f, 0.0f, 1.5f};
  const int64_t draws = 200000;
  for (float t : {0.5f, 1.0f, 2.0f}) {
    SamplingParams params;
    params.temperature = t;
    const auto counts = histogram(sampler, logits, params, draws, 7);
    const double chi2 = chi_square(counts, softmax(logits, t), draws);
    // 7 degrees of freedom: the 99.9% quantile is 24.3. A wrong temperature gives thousands.
    EXPECT_LT(chi2, 30.0) << "T=" << t;
    // The same draws judged against the wrong temperature must fail clearly.
    EXPECT_GT(chi_square(counts, softmax(logits, t * 1.25), draws), 200.0) << "T=" << t;
  }
}

TEST(Sampler, FullVocabularyDrawCrossesBlocks) {
  // Mass spread over tokens in different blocks of the draw; the rest is negligible.
  Sampler sampler;
  std::vector<float> logits(5000, -40.0f);
  const std::vector<int32_t> ids = {3, 1023, 1024, 2500, 4999};
  const std::vector<float> values = {1.0f, 0.2f, 0.7f, 1.5f, 0.0f};
  for (size_t i = 0; i < ids.size(); ++i) logits[ids[i]] = values[i];
  SamplingParams params;
  const int64_t draws = 50000;
  const auto counts = histogram(sampler, logits, params, draws, 11);
  const auto probs = softmax(logits);
  int64_t inside = 0;
  for (int32_t id : ids) inside += counts[id];
  EXPECT_EQ(inside, draws);
  std::vector<int64_t> c;
  std::vector<double> p;
  for (int32_t id : ids) {
    c.push_back(counts[id]);
    p.push_back(probs[id]);
  }
  EXPECT_LT(chi_square(c, p, draws), 25.0);  // 4 degrees of freedom
}

TEST(Sampler, TinyTemperatureIsArgmaxWithOneDraw) {
  Sampler sampler;
  const std::vector<float> logits = random_logits(500, 3);
  const int32_t want = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  for (float t : {1e-3f, 1e-20f, 1e-40f}) {
    SamplingParams params;
    params.temperature = t;
    Rng rng(5);
    Rng expected = rng;
    (void)expected.uniform();
    EXPECT_EQ(sampler.sample(logits, params, {}, rng).token_id, want) << t;
    EXPECT_TRUE(same_state(rng, expected)) << t;
  }
}

// ---- top-k, top-p, min-p ----

TEST(Sampler, TopKOneIsGreedy) {
  Sampler sampler;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::vector<float> logits = random_logits(3000, seed);
    if (seed % 5 == 0) logits[2999] = logits[17] = *std::max_element(logits.begin(), logits.end()) + 1.0f;
    SamplingParams params;
    params.top_k = 1;
    params.temperature = 1.5f;
    Rng rng(seed);
    Rng g(seed);
    EXPECT_EQ(sampler.sample(logits, params, {}, rng).token_id,
              sampler.sample(logits, greedy_params(), {}, g).token_id);
  }
}

TEST(Sampler, TopKTopPMinPKnownDistributions) {
  Sampler sampler;
  struct Case {
    std::vector<double> probs;
    int32_t top_k = 0;
    float top_p = 1.0f;
    float min_p = 0.0f;
    std::vector<double> want;  // the distribution after filtering
  };
  const std::vector<Case> cases = {
      // top-k: exactly k, ties at the k-th value go to the lower id.
      {{0.1, 0.3, 0.2, 0.2, 0.2}, 3, 1.0f, 0.0f, {0, 3.0 / 7, 2.0 / 7, 2.0 / 7, 0}},
      {{0.1, 0.3, 0.2, 0.2, 0.2}, 2, 1.0f, 0.0f, {0, 0.6, 0.4, 0, 0}},
      // top-p: the smallest prefix reaching top_p; at least one token.
      {{0.4, 0.3, 0.15, 0.1, 0.05}, 0, 0.75f, 0.0f, {0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0, 0}},
      {{0.4, 0.3, 0.15, 0.1, 0.05}, 0, 0.35f, 0.0f, {1, 0, 0, 0, 0}},
      {{0.05, 0.1, 0.15, 0.3, 0.4}, 0, 0.69f, 0.0f, {0, 0, 0, 3.0 / 7, 4.0 / 7}},
      // top-p is taken over the renormalized top-k set: {0.3, 0.25} -> {0.545, 0.455}.
      {{0.3, 0.25, 0.2, 0.15, 0.1}, 2, 0.5f, 0.0f, {1, 0, 0, 0, 0}},
      // min-p: below min_p * p_max is dropped.
      {{0.5, 0.25, 0.1, 0.1, 0.05}, 0, 1.0f, 0.3f, {2.0 / 3, 1.0 / 3, 0, 0, 0}},
      {{0.5, 0.25, 0.1, 0.1, 0.05}, 0, 1.0f, 0.19f, {0.5 / 0.95, 0.25 / 0.95, 0.1 / 0.95, 0.1 / 0.95, 0}},
      {{0.5, 0.25, 0.1, 0.1, 0.05}, 0, 1.0f, 1.0f, {1, 0, 0, 0, 0}},
      // min-p comes after top-p (header order): the nucleus of 0.6 is {0, 1}, min-p keeps both.
      // (min-p first would renormalize {0, 1} to {0.625, 0.375} and top-p would keep only 0.)
      {{0.5, 0.3, 0.2}, 0, 0.6f, 0.5f, {0.625, 0.375, 0}},
      // All three together.
      {{0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.05}, 5, 0.8f, 0.4f, {0.3 / 0.65, 0.2 / 0.65, 0.15 / 0.65, 0, 0, 0, 0}},
  };
  const int64_t draws = 60000;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    SamplingParams params;
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    const std::vector<float> logits = logits_of(c.probs);
    // The independent reference agrees with the hand-computed distribution.
    const auto ref = reference_distribution(logits, params);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(ref[i], c.want[i], 1e-6) << "case " << ci << " token " << i;
    const auto counts = histogram(sampler, logits, params, draws, 1000 + ci);
    for (size_t i = 0; i < counts.size(); ++i) {
      if (c.want[i] == 0.0) {
        EXPECT_EQ(counts[i], 0) << "case " << ci << ": excluded token " << i << " drawn";
      } else {
        EXPECT_GT(counts[i], 0) << "case " << ci << ": allowed token " << i << " never drawn";
      }
    }
    const int64_t dof = std::count_if(c.want.begin(), c.want.end(), [](double p) { return p > 0; }) - 1;
    EXPECT_LT(chi_square(counts, c.want, draws), 20.0 + 3.0 * static_cast<double>(dof)) << "case " << ci;
  }
}

TEST(Sampler, TopKTiesGoToLowerIds) {
  // A constant row: every token ties, so top-k keeps exactly the k lowest ids (both the sorted
  // path for small k and the dense path for large k).
  Sampler sampler;
  const std::vector<float> flat(5000, 0.25f);
  for (int32_t k : {1, 3, 200, 1000}) {
    SamplingParams params;
    params.top_k = k;
    const auto counts = histogram(sampler, flat, params, 20000, 8 + k);
    for (int32_t i = 0; i < 5000; ++i) {
      if (i >= k) {
        ASSERT_EQ(counts[i], 0) << "k " << k << " drew " << i;
      }
    }
    if (k <= 3) {
      for (int32_t i = 0; i < k; ++i) EXPECT_GT(counts[i], 20000 / k / 2) << "k " << k;
    }
  }
  const auto top = Sampler::top_logprobs(flat, 4);
  ASSERT_EQ(top.size(), 4u);
  for (int32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(top[i].token_id, i);
    EXPECT_NEAR(top[i].logprob, -std::log(5000.0), 1e-5);
  }
}

TEST(Sampler, FiltersNeverReturnExcludedTokens) {
  // Random small vocabularies and option mixes; every draw must be in the reference support.
  Sampler sampler;
  const int32_t ks[] = {0, 1, 2, 5, 17, 40};
  const float ps[] = {1.0f, 0.95f, 0.8f, 0.5f, 0.1f};
  const float min_ps[] = {0.0f, 0.05f, 0.3f};
  int64_t checked = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    const std::vector<float> logits = random_logits(40, 500 + seed, 1.0 + static_cast<double>(seed % 4));
    for (int32_t k : ks) {
      for (float p : ps) {
        for (float mp : min_ps) {
          SamplingParams params;
          params.temperature = 0.6f + 0.2f * static_cast<float>(seed % 3);
          params.top_k = k;
          params.top_p = p;
          params.min_p = mp;
          const auto ref = reference_distribution(logits, params);
          Rng rng(seed * 7919 + static_cast<uint64_t>(k));
          for (int d = 0; d < 300; ++d) {
            const int32_t id = sampler.sample(logits, params, {}, rng).token_id;
            ASSERT_GT(ref[id], 0.0) << "seed " << seed << " k " << k << " p " << p << " min_p " << mp
                                    << " drew excluded token " << id;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 12 * 6 * 5 * 3 * 300);
}

TEST(Sampler, DenseAndLargeTopKPathsMatchReferenceDistribution) {
  // Without top-k (or with a top-k above the sorted limit) the filters work on dense arrays:
  // check the whole distribution, not only its support.
  Sampler sampler;
  struct Case {
    size_t vocab;
    double scale;
    int32_t top_k;
    float top_p, min_p, temperature;
  };
  const std::vector<Case> cases = {
      {300, 1.0, 0, 0.5f, 0.0f, 0.9f},    {300, 1.0, 0, 0.9f, 0.0f, 1.0f},  {300, 2.0, 0, 0.9f, 0.2f, 1.0f},
      {300, 0.5, 0, 1.0f, 0.3f, 1.0f},    {300, 1.0, 0, 1.0f, 0.0f, 1.3f},  {3000, 1.5, 400, 1.0f, 0.0f, 1.0f},
      {3000, 1.5, 400, 0.8f, 0.0f, 1.0f}, {3000, 1.5, 400, 0.95f, 0.3f, 0.7f},
  };
  const int64_t draws = 50000;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    SamplingParams params;
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    params.temperature = c.temperature;
    const std::vector<float> logits = random_logits(c.vocab, 70 + ci, c.scale);
    const auto ref = reference_distribution(logits, params);
    const auto counts = histogram(sampler, logits, params, draws, 900 + ci);
    for (size_t i = 0; i < counts.size(); ++i) {
      if (ref[i] == 0.0) {
        ASSERT_EQ(counts[i], 0) << "case " << ci << ": excluded token " << i << " drawn";
      }
    }
    int64_t dof = 0;
    const double chi2 = chi_square_merged(counts, ref, draws, dof);
    EXPECT_LT(chi2, static_cast<double>(dof) + 5.0 * std::sqrt(2.0 * static_cast<double>(dof)) + 10.0)
        << "case " << ci << " dof " << dof;
  }
}

TEST(Sampler, NaNLogitsDoNotBreakSampling) {
  Sampler sampler;
  std::vector<float> logits = random_logits(2000, 5);
  for (size_t i = 0; i < logits.size(); i += 7) logits[i] = std::numeric_limits<float>::quiet_NaN();
  std::vector<SamplingParams> configs(6);
  configs[0].temperature = 0.0f;
  configs[1].top_k = 20;
  configs[2].top_k = 600;
  configs[3].top_p = 0.9f;
  configs[4].min_p = 0.1f;
  configs[5].logprobs = 5;
  Rng rng(1);
  for (const SamplingParams& p : configs) {
    for (int d = 0; d < 50; ++d) {
      const SampledToken t = sampler.sample(logits, p, {}, rng);
      ASSERT_GE(t.token_id, 0);
      ASSERT_LT(t.token_id, 2000);
      for (const auto& top : t.top) ASSERT_FALSE(std::isnan(logits[top.token_id]));
    }
  }
}

TEST(Sampler, TopPOverLargeVocabularyMatchesReference) {
  // No top-k, so the nucleus is found over the whole vocabulary (collected in bands of
  // decreasing probability). Flat logits need several bands.
  Sampler sampler;
  for (double scale : {0.5, 2.0, 6.0}) {
    const std::vector<float> logits = random_logits(9000, 99, scale);
    for (float p : {0.3f, 0.9f, 0.999f}) {
      for (float mp : {0.0f, 0.01f}) {
        SamplingParams params;
        params.top_p = p;
        params.min_p = mp;
        const auto ref = reference_distribution(logits, params);
        // Tokens most likely first, to compare the mass in the head of the distribution.
        std::vector<int32_t> order(logits.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
        std::vector<char> head(logits.size(), 0);
        double head_mass = 0.0;
        for (size_t i = 0; i < order.size() && head_mass < 0.5; ++i) {
          head[order[i]] = 1;
          head_mass += ref[order[i]];
        }
        Rng rng(17);
        const int64_t draws = 2500;
        int64_t in_head = 0;
        for (int64_t d = 0; d < draws; ++d) {
          const int32_t id = sampler.sample(logits, params, {}, rng).token_id;
          ASSERT_GT(ref[id], 0.0) << "scale " << scale << " top_p " << p << " drew excluded " << id;
          in_head += head[id];
        }
        const double sigma = std::sqrt(head_mass * (1 - head_mass) * draws);
        EXPECT_NEAR(static_cast<double>(in_head), head_mass * draws, 5 * sigma + 1) << scale << " " << p;
      }
    }
  }
}

TEST(Sampler, TopKOnLargeVocabularyMatchesReference) {
  Sampler sampler;
  std::vector<float> logits = random_logits(50000, 4, 2.0);
  for (int32_t k : {3, 50, 1000, 30000}) {
    SamplingParams params;
    params.top_k = k;
    params.temperature = 0.8f;
    params.top_p = k == 1000 ? 0.7f : 1.0f;
    params.min_p = k == 30000 ? 0.001f : 0.0f;
    const auto ref = reference_distribution(logits, params);
    Rng rng(k);
    for (int d = 0; d < (k > 256 ? 300 : 3000); ++d) {
      const int32_t id = sampler.sample(logits, params, {}, rng).token_id;
      ASSERT_GT(ref[id], 0.0) << "k " << k << " drew excluded " << id;
    }
  }
}

// ---- penalties and logit_bias ----

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  Sampler sampler;
  const std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.0f, 3.0f, -0.5f};
  const std::vector<int32_t> prompt = {0, 1, 0};
  const std::vector<int32_t> output = {1, 3, 5};
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  const auto got = sampler.processed_logits(logits, params, {prompt, output, {}});
  const std::vector<float> want = {1.0f, -4.0f, 1.0f, 0.0f, 3.0f, -1.0f};
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << i;

  // A greedy choice flips: positive logit divided, negative multiplied.
  const std::vector<int32_t> seen = {0};
  SamplingParams g = greedy_params();
  g.repetition_penalty = 1.2f;
  Rng rng(1);
  EXPECT_EQ(sampler.sample(std::vector<float>{1.0f, 0.9f}, g, {seen, {}, {}}, rng).token_id, 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{-1.0f, -1.1f}, g, {seen, {}, {}}, rng).token_id, 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{-1.0f, -1.1f}, g, {{}, seen, {}}, rng).token_id, 1);
  g.repetition_penalty = 1.0f;
  EXPECT_EQ(sampler.sample(std::vector<float>{-1.0f, -1.1f}, g, {seen, seen, {}}, rng).token_id, 0);
  // Below 1 encourages repetition.
  g.repetition_penalty = 0.5f;
  EXPECT_EQ(sampler.sample(std::vector<float>{0.9f, 1.0f}, g, {seen, {}, {}}, rng).token_id, 0);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountTheOutputOnly) {
  Sampler sampler;
  const std::vector<float> logits = {1.0f, 2.0f, 1.0f, 0.5f, 3.0f};
  const std::vector<int32_t> prompt = {0, 0, 1};
  const std::vector<int32_t> output = {2, 4, 2, 2};
  SamplingParams params;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  const auto got = sampler.processed_logits(logits, params, {prompt, output, {}});
  const std::vector<float> want = {1.0f, 2.0f, 1.0f - 0.75f - 0.5f, 0.5f, 3.0f - 0.25f - 0.5f};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << i;

  SamplingParams g = greedy_params();
  Rng rng(1);
  const std::vector<float> two = {1.0f, 0.9f};
  const std::vector<int32_t> once = {0};
  const std::vector<int32_t> thrice = {0, 0, 0};
  g.presence_penalty = 0.2f;
  EXPECT_EQ(sampler.sample(two, g, {{}, once, {}}, rng).token_id, 1);
  EXPECT_EQ(sampler.sample(two, g, {once, {}, {}}, rng).token_id, 0);  // the prompt does not count
  g.presence_penalty = 0.0f;
  g.frequency_penalty = 0.05f;
  EXPECT_EQ(sampler.sample(two, g, {{}, once, {}}, rng).token_id, 0);  // 0.95 > 0.9
  EXPECT_EQ(sampler.sample(two, g, {{}, thrice, {}}, rng).token_id, 1);  // 0.85 < 0.9
  g.frequency_penalty = -0.5f;  // negative penalties encourage
  EXPECT_EQ(sampler.sample(std::vector<float>{0.5f, 0.9f}, g, {{}, once, {}}, rng).token_id, 0);
}

TEST(Sampler, ProcessingOrderBiasMaskThenPenalties) {
  Sampler sampler;
  const std::vector<float> logits = {1.0f, -1.0f, 0.5f, 2.0f};
  const std::vector<int32_t> prompt = {1};
  const std::vector<int32_t> output = {0, 0, 3};
  const std::vector<int32_t> eos = {3};
  SamplingParams params;
  params.logit_bias = {{1, 3.0f}, {0, -2.0f}};
  params.repetition_penalty = 2.0f;
  params.frequency_penalty = 0.5f;
  params.presence_penalty = 0.25f;
  params.min_tokens = 5;
  const auto got = sampler.processed_logits(logits, params, {prompt, output, eos});
  // 0: (1 - 2) = -1 -> *2 = -2 -> - 2*0.5 - 0.25 = -3.25
  // 1: (-1 + 3) = 2 -> /2 = 1 (prompt only: no presence/frequency)
  // 2: untouched
  // 3: eos masked under min_tokens: -inf stays -inf
  EXPECT_FLOAT_EQ(got[0], -3.25f);
  EXPECT_FLOAT_EQ(got[1], 1.0f);
  EXPECT_FLOAT_EQ(got[2], 0.5f);
  EXPECT_EQ(got[3], -kInf);
}

TEST(Sampler, PenaltiesOverLongHistoryMatchNaiveReference) {
  Sampler sampler;
  const int32_t vocab = 32000;
  const std::vector<float> logits = random_logits(vocab, 8);
  Rng ids(9);
  for (int round = 0; round < 3; ++round) {
    std::vector<int32_t> prompt(500 + round * 700);
    std::vector<int32_t> output(2000 - round * 600);
    // Skewed ids so that many repeat; a few out of range (ignored).
    for (int32_t& id : prompt) id = static_cast<int32_t>(ids.uniform() * ids.uniform() * vocab);
    for (int32_t& id : output) id = static_cast<int32_t>(ids.uniform() * ids.uniform() * 300);
    prompt[3] = -5;
    output[7] = vocab + 10;
    SamplingParams params;
    params.repetition_penalty = 1.3f + 0.1f * static_cast<float>(round);
    params.presence_penalty = 0.4f;
    params.frequency_penalty = 0.1f * static_cast<float>(round + 1);
    std::map<int32_t, int32_t> in_prompt, in_output;
    for (int32_t id : prompt) ++in_prompt[id];
    for (int32_t id : output) ++in_output[id];
    std::vector<float> want = logits;
    for (int32_t t = 0; t < vocab; ++t) {
      float v = want[t];
      const bool seen = in_prompt.count(t) || in_output.count(t);
      if (seen) v = v > 0 ? v / params.repetition_penalty : v * params.repetition_penalty;
      if (in_output.count(t)) {
        v -= params.frequency_penalty * static_cast<float>(in_output[t]);
        v -= params.presence_penalty;
      }
      want[t] = v;
    }
    const auto got = sampler.processed_logits(logits, params, {prompt, output, {}});
    for (int32_t t = 0; t < vocab; ++t) ASSERT_EQ(got[t], want[t]) << "round " << round << " token " << t;
  }
  // The counting state of one call never leaks into the next.
  SamplingParams params;
  params.presence_penalty = 1.0f;
  const std::vector<int32_t> output = {5};
  const auto got = sampler.processed_logits(logits, params, {{}, output, {}});
  for (int32_t t = 0; t < vocab; ++t) ASSERT_EQ(got[t], t == 5 ? logits[t] - 1.0f : logits[t]) << t;
}

TEST(Sampler, LogitBiasForcesAndForbids) {
  Sampler sampler;
  const std::vector<float> logits = random_logits(1000, 21, 3.0);
  const int32_t argmax = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  SamplingParams force;
  force.logit_bias = {{777, 100.0f}};
  SamplingParams forbid;
  forbid.logit_bias = {{argmax, -100.0f}};
  for (float t : {0.0f, 1.0f, 2.0f}) {
    force.temperature = forbid.temperature = t;
    Rng rng(t == 0 ? 1 : 2);
    for (int d = 0; d < 2000; ++d) {
      EXPECT_EQ(sampler.sample(logits, force, {}, rng).token_id, 777);
      EXPECT_NE(sampler.sample(logits, forbid, {}, rng).token_id, argmax);
    }
  }
  // A peaked row where the forbidden token holds almost all the mass.
  std::vector<float> peaked(50, 0.0f);
  peaked[9] = 12.0f;
  forbid.logit_bias = {{9, -100.0f}};
  forbid.temperature = 1.0f;
  const auto counts = histogram(sampler, peaked, forbid, 20000, 3);
  EXPECT_EQ(counts[9], 0);
  // Out-of-range ids are ignored rather than written out of bounds.
  SamplingParams stray;
  stray.temperature = 0.0f;
  stray.logit_bias = {{-1, 100.0f}, {1000, 100.0f}};
  Rng rng(1);
  EXPECT_EQ(sampler.sample(logits, stray, {}, rng).token_id, argmax);
}

// ---- allowed_token_ids and bad_words ----

TEST(Sampler, AllowedTokenIdsAreTheOnlyOnesSampled) {
  Sampler sampler;
  const std::vector<float> logits = random_logits(1000, 31, 3.0);
  SamplingParams params;
  params.allowed_token_ids = {5, 77, 901, 5000 /* out of the row: ignored */};
  params.temperature = 0.0f;
  Rng rng(1);
  const int32_t best = logits[5] >= logits[77] && logits[5] >= logits[901] ? 5 : logits[77] >= logits[901] ? 77 : 901;
  EXPECT_EQ(sampler.sample(logits, params, {}, rng).token_id, best);
  // Sampled in proportion to their own softmax, nothing else.
  params.temperature = 1.0f;
  const auto counts = histogram(sampler, logits, params, 30000, 5);
  const double z = std::exp(logits[5]) + std::exp(logits[77]) + std::exp(logits[901]);
  int64_t others = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (i != 5 && i != 77 && i != 901) others += counts[i];
  }
  EXPECT_EQ(others, 0);
  for (int32_t id : {5, 77, 901}) EXPECT_NEAR(counts[id] / 30000.0, std::exp(logits[id]) / z, 0.015) << id;
  // Masked by min_tokens too (eos among them): the allowed one that is left, then the fallback
  // stays within the allowed ids.
  const std::vector<int32_t> eos = {77};
  SamplingParams masked = greedy_params();
  masked.allowed_token_ids = {77, 901};
  masked.min_tokens = 1;
  EXPECT_EQ(sampler.sample(logits, masked, {{}, {}, eos}, rng).token_id, 901);
  masked.allowed_token_ids = {77};
  EXPECT_EQ(sampler.sample(logits, masked, {{}, {}, eos}, rng).token_id, 77);
  // Logprobs stay those of the raw row.
  params.temperature = 0.0f;
  params.logprobs = 0;
  const SampledToken t = sampler.sample(logits, params, {}, rng);
  const std::vector<double> raw = log_softmax(logits);
  EXPECT_NEAR(t.logprob, raw[t.token_id], 1e-4);
}

TEST(Sampler, BadWordsBanTheirLastTokenAfterTheirStart) {
  Sampler sampler;
  // Most likely: 4, then 3, then 2.
  const std::vector<float> logits = {0.0f, 0.5f, 1.0f, 2.0f, 3.0f};
  SamplingParams params = greedy_params();
  params.bad_words_token_ids = {{4}, {1, 3}, {2, 1, 3}};
  std::vector<int32_t> output;
  Rng rng(1);
  auto next = [&] { return sampler.sample(logits, params, {{}, output, {}}, rng).token_id; };
  EXPECT_EQ(next(), 3);  // 4 is banned everywhere
  output = {1};
  EXPECT_EQ(next(), 2);  // "1 3" would be finished
  output = {0, 2, 1};
  EXPECT_EQ(next(), 2);  // both "1 3" and "2 1 3"
  output = {1, 0};
  EXPECT_EQ(next(), 3);
  // Sampled: never the banned tokens.
  params.temperature = 1.0f;
  output = {2, 1};
  const auto counts = histogram(sampler, logits, params, 20000, 6, {{}, output, {}});
  EXPECT_EQ(counts[4], 0);
  EXPECT_EQ(counts[3], 0);
  EXPECT_GT(counts[2], 0);
}

// ---- min_tokens ----

TEST(Sampler, MinTokensMasksEosAndStopIdsUntilReached) {
  Sampler sampler;
  // Most likely: 2 (eos), then 3 (stop id), then 0.
  const std::vector<float> logits = {1.0f, 0.5f, 3.0f, 2.0f, -1.0f};
  const std::vector<int32_t> eos = {2};
  SamplingParams params = greedy_params();
  params.stop_token_ids = {3};
  params.min_tokens = 2;
  std::vector<int32_t> output;
  Rng rng(1);
  auto next = [&](const SamplingParams& p) { return sampler.sample(logits, p, {{}, output, eos}, rng).token_id; };
  EXPECT_EQ(next(params), 0);
  output = {0};
  EXPECT_EQ(next(params), 0);
  output = {0, 0};
  EXPECT_EQ(next(params), 2);  // reached: eos allowed again
  output = {0, 0, 0};
  EXPECT_EQ(next(params), 2);

  // ignore_eos: eos is never masked; stop ids still are.
  params.ignore_eos = true;
  output.clear();
  EXPECT_EQ(next(params), 2);
  std::vector<float> stop_first = {1.0f, 0.5f, 3.0f, 4.0f, -1.0f};
  EXPECT_EQ(sampler.sample(stop_first, params, {{}, output, eos}, rng).token_id, 2);

  // Sampling never draws a masked token.
  SamplingParams sampled;
  sampled.stop_token_ids = {3};
  sampled.min_tokens = 1;
  output.clear();
  const auto counts = histogram(sampler, logits, sampled, 20000, 4, {{}, output, eos});
  EXPECT_EQ(counts[2], 0);
  EXPECT_EQ(counts[3], 0);
  EXPECT_GT(counts[0], 0);
  output = {1};
  const auto after = histogram(sampler, logits, sampled, 20000, 4, {{}, output, eos});
  EXPECT_GT(after[2], 0);
  EXPECT_GT(after[3], 0);
}

TEST(Sampler, EverythingMaskedFallsBackToRawArgmax) {
  Sampler sampler;
  const std::vector<float> logits = {0.5f, 2.0f};
  const std::vector<int32_t> eos = {0};
  SamplingParams params;
  params.stop_token_ids = {1};
  params.min_tokens = 3;
  for (float t : {0.0f, 1.0f}) {
    for (int32_t k : {0, 1}) {
      params.temperature = t;
      params.top_k = k;
      Rng rng(3);
      Rng expected = rng;
      if (t > 0) (void)expected.uniform();
      EXPECT_EQ(sampler.sample(logits, params, {{}, {}, eos}, rng).token_id, 1);
      EXPECT_TRUE(same_state(rng, expected));
    }
  }
}

// ---- seeds and the generator ----

TEST(Sampler, SameSeedSameTokensDifferentSeedsDiffer) {
  Sampler a, b;
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_p = 0.95f;
  auto run = [&](Sampler& s, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> out;
    for (int step = 0; step < 64; ++step) {
      const auto logits = random_logits(2000, 1000 + step, 1.0);
      out.push_back(s.sample(logits, params, {{}, out, {}}, rng).token_id);
    }
    return out;
  };
  const auto first = run(a, 42);
  EXPECT_EQ(first, run(b, 42));
  EXPECT_EQ(first, run(a, 42));  // reusing a sampler does not change anything
  EXPECT_NE(first, run(a, 43));
}

TEST(Sampler, ExactlyOneDrawPerNonGreedySample) {
  Sampler sampler;
  const std::vector<float> logits = random_logits(3000, 12, 2.0);
  std::vector<SamplingParams> configs(11);
  configs[9].top_k = 500;
  configs[10].top_k = 500;
  configs[10].top_p = 0.5f;
  configs[10].min_p = 0.01f;
  configs[1].top_k = 1;
  configs[2].top_k = 50;
  configs[3].top_p = 0.9f;
  configs[4].top_p = 0.001f;
  configs[5].min_p = 0.5f;
  configs[6].top_k = 100;
  configs[6].top_p = 0.5f;
  configs[6].min_p = 0.1f;
  configs[7].top_p = 0.8f;
  configs[7].min_p = 0.2f;
  configs[8].logit_bias = {{5, 100.0f}};
  configs[8].repetition_penalty = 1.5f;
  const std::vector<int32_t> history = {1, 2, 3};
  for (size_t i = 0; i < configs.size(); ++i) {
    Rng rng(77 + i);
    Rng expected = rng;
    for (int step = 0; step < 5; ++step) {
      (void)sampler.sample(logits, configs[i], {history, history, {}}, rng);
      (void)expected.uniform();
    }
    EXPECT_TRUE(same_state(rng, expected)) << "config " << i;
  }
}

// ---- logprobs ----

TEST(Sampler, LogprobsAreRawAndNormalized) {
  Sampler sampler;
  std::vector<float> logits = random_logits(5000, 31, 4.0);
  logits[100] = logits[4000] = 15.0f;  // a tie at the top: lower id first
  logits[200] = -80.0f;
  const auto ref = log_softmax(logits);

  const auto all = Sampler::top_logprobs(logits, 5000);
  ASSERT_EQ(all.size(), 5000u);
  double sum = 0.0;
  for (const auto& t : all) sum += std::exp(static_cast<double>(t.logprob));
  EXPECT_NEAR(sum, 1.0, 1e-5);
  // Sorted by the raw logits (two logits a float apart may round to one logprob): ties of the
  // logits go to the lower id.
  for (size_t i = 1; i < all.size(); ++i) {
    const float a = logits[all[i - 1].token_id], b = logits[all[i].token_id];
    ASSERT_GE(all[i - 1].logprob, all[i].logprob) << i;
    ASSERT_TRUE(a > b || (a == b && all[i - 1].token_id < all[i].token_id)) << i;
  }
  for (const auto& t : all) ASSERT_NEAR(t.logprob, ref[t.token_id], 2e-5) << t.token_id;
  EXPECT_EQ(all[0].token_id, 100);
  EXPECT_EQ(all[1].token_id, 4000);
  EXPECT_TRUE(Sampler::top_logprobs(logits, 0).empty());
  EXPECT_EQ(Sampler::top_logprobs(logits, 9999).size(), 5000u);
  const auto top3 = Sampler::top_logprobs(logits, 3);
  ASSERT_EQ(top3.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(top3[i].token_id, all[i].token_id);

  // The chosen token's logprob is the raw one even when processing forced it and it is not in
  // the top list.
  SamplingParams params = greedy_params();
  params.logprobs = 4;
  params.logit_bias = {{200, 100.0f}};
  Rng rng(1);
  const SampledToken forced = sampler.sample(logits, params, {}, rng);
  EXPECT_EQ(forced.token_id, 200);
  EXPECT_NEAR(forced.logprob, ref[200], 1e-4);
  ASSERT_EQ(forced.top.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(forced.top[i].token_id, all[i].token_id);
    EXPECT_NEAR(forced.top[i].logprob, ref[all[i].token_id], 2e-5);
  }
  // Sampled tokens at a temperature: still the raw logprob.
  SamplingParams hot;
  hot.temperature = 1.7f;
  hot.logprobs = 0;
  for (int d = 0; d < 200; ++d) {
    const SampledToken s = sampler.sample(logits, hot, {}, rng);
    EXPECT_TRUE(s.top.empty());
    ASSERT_NEAR(s.logprob, ref[s.token_id], 2e-5);
  }
  // Not requested: not computed.
  SamplingParams none;
  const SampledToken plain = sampler.sample(logits, none, {}, rng);
  EXPECT_EQ(plain.logprob, 0.0f);
  EXPECT_TRUE(plain.top.empty());
}

TEST(Sampler, LogprobsOverWideRangeOfLogits) {
  // Exercises the exp approximation over its whole range against std::exp.
  std::vector<float> logits(4096);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = -90.0f + 100.0f * static_cast<float>(i) / 4096.0f;
  logits[17] = -kInf;
  const auto ref = log_softmax(logits);
  const auto all = Sampler::top_logprobs(logits, 4096);
  for (const auto& t : all) {
    if (t.token_id == 17) {
      EXPECT_EQ(t.logprob, -kInf);
      continue;
    }
    ASSERT_NEAR(t.logprob, ref[t.token_id], 2e-5) << t.token_id;
  }
}

}  // namespace
}  // namespace duet
