// The architecture seam: a model declares its hyper-parameters, binds its weights by name and
// runs its forward pass in Backend ops. Architectures register in registry.cpp.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "duet/backend/backend.h"
#include "duet/backend/device.h"
#include "duet/core/memory.h"
#include "duet/formats/gguf.h"
#include "duet/model/placement.h"

namespace duet {

struct ModelConfig {
  std::string architecture;  // general.architecture
  std::string name;          // general.name, if any
  int64_t num_vocab = 0;
  int64_t context_length = 0;  // the training context
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  float rms_norm_eps = 1e-6f;
  RopeParams rope;
  double rope_scaling_factor = 1.0;  // linear factor (rope.freq_scale = 1 / factor)
  bool tied_embeddings = false;

  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

// The KV tensors of a model, in blocks: for every layer, K as [num_blocks * block_size, k_dim]
// elements and V as [.., v_dim] (slot = block * block_size + offset), in the memory of the device
// that runs the layer's attention (one buffer per device for its layers). v_dim 0 means no
// separate V (MLA keeps one latent row per token). Which blocks a sequence owns is the KV cache
// manager's business (cache/); this is only the storage.
class PagedKvCache {
 public:
  // layer_devices[l] keeps layer l.
  PagedKvCache(std::vector<Device*> layer_devices, int64_t num_blocks, int32_t block_size, int64_t k_dim, int64_t v_dim,
               KvDtype dtype);
  int64_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int64_t k_dim() const { return k_dim_; }
  int64_t v_dim() const { return v_dim_; }
  KvDtype dtype() const { return dtype_; }
  int64_t num_layers() const { return static_cast<int64_t>(layer_devices_.size()); }
  int64_t num_slots() const { return num_blocks_ * block_size_; }
  // Bytes per block per layer.
  int64_t k_block_bytes() const { return block_size_ * k_row_; }
  int64_t v_block_bytes() const { return block_size_ * v_row_; }
  // A layer's K (and V) rows, of dtype(), in its device's memory.
  void* k(int64_t layer) { return layer_base_[static_cast<size_t>(layer)]; }
  void* v(int64_t layer) {
    return v_dim_ == 0 ? nullptr : static_cast<uint8_t*>(layer_base_[static_cast<size_t>(layer)]) + num_slots() * k_row_;
  }
  Device& device(int64_t layer) const { return *layer_devices_[static_cast<size_t>(layer)]; }
  // Bytes reserved, on every device together.
  size_t bytes() const;
  // Returns the memory of these blocks' rows (whole pages inside them, every layer on this
  // process's devices) to the system; their contents are lost. For blocks no sequence holds.
  void release_blocks(const std::vector<int32_t>& blocks);
  // Commits the memory of blocks [first, first + count) now (every layer this process keeps in
  // host memory; a GPU's is committed when it is allocated) rather than at their first write, so
  // the steps that first write them do not stop for page faults. Returns the bytes committed;
  // fewer where the kernel cannot (commit_pages), and the rest is committed as it is written.
  int64_t commit_blocks(int64_t first, int64_t count);

 private:
  int64_t layer_bytes() const { return num_slots() * (k_row_ + v_row_); }

  int64_t num_blocks_;
  int32_t block_size_;
  int64_t k_dim_;
  int64_t v_dim_;
  KvDtype dtype_;
  int64_t k_row_;  // bytes per K row
  int64_t v_row_;
  std::vector<Device*> layer_devices_;
  // One per device, its layers' K and V (committed when first written, or by commit_blocks).
  std::vector<DeviceBuffer> storage_;
  std::vector<void*> layer_base_;
};

// One step's input, flattened over its sequences (the model runner builds it from the
// scheduler's output): the new tokens of every sequence back to back, their positions, the cache
// slot each token's K/V goes to, the sequences as paged attention sees them (block tables must
// stay valid during forward), and the token rows whose logits are wanted, in output order.
struct BatchInput {
  // kLastHidden: the last row's final normalised hidden state (an embedding), in its logits slot.
  enum class Logits { kNone, kLast, kAll, kLastHidden };

