// Randomized test of the KV cache manager against a model: many sequences with random prompts that
// share random prefixes, chunked prefill, decode, fork, free, preemption and cache resets. Besides
// the bookkeeping invariants it simulates the KV contents themselves: every slot holds a value that
// depends on the whole prefix up to its position, written through the block tables and copied by
// the pending copies. A prefix hit must find exactly the contents the new sequence would compute,
// and no sequence may ever see its computed contents changed by another.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "kv_cache_fixture.h"

namespace duet::testing {
namespace {

constexpr int32_t kNumBlocks = 48;
constexpr int32_t kBlockSize = 4;
constexpr int32_t kMaxLive = 10;
constexpr size_t kMaxTokens = 72;  // a sequence finishes (is freed) once it has computed this many

struct SimSeq {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> kv;  // kv[pos]: what the model writes at pos, a function of tokens[0..pos]
  int32_t num_computed = 0;

  void push(int32_t token) {
    const uint64_t prev = kv.empty() ? 0x51ED270B27A3F0E1ull : kv.back();
    tokens.push_back(token);
    kv.push_back((prev ^ static_cast<uint32_t>(token)) * 0x100000001B3ull + 0x2545F4914F6CDD1Dull);
  }
};

class KvCacheRandomTest : public KvCacheTest, public ::testing::WithParamInterface<uint32_t> {
 protected:
  uint64_t& slot(BlockId block, int32_t pos) {
    return content_[static_cast<size_t>(block) * kBlockSize + pos % kBlockSize];
  }

  // The model runner's side of a step: run the copies, then write the new tokens' KV.
  void compute(SeqId id, SimSeq& seq, int32_t num_new) {
    for (const auto& [src, dst] : kv_->take_pending_copies()) {
      ASSERT_NE(src, dst);
      ASSERT_GT(kv_->pool().ref_count(dst), 0);
      ++num_copies_;
      std::copy_n(&content_[static_cast<size_t>(src) * kBlockSize], kBlockSize,
                  &content_[static_cast<size_t>(dst) * kBlockSize]);
    }
    const std::vector<BlockId>& table = kv_->block_table(id);
    for (int32_t pos = seq.num_computed; pos < seq.num_computed + num_new; ++pos) {
      slot(table[pos / kBlockSize], pos) = seq.kv[pos];
    }
    seq.num_computed += num_new;
    kv_->cache_full_blocks(id, seq.tokens, seq.num_computed);
  }

  void check_invariants() {
    const BlockPool& pool = kv_->pool();
    std::vector<int32_t> expected_refs(kNumBlocks, 0);
    for (const auto& [id, seq] : seqs_) {
      const std::vector<BlockId>& table = kv_->block_table(id);
      ASSERT_GE(static_cast<int64_t>(table.size()) * kBlockSize, seq.num_computed) << "sequence " << id;
      ASSERT_EQ(std::set<BlockId>(table.begin(), table.end()).size(), table.size()) << "a block twice in " << id;
      for (BlockId block : table) ++expected_refs[block];
      for (int32_t pos = 0; pos < seq.num_computed; ++pos) {
        ASSERT_EQ(slot(table[pos / kBlockSize], pos), seq.kv[pos]) << "sequence " << id << " position " << pos;
      }
    }
    int32_t num_zero = 0;
    int32_t num_cached_free = 0;
    for (BlockId block = 0; block < kNumBlocks; ++block) {
      ASSERT_EQ(pool.ref_count(block), expected_refs[block]) << "block " << block;
      num_zero += expected_refs[block] == 0 ? 1 : 0;
      num_cached_free += expected_refs[block] == 0 && pool.is_cached(block) ? 1 : 0;
    }
    ASSERT_EQ(pool.num_free_blocks(), num_zero);
    ASSERT_EQ(kv_->stats().num_used_blocks, kNumBlocks - num_zero);
    ASSERT_EQ(pool.num_cached_free_blocks(), num_cached_free);
    const std::vector<BlockId> queue = pool.free_queue();
    ASSERT_EQ(static_cast<int32_t>(queue.size()), num_zero);
    ASSERT_EQ(std::set<BlockId>(queue.begin(), queue.end()).size(), queue.size()) << "a block twice in the queue";
    for (BlockId block : queue) ASSERT_EQ(expected_refs[block], 0) << "referenced block " << block << " is free";
  }

