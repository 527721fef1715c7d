// The KV cache manager: which KV blocks each sequence holds, prefix caching over full blocks,
// reference counts and copy-on-write for forked sequences. Block ids and bookkeeping only: the
// tensors live with the model runner, which executes the block copies this manager asks for.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "duet/cache/block_pool.h"

namespace duet {

using SeqId = int64_t;

struct KvCacheConfig {
  int32_t block_size = 16;       // tokens per block
  int32_t num_blocks = 0;        // blocks in the pool
  bool enable_prefix_caching = true;
  // Keep a log of the blocks registered in the prefix cache (take_new_cached_blocks): for a tier
  // that stores them elsewhere.
  bool record_new_cached_blocks = false;
};

// A block this manager registered in the prefix cache: its id, its chained hash and its parent's
// (0 for the first block of a sequence).
struct NewCachedBlock {
  BlockId block = 0;
  BlockHash hash = 0;
  BlockHash parent = 0;
};

// Blocks being imported into the prefix cache from another tier (begin_import / end_import):
// blocks[i] is block first + i of the chain, to be filled with the K/V of its tokens.
struct BlockImport {
  std::vector<BlockId> pinned;  // the local prefix (blocks 0 .. first - 1), referenced meanwhile
  int32_t first = 0;
  std::vector<BlockId> blocks;
  std::vector<BlockHash> hashes;  // chained hashes of `blocks`
};

// The chained hashes of the first num_blocks full blocks of `tokens` (as the prefix cache keys them).
// `salt` stands for the first block's parent: sequences whose K/V differ for the same tokens (a
// LoRA adapter's, a request's cache_salt) start their chains from different salts, so they never
// share a cached block. 0 is the base model's.
std::vector<BlockHash> chain_hashes(std::span<const int32_t> tokens, int32_t num_blocks, int32_t block_size,
                                    BlockHash salt = 0);

// The cached prefix of a new sequence: full blocks whose tokens equal the sequence's first
// tokens. num_tokens = blocks.size() * block_size, and always < the sequence's token count.
// hashes[i] is the chained hash of blocks[i]: the new sequence continues the chain from them, and
// allocate_slots checks them to refuse a hit whose blocks were evicted in the meantime.
struct PrefixHit {
  std::vector<BlockId> blocks;
  int32_t num_tokens = 0;
  std::vector<BlockHash> hashes;
};

struct KvCacheStats {
  int64_t prefix_queries = 0;  // tokens looked up in the prefix cache
  int64_t prefix_hits = 0;     // of those, tokens found
  int32_t num_blocks = 0;
  int32_t num_used_blocks = 0;      // referenced by at least one sequence
  int32_t num_cached_free_blocks = 0;  // unreferenced but still holding a cached prefix
  // Token slots allocated to sequences but not filled, over slots allocated (0 when none are).
  double fragmentation = 0.0;
  double usage() const { return num_blocks == 0 ? 0.0 : static_cast<double>(num_used_blocks) / num_blocks; }
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  int32_t block_size() const { return config_.block_size; }

  // The longest cached prefix of `tokens` (whole blocks, tokens compared on every hit), capped so
  // that at least the last token is still computed (the model needs its logits). Counts the
  // query and the hit in the stats. Takes no references: pass the result to allocate_slots in
  // the same step, before any other allocation can evict its blocks. Always empty (and not
  // counted) when prefix caching is off. `salt`: see chain_hashes.
  PrefixHit find_cached_prefix(std::span<const int32_t> tokens, BlockHash salt = 0);

  // Makes `seq` able to hold num_computed_tokens + num_new_tokens tokens. For a sequence the
  // manager does not know yet, `hit` (from find_cached_prefix; its tokens count as computed)
  // becomes the start of its block table: num_computed_tokens must equal hit->num_tokens (0
  // without a hit). When the block that the first new token goes into is shared with another
  // sequence (a fork), it is copied first: a new block replaces it in the table and the
  // (source, destination) pair is queued for take_pending_copies(). Any later block of the table
  // that the new tokens reach and that is still shared gets a fresh block too (no copy: it holds
  // none of this sequence's computed tokens).
  // Returns false and changes nothing when the pool has too few free blocks: that is the normal
  // answer the scheduler meets by preempting, not an error. Throws kInvalidArgument on misuse:
  // negative counts, a hit for a known sequence, a hit whose blocks were evicted since
  // find_cached_prefix, num_computed_tokens beyond the slots the sequence holds or inside its
  // cached blocks. A new sequence's blocks are cached under `salt` (its hit's, see chain_hashes);
  // a known sequence keeps the salt it started with.
  bool allocate_slots(SeqId seq, int32_t num_computed_tokens, int32_t num_new_tokens, const PrefixHit* hit = nullptr,
                      BlockHash salt = 0);

  // Whether every block of `hit` still holds the prefix find_cached_prefix found in it. A hit
  // goes stale when an allocation in between (another sequence's, or a sibling's of the same
  // request) reuses one of its free blocks; allocate_slots throws for a stale hit. A caller that
  // keeps hits across allocations checks this first and looks the prefix up again when false.
  bool prefix_hit_is_current(const PrefixHit& hit) const;

