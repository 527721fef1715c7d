// The llama forward pass against itself: all positions at once, token by token through the
// cache, and in chunks must agree; and bad files and inputs get clear errors.
#include <cmath>
#include <filesystem>
#include <vector>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include <gtest/gtest.h>
#include <unistd.h>

#include "duet/core/error.h"
#include "duet/core/memory.h"
#include "duet/formats/gguf_writer.h"
#include "duet/model/model.h"
#include "duet/model/synthetic.h"
#include "model_fixture.h"

namespace duet {
namespace {

class LlamaTest : public ModelFileTest {};

SyntheticSpec small_spec() {
  SyntheticSpec s = synthetic_preset("tiny");
  s.num_vocab = 300;
  return s;
}

// rope_freqs.weight (llama3 scaling as GGUF stores it) divides each pair's frequency: divisors
// of 2 on top of linear scaling 4 are linear scaling 8, to the bit (powers of two).
TEST_F(LlamaTest, RopeFreqsDivideThePairFrequencies) {
  SyntheticSpec a = small_spec();
  a.rope_scale = 4.0;
  SyntheticSpec b = small_spec();
  b.rope_scale = 8.0;
  ThreadPool pool(2);
  GgufWriter wa;
  add_synthetic_llama(wa, a, DType::kF32, 42, pool);
  const int64_t half = a.hidden_size / a.num_heads / 2;
  std::vector<uint8_t> twos(static_cast<size_t>(half) * sizeof(float));
  for (int64_t i = 0; i < half; ++i) {
    const float two = 2.0f;
    std::memcpy(twos.data() + i * sizeof(float), &two, sizeof(float));
  }
  wa.add_tensor("rope_freqs.weight", DType::kF32, {half}, twos);
  wa.write((dir_ / "a.gguf").string());
  GgufWriter wb;
  add_synthetic_llama(wb, b, DType::kF32, 42, pool);
  wb.write((dir_ / "b.gguf").string());
  auto ma = load((dir_ / "a.gguf").string());
  auto mb = load((dir_ / "b.gguf").string());
  ASSERT_EQ(ma->config().rope.freq_factors.size(), static_cast<size_t>(half));
  EXPECT_TRUE(mb->config().rope.freq_factors.empty());
  const std::vector<int32_t> tokens = {1, 17, 255, 3, 99, 0, 299, 42, 7, 7, 8, 120, 33};
  std::vector<float> la(tokens.size() * 300), lb(la.size());
  SequenceRunner(*ma, 32).forward(tokens, 0, la.data(), true);
  SequenceRunner(*mb, 32).forward(tokens, 0, lb.data(), true);
  EXPECT_EQ(la, lb);
  // And they are not the logits without scaling: the divisors were used.
  SyntheticSpec c = small_spec();
  c.rope_scale = 4.0;
  GgufWriter wc;
  add_synthetic_llama(wc, c, DType::kF32, 42, pool);
  wc.write((dir_ / "c.gguf").string());
  std::vector<float> lc(la.size());
  SequenceRunner(*load((dir_ / "c.gguf").string()), 32).forward(tokens, 0, lc.data(), true);
  EXPECT_NE(la, lc);
}

TEST_F(LlamaTest, IncrementalAndChunkedMatchFullPrefill) {
  for (DType type : {DType::kF32, DType::kQ4_0}) {
    auto model = load(write_model("m.gguf", type, small_spec()));
    const ModelConfig& c = model->config();
    EXPECT_EQ(c.num_vocab, 300);
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_DOUBLE_EQ(c.rope.freq_scale, 0.25);
    const std::vector<int32_t> tokens = {1, 17, 255, 3, 99, 0, 299, 42, 7, 7, 8};
    const int64_t n = static_cast<int64_t>(tokens.size());
    std::vector<float> all(static_cast<size_t>(n * c.num_vocab));
    SequenceRunner full(*model, n);
    full.forward(tokens, 0, all.data(), true);

    SequenceRunner one_by_one(*model, n, 4);  // small blocks: a sequence spans several
    std::vector<float> one(static_cast<size_t>(c.num_vocab));
    for (int64_t i = 0; i < n; ++i) {
      one_by_one.forward(std::span<const int32_t>(&tokens[i], 1), i, one.data(), false);
      for (int64_t v = 0; v < c.num_vocab; ++v) {
        ASSERT_NEAR(one[v], all[i * c.num_vocab + v], 1e-4) << dtype_name(type) << " pos " << i << " id " << v;
      }
    }

    SequenceRunner chunked(*model, n, 8);
    std::vector<float> chunk(static_cast<size_t>(4 * c.num_vocab));
    chunked.forward(std::span<const int32_t>(tokens.data(), 4), 0, chunk.data(), true);
    chunked.forward(std::span<const int32_t>(tokens.data() + 4, 7), 4, chunk.data(), false);
    for (int64_t v = 0; v < c.num_vocab; ++v) ASSERT_NEAR(chunk[v], all[(n - 1) * c.num_vocab + v], 1e-4);

    // Logits are not degenerate: a random model still spreads its predictions.
    float lo = all[0], hi = all[0];
    for (float x : all) {
      ASSERT_TRUE(std::isfinite(x));
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    EXPECT_GT(hi - lo, 1.0f);
  }
}

// Several sequences of different lengths in one step, their blocks interleaved in one cache, some
// prefilling a chunk after a cached prefix and some decoding: each must get exactly the logits it
// gets alone.
TEST_F(LlamaTest, BatchedPagedStepEqualsEachSequenceAlone) {
  auto model = load(write_model("m.gguf", DType::kQ8_0, small_spec()));
  const int64_t vocab = model->config().num_vocab;
  const int32_t bs = 4;
  std::vector<std::vector<int32_t>> seqs = {{5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {299, 3}, {10, 20, 30, 40, 50, 60}};
  // Reference: each sequence alone, logits of its last token.
  std::vector<std::vector<float>> alone;
  for (const auto& s : seqs) {
    SequenceRunner r(*model, static_cast<int64_t>(s.size()));
    std::vector<float> l(static_cast<size_t>(vocab));
    r.forward(s, 0, l.data(), false);
    alone.push_back(l);
  }
  // Shared cache with blocks handed out round-robin, so tables interleave.
  auto cache = model->new_kv_cache(32, bs, KvDtype::kF16);
  std::vector<std::vector<int32_t>> tables(seqs.size());
  int32_t next_block = 31;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const size_t blocks = (seqs[i].size() + bs - 1) / bs;
    for (size_t b = 0; b < blocks; ++b) tables[i].push_back(next_block--);
  }
  // Step 1: the first part of each sequence (all but the last 2 tokens, or all of a short one).
  std::vector<size_t> split(seqs.size());
  BatchInput step1;
  step1.attention.block_size = bs;
  for (size_t i = 0; i < seqs.size(); ++i) {
    split[i] = seqs[i].size() > 2 ? seqs[i].size() - 2 : seqs[i].size();
    step1.add_sequence(std::span<const int32_t>(seqs[i].data(), split[i]), 0, tables[i],
                       split[i] == seqs[i].size() ? BatchInput::Logits::kLast : BatchInput::Logits::kNone);
  }
  std::vector<float> out1(static_cast<size_t>(step1.logits_rows.size() * vocab));
  model->forward(step1, *cache, out1.data());
  // Step 2: the rest, a 2-token chunk for the long ones.
  BatchInput step2;
  step2.attention.block_size = bs;
  std::vector<size_t> order;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (split[i] == seqs[i].size()) continue;
    step2.add_sequence(std::span<const int32_t>(seqs[i].data() + split[i], seqs[i].size() - split[i]),
                       static_cast<int32_t>(split[i]), tables[i], BatchInput::Logits::kLast);
    order.push_back(i);
  }
  std::vector<float> out2(static_cast<size_t>(step2.logits_rows.size() * vocab));
  model->forward(step2, *cache, out2.data());
  size_t r1 = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (split[i] != seqs[i].size()) continue;
    for (int64_t v = 0; v < vocab; ++v) ASSERT_NEAR(out1[r1 * vocab + v], alone[i][v], 1e-4) << "seq " << i;
    ++r1;
  }
  for (size_t r = 0; r < order.size(); ++r) {
    for (int64_t v = 0; v < vocab; ++v) ASSERT_NEAR(out2[r * vocab + v], alone[order[r]][v], 1e-4) << "seq " << order[r];
  }
}

// commit_blocks commits the K and V rows of the blocks asked for in every layer (the pages a
// step would fault in at its first write) and refuses blocks past the cache.
TEST_F(LlamaTest, CommitBlocksCommitsTheirRowsInEveryLayer) {
  auto model = load(write_model("m.gguf", DType::kQ8_0, small_spec()));
  const int64_t blocks = 64, first = 5, count = 9;
  auto cache = model->new_kv_cache(blocks, 16, KvDtype::kF16);
  const int64_t kb = cache->k_block_bytes(), vb = cache->v_block_bytes();
  for (int64_t l = 0; l < cache->num_layers(); ++l) {
    EXPECT_EQ(resident_bytes(static_cast<uint8_t*>(cache->k(l)) + first * kb, static_cast<size_t>(count * kb)), 0u)
        << "layer " << l << ": a fresh cache is committed at first write";
  }
  EXPECT_EQ(cache->commit_blocks(first, count), cache->num_layers() * count * (kb + vb));
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (int64_t l = 0; l < cache->num_layers(); ++l) {
    // The whole pages inside each range (a block's rows need not start on a page).
    const auto inside = [&](void* rows, int64_t block_bytes) {
      const auto begin = (reinterpret_cast<uintptr_t>(rows) + first * block_bytes + page - 1) / page * page;
      const auto end = (reinterpret_cast<uintptr_t>(rows) + (first + count) * block_bytes) / page * page;
      return std::pair<const void*, size_t>(reinterpret_cast<const void*>(begin), end - begin);
    };
    for (const auto& [p, n] : {inside(cache->k(l), kb), inside(cache->v(l), vb)}) {
      ASSERT_GT(n, 0u);
      EXPECT_EQ(resident_bytes(p, n), n) << "layer " << l;
    }
  }
  EXPECT_EQ(cache->commit_blocks(0, 0), 0);
  EXPECT_THROW((void)cache->commit_blocks(blocks - 2, 3), Error);
  EXPECT_THROW((void)cache->commit_blocks(-1, 2), Error);
}

TEST(LlamaPresets, RealShapes) {
  const SyntheticSpec a = synthetic_preset("deepseek-llm-7b");
  EXPECT_EQ(a.architecture, "llama");
  EXPECT_EQ(a.hidden_size, 4096);
  EXPECT_EQ(a.num_layers, 30);
  EXPECT_EQ(a.num_heads, 32);
  EXPECT_EQ(a.num_kv_heads, 32);
  EXPECT_EQ(a.intermediate_size, 11008);
  EXPECT_EQ(a.num_vocab, 102400);
  EXPECT_EQ(a.context_length, 4096);
  EXPECT_DOUBLE_EQ(a.rope_scale, 1.0);
  const SyntheticSpec b = synthetic_preset("deepseek-coder-1.3b");
  EXPECT_EQ(b.hidden_size, 2048);
  EXPECT_EQ(b.intermediate_size, 5504);
  EXPECT_DOUBLE_EQ(b.rope_scale, 4.0);
  const std::vector<std::string> names = synthetic_preset_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "deepseek-llm-7b"), names.end());
}

