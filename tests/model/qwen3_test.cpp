// The qwen3 forward pass (DeepSeek-R1-0528-Qwen3-8B) against properties it must have whatever
// its weights: each query and key head normalized on its own (scaling one head's projection rows
// changes nothing), keys normalized before they are cached (a prompt run in pieces gives the logits
// of one run), YaRN's magnitude factor on the rotary (an attn_factor a is q and k norms scaled by
// a), the real shape, and a missing norm named. Its logits against an independent reference are
// tests/reference's (qwen3_reference.py).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/formats/gguf_writer.h"
#include "duet/model/model.h"
#include "duet/model/synthetic.h"
#include "model_fixture.h"

namespace duet {
namespace {

class Qwen3Test : public ModelFileTest {};

// max |a - b| over the largest |a|: the logits' own scale.
double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float mag = 0.0f, diff = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    mag = std::max(mag, std::fabs(a[i]));
    diff = std::max(diff, std::fabs(a[i] - b[i]));
  }
  return diff / (1.0 + mag);
}

// Multiplies the f32 values of `bytes` in [begin, end) by `factor`.
void scale_f32(std::vector<uint8_t>& bytes, int64_t begin, int64_t end, float factor) {
  for (int64_t i = begin; i < end; ++i) {
    float v;
    std::memcpy(&v, bytes.data() + i * 4, 4);
    v *= factor;
    std::memcpy(bytes.data() + i * 4, &v, 4);
  }
}

const auto keep_all = [](const std::string&, DType&, std::vector<int64_t>&, std::vector<uint8_t>&) { return true; };
const auto same_keys = [](GgufWriter&) {};

TEST_F(Qwen3Test, PresetsHaveTheRealShapes) {
  const SyntheticSpec s = synthetic_preset("r1-0528-qwen3-8b");
  EXPECT_EQ(s.architecture, "qwen3");
  EXPECT_EQ(s.hidden_size, 4096);
  EXPECT_EQ(s.num_layers, 36);
  EXPECT_EQ(s.num_heads, 32);
  EXPECT_EQ(s.num_kv_heads, 8);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.intermediate_size, 12288);
  EXPECT_EQ(s.num_vocab, 151936);
  EXPECT_EQ(s.context_length, 131072);
  EXPECT_DOUBLE_EQ(s.rope_base, 1000000.0);
  EXPECT_DOUBLE_EQ(s.rope_scale, 4.0);
  EXPECT_EQ(s.yarn_original_context, 32768);
  // The config's attn_factor cancels YaRN's magnitude factor.
  EXPECT_NEAR(s.yarn_attn_factor * (1.0 + 0.1 * std::log(4.0)), 1.0, 1e-9);

  // The tiny preset as loaded: heads of 48 (not 128 / 4), YaRN's parameters in the rope.
  auto m = load(write_model("tiny.gguf", DType::kF32, synthetic_preset("qwen3-tiny")));
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.architecture, "qwen3");
  EXPECT_EQ(c.head_dim, 48);
  EXPECT_EQ(c.rope.dim, 48);
  EXPECT_EQ(c.rope.mode, RopeMode::kNeox);
  EXPECT_DOUBLE_EQ(c.rope.freq_scale, 0.25);
  EXPECT_DOUBLE_EQ(c.rope.yarn_orig_ctx, 1024.0);
  EXPECT_DOUBLE_EQ(c.rope.yarn_beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.yarn_beta_slow, 1.0);
  EXPECT_NEAR(c.rope.attn_factor, 1.0 + 0.1 * std::log(4.0), 1e-12);
  EXPECT_EQ(m->cache_k_dim(), 2 * 48);
}

// RMSNorm of each head on its own: scaling one query head's rows of attn_q (or one kv head's of
// attn_k) by a positive factor leaves every logit where it was; a norm over all heads at once
// would move the other heads. Scaling a head's rows of attn_v, which has no norm, must move them
// (the check is not vacuous).
TEST_F(Qwen3Test, EachQueryAndKeyHeadIsNormalizedOnItsOwn) {
  const SyntheticSpec s = synthetic_preset("qwen3-tiny");
  const std::string base = write_model("base.gguf", DType::kF32, s);
  const int64_t hd = s.head_dim, d = s.hidden_size;
  const auto scaled = [&](const std::string& name, const std::string& tensor, int64_t head, float factor) {
    const std::string path = (dir_ / name).string();
    rewrite_gguf(
        base, path,
        [&](const std::string& n, DType&, std::vector<int64_t>&, std::vector<uint8_t>& bytes) {
          if (n.ends_with(tensor)) scale_f32(bytes, head * hd * d, (head + 1) * hd * d, factor);
          return true;
        },
        same_keys);
    return path;
  };
  const std::vector<int32_t> tokens = some_tokens(40, static_cast<int32_t>(s.num_vocab), 3);
  const std::vector<float> want = all_logits(*load(base), tokens, KvDtype::kF32);
  const std::vector<float> q = all_logits(*load(scaled("q.gguf", "attn_q.weight", 2, 7.0f)), tokens, KvDtype::kF32);
  const std::vector<float> k = all_logits(*load(scaled("k.gguf", "attn_k.weight", 1, 2.5f)), tokens, KvDtype::kF32);
  const std::vector<float> v = all_logits(*load(scaled("v.gguf", "attn_v.weight", 1, 3.0f)), tokens, KvDtype::kF32);
  EXPECT_LE(relative_diff(want, q), 1e-5);
  EXPECT_LE(relative_diff(want, k), 1e-5);
  EXPECT_GT(relative_diff(want, v), 1e-2);
}

