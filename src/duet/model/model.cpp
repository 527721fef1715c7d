#include "duet/model/model.h"

#include <algorithm>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/core/log.h"
#include "duet/core/memory.h"
#include "duet/core/quant.h"
#include "duet/core/sysinfo.h"
#include "duet/model/executor.h"
#include "duet/model/hparams.h"
#include "duet/model/deepseek2.h"
#include "duet/model/llama.h"
#include "duet/model/qwen2.h"
#include "duet/model/qwen3.h"

namespace duet {
namespace {

using Factory = std::unique_ptr<Model> (*)(std::shared_ptr<const GgufFile>, Placement);

// K and V elements per token and layer of a llama-like model's cache, from its metadata.
std::pair<int64_t, int64_t> llama_like_cache_dims(const GgufFile& f) {
  const HParams hp(f, f.get_string("general.architecture"));
  const int64_t heads = hp.positive("attention.head_count");
  const int64_t kv_heads = hp.has("attention.head_count_kv") ? hp.positive("attention.head_count_kv") : heads;
  const int64_t head_dim =
      hp.has("attention.key_length") ? hp.positive("attention.key_length") : hp.positive("embedding_length") / heads;
  return {kv_heads * head_dim, kv_heads * head_dim};
}

struct Registration {
  const char* architecture;
  Factory factory;
  std::pair<int64_t, int64_t> (*cache_dims)(const GgufFile&);  // for planning, before loading
};

// One line per architecture.
constexpr Registration kArchitectures[] = {
    {"llama", make_llama_model, llama_like_cache_dims},
    {"qwen2", make_qwen2_model, llama_like_cache_dims},
    {"qwen3", make_qwen3_model, llama_like_cache_dims},
    {"deepseek2", make_deepseek2_model, deepseek2_cache_dims},
    {"deepseek32", make_deepseek2_model, deepseek2_cache_dims},  // V3.2: deepseek2 with an indexer
};

const Registration& registration(const GgufFile& file) {
  const std::string arch = file.get_string_or("general.architecture", "");
  for (const Registration& r : kArchitectures) {
    if (arch == r.architecture) return r;
  }
  fail(ErrorCode::kUnsupported, "'{}': architecture '{}' is not supported (supported: {})", file.path(),
       arch.empty() ? "(general.architecture missing)" : arch, fmt::join(supported_architectures(), ", "));
}

// Whether `dtype` can hold the model's heads (q8_0: whole 32-value blocks; fp8: heads from the start
// of its 128-value blocks); throws naming them.
void check_kv_dtype(const Model& model, KvDtype dtype) {
  const auto [dk, dv] = model.cache_head_dims();
  const int64_t rows_v = model.cache_v_dim();  // MLA's V rows (DeepSeek-V3.2's indexer keys) are their own
  if (dtype == KvDtype::kQ8_0 && (dk % 32 != 0 || dv % 32 != 0 || rows_v % 32 != 0)) {
    fail(ErrorCode::kInvalidArgument,
         "a q8_0 KV cache holds heads in whole blocks of 32 values; this model's heads are {} (key) and {} (value) "
         "wide{}: use f16 or f32",
         dk, dv, dk % 32 == 0 && dv % 32 == 0 ? fmt::format(", its V rows {}", rows_v) : "");
  }
  if (dtype == KvDtype::kFp8) {
    // Each head converts from the start of a block of 128: heads of whole blocks, or one head a row
    // (its values after the last block are the row's halves). MLA's values are converted with their
    // key row; its V rows (DeepSeek-V3.2's indexer keys) are read whole.
    const int64_t rows_k = model.cache_k_dim();
    const bool k_fits = dk % kQKFP8 == 0 || dk == rows_k;
    const bool v_fits = model.values_in_key_rows() || dv % kQKFP8 == 0 || dv == rows_v;
    if (!k_fits || !v_fits) {
      fail(ErrorCode::kInvalidArgument,
           "an fp8 KV cache holds heads in whole blocks of 128 values, or one head a row; this model's are {} "
           "(key) and {} (value) wide in rows of {} and {}: use f16, q8_0 or f32",
           dk, dv, rows_k, rows_v);
    }
  }
}

}  // namespace

PagedKvCache::PagedKvCache(std::vector<Device*> layer_devices, int64_t num_blocks, int32_t block_size, int64_t k_dim,
                           int64_t v_dim, KvDtype dtype)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      k_dim_(k_dim),
      v_dim_(v_dim),
      dtype_(dtype),
      k_row_(static_cast<int64_t>(kv_row_bytes(dtype, k_dim))),
      v_row_(static_cast<int64_t>(kv_row_bytes(dtype, v_dim))),
      layer_devices_(std::move(layer_devices)) {
  if (num_blocks <= 0 || block_size <= 0) {
    fail(ErrorCode::kInvalidArgument, "a KV cache needs blocks: {} blocks of {} tokens", num_blocks, block_size);
  }
  // One buffer per device for its layers (the device puts it in huge pages where it can:
  // attention reads each key and value row of a sequence from another block, and with 4 KiB
  // pages nearly every row is a TLB miss). Pages are committed as blocks are first written, or
  // before, by commit_blocks.
  std::vector<Device*> devices;
  for (Device* d : layer_devices_) {
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  }
  layer_base_.resize(layer_devices_.size());
  for (Device* d : devices) {
    if (d->remote_rank() >= 0) continue;  // another process keeps those layers
    if (!d->backend().has_kv_dtype(dtype)) {
      fail(ErrorCode::kUnsupported, "device '{}' ({}) has no {} KV cache: use f16 or q8_0", d->info().name,
           d->info().kind, kv_dtype_name(dtype));
    }
    const int64_t layers = std::count(layer_devices_.begin(), layer_devices_.end(), d);
    storage_.push_back(d->allocate(static_cast<size_t>(layers * layer_bytes()), MemoryKind::kKv));
    auto* base = storage_.back().as<uint8_t>();
    for (size_t l = 0; l < layer_devices_.size(); ++l) {
      if (layer_devices_[l] != d) continue;
      layer_base_[l] = base;
      base += layer_bytes();
    }
  }
}

size_t PagedKvCache::bytes() const {
  size_t total = 0;
  for (const DeviceBuffer& b : storage_) total += b.size();
  return total;
}

void* Workspace::get(int slot, int64_t bytes) {
  if (slot >= static_cast<int>(slots_.size())) slots_.resize(static_cast<size_t>(slot) + 1);
  DeviceBuffer& b = slots_[static_cast<size_t>(slot)];
  if (static_cast<int64_t>(b.size()) < bytes) {
    b = DeviceBuffer();  // give the old one back first
    // Grown by a quarter beyond what is asked, so a slowly growing step does not reallocate often.
    b = device_.allocate(static_cast<size_t>(bytes + bytes / 4), MemoryKind::kScratch);
  }
  return b.data();
}

Model::Model(std::shared_ptr<const GgufFile> file, Placement placement)
    : file_(std::move(file)), placement_(std::move(placement)) {}

Model::~Model() = default;

void Model::write_hidden_rows(PartContext& c, const float* h) const {
  const int64_t d = config().hidden_size, V = config().num_vocab;
  if (!c.batch.hidden_rows.empty() && d > V) {
    fail(ErrorCode::kInvalidArgument, "an embedding of {} values does not fit a logits row of {}", d, V);
  }
  for (int32_t r : c.batch.hidden_rows) c.ops.copy_2d(h + r * d, d, c.logits + r * V, V, 1, d);
}

int Model::add_carried(std::string name, int64_t bytes_per_token) {
  carried_.push_back(CarriedBuffer{std::move(name), bytes_per_token});
  return static_cast<int>(carried_.size()) - 1;
}

void Model::add_part(PartId id, std::vector<int> reads, std::vector<int> writes,
                     std::function<void(PartContext&)> run) {
  parts_.push_back(ModelPart{id, std::move(reads), std::move(writes), std::move(run)});
}

void PagedKvCache::release_blocks(const std::vector<int32_t>& blocks) {
  for (int64_t l = 0; l < num_layers(); ++l) {
    if (layer_base_[static_cast<size_t>(l)] == nullptr) continue;  // another rank's layer
    for (int32_t b : blocks) {
      if (b < 0 || b >= num_blocks_) fail(ErrorCode::kInvalidArgument, "KV block {} is outside the cache's {}", b, num_blocks_);
      discard_pages(static_cast<uint8_t*>(k(l)) + b * k_block_bytes(), static_cast<size_t>(k_block_bytes()));
      if (v_dim_ > 0) discard_pages(static_cast<uint8_t*>(v(l)) + b * v_block_bytes(), static_cast<size_t>(v_block_bytes()));
    }
  }
}

int64_t PagedKvCache::commit_blocks(int64_t first, int64_t count) {
  if (first < 0 || count < 0 || first + count > num_blocks_) {
    fail(ErrorCode::kInvalidArgument, "KV blocks [{}, {}) are outside the cache's {}", first, first + count,
         num_blocks_);
  }
  int64_t committed = 0;
  const auto commit = [&](void* rows, int64_t block_bytes) {
    const int64_t bytes = count * block_bytes;
    if (commit_pages(static_cast<uint8_t*>(rows) + first * block_bytes, static_cast<size_t>(bytes))) committed += bytes;
  };
  for (int64_t l = 0; l < num_layers() && count > 0; ++l) {
    // Another rank's layer, or a device whose memory the host does not map.
    if (layer_base_[static_cast<size_t>(l)] == nullptr || !device(l).host_accessible()) continue;
    commit(k(l), k_block_bytes());
    if (v_dim_ > 0) commit(v(l), v_block_bytes());
  }
  return committed;
}

void Model::load_weights(const std::vector<std::pair<PartId, WeightRef>>& tensors) {
  for (auto& w : load_tensors(tensors)) loaded_.push_back(std::move(w));
}

std::vector<std::unique_ptr<LoadedWeights>> Model::load_tensors(const std::vector<std::pair<PartId, WeightRef>>& tensors) {
  std::vector<std::unique_ptr<LoadedWeights>> loaded;
  // The tensors whose every use is a matmul on a device whose backend packs it: once loaded,
  // their originals are never read again (Backend::packs).
  std::map<const void*, std::pair<size_t, bool>> packed_only;  // bytes, and whether it is
  for (const auto& [part, ref] : tensors) {
    if (ref.view->data == nullptr) continue;
    auto& [bytes, only] = packed_only.try_emplace(ref.view->data, 0, true).first->second;
    bytes = std::max(bytes, static_cast<size_t>(ref.view->rows) * ref.view->row_bytes());
    // Another rank's part does not read this process's copy, but is not known to pack it either.
    const Device& device = placement_.device(part);
    only = only && ref.matmul && device.remote_rank() < 0 && ops(part).packs(*ref.view);
  }
  for (size_t d = 0; d < placement_.devices.size(); ++d) {
    std::vector<WeightRef> mine;
    for (const auto& [part, ref] : tensors) {
      if (ref.view->data != nullptr && placement_.device_of(part) == static_cast<int>(d)) mine.push_back(ref);
    }
    const std::unique_lock<std::mutex> held = placement_.devices[d]->hold();
    loaded.push_back(placement_.devices[d]->load_weights(mine));
  }
  // Converted copies among them (a Hugging Face folder's FP8, AWQ or stacked weights, opened to
  // be discarded) are freed: the packed copies are the weights now, and not held twice.
  size_t freed = 0;
  for (const auto& [data, use] : packed_only) {
    if (use.second) freed += discard_copy(data, use.first);
  }
  if (freed > 0) {
    spdlog::info("model: {:.1f} MiB of converted weights freed once packed", static_cast<double>(freed) / (1 << 20));
  }
  return loaded;
}

void Model::forward(const BatchInput& batch, PagedKvCache& cache, float* logits) {
  if (!executor_) executor_ = std::make_unique<Executor>(*this);
  executor_->run(std::span<const BatchInput>(&batch, 1), cache, logits);
}

void Model::mtp_forward(const BatchInput&, const float*, PagedKvCache&, float*, float*) {
  fail(ErrorCode::kUnsupported, "'{}' ({}) has no multi-token-prediction layer loaded", file_->path(),
       config().architecture);
}

int64_t Model::kv_bytes_per_token(KvDtype dtype) const {
  check_kv_dtype(*this, dtype);
  return num_cache_layers() *
         static_cast<int64_t>(kv_row_bytes(dtype, cache_k_dim()) + kv_row_bytes(dtype, cache_v_dim()));
}

int64_t Model::rank_kv_blocks() const {
  const ParallelGroup* g = placement_.parallel.get();
  if (g == nullptr || g->world().size() == 1 || g->rank() != 0) return std::numeric_limits<int64_t>::max();
  if (rank_kv_blocks_ < 0) {
    int64_t least = std::numeric_limits<int64_t>::max();
    for (int r = 1; r < g->world().size(); ++r) {
      int64_t blocks = 0;
      g->world().recv(&blocks, sizeof(blocks), r, kPongTag);
      least = std::min(least, blocks);
    }
    rank_kv_blocks_ = least;
  }
  return rank_kv_blocks_;
}

std::unique_ptr<PagedKvCache> Model::new_kv_cache(int64_t num_blocks, int32_t block_size, KvDtype dtype) const {
  check_kv_dtype(*this, dtype);
  const ParallelGroup* g = placement_.parallel.get();
  if (g != nullptr && g->rank() == 0 && g->world().size() > 1) {
    // Every rank makes the same cache for its layers (and heads).
    if (num_blocks > rank_kv_blocks()) {
      fail(ErrorCode::kResourceExhausted, "a KV cache of {} blocks: another rank has room for only {}", num_blocks,
           rank_kv_blocks());
    }
    const int64_t init[4] = {kInitMessage, num_blocks, block_size, static_cast<int64_t>(dtype)};
    for (int r = 1; r < g->world().size(); ++r) g->world().send(init, sizeof(init), r, kStepTag);
  }
  std::vector<Device*> layers;
  for (int64_t l = 0; l < config().num_layers; ++l) layers.push_back(&placement_.device({PartKind::kAttention, l}));
  for (int64_t l = 0; l < num_mtp_layers(); ++l) layers.push_back(&placement_.device({PartKind::kHead, -1}));
  return std::make_unique<PagedKvCache>(std::move(layers), num_blocks, block_size, cache_k_dim(), cache_v_dim(), dtype);
}

void BatchInput::add_sequence(std::span<const int32_t> tokens, int32_t pos0, std::span<const int32_t> block_table,
                              Logits logits, int32_t lora_adapter) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  const int32_t bs = attention.block_size;
  if (static_cast<int64_t>(block_table.size()) * bs < pos0 + n) {
    fail(ErrorCode::kInternal, "block table of {} blocks cannot hold {} tokens", block_table.size(), pos0 + n);
  }
  const int32_t start = num_tokens();
  for (int32_t i = 0; i < n; ++i) {
    const int32_t pos = pos0 + i;
    token_ids.push_back(tokens[static_cast<size_t>(i)]);
    positions.push_back(pos);
    slot_mapping.push_back(static_cast<int64_t>(block_table[static_cast<size_t>(pos / bs)]) * bs + pos % bs);
    if (logits == Logits::kLastHidden && i == n - 1) hidden_rows.push_back(static_cast<int32_t>(logits_rows.size()));
    if (logits == Logits::kAll || ((logits == Logits::kLast || logits == Logits::kLastHidden) && i == n - 1)) {
      logits_rows.push_back(start + i);
    }
  }
  attention.seqs.push_back(
      PagedSequence{start, n, pos0 + n, block_table.data(), static_cast<int32_t>(block_table.size())});
  if (lora_adapter != 0 && n > 0) {
    if (!lora_runs.empty() && lora_runs.back().adapter == lora_adapter &&
        lora_runs.back().row0 + lora_runs.back().rows == start) {
      lora_runs.back().rows += n;
    } else {
      lora_runs.push_back(LoraRun{start, n, lora_adapter});
    }
  }
  attention.num_tokens = num_tokens();
}

