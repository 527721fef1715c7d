// tokenizer.json / tokenizer_config.json translation (hf_tokenizer.h) on small hand-written files,
// and the pre-tokenizer matching it relies on: every published pre-tokenizer section of
// hf_pre_tokenizers.json reads as its duet name, other spellings of the same regexes too, and
// anything else is refused with the patterns shown. No shared test data needed.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/tokenizer/hf_tokenizer.h"
#include "duet/tokenizer/pretokenizer.h"
#include "duet/tokenizer/tokenizer.h"
#include "vocab_fixture.h"

namespace duet::testing {
namespace {

using Json = nlohmann::json;

Json sections() {
  std::ifstream in(std::string(DUET_SOURCE_DIR) + "/tests/tokenizer/hf_pre_tokenizers.json");
  return Json::parse(in);
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

const GgufValue* find(const GgufMetadata& m, std::string_view key) {
  for (const auto& [k, v] : m) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string str(const GgufMetadata& m, std::string_view key) {
  const GgufValue* v = find(m, key);
  return v == nullptr ? "(absent)" : std::get<std::string>(v->value);
}

int64_t num(const GgufMetadata& m, std::string_view key) {
  const GgufValue* v = find(m, key);
  if (v == nullptr) return -100;
  if (const auto* u = std::get_if<uint64_t>(&v->value)) return static_cast<int64_t>(*u);
  if (const auto* b = std::get_if<bool>(&v->value)) return *b ? 1 : 0;
  return std::get<int64_t>(v->value);
}

// A byte-level BPE tokenizer.json over a tiny vocabulary: the 256 byte characters, "Ġh" + a
// few merges, and two added tokens.
Json small_byte_level(const Json& pre_tokenizer) {
  Json vocab = Json::object();
  int id = 0;
  // GPT-2's byte-to-character table, enough of it for the ids to be distinct.
  for (int b = 0; b < 256; ++b) {
    const int cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174) ? b : 256 + id;
    std::string s;
    if (cp < 0x80) s.push_back(static_cast<char>(cp));
    else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab[s] = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174))) ++id;
  }
  vocab["Ġh"] = 256;
  vocab["Ġhi"] = 257;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array({"Ġ h", Json::array({"Ġh", "i"})})}}},
          {"added_tokens", Json::array({{{"id", 258}, {"content", "<|bos|>"}, {"special", true}},
                                        {{"id", 260}, {"content", "<tool>"}, {"special", false}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer}};
}

class HfTokenizerTest : public ::testing::Test {
 protected:
  std::string dir() const { return dir_.path(""); }
  void put(const std::string& file, const Json& j) { write(dir_.path(file), j.dump()); }
  GgufMetadata read() const { return hf_tokenizer_metadata(dir()); }
  // The error hf_tokenizer_metadata throws, or "" when it does not.
  std::string error(ErrorCode* code = nullptr) const {
    try {
      hf_tokenizer_metadata(dir());
    } catch (const Error& e) {
      if (code) *code = e.code();
      return e.what();
    }
    return "";
  }

  TempDir dir_;
};

TEST(PreTokenizerNames, EveryPublishedSectionReadsAsItsName) {
  const Json all = sections();
  for (const auto& [name, section] : all.items()) {
    if (name.starts_with("_") || name == "llama-spm") continue;
    TempDir dir;
    write(dir.path("tokenizer.json"), small_byte_level(section["pre_tokenizer"]).dump());
    const GgufMetadata m = hf_tokenizer_metadata(dir.path(""));
    EXPECT_EQ(str(m, "tokenizer.ggml.pre"), name);
  }
}

TEST(PreTokenizerNames, CanonicalSpellings) {
  EXPECT_EQ(PreTokenizer::canonical_pattern("[\r\n]"), R"([\x{D}\x{A}])");
  EXPECT_EQ(PreTokenizer::canonical_pattern(R"([\r\n])"), R"([\x{D}\x{A}])");
  EXPECT_EQ(PreTokenizer::canonical_pattern(R"([\u3040-\x{309f}\xFF])"), R"([\x{3040}-\x{309F}\x{FF}])");
  EXPECT_EQ(PreTokenizer::canonical_pattern("[一-龥]"), R"([\x{4E00}-\x{9FA5}])");
  EXPECT_EQ(PreTokenizer::canonical_pattern(R"(\s?\p{L}+\\r)"), R"(\s?\p{L}+\\r)");  // an escaped backslash stays
  EXPECT_EQ(PreTokenizer::name_for_patterns({R"(\p{N}{1,3})"}), "");
}

TEST_F(HfTokenizerTest, ByteLevelVocabularyAddedTokensAndPadding) {
  const Json all = sections();
  put("tokenizer.json", small_byte_level(all["deepseek-v3"]["pre_tokenizer"]));
  put("config.json", {{"vocab_size", 264}, {"bos_token_id", 258}, {"eos_token_id", 260}});
  const GgufMetadata m = read();
  EXPECT_EQ(str(m, "tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(str(m, "tokenizer.ggml.pre"), "deepseek-v3");
  EXPECT_EQ(num(m, "tokenizer.ggml.bos_token_id"), 258);  // from config.json
  EXPECT_EQ(num(m, "tokenizer.ggml.eos_token_id"), 260);
  EXPECT_EQ(find(m, "tokenizer.ggml.add_bos_token"), nullptr);
  const std::unique_ptr<Tokenizer> tok = tokenizer_from_metadata(m);
  ASSERT_EQ(tok->vocab_size(), 264);
  EXPECT_EQ(tok->token_type(258), TokenType::kControl);
  EXPECT_EQ(tok->token_type(260), TokenType::kUserDefined);
  EXPECT_EQ(tok->token_type(259), TokenType::kUnused);  // a hole between added tokens
  EXPECT_EQ(tok->token_text(263), "[PAD263]");
  EXPECT_EQ(tok->token_type(263), TokenType::kUnused);
  // Merges as a string and as a pair both apply: " hi" is one token.
  EXPECT_EQ(tok->encode(" hi", false, false), (std::vector<int32_t>{257}));
  EXPECT_EQ(tok->encode("<|bos|> hi<tool>", false, true), (std::vector<int32_t>{258, 257, 260}));
}

TEST_F(HfTokenizerTest, TokenizerConfigSetsSpecialTokensAndTemplates) {
  const Json all = sections();
  put("tokenizer.json", small_byte_level(all["qwen2"]["pre_tokenizer"]));
  put("tokenizer_config.json", {{"bos_token", {{"__type", "AddedToken"}, {"content", "<|bos|>"}}},
                                {"eos_token", "<tool>"},
                                {"pad_token", nullptr},
                                {"add_bos_token", true},
                                {"chat_template", Json::array({{{"name", "default"}, {"template", "{{ x }}"}},
                                                               {{"name", "tool_use"}, {"template", "{{ y }}"}}})}});
  GgufMetadata m = read();
  EXPECT_EQ(str(m, "tokenizer.ggml.pre"), "qwen2");
  EXPECT_EQ(num(m, "tokenizer.ggml.bos_token_id"), 258);
  EXPECT_EQ(num(m, "tokenizer.ggml.eos_token_id"), 260);
  EXPECT_EQ(find(m, "tokenizer.ggml.padding_token_id"), nullptr);
  EXPECT_EQ(num(m, "tokenizer.ggml.add_bos_token"), 1);
  EXPECT_EQ(str(m, "tokenizer.chat_template"), "{{ x }}");
  EXPECT_EQ(str(m, "tokenizer.chat_template.tool_use"), "{{ y }}");
  // chat_template.jinja beside it wins.
  write(dir_.path("chat_template.jinja"), "{{ z }}");
  m = read();
  EXPECT_EQ(str(m, "tokenizer.chat_template"), "{{ z }}");
  // A token that is not in the vocabulary is an error that names it.
  put("tokenizer_config.json", {{"bos_token", "<s>"}});
  EXPECT_NE(error().find("bos_token '<s>' is not in the vocabulary"), std::string::npos) << error();
}

TEST_F(HfTokenizerTest, PostProcessorAddsBos) {
  const Json all = sections();
  Json tj = small_byte_level(all["llama3"]["pre_tokenizer"]);
  tj["post_processor"] = {{"type", "Sequence"},
                          {"processors", Json::array({{{"type", "ByteLevel"}},
                                                      {{"type", "TemplateProcessing"},
                                                       {"single", Json::array({{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                                                                               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}}})}};
  put("tokenizer.json", tj);
  const GgufMetadata m = read();
  EXPECT_EQ(str(m, "tokenizer.ggml.pre"), "llama3");
  EXPECT_EQ(num(m, "tokenizer.ggml.bos_token_id"), 258);
  EXPECT_EQ(num(m, "tokenizer.ggml.add_bos_token"), 1);
  EXPECT_EQ(num(m, "tokenizer.ggml.add_eos_token"), 0);
}

TEST_F(HfTokenizerTest, OtherSpellingsOfTheSameSteps) {
  const Json all = sections();
  // DeepSeek-LLM's digits as a Digits step, and Qwen2's regex with the characters themselves.
  Json llm = all["deepseek-llm"]["pre_tokenizer"];
  llm["pretokenizers"][5] = {{"type", "Digits"}, {"individual_digits", false}};
  put("tokenizer.json", small_byte_level(llm));
  EXPECT_EQ(str(read(), "tokenizer.ggml.pre"), "deepseek-llm");
  Json qwen = all["qwen2"]["pre_tokenizer"];
  const std::string escaped_rx = qwen["pretokenizers"][0]["pattern"]["Regex"];
  std::string rx;
  for (size_t i = 0; i < escaped_rx.size(); ++i) {
    const bool escape = escaped_rx[i] == '\\' && i + 1 < escaped_rx.size();
    if (escape && escaped_rx[i + 1] == 'r') {
      rx += '\r';
      ++i;
    } else if (escape && escaped_rx[i + 1] == 'n') {
      rx += '\n';
      ++i;
    } else {
      rx += escaped_rx[i];
    }
  }
  ASSERT_EQ(rx.find("\\r"), std::string::npos);
  qwen["pretokenizers"][0]["pattern"]["Regex"] = rx;
  put("tokenizer.json", small_byte_level(qwen));
  EXPECT_EQ(str(read(), "tokenizer.ggml.pre"), "qwen2");
}

TEST_F(HfTokenizerTest, UnknownPreTokenizersAreRefusedWithThePatterns) {
  const Json all = sections();
  Json pt = all["deepseek-v3"]["pre_tokenizer"];
  pt["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}{1,4}";
  put("tokenizer.json", small_byte_level(pt));
  ErrorCode code{};
  std::string e = error(&code);
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(e.find(R"('\p{N}{1,4}')"), std::string::npos) << e;
  EXPECT_NE(e.find("tokenizer.json"), std::string::npos) << e;

  put("tokenizer.json", small_byte_level({{"type", "Whitespace"}}));
  e = error(&code);
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(e.find("'Whitespace'"), std::string::npos) << e;

  pt = all["qwen2"]["pre_tokenizer"];
  pt["pretokenizers"][0]["behavior"] = "MergedWithPrevious";
  put("tokenizer.json", small_byte_level(pt));
  EXPECT_NE(error().find("MergedWithPrevious"), std::string::npos);

  // Not byte-level: no ByteLevel step.
  pt = all["qwen2"]["pre_tokenizer"];
  pt["pretokenizers"].erase(1);
  put("tokenizer.json", small_byte_level(pt));
  EXPECT_NE(error().find("no ByteLevel step"), std::string::npos) << error();

  // A normalizer duet does not apply.
  Json tj = small_byte_level(all["gpt2"]["pre_tokenizer"]);
  tj["normalizer"] = {{"type", "Lowercase"}};
  put("tokenizer.json", tj);
  EXPECT_NE(error().find("Lowercase"), std::string::npos) << error();
}

TEST_F(HfTokenizerTest, SentencePieceStyle) {
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"▁", 3}, {"a", 4}, {"b", 5}, {"▁a", 6}, {"ab", 7}, {"▁ab", 8}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 9 + b;
  Json tj = {{"model", {{"type", "BPE"}, {"byte_fallback", true}, {"unk_token", "<unk>"}, {"vocab", vocab},
                        {"merges", Json::array({"a b", "▁ ab", "▁ a"})}}},
             {"added_tokens", Json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                           {{"id", 1}, {"content", "<s>"}, {"special", true}},
                                           {{"id", 2}, {"content", "</s>"}, {"special", true}}})},
             {"normalizer", sections()["llama-spm"]["normalizer"]},
             {"pre_tokenizer", nullptr}};
  put("tokenizer.json", tj);
  put("tokenizer_config.json", {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}});
  GgufMetadata m = read();
  EXPECT_EQ(str(m, "tokenizer.ggml.model"), "llama");
  EXPECT_EQ(num(m, "tokenizer.ggml.add_space_prefix"), 1);
  EXPECT_EQ(num(m, "tokenizer.ggml.unknown_token_id"), 0);
  std::unique_ptr<Tokenizer> tok = tokenizer_from_metadata(m);
  EXPECT_EQ(tok->token_type(0), TokenType::kUnknown);
  EXPECT_EQ(tok->token_type(1), TokenType::kControl);
  EXPECT_EQ(tok->token_type(9), TokenType::kByte);
  // "ab" (rank 0) before "▁ab" (rank 1): " ab" -> ▁ab; "ba" has no merge: b, a; "é" falls back to bytes.
  EXPECT_EQ(tok->encode("ab", false, false), (std::vector<int32_t>{8}));
  EXPECT_EQ(tok->encode("ab ba", false, false), (std::vector<int32_t>{8, 3, 5, 4}));
  EXPECT_EQ(tok->encode("é", false, false), (std::vector<int32_t>{3, 9 + 0xC3, 9 + 0xA9}));

  // Metaspace instead of the normalizer; "never" prepends nothing.
  tj["normalizer"] = nullptr;
  tj["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "never"}, {"split", false}};
  put("tokenizer.json", tj);
  m = read();
  EXPECT_EQ(num(m, "tokenizer.ggml.add_space_prefix"), 0);
  tok = tokenizer_from_metadata(m);
  EXPECT_EQ(tok->encode("ab", false, false), (std::vector<int32_t>{7}));
  // split: true is refused, as is a model whose spaces do not become "▁".
  tj["pre_tokenizer"]["split"] = true;
  put("tokenizer.json", tj);
  EXPECT_NE(error().find("split"), std::string::npos) << error();
  tj["pre_tokenizer"] = nullptr;
  put("tokenizer.json", tj);
  EXPECT_NE(error().find("do not become"), std::string::npos) << error();
}

TEST_F(HfTokenizerTest, BadFilesGiveClearErrors) {
  EXPECT_TRUE(read().empty());  // no tokenizer.json: nothing to add
  write(dir_.path("tokenizer.json"), "{\"model\": {\"type\": \"BPE\", ");
  ErrorCode code{};
  std::string e = error(&code);
  EXPECT_EQ(code, ErrorCode::kDataLoss);
  EXPECT_NE(e.find("tokenizer.json"), std::string::npos) << e;
  EXPECT_NE(e.find("offset"), std::string::npos) << e;

  put("tokenizer.json", {{"model", {{"type", "Unigram"}, {"vocab", Json::array()}}}});
  e = error(&code);
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(e.find("'Unigram'"), std::string::npos) << e;

  Json tj = small_byte_level(sections()["gpt2"]["pre_tokenizer"]);
  tj["added_tokens"].push_back({{"id", 5}, {"content", "<clash>"}, {"special", true}});
  put("tokenizer.json", tj);
  EXPECT_NE(error().find("id 5 is given to both"), std::string::npos) << error();

  tj = small_byte_level(sections()["gpt2"]["pre_tokenizer"]);
  tj["model"]["merges"].push_back(42);
  put("tokenizer.json", tj);
  EXPECT_NE(error().find("merge 42"), std::string::npos) << error();

  tj = small_byte_level(sections()["gpt2"]["pre_tokenizer"]);
  tj["model"]["vocab"]["x"] = -3;
  put("tokenizer.json", tj);
  EXPECT_NE(error().find("has id -3"), std::string::npos) << error();
}

// A model file nested 100,000 deep ended the process: Sequences were read by recursion, and the
// error quoting an unknown step dumped it whole (dump() recurses per level too).
TEST_F(HfTokenizerTest, DeepFilesGiveClearErrors) {
  const int n = 100000;
  const auto deep = [&](const std::string& list) {
    std::string text;
    for (int i = 0; i < n; ++i) text += R"({"type": "Sequence", ")" + list + R"(": [)";
    for (int i = 0; i < n; ++i) text += "]}";
    return text;
  };
  const std::string base = small_byte_level(sections()["gpt2"]["pre_tokenizer"]).dump();
  const auto with = [&](const std::string& key, const std::string& value) {
    Json tj = Json::parse(base);
    tj[key] = "@@";
    std::string text = tj.dump();
    text.replace(text.find("\"@@\""), 4, value);
    write(dir_.path("tokenizer.json"), text);
  };
  with("pre_tokenizer", deep("pretokenizers"));
  EXPECT_NE(error().find("pre-tokenizer Sequences nested more than 16 deep"), std::string::npos) << error();
  with("post_processor", deep("processors"));
  EXPECT_NE(error().find("post-processor Sequences nested more than 16 deep"), std::string::npos) << error();
  with("normalizer", deep("normalizers"));
  const std::string e = error();
  EXPECT_NE(e.find("is not implemented"), std::string::npos) << e.substr(0, 300);
  EXPECT_LT(e.size(), 600u) << "the error quotes the whole normalizer";
}

}  // namespace
}  // namespace duet::testing
