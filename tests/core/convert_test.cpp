// Load-time conversions of checkpoint formats: FP8 e4m3 values, FP8 block-scaled weights kept
// with their scales or converted to Q8_0, AutoAWQ int4 to Q4_1, each against the format's own definition written out here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/convert.h"
#include "duet/core/error.h"
#include "duet/core/random.h"

namespace duet {
namespace {

TEST(Convert, Fp8E4m3Values) {
  EXPECT_EQ(fp8_e4m3_to_fp32(0x00), 0.0f);
  EXPECT_EQ(fp8_e4m3_to_fp32(0x38), 1.0f);        // exponent 7 = bias
  EXPECT_EQ(fp8_e4m3_to_fp32(0xB8), -1.0f);
  EXPECT_EQ(fp8_e4m3_to_fp32(0x40), 2.0f);
  EXPECT_EQ(fp8_e4m3_to_fp32(0x3C), 1.5f);        // mantissa 4/8
  EXPECT_EQ(fp8_e4m3_to_fp32(0x7E), 448.0f);      // the largest finite value
  EXPECT_EQ(fp8_e4m3_to_fp32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(fp8_e4m3_to_fp32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_fp32(0x07), 7.0f * std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_fp32(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_fp32(0xFF)));
  // Codes 0..126 are the non-negative finite values in increasing order.
  for (int v = 1; v < 127; ++v) EXPECT_LT(fp8_e4m3_to_fp32(static_cast<uint8_t>(v - 1)), fp8_e4m3_to_fp32(static_cast<uint8_t>(v)));
}

TEST(Convert, Fp8BlocksBecomeQ8_0WithinHalfAStepAndTheScaleRounding) {
  const int64_t rows = 200, cols = 320, block = 128;
  Rng rng(3);
  std::vector<uint8_t> w(static_cast<size_t>(rows * cols));
  for (uint8_t& b : w) {
    do b = static_cast<uint8_t>(rng.next()); while ((b & 0x7F) == 0x7F);  // no NaN
  }
  const int64_t sr = (rows + block - 1) / block, sc = (cols + block - 1) / block;
  std::vector<float> scale(static_cast<size_t>(sr * sc));
  for (float& s : scale) s = 1e-3f * static_cast<float>(1.0 + rng.uniform());
  std::vector<BlockQ8_0> q(static_cast<size_t>(rows * cols / 32));
  fp8_blocks_to_q8_0(w.data(), scale.data(), rows, cols, block, q.data());
  std::vector<float> got(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row_q8_0_ref(q.data() + r * (cols / 32), got.data(), cols);
    for (int64_t b = 0; b < cols / 32; ++b) {
      float amax = 0.0f;
      std::vector<float> want(32);
      for (int e = 0; e < 32; ++e) {
        const int64_t c = b * 32 + e;
        want[e] = fp8_e4m3_to_fp32(w[r * cols + c]) * scale[(r / block) * sc + c / block];
        amax = std::max(amax, std::fabs(want[e]));
      }
      // Half a step of the block (amax / 127), plus the step's own rounding to fp16 (2^-11 of
      // it, times up to 127 steps).
      const float step = amax / 127.0f;
      for (int e = 0; e < 32; ++e) {
        ASSERT_NEAR(got[b * 32 + e], want[e], step * (0.5f + 127.0f / 2048.0f) * 1.01f + 1e-9f)
            << "r=" << r << " c=" << b * 32 + e;
      }
    }
  }
  EXPECT_THROW(fp8_blocks_to_q8_0(w.data(), scale.data(), 1, 31, block, q.data()), Error);
}

// FP8 kept as it is: every row carries its 128 x 128 block's scale before each 128 of its codes,
// rows and columns past a multiple of 128 included (the last block shorter); the values are the
// codes times the scale of their block.
TEST(Convert, Fp8BlocksKeptAsRowsWithTheirScales) {
  Rng rng(8);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{200, 320}, {128, 128}, {1, 7}, {129, 300}, {300, 64}};
  for (const auto& [rows, cols] : shapes) {
    std::vector<uint8_t> w(static_cast<size_t>(rows * cols));
    for (uint8_t& b : w) b = static_cast<uint8_t>(rng.next());
    const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    std::vector<float> scale(static_cast<size_t>(sr * sc));
    for (float& s : scale) s = static_cast<float>(std::ldexp(1.0 + rng.uniform(), -static_cast<int>(rng.next() % 20)));
    const size_t rb = row_size(DType::kFP8_E4M3_B128, cols);
    EXPECT_EQ(rb, static_cast<size_t>(cols + 4 * sc));
    std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
    fp8_blocks_to_rows(w.data(), scale.data(), rows, cols, out.data());
    std::vector<float> got(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row_ref(DType::kFP8_E4M3_B128, out.data() + r * rb, got.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        const float want = fp8_e4m3_to_fp32(w[r * cols + c]) * scale[(r / 128) * sc + c / 128];
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got[c])) << rows << "x" << cols << " r=" << r << " c=" << c;
        } else {
          ASSERT_EQ(got[c], want) << rows << "x" << cols << " r=" << r << " c=" << c;
        }
      }
    }
  }
}

