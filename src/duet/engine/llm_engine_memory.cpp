// LLMEngine under memory pressure (see memory_plan.h and docs/ARCHITECTURE.md): the load-time
// plan, and the ladder of what an out-of-memory step climbs to at run time.
#include <algorithm>

#include "duet/core/error.h"
#include "duet/core/log.h"
#include "duet/core/sysinfo.h"
#include "duet/engine/llm_engine.h"

namespace duet {
namespace {

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Admission stays paused this long after the last out-of-memory event.
constexpr auto kAdmissionPause = std::chrono::seconds(1);

}  // namespace

MemoryPlan LLMEngine::plan_load_memory(const Placement& placement) {
  MemoryNeeds needs;
  needs.kv_dtype = config_.kv_cache_dtype;
  const WeightBytes weights = weight_bytes(*file_);
  has_float_weights_ = weights.as_q8_0 < weights.stored;
  if (parallel()) {
    // Over several ranks each holds a share; the plan is not made there (yet).
    MemoryPlan plan;
    plan.kv_dtype = config_.kv_cache_dtype;
    return plan;
  }
  needs.available_bytes = available_memory_bytes();
  needs.limit_bytes = effective_memory_limit();
  needs.weights_bytes = weights.stored;
  needs.weights_q8_0_bytes = weights.as_q8_0;
  needs.can_requantize = true;
  int kv_devices = 0;
  for (size_t d = 0; d < placement.devices.size(); ++d) {
    const Device& device = *placement.devices[d];
    if (device.remote_rank() >= 0) continue;
    needs.can_requantize = needs.can_requantize && placement.devices[d]->backend().can_requantize_weights();
    if (std::count(placement.attention.begin(), placement.attention.end(), static_cast<int>(d)) > 0) ++kv_devices;
  }
  // The smallest KV pool: the one configured in tokens or bytes, else one request of the longest
  // length served.
  const int64_t max_len = config_.max_model_len > 0 ? config_.max_model_len : file_context_length(*file_);
  const int64_t tokens = config_.kv_cache_tokens > 0 ? config_.kv_cache_tokens : max_len;
  const int64_t rounded = (tokens + config_.block_size - 1) / config_.block_size * config_.block_size;
  if (config_.kv_cache_tokens <= 0 && config_.kv_cache_bytes > 0) {
    needs.kv_bytes = config_.kv_cache_bytes * std::max(1, kv_devices);
    needs.kv_what = fmt::format("--kv-cache-memory {} on {} device{}", config_.kv_cache_bytes, kv_devices,
                                kv_devices == 1 ? "" : "s");
  } else {
    needs.kv_bytes = file_kv_bytes_per_token(*file_, config_.kv_cache_dtype) * rounded;
    try {
      needs.kv_q8_0_bytes = file_kv_bytes_per_token(*file_, KvDtype::kQ8_0) * rounded;
    } catch (const Error&) {
      needs.kv_q8_0_bytes = 0;  // its rows are not whole q8_0 blocks
    }
    needs.kv_what = config_.kv_cache_tokens > 0 ? fmt::format("{} tokens", tokens)
                                                : fmt::format("one request of {} tokens", max_len);
  }
  const MemoryPlan plan = plan_memory(needs, config_.degrade_on_oom);
  if (plan.degraded() || plan.kv_dtype != config_.kv_cache_dtype) {
    spdlog::warn("{}", plan.summary);
  } else {
    spdlog::info("{}", plan.summary);
  }
  if (plan.requantize_weights) {
    for (const auto& d : placement.devices) {
      if (d->remote_rank() < 0) d->backend().set_requantize_weights(true);
    }
  }
  return plan;
}

bool LLMEngine::kv_degradable() const {
  // (Not with the Redis KV tier: its blocks are keyed and laid out by the cache's element type.)
  if (kv_degraded_ || config_.kv_cache_dtype == KvDtype::kQ8_0 || parallel() || remote_) return false;
  try {
    return model_->kv_bytes_per_token(KvDtype::kQ8_0) < model_->kv_bytes_per_token(config_.kv_cache_dtype);
  } catch (const Error&) {
    return false;
  }
}

bool LLMEngine::weights_degradable() const {
  if (weights_degraded_ || !has_float_weights_ || parallel()) return false;
  for (const auto& d : model_->placement().devices) {
    if (d->remote_rank() < 0 && !d->backend().can_requantize_weights()) return false;
  }
  return true;
}

void LLMEngine::publish_memory_state() {
  const int32_t withheld = kv_->num_withheld_blocks();
  const int32_t events = oom_events_;
  const int32_t low = low_memory_events_;
  metrics_.update([&](EngineMetrics& m) {
    m.weights_degraded = weights_degraded_;
    m.kv_degraded = kv_degraded_;
    m.oom_events_total = events;
    m.low_memory_events_total = low;
    m.kv_blocks_withheld = withheld;
  });
}

int32_t LLMEngine::recompute_all() {
  for (const SchedulerOutput& out : in_flight_) {
    for (const ScheduledSequence& item : out.scheduled) item.request->in_flight = false;
  }
  in_flight_.clear();
  steps_finished_ = steps_launched_;  // the cleared steps read nothing any more
  const int32_t n = scheduler_->preempt_all();
  kv_->reset_prefix_cache();
  metrics_.update([&](EngineMetrics& m) { m.preemptions_total += n; });
  return n;
}

int32_t LLMEngine::min_kv_blocks() const {
  return std::max<int32_t>(1, (max_model_len_ + config_.block_size - 1) / config_.block_size);
}

bool LLMEngine::shrink_kv_pool() {
  const int32_t n = std::min(kv_->num_free_blocks() / 2, kv_->num_usable_blocks() - min_kv_blocks());
  if (n < 1) return false;
  const std::vector<BlockId> blocks = kv_->withhold_blocks(n);
  runner_->cache().release_blocks(blocks);
  spdlog::warn("memory: the KV pool shrinks by {} blocks to {} (their memory returned)", blocks.size(),
               kv_->num_usable_blocks());
  return !blocks.empty();
}

bool LLMEngine::degrade_kv() {
  if (!kv_degradable()) return false;
  const KvDtype before = config_.kv_cache_dtype;
  std::unique_ptr<ModelRunner> runner;
  try {
    runner = new_runner(*model_, KvDtype::kQ8_0);
  } catch (const std::exception& e) {
    spdlog::error("memory: the KV cache could not be made as q8_0: {}", e.what());
    return false;
  }
  const int32_t recomputed = recompute_all();
  {
    const std::lock_guard<std::mutex> lock(model_mutex_);
    retired_.push_back(Retired{nullptr, std::move(runner_)});
    config_.kv_cache_dtype = KvDtype::kQ8_0;
    runner_ = std::move(runner);
  }
  // Blocks withheld from the pool stay withheld; their rows in the new cache are never touched.
  kv_degraded_ = true;
  spdlog::warn("memory: degraded the KV cache from {} to q8_0 ({:.1f} MiB for {} blocks; {} requests recomputed)",
               kv_dtype_name(before), mib(static_cast<int64_t>(runner_->cache().bytes())), kv_->config().num_blocks,
               recomputed);
  return true;
}

bool LLMEngine::degrade_weights() {
  if (!weights_degradable()) return false;
  const auto start = Clock::now();
  Placement placement = model_->placement();
  const auto set_requantize = [&](bool on) {
    for (const auto& d : placement.devices) {
      if (d->remote_rank() < 0) d->backend().set_requantize_weights(on);
    }
  };
  set_requantize(true);
  std::unique_ptr<Model> model;
  std::unique_ptr<ModelRunner> runner;
  try {
    model = load_model(file_, placement);  // weights from the mapped file, float matrices as Q8_0
    runner = new_runner(*model, config_.kv_cache_dtype);
  } catch (const std::exception& e) {
    set_requantize(false);
    spdlog::error("memory: the weights could not be re-quantized: {}", e.what());
    return false;
  }
  const int32_t recomputed = recompute_all();
  {
    const std::lock_guard<std::mutex> lock(model_mutex_);
    retired_.push_back(Retired{std::move(model_), std::move(runner_)});
    model_ = std::move(model);
    runner_ = std::move(runner);
  }
  weights_degraded_ = true;
  spdlog::warn("memory: degraded the weights to Q8_0 in {:.2f} s ({} requests recomputed)",
               std::chrono::duration<double>(Clock::now() - start).count(), recomputed);
  return true;
}

PressureState LLMEngine::pressure_state() const {
  PressureState state;
  state.events = oom_events_ + low_memory_events_;
  state.can_shrink_kv = kv_->num_free_blocks() >= 2 && kv_->num_usable_blocks() > min_kv_blocks();
  state.kv_degradable = kv_degradable();
  state.weights_degradable = weights_degradable();
  return state;
}

void LLMEngine::climb(PressureRung rung) {
  // Stop admitting for a while.
  admission_paused_until_ = Clock::now() + kAdmissionPause;
  scheduler_->pause_admission(true);
  switch (rung) {
    case PressureRung::kPause:
      // And make the next step smaller.
      if (scheduler_->preempt_last()) metrics_.update([](EngineMetrics& m) { ++m.preemptions_total; });
      break;
    case PressureRung::kShrinkKv:
      shrink_kv_pool();
      break;
    case PressureRung::kDegradeKv:
      degrade_kv();
      break;
    case PressureRung::kDegradeWeights:
      degrade_weights();
      break;
    case PressureRung::kFail:
      break;
  }
  publish_memory_state();
}

void LLMEngine::check_memory_pressure() {
  if (config_.degrade_on_oom == DegradeMode::kOff || parallel()) return;
  const auto now = Clock::now();
  if (now - last_memory_check_ < std::chrono::milliseconds(200)) return;
  last_memory_check_ = now;
  const int64_t limit = effective_memory_limit();
  if (limit <= 0) return;
  const int64_t room = available_memory_bytes();
  if (room >= limit / 20 || now - last_low_memory_event_ < kAdmissionPause) return;
  last_low_memory_event_ = now;
  const PressureRung rung = next_pressure_rung(pressure_state(), config_.degrade_on_oom);
  ++low_memory_events_;
  if (rung == PressureRung::kFail) {
    spdlog::warn("memory: {:.1f} MiB left under the limit of {:.1f} MiB, and nothing is left to give", mib(room),
                 mib(limit));
    admission_paused_until_ = now + kAdmissionPause;
    scheduler_->pause_admission(true);
    publish_memory_state();
    return;
  }
  spdlog::warn("memory: {:.1f} MiB left under the limit of {:.1f} MiB (less than 5%): {}", mib(room), mib(limit),
               pressure_rung_name(rung));
  climb(rung);
}

void LLMEngine::on_out_of_memory(const SchedulerOutput& out, const std::string& what,
                                 std::vector<RequestOutput>& outputs) {
  const PressureRung rung = next_pressure_rung(pressure_state(), config_.degrade_on_oom);
  ++oom_events_;
  if (rung == PressureRung::kFail) {
    if (config_.degrade_on_oom == DegradeMode::kAuto) {
      spdlog::error("memory: out of memory again ({}) and nothing is left to give", what);
    }
    fail_step(out, what, outputs);
    publish_memory_state();
    return;
  }
  spdlog::warn("memory: a step of {} tokens ran out of memory ({}): {}; its requests are computed again",
               out.num_batched_tokens, what, pressure_rung_name(rung));
  // The step's requests: computed again (their computed tokens did not advance), or failed once
  // they ran out of memory too often.
  Request* last = nullptr;
  for (const ScheduledSequence& item : out.scheduled) {
    if (item.request == last) continue;
    last = item.request;
    Request& r = *item.request;
    if (++r.num_oom_retries > kMaxOomRetries) {
      outputs.push_back(fail_request(r, fmt::format("{} (after {} retries)", what, kMaxOomRetries),
                                     ErrorCode::kUnavailable));
      r.times.finished = Clock::now();
      std::unique_ptr<Request> removed = scheduler_->remove(r.id);
      record_finished(*removed);
    }
  }
  climb(rung);
}

}  // namespace duet
