#include "duet/model/decode_graph.h"

#include <algorithm>

#include <fmt/format.h>

#include "duet/core/error.h"

namespace duet {

int64_t decode_graph_bucket(const BatchInput& batch, std::string* why) {
  const auto refuse = [&](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return int64_t{0};
  };
  const int64_t n = batch.num_tokens();
  const auto& seqs = batch.attention.seqs;
  if (n == 0) return refuse("an empty step");
  if (batch.hidden_out != nullptr) return refuse("the step's hidden states are wanted (MTP drafting)");
  if (!batch.hidden_rows.empty()) return refuse("a row's hidden state is wanted (an embedding)");
  if (!batch.lora_runs.empty()) return refuse("rows run with a LoRA adapter");
  if (static_cast<int64_t>(seqs.size()) != n) {
    return refuse(fmt::format("{} tokens in {} sequences (not one new token each)", n, seqs.size()));
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].num_tokens != 1 || seqs[i].token_start != static_cast<int32_t>(i) || seqs[i].context_len < 1) {
      return refuse(fmt::format("sequence {} has {} new tokens from row {} in a context of {}", i, seqs[i].num_tokens,
                                seqs[i].token_start, seqs[i].context_len));
    }
  }
  if (static_cast<int64_t>(batch.logits_rows.size()) != n) {
    return refuse(fmt::format("logits for {} of {} rows", batch.logits_rows.size(), n));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (batch.logits_rows[static_cast<size_t>(i)] != i) return refuse("logits rows out of order");
  }
  for (int64_t b : kDecodeGraphBuckets) {
    if (n <= b) return b;
  }
  return refuse(fmt::format("{} sequences, more than the largest graph's {}", n, kDecodeGraphBuckets.back()));
}

int64_t decode_graph_context(const BatchInput& batch) {
  int64_t most = 0;
  for (const PagedSequence& ps : batch.attention.seqs) most = std::max<int64_t>(most, ps.context_len);
  int64_t c = 256;
  while (c < most) c *= 2;
  return c;
}

void pad_decode_batch(const BatchInput& batch, int64_t bucket, BatchInput& out) {
  const int64_t n = batch.num_tokens();
  if (bucket < n) fail(ErrorCode::kInternal, "a decode step of {} sequences padded to {}", n, bucket);
  out.clear();
  out.token_ids = batch.token_ids;
  out.positions = batch.positions;
  out.slot_mapping = batch.slot_mapping;
  out.attention = batch.attention;
  out.logits_rows = batch.logits_rows;
  out.hidden_out = nullptr;  // never with a graph (decode_graph_bucket)
  for (int64_t i = n; i < bucket; ++i) {
    out.token_ids.push_back(0);
    out.positions.push_back(0);
    out.slot_mapping.push_back(-1);
    out.attention.seqs.push_back(PagedSequence{static_cast<int32_t>(i), 1, 0, nullptr, 0});
    out.logits_rows.push_back(static_cast<int32_t>(i));
  }
  out.attention.num_tokens = static_cast<int32_t>(bucket);
}

}  // namespace duet
