#include "duet/tokenizer/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/core/json_excerpt.h"
#include "duet/tokenizer/pretokenizer.h"
#include "duet/tokenizer/spm_tokenizer.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The regex of Hugging Face's ByteLevel pre-tokenizer with use_regex (GPT-2's).
constexpr std::string_view kByteLevelRegex =
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // "▁"

std::string type_of(const Json& j) {
  const auto it = j.is_object() ? j.find("type") : j.end();
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool bool_field(const Json& j, const char* key, bool fallback, const std::string& path, std::string_view where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    fail(ErrorCode::kInvalidArgument, "'{}': {}.{} is {}, expected true or false", path, where, key, json_excerpt(*it));
  }
  return it->get<bool>();
}

// Sequences inside sequences, at most (each level a recursion: 100,000 ended the process).
constexpr int kMaxSequenceDepth = 16;

// The regexes of a byte-level pre-tokenizer, one per Split/Digits/ByteLevel step, in order.
void collect_patterns(const Json& pt, const std::string& path, std::vector<std::string>& patterns, bool& byte_level,
                      int depth = 0) {
  const std::string type = type_of(pt);
  if (type == "Sequence") {
    if (depth >= kMaxSequenceDepth) {
      fail(ErrorCode::kInvalidArgument, "'{}': pre-tokenizer Sequences nested more than {} deep", path,
           kMaxSequenceDepth);
    }
    const auto it = pt.find("pretokenizers");
    if (it == pt.end() || !it->is_array()) {
      fail(ErrorCode::kInvalidArgument, "'{}': a Sequence pre-tokenizer without a 'pretokenizers' list", path);
    }
    for (const Json& step : *it) collect_patterns(step, path, patterns, byte_level, depth + 1);
  } else if (type == "Split") {
    const auto pattern = pt.find("pattern");
    const std::string behavior = pt.value("behavior", "");
    if (pattern == pt.end() || !pattern->is_object() || !pattern->contains("Regex") || !(*pattern)["Regex"].is_string()) {
      fail(ErrorCode::kUnsupported, "'{}': a Split pre-tokenizer step with pattern {} (only {{\"Regex\": ...}} is "
           "implemented)", path, pattern == pt.end() ? "(none)" : json_excerpt(*pattern));
    }
    if (behavior != "Isolated" || bool_field(pt, "invert", false, path, "Split")) {
      fail(ErrorCode::kUnsupported, "'{}': a Split pre-tokenizer step with behavior '{}'{} is not implemented (only "
           "Isolated, not inverted)", path, behavior, bool_field(pt, "invert", false, path, "Split") ? ", inverted" : "");
    }
    patterns.push_back((*pattern)["Regex"].get<std::string>());
  } else if (type == "Digits") {
    patterns.emplace_back(bool_field(pt, "individual_digits", false, path, "Digits") ? R"(\p{N})" : R"(\p{N}+)");
  } else if (type == "ByteLevel") {
    if (bool_field(pt, "add_prefix_space", false, path, "ByteLevel")) {
      fail(ErrorCode::kUnsupported, "'{}': a ByteLevel pre-tokenizer with add_prefix_space is not implemented", path);
    }
    if (bool_field(pt, "use_regex", true, path, "ByteLevel")) patterns.emplace_back(kByteLevelRegex);
    byte_level = true;
  } else {
    fail(ErrorCode::kUnsupported, "'{}': pre-tokenizer step '{}' is not implemented for byte-level BPE (supported: "
         "Sequence, Split, Digits, ByteLevel)", path, type.empty() ? json_excerpt(pt) : type);
  }
}

