#include "duet/kvstore/redis_block_store.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

namespace duet {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kFirstBackoff = 0.1;
constexpr double kMaxBackoff = 5.0;
constexpr size_t kWriteBatch = 64;
constexpr size_t kWriteBatchBytes = size_t{8} << 20;
constexpr size_t kFetchChunk = 8;

timeval to_timeval(double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

}  // namespace

// One hiredis connection with its back-off. Used by one thread only.
class RedisBlockStore::Connection {
 public:
  Connection(const RedisStoreConfig& config, const char* role, std::atomic<int64_t>& errors)
      : config_(config), role_(role), errors_(errors) {}
  ~Connection() { close(); }

  bool up() const { return c_ != nullptr; }
  Clock::time_point next_attempt() const { return next_attempt_; }

  // Connected, or connected now if the back-off allows an attempt; false while Redis is down.
  bool ready() {
    if (c_ != nullptr) return true;
    if (Clock::now() < next_attempt_) return false;
    const RedisUrl& u = config_.url;
    c_ = redisConnectWithTimeout(u.host.c_str(), u.port, to_timeval(config_.timeout_seconds));
    if (c_ == nullptr || c_->err != 0) {
      down(c_ == nullptr ? std::string("out of memory") : std::string(c_->errstr));
      return false;
    }
    redisSetTimeout(c_, to_timeval(config_.timeout_seconds));
    std::string error;
    if (!u.password.empty() && !simple({"AUTH", u.password}, error)) return down("AUTH: " + error), false;
    if (u.db != 0 && !simple({"SELECT", std::to_string(u.db)}, error)) return down("SELECT: " + error), false;
    if (config_.max_memory_bytes > 0 && std::string_view(role_) == "writer") {
      // The cap is Redis' own: maxmemory, and evicting only keys with a TTL (every duet key has one).
      if (!simple({"CONFIG", "SET", "maxmemory", std::to_string(config_.max_memory_bytes)}, error) ||
          !simple({"CONFIG", "SET", "maxmemory-policy", "volatile-lru"}, error)) {
        if (c_ == nullptr) return false;
        spdlog::warn("kv-cache-redis: {} refused the memory cap ({}); it is left as the server has it",
                     u.display(), error);
      }
    }
    if (was_down_) spdlog::info("kv-cache-redis: {} connected to {} again", role_, u.display());
    if (!was_down_ && !connected_once_) spdlog::info("kv-cache-redis: {} connected to {}", role_, u.display());
    connected_once_ = true;
    was_down_ = false;
    delay_ = kFirstBackoff;
    return true;
  }

  // A failed connection or command: counted, the connection closed, the next attempt backed off.
  void down(const std::string& what) {
    ++errors_;
    close();
    if (!was_down_) {
      spdlog::warn("kv-cache-redis: {} lost {} ({}); retrying with back-off, requests go on with the local cache",
                   role_, config_.url.display(), what);
    }
    was_down_ = true;
    next_attempt_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay_));
    delay_ = std::min(delay_ * 2.0, kMaxBackoff);
  }

  // Sends the commands in one pipeline and reads every reply in order. On a connection error
  // (nothing read for the rest): false, the connection is down.
  bool pipeline(const std::vector<std::vector<std::string_view>>& commands,
                const std::function<void(size_t, redisReply*)>& on_reply) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& cmd : commands) {
      argv.clear();
      lens.clear();
      for (std::string_view a : cmd) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      if (redisAppendCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK) {
        down(c_->errstr);
        return false;
      }
    }
    for (size_t i = 0; i < commands.size(); ++i) {
      void* raw = nullptr;
      if (redisGetReply(c_, &raw) != REDIS_OK || raw == nullptr) {
        down(c_ != nullptr && c_->err != 0 ? std::string(c_->errstr) : std::string("no reply"));
        return false;
      }
      Reply reply(static_cast<redisReply*>(raw));
      on_reply(i, reply.get());
    }
    return true;
  }

 private:
  // One command whose reply must not be an error.
  bool simple(std::vector<std::string> args, std::string& error) {
    std::vector<std::string_view> cmd(args.begin(), args.end());
    bool ok = true;
    if (!pipeline({cmd}, [&](size_t, redisReply* r) {
          if (r->type == REDIS_REPLY_ERROR) {
            ok = false;
            error = std::string(r->str, r->len);
          }
        })) {
      error = "connection lost";
      return false;
    }
    return ok;
  }

  void close() {
    if (c_ != nullptr) redisFree(c_);
    c_ = nullptr;
  }

  const RedisStoreConfig& config_;
  const char* role_;
  std::atomic<int64_t>& errors_;
  redisContext* c_ = nullptr;
  Clock::time_point next_attempt_{};
  double delay_ = kFirstBackoff;
  bool was_down_ = false;
  bool connected_once_ = false;
};

