// Device-side reading of weight rows: the 32 elements of chunk c of a row (elements [32c, 32c +
// 32)), for every weight type the CUDA backend reads, from GGUF's blocks in place. Each follows the
// scalar reference in core/quant.cpp line by line.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "duet/core/dtype.h"
#include "duet/core/quant.h"

namespace duet::cuda {

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ float half_bits(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf16_bits(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
// An e4m3 code ("fn": no infinities, S.1111.111 is NaN) as f32, exactly (fp8_e4m3_to_fp32).
__device__ __forceinline__ float e4m3_bits(uint8_t v) {
  const uint32_t exp = (v >> 3) & 0x0f, mant = v & 0x07;
  float x;
  if (exp == 0x0f && mant == 0x07) {
    x = __uint_as_float(0x7fc00000u);
  } else if (exp == 0) {
    x = static_cast<float>(mant) * 0x1p-9f;  // subnormal: mant / 8 * 2^-6
  } else {
    x = __uint_as_float(((exp + 120) << 23) | (mant << 20));  // (1 + mant / 8) * 2^(exp - 7)
  }
  return (v & 0x80) != 0 ? -x : x;
}

// The elements of chunk c; for f32/f16/bf16 rows only the first `valid` are read (the row's tail),
// the rest are 0. Block formats always have whole chunks (FP8 rows, whose last block of 128 may be
// shorter, are a multiple of 32 long on the GPU: cuda_device.cpp refuses others).
template <DType T>
__device__ __forceinline__ void dequant32(const uint8_t* row, int64_t c, int valid, float* out) {
  if constexpr (T == DType::kF32) {
    const float* p = reinterpret_cast<const float*>(row) + c * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = j < valid ? p[j] : 0.0f;
  } else if constexpr (T == DType::kF16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + c * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = j < valid ? half_bits(p[j]) : 0.0f;
  } else if constexpr (T == DType::kBF16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + c * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = j < valid ? bf16_bits(p[j]) : 0.0f;
  } else if constexpr (T == DType::kQ8_0) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + c;
    const float d = half_bits(b->d);
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(b->qs[j]) * d;
  } else if constexpr (T == DType::kQ4_0) {
    const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(row) + c;
    const float d = half_bits(b->d);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>((b->qs[j] & 0x0f) - 8) * d;
      out[j + 16] = static_cast<float>((b->qs[j] >> 4) - 8) * d;
    }
  } else if constexpr (T == DType::kQ4_1) {
    const BlockQ4_1* b = reinterpret_cast<const BlockQ4_1*>(row) + c;
    const float d = half_bits(b->d), m = half_bits(b->m);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>(b->qs[j] & 0x0f) * d + m;
      out[j + 16] = static_cast<float>(b->qs[j] >> 4) * d + m;
    }
  } else if constexpr (T == DType::kQ5_0) {
    const BlockQ5_0* b = reinterpret_cast<const BlockQ5_0*>(row) + c;
    const float d = half_bits(b->d);
    // qh is 4 bytes at offset 2 (not 4-aligned): assembled byte by byte.
    const uint32_t qh = static_cast<uint32_t>(b->qh[0]) | (static_cast<uint32_t>(b->qh[1]) << 8) |
                        (static_cast<uint32_t>(b->qh[2]) << 16) | (static_cast<uint32_t>(b->qh[3]) << 24);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int q0 = (b->qs[j] & 0x0f) | static_cast<int>(((qh >> j) << 4) & 0x10);
      const int q1 = (b->qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
      out[j] = static_cast<float>(q0 - 16) * d;
      out[j + 16] = static_cast<float>(q1 - 16) * d;
    }
  } else if constexpr (T == DType::kFP8_E4M3_B128) {
    // Chunk c is quarter c % 4 of block c / 4: the block's f32 scale, then its codes (core/quant.h).
    // Each value is the f32 product of the exact e4m3 value and the scale, as the reference's.
    const uint8_t* b = row + (c / 4) * sizeof(BlockFP8);
    const float d = *reinterpret_cast<const float*>(b);
    const uint8_t* q = b + sizeof(float) + (c % 4) * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = j < valid ? e4m3_bits(q[j]) * d : 0.0f;
  } else if constexpr (T == DType::kQ4_K) {
    // Chunk c is sub-block s = c % 8 of super-block c / 8: the low (s even) or high nibbles of
    // the 32 bytes of pair s / 2, with the 6-bit scale and min number s.
    const BlockQ4_K* b = reinterpret_cast<const BlockQ4_K*>(row) + c / 8;
    const int s = static_cast<int>(c % 8);
    const uint8_t* sc = b->scales;
    int scale, min;
    if (s < 4) {
      scale = sc[s] & 63;
      min = sc[s + 4] & 63;
    } else {
      scale = (sc[s + 4] & 0x0f) | ((sc[s - 4] >> 6) << 4);
      min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
    const float d = half_bits(b->d) * static_cast<float>(scale);
    const float m = half_bits(b->dmin) * static_cast<float>(min);
    const uint8_t* q = b->qs + 32 * (s / 2);
    const int shift = (s % 2) * 4;
#pragma unroll
    for (int l = 0; l < 32; ++l) out[l] = d * static_cast<float>((q[l] >> shift) & 0x0f) - m;
  } else if constexpr (T == DType::kQ6_K) {
    // Chunk c is quarter p = s % 4 of half h = s / 4 (s = c % 8) of super-block c / 8.
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(row) + c / 8;
    const int s = static_cast<int>(c % 8), h = s / 4, p = s % 4;
    const uint8_t* ql = b->ql + 64 * h;
    const uint8_t* qh = b->qh + 32 * h;
    const int8_t* sc = b->scales + 8 * h;
    const float d = half_bits(b->d);
    const int lo_off = (p % 2) * 32;   // q1, q3: ql[l]; q2, q4: ql[l + 32]
    const int lo_shift = (p / 2) * 4;  // q1, q2: low nibble; q3, q4: high
    const int hi_shift = 2 * p;        // qh bits 0-1, 2-3, 4-5, 6-7
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = (((ql[l + lo_off] >> lo_shift) & 0x0f) | (((qh[l] >> hi_shift) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(sc[l / 16 + 2 * p]) * static_cast<float>(q);
    }
  }
}

// Calls f.template operator()<T>() for the weight type `type`; false for one the backend does not read.
template <typename F>
bool dispatch_weight_type(DType type, F&& f) {
  switch (type) {
    case DType::kF32: f.template operator()<DType::kF32>(); return true;
    case DType::kF16: f.template operator()<DType::kF16>(); return true;
    case DType::kBF16: f.template operator()<DType::kBF16>(); return true;
    case DType::kQ8_0: f.template operator()<DType::kQ8_0>(); return true;
    case DType::kQ4_0: f.template operator()<DType::kQ4_0>(); return true;
    case DType::kQ4_1: f.template operator()<DType::kQ4_1>(); return true;
    case DType::kQ5_0: f.template operator()<DType::kQ5_0>(); return true;
    case DType::kQ4_K: f.template operator()<DType::kQ4_K>(); return true;
    case DType::kQ6_K: f.template operator()<DType::kQ6_K>(); return true;
    case DType::kFP8_E4M3_B128: f.template operator()<DType::kFP8_E4M3_B128>(); return true;
    default: return false;
  }
}

}  // namespace duet::cuda
