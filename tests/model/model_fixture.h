// What the model tests share: a temporary folder for synthetic GGUF files, a CPU backend to load
// them on, and logits of a token list run as one prefill.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/thread_pool.h"
#include "duet/formats/gguf_writer.h"
#include "duet/model/model.h"
#include "duet/model/synthetic.h"

namespace duet {

// n token ids below `vocab`, the same for the same seed (a linear congruential sequence).
inline std::vector<int32_t> some_tokens(int64_t n, int32_t vocab, uint32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t x = seed;
  for (int32_t& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab));
  }
  return t;
}

// Rewrites `src` through `edit(name, type, shape, bytes)`, which may change a tensor or drop it
// (returning false), and `meta` for the metadata.
template <typename TensorEdit, typename MetaEdit>
void rewrite_gguf(const std::string& src_path, const std::string& dst_path, TensorEdit edit, MetaEdit meta) {
  const GgufFile src = GgufFile::open(src_path);
  GgufWriter w;
  for (const auto& [k, v] : src.metadata()) w.set(k, v);
  meta(w);
  for (const GgufTensorInfo& t : src.tensors()) {
    std::vector<int64_t> shape = t.shape;
    DType type = t.type;
    std::vector<uint8_t> bytes(t.data, t.data + t.nbytes);
    if (!edit(t.name, type, shape, bytes)) continue;
    w.add_tensor(t.name, type, shape, std::move(bytes));
  }
  w.write(dst_path);
}

class ModelFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("duet_" + std::string(info->test_suite_name()) + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    backend_ = make_cpu_backend(2);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write_model(const std::string& name, DType type, const SyntheticSpec& spec, uint64_t seed = 42) {
    ThreadPool pool(2);
    GgufWriter w;
    add_synthetic_model(w, spec, type, seed, pool);
    const std::string p = (dir_ / name).string();
    w.write(p);
    return p;
  }

  // The untied equivalent of a file with tied embeddings: the same file plus an output.weight that
  // is a copy of token_embd.weight (its type, shape and bytes).
  std::string untied_copy(const std::string& tied_path, const std::string& name) {
    const GgufFile src = GgufFile::open(tied_path);
    EXPECT_EQ(src.find_tensor("output.weight"), nullptr) << tied_path << " is not tied";
    const GgufTensorInfo* embd = src.find_tensor("token_embd.weight");
    EXPECT_NE(embd, nullptr);
    GgufWriter w;
    for (const auto& [k, v] : src.metadata()) w.set(k, v);
    for (const GgufTensorInfo& t : src.tensors()) {
      w.add_tensor(t.name, t.type, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    }
    if (embd != nullptr) {
      w.add_tensor("output.weight", embd->type, embd->shape, std::vector<uint8_t>(embd->data, embd->data + embd->nbytes));
    }
    const std::string p = (dir_ / name).string();
    w.write(p);
    return p;
  }

  std::unique_ptr<Model> load(const std::string& p) {
    return load_model(std::make_shared<const GgufFile>(GgufFile::open(p)), *backend_);
  }

  // Logits of every position of `tokens` run as one prefill.
  static std::vector<float> all_logits(Model& model, const std::vector<int32_t>& tokens,
                                       KvDtype kv_dtype = KvDtype::kF16) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    std::vector<float> out(static_cast<size_t>(n * model.config().num_vocab));
    SequenceRunner runner(model, n, 16, kv_dtype);
    runner.forward(tokens, 0, out.data(), true);
    return out;
  }

  static std::vector<float> last_logits(Model& model, const std::vector<int32_t>& tokens) {
    std::vector<float> out(static_cast<size_t>(model.config().num_vocab));
    SequenceRunner runner(model, static_cast<int64_t>(tokens.size()));
    runner.forward(tokens, 0, out.data(), false);
    return out;
  }

  // An f16 or q8_0 KV cache against an f32 one over every position of a long prompt: each stored
  // key and value is rounded (f16: to 11 significant bits; q8_0: to half a step of its block's
  // largest value / 127), so the logits move by a small fraction of their range, never more than
  // `rel` of it (max |a - b| / (1 + max |a|) per position); and they do move (the cache really
  // is of that type).
  static void expect_cache_close(Model& model, const std::vector<int32_t>& tokens, KvDtype dtype, double rel) {
    const std::vector<float> f32 = all_logits(model, tokens, KvDtype::kF32);
    const std::vector<float> f16 = all_logits(model, tokens, dtype);
    const int64_t vocab = model.config().num_vocab;
    double worst = 0.0;
    for (size_t p = 0; p < tokens.size(); ++p) {
      const float* a = f32.data() + p * vocab;
      const float* b = f16.data() + p * vocab;
      float mag = 0.0f;
      for (int64_t i = 0; i < vocab; ++i) mag = std::max(mag, std::fabs(a[i]));
      worst = std::max(worst, max_diff(a, b, vocab) / (1.0 + mag));
    }
    const std::string name = model.config().architecture + " " + std::string(kv_dtype_name(dtype));
    EXPECT_LE(worst, rel) << name;
    EXPECT_GT(worst, 0.0) << name << ": the cache gave the f32 cache's logits";
    std::printf("%s KV cache: worst relative logit difference %.3g\n", name.c_str(), worst);
  }

  // `seqs` in two steps of one batch over one cache (blocks of `block_size`, handed out from the
  // top so that the sequences' blocks interleave): each one's first split[i] tokens, then the rest
  // of those not whole yet. Each sequence's last logits, in the order of `seqs`.
  static std::vector<std::vector<float>> two_step_last_logits(Model& model,
                                                              const std::vector<std::vector<int32_t>>& seqs,
                                                              const std::vector<size_t>& split, int32_t block_size) {
    const auto vocab = static_cast<size_t>(model.config().num_vocab);
    auto cache = model.new_kv_cache(64, block_size, KvDtype::kF16);
    std::vector<std::vector<int32_t>> tables(seqs.size());
    int32_t next_block = 63;
    for (size_t i = 0; i < seqs.size(); ++i) {
      for (size_t b = 0; b < (seqs[i].size() + block_size - 1) / block_size; ++b) tables[i].push_back(next_block--);
    }
    std::vector<std::vector<float>> last(seqs.size());
    for (int step = 0; step < 2; ++step) {
      BatchInput batch;
      batch.attention.block_size = block_size;
      std::vector<size_t> with_logits;
      for (size_t i = 0; i < seqs.size(); ++i) {
        const size_t from = step == 0 ? 0 : split[i], to = step == 0 ? split[i] : seqs[i].size();
        if (from == to) continue;
        const bool whole = to == seqs[i].size();
        batch.add_sequence(std::span<const int32_t>(seqs[i].data() + from, to - from), static_cast<int32_t>(from),
                           tables[i], whole ? BatchInput::Logits::kLast : BatchInput::Logits::kNone);
        if (whole) with_logits.push_back(i);
      }
      std::vector<float> out(with_logits.size() * vocab);
      model.forward(batch, *cache, out.data());
      for (size_t r = 0; r < with_logits.size(); ++r) {
        last[with_logits[r]].assign(out.begin() + static_cast<std::ptrdiff_t>(r * vocab),
                                    out.begin() + static_cast<std::ptrdiff_t>((r + 1) * vocab));
      }
    }
    return last;
  }

  static float max_diff(const float* a, const float* b, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
  }

  std::filesystem::path dir_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace duet
