// Every op of the CUDA backend against the CPU backend (exact matmul: weights converted to f32)
// on the same random inputs, odd sizes included. Tolerances, as the largest difference over the
// largest reference magnitude (or bytes, where the result is bits), per op and type:
//   get_rows, copies, store_kv f32/f16     the same values (f16 rounding is the same RNE)
//   store_kv q8_0                          the same scales, quants within 1 (a rounding tie)
//   rms_norm, rope, silu_mul, add          1e-5 (another summation order; cos/sin in double both)
//   matmul f32, block formats by GEMV      1e-4 (f32 sums in another order; FP8 among them)
//   matmul f16 weights (tensor cores)      2e-3 (activations rounded to f16)
//   matmul bf16 weights                    1e-2 (activations rounded to bf16)
//   matmul block formats, m > 8            4e-3 (weights and activations rounded to f16)
//   paged attention f32/f16/q8_0 cache     1e-4
//   moe_route                              the same experts, weights 1e-5
//   moe_experts                            1e-4 (GEMV, f32 sums)
// Without a GPU the whole test reports itself skipped (exit 77) with the runtime's reason.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/backend/backend.h"
#include "duet/backend/cuda_device.h"
#include "duet/backend/device.h"
#include "duet/core/error.h"
#include "duet/core/quant.h"

namespace duet {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Largest difference over the largest reference magnitude.
double rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0.0, mag = 1e-30;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(want[i])));
  }
  return diff / mag;
}

class CudaOps : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { gpu_ = make_cuda_device(0); }
  static void TearDownTestSuite() { gpu_.reset(); }
  void SetUp() override { cpu_ = make_cpu_backend(1, MatmulMode::kExact); }

  template <typename T>
  DeviceBuffer put(const std::vector<T>& v) {
    DeviceBuffer b = gpu_->allocate(std::max<size_t>(1, v.size() * sizeof(T)), MemoryKind::kScratch);
    if (!v.empty()) gpu_->copy_from_host(b.data(), v.data(), v.size() * sizeof(T));
    return b;
  }
  template <typename T>
  std::vector<T> get(const DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    if (n > 0) gpu_->copy_to_host(v.data(), b.data(), n * sizeof(T));
    return v;
  }
  Backend& gpu() { return gpu_->backend(); }

  static std::vector<uint8_t> weights_of(DType type, const std::vector<float>& f, int64_t rows, int64_t cols) {
    const size_t rb = row_size(type, cols);
    std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
    if (type == DType::kQ5_0) {  // no quantizer: random quants, small scales
      std::mt19937 rng(static_cast<uint32_t>(rows * 131 + cols));
      for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
      auto* blocks = reinterpret_cast<BlockQ5_0*>(w.data());
      for (size_t b = 0; b < w.size() / sizeof(BlockQ5_0); ++b) blocks[b].d = fp32_to_fp16(0.01f * (1 + b % 3));
      return w;
    }
    if (type == DType::kFP8_E4M3_B128) {  // no quantizer: random codes (NaN's left out), f32 scales per 128
      std::mt19937 rng(static_cast<uint32_t>(rows * 137 + cols));
      for (int64_t r = 0; r < rows; ++r) {
        uint8_t* row = w.data() + r * rb;
        for (int64_t c0 = 0, b = 0; c0 < cols; c0 += kQKFP8, ++b) {
          const float d = 0.002f * static_cast<float>(1 + (r + b) % 5);
          std::memcpy(row + b * sizeof(BlockFP8), &d, sizeof d);
          for (int64_t j = 0; j < std::min<int64_t>(kQKFP8, cols - c0); ++j) {
            uint8_t v = static_cast<uint8_t>(rng());
            if ((v & 0x7f) == 0x7f) v ^= 1;
            row[b * sizeof(BlockFP8) + sizeof d + j] = v;
          }
        }
      }
      return w;
    }
    for (int64_t r = 0; r < rows; ++r) quantize_row_ref(type, f.data() + r * cols, w.data() + r * rb, cols);
    return w;
  }

  static inline std::shared_ptr<Device> gpu_;
  std::unique_ptr<Backend> cpu_;
};

const std::vector<DType> kTypes = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                                   DType::kQ4_1, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K, DType::kFP8_E4M3_B128};
bool k_quant(DType t) { return t == DType::kQ4_K || t == DType::kQ6_K; }

