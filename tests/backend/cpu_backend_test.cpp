// CPU backend ops against naive double-precision implementations written here.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "duet/backend/backend.h"
#include "duet/core/convert.h"
#include "duet/core/error.h"
#include "duet/core/memory.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"

namespace duet {
namespace {

std::vector<float> random_vector(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(2.0 * rng.uniform() - 1.0);
  return v;
}

// A cache buffer of `dtype` holding `v` (rounded to f16 for an f16 cache), and the values it holds.
// (q8_0, fp8: rows of `row` values, quantized per row as the backend's store_kv does.)
struct CacheBuffer {
  std::vector<float> f32;
  std::vector<uint16_t> f16;
  std::vector<BlockQ8_0> q8;
  std::vector<uint8_t> fp8;
  std::vector<float> values;
  const void* data(KvDtype dtype) const {
    if (dtype == KvDtype::kF16) return f16.data();
    if (dtype == KvDtype::kQ8_0) return q8.data();
    if (dtype == KvDtype::kFp8) return fp8.data();
    return f32.data();
  }
};

// A CPU backend of `threads` unpinned threads in `mode`.
std::unique_ptr<Backend> cpu_backend_with(MatmulMode mode, int threads) {
  CpuBackendOptions options;
  options.cpus = std::vector<int>(static_cast<size_t>(threads), -1);
  options.mode = mode;
  return make_cpu_backend(options);
}

// Rows of `type` from wf (rows x cols): the reference quantizer's, f32 and f16 as they are, and
// for Q5_0, which has no reference quantizer, random bits with a sane scale per block.
std::vector<uint8_t> weight_rows(DType type, const std::vector<float>& wf, int64_t rows, int64_t cols) {
  const size_t rb = row_size(type, cols);
  std::vector<uint8_t> data(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = data.data() + r * rb;
    if (type == DType::kF32) {
      std::memcpy(row, wf.data() + r * cols, rb);
    } else if (type == DType::kF16) {
      auto* dst = reinterpret_cast<uint16_t*>(row);
      for (int64_t c = 0; c < cols; ++c) dst[c] = fp32_to_fp16(wf[r * cols + c]);
    } else if (type == DType::kQ5_0) {
      for (size_t i = 0; i < rb; ++i) row[i] = static_cast<uint8_t>(wf[r * cols + i % cols] * 1000.0f);
      for (int64_t b = 0; b < cols / 32; ++b) {
        const uint16_t d = fp32_to_fp16(0.01f + 0.001f * static_cast<float>(b));
        std::memcpy(row + b * sizeof(BlockQ5_0), &d, sizeof(d));
      }
    } else {
      quantize_row_ref(type, wf.data() + r * cols, row, cols);
    }
  }
  return data;
}

CacheBuffer cache_buffer(const std::vector<float>& v, KvDtype dtype, int64_t row = 32) {
  CacheBuffer b;
  b.f32 = v;
  b.values = v;
  if (dtype == KvDtype::kF16) {
    for (float& x : b.values) {
      b.f16.push_back(fp32_to_fp16(x));
      x = fp16_to_fp32(b.f16.back());
    }
  } else if (dtype == KvDtype::kQ8_0) {
    b.q8.resize(v.size() / 32);
    for (size_t r = 0; r < v.size(); r += static_cast<size_t>(row)) {
      quantize_row_q8_0_ref(v.data() + r, b.q8.data() + r / 32, row);
      dequantize_row_ref(DType::kQ8_0, b.q8.data() + r / 32, b.values.data() + r, row);
    }
  } else if (dtype == KvDtype::kFp8) {
    const size_t rb = fp8_kv_row_bytes(row);
    b.fp8.resize(v.size() / static_cast<size_t>(row) * rb);
    for (size_t r = 0; r < v.size(); r += static_cast<size_t>(row)) {
      quantize_row_fp8_kv_ref(v.data() + r, b.fp8.data() + r / static_cast<size_t>(row) * rb, row);
      dequantize_row_fp8_kv_ref(b.fp8.data() + r / static_cast<size_t>(row) * rb, b.values.data() + r, row);
    }
  }
  return b;
}

TEST(CpuBackend, MatmulEveryTypeAgainstDequantizedReference) {
  auto backend = make_cpu_backend(2, MatmulMode::kExact);
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    for (int64_t rows : {1, 17, 33}) {
      for (int64_t m : {1, 5}) {
        const int64_t cols = 96;
        const std::vector<float> wf = random_vector(rows * cols, 5);
        std::vector<uint8_t> packed(row_size(type, cols) * static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
          quantize_row_ref(type, wf.data() + r * cols, packed.data() + r * row_size(type, cols), cols);
        }
        std::vector<float> deq(static_cast<size_t>(rows * cols));
        for (int64_t r = 0; r < rows; ++r) {
          dequantize_row_ref(type, packed.data() + r * row_size(type, cols), deq.data() + r * cols, cols);
        }
        const std::vector<float> x = random_vector(m * cols, 9);
        std::vector<float> y(static_cast<size_t>(m * rows));
        const WeightView w{"w", type, rows, cols, packed.data()};
        backend->matmul(w, x.data(), m, y.data());
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < rows; ++j) {
            double ref = 0.0;
            for (int64_t c = 0; c < cols; ++c) ref += static_cast<double>(x[i * cols + c]) * deq[j * cols + c];
            EXPECT_NEAR(y[i * rows + j], ref, 1e-4) << dtype_name(type) << " rows=" << rows << " m=" << m;
          }
        }
      }
    }
  }
}

// The fast path quantizes activations to int8 per block of 32: each activation is off by at most
// half a step (amax / 254) of its block, so a dot product is off by at most
// sum_c |w_c| * amax_block(c) / 254; the test checks exactly that bound.
TEST(CpuBackend, FastMatmulStaysWithinTheActivationRoundingBound) {
  auto backend = make_cpu_backend(2, MatmulMode::kFast);
  for (DType type : {DType::kQ4_0, DType::kQ8_0}) {
    const int64_t rows = 37, cols = 256, m = 5;
    const std::vector<float> wf = random_vector(rows * cols, 21);
    std::vector<uint8_t> packed(row_size(type, cols) * static_cast<size_t>(rows));
    std::vector<float> deq(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row_ref(type, wf.data() + r * cols, packed.data() + r * row_size(type, cols), cols);
      dequantize_row_ref(type, packed.data() + r * row_size(type, cols), deq.data() + r * cols, cols);
    }
    const std::vector<float> x = random_vector(m * cols, 23);
    std::vector<float> y(static_cast<size_t>(m * rows));
    backend->matmul(WeightView{"w", type, rows, cols, packed.data()}, x.data(), m, y.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < rows; ++j) {
        double exact = 0.0, bound = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
          exact += static_cast<double>(x[i * cols + c]) * deq[j * cols + c];
          float amax = 0.0f;
          for (int64_t q = c / 32 * 32; q < c / 32 * 32 + 32; ++q) amax = std::max(amax, std::fabs(x[i * cols + q]));
          bound += std::fabs(deq[j * cols + c]) * amax / 254.0;
        }
        EXPECT_LE(std::fabs(y[i * rows + j] - exact), bound * 1.001 + 1e-5) << dtype_name(type);
        EXPECT_GT(std::fabs(y[i * rows + j] - exact), 0.0) << "the fast path was not taken";
      }
    }
  }
}

// Prepared (repacked) weights give what the same weights give unprepared, within the int8
// activation rounding of either path; row ranges of a prepared matrix work whether or not they
// start on a 16-row boundary; and once the handle is gone, new weights at the same address are
// used as they are (nothing stale is served).
TEST(CpuBackend, PreparedWeightsMatchUnpreparedAndDoNotOutliveTheirHandle) {
  auto backend = make_cpu_backend(2, MatmulMode::kFast);
  for (DType type : {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K}) {
    const int64_t rows = 53, cols = type == DType::kQ4_K ? 512 : 320, m = 11;
    const size_t rb = row_size(type, cols);
    auto quantize = [&](uint64_t seed) { return weight_rows(type, random_vector(rows * cols, seed), rows, cols); };
    std::vector<uint8_t> w = quantize(31);
    const std::vector<uint8_t> original = w;
    const std::vector<float> x = random_vector(m * cols, 37);
    auto run = [&](const uint8_t* data, int64_t first, int64_t n) {
      std::vector<float> y(static_cast<size_t>(m * n));
      backend->matmul(WeightView{"w", type, n, cols, data + static_cast<size_t>(first) * rb}, x.data(), m, y.data());
      return y;
    };
    // What the weights give without preparation, from a copy at another address.
    const std::vector<float> plain = run(original.data(), 0, rows);
    auto close = [&](const std::vector<float>& got, int64_t first, int64_t n, const char* what) {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          EXPECT_NEAR(got[i * n + j], plain[i * rows + first + j], 1e-4) << dtype_name(type) << " " << what;
        }
      }
    };
    {
      const WeightView view{"w", type, rows, cols, w.data()};
      auto handle = backend->prepare_weights({view});
      close(run(w.data(), 0, rows), 0, rows, "whole");
      close(run(w.data(), 16, 20), 16, 20, "rows 16..35");
      close(run(w.data(), 5, 30), 5, 30, "rows 5..34");
      // A row of the batch alone is bit-identical to the same row in the batch.
      const std::vector<float> all = run(w.data(), 0, rows);
      std::vector<float> one(static_cast<size_t>(rows));
      backend->matmul(view, x.data() + 3 * cols, 1, one.data());
      for (int64_t j = 0; j < rows; ++j) ASSERT_EQ(one[j], all[3 * rows + j]) << dtype_name(type);
    }
    // The handle is gone: new weights in the same buffer are read as they are.
    const std::vector<uint8_t> next = quantize(41);
    std::copy(next.begin(), next.end(), w.begin());
    const std::vector<float> fresh = run(w.data(), 0, rows);
    std::vector<uint8_t> copy = w;
    const std::vector<float> expected = run(copy.data(), 0, rows);
    EXPECT_EQ(fresh, expected) << dtype_name(type);
  }
}