RedisBlockStore::RedisBlockStore(RedisStoreConfig config) : config_(std::move(config)) {
  writer_ = std::thread([this] { write_loop(); });
  reader_ = std::thread([this] { read_loop(); });
}

RedisBlockStore::~RedisBlockStore() {
  if (writer_up_.load()) flush(std::chrono::milliseconds(1000));
  stop_ = true;
  {
    std::lock_guard<std::mutex> lock(write_mutex_);
    write_wake_.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(read_mutex_);
    read_wake_.notify_all();
  }
  writer_.join();
  reader_.join();
}

bool RedisBlockStore::put(std::string key, std::string value) {
  const size_t bytes = key.size() + value.size();
  std::lock_guard<std::mutex> lock(write_mutex_);
  if (!writer_up_.load() || queued_bytes_ + bytes > config_.max_queued_bytes) {
    ++dropped_;
    return false;
  }
  queued_bytes_ += bytes;
  writes_.emplace_back(std::move(key), std::move(value));
  write_wake_.notify_one();
  return true;
}

bool RedisBlockStore::flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(write_mutex_);
  return write_idle_.wait_for(lock, timeout, [&] { return writes_.empty() && !writing_; });
}

void RedisBlockStore::write_loop() {
  Connection conn(config_, "writer", errors_);
  const std::string ttl = std::to_string(config_.ttl_seconds);
  std::vector<std::pair<std::string, std::string>> batch;
  std::vector<std::vector<std::string_view>> commands;
  for (;;) {
    if (!conn.up()) {
      writer_up_ = conn.ready();
      if (!writer_up_) {
        std::unique_lock<std::mutex> lock(write_mutex_);
        // Down: what was queued is dropped, and nothing is queued until the next attempt.
        dropped_ += static_cast<int64_t>(writes_.size());
        writes_.clear();
        queued_bytes_ = 0;
        write_idle_.notify_all();
        if (stop_) return;
        write_wake_.wait_until(lock, conn.next_attempt(), [&] { return stop_.load(); });
        if (stop_) return;
        continue;
      }
    }
    {
      std::unique_lock<std::mutex> lock(write_mutex_);
      write_wake_.wait(lock, [&] { return stop_ || !writes_.empty(); });
      if (writes_.empty()) return;  // stopping, nothing left
      size_t bytes = 0;
      while (!writes_.empty() && batch.size() < kWriteBatch && bytes < kWriteBatchBytes) {
        bytes += writes_.front().first.size() + writes_.front().second.size();
        batch.push_back(std::move(writes_.front()));
        writes_.pop_front();
      }
      writing_ = true;
    }
    commands.clear();
    for (const auto& [key, value] : batch) commands.push_back({"SET", key, value, "EX", ttl});
    int64_t written = 0;
    const bool sent = conn.pipeline(commands, [&](size_t i, redisReply* r) {
      if (r->type == REDIS_REPLY_ERROR) {
        ++errors_;  // e.g. OOM under maxmemory with noeviction: this block is not stored
      } else {
        written += static_cast<int64_t>(batch[i].second.size());
      }
    });
    bytes_written_ += written;
    if (!sent) writer_up_ = false;
    {
      std::lock_guard<std::mutex> lock(write_mutex_);
      size_t bytes = 0;
      for (const auto& [key, value] : batch) bytes += key.size() + value.size();
      queued_bytes_ -= std::min(queued_bytes_, bytes);
      writing_ = false;
      write_idle_.notify_all();
    }
    batch.clear();
  }
}