TEST_F(CudaOps, GetRows) {
  for (DType t : kTypes) {
    const int64_t rows = 37, cols = k_quant(t) ? 512 : (t == DType::kF32 || t == DType::kF16 ? 97 : 160);
    const std::vector<uint8_t> w = weights_of(t, random_floats(static_cast<size_t>(rows * cols), 1), rows, cols);
    const std::vector<int32_t> ids = {0, 36, 5, 5, 17, 1, 30};
    WeightView hv{"w", t, rows, cols, w.data()};
    std::vector<float> want(ids.size() * static_cast<size_t>(cols));
    cpu_->get_rows(hv, ids.data(), static_cast<int64_t>(ids.size()), want.data());
    DeviceBuffer dw = put(w), y = gpu_->allocate(want.size() * 4, MemoryKind::kScratch);
    WeightView dv = hv;
    dv.data = dw.data();
    gpu().get_rows(dv, ids.data(), static_cast<int64_t>(ids.size()), y.as<float>());
    EXPECT_LE(rel_diff(get<float>(y, want.size()), want), 1e-6) << dtype_name(t);
  }
}

TEST_F(CudaOps, Matmul) {
  for (DType t : kTypes) {
    for (int64_t rows : {1, 7, 67}) {
      for (int64_t m : {1, 3, 8, 9, 33}) {
        const int64_t cols = k_quant(t) ? 256
                             : t == DType::kFP8_E4M3_B128                                   ? 288  // 2 blocks of 128 and 32
                             : (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 ? 33 : 96);
        const std::vector<uint8_t> w = weights_of(t, random_floats(static_cast<size_t>(rows * cols), 2), rows, cols);
        const std::vector<float> x = random_floats(static_cast<size_t>(m * cols), 3);
        WeightView hv{"w", t, rows, cols, w.data()};
        std::vector<float> want(static_cast<size_t>(m * rows));
        cpu_->matmul(hv, x.data(), m, want.data());
        DeviceBuffer dw = put(w), dx = put(x), y = gpu_->allocate(want.size() * 4, MemoryKind::kScratch);
        WeightView dv = hv;
        dv.data = dw.data();
        gpu().matmul(dv, dx.as<float>(), m, y.as<float>());
        double tol = 1e-4;
        if (t == DType::kF16) tol = 2e-3;
        if (t == DType::kBF16) tol = 1e-2;
        if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16 && m > 8) tol = 4e-3;
        EXPECT_LE(rel_diff(get<float>(y, want.size()), want), tol) << dtype_name(t) << " rows " << rows << " m " << m;
      }
    }
  }
}

TEST_F(CudaOps, RmsNormSiluMulAdd) {
  const int64_t rows = 5, dim = 333, n = rows * dim;
  const std::vector<float> x = random_floats(n, 4), w = random_floats(dim, 5), u = random_floats(n, 6);
  std::vector<float> want(n);
  cpu_->rms_norm(x.data(), w.data(), want.data(), rows, dim, 1e-6f);
  DeviceBuffer dx = put(x), dw = put(w), du = put(u), y = gpu_->allocate(n * 4, MemoryKind::kScratch);
  gpu().rms_norm(dx.as<float>(), dw.as<float>(), y.as<float>(), rows, dim, 1e-6f);
  EXPECT_LE(rel_diff(get<float>(y, n), want), 1e-5) << "rms_norm";
  cpu_->silu_mul(x.data(), u.data(), want.data(), n);
  gpu().silu_mul(dx.as<float>(), du.as<float>(), y.as<float>(), n);
  EXPECT_LE(rel_diff(get<float>(y, n), want), 1e-5) << "silu_mul";
  std::vector<float> sum = x;
  cpu_->add(sum.data(), u.data(), n);
  gpu().add(dx.as<float>(), du.as<float>(), n);
  EXPECT_LE(rel_diff(get<float>(dx, n), sum), 1e-6) << "add";
}

