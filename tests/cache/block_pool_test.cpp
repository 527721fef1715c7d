#include "duet/cache/block_pool.h"

#include <algorithm>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/error.h"

namespace duet {
namespace {

std::vector<int32_t> iota_tokens(int32_t first, int32_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) tokens[i] = first + i;
  return tokens;
}

template <typename Fn>
void expect_error(ErrorCode code, Fn&& fn) {
  try {
    fn();
    ADD_FAILURE() << "expected duet::Error " << error_code_name(code);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
  }
}

// Every test leaves the pool as it found it: every block free, once, in the queue.
class BlockPoolTest : public ::testing::Test {
 protected:
  static constexpr int32_t kBlockSize = 4;

  void TearDown() override {
    EXPECT_EQ(pool_.num_free_blocks(), pool_.num_blocks());
    const std::vector<BlockId> queue = pool_.free_queue();
    EXPECT_EQ(static_cast<int32_t>(queue.size()), pool_.num_blocks());
    EXPECT_EQ(static_cast<int32_t>(std::set<BlockId>(queue.begin(), queue.end()).size()), pool_.num_blocks());
    int32_t cached = 0;
    for (BlockId id = 0; id < pool_.num_blocks(); ++id) {
      EXPECT_EQ(pool_.ref_count(id), 0) << "block " << id;
      cached += pool_.is_cached(id) ? 1 : 0;
    }
    EXPECT_EQ(pool_.num_cached_free_blocks(), cached);
  }

  BlockPool pool_{6, kBlockSize};
};

TEST(HashBlockTest, DeterministicChainedAndPinned) {
  const std::vector<int32_t> a = {1, 2, 3, 4};
  const std::vector<int32_t> b = {5, 6, 7, 8};
  // Values from an independent Python transcription of the same mix: the hash never changes
  // silently between runs, compilers or platforms.
  EXPECT_EQ(hash_block(0, a), 0xd3a83fc48144ab91ull);
  EXPECT_EQ(hash_block(hash_block(0, a), b), 0xe70d62a5cef3a082ull);
  EXPECT_EQ(hash_block(0, {}), 0x48218226ff3cd4bfull);
  EXPECT_EQ(hash_block(0, std::vector<int32_t>{-1, 2147483647}), 0x5562793b7aa0f89dull);

  EXPECT_NE(hash_block(0, b), hash_block(hash_block(0, a), b));  // the parent matters
  EXPECT_NE(hash_block(0, std::vector<int32_t>{1, 2}), hash_block(0, std::vector<int32_t>{2, 1}));
  EXPECT_NE(hash_block(0, std::vector<int32_t>{0}), hash_block(0, std::vector<int32_t>{0, 0}));
  // Many nearby blocks, no collisions.
  std::set<BlockHash> seen;
  for (int32_t i = 0; i < 1000; ++i) seen.insert(hash_block(0, std::vector<int32_t>{i, 0, 0, 0}));
  for (int32_t i = 0; i < 1000; ++i) seen.insert(hash_block(1, std::vector<int32_t>{i, 0, 0, 0}));
  EXPECT_EQ(seen.size(), 2000u);
}

TEST_F(BlockPoolTest, AllocateAndReleaseCountReferences) {
  EXPECT_EQ(pool_.num_blocks(), 6);
  EXPECT_EQ(pool_.block_size(), kBlockSize);
  auto blocks = pool_.allocate(4);
  ASSERT_TRUE(blocks);
  EXPECT_EQ(*blocks, (std::vector<BlockId>{0, 1, 2, 3}));
  EXPECT_EQ(pool_.num_free_blocks(), 2);
  pool_.add_ref(1);
  EXPECT_EQ(pool_.ref_count(1), 2);
  EXPECT_FALSE(pool_.allocate(3)) << "only 2 are free";
  EXPECT_EQ(pool_.num_free_blocks(), 2);
  EXPECT_EQ(pool_.free_queue(), (std::vector<BlockId>{4, 5}));
  auto none = pool_.allocate(0);
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
  pool_.release(1);
  EXPECT_EQ(pool_.ref_count(1), 1);
  EXPECT_EQ(pool_.num_free_blocks(), 2);
  for (BlockId id : *blocks) pool_.release(id);
  EXPECT_EQ(pool_.num_free_blocks(), 6);
}

TEST_F(BlockPoolTest, FreeQueueIsLeastRecentlyFreedFirst) {
  auto blocks = pool_.allocate(6);
  ASSERT_TRUE(blocks);
  EXPECT_TRUE(pool_.free_queue().empty());
  for (BlockId id : {3, 0, 5, 1, 4, 2}) pool_.release(id);
  EXPECT_EQ(pool_.free_queue(), (std::vector<BlockId>{3, 0, 5, 1, 4, 2}));
  auto again = pool_.allocate(2);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, (std::vector<BlockId>{3, 0}));
  pool_.release(0);
  pool_.release(3);
  EXPECT_EQ(pool_.free_queue(), (std::vector<BlockId>{5, 1, 4, 2, 0, 3}));
}

