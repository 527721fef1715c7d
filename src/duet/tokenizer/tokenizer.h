// Tokenizers built from GGUF metadata (tokenizer.ggml.*): byte-level BPE ("gpt2") with the
// pre-tokenizer named by tokenizer.ggml.pre, and SentencePiece-style BPE ("llama") with byte
// fallback.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "duet/formats/gguf.h"
#include "duet/tokenizer/special_tokens.h"

namespace duet {

// GGUF token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  Tokenizer(const Tokenizer&) = delete;  // the token index points into tokens_
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Builds the tokenizer described by the file's tokenizer.ggml.* metadata. Throws Error
  // (kUnsupported for an unknown model or pre-tokenizer, kInvalidArgument for bad metadata).
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);

  // add_special: add BOS (and EOS) as the metadata says (tokenizer.ggml.add_bos_token, ...).
  // parse_special: text of control/user-defined tokens ("<｜begin▁of▁sentence｜>") becomes that
  // token; otherwise it is tokenized as plain text. User-defined tokens (added tokens that are
  // not special) are matched either way, as Hugging Face tokenizers and llama.cpp do.
  // Safe to call from several threads at once.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // The bytes a token stands for (byte tokens become their byte, "Ġ"/"▁" become spaces, ...).
  // Control tokens give their text only when `special` is true, otherwise nothing (likewise
  // unknown and unused tokens). Throws kInvalidArgument for an id outside the vocabulary.
  virtual std::string token_to_piece(int32_t id, bool special) const;

  // Concatenated pieces; may contain incomplete UTF-8 at the ends if the ids split a character.
  // SentencePiece vocabularies that add a space prefix drop one leading space from the first
  // piece, so that decode(encode(text)) == text.
  std::string decode(std::span<const int32_t> ids, bool special = false) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  const std::string& token_text(int32_t id) const;  // the raw vocabulary entry
  TokenType token_type(int32_t id) const;
  bool is_control(int32_t id) const { return token_type(id) == TokenType::kControl; }
  // The id of the vocabulary entry with exactly this raw text, or -1.
  int32_t token_to_id(std::string_view text) const;

  std::string_view model() const { return model_; }  // "gpt2" or "llama"
  std::string_view pre() const { return pre_; }       // pre-tokenizer name ("default" if none)
  int32_t bos_id() const { return bos_id_; }          // -1 when the vocabulary has none
  int32_t eos_id() const { return eos_id_; }
  int32_t eot_id() const { return eot_id_; }  // end of turn (tokenizer.ggml.eot_token_id), or -1
  int32_t eom_id() const { return eom_id_; }  // end of message (tokenizer.ggml.eom_token_id), or -1
  int32_t unk_id() const { return unk_id_; }
  int32_t pad_id() const { return pad_id_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }  // SentencePiece only
  // Fill-in-the-middle markers: the prefix's, the suffix's (the hole) and the middle's (where the
  // model writes): tokenizer.ggml.fim_pre_token_id, fim_suf_token_id and fim_mid_token_id, else
  // DeepSeek-Coder's <｜fim▁begin｜>, <｜fim▁hole｜>, <｜fim▁end｜> or Qwen2.5-Coder's
  // <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|> found in the vocabulary; -1 when it has none.
  int32_t fim_pre_id() const { return fim_pre_id_; }
  int32_t fim_suf_id() const { return fim_suf_id_; }
  int32_t fim_mid_id() const { return fim_mid_id_; }
  // Token ids that end generation: eos plus any end-of-turn/eot ids from metadata.
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }

 protected:
  Tokenizer() = default;

  // Reads what both models share: tokens, token types, special ids and flags. Builds the token
  // index and the special-token matcher. `default_add_bos` applies when the key is absent.
  void load_vocab(const GgufFile& file, std::string_view model, bool default_add_bos);

  // Tokenizes plain text (no special-token text in it). `after_special` is true for the first
  // fragment of the input and for every fragment that follows a special token.
  virtual void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const = 0;

  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::string model_;
  std::string pre_ = "default";
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  std::vector<int32_t> stop_ids_;

  int32_t eot_id_ = -1;
  int32_t eom_id_ = -1;
  int32_t unk_id_ = -1;
  int32_t pad_id_ = -1;
  int32_t fim_pre_id_ = -1;
  int32_t fim_suf_id_ = -1;
  int32_t fim_mid_id_ = -1;
  bool add_space_prefix_ = false;
  std::unordered_map<std::string_view, int32_t> token_index_;  // raw text -> first id with it
  SpecialTokenMatcher special_;
  // What token_to_piece returns for normal, user-defined and byte tokens (filled by the model).
  std::vector<std::string> pieces_;
};

// Turns a stream of token ids into text without ever emitting part of a UTF-8 character: bytes
// of an incomplete character are held back until the character is complete. Bytes that can never
// become valid UTF-8 come out as U+FFFD right away, so everything emitted is valid UTF-8. Pieces
// are concatenated as they are (no leading-space removal, unlike Tokenizer::decode).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool special = false);
  // Text that became complete with this token (possibly empty).
  std::string push(int32_t id);
  // Whatever is held back, with invalid or incomplete sequences replaced by U+FFFD.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool special_;
  std::string pending_;
};

}  // namespace duet