void BatchInput::clear() {
  token_ids.clear();
  positions.clear();
  slot_mapping.clear();
  attention.seqs.clear();
  attention.num_tokens = 0;
  logits_rows.clear();
  hidden_rows.clear();
  lora_runs.clear();
  hidden_out = nullptr;
  windowed.clear();
}

void BatchInput::validate(int64_t num_vocab, int64_t num_slots, int64_t num_lora_slots) const {
  if (token_ids.empty()) fail(ErrorCode::kInvalidArgument, "forward needs at least one token");
  for (int32_t id : token_ids) {
    if (id < 0 || id >= num_vocab) {
      fail(ErrorCode::kInvalidArgument, "token id {} is outside the vocabulary [0, {})", id, num_vocab);
    }
  }
  for (int64_t slot : slot_mapping) {
    if (slot < 0 || slot >= num_slots) {
      fail(ErrorCode::kInvalidArgument, "KV slot {} is outside the cache of {} slots", slot, num_slots);
    }
  }
  for (int32_t r : hidden_rows) {
    if (r < 0 || static_cast<size_t>(r) >= logits_rows.size()) {
      fail(ErrorCode::kInvalidArgument, "hidden row {} is outside the {} logits rows", r, logits_rows.size());
    }
  }
  for (const LoraRun& run : lora_runs) {
    if (run.row0 < 0 || run.rows <= 0 || run.row0 + static_cast<int64_t>(run.rows) > num_tokens()) {
      fail(ErrorCode::kInvalidArgument, "LoRA rows [{}, {}) are outside the batch of {}", run.row0,
           static_cast<int64_t>(run.row0) + run.rows, num_tokens());
    }
    if (run.adapter < 1 || run.adapter > num_lora_slots) {
      fail(ErrorCode::kInvalidArgument, "LoRA adapter slot {} is outside [1, {}]", run.adapter, num_lora_slots);
    }
  }
}

