// Activation-aware weight quantization (AWQ, Lin et al. 2023): the input channels that carry large
// activations matter most, so before rounding a weight matrix to int4 its columns are multiplied
// by s = mean|x|^alpha (and the activations divided by s, folded into the op that produces them),
// with alpha chosen per group of matrices to minimise the error of their outputs on calibration
// activations. Here: how the activations are recorded (a Backend wrapper that sees every matmul)
// and the search for one group; which groups a model has and where 1/s is folded is the
// caller's business (cli/quantize_awq.cpp for the llama-like architectures).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "duet/backend/backend.h"

namespace duet {

// What a model fed one weight matrix during calibration: every row's |x| summed per input
// channel, and the first rows themselves (up to the recorder's limit) to measure output errors on.
struct ActivationStats {
  int64_t cols = 0;
  int64_t num_rows = 0;
  std::vector<double> sum_abs;  // [cols]
  std::vector<float> samples;   // [num_samples(), cols]
  bool keep_samples = true;     // whether the recorder keeps rows for this weight

  int64_t num_samples() const { return cols > 0 ? static_cast<int64_t>(samples.size()) / cols : 0; }
  // mean |x| per input channel over every row seen.
  std::vector<float> mean_abs() const;
};

// A Backend that forwards every op to `inner` and records the activations of each matmul, keyed
// by the weight's name (views of one tensor's rows count as that tensor). Keeps at most
// `max_samples` rows per weight, and only for the weights `keep_samples` accepts (null: all;
// matrices that read the same input need them once); the means are kept for every weight.
class ActivationRecorder final : public ForwardingBackend {
 public:
  using SampleFilter = std::function<bool(std::string_view weight_name)>;
  ActivationRecorder(Backend& inner, int64_t max_samples, SampleFilter keep_samples = nullptr)
      : ForwardingBackend(inner), max_samples_(max_samples), keep_samples_(std::move(keep_samples)) {}

  // The stats of weight `name`; throws kNotFound when the model never multiplied by it.
  const ActivationStats& stats(const std::string& name) const;
  const std::map<std::string, ActivationStats>& all_stats() const { return stats_; }

  std::string name() const override { return "recording " + ForwardingBackend::name(); }
  void matmul(const WeightView& w, const float* x, int64_t m, float* y) override;
  // Head by head through matmul, so that each head's activations are recorded.
  void matmul_heads(const WeightView& w, const HeadRows& s, const float* x, int64_t x_stride, int64_t x_head, int64_t m,
                    float* y, int64_t y_stride, int64_t y_head, float* scratch) override {
    Backend::matmul_heads(w, s, x, x_stride, x_head, m, y, y_stride, y_head, scratch);
  }

 private:
  int64_t max_samples_;
  SampleFilter keep_samples_;
  std::map<std::string, ActivationStats> stats_;
};

// A weight matrix in f32, `rows` x `cols` row-major (the group's cols are shared).
struct AwqMatrix {
  const float* data = nullptr;
  int64_t rows = 0;
};

struct AwqResult {
  float alpha = 0.0f;
  std::vector<float> scales;  // s per input channel: quantize W diag(s), feed x / s
  double error = 0.0;         // mean squared output error with these scales
  double rtn_error = 0.0;     // the same for alpha 0 (s = 1: plain round-to-nearest)
};

// Mean squared error, over the calibration samples of `input` and every output of the group's
// matrices, between W x and Q(W diag(s)) (x / s), Q rounding rows to `qtype` (scales empty: s = 1).
// `backend` should compute exactly (MatmulMode::kExact) so that only the weights' rounding counts.
double awq_output_error(Backend& backend, std::span<const AwqMatrix> group, int64_t cols, const ActivationStats& input,
                        std::span<const float> scales, DType qtype);

// Tries alpha = i / grid for i in [0, grid): s = mean|x|^alpha normalised so that
// max(s) * min(s) = 1 (as AutoAWQ does), and keeps the alpha of least output error. alpha 0 is
// plain round-to-nearest, so the result is never worse than that on the calibration samples.
// Throws kInvalidArgument when `input` has no samples or other columns than the group.
AwqResult awq_search(Backend& backend, std::span<const AwqMatrix> group, int64_t cols, const ActivationStats& input,
                     int grid, DType qtype);

}  // namespace duet
