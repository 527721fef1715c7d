#include "duet/cache/kv_cache_manager.h"

#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kv_cache_fixture.h"

namespace duet::testing {
namespace {

using Copies = std::vector<std::pair<BlockId, BlockId>>;

// Memory pressure: withheld blocks leave the pool for good (free ones only, cached prefixes
// evicted), the sequences keep theirs, and what is left can still be allocated to its end.
TEST_F(KvCacheTest, WithheldBlocksLeaveThePool) {
  KvCacheManager& kv = make(8);
  const std::vector<int32_t> prompt = iota_tokens(0, 10);  // 3 blocks
  prefill(1, prompt);
  prefill(2, iota_tokens(100, 8));  // 2 blocks
  kv.free(2);                        // 2 cached free blocks
  EXPECT_EQ(kv.num_free_blocks(), 5);
  const std::vector<BlockId> withheld = kv.withhold_blocks(4);
  EXPECT_EQ(withheld.size(), 4u);
  EXPECT_EQ(kv.num_withheld_blocks(), 4);
  EXPECT_EQ(kv.num_usable_blocks(), 4);
  EXPECT_EQ(kv.num_free_blocks(), 1);
  for (BlockId b : withheld) {
    for (BlockId t : table(1)) EXPECT_NE(b, t);
  }
  EXPECT_EQ(kv.stats().num_blocks, 4);
  EXPECT_EQ(kv.stats().num_used_blocks, 3);
  // Least recently used first: the three never used, then 2's first block (its cached prefix
  // evicted); its second block is still free and cached.
  EXPECT_EQ(kv.stats().num_cached_free_blocks, 1);
  // More than is free: only what is free.
  EXPECT_EQ(kv.withhold_blocks(5).size(), 1u);
  EXPECT_EQ(kv.num_usable_blocks(), 3);
  EXPECT_TRUE(kv.withhold_blocks(1).empty());
  EXPECT_FALSE(kv.allocate_slots(3, 0, 1));  // nothing left for a new sequence
  kv.free(1);
  EXPECT_EQ(kv.num_free_blocks(), 3);
  EXPECT_TRUE(kv.allocate_slots(3, 0, 12));  // all three usable blocks
  EXPECT_FALSE(kv.allocate_slots(4, 0, 1));
  kv.free(3);  // (the teardown checks the usable blocks, ids 0-2 here, are all free)
}

TEST_F(KvCacheTest, PromptHitsItsOwnBlocksAfterFree) {
  KvCacheManager& kv = make(8);
  const std::vector<int32_t> prompt = iota_tokens(0, 10);  // 2 full blocks + 2 tokens
  EXPECT_TRUE(prefill(1, prompt).blocks.empty());
  const std::vector<BlockId> first = table(1);
  ASSERT_EQ(first.size(), 3u);
  kv.free(1);
  EXPECT_EQ(kv.stats().num_cached_free_blocks, 2);

  const PrefixHit hit = prefill(2, prompt);
  EXPECT_EQ(hit.blocks, (std::vector<BlockId>{first[0], first[1]}));
  EXPECT_EQ(hit.num_tokens, 8);
  EXPECT_EQ(table(2)[0], first[0]);
  EXPECT_EQ(table(2)[1], first[1]);
  EXPECT_EQ(kv.stats().prefix_queries, 20);
  EXPECT_EQ(kv.stats().prefix_hits, 8);

  // A running sequence's blocks hit too, and are then shared.
  EXPECT_EQ(prefill(3, prompt).blocks, hit.blocks);
  EXPECT_EQ(kv.pool().ref_count(first[0]), 2);
  EXPECT_EQ(kv.pool().ref_count(first[1]), 2);
  EXPECT_NE(table(3)[2], table(2)[2]) << "the partial block is never shared by a hit";
  EXPECT_TRUE(kv.take_pending_copies().empty());
  kv.free(2);
  kv.free(3);
}

TEST_F(KvCacheTest, OnlyFullBlocksHit) {
  KvCacheManager& kv = make(8);
  prefill(1, iota_tokens(0, 6));  // one full block, one partial
  EXPECT_EQ(kv.pool().num_cached_blocks(), 1);
  EXPECT_EQ(kv.find_cached_prefix(iota_tokens(0, 7)).num_tokens, 4);
  EXPECT_EQ(kv.find_cached_prefix(iota_tokens(0, 9)).num_tokens, 4) << "the partial block was never cached";
  EXPECT_EQ(kv.find_cached_prefix(iota_tokens(0, 4)).num_tokens, 0) << "the last token is always computed";
  EXPECT_EQ(kv.find_cached_prefix(std::vector<int32_t>{0, 1, 2, 99, 4, 5}).num_tokens, 0);
  EXPECT_EQ(kv.find_cached_prefix(std::vector<int32_t>{}).num_tokens, 0);
  kv.free(1);
}

TEST_F(KvCacheTest, ChunkedPrefillCachesBlocksAsTheyFill) {
  KvCacheManager& kv = make(8);
  const std::vector<int32_t> prompt = iota_tokens(0, 12);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 5));
  kv.cache_full_blocks(1, prompt, 5);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 1);
  ASSERT_TRUE(kv.allocate_slots(1, 5, 5));
  kv.cache_full_blocks(1, prompt, 10);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 2);
  ASSERT_TRUE(kv.allocate_slots(1, 10, 2));
  kv.cache_full_blocks(1, prompt, 12);
  kv.cache_full_blocks(1, prompt, 12);  // again: nothing new
  EXPECT_EQ(kv.pool().num_cached_blocks(), 3);
  EXPECT_EQ(kv.find_cached_prefix(concat(prompt, {7})).blocks, table(1));
  kv.free(1);
}

