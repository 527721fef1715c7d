#include "duet/core/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "duet/core/error.h"

namespace duet {

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return sign;  // below half of the smallest subnormal
    // value = mant * 2^(exp - 150); the subnormal unit is 2^-24, so q = mant >> (126 - exp).
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t drop = 126 - exp;  // 14..24
    uint32_t q = mant >> drop;
    const uint32_t rem = mant & ((1u << drop) - 1);
    const uint32_t half = 1u << (drop - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

uint16_t fp32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

void quantize_row_q4_0_ref(const float* x, BlockQ4_0* y, int64_t n) {
  const int64_t nb = n / kQK4_0;
  for (int64_t i = 0; i < nb; ++i) {
    const float* xb = x + i * kQK4_0;
    float amax = 0.0f;
    float max = 0.0f;  // the value of largest magnitude, with its sign
    for (int j = 0; j < kQK4_0; ++j) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const float x0 = xb[j] * id;
      const float x1 = xb[j + kQK4_0 / 2] * id;
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_row_q8_0_ref(const float* x, BlockQ8_0* y, int64_t n) {
  const int64_t nb = n / kQK8_0;
  for (int64_t i = 0; i < nb; ++i) {
    const float* xb = x + i * kQK8_0;
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK8_0; ++j) y[i].qs[j] = static_cast<int8_t>(std::roundf(xb[j] * id));
  }
}

void dequantize_row_q4_0_ref(const BlockQ4_0* x, float* y, int64_t n) {
  const int64_t nb = n / kQK4_0;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[i * kQK4_0 + j] = static_cast<float>((x[i].qs[j] & 0x0f) - 8) * d;
      y[i * kQK4_0 + j + kQK4_0 / 2] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_row_q8_0_ref(const BlockQ8_0* x, float* y, int64_t n) {
  const int64_t nb = n / kQK8_0;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[i * kQK8_0 + j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

void quantize_row_q4_1_ref(const float* x, BlockQ4_1* y, int64_t n) {
  for (int64_t i = 0; i < n / 32; ++i) {
    const float* xb = x + i * 32;
    float min = std::numeric_limits<float>::max();
    float max = -std::numeric_limits<float>::max();
    for (int j = 0; j < 32; ++j) {
      min = std::min(min, xb[j]);
      max = std::max(max, xb[j]);
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    y[i].m = fp32_to_fp16(min);
    for (int j = 0; j < 16; ++j) {
      // Truncation of (value + 0.5) rounds the non-negative offsets to nearest, as GGML does.
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((xb[j] - min) * id + 0.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>((xb[j + 16] - min) * id + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void dequantize_row_q4_1_ref(const BlockQ4_1* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / 32; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const float m = fp16_to_fp32(x[i].m);
    for (int j = 0; j < 16; ++j) {
      y[i * 32 + j] = static_cast<float>(x[i].qs[j] & 0x0f) * d + m;
      y[i * 32 + j + 16] = static_cast<float>(x[i].qs[j] >> 4) * d + m;
    }
  }
}

namespace {

// The 5-bit quants of a Q5_0/Q5_1 block: low nibbles from qs, fifth bits from qh.
inline void q5_values(const uint8_t* qs, const uint8_t* qh_bytes, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof qh);
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) << 4) & 0x10);
    q[j + 16] = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
  }
}

}  // namespace

void dequantize_row_q5_0_ref(const BlockQ5_0* x, float* y, int64_t n) {
  int q[32];
  for (int64_t i = 0; i < n / 32; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    q5_values(x[i].qs, x[i].qh, q);
    for (int j = 0; j < 32; ++j) y[i * 32 + j] = static_cast<float>(q[j] - 16) * d;
  }
}

bool convert_row_to_q8_0_exact(DType type, const void* src, BlockQ8_0* dst, int64_t n) {
  const int64_t nb = n / kQK8_0;
  if (type == DType::kQ8_0) {
    std::memcpy(dst, src, static_cast<size_t>(nb) * sizeof(BlockQ8_0));
  } else if (type == DType::kQ4_0) {
    const auto* x = static_cast<const BlockQ4_0*>(src);
    for (int64_t i = 0; i < nb; ++i) {
      dst[i].d = x[i].d;
      for (int j = 0; j < kQK4_0 / 2; ++j) {
        dst[i].qs[j] = static_cast<int8_t>((x[i].qs[j] & 0x0f) - 8);
        dst[i].qs[j + kQK4_0 / 2] = static_cast<int8_t>((x[i].qs[j] >> 4) - 8);
      }
    }
  } else if (type == DType::kQ5_0) {
    const auto* x = static_cast<const BlockQ5_0*>(src);
    int q[32];
    for (int64_t i = 0; i < nb; ++i) {
      dst[i].d = x[i].d;
      q5_values(x[i].qs, x[i].qh, q);
      for (int j = 0; j < 32; ++j) dst[i].qs[j] = static_cast<int8_t>(q[j] - 16);
    }
  } else {
    return false;
  }
  return true;
}

void dequantize_row_q5_1_ref(const BlockQ5_1* x, float* y, int64_t n) {
  int q[32];
  for (int64_t i = 0; i < n / 32; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const float m = fp16_to_fp32(x[i].m);
    q5_values(x[i].qs, x[i].qh, q);
    for (int j = 0; j < 32; ++j) y[i * 32 + j] = static_cast<float>(q[j]) * d + m;
  }
}

void scale_min_k4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void dequantize_row_q4_k_ref(const BlockQ4_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const float dmin = fp16_to_fp32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    for (int j = 0; j < kQK_K / 64; ++j) {
      uint8_t sc, m;
      scale_min_k4(2 * j, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(2 * j + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
    }
  }
}

void dequantize_row_q5_k_ref(const BlockQ5_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const float dmin = fp16_to_fp32(x[i].dmin);
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    for (int j = 0; j < kQK_K / 64; ++j) {
      uint8_t sc, m;
      scale_min_k4(2 * j, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(2 * j + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      const uint8_t bit_lo = static_cast<uint8_t>(1u << (2 * j));
      const uint8_t bit_hi = static_cast<uint8_t>(2u << (2 * j));
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0x0f) + (qh[l] & bit_lo ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & bit_hi ? 16 : 0)) - m2;
      ql += 32;
    }
  }
}

void dequantize_row_q6_k_ref(const BlockQ6_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

void quantize_row_ref(DType type, const float* x, void* dst, int64_t n) {
  (void)row_size(type, n);  // validates n against the block size
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      auto* y = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
      return;
    }
    case DType::kBF16: {
      auto* y = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
      return;
    }
    case DType::kQ8_0:
      quantize_row_q8_0_ref(x, static_cast<BlockQ8_0*>(dst), n);
      return;
    case DType::kQ4_0:
      quantize_row_q4_0_ref(x, static_cast<BlockQ4_0*>(dst), n);
      return;
    case DType::kQ4_1:
      quantize_row_q4_1_ref(x, static_cast<BlockQ4_1*>(dst), n);
      return;
    case DType::kQ4_K:
      quantize_row_q4_k_ref(x, static_cast<BlockQ4_K*>(dst), n);
      return;
    case DType::kQ5_K:
      quantize_row_q5_k_ref(x, static_cast<BlockQ5_K*>(dst), n);
      return;
    case DType::kQ6_K:
      quantize_row_q6_k_ref(x, static_cast<BlockQ6_K*>(dst), n);
      return;
    default:
      fail(ErrorCode::kUnsupported, "quantizing to {} is not supported", dtype_name(type));
  }
}

float fp8_e4m3_to_fp32(uint8_t v) {
  const int sign = v >> 7;
  const int exp = (v >> 3) & 0x0f;
  const int mant = v & 0x07;
  float x;
  if (exp == 0x0f && mant == 0x07) {
    x = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    x = std::ldexp(static_cast<float>(mant) / 8.0f, -6);  // subnormal
  } else {
    x = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  }
  return sign ? -x : x;
}

void dequantize_row_fp8_ref(const void* x, float* y, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(x);
  for (int64_t b = 0; b * kQKFP8 < n; ++b) {
    float d;
    std::memcpy(&d, p, sizeof d);
    const int64_t len = std::min<int64_t>(kQKFP8, n - b * kQKFP8);
    for (int64_t j = 0; j < len; ++j) y[b * kQKFP8 + j] = fp8_e4m3_to_fp32(p[sizeof d + j]) * d;
    p += sizeof d + kQKFP8;
  }
}

void dequantize_row_ref(DType type, const void* src, float* y, int64_t n) {
  (void)row_size(type, n);
  switch (type) {
    case DType::kF32:
      std::memcpy(y, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* x = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
      return;
    }
    case DType::kBF16: {
      const auto* x = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
      return;
    }
    case DType::kQ8_0:
      dequantize_row_q8_0_ref(static_cast<const BlockQ8_0*>(src), y, n);
      return;
    case DType::kQ4_0:
      dequantize_row_q4_0_ref(static_cast<const BlockQ4_0*>(src), y, n);
      return;
    case DType::kQ4_1:
      dequantize_row_q4_1_ref(static_cast<const BlockQ4_1*>(src), y, n);
      return;
    case DType::kQ5_0:
      dequantize_row_q5_0_ref(static_cast<const BlockQ5_0*>(src), y, n);
      return;
    case DType::kQ5_1:
      dequantize_row_q5_1_ref(static_cast<const BlockQ5_1*>(src), y, n);
      return;
    case DType::kQ4_K:
      dequantize_row_q4_k_ref(static_cast<const BlockQ4_K*>(src), y, n);
      return;
    case DType::kQ5_K:
      dequantize_row_q5_k_ref(static_cast<const BlockQ5_K*>(src), y, n);
      return;
    case DType::kQ6_K:
      dequantize_row_q6_k_ref(static_cast<const BlockQ6_K*>(src), y, n);
      return;
    case DType::kFP8_E4M3_B128:
      dequantize_row_fp8_ref(src, y, n);
      return;
    default:
      fail(ErrorCode::kUnsupported, "tensor type {} is not supported yet", dtype_name(type));
  }
}

}  // namespace duet
