// Paged attention, decode and prefill in one kernel: a block per tile of up to kAttnTileRows
// (token, head) rows of one sequence that share a kv head (plan_attention). The block stages the
// tile's queries and then tiles of keys and values (converted to f32) in shared memory; each warp
// keeps an online softmax (running max, sum and weighted values, FlashAttention's recurrence) for
// its rows, so every key and value read serves the whole tile, and chunks after a cached prefix
// are just rows whose keys start before their tokens.
#include <cuda_fp16.h>

#include <cfloat>

#include "duet/backend/cuda/dequant.cuh"
#include "duet/backend/cuda/kernels.h"
#include "duet/backend/cuda/shapes.h"

namespace duet::cuda {
namespace {

constexpr int kRowsPerWarp = static_cast<int>((kAttnTileRows + kAttnWarps - 1) / kAttnWarps);
constexpr int kDvPerLane = static_cast<int>(kAttnMaxDv / kWarp);

// Element `i` of a cache, counted in elements from its start.
template <int KV>
__device__ __forceinline__ float cache_elem(const void* cache, int64_t i) {
  if constexpr (KV == kKvF32) {
    return static_cast<const float*>(cache)[i];
  } else if constexpr (KV == kKvF16) {
    return half_bits(static_cast<const uint16_t*>(cache)[i]);
  } else {
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(cache) + i / 32;
    return static_cast<float>(b->qs[i % 32]) * half_bits(b->d);
  }
}

template <int KV>
__global__ void attention_kernel(AttentionArgs a) {
  extern __shared__ float smem[];
  const int32_t* tile = a.meta + a.tiles_offset + static_cast<int64_t>(blockIdx.x) * 6;
  const int32_t seq = tile[0], t0 = tile[1], nt = tile[2], h0 = tile[3], nh = tile[4], g = tile[5];
  const int32_t* info = a.meta + a.seqs_offset + static_cast<int64_t>(seq) * 4;
  const int32_t token_start = info[0], num_tokens = info[1], context = info[2];
  const int32_t* table = a.meta + a.tables_offset + info[3];
  const int rows = nt * nh;
  const int64_t dk = a.dk, dv = a.dv, H = a.num_heads, bs = a.block_size;
  float* qs = smem;
  float* ks = qs + kAttnTileRows * dk;
  float* vs = ks + a.key_tile * dk;
  for (int64_t i = threadIdx.x; i < rows * dk; i += blockDim.x) {
    const int64_t r = i / dk, e = i % dk;
    qs[i] = a.q[((t0 + r / nh) * H + h0 + r % nh) * dk + e];
  }
  // Row r (token t0 + r / nh) sees keys [0, first_len + r / nh).
  const int64_t first_len = context - num_tokens + (t0 - token_start) + 1;
  const int64_t max_len = first_len + nt - 1;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDvPerLane];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -FLT_MAX;
    l[i] = 0.0f;
#pragma unroll
    for (int e = 0; e < kDvPerLane; ++e) acc[i][e] = 0.0f;
  }
  for (int64_t j0 = 0; j0 < max_len; j0 += a.key_tile) {
    const int64_t nk = min64(a.key_tile, max_len - j0);
    __syncthreads();  // the queries are in place; the previous keys are consumed
    for (int64_t i = threadIdx.x; i < nk * dk; i += blockDim.x) {
      const int64_t p = j0 + i / dk;
      const int64_t slot = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
      ks[i] = cache_elem<KV>(a.k, slot * a.k_stride + g * dk + i % dk);
    }
    for (int64_t i = threadIdx.x; i < nk * dv; i += blockDim.x) {
      const int64_t p = j0 + i / dv;
      const int64_t slot = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
      vs[i] = cache_elem<KV>(a.v, slot * a.v_stride + g * dv + i % dv);
    }
    __syncthreads();
#pragma unroll
    for (int ri = 0; ri < kRowsPerWarp; ++ri) {
      const int r = warp + ri * kAttnWarps;
      if (r >= rows) continue;
      const int64_t len = first_len + r / nh;
      for (int64_t kk = 0; kk < nk && j0 + kk < len; ++kk) {
        float dot = 0.0f;
        for (int64_t e = lane; e < dk; e += kWarp) dot += qs[r * dk + e] * ks[kk * dk + e];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        const float s = dot * a.scale;
        const float m_new = fmaxf(m[ri], s);
        const float correction = expf(m[ri] - m_new);
        const float p = expf(s - m_new);
        l[ri] = l[ri] * correction + p;
#pragma unroll
        for (int e = 0; e < kDvPerLane; ++e) {
          const int64_t c = lane + e * kWarp;
          if (c < dv) acc[ri][e] = acc[ri][e] * correction + p * vs[kk * dv + c];
        }
        m[ri] = m_new;
      }
    }
  }
#pragma unroll
  for (int ri = 0; ri < kRowsPerWarp; ++ri) {
    const int r = warp + ri * kAttnWarps;
    if (r >= rows) continue;
    float* o = a.out + ((t0 + r / nh) * H + h0 + r % nh) * dv;
#pragma unroll
    for (int e = 0; e < kDvPerLane; ++e) {
      const int64_t c = lane + e * kWarp;
      if (c < dv) o[c] = l[ri] > 0.0f ? acc[ri][e] / l[ri] : 0.0f;  // no key: a graph's padding row
    }
  }
}

}  // namespace

cudaError_t launch_attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.num_tiles <= 0) return cudaSuccess;
  const auto grid = static_cast<unsigned>(a.num_tiles);
  switch (a.kv_code) {
    case kKvF32: attention_kernel<kKvF32><<<grid, kAttnWarps * kWarp, a.smem_bytes, s>>>(a); break;
    case kKvF16: attention_kernel<kKvF16><<<grid, kAttnWarps * kWarp, a.smem_bytes, s>>>(a); break;
    case kKvQ8_0: attention_kernel<kKvQ8_0><<<grid, kAttnWarps * kWarp, a.smem_bytes, s>>>(a); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace duet::cuda
