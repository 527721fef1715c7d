// The Backend seam: a small set of ops that a model's forward pass is written against. A new
// device implements this interface and passes the same op tests as the CPU backend.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "duet/core/dtype.h"
#include "duet/core/numa.h"

namespace duet {

// A weight matrix of `rows` rows of `cols` elements each (row-major, GGUF layout: a GGUF tensor
// with shape [cols, rows]), in any supported type, resident where the backend can read it.
struct WeightView {
  std::string_view name;
  DType type = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;

  size_t row_bytes() const { return row_size(type, cols); }
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_bytes(); }
  // Rows [first, first + count) as a matrix of their own.
  WeightView rows_from(int64_t first, int64_t count) const { return WeightView{name, type, count, cols, row(first)}; }
};

// Where each head's rows lie in a matrix that stacks all heads' (see Backend::matmul_heads): head
// h's are rows [first_row + h * row_step, first_row + h * row_step + rows).
struct HeadRows {
  int64_t heads = 0;
  int64_t rows = 0;
  int64_t first_row = 0;
  int64_t row_step = 0;
};
// Throws kInvalidArgument naming the matrix when the heads' rows do not lie within w.
void check_head_rows(const WeightView& w, const HeadRows& s);

enum class RopeMode {
  kNormal,  // rotates adjacent pairs (x[2i], x[2i+1]): llama GGUF layout
  kNeox,    // rotates halves (x[i], x[i + d/2]): Hugging Face layout, qwen2
};

struct RopeParams {
  RopeMode mode = RopeMode::kNormal;
  int64_t dim = 0;           // rotated dimensions per head
  int64_t offset = 0;        // first rotated dimension within a head (dim + offset <= head_dim)
  double freq_base = 10000.0;
  double freq_scale = 1.0;   // 1 / scaling factor (linear, or YaRN's interpolation)
  // YaRN, when yarn_orig_ctx > 0: each pair's frequency blends the interpolated (freq_scale x)
  // and the original one, by a linear ramp between the correction dimensions of beta_fast and
  // beta_slow rotations over the original context.
  double yarn_orig_ctx = 0.0;
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
  double attn_factor = 1.0;  // cos and sin are multiplied by this (YaRN's mscale ratio)
  // Per rotated pair, a divisor of its frequency (llama3's rope scaling, stored in GGUF files as
  // rope_freqs.weight); empty for none.
  std::vector<float> freq_factors;

  bool operator==(const RopeParams&) const = default;
};

// The angle per position of each rotated pair i < dim / 2, scaling included.
std::vector<double> rope_frequencies(const RopeParams& p);

// The sequences of one step as paged attention sees them. Sequence s owns the new tokens
// [token_start, token_start + num_tokens) of the batch; after this step its cache holds
// context_len tokens, the new ones last, so its i-th new token sits at position
// context_len - num_tokens + i and attends to positions 0..that one. Its block table maps
// position p to slot block_table[p / block_size] * block_size + p % block_size.
struct PagedSequence {
  int32_t token_start = 0;
  int32_t num_tokens = 0;
  int32_t context_len = 0;
  const int32_t* block_table = nullptr;
  int32_t num_blocks = 0;

  // The cache slot of position `pos` under blocks of `block_size`.
  int64_t slot(int64_t pos, int64_t block_size) const {
    return int64_t{block_table[pos / block_size]} * block_size + pos % block_size;
  }
};

struct PagedAttentionBatch {
  std::vector<PagedSequence> seqs;
  int32_t block_size = 16;
  int32_t num_tokens = 0;  // total new tokens
};

// The element type of a KV cache. f16 halves the cache (and the bytes attention streams per
// token) against f32 for a rounding of each stored value to 11 significant bits; llama.cpp's
// default is f16 too. q8_0 (GGUF's Q8_0 blocks: 32 int8 values and an fp16 scale, 34 bytes)
// halves it again, for a rounding to half a step of each block's largest value / 127; its heads
// must be multiples of 32 wide (every DeepSeek model's are). fp8 is the cache DeepSeek deploys
// for V3.2 (its inference code simulates it, vLLM's and FlashMLA's kernels read it): each whole
// 128 values of a row as e4m3 codes with a power-of-two scale (BlockFP8: 132 bytes; the scale
// chosen as act_quant's "ue8m0" format chooses it), the values left after the last whole block as
// f16 (MLA's 64 rope values: its row of 576 takes 656 bytes, as FlashMLA's does); every head must
// start on a block (a row of one head, or heads of whole blocks). Rows are converted by the
// scalar reference (round to nearest even), the same bits on every ISA.
enum class KvDtype { kF32, kF16, kQ8_0, kFp8 };
// Bytes of one cache row of `dim` elements; throws kInvalidArgument when q8_0 cannot hold it.
size_t kv_row_bytes(KvDtype dtype, int64_t dim);
std::string_view kv_dtype_name(KvDtype dtype);
// "f32", "f16", "q8_0" or "fp8"; throws kInvalidArgument naming the value otherwise.
KvDtype parse_kv_dtype(std::string_view name);

