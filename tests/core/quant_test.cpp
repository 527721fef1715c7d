#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/dtype.h"
#include "duet/core/error.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"

namespace duet {
namespace {

TEST(Fp16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f)))) << h;
      continue;
    }
    EXPECT_EQ(fp32_to_fp16(f), h) << "half " << h << " -> " << f;
  }
}

TEST(Fp16, KnownValues) {
  EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (zero)
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie to even (up)
}

TEST(Fp16, RoundsToNearestOnRandomFloats) {
  Rng rng(7);
  for (int i = 0; i < 100000; ++i) {
    const float f = static_cast<float>((rng.uniform() - 0.5) * std::ldexp(1.0, static_cast<int>(rng.next() % 40) - 24));
    const uint16_t h = fp32_to_fp16(f);
    const float back = fp16_to_fp32(h);
    // No other half is closer.
    const float up = fp16_to_fp32(static_cast<uint16_t>(h + 1));
    const float down = fp16_to_fp32(static_cast<uint16_t>(h - 1));
    if ((h & 0x7fff) != 0 && (h & 0x7fff) < 0x7bff) {
      EXPECT_LE(std::fabs(back - f), std::fabs(up - f)) << f;
      EXPECT_LE(std::fabs(back - f), std::fabs(down - f)) << f;
    }
  }
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  float f;
  uint32_t bits = 0x3f808000;  // exactly halfway between 0x3f80 and 0x3f81: to even
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(fp32_to_bf16(f), 0x3f80);
  bits = 0x3f818000;  // halfway, odd below: up
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(fp32_to_bf16(f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

std::vector<float> random_row(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = static_cast<float>(rng.uniform() * 4.0 - 2.0);
  return x;
}

// The scale is rounded to fp16 after the values were divided by the exact scale, so the bound is
// half a step plus 127 times the scale's relative rounding error (2^-11): 0.5 + 0.062 steps.
TEST(Q8_0, QuantizesWithinHalfAStepPlusScaleRounding) {
  const std::vector<float> x = random_row(256, 1);
  std::vector<BlockQ8_0> q(256 / 32);
  quantize_row_q8_0_ref(x.data(), q.data(), 256);
  std::vector<float> y(256);
  dequantize_row_q8_0_ref(q.data(), y.data(), 256);
  for (int b = 0; b < 8; ++b) {
    const float d = fp16_to_fp32(q[b].d);
    for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]), 0.563f * d + 1e-6f);
  }
}

TEST(Q4_0, KnownBlock) {
  // Largest magnitude is -16 -> d = -16 / -8 = 2, q = round(x / 2) + 8 clamped to 15.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  BlockQ4_0 b;
  quantize_row_q4_0_ref(x.data(), &b, 32);
  EXPECT_EQ(fp16_to_fp32(b.d), 2.0f);
  std::vector<float> y(32);
  dequantize_row_q4_0_ref(&b, y.data(), 32);
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[31], 14.0f);  // 15 / 2 = 7.5 -> q 15 (clamped), 2 * (15 - 8) = 14
  for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(x[j] - y[j]), 1.0f + 1e-6f) << j;
}

TEST(Q4_0, ErrorBoundedByHalfStep) {
  const std::vector<float> x = random_row(4096, 3);
  std::vector<BlockQ4_0> q(4096 / 32);
  quantize_row_q4_0_ref(x.data(), q.data(), 4096);
  std::vector<float> y(4096);
  dequantize_row_q4_0_ref(q.data(), y.data(), 4096);
  for (int b = 0; b < 128; ++b) {
    const float d = std::fabs(fp16_to_fp32(q[b].d));
    for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]), d * 1.01f + 1e-6f);
  }
}

// K-quant blocks built by hand, with the values the GGUF block layout defines.
TEST(KQuants, Q6_KHandBuiltBlock) {
  BlockQ6_K b{};
  b.d = fp32_to_fp16(0.5f);
  for (int i = 0; i < 16; ++i) b.scales[i] = static_cast<int8_t>(i - 8);
  // Element 0: ql[0] low nibble 5, qh[0] bits 0-1 = 2 -> q = 5 | 2 << 4 = 37, minus 32 = 5.
  b.ql[0] = 0x35;  // high nibble 3 feeds element 64
  b.qh[0] = 0x02 | (0x1 << 4);  // element 64: q = 3 | 1 << 4 = 19 -> -13
  // Element 160 (second half, l = 0, third quarter): ql[64] high nibble, qh[32] bits 4-5.
  b.ql[64] = 0xf0;
  b.qh[32] = 0x3 << 4;  // q = 15 | 3 << 4 = 63 -> 31
  std::vector<float> y(256);
  dequantize_row_q6_k_ref(&b, y.data(), 256);
  EXPECT_EQ(y[0], 0.5f * -8 * 5);       // scale 0
  EXPECT_EQ(y[64], 0.5f * -4 * -13);    // scale 4
  EXPECT_EQ(y[128 + 64], 0.5f * 4 * 31);  // second half: scales 8.., index 8 + 4 = 12 -> 4
  EXPECT_EQ(y[1], 0.5f * -8 * -32);     // all-zero bits give -32
}

