#include "duet/engine/model_runner.h"

namespace duet {

ModelRunner::ModelRunner(Model& model, int64_t num_blocks, int32_t block_size, KvDtype kv_dtype)
    : model_(model), cache_(model.new_kv_cache(num_blocks, block_size, kv_dtype)), executor_(model) {}

ModelRunner::~ModelRunner() {
  // The devices must be done with every step's buffers before they go.
  while (!in_flight_.empty()) {
    try {
      finish();
    } catch (...) {  // a failed step during shutdown: nothing to report it to
    }
  }
}

void ModelRunner::launch(const SchedulerOutput& out, const KvCacheManager& kv) {
  std::unique_ptr<Step> step;
  if (!spare_.empty()) {
    step = std::move(spare_.back());
    spare_.pop_back();
  } else {
    step = std::make_unique<Step>();
  }
  BatchInput& batch = step->batch;
  batch.clear();
  batch.attention.block_size = cache_->block_size();
  step->tables.resize(out.scheduled.size());
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledSequence& item = out.scheduled[i];
    const Sequence& seq = *item.seq;
    const std::vector<BlockId>& table = kv.block_table(seq.id);
    step->tables[i].assign(table.begin(), table.end());
    std::span<const int32_t> tokens(seq.tokens.data() + seq.num_computed_tokens,
                                    static_cast<size_t>(item.num_new_tokens - item.num_draft_tokens));
    BatchInput::Logits logits = item.prompt_logits                ? BatchInput::Logits::kAll
                                : !item.sample                    ? BatchInput::Logits::kNone
                                : item.request->params.embedding ? BatchInput::Logits::kLastHidden
                                                                 : BatchInput::Logits::kLast;
    if (item.num_draft_tokens > 0) {
      // Speculative decoding: the drafts follow the last token, and every row's logits are wanted.
      with_drafts_.assign(tokens.begin(), tokens.end());
      with_drafts_.insert(with_drafts_.end(), seq.draft.begin(), seq.draft.begin() + item.num_draft_tokens);
      tokens = with_drafts_;
      logits = BatchInput::Logits::kAll;
    }
    batch.add_sequence(tokens, seq.num_computed_tokens, step->tables[i], logits, item.request->params.lora_adapter);
  }
  step->logits.resize(batch.logits_rows.size() * static_cast<size_t>(model_.config().num_vocab));
  if (model_.num_mtp_layers() > 0) {
    step->hidden.resize(static_cast<size_t>(batch.num_tokens() * model_.config().hidden_size));
    batch.hidden_out = step->hidden.data();
  }
  step->ticket = 0;
  if (batch.num_tokens() > 0) {
    step->ticket = executor_.launch(batch, *cache_, out.block_copies, step->logits.data());
  }
  in_flight_.push_back(std::move(step));
}

const float* ModelRunner::finish() {
  if (finished_) spare_.push_back(std::move(finished_));
  finished_ = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (finished_->ticket != 0) executor_.wait(finished_->ticket);
  return finished_->logits.data();
}

}  // namespace duet