  std::vector<int32_t> token_ids;
  std::vector<int32_t> positions;
  std::vector<int64_t> slot_mapping;
  PagedAttentionBatch attention;
  std::vector<int32_t> logits_rows;
  // Indexes into logits_rows whose output is the row's final normalised hidden state instead of
  // its logits (embeddings): its first hidden_size floats, the rest of the row undefined.
  std::vector<int32_t> hidden_rows;
  // Rows that run with a LoRA adapter: [row0, row0 + rows) with adapter `adapter` (1-based, see
  // Model::lora_adapters), one run per sequence or run of sequences back to back with the same
  // adapter; rows in no run use the base weights alone.
  struct LoraRun {
    int32_t row0 = 0;
    int32_t rows = 0;
    int32_t adapter = 0;
  };
  std::vector<LoraRun> lora_runs;
  // When set (host memory; a model on one host device): the head also writes every row's final
  // normalised hidden state here, [num_tokens, hidden_size], which MTP drafting reads.
  float* hidden_out = nullptr;
  // Attention restricted to a sliding window, derived from `attention` by the first layer with
  // that window and kept for the step's other layers (their block tables point into `slots`).
  // Parts of one micro-batch run one after another, so this host metadata needs no lock.
  struct Windowed {
    int64_t window = 0;
    PagedAttentionBatch attention;
    std::vector<int32_t> slots;
  };
  mutable std::deque<Windowed> windowed;

  // Appends one sequence: `tokens` at positions pos0.., with a block table covering at least
  // pos0 + tokens.size() positions, which of its rows need logits, and its LoRA adapter (0: none).
  void add_sequence(std::span<const int32_t> tokens, int32_t pos0, std::span<const int32_t> block_table,
                    Logits logits, int32_t lora_adapter = 0);
  void clear();
  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  // What every model's forward checks first: at least one token, every id inside the vocabulary,
  // every slot inside the cache, every LoRA run inside the batch with an adapter slot in
  // [1, num_lora_slots]; throws kInvalidArgument naming the bad value.
  void validate(int64_t num_vocab, int64_t num_slots, int64_t num_lora_slots = 0) const;
};

// A buffer a micro-batch carries from one part of the forward pass to the next (the residual
// stream; for MoE the normalised rows, the routing and the experts' sum), bytes_per_token for
// each of its tokens. The executor keeps one per micro-batch on every device that uses it and
// copies it from the device that wrote it last before a part on another device reads it.
struct CarriedBuffer {
  std::string name;
  int64_t bytes_per_token = 0;
};

// One device's temporaries for the parts it runs (nothing is kept from one part to the next),
// in its memory, grown on demand. Its parts run one at a time, so one is enough per device.
class Workspace {
 public:
  explicit Workspace(Device& device) : device_(device) {}
  // Slot `slot`'s buffer, holding at least `count` elements; contents undefined.
  float* f32(int slot, int64_t count) { return static_cast<float*>(get(slot, count * 4)); }
  int32_t* i32(int slot, int64_t count) { return static_cast<int32_t*>(get(slot, count * 4)); }

 private:
  void* get(int slot, int64_t bytes);
  Device& device_;
  std::vector<DeviceBuffer> slots_;
};

// What a part runs with: one micro-batch on one device.
struct PartContext {
  const BatchInput& batch;  // host metadata: token ids, positions, slots, block tables
  Device& device;
  Backend& ops;             // the device's ops
  Workspace& scratch;
  const std::vector<void*>& carried;  // this micro-batch's carried buffers on this device, by id
  PagedKvCache& cache;
  float* logits;            // head: [batch.logits_rows.size(), num_vocab], on this device