// How a mixture-of-experts router picks each token's experts from its logits over the experts
// (Hugging Face's MoEGate for DeepSeek V2 and V3): scores are the softmax (V2) or the sigmoid (V3)
// of the logits; the choice ranks scores plus `bias` (V3's e_score_correction_bias), optionally
// only among the num_groups_used best of num_groups expert groups (a group's score: its best
// expert for softmax, the sum of its best two for sigmoid); the k best are kept, ties to the
// lower id; their weights are the unbiased scores, normalised to sum 1 when norm_topk (V3 then
// scales by routed_scaling), else scaled by routed_scaling.
struct MoeRouting {
  enum class Gating { kSoftmax, kSigmoid };
  Gating gating = Gating::kSoftmax;
  int64_t num_experts = 0;
  int64_t num_used = 0;  // k
  int64_t num_groups = 1;
  int64_t num_groups_used = 1;
  bool norm_topk = false;
  double routed_scaling = 1.0;
  const float* bias = nullptr;  // [num_experts], or null
};

// The routed experts of one MoE layer, stacked: expert e's gate and up are rows [e * ff, (e + 1)
// * ff) of gate and up ([num_experts * ff, hidden]); its down is rows [e * hidden, (e + 1) *
// hidden) of down ([num_experts * hidden, ff]).
struct MoeExperts {
  WeightView gate, up, down;
  int64_t num_experts = 0;
  int64_t ff = 0;
};

// What a backend made for the weights it prepared (see Backend::prepare_weights); destroying it
// frees that.
class PreparedWeights {
 public:
  virtual ~PreparedWeights() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int num_threads() const = 0;

