// Paged attention on the CPU (Backend::paged_attention), tiled so that long contexts stay
// compute-bound and one long sequence still uses every thread.
//
// What every query row computes, whatever the batch, the chunking of its prompt or the thread
// count (so a token's attention is the same bits alone, in a batch, in one prefill or in
// chunks): its keys in chunks of kChunk positions (from position 0); per chunk the scores
// (scale * q.k, one fixed order per dot), their maximum m, p = exp(s - m), l = sum p and
// o = sum p v (one FMA chain per element in key order); chunks merged in order into segments of
// kSegmentChunks chunks, and segments merged in order into the row's result, each merge
// M' = max(M, m), O' = O exp(M - M') + o exp(m - M') (and L likewise); out = O / L. Cache rows
// are converted to f32 first (exactly, for f32, f16 and q8_0 caches).
//
// Work: a tile is rows of one sequence that share keys: several tokens of the heads of one kv
// head (prefill: each key converted and read once for up to kTileRows rows), or the heads of one
// token (decode: each key row read as one run; cut into several tiles by heads when there would be
// fewer tasks than threads and the call is worth it). With enough tiles for
// every thread, a thread takes whole tiles (largest first) and merges as it goes; otherwise
// (decode, few sequences) the segments of each tile are spread over the threads (or its chunks,
// when there are few segments), each writes its part's result, and a second pass merges them in
// order (flash-decoding), with the same arithmetic as the first way.
#pragma once

#include <cstdint>
#include <vector>

#include "duet/backend/backend.h"
#include "duet/backend/cpu/kernels.h"
#include "duet/core/memory.h"
#include "duet/core/thread_pool.h"

namespace duet::cpu {

class PagedAttention {
 public:
  static constexpr int64_t kChunk = 128;
  static constexpr int64_t kSegmentChunks = 4;
  // Cache rows converted at a time (their keys of every kv head of the tile stay in L2).
  static constexpr int64_t kSub = 16;

  // Backend::paged_attention; throws kInvalidArgument for a q8_0 shape that is not whole blocks.
  void run(ThreadPool& pool, const Kernels& k, const float* q, const void* k_cache, const void* v_cache, float* out,
           const PagedAttentionBatch& batch, const Backend::AttentionShape& shape, float scale);

 private:
  struct Tile {
    int32_t seq;
    int32_t token;   // first token (batch index)
    int32_t tokens;
    int32_t head;    // first query head
    int32_t heads;   // per token
    int64_t max_len; // keys of the last row
    int64_t cost;
  };
  struct Task {
    int32_t tile;
    int32_t part;  // a segment, or a chunk when by_chunks_; -1: the whole tile
  };
  // Rows [r0, r1) of a split tile, their parts to merge.
  struct Merge {
    size_t tile;
    int64_t r0, r1;
  };
  // Rows of 576 or 128 floats start on a cache line: no 512-bit load of them spans two.
  using Floats = LineVector<float>;
  // One thread's buffers, sized before each run.
  struct Scratch {
    Floats q, keys, values, scores, chunk_out, seg_out, total_out;
    std::vector<float> chunk_m, chunk_l, seg_m, seg_l, total_m, total_l;
  };
  struct Context;

  // Tiles of the batch's rows; the heads of a decoding token in `decode_parts` tiles (or as many as
  // it has heads, if fewer), each of at most tile_rows heads.
  void make_tiles(const PagedAttentionBatch& batch, const Backend::AttentionShape& shape, int64_t tile_rows,
                  int64_t decode_parts);
  // Part `part` of the tile (a segment, or a chunk when by_chunks; -1: the whole tile, merged in
  // s.total_*), into its place in `partial`.
  void run_tile(const Context& c, const Tile& t, int32_t part, bool by_chunks, Scratch& s, float* partial) const;
  // out for rows [r0, r1) of the tile: total / l.
  void finish_tile(const Context& c, const Tile& t, int64_t r0, int64_t r1, const float* total, const float* l,
                   float* out) const;

  std::vector<Tile> tiles_;
  std::vector<Task> tasks_;
  std::vector<int64_t> partial_offset_;  // per tile, into partial_
  std::vector<float> partial_;           // split tiles: per part and row, dv values, m and l
  bool by_chunks_ = false;               // split tiles' parts are chunks (else segments)
  std::vector<Merge> merges_;
  std::vector<Scratch> scratch_;
};

// A KV cache row of `dtype` to f32 with `k`'s kernels (nullptr for f32, which is copied).
inline DequantizeRowFn kv_to_f32(const Kernels& k, KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32: return nullptr;
    case KvDtype::kF16: return k.dequantize_f16;
    case KvDtype::kQ8_0: return k.dequantize_q8_0;
    case KvDtype::kFp8: return k.dequantize_kv_fp8;
  }
  return nullptr;
}

}  // namespace duet::cpu
