// One vocabulary's test vectors (ggml-vocab-NAME.gguf.inp/.out): every case must give exactly
// the reference ids (no BOS/EOS, no special-token parsing). Built once per vocabulary with
// DUET_VOCAB_NAME set; exits 77 (skipped) when the shared test data is not there.
#include <chrono>
#include <cstdio>
#include <iostream>

#include <gtest/gtest.h>

#include "duet/tokenizer/unicode.h"
#include "vocab_fixture.h"

#ifndef DUET_VOCAB_NAME
#error "DUET_VOCAB_NAME must name the vocabulary (e.g. \"deepseek-llm\")"
#endif

namespace duet::testing {
namespace {

const std::string kName = DUET_VOCAB_NAME;

class VocabTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    loaded_ = new LoadedVocab(load_vocab(kName));
    cases_ = new std::vector<VocabCase>(read_vocab_cases(kName));
  }
  static void TearDownTestSuite() {
    delete loaded_;
    delete cases_;
  }
  static const Tokenizer& tok() { return *loaded_->tokenizer; }

  static LoadedVocab* loaded_;
  static std::vector<VocabCase>* cases_;
};

LoadedVocab* VocabTest::loaded_ = nullptr;
std::vector<VocabCase>* VocabTest::cases_ = nullptr;

TEST_F(VocabTest, EveryCaseGivesTheReferenceIds) {
  ASSERT_FALSE(cases_->empty());
  size_t matched = 0;
  for (size_t i = 0; i < cases_->size(); ++i) {
    const VocabCase& c = (*cases_)[i];
    const std::vector<int32_t> ids = tok().encode(c.text, /*add_special=*/false, /*parse_special=*/false);
    if (ids == c.ids) {
      ++matched;
    } else {
      ADD_FAILURE() << kName << " case " << i << " " << escaped(c.text) << "\n  expected " << ids_string(c.ids)
                    << "\n  got      " << ids_string(ids);
    }
  }
  std::cout << kName << ": " << matched << "/" << cases_->size() << " cases match\n";
}

TEST_F(VocabTest, DecodeGivesTheTextBack) {
  // Every case is valid UTF-8 and both tokenizer kinds are lossless on it (byte-level BPE keeps
  // every byte; SentencePiece falls back to byte tokens and decode drops the prefix space).
  for (size_t i = 0; i < cases_->size(); ++i) {
    const VocabCase& c = (*cases_)[i];
    const std::vector<int32_t> ids = tok().encode(c.text, false, false);
    EXPECT_EQ(tok().decode(ids), c.text) << kName << " case " << i << " " << escaped(c.text);
    // The reference ids decode to the same text as well.
    EXPECT_EQ(tok().decode(c.ids), c.text) << kName << " case " << i << " (reference ids)";
  }
}

TEST_F(VocabTest, StreamingDecodeNeverSplitsACharacter) {
  for (const VocabCase& c : *cases_) {
    IncrementalDetokenizer detok(tok());
    std::string streamed;
    for (int32_t id : tok().encode(c.text, false, false)) {
      const std::string part = detok.push(id);
      EXPECT_TRUE(is_valid_utf8(part)) << escaped(part);
      streamed += part;
    }
    streamed += detok.flush();
    // The detokenizer keeps SentencePiece's prefix space, which decode() drops.
    if (tok().add_space_prefix() && !c.text.empty()) {
      ASSERT_FALSE(streamed.empty());
      EXPECT_EQ(streamed[0], ' ');
      streamed.erase(0, 1);
    }
    EXPECT_EQ(streamed, c.text);
  }
}

// Encoding keeps no state from one call to the next (its buffers are reused per thread): every
// case encoded again, 20 rounds over all of them, gives exactly the ids of the first round. The
// time it takes is printed (reported, not checked).
TEST_F(VocabTest, RepeatedEncodingGivesTheSameIds) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<int32_t>> first;
  for (const VocabCase& c : *cases_) first.push_back(tok().encode(c.text, false, false));
  size_t num_bytes = 0;
  constexpr int kRounds = 20;
  const auto t0 = Clock::now();
  for (int r = 0; r < kRounds; ++r) {
    // Every other round backwards, so that each case follows another than in the first round.
    for (size_t k = 0; k < cases_->size(); ++k) {
      const size_t i = r % 2 == 0 ? k : cases_->size() - 1 - k;
      const VocabCase& c = (*cases_)[i];
      ASSERT_EQ(tok().encode(c.text, false, false), first[i]) << kName << " round " << r << " case " << i;
      num_bytes += c.text.size();
    }
  }
  const double encode_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::printf("%s: %d tokens; GgufFile::open %.1f ms, Tokenizer::from_gguf %.1f ms; "
              "tokenizing all %zu cases %.3f ms (%.1f MB/s)\n",
              kName.c_str(), tok().vocab_size(), loaded_->open_ms, loaded_->build_ms,
              cases_->size(), encode_ms / kRounds, num_bytes / (encode_ms * 1e3));
}

}  // namespace
}  // namespace duet::testing

int main(int argc, char** argv) { return duet::testing::run_vocab_tests(DUET_VOCAB_NAME, argc, argv); }
