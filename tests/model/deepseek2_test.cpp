// The deepseek2 forward pass (MLA attention over a latent cache, mixture of experts) against
// itself: token by token, in chunks and in batched paged steps it gives what one prefill gives;
// the cache holds one latent row per token; bad files get errors that name the problem. Its
// numbers against DeepSeek's own modeling code are tests/reference's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/core/quant.h"
#include "duet/formats/gguf_writer.h"
#include "duet/model/model.h"
#include "duet/model/synthetic.h"
#include "../formats/safetensors_fixture.h"
#include "model_fixture.h"

namespace duet {
namespace {

class Deepseek2Test : public ModelFileTest {};
using testing::safetensors_bytes;
using testing::StTensor;

TEST_F(Deepseek2Test, PresetsHaveTheRealShapes) {
  const SyntheticSpec lite = synthetic_preset("deepseek-v2-lite");
  EXPECT_EQ(lite.architecture, "deepseek2");
  EXPECT_EQ(lite.hidden_size, 2048);
  EXPECT_EQ(lite.num_layers, 27);
  EXPECT_EQ(lite.q_lora_rank, 0);
  EXPECT_EQ(lite.kv_lora_rank, 512);
  EXPECT_EQ(lite.qk_rope_head_dim, 64);
  EXPECT_EQ(lite.num_experts, 64);
  EXPECT_EQ(lite.num_experts_used, 6);
  EXPECT_EQ(lite.num_shared_experts, 2);
  EXPECT_EQ(lite.expert_gating_func, 1u);
  const SyntheticSpec v3 = synthetic_preset("deepseek-v3");
  EXPECT_EQ(v3.hidden_size, 7168);
  EXPECT_EQ(v3.num_layers, 61);
  EXPECT_EQ(v3.q_lora_rank, 1536);
  EXPECT_EQ(v3.num_experts, 256);
  EXPECT_EQ(v3.num_experts_used, 8);
  EXPECT_EQ(v3.num_expert_groups, 8);
  EXPECT_EQ(v3.num_expert_groups_used, 4);
  EXPECT_EQ(v3.num_dense_layers, 3);
  EXPECT_EQ(v3.expert_gating_func, 2u);
  EXPECT_TRUE(v3.expert_weights_norm);
  EXPECT_DOUBLE_EQ(v3.expert_weights_scale, 2.5);
}

// The cache holds the compressed latent and the shared rope key per token and layer, nothing per
// head: V2-Lite's (512 + 64) floats per layer instead of 16 heads x (192 + 128).
TEST_F(Deepseek2Test, CachesOneLatentRowPerToken) {
  for (const char* preset : {"deepseek2-tiny-v2", "deepseek2-tiny-v3"}) {
    const SyntheticSpec s = synthetic_preset(preset);
    auto model = load(write_model("m.gguf", DType::kF32, s));
    const ModelConfig& c = model->config();
    EXPECT_EQ(c.architecture, "deepseek2");
    EXPECT_EQ(model->cache_k_dim(), s.kv_lora_rank + s.qk_rope_head_dim) << preset;
    EXPECT_EQ(model->cache_v_dim(), 0) << preset;
    EXPECT_EQ(model->kv_bytes_per_token(KvDtype::kF32),
              s.num_layers * (s.kv_lora_rank + s.qk_rope_head_dim) * static_cast<int64_t>(sizeof(float)));
    EXPECT_EQ(model->kv_bytes_per_token(KvDtype::kF16), model->kv_bytes_per_token(KvDtype::kF32) / 2);
    const int64_t per_head = s.num_heads * (s.qk_nope_head_dim + s.qk_rope_head_dim + s.v_head_dim);
    EXPECT_LT(model->cache_k_dim(), per_head) << preset;
  }
}

// A prefill of more than 128 tokens attends in the expanded form (the fast mode), token by token
// in the absorbed one: with f32 weights both are exact, so they agree to f32 rounding. A q8_0
// model's fast mode decompresses through the int8 kernels (another rounding: see
// ExpandedPrefillIsAsCloseToExactAsDecode), so its forms are compared in the exact mode, where
// the promise is the same bits however the prompt is cut.
TEST_F(Deepseek2Test, IncrementalAndChunkedMatchFullPrefill) {
  auto exact = make_cpu_backend(2, MatmulMode::kExact);
  for (const char* preset : {"deepseek2-tiny-v2", "deepseek2-tiny-v3"}) {
    for (DType type : {DType::kF32, DType::kQ8_0}) {
      const std::string path = write_model("m.gguf", type, synthetic_preset(preset));
      auto model = type == DType::kF32 ? load(path) : load_model(std::make_shared<const GgufFile>(GgufFile::open(path)), *exact);
      const int64_t vocab = model->config().num_vocab;
      // 150 tokens: one prefill of them, and a chunk of 146 after 4, attend expanded.
      const std::vector<int32_t> tokens = some_tokens(150, static_cast<int32_t>(vocab), 5);
      const int64_t n = static_cast<int64_t>(tokens.size());
      const std::vector<float> all = all_logits(*model, tokens);
      // One form (exact mode): the same bits up to 1e-4; two forms (f32 weights): f32 rounding,
      // 1e-4 of the logits' range over 150 positions.
      const auto [lo_all, hi_all] = std::minmax_element(all.begin(), all.end());
      const float tol = type == DType::kF32 ? 1e-4f * (*hi_all - *lo_all) : 1e-4f;

      SequenceRunner one_by_one(*model, n, 4);
      std::vector<float> one(static_cast<size_t>(vocab));
      for (int64_t i = 0; i < n; ++i) {
        one_by_one.forward(std::span<const int32_t>(&tokens[i], 1), i, one.data(), false);
        ASSERT_LE(max_diff(one.data(), all.data() + i * vocab, vocab), tol)
            << preset << " " << dtype_name(type) << " pos " << i;
      }
      SequenceRunner chunked(*model, n, 8);
      std::vector<float> chunk(static_cast<size_t>((n - 4) * vocab));
      chunked.forward(std::span<const int32_t>(tokens.data(), 4), 0, chunk.data(), true);
      chunked.forward(std::span<const int32_t>(tokens.data() + 4, n - 4), 4, chunk.data(), true);
      ASSERT_LE(max_diff(chunk.data(), all.data() + 4 * vocab, (n - 4) * vocab), tol)
          << preset << " " << dtype_name(type);
      float lo = all[0], hi = all[0];
      for (float x : all) {
        ASSERT_TRUE(std::isfinite(x));
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      EXPECT_GT(hi - lo, 1.0f);
    }
  }
}

// Sequences of different lengths in one step, blocks interleaved in one latent cache, some
// prefilling after a cached prefix and some decoding: each gets exactly its logits alone. With
// q8_0 weights in the exact mode (the same bits however a prompt is cut), and with f32 weights in
// the fast mode, whose steps mix the two forms (the first step's 147-token prompt expanded, the
// others and the second step's three tokens after a longer prefix absorbed) and agree to f32
// rounding.
class Deepseek2BatchTest : public Deepseek2Test, public ::testing::WithParamInterface<bool> {};

TEST_P(Deepseek2BatchTest, BatchedPagedStepEqualsEachSequenceAlone) {
  const bool fast = GetParam();
  auto exact = make_cpu_backend(2, MatmulMode::kExact);
  const std::string path = write_model("m.gguf", fast ? DType::kF32 : DType::kQ8_0, synthetic_preset("deepseek2-tiny-v3"));
  auto model = fast ? load(path) : load_model(std::make_shared<const GgufFile>(GgufFile::open(path)), *exact);
  const int64_t vocab = model->config().num_vocab;
  const int32_t v = static_cast<int32_t>(vocab);
  const int32_t bs = 4;
  std::vector<std::vector<int32_t>> seqs = {{5}, some_tokens(9, v, 1), {v - 1, 3}, some_tokens(6, v, 2),
                                            some_tokens(23, v, 3), some_tokens(150, v, 4)};
  std::vector<size_t> split;
  for (const auto& sq : seqs) split.push_back(sq.size() > 3 ? sq.size() - 3 : sq.size());
  const std::vector<std::vector<float>> batched = two_step_last_logits(*model, seqs, split, bs);
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_LE(max_diff(batched[i].data(), last_logits(*model, seqs[i]).data(), vocab), 1e-4) << "seq " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(ExactAndFast, Deepseek2BatchTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "FastF32" : "ExactQ8_0"; });

// The fast mode's two forms round differently with q8_0 weights (the expanded form's keys and
// values are made from int8 latents, the absorbed form's W_UV takes the int8 attention output):
// a prompt's logits in one prefill (expanded) are typically no farther from the exact mode's than
// the same tokens decoded one at a time (absorbed), and they do differ (the expanded form ran).
// Typically: the median over positions of each position's largest difference, because at a few
// positions a near-tie among the experts flips under either rounding (a jump of a whole logit in
// both forms, at different positions).
TEST_F(Deepseek2Test, ExpandedPrefillIsAsCloseToExactAsDecode) {
  auto fast = make_cpu_backend(2, MatmulMode::kFast);
  auto exact = make_cpu_backend(2, MatmulMode::kExact);
  if (!fast->expands_mla_prefill()) GTEST_SKIP() << "DUET_MLA_PREFILL=absorbed: the fast mode does not expand";
  for (const char* preset : {"deepseek2-tiny-v2", "deepseek2-tiny-v3"}) {
    const std::string path = write_model("m.gguf", DType::kQ8_0, synthetic_preset(preset));
    auto f = load_model(std::make_shared<const GgufFile>(GgufFile::open(path)), *fast);
    auto e = load_model(std::make_shared<const GgufFile>(GgufFile::open(path)), *exact);
    const int64_t vocab = f->config().num_vocab;
    const std::vector<int32_t> tokens = some_tokens(160, static_cast<int32_t>(vocab), 9);  // expanded past 128
    const int64_t n = static_cast<int64_t>(tokens.size());
    const std::vector<float> expanded = all_logits(*f, tokens), reference = all_logits(*e, tokens);
    std::vector<float> decoded(static_cast<size_t>(n * vocab));
    SequenceRunner runner(*f, n, 4);
    for (int64_t i = 0; i < n; ++i) {
      runner.forward(std::span<const int32_t>(&tokens[i], 1), i, decoded.data() + i * vocab, false);
    }
    // From position 1 (the first token alone is expanded too).
    auto median_error = [&](const std::vector<float>& x) {
      std::vector<float> worst;
      for (int64_t i = 1; i < n; ++i) worst.push_back(max_diff(x.data() + i * vocab, reference.data() + i * vocab, vocab));
      std::nth_element(worst.begin(), worst.begin() + static_cast<ptrdiff_t>(worst.size() / 2), worst.end());
      return worst[worst.size() / 2];
    };
    const float e_expanded = median_error(expanded), e_decoded = median_error(decoded);
    EXPECT_GT(max_diff(expanded.data() + vocab, decoded.data() + vocab, (n - 1) * vocab), 0.0f) << preset;
    EXPECT_LE(e_expanded, 2 * e_decoded) << preset;
    std::printf("%s q8_0, fast against exact, median over positions: one prefill (expanded) %.4f, decoded "
                "(absorbed) %.4f\n",
                preset, e_expanded, e_decoded);
  }
}

// A long prompt in one prefill (expanded; its heads in groups when DUET_MLA_EXPAND_MIB is small:
// tests/model/CMakeLists.txt runs this suite again with 1 MiB, where 1000 keys of tiny-v3's heads
// take groups of 3, 3 and 2) against the exact mode's absorbed form, f32 weights: f32 rounding.
TEST_F(Deepseek2Test, LongPromptExpandedMatchesAbsorbed) {
  auto fast = make_cpu_backend(2, MatmulMode::kFast);
  auto exact = make_cpu_backend(2, MatmulMode::kExact);
  const std::string path = write_model("m.gguf", DType::kF32, synthetic_preset("deepseek2-tiny-v3"));
  auto f = load_model(std::make_shared<const GgufFile>(GgufFile::open(path)), *fast);
  auto e = load_model(std::make_shared<const GgufFile>(GgufFile::open(path)), *exact);
  const int64_t vocab = f->config().num_vocab;
  const std::vector<int32_t> tokens = some_tokens(1000, static_cast<int32_t>(vocab), 4);
  const std::vector<float> a = all_logits(*f, tokens), b = all_logits(*e, tokens);
  float lo = b[0], hi = b[0];
  for (float x : b) lo = std::min(lo, x), hi = std::max(hi, x);
  EXPECT_LE(max_diff(a.data(), b.data(), static_cast<int64_t>(a.size())), 1e-4 * (hi - lo));
}

// Rewrites `src` dropping the tensors `drop` names and applying `meta` to the metadata.
template <typename Drop, typename MetaEdit>
void rewrite(const std::string& src_path, const std::string& dst_path, Drop drop, MetaEdit meta) {
  rewrite_gguf(
      src_path, dst_path,
      [&](const std::string& name, DType&, std::vector<int64_t>&, std::vector<uint8_t>&) { return !drop(name); }, meta);
}

// MLA's latent rows (key and value in one row) in f16 and q8_0 (a latent and a rope part of
// whole blocks, as in every real DeepSeek-V2/V3: 512 + 64). Dense layers only: a random router
// turns q8_0's rounding into other experts, which would measure the router, not the cache.
TEST_F(Deepseek2Test, F16AndQ8_0CachesStayCloseToF32) {
  SyntheticSpec s = synthetic_preset("deepseek2-tiny-v3");
  s.kv_lora_rank = 64;
  s.qk_rope_head_dim = 32;
  s.num_dense_layers = s.num_layers;
  auto model = load(write_model("m.gguf", DType::kF32, s));
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 60; ++i) tokens.push_back((i * 37 + 11) % static_cast<int32_t>(model->config().num_vocab));
  expect_cache_close(*model, tokens, KvDtype::kF16, 5e-3);
  expect_cache_close(*model, tokens, KvDtype::kQ8_0, 5e-2);
  // The preset's latent (32 + 8) is not whole blocks: refused when the cache is made.
  auto preset = load(write_model("preset.gguf", DType::kF32, synthetic_preset("deepseek2-tiny-v3")));
  EXPECT_THROW((void)preset->new_kv_cache(4, 16, KvDtype::kQ8_0), Error);
  try {  // the engine sizes its pool first: the same message there
    (void)preset->kv_bytes_per_token(KvDtype::kQ8_0);
    FAIL() << "a q8_0 pool was sized for a 40-wide latent";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heads are 40 (key) and 32 (value)"), std::string::npos) << e.what();
  }
}

// The fp8 cache holds a latent row of any width (one head a row): whole blocks of 128 as e4m3,
// the rest as halves, the values read with their key row; the sizes the engine plans with.
TEST_F(Deepseek2Test, Fp8CacheTakesLatentRowsOfAnyWidth) {
  auto preset = load(write_model("preset.gguf", DType::kF32, synthetic_preset("deepseek2-tiny-v3")));
  const int64_t layers = preset->config().num_layers;
  EXPECT_EQ(preset->kv_bytes_per_token(KvDtype::kFp8), layers * 40 * 2);  // 32 + 8: halves only
  EXPECT_NE(preset->new_kv_cache(4, 16, KvDtype::kFp8), nullptr);
  SyntheticSpec s = synthetic_preset("deepseek2-tiny-v3");
  s.kv_lora_rank = 128;
  s.num_dense_layers = s.num_layers;  // as above: the cache measured, not a router
  auto model = load(write_model("m.gguf", DType::kF32, s));
  EXPECT_EQ(model->kv_bytes_per_token(KvDtype::kFp8), layers * (132 + 8 * 2));
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 40; ++i) tokens.push_back((i * 37 + 11) % static_cast<int32_t>(model->config().num_vocab));
  expect_cache_close(*model, tokens, KvDtype::kFp8, 0.2);  // measured 0.095: 3 mantissa bits a latent value
}

TEST_F(Deepseek2Test, BadFilesGetErrorsThatNameTheProblem) {
  const std::string base = write_model("m.gguf", DType::kF32, synthetic_preset("deepseek2-tiny-v3"));
  const auto keep_all = [](const std::string&) { return false; };
  const std::string missing = (dir_ / "missing.gguf").string();
  rewrite(
      base, missing, [](const std::string& name) { return name == "blk.1.ffn_up_exps.weight"; }, [](GgufWriter&) {});
  try {
    (void)load(missing);
    FAIL() << "loaded a model without an expert tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.1.ffn_up_exps.weight"), std::string::npos) << e.what();
  }
  const std::string groups = (dir_ / "groups.gguf").string();
  rewrite(base, groups, keep_all, [](GgufWriter& w) { w.set("deepseek2.expert_group_count", GgufValue::u32(3)); });
  try {
    (void)load(groups);
    FAIL() << "loaded 8 experts in 3 groups";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("groups"), std::string::npos) << e.what();
  }
  const std::string gating = (dir_ / "gating.gguf").string();
  rewrite(base, gating, keep_all, [](GgufWriter& w) { w.set("deepseek2.expert_gating_func", GgufValue::u32(7)); });
  try {
    (void)load(gating);
    FAIL() << "loaded an unknown gating function";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("expert_gating_func"), std::string::npos) << e.what();
  }
}

