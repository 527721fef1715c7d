#include "duet/tokenizer/hf_tokenizer_writer.h"

#include <filesystem>
#include <fstream>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/tokenizer/chat_template.h"
#include "duet/tokenizer/pretokenizer.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet {
namespace {

using Json = nlohmann::ordered_json;

void write_json(const std::filesystem::path& path, const Json& j) {
  std::ofstream out(path, std::ios::trunc | std::ios::binary);
  out << j.dump(2) << '\n';
  if (!out) fail(ErrorCode::kUnavailable, "cannot write '{}'", path.string());
}

Json added_token(const std::string& content, bool normalized) {
  return {{"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
          {"normalized", normalized}};
}

}  // namespace

std::vector<std::string> write_hf_tokenizer(const GgufFile& g, const std::string& dir) {
  const std::string model = g.get_string("tokenizer.ggml.model");
  if (model != "gpt2") {
    fail(ErrorCode::kUnsupported, "'{}': tokenizer.ggml.model '{}' is not written as tokenizer.json (only byte-level "
         "BPE, gpt2)", g.path(), model);
  }
  const std::string pre = g.get_string_or("tokenizer.ggml.pre", "default");
  const std::vector<std::string> tokens = g.get_string_array("tokenizer.ggml.tokens");
  std::vector<int32_t> types(tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  if (g.has("tokenizer.ggml.token_type")) types = g.get_int_array("tokenizer.ggml.token_type");
  if (types.size() != tokens.size()) {
    fail(ErrorCode::kInvalidArgument, "'{}': {} token types for {} tokens", g.path(), types.size(), tokens.size());
  }

  // The vocabulary in id order. ordered_json looks a key up by a linear search, so entries are
  // appended to its vector directly, with a hash map for the (rare) token that appears twice.
  Json vocab = Json::object();
  auto& entries = static_cast<std::vector<std::pair<const std::string, Json>>&>(vocab.get_ref<Json::object_t&>());
  std::unordered_map<std::string_view, size_t> position;
  position.reserve(tokens.size());
  Json added = Json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    const auto type = static_cast<TokenType>(types[id]);
    // Padding up to the model's rows ("[PAD<id>]", unused) is not in a published tokenizer.json;
    // the reader puts it back from config.json's vocab_size.
    if (type == TokenType::kUnused) continue;
    if (type == TokenType::kControl || type == TokenType::kUserDefined) {
      Json t = {{"id", id}};
      t.update(added_token(tokens[id], type == TokenType::kUserDefined));
      t["special"] = type == TokenType::kControl;
      added.push_back(std::move(t));
    } else if (const auto [it, fresh] = position.emplace(tokens[id], entries.size()); fresh) {
      entries.emplace_back(tokens[id], id);
    } else {
      entries[it->second].second = id;  // as vocab[token] = id would: the last id wins
    }
  }
  Json merges = Json::array();
  for (const std::string& m : g.get_string_array("tokenizer.ggml.merges")) {
    const size_t space = m.find(' ');
    if (space == std::string::npos) fail(ErrorCode::kInvalidArgument, "'{}': merge '{}' has no space", g.path(), m);
    merges.push_back({m.substr(0, space), m.substr(space + 1)});
  }
  Json steps = Json::array();
  for (const std::string& p : PreTokenizer::patterns_for(pre)) {
    steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", p}}}, {"behavior", "Isolated"}, {"invert", false}});
  }
  steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
  const PreTokenizer pre_tokenizer(pre);
  Json tj = Json::object();
  tj["version"] = "1.0";
  tj["truncation"] = nullptr;
  tj["padding"] = nullptr;
  tj["added_tokens"] = std::move(added);
  tj["normalizer"] = nullptr;
  tj["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}};
  tj["post_processor"] = nullptr;
  tj["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  tj["model"] = {{"type", "BPE"},
                 {"dropout", nullptr},
                 {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr},
                 {"fuse_unk", false},
                 {"byte_fallback", false},
                 {"ignore_merges", pre_tokenizer.ignore_merges()},
                 {"vocab", std::move(vocab)},
                 {"merges", std::move(merges)}};

  Json tc = Json::object();
  tc["add_bos_token"] = g.get_bool_or("tokenizer.ggml.add_bos_token", false);
  tc["add_eos_token"] = g.get_bool_or("tokenizer.ggml.add_eos_token", false);
  for (const auto& [key, gkey] : {std::pair<const char*, const char*>{"bos_token", "tokenizer.ggml.bos_token_id"},
                                  {"eos_token", "tokenizer.ggml.eos_token_id"}}) {
    if (!g.has(gkey)) continue;
    const int64_t id = g.get_int(gkey);
    if (id < 0 || id >= static_cast<int64_t>(tokens.size())) {
      fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, outside the {} tokens", g.path(), gkey, id, tokens.size());
    }
    Json t = {{"__type", "AddedToken"}};
    t.update(added_token(tokens[static_cast<size_t>(id)], true));
    tc[key] = std::move(t);
  }
  tc["clean_up_tokenization_spaces"] = false;
  tc["legacy"] = true;
  tc["model_max_length"] = g.get_int_or(g.get_string_or("general.architecture", "") + ".context_length", 16384);
  tc["tokenizer_class"] = "LlamaTokenizerFast";
  tc["chat_template"] = g.has("tokenizer.chat_template")
                            ? g.get_string("tokenizer.chat_template")
                            : std::string(builtin_chat_template_source(builtin_chat_format_for(g)));

  const std::filesystem::path base(dir);
  std::filesystem::create_directories(base);
  write_json(base / "tokenizer.json", tj);
  write_json(base / "tokenizer_config.json", tc);
  return {"tokenizer.json", "tokenizer_config.json"};
}

}  // namespace duet
