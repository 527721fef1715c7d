// K-quant (Q4_K, Q5_K, Q6_K) reference quantization: bytes against llama.cpp, and the
// properties a quantizer must have (round-trip error bounds, stability under re-quantization).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/dtype.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"

namespace duet {
namespace {

// Input rows for the golden vectors: `kind` (mod 10) picks the distribution, every value comes
// from duet's platform-independent Rng and exact float operations (ldexp, not pow). The program
// that produced the golden blocks used this same function.
std::vector<float> golden_row(int kind, uint64_t seed, int64_t n) {
  Rng rng(seed);
  auto u = [&] { return static_cast<float>(rng.uniform()); };          // [0, 1)
  auto s = [&] { return static_cast<float>(2.0 * rng.uniform() - 1.0); };  // [-1, 1)
  std::vector<float> x(static_cast<size_t>(n));
  // 2^-14 .. 2^8, through ldexp (exact) rather than pow (libm-dependent). The draws are
  // sequenced explicitly: the order in which a compiler evaluates function arguments or the
  // operands of + is unspecified and differs between targets (x86 and aarch64 GCC do differ).
  const int exponent = static_cast<int>(rng.next() % 22) - 14;
  const float mantissa = 1.0f + u();
  const float scale = std::ldexp(mantissa, exponent);
  switch (kind % 10) {
    case 0:  // uniform, symmetric
      for (float& v : x) v = scale * s();
      break;
    case 1:  // bell-shaped with 1% outliers
      for (float& v : x) {
        const float a = s();
        const float b = s();
        const float c = s();
        const float d = s();
        v = scale * (((a + b) + c) + d);
        if (u() < 0.01f) v *= 20.0f;
      }
      break;
    case 2:  // all positive, offset from zero
      for (float& v : x) v = scale * (1.0f + 0.5f * s());
      break;
    case 3: {  // one value everywhere
      const float c = scale * s();
      for (float& v : x) v = c;
      break;
    }
    case 4:  // mostly zero, a few spikes
      for (float& v : x) v = u() < 0.03f ? scale * s() : 0.0f;
      break;
    case 5:  // tiny values (fp16 scales underflow)
      for (float& v : x) v = 1e-9f * s();
      break;
    case 6:  // groups of 32 that alternate between zero and large
      for (size_t i = 0; i < x.size(); ++i) x[i] = (i / 32) % 2 ? scale * 100.0f * s() : 0.0f;
      break;
    case 8:  // large magnitudes
      for (float& v : x) v = 1e3f * scale * s();
      break;
    case 9:  // multiples of 1/8: exact ties for the rounding
      for (float& v : x) v = static_cast<float>(static_cast<int>(16.0f * s())) * 0.125f;
      break;
    default:  // all negative, with a ramp
      for (size_t i = 0; i < x.size(); ++i) x[i] = -scale * (static_cast<float>(i % 256) / 256.0f + 0.1f * u());
      break;
  }
  return x;
}

std::vector<uint8_t> quantize(DType type, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_size(type, static_cast<int64_t>(x.size())));
  quantize_row_ref(type, x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

std::vector<float> dequantize(DType type, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row_ref(type, q.data(), y.data(), n);
  return y;
}

std::string to_hex(const std::vector<uint8_t>& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s += kDigits[b >> 4];
    s += kDigits[b & 0x0f];
  }
  return s;
}

// Golden blocks: one 256-element row golden_row(kind, seed, 256) each, quantized by llama.cpp
// (ggml at commit c392e5094, `ggml_quantize_chunk(type, x, dst, 0, 1, 256, NULL)`, the call
// llama-quantize makes without an importance matrix), printed as hex. Generated once with a
// throwaway program linking libggml-base; this test does not need llama.cpp.
struct GoldenBlock {
  DType type;
  int kind;
  uint64_t seed;
  const char* hex;
};

const GoldenBlock kGoldenBlocks[] = {
    {DType::kQ4_K, 1, 43,
     "3d38ba4616d050500eca490b7fff8cd6a4206958abe9f7043efd62d6ec2ca79b6782ca49e848479abc7a667e59a0156b"
     "c174b745416abf088bbb80a77982c2a7b76ce4db758dd9a491f772a956288388d2dde7d7d0f8dfd9b6d9c2c0d2c9b0d1"
     "d9c8e1f1d0b407e8ddc2ddf1f8c4ded4b9a88d075b687c7a7baf677c1e8b6dc88599088abfea5a5c0d8e306a5d8869aa"},
    {DType::kQ4_K, 3, 45,
     "0000f83800000000fffffffff0f0f0f00000000000000000000000000000000000000000000000000000000000000000"
     "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
     "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"},
    {DType::kQ4_K, 6, 48,
     "140df71800ff00fe00ff00fd00ae00bdb0c0302010e070f0100090506020e0a07030d03020f0f090a060c09040b04010"
     "2000a06020a030802060206060706070706050f090408070f0e0700040d0e090007040e08070e0f0b0303050b080b070"
     "705040903010503080e02060a0a0c020f070b04000e0f0b06090d040e00080c06080a05030e0d08070c06060a01040b0"},
    {DType::kQ4_K, 9, 51,
     "551cab27fbfbf5fcfcf8fef9dbcbffcbb890537d2361908c72569c5d7d61e8aa2e8706622b1b2ae93c0d66bd1e77e9e9"
     "bd01589370d8886d807f924c742548848016e8e4144f37a2a77fa527043aebca97179ce981de341026b949f2a1014e82"
     "7be7f5e6de9b9176203caaf6084995cc0b0cd7172e2867b3384171dba7419899ad6052de78cb7ddeecead9a362a53b92"},
    {DType::kQ5_K, 1, 43,
     "1a34bb4655d14f500fca490b70ff8cd5eaf0e92163777ff46dff286e67f96aefbde46bede3ed4d6b7be9306d71e678ed"
     "3950c6923aa6f1196fdcc69eab5b3f29b1f68674a27271275be8cfdfa5303cc883ea6f7b82d77f1109792140f3148460"
     "70dae9b8fc2cc35821fee554ae430601a4c9ddbeb0f0bec27bb28480b59260b2b29fd2f2b1770edfa894aae2f0a7bcb8"
     "73611a0eb7d2f904f76fcff93d28dca10b4201057fe5b4aa0b1c70e4cb22d355"},
    {DType::kQ5_K, 3, 45,
     "0000f83800000000fffffffff0f0f0f00000000000000000000000000000000000000000000000000000000000000000"
     "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
     "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
     "0000000000000000000000000000000000000000000000000000000000000000"},
    {DType::kQ5_K, 6, 48,
     "0909c61800ff00fc00ff00ff00de00fd82028820208aa0aa20808200a020a2820080822808828a822aa80202a02a2888"
     "6080503010c0e0d0100010a0c030b030e050a05040d0f01040b0702080508020500050c04040600040d030c0d0e0c0f0"
     "f0d0b0f0309000e0f0e0e00070b0d03000e090d000e0c0e0607060a0600060e0f0b080307020b05010d040c050509040"
     "f0e0609000d0f070c020b090c0101080c01050a060d0b010f080d0c040308060"},
    {DType::kQ5_K, 9, 51,
     "10189e27fafbf7fafefafffaa9ffffea6f42b439607c0e874a349be5a900d7ebd9232ce8f1f5e1cbc9d5f8a311956fbf"
     "7130a7fc56e3402b05cd4accfde3f1574f200ee5592855f47a1cee8c3ff0f3e38a02b137f0d121db11ff43a9095aa128"
     "202de0f829af6f756eff7a5f1965f6a52e3e39d401ae69304d6394e351019f03f8cfeacdbe3722ec507955ec00933a9a"
     "170ace3f4d52ee96618202d77f8241435ce0c4ce00a70cdeeaf5c357e45a7735"},
    {DType::kQ6_K, 1, 43,
     "80b1259e9c351de0f6f0ca08ae5d6afb0d5a06328fbe7ef70ed89aa4b461b529ba9578ddea8a901eb295f74ebaf6b96b"
     "b54f954c8bfc5b770eee786af218c0b7dd382efbe4285095f005ad648cb5c420f4aa83e2c6e9dc48678f04c27799a0d7"
     "e0a72c0c6ca0dcf6e4a78dd06838ac3d017e0406e1cc5043001fd0c5754fa191b56caa293652811d4f8378a1527eb596"
     "a574def25d71e18a8ad645a716284166aab49135577154655e857a5f06994ff789951b9babd6516928a6085b6996589a"
     "e1e115ef14efeaee1714168013d0e5e6a6ae"},
    {DType::kQ6_K, 3, 45,
     "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
     "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
     "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
     "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
     "80808080808080808080808080808080e4a0"},
    {DType::kQ6_K, 6, 48,
     "0000000000000000000000000000000000000000000000000000000000000000ae02ab96939bde1d82a07396a9c689e8"
     "e2b46ae5682300dde6b8cf0aff54af7b0000000000000000000000000000000000000000000000000000000000000000"
     "1f324de3fd53050072b1a2da72eed1f290d94fd6831d49e62bd0789663e33a29080c8040008c048c0040084444404c48"
     "484c40cc8c408044c4c8400408c4c88c0c884880c4080040844c0c8804c4440888484884cc0c084c84008c8844c4c04c"
     "00007f8000007f7f0000828e000082956502"},
    {DType::kQ6_K, 9, 51,
     "12410fd70d0701352baa63f7193702fd0070e5f71ea0c587aba735c7106099692f17799003d275ca4e06b55620c25073"
     "a5aa2d02a3b913113f0b123dc71001b3ee7e2409139d2341ccd7d9e803d3cf78b21095fc2d10b5f971d48bf9926715b6"
     "3a1978739eb9c319d7110c91d41f8c8e5045917507c80a52351174514f5c289bf204688b8ce8a47784b9876b9b186286"
     "4cd61e0bdcbddd4158bc5ad0dcea2121050de72204136dfc1d76bac0a47c9b947b828131a337b4393c2f26418e5af543"
     "7f8c84807c7b778478778080897f7f89b80f"},
};

TEST(QuantK, MatchesLlamaCppGoldenBlocks) {
  for (const GoldenBlock& g : kGoldenBlocks) {
    const std::vector<float> x = golden_row(g.kind, g.seed, kQK_K);
    EXPECT_EQ(to_hex(quantize(g.type, x)), g.hex) << dtype_name(g.type) << " kind " << g.kind;
  }
}

// FNV-1a 64 over the blocks of golden_row(r, 7000 + r, 256) for r = 0..999 (every kind 100
// times), computed from llama.cpp's blocks the same way as kGoldenBlocks.
struct GoldenHash {
  DType type;
  uint64_t fnv1a;
};

const GoldenHash kGoldenHashes[] = {
    {DType::kQ4_K, 0x736f95a810a293afull},
    {DType::kQ5_K, 0x02944589fda4b4a6ull},
    {DType::kQ6_K, 0x429ee84e7ae2c435ull},
    {DType::kQ8_0, 0x8dd210ce0b48e672ull},
    {DType::kQ4_0, 0x7670698b21fc2210ull},
};

TEST(QuantK, MatchesLlamaCppOnAThousandRows) {
  for (const GoldenHash& g : kGoldenHashes) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int r = 0; r < 1000; ++r) {
      for (uint8_t b : quantize(g.type, golden_row(r, 7000 + static_cast<uint64_t>(r), kQK_K))) {
        h ^= b;
        h *= 0x100000001b3ull;
      }
    }
    EXPECT_EQ(h, g.fnv1a) << dtype_name(g.type);
  }
}