// A batch longer than a packed call's activation rows (the kernel table's packed_act_rows: 256 at
// most) is cut into calls, each starting with the tiles that make a group's saved words and the
// last ending in rows past the tiles; every row still gives the bits of that row alone, wherever
// it falls in its call.
TEST(CpuBackend, PreparedBatchRowsAcrossPackedCallsGiveTheBitsOfEachRowAlone) {
  auto backend = make_cpu_backend(2, MatmulMode::kFast);
  for (DType type : {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ5_0, DType::kQ6_K, DType::kQ4_1}) {
    const int64_t rows = 40, cols = 256, m = 603;
    const std::vector<uint8_t> w = weight_rows(type, random_vector(rows * cols, 61), rows, cols);
    const WeightView view{"w", type, rows, cols, w.data()};
    auto handle = backend->prepare_weights({view});
    const std::vector<float> x = random_vector(m * cols, 62);
    std::vector<float> all(static_cast<size_t>(m * rows));
    backend->matmul(view, x.data(), m, all.data());
    for (int64_t i : {0, 1, 63, 64, 127, 128, 255, 256, 257, 300, 511, 512, 515, 599, 600, 602}) {
      std::vector<float> one(static_cast<size_t>(rows));
      backend->matmul(view, x.data() + i * cols, 1, one.data());
      for (int64_t j = 0; j < rows; ++j) ASSERT_EQ(one[j], all[i * rows + j]) << dtype_name(type) << " row " << i;
    }
  }
}

// Once prepared, a matrix's original bytes are never read again: every row range of it, whether
// or not it starts on a 16-row boundary, is served from the packed copy. The original's pages are
// made unreadable after preparing (a read would fault), and every range must still give what the
// unprepared weights give. What lets a loader free a converted copy once it is packed.
TEST(CpuBackend, PreparedWeightsAreNeverReadFromTheOriginalAgain) {
  auto backend = make_cpu_backend(2, MatmulMode::kFast);
  const bool generic = backend->name().find("generic") != std::string::npos;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  int packed_types = 0;
  // (Q5_0 packs too, but has no quantizer to make a test matrix with.)
  for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    const int64_t rows = 53, cols = 512, m = 7;
    const size_t rb = row_size(type, cols);
    const std::vector<uint8_t> plain_bytes = weight_rows(type, random_vector(rows * cols, 43), rows, cols);
    const std::vector<float> x = random_vector(m * cols, 47);
    auto run = [&](const uint8_t* data, int64_t first, int64_t n) {
      std::vector<float> y(static_cast<size_t>(m * n));
      backend->matmul(WeightView{"w", type, n, cols, data + static_cast<size_t>(first) * rb}, x.data(), m, y.data());
      return y;
    };
    const std::vector<float> plain = run(plain_bytes.data(), 0, rows);

    const size_t bytes = (plain_bytes.size() + page - 1) / page * page;
    AnonymousMemory original(bytes);
    auto* w = static_cast<uint8_t*>(original.data());
    std::copy(plain_bytes.begin(), plain_bytes.end(), w);
    const WeightView view{"w", type, rows, cols, w};
    if (!backend->packs(view)) {
      EXPECT_TRUE(generic) << dtype_name(type) << " is not packed on " << backend->name();
      continue;
    }
    ++packed_types;
    auto handle = backend->prepare_weights({view});
    ASSERT_EQ(::mprotect(w, bytes, PROT_NONE), 0);
    // The whole matrix: the unprepared result within the int8 activation rounding.
    const std::vector<float> whole = run(w, 0, rows);
    for (size_t i = 0; i < whole.size(); ++i) ASSERT_NEAR(whole[i], plain[i], 0.1) << dtype_name(type);
    // Each range: exactly the whole matrix's rows (the same groups, computed the same way).
    for (const auto& [first, n] : std::vector<std::pair<int64_t, int64_t>>{
             {16, 20}, {5, 30}, {1, 1}, {17, 36}, {40, 13}, {31, 2}}) {
      const std::vector<float> got = run(w, first, n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(got[i * n + j], whole[i * rows + first + j])
              << dtype_name(type) << " rows " << first << ".." << first + n - 1;
        }
      }
    }
    handle.reset();
    ASSERT_EQ(::mprotect(w, bytes, PROT_READ | PROT_WRITE), 0);
  }
  EXPECT_EQ(packed_types, generic ? 0 : 5) << backend->name();
}

// Memory degradation: with re-quantization on, a float matrix (f32, f16, bf16) is prepared as a
// packed Q8_0 copy of its rows quantized by the scalar reference. Every row range gives exactly
// what a Q8_0 matrix quantized from the same values gives, the original is never read again, and
// matrices prepared before the switch, or after it is turned off, are left as they are.
TEST(CpuBackend, RequantizedFloatWeightsAreQ8_0AndNeverReadAgain) {
  auto backend = make_cpu_backend(2, MatmulMode::kFast);
  auto exact = make_cpu_backend(1, MatmulMode::kExact);
  EXPECT_FALSE(exact->can_requantize_weights());
  EXPECT_FALSE(exact->set_requantize_weights(true));
  if (!backend->can_requantize_weights()) {
    EXPECT_NE(backend->name().find("generic"), std::string::npos) << backend->name();
    GTEST_SKIP() << "the generic kernels have no packed Q8_0 matmul to re-quantize into";
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const int64_t rows = 53, cols = 320, m = 7;
  const std::vector<float> x = random_vector(m * cols, 61);
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(type));
    const std::vector<float> wf = random_vector(rows * cols, 59);
    const size_t rb = row_size(type, cols);
    const size_t bytes = (rb * static_cast<size_t>(rows) + page - 1) / page * page;
    AnonymousMemory original(bytes);
    auto* w = static_cast<uint8_t*>(original.data());
    quantize_row_ref(type, wf.data(), w, rows * cols);
    // The reference: the values as stored, quantized to Q8_0 row by row, prepared as Q8_0.
    std::vector<float> stored(static_cast<size_t>(rows * cols));
    dequantize_row_ref(type, w, stored.data(), rows * cols);
    const size_t qb = row_size(DType::kQ8_0, cols);
    std::vector<uint8_t> q(qb * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row_q8_0_ref(stored.data() + r * cols, reinterpret_cast<BlockQ8_0*>(q.data() + r * qb), cols);
    }
    auto run = [&](DType t, const uint8_t* data, size_t row_bytes, int64_t first, int64_t n) {
      std::vector<float> y(static_cast<size_t>(m * n));
      backend->matmul(WeightView{"w", t, n, cols, data + static_cast<size_t>(first) * row_bytes}, x.data(), m, y.data());
      return y;
    };
    const WeightView view{"w", type, rows, cols, w};
    ASSERT_TRUE(backend->set_requantize_weights(false) == false);
    EXPECT_FALSE(backend->packs(view));
    ASSERT_TRUE(backend->set_requantize_weights(true));
    EXPECT_TRUE(backend->packs(view));
    auto q_handle = backend->prepare_weights({WeightView{"q", DType::kQ8_0, rows, cols, q.data()}});
    auto handle = backend->prepare_weights({view});
    ASSERT_EQ(::mprotect(w, bytes, PROT_NONE), 0);
    for (const auto& [first, n] : std::vector<std::pair<int64_t, int64_t>>{{0, rows}, {16, 20}, {5, 30}, {40, 13}}) {
      EXPECT_EQ(run(type, w, rb, first, n), run(DType::kQ8_0, q.data(), qb, first, n)) << first << "+" << n;
    }
    // Within Q8_0's rounding of the float result.
    std::vector<float> exact_y(static_cast<size_t>(m * rows));
    exact->matmul(WeightView{"s", DType::kF32, rows, cols, stored.data()}, x.data(), m, exact_y.data());
    const std::vector<float> got = run(type, w, rb, 0, rows);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], exact_y[i], 0.1);
    handle.reset();
    ASSERT_EQ(::mprotect(w, bytes, PROT_READ | PROT_WRITE), 0);
    // Handle gone: read as stored again (the f32 path), and re-quantization off packs nothing new.
    const std::vector<float> plain = run(type, w, rb, 0, rows);
    for (size_t i = 0; i < plain.size(); ++i) ASSERT_NEAR(plain[i], exact_y[i], 1e-4);
    EXPECT_FALSE(backend->set_requantize_weights(false));
    EXPECT_FALSE(backend->packs(view));
  }
}

