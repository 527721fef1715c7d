#include "duet/engine/rank_worker.h"

#include <cstring>
#include <deque>

#include "duet/core/error.h"
#include "duet/core/log.h"
#include "duet/model/executor.h"

namespace duet {

int run_rank_worker(std::shared_ptr<const GgufFile> file, const EngineConfig& config) {
  ParallelGroup& group = *config.parallel;
  Communicator& world = group.world();
  DeviceRegistry devices(DeviceRegistry::Options{config.threads, default_matmul_mode()});
  const KvBudget budget{config.kv_cache_bytes, config.memory_utilization};
  Placement placement = plan_model_placement(*file, config.device_map, devices, budget, config.kv_cache_dtype, config.parallel);
  placement.lora_adapters = config.lora_adapters;  // each rank reads its share of them
  std::unique_ptr<Model> model = load_model(file, std::move(placement));
  spdlog::info("rank {} (stage {}, tensor rank {}): devices\n{}", group.rank(), group.stage(), group.tensor_rank(),
               model->placement().describe());
  const int64_t capacity = kv_pool_blocks(*model, config);
  world.send(&capacity, sizeof(capacity), 0, kPongTag);

  Executor executor(*model);
  std::unique_ptr<PagedKvCache> cache;
  struct Step {
    BatchInput batch;
    std::vector<std::vector<int32_t>> tables;
    std::vector<std::pair<int32_t, int32_t>> copies;
    std::vector<float> logits;
    uint64_t ticket = 0;
  };
  std::deque<std::unique_ptr<Step>> in_flight;
  const auto finish_oldest = [&] {
    std::unique_ptr<Step> step = std::move(in_flight.front());
    in_flight.pop_front();
    executor.wait(step->ticket);
    // Rank 0 reports every rank's step time (duet:rank_step_seconds).
    const double seconds = executor.last_seconds()[static_cast<size_t>(group.stage())];
    world.send(&seconds, sizeof(seconds), 0, kStatsTag);
  };
  const int64_t vocab = model->config().num_vocab;
  std::vector<uint8_t> message;
  for (;;) {
    if (static_cast<int>(in_flight.size()) >= executor.depth()) {
      finish_oldest();
      continue;
    }
    // With steps in flight, look for the next one without waiting; idle, wait up to the timeout.
    const auto wait = in_flight.empty() ? world.timeout() : Communicator::Duration::zero();
    if (!world.recv_message(message, 0, kStepTag, wait)) {
      if (!in_flight.empty()) {
        finish_oldest();
        continue;
      }
      fail(ErrorCode::kUnavailable, "rank {}: rank 0 sent nothing for {:.0f} s (it died or hangs)", group.rank(),
           std::chrono::duration<double>(world.timeout()).count());
    }
    uint32_t kind = 0;
    if (message.size() >= 4) std::memcpy(&kind, message.data(), 4);
    if (message.size() == 4 && kind == kPingMessage) {
      const uint32_t pong = kPingMessage;
      world.send(&pong, 4, 0, kPongTag);
      continue;
    }
    if (message.size() == 4 && kind == kStopMessage) {
      while (!in_flight.empty()) finish_oldest();
      return 0;
    }
    LoraMessage lora;
    if (decode_lora_message(message, lora)) {
      // Between steps: those in flight may still use the slot.
      while (!in_flight.empty()) finish_oldest();
      if (!lora.load) {
        model->remove_lora_adapter(lora.slot);
        continue;
      }
      // An adapter of that name that rank 0 unloaded but has not freed yet (steps of it were in
      // flight there) is unused here now that this rank's steps are done: it goes, or its name
      // would refuse the new one. Rank 0's later word to free its slot finds it empty.
      for (int32_t i = 1; i <= Model::kMaxLoraAdapters; ++i) {
        const LoraAdapter* old = model->lora_adapter(i);
        if (old != nullptr && i != lora.slot && old->name() == lora.source.name) model->remove_lora_adapter(i);
      }
      std::string error;
      try {
        model->add_lora_adapter(lora.source, lora.slot);
      } catch (const std::exception& e) {
        error = e.what();
        spdlog::error("rank {}: LoRA adapter '{}' not loaded: {}", group.rank(), lora.source.name, error);
      }
      std::vector<uint8_t> answer(4 + error.size());
      std::memcpy(answer.data(), &kLoraMessage, 4);
      std::memcpy(answer.data() + 4, error.data(), error.size());
      world.send(answer.data(), answer.size(), 0, kPongTag);
      continue;
    }
    int64_t first = 0;
    if (message.size() >= 8) std::memcpy(&first, message.data(), 8);
    if (message.size() == 4 * sizeof(int64_t) && first == kInitMessage) {
      while (!in_flight.empty()) finish_oldest();
      int64_t init[4];
      std::memcpy(init, message.data(), sizeof(init));
      if (init[1] > capacity) {
        fail(ErrorCode::kResourceExhausted, "rank {}: rank 0 asks for {} KV blocks, this rank has room for {}",
             group.rank(), init[1], capacity);
      }
      cache.reset();
      cache = model->new_kv_cache(init[1], static_cast<int32_t>(init[2]), static_cast<KvDtype>(init[3]));
      (void)cache->commit_blocks(0, kv_commit_count(config, init[1]));  // as rank 0 commits its layers'
      continue;
    }
    if (!cache) fail(ErrorCode::kInternal, "rank {}: a step came before its KV cache", group.rank());
    auto step = std::make_unique<Step>();
    decode_step(message, step->batch, step->tables, step->copies);
    step->logits.resize(step->batch.logits_rows.size() * static_cast<size_t>(vocab));
    step->ticket = executor.launch(step->batch, *cache, step->copies, step->logits.data());
    in_flight.push_back(std::move(step));
  }
}

}  // namespace duet
