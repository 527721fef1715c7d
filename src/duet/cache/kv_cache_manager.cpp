#include "duet/cache/kv_cache_manager.h"

#include <algorithm>
#include <limits>

#include "duet/core/error.h"

namespace duet {

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_(config), pool_(config.num_blocks, config.block_size) {}

int32_t KvCacheManager::ceil_blocks(int64_t num_tokens, int32_t block_size) {
  return static_cast<int32_t>((num_tokens + block_size - 1) / block_size);
}

PrefixHit KvCacheManager::find_cached_prefix(std::span<const int32_t> tokens, BlockHash salt) {
  PrefixHit hit;
  if (!config_.enable_prefix_caching) return hit;
  const auto bs = static_cast<size_t>(config_.block_size);
  // At least the last token is computed, for its logits: whole blocks within tokens.size() - 1.
  const size_t max_blocks = tokens.empty() ? 0 : (tokens.size() - 1) / bs;
  BlockHash parent = salt;
  for (size_t i = 0; i < max_blocks; ++i) {
    const std::span<const int32_t> block_tokens = tokens.subspan(i * bs, bs);
    const BlockHash hash = hash_block(parent, block_tokens);
    const std::optional<BlockId> block = pool_.lookup(hash, block_tokens);
    if (!block) break;
    hit.blocks.push_back(*block);
    hit.hashes.push_back(hash);
    parent = hash;
  }
  hit.num_tokens = static_cast<int32_t>(hit.blocks.size() * bs);
  prefix_queries_ += static_cast<int64_t>(tokens.size());
  prefix_hits_ += hit.num_tokens;
  return hit;
}

void KvCacheManager::check_hit(const PrefixHit& hit) const {
  if (hit.hashes.size() != hit.blocks.size()) {
    fail(ErrorCode::kInvalidArgument, "prefix hit has {} blocks but {} hashes, expected one hash per block",
         hit.blocks.size(), hit.hashes.size());
  }
  const int64_t expected_tokens = static_cast<int64_t>(hit.blocks.size()) * config_.block_size;
  if (hit.num_tokens != expected_tokens) {
    fail(ErrorCode::kInvalidArgument, "prefix hit covers {} tokens, expected {} ({} blocks of {})", hit.num_tokens,
         expected_tokens, hit.blocks.size(), config_.block_size);
  }
  for (size_t i = 0; i < hit.blocks.size(); ++i) {
    const BlockId block = hit.blocks[i];
    if (block < 0 || block >= pool_.num_blocks() || pool_.cached_hash(block) != hit.hashes[i]) {
      fail(ErrorCode::kInvalidArgument,
           "prefix hit block {} (index {}) no longer holds the cached prefix it was found with: pass "
           "find_cached_prefix's result to allocate_slots before any other allocation, or check "
           "prefix_hit_is_current",
           block, i);
    }
  }
}

bool KvCacheManager::prefix_hit_is_current(const PrefixHit& hit) const {
  if (hit.hashes.size() != hit.blocks.size()) return false;
  for (size_t i = 0; i < hit.blocks.size(); ++i) {
    const BlockId block = hit.blocks[i];
    if (block < 0 || block >= pool_.num_blocks() || pool_.cached_hash(block) != hit.hashes[i]) return false;
  }
  return true;
}

bool KvCacheManager::allocate_slots(SeqId seq, int32_t num_computed_tokens, int32_t num_new_tokens,
                                    const PrefixHit* hit, BlockHash salt) {
  if (num_computed_tokens < 0 || num_new_tokens < 0) {
    fail(ErrorCode::kInvalidArgument, "allocate_slots for sequence {}: num_computed_tokens {} and num_new_tokens {}, "
         "expected both >= 0", seq, num_computed_tokens, num_new_tokens);
  }
  const int32_t bs = config_.block_size;
  const int64_t total_tokens = static_cast<int64_t>(num_computed_tokens) + num_new_tokens;
  if (total_tokens > std::numeric_limits<int32_t>::max()) {
    fail(ErrorCode::kInvalidArgument, "allocate_slots for sequence {}: {} tokens do not fit in int32", seq,
         total_tokens);
  }
  if (hit != nullptr && hit->blocks.empty()) hit = nullptr;  // an empty hit is no hit

  auto it = tables_.find(seq);
  const bool is_new = it == tables_.end();
  int32_t num_hit_free = 0;  // hit blocks that leave the free queue when referenced
  if (is_new) {
    const int32_t hit_tokens = hit != nullptr ? hit->num_tokens : 0;
    if (hit != nullptr) check_hit(*hit);
    if (num_computed_tokens != hit_tokens) {
      fail(ErrorCode::kInvalidArgument, "allocate_slots for new sequence {}: num_computed_tokens is {}, expected {} "
           "(the tokens of its prefix hit)", seq, num_computed_tokens, hit_tokens);
    }
    if (hit != nullptr) {
      for (BlockId block : hit->blocks) num_hit_free += pool_.ref_count(block) == 0 ? 1 : 0;
    }
  } else {
    const SeqState& state = it->second;
    if (hit != nullptr) {
      fail(ErrorCode::kInvalidArgument, "allocate_slots for sequence {}: a prefix hit only starts a new sequence, "
           "and this one already holds {} blocks", seq, state.blocks.size());
    }
    const auto cached_tokens = static_cast<int64_t>(state.block_hashes.size()) * bs;
    if (num_computed_tokens > state.num_tokens || num_computed_tokens < cached_tokens) {
      fail(ErrorCode::kInvalidArgument, "allocate_slots for sequence {}: num_computed_tokens is {}, expected between "
           "{} (its cached blocks) and {} (its slots)", seq, num_computed_tokens, cached_tokens, state.num_tokens);
    }
  }

  // Count everything before touching anything: on failure nothing may change.
  const std::vector<BlockId>* table = is_new ? nullptr : &it->second.blocks;
  const int32_t num_current = is_new ? (hit != nullptr ? static_cast<int32_t>(hit->blocks.size()) : 0)
                                     : static_cast<int32_t>(table->size());
  const int32_t num_target = ceil_blocks(total_tokens, bs);
  const int32_t num_append = std::max(0, num_target - num_current);
  // Blocks of the table that the new tokens write into and that another sequence shares.
  // (For a new sequence the table holds only full hit blocks, which the new tokens never reach.)
  const int32_t first_written = num_computed_tokens / bs;
  const int32_t end_written = num_new_tokens == 0 ? first_written : std::min(num_current, num_target);
  std::vector<int32_t> shared;
  for (int32_t i = first_written; table != nullptr && i < end_written; ++i) {
    if (pool_.ref_count((*table)[i]) > 1) shared.push_back(i);
  }
  const int32_t num_fresh = num_append + static_cast<int32_t>(shared.size());
  if (num_fresh > pool_.num_free_blocks() - num_hit_free) return false;

  // Reference the hit blocks first, so that allocating cannot evict them.
  SeqState& state = is_new ? tables_[seq] : it->second;
  if (is_new) state.salt = salt;
  if (is_new && hit != nullptr) {
    for (BlockId block : hit->blocks) pool_.add_ref(block);
    state.blocks = hit->blocks;
    state.block_hashes = hit->hashes;
  }
  std::optional<std::vector<BlockId>> fresh = pool_.allocate(num_fresh);
  if (!fresh) {
    fail(ErrorCode::kInternal, "allocate_slots for sequence {}: {} free blocks were counted but allocate({}) failed",
         seq, pool_.num_free_blocks(), num_fresh);
  }
  size_t next = 0;
  for (int32_t i : shared) {
    const BlockId src = state.blocks[i];
    const BlockId dst = (*fresh)[next++];
    // Only a block holding some of this sequence's computed tokens needs its contents copied.
    if (static_cast<int64_t>(i) * bs < num_computed_tokens) pending_copies_.emplace_back(src, dst);
    state.blocks[i] = dst;
    pool_.release(src);  // still referenced by the sequence(s) it is shared with
  }
  while (next < fresh->size()) state.blocks.push_back((*fresh)[next++]);
  state.num_tokens = std::max(state.num_tokens, static_cast<int32_t>(total_tokens));
  return true;
}

void KvCacheManager::cache_full_blocks(SeqId seq, std::span<const int32_t> tokens, int32_t num_computed_tokens) {
  if (!config_.enable_prefix_caching) return;
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    fail(ErrorCode::kInvalidArgument, "cache_full_blocks: unknown sequence {}", seq);
  }
  SeqState& state = it->second;
  const int32_t bs = config_.block_size;
  if (num_computed_tokens < 0 || static_cast<size_t>(num_computed_tokens) > tokens.size() ||
      num_computed_tokens > state.num_tokens) {
    fail(ErrorCode::kInvalidArgument, "cache_full_blocks for sequence {}: num_computed_tokens is {}, expected "
         "between 0 and min({} tokens given, {} slots held)", seq, num_computed_tokens, tokens.size(),
         state.num_tokens);
  }
  const auto num_full = static_cast<size_t>(num_computed_tokens / bs);
  for (size_t i = state.block_hashes.size(); i < num_full; ++i) {
    const BlockHash parent = i == 0 ? state.salt : state.block_hashes[i - 1];
    const std::span<const int32_t> block_tokens = tokens.subspan(i * bs, static_cast<size_t>(bs));
    const BlockHash hash = hash_block(parent, block_tokens);
    // Left uncached when another block already holds this prefix; the chain goes on regardless.
    if (pool_.cache(state.blocks[i], hash, block_tokens) && config_.record_new_cached_blocks) {
      new_cached_.push_back(NewCachedBlock{state.blocks[i], hash, parent});
    }
    state.block_hashes.push_back(hash);
  }
}

