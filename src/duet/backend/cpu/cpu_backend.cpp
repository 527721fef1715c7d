// The CPU backend: ops split across one persistent thread pool, kernels from the table chosen
// once for this machine's instruction set.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "duet/backend/backend.h"
#include "duet/backend/cpu/attention.h"
#include "duet/backend/cpu/kernels.h"
#include "duet/backend/cpu/packed.h"
#include "duet/core/error.h"
#include "duet/core/memory.h"
#include "duet/core/numa.h"
#include "duet/core/thread_pool.h"

namespace duet {
namespace {

// Weight rows converted to f32 at a time by one thread: enough to amortize the conversion over
// every activation row of the step while staying in L2.
constexpr int64_t kRowTile = 16;
// Integer path: weight rows per task, and activation rows per kernel call (their Q8A blocks
// stay in L2 while a tile of weights is read).
constexpr int64_t kQRowTile = 64;
constexpr int64_t kActTile = 32;
// Elementwise ops smaller than this run on the calling thread.
constexpr int64_t kMinParallelElements = 1 << 14;

// Packed copies of prepared weight matrices (packed.h), found by the original's address: a view
// of a whole prepared matrix, or of a row range of one that starts on a 16-row boundary (an
// expert of stacked experts, a head's rows), is served from the packed copy.
class PackedStore {
 public:
  const uint8_t* find(const WeightView& w) const {
    const auto* p = static_cast<const uint8_t*>(w.data);
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.upper_bound(p);
    if (it == entries_.begin()) return nullptr;
    --it;
    const Entry& e = it->second;
    if (e.type != w.type || e.cols != w.cols) return nullptr;
    const size_t row_bytes = row_size(e.type, e.cols);
    const size_t offset = static_cast<size_t>(p - it->first);
    if (offset % row_bytes != 0) return nullptr;
    const auto row = static_cast<int64_t>(offset / row_bytes);
    if (row % cpu::kPackRows != 0 || row + w.rows > e.rows) return nullptr;
    const size_t group_bytes = cpu::packed_bytes(e.type, cpu::kPackRows, e.cols / cpu::kQK8A);
    return e.packed + static_cast<size_t>(row / cpu::kPackRows) * group_bytes;
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
  // `packed` lies in `arena`, which lives as long as any matrix packed into it.
  void add(const WeightView& w, const uint8_t* packed, std::shared_ptr<const AnonymousMemory> arena) {
    const std::lock_guard<std::mutex> lock(mutex_);
    entries_.emplace(static_cast<const uint8_t*>(w.data), Entry{w.type, w.rows, w.cols, 1, packed, std::move(arena)});
  }
  void release(const uint8_t* begin) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(begin);
    if (it != entries_.end() && --it->second.holders == 0) entries_.erase(it);
  }

 private:
  struct Entry {
    DType type;
    int64_t rows;
    int64_t cols;
    int holders;
    const uint8_t* packed;
    std::shared_ptr<const AnonymousMemory> arena;
  };
  mutable std::mutex mutex_;
  std::map<const uint8_t*, Entry> entries_;
};

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
      : numa_(numa_mode()),
        topology_(numa_topology()),
        pool_(num_threads, numa_thread_cpus(numa_, topology_, resolve_threads(num_threads))),
        k_(cpu::kernels()),
        mode_(mode) {}

  std::string name() const override {
    return fmt::format("cpu ({}{})", cpu::isa_name(k_.isa), mode_ == MatmulMode::kExact ? ", exact matmul" : "");
  }
  int num_threads() const override { return pool_.num_threads(); }

