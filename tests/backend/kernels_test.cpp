// Every kernel of every ISA this machine can run against the scalar reference, odd sizes included.
// A kernel table is tested only on a CPU that has its instruction set: `--isa=NAME` tests the
// scalar table and NAME's, and exits 77 (a CTest skip, with the reason) where the CPU lacks NAME,
// so a machine without AVX-512 reports the AVX-512 table as not run instead of passing it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/backend/cpu/kernels.h"
#include "duet/backend/cpu/packed.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"

#ifdef DUET_EXPECT_ISA
#define DUET_STR2(x) #x
#define DUET_STR(x) DUET_STR2(x)
#define DUET_EXPECT_ISA_NAME DUET_STR(DUET_EXPECT_ISA)
#endif

namespace duet::cpu {

// The ISAs under test: the generic table and the one --isa named, or every available one.
std::vector<Isa>& isas_under_test() {
  static std::vector<Isa> isas;
  return isas;
}

namespace {

std::vector<Isa> tested_isas() { return isas_under_test().empty() ? available_isas() : isas_under_test(); }

std::vector<float> random_vector(int64_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * static_cast<float>(2.0 * rng.uniform() - 1.0);
  return v;
}

double nmse(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(ref[i]) - got[i]) * (static_cast<double>(ref[i]) - got[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den == 0.0 ? num : num / den;
}

TEST(Kernels, DequantizeMatchesReferenceExactly) {
  const Kernels& ref = kernels_generic();
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    for (DType type : {DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
      const int64_t block = traits(type).block_size;
      for (int64_t n : {32, 64, 4096, 4128}) {
        if (block == 1 && n == 4128) n = 4097;  // odd tail for plain types
        const std::vector<float> x = random_vector(n, static_cast<uint64_t>(n) + 3, 3.0f);
        std::vector<uint8_t> packed(row_size(type, n));
        quantize_row_ref(type, x.data(), packed.data(), n);
        std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
        dequantize_fn(ref, type)(packed.data(), a.data(), n);
        dequantize_fn(k, type)(packed.data(), b.data(), n);
        EXPECT_EQ(a, b) << "isa=" << isa_name(isa) << " type=" << dtype_name(type) << " n=" << n;
      }
    }
  }
}

TEST(Kernels, GemmMatchesReference) {
  const Kernels& ref = kernels_generic();
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    for (int64_t kdim : {1, 7, 31, 32, 33, 256, 4097}) {
      for (int64_t m : {1, 2, 3, 4, 7}) {
        for (int64_t nw : {1, 3, 4, 5, 16}) {
          const std::vector<float> w = random_vector(nw * kdim, 17 + static_cast<uint64_t>(kdim));
          const std::vector<float> x = random_vector(m * kdim, 29 + static_cast<uint64_t>(m));
          const int64_t ldy = nw + 2;
          std::vector<float> a(static_cast<size_t>(m * ldy), -7.0f), b(static_cast<size_t>(m * ldy), -7.0f);
          ref.gemm_f32(w.data(), nw, x.data(), m, kdim, a.data(), ldy);
          k.gemm_f32(w.data(), nw, x.data(), m, kdim, b.data(), ldy);
          EXPECT_LE(nmse(a, b), 1e-10) << "isa=" << isa_name(isa) << " k=" << kdim << " m=" << m << " nw=" << nw;
          for (int64_t i = 0; i < m; ++i) {  // the padding between rows is untouched
            EXPECT_EQ(b[static_cast<size_t>(i * ldy + nw)], -7.0f);
          }
        }
      }
    }
  }
}

TEST(Kernels, VectorOpsMatchReference) {
  const Kernels& ref = kernels_generic();
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    for (int64_t n : {1, 7, 31, 32, 33, 4096, 4097}) {
      const std::vector<float> x = random_vector(n, 1), y0 = random_vector(n, 2), w = random_vector(n, 3);
      EXPECT_NEAR(ref.dot_f32(x.data(), y0.data(), n), k.dot_f32(x.data(), y0.data(), n), 1e-4 * std::sqrt(n));
      std::vector<float> a = y0, b = y0;
      ref.axpy_f32(0.37f, x.data(), a.data(), n);
      k.axpy_f32(0.37f, x.data(), b.data(), n);
      EXPECT_LE(nmse(a, b), 1e-12) << isa_name(isa) << " axpy n=" << n;
      std::vector<float> ra(static_cast<size_t>(n)), rb(static_cast<size_t>(n));
      ref.rms_norm_f32(x.data(), w.data(), ra.data(), n, 1e-6f);
      k.rms_norm_f32(x.data(), w.data(), rb.data(), n, 1e-6f);
      EXPECT_LE(nmse(ra, rb), 1e-12) << isa_name(isa) << " rms_norm n=" << n;
      ref.silu_mul_f32(x.data(), w.data(), ra.data(), n);
      k.silu_mul_f32(x.data(), w.data(), rb.data(), n);
      EXPECT_LE(nmse(ra, rb), 1e-12) << isa_name(isa) << " silu_mul n=" << n;
    }
  }
}

// AVX-512's silu_mul gives the bits of AVX2's (the same operations lane for lane, the last n % 8
// elements through std::exp in both), so a model's SiLU does not depend on which table runs it.
TEST(Kernels, SiluMulOfAvx512GivesTheBitsOfAvx2) {
  bool ran = false;
  for (Isa isa : tested_isas()) {
    if (isa != Isa::kAvx512) continue;
    ran = true;
    const Kernels& avx512 = kernels_for(isa);
    const Kernels& avx2 = kernels_for(Isa::kAvx2);
    for (int64_t n = 1; n <= 70; ++n) {
      const std::vector<float> g = random_vector(n, 5 + static_cast<uint64_t>(n), 12.0f);
      const std::vector<float> u = random_vector(n, 90 + static_cast<uint64_t>(n));
      std::vector<float> want(static_cast<size_t>(n)), got(want.size(), -1.0f);
      avx2.silu_mul_f32(g.data(), u.data(), want.data(), n);
      avx512.silu_mul_f32(g.data(), u.data(), got.data(), n);
      ASSERT_EQ(got, want) << "n=" << n;
    }
  }
  if (!ran) GTEST_SKIP() << "the avx512 table is not under test here";
}

// The f16 KV cache: every ISA rounds a row to the same halves as the scalar reference (nearest
// even, subnormals and overflow to infinity included), so a cache written on one thread count or
// ISA holds the same bits.
// DeepSeek-V3.2's indexer totals: every ISA gives the bits of the scalar formula (fma chains in
// order), for head counts and key counts around the vector widths.
TEST(Kernels, IndexTotalsGiveTheScalarFormulasBits) {
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    SCOPED_TRACE(isa_name(isa));
    size_t positive = 0;
    for (const auto& [heads, d, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 8, 1}, {3, 16, 7}, {4, 24, 16},
                                      {6, 32, 37}, {9, 64, 100}, {5, 16, 33}, {8, 8, 64}, {4, 10, 20}, {7, 6, 18}}) {
      const std::vector<float> q = random_vector(heads * d, 1 + n), keys = random_vector(n * d, 2 + n),
                               w = random_vector(heads, 3 + n);
      std::vector<float> keys16(static_cast<size_t>((n + 15) / 16 * 16 * d)), total(static_cast<size_t>(n), -1.0f);
      index_keys16(keys.data(), n, d, keys16.data());
      k.index_totals(q.data(), heads, d, keys16.data(), n, w.data(), total.data());
      for (int64_t s = 0; s < n; ++s) {
        float t = 0.0f;
        for (int64_t h = 0; h < heads; ++h) {
          float score = 0.0f;
          for (int64_t p = 0; p < d; ++p) score = std::fma(q[h * d + p], keys[s * d + p], score);
          t = std::fma(w[h], std::max(0.0f, score), t);
        }
        ASSERT_EQ(total[s], t) << "heads " << heads << " d " << d << " key " << s;
        positive += t > 0.0f;
      }
    }
    EXPECT_GT(positive, 20u);
  }
}