TEST(Convert, AwqInt4BecomesQ4_1) {
  const int64_t in = 256, out = 24, group = 128;
  Rng rng(5);
  std::vector<int> q(static_cast<size_t>(in * out)), z(static_cast<size_t>(in / group * out));
  std::vector<uint16_t> s(static_cast<size_t>(in / group * out));
  for (int& v : q) v = static_cast<int>(rng.next() % 16);
  for (int& v : z) v = static_cast<int>(rng.next() % 16);
  for (uint16_t& v : s) v = fp32_to_fp16(static_cast<float>(0.001 + 0.02 * rng.uniform()));
  // AutoAWQ's packing: nibble i of packed column c holds output column 8c + order[i].
  const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  auto pack = [&](const std::vector<int>& m, int64_t rows_m) {
    std::vector<int32_t> p(static_cast<size_t>(rows_m * out / 8), 0);
    for (int64_t r = 0; r < rows_m; ++r) {
      for (int64_t c = 0; c < out / 8; ++c) {
        uint32_t word = 0;
        for (int i = 0; i < 8; ++i) word |= static_cast<uint32_t>(m[r * out + 8 * c + order[i]]) << (4 * i);
        p[r * (out / 8) + c] = static_cast<int32_t>(word);
      }
    }
    return p;
  };
  const std::vector<int32_t> qweight = pack(q, in), qzeros = pack(z, in / group);
  std::vector<BlockQ4_1> rows(static_cast<size_t>(out * in / 32));
  awq_to_q4_1(qweight.data(), qzeros.data(), s.data(), in, out, group, rows.data());
  std::vector<float> got(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    dequantize_row_q4_1_ref(rows.data() + o * (in / 32), got.data(), in);
    for (int64_t i = 0; i < in; ++i) {
      const int64_t g = i / group;
      const float scale = fp16_to_fp32(s[g * out + o]);
      const float want = static_cast<float>(q[i * out + o] - z[g * out + o]) * scale;
      ASSERT_NEAR(got[i], want, std::fabs(scale * static_cast<float>(z[g * out + o])) / 2048.0f + 1e-7f)
          << "o=" << o << " i=" << i;
    }
  }
  EXPECT_THROW(awq_to_q4_1(qweight.data(), qzeros.data(), s.data(), in, out, 48, rows.data()), Error);
}


// Every finite code is its own nearest value; halfway between two codes goes to the even one.
TEST(Convert, Fp8E4m3EncodesToTheNearestCode) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    if ((c & 0x7F) == 0x7F) continue;  // NaN
    const float v = fp8_e4m3_to_fp32(code);
    if (c == 0x80) {
      EXPECT_EQ(fp32_to_fp8_e4m3(v), 0x80);  // -0
      continue;
    }
    EXPECT_EQ(fp32_to_fp8_e4m3(v), code) << c;
  }
  EXPECT_EQ(fp32_to_fp8_e4m3(1.0625f), 0x38);   // between 1 (0x38) and 1.125 (0x39): even
  EXPECT_EQ(fp32_to_fp8_e4m3(1.1875f), 0x3A);   // between 1.125 (0x39) and 1.25 (0x3A): even
  EXPECT_EQ(fp32_to_fp8_e4m3(1.07f), 0x39);
  EXPECT_EQ(fp32_to_fp8_e4m3(1e6f), 0x7E);      // saturates at 448
  EXPECT_EQ(fp32_to_fp8_e4m3(-1e6f), 0xFE);
  EXPECT_EQ(fp32_to_fp8_e4m3(std::nanf("")), 0x7F);
}

