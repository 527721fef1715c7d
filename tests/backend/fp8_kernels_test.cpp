// FP8 weights (DType::kFP8_E4M3_B128) on every ISA this machine runs: every e4m3 code decoded as
// the OCP 8-bit floating point spec defines e4m3 ("fn": no infinities, S.1111.111 NaN), decoded
// here independently of the reference; rows of every length (a last block shorter than 128);
// the in-place product with gemm_f32's bits on the dequantized rows, alone or in a batch; and the
// CPU backend's FP8 matmul against f32 weights holding the same values.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "duet/backend/backend.h"
#include "duet/backend/cpu/kernels.h"
#include "duet/core/convert.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"

namespace duet::cpu {

std::vector<Isa>& isas_under_test();  // kernels_test.cpp: the generic table and --isa's

namespace {

std::vector<Isa> fp8_isas() { return isas_under_test().empty() ? available_isas() : isas_under_test(); }

// e4m3 from its bits: sign S, exponent E (4 bits, bias 7), mantissa M (3 bits); E = 0 is
// subnormal (M / 8 * 2^-6), E = 15 with M = 7 is NaN, everything else (1 + M / 8) * 2^(E - 7).
double e4m3_spec(uint8_t code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? m * std::ldexp(1.0, -9) : (8 + m) * std::ldexp(1.0, e - 10);
  return s ? -mag : mag;
}

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// One row of n values: codes and a scale per 128 in BlockFP8 layout (the last block shorter).
struct Fp8Row {
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
Fp8Row make_row(int64_t n, Rng& rng, bool with_nan) {
  Fp8Row r;
  r.bytes.resize(row_size(DType::kFP8_E4M3_B128, n));
  for (int64_t b0 = 0; b0 < n; b0 += kQKFP8) {
    // Scales from tiny (subnormal products) to large, like checkpoints' and beyond.
    const float d = static_cast<float>(std::ldexp(0.5 + rng.uniform(), static_cast<int>(rng.next() % 60) - 40));
    r.scales.push_back(d);
    uint8_t* block = r.bytes.data() + (b0 / kQKFP8) * sizeof(BlockFP8);
    std::memcpy(block, &d, sizeof d);
    for (int64_t j = 0; j < std::min<int64_t>(kQKFP8, n - b0); ++j) {
      auto c = static_cast<uint8_t>(rng.next());
      if (!with_nan && (c & 0x7f) == 0x7f) c ^= 1;
      block[sizeof(float) + j] = c;
      r.codes.push_back(c);
    }
  }
  return r;
}

TEST(Kernels, Fp8DecodesEveryCodeAsTheSpecSays) {
  for (Isa isa : fp8_isas()) {
    const Kernels& k = kernels_for(isa);
    for (const float d : {1.0f, 0.3f, 1.5e-5f, 7.0e-39f /* subnormal */, 3.0e30f}) {
      // All 256 codes in two blocks of 128 sharing the scale.
      std::vector<uint8_t> row(row_size(DType::kFP8_E4M3_B128, 256));
      for (int b = 0; b < 2; ++b) {
        std::memcpy(row.data() + b * sizeof(BlockFP8), &d, sizeof d);
        for (int j = 0; j < 128; ++j) row[b * sizeof(BlockFP8) + sizeof(float) + j] = static_cast<uint8_t>(b * 128 + j);
      }
      std::vector<float> got(256);
      k.dequantize_fp8(row.data(), got.data(), 256);
      for (int c = 0; c < 256; ++c) {
        const double v = e4m3_spec(static_cast<uint8_t>(c));
        // The value times the scale, rounded once to f32 (double holds the product exactly).
        const float want = std::isnan(v) ? NAN : static_cast<float>(v * static_cast<double>(d));
        EXPECT_TRUE(same_float(got[c], want))
            << "isa=" << isa_name(isa) << " code=0x" << std::hex << c << std::dec << " scale=" << d << ": got " << got[c]
            << ", expected " << want;
      }
    }
    // The codes' own values (scale 1) are e4m3's: 448 the largest, 2^-9 the smallest.
    EXPECT_EQ(fp8_e4m3_to_fp32(0x7e), 448.0f);
    EXPECT_EQ(fp8_e4m3_to_fp32(0x01), std::ldexp(1.0f, -9));
    EXPECT_EQ(fp8_e4m3_to_fp32(0x80), 0.0f);
    EXPECT_TRUE(std::signbit(fp8_e4m3_to_fp32(0x80)));
  }
}

TEST(Kernels, Fp8RowsOfEveryLengthDequantizeAsTheReference) {
  Rng rng(11);
  for (Isa isa : fp8_isas()) {
    const Kernels& k = kernels_for(isa);
    for (int64_t n : {1, 7, 8, 9, 100, 127, 128, 129, 136, 200, 255, 256, 300, 1000, 7168}) {
      const Fp8Row r = make_row(n, rng, /*with_nan=*/true);
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n) + 1, -3.0f);
      dequantize_row_ref(DType::kFP8_E4M3_B128, r.bytes.data(), want.data(), n);
      k.dequantize_fp8(r.bytes.data(), got.data(), n);
      for (int64_t c = 0; c < n; ++c) {
        ASSERT_TRUE(same_float(got[c], want[c])) << "isa=" << isa_name(isa) << " n=" << n << " c=" << c;
        const double v = e4m3_spec(r.codes[c]);
        const float spec = std::isnan(v) ? NAN : static_cast<float>(v * static_cast<double>(r.scales[c / kQKFP8]));
        ASSERT_TRUE(same_float(want[c], spec)) << "n=" << n << " c=" << c;
      }
      EXPECT_EQ(got[n], -3.0f) << "isa=" << isa_name(isa) << " n=" << n << ": wrote past the row";
    }
  }
}

// The fp8 KV cache's rows (KvDtype::kFp8: whole blocks of 128, then halves) of every length read
// back with the reference's bits on every ISA, nothing written past the row.
TEST(Kernels, Fp8KvRowsOfEveryLengthDequantizeAsTheReference) {
  Rng rng(13);
  for (Isa isa : fp8_isas()) {
    const Kernels& k = kernels_for(isa);
    ASSERT_NE(k.dequantize_kv_fp8, nullptr) << isa_name(isa);
    for (int64_t n : {1, 9, 64, 127, 128, 129, 200, 256, 576, 640, 1000}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = static_cast<float>(std::ldexp(rng.uniform() - 0.5, static_cast<int>(rng.next() % 30) - 15));
      std::vector<uint8_t> row(fp8_kv_row_bytes(n));
      quantize_row_fp8_kv_ref(x.data(), row.data(), n);
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n) + 1, -3.0f);
      dequantize_row_fp8_kv_ref(row.data(), want.data(), n);
      k.dequantize_kv_fp8(row.data(), got.data(), n);
      for (int64_t c = 0; c < n; ++c) {
        ASSERT_TRUE(same_float(got[c], want[c])) << "isa=" << isa_name(isa) << " n=" << n << " c=" << c;
      }
      EXPECT_EQ(got[n], -3.0f) << "isa=" << isa_name(isa) << " n=" << n << ": wrote past the row";
    }
  }
}