TEST(KQuants, Q4_KAndQ5_KHandBuiltBlocks) {
  BlockQ4_K b{};
  b.d = fp32_to_fp16(2.0f);
  b.dmin = fp32_to_fp16(0.25f);
  b.scales[0] = 3;        // scale 0 = 3
  b.scales[4] = 5;        // min 0 = 5
  b.scales[1] = 7;        // scale 1 = 7 (elements 32..63)
  b.scales[5] = 1;        // min 1 = 1
  b.scales[8] = 0x21;     // scale 4 low bits 1, min 4 low bits 2
  b.scales[0] |= 1 << 6;  // scale 4 high bits 1 -> scale 4 = 1 | 16 = 17
  b.qs[0] = 0x9c;         // element 0: 12, element 32: 9
  b.qs[64] = 0x04;        // element 128 (scale 4): 4
  std::vector<float> y(256);
  dequantize_row_q4_k_ref(&b, y.data(), 256);
  EXPECT_EQ(y[0], 2.0f * 3 * 12 - 0.25f * 5);
  EXPECT_EQ(y[32], 2.0f * 7 * 9 - 0.25f * 1);
  EXPECT_EQ(y[128], 2.0f * 17 * 4 - 0.25f * 2);

  BlockQ5_K c{};
  c.d = fp32_to_fp16(1.0f);
  c.dmin = fp32_to_fp16(0.0f);
  c.scales[0] = 2;
  c.scales[1] = 3;
  c.qs[0] = 0x21;  // element 0 low 1, element 32 low 2
  c.qh[0] = 0x3;   // bit 0: element 0 +16; bit 1: element 32 +16
  std::vector<float> z(256);
  dequantize_row_q5_k_ref(&c, z.data(), 256);
  EXPECT_EQ(z[0], 2.0f * 17);
  EXPECT_EQ(z[32], 3.0f * 18);
  EXPECT_EQ(z[1], 0.0f);
}

TEST(LegacyQuants, Q4_1Q5_0Q5_1HandBuiltBlocks) {
  BlockQ4_1 a{};
  a.d = fp32_to_fp16(0.5f);
  a.m = fp32_to_fp16(-1.0f);
  a.qs[3] = 0xa7;  // element 3: 7, element 19: 10
  std::vector<float> y(32);
  dequantize_row_q4_1_ref(&a, y.data(), 32);
  EXPECT_EQ(y[3], 0.5f * 7 - 1.0f);
  EXPECT_EQ(y[19], 0.5f * 10 - 1.0f);
  EXPECT_EQ(y[0], -1.0f);

  BlockQ5_0 b{};
  b.d = fp32_to_fp16(2.0f);
  b.qs[2] = 0x31;                    // element 2 low 1, element 18 low 3
  const uint32_t qh = (1u << 2) | (1u << 18);  // fifth bits of elements 2 and 18
  std::memcpy(b.qh, &qh, 4);
  dequantize_row_q5_0_ref(&b, y.data(), 32);
  EXPECT_EQ(y[2], 2.0f * (17 - 16));
  EXPECT_EQ(y[18], 2.0f * (19 - 16));
  EXPECT_EQ(y[0], 2.0f * -16);

  BlockQ5_1 c{};
  c.d = fp32_to_fp16(1.0f);
  c.m = fp32_to_fp16(0.25f);
  c.qs[31 - 16] = 0xf0;  // element 31 low 15
  const uint32_t qh31 = 1u << 31;
  std::memcpy(c.qh, &qh31, 4);
  dequantize_row_q5_1_ref(&c, y.data(), 32);
  EXPECT_EQ(y[31], 31.0f + 0.25f);
  EXPECT_EQ(y[15], 0.25f);
}

