#include "duet/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <queue>

#include "duet/core/error.h"
#include "duet/tokenizer/unicode.h"

namespace duet {
namespace {

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
};

// A pair that may merge: the left symbol's index and both ids at the time it was queued, so a
// stale entry (one of the two has merged since) is recognised and dropped.
struct Candidate {
  int32_t rank;
  int32_t left;
  int32_t left_id;
  int32_t right_id;
  int32_t merged_id;
};

struct LaterCandidate {  // lowest rank first, then leftmost
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};

class CandidateQueue : public std::priority_queue<Candidate, std::vector<Candidate>, LaterCandidate> {
 public:
  void reset() { c.clear(); }
};

}  // namespace

void MergeTable::reserve(size_t num_merges) {
  size_t capacity = 16;
  while (capacity < num_merges * 2) capacity *= 2;
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  size_ = 0;
}

bool MergeTable::insert(int32_t left, int32_t right, Merge merge) {
  if ((size_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(old.size(), 8));
    for (const Slot& s : old) {
      if (s.key != kEmpty) insert(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xFFFFFFFFu), s.merge);
    }
  }
  const uint64_t key = make_key(left, right);
  for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) return false;
    if (s.key == kEmpty) {
      s.key = key;
      s.merge = merge;
      ++size_;
      return true;
    }
  }
}

BpeTokenizer::BpeTokenizer(const GgufFile& file) {
  load_vocab(file, "gpt2", /*default_add_bos=*/false);
  pre_ = file.get_string_or("tokenizer.ggml.pre", "default");
  if (!PreTokenizer::is_supported(pre_)) {
    fail(ErrorCode::kUnsupported, "'{}': tokenizer.ggml.pre '{}' is not supported; supported: {}", file.path(), pre_,
         fmt::join(PreTokenizer::supported_names(), ", "));
  }
  pre_tokenizer_ = std::make_unique<PreTokenizer>(pre_);

  // Each byte starts as the token of its byte-level character. A normal token is preferred over
  // an added one with the same text (DeepSeek adds the never-valid UTF-8 bytes as user-defined).
  byte_ids_.fill(-1);
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& text = tokens_[id];
    uint32_t cp = 0;
    if (text.empty() || text.size() > 2 || decode_utf8(text, 0, cp) != text.size()) continue;
    const int byte = unicode_to_byte(cp);
    if (byte < 0) continue;
    int32_t& slot = byte_ids_[byte];
    if (slot < 0 || (types_[slot] != TokenType::kNormal && types_[id] == TokenType::kNormal)) {
      slot = static_cast<int32_t>(id);
    }
  }
  load_merges(file);
  build_pieces();
}

void BpeTokenizer::load_merges(const GgufFile& file) {
  if (!file.has("tokenizer.ggml.merges")) {
    fail(ErrorCode::kInvalidArgument, "'{}': tokenizer.ggml.merges is missing (a gpt2 tokenizer needs its merges)",
         file.path());
  }
  const std::vector<std::string> merges = file.get_string_array("tokenizer.ggml.merges");
  merges_.reserve(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string_view merge = merges[i];
    const size_t space = merge.find(' ', 1);
    if (space == std::string_view::npos || space + 1 >= merge.size()) {
      fail(ErrorCode::kInvalidArgument, "'{}': tokenizer.ggml.merges[{}] is '{}', expected two tokens separated by a space",
           file.path(), i, merge);
    }
    const std::string_view left = merge.substr(0, space);
    const std::string_view right = merge.substr(space + 1);
    joined.assign(left).append(right);
    const int32_t left_id = token_to_id(left);
    const int32_t right_id = token_to_id(right);
    const int32_t merged_id = token_to_id(joined);
    for (auto [id, text] : {std::pair{left_id, std::string_view(left)}, std::pair{right_id, std::string_view(right)},
                            std::pair{merged_id, std::string_view(joined)}}) {
      if (id < 0) {
        fail(ErrorCode::kInvalidArgument,
             "'{}': tokenizer.ggml.merges[{}] is '{}', but '{}' is not in the vocabulary (tokenizer.ggml.tokens)",
             file.path(), i, merge, text);
      }
    }
    merges_.insert(left_id, right_id, {static_cast<int32_t>(i), merged_id});
  }
}

void BpeTokenizer::build_pieces() {
  pieces_.assign(tokens_.size(), std::string());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& text = tokens_[id];
    switch (types_[id]) {
      case TokenType::kUserDefined:
        pieces_[id] = text;  // added tokens are stored as plain text
        break;
      case TokenType::kControl:
      case TokenType::kUnknown:
      case TokenType::kUnused:
        break;  // token_to_piece answers these from the raw text
      default: {
        // Byte-level text back to bytes; characters outside the table are kept as they are.
        std::string& piece = pieces_[id];
        uint32_t cp = 0;
        for (size_t pos = 0; pos < text.size();) {
          const size_t n = decode_utf8(text, pos, cp);
          const int byte = n > 0 ? unicode_to_byte(cp) : -1;
          if (byte >= 0) {
            piece.push_back(static_cast<char>(byte));
          } else {
            const size_t len = n > 0 ? n : 1;
            piece.append(text, pos, len);
          }
          pos += n > 0 ? n : 1;
        }
      }
    }
  }
}

void BpeTokenizer::encode_text(std::string_view text, bool /*after_special*/, std::vector<int32_t>& out) const {
  thread_local std::vector<std::string_view> words;
  words.clear();
  pre_tokenizer_->split(text, words);
  for (std::string_view word : words) encode_word(word, out);
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (pre_tokenizer_->ignore_merges()) {
    const int32_t whole = token_to_id(bytes_to_unicode_text(word));
    if (whole >= 0 && types_[whole] == TokenType::kNormal) {
      out.push_back(whole);
      return;
    }
  }
  if (word.size() == 1) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(word[0])];
    if (id >= 0) out.push_back(id);
    else if (unk_id_ >= 0) out.push_back(unk_id_);
    return;
  }

  thread_local std::vector<Symbol> symbols;
  thread_local CandidateQueue queue;
  symbols.clear();
  queue.reset();
  const auto n = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols.push_back({byte_ids_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1});
  }
  auto try_queue = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const int32_t left_id = symbols[left].id;
    const int32_t right_id = symbols[right].id;
    if (left_id < 0 || right_id < 0) return;  // a byte without a token never merges
    if (const MergeTable::Merge* m = merges_.find(left_id, right_id)) queue.push({m->rank, left, left_id, right_id, m->merged_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) try_queue(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    if (left.id != c.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.id != c.right_id) continue;
    left.id = c.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    right.id = -2;  // dead
    try_queue(left.prev);
    try_queue(c.left);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const int32_t id = symbols[i].id;
    if (id >= 0) out.push_back(id);
    else if (unk_id_ >= 0) out.push_back(unk_id_);
  }
}

}  // namespace duet