void KvCacheManager::fork(SeqId parent, SeqId child) {
  auto it = tables_.find(parent);
  if (it == tables_.end()) fail(ErrorCode::kInvalidArgument, "fork: unknown parent sequence {}", parent);
  if (tables_.count(child) != 0) {
    fail(ErrorCode::kInvalidArgument, "fork of sequence {}: child sequence {} already exists", parent, child);
  }
  SeqState copy = it->second;
  for (BlockId block : copy.blocks) pool_.add_ref(block);
  tables_.emplace(child, std::move(copy));
}

void KvCacheManager::free(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  const std::vector<BlockId>& blocks = it->second.blocks;
  for (auto block = blocks.rbegin(); block != blocks.rend(); ++block) pool_.release(*block);
  tables_.erase(it);
  // A copy into a block nobody holds any more would only overwrite whoever gets it next.
  std::erase_if(pending_copies_, [&](const std::pair<BlockId, BlockId>& copy) {
    return pool_.ref_count(copy.second) == 0;
  });
}

std::vector<std::pair<BlockId, BlockId>> KvCacheManager::take_pending_copies() {
  std::vector<std::pair<BlockId, BlockId>> copies;
  copies.swap(pending_copies_);
  return copies;
}

const std::vector<BlockId>& KvCacheManager::block_table(SeqId seq) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) fail(ErrorCode::kInvalidArgument, "block_table: unknown sequence {}", seq);
  return it->second.blocks;
}