TEST_F(KvCacheTest, FullPromptHitLeavesTheLastTokenToCompute) {
  KvCacheManager& kv = make(8);
  const std::vector<int32_t> prompt = iota_tokens(0, 8);  // exactly 2 blocks
  prefill(1, prompt);
  const std::vector<BlockId> first = table(1);
  kv.free(1);
  const PrefixHit hit = kv.find_cached_prefix(prompt);
  EXPECT_EQ(hit.blocks, std::vector<BlockId>{first[0]});
  EXPECT_EQ(hit.num_tokens, 4);
  ASSERT_TRUE(kv.allocate_slots(2, hit.num_tokens, 4, &hit));
  EXPECT_EQ(table(2).size(), 2u);
  EXPECT_EQ(table(2)[0], first[0]);
  kv.free(2);
}

TEST_F(KvCacheTest, EvictsTheLeastRecentlyFreedFirst) {
  KvCacheManager& kv = make(6);
  const std::vector<int32_t> a = iota_tokens(0, 12);
  const std::vector<int32_t> b = iota_tokens(100, 12);
  prefill(1, a);
  prefill(2, b);
  const std::vector<BlockId> ta = table(1);
  const std::vector<BlockId> tb = table(2);
  kv.free(1);
  kv.free(2);
  // Each sequence's blocks are freed last-first, so its prefix is evicted last.
  EXPECT_EQ(kv.pool().free_queue(), (std::vector<BlockId>{ta[2], ta[1], ta[0], tb[2], tb[1], tb[0]}));
  EXPECT_EQ(kv.stats().num_cached_free_blocks, 6);

  prefill(3, iota_tokens(500, 3));  // takes A's last block and evicts its hash
  EXPECT_EQ(table(3), std::vector<BlockId>{ta[2]});
  EXPECT_FALSE(kv.pool().is_cached(ta[2]));
  EXPECT_EQ(kv.find_cached_prefix(concat(a, {1})).num_tokens, 8);
  prefill(4, iota_tokens(600, 8));
  EXPECT_EQ(table(4), (std::vector<BlockId>{ta[1], ta[0]}));
  EXPECT_EQ(kv.find_cached_prefix(concat(a, {1})).num_tokens, 0) << "A's prefix is gone";
  EXPECT_EQ(kv.find_cached_prefix(concat(b, {1})).blocks, tb) << "B's is intact";
  EXPECT_EQ(kv.stats().num_cached_free_blocks, 3);
  kv.free(3);
  kv.free(4);
}

