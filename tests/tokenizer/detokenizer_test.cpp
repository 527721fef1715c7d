// The incremental detokenizer and the UTF-8 helpers under it: characters split across byte
// tokens are held back until complete, nothing emitted is ever invalid UTF-8, and flush()
// replaces what can never complete with U+FFFD.
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "duet/tokenizer/bpe_trainer.h"
#include "duet/tokenizer/tokenizer.h"
#include "duet/tokenizer/unicode.h"
#include "vocab_fixture.h"

namespace duet::testing {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

// A vocabulary trained on the built-in corpus, so rare characters are spelled in byte tokens.
const Tokenizer& trained() {
  static const std::unique_ptr<Tokenizer> tok =
      tokenizer_from_metadata(tokenizer_metadata(train_bpe(builtin_corpus(), 1000, "deepseek-v3"), "deepseek-v3"));
  return *tok;
}

// Streams `ids` through a detokenizer: every part must be valid UTF-8. Returns all parts.
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool special = false) {
  IncrementalDetokenizer detok(tok, special);
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

TEST(Utf8, DecodeAndValidate) {
  uint32_t cp = 0;
  EXPECT_EQ(decode_utf8("\xE4\xBD\xA0", 0, cp), 3u);
  EXPECT_EQ(cp, 0x4F60u);
  EXPECT_EQ(decode_utf8("\xF0\x9F\x98\x80", 0, cp), 4u);
  EXPECT_EQ(cp, 0x1F600u);
  EXPECT_EQ(decode_utf8("\xC0\xAF", 0, cp), 0u);          // overlong
  EXPECT_EQ(decode_utf8("\xED\xA0\x80", 0, cp), 0u);      // surrogate
  EXPECT_EQ(decode_utf8("\xF4\x90\x80\x80", 0, cp), 0u);  // above U+10FFFF
  EXPECT_EQ(decode_utf8("\xE4\xBD", 0, cp), 0u);          // incomplete
  EXPECT_TRUE(is_valid_utf8("plain ASCII, \xC3\xA9t\xC3\xA9, \xE4\xBD\xA0\xE5\xA5\xBD"));
  EXPECT_FALSE(is_valid_utf8("\x80"));
}

TEST(Utf8, SanitizeReplacesMaximalSubparts) {
  EXPECT_EQ(sanitize_utf8("a\xF0\x9F\x98z"), "a" + kFffd + "z");  // one U+FFFD for the truncated sequence
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), kFffd + kFffd);
  EXPECT_EQ(sanitize_utf8("\xE4\xBD\xA0"), "\xE4\xBD\xA0");
}

TEST(Utf8, CompletePrefixHoldsBackOnlyWhatCanStillComplete) {
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xBD"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(utf8_complete_prefix("ab\x80"), 3u);      // a stray continuation can never complete
  EXPECT_EQ(utf8_complete_prefix("ab\xE0\x80"), 4u);  // E0 80 is never valid
  EXPECT_EQ(utf8_complete_prefix("ab\xFF"), 3u);
}

TEST(Utf8, ByteToUnicodeIsABijection) {
  const auto& table = byte_to_unicode();
  std::set<std::string> seen(table.begin(), table.end());
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(table[' '], "\xC4\xA0");  // "Ġ"
  EXPECT_EQ(table['\n'], "\xC4\x8A");  // "Ċ"
  EXPECT_EQ(table['A'], "A");
  for (int b = 0; b < 256; ++b) {
    uint32_t cp = 0;
    ASSERT_GT(decode_utf8(table[b], 0, cp), 0u);
    EXPECT_EQ(unicode_to_byte(cp), b);
  }
  EXPECT_EQ(unicode_to_byte(0x4F60), -1);
}

TEST(Detokenizer, HoldsBackCharactersSplitAcrossByteTokens) {
  const Tokenizer& tok = trained();
  const std::string text = "emoji \xF0\x9F\xA6\x99\xF0\x9F\x9A\x80 and CJK \xE9\xBE\x98\xE9\xBD\x89 \xE2\x88\x9E!";
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  // The rare characters are spelled with byte tokens, so some pieces are not valid UTF-8 alone.
  size_t split_pieces = 0;
  for (int32_t id : ids) split_pieces += !is_valid_utf8(tok.token_to_piece(id, false));
  EXPECT_GT(split_pieces, 3u);

  const std::vector<std::string> parts = stream(tok, ids);
  EXPECT_EQ(joined(parts), text);
  EXPECT_EQ(parts.back(), "");  // nothing was left for flush
  size_t held = 0;
  for (size_t i = 0; i + 1 < parts.size(); ++i) held += parts[i].empty();
  EXPECT_GT(held, 0u);
}

TEST(Detokenizer, FlushReplacesWhatCannotComplete) {
  const Tokenizer& tok = trained();
  // Byte tokens of the trained vocabulary have id = byte value.
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.push(0xF0), "");
  EXPECT_EQ(detok.push(0x9F), "");
  EXPECT_EQ(detok.flush(), kFffd);  // one U+FFFD for the incomplete sequence
  EXPECT_EQ(detok.flush(), "");

  EXPECT_EQ(detok.push(0x80), kFffd);  // a stray continuation byte is replaced at once
  EXPECT_EQ(detok.push(0xE4), "");
  EXPECT_EQ(detok.push('A'), kFffd + "A");  // the sequence was broken by 'A'
  EXPECT_EQ(detok.push(0xC3), "");
  EXPECT_EQ(detok.push(0xA9), "\xC3\xA9");
  EXPECT_EQ(detok.flush(), "");
}

TEST(Detokenizer, ControlTokensOnlyWhenSpecial) {
  const Tokenizer& tok = trained();
  const std::vector<int32_t> ids = tok.encode("hi", true, false);
  ASSERT_EQ(ids.front(), tok.bos_id());
  EXPECT_EQ(joined(stream(tok, ids, false)), "hi");
  EXPECT_EQ(joined(stream(tok, ids, true)), "<｜begin▁of▁sentence｜>hi");
}

TEST(Detokenizer, RandomBytesNeverProduceInvalidUtf8) {
  const Tokenizer& tok = trained();
  std::mt19937 rng(1234);
  for (int round = 0; round < 50; ++round) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(static_cast<int32_t>(rng() % 300));
    const std::vector<std::string> parts = stream(tok, ids);
    EXPECT_EQ(joined(parts), sanitize_utf8(tok.decode(ids)));
  }
}

}  // namespace
}  // namespace duet::testing
