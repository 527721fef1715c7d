#include "duet/backend/cuda/plan.h"

#include <algorithm>

#include "duet/backend/cuda/graph_plan.h"
#include "duet/core/error.h"

namespace duet::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Weight tiles of whole 64-row groups where possible (cuBLAS's tiles), never more than `rows`.
int64_t round_rows(int64_t fit, int64_t rows) {
  if (fit >= rows) return rows;
  return fit >= 64 ? fit / 64 * 64 : fit;
}

}  // namespace

bool quantized_weight_type(DType type) {
  switch (type) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ8_0:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kFP8_E4M3_B128: return true;
    default: return false;
  }
}

bool supported_weight_type(DType type) {
  return type == DType::kF32 || type == DType::kF16 || type == DType::kBF16 || quantized_weight_type(type);
}

ScratchLayout scratch_layout(size_t total_bytes) {
  total_bytes = std::max<size_t>(total_bytes, size_t{16} << 20) / kAlign * kAlign;
  ScratchLayout s;
  s.weight_tile_offset = 0;
  s.weight_tile_bytes = total_bytes / 4 / kAlign * kAlign;
  s.activation_offset = s.weight_tile_offset + s.weight_tile_bytes;
  s.activation_bytes = total_bytes / 8 / kAlign * kAlign;
  s.moe_offset = s.activation_offset + s.activation_bytes;
  s.moe_bytes = total_bytes - s.moe_offset;
  s.total = total_bytes;
  return s;
}

MatmulPlan plan_matmul(DType type, int64_t rows, int64_t cols, int64_t m, const ScratchLayout& scratch,
                       bool rows_alone) {
  if (!supported_weight_type(type)) {
    fail(ErrorCode::kUnsupported, "matmul with {} weights is not supported by the CUDA backend", dtype_name(type));
  }
  if (rows < 0 || cols <= 0 || m < 0) {
    fail(ErrorCode::kInvalidArgument, "matmul of {} x {} weights by {} rows", rows, cols, m);
  }
  MatmulPlan plan;
  if (rows == 0 || m == 0) return plan;
  const bool quantized = quantized_weight_type(type);
  if (rows_alone) {
    plan.path = MatmulPath::kGemv;
    plan.tiles.push_back({0, rows, 0, m});
    return plan;
  }
  if (quantized && m <= kGemvUpTo) {
    plan.path = MatmulPath::kGemv;
    for (int64_t m0 = 0; m0 < m; m0 += kGemvMaxRows) plan.tiles.push_back({0, rows, m0, std::min(kGemvMaxRows, m - m0)});
    return plan;
  }
  int64_t tile_rows = rows, tile_m = m;
  const auto half_row = static_cast<size_t>(cols) * 2;
  if (type == DType::kF32) {
    plan.path = MatmulPath::kCublasF32;
  } else {
    plan.path = quantized ? MatmulPath::kDequantGemm : MatmulPath::kCublasHalf;
    if (half_row > scratch.activation_bytes || (quantized && half_row > scratch.weight_tile_bytes)) {
      fail(ErrorCode::kResourceExhausted,
           "a row of {} elements ({} bytes as f16) does not fit the CUDA scratch ({} bytes for activations, {} for "
           "weight tiles)", cols, half_row, scratch.activation_bytes, scratch.weight_tile_bytes);
    }
    tile_m = std::min<int64_t>(m, static_cast<int64_t>(scratch.activation_bytes / half_row));
    if (quantized) tile_rows = round_rows(static_cast<int64_t>(scratch.weight_tile_bytes / half_row), rows);
  }
  // Weight tiles outside, activation tiles inside: each weight tile is dequantized once.
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    for (int64_t m0 = 0; m0 < m; m0 += tile_m) {
      plan.tiles.push_back({r0, std::min(tile_rows, rows - r0), m0, std::min(tile_m, m - m0)});
    }
  }
  return plan;
}