// DeepSeek-V3.2's choice over several threads, by queries and by one query's positions, its keys
// read from f32, f16 and q8_0 cache rows in another order than the positions': each query's K
// best positions up to its own (the heads' relu-weighted sum, ties to the earlier position) as a
// plain sort of (total, position) pairs gives them, and the bits of the default, which reads the
// rows with load_kv and takes the queries one by one.
TEST(CpuBackend, IndexTopkOverThreadsIsEachQuerysBestPositions) {
  const int64_t heads = 3, d = 128, C = 300, K = 16;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> coarse(-2, 2);  // small integers: exact sums and many ties
  std::vector<float> keys(static_cast<size_t>(C * d));
  for (float& v : keys) v = static_cast<float>(coarse(rng));
  // Position s in cache row slots[s] (a shuffle), in each element type. The small integers are
  // exact in f32, f16 and fp8 (e4m3 blocks of 128: d = 128 is one); q8_0 rounds them, so there
  // the default's bits are all that is checked.
  std::vector<int64_t> slots(static_cast<size_t>(C));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  auto backend = make_cpu_backend(4);
  size_t tied = 0;
  for (const KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kQ8_0, KvDtype::kFp8}) {
    const size_t row_bytes = kv_row_bytes(dtype, d);
    std::vector<uint8_t> cache(static_cast<size_t>(C) * row_bytes);
    for (int64_t s = 0; s < C; ++s) {
      uint8_t* row = cache.data() + static_cast<size_t>(slots[static_cast<size_t>(s)]) * row_bytes;
      const float* k = keys.data() + s * d;
      if (dtype == KvDtype::kF32) std::memcpy(row, k, static_cast<size_t>(d) * sizeof(float));
      if (dtype == KvDtype::kF16) {
        for (int64_t p = 0; p < d; ++p) reinterpret_cast<uint16_t*>(row)[p] = fp32_to_fp16(k[p]);
      }
      if (dtype == KvDtype::kQ8_0) quantize_row_q8_0_ref(k, reinterpret_cast<BlockQ8_0*>(row), d);
      if (dtype == KvDtype::kFp8) quantize_row_fp8_kv_ref(k, row, d);
    }
    std::vector<float> read(keys.size());  // the keys as the cache holds them
    backend->load_kv(cache.data(), dtype, slots.data(), C, d, read.data());
    if (dtype != KvDtype::kQ8_0) {
      ASSERT_EQ(read, keys);
    }
    for (const int64_t m : {int64_t{1}, int64_t{3}, int64_t{37}}) {  // fewer queries than threads, and more
      const int64_t last0 = C - m;
      std::vector<float> q(static_cast<size_t>(m * heads * d)), w(static_cast<size_t>(m * heads));
      for (float& v : q) v = static_cast<float>(coarse(rng));
      for (float& v : w) v = static_cast<float>(coarse(rng) + 3);
      std::vector<int32_t> threaded(static_cast<size_t>(m * K)), serial(threaded.size());
      backend->index_topk(q.data(), cache.data(), dtype, slots.data(), C, w.data(), m, heads, d, last0, K,
                          threaded.data());
      backend->Backend::index_topk(q.data(), cache.data(), dtype, slots.data(), C, w.data(), m, heads, d, last0, K,
                                   serial.data());
      EXPECT_EQ(threaded, serial) << m << " queries, " << kv_dtype_name(dtype);
      if (dtype == KvDtype::kQ8_0) continue;
      for (int64_t j = 0; j < m; ++j) {
        std::vector<std::pair<double, int32_t>> ranked;
        for (int32_t s = 0; s <= last0 + j; ++s) {
          double total = 0.0;
          for (int64_t h = 0; h < heads; ++h) {
            double score = 0.0;
            for (int64_t p = 0; p < d; ++p) score += double{q[(j * heads + h) * d + p]} * read[s * d + p];
            total += w[j * heads + h] * std::max(0.0, score);
          }
          ranked.emplace_back(-total, s);
        }
        std::sort(ranked.begin(), ranked.end());
        tied += ranked[K - 1].first == ranked[K].first;
        std::vector<int32_t> want;
        for (int64_t k = 0; k < K; ++k) want.push_back(ranked[k].second);
        std::sort(want.begin(), want.end());
        EXPECT_EQ(std::vector<int32_t>(threaded.begin() + j * K, threaded.begin() + (j + 1) * K), want)
            << m << " queries, query " << j;
      }
    }
  }
  EXPECT_GT(tied, 0u);  // the cut fell inside a tie, so the tie rule was checked
}

// DeepSeek's FP8 rounding of the indexer's rows over the threads: the bits of the rows one after
// another (the default), which are hadamard_transform, times d^-1/2, then fp8_act_round_trip.
TEST(CpuBackend, IndexFp8RoundOverThreadsIsEachRowsRounding) {
  auto backend = make_cpu_backend(3);
  for (const int64_t rows : {int64_t{1}, int64_t{64}, int64_t{300}}) {
    const std::vector<float> x = random_vector(rows * 128, 40 + rows);
    std::vector<float> threaded = x, serial = x, want = x;
    backend->index_fp8_round(threaded.data(), rows, 128);
    backend->Backend::index_fp8_round(serial.data(), rows, 128);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = want.data() + r * 128;
      hadamard_transform(row, 128);
      for (int64_t i = 0; i < 128; ++i) row[i] *= static_cast<float>(1.0 / std::sqrt(128.0));
      fp8_act_round_trip(row, 128, 128);
    }
    EXPECT_EQ(threaded, serial) << rows << " rows";
    EXPECT_EQ(serial, want) << rows << " rows";
    EXPECT_NE(want, x);
  }
}

TEST(CpuBackend, GetRowsChecksIds) {
  auto backend = make_cpu_backend(1);
  const std::vector<float> table = random_vector(4 * 3, 1);
  const WeightView w{"emb", DType::kF32, 4, 3, table.data()};
  const int32_t ids[] = {3, 0};
  std::vector<float> out(6);
  backend->get_rows(w, ids, 2, out.data());
  EXPECT_EQ(out[0], table[9]);
  EXPECT_EQ(out[3], table[0]);
  const int32_t bad[] = {4};
  EXPECT_THROW(backend->get_rows(w, bad, 1, out.data()), Error);
}

TEST(CpuBackend, MoeExpertsSkipNegativeIdsSoRanksAddUpTheirExperts) {
  // Four experts of a 3-wide layer; each token picks two. Rank A holds experts 0-1, rank B 2-3:
  // each passes the other's picks as -1, and A's sum plus B's is the whole sum (each token's two
  // picks fall one on each side here, so the sums are the same additions).
  auto backend = make_cpu_backend(1);
  const int64_t d = 3, ff = 4, E = 4, n = 2, k = 2;
  const std::vector<float> gate = random_vector(E * ff * d, 11), up = random_vector(E * ff * d, 12);
  const std::vector<float> down = random_vector(E * d * ff, 13), x = random_vector(n * d, 14);
  const MoeExperts all{{"gate", DType::kF32, E * ff, d, gate.data()}, {"up", DType::kF32, E * ff, d, up.data()},
                       {"down", DType::kF32, E * d, ff, down.data()}, E, ff};
  const int32_t ids[] = {1, 2, 0, 3};
  const float weights[] = {0.25f, 0.75f, 0.5f, 0.5f};
  std::vector<float> whole(n * d), a(n * d), b(n * d);
  backend->moe_experts(all, x.data(), ids, weights, n, k, whole.data());
  const int32_t ids_a[] = {1, -1, 0, -1};
  backend->moe_experts(all, x.data(), ids_a, weights, n, k, a.data());
  // Rank B's experts as its own stack, numbered from 0.
  const MoeExperts half{{"gate", DType::kF32, 2 * ff, d, gate.data() + 2 * ff * d},
                        {"up", DType::kF32, 2 * ff, d, up.data() + 2 * ff * d},
                        {"down", DType::kF32, 2 * d, ff, down.data() + 2 * d * ff}, 2, ff};
  const int32_t ids_b[] = {-1, 0, -1, 1};
  backend->moe_experts(half, x.data(), ids_b, weights, n, k, b.data());
  // The same additions; where the compiler fuses the weighting into the sum (aarch64), one
  // product's rounding apart.
  for (int64_t i = 0; i < n * d; ++i) {
    EXPECT_NE(a[i], 0.0f);
    EXPECT_NEAR(a[i] + b[i], whole[i], 2e-7 * (std::fabs(a[i]) + std::fabs(b[i]))) << i;
  }
  const int32_t bad[] = {4, 0, 0, 0};
  EXPECT_THROW(backend->moe_experts(all, x.data(), bad, weights, n, k, a.data()), Error);
}

