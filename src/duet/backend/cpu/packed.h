// Weights repacked for the integer GEMM: sixteen rows interleaved block by block, so that one
// 512-bit register holds the same four bytes of sixteen rows and a dot-product instruction with
// a broadcast activation word advances sixteen outputs at once. The bytes are the file's, only
// moved (Q8_0's values also shifted to unsigned), so the packed copy is exactly as large as the
// original and unpacking it gives the original back.
//
// Layout of one group of 16 rows, block b after block b - 1 (nb blocks per row):
//   16 x fp16 scales (d), row r's scale at index r;
//   Q4_0: 4 x 64 bytes; 64-byte word k holds, for r = 0..15, row r's qs[4k .. 4k + 3] at 4r
//         (low nibbles: values 4k.., high nibbles: values 16 + 4k.., both stored as q + 8);
//   Q8_0: 8 x 64 bytes; word k holds row r's qs[4k .. 4k + 3] + 128 at 4r (as unsigned bytes).
//   Q5_0: Q4_0's 4 x 64 bytes of nibbles, then 8 x 64-bit masks of the fifth bits: mask j < 4 has
//         bit 4r + t set when row r's value 4j + t has it, mask 4 + j the same for 16 + 4j + t.
//   Q4_1: Q4_0's 4 x 64 bytes of nibbles, then 16 x fp16 minimums.
// Q4_K, per super-block of 256 (nb / 8 of them per row):
//   16 x fp16 d, 16 x fp16 dmin;
//   8 x 16 bytes of 6-bit scales, then 8 x 16 bytes of 6-bit mins, sub-block s's at 16s + r
//   (unpacked from the 12 bytes they share in the file: 64 bytes more per 16 rows, under 3%);
//   4 x 8 x 64 bytes of nibbles: word (g, k) holds row r's qs[32g + 4k .. 32g + 4k + 3] at 4r
//   (low nibbles: sub-block 2g's values 4k.., high nibbles: sub-block 2g + 1's).
// Q6_K, per super-block of 256 (3360 bytes, the file's 16 x 210):
//   16 x fp16 d; 16 x 16 int8 scales, group g's (values 16g..) at 16g + r;
//   2 x 16 words of low nibbles: word (h, k) holds row r's ql[64h + 4k .. 64h + 4k + 3];
//   2 x 8 words of high bit pairs: word (h, k) holds row r's qh[32h + 4k .. 32h + 4k + 3].
// Rows past the matrix's end (the last group of a matrix whose row count is not a multiple of
// 16) have scale 0 and contribute nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "duet/core/dtype.h"

namespace duet::cpu {

constexpr int kPackRows = 16;

// A tile of several activation rows spends so long on each block of weights that the hardware
// prefetcher falls behind it; the x86 packed kernels' first tile over a group (the one that reads
// it from memory) prefetches the weights kPrefetchAhead bytes ahead as it goes, into L2 only
// (prefetch_weights; kernels_avx512.cpp says more). On Zen 5, with prefetcht0, 8 KiB ahead
// instead of 2 took 4 rows of Q4_K 0.10-0.15 -> 0.07 ms, of Q6_K 0.17-0.19 -> 0.09-0.10 (2048 x
// 2048 from memory) and batched decode steps 6-29% faster, but AVX-512 prefill lost 3%, so prefill
// kept 2 KiB. On Zen 4 (qgemm_bench 5632 x 2048 from memory, one thread, medians of five
// alternations, ms) prefetcht2 at 8 KiB was faster for both: 4 rows of AVX-512 Q8_0 0.685 ->
// 0.557, AVX2 Q4_0 0.914 -> 0.623, Q4_K 0.699 -> 0.526, Q8_0 1.056 -> 0.860, Q6_K 1.468 -> 1.168;
// 16 rows of AVX2 Q4_0 1.810 -> 1.613, Q8_0 3.19 -> 2.57, AVX-512 Q4_K 1.36 -> 1.29; 32 rows
// (prefill) of AVX2 Q8_0 5.47 -> 4.89, Q4_0 3.49 -> 3.31, Q6_K 7.22 -> 6.97, AVX-512 Q4_K 2.71 ->
// 2.60, Q4_0 2.12 -> 2.14 (prefetcht2 at 2 KiB lost: AVX2 Q4_0 3.49 -> 4.91).
constexpr size_t kPrefetchAhead = 8192;
// Prefetches [p + ahead, p + ahead + bytes) for reading, a cache line at a time; kLocality is
// __builtin_prefetch's (3: every cache level, prefetcht0 on x86; 1: prefetcht2, L2 and beyond).
template <int kLocality = 3>
inline void prefetch_lines(const uint8_t* p, size_t ahead, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + ahead + o, 0, kLocality);
}
// The packed kernels' prefetch of their weights: into L2 only (see kPrefetchAhead).
inline void prefetch_weights(const uint8_t* p, size_t ahead, size_t bytes) { prefetch_lines<1>(p, ahead, bytes); }

// Whether `type` has a packed layout (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K).
bool packable(DType type);
// Bytes of one packed block of a 16-row group, as laid out above: a block of 32 values (Q4_0,
// Q4_1, Q5_0, Q8_0) or a super-block of 256 (Q4_K, Q6_K); 0 for a type without a packed layout.
constexpr size_t packed_block_bytes(DType type) {
  switch (type) {
    case DType::kQ4_0: return 32 + 16 * 16;
    case DType::kQ4_1: return 32 + 16 * 16 + 32;
    case DType::kQ5_0: return 32 + 16 * 16 + 64;
    case DType::kQ8_0: return 32 + 16 * 32;
    case DType::kQ4_K: return 32 + 32 + 128 + 128 + 16 * 128;
    case DType::kQ6_K: return 32 + 256 + 16 * 128 + 16 * 64;
    default: return 0;
  }
}
// Bytes of a packed matrix of `rows` rows of nb activation blocks (32 values each); a 16-row
// group is packed_bytes(type, kPackRows, nb).
size_t packed_bytes(DType type, int64_t rows, int64_t nb);

// Packs groups [group_begin, group_end) of a matrix of `rows` rows (rows start `row_bytes` apart
// at `src`, each nb blocks of 32 values) into `dst`, the start of the whole packed matrix.
void pack_rows16(DType type, const uint8_t* src, size_t row_bytes, int64_t rows, int64_t nb, uint8_t* dst,
                 int64_t group_begin, int64_t group_end);
// The inverse, for tests: writes the `rows` original rows back (row_bytes apart) from `packed`.
void unpack_rows16(DType type, const uint8_t* packed, int64_t rows, int64_t nb, uint8_t* dst, size_t row_bytes);

}  // namespace duet::cpu