void Model::add_lora(PartContext& c, int64_t layer, std::initializer_list<LoraOutput> outputs, const float* in, int mid_slot,
                     int out_slot) const {
  for (const BatchInput::LoraRun& run : c.batch.lora_runs) {
    const LoraAdapter* adapter = lora_adapter(run.adapter);
    if (adapter == nullptr) fail(ErrorCode::kInternal, "LoRA adapter slot {} is empty", run.adapter);
    if (layer >= adapter->num_layers()) continue;  // a layer after the model's (an MTP layer): none
    const int64_t n = run.rows;
    // A of every projection the adapter updates, in one matmul_shared over the rows' input (one
    // activation quantization, one hand-off to the threads), into consecutive [n, rank] blocks.
    std::vector<std::pair<const LoraPair*, float*>> used;
    int64_t ranks = 0, in_dim = 0;
    for (const LoraOutput& o : outputs) {
      const LoraPair& p = adapter->pair(layer, o.module);
      if (!p.present()) continue;
      used.emplace_back(&p, o.out);
      ranks += p.a.rows;
      in_dim = p.a.cols;
    }
    if (used.empty()) continue;
    float* mid = c.scratch.f32(mid_slot, n * ranks);
    std::vector<Backend::MatmulPart> parts;
    parts.reserve(used.size());
    int64_t offset = 0;
    for (const auto& [p, out] : used) {
      parts.push_back({p->a, mid + offset});
      offset += n * p->a.rows;
    }
    c.ops.matmul_shared(parts, in + run.row0 * in_dim, n);
    // Then each B on its block, added to its projection's rows.
    offset = 0;
    for (const auto& [p, out] : used) {
      const int64_t out_dim = p->b.rows;
      float* delta = c.scratch.f32(out_slot, n * out_dim);
      c.ops.matmul(p->b, mid + offset, n, delta);
      c.ops.add(out + run.row0 * out_dim, delta, n * out_dim);
      offset += n * p->a.rows;
    }
  }
}

