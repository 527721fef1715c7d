#include "duet/engine/memory_plan.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "duet/core/error.h"

namespace duet {
namespace {

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

DegradeMode parse_degrade_mode(std::string_view text) {
  if (text == "auto") return DegradeMode::kAuto;
  if (text == "off") return DegradeMode::kOff;
  fail(ErrorCode::kInvalidArgument, "--degrade-on-oom is '{}', expected auto or off", text);
}

std::string_view degrade_mode_name(DegradeMode mode) { return mode == DegradeMode::kAuto ? "auto" : "off"; }

MemoryPlan plan_memory(const MemoryNeeds& needs, DegradeMode mode) {
  struct Option {
    bool weights;
    bool kv;
  };
  std::vector<Option> options = {{false, false}};
  const bool weights_shrink = needs.can_requantize && needs.weights_q8_0_bytes < needs.weights_bytes;
  const bool kv_shrinks = needs.kv_dtype != KvDtype::kQ8_0 && needs.kv_q8_0_bytes > 0 &&
                          needs.kv_q8_0_bytes < needs.kv_bytes;
  if (mode == DegradeMode::kAuto) {
    if (weights_shrink) options.push_back({true, false});
    if (kv_shrinks) options.push_back({weights_shrink, true});
  }
  const auto weights_of = [&](const Option& o) { return o.weights ? needs.weights_q8_0_bytes : needs.weights_bytes; };
  const auto kv_of = [&](const Option& o) { return o.kv ? needs.kv_q8_0_bytes : needs.kv_bytes; };
  const std::string room = needs.limit_bytes > 0
                               ? fmt::format("{} of room under the memory limit of {}", mib(needs.available_bytes),
                                             mib(needs.limit_bytes))
                               : fmt::format("{} of available memory", mib(needs.available_bytes));
  for (const Option& o : options) {
    const int64_t needed = weights_of(o) + kv_of(o);
    if (needs.available_bytes > 0 && needed > needs.available_bytes) continue;
    MemoryPlan plan;
    plan.requantize_weights = o.weights;
    plan.kv_dtype = o.kv ? KvDtype::kQ8_0 : needs.kv_dtype;
    plan.needed_bytes = needed;
    if (o.weights || o.kv) {
      plan.summary = fmt::format(
          "memory: the model needs {} as it is ({} of weights + {} of KV cache for {}), more than its {}; degraded "
          "to fit in {}:{}{}", mib(needs.weights_bytes + needs.kv_bytes), mib(needs.weights_bytes), mib(needs.kv_bytes),
          needs.kv_what, room, mib(needed),
          o.weights ? fmt::format(" weights re-quantized to Q8_0 ({})", mib(needs.weights_q8_0_bytes)) : "",
          o.kv ? fmt::format("{} KV cache as q8_0 ({})", o.weights ? "," : "", mib(needs.kv_q8_0_bytes)) : "");
    } else {
      plan.summary = fmt::format("memory: the model needs {} ({} of weights + {} of KV cache for {}); {}", mib(needed),
                                 mib(weights_of(o)), mib(kv_of(o)), needs.kv_what, room);
    }
    return plan;
  }
  const int64_t as_is = needs.weights_bytes + needs.kv_bytes;
  std::string tried;
  if (options.size() > 1) {
    const Option& last = options.back();
    tried = fmt::format("; degraded as far as it goes ({}{}) it still needs {}",
                        last.weights ? "weights as Q8_0" : "", last.kv ? (last.weights ? ", KV as q8_0" : "KV as q8_0") : "",
                        mib(weights_of(last) + kv_of(last)));
  } else if (mode == DegradeMode::kOff && (weights_shrink || kv_shrinks)) {
    tried = fmt::format("; with --degrade-on-oom auto it would load with {}{} ({})",
                        weights_shrink ? "weights re-quantized to Q8_0" : "",
                        kv_shrinks ? (weights_shrink ? " and a q8_0 KV cache" : "a q8_0 KV cache") : "",
                        mib((weights_shrink ? needs.weights_q8_0_bytes : needs.weights_bytes) +
                            (kv_shrinks ? needs.kv_q8_0_bytes : needs.kv_bytes)));
  }
  fail(ErrorCode::kResourceExhausted,
       "the model does not fit in memory: it needs {} ({} of weights + {} of KV cache for {}), and has {}{} "
       "(--memory-limit, the cgroup's limit, --kv-cache-memory and --max-model-len set these)",
       mib(as_is), mib(needs.weights_bytes), mib(needs.kv_bytes), needs.kv_what, room, tried);
}

std::string_view pressure_rung_name(PressureRung rung) {
  switch (rung) {
    case PressureRung::kPause: return "pause admission";
    case PressureRung::kShrinkKv: return "shrink the KV pool";
    case PressureRung::kDegradeKv: return "degrade the KV cache to q8_0";
    case PressureRung::kDegradeWeights: return "degrade the weights to Q8_0";
    case PressureRung::kFail: return "fail the step";
  }
  return "?";
}

PressureRung next_pressure_rung(const PressureState& state, DegradeMode mode) {
  if (mode == DegradeMode::kOff) return PressureRung::kFail;
  const bool applies[] = {true, state.can_shrink_kv, state.kv_degradable, state.weights_degradable};
  for (int32_t r = std::max(0, state.events); r < 4; ++r) {
    if (applies[r]) return static_cast<PressureRung>(r);
  }
  return state.can_shrink_kv ? PressureRung::kShrinkKv : PressureRung::kFail;
}

}  // namespace duet
