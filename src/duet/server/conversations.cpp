#include "duet/server/conversations.h"

#include <algorithm>
#include <chrono>
#include <random>

#include <fmt/format.h>

#include "duet/server/openai.h"
#include "duet/server/responses.h"

namespace duet::server {
namespace {

using nlohmann::json;

// OpenAI's limit on the items one request adds to a conversation.
constexpr size_t kMaxItemsPerRequest = 20;

std::string new_conversation_id() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("conv_{:016x}{:016x}", rng(), rng());
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

json list_page(json items, const std::string& order, const std::string& after, int64_t limit, const std::string& what) {
  if (!order.empty() && order != "asc" && order != "desc") throw ApiError(400, "order must be asc or desc", "order");
  if (order != "asc") std::reverse(items.begin(), items.end());  // newest first, as OpenAI lists them
  size_t from = 0;
  if (!after.empty()) {
    while (from < items.size() && items[from].value("id", "") != after) ++from;
    if (from == items.size()) throw ApiError(404, fmt::format("no item '{}' in this {}", after, what), "after");
    ++from;
  }
  json data = json::array();
  for (size_t i = from; i < items.size() && static_cast<int64_t>(data.size()) < limit; ++i) data.push_back(items[i]);
  const bool more = from + data.size() < items.size();
  json body = {{"object", "list"}, {"data", data}, {"has_more", more}, {"first_id", nullptr}, {"last_id", nullptr}};
  if (!data.empty()) {
    body["first_id"] = data.front().value("id", "");
    body["last_id"] = data.back().value("id", "");
  }
  return body;
}

ConversationStore::ConversationStore(size_t max_bytes, const std::string& redis_url) : max_bytes_(max_bytes) {
  if (!redis_url.empty() && max_bytes > 0) redis_ = std::make_unique<RedisDocuments>(redis_url, "duet:conversation:");
}

void ConversationStore::drop(const std::string& id) {
  const auto it = index_.find(id);
  if (it == index_.end()) return;
  bytes_ -= it->second->bytes;
  lru_.erase(it->second);
  index_.erase(it);
}

json ConversationStore::change(const std::string& id, const std::function<json(Conversation&)>& f) {
  sync(id);
  std::lock_guard<std::mutex> lock(mutex_);
  Conversation& c = find(id);
  json out = f(c);
  measure(c);
  persist(c);
  return out;
}

void ConversationStore::insert(Conversation c) {
  drop(c.id);
  c.bytes = 0;
  lru_.push_front(std::move(c));
  index_[lru_.front().id] = lru_.begin();
  measure(lru_.front());
}

void ConversationStore::sync(const std::string& id) {
  if (!redis_) return;
  const RedisDocuments::Answer a = redis_->get(id);
  std::lock_guard<std::mutex> lock(mutex_);
  if (a.state == RedisDocuments::Answer::kDeleted) return drop(id);
  if (a.state != RedisDocuments::Answer::kFound) return;  // not there (a write still queued), or no answer
  const json kept = json::parse(a.text, nullptr, false);
  if (!kept.is_object() || !kept.contains("items") || !kept["items"].is_array()) {
    redis_->count_error();
    return;
  }
  Conversation c;
  c.id = id;
  c.created_at = kept.value("created_at", int64_t{0});
  c.metadata = kept.value("metadata", json::object());
  c.items = kept["items"];
  insert(std::move(c));
}

void ConversationStore::persist(const Conversation& c) {
  if (redis_) redis_->put(c.id, json_text({{"created_at", c.created_at}, {"metadata", c.metadata}, {"items", c.items}}));
}

size_t ConversationStore::size() {
  std::lock_guard<std::mutex> lock(mutex_);
  return lru_.size();
}

size_t ConversationStore::bytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

json ConversationStore::read_items(const json& items) {
  if (!items.is_array()) throw ApiError(400, "items must be a list of items", "items");
  if (items.size() > kMaxItemsPerRequest) {
    throw ApiError(400, fmt::format("items lists {} items: at most {} are added at a time", items.size(), kMaxItemsPerRequest),
                   "items");
  }
  json messages = json::array(), out = json::array();
  try {
    read_input_items(items, messages, out);
  } catch (const ApiError& e) {
    std::string message = e.what();
    if (message.rfind("input", 0) == 0) message = "items" + message.substr(5);
    throw ApiError(400, message, "items");
  }
  return out;
}

json ConversationStore::object(const Conversation& c) const {
  return {{"id", c.id}, {"object", "conversation"}, {"created_at", c.created_at}, {"metadata", c.metadata}};
}

ConversationStore::Conversation& ConversationStore::find(const std::string& id) {
  auto it = index_.find(id);
  if (it == index_.end()) throw ApiError(404, fmt::format("Conversation with id '{}' not found.", id), "conversation_id", "not_found");
  lru_.splice(lru_.begin(), lru_, it->second);
  return lru_.front();
}

void ConversationStore::measure(Conversation& c) {
  bytes_ -= c.bytes;
  c.bytes = json_text(c.items).size() + json_text(c.metadata).size() + c.id.size();
  bytes_ += c.bytes;
  // The least recently used go first; the one just used stays even when it alone passes the budget.
  while (bytes_ > max_bytes_ && lru_.size() > 1) drop(std::string(lru_.back().id));
}

json ConversationStore::create(const json& body) {
  if (!enabled()) throw ApiError(400, "the server keeps no conversations (it runs with --responses-store-mib 0)");
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object {items, metadata}");
  Conversation c;
  const json& items = json_field(body, "items");
  if (!items.is_null()) c.items = read_items(items);
  const json& metadata = json_field(body, "metadata");
  check_metadata(metadata);
  c.metadata = metadata.is_null() ? json::object() : metadata;
  c.id = new_conversation_id();
  c.created_at = unix_seconds();
  std::lock_guard<std::mutex> lock(mutex_);
  insert(std::move(c));
  persist(lru_.front());
  return object(lru_.front());
}

json ConversationStore::get(const std::string& id) {
  sync(id);
  std::lock_guard<std::mutex> lock(mutex_);
  return object(find(id));
}

json ConversationStore::update(const std::string& id, const json& body) {
  if (!body.is_object() || !body.contains("metadata")) throw ApiError(400, "the body must be {\"metadata\": {...}}", "metadata");
  const json& metadata = body["metadata"];
  check_metadata(metadata);
  return change(id, [&](Conversation& c) {
    c.metadata = metadata.is_null() ? json::object() : metadata;
    return object(c);
  });
}

json ConversationStore::erase(const std::string& id) {
  sync(id);
  std::lock_guard<std::mutex> lock(mutex_);
  find(id);
  if (redis_) redis_->erase(id);
  drop(id);
  return {{"id", id}, {"object", "conversation.deleted"}, {"deleted", true}};
}

json ConversationStore::list_items(const std::string& id, const std::string& order, const std::string& after, int64_t limit) {
  return list_page(items(id), order, after, limit, "conversation");
}

json ConversationStore::add_items(const std::string& id, const json& body) {
  if (!body.is_object() || !body.contains("items")) throw ApiError(400, "the body must be {\"items\": [...]}", "items");
  const json added = read_items(body["items"]);
  change(id, [&](Conversation& c) {
    c.items.insert(c.items.end(), added.begin(), added.end());
    return json();
  });
  return list_page(added, "asc", "", static_cast<int64_t>(added.size()) + 1, "conversation");
}

json ConversationStore::get_item(const std::string& id, const std::string& item_id) {
  for (const json& item : items(id)) {
    if (item.value("id", "") == item_id) return item;
  }
  throw ApiError(404, fmt::format("Item with id '{}' not found in conversation '{}'.", item_id, id), "item_id", "not_found");
}

json ConversationStore::delete_item(const std::string& id, const std::string& item_id) {
  return change(id, [&](Conversation& c) {
    const auto it = std::find_if(c.items.begin(), c.items.end(), [&](const json& item) { return item.value("id", "") == item_id; });
    if (it == c.items.end()) {
      throw ApiError(404, fmt::format("Item with id '{}' not found in conversation '{}'.", item_id, id), "item_id", "not_found");
    }
    c.items.erase(it);
    return object(c);
  });
}

json ConversationStore::items(const std::string& id) {
  sync(id);
  std::lock_guard<std::mutex> lock(mutex_);
  return find(id).items;
}

void ConversationStore::append(const std::string& id, const json& items) {
  // The response read the conversation when it started, so memory has it (unless the budget
  // dropped it since: then Redis, waited for here, is asked).
  bool here = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    here = index_.count(id) != 0;
  }
  if (!here) sync(id);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return;
  lru_.splice(lru_.begin(), lru_, it->second);
  Conversation& c = lru_.front();
  for (const json& item : items) {
    // An item the turn referred to (item_reference) is in the conversation already.
    const std::string id = item.value("id", "");
    const bool there = std::any_of(c.items.begin(), c.items.end(), [&](const json& i) { return i.value("id", "") == id; });
    if (!there) c.items.push_back(item);
  }
  measure(c);
  persist(c);
}

}  // namespace duet::server
