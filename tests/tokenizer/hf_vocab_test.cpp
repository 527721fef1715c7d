// One real vocabulary (ggml-vocab-NAME.gguf of ../shared/testdata/vocab) as a Hugging Face
// tokenizer.json: the GGUF's tokens and merges with the model family's published normalizer and
// pre-tokenizer (hf_pre_tokenizers.json), read back through hf_tokenizer_metadata(); every
// .inp case must give exactly the .out ids, as it does from the GGUF file. For the SentencePiece
// vocabulary the merges are derived from the vocabulary and its scores the way Hugging Face's
// converter does (every split of a piece into two pieces, ordered by the piece's score), so the
// folder's tokenizer is scored from merge ranks, not from the file's scores. Built once per
// vocabulary with DUET_VOCAB_NAME and DUET_HF_PRE set; exits 77 (skipped) without the shared data.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <unordered_map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "duet/formats/gguf.h"
#include "duet/tokenizer/hf_tokenizer.h"
#include "duet/tokenizer/tokenizer.h"
#include "duet/tokenizer/unicode.h"
#include "vocab_fixture.h"

#ifndef DUET_VOCAB_NAME
#error "DUET_VOCAB_NAME must name the vocabulary"
#endif
#ifndef DUET_HF_PRE
#error "DUET_HF_PRE must name its section of hf_pre_tokenizers.json"
#endif

namespace duet::testing {
namespace {

using Json = nlohmann::json;
using Metadata = std::vector<std::pair<std::string, GgufValue>>;

const GgufValue* find(const Metadata& m, std::string_view key) {
  for (const auto& [k, v] : m) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::vector<std::string> strings(const GgufValue* v) {
  std::vector<std::string> out;
  if (v == nullptr) return out;
  for (const GgufValue& item : std::get<GgufArray>(v->value).items) out.push_back(std::get<std::string>(item.value));
  return out;
}

std::vector<int64_t> ints(const GgufValue* v) {
  std::vector<int64_t> out;
  if (v == nullptr) return out;
  for (const GgufValue& item : std::get<GgufArray>(v->value).items) {
    if (const auto* i = std::get_if<int64_t>(&item.value)) out.push_back(*i);
    else out.push_back(static_cast<int64_t>(std::get<uint64_t>(item.value)));
  }
  return out;
}

std::vector<double> floats(const GgufValue* v) {
  std::vector<double> out;
  for (const GgufValue& item : std::get<GgufArray>(v->value).items) out.push_back(std::get<double>(item.value));
  return out;
}

int64_t int_value(const GgufValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v.value)) return *i;
  return static_cast<int64_t>(std::get<uint64_t>(v.value));
}

Json read_json(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

void write_json(const std::string& path, const Json& j) {
  std::ofstream out(path, std::ios::binary);
  out << j.dump();
}

// Hugging Face's SentencePiece merges: for each piece, every split into two pieces of the
// vocabulary (ordered by their ids), all of them ordered by the piece's score, highest first.
Json spm_merges(const std::vector<std::string>& tokens, const std::vector<int64_t>& types,
                const std::vector<double>& scores) {
  std::unordered_map<std::string, int64_t> id;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] != static_cast<int64_t>(TokenType::kUnused)) id.emplace(tokens[i], static_cast<int64_t>(i));
  }
  struct Merge {
    int64_t left, right;
    double score;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] == static_cast<int64_t>(TokenType::kUnused)) continue;
    const std::string& t = tokens[i];
    std::vector<Merge> local;
    uint32_t cp = 0;
    for (size_t pos = 0; pos < t.size();) {
      const size_t n = std::max<size_t>(1, decode_utf8(t, pos, cp));
      pos += n;
      if (pos >= t.size()) break;
      const auto l = id.find(t.substr(0, pos));
      const auto r = id.find(t.substr(pos));
      if (l != id.end() && r != id.end()) local.push_back({l->second, r->second, scores[i]});
    }
    std::sort(local.begin(), local.end(), [](const Merge& a, const Merge& b) {
      return a.left != b.left ? a.left < b.left : a.right < b.right;
    });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) { return a.score > b.score; });
  Json out = Json::array();
  for (const Merge& m : merges) out.push_back(Json::array({tokens[m.left], tokens[m.right]}));
  return out;
}

