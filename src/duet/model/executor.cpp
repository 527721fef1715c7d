#include "duet/model/executor.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>

#include <fmt/format.h>

#include "duet/backend/fault.h"
#include "duet/core/error.h"
#include "duet/model/decode_graph.h"

namespace duet {

// A micro-batch in flight: its carried buffers (per device, per buffer), its logits on the head
// device when that is not host memory, and how far its segments have got.
struct Executor::Slot {
  uint64_t ticket = 0;  // 0: free
  const BatchInput* batch = nullptr;
  // A decode step run as a graph: the batch padded to its bucket (`batch` points here), the key,
  // and the rows whose logits are returned (the real ones).
  BatchInput padded;
  bool graph = false;
  StepGraphs::Key graph_key;
  size_t logits_rows = 0;
  PagedKvCache* cache = nullptr;
  float* logits = nullptr;
  std::vector<std::pair<int32_t, int32_t>> block_copies;
  std::vector<std::vector<DeviceBuffer>> carried;  // [device][buffer]
  std::vector<std::vector<void*>> pointers;        // [device][buffer]
  DeviceBuffer device_logits;
  std::vector<double> seconds;                     // per device
  // Segment s has finished (run, or skipped after a failure) when done > s.
  std::mutex mutex;
  std::condition_variable changed;
  size_t done = 0;
  std::exception_ptr error;
};

Executor::Executor(Model& model) : model_(model), parallel_(model.placement().parallel.get()) {
  const Placement& p = model.placement();
  if (model.carried().size() >= static_cast<size_t>(kLogitsTag)) {
    fail(ErrorCode::kInternal, "{} carried buffers: message tags have room for {}", model.carried().size(), kLogitsTag);
  }
  const size_t num_devices = p.devices.size();
  for (const auto& d : p.devices) workspaces_.push_back(std::make_unique<Workspace>(*d));
  // Decode steps as graphs: the whole model on one device of this process that has them.
  if (num_devices == 1 && parallel_ == nullptr && p.devices[0]->remote_rank() < 0) graphs_ = p.devices[0]->step_graphs();
  last_seconds_.assign(num_devices, 0.0);
  // Segments, and the copies each needs: a buffer read where the device holding its latest
  // version is another one.
  const std::vector<ModelPart>& parts = model.parts();
  const size_t num_buffers = model.carried().size();
  uses_.assign(num_devices, std::vector<bool>(num_buffers, false));
  std::vector<int> writer(num_buffers, -1);
  std::vector<std::vector<bool>> valid(num_buffers, std::vector<bool>(num_devices, false));
  std::vector<bool> seen(num_devices, false);
  for (size_t i = 0; i < parts.size(); ++i) {
    const int device = p.device_of(parts[i].id);
    const auto d = static_cast<size_t>(device);
    if (segments_.empty() || segments_.back().device != device) {
      segments_.push_back(Segment{device, i, i, !seen[d], {}});
      seen[d] = true;
    }
    Segment& seg = segments_.back();
    seg.end_part = i + 1;
    for (int b : parts[i].reads) {
      uses_[d][static_cast<size_t>(b)] = true;
      if (writer[b] >= 0 && !valid[b][d]) {
        seg.copies.emplace_back(b, writer[b]);
        valid[b][d] = true;
      }
    }
    for (int b : parts[i].writes) {
      uses_[d][static_cast<size_t>(b)] = true;
      writer[b] = device;
      std::fill(valid[b].begin(), valid[b].end(), false);
      valid[b][d] = true;
    }
  }
}

bool Executor::idle() const {
  for (const auto& slot : slots_) {
    const std::lock_guard<std::mutex> lock(slot->mutex);
    if (slot->ticket != 0 && slot->done != segments_.size()) return false;
  }
  return true;
}

Executor::~Executor() {
  // Nothing may still run on the devices when the slots go.
  for (auto& slot : slots_) {
    std::unique_lock<std::mutex> lock(slot->mutex);
    if (slot->ticket != 0) slot->changed.wait(lock, [&] { return slot->done == segments_.size(); });
  }
}

void Executor::prepare(Slot& slot, const BatchInput& batch) {
  const Placement& p = model_.placement();
  const std::vector<CarriedBuffer>& carried = model_.carried();
  const int64_t n = batch.num_tokens();
  slot.carried.resize(p.devices.size());
  slot.pointers.resize(p.devices.size());
  for (size_t d = 0; d < p.devices.size(); ++d) {
    slot.carried[d].resize(carried.size());
    slot.pointers[d].assign(carried.size(), nullptr);
    if (p.devices[d]->remote_rank() >= 0) continue;  // another process holds its buffers
    for (size_t b = 0; b < carried.size(); ++b) {
      if (!uses_[d][b]) continue;
      const auto bytes = static_cast<size_t>(n * carried[b].bytes_per_token);
      DeviceBuffer& buf = slot.carried[d][b];
      if (buf.size() < bytes) {
        buf = DeviceBuffer();
        buf = p.devices[d]->allocate(bytes + bytes / 4, MemoryKind::kScratch);
      }
      slot.pointers[d][b] = buf.data();
    }
  }
  Device& head = *p.devices[static_cast<size_t>(p.head)];
  const size_t logit_bytes = batch.logits_rows.size() * static_cast<size_t>(model_.config().num_vocab) * sizeof(float);
  // A padded step's logits (more rows than the caller's buffer holds) go there first on any device.
  if ((!head.host_accessible() || slot.graph) && head.remote_rank() < 0 && slot.device_logits.size() < logit_bytes) {
    slot.device_logits = DeviceBuffer();
    slot.device_logits = head.allocate(logit_bytes, MemoryKind::kScratch);
  }
  slot.seconds.assign(p.devices.size(), 0.0);
}

void Executor::run_segment(size_t s, Slot& slot) {
  const Placement& p = model_.placement();
  const Segment& seg = segments_[s];
  const auto d = static_cast<size_t>(seg.device);
  Device& device = *p.devices[d];
  const BatchInput& batch = *slot.batch;
  PagedKvCache& cache = *slot.cache;
  const int64_t n = batch.num_tokens();
  const size_t logit_bytes = slot.logits_rows * static_cast<size_t>(model_.config().num_vocab) * sizeof(float);
  if (device.remote_rank() >= 0) {
    // Another rank runs this segment: it gets the buffers it reads that were written here, and
    // rank 0 gets the logits when the segment is the last.
    for (const auto& [b, from] : seg.copies) {
      Device& src = *p.devices[static_cast<size_t>(from)];
      if (src.remote_rank() >= 0) continue;  // from one other rank to another
      const auto bytes = static_cast<size_t>(n * model_.carried()[static_cast<size_t>(b)].bytes_per_token);
      parallel_->world().send(slot.pointers[static_cast<size_t>(from)][static_cast<size_t>(b)], bytes,
                              device.remote_rank(), message_tag(slot.ticket, b));
    }
    if (s + 1 == segments_.size() && parallel_->rank() == 0 && logit_bytes > 0) {
      parallel_->world().recv(slot.logits, logit_bytes, device.remote_rank(), message_tag(slot.ticket, kLogitsTag));
    }
    return;
  }
  const std::unique_lock<std::mutex> held = device.hold();
  const auto start = Device::Clock::now();
  device.begin_work();
  if (seg.first_on_device && !slot.block_copies.empty()) {
    for (int64_t l = 0; l < cache.num_layers(); ++l) {
      if (&cache.device(l) != &device) continue;
      device.backend().copy_blocks(cache.k(l), slot.block_copies, cache.k_block_bytes());
      if (cache.v_dim() > 0) device.backend().copy_blocks(cache.v(l), slot.block_copies, cache.v_block_bytes());
    }
  }
  if (!seg.copies.empty()) {
    int64_t copied = 0;
    for (const auto& [b, from] : seg.copies) {
      const auto bytes = static_cast<size_t>(n * model_.carried()[static_cast<size_t>(b)].bytes_per_token);
      Device& src = *p.devices[static_cast<size_t>(from)];
      if (src.remote_rank() >= 0) {
        parallel_->world().recv(slot.pointers[d][static_cast<size_t>(b)], bytes, src.remote_rank(),
                                message_tag(slot.ticket, b));
      } else {
        device.copy_from_device(src, slot.pointers[d][static_cast<size_t>(b)],
                                slot.pointers[static_cast<size_t>(from)][static_cast<size_t>(b)], bytes);
      }
      copied += static_cast<int64_t>(bytes);
    }
    device.record_copy(std::chrono::duration<double>(Device::Clock::now() - start).count(), copied);
  }
  const bool last = s + 1 == segments_.size();
  float* out = nullptr;
  if (last) out = device.host_accessible() && !slot.graph ? slot.logits : slot.device_logits.as<float>();
  PartContext ctx{batch, device, device.backend(), *workspaces_[d], slot.pointers[d], cache, out};
  const std::vector<ModelPart>& parts = model_.parts();
  const auto run_parts = [&] {
    for (size_t i = seg.first_part; i < seg.end_part; ++i) {
      parts[i].run(ctx);
      device.heartbeat();
    }
  };
  if (slot.graph) {
    graphs_->run(slot.graph_key, run_parts);
  } else {
    run_parts();
  }
  if (last && out != slot.logits && logit_bytes > 0) device.copy_to_host(slot.logits, out, logit_bytes);
  // The last stage's first tensor rank gives rank 0 the logits (its stage's other ranks have the
  // same ones).
  if (last && parallel_ != nullptr && parallel_->rank() != 0 && parallel_->tensor_rank() == 0 && logit_bytes > 0) {
    parallel_->world().send(slot.logits, logit_bytes, 0, message_tag(slot.ticket, kLogitsTag));
  }
  const auto end = Device::Clock::now();
  device.record_busy(start, end);
  slot.seconds[d] += std::chrono::duration<double>(end - start).count();
}

uint64_t Executor::launch(const BatchInput& batch, PagedKvCache& cache,
                          std::span<const std::pair<int32_t, int32_t>> block_copies, float* logits) {
  batch.validate(model_.config().num_vocab, cache.num_slots(), Model::kMaxLoraAdapters);
  Slot* slot = nullptr;
  for (auto& s : slots_) {
    if (s->ticket == 0) {
      slot = s.get();
      break;
    }
  }
  if (slot == nullptr) slot = slots_.emplace_back(std::make_unique<Slot>()).get();
  // A decode step on a device with graphs runs padded to its bucket (the other ranks, if any,
  // are sent the batch as it is).
  const int64_t bucket = graphs_ != nullptr ? decode_graph_bucket(batch) : 0;
  slot->graph = bucket > 0;
  slot->logits_rows = batch.logits_rows.size();
  if (slot->graph) {
    pad_decode_batch(batch, bucket, slot->padded);
    slot->graph_key = StepGraphs::Key{bucket, decode_graph_context(batch)};
  }
  const BatchInput& run_batch = slot->graph ? slot->padded : batch;
  prepare(*slot, run_batch);
  slot->ticket = next_ticket_++;
  slot->batch = &run_batch;
  slot->cache = &cache;
  slot->logits = logits;
  slot->block_copies.assign(block_copies.begin(), block_copies.end());
  slot->done = 0;
  slot->error = nullptr;
  if (parallel_ != nullptr && parallel_->rank() == 0 && parallel_->world().size() > 1) {
    // Every other rank runs the same micro-batch, with the same ticket.
    encode_step(batch, block_copies, message_);
    for (int r = 1; r < parallel_->world().size(); ++r) {
      parallel_->world().send(message_.data(), message_.size(), r, kStepTag);
    }
  }
  if (model_.placement().devices.size() == 1) {
    // The plain loop, now.
    try {
      for (size_t s = 0; s < segments_.size(); ++s) run_segment(s, *slot);
    } catch (...) {
      slot->error = std::current_exception();
    }
    slot->done = segments_.size();
    return slot->ticket;
  }
  // Each device's queue takes its segments in launch order; a segment waits for the one before
  // it of the same micro-batch, which was queued earlier, so the queues never wait in a circle.
  for (size_t s = 0; s < segments_.size(); ++s) {
    Device& device = *model_.placement().devices[static_cast<size_t>(segments_[s].device)];
    device.submit([this, s, slot] {
      std::exception_ptr error;
      {
        std::unique_lock<std::mutex> lock(slot->mutex);
        slot->changed.wait(lock, [&] { return slot->done >= s; });  // in order, even after a failure
        error = slot->error;
      }
      if (!error) {
        try {
          run_segment(s, *slot);
        } catch (...) {
          error = std::current_exception();
        }
      }
      {
        const std::lock_guard<std::mutex> lock(slot->mutex);
        if (error && !slot->error) slot->error = error;
        slot->done = s + 1;
      }
      slot->changed.notify_all();
    });
  }
  return slot->ticket;
}

void Executor::wait(uint64_t ticket) {
  Slot* slot = nullptr;
  for (auto& s : slots_) {
    if (s->ticket == ticket) slot = s.get();
  }
  if (slot == nullptr) fail(ErrorCode::kInternal, "no micro-batch {} is in flight", ticket);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(slot->mutex);
    const auto finished = [&] { return slot->done == segments_.size(); };
    // The watchdog: the device that has the micro-batch's next segment must make progress.
    while (!slot->changed.wait_for(lock, std::chrono::milliseconds(50), finished)) {
      if (hang_timeout_.count() <= 0) continue;
      Device& device = *model_.placement().devices[static_cast<size_t>(segments_[slot->done].device)];
      const auto quiet = Device::Clock::now() - device.last_progress();
      if (quiet > hang_timeout_ || device.failed()) {
        const std::string reason =
            device.failed() ? device.failure()
                            : fmt::format("no progress for {:.1f} s (a micro-batch waited for it)",
                                          std::chrono::duration<double>(quiet).count());
        device.mark_failed(reason);
        // The slot stays in flight until the device lets its work go; abandoned() tells.
        throw DeviceFailure(device.name(), device.failure());
      }
    }
    error = slot->error;
    slot->ticket = 0;
  }
  last_seconds_ = slot->seconds;
  if (error) std::rethrow_exception(error);
}

void Executor::run(std::span<const BatchInput> micro_batches, PagedKvCache& cache, float* logits) {
  std::vector<uint64_t> tickets;
  std::exception_ptr first;
  float* out = logits;
  for (const BatchInput& b : micro_batches) {
    try {
      tickets.push_back(launch(b, cache, {}, out));
    } catch (...) {
      first = std::current_exception();
      break;
    }
    out += b.logits_rows.size() * static_cast<size_t>(model_.config().num_vocab);
  }
  for (uint64_t t : tickets) {
    try {
      wait(t);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace duet
