// Weights repacked for the integer GEMM: sixteen rows interleaved block by block, so that one
// 512-bit register holds the same four bytes of sixteen rows and a dot-product instruction with
// a broadcast activation word advances sixteen outputs at once. The bytes are the file's, only
// moved (Q8_0's values also shifted to unsigned), so the packed copy is exactly as large as the
// original and unpacking it gives the original back.
//
// Layout of one group of 16 rows, block b after block b - 1 (nb blocks per row):
//   16 x fp16 scales, row r's scale at index r;
//   Q4_0: 4 x 64 bytes; 64-byte word k holds, for r = 0..15, row r's qs[4k .. 4k + 3] at 4r
//         (low nibbles: values 4k.., high nibbles: values 16 + 4k.., both stored as q + 8);
//   Q8_0: 8 x 64 bytes; word k holds row r's qs[4k .. 4k + 3] + 128 at 4r (as unsigned bytes).
// Rows past the matrix's end (the last group of a matrix whose row count is not a multiple of
// 16) have scale 0 and contribute nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "duet/core/dtype.h"

namespace duet::cpu {

constexpr int kPackRows = 16;

// Whether `type` has a packed layout.
bool packable(DType type);
// Bytes of one block of a 16-row group, and of a whole packed matrix.
size_t packed_block_bytes(DType type);
size_t packed_bytes(DType type, int64_t rows, int64_t nb);

// Packs groups [group_begin, group_end) of a matrix of `rows` rows (rows start `row_bytes` apart
// at `src`, each nb blocks) into `dst`, the start of the whole packed matrix.
void pack_rows16(DType type, const uint8_t* src, size_t row_bytes, int64_t rows, int64_t nb, uint8_t* dst,
                 int64_t group_begin, int64_t group_end);
// The inverse, for tests: writes the `rows` original rows back (row_bytes apart) from `packed`.
void unpack_rows16(DType type, const uint8_t* packed, int64_t rows, int64_t nb, uint8_t* dst, size_t row_bytes);

}  // namespace duet::cpu
