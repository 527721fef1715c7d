// The tokenizers over the real vocabularies in ../shared/testdata/vocab: special tokens, BOS/EOS
// from the files' metadata, pieces, thread safety, ill-formed UTF-8, and the detokenizer's byte
// tokens. A CTest skip (exit code 77, with the reason) when the shared data is absent, so that a
// checkout without it says so instead of passing tests that ran nothing.
#include <algorithm>
#include <cstdio>
#include <map>
#include <thread>

#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/tokenizer/bpe_trainer.h"
#include "duet/tokenizer/tokenizer.h"
#include "duet/tokenizer/unicode.h"
#include "vocab_fixture.h"

namespace duet::testing {
namespace {

const char* const kVocabs[] = {"deepseek-llm", "deepseek-coder", "gpt-2", "llama-spm"};

// The shared vocabularies, loaded once per test program (main checked that all are there).
const Tokenizer& vocab(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, load_vocab(name).tokenizer).first;
  return *it->second;
}

#define REQUIRE_VOCAB(var, name) const Tokenizer* var = &vocab(name)

// Streams `ids` through a detokenizer: every part must be valid UTF-8. Returns all parts.
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  IncrementalDetokenizer detok(tok);
  std::vector<std::string> parts;
  for (int32_t id : ids) {
    parts.push_back(detok.push(id));
    EXPECT_TRUE(is_valid_utf8(parts.back())) << escaped(parts.back());
  }
  parts.push_back(detok.flush());
  EXPECT_TRUE(is_valid_utf8(parts.back()));
  return parts;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string s;
  for (const std::string& p : parts) s += p;
  return s;
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

// Fill-in-the-middle markers found by their text: DeepSeek-Coder has them, DeepSeek-LLM does not.
TEST(FillInTheMiddle, MarkersOfTheVocabulary) {
  REQUIRE_VOCAB(coder, "deepseek-coder");
  EXPECT_EQ(coder->fim_pre_id(), coder->token_to_id("<｜fim▁begin｜>"));
  EXPECT_EQ(coder->fim_suf_id(), coder->token_to_id("<｜fim▁hole｜>"));
  EXPECT_EQ(coder->fim_mid_id(), coder->token_to_id("<｜fim▁end｜>"));
  EXPECT_EQ(coder->fim_pre_id(), 32016);
  EXPECT_EQ(coder->fim_suf_id(), 32015);
  EXPECT_EQ(coder->fim_mid_id(), 32017);
  REQUIRE_VOCAB(llm, "deepseek-llm");
  EXPECT_EQ(llm->fim_pre_id(), -1);
  EXPECT_EQ(llm->fim_suf_id(), -1);
  EXPECT_EQ(llm->fim_mid_id(), -1);
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

TEST(Detokenizer, SentencePieceByteFallback) {
  const Tokenizer* tok = &vocab("llama-spm");
  const std::string llama = "\xF0\x9F\xA6\x99";  // U+1F999 has no piece: four <0xXX> tokens
  const std::vector<int32_t> ids = tok->encode(llama, false, false);
  ASSERT_EQ(ids.size(), 5u);  // "▁" + 4 bytes
  const std::vector<std::string> parts = stream(*tok, ids);
  EXPECT_EQ(parts, (std::vector<std::string>{" ", "", "", "", llama, ""}));
}

TEST(Detokenizer, EveryPrefixOfAStreamIsValid) {
  const Tokenizer* tok = &vocab("gpt-2");
  const std::string text =
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE6\x96\x87\xE7\xAB\xA0 \xF0\x9F\x98\x80\xF0\x9F\x91\x8D"
      "\xF0\x9F\x8F\xBD \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4";
  const std::vector<int32_t> ids = tok->encode(text, false, false);
  EXPECT_GT(ids.size(), 10u);
  EXPECT_EQ(joined(stream(*tok, ids)), text);
}

}  // namespace
}  // namespace duet::testing

int main(int argc, char** argv) {
  for (const char* name : duet::testing::kVocabs) {
    std::string why;
    if (duet::testing::vocab_path(name, &why).empty()) {
      std::printf("skipped: %s\n", why.c_str());
      return 77;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