void Model::enable_lora(const LoraShape& shape) {
  lora_shape_ = shape;
  lora_.resize(static_cast<size_t>(kMaxLoraAdapters));
  const std::vector<LoraSource> sources = placement_.lora_adapters;
  for (size_t i = 0; i < sources.size(); ++i) {
    if (!sources[i].name.empty()) add_lora_adapter(sources[i], static_cast<int32_t>(i + 1));
  }
}

int32_t Model::add_lora_adapter(const LoraSource& source, int32_t index) {
  if (!lora_shape_) {
    fail(ErrorCode::kUnsupported, "LoRA adapters are not served for the {} architecture", config().architecture);
  }
  for (int32_t i = 1; i <= kMaxLoraAdapters; ++i) {
    const LoraAdapter* a = lora_adapter(i);
    if (a != nullptr && !lora_[static_cast<size_t>(i - 1)].retired && a->name() == source.name) {
      fail(ErrorCode::kInvalidArgument, "a LoRA adapter named '{}' is loaded already", source.name);
    }
    if (index == 0 && a == nullptr) index = i;
  }
  if (index == 0) fail(ErrorCode::kResourceExhausted, "all {} LoRA adapter slots are taken", kMaxLoraAdapters);
  if (index < 1 || index > kMaxLoraAdapters || lora_adapter(index) != nullptr) {
    fail(ErrorCode::kInvalidArgument, "LoRA adapter slot {} is not free", index);
  }
  std::unique_ptr<LoraAdapter> adapter = LoraAdapter::read(source, *lora_shape_);
  std::vector<std::pair<PartId, WeightRef>> tensors;
  int64_t quantized = 0, projections = 0;
  for (int64_t l = 0; l < adapter->num_layers(); ++l) {
    for (int m = 0; m < kNumLoraModules; ++m) {
      const auto module = static_cast<LoraModule>(m);
      LoraPair& pair = adapter->pair(l, module);
      if (!pair.present()) continue;
      if (lora_base(l, module) == nullptr) {
        fail(ErrorCode::kInvalidArgument, "LoRA adapter '{}' ('{}'): layer {} has no {} (a {} layer{})", source.name,
             source.path, l, lora_module_name(module), config().architecture,
             module == LoraModule::kGate || module == LoraModule::kUp || module == LoraModule::kDown
                 ? " with experts: its shared experts are shared_experts.*"
             : module >= LoraModule::kShGate ? " without experts: its feed-forward is gate_proj, up_proj, down_proj"
                                             : "");
      }
      const bool ffn = module == LoraModule::kGate || module == LoraModule::kUp || module == LoraModule::kDown ||
                       module >= LoraModule::kShGate;
      const PartId part{ffn ? PartKind::kFeedForward : PartKind::kAttention, l};
      // Over several ranks: none of a layer another stage runs, this rank's share of its own.
      if (placement_.device(part).remote_rank() >= 0) {
        adapter->drop_pair(l, module);
        continue;
      }
      adapter->shard_pair(l, module, lora_shard(module));
      // Where the device's fast path packs the projection itself into int8 kernels (int8
      // activations), the adapter's matrices go there too, as Q8_0: its f32 path is many times
      // slower per value. A float projection keeps them f32, as the exact path does.
      const WeightView* base = lora_base(l, module);
      const WeightView probe{pair.a.name, DType::kQ8_0, 32, pair.a.cols, nullptr};
      if (derive_lora(l, module, *adapter)) {
        for (WeightView& d : pair.derived) tensors.push_back({part, {&d, true}});
      } else if (ops(part).packs(*base) && base->type != DType::kF32 && base->type != DType::kF16 &&
                 base->type != DType::kBF16 && ops(part).packs(probe)) {
        adapter->quantize_pair_q8_0(l, module);
        ++quantized;
      }
      tensors.push_back({part, {&pair.a, true}});
      tensors.push_back({part, {&pair.b, true}});
      ++projections;
    }
  }
  // Routed experts' updates, on the device of the layer's experts, f32; under expert parallelism
  // only this rank's experts'.
  const auto [first_expert, num_experts] = lora_expert_range();
  for (int64_t l = 0; l < adapter->num_layers(); ++l) {
    if (!adapter->has_experts(l)) continue;
    if (!lora_has_experts(l)) {
      fail(ErrorCode::kInvalidArgument, "LoRA adapter '{}' ('{}'): layer {} has no routed experts (a dense layer: its "
           "feed-forward is gate_proj, up_proj, down_proj)", source.name, source.path, l);
    }
    const PartId part{PartKind::kExperts, l};
    const bool remote = placement_.device(part).remote_rank() >= 0;
    if (!remote && !placement_.device(part).host_accessible()) {
      fail(ErrorCode::kUnsupported, "LoRA adapter '{}': routed experts' updates run on a CPU device, and layer {}'s "
           "experts are on {}", source.name, l, placement_.device(part).name());
    }
    for (int64_t e = 0; e < adapter->num_experts(l); ++e) {
      for (int which = 0; which < 3; ++which) {
        LoraPair& pair = adapter->expert_pair(l, e, which);
        if (!pair.present()) continue;
        if (remote || e < first_expert || e - first_expert >= num_experts) {
          adapter->drop_expert_pair(l, e, which);
          continue;
        }
        tensors.push_back({part, {&pair.a, true}});
        tensors.push_back({part, {&pair.b, true}});
        ++projections;
      }
    }
  }
  spdlog::info("LoRA adapter '{}' ({}) in slot {}: rank {}, scale {:.4g}, {}; {} of {} projections as Q8_0; {:.1f} MiB",
               adapter->name(), adapter->path(), index, adapter->rank(), adapter->scale(),
               fmt::join(adapter->modules(), ", "), quantized, projections,
               static_cast<double>(adapter->bytes()) / (1 << 20));
  LoraSlot& slot = lora_[static_cast<size_t>(index - 1)];
  slot.loaded = load_tensors(tensors);
  slot.adapter = std::move(adapter);
  if (placement_.lora_adapters.size() < static_cast<size_t>(index)) placement_.lora_adapters.resize(static_cast<size_t>(index));
  placement_.lora_adapters[static_cast<size_t>(index - 1)] = source;
  return index;
}