TEST(Q4_1, KnownBlock) {
  // min -1, max 14 -> d = 1, m = -1, q = x + 1 (0..15) with elements j and j + 16 in one byte.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16) - 1.0f;
  x[5] = 0.4f;  // offset 1.4 rounds to 1
  x[6] = 0.6f;  // offset 1.6 rounds to 2
  BlockQ4_1 b;
  quantize_row_q4_1_ref(x.data(), &b, 32);
  EXPECT_EQ(fp16_to_fp32(b.d), 1.0f);
  EXPECT_EQ(fp16_to_fp32(b.m), -1.0f);
  EXPECT_EQ(b.qs[0], 0x00);
  EXPECT_EQ(b.qs[3], 0x33);
  EXPECT_EQ(b.qs[5], 0x51);
  EXPECT_EQ(b.qs[6], 0x62);
  EXPECT_EQ(b.qs[15], 0xff);
}

TEST(Q4_1, ErrorBoundedByHalfStepThroughTheGenericEntryPoints) {
  std::vector<float> x = random_row(4096, 5);
  for (int j = 0; j < 32; ++j) x[j] = 0.25f;  // a constant block: d = 0, every value exact
  std::vector<uint8_t> q(row_size(DType::kQ4_1, 4096));
  quantize_row_ref(DType::kQ4_1, x.data(), q.data(), 4096);
  std::vector<float> y(4096);
  dequantize_row_ref(DType::kQ4_1, q.data(), y.data(), 4096);
  const auto* blocks = reinterpret_cast<const BlockQ4_1*>(q.data());
  for (int b = 0; b < 128; ++b) {
    const float d = fp16_to_fp32(blocks[b].d);
    // half a step, plus the fp16 rounding of the minimum and of d times up to 15 steps
    const float bound = 0.5f * d + std::fabs(fp16_to_fp32(blocks[b].m)) * 1e-3f + 15.0f * d * 1e-3f + 1e-6f;
    for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]), bound) << b << " " << j;
  }
  EXPECT_EQ(y[0], 0.25f);
}

// Q4_0, Q5_0 and Q8_0 rows of random bytes (every quant, every fifth bit, random scales) become
// Q8_0 blocks that decode to the same floats, bit for bit; other types are refused untouched.
TEST(Q8_0, ExactConversionKeepsEveryValue) {
  const int64_t n = 256;
  Rng rng(11);
  for (DType type : {DType::kQ4_0, DType::kQ5_0, DType::kQ8_0}) {
    std::vector<uint8_t> src(row_size(type, n));
    for (uint8_t& b : src) b = static_cast<uint8_t>(rng.next());
    const size_t block = row_size(type, 32);
    for (size_t o = 0; o < src.size(); o += block) {  // finite scales, some of them negative
      const uint16_t d = fp32_to_fp16(static_cast<float>(rng.uniform() * 2.0 - 1.0) * 0.01f);
      std::memcpy(src.data() + o, &d, 2);
    }
    std::vector<BlockQ8_0> q8(n / 32);
    ASSERT_TRUE(convert_row_to_q8_0_exact(type, src.data(), q8.data(), n)) << dtype_name(type);
    std::vector<float> want(n), got(n);
    dequantize_row_ref(type, src.data(), want.data(), n);
    dequantize_row_q8_0_ref(q8.data(), got.data(), n);
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(std::memcmp(&want[j], &got[j], 4), 0)
          << dtype_name(type) << " " << j << ": " << want[j] << " " << got[j];
    }
  }
  std::vector<uint8_t> q4_k(row_size(DType::kQ4_K, n), 7);
  std::vector<BlockQ8_0> out(n / 32, BlockQ8_0{0x1234, {}});
  EXPECT_FALSE(convert_row_to_q8_0_exact(DType::kQ4_K, q4_k.data(), out.data(), n));
  EXPECT_EQ(out[0].d, 0x1234);
}

TEST(Quantize, RejectsRowsNotMultipleOfBlock) {
  std::vector<float> x(33);
  std::vector<uint8_t> out(64);
  EXPECT_THROW(quantize_row_ref(DType::kQ8_0, x.data(), out.data(), 33), Error);
}

TEST(DType, TraitsAndNames) {
  EXPECT_EQ(row_size(DType::kQ4_0, 64), 36u);
  EXPECT_EQ(row_size(DType::kF16, 3), 6u);
  EXPECT_EQ(parse_dtype("Q8_0"), DType::kQ8_0);
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_FALSE(parse_dtype("q9_9").has_value());
  EXPECT_FALSE(dtype_traits(4).has_value());  // removed GGML type id
  EXPECT_EQ(dtype_traits(14)->type_size, 210u);  // q6_k
}

}  // namespace
}  // namespace duet