  // y[m, w.rows] = x[m, w.cols] * W^T, activations and result in f32.
  virtual void matmul(const WeightView& w, const float* x, int64_t m, float* y) = 0;
  // Several matmuls of the same activations (a layer's q, k and v; its gate and up): for each
  // part, part.y[m, part.w.rows] = x[m, cols] * part.w^T, every part's w with the same cols. The
  // same values as matmul on each part in turn, which is what the default does; a backend may run
  // them as one op (the CPU backend quantizes x once and splits the rows of all of them over its
  // threads in one pass, so a decode step waits for its threads once instead of once a matrix).
  // Throws kInvalidArgument when the parts' column counts differ.
  struct MatmulPart {
    const WeightView& w;
    float* y;
  };
  virtual void matmul_shared(std::span<const MatmulPart> parts, const float* x, int64_t m);
  // One matmul per head, each with its own rows of `w` and its own slice of every token's
  // activations: for h < s.heads, i < m, r < s.rows,
  //   y[i * y_stride + h * y_head + r] = sum_c x[i * x_stride + h * x_head + c] * w[row, c],
  //   row = s.first_row + h * s.row_step + r, c < w.cols
  // (MLA's absorbed projections: each query head's nope part through its W_UK^T, each head's
  // latent output through its W_UV). The same values as those matmuls one by one; a backend may
  // run them as one op. `scratch` holds m * (w.cols + s.rows) floats in the backend's memory for
  // the default, which copies each head's slice in and out around a matmul. Throws
  // kInvalidArgument when the heads' rows do not lie within w.
  virtual void matmul_heads(const WeightView& w, const HeadRows& s, const float* x, int64_t x_stride, int64_t x_head,
                            int64_t m, float* y, int64_t y_stride, int64_t y_head, float* scratch);
  // The transposed product per head, for a matrix whose rows are a head's inputs (MLA's W_UK as
  // kv_b holds it: a head's nope rows of kv_lora_rank columns): for h < s.heads, i < m, c < w.cols,
  //   y[i * y_stride + h * y_head + c] = sum_r x[i * x_stride + h * x_head + r] * w[row, c],
  //   row = s.first_row + h * s.row_step + r, r < s.rows
  // in f32 on the exactly decoded weights, each element one chain over r in increasing order, so a
  // token's values do not depend on m or the threads. Reads the matrix as it is (no transposed
  // copy). Only where has_matmul_heads_t(w) is true (the default: nowhere; the model then builds
  // W_UK^T as a matrix of its own for matmul_heads); elsewhere throws kUnsupported.
  virtual bool has_matmul_heads_t(const WeightView& w) const {
    (void)w;
    return false;
  }
  virtual void matmul_heads_t(const WeightView& w, const HeadRows& s, const float* x, int64_t x_stride, int64_t x_head,
                              int64_t m, float* y, int64_t y_stride, int64_t y_head);
  // Prepares weight matrices that matmul will be given, for as long as the returned handle lives
  // (the CPU backend repacks Q4_0/Q8_0 into its interleaved layout and releases the originals'
  // pages). matmul recognises these views, and row ranges of them, by address; other views work
  // as before. A model prepares its matmul weights at load and keeps the handle. May return null.
  virtual std::unique_ptr<PreparedWeights> prepare_weights(const std::vector<WeightView>& weights) {
    (void)weights;
    return nullptr;
  }
  // y[i, :] = row ids[i] of `w`, as f32.
  virtual void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* y) = 0;
  // y = x / sqrt(mean(x^2) + eps) * weight, per row of `dim`.
  virtual void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t dim, float eps) = 0;
  // Rotates the first p.dim dimensions of every head in place; x is [rows, num_heads, head_dim].
  virtual void rope(float* x, int64_t rows, int64_t num_heads, int64_t head_dim, const int32_t* positions,
                    const RopeParams& p) = 0;
  // y = silu(gate) * up, elementwise.
  virtual void silu_mul(const float* gate, const float* up, float* y, int64_t n) = 0;
  // y += x, elementwise.
  virtual void add(float* y, const float* x, int64_t n) = 0;
  // Writes rows[i] (row_dim floats) to cache slot slots[i] (slot = block * block_size + offset),
  // for i < n, converted to `dtype`; cache is num_slots rows of kv_row_bytes(dtype, row_dim).
  virtual void store_kv(const float* rows, const int64_t* slots, int64_t n, int64_t row_dim, void* cache,
                        KvDtype dtype) = 0;
  // Whether store_kv, load_kv, paged_attention and index_topk take caches of `dtype` (the CUDA
  // backend has no fp8 cache); a model refuses a cache its devices cannot read when it makes it.
  virtual bool has_kv_dtype(KvDtype dtype) const {
    (void)dtype;
    return true;
  }
  // rows[i] = cache slot slots[i] (row_dim elements of `dtype`) as f32, for i < n: store_kv's
  // inverse (exact for every dtype: the stored values, not what was given to store_kv). The
  // default throws kUnsupported (the CPU backend has it); a model calls it only where
  // expands_mla_prefill() is true.
  virtual void load_kv(const void* cache, KvDtype dtype, const int64_t* slots, int64_t n, int64_t row_dim,
                       float* rows);
  // Whether a model with multi-head latent attention may attend a prefill chunk in the expanded
  // form (each head's keys and values decompressed from the cached latents, load_kv then a matmul)
  // rather than the absorbed form decode uses: a third of the multiply-adds a query and key, but
  // another rounding, so a prompt token's bits then depend on how its prompt was cut into chunks.
  // Only where batch invariance is not promised: the CPU backend's fast mode.
  virtual bool expands_mla_prefill() const { return false; }
  // Causal attention over a paged cache for every new token of a batch of sequences (see
  // PagedAttentionBatch). q: [num_tokens, num_heads, head_dim_k]; out: [num_tokens, num_heads,
  // head_dim_v]; slot s of the cache holds kv head g's key at k_cache + s * k_stride +
  // g * head_dim_k and its value at v_cache + s * v_stride + g * head_dim_v, this step's already
  // stored; strides and offsets count elements of shape.dtype (for q8_0 all of them multiples of
  // 32, else kInvalidArgument). Query head h reads kv head
  // h / (num_heads / num_kv_heads). (MLA: one kv head whose value is the first head_dim_v
  // elements of its key, both in one cache row.)
  struct AttentionShape {
    int64_t num_heads = 0;
    int64_t num_kv_heads = 0;
    int64_t head_dim_k = 0;
    int64_t head_dim_v = 0;
    int64_t k_stride = 0;
    int64_t v_stride = 0;
    KvDtype dtype = KvDtype::kF32;
  };
  virtual void paged_attention(const float* q, const void* k_cache, const void* v_cache, float* out,
                               const PagedAttentionBatch& batch, const AttentionShape& shape, float scale) = 0;
  // Copies whole blocks (block_bytes each) within a cache buffer: dst block = src block.
  virtual void copy_blocks(void* cache, const std::vector<std::pair<int32_t, int32_t>>& copies,
                           int64_t block_bytes) = 0;
  // dst[r * dst_stride + c] = src[r * src_stride + c] for r < rows, c < cols (floats): a head's
  // slice of every token's row, or rows put back, within one device's memory.
  virtual void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                       int64_t cols) = 0;
  // Each of n tokens' k = r.num_used experts and their weights ([n, k] each) from the router's
  // logits [n, r.num_experts] (see MoeRouting).
  virtual void moe_route(const float* logits, int64_t n, const MoeRouting& r, int32_t* ids, float* weights) = 0;
  // out[t] = sum over the token's experts in increasing id of weights[t, i] * down_e(silu(gate_e
  // x_t) * up_e x_t), e = ids[t, i], i < k; x and out are [n, hidden]. A negative id is an
  // expert of another rank (expert parallelism) and adds nothing. Each expert's matrices
  // multiply the rows of the tokens that chose it at once.
  virtual void moe_experts(const MoeExperts& w, const float* x, const int32_t* ids, const float* weights, int64_t n,
                           int64_t k, float* out) = 0;
  // DeepSeek-V3.2's lightning indexer, its choice: for each query j < m (its heads' rows
  // q + j * heads * d, their weights w + j * heads), each position s <= last0 + j totals, over h
  // in order, fma(w_h, max(0, q_h . k_s), total) from 0 (each dot product one fma chain over the d
  // dimensions in order, from 0), k_s the cache row slots[s] of `cache` (rows of d elements of
  // `dtype`, as load_kv reads them), and out + j * K gets the K positions of the highest totals
  // (ties to the earlier position) in increasing order. Needs K <= last0 + 1, last0 + m <= C and
  // host memory. The default reads the C rows with load_kv and takes one query after another;
  // the CPU backend converts the rows as it packs them and splits the queries (or one query's
  // positions) over its threads: the same bits.
  virtual void index_topk(const float* q, const void* cache, KvDtype dtype, const int64_t* slots, int64_t C,
                          const float* w, int64_t m, int64_t heads, int64_t d, int64_t last0, int64_t K, int32_t* out);
  // DeepSeek's FP8 rounding of the indexer's rows (DUET_INDEXER=fp8), in place: each of `rows`
  // rows of d values (d a power of two) through hadamard_transform, times d^-1/2, then
  // fp8_act_round_trip per 128 (core/convert.h). Host memory. The default takes one row after
  // another; the CPU backend splits the rows over its threads: the same bits.
  virtual void index_fp8_round(float* x, int64_t rows, int64_t d);
  // Whether prepare_weights makes its own copy of this matrix (the original is then not read by
  // matmul): a device that copies weights into its memory need not copy these.
  virtual bool packs(const WeightView& w) const {
    (void)w;
    return false;
  }
  // Memory degradation: whether this backend can re-quantize f32/f16/bf16 matmul weights to Q8_0
  // as it prepares them, and turning that on or off for the weights prepared from now on (a
  // matrix already prepared keeps its copy). Where it cannot, set_requantize_weights(true) does
  // nothing and returns false.
  virtual bool can_requantize_weights() const { return false; }
  virtual bool set_requantize_weights(bool on) {
    (void)on;
    return false;
  }
};

