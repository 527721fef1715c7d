// OpenAI's Conversations API (/v1/conversations): a conversation is a list of items (messages,
// function calls and their outputs, reasoning) that responses naming it (`conversation` on
// /v1/responses) continue, each adding its input and output items to it. Kept in memory under a
// byte budget (--responses-store-mib, beside the responses), the least recently used dropped
// first; with Redis (--responses-redis) also there, written at every change and read from there
// first, so that they outlive a restart and every server on that Redis continues them.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "duet/server/response_store.h"

namespace duet::server {

// One page of a list of items with ids, as OpenAI's list routes give it ({"object": "list",
// "data", "first_id", "last_id", "has_more"}): newest first unless `order` is "asc", after the item
// `after` (404 naming `what` when it is not there), at most `limit`.
nlohmann::json list_page(nlohmann::json items, const std::string& order, const std::string& after, int64_t limit,
                         const std::string& what);

class ConversationStore {
 public:
  // `redis_url` empty: memory only.
  explicit ConversationStore(size_t max_bytes, const std::string& redis_url = {});
  bool enabled() const { return max_bytes_ > 0; }
  size_t size();   // conversations kept
  size_t bytes();  // their size, as the budget counts it

  // The routes' answers; each throws ApiError (400 for a bad body, 404 for an unknown id).
  nlohmann::json create(const nlohmann::json& body);  // {items (up to 20), metadata}
  nlohmann::json get(const std::string& id);
  nlohmann::json update(const std::string& id, const nlohmann::json& body);  // {metadata}
  nlohmann::json erase(const std::string& id);
  nlohmann::json list_items(const std::string& id, const std::string& order, const std::string& after, int64_t limit);
  nlohmann::json add_items(const std::string& id, const nlohmann::json& body);  // {items (up to 20)}
  nlohmann::json get_item(const std::string& id, const std::string& item_id);
  nlohmann::json delete_item(const std::string& id, const std::string& item_id);  // the conversation

  // For a response: the conversation's items in order (throws 404), and its turn's items added
  // once it finished (those it has already, by id, once; nothing when the conversation was deleted
  // meanwhile).
  nlohmann::json items(const std::string& id);
  void append(const std::string& id, const nlohmann::json& items);

 private:
  struct Conversation {
    std::string id;
    int64_t created_at = 0;
    nlohmann::json metadata;
    nlohmann::json items = nlohmann::json::array();
    size_t bytes = 0;
  };
  nlohmann::json object(const Conversation& c) const;
  Conversation& find(const std::string& id);  // mutex_ held; the most recently used now
  void measure(Conversation& c);              // mutex_ held: its size, then the budget kept
  // With Redis: what it holds of `id` replaces the memory's (mutex_ not held: it waits for Redis);
  // a deletion there removes it here. persist writes a conversation there (mutex_ held).
  void sync(const std::string& id);
  void persist(const Conversation& c);
  void insert(Conversation c);         // mutex_ held: the most recently used
  void drop(const std::string& id);    // mutex_ held: gone from memory, if it was there
  // A change of a conversation (synced first), its size measured and written to Redis after;
  // what `f` returns is the answer.
  nlohmann::json change(const std::string& id, const std::function<nlohmann::json(Conversation&)>& f);
  // The items of a request body, checked and given ids as the Responses API reads input items.
  static nlohmann::json read_items(const nlohmann::json& items);

  const size_t max_bytes_;
  std::unique_ptr<RedisDocuments> redis_;
  std::mutex mutex_;
  std::list<Conversation> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Conversation>::iterator> index_;
  size_t bytes_ = 0;
};

}  // namespace duet::server