TEST_F(CudaOps, RopeEveryScaling) {
  const int64_t rows = 7, heads = 3, head_dim = 64;
  std::vector<RopeParams> cases(5);
  cases[0].dim = 64;  // normal
  cases[1].dim = 64;
  cases[1].mode = RopeMode::kNeox;
  cases[2].dim = 32;  // a rotated part at an offset (MLA's rope dims), YaRN
  cases[2].offset = 32;
  cases[2].mode = RopeMode::kNeox;
  cases[2].freq_scale = 0.25;
  cases[2].yarn_orig_ctx = 4096;
  cases[2].attn_factor = 1.1;
  cases[3].dim = 64;  // llama3 factors
  cases[3].freq_base = 500000.0;
  for (int i = 0; i < 32; ++i) cases[3].freq_factors.push_back(1.0f + static_cast<float>(i % 5));
  cases[4].dim = 64;  // linear
  cases[4].freq_scale = 0.5;
  const std::vector<int32_t> pos = {0, 1, 17, 999, 4095, 5000, 3};
  for (size_t c = 0; c < cases.size(); ++c) {
    std::vector<float> x = random_floats(static_cast<size_t>(rows * heads * head_dim), 7);
    DeviceBuffer dx = put(x);
    cpu_->rope(x.data(), rows, heads, head_dim, pos.data(), cases[c]);
    gpu().rope(dx.as<float>(), rows, heads, head_dim, pos.data(), cases[c]);
    EXPECT_LE(rel_diff(get<float>(dx, x.size()), x), 1e-5) << "rope case " << c;
  }
}

TEST_F(CudaOps, StoreKvAndCopies) {
  const int64_t dim = 96, n = 5, slots_total = 40;
  const std::vector<float> rows = random_floats(static_cast<size_t>(n * dim), 8);
  const std::vector<int64_t> slots = {3, 39, 0, 17, 18};
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16, KvDtype::kQ8_0}) {
    const size_t rb = kv_row_bytes(dt, dim);
    std::vector<uint8_t> want(rb * slots_total, 0);
    cpu_->store_kv(rows.data(), slots.data(), n, dim, want.data(), dt);
    DeviceBuffer cache = put(std::vector<uint8_t>(want.size(), 0)), dr = put(rows);
    gpu().store_kv(dr.as<float>(), slots.data(), n, dim, cache.data(), dt);
    const std::vector<uint8_t> got = get<uint8_t>(cache, want.size());
    if (dt != KvDtype::kQ8_0) {
      EXPECT_EQ(got, want) << kv_dtype_name(dt);
    } else {
      const auto* g = reinterpret_cast<const BlockQ8_0*>(got.data());
      const auto* w = reinterpret_cast<const BlockQ8_0*>(want.data());
      for (size_t b = 0; b < want.size() / sizeof(BlockQ8_0); ++b) {
        EXPECT_EQ(g[b].d, w[b].d) << "block " << b;
        for (int j = 0; j < 32; ++j) EXPECT_LE(std::abs(g[b].qs[j] - w[b].qs[j]), 1) << "block " << b;
      }
    }
    // copy_blocks (blocks of 4 slots) and copy_2d on the same cache.
    const std::vector<std::pair<int32_t, int32_t>> copies = {{0, 2}, {4, 9}};
    cpu_->copy_blocks(want.data(), copies, static_cast<int64_t>(4 * rb));
    gpu().copy_blocks(cache.data(), copies, static_cast<int64_t>(4 * rb));
    if (dt != KvDtype::kQ8_0) {
      EXPECT_EQ(get<uint8_t>(cache, want.size()), want) << "copy_blocks";
    }
  }
  const std::vector<float> src = random_floats(7 * 13, 9);
  std::vector<float> dst(5 * 11, 0.0f);
  DeviceBuffer ds = put(src), dd = put(dst);
  cpu_->copy_2d(src.data() + 2, 13, dst.data() + 1, 11, 5, 9);
  gpu().copy_2d(ds.as<float>() + 2, 13, dd.as<float>() + 1, 11, 5, 9);
  EXPECT_EQ(get<float>(dd, dst.size()), dst) << "copy_2d";
}

struct AttnCase {
  const char* name;
  int64_t heads, kv_heads, dk, dv;
  bool mla;  // values are the first dv elements of the key row
};

