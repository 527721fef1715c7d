#include "duet/core/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "duet/core/error.h"

namespace duet {

void fp8_blocks_to_rows(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols, uint8_t* out) {
  const int64_t scale_cols = (cols + kQKFP8 - 1) / kQKFP8;
  const size_t row_bytes = row_size(DType::kFP8_E4M3_B128, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scale_inv + (r / kQKFP8) * scale_cols;
    uint8_t* dst = out + static_cast<size_t>(r) * row_bytes;
    for (int64_t b = 0; b < scale_cols; ++b) {
      const int64_t len = std::min<int64_t>(kQKFP8, cols - b * kQKFP8);
      std::memcpy(dst, &s[b], sizeof(float));
      std::memcpy(dst + sizeof(float), w + r * cols + b * kQKFP8, static_cast<size_t>(len));
      dst += sizeof(BlockFP8);
    }
  }
}

void fp8_blocks_to_q8_0(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols, int64_t block,
                        BlockQ8_0* out) {
  if (cols % kQK8_0 != 0 || block <= 0) {
    fail(ErrorCode::kInvalidArgument, "FP8 weights of {} columns (block {}) cannot become Q8_0 blocks of 32", cols,
         block);
  }
  const int64_t scale_cols = (cols + block - 1) / block;
  float table[256];
  for (int v = 0; v < 256; ++v) table[v] = fp8_e4m3_to_fp32(static_cast<uint8_t>(v));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scale_inv + (r / block) * scale_cols;
    for (int64_t c = 0; c < cols; ++c) row[c] = table[w[r * cols + c]] * s[c / block];
    quantize_row_q8_0_ref(row.data(), out + r * (cols / kQK8_0), cols);
  }
}