int32_t KvCacheManager::blocks_needed(int32_t num_tokens, int32_t num_new_tokens) const {
  if (num_tokens < 0 || num_new_tokens < 0) {
    fail(ErrorCode::kInvalidArgument, "blocks_needed: num_tokens {} and num_new_tokens {}, expected both >= 0",
         num_tokens, num_new_tokens);
  }
  const int32_t bs = config_.block_size;
  return ceil_blocks(static_cast<int64_t>(num_tokens) + num_new_tokens, bs) - ceil_blocks(num_tokens, bs);
}

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats stats;
  stats.prefix_queries = prefix_queries_;
  stats.prefix_hits = prefix_hits_;
  stats.num_blocks = num_usable_blocks();  // withheld blocks are no longer the pool's
  stats.num_used_blocks = num_usable_blocks() - pool_.num_free_blocks();
  stats.num_cached_free_blocks = pool_.num_cached_free_blocks();
  int64_t slots = 0;
  int64_t filled = 0;
  for (const auto& [id, state] : tables_) {
    slots += static_cast<int64_t>(state.blocks.size()) * config_.block_size;
    filled += state.num_tokens;
  }
  stats.fragmentation = slots == 0 ? 0.0 : static_cast<double>(slots - filled) / static_cast<double>(slots);
  return stats;
}

int32_t KvCacheManager::reset_prefix_cache() {
  new_cached_.clear();
  return pool_.reset_cache();
}

std::vector<NewCachedBlock> KvCacheManager::take_new_cached_blocks() {
  std::vector<NewCachedBlock> out;
  out.swap(new_cached_);
  return out;
}