TEST(Kernels, Fp8InPlaceProductHasGemmF32BitsOnDequantizedRows) {
  Rng rng(5);
  for (Isa isa : fp8_isas()) {
    const Kernels& k = kernels_for(isa);
    for (int64_t kdim : {8, 16, 120, 128, 136, 200, 256, 392, 1032}) {
      for (int64_t nw : {1, 3, 4, 5, 9}) {
        const size_t rb = row_size(DType::kFP8_E4M3_B128, kdim);
        std::vector<uint8_t> w;
        std::vector<float> wd(static_cast<size_t>(nw * kdim));
        for (int64_t j = 0; j < nw; ++j) {
          const Fp8Row r = make_row(kdim, rng, /*with_nan=*/false);
          w.insert(w.end(), r.bytes.begin(), r.bytes.end());
          dequantize_row_ref(DType::kFP8_E4M3_B128, r.bytes.data(), wd.data() + j * kdim, kdim);
        }
        for (int64_t m : {1, 2, 3, 4, 5, 7}) {
          std::vector<float> x(static_cast<size_t>(m * kdim));
          for (float& v : x) v = static_cast<float>(2.0 * rng.uniform() - 1.0);
          const int64_t ldy = nw + 2;
          std::vector<float> got(static_cast<size_t>(m * ldy), -7.0f), want(got);
          k.gemv_fp8(w.data(), rb, nw, x.data(), m, kdim, got.data(), ldy);
          k.gemm_f32(wd.data(), nw, x.data(), m, kdim, want.data(), ldy);
          for (int64_t i = 0; i < m; ++i) {
            // Each row alone gives the same bits as in the batch.
            std::vector<float> alone(static_cast<size_t>(nw));
            k.gemv_fp8(w.data(), rb, nw, x.data() + i * kdim, 1, kdim, alone.data(), nw);
            for (int64_t j = 0; j < nw; ++j) {
              const float g = got[static_cast<size_t>(i * ldy + j)];
              ASSERT_TRUE(same_float(g, want[static_cast<size_t>(i * ldy + j)]))
                  << "isa=" << isa_name(isa) << " k=" << kdim << " m=" << m << " nw=" << nw << " (" << i << ", " << j << ")";
              ASSERT_TRUE(same_float(g, alone[static_cast<size_t>(j)])) << "isa=" << isa_name(isa) << " k=" << kdim;
              double exact = 0.0, mag = 0.0;
              for (int64_t c = 0; c < kdim; ++c) {
                exact += static_cast<double>(x[i * kdim + c]) * wd[j * kdim + c];
                mag += std::fabs(static_cast<double>(x[i * kdim + c]) * wd[j * kdim + c]);
              }
              EXPECT_LE(std::fabs(g - exact), 1e-6 * mag + 1e-30) << "isa=" << isa_name(isa) << " k=" << kdim;
            }
            EXPECT_EQ(got[static_cast<size_t>(i * ldy + nw)], -7.0f);  // the padding is untouched
          }
        }
      }
    }
  }
}