TEST_F(CudaOps, PagedAttentionDecodePrefillAndChunks) {
  const int32_t bs = 16;
  const std::vector<AttnCase> cases = {{"mha", 3, 3, 64, 64, false},
                                       {"gqa", 8, 2, 64, 64, false},
                                       {"gqa7", 14, 2, 32, 32, false},
                                       {"mla", 4, 1, 96, 64, true}};
  // (new tokens, context): decode, a prefill, a chunk after a cached prefix, a long decode.
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{1, 1}, {13, 13}, {5, 40}, {1, 77}};
  for (const AttnCase& c : cases) {
    for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16, KvDtype::kQ8_0}) {
      const int64_t k_stride = c.kv_heads * c.dk, v_stride = c.mla ? k_stride : c.kv_heads * c.dv;
      int32_t num_tokens = 0, blocks = 0;
      std::vector<std::vector<int32_t>> tables;
      for (const auto& [nt, ctx] : seqs) {
        std::vector<int32_t> t;
        for (int32_t i = 0; i < (ctx + bs - 1) / bs; ++i) t.push_back(blocks++);
        std::reverse(t.begin(), t.end());  // blocks out of order
        tables.push_back(t);
        num_tokens += nt;
      }
      const int64_t slots = static_cast<int64_t>(blocks) * bs;
      // Random rows stored through the CPU's store_kv (the same bits in both caches).
      const std::vector<float> kf = random_floats(static_cast<size_t>(slots * k_stride), 10);
      const std::vector<float> vf = random_floats(static_cast<size_t>(slots * v_stride), 11);
      std::vector<int64_t> all(static_cast<size_t>(slots));
      for (int64_t s = 0; s < slots; ++s) all[static_cast<size_t>(s)] = s;
      std::vector<uint8_t> kc(kv_row_bytes(dt, k_stride) * slots), vc(kv_row_bytes(dt, v_stride) * slots);
      cpu_->store_kv(kf.data(), all.data(), slots, k_stride, kc.data(), dt);
      cpu_->store_kv(vf.data(), all.data(), slots, v_stride, vc.data(), dt);
      PagedAttentionBatch batch;
      batch.block_size = bs;
      batch.num_tokens = num_tokens;
      int32_t start = 0;
      for (size_t i = 0; i < seqs.size(); ++i) {
        batch.seqs.push_back({start, seqs[i].first, seqs[i].second, tables[i].data(),
                              static_cast<int32_t>(tables[i].size())});
        start += seqs[i].first;
      }
      Backend::AttentionShape shape{c.heads, c.kv_heads, c.dk, c.dv, k_stride, v_stride, dt};
      const std::vector<float> q = random_floats(static_cast<size_t>(num_tokens * c.heads * c.dk), 12);
      std::vector<float> want(static_cast<size_t>(num_tokens * c.heads * c.dv));
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
      cpu_->paged_attention(q.data(), kc.data(), c.mla ? kc.data() : vc.data(), want.data(), batch, shape, scale);
      DeviceBuffer dq = put(q), dk = put(kc), dvb = put(vc), out = gpu_->allocate(want.size() * 4, MemoryKind::kScratch);
      gpu().paged_attention(dq.as<float>(), dk.data(), c.mla ? dk.data() : dvb.data(), out.as<float>(), batch, shape,
                            scale);
      EXPECT_LE(rel_diff(get<float>(out, want.size()), want), 1e-4) << c.name << " " << kv_dtype_name(dt);
    }
  }
}

