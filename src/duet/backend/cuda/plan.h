// The CUDA backend's host-side decisions, in plain C++ so that every machine builds and tests
// them (the kernels themselves need a GPU): which path a matmul takes and how it is cut to fit the
// scratch, how a paged-attention batch becomes tiles and one upload of int32 metadata, how a MoE
// layer's tokens are cut into chunks, and the ring that stages that metadata.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "duet/backend/backend.h"
#include "duet/backend/cuda/shapes.h"
#include "duet/core/dtype.h"

namespace duet::cuda {

// The weight types the CUDA matmul and get_rows read: f32, f16, bf16 and the block formats
// Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K (in place, GGUF's block layouts) and DeepSeek's FP8 (e4m3
// with a scale per 128 of a row, core/quant.h), the quantized ones (quantized_weight_type) by the
// GEMV for a few rows and dequantized tile by tile to f16 for cuBLAS for more.
bool supported_weight_type(DType type);
bool quantized_weight_type(DType type);

// The scratch of one CUDA device, allocated once when the device is made: regions for the
// dequantized weight tiles (f16), the converted activations (f16/bf16) and the MoE layer's
// per-pick rows. Offsets are 256-byte aligned and the regions do not overlap.
struct ScratchLayout {
  size_t weight_tile_offset = 0, weight_tile_bytes = 0;
  size_t activation_offset = 0, activation_bytes = 0;
  size_t moe_offset = 0, moe_bytes = 0;
  size_t total = 0;
};
// `total_bytes` split as 1/4 weight tiles, 1/8 activations, the rest MoE; at least 16 MiB.
ScratchLayout scratch_layout(size_t total_bytes);

enum class MatmulPath {
  kCublasF32,    // f32 weights: cublasSgemm on f32 activations
  kCublasHalf,   // f16/bf16 weights: activations converted to the weights' type, cublasGemmEx, f32 out
  kGemv,         // block formats, few activation rows: the GEMV kernel reads blocks in place
  kDequantGemm,  // block formats, many rows: weight tiles dequantized to f16, cublasGemmEx
};
// One cuBLAS call (or GEMV pass): weight rows [row0, row0 + rows) x activation rows
// [m0, m0 + m).
struct MatmulTile {
  int64_t row0 = 0, rows = 0, m0 = 0, m = 0;
};
struct MatmulPlan {
  MatmulPath path = MatmulPath::kCublasF32;
  std::vector<MatmulTile> tiles;  // cover [0, rows) x [0, m) exactly once
};
// Throws kUnsupported for a type the CUDA matmul does not read, kResourceExhausted when one row
// of the weights or activations does not fit its scratch region. `rows_alone` (MatmulMode::kExact):
// every type through the GEMV kernel in one pass over all m rows, each row computed alone, so its
// result does not depend on the batch (no scratch needed).
MatmulPlan plan_matmul(DType type, int64_t rows, int64_t cols, int64_t m, const ScratchLayout& scratch,
                       bool rows_alone = false);

// A paged-attention batch as the kernel reads it. Each tile is up to kAttnTileRows (token, head)
// rows of one sequence sharing one kv head: in decode the heads of a kv group for one token, in
// prefill tokens x heads of the group. `meta` is one int32 upload:
//   tiles      [num_tiles x 6]: seq, first token, tokens, first head, heads, kv head
//   seq info   [num_seqs x 4]: token_start, num_tokens, context_len, offset of its block table
//   tables     the sequences' block tables, one after another
struct AttentionPlan {
  int64_t num_tiles = 0;
  int64_t num_seqs = 0;
  int64_t tiles_offset = 0, seqs_offset = 0, tables_offset = 0;  // in int32 elements of meta
  std::vector<int32_t> meta;
  int64_t key_tile = 0;     // keys staged in shared memory at a time
  size_t smem_bytes = 0;    // dynamic shared memory of one block
};
// Validates the batch (token ranges, block tables long enough, heads and dtype shape) and
// throws kInvalidArgument / kUnsupported naming what is wrong. A sequence of one token and context
// 0 is a padding row of a decode step padded for a graph: it attends to nothing and is written as
// zeros. `for_graph`: the layout of a captured decode step, which must not change with the
// contexts: each sequence's table padded to graph_table_stride (graph_plan.h) of the longest.
AttentionPlan plan_attention(const PagedAttentionBatch& batch, const Backend::AttentionShape& shape,
                             bool for_graph = false);

// MoE: the tokens of one grouped pass, so that its per-pick rows (gate, up: ff floats; down:
// hidden floats; and the pick indices) fit the MoE scratch. Throws kResourceExhausted when one
// token does not fit.
struct MoeLayout {
  int64_t tokens_per_chunk = 0;
  // Offsets within the MoE region, bytes, for a chunk of tokens_per_chunk tokens.
  size_t offsets_off = 0, picks_off = 0, pos_off = 0, gate_off = 0, up_off = 0, down_off = 0, total = 0;
};
MoeLayout plan_moe(int64_t n, int64_t k, int64_t num_experts, int64_t ff, int64_t hidden, size_t moe_bytes);

// A ring over a staging area (pinned host memory mirrored on the device): reserve() hands out
// aligned ranges in order; when a request does not fit before the end it starts again at 0 and
// says so (wrapped), and the caller must then wait until everything staged before has been
// consumed (the device's stream synchronised) before writing.
class StagingRing {
 public:
  explicit StagingRing(size_t capacity, size_t align = 256) : capacity_(capacity), align_(align) {}
  struct Range {
    size_t offset = 0;
    bool wrapped = false;
  };
  // Throws kResourceExhausted when `bytes` exceeds the capacity.
  Range reserve(size_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_, align_, head_ = 0;
};

}  // namespace duet::cuda
