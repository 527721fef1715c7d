// Byte-level BPE (tokenizer.ggml.model "gpt2"): text is split by the pre-tokenizer, each piece's
// bytes start as the vocabulary's byte tokens, and merges from tokenizer.ggml.merges are applied
// lowest rank first (leftmost first among equal ranks), as GPT-2 and Hugging Face tokenizers do.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "duet/formats/gguf.h"
#include "duet/tokenizer/pretokenizer.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet {

// Merge ranks keyed by the pair of token ids: open addressing with linear probing.
class MergeTable {
 public:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };

  void reserve(size_t num_merges);
  // Returns false when the pair is already present (the first, lowest rank, stays).
  bool insert(int32_t left, int32_t right, Merge merge);
  const Merge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = make_key(left, right);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge{};
  };
  static uint64_t make_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  static size_t hash(uint64_t key) {
    const uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h ^ (h >> 32));
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const GgufFile& file);

  const PreTokenizer& pre_tokenizer() const { return *pre_tokenizer_; }
  size_t num_merges() const { return merges_.size(); }

 protected:
  void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const override;

 private:
  void load_merges(const GgufFile& file);
  void build_pieces();
  // Applies the merges to one pre-tokenized piece.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  MergeTable merges_;
  std::array<int32_t, 256> byte_ids_{};  // token of each byte's byte-level character, -1 if none
};

}  // namespace duet