// Throws kInvalidArgument unless every part of a matmul_shared has the same column count.
void check_shared_parts(std::span<const Backend::MatmulPart> parts);

// Forwards every op to another backend, calling enter() before and leave() after it: the base of
// backends that watch or guard one (the AWQ activation recorder, the guarded test device).
// The K positions of the highest of total[0, n) (ties to the earlier position), in increasing
// order, into out; `order` is scratch.
void index_topk_of_totals(const float* total, int64_t n, int64_t K, int32_t* out, std::vector<int32_t>& order);

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  int num_threads() const override { return inner_.num_threads(); }
  void matmul(const WeightView& w, const float* x, int64_t m, float* y) override;
  void matmul_heads(const WeightView& w, const HeadRows& s, const float* x, int64_t x_stride, int64_t x_head, int64_t m,
                    float* y, int64_t y_stride, int64_t y_head, float* scratch) override;
  bool has_matmul_heads_t(const WeightView& w) const override { return inner_.has_matmul_heads_t(w); }
  void matmul_heads_t(const WeightView& w, const HeadRows& s, const float* x, int64_t x_stride, int64_t x_head,
                      int64_t m, float* y, int64_t y_stride, int64_t y_head) override;
  std::unique_ptr<PreparedWeights> prepare_weights(const std::vector<WeightView>& weights) override;
  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* y) override;
  void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t dim, float eps) override;
  void rope(float* x, int64_t rows, int64_t num_heads, int64_t head_dim, const int32_t* positions,
            const RopeParams& p) override;
  void silu_mul(const float* gate, const float* up, float* y, int64_t n) override;
  void add(float* y, const float* x, int64_t n) override;
  void store_kv(const float* rows, const int64_t* slots, int64_t n, int64_t row_dim, void* cache,
                KvDtype dtype) override;
  void load_kv(const void* cache, KvDtype dtype, const int64_t* slots, int64_t n, int64_t row_dim,
               float* rows) override;
  bool has_kv_dtype(KvDtype dtype) const override { return inner_.has_kv_dtype(dtype); }
  bool expands_mla_prefill() const override { return inner_.expands_mla_prefill(); }
  void paged_attention(const float* q, const void* k_cache, const void* v_cache, float* out,
                       const PagedAttentionBatch& batch, const AttentionShape& shape, float scale) override;
  void copy_blocks(void* cache, const std::vector<std::pair<int32_t, int32_t>>& copies, int64_t block_bytes) override;
  void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols) override;
  void moe_route(const float* logits, int64_t n, const MoeRouting& r, int32_t* ids, float* weights) override;
  void moe_experts(const MoeExperts& w, const float* x, const int32_t* ids, const float* weights, int64_t n, int64_t k,
                   float* out) override;
  void index_fp8_round(float* x, int64_t rows, int64_t d) override;
  void index_topk(const float* q, const void* cache, KvDtype dtype, const int64_t* slots, int64_t C, const float* w,
                  int64_t m, int64_t heads, int64_t d, int64_t last0, int64_t K, int32_t* out) override;
  bool packs(const WeightView& w) const override { return inner_.packs(w); }
  bool can_requantize_weights() const override { return inner_.can_requantize_weights(); }
  bool set_requantize_weights(bool on) override { return inner_.set_requantize_weights(on); }

 protected:
  virtual void enter() {}
  virtual void leave() {}
  Backend& inner() { return inner_; }

 private:
  class Scope;
  Backend& inner_;
};