TEST_F(KvCacheTest, PrefixHitTakesFreeCachedBlocksOutOfTheFreeQueue) {
  KvCacheManager& kv = make(8);
  const std::vector<int32_t> a = iota_tokens(0, 12);
  prefill(1, a);
  kv.free(1);
  EXPECT_EQ(kv.pool().free_queue(), (std::vector<BlockId>{3, 4, 5, 6, 7, 2, 1, 0}));
  const PrefixHit hit = prefill(2, concat(a, {1}));
  EXPECT_EQ(hit.blocks, (std::vector<BlockId>{0, 1, 2}));
  EXPECT_EQ(table(2), (std::vector<BlockId>{0, 1, 2, 3}));
  EXPECT_EQ(kv.pool().free_queue(), (std::vector<BlockId>{4, 5, 6, 7}));
  EXPECT_EQ(kv.num_free_blocks(), 4);
  EXPECT_EQ(kv.stats().num_cached_free_blocks, 0);
  for (BlockId id : {0, 1, 2}) EXPECT_TRUE(kv.pool().is_cached(id));
  kv.free(2);
}

TEST_F(KvCacheTest, ForkSharesEveryBlock) {
  KvCacheManager& kv = make(8);
  prefill(1, iota_tokens(0, 6));
  kv.fork(1, 2);
  EXPECT_EQ(table(2), table(1));
  for (BlockId id : table(1)) EXPECT_EQ(kv.pool().ref_count(id), 2);
  EXPECT_EQ(kv.stats().num_used_blocks, 2);
  kv.free(1);
  for (BlockId id : table(2)) EXPECT_EQ(kv.pool().ref_count(id), 1);
  kv.free(2);
}

TEST_F(KvCacheTest, AppendIntoASharedPartialBlockCopiesItOnce) {
  KvCacheManager& kv = make(8);
  prefill(1, iota_tokens(0, 6));
  const std::vector<BlockId> parent = table(1);  // [p0, p1], p1 holds 2 tokens
  kv.fork(1, 2);
  ASSERT_TRUE(kv.allocate_slots(2, 6, 1));
  const std::vector<BlockId> child = table(2);
  ASSERT_EQ(child.size(), 2u);
  EXPECT_EQ(child[0], parent[0]);
  EXPECT_NE(child[1], parent[1]);
  EXPECT_EQ(kv.take_pending_copies(), (Copies{{parent[1], child[1]}}));
  EXPECT_TRUE(kv.take_pending_copies().empty());
  EXPECT_EQ(table(1), parent) << "the parent is untouched";
  EXPECT_EQ(kv.pool().ref_count(parent[0]), 2);
  EXPECT_EQ(kv.pool().ref_count(parent[1]), 1);
  EXPECT_EQ(kv.pool().ref_count(child[1]), 1);
  // The parent now owns its block alone: appending needs no copy.
  ASSERT_TRUE(kv.allocate_slots(1, 6, 1));
  EXPECT_EQ(table(1), parent);
  EXPECT_TRUE(kv.take_pending_copies().empty());
  kv.free(1);
  kv.free(2);
}

TEST_F(KvCacheTest, FullSharedBlockIsNotCopied) {
  KvCacheManager& kv = make(8);
  prefill(1, iota_tokens(0, 8));
  const std::vector<BlockId> parent = table(1);
  kv.fork(1, 2);
  ASSERT_TRUE(kv.allocate_slots(2, 8, 1));  // token 8 opens a new block
  EXPECT_TRUE(kv.take_pending_copies().empty());
  ASSERT_EQ(table(2).size(), 3u);
  EXPECT_EQ(table(2)[0], parent[0]);
  EXPECT_EQ(table(2)[1], parent[1]);
  EXPECT_EQ(kv.pool().ref_count(parent[0]), 2);
  EXPECT_EQ(kv.pool().ref_count(parent[1]), 2);
  kv.free(1);
  kv.free(2);
}

