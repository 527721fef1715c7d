// The CUDA backend's host side, which runs on every machine: the matmul, attention and MoE plans
// (what the kernels are launched over), the metadata ring, the scratch layout; and, in a build
// with CUDA, what a machine without a GPU must say: cuBLAS loads, the runtime's reason for having
// no GPU is reported, and `cuda:N` is refused with it.
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <gtest/gtest.h>

#include "duet/backend/cuda/plan.h"
#include "duet/backend/cuda_device.h"
#include "duet/backend/devices.h"
#include "duet/core/error.h"
#ifdef DUET_HAVE_CUDA
#include "duet/backend/cuda/cublas_api.h"
#endif

namespace duet::cuda {
namespace {

ScratchLayout small_scratch() { return scratch_layout(size_t{16} << 20); }

TEST(CudaScratch, RegionsAreAlignedAndDisjoint) {
  for (size_t mb : {1, 16, 100, 256, 4096}) {
    const ScratchLayout s = scratch_layout(mb << 20);
    EXPECT_GE(s.total, size_t{16} << 20);
    EXPECT_EQ(s.weight_tile_offset % 256, 0u);
    EXPECT_EQ(s.activation_offset % 256, 0u);
    EXPECT_EQ(s.moe_offset % 256, 0u);
    EXPECT_LE(s.weight_tile_offset + s.weight_tile_bytes, s.activation_offset);
    EXPECT_LE(s.activation_offset + s.activation_bytes, s.moe_offset);
    EXPECT_EQ(s.moe_offset + s.moe_bytes, s.total);
    EXPECT_GT(s.moe_bytes, s.total / 2);
  }
}

// Every (weight row, activation row) is covered by exactly one tile, and each tile fits the scratch.
void expect_exact_cover(const MatmulPlan& p, DType type, int64_t rows, int64_t cols, int64_t m, const ScratchLayout& s) {
  std::vector<int> seen(static_cast<size_t>(rows * m), 0);
  for (const MatmulTile& t : p.tiles) {
    ASSERT_GE(t.row0, 0);
    ASSERT_GT(t.rows, 0);
    ASSERT_LE(t.row0 + t.rows, rows);
    ASSERT_GE(t.m0, 0);
    ASSERT_GT(t.m, 0);
    ASSERT_LE(t.m0 + t.m, m);
    for (int64_t r = t.row0; r < t.row0 + t.rows; ++r) {
      for (int64_t i = t.m0; i < t.m0 + t.m; ++i) ++seen[static_cast<size_t>(r * m + i)];
    }
    const auto half = static_cast<size_t>(cols) * 2;
    if (p.path == MatmulPath::kGemv) {
      EXPECT_LE(t.m, kGemvMaxRows);
    }
    if (p.path == MatmulPath::kCublasHalf || p.path == MatmulPath::kDequantGemm) {
      EXPECT_LE(static_cast<size_t>(t.m) * half, s.activation_bytes);
    }
    if (p.path == MatmulPath::kDequantGemm) {
      EXPECT_LE(static_cast<size_t>(t.rows) * half, s.weight_tile_bytes);
    }
  }
  for (int v : seen) ASSERT_EQ(v, 1) << dtype_name(type) << " " << rows << "x" << cols << " m=" << m;
}

TEST(CudaMatmulPlan, PathsByTypeAndRows) {
  const ScratchLayout s = scratch_layout(size_t{256} << 20);
  EXPECT_EQ(plan_matmul(DType::kF32, 7, 33, 1, s).path, MatmulPath::kCublasF32);
  EXPECT_EQ(plan_matmul(DType::kF16, 7, 33, 1, s).path, MatmulPath::kCublasHalf);
  EXPECT_EQ(plan_matmul(DType::kBF16, 7, 33, 100, s).path, MatmulPath::kCublasHalf);
  for (DType q : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K,
                  DType::kFP8_E4M3_B128}) {
    EXPECT_EQ(plan_matmul(q, 64, 256, 1, s).path, MatmulPath::kGemv) << dtype_name(q);
    EXPECT_EQ(plan_matmul(q, 64, 256, kGemvUpTo, s).path, MatmulPath::kGemv) << dtype_name(q);
    EXPECT_EQ(plan_matmul(q, 64, 256, kGemvUpTo + 1, s).path, MatmulPath::kDequantGemm) << dtype_name(q);
  }
  EXPECT_TRUE(plan_matmul(DType::kQ8_0, 64, 256, 0, s).tiles.empty());
  EXPECT_TRUE(plan_matmul(DType::kQ8_0, 0, 256, 5, s).tiles.empty());
}

TEST(CudaMatmulPlan, TilesCoverEverythingOnceAndFitTheScratch) {
  const ScratchLayout s = small_scratch();  // 4 MiB weight tiles, 2 MiB activations
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_K, DType::kFP8_E4M3_B128}) {
    for (int64_t rows : {1, 7, 63, 64, 65, 5000}) {
      for (int64_t cols : {256, 18432}) {  // the second splits weights and activations into tiles
        for (int64_t m : {1, 7, 8, 9, 64, 513}) {
          const MatmulPlan p = plan_matmul(t, rows, cols, m, s);
          expect_exact_cover(p, t, rows, cols, m, s);
        }
      }
    }
  }
  // Big matrices are cut into tiles of whole 64-row groups.
  const MatmulPlan p = plan_matmul(DType::kQ4_0, 102400, 2048, 512, s);
  EXPECT_GT(p.tiles.size(), 1u);
  for (const MatmulTile& t : p.tiles) {
    if (t.row0 + t.rows < 102400) {
      EXPECT_EQ(t.rows % 64, 0);
    }
  }
}

