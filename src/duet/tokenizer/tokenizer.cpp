// The model-independent half of the tokenizers: the factory, the shared vocabulary metadata,
// special-token handling around the model's own encoder, decoding and the incremental
// detokenizer.
#include "duet/tokenizer/tokenizer.h"

#include <algorithm>
#include <limits>

#include "duet/core/error.h"
#include "duet/tokenizer/bpe_tokenizer.h"
#include "duet/tokenizer/spm_tokenizer.h"
#include "duet/tokenizer/unicode.h"

namespace duet {
namespace {

constexpr int64_t kMaxTokenType = static_cast<int64_t>(TokenType::kByte);

// Reads an optional token id. Absent, -1 and 0xFFFFFFFF (how some converters write "none") give
// `fallback`; anything else must be a valid id.
int32_t read_token_id(const GgufFile& file, std::string_view key, size_t num_tokens, int32_t fallback) {
  if (!file.has(key)) return fallback;
  const int64_t v = file.get_int(key);
  if (v == -1 || v == std::numeric_limits<uint32_t>::max()) return -1;
  if (v < 0 || v >= static_cast<int64_t>(num_tokens)) {
    fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, but the vocabulary (tokenizer.ggml.tokens) has {} tokens",
         file.path(), key, v, num_tokens);
  }
  return static_cast<int32_t>(v);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  if (!file.has("tokenizer.ggml.model")) {
    fail(ErrorCode::kInvalidArgument, "'{}': tokenizer.ggml.model is missing, so the file describes no tokenizer",
         file.path());
  }
  const std::string model = file.get_string("tokenizer.ggml.model");
  if (model == "gpt2") return std::make_unique<BpeTokenizer>(file);
  if (model == "llama") return std::make_unique<SpmTokenizer>(file);
  fail(ErrorCode::kUnsupported,
       "'{}': tokenizer.ggml.model '{}' is not supported; supported: gpt2 (byte-level BPE), llama (SentencePiece BPE)",
       file.path(), model);
}

void Tokenizer::load_vocab(const GgufFile& file, std::string_view model, bool default_add_bos) {
  model_ = model;
  if (!file.has("tokenizer.ggml.tokens")) {
    fail(ErrorCode::kInvalidArgument, "'{}': tokenizer.ggml.tokens is missing", file.path());
  }
  tokens_ = file.get_string_array("tokenizer.ggml.tokens");
  const size_t n = tokens_.size();
  if (n == 0) fail(ErrorCode::kInvalidArgument, "'{}': tokenizer.ggml.tokens is empty", file.path());
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    fail(ErrorCode::kInvalidArgument, "'{}': tokenizer.ggml.tokens has {} entries, more than int32 ids allow",
         file.path(), n);
  }

