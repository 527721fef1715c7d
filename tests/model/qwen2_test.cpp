// The qwen2 forward pass against itself and against llama: batched paged steps equal each
// sequence alone, the NEOX rope layout equals llama's rope on permuted rows, sliding windows
// behave as windows, and bad files get errors that name every problem.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
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

class Qwen2Test : public ModelFileTest {};

SyntheticSpec small_spec() {
  SyntheticSpec s = synthetic_preset("qwen2-tiny");
  s.num_vocab = 300;
  return s;
}

TEST_F(Qwen2Test, PresetsHaveTheRealShapes) {
  const SyntheticSpec a = synthetic_preset("r1-distill-qwen-1.5b");
  EXPECT_EQ(a.architecture, "qwen2");
  EXPECT_EQ(a.hidden_size, 1536);
  EXPECT_EQ(a.num_layers, 28);
  EXPECT_EQ(a.num_heads, 12);
  EXPECT_EQ(a.num_kv_heads, 2);
  EXPECT_EQ(a.intermediate_size, 8960);
  EXPECT_EQ(a.num_vocab, 151936);
  EXPECT_EQ(a.context_length, 131072);
  EXPECT_DOUBLE_EQ(a.rope_base, 10000.0);
  EXPECT_DOUBLE_EQ(a.rope_scale, 1.0);
  EXPECT_FALSE(a.tied);
  EXPECT_EQ(a.sliding_window, 0);
  const SyntheticSpec b = synthetic_preset("r1-distill-qwen-7b");
  EXPECT_EQ(b.hidden_size, 3584);
  EXPECT_EQ(b.num_heads, 28);
  EXPECT_EQ(b.num_kv_heads, 4);
  EXPECT_EQ(b.intermediate_size, 18944);
  EXPECT_EQ(b.num_vocab, 152064);
  EXPECT_EQ(synthetic_preset("tiny").architecture, "llama");
  try {
    (void)synthetic_preset("r1-distill-qwen-3b");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("r1-distill-qwen-1.5b"), std::string::npos) << e.what();
  }
}

TEST_F(Qwen2Test, ReadsItsConfig) {
  auto model = load(write_model("m.gguf", DType::kF32, small_spec()));
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_EQ(c.num_vocab, 300);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.rope.mode, RopeMode::kNeox);
  EXPECT_EQ(c.rope.dim, 32);
  EXPECT_DOUBLE_EQ(c.rope.freq_scale, 1.0);
  EXPECT_FALSE(c.tied_embeddings);
}