  template <typename T>
  T* buffer(int id) const {
    return static_cast<T*>(carried[static_cast<size_t>(id)]);
  }
};

// A part of the forward pass (embed, a layer's attention, feed-forward or experts, head): it runs
// on the device its placement gives, reading and writing carried buffers.
struct ModelPart {
  PartId id;
  std::vector<int> reads;
  std::vector<int> writes;
  std::function<void(PartContext&)> run;
};

class Executor;

class Model {
 public:
  virtual ~Model();
  virtual const ModelConfig& config() const = 0;
  // LoRA adapters live in numbered slots (1 .. kMaxLoraAdapters, a batch's LoraRun::adapter), so
  // that loading one while steps run touches no slot they read. The adapter in slot `index`, or
  // null for a free slot or an index out of range.
  static constexpr int32_t kMaxLoraAdapters = 256;
  const LoraAdapter* lora_adapter(int32_t index) const {
    return index < 1 || index > static_cast<int32_t>(lora_.size()) ? nullptr : lora_[static_cast<size_t>(index - 1)].adapter.get();
  }
  // Reads `source` (LoraAdapter::read, for this model's shape) into slot `index` (0: the first
  // free one) and places its matrices on the devices of their layers' parts; returns the slot.
  // Throws kUnsupported for an architecture without LoRA or a model over several ranks,
  // kInvalidArgument for a name another slot holds or a slot in use, kResourceExhausted when no
  // slot is free, and as LoraAdapter::read. placement().lora_adapters records it, so that a
  // model loaded again from that placement has it in the same slot.
  int32_t add_lora_adapter(const LoraSource& source, int32_t index = 0);
  // Takes slot `index`'s adapter out of use: its name is free for another adapter, and the
  // placement no longer records it; the slot still holds it for steps in flight, and is not
  // taken again until remove_lora_adapter.
  void retire_lora_adapter(int32_t index);
  bool lora_adapter_retired(int32_t index) const {
    return lora_adapter(index) != nullptr && lora_[static_cast<size_t>(index - 1)].retired;
  }
  // Adapters loaded and not retired.
  int32_t num_lora_adapters() const {
    int32_t n = 0;
    for (const LoraSlot& s : lora_) n += s.adapter != nullptr && !s.retired ? 1 : 0;
    return n;
  }
  // Empties slot `index`: its matrices are freed. The caller makes sure no step in flight or to
  // come reads it.
  void remove_lora_adapter(int32_t index);

  // The forward pass: its parts in order, each on its device, and the buffers they carry.
  const std::vector<ModelPart>& parts() const { return parts_; }
  const std::vector<CarriedBuffer>& carried() const { return carried_; }
  const Placement& placement() const { return placement_; }

  // Runs one step on the calling thread, as one micro-batch: computes every token of `batch`,
  // writes their K/V into `cache` at batch.slot_mapping, and writes the logits of
  // batch.logits_rows to `logits` (host memory, [logits_rows.size(), num_vocab]). Throws
  // kInvalidArgument for an id outside the vocabulary or a slot outside the cache, before
  // computing anything. (The engine runs steps through an Executor of its own, in micro-batches.)
  void forward(const BatchInput& batch, PagedKvCache& cache, float* logits);

  // Multi-token prediction (DeepSeek-V3's MTP layer, loaded when placement().mtp and the file has
  // one): how many MTP layers are loaded (0: none). The KV cache keeps theirs after the model's
  // layers, on the head's device.
  virtual int64_t num_mtp_layers() const { return 0; }
  int64_t num_cache_layers() const { return config().num_layers + num_mtp_layers(); }
  // One MTP step over every row of `batch`, on the calling thread (the model on one host device):
  // row i combines the model's final normalised hidden state at its position (`hidden` row i,
  // hidden_size floats, as BatchInput::hidden_out gives it, or an MTP output to chain) with the
  // embedding of batch.token_ids[i] (the token that followed it), writes the MTP layer's K/V at
  // batch.slot_mapping, its output (the residual after the block, hidden_size floats per row) to
  // `hidden_out`, and the logits of batch.logits_rows to `logits` (host memory). Throws
  // kUnsupported without an MTP layer, kInvalidArgument as forward does.
  virtual void mtp_forward(const BatchInput& batch, const float* hidden, PagedKvCache& cache, float* logits,
                           float* hidden_out);