void Model::retire_lora_adapter(int32_t index) {
  if (lora_adapter(index) == nullptr) return;
  lora_[static_cast<size_t>(index - 1)].retired = true;
  placement_.lora_adapters[static_cast<size_t>(index - 1)] = LoraSource{};
}

void Model::remove_lora_adapter(int32_t index) {
  if (lora_adapter(index) == nullptr) return;
  LoraSlot& slot = lora_[static_cast<size_t>(index - 1)];
  slot.loaded.clear();  // the devices' copies first, then the matrices they were made from
  slot.adapter.reset();
  slot.retired = false;
  placement_.lora_adapters[static_cast<size_t>(index - 1)] = LoraSource{};
}

SequenceRunner::SequenceRunner(Model& model, int64_t capacity, int32_t block_size, KvDtype kv_dtype)
    : model_(model), capacity_(capacity) {
  // Positions are 32-bit, and a context past the host's memory is refused here, by its size (a
  // bench -p of 2^31 tokens asked for a terabyte and paged until killed). Caches on a GPU are
  // checked by their own allocation.
  if (capacity > std::numeric_limits<int32_t>::max()) {
    fail(ErrorCode::kInvalidArgument, "a context of {} tokens is more than a sequence may hold ({} positions)",
         capacity, std::numeric_limits<int32_t>::max());
  }
  const int64_t num_blocks = std::max<int64_t>(1, (capacity + block_size - 1) / block_size);
  const std::vector<std::shared_ptr<Device>>& devices = model.placement().devices;
  if (std::all_of(devices.begin(), devices.end(), [](const auto& d) { return d->host_accessible(); })) {
    const int64_t need = model.kv_bytes_per_token(kv_dtype) * num_blocks * block_size;
    const int64_t available = available_memory_bytes();
    if (available > 0 && need > available) {
      fail(ErrorCode::kResourceExhausted, "a context of {} tokens takes {:.1f} GiB of KV cache, more than the {:.1f} "
           "GiB of memory available", capacity, static_cast<double>(need) / (1 << 30),
           static_cast<double>(available) / (1 << 30));
    }
  }
  cache_ = model.new_kv_cache(num_blocks, block_size, kv_dtype);
  block_table_.resize(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) block_table_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  batch_.attention.block_size = block_size;
}

