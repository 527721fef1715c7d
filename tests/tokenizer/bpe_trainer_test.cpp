// The BPE trainer behind `duet make-model`: exact vocabulary size, determinism, speed, and
// tokenizers built from its output round-trip any input.
#include <chrono>
#include <iostream>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/tokenizer/bpe_trainer.h"
#include "duet/tokenizer/tokenizer.h"
#include "duet/tokenizer/unicode.h"
#include "vocab_fixture.h"

namespace duet::testing {
namespace {

std::string random_bytes(std::mt19937& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

TEST(BpeTrainer, BuiltinCorpusIsSubstantialAndValid) {
  const std::string_view corpus = builtin_corpus();
  EXPECT_GT(corpus.size(), 15000u);
  EXPECT_TRUE(is_valid_utf8(corpus));
}

TEST(BpeTrainer, VocabularyHasExactlyTheRequestedSize) {
  const TrainedVocab v = train_bpe(builtin_corpus(), 4096, "deepseek-coder");
  ASSERT_EQ(v.tokens.size(), 4096u);
  ASSERT_EQ(v.token_types.size(), 4096u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(v.tokens[b], byte_to_unicode()[b]);
  EXPECT_EQ(v.tokens[v.bos_id], "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(v.tokens[v.eos_id], "<｜end▁of▁sentence｜>");
  EXPECT_EQ(v.token_types[v.bos_id], static_cast<int32_t>(TokenType::kControl));
  EXPECT_EQ(v.token_types[v.eos_id], static_cast<int32_t>(TokenType::kControl));
  size_t normal = 0, unused = 0;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    normal += v.token_types[i] == static_cast<int32_t>(TokenType::kNormal);
    if (v.token_types[i] == static_cast<int32_t>(TokenType::kUnused)) {
      ++unused;
      EXPECT_TRUE(v.tokens[i].starts_with("<|reserved_")) << v.tokens[i];
    }
  }
  EXPECT_EQ(normal + unused + 2, 4096u);
  std::set<std::string> distinct(v.tokens.begin(), v.tokens.end());
  EXPECT_EQ(distinct.size(), v.tokens.size());
  std::cout << "4096-entry vocabulary: " << normal << " normal tokens (" << v.merges.size() << " merges), " << unused
            << " reserved\n";
}

TEST(BpeTrainer, TinyVocabularies) {
  const TrainedVocab v = train_bpe(builtin_corpus(), 258, "gpt2");
  EXPECT_EQ(v.tokens.size(), 258u);
  EXPECT_TRUE(v.merges.empty());
  EXPECT_EQ(v.bos_id, 256);
  // A corpus with no repeated pair: no merges, the rest reserved.
  const TrainedVocab r = train_bpe("abcdefg", 300, "gpt2");
  EXPECT_TRUE(r.merges.empty());
  EXPECT_EQ(r.tokens.size(), 300u);
  EXPECT_EQ(r.tokens.back(), "<|reserved_41|>");
}

TEST(BpeTrainer, IsDeterministic) {
  const TrainedVocab a = train_bpe(builtin_corpus(), 3000, "deepseek-llm");
  const TrainedVocab b = train_bpe(builtin_corpus(), 3000, "deepseek-llm");
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.token_types, b.token_types);
}

TEST(BpeTrainer, TrainsThousandsOfMergesQuickly) {
  const auto t0 = std::chrono::steady_clock::now();
  const TrainedVocab v = train_bpe(builtin_corpus(), 8192, "deepseek-coder");
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "trained " << v.merges.size() << " merges on " << builtin_corpus().size() << " bytes in " << ms
            << " ms\n";
  EXPECT_GT(v.merges.size(), 3000u);
  EXPECT_LT(ms, 30000.0);  // generous: a sanity bound, not a benchmark
}

TEST(BpeTrainer, Errors) {
  try {
    train_bpe("abc", 257, "gpt2");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("257"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("258"), std::string::npos);
  }
  EXPECT_THROW(train_bpe("abc", 300, "no-such-pre"), Error);
}

class TrainedRoundTrip : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainedRoundTrip, DecodeInvertsEncode) {
  const std::string pre = GetParam();
  const TrainedVocab v = train_bpe(builtin_corpus(), 2048, pre);
  const auto tok = tokenizer_from_metadata(tokenizer_metadata(v, pre));
  EXPECT_EQ(tok->vocab_size(), 2048);
  EXPECT_EQ(tok->pre(), pre);

  const std::string corpus(builtin_corpus());
  const std::vector<int32_t> ids = tok->encode(corpus, false, false);
  EXPECT_EQ(tok->decode(ids), corpus);
  EXPECT_LT(ids.size() * 2, corpus.size()) << "the trained merges should compress their own corpus";
  for (int32_t id : ids) EXPECT_EQ(tok->token_type(id), TokenType::kNormal);

  std::mt19937 rng(42);
  for (int i = 0; i < 200; ++i) {
    const std::string bytes = random_bytes(rng, 1 + rng() % 64);
    EXPECT_EQ(tok->decode(tok->encode(bytes, false, false)), bytes) << escaped(bytes);
  }
  EXPECT_EQ(tok->encode("<｜begin▁of▁sentence｜>x", false, true).front(), v.bos_id);
  EXPECT_EQ(tok->encode("x", true, false).front(), v.bos_id);
}

INSTANTIATE_TEST_SUITE_P(Pre, TrainedRoundTrip,
                         ::testing::Values("gpt2", "deepseek-llm", "deepseek-coder", "deepseek-v3", "qwen2", "llama3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::erase(name, '-');
                           return name;
                         });

}  // namespace
}  // namespace duet::testing