TEST_F(CudaOps, MoeRouteAndGroupedExperts) {
  const int64_t E = 16, n = 37;
  const std::vector<float> logits = random_floats(static_cast<size_t>(n * E), 13, 2.0f);
  const std::vector<float> bias = random_floats(E, 14, 0.1f);
  DeviceBuffer dl = put(logits), db = put(bias);
  std::vector<MoeRouting> routes(3);
  routes[0].num_experts = E;  // V2: softmax, top 4 of 4 groups' best 2
  routes[0].num_used = 4;
  routes[0].num_groups = 4;
  routes[0].num_groups_used = 2;
  routes[0].routed_scaling = 1.5;
  routes[1] = routes[0];  // V3: sigmoid, bias, normalised, scaled
  routes[1].gating = MoeRouting::Gating::kSigmoid;
  routes[1].norm_topk = true;
  routes[1].routed_scaling = 2.5;
  routes[2].num_experts = E;  // no groups
  routes[2].num_used = 3;
  routes[2].norm_topk = true;
  for (size_t c = 0; c < routes.size(); ++c) {
    const MoeRouting& r = routes[c];
    const int64_t k = r.num_used;
    std::vector<int32_t> ids(static_cast<size_t>(n * k));
    std::vector<float> w(ids.size());
    MoeRouting hr = r;
    if (c == 1) hr.bias = bias.data();
    cpu_->moe_route(logits.data(), n, hr, ids.data(), w.data());
    DeviceBuffer gi = gpu_->allocate(ids.size() * 4, MemoryKind::kScratch), gw = gpu_->allocate(w.size() * 4, MemoryKind::kScratch);
    MoeRouting gr = r;
    if (c == 1) gr.bias = db.as<float>();
    gpu().moe_route(dl.as<float>(), n, gr, gi.as<int32_t>(), gw.as<float>());
    EXPECT_EQ(get<int32_t>(gi, ids.size()), ids) << "route " << c;
    EXPECT_LE(rel_diff(get<float>(gw, w.size()), w), 1e-5) << "route " << c;
  }
  // The grouped experts, some picks on another rank (-1).
  for (DType t : {DType::kF32, DType::kQ8_0, DType::kQ4_K}) {
    const int64_t ff = k_quant(t) ? 256 : 64, d = k_quant(t) ? 256 : 96, k = 3;
    const std::vector<uint8_t> gate = weights_of(t, random_floats(static_cast<size_t>(E * ff * d), 15), E * ff, d);
    const std::vector<uint8_t> up = weights_of(t, random_floats(static_cast<size_t>(E * ff * d), 16), E * ff, d);
    const std::vector<uint8_t> down = weights_of(t, random_floats(static_cast<size_t>(E * d * ff), 17), E * d, ff);
    for (int64_t tokens : {1, 5, 40}) {
      std::mt19937 rng(static_cast<uint32_t>(tokens));
      std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
      for (int64_t tk = 0; tk < tokens; ++tk) {
        std::vector<int32_t> all(static_cast<size_t>(E));
        for (int32_t e = 0; e < E; ++e) all[static_cast<size_t>(e)] = e;
        std::shuffle(all.begin(), all.end(), rng);
        for (int64_t i = 0; i < k; ++i) ids[static_cast<size_t>(tk * k + i)] = (tk + i) % 7 == 3 ? -1 : all[static_cast<size_t>(i)];
      }
      const std::vector<float> w = random_floats(ids.size(), 18), x = random_floats(static_cast<size_t>(tokens * d), 19);
      MoeExperts hm{{"gate", t, E * ff, d, gate.data()}, {"up", t, E * ff, d, up.data()},
                    {"down", t, E * d, ff, down.data()}, E, ff};
      std::vector<float> want(static_cast<size_t>(tokens * d));
      cpu_->moe_experts(hm, x.data(), ids.data(), w.data(), tokens, k, want.data());
      DeviceBuffer dg = put(gate), du = put(up), dd = put(down), di = put(ids), dw = put(w), dx = put(x);
      DeviceBuffer out = gpu_->allocate(want.size() * 4, MemoryKind::kScratch);
      MoeExperts gm = hm;
      gm.gate.data = dg.data();
      gm.up.data = du.data();
      gm.down.data = dd.data();
      gpu().moe_experts(gm, dx.as<float>(), di.as<int32_t>(), dw.as<float>(), tokens, k, out.as<float>());
      EXPECT_LE(rel_diff(get<float>(out, want.size()), want), 1e-4) << dtype_name(t) << " tokens " << tokens;
    }
  }
}

