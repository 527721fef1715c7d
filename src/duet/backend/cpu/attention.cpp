#include "duet/backend/cpu/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <new>

#include "duet/backend/cpu/packed.h"
#include "duet/core/error.h"
#include "duet/core/quant.h"

namespace duet::cpu {
namespace {

// Rows a tile takes at most; fewer for wide heads (MLA's 576 + 512), so that its queries, chunk
// of keys and three running outputs stay in a core's L2.
int64_t tile_rows_for(const Backend::AttentionShape& shape) { return shape.head_dim_k + shape.head_dim_v > 512 ? 32 : 64; }

// Multiply-adds of a call below which a decoding token's heads stay in one tile (run).
constexpr int64_t kMinCutWork = int64_t{1} << 20;

// Cache rows converted this far ahead of the one they are asked for (prefetch_row).
constexpr int64_t kRowsAhead = 4;

// Rows of converted keys and values lie this far apart: a cache row is often a multiple of
// 4 KiB (16 heads of 128 halves), and scratch rows a multiple of 4 KiB apart too would make every
// store alias the next row's loads (4K aliasing: ten times slower, measured).
int64_t padded(int64_t width) { return width + 16; }

// The largest of x[0 .. n) (n >= 1), as one chain of std::max from x[0] would find it, in eight
// independent chains: max is exact, so they find the same value, without one chain's wait on
// each comparison (that chain was 10% of a 4096-token prefill). A NaN counts only as x[0].
float row_max(const float* x, int64_t n) {
  float m[8];
  std::fill_n(m, 8, x[0]);
  int64_t j = 1;
  for (; j + 8 <= n; j += 8) {
    for (int i = 0; i < 8; ++i) m[i] = std::max(m[i], x[j + i]);
  }
  for (; j < n; ++j) m[0] = std::max(m[0], x[j]);
  float r = m[0];
  for (int i = 1; i < 8; ++i) r = std::max(r, m[i]);
  return r;
}

// Chunks of a row (or tile) of `len` keys.
int64_t chunks_of(int64_t len) { return (len + PagedAttention::kChunk - 1) / PagedAttention::kChunk; }

// One merge of a part (m, l, o) into a running result (M, L, O).
void merge(const Kernels& k, float& M, float& L, float* O, float m, float l, const float* o, int64_t dv) {
  const float top = std::max(M, m);
  const float a = std::exp(M - top), b = std::exp(m - top);
  L = std::fma(l, b, L * a);
  k.scale_add_f32(O, a, o, b, dv);
  M = top;
}

}  // namespace

// What every task of one call shares.
struct PagedAttention::Context {
  const Kernels& k;
  const float* q;
  const uint8_t* k_cache;
  const uint8_t* v_cache;
  const PagedAttentionBatch& batch;
  const Backend::AttentionShape& shape;
  float scale;
  int64_t group;            // query heads per kv head
  bool values_in_keys;      // MLA: the value is the first head_dim_v elements of the key row
  DequantizeRowFn convert;  // a cache row to f32 (nullptr: f32 already)
  size_t unit_bytes;        // bytes per `unit` elements of the cache
  int64_t unit;
  int64_t tile_rows;

  AttnCache type;           // the cache's element type for the kernels that read it in place
  size_t tail_bytes = 0;    // fp8: bytes per element after a row's last whole unit (halves)
  bool in_place = true;     // whether kernels read the cache as it is (fp8: always converted)