std::vector<BlockHash> chain_hashes(std::span<const int32_t> tokens, int32_t num_blocks, int32_t block_size,
                                    BlockHash salt) {
  if (num_blocks < 0 || block_size <= 0 || static_cast<int64_t>(num_blocks) * block_size > static_cast<int64_t>(tokens.size())) {
    fail(ErrorCode::kInvalidArgument, "chain_hashes: {} blocks of {} tokens, {} tokens given", num_blocks, block_size,
         tokens.size());
  }
  std::vector<BlockHash> hashes;
  hashes.reserve(static_cast<size_t>(num_blocks));
  BlockHash parent = salt;
  const auto bs = static_cast<size_t>(block_size);
  for (size_t i = 0; i < static_cast<size_t>(num_blocks); ++i) {
    parent = hash_block(parent, tokens.subspan(i * bs, bs));
    hashes.push_back(parent);
  }
  return hashes;
}

int32_t KvCacheManager::num_cached_prefix_blocks(std::span<const int32_t> tokens, BlockHash salt) const {
  if (!config_.enable_prefix_caching) return 0;
  const auto bs = static_cast<size_t>(config_.block_size);
  BlockHash parent = salt;
  int32_t n = 0;
  for (size_t i = 0; (i + 1) * bs <= tokens.size(); ++i) {
    const std::span<const int32_t> block_tokens = tokens.subspan(i * bs, bs);
    parent = hash_block(parent, block_tokens);
    if (!pool_.lookup(parent, block_tokens)) break;
    ++n;
  }
  return n;
}

std::optional<BlockImport> KvCacheManager::begin_import(std::span<const int32_t> tokens, int32_t first, int32_t count,
                                                       BlockHash salt) {
  const int32_t bs = config_.block_size;
  if (first < 0 || count < 0 || static_cast<int64_t>(first + count) * bs > static_cast<int64_t>(tokens.size())) {
    fail(ErrorCode::kInvalidArgument, "begin_import: blocks [{}, {}) of {} tokens in blocks of {}", first,
         first + count, tokens.size(), bs);
  }
  if (!config_.enable_prefix_caching || count == 0) return std::nullopt;
  const std::span<const int32_t> range = tokens.first(static_cast<size_t>(first + count) * bs);
  const int32_t local = num_cached_prefix_blocks(range, salt);
  if (local < first || local >= first + count) return std::nullopt;  // a gap before the range, or nothing to add
  BlockImport import;
  const std::vector<BlockHash> hashes = chain_hashes(range, first + count, bs, salt);
  for (int32_t i = 0; i < local; ++i) {
    const std::span<const int32_t> block_tokens = tokens.subspan(static_cast<size_t>(i) * bs, static_cast<size_t>(bs));
    const BlockId id = *pool_.lookup(hashes[static_cast<size_t>(i)], block_tokens);
    pool_.add_ref(id);  // the prefix may not be evicted by the allocation below
    import.pinned.push_back(id);
  }
  const int32_t n = std::min(first + count - local, pool_.num_free_blocks());
  if (n <= 0) {
    for (auto it = import.pinned.rbegin(); it != import.pinned.rend(); ++it) pool_.release(*it);
    return std::nullopt;
  }
  import.first = local;
  import.blocks = *pool_.allocate(n);
  import.hashes.assign(hashes.begin() + local, hashes.begin() + local + n);
  return import;
}

void KvCacheManager::end_import(const BlockImport& import, std::span<const int32_t> tokens, int32_t num_filled) {
  const auto bs = static_cast<size_t>(config_.block_size);
  const auto filled = static_cast<size_t>(std::clamp<int32_t>(num_filled, 0, static_cast<int32_t>(import.blocks.size())));
  for (size_t i = 0; i < filled; ++i) {
    const size_t index = static_cast<size_t>(import.first) + i;
    pool_.cache(import.blocks[i], import.hashes[i], tokens.subspan(index * bs, bs));
  }
  for (size_t i = import.blocks.size(); i-- > filled;) pool_.release(import.blocks[i]);
  for (size_t i = filled; i-- > 0;) pool_.release(import.blocks[i]);
  for (auto it = import.pinned.rbegin(); it != import.pinned.rend(); ++it) pool_.release(*it);
}

std::vector<BlockId> KvCacheManager::withhold_blocks(int32_t n) {
  n = std::min(n, pool_.num_free_blocks());
  if (n <= 0) return {};
  std::optional<std::vector<BlockId>> blocks = pool_.allocate(n);  // each now referenced once, here
  if (!blocks) return {};
  withheld_.insert(withheld_.end(), blocks->begin(), blocks->end());
  return *blocks;
}

}  // namespace duet