TEST_F(LlamaTest, F16AndQ8_0CachesStayCloseToF32) {
  auto model = load(write_model("m.gguf", DType::kF32, small_spec()));
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 60; ++i) tokens.push_back((i * 37 + 11) % 300);
  expect_cache_close(*model, tokens, KvDtype::kF16, 5e-3);
  expect_cache_close(*model, tokens, KvDtype::kQ8_0, 5e-2);
  // Heads 16 wide do not fill a q8_0 block: refused when the cache is made, naming the widths.
  SyntheticSpec narrow = small_spec();
  narrow.hidden_size = 64;
  auto narrow_model = load(write_model("narrow.gguf", DType::kF32, narrow));
  try {
    (void)narrow_model->new_kv_cache(4, 16, KvDtype::kQ8_0);
    FAIL() << "a q8_0 cache of 16-wide heads was made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heads are 16 (key) and 16 (value)"), std::string::npos) << e.what();
  }
  EXPECT_NE(narrow_model->new_kv_cache(4, 16, KvDtype::kF16), nullptr);
}

// The fp8 cache (e4m3 per head of 128 with a power-of-two scale: 3 mantissa bits) on heads of 128;
// the tiny preset's heads of 32, two to a row, would start inside a block: refused, naming them.
TEST_F(LlamaTest, Fp8CacheStaysCloseToF32AndNeedsHeadsOfWholeBlocks) {
  SyntheticSpec wide = small_spec();
  wide.hidden_size = 512;  // 4 heads of 128, 2 kv heads
  auto model = load(write_model("wide.gguf", DType::kF32, wide));
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 60; ++i) tokens.push_back((i * 37 + 11) % 300);
  expect_cache_close(*model, tokens, KvDtype::kFp8, 0.1);  // measured 0.053
  EXPECT_EQ(model->kv_bytes_per_token(KvDtype::kFp8), 2 * 2 * 2 * 132);  // layers, K and V, kv heads
  auto tiny = load(write_model("m.gguf", DType::kF32, small_spec()));
  try {
    (void)tiny->new_kv_cache(4, 16, KvDtype::kFp8);
    FAIL() << "an fp8 cache of 32-wide heads two to a row was made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("are 32 (key) and 32 (value) wide in rows of 64 and 64"), std::string::npos)
        << e.what();
  }
}

