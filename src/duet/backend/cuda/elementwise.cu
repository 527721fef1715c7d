// Row and elementwise kernels: weight rows read (get_rows and the f16 weight tiles), rms_norm,
// rope, silu_mul, add, conversions, store_kv, and the MoE routing, grouping and combining.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>

#include "duet/backend/cuda/dequant.cuh"
#include "duet/backend/cuda/kernels.h"

namespace duet::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n, int threads = kThreads) { return static_cast<unsigned>((n + threads - 1) / threads); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One thread per 32-element chunk of each row.
template <DType T, typename Out>
__global__ void dequant_rows_kernel(const uint8_t* w, int64_t cols, size_t row_bytes, const int32_t* ids, int64_t row0,
                                    int64_t n, Out* out) {
  const int64_t chunks = (cols + 31) / 32;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * chunks) return;
  const int64_t r = i / chunks, c = i % chunks;
  const int64_t src = ids != nullptr ? ids[r] : row0 + r;
  const int valid = static_cast<int>(min64(32, cols - c * 32));
  float v[32];
  dequant32<T>(w + static_cast<size_t>(src) * row_bytes, c, valid, v);
  Out* o = out + r * cols + c * 32;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    if (j < valid) {
      if constexpr (sizeof(Out) == 2) {
        o[j] = __float2half_rn(v[j]);
      } else {
        o[j] = v[j];
      }
    }
  }
}

__global__ void convert_f16_kernel(const float* x, int64_t n, __half* y) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2half_rn(x[i]);
}
__global__ void convert_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* y) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

// One block per row: the sum of squares, then the scaled row.
__global__ void rms_norm_kernel(const float* x, const float* w, float* y, int64_t dim, float eps) {
  __shared__ float partial[kThreads / 32];
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i] * xr[i];
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = s;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) total += partial[i];
  const float scale = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

// One thread per (row, head, pair); the angle in double, as the CPU computes it.
__global__ void rope_kernel(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int32_t* positions,
                            const double* freq, int64_t half, int64_t offset, bool neox, double attn_factor) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * heads * half) return;
  const int64_t pair = i % half, rh = i / half, r = rh / heads;
  const double theta = static_cast<double>(positions[r]) * freq[pair];
  const float c = static_cast<float>(cos(theta) * attn_factor);
  const float s = static_cast<float>(sin(theta) * attn_factor);
  float* v = x + rh * head_dim + offset;
  const int64_t a = neox ? pair : 2 * pair;
  const int64_t b = neox ? pair + half : 2 * pair + 1;
  const float x0 = v[a], x1 = v[b];
  v[a] = x0 * c - x1 * s;
  v[b] = x0 * s + x1 * c;
}

__global__ void silu_mul_kernel(const float* g, const float* u, float* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    const float a = g[i];
    y[i] = a / (1.0f + expf(-a)) * u[i];
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void store_f32_kernel(const float* rows, const int64_t* slots, int64_t n, int64_t dim, float* cache) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * dim || slots[i / dim] < 0) return;  // slot -1: a graph's padding row
  cache[slots[i / dim] * dim + i % dim] = rows[i];
}
__global__ void store_f16_kernel(const float* rows, const int64_t* slots, int64_t n, int64_t dim, __half* cache) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * dim || slots[i / dim] < 0) return;
  cache[slots[i / dim] * dim + i % dim] = __float2half_rn(rows[i]);
}
// One warp per Q8_0 block, as quantize_row_q8_0_ref: d = amax / 127, q = round(x / d).
__global__ void store_q8_0_kernel(const float* rows, const int64_t* slots, int64_t n, int64_t dim, BlockQ8_0* cache) {
  const int64_t nb = dim / 32;
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= n * nb || slots[warp / nb] < 0) return;  // the whole warp leaves together
  const int64_t i = warp / nb, b = warp % nb;
  const float x = rows[i * dim + b * 32 + lane];
  const float amax = warp_max(fabsf(x));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  BlockQ8_0* out = cache + slots[i] * nb + b;
  out->qs[lane] = static_cast<int8_t>(roundf(x * id));
  if (lane == 0) out->d = __half_as_ushort(__float2half_rn(d));
}