TEST(CudaMatmulPlan, RefusesWhatItCannotDo) {
  const ScratchLayout s = small_scratch();
  for (DType t : {DType::kQ5_1, DType::kQ5_K, DType::kQ2_K, DType::kIQ4_NL}) {
    try {
      plan_matmul(t, 8, 256, 1, s);
      ADD_FAILURE() << dtype_name(t) << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find(std::string(dtype_name(t))), std::string::npos) << e.what();
    }
  }
  // One f16 row larger than the activation scratch.
  try {
    plan_matmul(DType::kF16, 8, int64_t{4} << 20, 16, s);
    ADD_FAILURE() << "a row larger than the scratch was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted) << e.what();
  }
  EXPECT_THROW(plan_matmul(DType::kF32, -1, 8, 1, s), Error);
}

// A batch of sequences with their block tables (blocks handed out in a scrambled order).
struct Batch {
  std::vector<std::vector<int32_t>> tables;
  PagedAttentionBatch b;
};
Batch make_batch(const std::vector<std::pair<int32_t, int32_t>>& seqs /* num_tokens, context_len */, int32_t bs) {
  Batch out;
  out.b.block_size = bs;
  int32_t next = 0;
  for (const auto& [nt, ctx] : seqs) {
    std::vector<int32_t> t;
    for (int32_t i = 0; i < (ctx + bs - 1) / bs; ++i) t.push_back((next++ * 7919) % 10007);
    out.tables.push_back(t);
  }
  int32_t start = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    PagedSequence ps;
    ps.token_start = start;
    ps.num_tokens = seqs[i].first;
    ps.context_len = seqs[i].second;
    ps.block_table = out.tables[i].data();
    ps.num_blocks = static_cast<int32_t>(out.tables[i].size());
    out.b.seqs.push_back(ps);
    start += ps.num_tokens;
  }
  out.b.num_tokens = start;
  return out;
}

