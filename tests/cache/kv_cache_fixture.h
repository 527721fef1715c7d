// Shared helpers of the cache tests: a fixture that owns one KvCacheManager and checks, after
// every test, that the test freed every sequence and the pool is whole again.
#pragma once

#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/cache/kv_cache_manager.h"
#include "duet/core/error.h"

namespace duet::testing {

inline std::vector<int32_t> iota_tokens(int32_t first, int32_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) tokens[i] = first + i;
  return tokens;
}

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
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

class KvCacheTest : public ::testing::Test {
 protected:
  KvCacheManager& make(int32_t num_blocks, int32_t block_size = 4, bool prefix_caching = true) {
    kv_ = std::make_unique<KvCacheManager>(
        KvCacheConfig{.block_size = block_size, .num_blocks = num_blocks, .enable_prefix_caching = prefix_caching});
    return *kv_;
  }

  void TearDown() override {
    if (!kv_) return;
    const KvCacheStats stats = kv_->stats();
    EXPECT_EQ(stats.num_used_blocks, 0) << "the test left sequences holding blocks";
    EXPECT_EQ(kv_->num_free_blocks(), stats.num_blocks);
    EXPECT_EQ(stats.fragmentation, 0.0);
    const std::vector<BlockId> queue = kv_->pool().free_queue();
    EXPECT_EQ(static_cast<int32_t>(queue.size()), stats.num_blocks);
    EXPECT_EQ(static_cast<int32_t>(std::set<BlockId>(queue.begin(), queue.end()).size()), stats.num_blocks);
    for (BlockId id = 0; id < stats.num_blocks; ++id) EXPECT_EQ(kv_->pool().ref_count(id), 0) << "block " << id;
  }

  // One-step prefill of a new sequence: prefix lookup, slots for the rest, cache its full blocks.
  PrefixHit prefill(SeqId seq, const std::vector<int32_t>& tokens) {
    PrefixHit hit = kv_->find_cached_prefix(tokens);
    const auto size = static_cast<int32_t>(tokens.size());
    EXPECT_TRUE(kv_->allocate_slots(seq, hit.num_tokens, size - hit.num_tokens, &hit)) << "sequence " << seq;
    kv_->cache_full_blocks(seq, tokens, size);
    return hit;
  }

  std::vector<BlockId> table(SeqId seq) const { return kv_->block_table(seq); }

  // Everything observable about the manager, as text: equal snapshots mean nothing changed.
  std::string snapshot(const std::vector<SeqId>& seqs) const {
    std::ostringstream out;
    const KvCacheStats s = kv_->stats();
    out << "queries=" << s.prefix_queries << " hits=" << s.prefix_hits << " used=" << s.num_used_blocks
        << " cached_free=" << s.num_cached_free_blocks << " frag=" << s.fragmentation
        << " free=" << kv_->num_free_blocks() << "\nqueue:";
    for (BlockId id : kv_->pool().free_queue()) out << ' ' << id;
    out << "\nblocks:";
    for (BlockId id = 0; id < kv_->pool().num_blocks(); ++id) {
      out << ' ' << id << ':' << kv_->pool().ref_count(id);
      if (auto hash = kv_->pool().cached_hash(id)) out << '#' << *hash;
    }
    for (SeqId seq : seqs) {
      out << "\nseq " << seq << ':';
      if (!kv_->has(seq)) {
        out << " none";
        continue;
      }
      for (BlockId id : kv_->block_table(seq)) out << ' ' << id;
    }
    return out.str();
  }

  std::unique_ptr<KvCacheManager> kv_;
};

}  // namespace duet::testing