// tokenizer.ggml.pre for a byte-level BPE tokenizer.json.
std::string byte_level_pre(const Json& tj, const std::string& path) {
  const auto pt = tj.find("pre_tokenizer");
  if (pt == tj.end() || pt->is_null()) {
    fail(ErrorCode::kUnsupported, "'{}': a BPE model without byte_fallback needs a ByteLevel pre-tokenizer, and this "
         "file has none", path);
  }
  std::vector<std::string> patterns;
  bool byte_level = false;
  collect_patterns(*pt, path, patterns, byte_level);
  if (!byte_level) {
    fail(ErrorCode::kUnsupported, "'{}': the pre-tokenizer has no ByteLevel step, so this is not byte-level BPE", path);
  }
  const std::string name = PreTokenizer::name_for_patterns(patterns);
  if (name.empty()) {
    std::vector<std::string> shown;
    for (const std::string& p : patterns) shown.push_back(fmt::format("'{}'", PreTokenizer::canonical_pattern(p)));
    fail(ErrorCode::kUnsupported, "'{}': the pre-tokenizer's regexes [{}] are none that duet implements (the "
         "DeepSeek-LLM, DeepSeek-Coder, DeepSeek-V3, Qwen2, Llama 3 and GPT-2 ones)", path, fmt::join(shown, ", "));
  }
  const auto norm = tj.find("normalizer");
  if (norm != tj.end() && !norm->is_null()) {
    const std::string type = type_of(*norm);
    const bool empty_sequence = type == "Sequence" && norm->contains("normalizers") && (*norm)["normalizers"].is_array() &&
                                (*norm)["normalizers"].empty();
    if (!empty_sequence && type != "NFC") {
      fail(ErrorCode::kUnsupported, "'{}': normalizer {} is not implemented for byte-level BPE (none or NFC)", path,
           json_excerpt(*norm));
    }
  }
  return name;
}

// Whether a SentencePiece-style tokenizer.json prepends "▁" to the text (checks that spaces
// become "▁", which duet's SentencePiece tokenizer always does).
bool spm_space_prefix(const Json& tj, const std::string& path) {
  bool prefix = false;
  bool spaces = false;
  const auto norm = tj.find("normalizer");
  if (norm != tj.end() && !norm->is_null()) {
    std::vector<Json> steps;
    if (type_of(*norm) == "Sequence" && norm->contains("normalizers") && (*norm)["normalizers"].is_array()) {
      for (const Json& s : (*norm)["normalizers"]) steps.push_back(s);
    } else {
      steps.push_back(*norm);
    }
    for (const Json& s : steps) {
      const std::string type = type_of(s);
      if (type == "Prepend" && s.value("prepend", "") == kSpmSpace) {
        prefix = true;
      } else if (type == "Replace" && s.contains("pattern") && s["pattern"].is_object() &&
                 s["pattern"].value("String", "") == " " && s.value("content", "") == kSpmSpace) {
        spaces = true;
      } else {
        fail(ErrorCode::kUnsupported, "'{}': normalizer step {} is not implemented for SentencePiece-style BPE", path,
             json_excerpt(s));
      }
    }
  }
  const auto pt = tj.find("pre_tokenizer");
  if (pt != tj.end() && !pt->is_null()) {
    if (type_of(*pt) != "Metaspace" || pt->value("replacement", std::string(kSpmSpace)) != kSpmSpace) {
      fail(ErrorCode::kUnsupported, "'{}': pre-tokenizer {} is not implemented for SentencePiece-style BPE (none, or "
           "Metaspace with \"▁\")", path, json_excerpt(*pt));
    }
    if (bool_field(*pt, "split", false, path, "Metaspace")) {
      fail(ErrorCode::kUnsupported, "'{}': a Metaspace pre-tokenizer with split is not implemented", path);
    }
    const std::string scheme = pt->value("prepend_scheme", "");
    prefix = scheme.empty() ? bool_field(*pt, "add_prefix_space", true, path, "Metaspace") : scheme != "never";
    spaces = true;
  }
  if (!spaces) {
    fail(ErrorCode::kUnsupported, "'{}': a BPE model with byte_fallback whose spaces do not become \"▁\" (no Replace "
         "normalizer or Metaspace pre-tokenizer) is not implemented", path);
  }
  return prefix;
}

// The text of a token setting: "<s>", {"content": "<s>", ...}, or nullopt for null/absent.
std::optional<std::string> token_content(const Json& config, const char* key, const std::string& path) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, expected a string or an object with \"content\"", path, key,
       json_excerpt(*it));
}

