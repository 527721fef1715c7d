// The prefix cache's side of another tier: the log of newly cached blocks and importing blocks
// (begin_import / end_import), with fake token ids and no model.
#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include "duet/cache/kv_cache_manager.h"
#include "kv_cache_fixture.h"

namespace duet::testing {
namespace {

class KvCacheImportTest : public KvCacheTest {
 protected:
  KvCacheManager& make_recording(int32_t num_blocks) {
    kv_ = std::make_unique<KvCacheManager>(KvCacheConfig{
        .block_size = 4, .num_blocks = num_blocks, .enable_prefix_caching = true, .record_new_cached_blocks = true});
    return *kv_;
  }
};

TEST_F(KvCacheImportTest, LogsEachNewlyCachedBlockOnceWithItsChain) {
  KvCacheManager& kv = make_recording(8);
  const std::vector<int32_t> prompt = iota_tokens(0, 10);  // 2 full blocks
  prefill(1, prompt);
  std::vector<NewCachedBlock> logged = kv.take_new_cached_blocks();
  ASSERT_EQ(logged.size(), 2u);
  const std::vector<BlockHash> hashes = chain_hashes(prompt, 2, 4);
  EXPECT_EQ(logged[0].block, table(1)[0]);
  EXPECT_EQ(logged[0].hash, hashes[0]);
  EXPECT_EQ(logged[0].parent, 0u);
  EXPECT_EQ(logged[1].hash, hashes[1]);
  EXPECT_EQ(logged[1].parent, hashes[0]);
  EXPECT_TRUE(kv.take_new_cached_blocks().empty()) << "taken once";
  // A second sequence with the same prompt hits them: nothing new to log.
  prefill(2, prompt);
  EXPECT_TRUE(kv.take_new_cached_blocks().empty());
  kv.free(1);
  kv.free(2);
}

TEST_F(KvCacheImportTest, NothingLoggedUnlessAskedFor) {
  KvCacheManager& kv = make(8);
  prefill(1, iota_tokens(0, 10));
  EXPECT_TRUE(kv.take_new_cached_blocks().empty());
  kv.free(1);
}

TEST_F(KvCacheImportTest, ImportedBlocksAreFoundByThePrefixLookup) {
  KvCacheManager& kv = make(8);
  const std::vector<int32_t> prompt = iota_tokens(100, 13);  // 3 reusable blocks
  EXPECT_EQ(kv.num_cached_prefix_blocks(prompt), 0);
  std::optional<BlockImport> import = kv.begin_import(prompt, 0, 3);
  ASSERT_TRUE(import);
  EXPECT_EQ(import->first, 0);
  EXPECT_TRUE(import->pinned.empty());
  ASSERT_EQ(import->blocks.size(), 3u);
  EXPECT_EQ(import->hashes, chain_hashes(prompt, 3, 4));
  EXPECT_EQ(kv.num_free_blocks(), 5) << "held while being filled";
  kv.end_import(*import, prompt, 3);
  EXPECT_EQ(kv.num_free_blocks(), 8);
  EXPECT_EQ(kv.stats().num_cached_free_blocks, 3);
  EXPECT_EQ(kv.num_cached_prefix_blocks(prompt), 3);
  const PrefixHit hit = prefill(1, prompt);
  EXPECT_EQ(hit.blocks, import->blocks);
  EXPECT_EQ(hit.num_tokens, 12);
  kv.free(1);
}

TEST_F(KvCacheImportTest, ImportContinuesTheLocalPrefixAndPinsIt) {
  KvCacheManager& kv = make(6);
  const std::vector<int32_t> prompt = iota_tokens(0, 17);  // 4 reusable blocks
  prefill(1, std::vector<int32_t>(prompt.begin(), prompt.begin() + 9));  // blocks 0, 1 cached locally
  kv.free(1);
  ASSERT_EQ(kv.num_cached_prefix_blocks(prompt), 2);
  // A fetch that started at block 1 (the local cache had block 0 then): blocks 2, 3 are imported.
  std::optional<BlockImport> import = kv.begin_import(prompt, 1, 3);
  ASSERT_TRUE(import);
  EXPECT_EQ(import->first, 2);
  EXPECT_EQ(import->pinned.size(), 2u);
  ASSERT_EQ(import->blocks.size(), 2u);
  for (BlockId pinned : import->pinned) {
    EXPECT_EQ(kv.pool().ref_count(pinned), 1);
    EXPECT_EQ(std::count(import->blocks.begin(), import->blocks.end(), pinned), 0) << "the prefix is never reused";
  }
  kv.end_import(*import, prompt, 2);
  EXPECT_EQ(kv.num_cached_prefix_blocks(prompt), 4);
  // The prefix is released last: it is the last to be evicted.
  const std::vector<BlockId> queue = kv.pool().free_queue();
  EXPECT_EQ(queue.back(), import->pinned[0]);
  EXPECT_EQ(queue[queue.size() - 2], import->pinned[1]);
}

TEST_F(KvCacheImportTest, AGapOrNothingNewImportsNothing) {
  KvCacheManager& kv = make(8);
  const std::vector<int32_t> prompt = iota_tokens(0, 17);
  EXPECT_FALSE(kv.begin_import(prompt, 1, 2)) << "block 0 is not cached: blocks from 1 on could never be hit";
  prefill(1, std::vector<int32_t>(prompt.begin(), prompt.begin() + 13));  // blocks 0-2
  kv.free(1);
  EXPECT_FALSE(kv.begin_import(prompt, 1, 2)) << "blocks 1-2 are cached already";
  EXPECT_FALSE(kv.begin_import(prompt, 0, 0));
  expect_error(ErrorCode::kInvalidArgument, [&] { kv.begin_import(prompt, 3, 2); });
  EXPECT_EQ(kv.num_free_blocks(), 8);
}

TEST_F(KvCacheImportTest, TakesOnlyTheFreeBlocksAndKeepsWhatWasFilled) {
  KvCacheManager& kv = make(4);
  const std::vector<int32_t> running = iota_tokens(1000, 8);
  prefill(1, running);  // holds 2 blocks
  const std::vector<int32_t> prompt = iota_tokens(0, 17);
  std::optional<BlockImport> import = kv.begin_import(prompt, 0, 4);
  ASSERT_TRUE(import);
  EXPECT_EQ(import->blocks.size(), 2u) << "only the free blocks";
  EXPECT_EQ(kv.num_free_blocks(), 0);
  kv.end_import(*import, prompt, 1);  // the second one could not be filled
  EXPECT_EQ(kv.num_cached_prefix_blocks(prompt), 1);
  EXPECT_FALSE(kv.pool().is_cached(import->blocks[1]));
  EXPECT_EQ(kv.num_free_blocks(), 2);
  kv.free(1);
}

TEST_F(KvCacheImportTest, OffWithoutPrefixCaching) {
  KvCacheManager& kv = make(8, 4, false);
  EXPECT_FALSE(kv.begin_import(iota_tokens(0, 17), 0, 4));
  EXPECT_EQ(kv.num_cached_prefix_blocks(iota_tokens(0, 17)), 0);
}

TEST_F(KvCacheImportTest, ResetForgetsTheLog) {
  KvCacheManager& kv = make_recording(8);
  prefill(1, iota_tokens(0, 9));
  kv.reset_prefix_cache();
  EXPECT_TRUE(kv.take_new_cached_blocks().empty()) << "blocks no longer cached are not exported";
  kv.free(1);
}

}  // namespace
}  // namespace duet::testing
