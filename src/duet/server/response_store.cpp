#include "duet/server/response_store.h"

#include <chrono>
#include <iterator>
#include <optional>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "duet/kvstore/redis_url.h"

namespace duet::server {
namespace {

using nlohmann::json;

constexpr int64_t kRedisTtlSeconds = 30 * 86400;  // as long as OpenAI keeps a stored response
constexpr const char* kTombstone = "deleted";

RedisStoreConfig documents_config(const std::string& url) {
  RedisStoreConfig c;
  c.url = parse_redis_url(url);
  c.ttl_seconds = kRedisTtlSeconds;
  return c;
}

}  // namespace

RedisDocuments::RedisDocuments(const std::string& redis_url, std::string prefix)
    : prefix_(std::move(prefix)), redis_(documents_config(redis_url)) {}

void RedisDocuments::put(const std::string& id, std::string text) { redis_.put(key(id), std::move(text)); }

void RedisDocuments::erase(const std::string& id) { redis_.put(key(id), kTombstone); }

RedisDocuments::Answer RedisDocuments::get(const std::string& id) {
  const uint64_t ticket = redis_.fetch({key(id)}, [](size_t, const std::string&) { return true; });
  const auto wait = std::chrono::duration<double>(redis_.config().timeout_seconds + 0.5);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(wait);
  std::optional<std::vector<std::string>> values;
  while (!values && std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(fetch_mutex_);
      for (RedisBlockStore::Fetched& f : redis_.take_fetched()) fetched_[f.ticket] = std::move(f.values);
      if (auto it = fetched_.find(ticket); it != fetched_.end()) {
        values = std::move(it->second);
        fetched_.erase(it);
      }
    }
    if (!values) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Answer out;
  // Nothing fetched while the connection is down says nothing.
  if (!values || (values->empty() && !redis_.connected())) return out;
  if (values->empty()) {
    out.state = Answer::kAbsent;
  } else if (values->front() == kTombstone) {
    out.state = Answer::kDeleted;
  } else {
    out.state = Answer::kFound;
    out.text = std::move(values->front());
  }
  return out;
}

ResponseStore::ResponseStore(size_t max_bytes, const std::string& redis_url) : max_bytes_(max_bytes) {
  if (redis_url.empty() || max_bytes == 0) return;
  redis_ = std::make_unique<RedisDocuments>(redis_url, "duet:response:");
}

void ResponseStore::put(std::shared_ptr<StoredResponse> r) {
  if (!enabled() || r->deleted()) return;
  if (redis_ && !r->running()) {
    redis_->put(r->id, json_text(json{{"response", r->response()}, {"messages", r->messages}, {"input_items", r->input_items}}));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(r->id);
  if (it != index_.end()) {
    bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  const size_t bytes = r->bytes();
  lru_.push_front({std::move(r), bytes});
  index_[lru_.front().response->id] = lru_.begin();
  bytes_ += bytes;
  // The least recently used go first; the newest stays even when it alone passes the budget, and
  // a background run stays until it finished.
  for (auto e = std::prev(lru_.end()); bytes_ > max_bytes_ && e != lru_.begin();) {
    auto older = e;
    e = std::prev(e);
    if (older->response->running()) continue;
    bytes_ -= older->bytes;
    index_.erase(older->response->id);
    lru_.erase(older);
  }
}

std::shared_ptr<StoredResponse> ResponseStore::get(const std::string& id) {
  std::shared_ptr<StoredResponse> local;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(id);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      local = lru_.front().response;
    }
  }
  // Redis has the last word on finished responses (another server may have deleted one); what
  // it does not have (a write still queued, one made while it was down) or cannot say
  // (unreachable) comes from memory.
  if (!redis_ || (local && local->running())) return local;
  const RedisDocuments::Answer remote = redis_->get(id);
  if (remote.state == RedisDocuments::Answer::kDeleted) return nullptr;
  if (remote.state != RedisDocuments::Answer::kFound) return local;
  const json kept = json::parse(remote.text, nullptr, false);
  if (!kept.is_object() || !kept.contains("response") || !kept.contains("messages")) {
    redis_->count_error();
    return local;
  }
  auto found = std::make_shared<StoredResponse>();
  found->id = id;
  found->input_items = kept.value("input_items", json::array());
  found->finish(kept["response"], kept["messages"]);
  return found;
}

bool ResponseStore::erase(const std::string& id) {
  if (redis_) redis_->erase(id);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  bytes_ -= it->second->bytes;
  lru_.erase(it->second);
  index_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lru_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

}  // namespace duet::server
