#include "duet/tokenizer/spm_tokenizer.h"

#include <queue>
#include <string>

#include "duet/core/error.h"
#include "duet/tokenizer/unicode.h"

namespace duet {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK, "▁"

struct Symbol {
  int32_t start;  // byte offset in the escaped text
  int32_t len;    // 0 once merged into its left neighbour
  int32_t prev;
  int32_t next;
};

// Sizes only grow, so an entry whose two symbols still add up to `size` is current.
struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  int32_t size;
};

struct LaterBigram {  // highest score first, then leftmost
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  }
};

class BigramQueue : public std::priority_queue<Bigram, std::vector<Bigram>, LaterBigram> {
 public:
  void reset() { c.clear(); }
};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return -1;
  const int hi = hex_value(text[3]);
  const int lo = hex_value(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

SpmTokenizer::SpmTokenizer(const GgufFile& file) {
  load_vocab(file, "llama", /*default_add_bos=*/true);
  pre_ = file.get_string_or("tokenizer.ggml.pre", "default");
  add_space_prefix_ = file.get_bool_or("tokenizer.ggml.add_space_prefix", true);

  const size_t n = tokens_.size();
  if (file.has("tokenizer.ggml.scores")) {
    scores_ = file.get_float_array("tokenizer.ggml.scores");
    if (scores_.size() != n) {
      fail(ErrorCode::kInvalidArgument, "'{}': tokenizer.ggml.scores has {} entries, but tokenizer.ggml.tokens has {}",
           file.path(), scores_.size(), n);
    }
  } else {
    scores_.assign(n, 0.0f);
  }

  const bool typed = file.has("tokenizer.ggml.token_type");
  byte_ids_.fill(-1);
  for (size_t id = 0; id < n; ++id) {
    if (typed && types_[id] != TokenType::kByte) continue;
    const int byte = parse_byte_token(tokens_[id]);
    if (byte >= 0 && byte_ids_[byte] < 0) byte_ids_[byte] = static_cast<int32_t>(id);
  }
  build_pieces();
}

void SpmTokenizer::build_pieces() {
  pieces_.assign(tokens_.size(), std::string());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& text = tokens_[id];
    switch (types_[id]) {
      case TokenType::kControl:
      case TokenType::kUnknown:
      case TokenType::kUnused:
        break;  // token_to_piece answers these from the raw text
      case TokenType::kByte: {
        const int byte = parse_byte_token(text);
        pieces_[id] = byte >= 0 ? std::string(1, static_cast<char>(byte)) : text;
        break;
      }
      default: {
        std::string& piece = pieces_[id];
        for (size_t pos = 0; pos < text.size();) {
          if (text.compare(pos, kSpace.size(), kSpace) == 0) {
            piece.push_back(' ');
            pos += kSpace.size();
          } else {
            piece.push_back(text[pos++]);
          }
        }
      }
    }
  }
}

int32_t SpmTokenizer::mergeable_id(std::string_view text) const {
  const int32_t id = token_to_id(text);
  if (id < 0) return -1;
  const TokenType type = types_[id];
  return type == TokenType::kNormal || type == TokenType::kUserDefined || type == TokenType::kUndefined ? id : -1;
}

void SpmTokenizer::encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const {
  thread_local std::string escaped;
  thread_local std::vector<Symbol> symbols;
  thread_local BigramQueue queue;
  escaped.clear();
  if (add_space_prefix_ && after_special) escaped += kSpace;
  for (char c : text) {
    if (c == ' ') escaped += kSpace;
    else escaped.push_back(c);
  }
  if (escaped.empty()) return;

  // One symbol per character (an ill-formed byte sequence is one symbol as well).
  symbols.clear();
  queue.reset();
  uint32_t cp = 0;
  for (size_t pos = 0; pos < escaped.size();) {
    size_t len = decode_utf8(escaped, pos, cp);
    if (len == 0) len = utf8_maximal_subpart(escaped, pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<int32_t>(pos), static_cast<int32_t>(len), index - 1, -1});
    if (index > 0) symbols[index - 1].next = index;
    pos += len;
  }

  auto try_queue = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t size = symbols[left].len + symbols[right].len;
    const int32_t id = mergeable_id(std::string_view(escaped).substr(symbols[left].start, size));
    if (id >= 0) queue.push({scores_[id], left, right, size});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) try_queue(i, i + 1);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    if (left.len == 0 || right.len == 0 || left.len + right.len != b.size) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    try_queue(left.prev, b.left);
    try_queue(b.left, left.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = std::string_view(escaped).substr(symbols[i].start, symbols[i].len);
    const int32_t id = mergeable_id(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    bool all_bytes = true;
    for (char c : piece) all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
    if (all_bytes) {
      for (char c : piece) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
    } else if (unk_id_ >= 0) {
      out.push_back(unk_id_);
    }
  }
}

}  // namespace duet