TEST(Kernels, F32ToF16RoundsLikeTheReference) {
  std::vector<float> x;
  Rng rng(41);
  for (int i = 0; i < 4000; ++i) {
    const double mag = std::ldexp(rng.uniform(), static_cast<int>(rng.next() % 50) - 30);  // 2^-30 .. 2^19
    x.push_back(static_cast<float>(rng.uniform() < 0.5 ? -mag : mag));
  }
  for (float v : {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f, 5.96e-8f, 2.98e-8f, 6.1e-5f}) x.push_back(v);
  x.push_back(std::ldexp(1.0f, -14) + std::ldexp(1.0f, -25));  // halfway cases in both ranges
  x.push_back(1.0f + std::ldexp(1.0f, -11));
  x.push_back(1.0f + 3 * std::ldexp(1.0f, -11));
  x.push_back(std::ldexp(3.0f, -25));
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    ASSERT_NE(k.f32_to_f16, nullptr) << isa_name(isa);
    for (size_t n : {x.size(), size_t{7}, size_t{9}}) {
      std::vector<uint16_t> y(n + 1, 0xabcd);
      k.f32_to_f16(x.data(), y.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], fp32_to_fp16(x[i])) << isa_name(isa) << " x=" << x[i];
      EXPECT_EQ(y[n], 0xabcd);
    }
  }
}

// Attention's scores against double, and each score the same bits whichever rows and keys are
// computed beside it (a token's attention must not depend on its batch or chunking).
TEST(Kernels, AttentionScoresMatchDoubleAndDoNotDependOnTheirNeighbours) {
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    for (int64_t dk : {1, 5, 8, 17, 64, 128, 576}) {
      const int64_t rows = 7, nk = 11, ldq = dk + 3, ldk = dk + 5, lds = nk + 2;
      const std::vector<float> q = random_vector(rows * ldq, 60 + static_cast<uint64_t>(dk));
      const std::vector<float> keys = random_vector(nk * ldk, 61 + static_cast<uint64_t>(dk), 3.0f);
      std::vector<float> s(static_cast<size_t>(rows * lds), -5.0f);
      k.attn_scores[kAttnF32](q.data(), ldq, rows, keys.data(), ldk, nk, dk, 0.3f, s.data(), lds);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < nk; ++j) {
          double want = 0.0, mag = 0.0;
          for (int64_t c = 0; c < dk; ++c) {
            want += static_cast<double>(q[r * ldq + c]) * keys[j * ldk + c];
            mag += std::fabs(static_cast<double>(q[r * ldq + c]) * keys[j * ldk + c]);
          }
          EXPECT_NEAR(s[r * lds + j], 0.3 * want, 1e-6 * (1.0 + mag)) << isa_name(isa) << " dk=" << dk;
          float one;
          k.attn_scores[kAttnF32](q.data() + r * ldq, ldq, 1, keys.data() + j * ldk, ldk, 1, dk, 0.3f, &one, 1);
          ASSERT_EQ(one, s[r * lds + j]) << isa_name(isa) << " dk=" << dk << " r=" << r << " j=" << j;
        }
        for (int64_t j = nk; j < lds; ++j) EXPECT_EQ(s[r * lds + j], -5.0f);
      }
    }
  }
}

// p = exp(s - m) (a vectorized exp on x86 and NEON) and its sum against double, over scores of a
// few units and of hundreds (e^-100 underflows to 0, nothing becomes NaN), every tail length;
// an element's value does not depend on where the row ends.
TEST(Kernels, ExpSumMatchesDouble) {
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    for (float spread : {1.0f, 8.0f, 200.0f}) {
      for (int64_t n : {1, 2, 7, 8, 9, 31, 100, 257}) {
        std::vector<float> x = random_vector(n, 90 + static_cast<uint64_t>(n), spread);
        x.push_back(-1.0f);
        double max = -1e300, sum = 0.0;
        for (int64_t j = 0; j < n; ++j) max = std::max(max, static_cast<double>(x[j]));
        for (int64_t j = 0; j < n; ++j) sum += std::exp(x[j] - max);
        std::vector<float> y = x;
        const float got = k.exp_sum_f32(y.data(), n, static_cast<float>(max));
        EXPECT_NEAR(got, sum, 1e-6 * sum) << isa_name(isa) << " n=" << n;
        for (int64_t j = 0; j < n; ++j) {
          const double want = std::exp(x[j] - max);
          ASSERT_TRUE(std::isfinite(y[j])) << isa_name(isa);
          EXPECT_NEAR(y[j], want, 1e-6 * want + 1e-30) << isa_name(isa) << " n=" << n << " spread=" << spread;
          float alone = x[j];
          k.exp_sum_f32(&alone, 1, static_cast<float>(max));
          ASSERT_EQ(alone, y[j]) << isa_name(isa) << " n=" << n << " j=" << j;
        }
        EXPECT_EQ(y[n], -1.0f);
      }
    }
  }
}