TEST_F(BlockPoolTest, HashCollisionNeverReturnsAWrongBlock) {
  auto blocks = pool_.allocate(2);
  ASSERT_TRUE(blocks);
  const BlockHash same = 42;
  const std::vector<int32_t> a = iota_tokens(0, kBlockSize);
  const std::vector<int32_t> b = iota_tokens(100, kBlockSize);
  pool_.cache((*blocks)[0], same, a);
  EXPECT_EQ(pool_.lookup(same, a), (*blocks)[0]);
  EXPECT_FALSE(pool_.lookup(same, b)) << "same hash, different tokens: must miss";
  EXPECT_FALSE(pool_.lookup(43, a));
  // The second block cannot take the hash: it stays uncached, the first keeps it.
  pool_.cache((*blocks)[1], same, b);
  EXPECT_FALSE(pool_.is_cached((*blocks)[1]));
  EXPECT_FALSE(pool_.lookup(same, b));
  EXPECT_EQ(pool_.lookup(same, a), (*blocks)[0]);
  // A block already cached keeps its first prefix.
  pool_.cache((*blocks)[0], 7, b);
  EXPECT_EQ(pool_.cached_hash((*blocks)[0]), same);
  EXPECT_FALSE(pool_.lookup(7, b));
  EXPECT_FALSE(pool_.lookup(same, std::vector<int32_t>{0, 1, 2})) << "a short block never matches";
  for (BlockId id : *blocks) pool_.release(id);
}

TEST_F(BlockPoolTest, FreeCachedBlockStaysFindableUntilEvicted) {
  auto blocks = pool_.allocate(6);
  ASSERT_TRUE(blocks);
  const std::vector<int32_t> tokens = iota_tokens(7, kBlockSize);
  const BlockHash hash = hash_block(0, tokens);
  pool_.cache(2, hash, tokens);
  EXPECT_EQ(pool_.num_cached_blocks(), 1);
  EXPECT_EQ(pool_.num_cached_free_blocks(), 0);
  for (BlockId id : {0, 1, 2, 3, 4, 5}) pool_.release(id);
  EXPECT_EQ(pool_.num_cached_free_blocks(), 1);
  EXPECT_EQ(pool_.lookup(hash, tokens), 2);

  // A prefix hit takes the free cached block out of the free queue.
  pool_.add_ref(2);
  EXPECT_EQ(pool_.num_free_blocks(), 5);
  EXPECT_EQ(pool_.num_cached_free_blocks(), 0);
  EXPECT_EQ(pool_.free_queue(), (std::vector<BlockId>{0, 1, 3, 4, 5}));
  pool_.release(2);
  EXPECT_EQ(pool_.free_queue(), (std::vector<BlockId>{0, 1, 3, 4, 5, 2}));

  // Allocating it evicts the prefix: the hash is gone.
  auto all = pool_.allocate(6);
  ASSERT_TRUE(all);
  EXPECT_FALSE(pool_.is_cached(2));
  EXPECT_FALSE(pool_.cached_hash(2));
  EXPECT_FALSE(pool_.lookup(hash, tokens));
  EXPECT_EQ(pool_.num_cached_blocks(), 0);
  for (BlockId id : *all) pool_.release(id);
  EXPECT_EQ(pool_.num_cached_free_blocks(), 0);
}

TEST_F(BlockPoolTest, ResetCacheForgetsEveryPrefix) {
  auto blocks = pool_.allocate(3);
  ASSERT_TRUE(blocks);
  for (BlockId id : *blocks) {
    const std::vector<int32_t> tokens = iota_tokens(id * 10, kBlockSize);
    pool_.cache(id, hash_block(0, tokens), tokens);
  }
  pool_.release((*blocks)[0]);
  EXPECT_EQ(pool_.num_cached_free_blocks(), 1);
  EXPECT_EQ(pool_.reset_cache(), 3);
  EXPECT_EQ(pool_.num_cached_free_blocks(), 0);
  EXPECT_EQ(pool_.num_cached_blocks(), 0);
  for (BlockId id : *blocks) EXPECT_FALSE(pool_.is_cached(id));
  EXPECT_EQ(pool_.reset_cache(), 0);
  pool_.release((*blocks)[1]);
  pool_.release((*blocks)[2]);
}

TEST_F(BlockPoolTest, MisuseThrows) {
  expect_error(ErrorCode::kInvalidArgument, [&] { pool_.release(0); });
  expect_error(ErrorCode::kInvalidArgument, [&] { pool_.release(6); });
  expect_error(ErrorCode::kInvalidArgument, [&] { pool_.add_ref(-1); });
  expect_error(ErrorCode::kInvalidArgument, [&] { (void)pool_.ref_count(99); });
  expect_error(ErrorCode::kInvalidArgument, [&] { (void)pool_.allocate(-1); });
  expect_error(ErrorCode::kInvalidArgument, [&] { pool_.cache(0, 1, iota_tokens(0, kBlockSize)); });
  auto blocks = pool_.allocate(1);
  ASSERT_TRUE(blocks);
  expect_error(ErrorCode::kInvalidArgument, [&] { pool_.cache((*blocks)[0], 1, iota_tokens(0, kBlockSize - 1)); });
  pool_.release((*blocks)[0]);
  expect_error(ErrorCode::kInvalidArgument, [] { BlockPool bad(4, 0); });
  expect_error(ErrorCode::kInvalidArgument, [] { BlockPool bad(-1, 16); });
}

}  // namespace
}  // namespace duet
