// Runs a model's parts over micro-batches on their devices. Consecutive parts on one device form
// a segment; before a segment runs, the carried buffers it reads are copied from the device that
// wrote them last. With one device, a micro-batch runs on the calling thread when launched. With
// several, each device runs its segments on its own queue, in the order they were launched: a
// segment waits only for the segment before it of the same micro-batch, so device B works on
// micro-batch i while device A works on i + 1 (a pipeline), and the expert device of a MoE layer
// works on one micro-batch's experts while the layer's device goes on with another.
//
// Over several ranks (Placement::parallel), the stages of other ranks are rank devices: a
// segment there runs in that process, so here it only sends it the carried buffers it reads (and
// a segment here receives those it reads from there), each message tagged with the micro-batch's
// ticket and the buffer. Rank 0 sends every launched micro-batch (encode_step) to the other
// ranks, whose executors launch the same ones in the same order (same tickets); the last stage
// sends rank 0 the logits.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "duet/model/model.h"
#include "duet/model/parallel.h"

namespace duet {

class Executor {
 public:
  explicit Executor(Model& model);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // How many micro-batches keep every device busy: one per device of the placement.
  int depth() const { return static_cast<int>(model_.placement().devices.size()); }

  // Starts one micro-batch (validated first) after those already started: first the KV block
  // copies each device makes for its layers (copy-on-write), then the parts; its logits rows go
  // to `logits` (host memory, num_vocab floats each) by the time wait() returns. `batch`, `cache`
  // and `logits` must stay valid until then. Returns the ticket to wait for.
  uint64_t launch(const BatchInput& batch, PagedKvCache& cache,
                  std::span<const std::pair<int32_t, int32_t>> block_copies, float* logits);
  // Waits for a launched micro-batch; rethrows the first error one of its parts threw. With a
  // hang timeout, a device that has this micro-batch's next segment and makes no progress for
  // that long is declared failed, and wait throws DeviceFailure (the micro-batch stays in flight
  // until the device lets it go: see idle()).
  void wait(uint64_t ticket);
  // 0 (the default): wait as long as it takes.
  void set_hang_timeout(std::chrono::milliseconds timeout) { hang_timeout_ = timeout; }
  // Whether no micro-batch is still running or queued on a device.
  bool idle() const;
  // Each micro-batch launched, then all waited for; logits one micro-batch after another.
  void run(std::span<const BatchInput> micro_batches, PagedKvCache& cache, float* logits);

  struct Segment {
    int device = 0;
    size_t first_part = 0, end_part = 0;
    bool first_on_device = false;               // makes the device's block copies
    std::vector<std::pair<int, int>> copies;    // carried buffers to copy in: (buffer, from device)
  };
  const std::vector<Segment>& segments() const { return segments_; }
  // Per device of the placement: seconds its segments took for the micro-batch waited for last.
  const std::vector<double>& last_seconds() const { return last_seconds_; }

 private:
  struct Slot;
  static constexpr int kLogitsTag = 63;
  static int message_tag(uint64_t ticket, int buffer) { return static_cast<int>((ticket & 1023) << 6) | buffer; }
  void prepare(Slot& slot, const BatchInput& batch);
  void run_segment(size_t s, Slot& slot);

  Model& model_;
  ParallelGroup* parallel_;  // null: one process
  StepGraphs* graphs_ = nullptr;  // the one device's decode graphs, when it has them
  std::vector<uint8_t> message_;  // rank 0: the step sent to the others
  std::vector<Segment> segments_;
  std::vector<std::vector<bool>> uses_;                  // [device][buffer]
  std::vector<std::unique_ptr<Workspace>> workspaces_;   // per device
  std::vector<std::unique_ptr<Slot>> slots_;             // micro-batches in flight (or free)
  uint64_t next_ticket_ = 1;
  std::vector<double> last_seconds_;
  std::chrono::milliseconds hang_timeout_{0};
};

// A step as rank 0 sends it: its BatchInput (with its block tables' contents) and block copies;
// an empty batch (no token) asks the ranks to stop. decode_step rebuilds it, its block tables in
// `tables`; throws kDataLoss for a message that does not parse.
void encode_step(const BatchInput& batch, std::span<const std::pair<int32_t, int32_t>> block_copies,
                 std::vector<uint8_t>& out);
void decode_step(const std::vector<uint8_t>& message, BatchInput& batch, std::vector<std::vector<int32_t>>& tables,
                 std::vector<std::pair<int32_t, int32_t>>& block_copies);

// A LoRA adapter that rank 0 loaded into `slot` at run time (load: the other ranks read `source`
// into the same slot, each its share, and answer on kPongTag: kLoraMessage, then the error's
// text, none when it loaded), or removed from it (no answer). Sent on kStepTag between steps.
struct LoraMessage {
  bool load = false;
  int32_t slot = 0;
  LoraSource source;
};
void encode_lora_message(const LoraMessage& m, std::vector<uint8_t>& out);
// False when `message` is not a LoRA message; throws kDataLoss for one that does not parse.
bool decode_lora_message(const std::vector<uint8_t>& message, LoraMessage& m);

}  // namespace duet