  types_.assign(n, TokenType::kNormal);
  if (file.has("tokenizer.ggml.token_type")) {
    const std::vector<int32_t> types = file.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != n) {
      fail(ErrorCode::kInvalidArgument, "'{}': tokenizer.ggml.token_type has {} entries, but tokenizer.ggml.tokens has {}",
           file.path(), types.size(), n);
    }
    for (size_t i = 0; i < n; ++i) {
      if (types[i] < 0 || types[i] > kMaxTokenType) {
        fail(ErrorCode::kInvalidArgument, "'{}': tokenizer.ggml.token_type[{}] is {} (token '{}'), expected 0..{}",
             file.path(), i, types[i], tokens_[i], kMaxTokenType);
      }
      types_[i] = static_cast<TokenType>(types[i]);
    }
  }

  // SentencePiece vocabularies put <unk>, <s>, </s> first; llama.cpp assumes so when keys are absent.
  const bool spm = model == "llama";
  bos_id_ = read_token_id(file, "tokenizer.ggml.bos_token_id", n, spm && n > 1 ? 1 : -1);
  eos_id_ = read_token_id(file, "tokenizer.ggml.eos_token_id", n, spm && n > 2 ? 2 : -1);
  unk_id_ = read_token_id(file, "tokenizer.ggml.unknown_token_id", n, spm ? 0 : -1);
  eot_id_ = read_token_id(file, "tokenizer.ggml.eot_token_id", n, -1);
  eom_id_ = read_token_id(file, "tokenizer.ggml.eom_token_id", n, -1);
  pad_id_ = read_token_id(file, "tokenizer.ggml.padding_token_id", n, -1);

  add_bos_ = file.get_bool_or("tokenizer.ggml.add_bos_token", default_add_bos && bos_id_ >= 0);
  add_eos_ = file.get_bool_or("tokenizer.ggml.add_eos_token", false);
  if (add_bos_ && bos_id_ < 0) {
    fail(ErrorCode::kInvalidArgument, "'{}': tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set",
         file.path());
  }
  if (add_eos_ && eos_id_ < 0) {
    fail(ErrorCode::kInvalidArgument, "'{}': tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set",
         file.path());
  }

  stop_ids_.clear();
  for (int32_t id : {eos_id_, eot_id_, eom_id_}) {
    if (id >= 0 && std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end()) stop_ids_.push_back(id);
  }

  token_index_.clear();
  token_index_.reserve(n);
  for (size_t i = 0; i < n; ++i) token_index_.emplace(tokens_[i], static_cast<int32_t>(i));
  special_.build(tokens_, types_);

  fim_pre_id_ = read_token_id(file, "tokenizer.ggml.fim_pre_token_id", n, -1);
  fim_suf_id_ = read_token_id(file, "tokenizer.ggml.fim_suf_token_id", n, -1);
  fim_mid_id_ = read_token_id(file, "tokenizer.ggml.fim_mid_token_id", n, -1);
  if (fim_pre_id_ < 0 || fim_suf_id_ < 0 || fim_mid_id_ < 0) {
    static const char* const kKnown[][3] = {{"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"},
                                            {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}};
    fim_pre_id_ = fim_suf_id_ = fim_mid_id_ = -1;
    for (const auto& names : kKnown) {
      const int32_t pre = token_to_id(names[0]), suf = token_to_id(names[1]), mid = token_to_id(names[2]);
      if (pre >= 0 && suf >= 0 && mid >= 0) {
        fim_pre_id_ = pre;
        fim_suf_id_ = suf;
        fim_mid_id_ = mid;
        break;
      }
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && add_bos_) out.push_back(bos_id_);

  std::vector<SpecialTokenMatcher::Fragment> fragments;
  special_.split(text, parse_special, fragments);
  bool after_special = true;
  for (const auto& fragment : fragments) {
    if (fragment.id >= 0) {
      out.push_back(fragment.id);
      after_special = true;
    } else {
      encode_text(fragment.text, after_special, out);
      after_special = false;
    }
  }

  if (add_special && add_eos_) out.push_back(eos_id_);
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  switch (token_type(id)) {
    case TokenType::kControl:
    case TokenType::kUnknown:
    case TokenType::kUnused:
      return special ? tokens_[id] : std::string();
    default:
      return pieces_[id];
  }
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool special) const {
  std::string out;
  bool first_text = true;
  for (int32_t id : ids) {
    std::string piece = token_to_piece(id, special);
    if (piece.empty()) continue;
    if (first_text && add_space_prefix_ && piece[0] == ' ') piece.erase(0, 1);
    first_text = false;
    out += piece;
  }
  return out;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  token_type(id);  // range check
  return tokens_[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    fail(ErrorCode::kInvalidArgument, "token id {} is out of range: the vocabulary has {} tokens", id, vocab_size());
  }
  return types_[id];
}

int32_t Tokenizer::token_to_id(std::string_view text) const {
  auto it = token_index_.find(text);
  return it == token_index_.end() ? -1 : it->second;
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool special)
    : tokenizer_(tokenizer), special_(special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  pending_ += tokenizer_.token_to_piece(id, special_);
  const size_t complete = utf8_complete_prefix(pending_);
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace duet