// The fused mixture-of-experts path (all used experts' gate and up in one pass, then the down
// rows with the weighted sum) gives the bits of one expert after another, for every packed type,
// a mix of types (Q4_K_M's gate/up Q4_K and down Q6_K), one token or many (an expert picked by
// more tokens than one activation tile), picks held elsewhere (-1), and 1, 2 or 3 threads.
TEST(CpuBackend, FusedMoeGivesTheBitsOfOneExpertAfterAnother) {
  struct Types {
    DType gate_up, down;
    int64_t d, ff;
  };
  for (const Types& t : {Types{DType::kQ4_0, DType::kQ4_0, 96, 64}, Types{DType::kQ8_0, DType::kQ8_0, 96, 64},
                         Types{DType::kQ4_K, DType::kQ6_K, 256, 512}, Types{DType::kQ6_K, DType::kQ4_K, 256, 256}}) {
    const int64_t E = 8, k = 3, d = t.d, ff = t.ff;
    auto quantized = [](DType type, int64_t rows, int64_t cols, uint64_t seed) {
      return weight_rows(type, random_vector(rows * cols, seed), rows, cols);
    };
    const std::vector<uint8_t> gate = quantized(t.gate_up, E * ff, d, 51), up = quantized(t.gate_up, E * ff, d, 52);
    const std::vector<uint8_t> down = quantized(t.down, E * d, ff, 53);
    const MoeExperts w{{"gate", t.gate_up, E * ff, d, gate.data()}, {"up", t.gate_up, E * ff, d, up.data()},
                       {"down", t.down, E * d, ff, down.data()}, E, ff};
    for (int threads : {1, 2, 3}) {
      CpuBackendOptions fused_options, plain_options;
      fused_options.cpus = plain_options.cpus = std::vector<int>(static_cast<size_t>(threads), -1);
      fused_options.mode = plain_options.mode = MatmulMode::kFast;
      plain_options.fused_moe = false;
      auto fused = make_cpu_backend(fused_options), plain = make_cpu_backend(plain_options);
      auto fused_handle = fused->prepare_weights({w.gate, w.up, w.down});
      auto plain_handle = plain->prepare_weights({w.gate, w.up, w.down});
      for (int64_t n : {1, 5, 40}) {
        const std::vector<float> x = random_vector(n * d, 60 + n);
        std::vector<int32_t> ids(static_cast<size_t>(n * k));
        std::vector<float> weights(ids.size());
        Rng rng(70 + static_cast<uint64_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          ids[i * k] = 0;  // every token picks expert 0: more rows than one activation tile at n = 40
          ids[i * k + 1] = 1 + static_cast<int32_t>(rng.uniform() * (E - 1));
          ids[i * k + 2] = i % 4 == 3 ? -1 : static_cast<int32_t>(rng.uniform() * E);
          if (ids[i * k + 2] == ids[i * k + 1] || ids[i * k + 2] == 0) ids[i * k + 2] = -1;
          for (int64_t j = 0; j < k; ++j) weights[i * k + j] = static_cast<float>(0.1 + rng.uniform());
        }
        std::vector<float> got(static_cast<size_t>(n * d), 7.0f), want(static_cast<size_t>(n * d), -7.0f);
        fused->moe_experts(w, x.data(), ids.data(), weights.data(), n, k, got.data());
        plain->moe_experts(w, x.data(), ids.data(), weights.data(), n, k, want.data());
        ASSERT_EQ(got, want) << dtype_name(t.gate_up) << "/" << dtype_name(t.down) << ", " << threads << " threads, n " << n;
        double norm = 0;
        for (float v : got) norm += std::fabs(v);
        EXPECT_GT(norm, 0.0);
      }
    }
  }
}

// matmul_heads (every head in one op for a few rows) against each head's own matmul on a copy of
// its slice: the same bits for every weight type, prepared or not, both matmul modes, heads that
// are contiguous or interleaved with other rows (kv_b's W_UV), any number of threads, and rows up
// to and past where the op runs head by head. Values outside the heads' slices stay untouched.
TEST(CpuBackend, MatmulHeadsGivesTheBitsOfEachHeadsMatmul) {
  const int64_t cols = 256, heads = 4, x_head = cols + 32, y_head = 48;
  const int64_t x_stride = heads * x_head + 8, y_stride = heads * y_head + 8;
  for (MatmulMode mode : {MatmulMode::kFast, MatmulMode::kExact}) {
    for (int threads : {1, 2, 3}) {
      auto backend = cpu_backend_with(mode, threads);
      for (DType type : {DType::kF32, DType::kF16, DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
        for (const HeadRows s : {HeadRows{heads, 32, 0, 32}, HeadRows{heads, 40, 16, 48}, HeadRows{heads, 35, 5, 40}}) {
          const int64_t rows = s.first_row + heads * s.row_step;
          const std::vector<float> wf = random_vector(rows * cols, 80 + static_cast<uint64_t>(type));
          const std::vector<uint8_t> w = weight_rows(type, wf, rows, cols);
          const WeightView view{"w", type, rows, cols, w.data()};
          for (bool prepared : {false, true}) {
            auto handle = prepared ? backend->prepare_weights({view}) : nullptr;
            for (int64_t m : {1, 3, 16, 17}) {
              const std::vector<float> x = random_vector(m * x_stride, 90 + m);
              std::vector<float> got(static_cast<size_t>(m * y_stride), 5.0f), want = got;
              std::vector<float> in(static_cast<size_t>(m * cols)), out(static_cast<size_t>(m * s.rows));
              for (int64_t h = 0; h < heads; ++h) {
                for (int64_t i = 0; i < m; ++i) std::copy_n(&x[i * x_stride + h * x_head], cols, &in[i * cols]);
                backend->matmul(view.rows_from(s.first_row + h * s.row_step, s.rows), in.data(), m, out.data());
                for (int64_t i = 0; i < m; ++i) std::copy_n(&out[i * s.rows], s.rows, &want[i * y_stride + h * y_head]);
              }
              std::vector<float> scratch(static_cast<size_t>(m * (cols + s.rows)));
              backend->matmul_heads(view, s, x.data(), x_stride, x_head, m, got.data(), y_stride, y_head, scratch.data());
              ASSERT_EQ(got, want) << dtype_name(type) << (mode == MatmulMode::kFast ? " fast" : " exact") << ", "
                                   << threads << " threads, heads every " << s.row_step << " rows from "
                                   << s.first_row << (prepared ? ", prepared" : "") << ", m " << m;
            }
          }
        }
      }
    }
  }
  auto backend = make_cpu_backend(1, MatmulMode::kFast);
  std::vector<float> w(64 * 32), x(4 * 32), y(64), scratch(64);
  const WeightView view{"w_uk", DType::kF32, 64, 32, w.data()};
  try {
    backend->matmul_heads(view, HeadRows{4, 16, 4, 16}, x.data(), 32, 32, 1, y.data(), 64, 16, scratch.data());
    FAIL() << "heads past the matrix's rows were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'w_uk'"), std::string::npos) << e.what();
  }
}

// matmul_heads_t (each head's rows as its inputs, MLA's W_UK as kv_b holds it) against double on
// the decoded weights; each token's values are the same bits whatever m and the threads (one
// chain per element in row order); a prepared (packed) matrix is read the same; heads past the
// matrix's rows are refused.
TEST(CpuBackend, MatmulHeadsTransposedMatchesDoubleWhateverTheBatch) {
  const int64_t cols = 256, heads = 3, x_head = 40, y_head = cols + 16;
  const int64_t x_stride = heads * x_head + 8, y_stride = heads * y_head + 8;
  for (DType type : {DType::kF32, DType::kF16, DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    for (const HeadRows s : {HeadRows{heads, 32, 0, 32}, HeadRows{heads, 21, 3, 40}}) {
      const int64_t rows = s.first_row + heads * s.row_step;
      const std::vector<float> wf = random_vector(rows * cols, 180 + static_cast<uint64_t>(type));
      const size_t rb = row_size(type, cols);
      std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
      std::vector<float> decoded(wf.size());
      for (int64_t r = 0; r < rows; ++r) {
        quantize_row_ref(type, wf.data() + r * cols, w.data() + r * rb, cols);
        dequantize_row_ref(type, w.data() + r * rb, decoded.data() + r * cols, cols);
      }
      const WeightView view{"w_uk", type, rows, cols, w.data()};
      const int64_t m_max = 19;
      const std::vector<float> x = random_vector(m_max * x_stride, 190);
      std::vector<float> first;  // every token's values from the first run
      for (int threads : {1, 2, 3}) {
        auto backend = cpu_backend_with(MatmulMode::kFast, threads);
        ASSERT_TRUE(backend->has_matmul_heads_t(view)) << dtype_name(type);
        for (bool prepared : {false, true}) {
          auto handle = prepared ? backend->prepare_weights({view}) : nullptr;
          for (int64_t m : {int64_t{1}, int64_t{8}, int64_t{9}, m_max}) {
            std::vector<float> y(static_cast<size_t>(m * y_stride), 5.0f);
            backend->matmul_heads_t(view, s, x.data(), x_stride, x_head, m, y.data(), y_stride, y_head);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t h = 0; h < heads; ++h) {
                for (int64_t c = 0; c < cols; ++c) {
                  double want = 0.0, mag = 0.0;
                  for (int64_t r = 0; r < s.rows; ++r) {
                    const double p = static_cast<double>(x[i * x_stride + h * x_head + r]) *
                                     decoded[(s.first_row + h * s.row_step + r) * cols + c];
                    want += p;
                    mag += std::fabs(p);
                  }
                  ASSERT_NEAR(y[i * y_stride + h * y_head + c], want, 1e-6 * (1.0 + mag)) << dtype_name(type);
                }
                for (int64_t c = cols; c < y_head; ++c) ASSERT_EQ(y[i * y_stride + h * y_head + c], 5.0f);
              }
            }
            // Token 0 the same in every run (threads, packing, m); every token below.
            if (first.empty()) first.assign(y.begin(), y.begin() + y_stride);
            ASSERT_TRUE(std::equal(first.begin(), first.end(), y.begin()))
                << dtype_name(type) << ", " << threads << " threads, m " << m << (prepared ? ", prepared" : "");
          }
        }
      }
      // A token alone gives the bits it has among others.
      auto backend = cpu_backend_with(MatmulMode::kFast, 2);
      std::vector<float> all(static_cast<size_t>(m_max * y_stride), 5.0f), one(static_cast<size_t>(y_stride), 5.0f);
      backend->matmul_heads_t(view, s, x.data(), x_stride, x_head, m_max, all.data(), y_stride, y_head);
      for (int64_t i = 0; i < m_max; ++i) {
        backend->matmul_heads_t(view, s, x.data() + i * x_stride, x_stride, x_head, 1, one.data(), y_stride, y_head);
        ASSERT_TRUE(std::equal(one.begin(), one.end(), all.begin() + i * y_stride)) << dtype_name(type) << " token " << i;
      }
    }
  }
  auto backend = make_cpu_backend(1, MatmulMode::kFast);
  std::vector<float> w(64 * 32), x(4 * 32), y(64);
  const WeightView view{"w_uk", DType::kF32, 64, 32, w.data()};
  try {
    backend->matmul_heads_t(view, HeadRows{4, 16, 4, 16}, x.data(), 64, 16, 1, y.data(), 128, 32);
    FAIL() << "heads past the matrix's rows were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'w_uk'"), std::string::npos) << e.what();
  }
}

