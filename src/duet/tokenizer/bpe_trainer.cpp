#include "duet/tokenizer/bpe_trainer.h"

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "duet/core/error.h"
#include "duet/tokenizer/pretokenizer.h"
#include "duet/tokenizer/tokenizer.h"
#include "duet/tokenizer/unicode.h"

namespace duet {
namespace {

constexpr int32_t kNumSpecials = 2;
constexpr std::string_view kBosText = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEosText = "<｜end▁of▁sentence｜>";

using PairKey = uint64_t;

PairKey pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
int32_t key_left(PairKey k) { return static_cast<int32_t>(k >> 32); }
int32_t key_right(PairKey k) { return static_cast<int32_t>(k & 0xFFFFFFFFu); }

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
  int64_t last_merge = -1;  // the merge that last visited this word (dedupes pair_words)
};

struct HeapEntry {
  int64_t count;
  PairKey key;
};

struct FewerOrLater {  // most frequent first; ties: smaller (left, right) ids first
  bool operator()(const HeapEntry& a, const HeapEntry& b) const {
    return a.count != b.count ? a.count < b.count : a.key > b.key;
  }
};

// Incremental pair statistics over the distinct words of the corpus.
class PairStats {
 public:
  explicit PairStats(std::vector<Word>& words) : words_(words) {
    for (size_t w = 0; w < words_.size(); ++w) {
      const Word& word = words_[w];
      for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
        const PairKey k = pair_key(word.symbols[i], word.symbols[i + 1]);
        counts_[k] += word.count;
        add_word(k, static_cast<int32_t>(w));
      }
    }
    for (const auto& [k, c] : counts_) heap_.push({c, k});
  }

  // The most frequent pair with its count, or count 0 when none is left.
  HeapEntry best() {
    while (!heap_.empty()) {
      const HeapEntry top = heap_.top();
      auto it = counts_.find(top.key);
      if (it != counts_.end() && it->second == top.count) return top;
      heap_.pop();  // stale
    }
    return {0, 0};
  }

  // Replaces every occurrence of `k` (left to right, non-overlapping) by `merged` and updates
  // the counts of the pairs around them.
  void merge(PairKey k, int32_t merged, int64_t merge_index) {
    const int32_t a = key_left(k);
    const int32_t b = key_right(k);
    deltas_.clear();
    std::vector<int32_t> word_ids = std::move(pair_words_[k]);
    pair_words_.erase(k);
    for (int32_t w : word_ids) {
      Word& word = words_[w];
      if (word.last_merge == merge_index) continue;
      word.last_merge = merge_index;
      std::vector<int32_t>& s = word.symbols;
      bool found = false;
      for (size_t i = 0; i + 1 < s.size() && !found; ++i) found = s[i] == a && s[i + 1] == b;
      if (!found) continue;
      for (size_t i = 0; i + 1 < s.size(); ++i) deltas_[pair_key(s[i], s[i + 1])] -= word.count;
      size_t out = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          s[out++] = merged;
          ++i;
        } else {
          s[out++] = s[i];
        }
      }
      s.resize(out);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const PairKey p = pair_key(s[i], s[i + 1]);
        deltas_[p] += word.count;
        if (key_left(p) == merged || key_right(p) == merged) add_word(p, w);
      }
    }
    for (const auto& [p, d] : deltas_) {
      if (d == 0) continue;
      int64_t& c = counts_[p];
      c += d;
      if (c > 0) heap_.push({c, p});
    }
    counts_.erase(k);
  }

 private:
  void add_word(PairKey k, int32_t w) {
    std::vector<int32_t>& ids = pair_words_[k];
    if (ids.empty() || ids.back() != w) ids.push_back(w);
  }

  std::vector<Word>& words_;
  std::unordered_map<PairKey, int64_t> counts_;
  std::unordered_map<PairKey, std::vector<int32_t>> pair_words_;
  std::unordered_map<PairKey, int64_t> deltas_;
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, FewerOrLater> heap_;
};

}  // namespace

