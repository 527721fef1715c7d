// Memory limits and degradation (see docs/ARCHITECTURE.md): what the engine does when a model
// does not fit under the memory it may take. At load, plan_memory picks the least degradation
// that fits (the model as it is, its float weights re-quantized to Q8_0, then also a q8_0 KV
// cache); at run time, PressureLadder says which rung each out-of-memory event climbs to.
// Both are plain decisions over numbers, unit-tested without a model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "duet/backend/backend.h"

namespace duet {

// --degrade-on-oom: auto (degrade rather than fail) or off (fail instead).
enum class DegradeMode { kAuto, kOff };
// "auto" or "off"; throws kInvalidArgument naming the value otherwise.
DegradeMode parse_degrade_mode(std::string_view text);
std::string_view degrade_mode_name(DegradeMode mode);

// What a model needs, estimated from its file before any weight is read, and the room it has.
struct MemoryNeeds {
  int64_t available_bytes = 0;  // room under the limit now
  int64_t limit_bytes = 0;      // the limit named in messages (0: only the host's free memory)
  int64_t weights_bytes = 0;    // the weights as stored
  int64_t weights_q8_0_bytes = 0;  // with the float matrices re-quantized to Q8_0 (= weights_bytes: none)
  bool can_requantize = true;   // the devices' backends can re-quantize weights
  KvDtype kv_dtype = KvDtype::kF16;  // as configured
  int64_t kv_bytes = 0;         // the smallest KV pool the engine runs with, in kv_dtype
  int64_t kv_q8_0_bytes = 0;    // the same in q8_0 (0: not possible, or no smaller)
  std::string kv_what;          // what that pool is, for messages ("one request of 4096 tokens")
};

struct MemoryPlan {
  bool requantize_weights = false;
  KvDtype kv_dtype = KvDtype::kF16;
  int64_t needed_bytes = 0;  // weights + KV under this plan
  bool degraded() const { return requantize_weights; }
  // One line for the log: what was chosen and the numbers.
  std::string summary;
};

// The first plan that fits in needs.available_bytes, in order: as configured; (auto only) float
// weights as Q8_0 when there are any and the devices can; then also a q8_0 KV cache when the
// model allows it. Throws kResourceExhausted naming the needed bytes (weights and KV apart), the
// room and the limit when none fits (with off: when the first does not). available_bytes <= 0
// (unknown) plans nothing.
MemoryPlan plan_memory(const MemoryNeeds& needs, DegradeMode mode);

// The runtime ladder: each out-of-memory event in a step climbs one rung (with degradation
// auto); rungs that cannot apply (nothing to shrink, KV or weights already degraded or not
// degradable) are passed over.
enum class PressureRung {
  kPause,           // stop admitting new requests for a while; the step's requests are recomputed
  kShrinkKv,        // also withhold half of the free KV blocks and return their pages
  kDegradeKv,       // also re-make the KV cache as q8_0 (every request recomputed)
  kDegradeWeights,  // also re-load the weights re-quantized to Q8_0 (every request recomputed)
  kFail,            // nothing left to give: the step's requests fail
};
std::string_view pressure_rung_name(PressureRung rung);

struct PressureState {
  int32_t events = 0;         // out-of-memory events so far
  bool can_shrink_kv = true;  // free blocks beyond what the running requests need
  bool kv_degradable = true;  // not degraded yet and the model's heads allow q8_0
  bool weights_degradable = true;  // not degraded yet, float matrices exist, the devices can
};
// The rung for the next event. Event 1 pauses; event 2 shrinks the pool; event 3 degrades the
// KV cache, event 4 the weights, each when it can (else the next that can); later events shrink
// again while something can be shrunk, and fail the step otherwise. With off: always kFail.
PressureRung next_pressure_rung(const PressureState& state, DegradeMode mode);

}  // namespace duet