// How matmuls with quantized weights treat activations. kFast: Q4_0 and Q8_0 weights multiply
// activations quantized to int8 per block of 32 (integer dot products, as llama.cpp does);
// kExact: every weight is converted to f32 and activations stay f32 (slower; what the
// reference tests compare against).
enum class MatmulMode { kFast, kExact };
// DUET_MATMUL=exact|fast, default fast. Throws kInvalidArgument for another value.
MatmulMode default_matmul_mode();
// DUET_MLA_PREFILL=auto|absorbed, default auto: whether the CPU backend's fast mode lets MLA
// prefill chunks attend in the expanded form (Backend::expands_mla_prefill); absorbed keeps
// decode's form everywhere (a token's bits then do not depend on its prompt's chunking). Throws
// kInvalidArgument for another value.
bool mla_prefill_may_expand();

// The CPU backend with `num_threads` threads (<= 0: all hardware threads), threads pinned and
// packed weights placed as `--numa` says (the whole machine).
std::unique_ptr<Backend> make_cpu_backend(int num_threads, MatmulMode mode = default_matmul_mode());

// A CPU backend over chosen cores and memory (a core set or a NUMA node as a device): its pool
// has one thread per entry of `cpus`, worker i pinned to cpus[i] (thread 0 is the caller, which
// the device pins itself), and its packed weights go where `memory` says.
struct CpuBackendOptions {
  std::vector<int> cpus;
  MemoryPlacement memory;
  MatmulMode mode = default_matmul_mode();
  // Mixture-of-experts layers with packed weights run fused (all used experts in one pass, see
  // the CPU backend's moe_experts); false runs each expert's matmuls one after another (the same
  // results; for tests and benchmarks comparing the two).
  bool fused_moe = true;
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

}  // namespace duet