TEST_F(Qwen2Test, IncrementalAndChunkedMatchFullPrefill) {
  for (DType type : {DType::kF32, DType::kQ4_0}) {
    auto model = load(write_model("m.gguf", type, small_spec()));
    const int64_t vocab = model->config().num_vocab;
    const std::vector<int32_t> tokens = {1, 17, 255, 3, 99, 0, 299, 42, 7, 7, 8};
    const int64_t n = static_cast<int64_t>(tokens.size());
    const std::vector<float> all = all_logits(*model, tokens);

    SequenceRunner one_by_one(*model, n, 4);
    std::vector<float> one(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < n; ++i) {
      one_by_one.forward(std::span<const int32_t>(&tokens[i], 1), i, one.data(), false);
      ASSERT_LE(max_diff(one.data(), all.data() + i * vocab, vocab), 1e-4) << dtype_name(type) << " pos " << i;
    }
    SequenceRunner chunked(*model, n, 8);
    std::vector<float> chunk(static_cast<size_t>(4 * vocab));
    chunked.forward(std::span<const int32_t>(tokens.data(), 4), 0, chunk.data(), true);
    chunked.forward(std::span<const int32_t>(tokens.data() + 4, 7), 4, chunk.data(), false);
    ASSERT_LE(max_diff(chunk.data(), all.data() + (n - 1) * vocab, vocab), 1e-4) << dtype_name(type);
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
// gets alone; with full attention, and with a window that some of them outgrow.
TEST_F(Qwen2Test, BatchedPagedStepEqualsEachSequenceAlone) {
  for (int64_t window : {0, 5}) {
    SyntheticSpec s = small_spec();
    s.sliding_window = window;
    auto model = load(write_model("m.gguf", DType::kQ8_0, s));
    const int64_t vocab = model->config().num_vocab;
    const int32_t bs = 4;
    std::vector<std::vector<int32_t>> seqs = {
        {5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {299, 3}, {10, 20, 30, 40, 50, 60}, some_tokens(23, 300, 3)};
    std::vector<std::vector<float>> alone;
    for (const auto& sq : seqs) alone.push_back(last_logits(*model, sq));
    auto cache = model->new_kv_cache(32, bs, KvDtype::kF16);
    std::vector<std::vector<int32_t>> tables(seqs.size());
    int32_t next_block = 31;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const size_t blocks = (seqs[i].size() + bs - 1) / bs;
      for (size_t b = 0; b < blocks; ++b) tables[i].push_back(next_block--);
    }
    // Step 1: all but the last 3 tokens (or all of a short one); step 2: the rest.
    std::vector<size_t> split(seqs.size());
    BatchInput step1;
    step1.attention.block_size = bs;
    for (size_t i = 0; i < seqs.size(); ++i) {
      split[i] = seqs[i].size() > 3 ? seqs[i].size() - 3 : seqs[i].size();
      step1.add_sequence(std::span<const int32_t>(seqs[i].data(), split[i]), 0, tables[i],
                         split[i] == seqs[i].size() ? BatchInput::Logits::kLast : BatchInput::Logits::kNone);
    }
    std::vector<float> out1(step1.logits_rows.size() * static_cast<size_t>(vocab));
    model->forward(step1, *cache, out1.data());
    BatchInput step2;
    step2.attention.block_size = bs;
    std::vector<size_t> order;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (split[i] == seqs[i].size()) continue;
      step2.add_sequence(std::span<const int32_t>(seqs[i].data() + split[i], seqs[i].size() - split[i]),
                         static_cast<int32_t>(split[i]), tables[i], BatchInput::Logits::kLast);
      order.push_back(i);
    }
    std::vector<float> out2(step2.logits_rows.size() * static_cast<size_t>(vocab));
    model->forward(step2, *cache, out2.data());
    size_t r1 = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (split[i] != seqs[i].size()) continue;
      ASSERT_LE(max_diff(out1.data() + r1 * vocab, alone[i].data(), vocab), 1e-4) << "window " << window << " seq " << i;
      ++r1;
    }
    for (size_t r = 0; r < order.size(); ++r) {
      ASSERT_LE(max_diff(out2.data() + r * vocab, alone[order[r]].data(), vocab), 1e-4)
          << "window " << window << " seq " << order[r];
    }
  }
}

// NEOX rope on the Hugging Face q/k layout is llama's adjacent-pair rope on rows permuted the way
// llama.cpp's converter permutes them for llama: a qwen2 model with zero biases and the llama
// model with permuted q/k rows must give the same logits.
TEST_F(Qwen2Test, NeoxRopeEqualsLlamaRopeOnPermutedRows) {
  SyntheticSpec s = small_spec();
  s.rope_scale = 2.0;
  const std::string qwen = write_model("q.gguf", DType::kF32, s);
  const std::string no_bias = (dir_ / "q0.gguf").string();
  rewrite_gguf(
      qwen, no_bias,
      [](const std::string& name, DType&, std::vector<int64_t>&, std::vector<uint8_t>& bytes) {
        if (name.ends_with(".bias")) std::fill(bytes.begin(), bytes.end(), 0);
        return true;
      },
      [](GgufWriter&) {});
  const int64_t head_dim = s.hidden_size / s.num_heads;
  const std::string llama = (dir_ / "l.gguf").string();
  rewrite_gguf(
      no_bias, llama,
      [&](const std::string& name, DType& type, std::vector<int64_t>& shape, std::vector<uint8_t>& bytes) {
        if (name.ends_with(".bias")) return false;
        if (!name.ends_with("attn_q.weight") && !name.ends_with("attn_k.weight")) return true;
        EXPECT_EQ(type, DType::kF32);
        // Within each head, HF row j * (d/2) + i goes to GGUF row 2 * i + j.
        const size_t row_bytes = static_cast<size_t>(shape[0]) * sizeof(float);
        const int64_t rows = shape[1];
        std::vector<uint8_t> out(bytes.size());
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t head = r / head_dim, within = r % head_dim;
          const int64_t j = within / (head_dim / 2), i = within % (head_dim / 2);
          const int64_t dst = head * head_dim + 2 * i + j;
          std::memcpy(out.data() + dst * row_bytes, bytes.data() + r * row_bytes, row_bytes);
        }
        bytes = std::move(out);
        return true;
      },
      [&](GgufWriter& w) {
        const GgufFile src = GgufFile::open(no_bias);
        w.set("general.architecture", GgufValue::str("llama"));
        for (const auto& [k, v] : src.metadata()) {
          if (k.starts_with("qwen2.")) w.set("llama." + k.substr(6), v);
        }
      });
  auto q = load(no_bias);
  auto l = load(llama);
  EXPECT_EQ(l->config().architecture, "llama");
  const std::vector<int32_t> tokens = some_tokens(20, 300, 7);
  const std::vector<float> a = all_logits(*q, tokens);
  const std::vector<float> b = all_logits(*l, tokens);
  EXPECT_LE(max_diff(a.data(), b.data(), static_cast<int64_t>(a.size())), 1e-4);
  // And the biases matter: the model with them differs.
  auto with_bias = load(qwen);
  const std::vector<float> c = all_logits(*with_bias, tokens);
  EXPECT_GT(max_diff(a.data(), c.data(), static_cast<int64_t>(a.size())), 1e-2);
}