TEST_F(KvCacheTest, SharedBlocksAheadOfTheComputedTokensGetFreshBlocks) {
  KvCacheManager& kv = make(8);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 10));  // 3 blocks, only 5 tokens computed before the fork
  const std::vector<BlockId> parent = table(1);
  kv.fork(1, 2);
  ASSERT_TRUE(kv.allocate_slots(2, 5, 5));
  const std::vector<BlockId> child = table(2);
  ASSERT_EQ(child.size(), 3u);
  EXPECT_EQ(child[0], parent[0]);
  EXPECT_NE(child[1], parent[1]);
  EXPECT_NE(child[2], parent[2]);
  // Block 1 holds computed token 4: copied. Block 2 holds none of them: no copy.
  EXPECT_EQ(kv.take_pending_copies(), (Copies{{parent[1], child[1]}}));
  EXPECT_EQ(kv.pool().ref_count(parent[0]), 2);
  EXPECT_EQ(kv.pool().ref_count(parent[1]), 1);
  EXPECT_EQ(kv.pool().ref_count(parent[2]), 1);
  kv.free(1);
  kv.free(2);
}

TEST_F(KvCacheTest, FailedAllocationWithAHitChangesNothing) {
  KvCacheManager& kv = make(4);
  const std::vector<int32_t> a = iota_tokens(0, 12);
  prefill(1, a);
  kv.free(1);  // 3 cached free blocks + 1 never used
  const PrefixHit hit = kv.find_cached_prefix(concat(a, iota_tokens(50, 8)));
  ASSERT_EQ(hit.num_tokens, 12);
  const std::string before = snapshot({1, 2});
  // 20 tokens need 5 blocks: 3 from the hit, 2 new, but only 1 is free besides the hit.
  EXPECT_FALSE(kv.allocate_slots(2, 12, 8, &hit));
  EXPECT_EQ(snapshot({1, 2}), before);
  EXPECT_FALSE(kv.has(2));
  for (BlockId id : hit.blocks) EXPECT_EQ(kv.pool().ref_count(id), 0);
  // 16 tokens fit: the same hit is still good.
  EXPECT_TRUE(kv.allocate_slots(2, 12, 4, &hit));
  EXPECT_EQ(kv.stats().num_used_blocks, 4);
  kv.free(2);
}

TEST_F(KvCacheTest, FailedCopyOnWriteChangesNothing) {
  KvCacheManager& kv = make(4);
  prefill(1, iota_tokens(0, 6));
  kv.fork(1, 2);
  prefill(3, iota_tokens(100, 8));
  ASSERT_EQ(kv.num_free_blocks(), 0);
  const std::string before = snapshot({1, 2, 3});
  EXPECT_FALSE(kv.allocate_slots(2, 6, 1)) << "the copy needs a free block";
  EXPECT_FALSE(kv.allocate_slots(3, 8, 1)) << "a new block is needed";
  EXPECT_EQ(snapshot({1, 2, 3}), before);
  EXPECT_TRUE(kv.take_pending_copies().empty());
  EXPECT_TRUE(kv.allocate_slots(2, 6, 0)) << "no new tokens, nothing to allocate";
  kv.free(3);
  EXPECT_TRUE(kv.allocate_slots(2, 6, 1));
  EXPECT_EQ(kv.take_pending_copies().size(), 1u);
  kv.free(1);
  kv.free(2);
}

TEST_F(KvCacheTest, DuplicatePrefixStaysUncachedAndTheChainGoesOn) {
  KvCacheManager& kv = make(8);
  const std::vector<int32_t> a = iota_tokens(0, 9);
  // Both look up before either has cached: both compute the same prefix in their own blocks.
  ASSERT_TRUE(kv.allocate_slots(1, 0, 9));
  ASSERT_TRUE(kv.allocate_slots(2, 0, 9));
  kv.cache_full_blocks(1, a, 9);
  kv.cache_full_blocks(2, a, 9);
  EXPECT_TRUE(kv.pool().is_cached(table(1)[0]));
  EXPECT_FALSE(kv.pool().is_cached(table(2)[0]));
  EXPECT_FALSE(kv.pool().is_cached(table(2)[1]));
  // Sequence 2 goes on; its next full block chains on the hashes of the skipped blocks.
  const std::vector<int32_t> longer = concat(a, {9, 10, 11, 12});
  ASSERT_TRUE(kv.allocate_slots(2, 9, 4));
  kv.cache_full_blocks(2, longer, 13);
  EXPECT_TRUE(kv.pool().is_cached(table(2)[2]));
  EXPECT_EQ(kv.find_cached_prefix(longer).blocks, (std::vector<BlockId>{table(1)[0], table(1)[1], table(2)[2]}));
  kv.free(1);
  kv.free(2);
}