// The unsplit file equivalent to a split one: `joined` (the same weights in the attn_kv_b layout)
// with attn_kv_b replaced by the f32 values the split file's attn_k_b and attn_v_b decode to.
std::string equivalent_joined(const std::string& joined, const std::string& split, const std::string& out,
                              const SyntheticSpec& s) {
  const GgufFile sf = GgufFile::open(split);
  const int64_t H = s.num_heads, rank = s.kv_lora_rank, nope = s.qk_nope_head_dim, vd = s.v_head_dim;
  std::map<std::string, std::vector<uint8_t>> kv_b;
  for (int64_t layer = 0; layer < s.num_layers; ++layer) {
    const std::string pre = "blk." + std::to_string(layer) + ".";
    const GgufTensorInfo* kb = sf.find_tensor(pre + "attn_k_b.weight");  // rows h * rank + k, nope wide
    const GgufTensorInfo* vb = sf.find_tensor(pre + "attn_v_b.weight");  // rows h * vd + j, rank wide
    EXPECT_TRUE(kb != nullptr && vb != nullptr) << pre;
    if (kb == nullptr || vb == nullptr) return "";
    std::vector<float> k_rows(static_cast<size_t>(H * rank * nope)), v_rows(static_cast<size_t>(H * vd * rank));
    for (int64_t r = 0; r < H * rank; ++r) {
      dequantize_row_ref(kb->type, kb->data + r * row_size(kb->type, nope), k_rows.data() + r * nope, nope);
    }
    for (int64_t r = 0; r < H * vd; ++r) {
      dequantize_row_ref(vb->type, vb->data + r * row_size(vb->type, rank), v_rows.data() + r * rank, rank);
    }
    std::vector<float> f(static_cast<size_t>(H * (nope + vd) * rank));  // kv_b rows h * (nope + vd) + i
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < nope; ++i) {
        for (int64_t k = 0; k < rank; ++k) f[((h * (nope + vd) + i) * rank) + k] = k_rows[(h * rank + k) * nope + i];
      }
      for (int64_t j = 0; j < vd; ++j) {
        for (int64_t k = 0; k < rank; ++k) f[((h * (nope + vd) + nope + j) * rank) + k] = v_rows[(h * vd + j) * rank + k];
      }
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(f.data());
    kv_b[pre + "attn_kv_b.weight"] = std::vector<uint8_t>(bytes, bytes + f.size() * sizeof(float));
  }
  const GgufFile jf = GgufFile::open(joined);
  GgufWriter w;
  for (const auto& [k, v] : jf.metadata()) w.set(k, v);
  for (const GgufTensorInfo& t : jf.tensors()) {
    auto replaced = kv_b.find(t.name);
    if (replaced == kv_b.end()) {
      w.add_tensor(t.name, t.type, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    } else {
      w.add_tensor(t.name, DType::kF32, t.shape, std::move(replaced->second));
    }
  }
  EXPECT_TRUE(kv_b.size() == static_cast<size_t>(s.num_layers));
  w.write(out);
  return out;
}