  // Elements per token and layer the cache keeps for K and for V (MLA: the latent row, no V).
  virtual int64_t cache_k_dim() const { return config().kv_dim(); }
  virtual int64_t cache_v_dim() const { return config().kv_dim(); }
  // Bytes of KV cache one token takes (all layers, the MTP layer's too, K and V). Throws as
  // new_kv_cache does.
  int64_t kv_bytes_per_token(KvDtype dtype) const;
  // Widths of one cache head's key and value as attention reads them (MLA: the latent row, and
  // its first kv_lora_rank elements as the value).
  virtual std::pair<int64_t, int64_t> cache_head_dims() const { return {config().head_dim, config().head_dim}; }
  // Whether attention's values are the first elements of the key rows (MLA), not V rows of their own.
  virtual bool values_in_key_rows() const { return false; }
  // A cache on the devices of the layers' attention. Throws kInvalidArgument, naming the widths,
  // when `dtype` cannot hold this model's heads (q8_0 needs multiples of its 32-value blocks).
  // Over several ranks, rank 0 tells the others to make theirs (the same blocks, for their layers
  // and heads); kResourceExhausted when one of them has no room for num_blocks.
  std::unique_ptr<PagedKvCache> new_kv_cache(int64_t num_blocks, int32_t block_size, KvDtype dtype) const;
  // Rank 0 over several ranks: the fewest KV blocks another rank has room for (each sends it once
  // it has loaded, see run_rank_worker); otherwise no limit.
  int64_t rank_kv_blocks() const;

 protected:
  Model(std::shared_ptr<const GgufFile> file, Placement placement);

  // The head's last act: the rows of batch.hidden_rows get their normalised hidden state (`h`,
  // one row of hidden_size per logits row, on the head's device) in place of their logits.
  void write_hidden_rows(PartContext& c, const float* h) const;
  int add_carried(std::string name, int64_t bytes_per_token);
  void add_part(PartId id, std::vector<int> reads, std::vector<int> writes, std::function<void(PartContext&)> run);
  // Each device loads the tensors of its parts (views may be repointed to its copies).
  void load_weights(const std::vector<std::pair<PartId, WeightRef>>& tensors);
  Backend& ops(PartId part) const { return placement_.device(part).backend(); }

  // After load_weights: the model takes LoRA adapters of this shape, and those of
  // placement().lora_adapters are loaded into their slots (add_lora_adapter throws).
  void enable_lora(const LoraShape& shape);
  // The projection an adapter's `module` of `layer` updates (for its weight type), or null.
  virtual const WeightView* lora_base(int64_t /*layer*/, LoraModule /*module*/) const { return nullptr; }
  // This rank's share of an adapter's update of `module` (tensor parallelism), as of the base's.
  virtual LoraShard lora_shard(LoraModule /*module*/) const { return {}; }
  // Derives matrices of an adapter's update of `module` in `layer` that the model's own products
  // need (LoraPair::derived, from this rank's share); true when it did, and the pair stays f32.
  virtual bool derive_lora(int64_t /*layer*/, LoraModule /*module*/, LoraAdapter& /*adapter*/) const { return false; }
  // Routed experts: whether `layer` has them, and the ones this rank runs (expert parallelism),
  // [first, first + count).
  virtual bool lora_has_experts(int64_t /*layer*/) const { return false; }
  virtual std::pair<int64_t, int64_t> lora_expert_range() const { return {0, INT64_MAX}; }
  // Adds the batch's LoRA updates of projections of `layer` that read the same input `in` (rows
  // of it, `in_stride` floats apart) to their outputs (rows of each): per run of rows and
  // projection, B (A in), with A of all the projections in one matmul_shared. `mid` and `out`:
  // scratch slots of the part's workspace.
  struct LoraOutput {
    LoraModule module;
    float* out;
  };
  void add_lora(PartContext& c, int64_t layer, std::initializer_list<LoraOutput> outputs, const float* in, int mid,
                int out) const;

  std::shared_ptr<const GgufFile> file_;
  Placement placement_;

