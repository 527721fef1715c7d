// Finds the text of added tokens in input so that it becomes one token id: user-defined tokens
// always (Hugging Face matches added tokens that are not "special" even when special tokens are
// not parsed, and so does llama.cpp), control and unknown tokens only when special-token parsing
// is on. Matching is leftmost-longest.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace duet {

enum class TokenType : int32_t;  // tokenizer.h

class SpecialTokenMatcher {
 public:
  struct Fragment {
    std::string_view text;  // the matched token text, or plain text when id is -1
    int32_t id;
  };

  // Indexes the added tokens of a vocabulary; `tokens` must outlive the matcher (views into it).
  void build(const std::vector<std::string>& tokens, const std::vector<TokenType>& types);

  // Splits `text` into plain-text fragments and matched tokens, in order. Plain fragments are
  // never empty.
  void split(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;

  size_t num_always() const { return num_always_; }
  size_t num_parsed() const { return num_parsed_; }

 private:
  struct Entry {
    int32_t id;
    bool always;  // user-defined: matched even without parse_special
  };

  std::unordered_map<std::string_view, Entry> entries_;           // token text -> lowest id
  std::array<std::vector<uint32_t>, 256> lengths_by_first_byte_;  // distinct lengths, longest first
  std::array<uint8_t, 256> first_byte_flags_{};                   // kAlways | kParsed of the texts there
  size_t num_always_ = 0;
  size_t num_parsed_ = 0;
};

}  // namespace duet
