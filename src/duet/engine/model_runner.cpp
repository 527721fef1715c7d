#include "duet/engine/model_runner.h"

namespace duet {

ModelRunner::ModelRunner(Model& model, Backend& backend, int64_t num_blocks, int32_t block_size, KvDtype kv_dtype)
    : model_(model), backend_(backend), cache_(model.new_kv_cache(num_blocks, block_size, kv_dtype)) {
  batch_.attention.block_size = block_size;
}

const float* ModelRunner::execute(const SchedulerOutput& out, const KvCacheManager& kv) {
  if (!out.block_copies.empty()) {
    for (int64_t l = 0; l < model_.config().num_layers; ++l) {
      backend_.copy_blocks(cache_->k(l), out.block_copies, cache_->k_block_bytes());
      if (cache_->v_dim() > 0) backend_.copy_blocks(cache_->v(l), out.block_copies, cache_->v_block_bytes());
    }
  }
  batch_.clear();
  for (const ScheduledSequence& item : out.scheduled) {
    const Sequence& seq = *item.seq;
    const std::span<const int32_t> tokens(seq.tokens.data() + seq.num_computed_tokens,
                                          static_cast<size_t>(item.num_new_tokens));
    batch_.add_sequence(tokens, seq.num_computed_tokens, kv.block_table(seq.id),
                        item.sample ? BatchInput::Logits::kLast : BatchInput::Logits::kNone);
  }
  logits_.resize(batch_.logits_rows.size() * static_cast<size_t>(model_.config().num_vocab));
  if (batch_.num_tokens() > 0) model_.forward(batch_, *cache_, logits_.data());
  return logits_.data();
}

}  // namespace duet
