// SentencePiece-style BPE (tokenizer.ggml.model "llama"): spaces become "▁", a "▁" is put in
// front of the text (tokenizer.ggml.add_space_prefix, default true), adjacent pieces merge while
// their concatenation is in the vocabulary, highest tokenizer.ggml.scores first (leftmost first
// among equal scores), and characters left without a token fall back to <0xXX> byte tokens (or
// the unknown token when the vocabulary has no byte tokens).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "duet/formats/gguf.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet {

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(const GgufFile& file);

 protected:
  void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const override;

 private:
  // Only normal and user-defined pieces are produced by merging (never control, byte or unused).
  int32_t mergeable_id(std::string_view text) const;
  void build_pieces();

  std::vector<float> scores_;
  std::array<int32_t, 256> byte_ids_{};  // <0xXX> token of each byte, -1 if none
};

// The byte of a "<0xXX>" token text, or -1.
int parse_byte_token(std::string_view text);

}  // namespace duet
