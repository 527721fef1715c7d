// CPU kernels: pointers and sizes in, no allocation, no exceptions, no logging. Each instruction
// set fills one table of function pointers; the table is chosen once (see isa.h).
#pragma once

#include <cstdint>

#include "duet/backend/cpu/isa.h"
#include "duet/backend/cpu/kernels_fp8.h"
#include "duet/core/dtype.h"
#include "duet/core/quant.h"

namespace duet::cpu {

using DequantizeRowFn = void (*)(const void* src, float* y, int64_t n);

// Activations quantized for the integer dot products with Q4_0/Q8_0 weights: 32 int8 values, a
// float scale (finer than the weights' fp16 one) and the sum of the values (what weight formats
// with a per-block minimum need).
constexpr int kQK8A = 32;
struct BlockQ8A {
  float d;
  int32_t sum;
  int8_t qs[kQK8A];
};
static_assert(sizeof(BlockQ8A) == 40, "Q8A block must be 40 bytes");

// The sums of values 0..15 and 16..31 of each of n activation blocks, into half[2b] and
// half[2b + 1]: what packed Q6_K's 16-value scale groups take off for its 32 offset, computed
// once per matmul beside the activations' quantization.
inline void half_sums(const BlockQ8A* a, int64_t n, int32_t* half) {
  for (int64_t b = 0; b < n; ++b) {
    int32_t lo = 0, hi = 0;
    for (int j = 0; j < 16; ++j) {
      lo += a[b].qs[j];
      hi += a[b].qs[16 + j];
    }
    half[2 * b] = lo;
    half[2 * b + 1] = hi;
  }
}

// Each of n activation blocks' d and d * sum as floats, at [2b] and [2b + 1] of the result: what
// packed Q4_K's and Q4_1's x86 kernels scale by (the min's term), made once per kernel call so that
// they broadcast both from memory. Made in the tile from the block instead, GCC's int-to-float
// conversion, product and register broadcast per block and activation row took, of the tiles'
// time (qgemm_bench, 64 rows, in cache, Zen 4): Q4_K 3-4% (AVX2) and 4-6% (AVX-512), Q4_1 9% and
// 4%; of dsc-1.3b Q4_K_M's pp512, 3% (AVX2 table) and 3-7% (AVX-512), in alternation.
// Returns a buffer of the calling thread, valid until its next call (the kernels do not nest).
// Defined in packed.cpp, built without the kernel files' ISA flags: an inline function here
// could be emitted by the AVX-512 file and that copy taken by the linker for every table.
const float* act_scalars(const BlockQ8A* a, int64_t n);

// y[i * ldy + j] = dot(weight row j, activation row i) for i < m, j < nw. Weight rows start
// `row_bytes` apart at `w` and hold nb blocks; activation rows are nb consecutive blocks.
using QGemmFn = void (*)(const uint8_t* w, size_t row_bytes, int64_t nw, const BlockQ8A* a, int64_t m, int64_t nb,
                         float* y, int64_t ldy);

// The same product over weights packed 16 rows at a time (packed.h): `packed` is the start of the
// packed matrix, nw its true row count; y[i * ldy + j] for i < m, j < nw. A row of y is computed
// the same way whatever m is, so a sequence's result does not depend on the rest of the batch.
// `half` holds a's half_sums (2 per block); only Q6_K reads it, the other types take nullptr.
using PackedGemmFn = void (*)(const uint8_t* packed, int64_t nw, const BlockQ8A* a, const int32_t* half, int64_t m,
                              int64_t nb, float* y, int64_t ldy);

// The element type of attention's keys and values (Kernels::attn_scores / attn_values).
enum AttnCache { kAttnF32 = 0, kAttnF16 = 1, kAttnQ8_0 = 2 };
using AttnScoresFn = void (*)(const float* q, int64_t ldq, int64_t rows, const void* k, int64_t ldk, int64_t nk,
                              int64_t dk, float scale, float* s, int64_t lds);
using AttnValuesFn = void (*)(const float* p, int64_t ldp, int64_t rows, const void* v, int64_t ldv, int64_t nk,
                              int64_t dv, float* o, int64_t ldo, bool accumulate);

// A row of `n` values of the fp8 KV cache (quantize_row_fp8_kv_ref's layout): its whole blocks of
// 128 through Fp8, the values after them (halves) through F16; each ISA's table instantiates it
// with its own two, so the bits are dequantize_row_fp8_kv_ref's.
template <DequantizeRowFn Fp8, DequantizeRowFn F16>
void dequantize_kv_fp8(const void* src, float* y, int64_t n) {
  const int64_t whole = n / kQKFP8 * kQKFP8;
  if (whole > 0) Fp8(src, y, whole);
  if (n > whole) F16(static_cast<const uint8_t*>(src) + whole / kQKFP8 * sizeof(BlockFP8), y + whole, n - whole);
}

struct Kernels {
  Isa isa;
  // Row conversion to f32 for each computable weight type (nullptr where not supported).
  DequantizeRowFn dequantize_f16;
  DequantizeRowFn dequantize_bf16;
  DequantizeRowFn dequantize_q8_0;
  DequantizeRowFn dequantize_q4_0;
  DequantizeRowFn dequantize_q4_1;
  DequantizeRowFn dequantize_q5_0;
  DequantizeRowFn dequantize_q5_1;
  DequantizeRowFn dequantize_q4_k;
  DequantizeRowFn dequantize_q5_k;
  DequantizeRowFn dequantize_q6_k;
  // y[i * ldy + j] = dot(x[i, :k], w[j, :k]) for i < m, j < nw; x and w row-major with rows of k.
  void (*gemm_f32)(const float* w, int64_t nw, const float* x, int64_t m, int64_t k, float* y, int64_t ldy);
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  // y += a * x
  void (*axpy_f32)(float a, const float* x, float* y, int64_t n);
  // The f16 KV cache: rows to f16 (round to nearest even, as fp32_to_fp16).
  void (*f32_to_f16)(const float* x, uint16_t* y, int64_t n);
  // Attention. Scores: s[r * lds + j] = scale * dot(q row r, k row j) for r < rows, j < nk
  // (rows ldq, ldk and lds elements apart); each dot in one fixed order of its own (per lane an
  // FMA chain over the dimensions, then one reduction tree), whatever rows and nk are. The keys
  // are f32, or KV cache rows read in place (index by AttnCache): f16, or q8_0 blocks (ldk, dk a
  // multiple of 32), whose elements become f32 exactly, so every variant gives the f32 one's bits
  // on the converted rows.
  AttnScoresFn attn_scores[3];
  // x[j] = exp(x[j] - m) for j < n; returns their sum (each element through the same exp, the
  // sum in a fixed order for each n).
  float (*exp_sum_f32)(float* x, int64_t n, float m);
  // Weighted sums of values: o[r * ldo + c] = sum over j < nk of p[r * ldp + j] * v[j * ldv + c]
  // for r < rows, c < dv, each element one FMA chain in the order of j that starts from 0, or
  // from o's value when `accumulate` (so a sum split over calls gives the same bits); values as
  // the keys above.
  AttnValuesFn attn_values[3];
  // The same two for one query row per head, `rows` heads whose keys (values) lie side by side in
  // each cache row, head r's at columns [r * dk, (r + 1) * dk) (r * dv for values): decode with one
  // query row per kv head. The bits of attn_scores / attn_values called head by head with one row;
  // each cache row read once, all heads. nullptr where an ISA has none (attention calls the
  // kernels above head by head then).
  AttnScoresFn attn_scores_heads[3];
  AttnValuesFn attn_values_heads[3];
  // y[i] = fma(x[i], b, y[i] * a): merging two parts of a softmax-weighted sum.
  void (*scale_add_f32)(float* y, float a, const float* x, float b, int64_t n);
  // y = x / sqrt(mean(x^2) + eps) * w for one row
  void (*rms_norm_f32)(const float* x, const float* w, float* y, int64_t n, float eps);
  // y = silu(g) * u
  void (*silu_mul_f32)(const float* g, const float* u, float* y, int64_t n);
  // Integer path: activations to Q8A blocks (n a multiple of 32), and weights x activations.
  void (*quantize_q8a)(const float* x, BlockQ8A* y, int64_t n);
  QGemmFn gemm_q4_0_q8a;
  QGemmFn gemm_q8_0_q8a;
  // K-quants: a super-block of 256 weights meets 8 activation blocks (nb counts Q8A blocks).
  QGemmFn gemm_q4_k_q8a;
  QGemmFn gemm_q6_k_q8a;
  // Packed weights (nullptr where the ISA has no packed kernel; the plain one is used then).
  PackedGemmFn gemm_q4_0x16_q8a;
  PackedGemmFn gemm_q8_0x16_q8a;
  PackedGemmFn gemm_q4_kx16_q8a;
  PackedGemmFn gemm_q5_0x16_q8a;  // Q5_0: llama.cpp's Q4_K_M uses it where rows are not a multiple of 256
  PackedGemmFn gemm_q6_kx16_q8a;
  PackedGemmFn gemm_q4_1x16_q8a;  // Q4_1: also what AWQ's int4 with zero points becomes
  // Activation rows per packed-GEMM call in the backend: every group of a task's weights is read
  // once a call, and a kernel's first tile over a group (what makes its saved words) runs once a
  // call. The AVX2 and AVX-VNNI tables take 256, AVX-512 64 (kernels_avx2.cpp), NEON 32; AMX,
  // which unpacks each 16-row group once per call, gains from more (pp512, dsc-1.3b Q4_0, 2
  // threads: 284 tokens/s with 32, 310 with 64, 327 with 128, 304 with 512).
  int64_t packed_act_rows = 32;
  // FP8 weights (kernels_fp8.h): rows to f32 (dequantize_fn), and a few activation rows times
  // rows in place, with gemm_f32's bits on the dequantized rows.
  DequantizeRowFn dequantize_fp8;
  Fp8GemvFn gemv_fp8;
  // Rows of the fp8 KV cache (KvDtype::kFp8) to f32: dequantize_kv_fp8 above on this table's
  // dequantize_fp8 and dequantize_f16.
  DequantizeRowFn dequantize_kv_fp8;
  // DeepSeek-V3.2's lightning indexer, one query over keys [0, n): total[s] is, over h < heads
  // in order, fma(w[h], max(0, score), total[s]) from 0, score the dot product of q + h * d
  // and key s as one fma chain over the d dimensions in order, from 0. The keys come in groups
  // of 16 (index_keys16): keys16[(s / 16) * d * 16 + p * 16 + s % 16]. Every ISA gives these bits.
  void (*index_totals)(const float* q, int64_t heads, int64_t d, const float* keys16, int64_t n, const float* w,
                       float* total);
};

// keys [n, d] row-major into index_totals' groups of 16 (n rounded up to 16, the padding zero).
void index_keys16(const float* keys, int64_t n, int64_t d, float* keys16);

const Kernels& kernels_generic();
#if defined(__x86_64__)
const Kernels& kernels_avx2();
const Kernels& kernels_avxvnni();
const Kernels& kernels_avx512();
const Kernels& kernels_amx();
#endif
#if defined(__aarch64__)
const Kernels& kernels_neon();
#endif

// The table for an ISA (must be available) and the selected one.
const Kernels& kernels_for(Isa isa);
const Kernels& kernels();

// The dequantize function of `type` in `k`, or nullptr when `type` is not computable.
DequantizeRowFn dequantize_fn(const Kernels& k, DType type);
// The integer GEMM for weights of `type`, or nullptr when it has none.
QGemmFn qgemm_fn(const Kernels& k, DType type);
// The packed GEMM for weights of `type`, or nullptr when it has none.
PackedGemmFn packed_gemm_fn(const Kernels& k, DType type);

}  // namespace duet::cpu
