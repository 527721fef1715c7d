// AWQ's pieces on their own: the recording backend and the scale search for one group of matrices.
#include "duet/model/awq.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"

namespace duet {
namespace {

std::vector<float> uniform(int64_t n, float half_width, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>((rng.uniform() * 2.0 - 1.0) * half_width);
  return v;
}

// Calibration samples [n, cols]: unit-scale activations, with `outliers` channels (every
// cols / outliers-th) `scale` times larger, as LLM activations have.
ActivationStats samples(int64_t n, int64_t cols, int outliers, float scale, uint64_t seed) {
  ActivationStats s;
  s.cols = cols;
  s.num_rows = n;
  s.samples = uniform(n * cols, 1.0f, seed);
  for (int64_t r = 0; r < n; ++r) {
    for (int o = 0; o < outliers; ++o) s.samples[static_cast<size_t>(r * cols + o * (cols / outliers))] *= scale;
  }
  s.sum_abs.assign(static_cast<size_t>(cols), 0.0);
  for (int64_t i = 0; i < n * cols; ++i) s.sum_abs[static_cast<size_t>(i % cols)] += std::fabs(s.samples[static_cast<size_t>(i)]);
  return s;
}

// The mean squared output error of plain Q4_1 rounding, computed here in double from the
// reference (de)quantization, independently of awq.cpp and the backend.
double rtn_error_naive(const std::vector<float>& w, int64_t rows, int64_t cols, const ActivationStats& x) {
  std::vector<uint8_t> q(row_size(DType::kQ4_1, cols));
  std::vector<float> wq(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row_ref(DType::kQ4_1, w.data() + r * cols, q.data(), cols);
    dequantize_row_ref(DType::kQ4_1, q.data(), wq.data() + r * cols, cols);
  }
  double sum = 0.0;
  for (int64_t i = 0; i < x.num_samples(); ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double e = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        e += (static_cast<double>(w[static_cast<size_t>(r * cols + c)]) - wq[static_cast<size_t>(r * cols + c)]) *
             x.samples[static_cast<size_t>(i * cols + c)];
      }
      sum += e * e;
    }
  }
  return sum / static_cast<double>(x.num_samples() * rows);
}

class AwqTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = make_cpu_backend(2, MatmulMode::kExact);
};

TEST_F(AwqTest, RecorderForwardsAndKeepsMeansAndFirstSamples) {
  ActivationRecorder rec(*backend_, 3);
  const int64_t cols = 32, rows = 4;
  const std::vector<float> w = uniform(rows * cols, 1.0f, 1);
  const WeightView view{"blk.0.attn_q.weight", DType::kF32, rows, cols, w.data()};
  const std::vector<float> x1 = uniform(2 * cols, 1.0f, 2), x2 = uniform(2 * cols, 3.0f, 3);
  std::vector<float> y(2 * rows), want(2 * rows);
  rec.matmul(view, x1.data(), 2, y.data());
  backend_->matmul(view, x1.data(), 2, want.data());
  EXPECT_EQ(y, want);
  rec.matmul(view, x2.data(), 2, y.data());
  const ActivationStats& s = rec.stats("blk.0.attn_q.weight");
  EXPECT_EQ(s.num_rows, 4);
  ASSERT_EQ(s.num_samples(), 3);  // the limit: both rows of x1, the first of x2
  EXPECT_EQ(std::vector<float>(s.samples.begin() + 2 * cols, s.samples.end()),
            std::vector<float>(x2.begin(), x2.begin() + cols));
  const std::vector<float> mean = s.mean_abs();
  for (int64_t c = 0; c < cols; ++c) {
    const double m = (std::fabs(x1[c]) + std::fabs(x1[cols + c]) + std::fabs(x2[c]) + std::fabs(x2[cols + c])) / 4.0;
    EXPECT_NEAR(mean[static_cast<size_t>(c)], m, 1e-6) << c;
  }
  EXPECT_THROW(rec.stats("blk.0.attn_k.weight"), Error);

  // With a filter, the others keep their means only.
  ActivationRecorder filtered(*backend_, 3, [](std::string_view name) { return name.ends_with("attn_q.weight"); });
  const WeightView k{"blk.0.attn_k.weight", DType::kF32, rows, cols, w.data()};
  filtered.matmul(view, x1.data(), 2, y.data());
  filtered.matmul(k, x1.data(), 2, y.data());
  EXPECT_EQ(filtered.stats("blk.0.attn_q.weight").num_samples(), 2);
  EXPECT_EQ(filtered.stats("blk.0.attn_k.weight").num_samples(), 0);
  EXPECT_EQ(filtered.stats("blk.0.attn_k.weight").mean_abs(), filtered.stats("blk.0.attn_q.weight").mean_abs());
}

TEST_F(AwqTest, AlphaZeroIsRoundToNearestAndTheSearchNeverLoses) {
  const int64_t cols = 256, n = 64;
  const std::vector<int64_t> rows = {48, 16};
  std::vector<std::vector<float>> w;
  std::vector<AwqMatrix> group;
  for (size_t i = 0; i < rows.size(); ++i) {
    w.push_back(uniform(rows[i] * cols, std::sqrt(3.0f / cols), 10 + i));
    group.push_back({w.back().data(), rows[i]});
  }
  for (int outliers : {0, 8}) {
    const ActivationStats x = samples(n, cols, outliers == 0 ? 1 : outliers, outliers == 0 ? 1.0f : 30.0f, 7);
    const AwqResult r = awq_search(*backend_, group, cols, x, 20, DType::kQ4_1);
    double naive = 0.0;
    for (size_t i = 0; i < rows.size(); ++i) naive += rtn_error_naive(w[i], rows[i], cols, x) * static_cast<double>(rows[i]);
    naive /= 64.0;
    EXPECT_NEAR(r.rtn_error, naive, 1e-4 * naive) << "outliers " << outliers;
    EXPECT_EQ(r.rtn_error, awq_output_error(*backend_, group, cols, x, {}, DType::kQ4_1));
    EXPECT_LE(r.error, r.rtn_error) << "outliers " << outliers;
    EXPECT_NEAR(r.error, awq_output_error(*backend_, group, cols, x, r.scales, DType::kQ4_1), 1e-6 * r.error);
    if (outliers > 0) {
      // Channels 30 times larger than the rest dominate the rounding error; scaling them up
      // before rounding must cut it by far.
      EXPECT_GT(r.alpha, 0.0f);
      EXPECT_LT(r.error, 0.5 * r.rtn_error) << "alpha " << r.alpha;
      EXPECT_GT(r.scales[0], r.scales[1]);
    }
  }
}

TEST_F(AwqTest, RejectsMismatchedInputs) {
  const std::vector<float> w(32 * 64, 0.5f);
  const AwqMatrix m{w.data(), 32};
  EXPECT_THROW(awq_search(*backend_, {&m, 1}, 64, ActivationStats{}, 20, DType::kQ4_1), Error);
  EXPECT_THROW(awq_search(*backend_, {&m, 1}, 64, samples(4, 32, 1, 1.0f, 1), 20, DType::kQ4_1), Error);
  EXPECT_THROW(awq_search(*backend_, {&m, 1}, 64, samples(4, 64, 1, 1.0f, 1), 0, DType::kQ4_1), Error);
}

}  // namespace
}  // namespace duet
