// Turns the scheduler's output into one micro-batch of the model: flattens the step into a
// BatchInput (token ids, positions, slot mapping, block tables, the rows that need logits) and
// hands it, with the block copies the cache manager asked for, to the executor over the paged KV
// cache it owns. Steps may be launched before earlier ones finish (up to depth(), one per
// device, so a pipeline of devices stays busy); they finish in launch order.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "duet/cache/kv_cache_manager.h"
#include "duet/engine/scheduler.h"
#include "duet/model/executor.h"
#include "duet/model/model.h"

namespace duet {

class ModelRunner {
 public:
  ModelRunner(Model& model, int64_t num_blocks, int32_t block_size, KvDtype kv_dtype);
  ~ModelRunner();

  // Steps worth launching before waiting for the first: one per device of the model.
  int depth() const { return executor_.depth(); }
  size_t num_in_flight() const { return in_flight_.size(); }
  // Starts a step. `out` must stay valid until its finish().
  void launch(const SchedulerOutput& out, const KvCacheManager& kv);
  // Waits for the oldest launched step and returns the logits of its sequences that sample, one
  // row of num_vocab floats each (1 + num_draft_tokens rows for a sequence with drafts), in the
  // order they appear in its out.scheduled; valid until the next finish(). Rethrows what its forward pass threw.
  const float* finish();
  // launch, then finish.
  const float* execute(const SchedulerOutput& out, const KvCacheManager& kv) {
    launch(out, kv);
    return finish();
  }

  // A device that makes no progress on a step for this long is declared failed (finish throws
  // DeviceFailure); 0: wait as long as it takes.
  void set_hang_timeout(std::chrono::milliseconds timeout) { executor_.set_hang_timeout(timeout); }
  // Whether the devices are done with every step launched (a runner replaced after a failure is
  // destroyed only then).
  bool idle() const { return executor_.idle(); }

  // The batch of the step finish() returned last, and (with an MTP layer loaded) the model's final
  // normalised hidden state of each of its rows, [num_tokens, hidden_size]; null otherwise.
  const BatchInput& finished_batch() const { return finished_->batch; }
  const float* finished_hidden() const { return finished_->hidden.empty() ? nullptr : finished_->hidden.data(); }

  PagedKvCache& cache() { return *cache_; }
  const Executor& executor() const { return executor_; }

 private:
  struct Step {
    BatchInput batch;
    std::vector<std::vector<int32_t>> tables;  // the block tables as they were at launch
    std::vector<float> logits;
    std::vector<float> hidden;  // for MTP drafting
    uint64_t ticket = 0;
  };

  Model& model_;
  std::unique_ptr<PagedKvCache> cache_;
  Executor executor_;
  std::deque<std::unique_ptr<Step>> in_flight_;
  std::vector<std::unique_ptr<Step>> spare_;
  std::unique_ptr<Step> finished_;
  std::vector<int32_t> with_drafts_;  // a sequence's last token and its drafts, while launching
};

}  // namespace duet
