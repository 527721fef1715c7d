#include "duet/model/model.h"

#include <algorithm>

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/core/numa.h"
#include "duet/model/deepseek2.h"
#include "duet/model/llama.h"
#include "duet/model/qwen2.h"

namespace duet {
namespace {

using Factory = std::unique_ptr<Model> (*)(std::shared_ptr<const GgufFile>, Backend&);

struct Registration {
  const char* architecture;
  Factory factory;
};

// One line per architecture.
constexpr Registration kArchitectures[] = {
    {"llama", make_llama_model},
    {"qwen2", make_qwen2_model},
    {"deepseek2", make_deepseek2_model},
};

// Whether `dtype` can hold the model's heads (q8_0: whole 32-value blocks); throws naming them.
void check_kv_dtype(const Model& model, KvDtype dtype) {
  const auto [dk, dv] = model.cache_head_dims();
  if (dtype == KvDtype::kQ8_0 && (dk % 32 != 0 || dv % 32 != 0)) {
    fail(ErrorCode::kInvalidArgument,
         "a q8_0 KV cache holds heads in whole blocks of 32 values; this model's heads are {} (key) and {} (value) "
         "wide: use f16 or f32",
         dk, dv);
  }
}

}  // namespace

PagedKvCache::PagedKvCache(int64_t num_layers, int64_t num_blocks, int32_t block_size, int64_t k_dim, int64_t v_dim,
                           KvDtype dtype)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      k_dim_(k_dim),
      v_dim_(v_dim),
      dtype_(dtype),
      k_row_(static_cast<int64_t>(kv_row_bytes(dtype, k_dim))),
      v_row_(static_cast<int64_t>(kv_row_bytes(dtype, v_dim))) {
  if (num_blocks <= 0 || block_size <= 0) {
    fail(ErrorCode::kInvalidArgument, "a KV cache needs blocks: {} blocks of {} tokens", num_blocks, block_size);
  }
  // In transparent huge pages: attention reads each key and value row of a sequence from another
  // block, so with 4 KiB pages nearly every row is a TLB miss (measured: a 16-sequence decode
  // step's attention takes 15-30% less time in huge pages). Pages are still committed as blocks
  // are first written, 2 MiB at a time.
  memory_ = AnonymousMemory(static_cast<size_t>(num_layers * layer_bytes()), /*huge_pages=*/true);
  numa_place(memory_.data(), memory_.size(), numa_mode(), numa_topology());
}

int64_t Model::kv_bytes_per_token(KvDtype dtype) const {
  check_kv_dtype(*this, dtype);
  return config().num_layers *
         static_cast<int64_t>(kv_row_bytes(dtype, cache_k_dim()) + kv_row_bytes(dtype, cache_v_dim()));
}

std::unique_ptr<PagedKvCache> Model::new_kv_cache(int64_t num_blocks, int32_t block_size, KvDtype dtype) const {
  check_kv_dtype(*this, dtype);
  return std::make_unique<PagedKvCache>(config().num_layers, num_blocks, block_size, cache_k_dim(), cache_v_dim(),
                                        dtype);
}

void BatchInput::add_sequence(std::span<const int32_t> tokens, int32_t pos0, std::span<const int32_t> block_table,
                              Logits logits) {
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
    if (logits == Logits::kAll || (logits == Logits::kLast && i == n - 1)) logits_rows.push_back(start + i);
  }
  attention.seqs.push_back(
      PagedSequence{start, n, pos0 + n, block_table.data(), static_cast<int32_t>(block_table.size())});
  attention.num_tokens = num_tokens();
}

void BatchInput::clear() {
  token_ids.clear();
  positions.clear();
  slot_mapping.clear();
  attention.seqs.clear();
  attention.num_tokens = 0;
  logits_rows.clear();
}

void BatchInput::validate(int64_t num_vocab, int64_t num_slots) const {
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
}

SequenceRunner::SequenceRunner(Model& model, int64_t capacity, int32_t block_size, KvDtype kv_dtype)
    : model_(model), capacity_(capacity) {
  const int64_t num_blocks = std::max<int64_t>(1, (capacity + block_size - 1) / block_size);
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
                      all_logits ? BatchInput::Logits::kAll : BatchInput::Logits::kLast);
  model_.forward(batch_, *cache_, logits);
}

std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file, Backend& backend) {
  const std::string arch = file->get_string_or("general.architecture", "");
  for (const Registration& r : kArchitectures) {
    if (arch == r.architecture) return r.factory(std::move(file), backend);
  }
  fail(ErrorCode::kUnsupported, "'{}': architecture '{}' is not supported (supported: {})", file->path(),
       arch.empty() ? "(general.architecture missing)" : arch, fmt::join(supported_architectures(), ", "));
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> names;
  for (const Registration& r : kArchitectures) names.emplace_back(r.architecture);
  return names;
}

}  // namespace duet