// matmul_shared (several matrices of one activation in one pass) against matmul on each: the same
// bits for mixes of packed types (Q6_K's half sums among them), row counts that end inside a
// 16-row group, prepared or not, views starting inside a group, both modes, any number of threads
// and rows; parts whose columns differ are refused before anything is written.
TEST(CpuBackend, MatmulSharedGivesTheBitsOfEachMatmul) {
  const int64_t cols = 512;
  const std::vector<std::vector<DType>> mixes = {{DType::kQ4_0, DType::kQ4_0, DType::kQ4_0},
                                                 {DType::kQ4_K, DType::kQ4_K, DType::kQ6_K},
                                                 {DType::kQ8_0, DType::kQ5_0},
                                                 {DType::kQ4_1, DType::kF16, DType::kQ4_0}};
  const std::vector<int64_t> part_rows = {37, 16, 70};
  for (MatmulMode mode : {MatmulMode::kFast, MatmulMode::kExact}) {
    for (int threads : {1, 2, 3}) {
      auto backend = cpu_backend_with(mode, threads);
      for (const std::vector<DType>& mix : mixes) {
        std::vector<std::vector<uint8_t>> data;
        std::vector<WeightView> views;
        for (size_t j = 0; j < mix.size(); ++j) {
          const DType type = mix[j];
          const int64_t rows = part_rows[j] + 5;  // the view leaves out the first 5 or not
          const std::vector<float> wf = random_vector(rows * cols, 300 + 10 * j + static_cast<uint64_t>(type));
          data.push_back(weight_rows(type, wf, rows, cols));
          views.push_back(WeightView{"w", type, rows, cols, data.back().data()});
        }
        for (bool prepared : {false, true}) {
          auto handle = prepared ? backend->prepare_weights(views) : nullptr;
          for (int64_t skip : {0, 5}) {
            std::vector<WeightView> parts_w;
            for (const WeightView& v : views) parts_w.push_back(v.rows_from(skip, v.rows - 5));
            for (int64_t m : {1, 3, 40}) {
              const std::vector<float> x = random_vector(m * cols, 400 + m);
              std::vector<std::vector<float>> got, want;
              std::vector<Backend::MatmulPart> parts;
              for (const WeightView& v : parts_w) {
                got.emplace_back(static_cast<size_t>(m * v.rows), 7.0f);
                want.emplace_back(static_cast<size_t>(m * v.rows));
                backend->matmul(v, x.data(), m, want.back().data());
              }
              for (size_t j = 0; j < parts_w.size(); ++j) parts.push_back({parts_w[j], got[j].data()});
              backend->matmul_shared(parts, x.data(), m);
              for (size_t j = 0; j < parts_w.size(); ++j) {
                ASSERT_EQ(got[j], want[j]) << "part " << j << " (" << dtype_name(mix[j]) << ") of " << mix.size()
                                           << (mode == MatmulMode::kFast ? ", fast" : ", exact") << ", " << threads
                                           << " threads" << (prepared ? ", prepared" : "") << ", from row " << skip
                                           << ", m " << m;
              }
            }
          }
        }
      }
    }
  }
  auto backend = make_cpu_backend(1, MatmulMode::kFast);
  std::vector<float> a(16 * 64), b(16 * 32), x(64), ya(16, 3.0f), yb(16, 3.0f);
  const WeightView wa{"w_a", DType::kF32, 16, 64, a.data()}, wb{"w_b", DType::kF32, 16, 32, b.data()};
  const Backend::MatmulPart parts[] = {{wa, ya.data()}, {wb, yb.data()}};
  try {
    backend->matmul_shared(parts, x.data(), 1);
    FAIL() << "parts with different column counts were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'w_b'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ya, std::vector<float>(16, 3.0f));
}

TEST(CpuBackend, RopeBothModesAgainstNaive) {
  auto backend = make_cpu_backend(2);
  const int64_t rows = 3, heads = 2, head_dim = 8;
  for (RopeMode mode : {RopeMode::kNormal, RopeMode::kNeox}) {
    RopeParams p;
    p.mode = mode;
    p.dim = 6;
    p.freq_base = 10000.0;
    p.freq_scale = 0.25;
    std::vector<float> x = random_vector(rows * heads * head_dim, 4);
    const std::vector<float> orig = x;
    const int32_t positions[] = {0, 5, 1000};
    backend->rope(x.data(), rows, heads, head_dim, positions, p);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const float* o = orig.data() + (r * heads + h) * head_dim;
        const float* v = x.data() + (r * heads + h) * head_dim;
        for (int64_t i = 0; i < 3; ++i) {
          const double theta = positions[r] * 0.25 * std::pow(10000.0, -2.0 * i / 6.0);
          const int64_t a = mode == RopeMode::kNormal ? 2 * i : i;
          const int64_t b = mode == RopeMode::kNormal ? 2 * i + 1 : i + 3;
          EXPECT_NEAR(v[a], o[a] * std::cos(theta) - o[b] * std::sin(theta), 1e-5);
          EXPECT_NEAR(v[b], o[a] * std::sin(theta) + o[b] * std::cos(theta), 1e-5);
        }
        for (int64_t i = 6; i < head_dim; ++i) EXPECT_EQ(v[i], o[i]);  // beyond the rope dims
      }
    }
  }
}

// rope keeps each call's cos and sin for the next call with the same positions and parameters:
// every call below, on one backend, gives the bits of a backend that has seen no call before.
TEST(CpuBackend, RopeKeepsItsTableOnlyForTheSamePositionsAndParameters) {
  auto backend = make_cpu_backend(2);
  const int64_t heads = 2, head_dim = 8;
  std::vector<int32_t> positions = {3, 9, 40};
  RopeParams p;
  p.dim = 8;
  const auto check = [&](const char* what, int64_t rows) {
    const std::vector<float> x = random_vector(rows * heads * head_dim, 7);
    std::vector<float> kept = x, fresh = x;
    backend->rope(kept.data(), rows, heads, head_dim, positions.data(), p);
    make_cpu_backend(1)->rope(fresh.data(), rows, heads, head_dim, positions.data(), p);
    EXPECT_EQ(kept, fresh) << what;
  };
  check("first call", 3);
  check("the same again", 3);
  positions[1] = 10;
  check("a position changed in the same buffer", 3);
  check("fewer rows", 2);
  p.freq_base = 500000.0;
  check("freq_base", 3);
  p.freq_scale = 0.5;
  check("freq_scale", 3);
  p.attn_factor = 0.7;
  check("attn_factor", 3);
  p.freq_factors = {1.0f, 2.0f, 4.0f, 8.0f};
  check("freq_factors", 3);
  p.freq_factors[2] = 3.0f;
  check("one freq factor", 3);
  p.mode = RopeMode::kNeox;
  check("mode", 3);
  p.dim = 4;
  p.freq_factors.resize(2);
  check("dim", 3);
  p.offset = 4;
  check("offset", 3);
}

