// Every kernel of every ISA this machine can run against the scalar reference, odd sizes included.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "duet/backend/cpu/kernels.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"

namespace duet::cpu {
namespace {

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
  for (Isa isa : available_isas()) {
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
  for (Isa isa : available_isas()) {
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
  for (Isa isa : available_isas()) {
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

TEST(Isa, GenericIsAlwaysAvailable) {
  const std::vector<Isa> isas = available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::kGeneric);
}

}  // namespace
}  // namespace duet::cpu