TEST(QuantK, DispatchMatchesTheTypedFunctions) {
  const std::vector<float> x = golden_row(1, 5, 4 * kQK_K);
  std::vector<BlockQ4_K> a(4);
  std::vector<BlockQ5_K> b(4);
  std::vector<BlockQ6_K> c(4);
  quantize_row_q4_k_ref(x.data(), a.data(), 4 * kQK_K);
  quantize_row_q5_k_ref(x.data(), b.data(), 4 * kQK_K);
  quantize_row_q6_k_ref(x.data(), c.data(), 4 * kQK_K);
  EXPECT_EQ(std::memcmp(quantize(DType::kQ4_K, x).data(), a.data(), sizeof(BlockQ4_K) * 4), 0);
  EXPECT_EQ(std::memcmp(quantize(DType::kQ5_K, x).data(), b.data(), sizeof(BlockQ5_K) * 4), 0);
  EXPECT_EQ(std::memcmp(quantize(DType::kQ6_K, x).data(), c.data(), sizeof(BlockQ6_K) * 4), 0);
}

TEST(QuantK, SuperBlocksAreIndependent) {
  // A row of four super-blocks quantizes like its four quarters on their own.
  const std::vector<float> x = golden_row(0, 11, 4 * kQK_K);
  for (DType type : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const std::vector<uint8_t> whole = quantize(type, x);
    const size_t block = traits(type).type_size;
    for (size_t i = 0; i < 4; ++i) {
      const std::vector<float> part(x.begin() + static_cast<std::ptrdiff_t>(i * kQK_K),
                                    x.begin() + static_cast<std::ptrdiff_t>((i + 1) * kQK_K));
      const std::vector<uint8_t> q = quantize(type, part);
      EXPECT_EQ(std::memcmp(q.data(), whole.data() + i * block, block), 0) << dtype_name(type) << " block " << i;
    }
  }
}

