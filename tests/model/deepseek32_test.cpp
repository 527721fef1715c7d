// DeepSeek-V3.2 (architecture deepseek32): deepseek2 with a lightning indexer that keeps each
// query's index_topk best positions. What the float64 reference (tests/reference) cannot see from
// outside: the indexer's keys live in the cache (a prompt in pieces, token by token or in one
// batch with other sequences gives the bits of one prefill), a query with no more positions than
// top-k attends to all of them (V3's bits exactly), the choice does change what attends, and bad
// files are refused naming the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "duet/core/error.h"
#include "model_fixture.h"

namespace duet {
namespace {

class Deepseek32Test : public ModelFileTest {
 protected:
  std::unique_ptr<Model> load_exact(const std::string& path) {
    return load_model(std::make_shared<const GgufFile>(GgufFile::open(path)), *exact_);
  }
  std::unique_ptr<Backend> exact_ = make_cpu_backend(2, MatmulMode::kExact);
};

SyntheticSpec tiny(int64_t topk) {
  SyntheticSpec s = synthetic_preset("deepseek32-tiny");
  s.index_topk = topk;
  return s;
}

// With rope parts of 32: latent rows of 32 + 32, which a q8_0 cache holds (the preset's 40 not).
SyntheticSpec tiny_q8_cache(int64_t topk) {
  SyntheticSpec s = tiny(topk);
  s.qk_rope_head_dim = 32;
  return s;
}

TEST_F(Deepseek32Test, PresetsAndCacheRows) {
  const SyntheticSpec real = synthetic_preset("deepseek-v3.2");
  EXPECT_EQ(real.architecture, "deepseek32");
  EXPECT_EQ(real.index_heads, 64);
  EXPECT_EQ(real.index_head_dim, 128);
  EXPECT_EQ(real.index_topk, 2048);
  EXPECT_EQ(real.q_lora_rank, 1536);
  EXPECT_EQ(real.num_experts, 256);

  const SyntheticSpec s = synthetic_preset("deepseek32-tiny");
  auto model = load(write_model("m.gguf", DType::kF32, s));
  EXPECT_EQ(model->config().architecture, "deepseek32");
  EXPECT_EQ(model->cache_k_dim(), s.kv_lora_rank + s.qk_rope_head_dim);
  EXPECT_EQ(model->cache_v_dim(), s.index_head_dim);  // the indexer's key
  EXPECT_EQ(model->kv_bytes_per_token(KvDtype::kF32),
            s.num_layers * (s.kv_lora_rank + s.qk_rope_head_dim + s.index_head_dim) *
                static_cast<int64_t>(sizeof(float)));
  // q8_0 holds rows of 32: 32-wide indexer keys fit, 48-wide ones do not.
  auto wide_rope = load(write_model("q8.gguf", DType::kF32, tiny_q8_cache(8)));
  EXPECT_NO_THROW(wide_rope->new_kv_cache(4, 16, KvDtype::kQ8_0));
  SyntheticSpec narrow = tiny_q8_cache(8);
  narrow.index_head_dim = 48;
  auto narrow_model = load(write_model("narrow.gguf", DType::kF32, narrow));
  try {
    narrow_model->new_kv_cache(4, 16, KvDtype::kQ8_0);
    FAIL() << "a q8_0 cache took 48-wide indexer keys";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("V rows 48"), std::string::npos) << e.what();
  }
}

// With top-k at least the prompt's length nothing is dropped: the bits of deepseek2 on the same
// weights (the presets share every tensor but the indexer's, same seed). With top-k 8 the first 8
// positions are still V3's and later ones differ.
TEST_F(Deepseek32Test, DenseUpToTopKAndSparseBeyond) {
  auto v3 = load_exact(write_model("v3.gguf", DType::kQ8_0, synthetic_preset("deepseek2-tiny-v3")));
  auto wide = load_exact(write_model("wide.gguf", DType::kQ8_0, tiny(1000)));
  auto sparse = load_exact(write_model("sparse.gguf", DType::kQ8_0, tiny(8)));
  const int64_t vocab = v3->config().num_vocab;
  const std::vector<int32_t> tokens = some_tokens(40, static_cast<int32_t>(vocab), 3);
  const std::vector<float> a = all_logits(*v3, tokens, KvDtype::kF32);
  const std::vector<float> b = all_logits(*wide, tokens, KvDtype::kF32);
  const std::vector<float> c = all_logits(*sparse, tokens, KvDtype::kF32);
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::vector<float>(a.begin(), a.begin() + 8 * vocab), std::vector<float>(c.begin(), c.begin() + 8 * vocab));
  int differing = 0;
  float largest = 0.0f;
  for (int64_t p = 8; p < 40; ++p) {
    const float d = max_diff(a.data() + p * vocab, c.data() + p * vocab, vocab);
    differing += d > 0.0f;
    largest = std::max(largest, d);
  }
  EXPECT_EQ(differing, 32) << "every position past the 8th attends to 8 of its positions";
  EXPECT_GT(largest, 0.1f);
  std::printf("top-8 against dense: positions 9-40 move by up to %.3g\n", largest);
}