 private:
  std::vector<ModelPart> parts_;
  std::vector<CarriedBuffer> carried_;
  std::vector<std::unique_ptr<LoadedWeights>> loaded_;
  // Each device's handles of `tensors` (load_weights keeps them in loaded_).
  std::vector<std::unique_ptr<LoadedWeights>> load_tensors(const std::vector<std::pair<PartId, WeightRef>>& tensors);
  struct LoraSlot {
    std::unique_ptr<LoraAdapter> adapter;
    std::vector<std::unique_ptr<LoadedWeights>> loaded;  // its matrices on the devices
    bool retired = false;
  };
  std::optional<LoraShape> lora_shape_;  // set by enable_lora
  std::vector<LoraSlot> lora_;           // kMaxLoraAdapters slots once enabled
  std::unique_ptr<Executor> executor_;  // forward()'s
  mutable int64_t rank_kv_blocks_ = -1;
};

// Tags of the messages between rank 0 and the other ranks (above every micro-batch's): what rank
// 0 sends them (kStepTag), and what they answer (kPongTag: the KV blocks they have room for,
// then one pong per ping).
inline constexpr int kStepTag = 1 << 17;
inline constexpr int kPongTag = kStepTag + 2;
inline constexpr int kStatsTag = kStepTag + 3;  // a rank's seconds on each step it finished (a double)
// The first int64 of a message rank 0 sends the others to make their KV cache (then num_blocks,
// block_size, the KvDtype); steps, pings and the stop are told apart by their first bytes.
inline constexpr int64_t kInitMessage = 0x54494e4944;  // "DINIT"
inline constexpr uint32_t kPingMessage = 0x474e4950;   // "PING"
inline constexpr uint32_t kStopMessage = 0x504f5453;   // "STOP"
inline constexpr uint32_t kLoraMessage = 0x41524f4c;   // "LORA": encode_lora_message's, and a rank's answer

// Runs a single sequence through a model with a private cache (block i holds positions
// [i * block_size, (i + 1) * block_size)): for tools, benchmarks and tests.
class SequenceRunner {
 public:
  SequenceRunner(Model& model, int64_t capacity, int32_t block_size = 16, KvDtype kv_dtype = KvDtype::kF16);
  int64_t capacity() const { return capacity_; }
  // Runs `tokens` at positions pos0..; writes the last token's logits ([num_vocab]), or every
  // token's ([tokens.size(), num_vocab]) when all_logits. Throws kInvalidArgument when they do
  // not fit in the capacity.
  void forward(std::span<const int32_t> tokens, int64_t pos0, float* logits, bool all_logits);
  // The LoRA adapter the tokens run with from now on (1-based, Model::lora_adapters; 0: none).
  void set_lora_adapter(int32_t adapter) { lora_adapter_ = adapter; }

 private:
  Model& model_;
  int32_t lora_adapter_ = 0;
  int64_t capacity_;
  std::unique_ptr<PagedKvCache> cache_;
  std::vector<int32_t> block_table_;
  BatchInput batch_;
};

// Reads the architecture from general.architecture and builds that model over the file's weights,
// each part on the device `placement` gives it (`file` is kept alive by the model). Throws
// kUnsupported for an unknown architecture and kInvalidArgument listing every missing or
// mismatched tensor.
std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file, Placement placement);
// The whole model on one host device over `backend` (which must outlive the model).
std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file, Backend& backend);
// Resolves `map` for the model in `file` (see plan_placement), with the KV row size its
// architecture gives for `kv_dtype`; over the ranks of `parallel` (when given), this rank's stage
// on that map's one device and the other stages on rank devices (place_stages).
Placement plan_model_placement(const GgufFile& file, const DeviceMapSpec& map, DeviceRegistry& devices,
                               const KvBudget& budget, KvDtype kv_dtype,
                               std::shared_ptr<ParallelGroup> parallel = nullptr);

// Before loading: bytes of KV cache one token of the model in `file` takes (all layers, K and V)
// in `dtype`, and its context length (2048 when the file does not say). Throws kInvalidArgument
// when `dtype` cannot hold its rows.
int64_t file_kv_bytes_per_token(const GgufFile& file, KvDtype dtype);
int64_t file_context_length(const GgufFile& file);

// Rank 0: tells every other rank to stop (after its steps have finished); a rank that cannot be
// reached is logged, not thrown.
void stop_other_ranks(const ParallelGroup& group);

// Architectures this build can run.
std::vector<std::string> supported_architectures();

}  // namespace duet
