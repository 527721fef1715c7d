// The Redis side of the KV tier: a writer thread that stores blocks (SET with a TTL, pipelined)
// and a reader thread that fetches chains of blocks (GETEX, refreshing the TTL), each on its own
// hiredis connection. Callers only queue work and collect results: nothing here blocks the
// caller on the network. A failed command closes its connection; the thread reconnects with
// back-off (0.1 s doubling to 5 s), and while a connection is down writes are dropped and fetches
// answer at once with nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "duet/kvstore/redis_url.h"

namespace duet {

struct RedisStoreConfig {
  RedisUrl url;
  int64_t ttl_seconds = 86400;                // every key expires; a hit refreshes it
  int64_t max_memory_bytes = 0;               // > 0: Redis' maxmemory, volatile-lru (set at connect)
  double timeout_seconds = 1.0;               // connect and command timeout
  size_t max_queued_bytes = size_t{64} << 20; // writes waiting beyond this are dropped
  size_t max_fetch_bytes = size_t{256} << 20; // one fetch stops once its values hold this much
};

struct RedisStoreCounters {
  int64_t hits = 0;           // blocks fetched and used
  int64_t misses = 0;         // blocks looked up and not used
  int64_t bytes_read = 0;     // of values fetched
  int64_t bytes_written = 0;  // of values stored
  int64_t errors = 0;         // failed connections and commands, values that failed their check
  int64_t dropped = 0;        // writes dropped (queue full or Redis down)
};

class RedisBlockStore {
 public:
  explicit RedisBlockStore(RedisStoreConfig config);
  // Gives the writer up to a second to store what is queued (when connected), then stops.
  ~RedisBlockStore();
  RedisBlockStore(const RedisBlockStore&) = delete;
  RedisBlockStore& operator=(const RedisBlockStore&) = delete;

  const RedisStoreConfig& config() const { return config_; }

  // Queues a block for the writer. False (and counted as dropped) when the queue is full or the
  // writer's connection is down.
  bool put(std::string key, std::string value);

  // Runs on the reader thread for each value found, in key order: whether it may be used.
  using Check = std::function<bool(size_t index, const std::string& value)>;
  // Queues a fetch of `keys` (a chain: each is only useful after the ones before it): the values
  // from the first key on, up to the first key that is absent or whose value `check` refuses.
  // Returns its ticket; the result comes back through take_fetched().
  uint64_t fetch(std::vector<std::string> keys, Check check);
  struct Fetched {
    uint64_t ticket = 0;
    std::vector<std::string> values;
  };
  std::vector<Fetched> take_fetched();
  bool has_fetched() const;

  void count_hits(int64_t n) { hits_ += n; }
  void count_misses(int64_t n) { misses_ += n; }
  void count_error() { ++errors_; }
  RedisStoreCounters counters() const;
  // Whether the writer's connection is up now.
  bool connected() const { return writer_up_.load(); }
  // Waits up to `timeout` until the writer has no queued block (tests, shutdown); true if empty.
  bool flush(std::chrono::milliseconds timeout);

 private:
  class Connection;
  struct FetchJob {
    uint64_t ticket;
    std::vector<std::string> keys;
    Check check;
  };

  void write_loop();
  void read_loop();
  void run_fetch(Connection& conn, FetchJob& job, std::vector<std::string>& values);

  RedisStoreConfig config_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> writer_up_{false};
  std::atomic<int64_t> hits_{0}, misses_{0}, bytes_read_{0}, bytes_written_{0}, errors_{0}, dropped_{0};

  std::mutex write_mutex_;
  std::condition_variable write_wake_;
  std::condition_variable write_idle_;
  std::deque<std::pair<std::string, std::string>> writes_;
  size_t queued_bytes_ = 0;
  bool writing_ = false;  // a batch is being sent

  mutable std::mutex read_mutex_;
  std::condition_variable read_wake_;
  std::deque<FetchJob> fetches_;
  std::vector<Fetched> fetched_;
  uint64_t next_ticket_ = 1;

  std::thread writer_;
  std::thread reader_;
};

}  // namespace duet