// A tied head is the token table: the tied file gives exactly the logits of its untied equivalent
// (the same file with output.weight a copy of token_embd.weight), in f16 and in q8_0 (whose head
// goes through the packed copy while the table's rows are read from the file).
TEST_F(LlamaTest, TiedEmbeddingsUseTheTokenTable) {
  SyntheticSpec s = small_spec();
  s.tied = true;
  for (DType type : {DType::kF16, DType::kQ8_0}) {
    const std::string tied_path = write_model("tied.gguf", type, s);
    auto tied = load(tied_path);
    auto untied = load(untied_copy(tied_path, "untied.gguf"));
    EXPECT_TRUE(tied->config().tied_embeddings);
    EXPECT_FALSE(untied->config().tied_embeddings);
    const std::vector<int32_t> tokens = {5, 6, 250, 17, 3};
    const std::vector<float> a = all_logits(*tied, tokens), b = all_logits(*untied, tokens);
    EXPECT_EQ(max_diff(a.data(), b.data(), static_cast<int64_t>(a.size())), 0.0f) << dtype_name(type);
    float size = 0.0f;
    for (float x : a) size = std::max(size, std::fabs(x));
    EXPECT_GT(size, 0.0f) << dtype_name(type);
  }
}

TEST_F(LlamaTest, RejectsBadInputs) {
  auto model = load(write_model("m.gguf", DType::kF32, small_spec()));
  std::vector<float> logits(300 * 4);
  SequenceRunner runner(*model, 3);
  const int32_t too_many[] = {1, 2, 3, 4};
  EXPECT_THROW(runner.forward(too_many, 0, logits.data(), false), Error);
  const int32_t out_of_vocab[] = {300};
  try {
    runner.forward(out_of_vocab, 0, logits.data(), false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("300"), std::string::npos) << e.what();
  }
}