TEST_F(Qwen2Test, SlidingWindow) {
  SyntheticSpec s = small_spec();
  const std::vector<int32_t> tokens = some_tokens(30, 300, 11);
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto full = load(write_model("full.gguf", DType::kF32, s));
  const int64_t vocab = full->config().num_vocab;
  const std::vector<float> full_logits = all_logits(*full, tokens);

  // A window as long as the sequence, one switched off, or one on no layer changes nothing.
  s.sliding_window = n;
  auto long_window = load(write_model("w30.gguf", DType::kF32, s));
  EXPECT_LE(max_diff(all_logits(*long_window, tokens).data(), full_logits.data(), n * vocab), 1e-5);
  s.sliding_window = 6;
  s.max_window_layers = s.num_layers;
  auto no_layer = load(write_model("w6none.gguf", DType::kF32, s));
  EXPECT_LE(max_diff(all_logits(*no_layer, tokens).data(), full_logits.data(), n * vocab), 1e-5);
  const std::string off = (dir_ / "w6off.gguf").string();
  s.max_window_layers = 0;
  rewrite_gguf(
      write_model("w6.gguf", DType::kF32, s), off,
      [](const std::string&, DType&, std::vector<int64_t>&, std::vector<uint8_t>&) { return true; },
      [](GgufWriter& w) { w.set("qwen2.attention.use_sliding_window", GgufValue::boolean(false)); });
  EXPECT_LE(max_diff(all_logits(*load(off), tokens).data(), full_logits.data(), n * vocab), 1e-5);

  // A short window: positions inside it agree with full attention, later ones do not; decoding
  // token by token and in chunks across the window's edge gives the same as one prefill.
  auto windowed = load((dir_ / "w6.gguf").string());
  const std::vector<float> w6 = all_logits(*windowed, tokens);
  EXPECT_LE(max_diff(w6.data(), full_logits.data(), 6 * vocab), 1e-5);
  EXPECT_GT(max_diff(w6.data() + 10 * vocab, full_logits.data() + 10 * vocab, vocab), 1e-3);
  SequenceRunner one_by_one(*windowed, n, 4);
  std::vector<float> one(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < n; ++i) {
    one_by_one.forward(std::span<const int32_t>(&tokens[i], 1), i, one.data(), false);
    ASSERT_LE(max_diff(one.data(), w6.data() + i * vocab, vocab), 1e-4) << "pos " << i;
  }
  SequenceRunner chunked(*windowed, n, 4);
  std::vector<float> chunk(static_cast<size_t>(n * vocab));
  chunked.forward(std::span<const int32_t>(tokens.data(), 4), 0, chunk.data(), true);
  chunked.forward(std::span<const int32_t>(tokens.data() + 4, 13), 4, chunk.data(), true);
  ASSERT_LE(max_diff(chunk.data(), w6.data() + 4 * vocab, 13 * vocab), 1e-4);

  // With one layer, a token sees exactly its window: rope depends only on distances, so the last
  // token's logits equal those of its window's tokens run alone from position 0.
  s.num_layers = 1;
  s.sliding_window = 6;
  auto one_layer = load(write_model("w6l1.gguf", DType::kF32, s));
  const std::vector<float> last = last_logits(*one_layer, tokens);
  const std::vector<int32_t> tail(tokens.end() - 6, tokens.end());
  EXPECT_LE(max_diff(last.data(), last_logits(*one_layer, tail).data(), vocab), 1e-3);
  s.sliding_window = 0;
  auto one_layer_full = load(write_model("l1.gguf", DType::kF32, s));
  EXPECT_GT(max_diff(last.data(), last_logits(*one_layer_full, tokens).data(), vocab), 1e-2);
}