AttentionPlan plan_attention(const PagedAttentionBatch& batch, const Backend::AttentionShape& shape,
                             bool for_graph) {
  const int64_t H = shape.num_heads, G = shape.num_kv_heads, dk = shape.head_dim_k, dv = shape.head_dim_v;
  if (H <= 0 || G <= 0 || H % G != 0) {
    fail(ErrorCode::kInvalidArgument, "attention with {} heads over {} kv heads", H, G);
  }
  if (dk <= 0 || dk > kAttnMaxDk || dv < 0 || dv > kAttnMaxDv) {
    fail(ErrorCode::kUnsupported, "CUDA paged attention takes key heads of 1 to {} and value heads of 0 to {} "
         "elements, not {} and {}", kAttnMaxDk, kAttnMaxDv, dk, dv);
  }
  if (shape.dtype == KvDtype::kQ8_0) {
    for (int64_t v : {dk, dv, shape.k_stride, shape.v_stride}) {
      if (v % 32 != 0) {
        fail(ErrorCode::kInvalidArgument, "a q8_0 KV cache needs heads and rows in whole blocks of 32, not {}", v);
      }
    }
  }
  if (batch.block_size <= 0) fail(ErrorCode::kInvalidArgument, "KV block size {}", batch.block_size);
  const int64_t group = H / G;
  const int64_t head_tile = std::min(group, kAttnTileRows);
  const int64_t token_tile = std::max<int64_t>(1, kAttnTileRows / head_tile);
  AttentionPlan plan;
  std::vector<int32_t> tiles, seqs, tables;
  int64_t stride = 0;  // for_graph: every sequence's table padded to this
  if (for_graph) {
    int64_t most = 0;
    for (const PagedSequence& ps : batch.seqs) most = std::max<int64_t>(most, (ps.context_len + batch.block_size - 1) / batch.block_size);
    stride = graph_table_stride(most);
  }
  for (size_t si = 0; si < batch.seqs.size(); ++si) {
    const PagedSequence& ps = batch.seqs[si];
    const bool padding = ps.num_tokens == 1 && ps.context_len == 0;  // a graph step's padding row
    if (ps.num_tokens < 0 || ps.token_start < 0 || ps.token_start + ps.num_tokens > batch.num_tokens ||
        (ps.num_tokens > ps.context_len && !padding)) {
      fail(ErrorCode::kInvalidArgument, "sequence {} of the attention batch: tokens [{}, {}) of {}, context {}", si,
           ps.token_start, ps.token_start + ps.num_tokens, batch.num_tokens, ps.context_len);
    }
    const int64_t blocks_needed = (ps.context_len + batch.block_size - 1) / batch.block_size;
    if (ps.num_blocks < blocks_needed || (blocks_needed > 0 && ps.block_table == nullptr)) {
      fail(ErrorCode::kInvalidArgument, "sequence {} of the attention batch has {} blocks for {} tokens (needs {})", si,
           ps.num_blocks, ps.context_len, blocks_needed);
    }
    seqs.insert(seqs.end(), {ps.token_start, ps.num_tokens, ps.context_len, static_cast<int32_t>(tables.size())});
    if (blocks_needed > 0) tables.insert(tables.end(), ps.block_table, ps.block_table + blocks_needed);
    if (for_graph) tables.resize(static_cast<size_t>(static_cast<int64_t>(si + 1) * stride), 0);
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += head_tile) {
        const int64_t heads = std::min(head_tile, (g + 1) * group - h0);
        for (int64_t t0 = 0; t0 < ps.num_tokens; t0 += token_tile) {
          const int64_t nt = std::min(token_tile, ps.num_tokens - t0);
          tiles.insert(tiles.end(), {static_cast<int32_t>(si), static_cast<int32_t>(ps.token_start + t0),
                                     static_cast<int32_t>(nt), static_cast<int32_t>(h0), static_cast<int32_t>(heads),
                                     static_cast<int32_t>(g)});
        }
      }
    }
  }
  plan.num_tiles = static_cast<int64_t>(tiles.size() / 6);
  plan.num_seqs = static_cast<int64_t>(batch.seqs.size());
  plan.tiles_offset = 0;
  plan.seqs_offset = static_cast<int64_t>(tiles.size());
  plan.tables_offset = plan.seqs_offset + static_cast<int64_t>(seqs.size());
  plan.meta = std::move(tiles);
  plan.meta.insert(plan.meta.end(), seqs.begin(), seqs.end());
  plan.meta.insert(plan.meta.end(), tables.begin(), tables.end());
  // Shared memory: the tile's queries, then a tile of keys and values, as f32.
  const size_t q_bytes = static_cast<size_t>(kAttnTileRows * dk) * sizeof(float);
  const size_t per_key = static_cast<size_t>(dk + dv) * sizeof(float);
  plan.key_tile = std::clamp<int64_t>(static_cast<int64_t>((kAttnSmemBytes - q_bytes) / per_key), 1, kAttnMaxKeyTile);
  plan.smem_bytes = q_bytes + static_cast<size_t>(plan.key_tile) * per_key;
  return plan;
}

MoeLayout plan_moe(int64_t n, int64_t k, int64_t num_experts, int64_t ff, int64_t hidden, size_t moe_bytes) {
  if (num_experts <= 0 || k <= 0 || ff <= 0 || hidden <= 0) {
    fail(ErrorCode::kInvalidArgument, "MoE of {} experts, {} used, ff {}, hidden {}", num_experts, k, ff, hidden);
  }
  const auto layout = [&](int64_t tokens) {
    MoeLayout l;
    l.tokens_per_chunk = tokens;
    const auto picks = static_cast<size_t>(tokens * k);
    size_t off = 0;
    l.offsets_off = off;
    off = align_up(off + static_cast<size_t>(num_experts + 1) * sizeof(int32_t));
    l.picks_off = off;
    off = align_up(off + picks * sizeof(int32_t));
    l.pos_off = off;
    off = align_up(off + picks * sizeof(int32_t));
    l.gate_off = off;
    off = align_up(off + picks * static_cast<size_t>(ff) * sizeof(float));
    l.up_off = off;
    off = align_up(off + picks * static_cast<size_t>(ff) * sizeof(float));
    l.down_off = off;
    off = align_up(off + picks * static_cast<size_t>(hidden) * sizeof(float));
    l.total = off;
    return l;
  };
  if (layout(1).total > moe_bytes) {
    fail(ErrorCode::kResourceExhausted, "one token of a MoE layer ({} experts of {} used, ff {}, hidden {}) needs {} "
         "bytes of CUDA scratch, {} are set aside", num_experts, k, ff, hidden, layout(1).total, moe_bytes);
  }
  // The largest chunk that fits, by bisection over the monotone size.
  int64_t lo = 1, hi = std::max<int64_t>(1, n);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (layout(mid).total <= moe_bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return layout(lo);
}

StagingRing::Range StagingRing::reserve(size_t bytes) {
  const size_t size = (std::max<size_t>(bytes, 1) + align_ - 1) / align_ * align_;
  if (size > capacity_) {
    fail(ErrorCode::kResourceExhausted, "{} bytes of metadata do not fit the {} byte CUDA staging ring", bytes,
         capacity_);
  }
  Range r;
  if (head_ + size > capacity_) {
    head_ = 0;
    r.wrapped = true;
  }
  r.offset = head_;
  head_ += size;
  return r;
}

}  // namespace duet::cuda
