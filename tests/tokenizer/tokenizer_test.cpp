// Unit tests of the tokenizers on vocabularies trained here: BOS/EOS, thread safety, pre-tokenizers,
// and the errors for malformed metadata. The tests over the real shared vocabularies are in
// tokenizer_shared_test.cpp (a CTest skip when ../shared is absent).
#include <algorithm>
#include <iostream>
#include <map>
#include <thread>

#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/tokenizer/bpe_trainer.h"
#include "duet/tokenizer/pretokenizer.h"
#include "duet/tokenizer/tokenizer.h"
#include "vocab_fixture.h"

namespace duet::testing {
namespace {

using Metadata = std::vector<std::pair<std::string, GgufValue>>;

// A small byte-level vocabulary trained here, as metadata that tests may change.
const TrainedVocab& small_vocab() {
  static const TrainedVocab vocab = train_bpe(builtin_corpus(), 600, "deepseek-coder");
  return vocab;
}
Metadata small_bpe_metadata() { return tokenizer_metadata(small_vocab(), "deepseek-coder"); }

void set(Metadata& m, const std::string& key, GgufValue value) {
  for (auto& [k, v] : m) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  m.emplace_back(key, std::move(value));
}

void remove_key(Metadata& m, const std::string& key) {
  std::erase_if(m, [&](const auto& kv) { return kv.first == key; });
}

// Expects building a tokenizer from `m` to fail with `code` and a message containing `parts`.
void expect_error(const Metadata& m, ErrorCode code, std::initializer_list<std::string_view> parts) {
  try {
    tokenizer_from_metadata(m);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (std::string_view part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Bos, AddEosAndStopIdsFromSyntheticMetadata) {
  Metadata m = small_bpe_metadata();
  set(m, "tokenizer.ggml.add_eos_token", GgufValue::boolean(true));
  set(m, "tokenizer.ggml.eot_token_id", GgufValue::u32(300));
  set(m, "tokenizer.ggml.eom_token_id", GgufValue::i32(-1));  // "none"
  const auto tok = tokenizer_from_metadata(m);
  const std::vector<int32_t> ids = tok->encode("abc", true, false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), tok->bos_id());
  EXPECT_EQ(ids.back(), tok->eos_id());
  EXPECT_EQ(tok->eom_id(), -1);
  EXPECT_EQ(tok->stop_ids(), (std::vector<int32_t>{tok->eos_id(), 300}));

  remove_key(m, "tokenizer.ggml.add_bos_token");
  remove_key(m, "tokenizer.ggml.add_eos_token");
  EXPECT_FALSE(tokenizer_from_metadata(m)->add_bos());  // the gpt2 default
}

// Fill-in-the-middle markers from llama.cpp's metadata keys, all three or none.
TEST(FillInTheMiddle, MarkersFromMetadata) {
  Metadata m = small_bpe_metadata();
  EXPECT_EQ(tokenizer_from_metadata(m)->fim_pre_id(), -1);
  set(m, "tokenizer.ggml.fim_pre_token_id", GgufValue::u32(301));
  set(m, "tokenizer.ggml.fim_suf_token_id", GgufValue::u32(302));
  EXPECT_EQ(tokenizer_from_metadata(m)->fim_pre_id(), -1);  // no middle marker: none
  set(m, "tokenizer.ggml.fim_mid_token_id", GgufValue::u32(303));
  const auto tok = tokenizer_from_metadata(m);
  EXPECT_EQ(tok->fim_pre_id(), 301);
  EXPECT_EQ(tok->fim_suf_id(), 302);
  EXPECT_EQ(tok->fim_mid_id(), 303);
  set(m, "tokenizer.ggml.fim_mid_token_id", GgufValue::u32(1000000));
  expect_error(m, ErrorCode::kInvalidArgument, {"fim_mid_token_id"});
}

// encode() reuses per-thread buffers; threads encoding at once must each get the ids of a single
// encode (always run: a trained vocabulary needs no shared data).
TEST(Encode, IsThreadSafe) {
  const auto tok = tokenizer_from_metadata(tokenizer_metadata(small_vocab(), "deepseek-coder"));
  const std::string text = std::string(builtin_corpus().substr(0, 8000));
  const std::vector<int32_t> expected = tok->encode(text, true, true);
  ASSERT_GT(expected.size(), 1000u);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Each thread its own part of the text too, so that the buffers differ in size.
      const std::string part = text.substr(static_cast<size_t>(t) * 1000);
      const std::vector<int32_t> part_ids = tok->encode(part, false, false);
      for (int r = 0; r < 20; ++r) {
        ok[t] += tok->encode(text, true, true) == expected;
        ok[t] += tok->encode(part, false, false) == part_ids;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 40) << "thread " << t;
}

TEST(PreTokenizer, NamesAndPieces) {
  for (std::string_view name : {"default", "gpt2", "gpt-2", "deepseek-llm", "deepseek-coder", "deepseek-v3", "qwen2",
                                "deepseek-r1-qwen", "llama3", "llama-bpe"}) {
    EXPECT_TRUE(PreTokenizer::is_supported(name)) << name;
    const PreTokenizer pre(name);
    std::vector<std::string_view> pieces;
    const std::string text = "Hello, world! 12345 你好世界 x\xFFy \n\n  end  ";
    pre.split(text, pieces);
    std::string joined;
    for (std::string_view p : pieces) {
      EXPECT_FALSE(p.empty()) << name;
      joined += p;
    }
    EXPECT_EQ(joined, text) << name;
  }
  std::vector<std::string_view> pieces;
  PreTokenizer("deepseek-v3").split("abc 12345", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"abc", " ", "123", "45"}));
  pieces.clear();
  PreTokenizer("deepseek-coder").split("x=42", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"x", "=", "4", "2"}));
  pieces.clear();
  PreTokenizer("qwen2").split("I'M fine", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"I", "'M", " fine"}));
  std::cout << "PCRE2 JIT in use: " << (PreTokenizer("deepseek-llm").jit() ? "yes" : "no") << "\n";
}