// Whether the post-processor adds a special token before (add_bos) / after (add_eos) the text;
// nullopt when it has no TemplateProcessing.
struct Added {
  std::optional<bool> bos, eos;
  std::string bos_text, eos_text;
};
void post_processor_tokens(const Json& pp, Added& out, const std::string& path, int depth = 0) {
  const std::string type = type_of(pp);
  if (type == "Sequence" && pp.contains("processors") && pp["processors"].is_array()) {
    if (depth >= kMaxSequenceDepth) {
      fail(ErrorCode::kInvalidArgument, "'{}': post-processor Sequences nested more than {} deep", path,
           kMaxSequenceDepth);
    }
    for (const Json& p : pp["processors"]) post_processor_tokens(p, out, path, depth + 1);
    return;
  }
  if (type != "TemplateProcessing" || !pp.contains("single") || !pp["single"].is_array()) return;
  const Json& single = pp["single"];
  auto special_id = [](const Json& piece) -> std::optional<std::string> {
    if (!piece.is_object() || !piece.contains("SpecialToken")) return std::nullopt;
    const Json& st = piece["SpecialToken"];
    if (!st.is_object() || !st.contains("id") || !st["id"].is_string()) return std::nullopt;
    return st["id"].get<std::string>();
  };
  const std::optional<std::string> first = single.empty() ? std::nullopt : special_id(single.front());
  const std::optional<std::string> last = single.size() < 2 ? std::nullopt : special_id(single.back());
  out.bos = first.has_value();
  out.eos = last.has_value();
  if (first) out.bos_text = *first;
  if (last) out.eos_text = *last;
}

