// Unit tests of the tokenizers: special tokens, BOS/EOS, pieces, pre-tokenizers, and the errors
// for malformed metadata. Tests that need the shared vocab files skip when they are missing.
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

// The shared vocabularies, loaded once per test program.
const Tokenizer* shared_vocab(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    if (vocab_path(name).empty()) return nullptr;
    it = cache.emplace(name, load_vocab(name).tokenizer).first;
  }
  return it->second.get();
}

#define REQUIRE_VOCAB(var, name)                                              \
  const Tokenizer* var = shared_vocab(name);                                  \
  if (var == nullptr) GTEST_SKIP() << "shared vocab '" << name << "' missing"

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

TEST(SpecialTokens, ControlTokensNeedParseSpecial) {
  REQUIRE_VOCAB(tok, "deepseek-llm");
  const std::string text = "<｜begin▁of▁sentence｜>Hello world<｜end▁of▁sentence｜>";
  const std::vector<int32_t> parsed = tok->encode(text, false, true);
  EXPECT_EQ(parsed, (std::vector<int32_t>{100000, 17464, 1843, 100001}));

  const std::vector<int32_t> plain = tok->encode(text, false, false);
  EXPECT_GT(plain.size(), 4u);
  for (int32_t id : plain) EXPECT_FALSE(tok->is_control(id)) << id;
  EXPECT_EQ(tok->decode(plain), text);  // the special text survives as ordinary text
  EXPECT_EQ(tok->decode(parsed), "Hello world");
  EXPECT_EQ(tok->decode(parsed, /*special=*/true), text);
}

TEST(SpecialTokens, UserDefinedTokensAreAlwaysMatched) {
  REQUIRE_VOCAB(tok, "deepseek-coder");
  const int32_t user = tok->token_to_id("<|User|>");
  ASSERT_GE(user, 0);
  EXPECT_EQ(tok->token_type(user), TokenType::kUserDefined);
  EXPECT_EQ(tok->encode("<|User|>", false, false), std::vector<int32_t>{user});
  EXPECT_EQ(tok->encode("<|User|>", false, true), std::vector<int32_t>{user});
  // Leftmost-longest: "<｜fim▁begin｜>" is one token even though it contains other texts.
  const int32_t fim = tok->token_to_id("<｜fim▁begin｜>");
  EXPECT_EQ(tok->encode("<｜fim▁begin｜>", false, false), std::vector<int32_t>{fim});
  // Control tokens of this vocabulary still need parse_special.
  EXPECT_NE(tok->encode("<｜begin▁of▁sentence｜>", false, false).size(), 1u);
  EXPECT_EQ(tok->encode("<｜begin▁of▁sentence｜>", false, true), std::vector<int32_t>{tok->bos_id()});
}

TEST(SpecialTokens, SentencePieceAddsThePrefixAfterASpecialToken) {
  REQUIRE_VOCAB(tok, "llama-spm");
  // "<s>Hello" with parse_special: <s>, then "Hello" with its prefix space ("▁Hello").
  EXPECT_EQ(tok->encode("<s>Hello", false, true), (std::vector<int32_t>{1, 15043}));
  EXPECT_EQ(tok->encode("Hello", true, false), (std::vector<int32_t>{1, 15043}));
  const std::vector<int32_t> plain = tok->encode("<s>", false, false);
  EXPECT_TRUE(std::find(plain.begin(), plain.end(), 1) == plain.end());
  EXPECT_EQ(tok->decode(plain), "<s>");
}

TEST(Bos, FollowsTheMetadata) {
  REQUIRE_VOCAB(llm, "deepseek-llm");
  EXPECT_TRUE(llm->add_bos());
  EXPECT_FALSE(llm->add_eos());
  EXPECT_EQ(llm->encode("Hello", true, false), (std::vector<int32_t>{100000, 17464}));
  EXPECT_EQ(llm->encode("Hello", false, false), (std::vector<int32_t>{17464}));
  EXPECT_EQ(llm->encode("", true, false), (std::vector<int32_t>{100000}));
  EXPECT_EQ(llm->stop_ids(), (std::vector<int32_t>{100001}));

  REQUIRE_VOCAB(gpt2, "gpt-2");  // no add_bos_token key: a gpt2 model adds nothing
  EXPECT_FALSE(gpt2->add_bos());
  EXPECT_EQ(gpt2->encode("Hello", true, false), gpt2->encode("Hello", false, false));
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

TEST(Pieces, ByteLevelAndSentencePiece) {
  REQUIRE_VOCAB(gpt2, "gpt-2");
  EXPECT_EQ(gpt2->token_to_piece(gpt2->token_to_id("\xC4\xA0"), false), " ");  // "Ġ"
  EXPECT_EQ(gpt2->token_to_piece(198, false), "\n");
  EXPECT_EQ(gpt2->token_to_piece(50256, false), "");
  EXPECT_EQ(gpt2->token_to_piece(50256, true), "<|endoftext|>");
  EXPECT_THROW(gpt2->token_to_piece(50257, false), Error);
  EXPECT_THROW(gpt2->token_text(-1), Error);

  REQUIRE_VOCAB(spm, "llama-spm");
  EXPECT_EQ(spm->token_to_piece(13, false), "\n");        // <0x0A>
  EXPECT_EQ(spm->token_to_piece(15043, false), " Hello");  // ▁Hello
  EXPECT_EQ(spm->token_to_piece(0, false), "");            // <unk>
  EXPECT_EQ(spm->token_to_piece(1, true), "<s>");
  EXPECT_EQ(spm->decode(std::vector<int32_t>{1, 15043, 3186}), "Hello world");
}

TEST(Encode, IsThreadSafe) {
  REQUIRE_VOCAB(tok, "deepseek-llm");
  const std::string text = std::string(builtin_corpus().substr(0, 8000));
  const std::vector<int32_t> expected = tok->encode(text, true, true);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < 5; ++r) ok[t] += tok->encode(text, true, true) == expected;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 5);
}

TEST(Encode, InvalidUtf8IsKeptByteForByte) {
  // Ill-formed bytes become pieces of their own and are encoded with byte tokens. (DeepSeek's
  // vocabularies have no byte tokens for C0, C1 and F5..FF, which never occur in UTF-8; their
  // characters are user-defined tokens there, so those bytes come back as those characters.)
  REQUIRE_VOCAB(tok, "deepseek-llm");
  const std::string text = "ab\x80\xC3 cd\xE4\xB8 \xF0\x9F\x98";
  EXPECT_EQ(tok->decode(tok->encode(text, false, false)), text);
  REQUIRE_VOCAB(gpt2, "gpt-2");
  const std::string all = "\xFF\xFE\xC0\xC1\xF5 x \xED\xA0\x80";
  EXPECT_EQ(gpt2->decode(gpt2->encode(all, false, false)), all);
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