void SequenceRunner::forward(std::span<const int32_t> tokens, int64_t pos0, float* logits, bool all_logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) fail(ErrorCode::kInvalidArgument, "forward needs at least one token");
  if (pos0 < 0 || pos0 + n > capacity_) {
    fail(ErrorCode::kInvalidArgument, "{} tokens at position {} do not fit in a context of {} positions", n, pos0,
         capacity_);
  }
  batch_.clear();
  batch_.add_sequence(tokens, static_cast<int32_t>(pos0), block_table_,
                      all_logits ? BatchInput::Logits::kAll : BatchInput::Logits::kLast, lora_adapter_);
  model_.forward(batch_, *cache_, logits);
}

std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file, Placement placement) {
  const Registration& r = registration(*file);
  return r.factory(std::move(file), std::move(placement));
}

std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file, Backend& backend) {
  const Registration& r = registration(*file);
  Placement p = place_all_on(*file, make_host_device(backend), 0);
  return r.factory(std::move(file), std::move(p));
}

Placement plan_model_placement(const GgufFile& file, const DeviceMapSpec& map, DeviceRegistry& devices,
                               const KvBudget& budget, KvDtype kv_dtype, std::shared_ptr<ParallelGroup> parallel) {
  const auto [k, v] = registration(file).cache_dims(file);
  const int64_t row = static_cast<int64_t>(kv_row_bytes(kv_dtype, k) + kv_row_bytes(kv_dtype, v));
  Placement p = plan_placement(file, map, devices, budget, row);
  if (parallel == nullptr) return p;
  return place_stages(file, std::move(p), std::move(parallel), row);
}

int64_t file_kv_bytes_per_token(const GgufFile& file, KvDtype dtype) {
  const auto [k, v] = registration(file).cache_dims(file);
  const std::string arch = file.get_string_or("general.architecture", "");
  const int64_t layers = HParams(file, arch).layer_count("block_count");
  return layers * static_cast<int64_t>(kv_row_bytes(dtype, k) + kv_row_bytes(dtype, v));
}

int64_t file_context_length(const GgufFile& file) {
  const std::string arch = file.get_string_or("general.architecture", "");
  return file.get_int_or(arch + ".context_length", 2048);
}

void stop_other_ranks(const ParallelGroup& group) {
  if (group.rank() != 0 || group.world().broken()) return;
  try {
    const uint32_t stop = kStopMessage;
    for (int r = 1; r < group.world().size(); ++r) group.world().send(&stop, 4, r, kStepTag);
  } catch (const Error& e) {
    spdlog::warn("the other ranks were not told to stop: {}", e.what());
  }
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> names;
  for (const Registration& r : kArchitectures) names.emplace_back(r.architecture);
  return names;
}

}  // namespace duet