TEST(QuantK, ZerosStayZero) {
  const std::vector<float> zeros(2 * kQK_K, 0.0f);
  for (DType type : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (float v : dequantize(type, quantize(type, zeros), 2 * kQK_K)) EXPECT_EQ(v, 0.0f) << dtype_name(type);
  }
}

// Rows whose values keep every fp16 scale a normal number: uniform, bell-shaped with 1%
// outliers, positive with an offset, negative ramps; magnitudes 2^-4 .. 2^5.
std::vector<float> normal_row(int kind, uint64_t seed) {
  Rng rng(seed);
  auto u = [&] { return static_cast<float>(rng.uniform()); };
  auto s = [&] { return static_cast<float>(2.0 * rng.uniform() - 1.0); };
  const float scale = std::ldexp(1.0f + u(), static_cast<int>(rng.next() % 9) - 4);
  std::vector<float> x(kQK_K);
  for (size_t i = 0; i < x.size(); ++i) {
    switch (kind) {
      case 0: x[i] = scale * s(); break;
      case 1: x[i] = scale * (s() + s() + s() + s()) * (u() < 0.01f ? 20.0f : 1.0f); break;
      case 2: x[i] = scale * (1.0f + 0.5f * s()); break;
      default: x[i] = -scale * (static_cast<float>(i) / 256.0f + 0.1f * u()); break;
    }
  }
  return x;
}