// Matmuls row by row (MatmulMode::kExact, DUET_MATMUL=exact): every weight type through the GEMV,
// and each row's bits do not depend on the rows beside it.
TEST_F(CudaOps, MatmulRowByRowIsBatchInvariant) {
  const std::shared_ptr<Device> exact = make_cuda_device(0, MatmulMode::kExact);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_K}) {
    const int64_t rows = 67, cols = 256, m = 33;
    const std::vector<uint8_t> w = weights_of(t, random_floats(static_cast<size_t>(rows * cols), 2), rows, cols);
    const std::vector<float> x = random_floats(static_cast<size_t>(m * cols), 3);
    WeightView hv{"w", t, rows, cols, w.data()};
    std::vector<float> want(static_cast<size_t>(m * rows));
    cpu_->matmul(hv, x.data(), m, want.data());
    DeviceBuffer dw = exact->allocate(w.size(), MemoryKind::kWeights), dx = exact->allocate(x.size() * 4, MemoryKind::kScratch);
    exact->copy_from_host(dw.data(), w.data(), w.size());
    exact->copy_from_host(dx.data(), x.data(), x.size() * 4);
    DeviceBuffer all = exact->allocate(want.size() * 4, MemoryKind::kScratch), one = exact->allocate(rows * 4, MemoryKind::kScratch);
    WeightView dv = hv;
    dv.data = dw.data();
    exact->backend().matmul(dv, dx.as<float>(), m, all.as<float>());
    std::vector<float> got(want.size()), alone(static_cast<size_t>(rows));
    exact->copy_to_host(got.data(), all.data(), got.size() * 4);
    EXPECT_LE(rel_diff(got, want), 1e-4) << dtype_name(t);
    exact->backend().matmul(dv, dx.as<float>() + 17 * cols, 1, one.as<float>());
    exact->copy_to_host(alone.data(), one.data(), alone.size() * 4);
    EXPECT_EQ(std::memcmp(alone.data(), got.data() + 17 * rows, alone.size() * 4), 0) << dtype_name(t);
  }
}