// The bit-operation rounding gives the table search's code's value, on values spread over e4m3's
// whole range (subnormals, the boundary to normals, saturation), on every code and every midpoint.
TEST(Convert, Fp8E4m3RoundIsTheNearestCodesValue) {
  std::vector<float> values;
  for (int c = 0; c < 127; ++c) {
    const float v = fp8_e4m3_to_fp32(static_cast<uint8_t>(c));
    values.push_back(v);
    if (c + 1 < 127) {
      const float next = fp8_e4m3_to_fp32(static_cast<uint8_t>(c + 1));
      values.push_back(0.5f * (v + next));                           // a tie
      values.push_back(std::nextafter(0.5f * (v + next), 0.0f));     // just below it
      values.push_back(std::nextafter(0.5f * (v + next), 1000.0f));  // just above it
    }
  }
  Rng rng(17);
  for (int i = 0; i < 20000; ++i) {
    values.push_back(std::ldexp(static_cast<float>(rng.uniform()), static_cast<int>(rng.next() % 22) - 12));
  }
  for (float v : {0x1p-6f, std::nextafter(0x1p-6f, 0.0f), 0x1p-10f, 464.0f, 465.0f, 1e30f}) values.push_back(v);
  for (float v : values) {
    for (float x : {v, -v}) {
      EXPECT_EQ(fp8_e4m3_round(x), fp8_e4m3_to_fp32(fp32_to_fp8_e4m3(x))) << x;
    }
  }
  EXPECT_TRUE(std::signbit(fp8_e4m3_round(-1e-30f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_round(std::nanf(""))));
}

// Power-of-two scales per block: the largest value of a block lands in (224, 448], the others
// round on e4m3's grid at that scale (ties to the even code); an all-zero block stays zero.
TEST(Convert, Fp8ActRoundTripUsesPowerOfTwoScales) {
  // amax 5: s = 2^ceil(log2(5 / 448)) = 2^-6; 300 / 64 and 304 / 64 are 300 and 304 there, which
  // round to 288 and (a tie between 288 and 320) 320.
  std::vector<float> x = {5.0f, 300.0f / 64, 304.0f / 64, -1.0f / 64, 0.0f, 0.0f};
  fp8_act_round_trip(x.data(), 6, 4);
  EXPECT_EQ(x[0], 5.0f);
  EXPECT_EQ(x[1], 288.0f / 64);
  EXPECT_EQ(x[2], 320.0f / 64);
  EXPECT_EQ(x[3], -1.0f / 64);
  EXPECT_EQ(x[4], 0.0f);  // the second block: all zero
  EXPECT_EQ(x[5], 0.0f);
  Rng rng(5);
  std::vector<float> y(300), orig;
  for (float& v : y) v = static_cast<float>(rng.uniform() - 0.5) * 37.0f;
  orig = y;
  fp8_act_round_trip(y.data(), 300, 128);
  for (int64_t b0 = 0; b0 < 300; b0 += 128) {
    float amax = 0.0f;
    for (int64_t i = b0; i < std::min<int64_t>(300, b0 + 128); ++i) amax = std::max(amax, std::fabs(orig[i]));
    const float s = std::ldexp(1.0f, static_cast<int>(std::ceil(std::log2(amax / 448.0))));
    for (int64_t i = b0; i < std::min<int64_t>(300, b0 + 128); ++i) {
      EXPECT_EQ(y[i], fp8_e4m3_to_fp32(fp32_to_fp8_e4m3(orig[i] / s)) * s) << i;
      EXPECT_LE(std::fabs(y[i] - orig[i]), std::fabs(orig[i]) / 16 + s / 1024) << i;
    }
  }
  EXPECT_THROW(fp8_act_round_trip(y.data(), 4, 0), Error);
}

// The bit encoder gives the table search's code: on every code's value, every midpoint and values
// over e4m3's whole range (subnormals, saturation), either sign.
TEST(Convert, Fp8E4m3EncodeIsTheTableSearchsCode) {
  std::vector<float> values;
  for (int c = 0; c < 127; ++c) {
    const float v = fp8_e4m3_to_fp32(static_cast<uint8_t>(c));
    values.push_back(v);
    if (c + 1 < 127) values.push_back(0.5f * (v + fp8_e4m3_to_fp32(static_cast<uint8_t>(c + 1))));
  }
  Rng rng(23);
  for (int i = 0; i < 20000; ++i) {
    values.push_back(std::ldexp(static_cast<float>(rng.uniform()), static_cast<int>(rng.next() % 24) - 13));
  }
  for (float v : {0x1p-6f, std::nextafter(0x1p-6f, 0.0f), 0x1p-10f, 448.0f, 465.0f, 1e30f}) values.push_back(v);
  for (float v : values) {
    for (float x : {v, -v}) EXPECT_EQ(fp8_e4m3_encode(x), fp32_to_fp8_e4m3(x)) << x;
  }
  EXPECT_EQ(fp8_e4m3_encode(-0.0f), 0x80);
  EXPECT_EQ(fp8_e4m3_encode(std::nanf("")), 0x7F);
}

// The fp8 KV cache's row: per whole 128 values a BlockFP8 with act_quant's power-of-two scale and
// the codes of the scaled values, the rest as halves; read back, the values of fp8_act_round_trip
// on the blocks and of f16 on the rest. A row of 576 (MLA's) takes 656 bytes.
TEST(Convert, Fp8KvRowsAreActQuantBlocksAndHalves) {
  EXPECT_EQ(fp8_kv_row_bytes(576), 656u);
  EXPECT_EQ(fp8_kv_row_bytes(128), 132u);
  EXPECT_EQ(fp8_kv_row_bytes(64), 128u);
  Rng rng(29);
  for (int64_t n : {1, 64, 127, 128, 129, 256, 576, 700}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>(rng.uniform() - 0.5) * (i % 128 < 64 ? 3.0f : 0.01f);  // blocks of mixed sizes
    }
    if (n > 130) x[130] = 900.0f;  // a block whose scale is above 1
    std::vector<uint8_t> row(fp8_kv_row_bytes(n) + 1, 0xAB);
    quantize_row_fp8_kv_ref(x.data(), row.data(), n);
    EXPECT_EQ(row.back(), 0xAB) << n << ": wrote past the row";
    std::vector<float> got(static_cast<size_t>(n));
    dequantize_row_fp8_kv_ref(row.data(), got.data(), n);
    const int64_t whole = n / 128 * 128;
    std::vector<float> want = x;
    fp8_act_round_trip(want.data(), whole, 128);
    for (int64_t i = whole; i < n; ++i) want[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << n << " at " << i;
    for (int64_t b = 0; b < whole / 128; ++b) {
      BlockFP8 blk;
      std::memcpy(&blk, row.data() + b * sizeof(BlockFP8), sizeof blk);
      EXPECT_EQ(blk.d, std::exp2(std::round(std::log2(blk.d)))) << n << " block " << b << ": not a power of two";
      for (int j = 0; j < 128; ++j) ASSERT_EQ(blk.qs[j], fp32_to_fp8_e4m3(x[b * 128 + j] / blk.d)) << n << " " << j;
    }
  }
}

// H x for x = (1, 2, 3, 4) is (10, -2, -4, 0); H H = n I; n must be a power of two.
TEST(Convert, HadamardTransform) {
  std::vector<float> x = {1, 2, 3, 4};
  hadamard_transform(x.data(), 4);
  EXPECT_EQ(x, (std::vector<float>{10, -2, -4, 0}));
  Rng rng(9);
  std::vector<float> y(128);
  for (float& v : y) v = static_cast<float>(rng.uniform()) - 0.5f;
  std::vector<float> z = y;
  hadamard_transform(z.data(), 128);
  hadamard_transform(z.data(), 128);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(z[i] / 128, y[i], 1e-6) << i;
  EXPECT_THROW(hadamard_transform(x.data(), 3), Error);
  EXPECT_THROW(hadamard_transform(x.data(), 0), Error);
}

// f32 -> FP8 blocks -> Q8_0 gives back each weight within e4m3's rounding (half a step of 3
// mantissa bits) plus Q8_0's, on a matrix whose sides are not multiples of the block.
TEST(Convert, Fp8BlocksFromF32RoundTrip) {
  const int64_t rows = 150, cols = 160, block = 128;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 7));
  }
  std::vector<uint8_t> q(w.size());
  std::vector<float> scale(4);
  fp8_blocks_from_f32(w.data(), rows, cols, block, q.data(), scale.data());
  std::vector<BlockQ8_0> out(static_cast<size_t>(rows * cols / 32));
  fp8_blocks_to_q8_0(q.data(), scale.data(), rows, cols, block, out.data());
  std::vector<float> back(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row_q8_0_ref(out.data() + r * (cols / 32), back.data(), cols);
    for (int64_t c = 0; c < cols; ++c) {
      const float x = w[static_cast<size_t>(r * cols + c)];
      const float s = scale[static_cast<size_t>((r / block) * 2 + c / block)];
      // e4m3: relative 1/16 (or half the subnormal step), then Q8_0: half of 7 / 127 of the largest
      // value, and its scale rounded to fp16 (7 / 2048).
      const float bound = std::max(std::fabs(x) / 16.0f, s * std::ldexp(1.0f, -10)) + 7.0f / 254.0f + 7.0f / 2048.0f;
      ASSERT_LE(std::fabs(back[static_cast<size_t>(c)] - x), bound) << r << "," << c;
    }
  }
  float amax = 0.0f;  // the first tile: rows 0-127, columns 0-127
  for (int64_t r = 0; r < block; ++r) {
    for (int64_t c = 0; c < block; ++c) amax = std::max(amax, std::fabs(w[static_cast<size_t>(r * cols + c)]));
  }
  EXPECT_EQ(scale[0], amax / 448.0f);
}

