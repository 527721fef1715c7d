// The CPU backend: ops split across one persistent thread pool, kernels from the table chosen
// once for this machine's instruction set.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "duet/backend/backend.h"
#include "duet/backend/cpu/attention.h"
#include "duet/backend/cpu/kernels.h"
#include "duet/backend/cpu/packed.h"
#include "duet/backend/moe.h"
#include "duet/core/convert.h"
#include "duet/core/env.h"
#include "duet/core/error.h"
#include "duet/core/memory.h"
#include "duet/core/numa.h"
#include "duet/core/quant.h"
#include "duet/core/thread_pool.h"

namespace duet {
namespace {

// Weight rows converted to f32 at a time by one thread: enough to amortize the conversion over
// every activation row of the step while staying in L2.
constexpr int64_t kRowTile = 16;
// Integer path: weight rows per task, and activation rows per call of the plain (unpacked)
// kernel; a packed kernel's call takes the kernel table's packed_act_rows.
constexpr int64_t kQRowTile = 64;
constexpr int64_t kPlainActTile = 32;
// FP8 weights: up to this many activation rows, the rows are multiplied in place (decoded as they
// are read); more rows share each tile of weight rows converted to f32. Both give the same bits.
constexpr int64_t kFp8InPlaceRows = 4;
constexpr int64_t kFp8RowTile = 16;
// matmul_heads_t over Q8_0 rows: up to this many activation rows, the rows are read in place by
// the values kernel; more rows share each tile of rows converted to f32. Both give the same bits.
constexpr int64_t kHeadsTInPlaceRows = 4;
// matmul_heads runs every head in one op up to this many activation rows.
constexpr int64_t kHeadsFusedRows = 16;
// Elementwise ops smaller than this run on the calling thread.
constexpr int64_t kMinParallelElements = 1 << 14;
// Rows of `cols` elements per task of a row-wise op (quantizing activations, a norm): at least 4,
// and enough that a decode step's few rows run on the calling thread rather than in a dispatch
// that costs more than they do.
constexpr int64_t rows_grain(int64_t cols) { return std::max<int64_t>(4, kMinParallelElements / std::max<int64_t>(1, cols)); }

// Packed copies of prepared weight matrices (packed.h), found by the original's address: a view
// of a whole prepared matrix, or of any row range of one (an expert of stacked experts, a head's
// rows), is served from the packed copy, so a prepared matrix's original is never read again.
class PackedStore {
 public:
  // The packed group holding a view's first row, and how many rows of that group come before it
  // (0 when the view starts on a 16-row boundary).
  struct Slice {
    const uint8_t* group = nullptr;
    int64_t lead = 0;
    DType type = DType::kF32;  // the packed copy's type (Q8_0 for a re-quantized float matrix)
  };
  Slice find(const WeightView& w) const {
    const auto* p = static_cast<const uint8_t*>(w.data);
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.upper_bound(p);
    if (it == entries_.begin()) return {};
    --it;
    const Entry& e = it->second;
    if (e.type != w.type || e.cols != w.cols) return {};
    const size_t row_bytes = row_size(e.type, e.cols);
    const size_t offset = static_cast<size_t>(p - it->first);
    if (offset % row_bytes != 0) return {};
    const auto row = static_cast<int64_t>(offset / row_bytes);
    if (row + w.rows > e.rows) return {};
    const size_t group_bytes = cpu::packed_bytes(e.packed_type, cpu::kPackRows, e.cols / cpu::kQK8A);
    return {e.packed + static_cast<size_t>(row / cpu::kPackRows) * group_bytes, row % cpu::kPackRows, e.packed_type};
  }
  // Counts one more holder of an already packed matrix; false when it has no packed copy.
  bool retain(const WeightView& w) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(static_cast<const uint8_t*>(w.data));
    if (it == entries_.end() || it->second.type != w.type || it->second.rows != w.rows || it->second.cols != w.cols) {
      return false;
    }
    ++it->second.holders;
    return true;
  }
  // `packed` (of `packed_type`: w.type, or Q8_0 for a float matrix re-quantized) lies in
  // `arena`, which lives as long as any matrix packed into it.
  void add(const WeightView& w, DType packed_type, const uint8_t* packed, std::shared_ptr<const AnonymousMemory> arena) {
    const std::lock_guard<std::mutex> lock(mutex_);
    entries_.emplace(static_cast<const uint8_t*>(w.data),
                     Entry{w.type, packed_type, w.rows, w.cols, 1, packed, std::move(arena)});
    if (packed_type != w.type) ++num_requantized_;
  }
  // Whether any float matrix was re-quantized (matmul then looks float views up too).
  bool any_requantized() const { return num_requantized_.load(std::memory_order_relaxed) > 0; }
  void release(const uint8_t* begin) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(begin);
    if (it != entries_.end() && --it->second.holders == 0) {
      if (it->second.packed_type != it->second.type) --num_requantized_;
      entries_.erase(it);
    }
  }

 private:
  struct Entry {
    DType type;         // the original's
    DType packed_type;  // the packed copy's
    int64_t rows;
    int64_t cols;
    int holders;
    const uint8_t* packed;
    std::shared_ptr<const AnonymousMemory> arena;
  };
  mutable std::mutex mutex_;
  std::map<const uint8_t*, Entry> entries_;
  std::atomic<int> num_requantized_{0};
};