// Weighted sums of values against double; every element is one FMA chain over the keys in
// order, so it is the same bits in any row or column tile, and a sum continued over two calls
// (accumulate) equals the sum in one.
TEST(Kernels, AttentionValuesMatchDoubleAndAreOneChainPerElement) {
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    for (int64_t dv : {1, 7, 8, 64, 100, 128, 512}) {
      for (int64_t nk : {1, 3, 40}) {
        const int64_t rows = 5, ldp = nk + 1, ldv = dv + 3, ldo = dv + 2;
        const std::vector<float> p = random_vector(rows * ldp, 3 + static_cast<uint64_t>(nk));
        const std::vector<float> v = random_vector(nk * ldv, 5 + static_cast<uint64_t>(dv));
        std::vector<float> o(static_cast<size_t>(rows * ldo), -5.0f);
        k.attn_values[kAttnF32](p.data(), ldp, rows, v.data(), ldv, nk, dv, o.data(), ldo, false);
        const int64_t half = nk / 2;
        std::vector<float> two(static_cast<size_t>(rows * ldo), -5.0f);
        k.attn_values[kAttnF32](p.data(), ldp, rows, v.data(), ldv, half, dv, two.data(), ldo, false);
        k.attn_values[kAttnF32](p.data() + half, ldp, rows, v.data() + half * ldv, ldv, nk - half, dv, two.data(), ldo,
                      half > 0);
        ASSERT_EQ(o, two) << isa_name(isa) << " dv=" << dv << " nk=" << nk;
        for (int64_t r = 0; r < rows; ++r) {  // a row alone (its own, wider tiles) gives its bits among others
          std::vector<float> alone(static_cast<size_t>(ldo), -5.0f);
          k.attn_values[kAttnF32](p.data() + r * ldp, ldp, 1, v.data(), ldv, nk, dv, alone.data(), ldo, false);
          ASSERT_TRUE(std::equal(alone.begin(), alone.end(), o.begin() + r * ldo))
              << isa_name(isa) << " dv=" << dv << " nk=" << nk << " row " << r;
        }
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < dv; ++c) {
            double want = 0.0, mag = 0.0;
            for (int64_t j = 0; j < nk; ++j) {
              want += static_cast<double>(p[r * ldp + j]) * v[j * ldv + c];
              mag += std::fabs(static_cast<double>(p[r * ldp + j]) * v[j * ldv + c]);
            }
            EXPECT_NEAR(o[r * ldo + c], want, 1e-6 * (1.0 + mag)) << isa_name(isa) << " dv=" << dv << " nk=" << nk;
            float one;
            k.attn_values[kAttnF32](p.data() + r * ldp, ldp, 1, v.data() + c, ldv, nk, 1, &one, 1, false);
            ASSERT_EQ(one, o[r * ldo + c]) << isa_name(isa) << " dv=" << dv << " nk=" << nk << " c=" << c;
          }
          for (int64_t c = dv; c < ldo; ++c) EXPECT_EQ(o[r * ldo + c], -5.0f);
        }
      }
    }
  }
}

// Keys and values read in place from an f16 or q8_0 cache give exactly what the f32 kernels
// give on the rows converted to f32 (the conversion is exact), tails and strides included.
TEST(Kernels, AttentionOnCacheRowsEqualsTheF32KernelsOnTheirValues) {
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    for (int64_t d : {32, 64, 96, 128, 576}) {
      const int64_t rows = 5, nk = 9, ld = d + 64;  // rows of the cache are `ld` apart
      const std::vector<float> x = random_vector(nk * ld, 30 + static_cast<uint64_t>(d), 4.0f);
      const std::vector<float> q = random_vector(rows * d, 31);
      const std::vector<float> p = random_vector(rows * nk, 32);
      std::vector<uint16_t> h(x.size());
      std::vector<BlockQ8_0> b(x.size() / 32);
      std::vector<float> from_h(x.size()), from_b(x.size());
      for (size_t i = 0; i < x.size(); ++i) from_h[i] = fp16_to_fp32(h[i] = fp32_to_fp16(x[i]));
      quantize_row_q8_0_ref(x.data(), b.data(), static_cast<int64_t>(x.size()));
      dequantize_row_ref(DType::kQ8_0, b.data(), from_b.data(), static_cast<int64_t>(x.size()));
      for (int t : {kAttnF16, kAttnQ8_0}) {
        if (t == kAttnF16 && d == 576) continue;
        const void* cache = t == kAttnF16 ? static_cast<const void*>(h.data()) : static_cast<const void*>(b.data());
        const std::vector<float>& f32 = t == kAttnF16 ? from_h : from_b;
        const int64_t dk = t == kAttnF16 ? d - 3 : d;  // f16 rows with a tail too
        std::vector<float> s1(static_cast<size_t>(rows * nk)), s2(s1.size());
        k.attn_scores[t](q.data(), d, rows, cache, ld, nk, dk, 0.5f, s1.data(), nk);
        k.attn_scores[kAttnF32](q.data(), d, rows, f32.data(), ld, nk, dk, 0.5f, s2.data(), nk);
        ASSERT_EQ(s1, s2) << isa_name(isa) << " type " << t << " d=" << d;
        std::vector<float> o1(static_cast<size_t>(rows * dk)), o2(o1.size());
        k.attn_values[t](p.data(), nk, rows, cache, ld, nk, dk, o1.data(), dk, false);
        k.attn_values[kAttnF32](p.data(), nk, rows, f32.data(), ld, nk, dk, o2.data(), dk, false);
        ASSERT_EQ(o1, o2) << isa_name(isa) << " type " << t << " d=" << d;
      }
    }
  }
}