  // Bytes of the first n elements of a cache row.
  size_t offset(int64_t n) const {
    return static_cast<size_t>(n / unit) * unit_bytes + static_cast<size_t>(n % unit) * tail_bytes;
  }
  // Where element `first` of cache slot `slot` (rows `stride` elements apart) lies.
  const uint8_t* cache_row(const uint8_t* cache, int64_t slot, int64_t stride, int64_t first) const {
    return cache + static_cast<size_t>(slot) * offset(stride) + offset(first);
  }
  // Element `col` of a row at `base`: f32 scratch (convert) or the cache's own elements.
  const void* at(const void* base, bool converted, int64_t col) const {
    if (converted) return static_cast<const float*>(base) + col;
    return static_cast<const uint8_t*>(base) + static_cast<size_t>(col / unit) * unit_bytes;
  }
  // The cache lines of elements [first, first + n) of cache slot `slot`, asked for ahead of their
  // conversion: a decode step reads the keys from memory (the weights went through the caches
  // since the last step), a block of rows at a time, and converting them one row after another
  // left each row's wait for memory exposed.
  void prefetch_row(const uint8_t* cache, int64_t slot, int64_t stride, int64_t first, int64_t n) const {
    const uint8_t* begin = cache_row(cache, slot, stride, first);
    prefetch_lines(begin, 0, static_cast<size_t>(cache_row(cache, slot, stride, first + n) - begin));
  }
  // Elements [first, first + n) of cache slot `slot` (rows `stride` elements apart) as f32.
  void row_to_f32(const uint8_t* cache, int64_t slot, int64_t stride, int64_t first, int64_t n, float* dst) const {
    const uint8_t* src = cache_row(cache, slot, stride, first);
    if (convert == nullptr) {
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    } else {
      convert(src, dst, n);
    }
  }
};

void PagedAttention::make_tiles(const PagedAttentionBatch& batch, const Backend::AttentionShape& shape,
                                int64_t tile_rows, int64_t decode_parts) {
  const int64_t num_heads = shape.num_heads, group = num_heads / shape.num_kv_heads;
  tiles_.clear();
  auto add = [&](size_t si, int64_t t0, int64_t tokens, int64_t h0, int64_t heads) {
    const PagedSequence& ps = batch.seqs[si];
    const int64_t max_len = ps.context_len - ps.num_tokens + (t0 - ps.token_start) + tokens;
    tiles_.push_back(Tile{static_cast<int32_t>(si), static_cast<int32_t>(t0), static_cast<int32_t>(tokens),
                          static_cast<int32_t>(h0), static_cast<int32_t>(heads), max_len,
                          tokens * heads * max_len});
  };
  for (size_t si = 0; si < batch.seqs.size(); ++si) {
    const PagedSequence& ps = batch.seqs[si];
    if (ps.num_tokens == 1) {  // the heads of one token: each key row read as one run
      const int64_t step = std::max<int64_t>(1, (std::min(tile_rows, num_heads) + decode_parts - 1) / decode_parts);
      for (int64_t h0 = 0; h0 < num_heads; h0 += step) add(si, ps.token_start, 1, h0, std::min(step, num_heads - h0));
      continue;
    }
    // Several tokens of the heads of one kv head.
    const int64_t heads = std::min(group, tile_rows);
    const int64_t tokens = std::max<int64_t>(1, tile_rows / heads);
    for (int64_t g = 0; g < shape.num_kv_heads; ++g) {
      for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += heads) {
        for (int64_t t0 = 0; t0 < ps.num_tokens; t0 += tokens) {
          add(si, ps.token_start + t0, std::min<int64_t>(tokens, ps.num_tokens - t0), h0,
              std::min(heads, (g + 1) * group - h0));
        }
      }
    }
  }
}

