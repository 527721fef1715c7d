#include "duet/grammar/vocabulary.h"

#include <algorithm>
#include <numeric>

namespace duet::grammar {

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer, int32_t num_vocab, std::vector<int32_t> end_ids)
    : num_vocab_(std::max(num_vocab, tokenizer.vocab_size())), end_ids_(std::move(end_ids)) {
  bytes_.resize(static_cast<size_t>(num_vocab_));
  std::vector<int32_t> text_ids;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (is_end(id)) continue;
    switch (tokenizer.token_type(id)) {
      case TokenType::kNormal:
      case TokenType::kUserDefined:
      case TokenType::kByte:
      case TokenType::kUndefined:
        bytes_[static_cast<size_t>(id)] = tokenizer.token_to_piece(id, false);
        if (!bytes_[static_cast<size_t>(id)].empty()) text_ids.push_back(id);
        break;
      case TokenType::kControl:
        bytes_[static_cast<size_t>(id)] = tokenizer.token_to_piece(id, true);
        if (!bytes_[static_cast<size_t>(id)].empty()) control_.push_back({id, bytes_[static_cast<size_t>(id)]});
        control_ids_.insert(id);
        break;
      default: break;  // unknown and unused tokens are never produced under a grammar
    }
  }
  std::stable_sort(text_ids.begin(), text_ids.end(),
                   [this](int32_t a, int32_t b) { return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)]; });
  sorted_ids_ = text_ids;

  // Depth-first nodes: each token adds the nodes of its bytes past the prefix it shares with the
  // previous one (sorted order makes that prefix the path already open).
  std::vector<uint32_t> open;  // node index per depth on the current path
  std::string_view prev;
  for (size_t i = 0; i < text_ids.size(); ++i) {
    const std::string_view b = bytes_[static_cast<size_t>(text_ids[i])];
    size_t common = 0;
    while (common < prev.size() && common < b.size() && prev[common] == b[common]) ++common;
    open.resize(common);
    for (size_t d = common; d < b.size(); ++d) {
      open.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back(Node{0, 0, 0, static_cast<uint16_t>(std::min<size_t>(d + 1, UINT16_MAX)), static_cast<uint8_t>(b[d])});
    }
    Node& end = nodes_[open.back()];
    if (end.token_end == 0 && end.token_begin == 0) end.token_begin = static_cast<uint32_t>(i);
    end.token_end = static_cast<uint32_t>(i + 1);
    prev = b;
  }
  // Subtree ends: the next node at the same depth or shallower.
  std::vector<uint32_t> pending;
  for (uint32_t i = 0; i < nodes_.size(); ++i) {
    while (!pending.empty() && nodes_[pending.back()].depth >= nodes_[i].depth) {
      nodes_[pending.back()].subtree_end = i;
      pending.pop_back();
    }
    pending.push_back(i);
  }
  for (uint32_t p : pending) nodes_[p].subtree_end = static_cast<uint32_t>(nodes_.size());
}

bool TokenVocabulary::is_end(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

}  // namespace duet::grammar