// The heads kernels (one query row per head, the heads side by side in each cache row) give the
// bits of the one-row kernels called head by head, for every cache type, head count (groups of
// four and remainders), tail and key count; a values sum continued over calls included.
TEST(Kernels, AttentionHeadsKernelsGiveTheBitsOfTheKernelsHeadByHead) {
  bool ran = false;
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    for (int t : {kAttnF32, kAttnF16, kAttnQ8_0}) {
      if (k.attn_scores_heads[t] == nullptr || k.attn_values_heads[t] == nullptr) continue;
      ran = true;
      for (int64_t heads : {1, 3, 4, 5, 8, 16}) {
        for (int64_t d : {32, 64, 125, 128}) {
          if (t == kAttnQ8_0 && d % 32 != 0) continue;
          const int64_t ld = heads * d + 64;  // cache rows `ld` elements apart, a multiple of 32 for q8_0
          for (int64_t nk : {1, 7, 16}) {
            const uint64_t seed = static_cast<uint64_t>(heads * 1000 + d * 10 + nk + 100000 * t);
            const std::vector<float> x = random_vector(nk * ld, seed, 4.0f);
            std::vector<uint16_t> h(x.size());
            for (size_t i = 0; i < x.size(); ++i) h[i] = fp32_to_fp16(x[i]);
            std::vector<BlockQ8_0> b(x.size() / 32);
            quantize_row_q8_0_ref(x.data(), b.data(), static_cast<int64_t>(x.size()));
            const void* cache = t == kAttnF32   ? static_cast<const void*>(x.data())
                                : t == kAttnF16 ? static_cast<const void*>(h.data())
                                                : static_cast<const void*>(b.data());
            auto col = [&](int64_t c) -> const void* {
              if (t == kAttnF32) return x.data() + c;
              if (t == kAttnF16) return h.data() + c;
              return b.data() + c / 32;
            };
            const int64_t ldq = d + 3, lds = nk + 2, ldp = nk + 1, ldo = d + 5;
            const std::vector<float> q = random_vector(heads * ldq, seed + 1);
            std::vector<float> s(static_cast<size_t>(heads * lds), -5.0f), want_s = s;
            k.attn_scores_heads[t](q.data(), ldq, heads, cache, ld, nk, d, 0.3f, s.data(), lds);
            for (int64_t r = 0; r < heads; ++r) {
              k.attn_scores[t](q.data() + r * ldq, ldq, 1, col(r * d), ld, nk, d, 0.3f, want_s.data() + r * lds, lds);
            }
            ASSERT_EQ(s, want_s) << isa_name(isa) << " type " << t << " heads=" << heads << " d=" << d << " nk=" << nk;
            const std::vector<float> p = random_vector(heads * ldp, seed + 2);
            for (bool accumulate : {false, true}) {
              std::vector<float> o = random_vector(heads * ldo, seed + 3), want_o = o;
              k.attn_values_heads[t](p.data(), ldp, heads, cache, ld, nk, d, o.data(), ldo, accumulate);
              for (int64_t r = 0; r < heads; ++r) {
                k.attn_values[t](p.data() + r * ldp, ldp, 1, col(r * d), ld, nk, d, want_o.data() + r * ldo, ldo,
                                 accumulate);
              }
              ASSERT_EQ(o, want_o) << isa_name(isa) << " type " << t << " heads=" << heads << " d=" << d
                                   << " nk=" << nk << " accumulate=" << accumulate;
            }
          }
        }
      }
    }
  }
  if (!ran) GTEST_SKIP() << "no table under test here has the heads kernels";
}

TEST(Kernels, ScaleAddIsOneFmaPerElement) {
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    for (int64_t n : {1, 7, 8, 17, 512}) {
      const std::vector<float> x = random_vector(n, 7), y0 = random_vector(n + 1, 8);
      std::vector<float> y = y0;
      k.scale_add_f32(y.data(), 0.7f, x.data(), 1.3f, n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], std::fma(x[i], 1.3f, y0[i] * 0.7f)) << isa_name(isa);
      EXPECT_EQ(y[n], y0[n]);
    }
  }
}

// The KV cache's rows become f32 exactly on every ISA (attention converts them before use).
TEST(Kernels, CacheRowsConvertExactly) {
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    for (int64_t d : {32, 128, 576}) {
      const std::vector<float> x = random_vector(d, 9, 5.0f);
      std::vector<uint16_t> h(static_cast<size_t>(d));
      for (int64_t i = 0; i < d; ++i) h[i] = fp32_to_fp16(x[i]);
      std::vector<BlockQ8_0> q(static_cast<size_t>(d / 32));
      quantize_row_q8_0_ref(x.data(), q.data(), d);
      std::vector<float> want(static_cast<size_t>(d)), got(static_cast<size_t>(d));
      for (int64_t i = 0; i < d; ++i) want[i] = fp16_to_fp32(h[i]);
      k.dequantize_f16(h.data(), got.data(), d);
      ASSERT_EQ(want, got) << isa_name(isa);
      for (int64_t i = 0; i < d; ++i) {
        want[i] = static_cast<float>(static_cast<double>(fp16_to_fp32(q[i / 32].d)) * q[i / 32].qs[i % 32]);
      }
      k.dequantize_q8_0(q.data(), got.data(), d);
      ASSERT_EQ(want, got) << isa_name(isa);
    }
  }
}

TEST(Kernels, QuantizeQ8AIsExactlyTheReference) {
  const Kernels& ref = kernels_generic();
  for (Isa isa : tested_isas()) {
    const Kernels& k = kernels_for(isa);
    for (int64_t n : {32, 64, 4096}) {
      std::vector<float> x = random_vector(n, 77 + static_cast<uint64_t>(n), 5.0f);
      x[3] = 0.0f;
      if (n > 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block
      std::vector<BlockQ8A> a(static_cast<size_t>(n / 32)), b(static_cast<size_t>(n / 32));
      ref.quantize_q8a(x.data(), a.data(), n);
      k.quantize_q8a(x.data(), b.data(), n);
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].d, b[i].d) << isa_name(isa) << " block " << i;
        EXPECT_EQ(a[i].sum, b[i].sum) << isa_name(isa) << " block " << i;
        EXPECT_EQ(0, std::memcmp(a[i].qs, b[i].qs, 32)) << isa_name(isa) << " block " << i;
      }
    }
  }
}