void PagedAttention::run(ThreadPool& pool, const Kernels& k, const float* q, const void* k_cache, const void* v_cache,
                         float* out, const PagedAttentionBatch& batch, const Backend::AttentionShape& shape,
                         float scale) {
  if (shape.num_heads <= 0 || shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0) {
    fail(ErrorCode::kInvalidArgument, "attention has {} query heads for {} kv heads, expected a multiple",
         shape.num_heads, shape.num_kv_heads);
  }
  Context c{k, q, static_cast<const uint8_t*>(k_cache), static_cast<const uint8_t*>(v_cache), batch, shape, scale,
            shape.num_heads / shape.num_kv_heads, false, nullptr, sizeof(float), 1, tile_rows_for(shape), kAttnF32};
  c.values_in_keys = k_cache == v_cache && shape.k_stride == shape.v_stride && shape.num_kv_heads == 1 &&
                     shape.head_dim_v <= shape.head_dim_k;
  switch (shape.dtype) {
    case KvDtype::kF32: break;
    case KvDtype::kF16:
      c.convert = k.dequantize_f16;
      c.unit_bytes = sizeof(uint16_t);
      c.type = kAttnF16;
      break;
    case KvDtype::kQ8_0:
      for (int64_t v : {shape.head_dim_k, shape.head_dim_v, shape.k_stride, shape.v_stride}) {
        if (v % kQK8_0 != 0) {
          fail(ErrorCode::kInvalidArgument, "a q8_0 KV cache needs heads and rows in whole blocks of 32, not {}", v);
        }
      }
      c.convert = k.dequantize_q8_0;
      c.unit_bytes = sizeof(BlockQ8_0);
      c.unit = kQK8_0;
      c.type = kAttnQ8_0;
      break;
    case KvDtype::kFp8:
      // A head converts from a block's start: heads of whole blocks, or the only head of a row
      // (whose values after its last block are the row's halves).
      // (MLA's values are converted with their key row.)
      if (const auto fits = [&](int64_t d, int64_t stride) {
            return d % kQKFP8 == 0 || (shape.num_kv_heads == 1 && d == stride);
          };
          !fits(shape.head_dim_k, shape.k_stride) || (!c.values_in_keys && !fits(shape.head_dim_v, shape.v_stride))) {
        fail(ErrorCode::kInvalidArgument, "an fp8 KV cache needs heads of whole blocks of 128 or one head a row, "
             "not heads of {} and {} in rows of {} and {}", shape.head_dim_k, shape.head_dim_v, shape.k_stride,
             shape.v_stride);
      }
      c.convert = kv_to_f32(k, KvDtype::kFp8);
      c.unit_bytes = sizeof(BlockFP8);
      c.unit = kQKFP8;
      c.tail_bytes = sizeof(uint16_t);
      c.in_place = false;
      break;
  }
  const int nth = pool.num_threads();
  const int64_t dk = shape.head_dim_k, dv = shape.head_dim_v, seg_keys = kChunk * kSegmentChunks;
  make_tiles(batch, shape, c.tile_rows, 1);
  // Fewer tasks than threads even with every chunk on its own (decode of one or a few sequences
  // of about a chunk): the heads of each decoding token are cut into parts as well, each reading
  // the keys the whole tile would have read (its rows compute the same). Only when the work pays
  // for it: a few short MHA rows cost less than the threads' start.
  if (nth > 1) {
    int64_t tasks = 0, work = 0;
    for (const Tile& t : tiles_) {
      tasks += chunks_of(t.max_len);
      work += t.cost * (dk + dv);
    }
    if (tasks > 0 && tasks < nth && work >= kMinCutWork) make_tiles(batch, shape, c.tile_rows, (nth + tasks - 1) / tasks);
  }

  // Whole tiles when there are enough for every thread, else every segment on its own, or every
  // chunk when segments would leave the threads uneven (flash-decoding). A segment's chunks are
  // merged in order after, as its task would have merged them: the same bits. At 256-512 keys of
  // dsc-1.3b's shape (16 heads of 128: one segment), cutting the heads instead (each thread
  // reading half of every cache row) took 0.16-0.39 ms a call on two threads, the whole tile on
  // one 0.06-0.13, its chunks 0.03-0.10; 576 keys 0.14-0.21 ms in two segments (512 and 64 keys),
  // 0.12-0.13 in five chunks; but 1,024 and 2,048 keys (even segments) took 5-15% longer in
  // chunks, each chunk's part stored and merged after (attention_bench, Zen 5).
  tasks_.clear();
  partial_offset_.assign(tiles_.size(), -1);
  const bool split = static_cast<int64_t>(tiles_.size()) < 2 * static_cast<int64_t>(nth) && nth > 1;
  by_chunks_ = false;
  if (split) {
    // Keys of the busiest thread, with the tiles' parts handed out longest first to the least
    // busy thread, as the claims below go; chunks only when they are 10% ahead of segments.
    const auto busiest = [&](int64_t part_keys) {
      std::vector<int64_t> parts, load(static_cast<size_t>(nth), 0);
      for (const Tile& t : tiles_) {
        for (int64_t j = 0; j < t.max_len; j += part_keys) parts.push_back(std::min(part_keys, t.max_len - j) * t.heads);
      }
      std::sort(parts.begin(), parts.end(), std::greater<>());
      for (int64_t p : parts) *std::min_element(load.begin(), load.end()) += p;
      return *std::max_element(load.begin(), load.end());
    };
    by_chunks_ = 10 * busiest(kChunk) < 9 * busiest(seg_keys);
  }
  size_t partial_floats = 0;
  std::vector<size_t> order(tiles_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tiles_[a].cost > tiles_[b].cost; });
  for (size_t i : order) {
    const Tile& t = tiles_[i];
    const int64_t parts = by_chunks_ ? chunks_of(t.max_len) : (t.max_len + seg_keys - 1) / seg_keys;
    if (!split || parts == 1) {
      tasks_.push_back(Task{static_cast<int32_t>(i), -1});
      continue;
    }
    partial_offset_[i] = static_cast<int64_t>(partial_floats);
    partial_floats += static_cast<size_t>(parts * t.tokens * t.heads * (dv + 2));
    for (int64_t p = 0; p < parts; ++p) tasks_.push_back(Task{static_cast<int32_t>(i), static_cast<int32_t>(p)});
  }
  // Each thread's buffers, once for the widest tile, allocated here (not in the job): a failed
  // allocation is this op's Error.
  try {
    partial_.resize(partial_floats);
    int64_t rows = 0, width_k = 0, width_v = 0;
    for (const Tile& t : tiles_) {
      rows = std::max<int64_t>(rows, int64_t{t.tokens} * t.heads);
      const int64_t kv = (t.head + t.heads - 1) / c.group - t.head / c.group + 1;
      width_k = std::max(width_k, kv * dk);
      width_v = std::max(width_v, kv * dv);
    }
    scratch_.resize(static_cast<size_t>(nth));
    for (Scratch& s : scratch_) {
      s.q.resize(static_cast<size_t>(rows * dk));
      // MLA's converted key rows stay for the chunk's values (their first dv elements).
      s.keys.resize(static_cast<size_t>((c.values_in_keys ? kChunk : kSub) * padded(width_k)));
      s.values.resize(c.values_in_keys ? 0 : static_cast<size_t>(kSub * padded(width_v)));
      s.scores.resize(static_cast<size_t>(rows * kChunk));
      for (auto* v : {&s.chunk_out, &s.seg_out, &s.total_out}) v->resize(static_cast<size_t>(rows * dv));
      for (auto* v : {&s.chunk_m, &s.chunk_l, &s.seg_m, &s.seg_l, &s.total_m, &s.total_l}) v->resize(static_cast<size_t>(rows));
    }
  } catch (const std::bad_alloc&) {
    fail(ErrorCode::kResourceExhausted, "cannot allocate attention's scratch for {} tiles over {} threads",
         tiles_.size(), nth);
  }

  std::atomic<size_t> next{0};
  pool.run([&](int tid, int) {
    Scratch& s = scratch_[static_cast<size_t>(tid)];
    for (size_t i = next.fetch_add(1); i < tasks_.size(); i = next.fetch_add(1)) {
      const Task& task = tasks_[i];
      const Tile& t = tiles_[static_cast<size_t>(task.tile)];
      const int64_t offset = partial_offset_[static_cast<size_t>(task.tile)];
      run_tile(c, t, task.part, by_chunks_, s, task.part < 0 ? nullptr : partial_.data() + offset);
      if (task.part < 0) finish_tile(c, t, 0, int64_t{t.tokens} * t.heads, s.total_out.data(), s.total_l.data(), out);
    }
  });
  if (partial_.empty()) return;
  // Split tiles: each row's parts merged in order (chunks into their segment first), in runs of
  // rows spread over the threads (one decoding token's heads are one tile).
  merges_.clear();
  for (size_t i = 0; i < tiles_.size(); ++i) {
    if (partial_offset_[i] < 0) continue;
    const int64_t n_rows = int64_t{tiles_[i].tokens} * tiles_[i].heads, run = (n_rows + nth - 1) / nth;
    for (int64_t r0 = 0; r0 < n_rows; r0 += run) merges_.push_back(Merge{i, r0, std::min(n_rows, r0 + run)});
  }
  const int64_t per_segment = by_chunks_ ? kSegmentChunks : 1;  // parts
  next = 0;
  pool.run([&](int tid, int) {
    Scratch& s = scratch_[static_cast<size_t>(tid)];
    for (size_t i = next.fetch_add(1); i < merges_.size(); i = next.fetch_add(1)) {
      const Merge& mg = merges_[i];
      const Tile& t = tiles_[mg.tile];
      const int64_t n_rows = int64_t{t.tokens} * t.heads;
      const float* part = partial_.data() + partial_offset_[mg.tile];
      const int64_t parts = by_chunks_ ? chunks_of(t.max_len) : (t.max_len + seg_keys - 1) / seg_keys;
      for (int64_t r = mg.r0; r < mg.r1; ++r) {
        float* seg = s.seg_out.data() + r * dv;
        float* total = s.total_out.data() + r * dv;
        for (int64_t pi = 0; pi < parts; ++pi) {
          const float* row = part + (pi * n_rows + r) * (dv + 2);
          const float m = row[dv], l = row[dv + 1];
          if (std::isnan(m)) break;  // the row ended before this part
          if (pi % per_segment == 0) {
            std::copy_n(row, dv, seg);
            s.seg_m[r] = m;
            s.seg_l[r] = l;
          } else {
            merge(k, s.seg_m[r], s.seg_l[r], seg, m, l, row, dv);
          }
          const bool last = pi + 1 == parts || pi % per_segment == per_segment - 1 ||
                            std::isnan(part[((pi + 1) * n_rows + r) * (dv + 2) + dv]);
          if (!last) continue;
          if (pi < per_segment) {
            std::copy_n(seg, dv, total);
            s.total_m[r] = s.seg_m[r];
            s.total_l[r] = s.seg_l[r];
          } else {
            merge(k, s.total_m[r], s.total_l[r], total, s.seg_m[r], s.seg_l[r], seg, dv);
          }
        }
      }
      finish_tile(c, t, mg.r0, mg.r1, s.total_out.data(), s.total_l.data(), out);
    }
  });
}