// The keys are normalized before they are cached: a prompt run in three pieces (prefill, a
// chunk, then token by token) gives the logits of one run at every position.
TEST_F(Qwen3Test, PiecesOfAPromptGiveTheLogitsOfOneRun) {
  const SyntheticSpec s = synthetic_preset("qwen3-tiny");
  auto m = load(write_model("m.gguf", DType::kF32, s));
  const int64_t vocab = s.num_vocab;
  const std::vector<int32_t> tokens = some_tokens(50, static_cast<int32_t>(vocab), 5);
  const std::vector<float> whole = all_logits(*m, tokens, KvDtype::kF32);
  SequenceRunner runner(*m, 64, 16, KvDtype::kF32);
  std::vector<float> pieces(whole.size());
  runner.forward(std::span(tokens).first(20), 0, pieces.data(), true);
  runner.forward(std::span(tokens).subspan(20, 25), 20, pieces.data() + 20 * vocab, true);
  for (int64_t p = 45; p < 50; ++p) {
    runner.forward(std::span(tokens).subspan(static_cast<size_t>(p), 1), p, pieces.data() + p * vocab, false);
  }
  EXPECT_LE(relative_diff(whole, pieces), 1e-5);
}

// YaRN's magnitude factor multiplies cos and sin, so q and k, so every score by its square: a file
// with yarn_attn_factor a gives the logits of the same file without it and with both head norms'
// weights times a. Without either, the logits differ (the factor is applied at all).
TEST_F(Qwen3Test, YarnAttnFactorScalesTheRotary) {
  const SyntheticSpec s = synthetic_preset("qwen3-tiny");
  const std::string base = write_model("base.gguf", DType::kF32, s);
  const float a = 0.6f;
  const std::string with_key = (dir_ / "key.gguf").string(), with_norms = (dir_ / "norms.gguf").string();
  rewrite_gguf(base, with_key, keep_all,
               [&](GgufWriter& w) { w.set("qwen3.rope.scaling.yarn_attn_factor", GgufValue::f32(a)); });
  rewrite_gguf(
      base, with_norms,
      [&](const std::string& n, DType&, std::vector<int64_t>& shape, std::vector<uint8_t>& bytes) {
        if (n.ends_with("attn_q_norm.weight") || n.ends_with("attn_k_norm.weight")) scale_f32(bytes, 0, shape[0], a);
        return true;
      },
      same_keys);
  const std::vector<int32_t> tokens = some_tokens(30, static_cast<int32_t>(s.num_vocab), 7);
  const std::vector<float> by_key = all_logits(*load(with_key), tokens, KvDtype::kF32);
  const std::vector<float> by_norms = all_logits(*load(with_norms), tokens, KvDtype::kF32);
  EXPECT_LE(relative_diff(by_key, by_norms), 1e-5);
  EXPECT_GT(relative_diff(by_key, all_logits(*load(base), tokens, KvDtype::kF32)), 1e-3);
}

TEST_F(Qwen3Test, MissingOrMisshapenNormsAreNamed) {
  const SyntheticSpec s = synthetic_preset("qwen3-tiny");
  const std::string base = write_model("base.gguf", DType::kF32, s);
  const std::string bad = (dir_ / "bad.gguf").string();
  rewrite_gguf(
      base, bad,
      [](const std::string& n, DType&, std::vector<int64_t>& shape, std::vector<uint8_t>& bytes) {
        if (n == "blk.1.attn_k_norm.weight") return false;
        if (n == "blk.0.attn_q_norm.weight") {  // the model's width, not a head's
          shape = {128};
          bytes.resize(128 * 4);
        }
        return true;
      },
      same_keys);
  try {
    (void)load(bad);
    FAIL() << "loaded a qwen3 model without its norms";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("blk.1.attn_k_norm.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("blk.0.attn_q_norm.weight"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace duet