TEST(PreTokenizer, UnknownNameIsUnsupported) {
  try {
    PreTokenizer("nope");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("deepseek-v3"), std::string::npos);
  }
}

TEST(Errors, MalformedMetadata) {
  const Metadata good = small_bpe_metadata();
  ASSERT_NO_THROW(tokenizer_from_metadata(good));

  Metadata m = good;
  remove_key(m, "tokenizer.ggml.model");
  expect_error(m, ErrorCode::kInvalidArgument, {"tokenizer.ggml.model", "missing"});

  m = good;
  set(m, "tokenizer.ggml.model", GgufValue::str("bert"));
  expect_error(m, ErrorCode::kUnsupported, {"'bert'", "gpt2", "llama"});

  m = good;
  set(m, "tokenizer.ggml.pre", GgufValue::str("mystery"));
  expect_error(m, ErrorCode::kUnsupported, {"tokenizer.ggml.pre", "'mystery'", "deepseek-llm"});

  m = good;
  remove_key(m, "tokenizer.ggml.tokens");
  expect_error(m, ErrorCode::kInvalidArgument, {"tokenizer.ggml.tokens", "missing"});

  m = good;
  set(m, "tokenizer.ggml.token_type", GgufValue::i32_array({1, 1, 1}));
  expect_error(m, ErrorCode::kInvalidArgument, {"tokenizer.ggml.token_type", "3 entries", "600"});

  m = good;
  std::vector<int32_t> types(600, 1);
  types[7] = 9;
  set(m, "tokenizer.ggml.token_type", GgufValue::i32_array(types));
  expect_error(m, ErrorCode::kInvalidArgument, {"tokenizer.ggml.token_type[7]", "9"});

  m = good;
  set(m, "tokenizer.ggml.merges", GgufValue::string_array({small_vocab().merges[0], "zz\xC4\xA0 q"}));
  expect_error(m, ErrorCode::kInvalidArgument, {"tokenizer.ggml.merges[1]", "'zz\xC4\xA0'", "not in the vocabulary"});

  m = good;
  set(m, "tokenizer.ggml.merges", GgufValue::string_array({"ab"}));
  expect_error(m, ErrorCode::kInvalidArgument, {"tokenizer.ggml.merges[0]", "'ab'", "separated by a space"});

  m = good;
  remove_key(m, "tokenizer.ggml.merges");
  expect_error(m, ErrorCode::kInvalidArgument, {"tokenizer.ggml.merges", "missing"});

  m = good;
  set(m, "tokenizer.ggml.bos_token_id", GgufValue::u32(600));
  expect_error(m, ErrorCode::kInvalidArgument, {"tokenizer.ggml.bos_token_id", "600", "600 tokens"});

  m = good;
  remove_key(m, "tokenizer.ggml.bos_token_id");
  expect_error(m, ErrorCode::kInvalidArgument, {"tokenizer.ggml.add_bos_token is true", "bos_token_id"});

  m = good;
  set(m, "tokenizer.ggml.tokens", GgufValue::i32_array({1, 2}));
  expect_error(m, ErrorCode::kInvalidArgument, {"tokenizer.ggml.tokens"});
}

TEST(Errors, SentencePieceScores) {
  Metadata m = {
      {"tokenizer.ggml.model", GgufValue::str("llama")},
      {"tokenizer.ggml.tokens", GgufValue::string_array({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a"})},
      {"tokenizer.ggml.token_type", GgufValue::i32_array({2, 3, 3, 1, 1})},
      {"tokenizer.ggml.scores", GgufValue::f32_array({0, 0, 0})},
  };
  expect_error(m, ErrorCode::kInvalidArgument, {"tokenizer.ggml.scores", "3 entries", "5"});
  set(m, "tokenizer.ggml.scores", GgufValue::f32_array({0, 0, 0, -1, -2}));
  const auto tok = tokenizer_from_metadata(m);
  EXPECT_TRUE(tok->add_bos());  // the llama default, with <s> as bos
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->unk_id(), 0);
  // No byte tokens: a character without a piece becomes <unk>.
  EXPECT_EQ(tok->encode("a\xC3\xA9", false, false), (std::vector<int32_t>{3, 4, 0}));
}

}  // namespace
}  // namespace duet::testing