TEST(CpuBackend, PagedAttentionAgainstNaiveWithGqa) {
  auto backend = make_cpu_backend(2);
  const int64_t heads = 4, kv_heads = 2;
  const int32_t bs = 2;
  // Two sequences: A has 4 cached tokens and 3 new ones; B decodes 1 token after 2 cached.
  const int32_t table_a[] = {5, 0, 3, 1};  // 7 tokens need 4 blocks of 2
  const int32_t table_b[] = {2, 4};
  PagedAttentionBatch batch;
  batch.block_size = bs;
  batch.seqs = {PagedSequence{0, 3, 7, table_a, 4}, PagedSequence{3, 1, 3, table_b, 2}};
  batch.num_tokens = 4;
  const int64_t slots = 6 * bs;
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kQ8_0, KvDtype::kFp8}) {
    const int64_t d = dtype == KvDtype::kQ8_0 ? 32 : dtype == KvDtype::kFp8 ? 128 : 5;  // whole blocks
    const std::vector<float> q = random_vector(4 * heads * d, 1);
    const CacheBuffer kb = cache_buffer(random_vector(slots * kv_heads * d, 2), dtype, kv_heads * d);
    const CacheBuffer vb = cache_buffer(random_vector(slots * kv_heads * d, 3), dtype, kv_heads * d);
    const std::vector<float>& k = kb.values;
    const std::vector<float>& v = vb.values;
    std::vector<float> out(static_cast<size_t>(4 * heads * d));
    const float scale = 0.4f;
    backend->paged_attention(q.data(), kb.data(dtype), vb.data(dtype), out.data(), batch,
                             Backend::AttentionShape{heads, kv_heads, d, d, kv_heads * d, kv_heads * d, dtype}, scale);
    for (int64_t t = 0; t < 4; ++t) {
      const PagedSequence& ps = t < 3 ? batch.seqs[0] : batch.seqs[1];
      const int64_t pos = ps.context_len - ps.num_tokens + (t - ps.token_start);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kvh = h / 2;
        std::vector<double> p;
        double max = -1e300;
        for (int64_t j = 0; j <= pos; ++j) {
          const int64_t slot = ps.block_table[j / bs] * bs + j % bs;
          double s = 0.0;
          for (int64_t c = 0; c < d; ++c) s += q[(t * heads + h) * d + c] * k[(slot * kv_heads + kvh) * d + c];
          p.push_back(s * scale);
          max = std::max(max, p.back());
        }
        double sum = 0.0;
        for (double& e : p) sum += (e = std::exp(e - max));
        for (int64_t c = 0; c < d; ++c) {
          double o = 0.0;
          for (int64_t j = 0; j <= pos; ++j) {
            const int64_t slot = ps.block_table[j / bs] * bs + j % bs;
            o += p[static_cast<size_t>(j)] / sum * v[(slot * kv_heads + kvh) * d + c];
          }
          EXPECT_NEAR(out[(t * heads + h) * d + c], o, 1e-5) << kv_dtype_name(dtype) << " t=" << t << " h=" << h;
        }
      }
    }
  }
}

// A token's attention is the same bits whether its sequence's tokens come in one call (tiled
// together), in chunks, or one at a time: the scheduler chunks prompts by the step's token
// budget, so anything else would make outputs depend on the other requests. MHA, GQA and an MLA
// group wider than a tile; a token alone on one thread and on two; 150 new tokens, so that MHA's
// prompt fills whole tiles (64 rows) and a short last one.
TEST(CpuBackend, PagedAttentionIsTheSameInOneCallInChunksAndAlone) {
  auto backend = make_cpu_backend(2);
  auto one = make_cpu_backend(1);
  struct Shape {
    int64_t heads, kv_heads, dk, dv;
  };
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kQ8_0, KvDtype::kFp8})
  for (const Shape sh : {Shape{4, 4, 32, 32}, Shape{6, 2, 24, 24}, Shape{12, 1, 40, 32}, Shape{6, 2, 64, 64},
                         Shape{12, 1, 96, 64}, Shape{4, 2, 128, 128}, Shape{2, 2, 128, 128}, Shape{8, 1, 160, 160}}) {
    if (dtype == KvDtype::kQ8_0 && (sh.dk % 32 != 0 || sh.dv % 32 != 0)) continue;
    if (dtype == KvDtype::kFp8 && sh.kv_heads > 1 && (sh.dk % 128 != 0 || sh.dv % 128 != 0)) continue;
    if (dtype != KvDtype::kFp8 && sh.dk >= 128) continue;  // the shapes for fp8's blocks
    const int32_t bs = 4, n = 150, blocks = 39;  // 150 new tokens after 5 cached ones
    std::vector<int32_t> table(blocks);
    for (int32_t b = 0; b < blocks; ++b) table[b] = (b * 37) % blocks;  // scattered blocks
    const int64_t slots = int64_t{blocks} * bs;
    const int64_t k_stride = sh.kv_heads * sh.dk, v_stride = sh.kv_heads * sh.dv;
    const std::vector<float> q = random_vector(n * sh.heads * sh.dk, 11);
    const CacheBuffer k = cache_buffer(random_vector(slots * k_stride, 12), dtype, k_stride);
    const CacheBuffer v = cache_buffer(random_vector(slots * v_stride, 13), dtype, v_stride);
    const Backend::AttentionShape shape{sh.heads, sh.kv_heads, sh.dk, sh.dv, k_stride, v_stride, dtype};
    auto run = [&](int32_t first, int32_t count, Backend* b = nullptr) {
      PagedAttentionBatch batch;
      batch.block_size = bs;
      batch.seqs = {PagedSequence{0, count, 5 + first + count, table.data(), blocks}};
      batch.num_tokens = count;
      std::vector<float> out(static_cast<size_t>(count * sh.heads * sh.dv));
      (b != nullptr ? b : backend.get())
          ->paged_attention(q.data() + first * sh.heads * sh.dk, k.data(dtype), v.data(dtype), out.data(), batch, shape,
                            0.3f);
      return out;
    };
    const std::vector<float> all = run(0, n);
    std::vector<float> pieces, alone;
    for (int32_t first = 0; first < n; first += 5) {
      const std::vector<float> part = run(first, std::min(5, n - first));
      pieces.insert(pieces.end(), part.begin(), part.end());
    }
    std::vector<float> alone1;
    for (int32_t t = 0; t < n; ++t) {
      const std::vector<float> x = run(t, 1), y = run(t, 1, one.get());
      alone.insert(alone.end(), x.begin(), x.end());
      alone1.insert(alone1.end(), y.begin(), y.end());
    }
    ASSERT_EQ(all, pieces) << kv_dtype_name(dtype) << " heads " << sh.heads << " kv " << sh.kv_heads;
    ASSERT_EQ(all, alone) << kv_dtype_name(dtype) << " heads " << sh.heads << " kv " << sh.kv_heads;
    ASSERT_EQ(all, alone1) << kv_dtype_name(dtype) << " heads " << sh.heads << " kv " << sh.kv_heads;
  }
}

// Long contexts go in chunks of keys merged in segments; one decoding sequence has its segments
// (or, with few segments, its chunks) spread over the threads (split) and merged after, its rows
// spread over the threads again. Every way gives a token the same bits: the last tokens of a long
// prompt in one call (whole tiles), each alone (split, on two and three threads), and on one
// thread, and they agree with double precision.
TEST(CpuBackend, PagedAttentionOverLongContextsIsTheSameSplitOrWhole) {
  auto two = make_cpu_backend(2);
  auto three = make_cpu_backend(3);
  auto one = make_cpu_backend(1);
  struct Shape {
    int64_t heads, kv_heads, dk, dv;
    bool latent;  // MLA: the value is the key row's first dv elements
  };
  // The last 6 tokens of 2,048 keys (four segments: split by segments on two threads, by chunks
  // on three), of 2,600, 700 and 300 (segments that would leave the threads uneven: by chunks).
  for (const int32_t context : {2048, 2600, 700, 300})
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kQ8_0, KvDtype::kF32, KvDtype::kFp8})
  for (const Shape sh : {Shape{4, 4, 64, 64, false}, Shape{6, 2, 32, 32, false}, Shape{8, 1, 96, 64, true},
                         Shape{4, 2, 128, 128, false}, Shape{8, 1, 160, 128, true}}) {
    // fp8: heads of whole blocks (a latent row of one block and a tail of halves); the others
    // keep their shapes.
    if ((dtype == KvDtype::kFp8) != (sh.dk >= 128)) continue;
    const int32_t bs = 16, n = 6;
    const int32_t blocks = (context + bs - 1) / bs;
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    for (int32_t b = 0; b < blocks; ++b) table[b] = (b * 37) % blocks;  // scattered blocks
    const int64_t slots = int64_t{blocks} * bs;
    const int64_t k_stride = sh.kv_heads * sh.dk, v_stride = sh.latent ? k_stride : sh.kv_heads * sh.dv;
    const std::vector<float> q = random_vector(n * sh.heads * sh.dk, 21);
    std::vector<float> kvals = random_vector(slots * k_stride, 22);
    for (size_t i = 0; i < kvals.size(); i += 7) kvals[i] *= 4.0f;  // some larger scores
    const CacheBuffer k = cache_buffer(kvals, dtype, k_stride);
    const CacheBuffer v = sh.latent ? k : cache_buffer(random_vector(slots * v_stride, 23), dtype, v_stride);
    const Backend::AttentionShape shape{sh.heads, sh.kv_heads, sh.dk, sh.dv, k_stride, v_stride, dtype};
    auto run = [&](Backend& b, int32_t first, int32_t count) {
      PagedAttentionBatch batch;
      batch.block_size = bs;
      batch.seqs = {PagedSequence{0, count, context - n + first + count, table.data(), blocks}};
      batch.num_tokens = count;
      std::vector<float> out(static_cast<size_t>(count * sh.heads * sh.dv));
      b.paged_attention(q.data() + first * sh.heads * sh.dk, k.data(dtype), sh.latent ? k.data(dtype) : v.data(dtype),
                        out.data(), batch, shape, 0.2f);
      return out;
    };
    const std::vector<float> all = run(*two, 0, n);
    ASSERT_EQ(all, run(*one, 0, n)) << kv_dtype_name(dtype) << " heads " << sh.heads;
    std::vector<float> alone, alone1, alone3;
    for (int32_t t = 0; t < n; ++t) {
      const std::vector<float> x = run(*two, t, 1), y = run(*one, t, 1), z = run(*three, t, 1);
      alone.insert(alone.end(), x.begin(), x.end());
      alone1.insert(alone1.end(), y.begin(), y.end());
      alone3.insert(alone3.end(), z.begin(), z.end());
    }
    const std::string what = std::string(kv_dtype_name(dtype)) + " heads " + std::to_string(sh.heads) + " kv " +
                             std::to_string(sh.kv_heads) + " context " + std::to_string(context);
    ASSERT_EQ(all, alone) << what;
    ASSERT_EQ(all, alone1) << what;
    ASSERT_EQ(all, alone3) << what;
    const std::vector<float>& kv = k.values;
    const std::vector<float>& vv = sh.latent ? k.values : v.values;
    const int64_t group = sh.heads / sh.kv_heads;
    for (int32_t t = 0; t < n; t += 5) {
      const int64_t pos = context - n + t;
      for (int64_t h = 0; h < sh.heads; h += 3) {
        const int64_t g = h / group;
        std::vector<double> p;
        double max = -1e300, sum = 0.0;
        for (int64_t j = 0; j <= pos; ++j) {
          const int64_t slot = table[j / bs] * bs + j % bs;
          double s = 0.0;
          for (int64_t c = 0; c < sh.dk; ++c) s += q[(t * sh.heads + h) * sh.dk + c] * kv[slot * k_stride + g * sh.dk + c];
          p.push_back(0.2 * s);
          max = std::max(max, p.back());
        }
        for (double& e : p) sum += (e = std::exp(e - max));
        for (int64_t c = 0; c < sh.dv; c += 5) {
          double o = 0.0;
          for (int64_t j = 0; j <= pos; ++j) {
            const int64_t slot = table[j / bs] * bs + j % bs;
            o += p[static_cast<size_t>(j)] / sum * vv[slot * v_stride + (sh.latent ? 0 : g * sh.dv) + c];
          }
          EXPECT_NEAR(all[(t * sh.heads + h) * sh.dv + c], o, 1e-5) << kv_dtype_name(dtype) << " t=" << t << " h=" << h;
        }
      }
    }
  }
}