// The indexer's keys are cached: token by token, in chunks (a chunk's first queries dense, its
// later ones sparse) and after a prefix, the bits of one prefill, for every cache type.
TEST_F(Deepseek32Test, IncrementalAndChunkedMatchFullPrefill) {
  for (DType type : {DType::kF32, DType::kQ8_0}) {
    auto model = load_exact(write_model("m.gguf", type, tiny_q8_cache(6)));
    const int64_t vocab = model->config().num_vocab;
    const std::vector<int32_t> tokens = some_tokens(37, static_cast<int32_t>(vocab), 11);
    const int64_t n = static_cast<int64_t>(tokens.size());
    for (KvDtype kv : {KvDtype::kF32, KvDtype::kF16, KvDtype::kQ8_0}) {
      const std::string what = std::string(dtype_name(type)) + " weights, " + std::string(kv_dtype_name(kv)) + " cache";
      const std::vector<float> all = all_logits(*model, tokens, kv);
      SequenceRunner one_by_one(*model, n, 4, kv);
      std::vector<float> one(static_cast<size_t>(vocab));
      for (int64_t i = 0; i < n; ++i) {
        one_by_one.forward(std::span<const int32_t>(&tokens[i], 1), i, one.data(), false);
        ASSERT_EQ(max_diff(one.data(), all.data() + i * vocab, vocab), 0.0f) << what << ", position " << i;
      }
      // Chunks of 4, 9 (dense then sparse: positions 4..12 around top-k 6) and the rest.
      SequenceRunner chunked(*model, n, 8, kv);
      std::vector<float> got(static_cast<size_t>(n * vocab));
      int64_t pos = 0;
      for (int64_t len : {int64_t{4}, int64_t{9}, n - 13}) {
        chunked.forward(std::span<const int32_t>(tokens.data() + pos, len), pos, got.data() + pos * vocab, true);
        pos += len;
      }
      ASSERT_EQ(got, all) << what;
    }
  }
}

// Sequences at different depths in one step (blocks interleaved in one cache, some dense, some
// sparse, some decoding), each with exactly its logits alone.
TEST_F(Deepseek32Test, BatchedStepEqualsEachSequenceAlone) {
  auto model = load_exact(write_model("m.gguf", DType::kQ8_0, tiny(5)));
  const int64_t vocab = model->config().num_vocab;
  const int32_t v = static_cast<int32_t>(vocab), bs = 4;
  const std::vector<std::vector<int32_t>> seqs = {{5}, some_tokens(9, v, 1), some_tokens(4, v, 2),
                                                  some_tokens(23, v, 3), some_tokens(41, v, 4)};
  // Step 1: all but the last token of the longer ones; step 2: those last tokens.
  std::vector<size_t> split;
  for (const auto& sq : seqs) split.push_back(sq.size() > 4 ? sq.size() - 1 : sq.size());
  const std::vector<std::vector<float>> batched = two_step_last_logits(*model, seqs, split, bs);
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(max_diff(batched[i].data(), last_logits(*model, seqs[i]).data(), vocab), 0.0f) << "sequence " << i;
  }
}

