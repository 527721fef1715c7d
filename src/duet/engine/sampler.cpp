#include "duet/engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "duet/core/error.h"

namespace duet {
Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  if (!(params.temperature >= 0.0f)) {
    fail(ErrorCode::kInvalidArgument, "temperature is {}, expected a number >= 0", params.temperature);
  }
  if (params.top_k < 0) fail(ErrorCode::kInvalidArgument, "top_k is {}, expected >= 0", params.top_k);
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    fail(ErrorCode::kInvalidArgument, "top_p is {}, expected a number in (0, 1]", params.top_p);
  }
}

int32_t Sampler::sample(std::span<const float> logits) {
  const auto n = static_cast<int32_t>(logits.size());
  if (n == 0) fail(ErrorCode::kInternal, "sampling from empty logits");
  if (params_.temperature == 0.0f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  candidates_.clear();
  candidates_.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) candidates_.emplace_back(logits[static_cast<size_t>(i)], i);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(keep), candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);
  // Softmax at the temperature over what is left.
  const float max = candidates_.front().first;
  double sum = 0.0;
  for (auto& c : candidates_) {
    c.first = std::exp((c.first - max) / params_.temperature);
    sum += c.first;
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    size_t cut = candidates_.size();
    for (size_t i = 0; i < candidates_.size(); ++i) {
      cumulative += candidates_[i].first / sum;
      if (cumulative >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    candidates_.resize(cut);
    sum = 0.0;
    for (const auto& c : candidates_) sum += c.first;
  }
  double r = rng_.uniform() * sum;
  for (const auto& c : candidates_) {
    r -= c.first;
    if (r < 0.0) return c.second;
  }
  return candidates_.back().second;
}

}  // namespace duet