TEST_F(KvCacheTest, PendingCopyIntoAFreedBlockIsDropped) {
  KvCacheManager& kv = make(8);
  prefill(1, iota_tokens(0, 6));
  kv.fork(1, 2);
  ASSERT_TRUE(kv.allocate_slots(2, 6, 1));
  kv.free(2);
  EXPECT_TRUE(kv.take_pending_copies().empty());
  // A freed source keeps its contents until it is reused: that copy stays.
  kv.fork(1, 3);
  ASSERT_TRUE(kv.allocate_slots(3, 6, 1));
  const std::vector<BlockId> parent = table(1);
  kv.free(1);
  EXPECT_EQ(kv.take_pending_copies(), (Copies{{parent[1], table(3)[1]}}));
  kv.free(3);
}

// Two sequences of one request come back after a preemption, each with its own prefix hit. The
// first one's allocation reuses a free block of the second one's hit: that hit is stale now.
TEST_F(KvCacheTest, HitGoesStaleWhenAnotherAllocationReusesItsBlock) {
  KvCacheManager& kv = make(4);
  const std::vector<int32_t> prompt = iota_tokens(0, 8);
  const std::vector<int32_t> one = concat(prompt, {1, 1, 1, 1});
  const std::vector<int32_t> two = concat(prompt, {2, 2, 2, 2});
  prefill(1, one);  // blocks 0, 1, 2
  EXPECT_EQ(prefill(2, two).num_tokens, 8);  // blocks 0, 1, 3
  kv.free(1);
  kv.free(2);
  const PrefixHit hit1 = kv.find_cached_prefix(concat(one, {5}));
  const PrefixHit hit2 = kv.find_cached_prefix(concat(two, {5}));
  ASSERT_EQ(hit1.num_tokens, 12);
  ASSERT_EQ(hit2.num_tokens, 12);
  ASSERT_TRUE(kv.allocate_slots(1, 12, 1, &hit1));  // its new block is hit2's last one
  EXPECT_FALSE(kv.prefix_hit_is_current(hit2));
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.allocate_slots(2, 12, 1, &hit2); });
  const PrefixHit again = kv.find_cached_prefix(concat(two, {5}));
  EXPECT_EQ(again.num_tokens, 8);
  EXPECT_TRUE(kv.prefix_hit_is_current(again));
  EXPECT_FALSE(kv.allocate_slots(2, 8, 5, &again)) << "no block left for the rest";
  kv.free(1);
}

TEST_F(KvCacheTest, PrefixCachingOffNeverHitsNorCaches) {
  KvCacheManager& kv = make(8, 4, false);
  const std::vector<int32_t> a = iota_tokens(0, 12);
  prefill(1, a);
  kv.free(1);
  EXPECT_TRUE(prefill(2, a).blocks.empty());
  EXPECT_EQ(kv.pool().num_cached_blocks(), 0);
  EXPECT_EQ(kv.stats().num_cached_free_blocks, 0);
  EXPECT_EQ(kv.stats().prefix_queries, 0);
  EXPECT_EQ(kv.stats().prefix_hits, 0);
  kv.free(2);
  EXPECT_EQ(kv.stats().num_cached_free_blocks, 0);
}