TEST(Kernels, IntegerGemmMatchesReferenceAndDequantizedMath) {
  const Kernels& ref = kernels_generic();
  for (DType type : {DType::kQ4_0, DType::kQ8_0}) {
    for (int64_t nb : {1, 2, 3, 64}) {
      const int64_t k = nb * 32;
      for (int64_t nw : {1, 4, 5, 9, 64}) {
        for (int64_t m : {1, 2, 3, 4, 7, 11}) {
          const std::vector<float> wf = random_vector(nw * k, 5 + static_cast<uint64_t>(nb));
          const std::vector<float> x = random_vector(m * k, 9 + static_cast<uint64_t>(m), 2.0f);
          const size_t rb = row_size(type, k);
          std::vector<uint8_t> w(rb * static_cast<size_t>(nw));
          for (int64_t j = 0; j < nw; ++j) quantize_row_ref(type, wf.data() + j * k, w.data() + j * rb, k);
          std::vector<BlockQ8A> a(static_cast<size_t>(m * nb));
          for (int64_t i = 0; i < m; ++i) ref.quantize_q8a(x.data() + i * k, a.data() + i * nb, k);
          const int64_t ldy = nw + 1;
          std::vector<float> want(static_cast<size_t>(m * ldy), -5.0f);
          qgemm_fn(ref, type)(w.data(), rb, nw, a.data(), m, nb, want.data(), ldy);
          // The reference itself: the integer dot product equals the dot product of the
          // dequantized weights and the dequantized activations. Float sums of many terms are
          // compared relative to the sum of the terms' magnitudes (what rounding scales with).
          std::vector<double> mag(static_cast<size_t>(m * ldy));
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < nw; ++j) {
              std::vector<float> wd(static_cast<size_t>(k));
              dequantize_row_ref(type, w.data() + j * rb, wd.data(), k);
              double dot = 0.0, abs_dot = 0.0;
              for (int64_t c = 0; c < k; ++c) {
                const BlockQ8A& blk = a[static_cast<size_t>(i * nb + c / 32)];
                dot += static_cast<double>(wd[c]) * blk.d * blk.qs[c % 32];
                abs_dot += std::fabs(static_cast<double>(wd[c]) * blk.d * blk.qs[c % 32]);
              }
              mag[i * ldy + j] = 1.0 + abs_dot;
              EXPECT_NEAR(want[i * ldy + j], dot, 1e-5 * mag[i * ldy + j]);
            }
          }
          for (Isa isa : tested_isas()) {
            const QGemmFn fn = qgemm_fn(kernels_for(isa), type);
            ASSERT_NE(fn, nullptr);
            std::vector<float> got(static_cast<size_t>(m * ldy), -5.0f);
            fn(w.data(), rb, nw, a.data(), m, nb, got.data(), ldy);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < nw; ++j) {
                EXPECT_NEAR(got[i * ldy + j], want[i * ldy + j], 1e-5 * mag[i * ldy + j])
                    << isa_name(isa) << " " << dtype_name(type) << " nb=" << nb << " nw=" << nw << " m=" << m;
              }
              EXPECT_EQ(got[i * ldy + nw], -5.0f);  // padding untouched
              // Batch invariance: a row computed alone is bit-identical to the same row in a
              // batch, or a sequence's next token would depend on who else is being served.
              std::vector<float> alone(static_cast<size_t>(nw));
              fn(w.data(), rb, nw, a.data() + i * nb, 1, nb, alone.data(), nw);
              for (int64_t j = 0; j < nw; ++j) {
                ASSERT_EQ(alone[j], got[i * ldy + j])
                    << isa_name(isa) << " " << dtype_name(type) << " nb=" << nb << " nw=" << nw << " m=" << m;
              }
            }
          }
        }
      }
    }
  }
}

// K-quant blocks with random bytes and sane fp16 scales: every layout position is exercised
// without needing a quantizer.
std::vector<uint8_t> random_k_blocks(DType type, int64_t rows, int64_t k, uint64_t seed) {
  Rng rng(seed);
  const size_t rb = row_size(type, k);
  std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
  for (uint8_t& b : w) b = static_cast<uint8_t>(rng.next());
  const size_t block = traits(type).type_size;
  for (size_t off = 0; off < w.size(); off += block) {
    auto set_half = [&](size_t at, float v) {
      const uint16_t h = fp32_to_fp16(v);
      std::memcpy(&w[off + at], &h, 2);
    };
    if (type == DType::kQ4_K) {
      set_half(0, static_cast<float>(rng.uniform()) * 0.01f);
      set_half(2, static_cast<float>(rng.uniform()) * 0.01f);
    } else if (type == DType::kQ5_0) {
      set_half(0, static_cast<float>(rng.uniform()) * 0.05f);
    } else if (type == DType::kQ4_1) {
      set_half(0, static_cast<float>(rng.uniform()) * 0.05f);
      set_half(2, static_cast<float>(rng.uniform() - 0.5) * 0.5f);
    } else {  // Q6_K: d is the last field
      set_half(block - 2, static_cast<float>(rng.uniform()) * 0.01f);
    }
  }
  return w;
}

// Weights of `type` for `rows` rows of k values: quantized from random floats, or random bytes
// with sane scales for the K-quants and Q5_0 (every bit of the layout exercised).
std::vector<uint8_t> random_weights(DType type, int64_t rows, int64_t k, uint64_t seed) {
  if (type == DType::kQ4_K || type == DType::kQ6_K || type == DType::kQ5_0 || type == DType::kQ4_1) {
    return random_k_blocks(type, rows, k, seed);
  }
  const size_t rb = row_size(type, k);
  const std::vector<float> wf = random_vector(rows * k, seed);
  std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
  for (int64_t j = 0; j < rows; ++j) quantize_row_ref(type, wf.data() + j * k, w.data() + j * rb, k);
  return w;
}

// The scalar reference of weights x Q8A activations; for types without an integer reference
// (Q5_0), the dequantized weights times the dequantized activations in double.
void reference_qgemm(DType type, const uint8_t* w, size_t rb, int64_t nw, const BlockQ8A* a, int64_t m, int64_t nb,
                     float* y, int64_t ldy) {
  const Kernels& ref = kernels_generic();
  if (const QGemmFn fn = qgemm_fn(ref, type)) return fn(w, rb, nw, a, m, nb, y, ldy);
  const int64_t k = nb * 32;
  std::vector<float> wd(static_cast<size_t>(k));
  for (int64_t j = 0; j < nw; ++j) {
    dequantize_fn(ref, type)(w + j * rb, wd.data(), k);
    for (int64_t i = 0; i < m; ++i) {
      double dot = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const BlockQ8A& blk = a[i * nb + c / 32];
        dot += static_cast<double>(wd[c]) * blk.d * blk.qs[c % 32];
      }
      y[i * ldy + j] = static_cast<float>(dot);
    }
  }
}

