// Turns the scheduler's output into one forward pass: flattens the step into a BatchInput
// (token ids, positions, slot mapping, block tables, the rows that need logits), runs the block
// copies the cache manager asked for, and runs the model over the paged KV cache it owns.
#pragma once

#include <memory>
#include <vector>

#include "duet/backend/backend.h"
#include "duet/cache/kv_cache_manager.h"
#include "duet/engine/scheduler.h"
#include "duet/model/model.h"

namespace duet {

class ModelRunner {
 public:
  ModelRunner(Model& model, Backend& backend, int64_t num_blocks, int32_t block_size, KvDtype kv_dtype);

  // Runs the step. Returns the logits of the scheduled sequences that sample, one row of
  // num_vocab floats each, in the order they appear in out.scheduled; valid until the next call.
  const float* execute(const SchedulerOutput& out, const KvCacheManager& kv);

  PagedKvCache& cache() { return *cache_; }

 private:
  Model& model_;
  Backend& backend_;
  std::unique_ptr<PagedKvCache> cache_;
  BatchInput batch_;
  std::vector<float> logits_;
};

}  // namespace duet
