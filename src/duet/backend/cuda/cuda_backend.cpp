// The CUDA backend: each op checks its arguments on the host, plans its launch (plan.h), stages
// its host metadata through the context's ring and queues its kernels (kernels.h) or cuBLAS
// calls on the device's stream. Nothing here waits for the GPU. While a decode step is recorded
// for a graph (context.h's recorder), each op also traces every argument its launches depend on,
// and in a dry run stops before launching.
#include <algorithm>
#include <string>
#include <vector>

#include "duet/backend/cuda/context.h"
#include "duet/backend/cuda/kernels.h"
#include "duet/core/error.h"

namespace duet::cuda {
namespace {

// Op numbers in the recorder's trace (0 is an upload).
enum Op : int {
  kOpMatmul = 1, kOpGetRows, kOpRmsNorm, kOpRope, kOpSiluMul, kOpAdd, kOpStoreKv, kOpAttention, kOpCopyBlocks,
  kOpCopy2d, kOpMoeRoute, kOpMoeExperts
};
using Upload = StepRecorder::Upload;

cudaDataType_t blas_type(DType t) {
  switch (t) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(CudaContext& c) : c_(c) {}

  std::string name() const override { return c_.name; }
  int num_threads() const override { return 1; }

  void matmul(const WeightView& w, const float* x, int64_t m, float* y) override {
    c_.trace(kOpMatmul, w.data, w.type, w.rows, w.cols, x, m, y, c_.rows_alone);
    const MatmulPlan plan = plan_matmul(w.type, w.rows, w.cols, m, c_.scratch, c_.rows_alone);
    if (!c_.launching()) return;
    c_.activate();
    const size_t row_bytes = w.row_bytes();
    const auto* wb = static_cast<const unsigned char*>(w.data);
    unsigned char* tile_w = c_.scratch_base + c_.scratch.weight_tile_offset;
    unsigned char* tile_x = c_.scratch_base + c_.scratch.activation_offset;
    int64_t dequantized_row0 = -1;
    const float one = 1.0f, zero = 0.0f;
    for (const MatmulTile& t : plan.tiles) {
      float* yt = y + t.m0 * w.rows + t.row0;
      const float* xt = x + t.m0 * w.cols;
      switch (plan.path) {
        case MatmulPath::kGemv: {
          GemvArgs a;
          a.w = wb;
          a.rows = w.rows;
          a.cols = w.cols;
          a.row_bytes = row_bytes;
          a.x = xt;
          a.m = t.m;
          a.y = y + t.m0 * w.rows;
          a.y_stride = w.rows;
          DUET_CUDA_CHECK(launch_gemv(w.type, a, c_.stream));
          break;
        }
        case MatmulPath::kCublasF32:
          DUET_CUBLAS_CHECK(*c_.blas, c_.blas->sgemm(c_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(t.rows),
                                                     static_cast<int>(t.m), static_cast<int>(w.cols), &one,
                                                     reinterpret_cast<const float*>(wb + t.row0 * row_bytes),
                                                     static_cast<int>(w.cols), xt, static_cast<int>(w.cols), &zero, yt,
                                                     static_cast<int>(w.rows)));
          break;
        case MatmulPath::kCublasHalf:
        case MatmulPath::kDequantGemm: {
          const bool dequant = plan.path == MatmulPath::kDequantGemm;
          const DType half_type = dequant ? DType::kF16 : w.type;
          const void* a_ptr = wb + t.row0 * row_bytes;
          if (dequant) {
            if (dequantized_row0 != t.row0) {
              DUET_CUDA_CHECK(launch_dequant_rows(w.type, wb, w.cols, row_bytes, nullptr, t.row0, t.rows, tile_w,
                                                  /*out_f16=*/true, c_.stream));
              dequantized_row0 = t.row0;
            }
            a_ptr = tile_w;
          }
          DUET_CUDA_CHECK(launch_convert(xt, t.m * w.cols, half_type, tile_x, c_.stream));
          DUET_CUBLAS_CHECK(*c_.blas,
                            c_.blas->gemm_ex(c_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(t.rows),
                                             static_cast<int>(t.m), static_cast<int>(w.cols), &one, a_ptr,
                                             blas_type(half_type), static_cast<int>(w.cols), tile_x,
                                             blas_type(half_type), static_cast<int>(w.cols), &zero, yt, CUDA_R_32F,
                                             static_cast<int>(w.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          break;
        }
      }
    }
  }

  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* y) override {
    if (!supported_weight_type(w.type)) {
      fail(ErrorCode::kUnsupported, "reading rows of {} tensor '{}' is not supported on CUDA", dtype_name(w.type),
           w.name);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= w.rows) {
        fail(ErrorCode::kInvalidArgument, "token id {} is out of range [0, {}) of '{}'", ids[i], w.rows, w.name);
      }
    }
    c_.trace(kOpGetRows, w.data, w.type, w.rows, w.cols, n, y);
    if (n <= 0) return;
    const int32_t* dev_ids = c_.upload(Upload::kIds, ids, static_cast<size_t>(n));
    if (!c_.launching()) return;
    c_.activate();
    DUET_CUDA_CHECK(launch_dequant_rows(w.type, w.data, w.cols, w.row_bytes(), dev_ids, 0, n, y, false, c_.stream));
  }

  void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t dim, float eps) override {
    c_.trace(kOpRmsNorm, x, weight, y, rows, dim, eps);
    if (!c_.launching()) return;
    c_.activate();
    DUET_CUDA_CHECK(launch_rms_norm(x, weight, y, rows, dim, eps, c_.stream));
  }

  void rope(float* x, int64_t rows, int64_t num_heads, int64_t head_dim, const int32_t* positions,
            const RopeParams& p) override {
    if (p.dim % 2 != 0 || p.offset < 0 || p.dim + p.offset > head_dim) {
      fail(ErrorCode::kInvalidArgument, "rope of {} dimensions at offset {} in heads of {}", p.dim, p.offset, head_dim);
    }
    c_.trace(kOpRope, x, rows, num_heads, head_dim, p.dim, p.offset, p.mode, p.attn_factor);
    if (rows <= 0 || p.dim == 0) return;
    const std::vector<double> freq = rope_frequencies(p);
    const double* dev_freq = c_.upload(Upload::kFreq, freq.data(), freq.size());
    const int32_t* dev_pos = c_.upload(Upload::kPositions, positions, static_cast<size_t>(rows));
    if (!c_.launching()) return;
    c_.activate();
    DUET_CUDA_CHECK(launch_rope(x, rows, num_heads, head_dim, dev_pos, dev_freq, p.dim / 2, p.offset,
                                p.mode == RopeMode::kNeox, p.attn_factor, c_.stream));
  }

  void silu_mul(const float* gate, const float* up, float* y, int64_t n) override {
    c_.trace(kOpSiluMul, gate, up, y, n);
    if (!c_.launching()) return;
    c_.activate();
    DUET_CUDA_CHECK(launch_silu_mul(gate, up, y, n, c_.stream));
  }

  void add(float* y, const float* x, int64_t n) override {
    c_.trace(kOpAdd, y, x, n);
    if (!c_.launching()) return;
    c_.activate();
    DUET_CUDA_CHECK(launch_add(y, x, n, c_.stream));
  }

  bool has_kv_dtype(KvDtype dtype) const override { return dtype != KvDtype::kFp8; }

  void store_kv(const float* rows, const int64_t* slots, int64_t n, int64_t row_dim, void* cache,
                KvDtype dtype) override {
    (void)kv_row_bytes(dtype, row_dim);  // refuses a q8_0 row that is not whole blocks
    if (!has_kv_dtype(dtype)) fail(ErrorCode::kUnsupported, "the CUDA backend has no {} KV cache", kv_dtype_name(dtype));
    c_.trace(kOpStoreKv, rows, n, row_dim, cache, dtype);
    if (n <= 0) return;
    const int64_t* dev_slots = c_.upload(Upload::kSlots, slots, static_cast<size_t>(n));
    if (!c_.launching()) return;
    c_.activate();
    DUET_CUDA_CHECK(launch_store_kv(rows, dev_slots, n, row_dim, cache, static_cast<int>(dtype), c_.stream));
  }

  void paged_attention(const float* q, const void* k_cache, const void* v_cache, float* out,
                       const PagedAttentionBatch& batch, const AttentionShape& shape, float scale) override {
    const AttentionPlan plan = plan_attention(batch, shape, c_.recorder != nullptr);
    c_.trace(kOpAttention, q, k_cache, v_cache, out, plan.num_tiles, plan.num_seqs, plan.meta.size(), plan.seqs_offset,
             plan.tables_offset, plan.key_tile, plan.smem_bytes, batch.block_size, shape.num_heads, shape.head_dim_k,
             shape.head_dim_v, shape.k_stride, shape.v_stride, shape.dtype, scale);
    if (plan.num_tiles == 0) return;
    AttentionArgs a;
    a.q = q;
    a.k = k_cache;
    a.v = v_cache;
    a.out = out;
    a.meta = c_.upload(Upload::kAttention, plan.meta.data(), plan.meta.size());
    if (!c_.launching()) return;
    c_.activate();
    a.tiles_offset = plan.tiles_offset;
    a.seqs_offset = plan.seqs_offset;
    a.tables_offset = plan.tables_offset;
    a.num_tiles = plan.num_tiles;
    a.block_size = batch.block_size;
    a.num_heads = shape.num_heads;
    a.dk = shape.head_dim_k;
    a.dv = shape.head_dim_v;
    a.k_stride = shape.k_stride;
    a.v_stride = shape.v_stride;
    a.kv_code = static_cast<int>(shape.dtype);
    a.scale = scale;
    a.key_tile = plan.key_tile;
    a.smem_bytes = plan.smem_bytes;
    DUET_CUDA_CHECK(launch_attention(a, c_.stream));
  }

  void copy_blocks(void* cache, const std::vector<std::pair<int32_t, int32_t>>& copies,
                   int64_t block_bytes) override {
    c_.trace(kOpCopyBlocks, cache, block_bytes, copies.size());
    for (const auto& [src, dst] : copies) c_.trace(kOpCopyBlocks, src, dst);
    if (copies.empty() || !c_.launching()) return;
    c_.activate();
    auto* base = static_cast<unsigned char*>(cache);
    for (const auto& [src, dst] : copies) {
      DUET_CUDA_CHECK(cudaMemcpyAsync(base + static_cast<int64_t>(dst) * block_bytes,
                                      base + static_cast<int64_t>(src) * block_bytes, static_cast<size_t>(block_bytes),
                                      cudaMemcpyDeviceToDevice, c_.stream));
    }
  }

  void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols) override {
    c_.trace(kOpCopy2d, src, src_stride, dst, dst_stride, rows, cols);
    if (rows <= 0 || cols <= 0 || !c_.launching()) return;
    c_.activate();
    DUET_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * sizeof(float), src,
                                      static_cast<size_t>(src_stride) * sizeof(float),
                                      static_cast<size_t>(cols) * sizeof(float), static_cast<size_t>(rows),
                                      cudaMemcpyDeviceToDevice, c_.stream));
  }

  void moe_route(const float* logits, int64_t n, const MoeRouting& r, int32_t* ids, float* weights) override {
    const int64_t E = r.num_experts, k = r.num_used, G = std::max<int64_t>(1, r.num_groups);
    if (E <= 0 || k <= 0 || k > E || E % G != 0 || r.num_groups_used < 1 || r.num_groups_used > G) {
      fail(ErrorCode::kInvalidArgument,
           "MoE routing of {} experts, {} used, {} groups of which {} used is inconsistent", E, k, G,
           r.num_groups_used);
    }
    if (E > kMoeMaxExperts || k > kMoeMaxUsed) {
      fail(ErrorCode::kUnsupported, "CUDA MoE routing takes up to {} experts of which {} used, not {} of {}",
           kMoeMaxExperts, kMoeMaxUsed, E, k);
    }
    c_.trace(kOpMoeRoute, logits, n, E, k, G, r.num_groups_used, r.gating, r.norm_topk, r.routed_scaling, r.bias, ids,
             weights);
    if (n <= 0 || !c_.launching()) return;
    c_.activate();
    MoeRouteArgs a;
    a.num_experts = E;
    a.num_used = k;
    a.num_groups = G;
    a.num_groups_used = r.num_groups_used;
    a.softmax = r.gating == MoeRouting::Gating::kSoftmax;
    a.norm_topk = r.norm_topk;
    a.routed_scaling = r.routed_scaling;
    a.bias = r.bias;
    DUET_CUDA_CHECK(launch_moe_route(logits, n, a, ids, weights, c_.stream));
  }

  void moe_experts(const MoeExperts& w, const float* x, const int32_t* ids, const float* weights, int64_t n, int64_t k,
                   float* out) override {
    const int64_t d = w.gate.cols, ff = w.ff, E = w.num_experts;
    for (const WeightView* v : {&w.gate, &w.up, &w.down}) {
      if (!supported_weight_type(v->type)) {
        fail(ErrorCode::kUnsupported, "experts of {} weights ('{}') are not supported on CUDA", dtype_name(v->type),
             v->name);
      }
    }
    if (w.gate.rows != E * ff || w.up.rows != E * ff || w.up.cols != d || w.down.rows != E * d || w.down.cols != ff) {
      fail(ErrorCode::kInvalidArgument, "experts '{}': {} experts of ff {} and hidden {} do not match their matrices",
           w.gate.name, E, ff, d);
    }
    if (E > kMoeMaxExperts || k > kMoeMaxUsed) {
      fail(ErrorCode::kUnsupported, "CUDA MoE takes up to {} experts of which {} used, not {} of {}", kMoeMaxExperts,
           kMoeMaxUsed, E, k);
    }
    c_.trace(kOpMoeExperts, w.gate.data, w.gate.type, w.up.data, w.up.type, w.down.data, w.down.type, d, ff, E, x, ids,
             weights, n, k, out);
    if (n <= 0) return;
    const MoeLayout L = plan_moe(n, k, E, ff, d, c_.scratch.moe_bytes);
    if (!c_.launching()) return;
    c_.activate();
    unsigned char* base = c_.scratch_base + c_.scratch.moe_offset;
    auto* offsets = reinterpret_cast<int32_t*>(base + L.offsets_off);
    auto* token_of = reinterpret_cast<int32_t*>(base + L.picks_off);
    auto* pos_of = reinterpret_cast<int32_t*>(base + L.pos_off);
    auto* gate = reinterpret_cast<float*>(base + L.gate_off);
    auto* up = reinterpret_cast<float*>(base + L.up_off);
    auto* down = reinterpret_cast<float*>(base + L.down_off);
    for (int64_t t0 = 0; t0 < n; t0 += L.tokens_per_chunk) {
      const int64_t nc = std::min(L.tokens_per_chunk, n - t0);
      DUET_CUDA_CHECK(launch_moe_sort(ids + t0 * k, nc, k, E, offsets, token_of, pos_of, c_.stream));
      GemvArgs a;
      a.rows = ff;
      a.cols = d;
      a.x = x + t0 * d;
      a.x_index = token_of;
      a.offsets = offsets;
      a.num_groups = E;
      a.y_stride = ff;
      a.w = w.gate.data;
      a.row_bytes = w.gate.row_bytes();
      a.expert_bytes = static_cast<size_t>(ff) * a.row_bytes;
      a.y = gate;
      DUET_CUDA_CHECK(launch_gemv(w.gate.type, a, c_.stream));
      a.w = w.up.data;
      a.row_bytes = w.up.row_bytes();
      a.expert_bytes = static_cast<size_t>(ff) * a.row_bytes;
      a.y = up;
      DUET_CUDA_CHECK(launch_gemv(w.up.type, a, c_.stream));
      // Rows past the picks are never read.
      DUET_CUDA_CHECK(launch_silu_mul(gate, up, gate, nc * k * ff, c_.stream));
      GemvArgs b;
      b.w = w.down.data;
      b.rows = d;
      b.cols = ff;
      b.row_bytes = w.down.row_bytes();
      b.expert_bytes = static_cast<size_t>(d) * b.row_bytes;
      b.x = gate;
      b.offsets = offsets;
      b.num_groups = E;
      b.y = down;
      b.y_stride = d;
      DUET_CUDA_CHECK(launch_gemv(w.down.type, b, c_.stream));
      DUET_CUDA_CHECK(launch_moe_combine(down, ids + t0 * k, weights + t0 * k, pos_of, nc, k, d, out + t0 * d,
                                         c_.stream));
    }
  }

 private:
  CudaContext& c_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(CudaContext& context) { return std::make_unique<CudaBackend>(context); }

}  // namespace duet::cuda