// MLA's decode shape (16 heads over one latent row of 576, values its first 512) at a context
// of one chunk: on two threads the token's heads are cut into two tiles, on one thread not, and
// the last tokens of a prompt in one call are tiled another way again: the same bits.
TEST(CpuBackend, PagedAttentionCutsDecodeHeadsWithTheSameBits) {
  auto two = make_cpu_backend(2);
  auto one = make_cpu_backend(1);
  const int64_t heads = 16, dk = 576, dv = 512;
  const int32_t bs = 16, context = 120, n = 3, blocks = (context + bs - 1) / bs;
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int32_t b = 0; b < blocks; ++b) table[b] = (b * 5) % blocks;
  const std::vector<float> q = random_vector(n * heads * dk, 31);
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kF32, KvDtype::kFp8}) {
    const CacheBuffer k = cache_buffer(random_vector(int64_t{blocks} * bs * dk, 32), dtype, dk);
    const Backend::AttentionShape shape{heads, 1, dk, dv, dk, dk, dtype};
    auto run = [&](Backend& b, int32_t first, int32_t count) {
      PagedAttentionBatch batch;
      batch.block_size = bs;
      batch.seqs = {PagedSequence{0, count, context - n + first + count, table.data(), blocks}};
      batch.num_tokens = count;
      std::vector<float> out(static_cast<size_t>(count * heads * dv));
      b.paged_attention(q.data() + first * heads * dk, k.data(dtype), k.data(dtype), out.data(), batch, shape, 0.1f);
      return out;
    };
    const std::vector<float> all = run(*two, 0, n);
    std::vector<float> cut, whole;
    for (int32_t t = 0; t < n; ++t) {
      const std::vector<float> x = run(*two, t, 1), y = run(*one, t, 1);
      cut.insert(cut.end(), x.begin(), x.end());
      whole.insert(whole.end(), y.begin(), y.end());
    }
    ASSERT_EQ(cut, whole) << kv_dtype_name(dtype);
    ASSERT_EQ(cut, all) << kv_dtype_name(dtype);
  }
}

// A batch without sequences (a part with nothing to attend this step) does nothing, on any
// number of threads.
TEST(CpuBackend, PagedAttentionOfNoSequences) {
  for (int threads : {1, 2}) {
    auto backend = make_cpu_backend(threads);
    PagedAttentionBatch batch;
    batch.block_size = 4;
    const std::vector<float> q(16, 1.0f), cache(64, 1.0f);
    std::vector<float> out(16, 7.0f);
    backend->paged_attention(q.data(), cache.data(), cache.data(), out.data(), batch,
                             Backend::AttentionShape{4, 1, 4, 4, 4, 4}, 0.5f);
    EXPECT_EQ(out, std::vector<float>(16, 7.0f)) << threads << " threads";
  }
}

// MLA's shape: one kv head whose cache row holds the key (dk floats) and whose value is the
// first dv floats of that same row.
TEST(CpuBackend, PagedAttentionWithSharedLatentRows) {
  auto backend = make_cpu_backend(2);
  const int64_t heads = 3, dk = 6, dv = 4, n = 2;
  const int32_t table[] = {1, 0};
  PagedAttentionBatch batch;
  batch.block_size = 2;
  batch.seqs = {PagedSequence{0, 2, 3, table, 2}};
  batch.num_tokens = 2;
  const std::vector<float> q = random_vector(n * heads * dk, 7);
  const std::vector<float> cache = random_vector(4 * dk, 8);
  std::vector<float> out(static_cast<size_t>(n * heads * dv));
  backend->paged_attention(q.data(), cache.data(), cache.data(), out.data(), batch,
                           Backend::AttentionShape{heads, 1, dk, dv, dk, dk}, 0.5f);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = 1 + t;  // context 3: two new tokens at positions 1 and 2
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> p;
      double max = -1e300;
      for (int64_t j = 0; j <= pos; ++j) {
        const int64_t slot = table[j / 2] * 2 + j % 2;
        double s = 0.0;
        for (int64_t c = 0; c < dk; ++c) s += q[(t * heads + h) * dk + c] * cache[slot * dk + c];
        p.push_back(s * 0.5);
        max = std::max(max, p.back());
      }
      double sum = 0.0;
      for (double& e : p) sum += (e = std::exp(e - max));
      for (int64_t c = 0; c < dv; ++c) {
        double o = 0.0;
        for (int64_t j = 0; j <= pos; ++j) o += p[static_cast<size_t>(j)] / sum * cache[(table[j / 2] * 2 + j % 2) * dk + c];
        EXPECT_NEAR(out[(t * heads + h) * dv + c], o, 1e-5);
      }
    }
  }
}

// YaRN: pairs that turn fast keep their frequency, slow ones are interpolated by the factor, the
// ones between blend (the DeepSeek-V2 configuration: dim 64, base 10000, factor 40 over 4096).
TEST(Rope, YarnFrequencies) {
  RopeParams p;
  p.dim = 64;
  p.freq_base = 10000.0;
  p.freq_scale = 1.0 / 40.0;
  p.yarn_orig_ctx = 4096.0;
  const std::vector<double> f = rope_frequencies(p);
  auto original = [&](int i) { return std::pow(10000.0, -2.0 * i / 64.0); };
  // Correction dims: floor(64 ln(4096 / (32 * 2 pi)) / (2 ln 10000)) = 10 and
  // ceil(64 ln(4096 / (2 pi)) / (2 ln 10000)) = 23.
  for (int i = 0; i <= 10; ++i) EXPECT_DOUBLE_EQ(f[static_cast<size_t>(i)], original(i)) << i;
  for (int i = 23; i < 32; ++i) EXPECT_DOUBLE_EQ(f[static_cast<size_t>(i)], original(i) / 40.0) << i;
  const double ramp = (16.0 - 10.0) / (23.0 - 10.0);
  EXPECT_NEAR(f[16], original(16) / 40.0 * ramp + original(16) * (1 - ramp), 1e-15);
  p.yarn_orig_ctx = 0.0;  // plain linear scaling
  EXPECT_DOUBLE_EQ(rope_frequencies(p)[5], original(5) / 40.0);
}

TEST(CpuBackend, StoreAndCopyBlocks) {
  auto backend = make_cpu_backend(1);
  std::vector<float> cache(8 * 3, 0.0f);  // 4 blocks of 2 slots, rows of 3
  const std::vector<float> rows = {1, 2, 3, 4, 5, 6};
  const int64_t slots[] = {7, 2};
  backend->store_kv(rows.data(), slots, 2, 3, cache.data(), KvDtype::kF32);
  EXPECT_EQ(cache[7 * 3 + 2], 3.0f);
  EXPECT_EQ(cache[2 * 3 + 0], 4.0f);
  backend->copy_blocks(cache.data(), {{1, 0}, {3, 2}}, 2 * 3 * sizeof(float));  // block 1 (slots 2,3) -> block 0
  EXPECT_EQ(cache[0], 4.0f);
  EXPECT_EQ(cache[4 * 3 + 3 + 2], 3.0f);  // block 3's slot 7 -> block 2's slot 5
}