TEST(CudaAttentionPlan, TilesCoverEveryTokenAndHeadOnceWithItsKvHead) {
  struct Case {
    int64_t heads, kv_heads, dk, dv;
  };
  // MHA, GQA of 7 and 4, MLA (one kv head, 16 heads, 576-wide keys, 512-wide values).
  for (const Case c : {Case{4, 4, 64, 64}, Case{14, 2, 64, 64}, Case{32, 8, 128, 128}, Case{16, 1, 576, 512}}) {
    // Decode of three sequences, a prefill, a chunk after a cached prefix.
    Batch bt = make_batch({{1, 1}, {1, 37}, {13, 13}, {5, 40}, {1, 16}}, 16);
    Backend::AttentionShape shape;
    shape.num_heads = c.heads;
    shape.num_kv_heads = c.kv_heads;
    shape.head_dim_k = c.dk;
    shape.head_dim_v = c.dv;
    shape.k_stride = c.kv_heads * c.dk;
    shape.v_stride = c.kv_heads * c.dv;
    const AttentionPlan p = plan_attention(bt.b, shape);
    ASSERT_EQ(p.num_seqs, 5);
    std::map<std::pair<int32_t, int32_t>, int> seen;  // (token, head)
    const int64_t group = c.heads / c.kv_heads;
    for (int64_t i = 0; i < p.num_tiles; ++i) {
      const int32_t* t = p.meta.data() + p.tiles_offset + i * 6;
      const int32_t seq = t[0], t0 = t[1], nt = t[2], h0 = t[3], nh = t[4], g = t[5];
      ASSERT_LE(static_cast<int64_t>(nt) * nh, kAttnTileRows);
      const PagedSequence& ps = bt.b.seqs[static_cast<size_t>(seq)];
      ASSERT_GE(t0, ps.token_start);
      ASSERT_LE(t0 + nt, ps.token_start + ps.num_tokens);
      for (int32_t h = h0; h < h0 + nh; ++h) ASSERT_EQ(h / group, g) << "a tile mixes kv heads";
      for (int32_t tok = t0; tok < t0 + nt; ++tok) {
        for (int32_t h = h0; h < h0 + nh; ++h) ++seen[{tok, h}];
      }
    }
    ASSERT_EQ(static_cast<int64_t>(seen.size()), bt.b.num_tokens * c.heads);
    for (const auto& [k, v] : seen) ASSERT_EQ(v, 1);
    // Each sequence's info and its block table as uploaded.
    for (int64_t s = 0; s < p.num_seqs; ++s) {
      const int32_t* info = p.meta.data() + p.seqs_offset + s * 4;
      const PagedSequence& ps = bt.b.seqs[static_cast<size_t>(s)];
      EXPECT_EQ(info[0], ps.token_start);
      EXPECT_EQ(info[1], ps.num_tokens);
      EXPECT_EQ(info[2], ps.context_len);
      for (int32_t j = 0; j < ps.num_blocks; ++j) {
        EXPECT_EQ(p.meta[static_cast<size_t>(p.tables_offset + info[3] + j)], ps.block_table[j]);
      }
    }
    EXPECT_GE(p.key_tile, 1);
    EXPECT_LE(p.smem_bytes, kAttnSmemBytes);
    EXPECT_EQ(p.smem_bytes, static_cast<size_t>(kAttnTileRows * c.dk + p.key_tile * (c.dk + c.dv)) * sizeof(float));
  }
}

TEST(CudaAttentionPlan, RefusesBadBatchesAndShapes) {
  Backend::AttentionShape shape;
  shape.num_heads = 4;
  shape.num_kv_heads = 2;
  shape.head_dim_k = shape.head_dim_v = 64;
  shape.k_stride = shape.v_stride = 128;
  Batch short_table = make_batch({{3, 40}}, 16);
  short_table.b.seqs[0].num_blocks = 2;  // 40 tokens need 3 blocks
  EXPECT_THROW(plan_attention(short_table.b, shape), Error);
  Batch overrun = make_batch({{3, 3}}, 16);
  overrun.b.num_tokens = 2;  // the sequence's tokens run past the batch
  EXPECT_THROW(plan_attention(overrun.b, shape), Error);
  Batch ok = make_batch({{1, 5}}, 16);
  Backend::AttentionShape bad = shape;
  bad.num_kv_heads = 3;
  EXPECT_THROW(plan_attention(ok.b, bad), Error);
  bad = shape;
  bad.head_dim_v = kAttnMaxDv + 32;
  EXPECT_THROW(plan_attention(ok.b, bad), Error);
  bad = shape;
  bad.dtype = KvDtype::kQ8_0;
  bad.k_stride = 100;  // q8_0 rows must be whole blocks
  EXPECT_THROW(plan_attention(ok.b, bad), Error);
  bad.k_stride = 128;
  EXPECT_NO_THROW(plan_attention(ok.b, bad));
}