TEST_F(KvCacheTest, StatsAndFragmentation) {
  KvCacheManager& kv = make(10);
  KvCacheStats s = kv.stats();
  EXPECT_EQ(s.num_blocks, 10);
  EXPECT_EQ(s.fragmentation, 0.0);
  EXPECT_EQ(s.usage(), 0.0);
  prefill(1, iota_tokens(0, 6));  // 2 blocks, 8 slots, 6 tokens
  EXPECT_DOUBLE_EQ(kv.stats().fragmentation, 2.0 / 8.0);
  prefill(2, iota_tokens(100, 4));  // 1 block, full
  EXPECT_DOUBLE_EQ(kv.stats().fragmentation, 2.0 / 12.0);
  kv.fork(1, 3);  // counted per sequence: 20 slots, 16 tokens
  s = kv.stats();
  EXPECT_DOUBLE_EQ(s.fragmentation, 4.0 / 20.0);
  EXPECT_EQ(s.num_used_blocks, 3);
  EXPECT_DOUBLE_EQ(s.usage(), 0.3);
  EXPECT_EQ(s.prefix_queries, 10);
  EXPECT_EQ(s.prefix_hits, 0);
  EXPECT_EQ(s.num_cached_free_blocks, 0);
  kv.free(2);
  s = kv.stats();
  EXPECT_EQ(s.num_cached_free_blocks, 1);
  EXPECT_DOUBLE_EQ(s.fragmentation, 4.0 / 16.0);
  kv.free(1);
  kv.free(3);
  s = kv.stats();
  EXPECT_EQ(s.num_cached_free_blocks, 2);
  EXPECT_EQ(s.fragmentation, 0.0);
  prefill(4, iota_tokens(0, 5));
  EXPECT_EQ(kv.stats().prefix_queries, 15);
  EXPECT_EQ(kv.stats().prefix_hits, 4);
  kv.free(4);
}

TEST_F(KvCacheTest, BlocksNeeded) {
  KvCacheManager& kv = make(4, 16);
  EXPECT_EQ(kv.blocks_needed(0, 0), 0);
  EXPECT_EQ(kv.blocks_needed(0, 1), 1);
  EXPECT_EQ(kv.blocks_needed(0, 16), 1);
  EXPECT_EQ(kv.blocks_needed(0, 17), 2);
  EXPECT_EQ(kv.blocks_needed(15, 1), 0);
  EXPECT_EQ(kv.blocks_needed(16, 1), 1);
  EXPECT_EQ(kv.blocks_needed(17, 15), 0);
  EXPECT_EQ(kv.blocks_needed(17, 16), 1);
  EXPECT_EQ(kv.blocks_needed(10, 100), 6);
  expect_error(ErrorCode::kInvalidArgument, [&] { (void)kv.blocks_needed(-1, 1); });
}

TEST_F(KvCacheTest, ResetPrefixCache) {
  KvCacheManager& kv = make(8);
  const std::vector<int32_t> a = iota_tokens(0, 9);
  prefill(1, a);
  kv.free(1);
  EXPECT_EQ(kv.reset_prefix_cache(), 2);
  EXPECT_EQ(kv.stats().num_cached_free_blocks, 0);
  EXPECT_TRUE(prefill(2, a).blocks.empty());
  // The running sequence keeps its blocks; only blocks it fills from now on are cached again.
  EXPECT_EQ(kv.reset_prefix_cache(), 2);
  const std::vector<int32_t> longer = concat(a, {9, 10, 11});
  ASSERT_TRUE(kv.allocate_slots(2, 9, 3));
  kv.cache_full_blocks(2, longer, 12);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 1);
  EXPECT_TRUE(kv.pool().is_cached(table(2)[2]));
  kv.free(2);
}

TEST_F(KvCacheTest, MisuseFailsLoudlyAndChangesNothing) {
  KvCacheManager& kv = make(8);
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.fork(9, 10); });
  expect_error(ErrorCode::kInvalidArgument, [&] { (void)kv.block_table(9); });
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.cache_full_blocks(9, iota_tokens(0, 4), 4); });
  kv.free(9);  // unknown: ignored
  const std::vector<int32_t> a = iota_tokens(0, 8);
  prefill(1, a);
  const PrefixHit hit = kv.find_cached_prefix(concat(a, {1}));
  ASSERT_EQ(hit.num_tokens, 8);
  const std::string before = snapshot({1, 2});
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.allocate_slots(1, 8, 1, &hit); });  // known seq
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.allocate_slots(2, 0, 9, &hit); });  // not the hit's count
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.allocate_slots(2, 3, 1); });        // new seq, nothing computed
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.allocate_slots(1, 9, 1); });        // beyond its slots
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.allocate_slots(1, 3, 1); });        // inside cached blocks
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.allocate_slots(1, 8, -1); });
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.fork(1, 1); });
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.cache_full_blocks(1, a, 9); });
  PrefixHit no_hashes = hit;
  no_hashes.hashes.clear();
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.allocate_slots(2, 8, 1, &no_hashes); });
  EXPECT_EQ(snapshot({1, 2}), before);

  // A hit whose blocks were evicted before allocate_slots is refused, not silently used.
  kv.free(1);
  const PrefixHit stale = kv.find_cached_prefix(concat(a, {1}));
  ASSERT_EQ(stale.num_tokens, 8);
  EXPECT_TRUE(kv.prefix_hit_is_current(stale));
  prefill(3, iota_tokens(1000, 32));  // takes every block
  EXPECT_FALSE(kv.prefix_hit_is_current(stale));
  EXPECT_TRUE(kv.prefix_hit_is_current(PrefixHit{}));
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.allocate_slots(4, 8, 1, &stale); });
  EXPECT_FALSE(kv.has(4));
  kv.free(3);
}