// moe_route_ref for one token per thread (scores in double, ties to the lower id).
__global__ void moe_route_kernel(const float* logits, int64_t n, MoeRouteArgs r, int32_t* ids, float* weights) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n) return;
  const int64_t E = r.num_experts, k = r.num_used, G = r.num_groups > 1 ? r.num_groups : 1, per = E / G;
  double score[256], pick[256];
  const float* lg = logits + t * E;
  if (r.softmax) {
    float mx = -FLT_MAX;
    for (int64_t e = 0; e < E; ++e) mx = fmaxf(mx, lg[e]);
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += (score[e] = exp(static_cast<double>(lg[e] - mx)));
    for (int64_t e = 0; e < E; ++e) score[e] /= sum;
  } else {
    for (int64_t e = 0; e < E; ++e) score[e] = 1.0 / (1.0 + exp(-static_cast<double>(lg[e])));
  }
  for (int64_t e = 0; e < E; ++e) pick[e] = score[e] + (r.bias != nullptr ? static_cast<double>(r.bias[e]) : 0.0);
  if (G > 1) {
    double gs[256];
    bool keep[256];
    for (int64_t g = 0; g < G; ++g) {
      const double* s = pick + g * per;
      double a = -INFINITY, b = -INFINITY;
      for (int64_t i = 0; i < per; ++i) {
        if (s[i] > a) {
          b = a;
          a = s[i];
        } else if (s[i] > b) {
          b = s[i];
        }
      }
      gs[g] = r.softmax ? a : a + (per > 1 ? b : 0.0);
      keep[g] = false;
    }
    // The num_groups_used best groups, ties to the lower index (a stable sort's first ones).
    for (int64_t u = 0; u < r.num_groups_used; ++u) {
      int64_t best = -1;
      for (int64_t g = 0; g < G; ++g) {
        if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
      }
      keep[best] = true;
    }
    for (int64_t e = 0; e < E; ++e) {
      if (!keep[e / per]) pick[e] = -INFINITY;
    }
  }
  int32_t chosen[16];
  double total = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < i; ++j) taken = taken || chosen[j] == e;
      if (!taken && (best < 0 || pick[e] > pick[best])) best = e;
    }
    chosen[i] = static_cast<int32_t>(best);
    total += score[best];
  }
  for (int64_t i = 0; i < k; ++i) {
    double w = score[chosen[i]];
    if (k > 1 && r.norm_topk) {
      w /= total + 1e-20;
      if (!r.softmax) w *= r.routed_scaling;
    } else {
      w *= r.routed_scaling;
    }
    ids[t * k + i] = chosen[i];
    weights[t * k + i] = static_cast<float>(w);
  }
}

// One block: thread e collects expert e's picks in pick order (so the grouping is the same on
// every run), after thread 0 has laid out the offsets.
__global__ void moe_sort_kernel(const int32_t* ids, int64_t n, int64_t k, int64_t E, int32_t* offsets,
                                int32_t* token_of, int32_t* pos_of) {
  __shared__ int32_t count[257];
  const int64_t picks = n * k;
  for (int64_t e = threadIdx.x; e <= E; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < picks; i += blockDim.x) {
    const int32_t e = ids[i];
    if (e >= 0 && e < E) atomicAdd(&count[e + 1], 1);
    pos_of[i] = -1;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];
    for (int64_t e = 0; e <= E; ++e) offsets[e] = count[e];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t at = count[e];
    for (int64_t i = 0; i < picks; ++i) {
      if (ids[i] == e) {
        token_of[at] = static_cast<int32_t>(i / k);
        pos_of[i] = at;
        ++at;
      }
    }
  }
}