// llama.cpp's newer converters split kv_b per head into attn_k_b (transposed) and attn_v_b and
// describe the heads under key_length_mla / value_length_mla: the same weights in either layout
// give the same logits, bit for bit in f32, f16 and bf16, which store the same values either way.
// In q8_0 attn_k_b's blocks run along the other axis, so its values are rounded otherwise than
// kv_b's: the split q8_0 file is compared with its unsplit equivalent, the joined file whose kv_b
// holds (in f32) exactly the values the split halves decode to, every other tensor the same q8_0
// bytes. With exact matmuls (every weight converted to f32, f32 activations) the two are the same
// computation, and must give the same logits bit for bit.
TEST_F(Deepseek2Test, SplitMlaLayoutGivesTheSameLogits) {
  for (const char* preset : {"deepseek2-tiny-v2", "deepseek2-tiny-v3"}) {
    for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
      SyntheticSpec s = synthetic_preset(preset);
      s.qk_nope_head_dim = 32;  // whole q8_0 blocks along attn_k_b's rows
      auto joined = load(write_model("joined.gguf", type, s));
      s.split_mla = true;
      const std::string split_path = write_model("split.gguf", type, s);
      const GgufFile split_file = GgufFile::open(split_path);
      EXPECT_EQ(split_file.find_tensor("blk.0.attn_kv_b.weight"), nullptr);
      ASSERT_NE(split_file.find_tensor("blk.0.attn_k_b.weight"), nullptr);
      EXPECT_EQ(split_file.find_tensor("blk.0.attn_k_b.weight")->shape,
                (std::vector<int64_t>{s.qk_nope_head_dim, s.kv_lora_rank, s.num_heads}));
      EXPECT_EQ(split_file.find_tensor("blk.0.attn_v_b.weight")->shape,
                (std::vector<int64_t>{s.kv_lora_rank, s.v_head_dim, s.num_heads}));
      EXPECT_EQ(split_file.get_int_or("deepseek2.attention.key_length", 0), s.kv_lora_rank + s.qk_rope_head_dim);
      EXPECT_EQ(split_file.get_int_or("deepseek2.attention.key_length_mla", 0),
                s.qk_nope_head_dim + s.qk_rope_head_dim);
      auto split = load(split_path);
      EXPECT_EQ(split->config().head_dim, joined->config().head_dim);
      EXPECT_EQ(split->cache_k_dim(), joined->cache_k_dim());
      const int64_t vocab = joined->config().num_vocab;
      const std::vector<int32_t> tokens = some_tokens(11, static_cast<int32_t>(vocab), 7);
      const std::vector<float> a = all_logits(*joined, tokens), b = all_logits(*split, tokens);
      const float diff = max_diff(a.data(), b.data(), static_cast<int64_t>(a.size()));
      if (type != DType::kQ8_0) {
        EXPECT_EQ(diff, 0.0f) << preset << " " << dtype_name(type);
        continue;
      }
      const std::string joined_path = (dir_ / "joined.gguf").string();
      s.split_mla = false;
      const std::string equivalent = equivalent_joined(joined_path, split_path, (dir_ / "equal.gguf").string(), s);
      ASSERT_FALSE(equivalent.empty());
      auto exact = make_cpu_backend(2, MatmulMode::kExact);
      auto split_exact = load_model(std::make_shared<const GgufFile>(GgufFile::open(split_path)), *exact);
      auto equal_exact = load_model(std::make_shared<const GgufFile>(GgufFile::open(equivalent)), *exact);
      const std::vector<float> c = all_logits(*split_exact, tokens), d = all_logits(*equal_exact, tokens);
      EXPECT_EQ(max_diff(c.data(), d.data(), static_cast<int64_t>(c.size())), 0.0f) << preset << " q8_0";
      // And the rounding is real: the joined q8_0 file (kv_b rounded along the other axis) differs.
      EXPECT_GT(max_diff(a.data(), b.data(), static_cast<int64_t>(a.size())), 0.0f) << preset;
    }
  }
}