// Salted chains (a LoRA adapter's, a request's cache_salt): the same tokens under another salt are
// no hit, under the same salt they are; a sequence registers its blocks under the salt it started
// with, its decode blocks and its forks too.
TEST_F(KvCacheTest, SaltedChainsShareNoBlocks) {
  KvCacheManager& kv = make(16);
  const BlockHash salt = 0x5eed;
  std::vector<int32_t> tokens = iota_tokens(0, 10);  // 2 full blocks and 2 tokens
  PrefixHit none = kv.find_cached_prefix(tokens, salt);
  EXPECT_EQ(none.num_tokens, 0);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 10, &none, salt));
  kv.cache_full_blocks(1, tokens, 10);
  EXPECT_EQ(kv.find_cached_prefix(tokens).num_tokens, 0) << "the base chain found a salted block";
  EXPECT_EQ(kv.find_cached_prefix(tokens, salt + 1).num_tokens, 0) << "another salt found it";
  const PrefixHit same = kv.find_cached_prefix(tokens, salt);
  EXPECT_EQ(same.num_tokens, 8);
  EXPECT_EQ(same.hashes, chain_hashes(tokens, 2, 4, salt));
  EXPECT_NE(chain_hashes(tokens, 2, 4, salt), chain_hashes(tokens, 2, 4));
  const std::span<const int32_t> full = std::span<const int32_t>(tokens).first(8);
  EXPECT_EQ(kv.num_cached_prefix_blocks(full, salt), 2);
  EXPECT_EQ(kv.num_cached_prefix_blocks(full), 0);
  // Decode past the third block: registered under the same salted chain.
  const std::vector<int32_t> more = iota_tokens(10, 3);
  tokens.insert(tokens.end(), more.begin(), more.end());
  ASSERT_TRUE(kv.allocate_slots(1, 10, 3));
  kv.cache_full_blocks(1, tokens, 13);
  EXPECT_EQ(kv.find_cached_prefix(tokens, salt).num_tokens, 12);
  EXPECT_EQ(kv.find_cached_prefix(tokens).num_tokens, 0);
  // A fork continues its parent's salted chain.
  kv.fork(1, 2);
  std::vector<int32_t> child = tokens;
  const std::vector<int32_t> tail = iota_tokens(50, 4);
  child.insert(child.end(), tail.begin(), tail.end());
  ASSERT_TRUE(kv.allocate_slots(2, 13, 4));
  kv.cache_full_blocks(2, child, 17);
  EXPECT_EQ(kv.find_cached_prefix(child, salt).num_tokens, 16);
  EXPECT_EQ(kv.find_cached_prefix(child).num_tokens, 0);
  // A base-model sequence with the same tokens computes them all, and caches its own chain.
  PrefixHit base = kv.find_cached_prefix(tokens);
  ASSERT_TRUE(kv.allocate_slots(3, 0, 13, &base));
  kv.cache_full_blocks(3, tokens, 13);
  EXPECT_EQ(kv.find_cached_prefix(tokens).num_tokens, 12);
  EXPECT_EQ(kv.find_cached_prefix(tokens, salt).num_tokens, 12);
  kv.free(1);
  kv.free(2);
  kv.free(3);
}

}  // namespace
}  // namespace duet::testing