TEST(Kernels, PackingRoundTripsAndPadsWithZeroScales) {
  for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K}) {
    const int64_t per_block = traits(type).block_size / 32;  // activation blocks per weight block
    for (int64_t rows : {1, 15, 16, 17, 40}) {
      for (int64_t blocks : {1, 3, 8}) {
        const int64_t nb = blocks * per_block;
        const int64_t k = nb * 32;
        const size_t rb = row_size(type, k);
        const std::vector<uint8_t> w = random_weights(type, rows, k, 77 + static_cast<uint64_t>(rows));
        const size_t bytes = packed_bytes(type, rows, nb);
        const int64_t groups = (rows + kPackRows - 1) / kPackRows;
        // The size of the original (with the last group's padding rows), plus the unpacked
        // 6-bit scales and mins of Q4_K: 64 bytes per super-block and group.
        EXPECT_EQ(bytes, rb * static_cast<size_t>(groups * kPackRows) +
                             (type == DType::kQ4_K ? static_cast<size_t>(64 * groups * blocks) : 0));
        std::vector<uint8_t> packed(bytes, 0xAB);
        pack_rows16(type, w.data(), rb, rows, nb, packed.data(), 0, groups);
        std::vector<uint8_t> back(w.size(), 0);
        unpack_rows16(type, packed.data(), rows, nb, back.data(), rb);
        EXPECT_EQ(back, w) << dtype_name(type) << " rows=" << rows << " nb=" << nb;
        // Padding rows: scale 0 in every block (the scales come first in each packed block).
        const size_t block_stride = packed_bytes(type, kPackRows, nb) / static_cast<size_t>(blocks);
        for (int64_t row = rows; row < groups * kPackRows; ++row) {
          for (int64_t b = 0; b < blocks; ++b) {
            const uint8_t* s0 = packed.data() + static_cast<size_t>((row / kPackRows) * blocks + b) * block_stride;
            EXPECT_EQ(s0[2 * (row % kPackRows)], 0);
            EXPECT_EQ(s0[2 * (row % kPackRows) + 1], 0);
          }
        }
      }
    }
  }
}

TEST(Kernels, PackedGemmMatchesReferenceAndIsBatchInvariant) {
  const Kernels& ref = kernels_generic();
  for (Isa isa : tested_isas()) {
    int tested = 0;
    for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K}) {
      const PackedGemmFn fn = packed_gemm_fn(kernels_for(isa), type);
      if (fn == nullptr) continue;
      ++tested;
      const int64_t per_block = traits(type).block_size / 32;
      for (int64_t blocks : {1, 2, 3, 16, 40}) {
        const int64_t nb = blocks * per_block;
        const int64_t k = nb * 32;
        for (int64_t nw : {1, 15, 16, 17, 48}) {
          for (int64_t m : {1, 2, 6, 7, 8, 9, 16, 21, 31}) {
            const std::vector<uint8_t> w = random_weights(type, nw, k, 15 + static_cast<uint64_t>(nb));
            const std::vector<float> x = random_vector(m * k, 19 + static_cast<uint64_t>(m), 2.0f);
            const size_t rb = row_size(type, k);
            const int64_t groups = (nw + kPackRows - 1) / kPackRows;
            std::vector<uint8_t> packed(packed_bytes(type, nw, nb));
            pack_rows16(type, w.data(), rb, nw, nb, packed.data(), 0, groups);
            std::vector<BlockQ8A> a(static_cast<size_t>(m * nb));
            for (int64_t i = 0; i < m; ++i) ref.quantize_q8a(x.data() + i * k, a.data() + i * nb, k);
            // Q6_K's half sums, as the backend passes them (the other types take nullptr).
            std::vector<int32_t> half(static_cast<size_t>(2 * m * nb));
            half_sums(a.data(), m * nb, half.data());
            auto half_of = [&](int64_t i) { return type == DType::kQ6_K ? half.data() + 2 * i * nb : nullptr; };
            const int64_t ldy = nw + 1;
            std::vector<float> want(static_cast<size_t>(m * ldy), -5.0f), got(want);
            reference_qgemm(type, w.data(), rb, nw, a.data(), m, nb, want.data(), ldy);
            fn(packed.data(), nw, a.data(), half_of(0), m, nb, got.data(), ldy);
            for (int64_t i = 0; i < m; ++i) {
              // Rounding scales with the sum of the terms' magnitudes: |w| * |a| summed.
              double mag = 1.0;
              for (int64_t j = 0; j < nw; ++j) {
                std::vector<float> wd(static_cast<size_t>(k));
                dequantize_fn(ref, type)(w.data() + j * rb, wd.data(), k);
                double s = 0.0;
                for (int64_t c = 0; c < k; ++c) s += std::fabs(static_cast<double>(wd[c]) * x[i * k + c]);
                mag = std::max(mag, 1.0 + s);
              }
              for (int64_t j = 0; j < nw; ++j) {
                EXPECT_NEAR(got[i * ldy + j], want[i * ldy + j], 1e-5 * mag)
                    << isa_name(isa) << " " << dtype_name(type) << " nb=" << nb << " nw=" << nw << " m=" << m;
              }
              EXPECT_EQ(got[i * ldy + nw], -5.0f);  // only the matrix's rows are written
              std::vector<float> alone(static_cast<size_t>(nw));
              fn(packed.data(), nw, a.data() + i * nb, half_of(i), 1, nb, alone.data(), nw);
              for (int64_t j = 0; j < nw; ++j) {
                ASSERT_EQ(alone[j], got[i * ldy + j])
                    << isa_name(isa) << " " << dtype_name(type) << " nb=" << nb << " nw=" << nw << " m=" << m;
              }
            }
          }
        }
      }
    }
    // AVX-512, AVX-VNNI, AVX2 and NEON have a packed kernel for every packable type.
    if (isa != Isa::kGeneric) {
      EXPECT_EQ(tested, 6) << isa_name(isa);
    }
  }
}


