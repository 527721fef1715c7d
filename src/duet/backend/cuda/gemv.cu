// The quantized GEMV (decode matmuls, and each expert's rows of a MoE layer in one grouped
// launch): one warp per output row; lane l dequantizes chunks l, l + 32, ... of the weight row
// once and multiplies them with up to kGemvMaxRows activation rows, then the warp sums.
#include "duet/backend/cuda/dequant.cuh"
#include "duet/backend/cuda/kernels.h"
#include "duet/backend/cuda/shapes.h"

namespace duet::cuda {
namespace {

template <DType T>
__global__ void gemv_kernel(GemvArgs a) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kGemvWarps) + warp;
  const int64_t g = blockIdx.y;
  if (r >= a.rows) return;
  const int64_t begin = a.offsets != nullptr ? a.offsets[g] : 0;
  const int64_t end = a.offsets != nullptr ? a.offsets[g + 1] : a.m;
  const uint8_t* row = static_cast<const uint8_t*>(a.w) + g * a.expert_bytes + static_cast<size_t>(r) * a.row_bytes;
  const int64_t chunks = (a.cols + 31) / 32;
  for (int64_t i0 = begin; i0 < end; i0 += kGemvMaxRows) {
    const int64_t count = min64(kGemvMaxRows, end - i0);
    const float* xs[kGemvMaxRows];
#pragma unroll
    for (int j = 0; j < kGemvMaxRows; ++j) {
      const int64_t item = i0 + (j < count ? j : 0);
      const int64_t xr = a.x_index != nullptr ? a.x_index[item] : item;
      xs[j] = a.x + xr * a.cols;
    }
    float acc[kGemvMaxRows] = {};
    for (int64_t c = lane; c < chunks; c += kWarp) {
      const int valid = static_cast<int>(min64(32, a.cols - c * 32));
      float w[32];
      dequant32<T>(row, c, valid, w);
#pragma unroll
      for (int j = 0; j < kGemvMaxRows; ++j) {
        if (j < count) {
          const float* x = xs[j] + c * 32;
          float s = 0.0f;
#pragma unroll
          for (int e = 0; e < 32; ++e) s += e < valid ? w[e] * x[e] : 0.0f;
          acc[j] += s;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kGemvMaxRows; ++j) {
      float v = acc[j];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0 && j < count) a.y[(i0 + j) * a.y_stride + r] = v;
    }
  }
}

}  // namespace

cudaError_t launch_gemv(DType type, const GemvArgs& a, cudaStream_t s) {
  if (a.rows <= 0 || (a.offsets == nullptr && a.m <= 0) || a.num_groups <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((a.rows + kGemvWarps - 1) / kGemvWarps), static_cast<unsigned>(a.num_groups));
  const bool known = dispatch_weight_type(type, [&]<DType T>() { gemv_kernel<T><<<grid, kGemvWarps * kWarp, 0, s>>>(a); });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace duet::cuda