TEST_F(LlamaTest, ListsEveryMissingOrMismatchedTensor) {
  ThreadPool pool(1);
  GgufWriter w;
  SyntheticSpec s = small_spec();
  add_synthetic_llama(w, s, DType::kF32, 1, pool);
  const std::string full = (dir_ / "full.gguf").string();
  w.write(full);
  // Rewrite the same metadata with two tensors dropped and one given the wrong shape.
  const GgufFile src = GgufFile::open(full);
  GgufWriter broken;
  for (const auto& [k, v] : src.metadata()) broken.set(k, v);
  for (const GgufTensorInfo& t : src.tensors()) {
    if (t.name == "blk.1.ffn_up.weight" || t.name == "output_norm.weight") continue;
    std::vector<int64_t> shape = t.shape;
    if (t.name == "blk.0.attn_k.weight") shape = {shape[0] * 2, shape[1] / 2};
    broken.add_tensor(t.name, t.type, shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  }
  const std::string p = (dir_ / "broken.gguf").string();
  broken.write(p);
  try {
    (void)load(p);
    FAIL() << "loaded a model with missing tensors";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("3 problems"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'blk.1.ffn_up.weight' is missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'output_norm.weight' is missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'blk.0.attn_k.weight' has shape [256, 32], expected [128, 64]"), std::string::npos) << msg;
  }
}

TEST_F(LlamaTest, UnknownArchitectureIsUnsupported) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::str("mamba"));
  const std::string p = (dir_ / "mamba.gguf").string();
  w.write(p);
  try {
    (void)load(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("'mamba'"), std::string::npos);
  }
}