uint64_t RedisBlockStore::fetch(std::vector<std::string> keys, Check check) {
  std::lock_guard<std::mutex> lock(read_mutex_);
  const uint64_t ticket = next_ticket_++;
  fetches_.push_back(FetchJob{ticket, std::move(keys), std::move(check)});
  read_wake_.notify_one();
  return ticket;
}

std::vector<RedisBlockStore::Fetched> RedisBlockStore::take_fetched() {
  std::lock_guard<std::mutex> lock(read_mutex_);
  std::vector<Fetched> out;
  out.swap(fetched_);
  return out;
}

bool RedisBlockStore::has_fetched() const {
  std::lock_guard<std::mutex> lock(read_mutex_);
  return !fetched_.empty();
}

void RedisBlockStore::read_loop() {
  Connection conn(config_, "reader", errors_);
  for (;;) {
    FetchJob job;
    {
      std::unique_lock<std::mutex> lock(read_mutex_);
      read_wake_.wait(lock, [&] { return stop_ || !fetches_.empty(); });
      if (stop_) return;
      job = std::move(fetches_.front());
      fetches_.pop_front();
    }
    std::vector<std::string> values;
    if (conn.ready()) run_fetch(conn, job, values);
    std::lock_guard<std::mutex> lock(read_mutex_);
    fetched_.push_back(Fetched{job.ticket, std::move(values)});
  }
}

void RedisBlockStore::run_fetch(Connection& conn, FetchJob& job, std::vector<std::string>& values) {
  const std::string ttl = std::to_string(config_.ttl_seconds);
  bool getex = true;  // GETEX refreshes the TTL (Redis 6.2); GET on older servers
  size_t bytes = 0;
  std::vector<std::vector<std::string_view>> commands;
  for (size_t first = 0; first < job.keys.size(); first += kFetchChunk) {
    const size_t end = std::min(job.keys.size(), first + kFetchChunk);
    commands.clear();
    for (size_t i = first; i < end; ++i) {
      if (getex) {
        commands.push_back({"GETEX", job.keys[i], "EX", ttl});
      } else {
        commands.push_back({"GET", job.keys[i]});
      }
    }
    bool done = false;
    bool retry_with_get = false;
    const bool ok = conn.pipeline(commands, [&](size_t i, redisReply* r) {
      if (done) return;
      if (r->type == REDIS_REPLY_STRING) {
        bytes_read_ += static_cast<int64_t>(r->len);
        std::string value(r->str, r->len);
        if (!job.check(first + i, value)) {
          ++errors_;  // corrupt, foreign or of another layout: never used
          done = true;
          return;
        }
        bytes += value.size();
        values.push_back(std::move(value));
        if (bytes >= config_.max_fetch_bytes) done = true;
        return;
      }
      if (r->type == REDIS_REPLY_ERROR && getex && std::string_view(r->str, r->len).find("unknown command") != std::string_view::npos) {
        retry_with_get = true;
      } else if (r->type == REDIS_REPLY_ERROR) {
        ++errors_;
      }
      done = true;  // absent (nil), an error, or a reply of another type: the chain ends here
    });
    if (retry_with_get && values.size() == first) {
      getex = false;
      first -= kFetchChunk;  // the same chunk again, with GET
      continue;
    }
    if (!ok || done) return;
  }
}

RedisStoreCounters RedisBlockStore::counters() const {
  RedisStoreCounters c;
  c.hits = hits_.load();
  c.misses = misses_.load();
  c.bytes_read = bytes_read_.load();
  c.bytes_written = bytes_written_.load();
  c.errors = errors_.load();
  c.dropped = dropped_.load();
  return c;
}

}  // namespace duet