  // After a step: registers every block of `seq` that the first num_computed_tokens of `tokens`
  // fill completely in the prefix cache (chained hash of the parent block's hash and the
  // block's tokens). `tokens` are all of the sequence's tokens so far (prompt and output). A block
  // whose prefix another block already holds stays uncached. No-op when prefix caching is off;
  // otherwise throws kInvalidArgument for an unknown sequence or counts that do not fit.
  void cache_full_blocks(SeqId seq, std::span<const int32_t> tokens, int32_t num_computed_tokens);

  // `child` starts with the same block table as `parent`, sharing every block (and its token
  // count and cached-block hashes). Throws kInvalidArgument for an unknown parent or a known child.
  void fork(SeqId parent, SeqId child);

  // Releases every block of `seq`, last block first, so that the blocks of a prefix stay cached
  // the longest. Pending copies into a block that this leaves free are dropped. Unknown ids are
  // ignored.
  void free(SeqId seq);

  // Block copies that must run before the next forward pass (copy-on-write), emptied by this call.
  // Run them before any KV write of that pass: a source may have been freed and handed to another
  // sequence in the same step, which only writes into it during the pass.
  std::vector<std::pair<BlockId, BlockId>> take_pending_copies();

  const std::vector<BlockId>& block_table(SeqId seq) const;  // throws kInvalidArgument if unknown
  bool has(SeqId seq) const { return tables_.count(seq) != 0; }
  int32_t num_free_blocks() const { return pool_.num_free_blocks(); }
  // Free blocks needed to add num_new_tokens to a sequence holding num_tokens (ignores sharing).
  int32_t blocks_needed(int32_t num_tokens, int32_t num_new_tokens) const;

  // Read-only view of the pool (ref counts, free queue, cached blocks): for metrics and tests.
  const BlockPool& pool() const { return pool_; }

  KvCacheStats stats() const;  // O(number of sequences)
  // Blocks registered in the prefix cache since the last call, in the order registered (empty
  // unless record_new_cached_blocks). Their contents are final: they are full, and computed.
  std::vector<NewCachedBlock> take_new_cached_blocks();

  // Whole blocks of `tokens` the prefix cache holds now, from the first on (no stats counted).
  int32_t num_cached_prefix_blocks(std::span<const int32_t> tokens, BlockHash salt = 0) const;
  // Starts importing blocks [first, first + count) of `tokens`' chain from another tier: pins the
  // local prefix and takes free blocks for those of the range it lacks (fewer when fewer are free,
  // never a block of the prefix). nullopt when the local prefix ends before `first`, covers the
  // range already, or no block is free. Fill the blocks' K/V, then call end_import.
  std::optional<BlockImport> begin_import(std::span<const int32_t> tokens, int32_t first, int32_t count,
                                          BlockHash salt = 0);
  // Registers the first num_filled blocks of `import` in the prefix cache and releases every block
  // it took: the unfilled ones first, then the imported ones (last first) and the pinned prefix,
  // so that they sit at the tail of the free queue, the prefix last to be evicted.
  void end_import(const BlockImport& import, std::span<const int32_t> tokens, int32_t num_filled);

  // Drops every cached prefix (the blocks stay allocated to their sequences). Returns how many
  // cached blocks were dropped. Running sequences do not register the dropped blocks again; the
  // blocks they fill from now on are registered as usual.
  int32_t reset_prefix_cache();

  // Memory pressure: takes up to `n` free blocks (least recently used first, cached prefixes
  // evicted) out of the pool for good, so that their memory can be returned; returns their ids.
  // The pool then holds num_usable_blocks() blocks for sequences.
  std::vector<BlockId> withhold_blocks(int32_t n);
  int32_t num_withheld_blocks() const { return static_cast<int32_t>(withheld_.size()); }
  int32_t num_usable_blocks() const { return config_.num_blocks - num_withheld_blocks(); }

 private:
  struct SeqState {
    std::vector<BlockId> blocks;
    int32_t num_tokens = 0;  // token slots the sequence has asked for so far
    // Chained hashes of the leading blocks already registered in the prefix cache (or skipped
    // because another block holds the same prefix): num_cached_blocks = block_hashes.size().
    std::vector<BlockHash> block_hashes;
    BlockHash salt = 0;  // the first block's parent (chain_hashes)
  };

  static int32_t ceil_blocks(int64_t num_tokens, int32_t block_size);
  void check_hit(const PrefixHit& hit) const;

  KvCacheConfig config_;
  BlockPool pool_;
  std::vector<BlockId> withheld_;  // taken out of the pool (withhold_blocks), held for good
  std::unordered_map<SeqId, SeqState> tables_;
  std::vector<std::pair<BlockId, BlockId>> pending_copies_;
  std::vector<NewCachedBlock> new_cached_;
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
};

}  // namespace duet