bool is_float_type(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// What prepare_weights returns: the packed copies live while it does.
class PreparedPacked final : public PreparedWeights {
 public:
  explicit PreparedPacked(std::shared_ptr<PackedStore> store) : store_(std::move(store)) {}
  ~PreparedPacked() override {
    for (const uint8_t* k : keys) store_->release(k);
  }
  std::vector<const uint8_t*> keys;

 private:
  std::shared_ptr<PackedStore> store_;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(int num_threads, MatmulMode mode)
      : topology_(numa_topology()),
        memory_(memory_placement_for(numa_mode(), topology_)),
        pool_(num_threads, numa_thread_cpus(numa_mode(), topology_, resolve_threads(num_threads))),
        k_(cpu::kernels()),
        mode_(mode) {}
  explicit CpuBackend(const CpuBackendOptions& o)
      : topology_(numa_topology()),
        memory_(o.memory),
        pool_(static_cast<int>(std::max<size_t>(1, o.cpus.size())), o.cpus),
        k_(cpu::kernels()),
        mode_(o.mode),
        fused_moe_(o.fused_moe) {}

  std::string name() const override {
    return fmt::format("cpu ({}{})", cpu::isa_name(k_.isa), mode_ == MatmulMode::kExact ? ", exact matmul" : "");
  }
  int num_threads() const override { return pool_.num_threads(); }

  void matmul(const WeightView& w, const float* x, int64_t m, float* y) override {
    if (w.type == DType::kFP8_E4M3_B128 && mode_ == MatmulMode::kFast && m <= kFp8InPlaceRows &&
        w.cols % cpu::kFp8GemvStep == 0) {
      const size_t row_bytes = w.row_bytes();
      return pool_.parallel_for(w.rows, kFp8RowTile, [&](int64_t begin, int64_t end) {
        k_.gemv_fp8(w.row(begin), row_bytes, end - begin, x, m, w.cols, y + begin, w.rows);
      });
    }
    if (mode_ == MatmulMode::kFast && w.cols % cpu::kQK8A == 0) {
      // Prepared weights go through their packed copy (Q5_0 has only that integer path).
      const cpu::PackedGemmFn pgemm = cpu::packed_gemm_fn(k_, w.type);
      const PackedStore::Slice packed = pgemm != nullptr ? packed_->find(w) : PackedStore::Slice{};
      const cpu::QGemmFn qgemm = cpu::qgemm_fn(k_, w.type);
      if (packed.group != nullptr || qgemm != nullptr) return matmul_int8(w, qgemm, pgemm, packed, x, m, y);
      if (is_float_type(w.type) && packed_->any_requantized()) {
        // A float matrix re-quantized to Q8_0 as it was prepared (memory degradation).
        const PackedStore::Slice q = packed_->find(w);
        if (q.group != nullptr) {
          WeightView as_packed = w;
          as_packed.type = q.type;
          return matmul_int8(as_packed, nullptr, cpu::packed_gemm_fn(k_, q.type), q, x, m, y);
        }
      }
    }
    const cpu::DequantizeRowFn deq = w.type == DType::kF32 ? nullptr : cpu::dequantize_fn(k_, w.type);
    if (w.type != DType::kF32 && deq == nullptr) {
      fail(ErrorCode::kUnsupported, "matmul with {} weights ('{}') is not supported on the CPU", dtype_name(w.type),
           w.name);
    }
    const int64_t k = w.cols;
    // Each thread's tile of weight rows converted to f32, allocated here (not in the jobs, where a
    // failed allocation could not become this call's error).
    float* tiles = nullptr;
    if (deq != nullptr) {
      tiles = scratch(f32_tiles_, checked_product({pool_.num_threads(), kRowTile, k}, w.name), w.name);
    }
    pool_.parallel_ranges(w.rows, kRowTile, [&](int tid, int64_t begin, int64_t end) {
      float* tile = tiles == nullptr ? nullptr : tiles + static_cast<size_t>(tid) * kRowTile * k;
      for (int64_t r0 = begin; r0 < end; r0 += kRowTile) {
        const int64_t nw = std::min(kRowTile, end - r0);
        k_.gemm_f32(f32_rows(w, deq, r0, nw, tile), nw, x, m, k, y + r0, w.rows);
      }
    });
  }

  // Rows [first, first + n) of w as f32: in place for f32 weights, else converted by `deq` into
  // `tile` (n rows of w.cols).
  static const float* f32_rows(const WeightView& w, cpu::DequantizeRowFn deq, int64_t first, int64_t n, float* tile) {
    if (deq == nullptr) return reinterpret_cast<const float*>(w.row(first));
    for (int64_t j = 0; j < n; ++j) deq(w.row(first + j), tile + j * w.cols, w.cols);
    return tile;
  }

  // Elements of scratch for a product of sizes; kResourceExhausted naming `what` when it
  // overflows.
  static size_t checked_product(std::initializer_list<int64_t> sizes, std::string_view what) {
    size_t total = 1;
    for (int64_t v : sizes) {
      if (v < 0 || (v > 0 && total > SIZE_MAX / 16 / static_cast<size_t>(v))) {
        fail(ErrorCode::kResourceExhausted, "the scratch for '{}' would be larger than memory can be", what);
      }
      total *= static_cast<size_t>(v);
    }
    return total;
  }

  // Grows `buffer` to `n` elements on the calling thread; a failed allocation is an Error of the
  // op (kResourceExhausted, naming `what`), and the buffer keeps what it had.
  template <typename T, typename A>
  static T* scratch(std::vector<T, A>& buffer, size_t n, std::string_view what) {
    if (buffer.size() < n) {
      try {
        buffer.resize(n);
      } catch (const std::exception&) {
        fail(ErrorCode::kResourceExhausted, "cannot allocate {} bytes of scratch for '{}'", n * sizeof(T), what);
      }
    }
    return buffer.data();
  }

  // x[m, cols] quantized to Q8A blocks in the activations' scratch, and with `halves` (packed
  // Q6_K) each block's two 16-value sums in theirs: once per matmul rather than per task.
  struct QuantizedRows {
    const cpu::BlockQ8A* act;
    const int32_t* half;  // null without `halves`
  };
  QuantizedRows quantize_rows(const float* x, int64_t m, int64_t cols, bool halves, std::string_view name) {
    const int64_t nb = cols / cpu::kQK8A;
    cpu::BlockQ8A* act = scratch(activations_, checked_product({m, nb}, name), name);
    int32_t* half = halves ? scratch(half_sums_, checked_product({2, m, nb}, name), name) : nullptr;
    pool_.parallel_for(m, rows_grain(cols), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        k_.quantize_q8a(x + i * cols, act + i * nb, cols);
        if (halves) cpu::half_sums(act + i * nb, nb, half + 2 * i * nb);
      }
    });
    return {act, half};
  }

  // Activations quantized to Q8A blocks once, then integer dot products with the weights in
  // place: weight rows split over the threads, activation rows in tiles that stay in cache.
  void matmul_int8(const WeightView& w, cpu::QGemmFn qgemm, cpu::PackedGemmFn pgemm, PackedStore::Slice packed,
                   const float* x, int64_t m, float* y) {
    const int64_t nb = w.cols / cpu::kQK8A;
    // A view starting inside a group computes the group's rows before it too, into scratch.
    float* covering =
        packed.lead > 0 ? scratch(packed_out_, checked_product({m, packed.lead + w.rows}, w.name), w.name) : nullptr;
    const QuantizedRows q = quantize_rows(x, m, w.cols, packed.group != nullptr && w.type == DType::kQ6_K, w.name);
    const cpu::BlockQ8A* act = q.act;
    const int32_t* half = q.half;
    if (packed.group != nullptr) {
      if (covering == nullptr) return matmul_packed(w.type, pgemm, packed.group, w.rows, nb, act, half, m, y);
      const int64_t rows = packed.lead + w.rows;
      matmul_packed(w.type, pgemm, packed.group, rows, nb, act, half, m, covering);
      for (int64_t i = 0; i < m; ++i) std::copy_n(covering + i * rows + packed.lead, w.rows, y + i * w.rows);
      return;
    }
    const size_t row_bytes = w.row_bytes();
    pool_.parallel_for(w.rows, kQRowTile, [&](int64_t begin, int64_t end) {
      for (int64_t r0 = begin; r0 < end; r0 += kQRowTile) {
        const int64_t nw = std::min(kQRowTile, end - r0);
        for (int64_t i0 = 0; i0 < m; i0 += kPlainActTile) {
          const int64_t mi = std::min(kPlainActTile, m - i0);
          qgemm(w.row(r0), row_bytes, nw, act + i0 * nb, mi, nb, y + i0 * w.rows + r0, w.rows);
        }
      }
    });
  }

  // Packed weights: y[m, rows] for `rows` rows from the start of the group at `packed`; each task
  // takes whole groups of 16 rows.
  void matmul_packed(DType type, cpu::PackedGemmFn pgemm, const uint8_t* packed, int64_t rows, int64_t nb,
                     const cpu::BlockQ8A* act, const int32_t* half, int64_t m, float* y) {
    const size_t group_bytes = cpu::packed_bytes(type, cpu::kPackRows, nb);
    const int64_t groups = (rows + cpu::kPackRows - 1) / cpu::kPackRows;
    pool_.parallel_for(groups, kQRowTile / cpu::kPackRows, [&](int64_t begin, int64_t end) {
      packed_groups(pgemm, packed, group_bytes, rows, nb, act, half, m, y, begin, end);
    });
  }

  // Groups [begin, end) of a packed matrix of `rows` rows (group_bytes each, from `packed`) into
  // their columns of y[m, rows], activation rows in tiles of `act_tile`: one task of matmul_packed.
  void packed_groups(cpu::PackedGemmFn pgemm, const uint8_t* packed, size_t group_bytes, int64_t rows, int64_t nb,
                     const cpu::BlockQ8A* act, const int32_t* half, int64_t m, float* y, int64_t begin,
                     int64_t end) const {
    const int64_t act_tile = k_.packed_act_rows;
    const int64_t r0 = begin * cpu::kPackRows;
    const int64_t nw = std::min(end * cpu::kPackRows, rows) - r0;
    for (int64_t i0 = 0; i0 < m; i0 += act_tile) {
      const int64_t mi = std::min(act_tile, m - i0);
      pgemm(packed + static_cast<size_t>(begin) * group_bytes, nw, act + i0 * nb,
            half != nullptr ? half + 2 * i0 * nb : nullptr, mi, nb, y + i0 * rows + r0, rows);
    }
  }

  // Packed matrices of one activation in one pass: x quantized once, then the 16-row groups of
  // every part claimed by the threads as one range, each task calling the same kernels on the
  // same groups as matmul would (tasks never cross a part, and a group's result does not depend
  // on the task it is in), so the bits of matmul part by part. Anything else (unpacked or FP8
  // weights, a view starting inside a group, the exact mode) goes part by part.
  void matmul_shared(std::span<const MatmulPart> parts, const float* x, int64_t m) override {
    check_shared_parts(parts);
    const auto by_part = [&] { Backend::matmul_shared(parts, x, m); };
    if (parts.size() < 2 || mode_ != MatmulMode::kFast || parts.front().w.cols % cpu::kQK8A != 0) return by_part();
    std::vector<SharedPart>& packed = shared_parts_;
    packed.clear();
    const int64_t nb = parts.front().w.cols / cpu::kQK8A;
    int64_t groups = 0;
    bool halves = false;
    for (const MatmulPart& p : parts) {
      const cpu::PackedGemmFn pgemm = cpu::packed_gemm_fn(k_, p.w.type);
      const PackedStore::Slice slice = pgemm != nullptr ? packed_->find(p.w) : PackedStore::Slice{};
      if (slice.group == nullptr || slice.lead != 0 || slice.type != p.w.type) return by_part();
      packed.push_back({pgemm, slice.group, cpu::packed_bytes(p.w.type, cpu::kPackRows, nb), groups});
      groups += (p.w.rows + cpu::kPackRows - 1) / cpu::kPackRows;
      halves = halves || p.w.type == DType::kQ6_K;
    }
    const QuantizedRows q = quantize_rows(x, m, parts.front().w.cols, halves, parts.front().w.name);
    const cpu::BlockQ8A* act = q.act;
    const int32_t* half = q.half;
    pool_.parallel_for(groups, kQRowTile / cpu::kPackRows, [&](int64_t begin, int64_t end) {
      for (size_t j = 0; j < parts.size() && begin < end; ++j) {
        const SharedPart& p = packed[j];
        const int64_t last = j + 1 < parts.size() ? packed[j + 1].first : groups;
        if (begin >= last) continue;
        const int64_t stop = std::min(end, last);
        const WeightView& w = parts[j].w;
        const int32_t* h = w.type == DType::kQ6_K ? half : nullptr;
        packed_groups(p.pgemm, p.group, p.group_bytes, w.rows, nb, act, h, m, parts[j].y, begin - p.first,
                      stop - p.first);
        begin = stop;
      }
    });
  }

  // Rows of a weight type the kernels decode (f32 as it is).
  bool has_matmul_heads_t(const WeightView& w) const override {
    return w.type == DType::kF32 || cpu::dequantize_fn(k_, w.type) != nullptr;
  }

  // The heads over the threads; each head's rows as f32 (f32_rows: in place for f32 weights, else
  // decoded once, kRowTile rows at a time, into the thread's buffer), then the attention values
  // kernel with the tokens' slices as its weights: each element one FMA chain over the rows in
  // order from 0, the same whichever tokens share the call (kernels.h). For up to
  // kHeadsTInPlaceRows tokens, Q8_0 rows (MLA's W_UK from a Q4_0, Q5_0 or Q8_0 kv_b: deepseek2.cpp)
  // go to the values kernel in place, as a q8_0 cache's rows, each element the f32 that decoding
  // gives: the same bits, no tile written and read back. More tokens take the decoded tile, which
  // converts each element once instead of once per tile of tokens (V2-Lite pp512 lost 3-6% in
  // place).
  void matmul_heads_t(const WeightView& w, const HeadRows& s, const float* x, int64_t x_stride, int64_t x_head,
                      int64_t m, float* y, int64_t y_stride, int64_t y_head) override {
    check_head_rows(w, s);
    if (!has_matmul_heads_t(w)) return Backend::matmul_heads_t(w, s, x, x_stride, x_head, m, y, y_stride, y_head);
    const int64_t n = w.cols;
    if (w.type == DType::kQ8_0 && m <= kHeadsTInPlaceRows) {
      pool_.parallel_ranges(s.heads, 1, [&](int, int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h) {
          const uint8_t* rows = w.row(s.first_row + h * s.row_step);
          k_.attn_values[cpu::kAttnQ8_0](x + h * x_head, x_stride, m, rows, n, s.rows, n, y + h * y_head, y_stride,
                                         false);
        }
      });
      return;
    }
    const cpu::DequantizeRowFn deq = w.type == DType::kF32 ? nullptr : cpu::dequantize_fn(k_, w.type);
    float* tiles = nullptr;  // allocated here, where a failed allocation is this call's error
    if (deq != nullptr) tiles = scratch(heads_t_, checked_product({pool_.num_threads(), kRowTile, n}, w.name), w.name);
    pool_.parallel_ranges(s.heads, 1, [&](int tid, int64_t h0, int64_t h1) {
      float* tile = tiles == nullptr ? nullptr : tiles + static_cast<size_t>(tid) * static_cast<size_t>(kRowTile * n);
      for (int64_t h = h0; h < h1; ++h) {
        // kRowTile rows at a time, decoded into a tile that stays in L1/L2, each element's chain
        // continued over the tiles (accumulate), so the bits of one pass over all the rows.
        for (int64_t r0 = 0; r0 < s.rows; r0 += kRowTile) {
          const int64_t nr = std::min(kRowTile, s.rows - r0);
          const float* wf = f32_rows(w, deq, s.first_row + h * s.row_step + r0, nr, tile);
          k_.attn_values[cpu::kAttnF32](x + h * x_head + r0, x_stride, m, wf, n, nr, n, y + h * y_head, y_stride,
                                        r0 > 0);
        }
      }
    });
  }

  // All heads in one op for a few activation rows (decode, and the rows of a small batch): each
  // head's slice of x is quantized (or copied) once, then one parallel pass over every head's
  // weight rows, with the same kernels, tiles and row groups as matmul on each head's rows, so the
  // same bits. Larger steps, FP8 weights and heads that do not start on a packed group run head by
  // head (Backend::matmul_heads), where each matmul is big enough to split well.
  void matmul_heads(const WeightView& w, const HeadRows& s, const float* x, int64_t x_stride, int64_t x_head,
                    int64_t m, float* y, int64_t y_stride, int64_t y_head, float* tmp) override {
    check_head_rows(w, s);
    const auto by_head = [&] { Backend::matmul_heads(w, s, x, x_stride, x_head, m, y, y_stride, y_head, tmp); };
    if (m > kHeadsFusedRows || s.heads <= 1 || w.type == DType::kFP8_E4M3_B128) return by_head();
    const int64_t k = w.cols;
    if (mode_ == MatmulMode::kFast && k % cpu::kQK8A == 0) {
      const cpu::PackedGemmFn pgemm = cpu::packed_gemm_fn(k_, w.type);
      const bool float_requantized = is_float_type(w.type) && packed_->any_requantized();
      // Each head's packed rows, when its matrix was prepared.
      std::vector<PackedStore::Slice>& groups = head_groups_;
      groups.assign(static_cast<size_t>(s.heads), PackedStore::Slice{});
      int64_t num_packed = 0;
      if (pgemm != nullptr || float_requantized) {
        for (int64_t h = 0; h < s.heads; ++h) {
          const PackedStore::Slice g = packed_->find(w.rows_from(s.first_row + h * s.row_step, s.rows));
          if (g.group == nullptr) break;
          if (g.lead != 0) return by_head();
          groups[static_cast<size_t>(h)] = g;
          ++num_packed;
        }
      }
      if (num_packed != 0 && num_packed != s.heads) return by_head();
      const cpu::QGemmFn qgemm = cpu::qgemm_fn(k_, w.type);
      if (num_packed == s.heads || qgemm != nullptr) {
        const DType type = num_packed != 0 ? groups[0].type : w.type;
        const cpu::PackedGemmFn packed_fn = num_packed != 0 ? cpu::packed_gemm_fn(k_, type) : nullptr;
        if (num_packed != 0 && packed_fn == nullptr) return by_head();
        const int64_t nb = k / cpu::kQK8A;
        cpu::BlockQ8A* act = scratch(activations_, checked_product({s.heads, m, nb}, w.name), w.name);
        const bool halves = packed_fn != nullptr && type == DType::kQ6_K;
        int32_t* half = halves ? scratch(half_sums_, checked_product({2, s.heads, m, nb}, w.name), w.name) : nullptr;
        pool_.parallel_for(s.heads * m, rows_grain(k), [&](int64_t begin, int64_t end) {
          for (int64_t j = begin; j < end; ++j) {  // j = h * m + i
            const int64_t h = j / m, i = j % m;
            k_.quantize_q8a(x + i * x_stride + h * x_head, act + j * nb, k);
            if (halves) cpu::half_sums(act + j * nb, nb, half + 2 * j * nb);
          }
        });
        // Tasks over (head, tile of rows): 16-row groups when packed, kQRowTile rows otherwise.
        const int64_t tile = packed_fn != nullptr ? cpu::kPackRows : kQRowTile;
        const int64_t per_head = (s.rows + tile - 1) / tile;
        const size_t group_bytes = packed_fn != nullptr ? cpu::packed_bytes(type, cpu::kPackRows, nb) : 0;
        const size_t row_bytes = w.row_bytes();
        const int64_t grain = packed_fn != nullptr ? kQRowTile / cpu::kPackRows : 1;
        pool_.parallel_for(s.heads * per_head, grain, [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end;) {
            const int64_t h = t / per_head, t0 = t % per_head;
            const int64_t t1 = std::min(per_head, t0 + (end - t));
            const cpu::BlockQ8A* a = act + h * m * nb;
            float* yh = y + h * y_head;
            if (packed_fn != nullptr) {
              const int64_t r0 = t0 * tile, nw = std::min(t1 * tile, s.rows) - r0;
              packed_fn(groups[static_cast<size_t>(h)].group + static_cast<size_t>(t0) * group_bytes, nw, a,
                        halves ? half + 2 * h * m * nb : nullptr, m, nb, yh + r0, y_stride);
            } else {
              for (int64_t u = t0; u < t1; ++u) {
                const int64_t r0 = u * tile, nw = std::min(tile, s.rows - r0);
                qgemm(w.row(s.first_row + h * s.row_step + r0), row_bytes, nw, a, m, nb, yh + r0, y_stride);
              }
            }
            t += t1 - t0;
          }
        });
        return;
      }
    }
    // f32 weights (MLA's absorbed W_UK), or converted to f32 a tile of rows at a time.
    const cpu::DequantizeRowFn deq = w.type == DType::kF32 ? nullptr : cpu::dequantize_fn(k_, w.type);
    if (w.type != DType::kF32 && deq == nullptr) return by_head();  // which fails as matmul does
    const float* in = x;  // head h's rows at in + h * in_head, k apart (one row: in place)
    int64_t in_head = x_head;
    if (m > 1) {
      float* rows = scratch(heads_in_, checked_product({s.heads, m, k}, w.name), w.name);
      for (int64_t h = 0; h < s.heads; ++h) {
        for (int64_t i = 0; i < m; ++i) std::copy_n(x + i * x_stride + h * x_head, k, rows + (h * m + i) * k);
      }
      in = rows;
      in_head = m * k;
    }
    float* tiles = deq == nullptr ? nullptr
                                  : scratch(f32_tiles_, checked_product({pool_.num_threads(), kRowTile, k}, w.name), w.name);
    const int64_t per_head = (s.rows + kRowTile - 1) / kRowTile;
    pool_.parallel_ranges(s.heads * per_head, 1, [&](int tid, int64_t begin, int64_t end) {
      float* mine = tiles == nullptr ? nullptr : tiles + static_cast<size_t>(tid) * kRowTile * k;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t h = t / per_head, r0 = t % per_head * kRowTile, nw = std::min(kRowTile, s.rows - r0);
        const float* wt = f32_rows(w, deq, s.first_row + h * s.row_step + r0, nw, mine);
        k_.gemm_f32(wt, nw, in + h * in_head, m, k, y + h * y_head + r0, y_stride);
      }
    });
  }

  bool packs(const WeightView& w) const override {
    if (mode_ != MatmulMode::kFast || w.cols % cpu::kQK8A != 0) return false;
    return (cpu::packable(w.type) && cpu::packed_gemm_fn(k_, w.type) != nullptr) || requantizes(w);
  }
  // Whether prepare_weights re-quantizes this matrix to Q8_0 (memory degradation).
  bool requantizes(const WeightView& w) const {
    return requantize_.load() && is_float_type(w.type) && w.cols % cpu::kQK8A == 0 &&
           cpu::packed_gemm_fn(k_, DType::kQ8_0) != nullptr;
  }
  bool can_requantize_weights() const override {
    return mode_ == MatmulMode::kFast && cpu::packed_gemm_fn(k_, DType::kQ8_0) != nullptr;
  }
  bool set_requantize_weights(bool on) override {
    requantize_.store(on && can_requantize_weights());
    return requantize_.load();
  }

  std::unique_ptr<PreparedWeights> prepare_weights(const std::vector<WeightView>& weights) override {
    if (mode_ != MatmulMode::kFast) return nullptr;
    auto handle = std::make_unique<PreparedPacked>(packed_);
    // Every new copy goes into one arena: whole huge pages, not a partial one per matrix.
    std::vector<std::pair<const WeightView*, size_t>> fresh;  // and its offset in the arena
    size_t total = 0;
    for (const WeightView& w : weights) {
      if (!packs(w)) continue;
      if (packed_->retain(w)) {
        handle->keys.push_back(static_cast<const uint8_t*>(w.data));
        continue;
      }
      bool seen = false;  // the same matrix twice in the list (a tied head)
      for (const auto& [v, off] : fresh) seen = seen || v->data == w.data;
      if (seen) continue;
      fresh.emplace_back(&w, total);
      total += (cpu::packed_bytes(packed_type(w), w.rows, w.cols / cpu::kQK8A) + 63) / 64 * 64;
    }
    if (fresh.empty()) return handle;
    auto arena = std::make_shared<AnonymousMemory>(total, /*huge_pages=*/true);
    place_memory(arena->data(), arena->size(), memory_, topology_);
    for (const auto& [wp, offset] : fresh) {
      const WeightView& w = *wp;
      const int64_t nb = w.cols / cpu::kQK8A;
      uint8_t* dst = static_cast<uint8_t*>(arena->data()) + offset;
      const int64_t groups = (w.rows + cpu::kPackRows - 1) / cpu::kPackRows;
      const DType type = packed_type(w);
      if (type == w.type) {
        pool_.parallel_for(groups, 16, [&](int64_t g0, int64_t g1) {
          cpu::pack_rows16(w.type, w.row(0), w.row_bytes(), w.rows, nb, dst, g0, g1);
        });
      } else {
        requantize_and_pack(w, dst);
      }
      release_pages(w.data, static_cast<size_t>(w.rows) * w.row_bytes());
      packed_->add(w, type, dst, arena);
      handle->keys.push_back(static_cast<const uint8_t*>(w.data));
    }
    return handle;
  }

  DType packed_type(const WeightView& w) const {
    return cpu::packable(w.type) && cpu::packed_gemm_fn(k_, w.type) != nullptr ? w.type : DType::kQ8_0;
  }

  // A float matrix as packed Q8_0: each group of 16 rows converted to f32, quantized to Q8_0
  // blocks by the scalar reference (the same bits on every ISA) and packed, through a scratch of
  // one group per thread (allocated here, before the jobs).
  void requantize_and_pack(const WeightView& w, uint8_t* dst) {
    const int64_t nb = w.cols / cpu::kQK8A;
    const size_t q_row = row_size(DType::kQ8_0, w.cols);
    const size_t per_thread = cpu::kPackRows * q_row + static_cast<size_t>(w.cols) * sizeof(float);
    std::vector<uint8_t> scratch(static_cast<size_t>(pool_.num_threads()) * per_thread + 64);
    const cpu::DequantizeRowFn deq = w.type == DType::kF32 ? nullptr : cpu::dequantize_fn(k_, w.type);
    const size_t group_bytes = cpu::packed_bytes(DType::kQ8_0, cpu::kPackRows, nb);
    const int64_t groups = (w.rows + cpu::kPackRows - 1) / cpu::kPackRows;
    pool_.parallel_ranges(groups, 1, [&](int tid, int64_t g0, int64_t g1) {
      uint8_t* mine = scratch.data() + static_cast<size_t>(tid) * per_thread;
      uint8_t* q = mine;
      auto* row = reinterpret_cast<float*>(mine + cpu::kPackRows * q_row);
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t rows = std::min<int64_t>(cpu::kPackRows, w.rows - g * cpu::kPackRows);
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* src = w.row(g * cpu::kPackRows + r);
          if (deq != nullptr) {
            deq(src, row, w.cols);
          } else {
            std::memcpy(row, src, static_cast<size_t>(w.cols) * sizeof(float));
          }
          quantize_row_q8_0_ref(row, reinterpret_cast<BlockQ8_0*>(q + static_cast<size_t>(r) * q_row), w.cols);
        }
        cpu::pack_rows16(DType::kQ8_0, q, q_row, rows, nb, dst + static_cast<size_t>(g) * group_bytes, 0, 1);
      }
    });
  }

  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* y) override {
    const cpu::DequantizeRowFn deq = w.type == DType::kF32 ? nullptr : cpu::dequantize_fn(k_, w.type);
    if (w.type != DType::kF32 && deq == nullptr) {
      fail(ErrorCode::kUnsupported, "reading rows of {} tensor '{}' is not supported", dtype_name(w.type), w.name);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= w.rows) {
        fail(ErrorCode::kInvalidArgument, "token id {} is out of range [0, {}) of '{}'", ids[i], w.rows, w.name);
      }
      float* out = y + i * w.cols;
      if (deq == nullptr) {
        std::copy_n(reinterpret_cast<const float*>(w.row(ids[i])), w.cols, out);
      } else {
        deq(w.row(ids[i]), out, w.cols);
      }
    }
  }

  void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t dim, float eps) override {
    pool_.parallel_for(rows, rows_grain(dim), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) k_.rms_norm_f32(x + r * dim, weight, y + r * dim, dim, eps);
    });
  }

  void rope(float* x, int64_t rows, int64_t num_heads, int64_t head_dim, const int32_t* positions,
            const RopeParams& p) override {
    const int64_t half = p.dim / 2;
    const float* tables = rope_table(rows, positions, p);
    pool_.parallel_for(rows, rows_grain(num_heads * p.dim), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* cs = tables + r * 2 * half;
        for (int64_t h = 0; h < num_heads; ++h) {
          float* v = x + (r * num_heads + h) * head_dim + p.offset;
          for (int64_t i = 0; i < half; ++i) {
            const int64_t a = p.mode == RopeMode::kNormal ? 2 * i : i;
            const int64_t b = p.mode == RopeMode::kNormal ? 2 * i + 1 : i + half;
            const float c = cs[2 * i], s = cs[2 * i + 1];
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
          }
        }
      }
    });
  }

  // Each row's cos and sin (times attn_factor) of every rotated pair, [rows][half][2]: kept for
  // the next call with the same positions and parameters (a step's queries and keys, and every
  // layer's, share them), which skips its sines, cosines and frequencies, 2 us of a decode step's
  // serial work per call.
  const float* rope_table(int64_t rows, const int32_t* positions, const RopeParams& p) {
    RopeTable& t = rope_table_;
    if (t.rows == rows && t.params == p && std::equal(positions, positions + rows, t.positions.data())) {
      return t.cs.data();
    }
    t.rows = -1;  // until complete
    const int64_t half = p.dim / 2;
    float* cs = scratch(t.cs, checked_product({rows, 2, half}, "rope"), "rope");
    std::copy_n(positions, rows, scratch(t.positions, static_cast<size_t>(rows), "rope"));
    const std::vector<double> freq = rope_frequencies(p);
    pool_.parallel_for(rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const double pos = static_cast<double>(positions[r]);
        float* row = cs + r * 2 * half;
        for (int64_t i = 0; i < half; ++i) {
          const double theta = pos * freq[static_cast<size_t>(i)];
          row[2 * i] = static_cast<float>(std::cos(theta) * p.attn_factor);
          row[2 * i + 1] = static_cast<float>(std::sin(theta) * p.attn_factor);
        }
      }
    });
    t.params = p;
    t.rows = rows;
    return cs;
  }

  void silu_mul(const float* gate, const float* up, float* y, int64_t n) override {
    pool_.parallel_for(n, kMinParallelElements, [&](int64_t begin, int64_t end) {
      k_.silu_mul_f32(gate + begin, up + begin, y + begin, end - begin);
    });
  }

  void add(float* y, const float* x, int64_t n) override {
    pool_.parallel_for(n, kMinParallelElements, [&](int64_t begin, int64_t end) {
      k_.axpy_f32(1.0f, x + begin, y + begin, end - begin);
    });
  }

  void store_kv(const float* rows, const int64_t* slots, int64_t n, int64_t row_dim, void* cache,
                KvDtype dtype) override {
    const size_t row_bytes = kv_row_bytes(dtype, row_dim);
    for (int64_t i = 0; i < n; ++i) {
      void* dst = static_cast<uint8_t*>(cache) + static_cast<size_t>(slots[i]) * row_bytes;
      if (dtype == KvDtype::kF16) {
        k_.f32_to_f16(rows + i * row_dim, static_cast<uint16_t*>(dst), row_dim);
      } else if (dtype == KvDtype::kQ8_0) {
        quantize_row_q8_0_ref(rows + i * row_dim, static_cast<BlockQ8_0*>(dst), row_dim);
      } else if (dtype == KvDtype::kFp8) {
        quantize_row_fp8_kv_ref(rows + i * row_dim, dst, row_dim);
      } else {
        std::copy_n(rows + i * row_dim, row_dim, static_cast<float*>(dst));
      }
    }
  }

  void load_kv(const void* cache, KvDtype dtype, const int64_t* slots, int64_t n, int64_t row_dim,
               float* rows) override {
    const size_t row_bytes = kv_row_bytes(dtype, row_dim);
    const cpu::DequantizeRowFn convert = cpu::kv_to_f32(k_, dtype);
    pool_.parallel_for(n, std::max<int64_t>(1, kMinParallelElements / row_dim), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const void* src = static_cast<const uint8_t*>(cache) + static_cast<size_t>(slots[i]) * row_bytes;
        if (convert != nullptr) {
          convert(src, rows + i * row_dim, row_dim);
        } else {
          std::copy_n(static_cast<const float*>(src), row_dim, rows + i * row_dim);
        }
      }
    });
  }

  // Fast mode only: exact mode promises a token the same bits however its prompt is chunked.
  bool expands_mla_prefill() const override { return mode_ == MatmulMode::kFast && expand_mla_; }

  void paged_attention(const float* q, const void* k_cache, const void* v_cache, float* out,
                       const PagedAttentionBatch& batch, const AttentionShape& shape, float scale) override {
    attention_.run(pool_, k_, q, k_cache, v_cache, out, batch, shape, scale);
  }

  void copy_blocks(void* cache, const std::vector<std::pair<int32_t, int32_t>>& copies,
                   int64_t block_bytes) override {
    auto* base = static_cast<uint8_t*>(cache);
    for (const auto& [src, dst] : copies) {
      std::memcpy(base + static_cast<int64_t>(dst) * block_bytes, base + static_cast<int64_t>(src) * block_bytes,
                  static_cast<size_t>(block_bytes));
    }
  }

  void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols) override {
    pool_.parallel_for(rows, std::max<int64_t>(1, kMinParallelElements / std::max<int64_t>(1, cols)),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t r = begin; r < end; ++r) std::copy_n(src + r * src_stride, cols, dst + r * dst_stride);
                       });
  }

  void index_fp8_round(float* x, int64_t rows, int64_t d) override {
    pool_.parallel_for(rows, std::max<int64_t>(1, kMinParallelElements / std::max<int64_t>(1, d) / 8),
                       [&](int64_t begin, int64_t end) { Backend::index_fp8_round(x + begin * d, end - begin, d); });
  }

  void index_topk(const float* q, const void* cache, KvDtype dtype, const int64_t* slots, int64_t C, const float* w,
                  int64_t m, int64_t heads, int64_t d, int64_t last0, int64_t K, int32_t* out) override {
    // The keys in groups of 16 (every element written by index_keys16: no zeroing first), each
    // group's cache rows converted as load_kv converts them and packed at once, the groups split
    // over the threads.
    const int64_t groups = (C + 15) / 16;
    const auto keys16 = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(groups * 16 * d));
    const size_t row_bytes = kv_row_bytes(dtype, d);
    const cpu::DequantizeRowFn convert = cpu::kv_to_f32(k_, dtype);
    pool_.parallel_for(groups, 8, [&](int64_t begin, int64_t end) {
      std::vector<float> rows(static_cast<size_t>(16 * d));
      for (int64_t g = begin; g < end; ++g) {
        const int64_t n = std::min<int64_t>(16, C - g * 16);
        for (int64_t j = 0; j < n; ++j) {
          const void* src = static_cast<const uint8_t*>(cache) + static_cast<size_t>(slots[g * 16 + j]) * row_bytes;
          if (convert != nullptr) {
            convert(src, rows.data() + j * d, d);
          } else {
            std::copy_n(static_cast<const float*>(src), d, rows.data() + j * d);
          }
        }
        cpu::index_keys16(rows.data(), n, d, keys16.get() + g * 16 * d);
      }
    });
    if (m >= pool_.num_threads()) {
      // A thread takes whole queries.
      pool_.parallel_for(m, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> total(static_cast<size_t>(C));
        std::vector<int32_t> order;
        for (int64_t j = begin; j < end; ++j) {
          const int64_t n = last0 + j + 1;
          k_.index_totals(q + j * heads * d, heads, d, keys16.get(), n, w + j * heads, total.data());
          index_topk_of_totals(total.data(), n, K, out + j * K, order);
        }
      });
      return;
    }
    // Fewer queries than threads (decode): each query's positions split, 256 keys a claim.
    std::vector<float> total(static_cast<size_t>(C));
    std::vector<int32_t> order;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t n = last0 + j + 1;
      pool_.parallel_for((n + 15) / 16, 16, [&](int64_t begin, int64_t end) {
        const int64_t s0 = begin * 16, s1 = std::min(n, end * 16);
        k_.index_totals(q + j * heads * d, heads, d, keys16.get() + s0 * d, s1 - s0, w + j * heads, total.data() + s0);
      });
      index_topk_of_totals(total.data(), n, K, out + j * K, order);
    }
  }

  void moe_route(const float* logits, int64_t n, const MoeRouting& r, int32_t* ids, float* weights) override {
    moe_route_ref(logits, n, r, ids, weights);
  }

  // Each expert runs once on the rows of the tokens that chose it (rows alone or together give
  // the same bits), and each token's sum takes its experts in increasing id.
  void moe_experts(const MoeExperts& w, const float* x, const int32_t* ids, const float* weights, int64_t n, int64_t k,
                   float* out) override {
    const int64_t d = w.gate.cols, ff = w.ff, E = w.num_experts;
    // Picks (token * k + i) grouped by expert, in pick order within an expert.
    // A negative id is a pick of an expert held elsewhere (expert parallelism): skipped.
    moe_count_.assign(static_cast<size_t>(E) + 1, 0);
    int64_t picks = 0;
    for (int64_t i = 0; i < n * k; ++i) {
      if (ids[i] >= E) fail(ErrorCode::kInvalidArgument, "expert id {} outside [0, {})", ids[i], E);
      if (ids[i] < 0) continue;
      ++moe_count_[static_cast<size_t>(ids[i]) + 1];
      ++picks;
    }
    for (int64_t e = 0; e < E; ++e) moe_count_[e + 1] += moe_count_[e];
    moe_picks_.resize(static_cast<size_t>(picks));
    moe_fill_.assign(moe_count_.begin(), moe_count_.end() - 1);
    for (int64_t i = 0; i < n * k; ++i) {
      if (ids[i] >= 0) moe_picks_[static_cast<size_t>(moe_fill_[ids[i]]++)] = i;
    }
    int64_t most = 0;
    for (int64_t e = 0; e < E; ++e) most = std::max(most, moe_count_[e + 1] - moe_count_[e]);
    if (moe_experts_fused(w, x, weights, k, picks, most, n, out)) return;
    moe_in_.resize(static_cast<size_t>(most * d));
    moe_out_.resize(static_cast<size_t>(most * d));
    moe_gate_.resize(static_cast<size_t>(most * ff));
    moe_up_.resize(static_cast<size_t>(most * ff));
    std::fill_n(out, n * d, 0.0f);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t first = moe_count_[e], m = moe_count_[e + 1] - first;
      if (m == 0) continue;
      const int64_t* picks = moe_picks_.data() + first;
      for (int64_t r = 0; r < m; ++r) std::copy_n(x + (picks[r] / k) * d, d, moe_in_.data() + r * d);
      matmul(w.gate.rows_from(e * ff, ff), moe_in_.data(), m, moe_gate_.data());
      matmul(w.up.rows_from(e * ff, ff), moe_in_.data(), m, moe_up_.data());
      silu_mul(moe_gate_.data(), moe_up_.data(), moe_gate_.data(), m * ff);
      matmul(w.down.rows_from(e * d, d), moe_gate_.data(), m, moe_out_.data());
      for (int64_t r = 0; r < m; ++r) {
        const float wt = weights[picks[r]];
        float* dst = out + (picks[r] / k) * d;
        const float* src = moe_out_.data() + r * d;
        for (int64_t j = 0; j < d; ++j) dst[j] += wt * src[j];
      }
    }
  }

 private:
  // A work item of the fused MoE: groups [g0, g1) of 16 rows of one expert's matrices.
  struct MoeItem {
    int64_t expert, g0, g1;
  };

  // moe_experts with packed weights, fused: the picks' rows quantized once; every used expert's
  // gate and up rows in one dispatch, items of 128 rows of one expert claimed by the threads in
  // runs as they go, SiLU applied to each item's rows as they are done; the SiLU rows quantized;
  // then one dispatch over 128-row slices of the output, each thread running every used expert's
  // down rows of its slice and adding them, weighted, into the tokens' sums in increasing expert
  // order. Three barriers for the layer instead of about five per used expert; the same kernels on
  // the same quantized rows, so the same bits as one expert after another. False (nothing done)
  // where it does not apply: exact mode, sizes off the 32-value blocks, an expert not packed or
  // not starting on a 16-row group.
  bool moe_experts_fused(const MoeExperts& w, const float* x, const float* weights, int64_t k, int64_t picks,
                         int64_t most, int64_t n, float* out) {
    const int64_t d = w.gate.cols, ff = w.ff, E = w.num_experts;
    if (!fused_moe_ || mode_ != MatmulMode::kFast || picks == 0 || d % cpu::kQK8A != 0 || ff % cpu::kQK8A != 0 ||
        w.down.cols != ff || w.up.cols != d) {
      return false;
    }
    // Each used expert's three packed slices; one type per matrix.
    moe_slices_.assign(static_cast<size_t>(3 * E), PackedStore::Slice{});
    const PackedStore::Slice* first_used = nullptr;
    for (int64_t e = 0; e < E; ++e) {
      if (moe_count_[e + 1] == moe_count_[e]) continue;
      const WeightView views[3] = {w.gate.rows_from(e * ff, ff), w.up.rows_from(e * ff, ff), w.down.rows_from(e * d, d)};
      for (int j = 0; j < 3; ++j) {
        const PackedStore::Slice s = packed_->find(views[j]);
        if (s.group == nullptr || s.lead != 0) return false;
        moe_slices_[static_cast<size_t>(3 * e + j)] = s;
      }
      if (first_used == nullptr) first_used = &moe_slices_[static_cast<size_t>(3 * e)];
    }
    const DType tg = first_used[0].type, tu = first_used[1].type, td = first_used[2].type;
    const cpu::PackedGemmFn pg = cpu::packed_gemm_fn(k_, tg), pu = cpu::packed_gemm_fn(k_, tu);
    const cpu::PackedGemmFn pd = cpu::packed_gemm_fn(k_, td);
    if (pg == nullptr || pu == nullptr || pd == nullptr) return false;
    const int64_t nbd = d / cpu::kQK8A, nbf = ff / cpu::kQK8A;
    const bool half_in = tg == DType::kQ6_K || tu == DType::kQ6_K, half_h = td == DType::kQ6_K;
    const size_t gbytes_g = cpu::packed_bytes(tg, cpu::kPackRows, nbd), gbytes_u = cpu::packed_bytes(tu, cpu::kPackRows, nbd);
    const size_t gbytes_d = cpu::packed_bytes(td, cpu::kPackRows, nbf);
    constexpr int64_t kItemGroups = 2 * kQRowTile / cpu::kPackRows;  // 128 rows an item
    const int64_t act_tile = k_.packed_act_rows;
    const int nth = pool_.num_threads();
    // Scratch, allocated here so that a failed allocation is this call's error.
    cpu::BlockQ8A* act = scratch(moe_act_, checked_product({picks, nbd}, "moe"), "moe");
    cpu::BlockQ8A* act_h = scratch(moe_act_h_, checked_product({picks, nbf}, "moe"), "moe");
    int32_t* halves = half_in ? scratch(moe_half_, checked_product({2, picks, nbd}, "moe"), "moe") : nullptr;
    int32_t* halves_h = half_h ? scratch(moe_half_h_, checked_product({2, picks, nbf}, "moe"), "moe") : nullptr;
    float* gate = scratch(moe_gate_, checked_product({picks, ff}, "moe"), "moe");
    float* up = scratch(moe_up_, checked_product({picks, ff}, "moe"), "moe");
    float* slice = scratch(moe_out_, checked_product({nth, most, kItemGroups * cpu::kPackRows}, "moe"), "moe");
    // Gate/up items, in expert order.
    const int64_t groups_f = ff / cpu::kPackRows;
    moe_items_.clear();
    for (int64_t e = 0; e < E; ++e) {
      if (moe_count_[e + 1] == moe_count_[e]) continue;
      for (int64_t g = 0; g < groups_f; g += kItemGroups) moe_items_.push_back({e, g, std::min(groups_f, g + kItemGroups)});
    }

    pool_.parallel_for(picks, rows_grain(d), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        k_.quantize_q8a(x + (moe_picks_[static_cast<size_t>(p)] / k) * d, act + p * nbd, d);
        if (half_in) cpu::half_sums(act + p * nbd, nbd, halves + 2 * p * nbd);
      }
    });
    // Runs of consecutive items claimed as the threads go (parallel_ranges: large runs first, so
    // each thread mostly reads one expert's rows in order, single items at the end). Shares fixed
    // beforehand by work left the faster thread waiting whenever the other was slowed (memory
    // shared with the host's other work, a core taken away): about a tenth of a V2-Lite decode
    // step's time on two threads went to such waits.
    pool_.parallel_ranges(static_cast<int64_t>(moe_items_.size()), 1, [&](int, int64_t i0_item, int64_t i1_item) {
      for (int64_t i = i0_item; i < i1_item; ++i) {
        const MoeItem& it = moe_items_[static_cast<size_t>(i)];
        const int64_t first = moe_count_[it.expert], m = moe_count_[it.expert + 1] - first;
        const int64_t r0 = it.g0 * cpu::kPackRows, nw = std::min(it.g1 * cpu::kPackRows, ff) - r0;
        const PackedStore::Slice* s = &moe_slices_[static_cast<size_t>(3 * it.expert)];
        for (int64_t i0 = 0; i0 < m; i0 += act_tile) {
          const int64_t mi = std::min(act_tile, m - i0), row = first + i0;
          const int32_t* h = half_in ? halves + 2 * row * nbd : nullptr;
          pg(s[0].group + static_cast<size_t>(it.g0) * gbytes_g, nw, act + row * nbd, tg == DType::kQ6_K ? h : nullptr,
             mi, nbd, gate + row * ff + r0, ff);
          pu(s[1].group + static_cast<size_t>(it.g0) * gbytes_u, nw, act + row * nbd, tu == DType::kQ6_K ? h : nullptr,
             mi, nbd, up + row * ff + r0, ff);
        }
        for (int64_t r = first; r < first + m; ++r) k_.silu_mul_f32(gate + r * ff + r0, up + r * ff + r0, gate + r * ff + r0, nw);
      }
    });
    pool_.parallel_for(picks, rows_grain(ff), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        k_.quantize_q8a(gate + p * ff, act_h + p * nbf, ff);
        if (half_h) cpu::half_sums(act_h + p * nbf, nbf, halves_h + 2 * p * nbf);
      }
    });
    std::fill_n(out, n * d, 0.0f);
    const int64_t groups_d = (d + cpu::kPackRows - 1) / cpu::kPackRows;
    pool_.parallel_ranges(groups_d, kItemGroups, [&](int tid, int64_t begin, int64_t end) {
      float* y = slice + static_cast<size_t>(tid) * most * kItemGroups * cpu::kPackRows;
      for (int64_t g0 = begin; g0 < end; g0 += kItemGroups) {
        const int64_t g1 = std::min(end, g0 + kItemGroups);
        const int64_t r0 = g0 * cpu::kPackRows, nw = std::min(g1 * cpu::kPackRows, d) - r0;
        for (int64_t e = 0; e < E; ++e) {
          const int64_t first = moe_count_[e], m = moe_count_[e + 1] - first;
          if (m == 0) continue;
          const uint8_t* group = moe_slices_[static_cast<size_t>(3 * e + 2)].group + static_cast<size_t>(g0) * gbytes_d;
          for (int64_t i0 = 0; i0 < m; i0 += act_tile) {
            const int64_t mi = std::min(act_tile, m - i0), row = first + i0;
            pd(group, nw, act_h + row * nbf, half_h ? halves_h + 2 * row * nbf : nullptr, mi, nbf, y + i0 * nw, nw);
          }
          for (int64_t r = 0; r < m; ++r) {
            const int64_t p = moe_picks_[static_cast<size_t>(first + r)];
            const float wt = weights[p];
            float* dst = out + (p / k) * d + r0;
            const float* src = y + r * nw;
            for (int64_t j = 0; j < nw; ++j) dst[j] += wt * src[j];
          }
        }
      }
    });
    return true;
  }

  static int resolve_threads(int n) {
    return n > 0 ? n : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }

  NumaTopology topology_;
  MemoryPlacement memory_;  // where packed weights go
  ThreadPool pool_;
  const cpu::Kernels& k_;
  MatmulMode mode_;
  bool fused_moe_ = true;
  // DUET_MLA_PREFILL, read when the backend is made so that a bad value stops the start.
  bool expand_mla_ = mla_prefill_may_expand();
  LineVector<float> heads_t_;  // matmul_heads_t: each thread's decoded rows of a head (kRowTile at a time)
  cpu::PagedAttention attention_;
  // Per-thread scratch, grown on the calling thread before a job is dispatched (ops run on one
  // thread at a time, the engine's).
  LineVector<float> f32_tiles_;   // matmul: weight rows converted to f32
  struct RopeTable {
    int64_t rows = -1;  // -1: nothing kept
    RopeParams params;
    std::vector<int32_t> positions;
    std::vector<float> cs;
  };
  RopeTable rope_table_;  // rope: the last call's cos and sin
  std::vector<cpu::BlockQ8A> activations_;  // quantized activations of the current matmul
  std::vector<int32_t> half_sums_;          // and their half sums, for packed Q6_K
  LineVector<float> packed_out_;            // a packed view's output with the rows of its group before it
  std::vector<PackedStore::Slice> head_groups_;  // matmul_heads: each head's packed rows
  LineVector<float> heads_in_;                   // and each head's activation rows, contiguous
  struct SharedPart {
    cpu::PackedGemmFn pgemm;
    const uint8_t* group;
    size_t group_bytes;
    int64_t first;  // the part's first group in the combined range
  };
  std::vector<SharedPart> shared_parts_;  // matmul_shared: each part's packed copy
  // moe_experts: picks per expert (prefix counts), the picks grouped by expert, and each expert's
  // gathered rows, gate, up and output.
  std::vector<int64_t> moe_count_, moe_fill_, moe_picks_;
  LineVector<float> moe_in_, moe_out_, moe_gate_, moe_up_;
  // and for the fused path: each used expert's packed slices, the gate/up items, the picks'
  // quantized rows (and half sums for Q6_K) in and after SiLU.
  std::vector<PackedStore::Slice> moe_slices_;
  std::vector<MoeItem> moe_items_;
  std::vector<cpu::BlockQ8A> moe_act_, moe_act_h_;
  std::vector<int32_t> moe_half_, moe_half_h_;
  std::shared_ptr<PackedStore> packed_ = std::make_shared<PackedStore>();
  std::atomic<bool> requantize_{false};  // prepare_weights re-quantizes float matrices to Q8_0
};

}  // namespace

bool mla_prefill_may_expand() {
  static const bool may = env_choice("DUET_MLA_PREFILL", {"auto", "absorbed"}) == 0;
  return may;
}

MatmulMode default_matmul_mode() {
  static const MatmulMode mode =
      env_choice("DUET_MATMUL", {"fast", "exact"}) == 0 ? MatmulMode::kFast : MatmulMode::kExact;
  return mode;
}

std::unique_ptr<Backend> make_cpu_backend(int num_threads, MatmulMode mode) {
  return std::make_unique<CpuBackend>(num_threads, mode);
}

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace duet