// Writes tokenizer.json, tokenizer_config.json and config.json for the vocabulary into `dir`.
void write_hf_tokenizer(const Metadata& m, const Json& section, const std::string& dir) {
  const std::string model = std::get<std::string>(find(m, "tokenizer.ggml.model")->value);
  const bool spm = model == "llama";
  const std::vector<std::string> tokens = strings(find(m, "tokenizer.ggml.tokens"));
  std::vector<int64_t> types = ints(find(m, "tokenizer.ggml.token_type"));
  if (types.empty()) types.assign(tokens.size(), static_cast<int64_t>(TokenType::kNormal));
  Json vocab = Json::object();
  Json added = Json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto type = static_cast<TokenType>(types[i]);
    if (type == TokenType::kUnused) continue;
    const bool is_added = type == TokenType::kControl || type == TokenType::kUserDefined || (spm && type == TokenType::kUnknown);
    // SentencePiece vocabularies list every piece in the model, added or not; byte-level ones
    // keep added tokens apart.
    if (spm || !is_added) vocab[tokens[i]] = i;
    if (is_added) {
      added.push_back({{"id", i}, {"content", tokens[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", type == TokenType::kUserDefined}, {"special", type != TokenType::kUserDefined}});
    }
  }
  Json merges = Json::array();
  if (spm) {
    merges = spm_merges(tokens, types, floats(find(m, "tokenizer.ggml.scores")));
  } else {
    for (const std::string& merge : strings(find(m, "tokenizer.ggml.merges"))) merges.push_back(merge);
  }
  Json bpe = {{"type", "BPE"}, {"dropout", nullptr}, {"fuse_unk", spm}, {"byte_fallback", spm}, {"ignore_merges", false},
              {"vocab", vocab}, {"merges", merges}};
  if (spm) bpe["unk_token"] = "<unk>";
  const Json tj = {{"version", "1.0"}, {"added_tokens", added}, {"normalizer", section["normalizer"]},
                   {"pre_tokenizer", section["pre_tokenizer"]}, {"post_processor", nullptr},
                   {"decoder", section["decoder"]}, {"model", bpe}};
  write_json(dir + "/tokenizer.json", tj);
  Json tc = Json::object();
  if (const GgufValue* bos = find(m, "tokenizer.ggml.bos_token_id")) tc["bos_token"] = tokens[int_value(*bos)];
  if (const GgufValue* eos = find(m, "tokenizer.ggml.eos_token_id")) {
    tc["eos_token"] = {{"__type", "AddedToken"}, {"content", tokens[int_value(*eos)]}};
  }
  if (const GgufValue* add = find(m, "tokenizer.ggml.add_bos_token")) tc["add_bos_token"] = std::get<bool>(add->value);
  write_json(dir + "/tokenizer_config.json", tc);
  write_json(dir + "/config.json", {{"vocab_size", tokens.size()}});
}

class HfVocabTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gguf_ = new Metadata(load_vocab_metadata(DUET_VOCAB_NAME));
    const Json sections = read_json(std::string(DUET_SOURCE_DIR) + "/tests/tokenizer/hf_pre_tokenizers.json");
    TempDir dir;
    write_hf_tokenizer(*gguf_, sections.at(DUET_HF_PRE), dir.path(""));
    hf_ = new Metadata(hf_tokenizer_metadata(dir.path("")));
    tokenizer_ = tokenizer_from_metadata(*hf_).release();
    cases_ = new std::vector<VocabCase>(read_vocab_cases(DUET_VOCAB_NAME));
  }
  static void TearDownTestSuite() {
    delete gguf_;
    delete hf_;
    delete tokenizer_;
    delete cases_;
  }

  static Metadata* gguf_;
  static Metadata* hf_;
  static Tokenizer* tokenizer_;
  static std::vector<VocabCase>* cases_;
};

Metadata* HfVocabTest::gguf_ = nullptr;
Metadata* HfVocabTest::hf_ = nullptr;
Tokenizer* HfVocabTest::tokenizer_ = nullptr;
std::vector<VocabCase>* HfVocabTest::cases_ = nullptr;

TEST_F(HfVocabTest, TheVocabularyComesBackAsTheFileHasIt) {
  const std::vector<std::string> a = strings(find(*gguf_, "tokenizer.ggml.tokens"));
  const std::vector<std::string> b = strings(find(*hf_, "tokenizer.ggml.tokens"));
  const std::vector<int64_t> ta = ints(find(*gguf_, "tokenizer.ggml.token_type"));
  const std::vector<int64_t> tb = ints(find(*hf_, "tokenizer.ggml.token_type"));
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(tb.size(), b.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool unused = !ta.empty() && ta[i] == static_cast<int64_t>(TokenType::kUnused);
    if (unused) {  // the folder has a hole there: "[PAD<id>]", unused
      EXPECT_EQ(tb[i], static_cast<int64_t>(TokenType::kUnused)) << i;
      continue;
    }
    if (a[i] != b[i] || (!ta.empty() && ta[i] != tb[i])) ++differ;
  }
  EXPECT_EQ(differ, 0u);
  EXPECT_EQ(std::get<std::string>(find(*hf_, "tokenizer.ggml.model")->value),
            std::get<std::string>(find(*gguf_, "tokenizer.ggml.model")->value));
  if (const GgufValue* pre = find(*hf_, "tokenizer.ggml.pre")) {
    std::cout << DUET_VOCAB_NAME << ": the pre-tokenizer reads as '" << std::get<std::string>(pre->value) << "'\n";
    EXPECT_EQ(std::get<std::string>(pre->value), DUET_HF_PRE);
  }
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
    if (const GgufValue* v = find(*gguf_, key)) {
      ASSERT_NE(find(*hf_, key), nullptr) << key;
      EXPECT_EQ(int_value(*find(*hf_, key)), int_value(*v)) << key;
    }
  }
}

TEST_F(HfVocabTest, EveryCaseGivesTheReferenceIds) {
  ASSERT_FALSE(cases_->empty());
  size_t matched = 0;
  for (size_t i = 0; i < cases_->size(); ++i) {
    const VocabCase& c = (*cases_)[i];
    const std::vector<int32_t> ids = tokenizer_->encode(c.text, false, false);
    if (ids == c.ids) {
      ++matched;
    } else {
      ADD_FAILURE() << DUET_VOCAB_NAME << " case " << i << " " << escaped(c.text) << "\n  expected "
                    << ids_string(c.ids) << "\n  got      " << ids_string(ids);
    }
  }
  std::cout << DUET_VOCAB_NAME << " from tokenizer.json: " << matched << "/" << cases_->size() << " cases match\n";
}

}  // namespace
}  // namespace duet::testing

int main(int argc, char** argv) { return duet::testing::run_vocab_tests(DUET_VOCAB_NAME, argc, argv); }