// f32 -> AWQ -> Q4_1: each weight within half a quantization step of its group (plus the zero
// point times the scale rounded to fp16 in Q4_1).
TEST(Convert, AwqFromF32RoundTrip) {
  const int64_t in = 128, out = 24, group = 64;
  std::vector<float> w(static_cast<size_t>(out * in));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.91f * static_cast<float>(i)) * 0.5f + 0.1f;
  std::vector<int32_t> qweight(static_cast<size_t>(in * out / 8)), qzeros(static_cast<size_t>(in / group * out / 8));
  std::vector<uint16_t> scales(static_cast<size_t>(in / group * out));
  awq_from_f32(w.data(), in, out, group, qweight.data(), qzeros.data(), scales.data());
  std::vector<BlockQ4_1> rows(static_cast<size_t>(out * in / 32));
  awq_to_q4_1(qweight.data(), qzeros.data(), scales.data(), in, out, group, rows.data());
  std::vector<float> back(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    dequantize_row_q4_1_ref(rows.data() + o * (in / 32), back.data(), in);
    for (int64_t i = 0; i < in; ++i) {
      const float s = fp16_to_fp32(scales[static_cast<size_t>((i / group) * out + o)]);
      ASSERT_LE(std::fabs(back[static_cast<size_t>(i)] - w[static_cast<size_t>(o * in + i)]),
                0.5f * s + 15.0f * s / 2048.0f + 1e-6f)
          << o << "," << i;
    }
  }
  EXPECT_THROW(awq_from_f32(w.data(), in, 20, group, qweight.data(), qzeros.data(), scales.data()), Error);
}

}  // namespace
}  // namespace duet