// The packed kernels add several products in 16 bits before widening: weights at their largest
// unsigned value (every nibble 15, Q5_0's 31, Q6_K's 63, Q8_0's -128) against activations at
// +-127 everywhere are the sums closest to 2^15, and must still match the reference. (AVX2's Q8_0
// tiles of 16 rows and more: -128 x 127 twice is -32768, 16 bits' least.) 21 rows take every
// tile shape: wide tiles, those of 4, single rows.
TEST(Kernels, PackedGemmDoesNotSaturateAtExtremeValues) {
  for (Isa isa : tested_isas()) {
    for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K}) {
      const PackedGemmFn fn = packed_gemm_fn(kernels_for(isa), type);
      if (fn == nullptr) continue;
      const int64_t nb = 8, k = nb * 32, nw = 17, m = 21;
      const size_t rb = row_size(type, k);
      std::vector<uint8_t> w = random_weights(type, nw, k, 5);
      const size_t block = traits(type).type_size;
      for (size_t off = 0; off < w.size(); off += block) {
        uint8_t* blk = w.data() + off;
        switch (type) {
          case DType::kQ4_0: std::memset(blk + 2, 0xff, 16); break;
          case DType::kQ4_1: std::memset(blk + 4, 0xff, 16); break;
          case DType::kQ5_0: std::memset(blk + 2, 0xff, 20); break;
          // Q8_0 alternates blocks of -128 and of 127: the unsigned bytes 0 and 255, the latter
          // AVX2's single rows' extreme (255 times -8, an activation's high half, eight words).
          case DType::kQ8_0: std::memset(blk + 2, (off / block) % 2 == 0 ? 0x80 : 0x7f, 32); break;
          case DType::kQ4_K: std::memset(blk + 16, 0xff, 128); break;
          default: std::memset(blk, 0xff, 192); break;  // Q6_K: ql and qh
        }
      }
      std::vector<BlockQ8A> a(static_cast<size_t>(m * nb));
      for (size_t b = 0; b < a.size(); ++b) {
        const int8_t v = (b / nb) % 2 == 0 ? 127 : -127;  // rows alternate in sign
        std::memset(a[b].qs, static_cast<uint8_t>(v), 32);
        a[b].d = 0.01f;
        a[b].sum = 32 * v;
      }
      std::vector<int32_t> half(static_cast<size_t>(2 * m * nb));
      half_sums(a.data(), m * nb, half.data());
      std::vector<uint8_t> packed(packed_bytes(type, nw, nb));
      pack_rows16(type, w.data(), rb, nw, nb, packed.data(), 0, (nw + kPackRows - 1) / kPackRows);
      std::vector<float> want(static_cast<size_t>(m * nw)), got(want);
      reference_qgemm(type, w.data(), rb, nw, a.data(), m, nb, want.data(), nw);
      fn(packed.data(), nw, a.data(), type == DType::kQ6_K ? half.data() : nullptr, m, nb, got.data(), nw);
      for (size_t q = 0; q < got.size(); ++q) {
        EXPECT_NEAR(got[q], want[q], 1e-5 * (1.0 + std::fabs(want[q])))
            << isa_name(isa) << " " << dtype_name(type) << " output " << q;
      }
    }
  }
}

// The AVX-VNNI table differs from the AVX2 one only in how the integer sums are formed (vpdpbusd
// for vpmaddubsw and vpmaddwd), which are exact either way: the same bits for every packed type,
// tile shape and tail. The plain GEMM too, except Q8_0's, whose VNNI form (shared with AVX-512)
// takes the weights' +128 offset off per lane before each lane's multiply-add, not per block.
TEST(Kernels, AvxVnniGivesTheBitsOfAvx2) {
  bool ran = false;
  for (Isa isa : tested_isas()) {
    if (isa != Isa::kAvxVnni) continue;
    ran = true;
    const Kernels& vnni = kernels_for(isa);
    const Kernels& avx2 = kernels_for(Isa::kAvx2);
    const Kernels& ref = kernels_generic();
    for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K}) {
      const int64_t per_block = traits(type).block_size / 32;
      for (int64_t blocks : {1, 3, 8}) {
        const int64_t nb = blocks * per_block, k = nb * 32;
        for (int64_t nw : {1, 16, 23}) {
          for (int64_t m : {1, 4, 7, 17}) {
            const std::vector<uint8_t> w = random_weights(type, nw, k, 31 + static_cast<uint64_t>(nb + nw));
            const std::vector<float> x = random_vector(m * k, 37 + static_cast<uint64_t>(m), 2.0f);
            const size_t rb = row_size(type, k);
            std::vector<BlockQ8A> a(static_cast<size_t>(m * nb));
            for (int64_t i = 0; i < m; ++i) ref.quantize_q8a(x.data() + i * k, a.data() + i * nb, k);
            std::vector<int32_t> half(static_cast<size_t>(2 * m * nb));
            half_sums(a.data(), m * nb, half.data());
            const std::string where = std::string(dtype_name(type)) + " nb=" + std::to_string(nb) +
                                      " nw=" + std::to_string(nw) + " m=" + std::to_string(m);
            std::vector<uint8_t> packed(packed_bytes(type, nw, nb));
            pack_rows16(type, w.data(), rb, nw, nb, packed.data(), 0, (nw + kPackRows - 1) / kPackRows);
            std::vector<float> want(static_cast<size_t>(m * nw)), got(want.size(), -1.0f);
            const int32_t* hs = type == DType::kQ6_K ? half.data() : nullptr;
            packed_gemm_fn(avx2, type)(packed.data(), nw, a.data(), hs, m, nb, want.data(), nw);
            packed_gemm_fn(vnni, type)(packed.data(), nw, a.data(), hs, m, nb, got.data(), nw);
            ASSERT_EQ(got, want) << "packed " << where;
            const QGemmFn fn = qgemm_fn(vnni, type);
            if (fn != nullptr && type != DType::kQ8_0) {
              qgemm_fn(avx2, type)(w.data(), rb, nw, a.data(), m, nb, want.data(), nw);
              std::fill(got.begin(), got.end(), -1.0f);
              fn(w.data(), rb, nw, a.data(), m, nb, got.data(), nw);
              ASSERT_EQ(got, want) << "plain " << where;
            }
          }
        }
      }
    }
  }
  if (!ran) GTEST_SKIP() << "the avxvnni table is not under test here";
}