TEST_F(Deepseek2Test, SplitMlaLayoutNamesAMissingHalf) {
  SyntheticSpec s = synthetic_preset("deepseek2-tiny-v2");
  s.split_mla = true;
  const std::string base = write_model("split.gguf", DType::kF32, s);
  const std::string missing = (dir_ / "missing.gguf").string();
  rewrite(
      base, missing, [](const std::string& name) { return name == "blk.2.attn_v_b.weight"; }, [](GgufWriter&) {});
  try {
    (void)load(missing);
    FAIL() << "loaded a model without attn_v_b";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.2.attn_v_b.weight"), std::string::npos) << e.what();
  }
}

// A LoRA adapter (PEFT's layout) on every projection duet updates: the query (direct, or q_a and
// q_b), kv_a, kv_b, o, a dense layer's feed-forward and the shared experts. Its logits are those
// of the model whose weights are W + scale B A (kv_b merged into attn_kv_b, or into attn_k_b and
// attn_v_b in the split layout), though duet runs kv_b's update through the absorbed form
// (A^T (B_k^T q) into each head's query, B_v (A latent) after attention) and never merges.
struct Update {
  std::string hf;    // PEFT's module path inside model.layers.N.
  std::string gguf;  // the tensor it updates (kv_b: attn_kv_b's rows, whatever the layout)
  int64_t in = 0, out = 0;
  std::vector<float> a, b;  // rank x in, out x rank
  int64_t expert = -1;      // a routed expert's: its matrix within the stacked tensor
};

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = (static_cast<float>(x >> 8) / static_cast<float>(1u << 24) - 0.5f) * 2.0f * scale;
  }
  return v;
}

