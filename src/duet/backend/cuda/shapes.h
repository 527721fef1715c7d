// The CUDA kernels' fixed shapes, shared by the kernels and their host-side planning (plan.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace duet::cuda {

inline constexpr int kWarp = 32;
// Quantized GEMV: one warp per output row, 4 warps a block, up to 8 activation rows per pass
// over the weights (each weight block is dequantized once per pass).
inline constexpr int kGemvWarps = 4;
inline constexpr int64_t kGemvMaxRows = 8;
// Activation rows up to which a quantized matmul stays a GEMV (decode); above, its weights are
// dequantized tile by tile to f16 for cuBLAS's tensor-core GEMM (prefill).
inline constexpr int64_t kGemvUpTo = 8;
// Paged attention: (token, head) rows per tile, 4 warps per tile, each lane holding up to
// kAttnMaxDv / 32 output elements; keys staged in shared memory in tiles that fit kAttnSmemBytes.
inline constexpr int64_t kAttnTileRows = 8;
inline constexpr int kAttnWarps = 4;
inline constexpr int64_t kAttnMaxDk = 1024;
inline constexpr int64_t kAttnMaxDv = 512;
inline constexpr size_t kAttnSmemBytes = 48 * 1024;
inline constexpr int64_t kAttnMaxKeyTile = 32;
// MoE routing holds one token's scores per thread.
inline constexpr int64_t kMoeMaxExperts = 256;
inline constexpr int64_t kMoeMaxUsed = 16;

}  // namespace duet::cuda