// LoRA rows in a batch: a run per sequence, merged with the one before when it follows it with the
// same adapter; base rows in none; validate() refuses runs outside the batch or adapters not loaded.
TEST(BatchInputLora, RunsMergeAndValidate) {
  const std::vector<int32_t> table = {0, 1, 2, 3};
  const std::vector<int32_t> three = {1, 2, 3}, one = {4};
  BatchInput b;
  b.attention.block_size = 16;
  b.add_sequence(three, 0, table, BatchInput::Logits::kLast, 2);
  b.add_sequence(one, 5, table, BatchInput::Logits::kLast, 2);
  b.add_sequence(one, 7, table, BatchInput::Logits::kLast);
  b.add_sequence(three, 9, table, BatchInput::Logits::kLast, 1);
  b.add_sequence(one, 20, table, BatchInput::Logits::kLast, 2);
  ASSERT_EQ(b.lora_runs.size(), 3u);
  EXPECT_EQ(b.lora_runs[0].row0, 0);
  EXPECT_EQ(b.lora_runs[0].rows, 4);
  EXPECT_EQ(b.lora_runs[0].adapter, 2);
  EXPECT_EQ(b.lora_runs[1].row0, 5);
  EXPECT_EQ(b.lora_runs[1].rows, 3);
  EXPECT_EQ(b.lora_runs[1].adapter, 1);
  EXPECT_EQ(b.lora_runs[2].row0, 8);
  EXPECT_EQ(b.lora_runs[2].rows, 1);
  EXPECT_NO_THROW(b.validate(64, 64, 2));
  EXPECT_THROW(b.validate(64, 64, 1), Error);  // adapter 2 not loaded
  EXPECT_THROW(b.validate(64, 64, 0), Error);
  b.lora_runs[2].rows = 2;                     // past the batch's 9 rows
  EXPECT_THROW(b.validate(64, 64, 2), Error);
  b.clear();
  EXPECT_TRUE(b.lora_runs.empty());
}

}  // namespace
}  // namespace duet