std::vector<uint8_t> raw_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

TEST_F(Deepseek2Test, LoraAdapterEqualsMergedWeights) {
  constexpr int64_t kRank = 4;
  constexpr double kScale = 8.0 / kRank;  // lora_alpha 8
  for (const char* preset : {"deepseek2-tiny-v2", "deepseek2-tiny-v3"}) {
    for (const bool split : {false, true}) {
      SCOPED_TRACE(std::string(preset) + (split ? " split" : ""));
      SyntheticSpec s = synthetic_preset(preset);
      s.split_mla = split;
      const std::string base = write_model("base.gguf", DType::kF32, s);
      const int64_t d = s.hidden_size, H = s.num_heads, qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
      const int64_t nope = s.qk_nope_head_dim, vd = s.v_head_dim, rank = s.kv_lora_rank;
      const int64_t shared = s.expert_intermediate_size * s.num_shared_experts;
      // Every layer's updates, seeded by layer and module.
      std::vector<std::vector<Update>> layers(static_cast<size_t>(s.num_layers));
      uint32_t seed = 1;
      for (int64_t l = 0; l < s.num_layers; ++l) {
        std::vector<Update>& u = layers[static_cast<size_t>(l)];
        if (s.q_lora_rank > 0) {
          u.push_back({"self_attn.q_a_proj", "attn_q_a", d, s.q_lora_rank, {}, {}, -1});
          u.push_back({"self_attn.q_b_proj", "attn_q_b", s.q_lora_rank, H * qk, {}, {}, -1});
        } else {
          u.push_back({"self_attn.q_proj", "attn_q", d, H * qk, {}, {}, -1});
        }
        u.push_back({"self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa", d, rank + s.qk_rope_head_dim, {}, {}, -1});
        u.push_back({"self_attn.kv_b_proj", "attn_kv_b", rank, H * (nope + vd), {}, {}, -1});
        u.push_back({"self_attn.o_proj", "attn_output", H * vd, d, {}, {}, -1});
        if (l < s.num_dense_layers) {
          u.push_back({"mlp.gate_proj", "ffn_gate", d, s.intermediate_size, {}, {}, -1});
          u.push_back({"mlp.up_proj", "ffn_up", d, s.intermediate_size, {}, {}, -1});
          u.push_back({"mlp.down_proj", "ffn_down", s.intermediate_size, d, {}, {}, -1});
        } else {
          u.push_back({"mlp.shared_experts.gate_proj", "ffn_gate_shexp", d, shared, {}, {}, -1});
          u.push_back({"mlp.shared_experts.up_proj", "ffn_up_shexp", d, shared, {}, {}, -1});
          u.push_back({"mlp.shared_experts.down_proj", "ffn_down_shexp", shared, d, {}, {}, -1});
          const int64_t eff = s.expert_intermediate_size;
          for (int64_t e = 0; e < s.num_experts; ++e) {
            const std::string p = "mlp.experts." + std::to_string(e) + ".";
            u.push_back({p + "gate_proj", "ffn_gate_exps", d, eff, {}, {}, e});
            u.push_back({p + "up_proj", "ffn_up_exps", d, eff, {}, {}, e});
            u.push_back({p + "down_proj", "ffn_down_exps", eff, d, {}, {}, e});
          }
        }
        for (Update& x : u) {
          // Sizes whose product moves a projection's output by about a tenth of its own.
          x.a = random_values(static_cast<size_t>(kRank * x.in), seed++, 0.5f / std::sqrt(static_cast<float>(x.in)));
          x.b = random_values(static_cast<size_t>(x.out * kRank), seed++, 0.2f);
        }
      }
      // The PEFT folder.
      const std::filesystem::path folder = dir_ / "adapter";
      std::filesystem::create_directories(folder);
      std::vector<StTensor> tensors;
      for (int64_t l = 0; l < s.num_layers; ++l) {
        for (const Update& x : layers[static_cast<size_t>(l)]) {
          const std::string p = "base_model.model.model.layers." + std::to_string(l) + "." + x.hf;
          tensors.push_back({p + ".lora_A.weight", "F32", {kRank, x.in}, raw_bytes(x.a)});
          tensors.push_back({p + ".lora_B.weight", "F32", {x.out, kRank}, raw_bytes(x.b)});
        }
      }
      {
        std::ofstream(folder / "adapter_config.json") << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "bias": "none"})";
        const std::vector<uint8_t> bytes = safetensors_bytes(tensors);
        std::ofstream(folder / "adapter_model.safetensors", std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      }
      // The merged model: W[o][i] += scale sum_j B[o][j] A[j][i].
      const std::string merged = (dir_ / "merged.gguf").string();
      rewrite_gguf(
          base, merged,
          [&](const std::string& name, DType&, std::vector<int64_t>&, std::vector<uint8_t>& bytes) {
            int64_t l = -1;
            char rest[64] = {};
            if (std::sscanf(name.c_str(), "blk.%ld.%63s", &l, rest) != 2 || l < 0 || l >= s.num_layers) return true;
            const std::string tensor = std::string(rest).substr(0, std::string(rest).rfind(".weight"));
            for (const Update& x : layers[static_cast<size_t>(l)]) {
              // A routed expert's matrix: its rows of the stacked tensor.
              auto* w = reinterpret_cast<float*>(bytes.data()) + std::max<int64_t>(x.expert, 0) * x.out * x.in;
              const bool k_b = x.gguf == "attn_kv_b" && tensor == "attn_k_b", v_b = x.gguf == "attn_kv_b" && tensor == "attn_v_b";
              if (x.gguf != tensor && !k_b && !v_b) continue;
              for (int64_t o = 0; o < x.out; ++o) {
                const int64_t h = o / (nope + vd), k = o % (nope + vd);
                for (int64_t i = 0; i < x.in; ++i) {
                  double delta = 0.0;
                  for (int64_t j = 0; j < kRank; ++j) delta += double{x.b[o * kRank + j]} * x.a[j * x.in + i];
                  const auto add = static_cast<float>(kScale * delta);
                  if (k_b && k < nope) w[(h * rank + i) * nope + k] += add;         // W_UK^T per head
                  else if (v_b && k >= nope) w[(h * vd + (k - nope)) * rank + i] += add;  // W_UV per head
                  else if (!k_b && !v_b) w[o * x.in + i] += add;
                }
              }
            }
            return true;
          },
          [](GgufWriter&) {});

      const std::vector<int32_t> tokens = some_tokens(40, static_cast<int32_t>(s.num_vocab), 9);
      auto with = load(base);
      ASSERT_EQ(with->add_lora_adapter(LoraSource{"all", folder.string()}), 1);
      const int64_t n = static_cast<int64_t>(tokens.size()), vocab = s.num_vocab;
      std::vector<float> adapted(static_cast<size_t>(n * vocab));
      SequenceRunner runner(*with, n, 16, KvDtype::kF32);
      runner.set_lora_adapter(1);
      runner.forward(tokens, 0, adapted.data(), true);
      const std::vector<float> want = all_logits(*load(merged), tokens, KvDtype::kF32);
      const std::vector<float> plain = all_logits(*with, tokens, KvDtype::kF32);  // slot 0: no adapter
      float mag = 0.0f;
      for (float x : want) mag = std::max(mag, std::fabs(x));
      const double err = max_diff(adapted.data(), want.data(), n * vocab) / (1.0 + mag);
      const double moved = max_diff(plain.data(), want.data(), n * vocab) / (1.0 + mag);
      std::printf("%s%s: LoRA against merged weights %.3g (the adapter moves the logits by %.3g)\n", preset,
                  split ? " split" : "", err, moved);
      EXPECT_LE(err, 1e-5);
      EXPECT_GT(moved, 1e-2);
    }
  }
}