  void matmul(const WeightView& w, const float* x, int64_t m, float* y) override {
    if (mode_ == MatmulMode::kFast && w.cols % cpu::kQK8A == 0) {
      // Prepared weights go through their packed copy (Q5_0 has only that integer path).
      const cpu::PackedGemmFn pgemm = cpu::packed_gemm_fn(k_, w.type);
      const uint8_t* packed = pgemm != nullptr ? packed_->find(w) : nullptr;
      const cpu::QGemmFn qgemm = cpu::qgemm_fn(k_, w.type);
      if (packed != nullptr || qgemm != nullptr) return matmul_int8(w, qgemm, pgemm, packed, x, m, y);
    }
    const cpu::DequantizeRowFn deq = w.type == DType::kF32 ? nullptr : cpu::dequantize_fn(k_, w.type);
    if (w.type != DType::kF32 && deq == nullptr) {
      fail(ErrorCode::kUnsupported, "matmul with {} weights ('{}') is not supported on the CPU", dtype_name(w.type),
           w.name);
    }
    const int64_t k = w.cols;
    pool_.parallel_for(w.rows, kRowTile, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> tile;
      for (int64_t r0 = begin; r0 < end; r0 += kRowTile) {
        const int64_t nw = std::min(kRowTile, end - r0);
        const float* wt;
        if (deq == nullptr) {
          wt = reinterpret_cast<const float*>(w.row(r0));
        } else {
          tile.resize(static_cast<size_t>(nw * k));
          for (int64_t j = 0; j < nw; ++j) deq(w.row(r0 + j), tile.data() + j * k, k);
          wt = tile.data();
        }
        k_.gemm_f32(wt, nw, x, m, k, y + r0, w.rows);
      }
    });
  }