std::string read_text_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(ErrorCode::kUnavailable, "cannot read '{}'", p.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

GgufMetadata hf_tokenizer_metadata(const std::string& dir_arg) {
  const fs::path dir(dir_arg);
  const fs::path tj_path = dir / "tokenizer.json";
  std::error_code ec;
  if (!fs::exists(tj_path, ec)) return {};
  const std::string path = tj_path.string();
  const Json tj = read_json_file(path);
  const auto model_it = tj.is_object() ? tj.find("model") : tj.end();
  if (model_it == tj.end() || !model_it->is_object()) {
    fail(ErrorCode::kInvalidArgument, "'{}': 'model' is missing or not an object", path);
  }
  const Json& model = *model_it;
  const std::string model_type = type_of(model);
  if (model_type != "BPE") {
    fail(ErrorCode::kUnsupported, "'{}': tokenizer model '{}' is not implemented (only BPE: byte-level, or "
         "SentencePiece-style with byte_fallback)", path, model_type.empty() ? "(no type)" : model_type);
  }
  const bool spm = bool_field(model, "byte_fallback", false, path, "model");

  Json config = Json::object();
  if (fs::exists(dir / "config.json", ec)) config = read_json_file((dir / "config.json").string());
  Json tconfig = Json::object();
  const std::string tc_path = (dir / "tokenizer_config.json").string();
  if (fs::exists(tc_path, ec)) tconfig = read_json_file(tc_path);
  if (!config.is_object() || !tconfig.is_object()) {
    fail(ErrorCode::kInvalidArgument, "'{}': config.json and tokenizer_config.json must be JSON objects", dir_arg);
  }

  // Vocabulary: the model's, the added tokens, and unused padding up to config.json's vocab_size.
  const auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) {
    fail(ErrorCode::kInvalidArgument, "'{}': model.vocab is missing or not an object of token -> id", path);
  }
  constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max() - 1;
  std::vector<std::optional<std::string>> slots;
  auto place = [&](const std::string& text, const Json& id_json, std::string_view where) -> int64_t {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 || id_json.get<int64_t>() > kMaxId) {
      fail(ErrorCode::kInvalidArgument, "'{}': {} token '{}' has id {}, expected an integer in [0, {}]", path, where,
           text, json_excerpt(id_json), kMaxId);
    }
    const int64_t id = id_json.get<int64_t>();
    if (id >= static_cast<int64_t>(slots.size())) {
      if (id > static_cast<int64_t>(vocab_it->size()) + 1'000'000) {
        fail(ErrorCode::kInvalidArgument, "'{}': {} token '{}' has id {}, far beyond the {} tokens of the vocabulary",
             path, where, text, id, vocab_it->size());
      }
      slots.resize(static_cast<size_t>(id) + 1);
    }
    std::optional<std::string>& slot = slots[static_cast<size_t>(id)];
    if (slot && *slot != text) {
      fail(ErrorCode::kInvalidArgument, "'{}': id {} is given to both '{}' and '{}'", path, id, *slot, text);
    }
    slot = text;
    return id;
  };
  for (const auto& [text, id] : vocab_it->items()) place(text, id, "vocabulary");
  std::unordered_map<int64_t, bool> added;  // id -> special
  if (const auto at = tj.find("added_tokens"); at != tj.end() && !at->is_null()) {
    if (!at->is_array()) fail(ErrorCode::kInvalidArgument, "'{}': added_tokens is not a list", path);
    for (const Json& t : *at) {
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string() || !t.contains("id")) {
        fail(ErrorCode::kInvalidArgument, "'{}': added token {} needs \"id\" and \"content\"", path, json_excerpt(t));
      }
      const int64_t id = place(t["content"].get<std::string>(), t["id"], "added");
      added[id] = bool_field(t, "special", false, path, "added_tokens[]");
    }
  }
  if (const auto vs = config.find("vocab_size"); vs != config.end() && vs->is_number_integer()) {
    const int64_t n = vs->get<int64_t>();
    if (n > static_cast<int64_t>(slots.size()) && n <= kMaxId) slots.resize(static_cast<size_t>(n));
  }
  if (slots.empty()) fail(ErrorCode::kInvalidArgument, "'{}': the vocabulary is empty", path);

  std::string unk_text;
  if (const auto unk = model.find("unk_token"); unk != model.end() && unk->is_string()) unk_text = unk->get<std::string>();
  std::vector<std::string> tokens(slots.size());
  std::vector<int32_t> types(slots.size(), static_cast<int32_t>(TokenType::kNormal));
  std::unordered_map<std::string, int32_t> index;
  for (size_t id = 0; id < slots.size(); ++id) {
    if (!slots[id]) {
      tokens[id] = fmt::format("[PAD{}]", id);
      types[id] = static_cast<int32_t>(TokenType::kUnused);
      continue;
    }
    tokens[id] = *slots[id];
    if (auto a = added.find(static_cast<int64_t>(id)); a != added.end()) {
      types[id] = static_cast<int32_t>(a->second ? TokenType::kControl : TokenType::kUserDefined);
    } else if (spm && parse_byte_token(tokens[id]) >= 0) {
      types[id] = static_cast<int32_t>(TokenType::kByte);
    }
    if (spm && !unk_text.empty() && tokens[id] == unk_text) types[id] = static_cast<int32_t>(TokenType::kUnknown);
    index.emplace(tokens[id], static_cast<int32_t>(id));
  }

  // Merges as "left right", and their ranks.
  std::vector<std::string> merges;
  if (const auto m = model.find("merges"); m != model.end() && !m->is_null()) {
    if (!m->is_array()) fail(ErrorCode::kInvalidArgument, "'{}': model.merges is not a list", path);
    merges.reserve(m->size());
    for (const Json& merge : *m) {
      if (merge.is_string()) {
        merges.push_back(merge.get<std::string>());
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
        merges.push_back(merge[0].get<std::string>() + " " + merge[1].get<std::string>());
      } else {
        fail(ErrorCode::kInvalidArgument, "'{}': merge {} is neither \"a b\" nor [\"a\", \"b\"]", path, json_excerpt(merge));
      }
    }
  }

  GgufMetadata out;
  out.emplace_back("tokenizer.ggml.model", GgufValue::str(spm ? "llama" : "gpt2"));
  if (spm) {
    const bool prefix = spm_space_prefix(tj, path);
    // A token made by merge r scores -(r + 1): the SentencePiece merger then applies merges in
    // rank order, as Hugging Face's BPE does.
    std::vector<float> scores(tokens.size(), 0.0f);
    std::vector<bool> scored(tokens.size(), false);
    for (size_t r = 0; r < merges.size(); ++r) {
      const std::string& merge = merges[r];
      const size_t space = merge.find(' ');
      if (space == std::string::npos) {
        fail(ErrorCode::kInvalidArgument, "'{}': merge '{}' has no space between its two tokens", path, merge);
      }
      const auto it = index.find(merge.substr(0, space) + merge.substr(space + 1));
      if (it == index.end() || scored[static_cast<size_t>(it->second)]) continue;
      scored[static_cast<size_t>(it->second)] = true;
      scores[static_cast<size_t>(it->second)] = -static_cast<float>(r + 1);
    }
    out.emplace_back("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
    out.emplace_back("tokenizer.ggml.scores", GgufValue::f32_array(scores));
    out.emplace_back("tokenizer.ggml.token_type", GgufValue::i32_array(types));
    out.emplace_back("tokenizer.ggml.add_space_prefix", GgufValue::boolean(prefix));
  } else {
    out.emplace_back("tokenizer.ggml.pre", GgufValue::str(byte_level_pre(tj, path)));
    out.emplace_back("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
    out.emplace_back("tokenizer.ggml.token_type", GgufValue::i32_array(types));
    out.emplace_back("tokenizer.ggml.merges", GgufValue::string_array(merges));
  }

  // Special tokens: tokenizer_config.json, then the post-processor, then config.json's ids.
  Added post;
  if (const auto pp = tj.find("post_processor"); pp != tj.end() && !pp->is_null()) post_processor_tokens(*pp, post, path);
  auto id_of = [&](const std::string& text, const char* what, const std::string& where) {
    const auto it = index.find(text);
    if (it == index.end()) {
      fail(ErrorCode::kInvalidArgument, "'{}': {} '{}' is not in the vocabulary of '{}'", where, what, text, path);
    }
    return it->second;
  };
  auto config_id = [&](const char* key) -> std::optional<int32_t> {
    const auto it = config.find(key);
    if (it == config.end() || !it->is_number_integer()) return std::nullopt;
    const int64_t id = it->get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(tokens.size())) {
      fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, outside the vocabulary of {} tokens",
           (dir / "config.json").string(), key, id, tokens.size());
    }
    return static_cast<int32_t>(id);
  };
  // BOS and EOS must be in the vocabulary; an unknown or padding token that is not is left out
  // (duet needs neither).
  auto special = [&](const char* key, const std::string& from_post, const char* config_key, const char* gguf_key) {
    const bool required = config_key != nullptr;
    std::optional<int32_t> id;
    if (const std::optional<std::string> text = token_content(tconfig, key, tc_path)) {
      if (required || index.count(*text) != 0) id = id_of(*text, key, tc_path);
    } else if (!from_post.empty()) {
      id = id_of(from_post, key, path + " (post_processor)");
    } else if (config_key != nullptr) {
      id = config_id(config_key);
    }
    if (id) out.emplace_back(gguf_key, GgufValue::u32(static_cast<uint32_t>(*id)));
  };
  special("bos_token", post.bos_text, "bos_token_id", "tokenizer.ggml.bos_token_id");
  special("eos_token", post.eos_text, "eos_token_id", "tokenizer.ggml.eos_token_id");
  special("unk_token", spm && index.count(unk_text) != 0 ? unk_text : std::string(), nullptr,
          "tokenizer.ggml.unknown_token_id");
  special("pad_token", std::string(), nullptr, "tokenizer.ggml.padding_token_id");
  const auto add_bos = tconfig.find("add_bos_token");
  if (add_bos != tconfig.end() && !add_bos->is_null()) {
    out.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::boolean(bool_field(tconfig, "add_bos_token", false, tc_path, "tokenizer_config")));
  } else if (post.bos) {
    out.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::boolean(*post.bos));
  }
  const auto add_eos = tconfig.find("add_eos_token");
  if (add_eos != tconfig.end() && !add_eos->is_null()) {
    out.emplace_back("tokenizer.ggml.add_eos_token", GgufValue::boolean(bool_field(tconfig, "add_eos_token", false, tc_path, "tokenizer_config")));
  } else if (post.eos) {
    out.emplace_back("tokenizer.ggml.add_eos_token", GgufValue::boolean(*post.eos));
  }

  // Chat templates: chat_template.jinja, else tokenizer_config.json's (one, or a list of named
  // ones: "default" is the template, the others tokenizer.chat_template.<name>).
  const fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja, ec)) {
    out.emplace_back("tokenizer.chat_template", GgufValue::str(read_text_file(jinja)));
  } else if (const auto ct = tconfig.find("chat_template"); ct != tconfig.end() && !ct->is_null()) {
    if (ct->is_string()) {
      out.emplace_back("tokenizer.chat_template", GgufValue::str(ct->get<std::string>()));
    } else if (ct->is_array()) {
      for (const Json& named : *ct) {
        if (!named.is_object() || !named.contains("name") || !named["name"].is_string() || !named.contains("template") ||
            !named["template"].is_string()) {
          fail(ErrorCode::kInvalidArgument, "'{}': chat_template entry {} needs \"name\" and \"template\" strings",
               tc_path, json_excerpt(named));
        }
        const std::string name = named["name"].get<std::string>();
        out.emplace_back(name == "default" ? "tokenizer.chat_template" : "tokenizer.chat_template." + name,
                         GgufValue::str(named["template"].get<std::string>()));
      }
    } else {
      fail(ErrorCode::kInvalidArgument, "'{}': chat_template is {}, expected a string or a list of named templates",
           tc_path, ct->type_name());
    }
  }
  return out;
}

}  // namespace duet