// What an adapter may not update is refused, naming it: a dense layer's feed-forward in a layer
// with experts, routed experts in a dense layer, a projection the model does not have.
TEST_F(Deepseek2Test, LoraAdapterRefusals) {
  const SyntheticSpec s = synthetic_preset("deepseek2-tiny-v3");  // layer 0 dense, 1 and 2 MoE
  const std::string base = write_model("base.gguf", DType::kF32, s);
  auto model = load(base);
  const auto expect_refused = [&](int layer, const std::string& module, int64_t in, int64_t out,
                                   const std::string& message) {
    const std::filesystem::path folder = dir_ / ("adapter-" + std::to_string(layer) + "-" + std::to_string(in) + "-" +
                                                 std::to_string(out));
    std::filesystem::create_directories(folder);
    const std::string p = "base_model.model.model.layers." + std::to_string(layer) + "." + module;
    const std::vector<StTensor> t = {{p + ".lora_A.weight", "F32", {2, in}, raw_bytes(std::vector<float>(2 * in, 0.01f))},
                                     {p + ".lora_B.weight", "F32", {out, 2}, raw_bytes(std::vector<float>(2 * out, 0.01f))}};
    std::ofstream(folder / "adapter_config.json") << R"({"peft_type": "LORA", "r": 2, "lora_alpha": 2})";
    const std::vector<uint8_t> bytes = safetensors_bytes(t);
    std::ofstream(folder / "adapter_model.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    try {
      model->add_lora_adapter(LoraSource{"x", folder.string()});
      ADD_FAILURE() << module << " was loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  expect_refused(1, "mlp.gate_proj", s.hidden_size, s.intermediate_size, "layer 1 has no gate_proj");
  expect_refused(0, "mlp.experts.0.gate_proj", s.hidden_size, s.expert_intermediate_size,
                 "layer 0 has no routed experts");
  expect_refused(1, "mlp.experts.8.gate_proj", s.hidden_size, s.expert_intermediate_size,
                 "expert 8 beyond the model's 8");
  expect_refused(1, "self_attn.q_proj", s.hidden_size, s.num_heads * (s.qk_nope_head_dim + s.qk_rope_head_dim),
                 "the deepseek2 model has no q_proj");
}

}  // namespace
}  // namespace duet