// Rows of a tile in the order (kv head, token, head): rows of one kv head are contiguous, and
// within them later tokens (more keys) come last.
namespace {
struct RowMap {
  int64_t n = 0;
  int64_t index[64];  // row of q and out
  int64_t len[64];
  int64_t kvh[64];
};

void map_rows(const PagedSequence& ps, int32_t token, int32_t tokens, int32_t head, int32_t heads, int64_t group,
              int64_t num_heads, RowMap& m) {
  const int64_t first_len = ps.context_len - ps.num_tokens + (token - ps.token_start) + 1;
  m.n = 0;
  const int64_t g0 = head / group, g1 = (head + heads - 1) / group;
  for (int64_t g = g0; g <= g1; ++g) {
    const int64_t h0 = std::max<int64_t>(head, g * group), h1 = std::min<int64_t>(head + heads, (g + 1) * group);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = h0; h < h1; ++h) {
        m.index[m.n] = (token + t) * num_heads + h;
        m.len[m.n] = first_len + t;
        m.kvh[m.n] = g;
        ++m.n;
      }
    }
  }
}

// Calls fn(first, end, kv head - the tile's first) for each kv head's rows that still have keys
// at position `from` (a suffix of them: later tokens have more keys).
template <typename Fn>
void for_runs(const RowMap& m, int64_t from, Fn&& fn) {
  for (int64_t r0 = 0; r0 < m.n;) {
    int64_t r1 = r0;
    while (r1 < m.n && m.kvh[r1] == m.kvh[r0]) ++r1;
    int64_t a = r0;
    while (a < r1 && m.len[a] <= from) ++a;
    if (a < r1) fn(a, r1, m.kvh[r0] - m.kvh[0]);
    r0 = r1;
  }
}
}  // namespace

