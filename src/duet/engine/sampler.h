// Next-token choice from logits. Temperature 0 is greedy; otherwise top-k, then top-p, then a
// draw from a generator seeded per request, so the same seed gives the same text.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "duet/core/random.h"

namespace duet {

struct SamplingParams {
  float temperature = 1.0f;
  int32_t top_k = 0;      // 0: no limit
  float top_p = 1.0f;     // 1: no limit
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

}  // namespace duet
