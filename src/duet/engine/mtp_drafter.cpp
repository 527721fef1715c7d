#include "duet/engine/mtp_drafter.h"

#include <algorithm>

namespace duet {
namespace {

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

}  // namespace

void MtpDrafter::run(std::span<const Item> items, const BatchInput& step, const float* hidden, Model& model,
                     PagedKvCache& cache, KvCacheManager& kv) {
  const int64_t d = model.config().hidden_size, vocab = model.config().num_vocab;
  const auto row_bytes = static_cast<size_t>(d);
  // 1. Catch-up over the kept rows of every sequence; logits at the last row of those that draft.
  batch_.clear();
  batch_.attention.block_size = cache.block_size();
  hidden_.clear();
  std::vector<const Item*> drafting;  // in the order of their logits rows
  for (const Item& it : items) {
    Sequence& seq = *it.seq;
    seq.draft.clear();
    const int32_t pos0 = step.positions[static_cast<size_t>(it.first_row)];
    const int32_t kept = std::min(it.num_rows, seq.num_computed_tokens - pos0);
    if (kept <= 0 || seq.num_computed_tokens >= static_cast<int32_t>(seq.tokens.size())) continue;
    // Row j (position pos0 + j) takes the token after it.
    tokens_.assign(seq.tokens.begin() + pos0 + 1, seq.tokens.begin() + pos0 + 1 + kept);
    const bool drafts = it.max_drafts > 0 && seq.num_computed_tokens + 1 == static_cast<int32_t>(seq.tokens.size());
    batch_.add_sequence(tokens_, pos0, kv.block_table(seq.id),
                        drafts ? BatchInput::Logits::kLast : BatchInput::Logits::kNone);
    const float* src = hidden + static_cast<size_t>(it.first_row) * row_bytes;
    hidden_.insert(hidden_.end(), src, src + static_cast<size_t>(kept) * row_bytes);
    if (drafts) drafting.push_back(&it);
  }
  if (batch_.num_tokens() == 0) return;
  out_.resize(static_cast<size_t>(batch_.num_tokens()) * row_bytes);
  logits_.resize(drafting.size() * static_cast<size_t>(vocab));
  model.mtp_forward(batch_, hidden_.data(), cache, logits_.data(), out_.data());
  // Each drafting sequence's MTP output at its last row, the input of the chain.
  std::vector<float> last(drafting.size() * row_bytes);
  for (size_t i = 0; i < drafting.size(); ++i) {
    const int32_t row = batch_.logits_rows[i];
    std::copy_n(out_.data() + static_cast<size_t>(row) * row_bytes, row_bytes, last.data() + i * row_bytes);
    drafting[i]->seq->draft.push_back(argmax(logits_.data() + i * static_cast<size_t>(vocab), vocab));
  }

  // 2. The chain: draft j + 1 from the layer's output at p + j with draft j.
  for (int32_t j = 1; j < k_; ++j) {
    batch_.clear();
    hidden_.clear();
    std::vector<size_t> active;
    for (size_t i = 0; i < drafting.size(); ++i) {
      Sequence& seq = *drafting[i]->seq;
      if (static_cast<int32_t>(seq.draft.size()) != j || j >= drafting[i]->max_drafts) continue;
      // Slots for positions up to p + j (p + 1 = num_computed_tokens): the next step's anyway.
      if (!kv.allocate_slots(seq.id, seq.num_computed_tokens, j)) continue;
      const int32_t token = seq.draft.back();
      batch_.add_sequence(std::span<const int32_t>(&token, 1), seq.num_computed_tokens + j - 1, kv.block_table(seq.id),
                          BatchInput::Logits::kLast);
      hidden_.insert(hidden_.end(), last.begin() + static_cast<std::ptrdiff_t>(i * row_bytes),
                     last.begin() + static_cast<std::ptrdiff_t>((i + 1) * row_bytes));
      active.push_back(i);
    }
    if (active.empty()) break;
    out_.resize(active.size() * row_bytes);
    logits_.resize(active.size() * static_cast<size_t>(vocab));
    model.mtp_forward(batch_, hidden_.data(), cache, logits_.data(), out_.data());
    for (size_t a = 0; a < active.size(); ++a) {
      const size_t i = active[a];
      std::copy_n(out_.data() + a * row_bytes, row_bytes, last.data() + i * row_bytes);
      drafting[i]->seq->draft.push_back(argmax(logits_.data() + a * static_cast<size_t>(vocab), vocab));
    }
  }
}

}  // namespace duet
