#include <algorithm>
#include <cmath>
#include <numbers>

#include "duet/backend/backend.h"

namespace duet {
namespace {

// The (fractional) pair index whose wavelength makes `rotations` turns over the original context.
double yarn_correction_dim(double rotations, double dim, double base, double orig_ctx) {
  return dim * std::log(orig_ctx / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

}  // namespace

std::vector<double> rope_frequencies(const RopeParams& p) {
  const int64_t half = p.dim / 2;
  std::vector<double> freq(static_cast<size_t>(half));
  const double dim = static_cast<double>(p.dim);
  double low = 0.0, high = 0.0;
  if (p.yarn_orig_ctx > 0.0) {
    low = std::max(0.0, std::floor(yarn_correction_dim(p.yarn_beta_fast, dim, p.freq_base, p.yarn_orig_ctx)));
    high = std::min(dim - 1.0, std::ceil(yarn_correction_dim(p.yarn_beta_slow, dim, p.freq_base, p.yarn_orig_ctx)));
  }
  for (int64_t i = 0; i < half; ++i) {
    const double original = std::pow(p.freq_base, -2.0 * static_cast<double>(i) / dim);
    const double interpolated = p.freq_scale * original;
    if (p.yarn_orig_ctx <= 0.0) {
      freq[static_cast<size_t>(i)] = interpolated;
      continue;
    }
    // Pairs below `low` turn fast enough to keep their original frequency, pairs above `high`
    // are interpolated, and the ones between are blended linearly.
    const double ramp = std::clamp((static_cast<double>(i) - low) / std::max(0.001, high - low), 0.0, 1.0);
    freq[static_cast<size_t>(i)] = interpolated * ramp + original * (1.0 - ramp);
  }
  if (!p.freq_factors.empty()) {
    for (int64_t i = 0; i < half && i < static_cast<int64_t>(p.freq_factors.size()); ++i) {
      freq[static_cast<size_t>(i)] /= static_cast<double>(p.freq_factors[static_cast<size_t>(i)]);
    }
  }
  return freq;
}

}  // namespace duet