  std::map<SeqId, SimSeq> seqs_;
  int64_t num_copies_ = 0;
  std::vector<uint64_t> content_ = std::vector<uint64_t>(static_cast<size_t>(kNumBlocks) * kBlockSize, 0);
};

TEST_P(KvCacheRandomTest, ManySequencesAgainstAModel) {
  KvCacheManager& kv = make(kNumBlocks, kBlockSize);
  std::mt19937 rng(GetParam());
  auto uniform = [&](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
  // A few long shared prefixes (system prompts) over a small vocabulary.
  std::vector<std::vector<int32_t>> bases(4);
  for (auto& base : bases) {
    for (int32_t i = 0; i < 40; ++i) base.push_back(uniform(0, 9));
  }
  SeqId next_id = 1;
  int64_t num_hit_tokens = 0, num_failures = 0, num_forks = 0;

  for (int step = 0; step < 4000; ++step) {
    const int32_t op = uniform(0, 99);
    if ((op < 25 && seqs_.size() < kMaxLive) || seqs_.empty()) {  // a new request
      SimSeq seq;
      const auto& base = bases[uniform(0, 3)];
      const int32_t shared = uniform(0, 40);
      for (int32_t i = 0; i < shared; ++i) seq.push(base[i]);
      for (int32_t i = uniform(shared == 0 ? 1 : 0, 12); i > 0; --i) seq.push(uniform(0, 9));
      const PrefixHit hit = kv.find_cached_prefix(seq.tokens);
      ASSERT_LT(hit.num_tokens, static_cast<int32_t>(seq.tokens.size()));
      ASSERT_EQ(hit.num_tokens, static_cast<int32_t>(hit.blocks.size()) * kBlockSize);
      for (int32_t pos = 0; pos < hit.num_tokens; ++pos) {
        ASSERT_EQ(slot(hit.blocks[pos / kBlockSize], pos), seq.kv[pos]) << "a prefix hit with the wrong contents";
      }
      const int32_t num_new = uniform(1, static_cast<int32_t>(seq.tokens.size()) - hit.num_tokens);
      const SeqId id = next_id++;
      const std::string state = snapshot({id});
      if (kv.allocate_slots(id, hit.num_tokens, num_new, &hit)) {
        num_hit_tokens += hit.num_tokens;
        seq.num_computed = hit.num_tokens;
        compute(id, seqs_[id] = seq, num_new);
      } else {
        ++num_failures;
        ASSERT_EQ(snapshot({id}), state) << "a failed allocate_slots changed something";
      }
    } else if (op < 75) {  // one scheduler step of a running sequence: prefill chunk or decode
      auto it = std::next(seqs_.begin(), uniform(0, static_cast<int32_t>(seqs_.size()) - 1));
      const SeqId id = it->first;
      SimSeq& seq = it->second;
      if (seq.num_computed == static_cast<int32_t>(seq.tokens.size())) seq.push(uniform(0, 9));  // sampled
      const int32_t num_new = uniform(1, static_cast<int32_t>(seq.tokens.size()) - seq.num_computed);
      const std::string state = snapshot({id});
      if (kv.allocate_slots(id, seq.num_computed, num_new)) {
        compute(id, seq, num_new);
        if (seq.num_computed >= static_cast<int32_t>(kMaxTokens)) {  // finished
          kv.free(id);
          seqs_.erase(id);
        }
      } else {
        ++num_failures;
        ASSERT_EQ(snapshot({id}), state) << "a failed allocate_slots changed something";
        kv.free(id);  // preempted (recompute): it gives back everything
        seqs_.erase(id);
      }
    } else if (op < 83) {  // fork (n > 1 sampling)
      auto it = std::next(seqs_.begin(), uniform(0, static_cast<int32_t>(seqs_.size()) - 1));
      const SeqId child = next_id++;
      kv.fork(it->first, child);
      ASSERT_EQ(kv.block_table(child), kv.block_table(it->first));
      seqs_[child] = it->second;
      ++num_forks;
    } else if (op < 99) {  // finished or aborted
      auto it = std::next(seqs_.begin(), uniform(0, static_cast<int32_t>(seqs_.size()) - 1));
      kv.free(it->first);
      seqs_.erase(it);
    } else {
      kv.reset_prefix_cache();
    }
    check_invariants();
    if (HasFatalFailure()) FAIL() << "at step " << step;
  }
  // The run exercised what it is meant to.
  EXPECT_GT(num_hit_tokens, 0);
  EXPECT_GT(num_copies_, 0);
  EXPECT_GT(num_failures, 0);
  EXPECT_GT(num_forks, 0);

  for (const auto& [id, seq] : seqs_) kv.free(id);
  seqs_.clear();
  check_invariants();
  EXPECT_EQ(kv.num_free_blocks(), kNumBlocks);
  EXPECT_EQ(kv.stats().num_used_blocks, 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, KvCacheRandomTest, ::testing::Values(1u, 2u, 3u, 4u));

}  // namespace
}  // namespace duet::testing
