// A model's vocabulary as grammars see it: the bytes of every token that stands for text, in a
// trie laid out in depth-first order, so that one pass over the nodes (skipping the subtree of a
// prefix the grammar refuses) finds every token a matcher state allows. Built once per model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "duet/tokenizer/tokenizer.h"

namespace duet::grammar {

class TokenVocabulary {
 public:
  struct Node {
    uint32_t subtree_end;  // the first node after this one's subtree
    uint32_t token_begin;  // tokens whose bytes end here: sorted_ids()[token_begin, token_end)
    uint32_t token_end;
    uint16_t depth;        // 1 for the first byte
    uint8_t byte;
  };
  struct ControlToken {
    int32_t id;
    std::string text;
  };

  // `num_vocab` is the model's number of logits (at least the tokenizer's vocabulary);
  // `end_ids` the tokens that end generation (never part of a match; allowed where the grammar
  // may end).
  TokenVocabulary(const Tokenizer& tokenizer, int32_t num_vocab, std::vector<int32_t> end_ids);

  int32_t num_vocab() const { return num_vocab_; }
  size_t num_mask_words() const { return (static_cast<size_t>(num_vocab_) + 63) / 64; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& sorted_ids() const { return sorted_ids_; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  // Control tokens with a text (such as <｜tool▁calls▁begin｜>): not in the trie; a grammar
  // allows one only where a literal of it contains its text.
  const std::vector<ControlToken>& control_tokens() const { return control_; }
  // The bytes a token adds to the output (control tokens: their text); empty for tokens that
  // add nothing.
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_end(int32_t id) const;
  bool is_control(int32_t id) const { return control_ids_.count(id) != 0; }

 private:
  int32_t num_vocab_;
  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;
  std::vector<int32_t> sorted_ids_;
  std::vector<int32_t> end_ids_;
  std::vector<ControlToken> control_;
  std::unordered_set<int32_t> control_ids_;
};

}  // namespace duet::grammar