TrainedVocab train_bpe(std::string_view corpus, int32_t vocab_size, std::string_view pre) {
  if (vocab_size < 256 + kNumSpecials) {
    fail(ErrorCode::kInvalidArgument,
         "vocab_size {} is too small: a byte-level BPE vocabulary needs at least {} entries (256 bytes + bos + eos)",
         vocab_size, 256 + kNumSpecials);
  }
  const PreTokenizer pre_tokenizer(pre);

  // Distinct words with their counts, in a fixed (sorted) order.
  std::vector<std::string_view> pieces;
  pre_tokenizer.split(corpus, pieces);
  std::unordered_map<std::string_view, int64_t> counts;
  for (std::string_view p : pieces) ++counts[p];
  std::vector<std::pair<std::string_view, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [text, count] : sorted) {
    Word w;
    w.count = count;
    for (char c : text) w.symbols.push_back(static_cast<uint8_t>(c));
    words.push_back(std::move(w));
  }

  TrainedVocab vocab;
  std::unordered_map<std::string, int32_t> ids;
  for (int b = 0; b < 256; ++b) {
    vocab.tokens.push_back(byte_to_unicode()[b]);
    vocab.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
    ids.emplace(vocab.tokens.back(), b);
  }

  const auto max_normal = static_cast<size_t>(vocab_size - kNumSpecials);
  PairStats stats(words);
  for (int64_t merge_index = 0; vocab.tokens.size() < max_normal; ++merge_index) {
    const HeapEntry best = stats.best();
    if (best.count < 2) break;
    const std::string& left = vocab.tokens[key_left(best.key)];
    const std::string& right = vocab.tokens[key_right(best.key)];
    vocab.merges.push_back(left + " " + right);
    std::string text = left + right;
    auto [it, added] = ids.emplace(std::move(text), static_cast<int32_t>(vocab.tokens.size()));
    if (added) {  // two merge paths can spell the same token; it keeps its first id
      vocab.tokens.push_back(it->first);
      vocab.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
    }
    stats.merge(best.key, it->second, merge_index);
  }

  vocab.bos_id = static_cast<int32_t>(vocab.tokens.size());
  vocab.tokens.emplace_back(kBosText);
  vocab.eos_id = vocab.bos_id + 1;
  vocab.tokens.emplace_back(kEosText);
  vocab.token_types.insert(vocab.token_types.end(), kNumSpecials, static_cast<int32_t>(TokenType::kControl));
  for (int n = 0; vocab.tokens.size() < static_cast<size_t>(vocab_size); ++n) {
    std::string name = "<|reserved_" + std::to_string(n) + "|>";
    if (ids.count(name)) continue;
    vocab.tokens.push_back(std::move(name));
    vocab.token_types.push_back(static_cast<int32_t>(TokenType::kUnused));
  }
  return vocab;
}

std::vector<std::pair<std::string, GgufValue>> tokenizer_metadata(const TrainedVocab& vocab, std::string_view pre) {
  return {
      {"tokenizer.ggml.model", GgufValue::str("gpt2")},
      {"tokenizer.ggml.pre", GgufValue::str(std::string(pre))},
      {"tokenizer.ggml.tokens", GgufValue::string_array(vocab.tokens)},
      {"tokenizer.ggml.token_type", GgufValue::i32_array(vocab.token_types)},
      {"tokenizer.ggml.merges", GgufValue::string_array(vocab.merges)},
      {"tokenizer.ggml.bos_token_id", GgufValue::u32(static_cast<uint32_t>(vocab.bos_id))},
      {"tokenizer.ggml.eos_token_id", GgufValue::u32(static_cast<uint32_t>(vocab.eos_id))},
      {"tokenizer.ggml.add_bos_token", GgufValue::boolean(true)},
      {"tokenizer.ggml.add_eos_token", GgufValue::boolean(false)},
  };
}

}  // namespace duet
