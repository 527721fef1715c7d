// The responses a server keeps for /v1/responses: in memory under a byte budget, and in Redis
// when asked (--responses-redis).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "duet/kvstore/redis_block_store.h"
#include "duet/server/responses.h"

namespace duet::server {

// JSON documents a server keeps in Redis (--responses-redis) under `prefix` + id, for 30 days:
// written without waiting (the writer's queue), read with the connection's deadline, deleted as a
// tombstone so that every server on that Redis sees the deletion. Thread-safe.
class RedisDocuments {
 public:
  RedisDocuments(const std::string& redis_url, std::string prefix);
  void put(const std::string& id, std::string text);
  void erase(const std::string& id);
  // What Redis says of a document: its text, deleted, not there, or nothing (unreachable, or no
  // answer within the deadline).
  struct Answer {
    enum State { kFound, kDeleted, kAbsent, kNoAnswer } state = kNoAnswer;
    std::string text;  // kFound
  };
  Answer get(const std::string& id);
  void count_error() { redis_.count_error(); }

 private:
  std::string key(const std::string& id) const { return prefix_ + id; }
  std::string prefix_;
  RedisBlockStore redis_;
  std::mutex fetch_mutex_;  // the fetched values of all callers, taken from redis_ by whoever waits
  std::unordered_map<uint64_t, std::vector<std::string>> fetched_;
};

// The responses a server keeps, the least recently used dropped first once their text passes a
// byte budget (--responses-store-mib). With Redis (--responses-redis), finished responses are
// also written there (for 30 days) and read from there first, so they outlive a restart and every
// server on the same Redis sees them; a deletion is written as a tombstone. A running background
// response is only in the memory of the server that runs it. Thread-safe.
class ResponseStore {
 public:
  // `redis_url` empty: memory only.
  explicit ResponseStore(size_t max_bytes, const std::string& redis_url = {});
  bool enabled() const { return max_bytes_ > 0; }
  // Adds or replaces an entry (its size read now: put it again once it finished); one deleted is
  // not added.
  void put(std::shared_ptr<StoredResponse> r);
  std::shared_ptr<StoredResponse> get(const std::string& id);
  bool erase(const std::string& id);
  size_t size() const;
  size_t bytes() const;

 private:
  struct Entry {
    std::shared_ptr<StoredResponse> response;
    size_t bytes;  // its size when it was put
  };
  size_t max_bytes_;
  std::unique_ptr<RedisDocuments> redis_;
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
};

}  // namespace duet::server