// The AMX table's packed GEMM forms each block's integer sums on the tile unit and scales them
// with the AVX-512 tile's float operations in the same order: the AVX-512 bits for every packed
// type, whole tiles of 16 rows and the rows after them, one chunk of unpacked blocks or several
// (nb above 64), a last group short of 16 rows.
TEST(Kernels, AmxGivesTheBitsOfAvx512) {
  bool ran = false;
  for (Isa isa : tested_isas()) {
    if (isa != Isa::kAmx) continue;
    ran = true;
    const Kernels& amx = kernels_for(isa);
    const Kernels& avx512 = kernels_for(Isa::kAvx512);
    const Kernels& ref = kernels_generic();
    for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K}) {
      const bool super = traits(type).block_size == 256;
      for (int64_t nb : {super ? int64_t{8} : int64_t{1}, super ? int64_t{16} : int64_t{5}, int64_t{64},
                         super ? int64_t{136} : int64_t{130}}) {
        const int64_t k = nb * 32;
        for (int64_t nw : {16, 23}) {
          for (int64_t m : {15, 16, 35, 48}) {
            const std::vector<uint8_t> w = random_weights(type, nw, k, 43 + static_cast<uint64_t>(nb + nw));
            const std::vector<float> x = random_vector(m * k, 47 + static_cast<uint64_t>(m), 2.0f);
            const size_t rb = row_size(type, k);
            std::vector<BlockQ8A> a(static_cast<size_t>(m * nb));
            for (int64_t i = 0; i < m; ++i) ref.quantize_q8a(x.data() + i * k, a.data() + i * nb, k);
            std::vector<int32_t> half(static_cast<size_t>(2 * m * nb));
            half_sums(a.data(), m * nb, half.data());
            std::vector<uint8_t> packed(packed_bytes(type, nw, nb));
            pack_rows16(type, w.data(), rb, nw, nb, packed.data(), 0, (nw + kPackRows - 1) / kPackRows);
            const int64_t ldy = nw + 3;
            std::vector<float> want(static_cast<size_t>(m * ldy), -1.0f), got(want);
            const int32_t* hs = type == DType::kQ6_K ? half.data() : nullptr;
            packed_gemm_fn(avx512, type)(packed.data(), nw, a.data(), hs, m, nb, want.data(), ldy);
            packed_gemm_fn(amx, type)(packed.data(), nw, a.data(), hs, m, nb, got.data(), ldy);
            ASSERT_EQ(got, want) << dtype_name(type) << " nb=" << nb << " nw=" << nw << " m=" << m;
          }
        }
      }
    }
  }
  if (!ran) GTEST_SKIP() << "the amx table is not under test here";
}

TEST(Kernels, IntegerGemmOfKQuantsMatchesDequantizedMath) {
  const Kernels& ref = kernels_generic();
  for (DType type : {DType::kQ4_K, DType::kQ6_K}) {
    for (int64_t k : {256, 768}) {
      const int64_t nb = k / 32, nw = 5, m = 3;
      const size_t rb = row_size(type, k);
      const std::vector<uint8_t> w = random_k_blocks(type, nw, k, 31 + static_cast<uint64_t>(k));
      const std::vector<float> x = random_vector(m * k, 41, 2.0f);
      std::vector<BlockQ8A> a(static_cast<size_t>(m * nb));
      for (int64_t i = 0; i < m; ++i) ref.quantize_q8a(x.data() + i * k, a.data() + i * nb, k);
      std::vector<float> want(static_cast<size_t>(m * nw));
      qgemm_fn(ref, type)(w.data(), rb, nw, a.data(), m, nb, want.data(), nw);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < nw; ++j) {
          std::vector<float> wd(static_cast<size_t>(k));
          dequantize_row_ref(type, w.data() + j * rb, wd.data(), k);
          double dot = 0.0, scale = 0.0;
          for (int64_t c = 0; c < k; ++c) {
            const BlockQ8A& blk = a[static_cast<size_t>(i * nb + c / 32)];
            dot += static_cast<double>(wd[c]) * blk.d * blk.qs[c % 32];
            scale += std::fabs(static_cast<double>(wd[c]) * blk.d * blk.qs[c % 32]);
          }
          EXPECT_NEAR(want[i * nw + j], dot, 1e-5 * (1.0 + scale)) << dtype_name(type) << " k=" << k;
        }
      }
      for (Isa isa : tested_isas()) {
        std::vector<float> got(static_cast<size_t>(m * nw));
        qgemm_fn(kernels_for(isa), type)(w.data(), rb, nw, a.data(), m, nb, got.data(), nw);
        for (size_t q = 0; q < got.size(); ++q) {
          EXPECT_NEAR(got[q], want[q], 1e-5 * (1.0 + std::fabs(want[q]))) << isa_name(isa) << " " << dtype_name(type);
        }
        for (int64_t i = 0; i < m; ++i) {  // batch invariance, as for the legacy types
          std::vector<float> alone(static_cast<size_t>(nw));
          qgemm_fn(kernels_for(isa), type)(w.data(), rb, nw, a.data() + i * nb, 1, nb, alone.data(), nw);
          for (int64_t j = 0; j < nw; ++j) ASSERT_EQ(alone[j], got[i * nw + j]) << isa_name(isa) << " " << dtype_name(type);
        }
      }
    }
  }
}

TEST(Isa, GenericIsAlwaysAvailable) {
  const std::vector<Isa> isas = available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::kGeneric);
#ifdef DUET_EXPECT_ISA
  // Builds for a target with SIMD kernels must actually test them.
  bool found = false;
  for (Isa isa : isas) found = found || isa_name(isa) == DUET_EXPECT_ISA_NAME;
  EXPECT_TRUE(found) << DUET_EXPECT_ISA_NAME << " is not available here";
  EXPECT_EQ(isa_name(selected_isa()), DUET_EXPECT_ISA_NAME);
#endif
}

}  // namespace
}  // namespace duet::cpu

// --isa=NAME: the generic table and NAME's only; 77 (CTest's skip) where this CPU cannot run NAME.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  using duet::cpu::Isa;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--isa=", 0) != 0) continue;
    const std::string name = arg.substr(6);
    std::string available;
    for (Isa isa : duet::cpu::available_isas()) {
      available += (available.empty() ? "" : ", ") + std::string(duet::cpu::isa_name(isa));
      if (duet::cpu::isa_name(isa) == name) {
        duet::cpu::isas_under_test() = {Isa::kGeneric};
        if (isa != Isa::kGeneric) duet::cpu::isas_under_test().push_back(isa);
      }
    }
    if (duet::cpu::isas_under_test().empty()) {
      std::printf("skipped: the %s kernels were not run: this CPU cannot run them (available: %s)\n", name.c_str(),
                  available.c_str());
      return 77;
    }
  }
  return RUN_ALL_TESTS();
}