// A decode-like step (get_rows, rms_norm, Q8_0 matmuls, store_kv, paged attention), two sequences
// and one padding row (slot -1, context 0), run through the device's graphs five times with other
// ids, positions, slots and contexts: plain (the warm-up), captured, replayed three times; each
// time the real rows match the CPU's ops on the unpadded step, the padding row attends to nothing
// (zeros) and stores nothing (the caches stay equal). Then a step writing another buffer: its
// launches differ from the captured ones, so it runs plain, and is still right.
TEST_F(CudaOps, ADecodeStepIsCapturedAndReplayedAsAGraph) {
  StepGraphs* graphs = gpu_->step_graphs();
  ASSERT_NE(graphs, nullptr) << "DUET_CUDA_GRAPHS turned them off";
  const StepGraphs::Stats before = graphs->stats();
  const int64_t vocab = 50, d = 64;
  const int32_t bs = 4, num_blocks = 8;
  const std::vector<float> embd = random_floats(static_cast<size_t>(vocab * d), 30), norm = random_floats(d, 31);
  const std::vector<uint8_t> wq = weights_of(DType::kQ8_0, random_floats(d * d, 32), d, d);
  const std::vector<uint8_t> wkv = weights_of(DType::kQ8_0, random_floats(d * d, 33), d, d);
  const std::vector<float> prefill = random_floats(static_cast<size_t>(num_blocks * bs * d), 34);
  DeviceBuffer de = put(embd), dn = put(norm), dq = put(wq), dkv = put(wkv), dcache = put(prefill);
  std::vector<float> cache = prefill;  // the CPU's copy
  const WeightView he{"e", DType::kF32, vocab, d, embd.data()}, hq{"q", DType::kQ8_0, d, d, wq.data()},
      hkv{"kv", DType::kQ8_0, d, d, wkv.data()};
  WeightView ge = he, gq = hq, gkv = hkv;
  ge.data = de.data();
  gq.data = dq.data();
  gkv.data = dkv.data();
  const Backend::AttentionShape shape{1, 1, d, d, d, d, KvDtype::kF32};
  const float scale = 0.125f;
  DeviceBuffer x = gpu_->allocate(3 * d * 4, MemoryKind::kScratch), h = gpu_->allocate(3 * d * 4, MemoryKind::kScratch),
               q = gpu_->allocate(3 * d * 4, MemoryKind::kScratch), kv = gpu_->allocate(3 * d * 4, MemoryKind::kScratch),
               out = gpu_->allocate(3 * d * 4, MemoryKind::kScratch), other = gpu_->allocate(3 * d * 4, MemoryKind::kScratch);
  const std::vector<int32_t> table_a = {5, 1, 6, 2}, table_b = {0, 3, 7, 4};
  std::vector<StepGraphs::Ran> ran;
  for (int step = 0; step < 6; ++step) {
    const int32_t ctx_a = 3 + step, ctx_b = 9 + step;  // each sequence's new token is its last position
    const std::vector<int32_t> ids = {static_cast<int32_t>(7 * step % vocab), static_cast<int32_t>(11 + step), 0};
    const std::vector<int64_t> slots = {int64_t{table_a[(ctx_a - 1) / bs]} * bs + (ctx_a - 1) % bs,
                                        int64_t{table_b[(ctx_b - 1) / bs]} * bs + (ctx_b - 1) % bs, -1};
    PagedAttentionBatch batch;
    batch.block_size = bs;
    batch.num_tokens = 3;
    batch.seqs = {{0, 1, ctx_a, table_a.data(), 4}, {1, 1, ctx_b, table_b.data(), 4}, {2, 1, 0, nullptr, 0}};
    float* result = step == 5 ? other.as<float>() : out.as<float>();
    const auto ops = [&] {
      Backend& g = gpu();
      g.get_rows(ge, ids.data(), 3, x.as<float>());
      g.rms_norm(x.as<float>(), dn.as<float>(), h.as<float>(), 3, d, 1e-6f);
      g.matmul(gkv, h.as<float>(), 3, kv.as<float>());
      g.store_kv(kv.as<float>(), slots.data(), 3, d, dcache.data(), KvDtype::kF32);
      g.matmul(gq, h.as<float>(), 3, q.as<float>());
      g.paged_attention(q.as<float>(), dcache.data(), dcache.data(), result, batch, shape, scale);
    };
    ran.push_back(graphs->run(StepGraphs::Key{3, 256}, ops));
    // The CPU on the two real rows.
    std::vector<float> cx(2 * d), ch(2 * d), cq(2 * d), ckv(2 * d), want(2 * d);
    cpu_->get_rows(he, ids.data(), 2, cx.data());
    cpu_->rms_norm(cx.data(), norm.data(), ch.data(), 2, d, 1e-6f);
    cpu_->matmul(hkv, ch.data(), 2, ckv.data());
    cpu_->store_kv(ckv.data(), slots.data(), 2, d, cache.data(), KvDtype::kF32);
    cpu_->matmul(hq, ch.data(), 2, cq.data());
    PagedAttentionBatch real = batch;
    real.seqs.pop_back();
    real.num_tokens = 2;
    cpu_->paged_attention(cq.data(), cache.data(), cache.data(), want.data(), real, shape, scale);
    const std::vector<float> got = get<float>(step == 5 ? other : out, 3 * d);
    EXPECT_LE(rel_diff(std::vector<float>(got.begin(), got.begin() + 2 * d), want), 1e-4) << "step " << step;
    for (int64_t i = 2 * d; i < 3 * d; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], 0.0f) << "padding row, step " << step;
    EXPECT_LE(rel_diff(get<float>(dcache, cache.size()), cache), 1e-4) << "caches after step " << step;
  }
  using Ran = StepGraphs::Ran;
  EXPECT_EQ(ran, (std::vector<Ran>{Ran::kPlain, Ran::kCaptured, Ran::kReplayed, Ran::kReplayed, Ran::kReplayed,
                                   Ran::kPlain}));
  const StepGraphs::Stats after = graphs->stats();
  EXPECT_EQ(after.captures - before.captures, 1);
  EXPECT_EQ(after.replays - before.replays, 3);
  EXPECT_EQ(after.mismatches - before.mismatches, 1);
  EXPECT_EQ(after.capture_failures, before.capture_failures);
}

TEST_F(CudaOps, DeviceCountsItsMemoryAndRefusesTooMuch) {
  const int64_t before = gpu_->memory_used(MemoryKind::kKv);
  {
    DeviceBuffer b = gpu_->allocate(1 << 20, MemoryKind::kKv);
    EXPECT_EQ(gpu_->memory_used(MemoryKind::kKv), before + (1 << 20));
  }
  EXPECT_EQ(gpu_->memory_used(MemoryKind::kKv), before);
  EXPECT_THROW(gpu_->allocate(size_t{1} << 50, MemoryKind::kKv), Error);
  // A copy larger than the staging halves round-trips.
  const std::vector<float> big = random_floats(size_t{5} << 20, 20);
  DeviceBuffer b = put(big);
  EXPECT_EQ(get<float>(b, big.size()), big);
}

}  // namespace
}  // namespace duet
