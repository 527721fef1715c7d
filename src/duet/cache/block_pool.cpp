#include "duet/cache/block_pool.h"

#include <algorithm>
#include <cstddef>

#include "duet/core/error.h"
#include "duet/core/random.h"

namespace duet {

BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens) {
  // Parent and length first, then one bijective round per token: for a fixed state, different
  // tokens always give different next states.
  uint64_t h = mix64(parent + kGolden);
  h = mix64(h ^ (static_cast<uint64_t>(tokens.size()) * kGolden));
  for (int32_t token : tokens) {
    h = mix64((h + kGolden) ^ static_cast<uint64_t>(static_cast<uint32_t>(token)));
  }
  return h;
}

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size) : block_size_(block_size) {
  if (num_blocks < 0) fail(ErrorCode::kInvalidArgument, "block pool: num_blocks is {}, expected >= 0", num_blocks);
  if (block_size <= 0) fail(ErrorCode::kInvalidArgument, "block pool: block_size is {}, expected > 0", block_size);
  const auto n = static_cast<size_t>(num_blocks);
  ref_counts_.assign(n, 0);
  prev_.assign(n, kNone);
  next_.assign(n, kNone);
  cached_.assign(n, 0);
  hashes_.assign(n, 0);
  tokens_.assign(n * static_cast<size_t>(block_size), 0);
  for (BlockId id = 0; id < num_blocks; ++id) push_back_free(id);
}

void BlockPool::check_id(BlockId id, const char* what) const {
  if (id < 0 || id >= num_blocks()) {
    fail(ErrorCode::kInvalidArgument, "block pool: {} of block {}, expected an id in [0, {})", what, id,
         num_blocks());
  }
}

int32_t BlockPool::ref_count(BlockId id) const {
  check_id(id, "ref_count");
  return ref_counts_[id];
}

void BlockPool::push_back_free(BlockId id) {
  prev_[id] = tail_;
  next_[id] = kNone;
  if (tail_ != kNone) {
    next_[tail_] = id;
  } else {
    head_ = id;
  }
  tail_ = id;
  ++num_free_;
  if (cached_[id]) ++num_cached_free_;
}

void BlockPool::unlink_free(BlockId id) {
  const BlockId prev = prev_[id];
  const BlockId next = next_[id];
  if (prev != kNone) {
    next_[prev] = next;
  } else {
    head_ = next;
  }
  if (next != kNone) {
    prev_[next] = prev;
  } else {
    tail_ = prev;
  }
  prev_[id] = kNone;
  next_[id] = kNone;
  --num_free_;
  if (cached_[id]) --num_cached_free_;
}

void BlockPool::evict(BlockId id) {
  if (!cached_[id]) return;
  auto it = by_hash_.find(hashes_[id]);
  if (it != by_hash_.end() && it->second == id) by_hash_.erase(it);
  cached_[id] = 0;
  hashes_[id] = 0;
  if (ref_counts_[id] == 0) --num_cached_free_;
}

std::optional<std::vector<BlockId>> BlockPool::allocate(int32_t n) {
  if (n < 0) fail(ErrorCode::kInvalidArgument, "block pool: allocate {} blocks, expected n >= 0", n);
  if (n > num_free_) return std::nullopt;
  std::vector<BlockId> blocks;
  blocks.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const BlockId id = head_;
    evict(id);
    unlink_free(id);
    ref_counts_[id] = 1;
    blocks.push_back(id);
  }
  return blocks;
}

void BlockPool::add_ref(BlockId id) {
  check_id(id, "add_ref");
  if (ref_counts_[id] == 0) unlink_free(id);
  ++ref_counts_[id];
}

void BlockPool::release(BlockId id) {
  check_id(id, "release");
  if (ref_counts_[id] == 0) {
    fail(ErrorCode::kInvalidArgument, "block pool: release of block {}, which is already free", id);
  }
  if (--ref_counts_[id] == 0) push_back_free(id);
}

std::optional<BlockId> BlockPool::lookup(BlockHash hash, std::span<const int32_t> tokens) const {
  if (tokens.size() != static_cast<size_t>(block_size_)) return std::nullopt;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const BlockId id = it->second;
  const int32_t* stored = tokens_.data() + static_cast<size_t>(id) * block_size_;
  if (!std::equal(tokens.begin(), tokens.end(), stored)) return std::nullopt;  // a hash collision
  return id;
}

bool BlockPool::cache(BlockId id, BlockHash hash, std::span<const int32_t> tokens) {
  check_id(id, "cache");
  if (tokens.size() != static_cast<size_t>(block_size_)) {
    fail(ErrorCode::kInvalidArgument, "block pool: cache block {} with {} tokens, expected a full block of {}", id,
         tokens.size(), block_size_);
  }
  if (ref_counts_[id] == 0) {
    fail(ErrorCode::kInvalidArgument, "block pool: cache block {}, which is free (only referenced blocks are cached)",
         id);
  }
  if (cached_[id] || by_hash_.count(hash) != 0) return false;
  cached_[id] = 1;
  hashes_[id] = hash;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(id) * block_size_);
  by_hash_.emplace(hash, id);
  return true;
}

std::span<const int32_t> BlockPool::cached_tokens(BlockId id) const {
  check_id(id, "cached_tokens");
  return std::span<const int32_t>(tokens_.data() + static_cast<size_t>(id) * block_size_, static_cast<size_t>(block_size_));
}

bool BlockPool::is_cached(BlockId id) const {
  check_id(id, "is_cached");
  return cached_[id] != 0;
}

std::optional<BlockHash> BlockPool::cached_hash(BlockId id) const {
  check_id(id, "cached_hash");
  if (!cached_[id]) return std::nullopt;
  return hashes_[id];
}

int32_t BlockPool::reset_cache() {
  const auto num = static_cast<int32_t>(by_hash_.size());
  by_hash_.clear();
  std::fill(cached_.begin(), cached_.end(), 0);
  std::fill(hashes_.begin(), hashes_.end(), 0);
  num_cached_free_ = 0;
  return num;
}

std::vector<BlockId> BlockPool::free_queue() const {
  std::vector<BlockId> order;
  order.reserve(static_cast<size_t>(num_free_));
  // Bounded walk: a corrupted list (a cycle) shows up as more entries than blocks, not a hang.
  for (BlockId id = head_; id != kNone && order.size() <= ref_counts_.size(); id = next_[id]) {
    order.push_back(id);
  }
  return order;
}

}  // namespace duet