// The fast mode: a prompt of 600 tokens keeping 128 positions each, long enough for V3's prefill to
// take the expanded form, stays absorbed past the 128th (see attention()) and attends sparsely, as
// decode does: one prefill = token by token to f32 rounding, and not the dense model's logits.
// Under deepseek32_test_head_groups (DUET_MLA_EXPAND_MIB=1) the queries' scores go in groups of 109.
TEST_F(Deepseek32Test, FastModeLongPromptIsSparse) {
  auto model = load(write_model("m.gguf", DType::kF32, tiny(128)));
  auto dense = load(write_model("dense.gguf", DType::kF32, tiny(1000)));
  const int64_t vocab = model->config().num_vocab, n = 600;
  const std::vector<int32_t> tokens = some_tokens(n, static_cast<int32_t>(vocab), 9);
  const std::vector<float> all = all_logits(*model, tokens, KvDtype::kF32);
  const std::vector<float> all_dense = all_logits(*dense, tokens, KvDtype::kF32);
  SequenceRunner one_by_one(*model, n, 16, KvDtype::kF32);
  std::vector<float> one(static_cast<size_t>(vocab));
  const auto [lo, hi] = std::minmax_element(all.begin(), all.end());
  const float tol = 1e-4f * (*hi - *lo);
  for (int64_t i = 0; i < n; ++i) {
    one_by_one.forward(std::span<const int32_t>(&tokens[i], 1), i, one.data(), false);
    ASSERT_LE(max_diff(one.data(), all.data() + i * vocab, vocab), tol) << "position " << i;
  }
  EXPECT_GT(max_diff(all.data() + (n - 1) * vocab, all_dense.data() + (n - 1) * vocab, vocab), 0.1f);
}

TEST_F(Deepseek32Test, BadFilesGetErrorsThatNameTheProblem) {
  const std::string good = write_model("good.gguf", DType::kF32, tiny(8));
  const auto expect_error = [&](const std::string& path, const std::string& needle) {
    try {
      load(path);
      FAIL() << "loaded " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::string dropped = (dir_ / "dropped.gguf").string();
  rewrite_gguf(
      good, dropped,
      [](const std::string& name, DType&, std::vector<int64_t>&, std::vector<uint8_t>&) {
        return name != "blk.1.indexer.k_norm.bias";
      },
      [](GgufWriter&) {});
  expect_error(dropped, "blk.1.indexer.k_norm.bias");
  const std::string no_topk = (dir_ / "no_topk.gguf").string();
  rewrite_gguf(
      good, no_topk, [](const std::string&, DType&, std::vector<int64_t>&, std::vector<uint8_t>&) { return true; },
      [](GgufWriter& w) { w.set("deepseek32.attention.indexer.top_k", GgufValue::u32(0)); });
  expect_error(no_topk, "deepseek32.attention.indexer.top_k");
  const std::string narrow = (dir_ / "narrow.gguf").string();
  rewrite_gguf(
      good, narrow, [](const std::string&, DType&, std::vector<int64_t>&, std::vector<uint8_t>&) { return true; },
      [](GgufWriter& w) { w.set("deepseek32.attention.indexer.key_length", GgufValue::u32(4)); });
  expect_error(narrow, "less than the 8 rotated dimensions");
  SyntheticSpec direct = tiny(8);
  direct.q_lora_rank = 0;
  EXPECT_THROW(write_model("direct.gguf", DType::kF32, direct), Error);  // the writer refuses it too
  SyntheticSpec plain = synthetic_preset("deepseek2-tiny-v3");
  plain.index_topk = 8;
  EXPECT_THROW(write_model("plain.gguf", DType::kF32, plain), Error);
}

}  // namespace
}  // namespace duet
