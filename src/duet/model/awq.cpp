#include "duet/model/awq.h"

#include <algorithm>
#include <cmath>

#include "duet/core/error.h"
#include "duet/core/quant.h"

namespace duet {

std::vector<float> ActivationStats::mean_abs() const {
  std::vector<float> mean(static_cast<size_t>(cols), 0.0f);
  if (num_rows == 0) return mean;
  for (int64_t c = 0; c < cols; ++c) {
    mean[static_cast<size_t>(c)] = static_cast<float>(sum_abs[static_cast<size_t>(c)] / static_cast<double>(num_rows));
  }
  return mean;
}

const ActivationStats& ActivationRecorder::stats(const std::string& name) const {
  const auto it = stats_.find(name);
  if (it == stats_.end()) fail(ErrorCode::kNotFound, "no activations were recorded for '{}'", name);
  return it->second;
}

void ActivationRecorder::matmul(const WeightView& w, const float* x, int64_t m, float* y) {
  ActivationStats& s = stats_[std::string(w.name)];
  if (s.cols == 0) {
    s.cols = w.cols;
    s.sum_abs.assign(static_cast<size_t>(w.cols), 0.0);
    s.keep_samples = !keep_samples_ || keep_samples_(w.name);
  } else if (s.cols != w.cols) {
    fail(ErrorCode::kInternal, "'{}' was multiplied with {} and {} columns", w.name, s.cols, w.cols);
  }
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * w.cols;
    for (int64_t c = 0; c < w.cols; ++c) s.sum_abs[static_cast<size_t>(c)] += std::fabs(row[c]);
  }
  s.num_rows += m;
  const int64_t keep = s.keep_samples ? std::min(m, max_samples_ - s.num_samples()) : 0;
  if (keep > 0) s.samples.insert(s.samples.end(), x, x + keep * w.cols);
  ForwardingBackend::matmul(w, x, m, y);
}

namespace {

void check_group(std::span<const AwqMatrix> group, int64_t cols, const ActivationStats& input, DType qtype) {
  if (input.num_samples() == 0) fail(ErrorCode::kInvalidArgument, "AWQ needs calibration samples; none were recorded");
  if (input.cols != cols) {
    fail(ErrorCode::kInvalidArgument, "the calibration activations have {} channels, the weights {} columns", input.cols,
         cols);
  }
  if (cols % traits(qtype).block_size != 0) {
    fail(ErrorCode::kInvalidArgument, "{} columns are not a multiple of {}'s block of {}", cols, dtype_name(qtype),
         traits(qtype).block_size);
  }
  if (group.empty()) fail(ErrorCode::kInvalidArgument, "AWQ needs at least one weight matrix");
}

// The group's outputs on the samples, unquantized: [matrix][n, rows].
std::vector<std::vector<float>> reference_outputs(Backend& backend, std::span<const AwqMatrix> group, int64_t cols,
                                                  const ActivationStats& input) {
  const int64_t n = input.num_samples();
  std::vector<std::vector<float>> out;
  for (const AwqMatrix& m : group) {
    std::vector<float>& y = out.emplace_back(static_cast<size_t>(n * m.rows));
    backend.matmul(WeightView{"awq reference", DType::kF32, m.rows, cols, m.data}, input.samples.data(), n, y.data());
  }
  return out;
}

double quantized_error(Backend& backend, std::span<const AwqMatrix> group, int64_t cols, const ActivationStats& input,
                       std::span<const float> scales, DType qtype, const std::vector<std::vector<float>>& reference) {
  const int64_t n = input.num_samples();
  std::vector<float> x(input.samples);
  if (!scales.empty()) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(r * cols + c)] /= scales[static_cast<size_t>(c)];
    }
  }
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<float> y;
  std::vector<uint8_t> q;
  double sum = 0.0;
  int64_t count = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    const AwqMatrix& m = group[i];
    const size_t rb = row_size(qtype, cols);
    q.resize(rb * static_cast<size_t>(m.rows));
    for (int64_t r = 0; r < m.rows; ++r) {
      const float* w = m.data + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        row[static_cast<size_t>(c)] = scales.empty() ? w[c] : w[c] * scales[static_cast<size_t>(c)];
      }
      quantize_row_ref(qtype, row.data(), q.data() + static_cast<size_t>(r) * rb, cols);
    }
    y.resize(static_cast<size_t>(n * m.rows));
    backend.matmul(WeightView{"awq candidate", qtype, m.rows, cols, q.data()}, x.data(), n, y.data());
    for (size_t k = 0; k < y.size(); ++k) {
      const double e = static_cast<double>(y[k]) - reference[i][k];
      sum += e * e;
    }
    count += n * m.rows;
  }
  return sum / static_cast<double>(count);
}

}  // namespace

double awq_output_error(Backend& backend, std::span<const AwqMatrix> group, int64_t cols, const ActivationStats& input,
                        std::span<const float> scales, DType qtype) {
  check_group(group, cols, input, qtype);
  if (!scales.empty() && static_cast<int64_t>(scales.size()) != cols) {
    fail(ErrorCode::kInvalidArgument, "{} scales for {} columns", scales.size(), cols);
  }
  return quantized_error(backend, group, cols, input, scales, qtype, reference_outputs(backend, group, cols, input));
}

AwqResult awq_search(Backend& backend, std::span<const AwqMatrix> group, int64_t cols, const ActivationStats& input,
                     int grid, DType qtype) {
  check_group(group, cols, input, qtype);
  if (grid < 1) fail(ErrorCode::kInvalidArgument, "the AWQ grid is {}, expected at least 1", grid);
  const std::vector<std::vector<float>> reference = reference_outputs(backend, group, cols, input);
  // A channel that never saw an activation gets the smallest positive mean, so every s is finite.
  std::vector<float> mean = input.mean_abs();
  float floor = 0.0f;
  for (float v : mean) {
    if (v > 0.0f && (floor == 0.0f || v < floor)) floor = v;
  }
  for (float& v : mean) v = std::max(v, floor > 0.0f ? floor : 1.0f);

  AwqResult best;
  best.scales.assign(static_cast<size_t>(cols), 1.0f);
  best.rtn_error = quantized_error(backend, group, cols, input, {}, qtype, reference);
  best.error = best.rtn_error;
  std::vector<float> s(static_cast<size_t>(cols));
  for (int i = 1; i < grid; ++i) {
    const float alpha = static_cast<float>(i) / static_cast<float>(grid);
    float lo = 0.0f, hi = 0.0f;
    for (size_t c = 0; c < s.size(); ++c) {
      s[c] = std::pow(mean[c], alpha);
      lo = c == 0 ? s[c] : std::min(lo, s[c]);
      hi = c == 0 ? s[c] : std::max(hi, s[c]);
    }
    const float norm = std::sqrt(lo * hi);
    for (float& v : s) v /= norm;
    const double error = quantized_error(backend, group, cols, input, s, qtype, reference);
    if (error < best.error) {
      best.error = error;
      best.alpha = alpha;
      best.scales = s;
    }
  }
  return best;
}

}  // namespace duet