// The backend's FP8 matmul (in place for a few rows, through f32 tiles for more, and the exact
// path) against f32 weights holding the dequantized values: the same bits, rows 128 and 200 (a
// scale block and a half), columns a multiple of 128 or not (100: not of 8 either, always
// through f32 tiles).
TEST(Kernels, Fp8MatmulEqualsF32WeightsOfTheDequantizedValues) {
  Rng rng(9);
  for (int64_t cols : {100, 128, 200, 384}) {
    const int64_t rows = 200;
    const size_t rb = row_size(DType::kFP8_E4M3_B128, cols);
    std::vector<uint8_t> w;
    std::vector<float> wd(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      const Fp8Row row = make_row(cols, rng, false);
      w.insert(w.end(), row.bytes.begin(), row.bytes.end());
      dequantize_row_ref(DType::kFP8_E4M3_B128, row.bytes.data(), wd.data() + r * cols, cols);
    }
    ASSERT_EQ(w.size(), rb * static_cast<size_t>(rows));
    for (MatmulMode mode : {MatmulMode::kFast, MatmulMode::kExact}) {
      auto backend = make_cpu_backend(2, mode);
      for (int64_t m : {1, 3, 4, 5, 17}) {
        std::vector<float> x(static_cast<size_t>(m * cols));
        for (float& v : x) v = static_cast<float>(2.0 * rng.uniform() - 1.0);
        std::vector<float> got(static_cast<size_t>(m * rows)), want(got.size());
        backend->matmul(WeightView{"fp8", DType::kFP8_E4M3_B128, rows, cols, w.data()}, x.data(), m, got.data());
        backend->matmul(WeightView{"f32", DType::kF32, rows, cols, wd.data()}, x.data(), m, want.data());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_TRUE(same_float(got[i], want[i])) << "cols=" << cols << " m=" << m << " i=" << i << " exact="
                                                   << (mode == MatmulMode::kExact);
        }
      }
      std::vector<float> row(static_cast<size_t>(cols));
      const int32_t id = 130;
      backend->get_rows(WeightView{"fp8", DType::kFP8_E4M3_B128, rows, cols, w.data()}, &id, 1, row.data());
      for (int64_t c = 0; c < cols; ++c) ASSERT_TRUE(same_float(row[c], wd[id * cols + c]));
    }
  }
}

}  // namespace
}  // namespace duet::cpu