// One block per token, threads over the hidden dimension; picks summed in increasing expert id.
__global__ void moe_combine_kernel(const float* rows, const int32_t* ids, const float* weights, const int32_t* pos_of,
                                   int64_t k, int64_t d, float* out) {
  const int64_t t = blockIdx.x;
  int32_t order[16];
  int64_t used = 0;
  for (int64_t i = 0; i < k; ++i) {
    if (pos_of[t * k + i] < 0) continue;
    int64_t j = used++;
    while (j > 0 && ids[t * k + order[j - 1]] > ids[t * k + i]) {
      order[j] = order[j - 1];
      --j;
    }
    order[j] = static_cast<int32_t>(i);
  }
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float sum = 0.0f;
    for (int64_t j = 0; j < used; ++j) {
      const int64_t i = order[j];
      sum += weights[t * k + i] * rows[static_cast<int64_t>(pos_of[t * k + i]) * d + c];
    }
    out[t * d + c] = sum;
  }
}

}  // namespace

cudaError_t launch_dequant_rows(DType type, const void* w, int64_t cols, size_t row_bytes, const int32_t* ids,
                                int64_t row0, int64_t n, void* out, bool out_f16, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const int64_t work = n * ((cols + 31) / 32);
  const bool known = dispatch_weight_type(type, [&]<DType T>() {
    const auto* wp = static_cast<const uint8_t*>(w);
    if (out_f16) {
      dequant_rows_kernel<T, __half><<<blocks_for(work), kThreads, 0, s>>>(wp, cols, row_bytes, ids, row0, n,
                                                                          static_cast<__half*>(out));
    } else {
      dequant_rows_kernel<T, float><<<blocks_for(work), kThreads, 0, s>>>(wp, cols, row_bytes, ids, row0, n,
                                                                         static_cast<float*>(out));
    }
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t launch_convert(const float* x, int64_t n, DType to, void* out, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (to == DType::kF16) {
    convert_f16_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, static_cast<__half*>(out));
  } else if (to == DType::kBF16) {
    convert_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, static_cast<__nv_bfloat16*>(out));
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                            cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, w, y, dim, eps);
  return cudaGetLastError();
}

cudaError_t launch_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int32_t* positions,
                        const double* freq, int64_t half, int64_t offset, bool neox, double attn_factor,
                        cudaStream_t s) {
  const int64_t n = rows * heads * half;
  if (n <= 0) return cudaSuccess;
  rope_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, rows, heads, head_dim, positions, freq, half, offset, neox,
                                                 attn_factor);
  return cudaGetLastError();
}

cudaError_t launch_silu_mul(const float* gate, const float* up, float* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, s>>>(gate, up, y, n);
  return cudaGetLastError();
}

cudaError_t launch_add(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, x, n);
  return cudaGetLastError();
}

cudaError_t launch_store_kv(const float* rows, const int64_t* slots, int64_t n, int64_t row_dim, void* cache,
                            int kv_code, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  switch (kv_code) {
    case kKvF32:
      store_f32_kernel<<<blocks_for(n * row_dim), kThreads, 0, s>>>(rows, slots, n, row_dim, static_cast<float*>(cache));
      break;
    case kKvF16:
      store_f16_kernel<<<blocks_for(n * row_dim), kThreads, 0, s>>>(rows, slots, n, row_dim, static_cast<__half*>(cache));
      break;
    case kKvQ8_0:
      store_q8_0_kernel<<<blocks_for(n * row_dim), kThreads, 0, s>>>(rows, slots, n, row_dim,
                                                                     static_cast<BlockQ8_0*>(cache));
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_moe_route(const float* logits, int64_t n, const MoeRouteArgs& r, int32_t* ids, float* weights,
                             cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  moe_route_kernel<<<blocks_for(n, 64), 64, 0, s>>>(logits, n, r, ids, weights);
  return cudaGetLastError();
}

cudaError_t launch_moe_sort(const int32_t* ids, int64_t n, int64_t k, int64_t num_experts, int32_t* offsets,
                            int32_t* token_of, int32_t* pos_of, cudaStream_t s) {
  moe_sort_kernel<<<1, 256, 0, s>>>(ids, n, k, num_experts, offsets, token_of, pos_of);
  return cudaGetLastError();
}

cudaError_t launch_moe_combine(const float* rows, const int32_t* ids, const float* weights, const int32_t* pos_of,
                               int64_t n, int64_t k, int64_t d, float* out, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  moe_combine_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(rows, ids, weights, pos_of, k, d, out);
  return cudaGetLastError();
}

}  // namespace duet::cuda