void PagedAttention::run_tile(const Context& c, const Tile& t, int32_t part, bool by_chunks, Scratch& s,
                              float* partial) const {
  const Kernels& k = c.k;
  const Backend::AttentionShape& sh = c.shape;
  const PagedSequence& ps = c.batch.seqs[static_cast<size_t>(t.seq)];
  const int64_t dk = sh.head_dim_k, dv = sh.head_dim_v, bs = c.batch.block_size;
  RowMap m;
  map_rows(ps, t.token, t.tokens, t.head, t.heads, c.group, sh.num_heads, m);
  const int64_t g0 = m.kvh[0], kv = m.kvh[m.n - 1] - g0 + 1;
  const int64_t width_k = kv * dk, width_v = kv * dv;
  const int64_t ldk = padded(width_k), ldv = padded(c.values_in_keys ? width_k : width_v);
  // Converting the keys pays when several rows read each: prefill, grouped heads, MLA.
  int64_t most = 0;
  for (int64_t r0 = 0, r = 0; r <= m.n; ++r) {
    if (r == m.n || m.kvh[r] != m.kvh[r0]) {
      most = std::max(most, r - r0);
      r0 = r;
    }
  }
  const bool convert = most > 1 || !c.in_place;
  // One row per kv head, all with the same keys (decode): the heads kernels read each cache row
  // once for all of them.
  bool uniform = true;
  for (int64_t r = 1; r < m.n; ++r) uniform = uniform && m.len[r] == m.len[0];
  const bool by_rows = !convert && uniform && k.attn_scores_heads[c.type] != nullptr &&
                       k.attn_values_heads[c.type] != nullptr;
  auto slot_of = [&](int64_t pos) { return ps.slot(pos, bs); };
  for (int64_t r = 0; r < m.n; ++r) std::copy_n(c.q + m.index[r] * dk, dk, s.q.data() + r * dk);

  const int64_t segments = (t.max_len + kChunk * kSegmentChunks - 1) / (kChunk * kSegmentChunks);
  const int64_t part_seg = part < 0 ? -1 : (by_chunks ? part / kSegmentChunks : part);
  const int64_t seg_first = part < 0 ? 0 : part_seg, seg_last = part < 0 ? segments : part_seg + 1;
  for (int64_t seg = seg_first; seg < seg_last; ++seg) {
    // The segment's chunks, or the one chunk that is this task's part.
    int64_t chunk_begin = seg * kSegmentChunks, chunk_end = std::min((seg + 1) * kSegmentChunks, chunks_of(t.max_len));
    if (part >= 0 && by_chunks) chunk_begin = part, chunk_end = part + 1;
    for (int64_t ch = chunk_begin; ch < chunk_end; ++ch) {
      const int64_t j0 = ch * kChunk, nkeys = std::min(kChunk, t.max_len - j0);
      const bool first = ch == chunk_begin;
      float* target = first ? s.seg_out.data() : s.chunk_out.data();
      float* tm = first ? s.seg_m.data() : s.chunk_m.data();
      float* tl = first ? s.seg_l.data() : s.chunk_l.data();
      // Scores, up to kSub keys at a time: their rows converted to f32 once for every row of the
      // tile, or read in place (in runs of one block) when each kv head has one row.
      auto sub_len = [&](int64_t sb) {
        const int64_t n = std::min(kSub, nkeys - sb);
        return convert ? n : std::min(n, bs - (j0 + sb) % bs);
      };
      for (int64_t sb = 0, nsub = 0; sb < nkeys; sb += nsub) {
        nsub = sub_len(sb);
        float* converted = s.keys.data() + (c.values_in_keys ? sb * ldk : 0);
        const void* keys = converted;
        int64_t ld = ldk, col = 0;
        if (convert) {
          for (int64_t j = 0; j < nsub; ++j) {
            if (const int64_t ahead = j0 + sb + j + kRowsAhead; ahead < t.max_len) {
              c.prefetch_row(c.k_cache, slot_of(ahead), sh.k_stride, g0 * dk, width_k);
            }
            c.row_to_f32(c.k_cache, slot_of(j0 + sb + j), sh.k_stride, g0 * dk, width_k, converted + j * ldk);
          }
        } else {
          keys = c.cache_row(c.k_cache, slot_of(j0 + sb), sh.k_stride, 0);
          ld = sh.k_stride;
          col = g0 * dk;
        }
        if (by_rows) {
          k.attn_scores_heads[c.type](s.q.data(), dk, m.n, c.at(keys, false, col), ld,
                                      std::min(nsub, m.len[0] - j0 - sb), dk, c.scale, s.scores.data() + sb, kChunk);
          continue;
        }
        for_runs(m, j0 + sb, [&](int64_t a, int64_t r1, int64_t g) {
          k.attn_scores[convert ? kAttnF32 : c.type](s.q.data() + a * dk, dk, r1 - a,
                                                      c.at(keys, convert, col + g * dk), ld,
                                                      std::min(nsub, m.len[r1 - 1] - j0 - sb), dk, c.scale,
                                                      s.scores.data() + a * kChunk + sb, kChunk);
        });
      }
      for (int64_t r = 0; r < m.n; ++r) {
        if (m.len[r] <= j0) continue;
        const int64_t nk = std::min(kChunk, m.len[r] - j0);
        float* sr = s.scores.data() + r * kChunk;
        const float mx = row_max(sr, nk);
        tm[r] = mx;
        tl[r] = k.exp_sum_f32(sr, nk, mx);
      }
      // Weighted values the same way: each element's chain continues over the parts. MLA's
      // converted rows of the whole chunk are still in s.keys, so its values take the chunk in one
      // part (the same chains, kept in registers instead of stored and reloaded every kSub keys).
      const bool whole_chunk = convert && c.values_in_keys;
      const uint8_t* v_cache = c.values_in_keys ? c.k_cache : c.v_cache;
      const int64_t v_stride = c.values_in_keys ? sh.k_stride : sh.v_stride;
      const int64_t v_first = c.values_in_keys ? g0 * dk : g0 * dv;
      const int64_t v_width = c.values_in_keys ? width_k : width_v;
      for (int64_t sb = 0, nsub = 0; sb < nkeys; sb += nsub) {
        nsub = whole_chunk ? nkeys : sub_len(sb);
        const void* vals = s.values.data();
        int64_t ld = ldv, col = 0;
        if (whole_chunk) {
          vals = s.keys.data() + sb * ldk;  // converted for the scores
        } else if (convert) {
          for (int64_t j = 0; j < nsub; ++j) {
            c.row_to_f32(v_cache, slot_of(j0 + sb + j), v_stride, v_first, v_width, s.values.data() + j * ldv);
          }
        } else {
          vals = c.cache_row(v_cache, slot_of(j0 + sb), v_stride, 0);
          ld = v_stride;
          col = v_first;
        }
        if (by_rows) {
          k.attn_values_heads[c.type](s.scores.data() + sb, kChunk, m.n, c.at(vals, false, col), ld,
                                      std::min(nsub, m.len[0] - j0 - sb), dv, target, dv, sb > 0);
          continue;
        }
        for_runs(m, j0 + sb, [&](int64_t a, int64_t r1, int64_t g) {
          for (int64_t b = a; b < r1;) {  // rows with the same number of keys here together
            const int64_t nk = std::min(nsub, m.len[b] - j0 - sb);
            int64_t e = b + 1;
            while (e < r1 && std::min(nsub, m.len[e] - j0 - sb) == nk) ++e;
            k.attn_values[convert ? kAttnF32 : c.type](s.scores.data() + b * kChunk + sb, kChunk, e - b,
                                                       c.at(vals, convert, col + g * dv), ld, nk, dv,
                                                       target + b * dv, dv, sb > 0);
            b = e;
          }
        });
      }
      if (!first) {
        for (int64_t r = 0; r < m.n; ++r) {
          if (m.len[r] <= j0) continue;
          merge(k, s.seg_m[r], s.seg_l[r], s.seg_out.data() + r * dv, s.chunk_m[r], s.chunk_l[r],
                s.chunk_out.data() + r * dv, dv);
        }
      }
    }
    const int64_t part_start = chunk_begin * kChunk;
    if (partial != nullptr) {  // this part (segment or chunk), for the merge pass
      float* out_part = partial + part * m.n * (dv + 2);
      for (int64_t r = 0; r < m.n; ++r) {
        float* row = out_part + r * (dv + 2);
        if (m.len[r] <= part_start) {
          row[dv] = NAN;
          continue;
        }
        std::copy_n(s.seg_out.data() + r * dv, dv, row);
        row[dv] = s.seg_m[r];
        row[dv + 1] = s.seg_l[r];
      }
      continue;
    }
    for (int64_t r = 0; r < m.n; ++r) {
      if (m.len[r] <= part_start) continue;
      if (seg == 0) {
        std::copy_n(s.seg_out.data() + r * dv, dv, s.total_out.data() + r * dv);
        s.total_m[r] = s.seg_m[r];
        s.total_l[r] = s.seg_l[r];
      } else {
        merge(k, s.total_m[r], s.total_l[r], s.total_out.data() + r * dv, s.seg_m[r], s.seg_l[r],
              s.seg_out.data() + r * dv, dv);
      }
    }
  }
}

void PagedAttention::finish_tile(const Context& c, const Tile& t, int64_t r0, int64_t r1, const float* total,
                                 const float* l, float* out) const {
  const PagedSequence& ps = c.batch.seqs[static_cast<size_t>(t.seq)];
  const int64_t dv = c.shape.head_dim_v;
  RowMap m;
  map_rows(ps, t.token, t.tokens, t.head, t.heads, c.group, c.shape.num_heads, m);
  for (int64_t r = r0; r < r1; ++r) {
    const float inv = 1.0f / l[r];
    float* dst = out + m.index[r] * dv;
    const float* src = total + r * dv;
    for (int64_t i = 0; i < dv; ++i) dst[i] = src[i] * inv;
  }
}

}  // namespace duet::cpu
