// Hugging Face folders written from GGUF files (hf_writer.h, hf_tokenizer_writer.h) read back
// through open_model_path to the same model: the same logits bit for bit in the GGUF's own float
// type (llama within 1e-5: Hugging Face's q/k row order sums q.k in another order), the same token
// ids; FP8 and AWQ folders load and stay close. Under AddressSanitizer in `make test`.
// (tests/reference's make_model_hf_* run the same through `duet make-model --format hf`.)
#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>

#include "../model/model_fixture.h"
#include "duet/core/error.h"
#include "duet/engine/model_path.h"
#include "duet/formats/hf_writer.h"
#include "duet/tokenizer/bpe_trainer.h"
#include "duet/tokenizer/hf_tokenizer_writer.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet {
namespace {

class HfWriterTest : public ModelFileTest {
 protected:
  // A synthetic model with a learned vocabulary, as make-model writes it.
  std::string write_with_tokenizer(const std::string& name, DType type, const SyntheticSpec& spec,
                                   const std::string& pre) {
    ThreadPool pool(2);
    GgufWriter w;
    add_synthetic_model(w, spec, type, 42, pool);
    const TrainedVocab vocab = train_bpe(builtin_corpus(), static_cast<int32_t>(spec.num_vocab), pre);
    for (auto& [key, value] : tokenizer_metadata(vocab, pre)) w.set(key, std::move(value));
    const std::string p = (dir_ / name).string();
    w.write(p);
    return p;
  }

  std::string write_folder(const std::string& gguf_path, const std::string& name, const HfWriteOptions& o) {
    const GgufFile g = GgufFile::open(gguf_path);
    const std::string folder = (dir_ / name).string();
    write_hf_model(g, folder, o);
    write_hf_tokenizer(g, folder);
    return folder;
  }

  std::unique_ptr<Model> load_path(const std::string& path) {
    return load_model(std::make_shared<const GgufFile>(open_model_path(path)), *backend_);
  }
};

struct Case {
  const char* preset;
  const char* pre;
  DType type;
  float tolerance;
  uint64_t shard_bytes;
};

TEST_F(HfWriterTest, FoldersGiveTheGgufLogitsAndTokens) {
  const Case cases[] = {{"deepseek2-tiny-v3", "deepseek-v3", DType::kF32, 0.0f, 0},
                        {"deepseek2-tiny-v2", "deepseek-llm", DType::kBF16, 0.0f, 100'000},
                        {"qwen2-tiny", "qwen2", DType::kF16, 0.0f, 0},
                        {"tiny", "deepseek-coder", DType::kF32, 1e-5f, 150'000}};
  for (const Case& c : cases) {
    const std::string gguf = write_with_tokenizer("m.gguf", c.type, synthetic_preset(c.preset), c.pre);
    HfWriteOptions o;
    o.type = c.type;
    o.max_shard_bytes = c.shard_bytes;
    const std::string folder = write_folder(gguf, std::string(c.preset) + "-hf", o);
    EXPECT_EQ(std::filesystem::exists(std::filesystem::path(folder) / "model.safetensors.index.json"),
              c.shard_bytes > 0)
        << c.preset;
    auto a = load_path(gguf);
    auto b = load_path(folder);
    const int64_t vocab = a->config().num_vocab;
    ASSERT_EQ(b->config().num_vocab, vocab) << c.preset;
    std::vector<int32_t> tokens;
    for (int32_t i = 0; i < 19; ++i) tokens.push_back(static_cast<int32_t>((i * 97 + 5) % vocab));
    const std::vector<float> la = all_logits(*a, tokens), lb = all_logits(*b, tokens);
    float size = 0.0f;
    for (float x : la) size = std::max(size, std::fabs(x));
    EXPECT_LE(max_diff(la.data(), lb.data(), static_cast<int64_t>(la.size())), c.tolerance * (1.0f + size))
        << c.preset << " " << dtype_name(c.type);

    const auto ta = Tokenizer::from_gguf(GgufFile::open(gguf));
    const auto tb = Tokenizer::from_gguf(open_model_path(folder));
    for (const char* text : {"Hello world! def f(x): return 3.14159", "中文的句子 and   spaces\n\n\ttabs"}) {
      EXPECT_EQ(ta->encode(text, true, true), tb->encode(text, true, true)) << c.preset << " " << text;
    }
  }
}

TEST_F(HfWriterTest, QuantizedFoldersLoadClose) {
  const std::string gguf = write_with_tokenizer("m.gguf", DType::kF32, synthetic_preset("deepseek2-tiny-v3"),
                                                "deepseek-v3");
  auto reference = load_path(gguf);
  std::vector<int32_t> tokens = {1, 7, 300, 42, 9, 511, 0};
  const std::vector<float> want = all_logits(*reference, tokens);
  float size = 0.0f;
  for (float x : want) size = std::max(size, std::fabs(x));
  for (HfQuant quant : {HfQuant::kFp8, HfQuant::kAwq}) {
    HfWriteOptions o;
    o.quant = quant;
    o.awq_group = 32;
    const std::string folder = write_folder(gguf, quant == HfQuant::kFp8 ? "fp8" : "awq", o);
    auto model = load_path(folder);
    const std::vector<float> got = all_logits(*model, tokens);
    const float diff = max_diff(want.data(), got.data(), static_cast<int64_t>(want.size()));
    EXPECT_GT(diff, 0.0f);
    EXPECT_LE(diff / (1.0f + size), 0.75f) << (quant == HfQuant::kFp8 ? "fp8" : "awq");
  }
  HfWriteOptions o;
  o.quant = HfQuant::kAwq;
  o.awq_group = 128;  // the hidden size is 128, but the expert feed-forward is 32
  EXPECT_THROW(write_folder(gguf, "awq128", o), Error);
}

}  // namespace
}  // namespace duet