TEST_F(Qwen2Test, ListsEveryMissingBias) {
  const std::string full = write_model("full.gguf", DType::kF32, small_spec(), 1);
  const std::string p = (dir_ / "broken.gguf").string();
  rewrite_gguf(
      full, p,
      [](const std::string& name, DType&, std::vector<int64_t>& shape, std::vector<uint8_t>& bytes) {
        if (name == "blk.0.attn_q.bias" || name == "blk.1.attn_k.bias" || name == "blk.1.attn_v.bias") return false;
        if (name == "blk.0.attn_v.bias") {  // wrong length
          shape = {shape[0] / 2};
          bytes.resize(bytes.size() / 2);
        }
        return true;
      },
      [](GgufWriter&) {});
  try {
    (void)load(p);
    FAIL() << "loaded a qwen2 model without its biases";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find("4 problems"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'blk.0.attn_q.bias' is missing (vector of 128"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'blk.1.attn_k.bias' is missing (vector of 64"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'blk.1.attn_v.bias' is missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'blk.0.attn_v.bias' has shape [32], expected [64]"), std::string::npos) << msg;
  }
}

// Tied embeddings with one kv head: the tied file gives exactly the logits of its untied
// equivalent (output.weight a copy of token_embd.weight), in f16 and q8_0.
TEST_F(Qwen2Test, TiedEmbeddingsAndOneKvHead) {
  SyntheticSpec s = small_spec();
  s.tied = true;
  s.num_kv_heads = 1;
  for (DType type : {DType::kF16, DType::kQ8_0}) {
    const std::string tied_path = write_model("tied.gguf", type, s);
    auto tied = load(tied_path);
    auto untied = load(untied_copy(tied_path, "untied.gguf"));
    EXPECT_TRUE(tied->config().tied_embeddings);
    EXPECT_FALSE(untied->config().tied_embeddings);
    EXPECT_EQ(tied->config().num_kv_heads, 1);
    const std::vector<int32_t> tokens = {5, 6, 7, 100, 2};
    const std::vector<float> a = all_logits(*tied, tokens), b = all_logits(*untied, tokens);
    EXPECT_EQ(max_diff(a.data(), b.data(), static_cast<int64_t>(a.size())), 0.0f) << dtype_name(type);
    for (float x : a) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST_F(Qwen2Test, RefusesUnsupportedRopeScalingAndBadWindows) {
  const std::string base = write_model("m.gguf", DType::kF32, small_spec());
  const auto keep = [](const std::string&, DType&, std::vector<int64_t>&, std::vector<uint8_t>&) { return true; };
  // Each case: the keys it sets, the error code and a part of the message.
  struct Case {
    std::function<void(GgufWriter&)> set;
    ErrorCode code;
    std::string message;
  };
  const Case cases[] = {
      {[](GgufWriter& w) { w.set("qwen2.rope.scaling.type", GgufValue::str("longrope")); }, ErrorCode::kUnsupported,
       "qwen2.rope.scaling.type 'longrope' is not supported for qwen2 (expected linear, yarn or none)"},
      {[](GgufWriter& w) {  // YaRN without its original context
         w.set("qwen2.rope.scaling.type", GgufValue::str("yarn"));
         w.set("qwen2.rope.scaling.factor", GgufValue::f32(4.0f));
       },
       ErrorCode::kInvalidArgument, "qwen2.rope.scaling.original_context_length > 0"},
      {[](GgufWriter& w) {
         w.set("qwen2.rope.scaling.type", GgufValue::str("yarn"));
         w.set("qwen2.rope.scaling.factor", GgufValue::f32(0.5f));
         w.set("qwen2.rope.scaling.original_context_length", GgufValue::u32(64));
       },
       ErrorCode::kInvalidArgument, "qwen2.rope.scaling.factor >= 1"},
      {[](GgufWriter& w) {
         w.set("qwen2.rope.scaling.type", GgufValue::str("yarn"));
         w.set("qwen2.rope.scaling.factor", GgufValue::f32(4.0f));
         w.set("qwen2.rope.scaling.original_context_length", GgufValue::u32(64));
         w.set("qwen2.rope.scaling.yarn_ext_factor", GgufValue::f32(0.5f));
       },
       ErrorCode::kUnsupported, "qwen2.rope.scaling.yarn_ext_factor is 0.5"},
  };
  for (const Case& c : cases) {
    const std::string path = (dir_ / "scaled.gguf").string();
    rewrite_gguf(base, path, keep, c.set);
    try {
      (void)load(path);
      FAIL() << "loaded a model that should fail with " << c.message;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), c.code) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
  const std::string bad = (dir_ / "bad_window.gguf").string();
  rewrite_gguf(base, bad, keep, [](GgufWriter& w) { w.set("qwen2.attention.sliding_window", GgufValue::i32(-4)); });
  try {
    (void)load(bad);
    FAIL() << "loaded a negative window";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen2.attention.sliding_window"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace duet