struct ErrorBound {
  DType type;
  double rmse_uniform;  // RMSE / RMS(x) on uniform rows
  double max_error;     // max |x' - x| / max |x| over every kind
  double requantize;    // max |x'' - x'| / max |x|, x'' = x' quantized again (0: bytes identical)
};

// Bounds about 10% above the worst of 4000 rows when written (uniform RMSE in theory: Q8_0
// 1/(127 sqrt 12) ~ 0.0023 per unit scale, Q4_K 1/(15 sqrt 3) ~ 0.038 of half the range).
const ErrorBound kBounds[] = {
    {DType::kQ8_0, 0.005, 0.005, 0.0},  {DType::kQ4_0, 0.08, 0.135, 0.0}, {DType::kQ4_K, 0.066, 0.13, 0.025},
    {DType::kQ5_K, 0.034, 0.072, 0.036}, {DType::kQ6_K, 0.017, 0.024, 0.009},
};

TEST(QuantK, RoundTripErrorIsBounded) {
  for (const ErrorBound& b : kBounds) {
    double worst_rmse = 0, worst_max = 0, worst_requantize = 0;
    for (int r = 0; r < 1000; ++r) {
      const int kind = r % 4;
      const std::vector<float> x = normal_row(kind, 300 + static_cast<uint64_t>(r));
      const std::vector<uint8_t> q = quantize(b.type, x);
      const std::vector<float> y = dequantize(b.type, q, kQK_K);
      double se = 0, sx = 0, amax = 0, max_error = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double e = static_cast<double>(y[i]) - x[i];
        se += e * e;
        sx += static_cast<double>(x[i]) * x[i];
        amax = std::max(amax, static_cast<double>(std::fabs(x[i])));
        max_error = std::max(max_error, std::fabs(e));
      }
      if (kind == 0) worst_rmse = std::max(worst_rmse, std::sqrt(se / sx));
      worst_max = std::max(worst_max, max_error / amax);

      const std::vector<uint8_t> q2 = quantize(b.type, y);
      if (b.requantize == 0.0) {
        // Q8_0 and Q4_0 map their own output back to the same bytes.
        EXPECT_EQ(to_hex(q2), to_hex(q)) << dtype_name(b.type) << " row " << r;
      } else {
        // The K-quants' scale search may settle elsewhere, but only by a fraction of a step.
        const std::vector<float> y2 = dequantize(b.type, q2, kQK_K);
        for (size_t i = 0; i < y.size(); ++i) {
          worst_requantize = std::max(worst_requantize, std::fabs(static_cast<double>(y2[i]) - y[i]) / amax);
        }
      }
    }
    EXPECT_LE(worst_rmse, b.rmse_uniform) << dtype_name(b.type);
    EXPECT_LE(worst_max, b.max_error) << dtype_name(b.type);
    EXPECT_LE(worst_requantize, b.requantize) << dtype_name(b.type);
  }
}

TEST(QuantK, ConstantRowsAreNearlyExact) {
  // Only the fp16 rounding of the super-block scale is lost, while it stays a normal number
  // (Q6_K's is c / 4096: c >= 0.25).
  for (DType type : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (float c : {1.0f, -3.5f, 0.5f, 100.0f}) {
      const std::vector<float> x(kQK_K, c);
      for (float v : dequantize(type, quantize(type, x), kQK_K)) {
        EXPECT_NEAR(v, c, std::fabs(c) * 2e-3) << dtype_name(type) << " c=" << c;
      }
    }
  }
}

}  // namespace
}  // namespace duet
