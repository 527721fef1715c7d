// Speculative decoding with DeepSeek-V3's multi-token-prediction layer as the drafter
// (--speculative-method mtp): one more way to fill Sequence::draft, verified by the engine exactly
// as n-gram drafts are.
//
// The MTP layer at position i reads the model's final normalised hidden state there and the
// token at i + 1, and predicts the token at i + 2; it attends over its own KV (a layer of the
// paged cache after the model's, so prefix caching and preemption treat it like any layer).
// After every step, for each sequence of a request the drafter serves (n = 1, no beam search):
//   1. catch-up: the layer runs over every position the step computed and kept (prompt chunks,
//      the decoded token, the accepted drafts), now that the token after each is known; this
//      writes its KV there, and at the last position (p) gives the first draft, d1 = argmax;
//   2. chain: for drafts 2..K the layer runs on its own output, at p + 1 with d1, at p + 2 with
//      d2, ... (V3 trained one MTP module; chaining it is what vLLM and SGLang do for K > 1).
//      Those positions are the ones the next step computes, so their slots are allocated now
//      (fewer drafts when the pool has no block for them); their KV is written again by the next
//      catch-up with the tokens that were kept.
// A full block's MTP row at its last position depends on the token after the block, so a
// prefix-cache hit by another prompt may reuse one computed for a different next token: a
// slightly worse draft there, never a different output (every draft is verified).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "duet/cache/kv_cache_manager.h"
#include "duet/engine/request.h"
#include "duet/model/model.h"

namespace duet {

class MtpDrafter {
 public:
  // One sequence of the step just finished: its rows in the step's batch, and how many drafts it
  // may get for the next step (0: catch-up only).
  struct Item {
    Sequence* seq;
    int32_t first_row;
    int32_t num_rows;
    int32_t max_drafts;
  };

  explicit MtpDrafter(int32_t num_speculative_tokens) : k_(num_speculative_tokens) {}

  // Runs catch-up and the chain for `items` (see above), given the step's batch and the model's
  // hidden states of its rows (BatchInput::hidden_out); sets each item's seq->draft (empty when it
  // gets none).
  void run(std::span<const Item> items, const BatchInput& step, const float* hidden, Model& model,
           PagedKvCache& cache, KvCacheManager& kv);

 private:
  int32_t k_;
  BatchInput batch_;
  std::vector<float> hidden_, out_, logits_;
  std::vector<int32_t> tokens_;
};

}  // namespace duet
