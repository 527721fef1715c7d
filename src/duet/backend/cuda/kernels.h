// The CUDA kernels' launchers: device pointers and sizes in, the stream always an argument, no
// allocation, no synchronisation. Each returns the launch's error (cudaGetLastError) for the
// caller's DUET_CUDA_CHECK. Launch shapes come from plan.h or are computed beside the kernel.
// Weight rows use GGUF's block layouts (core/quant.h), read in place.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "duet/core/dtype.h"

namespace duet::cuda {

// Cache element types, as KvDtype numbers them.
enum KvCode : int { kKvF32 = 0, kKvF16 = 1, kKvQ8_0 = 2 };

// elementwise.cu -------------------------------------------------------------------------------
// out row i = weight row (ids != null ? ids[i] : row0 + i), as f32 (out_f16 false) or f16.
cudaError_t launch_dequant_rows(DType type, const void* w, int64_t cols, size_t row_bytes, const int32_t* ids,
                                int64_t row0, int64_t n, void* out, bool out_f16, cudaStream_t s);
// out[i] = x[i] as f16 (to == kF16) or bf16 (kBF16).
cudaError_t launch_convert(const float* x, int64_t n, DType to, void* out, cudaStream_t s);
cudaError_t launch_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                            cudaStream_t s);
// freq: [half] angles per position (rope_frequencies), positions: [rows].
cudaError_t launch_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int32_t* positions,
                        const double* freq, int64_t half, int64_t offset, bool neox, double attn_factor,
                        cudaStream_t s);
cudaError_t launch_silu_mul(const float* gate, const float* up, float* y, int64_t n, cudaStream_t s);
cudaError_t launch_add(float* y, const float* x, int64_t n, cudaStream_t s);
// rows[i] (row_dim floats) to cache row slots[i], as f32, f16 or Q8_0 blocks (row_dim % 32 == 0); a
// negative slot (a graph's padding row) is skipped.
cudaError_t launch_store_kv(const float* rows, const int64_t* slots, int64_t n, int64_t row_dim, void* cache,
                            int kv_code, cudaStream_t s);

// MoE routing (as moe_route_ref): one thread per token.
struct MoeRouteArgs {
  int64_t num_experts = 0, num_used = 0, num_groups = 1, num_groups_used = 1;
  bool softmax = true, norm_topk = false;
  double routed_scaling = 1.0;
  const float* bias = nullptr;  // device, [num_experts] or null
};
cudaError_t launch_moe_route(const float* logits, int64_t n, const MoeRouteArgs& r, int32_t* ids, float* weights,
                             cudaStream_t s);
// The picks of n tokens x k (ids [n * k], negative: not here) grouped by expert, stably:
// offsets [E + 1]; per grouped item p: pick_of[p] (the flat pick t * k + i) and token_of[p] (t);
// pos_of[t * k + i] = its item, or -1.
cudaError_t launch_moe_sort(const int32_t* ids, int64_t n, int64_t k, int64_t num_experts, int32_t* offsets,
                            int32_t* token_of, int32_t* pos_of, cudaStream_t s);
// out[t] = sum over t's picks in increasing expert id of weights[t, i] * rows[pos_of[t * k + i]].
cudaError_t launch_moe_combine(const float* rows, const int32_t* ids, const float* weights, const int32_t* pos_of,
                               int64_t n, int64_t k, int64_t d, float* out, cudaStream_t s);

// gemv.cu ---------------------------------------------------------------------------------------
// y[item, r] = W_g row r . x[row of item] for the items of each group g (an expert: its weights
// start expert_bytes after the previous one's). One group of m items when offsets is null.
struct GemvArgs {
  const void* w = nullptr;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0, expert_bytes = 0;
  const float* x = nullptr;
  const int32_t* x_index = nullptr;  // item i reads x row x_index[i], or row i when null
  const int32_t* offsets = nullptr;  // device [num_groups + 1], or null
  int64_t num_groups = 1;
  int64_t m = 0;                     // items, when offsets is null
  float* y = nullptr;                // item i's row: y + i * y_stride
  int64_t y_stride = 0;
};
cudaError_t launch_gemv(DType type, const GemvArgs& a, cudaStream_t s);

// attention.cu ----------------------------------------------------------------------------------
// Paged attention over the tiles of an AttentionPlan (plan.h), whose meta is uploaded at `meta`.
struct AttentionArgs {
  const float* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  float* out = nullptr;
  const int32_t* meta = nullptr;
  int64_t tiles_offset = 0, seqs_offset = 0, tables_offset = 0, num_tiles = 0;
  int32_t block_size = 16;
  int64_t num_heads = 0, dk = 0, dv = 0, k_stride = 0, v_stride = 0;
  int kv_code = kKvF32;
  float scale = 1.0f;
  int64_t key_tile = 1;
  size_t smem_bytes = 0;
};
cudaError_t launch_attention(const AttentionArgs& a, cudaStream_t s);

}  // namespace duet::cuda