TEST(CpuBackend, StoresAndCopiesF16Rows) {
  auto backend = make_cpu_backend(1);
  std::vector<uint16_t> cache(8 * 3, 0);
  const std::vector<float> rows = {1.0f, -2.5f, 1.0f / 3.0f, 70000.0f, 1e-6f, 0.1f};
  const int64_t slots[] = {7, 2};
  backend->store_kv(rows.data(), slots, 2, 3, cache.data(), KvDtype::kF16);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(cache[7 * 3 + c], fp32_to_fp16(rows[c]));
    EXPECT_EQ(cache[2 * 3 + c], fp32_to_fp16(rows[3 + c]));
  }
  EXPECT_EQ(fp16_to_fp32(cache[7 * 3 + 1]), -2.5f);
  EXPECT_TRUE(std::isinf(fp16_to_fp32(cache[2 * 3])));  // beyond f16's range
  EXPECT_EQ(cache[0], 0);
  backend->copy_blocks(cache.data(), {{1, 0}, {3, 2}}, 2 * 3 * sizeof(uint16_t));
  EXPECT_EQ(cache[0], fp32_to_fp16(rows[3]));
  EXPECT_EQ(cache[4 * 3 + 3 + 1], fp32_to_fp16(rows[1]));
  EXPECT_EQ(cache[1 * 3], 0);  // untouched: slot 1 of block 0 came from slot 3, never written
}

// load_kv reads back what store_kv stored, for every cache type and over the threads: f32 as it
// is, f16 and q8_0 as the values their rounding gave; and only the fast mode expands MLA prefill.
TEST(CpuBackend, LoadKvReadsBackTheStoredValues) {
  auto backend = make_cpu_backend(2);
  const int64_t dim = 576, slots_n = 300;
  const std::vector<float> rows = random_vector(slots_n * dim, 33);
  std::vector<int64_t> slots(static_cast<size_t>(slots_n));
  for (int64_t i = 0; i < slots_n; ++i) slots[static_cast<size_t>(i)] = (i * 7) % slots_n;  // a permutation
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kQ8_0, KvDtype::kFp8}) {
    std::vector<uint8_t> cache(static_cast<size_t>(slots_n) * kv_row_bytes(dtype, dim));
    backend->store_kv(rows.data(), slots.data(), slots_n, dim, cache.data(), dtype);
    std::vector<float> back(rows.size(), -1.0f), want(static_cast<size_t>(dim));
    backend->load_kv(cache.data(), dtype, slots.data(), slots_n, dim, back.data());
    for (int64_t i = 0; i < slots_n; ++i) {
      const float* r = rows.data() + i * dim;
      if (dtype == KvDtype::kF32) {
        std::copy_n(r, dim, want.begin());
      } else if (dtype == KvDtype::kF16) {
        for (int64_t c = 0; c < dim; ++c) want[static_cast<size_t>(c)] = fp16_to_fp32(fp32_to_fp16(r[c]));
      } else if (dtype == KvDtype::kQ8_0) {
        std::vector<BlockQ8_0> q(static_cast<size_t>(dim / 32));
        quantize_row_q8_0_ref(r, q.data(), dim);
        dequantize_row_ref(DType::kQ8_0, reinterpret_cast<const uint8_t*>(q.data()), want.data(), dim);
      } else {
        std::vector<uint8_t> q(fp8_kv_row_bytes(dim));
        quantize_row_fp8_kv_ref(r, q.data(), dim);
        dequantize_row_fp8_kv_ref(q.data(), want.data(), dim);
      }
      ASSERT_EQ(std::memcmp(back.data() + i * dim, want.data(), static_cast<size_t>(dim) * 4), 0)
          << kv_dtype_name(dtype) << " row " << i;
    }
  }
  EXPECT_EQ(make_cpu_backend(1, MatmulMode::kExact)->expands_mla_prefill(), false);
  EXPECT_EQ(make_cpu_backend(1, MatmulMode::kFast)->expands_mla_prefill(), mla_prefill_may_expand());
}

// One sequence of one token in block table[0] (blocks of 4): a call that only has to reach the
// shape checks.
PagedAttentionBatch one_token_batch(const int32_t* table) {
  PagedAttentionBatch batch;
  batch.block_size = 4;
  batch.seqs = {PagedSequence{0, 1, 1, table, 1}};
  batch.num_tokens = 1;
  return batch;
}

TEST(CpuBackend, StoresQ8_0RowsAndRefusesPartialBlocks) {
  auto backend = make_cpu_backend(1);
  const std::vector<float> rows = random_vector(2 * 64, 21);
  std::vector<BlockQ8_0> cache(4 * 2);  // 4 slots of 64 values
  const int64_t slots[] = {3, 0};
  backend->store_kv(rows.data(), slots, 2, 64, cache.data(), KvDtype::kQ8_0);
  std::vector<BlockQ8_0> want(2);
  quantize_row_q8_0_ref(rows.data(), want.data(), 64);
  EXPECT_EQ(std::memcmp(&cache[3 * 2], want.data(), 2 * sizeof(BlockQ8_0)), 0);
  quantize_row_q8_0_ref(rows.data() + 64, want.data(), 64);
  EXPECT_EQ(std::memcmp(&cache[0], want.data(), 2 * sizeof(BlockQ8_0)), 0);
  EXPECT_EQ(kv_row_bytes(KvDtype::kQ8_0, 64), 68u);
  EXPECT_THROW(kv_row_bytes(KvDtype::kQ8_0, 40), Error);
  // Heads narrower than a block cannot be addressed in a q8_0 row.
  const int32_t table[] = {0};
  const PagedAttentionBatch batch = one_token_batch(table);
  std::vector<float> q(4 * 16), out(4 * 16);
  EXPECT_THROW(backend->paged_attention(q.data(), cache.data(), cache.data(), out.data(), batch,
                                        Backend::AttentionShape{4, 4, 16, 16, 64, 64, KvDtype::kQ8_0}, 1.0f),
               Error);
}

// fp8 rows stored as the reference lays them out (MLA's 576: four blocks and 64 halves); heads
// that would start inside a block are refused.
TEST(CpuBackend, StoresFp8RowsAndRefusesHeadsInsideBlocks) {
  auto backend = make_cpu_backend(1);
  const int64_t dim = 576;
  const std::vector<float> rows = random_vector(2 * dim, 22);
  const size_t rb = kv_row_bytes(KvDtype::kFp8, dim);
  EXPECT_EQ(rb, 656u);
  std::vector<uint8_t> cache(3 * rb), want(rb);
  const int64_t slots[] = {2, 0};
  backend->store_kv(rows.data(), slots, 2, dim, cache.data(), KvDtype::kFp8);
  quantize_row_fp8_kv_ref(rows.data(), want.data(), dim);
  EXPECT_EQ(std::memcmp(cache.data() + 2 * rb, want.data(), rb), 0);
  quantize_row_fp8_kv_ref(rows.data() + dim, want.data(), dim);
  EXPECT_EQ(std::memcmp(cache.data(), want.data(), rb), 0);
  const int32_t table[] = {0};
  const PagedAttentionBatch batch = one_token_batch(table);
  std::vector<float> q(4 * 64), out(4 * 64);
  std::vector<uint8_t> heads_cache(4 * kv_row_bytes(KvDtype::kFp8, 256));
  EXPECT_THROW(backend->paged_attention(q.data(), heads_cache.data(), heads_cache.data(), out.data(), batch,
                                        Backend::AttentionShape{4, 4, 64, 64, 256, 256, KvDtype::kFp8}, 1.0f),
               Error);
}

TEST(CpuBackend, RejectsUncomputableWeights) {
  auto backend = make_cpu_backend(1);
  std::vector<uint8_t> data(66);
  const WeightView w{"blk.0.ffn_down.weight", DType::kIQ2_XXS, 1, 256, data.data()};
  std::vector<float> x(256), y(1);
  try {
    backend->matmul(w, x.data(), 1, y.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("blk.0.ffn_down.weight"), std::string::npos);
  }
}

// An op whose scratch cannot be allocated fails as a call: an Error (resource exhausted, naming the
// weight) from matmul, with the backend usable afterwards. The scratch was once resized inside the
// thread-pool jobs, so the failed allocation happened on a worker and std::terminate ended the
// process. (An f16 matrix of 2^50 columns: its f32 tiles cannot exist; no weight byte is read.)
TEST(CpuBackend, AScratchAllocationThatFailsIsAnErrorOfTheCall) {
  for (MatmulMode mode : {MatmulMode::kExact, MatmulMode::kFast}) {
    auto backend = make_cpu_backend(2, mode);
    const uint16_t dummy = 0;
    const WeightView huge{"blk.0.huge.weight", DType::kF16, 32, int64_t{1} << 50, &dummy};
    const float x = 0.0f;
    float y = 0.0f;
    try {
      backend->matmul(huge, &x, 1, &y);
      FAIL() << "a matmul over 2^50 columns returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted) << e.what();
      EXPECT_NE(std::string(e.what()).find("blk.0.huge.weight"), std::string::npos) << e.what();
    }
    // The next call works.
    std::vector<uint16_t> w(2 * 64, fp32_to_fp16(0.5f));
    std::vector<float> in(64, 1.0f), out(2, 0.0f);
    backend->matmul(WeightView{"ok", DType::kF16, 2, 64, w.data()}, in.data(), 1, out.data());
    EXPECT_FLOAT_EQ(out[0], 32.0f);
    EXPECT_FLOAT_EQ(out[1], 32.0f);
  }
}

}  // namespace
}  // namespace duet
