// A fixed pool of KV blocks: reference counts, a free queue in LRU order, and the prefix-cache
// index (block hash -> block) over full blocks. Block ids and metadata only, no tensors.
//
// Every operation is O(1) (allocate: O(1) per block; cache/lookup: O(block_size) to store or
// compare the tokens). The free queue is an intrusive doubly-linked list over block ids, so it
// allocates nothing after construction. A block is in the free queue exactly when its reference
// count is 0. A free block keeps its cached prefix (if any) until allocate() hands it out again.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace duet {

using BlockId = int32_t;
using BlockHash = uint64_t;

// The chained hash of a full block: its parent's hash (0 for the first block) and its tokens.
// A splitmix64-style mix over plain 64-bit integer arithmetic: the same value on every run and
// platform. Collisions are possible in principle; lookups compare tokens, so they are harmless.
BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens);

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t block_size() const { return block_size_; }
  // Blocks no sequence references, cached or not: what allocate() can hand out.
  int32_t num_free_blocks() const { return num_free_; }
  int32_t num_cached_free_blocks() const { return num_cached_free_; }
  int32_t num_cached_blocks() const { return static_cast<int32_t>(by_hash_.size()); }
  int32_t ref_count(BlockId id) const;  // throws kInvalidArgument for an id outside the pool

  // Takes n blocks from the head of the free queue (least recently freed first), evicting any
  // cached prefix they held; each comes back with reference count 1. nullopt (and no change)
  // when fewer than n are free.
  std::optional<std::vector<BlockId>> allocate(int32_t n);
  // One more reference; a free block that is taken again (a prefix hit) leaves the free queue.
  void add_ref(BlockId id);
  // One reference fewer; at zero the block goes to the tail of the free queue, keeping its
  // cached prefix until it is reused. Releasing a free block throws kInvalidArgument.
  void release(BlockId id);

  // The cached block with this hash whose tokens equal `tokens`, or nullopt.
  std::optional<BlockId> lookup(BlockHash hash, std::span<const int32_t> tokens) const;
  // Marks a full, referenced block as holding `tokens` under `hash`. A block already holding a
  // cached prefix, or a hash already cached in another block, is left as it is (and false is
  // returned; true when the block was registered). Throws kInvalidArgument when tokens is not
  // one block long or the block is free.
  bool cache(BlockId id, BlockHash hash, std::span<const int32_t> tokens);
  bool is_cached(BlockId id) const;
  // The hash a cached block is registered under; nullopt when it holds no cached prefix.
  std::optional<BlockHash> cached_hash(BlockId id) const;
  // The tokens a cached block holds (meaningful only while is_cached(id)).
  std::span<const int32_t> cached_tokens(BlockId id) const;
  // Forgets every cached prefix. Returns how many blocks held one.
  int32_t reset_cache();

  // The free queue from head (next to allocate) to tail. O(num_blocks): for tests and debugging.
  std::vector<BlockId> free_queue() const;

 private:
  static constexpr BlockId kNone = -1;

  void check_id(BlockId id, const char* what) const;
  void push_back_free(BlockId id);
  void unlink_free(BlockId id);
  void evict(BlockId id);

  int32_t block_size_;
  std::vector<int32_t> ref_counts_;
  // Free queue (LRU): an intrusive doubly-linked list, head = next to reuse.
  std::vector<BlockId> prev_;
  std::vector<BlockId> next_;
  BlockId head_ = kNone;
  BlockId tail_ = kNone;
  int32_t num_free_ = 0;
  int32_t num_cached_free_ = 0;
  // Prefix cache, per block: whether it holds a cached prefix, its hash, and its tokens (a flat
  // num_blocks x block_size array, so caching allocates nothing).
  std::vector<uint8_t> cached_;
  std::vector<BlockHash> hashes_;
  std::vector<int32_t> tokens_;
  std::unordered_map<BlockHash, BlockId> by_hash_;
};

}  // namespace duet