TEST(CudaMoePlan, ChunksFitTheScratchAndAreAsLargeAsPossible) {
  for (size_t mb : {1, 4, 160}) {
    const size_t bytes = mb << 20;
    for (const auto& [E, k, ff, d] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{64, 6, 1408, 2048},
                                      {256, 8, 2048, 7168}, {4, 2, 64, 96}}) {
      for (int64_t n : {1, 7, 512, 8192}) {
        MoeLayout l;
        try {
          l = plan_moe(n, k, E, ff, d, bytes);
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
          EXPECT_GT(static_cast<size_t>(k * (2 * ff + d)) * 4, bytes) << "refused though a token fits: " << e.what();
          continue;
        }
        EXPECT_GE(l.tokens_per_chunk, 1);
        EXPECT_LE(l.tokens_per_chunk, n);
        EXPECT_LE(l.total, bytes);
        const std::vector<size_t> offs = {l.offsets_off, l.picks_off, l.pos_off, l.gate_off, l.up_off, l.down_off, l.total};
        for (size_t i = 0; i + 1 < offs.size(); ++i) EXPECT_LT(offs[i], offs[i + 1]);
        for (size_t o : offs) EXPECT_EQ(o % 256, 0u);
        // Regions hold their rows: picks x ff floats for gate and up, picks x d for down.
        const auto picks = static_cast<size_t>(l.tokens_per_chunk * k);
        EXPECT_GE(l.up_off - l.gate_off, picks * static_cast<size_t>(ff) * 4);
        EXPECT_GE(l.total - l.down_off, picks * static_cast<size_t>(d) * 4);
        if (l.tokens_per_chunk < n) {  // one more token would not fit
          EXPECT_GT(plan_moe(l.tokens_per_chunk + 1, k, E, ff, d, size_t{1} << 40).total, bytes);
        }
      }
    }
  }
}

TEST(CudaStagingRing, HandsOutAlignedRangesAndSaysWhenItWraps) {
  StagingRing ring(4096, 256);
  const auto a = ring.reserve(100);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_FALSE(a.wrapped);
  const auto b = ring.reserve(300);
  EXPECT_EQ(b.offset, 256u);
  EXPECT_FALSE(b.wrapped);
  const auto c = ring.reserve(3500);  // 768 + 3584 > 4096: starts again at 0
  EXPECT_EQ(c.offset, 0u);
  EXPECT_TRUE(c.wrapped);
  const auto d = ring.reserve(0);
  EXPECT_EQ(d.offset, 3584u);
  EXPECT_FALSE(d.wrapped);
  const auto e = ring.reserve(256);  // exactly to the end
  EXPECT_EQ(e.offset, 3840u);
  EXPECT_FALSE(e.wrapped);
  const auto f = ring.reserve(1);
  EXPECT_EQ(f.offset, 0u);
  EXPECT_TRUE(f.wrapped);
  EXPECT_THROW(ring.reserve(4097), Error);
}

// What a CUDA build says on a machine without a GPU (and what any build says of cuda:N).
TEST(CudaDevices, WithoutAGpuCudaIsRefusedWithTheRuntimesReason) {
  const MachineDevices m = machine_devices();
  EXPECT_EQ(m.backends.at("cuda"), cuda_backend_built());
  const CudaDeviceCount gpus = probe_cuda_devices();
  int listed = 0;
  for (const DeviceInfo& d : m.devices) listed += d.kind == "cuda";
  EXPECT_EQ(listed, gpus.count);
  if (gpus.count > 0) GTEST_SKIP() << "this machine has " << gpus.count << " GPUs (the refusal is for machines without)";
  EXPECT_FALSE(gpus.error.empty());
  DeviceRegistry r;
  try {
    r.check("cuda:0");
    ADD_FAILURE() << "cuda:0 accepted without a GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
    if (cuda_backend_built()) {
      EXPECT_NE(msg.find(gpus.error), std::string::npos) << msg;  // the runtime's own words
      EXPECT_NE(msg.find("cudaGetDeviceCount"), std::string::npos) << msg;
    } else {
      EXPECT_NE(msg.find("no CUDA backend"), std::string::npos) << msg;
    }
    std::printf("refused: %s\n", msg.c_str());
  }
  EXPECT_THROW(make_cuda_device(0), Error);
  EXPECT_TRUE(r.made().empty());
}

#ifdef DUET_HAVE_CUDA
// cuBLAS is loaded, not linked: the library and every function the backend calls are found.
TEST(CudaCublas, LoadsWithEveryFunctionTheBackendCalls) {
  const CublasApi& api = CublasApi::get();
  EXPECT_FALSE(api.library.empty());
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.destroy, nullptr);
  EXPECT_NE(api.set_stream, nullptr);
  EXPECT_NE(api.sgemm, nullptr);
  EXPECT_NE(api.gemm_ex, nullptr);
  ASSERT_NE(api.status_string, nullptr);
  const std::string ok = api.status_string(CUBLAS_STATUS_SUCCESS);
  EXPECT_FALSE(ok.empty());
  EXPECT_NE(ok, api.status_string(CUBLAS_STATUS_NOT_INITIALIZED));
}
#endif

}  // namespace
}  // namespace duet::cuda