  // Activations quantized to Q8A blocks once, then integer dot products with the weights in
  // place: weight rows split over the threads, activation rows in tiles that stay in cache.
  void matmul_int8(const WeightView& w, cpu::QGemmFn qgemm, cpu::PackedGemmFn pgemm, const uint8_t* packed,
                   const float* x, int64_t m, float* y) {
    const int64_t nb = w.cols / cpu::kQK8A;
    activations_.resize(static_cast<size_t>(m * nb));
    cpu::BlockQ8A* act = activations_.data();
    // Packed Q6_K also takes each block's two 16-value sums, once here rather than per task.
    const bool halves = packed != nullptr && w.type == DType::kQ6_K;
    if (halves) half_sums_.resize(static_cast<size_t>(2 * m * nb));
    pool_.parallel_for(m, 4, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        k_.quantize_q8a(x + i * w.cols, act + i * nb, w.cols);
        if (halves) cpu::half_sums(act + i * nb, nb, half_sums_.data() + 2 * i * nb);
      }
    });
    if (packed != nullptr) return matmul_packed(w, pgemm, packed, act, halves ? half_sums_.data() : nullptr, m, y);
    const size_t row_bytes = w.row_bytes();
    pool_.parallel_for(w.rows, kQRowTile, [&](int64_t begin, int64_t end) {
      for (int64_t r0 = begin; r0 < end; r0 += kQRowTile) {
        const int64_t nw = std::min(kQRowTile, end - r0);
        for (int64_t i0 = 0; i0 < m; i0 += kActTile) {
          const int64_t mi = std::min(kActTile, m - i0);
          qgemm(w.row(r0), row_bytes, nw, act + i0 * nb, mi, nb, y + i0 * w.rows + r0, w.rows);
        }
      }
    });
  }

  // Packed weights: each task takes whole groups of 16 rows.
  void matmul_packed(const WeightView& w, cpu::PackedGemmFn pgemm, const uint8_t* packed, const cpu::BlockQ8A* act,
                     const int32_t* half, int64_t m, float* y) {
    const int64_t nb = w.cols / cpu::kQK8A;
    const size_t group_bytes = cpu::packed_bytes(w.type, cpu::kPackRows, nb);
    const int64_t groups = (w.rows + cpu::kPackRows - 1) / cpu::kPackRows;
    pool_.parallel_for(groups, kQRowTile / cpu::kPackRows, [&](int64_t begin, int64_t end) {
      const int64_t r0 = begin * cpu::kPackRows;
      const int64_t nw = std::min(end * cpu::kPackRows, w.rows) - r0;
      for (int64_t i0 = 0; i0 < m; i0 += kActTile) {
        const int64_t mi = std::min(kActTile, m - i0);
        pgemm(packed + static_cast<size_t>(begin) * group_bytes, nw, act + i0 * nb,
              half != nullptr ? half + 2 * i0 * nb : nullptr, mi, nb, y + i0 * w.rows + r0, w.rows);
      }
    });
  }

  std::unique_ptr<PreparedWeights> prepare_weights(const std::vector<WeightView>& weights) override {
    if (mode_ != MatmulMode::kFast) return nullptr;
    auto handle = std::make_unique<PreparedPacked>(packed_);
    // Every new copy goes into one arena: whole huge pages, not a partial one per matrix.
    std::vector<std::pair<const WeightView*, size_t>> fresh;  // and its offset in the arena
    size_t total = 0;
    for (const WeightView& w : weights) {
      if (!cpu::packable(w.type) || w.cols % cpu::kQK8A != 0 || cpu::packed_gemm_fn(k_, w.type) == nullptr) continue;
      if (packed_->retain(w)) {
        handle->keys.push_back(static_cast<const uint8_t*>(w.data));
        continue;
      }
      bool seen = false;  // the same matrix twice in the list (a tied head)
      for (const auto& [v, off] : fresh) seen = seen || v->data == w.data;
      if (seen) continue;
      fresh.emplace_back(&w, total);
      total += (cpu::packed_bytes(w.type, w.rows, w.cols / cpu::kQK8A) + 63) / 64 * 64;
    }
    if (fresh.empty()) return handle;
    auto arena = std::make_shared<AnonymousMemory>(total, /*huge_pages=*/true);
    numa_place(arena->data(), arena->size(), numa_, topology_);
    for (const auto& [wp, offset] : fresh) {
      const WeightView& w = *wp;
      const int64_t nb = w.cols / cpu::kQK8A;
      uint8_t* dst = static_cast<uint8_t*>(arena->data()) + offset;
      const int64_t groups = (w.rows + cpu::kPackRows - 1) / cpu::kPackRows;
      pool_.parallel_for(groups, 16, [&](int64_t g0, int64_t g1) {
        cpu::pack_rows16(w.type, w.row(0), w.row_bytes(), w.rows, nb, dst, g0, g1);
      });
      release_pages(w.data, static_cast<size_t>(w.rows) * w.row_bytes());
      packed_->add(w, dst, arena);
      handle->keys.push_back(static_cast<const uint8_t*>(w.data));
    }
    return handle;
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
    const int64_t grain = std::max<int64_t>(1, kMinParallelElements / std::max<int64_t>(1, dim));
    pool_.parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) k_.rms_norm_f32(x + r * dim, weight, y + r * dim, dim, eps);
    });
  }

  void rope(float* x, int64_t rows, int64_t num_heads, int64_t head_dim, const int32_t* positions,
            const RopeParams& p) override {
    const int64_t half = p.dim / 2;
    const std::vector<double> freq = rope_frequencies(p);
    pool_.parallel_for(rows, 1, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> cs;
      cs.resize(static_cast<size_t>(2 * half));
      for (int64_t r = begin; r < end; ++r) {
        const double pos = static_cast<double>(positions[r]);
        for (int64_t i = 0; i < half; ++i) {
          const double theta = pos * freq[static_cast<size_t>(i)];
          cs[2 * i] = static_cast<float>(std::cos(theta) * p.attn_factor);
          cs[2 * i + 1] = static_cast<float>(std::sin(theta) * p.attn_factor);
        }
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
      } else {
        std::copy_n(rows + i * row_dim, row_dim, static_cast<float*>(dst));
      }
    }
  }

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

 private:
  static int resolve_threads(int n) {
    return n > 0 ? n : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }

  NumaMode numa_;
  NumaTopology topology_;
  ThreadPool pool_;
  const cpu::Kernels& k_;
  MatmulMode mode_;
  cpu::PagedAttention attention_;
  std::vector<cpu::BlockQ8A> activations_;  // quantized activations of the current matmul
  std::vector<int32_t> half_sums_;          // and their half sums, for packed Q6_K
  std::shared_ptr<PackedStore> packed_ = std::make_shared<PackedStore>();
};

}  // namespace

MatmulMode default_matmul_mode() {
  static const MatmulMode mode = [] {
    const char* env = std::getenv("DUET_MATMUL");
    if (env == nullptr || *env == '\0' || std::string(env) == "fast") return MatmulMode::kFast;
    if (std::string(env) == "exact") return MatmulMode::kExact;
    fail(ErrorCode::kInvalidArgument, "DUET_MATMUL={} is not known (expected fast or exact)", env);
  }();
  return mode;
}

std::unique_ptr<Backend> make_cpu_backend(int num_threads, MatmulMode mode) {
  return std::make_unique<CpuBackend>(num_threads, mode);
}

}  // namespace duet
