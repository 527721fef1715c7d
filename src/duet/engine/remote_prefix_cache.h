// The engine's side of the Redis KV tier (docs/ARCHITECTURE.md, "The Redis KV tier"): blocks the
// prefix cache registers are copied out of the devices' KV storage and queued for Redis; a new
// request's full blocks past its local prefix are fetched before it is scheduled and imported
// into free blocks of the pool, where the ordinary prefix lookup finds them. Runs on the engine
// thread; the network is the RedisBlockStore's threads' business.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "duet/cache/kv_cache_manager.h"
#include "duet/formats/gguf.h"
#include "duet/kvstore/block_codec.h"
#include "duet/kvstore/redis_block_store.h"
#include "duet/model/model.h"
#include "duet/engine/request.h"

namespace duet {

struct RedisKvConfig {
  std::string url;               // redis://HOST:PORT[/DB]; empty: no Redis tier
  int64_t ttl_seconds = 86400;   // of every block written (a hit refreshes it)
  int64_t max_memory_bytes = 0;  // > 0: Redis' maxmemory (volatile-lru), set at connect
  double timeout_ms = 1000.0;    // the longest a new request waits for its blocks
};

// A hash of what makes a model's KV what it is: the architecture and every metadata key and
// value, every tensor's name, type and shape, and 64 bytes from the start, middle and end of each
// tensor's data. Read before the model loads (a folder's converted copies may be released after).
uint64_t model_fingerprint(const GgufFile& file);

class RemotePrefixCache {
 public:
  // Throws kInvalidArgument for a bad URL or settings. Redis need not be up: the store connects
  // (and reconnects) on its own.
  RemotePrefixCache(const RedisKvConfig& config, uint64_t model_fingerprint, KvDtype dtype, const PagedKvCache& cache,
                    int32_t max_fetch_blocks);

  const BlockLayout& layout() const { return layout_; }
  uint64_t identity() const { return identity_; }

  // Copies out and queues the blocks the cache manager registered since the last call.
  void export_blocks(KvCacheManager& kv, PagedKvCache& cache);
  // A new request's prompt: starts fetching its full blocks (those whose K/V can be reused: the
  // last token is always computed) past the local prefix. Returns the fetch's ticket, or 0 when
  // there is nothing to fetch. `salt`: the chain's (chain_hashes).
  uint64_t start_fetch(const std::vector<int32_t>& prompt, const KvCacheManager& kv, BlockHash salt = 0);
  // Imports the fetches that are done into free blocks of the pool; returns their tickets.
  std::vector<uint64_t> poll(KvCacheManager& kv, PagedKvCache& cache);
  // The request of this fetch goes on without it (it took too long, or the request was aborted):
  // its blocks count as misses; what still comes back is imported for later requests.
  void abandon(uint64_t ticket);
  bool has_pending() const { return !pending_.empty(); }
  // Whether a fetch is done and waits for poll().
  bool has_results() const { return store_->has_fetched(); }

  RedisStoreCounters counters() const { return store_->counters(); }
  RedisBlockStore& store() { return *store_; }

 private:
  struct Pending {
    std::shared_ptr<const std::vector<int32_t>> tokens;
    int32_t first = 0;  // chain index of the first block fetched
    int32_t count = 0;
    Clock::time_point started;
    BlockHash salt = 0;
    bool abandoned = false;  // no request waits for it any more
  };

  BlockLayout layout_;
  uint64_t identity_ = 0;
  int32_t max_fetch_blocks_ = 0;
  std::unordered_map<uint64_t, Pending> pending_;
  std::vector<uint8_t> payload_;  // one block's K/V while exporting
  std::unique_ptr<RedisBlockStore> store_;
};

}  // namespace duet