void awq_to_q4_1(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int64_t in, int64_t out,
                 int64_t group, BlockQ4_1* rows) {
  if (in % group != 0 || group % 32 != 0 || out % 8 != 0) {
    fail(ErrorCode::kInvalidArgument, "AWQ layer {} x {} with group {}: expected the inputs a multiple of the group, "
         "the group a multiple of 32 and the outputs of 8", in, out, group);
  }
  // Position of output column (8 * col + j) within its int32: nibble kSlot[j].
  static constexpr int kSlot[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // inverse of the order 0, 2, 4, 6, 1, 3, 5, 7
  const int64_t packed_cols = out / 8;
  auto nibble = [&](const int32_t* m, int64_t row, int64_t o) {
    const uint32_t word = static_cast<uint32_t>(m[row * packed_cols + o / 8]);
    return static_cast<int>((word >> (4 * kSlot[o % 8])) & 0x0f);
  };
  const int64_t nb = in / 32;
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t g = b * 32 / group;
      const float s = fp16_to_fp32(scales[g * out + o]);
      const int z = nibble(qzeros, g, o);
      BlockQ4_1& blk = rows[o * nb + b];
      blk.d = scales[g * out + o];
      blk.m = fp32_to_fp16(-s * static_cast<float>(z));
      for (int e = 0; e < 16; ++e) {
        const int lo = nibble(qweight, b * 32 + e, o);
        const int hi = nibble(qweight, b * 32 + 16 + e, o);
        blk.qs[e] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

uint8_t fp32_to_fp8_e4m3(float v) {
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const float a = std::fabs(v);
  // The 127 finite non-negative codes increase with their value: find the nearest one.
  static const std::vector<float> table = [] {
    std::vector<float> t(127);
    for (int c = 0; c < 127; ++c) t[static_cast<size_t>(c)] = fp8_e4m3_to_fp32(static_cast<uint8_t>(c));
    return t;
  }();
  if (a >= table.back()) return static_cast<uint8_t>(sign | 126);
  const auto hi = std::upper_bound(table.begin(), table.end(), a);  // a < *hi, hi > begin since a >= 0
  const int up = static_cast<int>(hi - table.begin()), down = up - 1;
  const float d_down = a - table[static_cast<size_t>(down)], d_up = table[static_cast<size_t>(up)] - a;
  const int code = d_down < d_up || (d_down == d_up && down % 2 == 0) ? down : up;
  return static_cast<uint8_t>(sign | code);
}

float fp8_e4m3_round(float v) {
  if (std::isnan(v)) return v;
  const float a = std::min(std::fabs(v), 448.0f);
  float r = 0.0f;
  if (a < 0x1p-6f) {
    r = std::nearbyint(a * 512.0f) / 512.0f;  // subnormal codes: multiples of 2^-9 (ties to even)
  } else {
    // Three mantissa bits, rounded to nearest even on the f32 bits; a <= 448 cannot round past it.
    uint32_t bits = 0;
    std::memcpy(&bits, &a, sizeof bits);
    bits += 0x7FFFFu + ((bits >> 20) & 1u);
    bits &= ~0xFFFFFu;
    std::memcpy(&r, &bits, sizeof r);
  }
  return std::copysign(r, v);
}

namespace {

// act_quant's "ue8m0" scale of x [n] as an exponent e (the scale is 2^e): ceil(log2(max(amax,
// 1e-4) / 448)).
int ue8m0_exponent(const float* x, int64_t n) {
  float amax = 1e-4f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  // ceil(log2(r)) of a normal f32 r: its exponent, plus one when any mantissa bit is set.
  const float r = amax * (1.0f / 448.0f);
  uint32_t bits = 0;
  std::memcpy(&bits, &r, sizeof bits);
  return static_cast<int>((bits >> 23) & 0xFFu) - 127 + ((bits & 0x7FFFFFu) != 0 ? 1 : 0);
}

}  // namespace

void fp8_act_round_trip(float* x, int64_t n, int64_t block) {
  if (block <= 0) fail(ErrorCode::kInvalidArgument, "FP8 block size {} must be positive", block);
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t b1 = std::min(n, b0 + block);
    const int e = ue8m0_exponent(x + b0, b1 - b0);
    const float s = std::ldexp(1.0f, e), inv = std::ldexp(1.0f, -e);
    for (int64_t i = b0; i < b1; ++i) x[i] = fp8_e4m3_round(x[i] * inv) * s;
  }
}

uint8_t fp8_e4m3_encode(float v) {
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const float r = std::fabs(fp8_e4m3_round(v));
  if (r < 0x1p-6f) return static_cast<uint8_t>(sign | static_cast<uint8_t>(r * 512.0f));  // m 2^-9, m < 8
  uint32_t bits = 0;
  std::memcpy(&bits, &r, sizeof bits);
  const uint32_t e = ((bits >> 23) & 0xFFu) - 127u + 7u, m = (bits >> 20) & 7u;  // r = (1 + m/8) 2^(e-7)
  return static_cast<uint8_t>(sign | (e << 3) | m);
}

size_t fp8_kv_row_bytes(int64_t n) {
  return static_cast<size_t>(n / kQKFP8) * sizeof(BlockFP8) + static_cast<size_t>(n % kQKFP8) * sizeof(uint16_t);
}

void quantize_row_fp8_kv_ref(const float* x, void* y, int64_t n) {
  auto* p = static_cast<uint8_t*>(y);
  int64_t i = 0;
  for (; i + kQKFP8 <= n; i += kQKFP8, p += sizeof(BlockFP8)) {
    const int e = ue8m0_exponent(x + i, kQKFP8);
    BlockFP8 b;
    b.d = std::ldexp(1.0f, e);
    const float inv = std::ldexp(1.0f, -e);
    for (int j = 0; j < kQKFP8; ++j) b.qs[j] = fp8_e4m3_encode(x[i + j] * inv);
    std::memcpy(p, &b, sizeof b);
  }
  for (int64_t j = 0; i + j < n; ++j) {
    const uint16_t h = fp32_to_fp16(x[i + j]);
    std::memcpy(p + j * sizeof h, &h, sizeof h);
  }
}

void dequantize_row_fp8_kv_ref(const void* y, float* x, int64_t n) {
  const int64_t whole = n / kQKFP8 * kQKFP8;
  dequantize_row_fp8_ref(y, x, whole);
  const uint8_t* tail = static_cast<const uint8_t*>(y) + static_cast<size_t>(whole / kQKFP8) * sizeof(BlockFP8);
  for (int64_t j = 0; whole + j < n; ++j) {
    uint16_t h = 0;
    std::memcpy(&h, tail + j * sizeof h, sizeof h);
    x[whole + j] = fp16_to_fp32(h);
  }
}

void hadamard_transform(float* x, int64_t n) {
  if (n <= 0 || (n & (n - 1)) != 0) {
    fail(ErrorCode::kInvalidArgument, "a Hadamard transform of {} values: not a power of two", n);
  }
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

void fp8_blocks_from_f32(const float* w, int64_t rows, int64_t cols, int64_t block, uint8_t* q, float* scale_inv) {
  if (block <= 0) fail(ErrorCode::kInvalidArgument, "FP8 block size {} must be positive", block);
  const int64_t br = (rows + block - 1) / block, bc = (cols + block - 1) / block;
  for (int64_t i = 0; i < br; ++i) {
    for (int64_t j = 0; j < bc; ++j) {
      const int64_t r_end = std::min(rows, (i + 1) * block), c_end = std::min(cols, (j + 1) * block);
      float amax = 0.0f;
      for (int64_t r = i * block; r < r_end; ++r) {
        for (int64_t c = j * block; c < c_end; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      }
      const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
      scale_inv[i * bc + j] = s;
      for (int64_t r = i * block; r < r_end; ++r) {
        for (int64_t c = j * block; c < c_end; ++c) q[r * cols + c] = fp32_to_fp8_e4m3(w[r * cols + c] / s);
      }
    }
  }
}

void awq_from_f32(const float* w, int64_t in, int64_t out, int64_t group, int32_t* qweight, int32_t* qzeros,
                  uint16_t* scales) {
  if (group <= 0 || in % group != 0 || out % 8 != 0) {
    fail(ErrorCode::kInvalidArgument, "AWQ layer {} x {} with group {}: expected the inputs a multiple of the group "
         "and the outputs of 8", in, out, group);
  }
  static constexpr int kSlot[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // nibble of output (8 * col + j), as awq_to_q4_1
  const int64_t packed_cols = out / 8, groups = in / group;
  std::fill_n(qweight, in * packed_cols, 0);
  std::fill_n(qzeros, groups * packed_cols, 0);
  auto put = [&](int32_t* m, int64_t row, int64_t o, int value) {
    uint32_t& word = reinterpret_cast<uint32_t&>(m[row * packed_cols + o / 8]);
    word |= static_cast<uint32_t>(value & 0x0f) << (4 * kSlot[o % 8]);
  };
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t o = 0; o < out; ++o) {
      const float* x = w + o * in + g * group;
      const auto [lo, hi] = std::minmax_element(x, x + group);
      const uint16_t h = fp32_to_fp16(std::max((*hi - *lo) / 15.0f, 1e-5f));
      const float s = fp16_to_fp32(h);
      const int zero = static_cast<int>(std::clamp(std::nearbyint(-*lo / s), 0.0f, 15.0f));
      scales[g * out + o] = h;
      put(qzeros, g, o, zero);
      for (int64_t i = 0; i < group; ++i) {
        const int v = static_cast<int>(std::clamp(std::nearbyint(x[i] / s) + static_cast<float>(zero), 0.0f, 15.0f));
        put(qweight, g * group + i, o, v);
      }
    }
  }
}

}  // namespace duet
