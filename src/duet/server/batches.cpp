#include "duet/server/batches.h"

#include <algorithm>
#include <iterator>
#include <chrono>
#include <istream>
#include <optional>
#include <sstream>
#include <streambuf>

#include <fmt/format.h>

#include "duet/server/openai.h"

namespace duet::server {

using nlohmann::json;

namespace {

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An istream over a string it does not copy.
class ViewBuffer : public std::streambuf {
 public:
  explicit ViewBuffer(const std::string& s) {
    char* p = const_cast<char*>(s.data());
    setg(p, p, p + s.size());
  }
};

// OpenAI's list object over `items` (each with an "id").
json list_object(std::vector<json> items, bool has_more) {
  json out = {{"object", "list"}, {"data", json::array()}, {"first_id", nullptr}, {"last_id", nullptr},
              {"has_more", has_more}};
  if (!items.empty()) {
    out["first_id"] = items.front()["id"];
    out["last_id"] = items.back()["id"];
  }
  out["data"] = std::move(items);
  return out;
}

json optional_time(const std::optional<int64_t>& t) { return t ? json(*t) : json(nullptr); }

}  // namespace

json StoredFile::to_json() const {
  return {{"id", id},
          {"object", "file"},
          {"bytes", data ? data->size() : 0},
          {"created_at", created_at},
          {"expires_at", nullptr},
          {"filename", filename},
          {"purpose", purpose},
          {"status", "processed"},
          {"status_details", nullptr}};
}

StoredFile FileStore::put(std::string filename, std::string purpose, std::string data) {
  auto f = std::make_shared<StoredFile>();
  f->id = unique_id("file-");
  f->filename = std::move(filename);
  f->purpose = std::move(purpose);
  f->created_at = unix_seconds();
  const size_t size = data.size();
  f->data = std::make_shared<const std::string>(std::move(data));
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes_ + size > max_bytes_) {
    throw ApiError(400, fmt::format("the file is {} bytes and the server's file store has {} of its {} left "
                                    "(--files-store-mib): delete files with DELETE /v1/files/{{id}}",
                                    size, max_bytes_ - bytes_, max_bytes_), "file");
  }
  bytes_ += size;
  files_[f->id] = f;
  order_.push_back(f->id);
  return *f;
}

std::shared_ptr<const StoredFile> FileStore::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = files_.find(id);
  return it == files_.end() ? nullptr : it->second;
}

bool FileStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = files_.find(id);
  if (it == files_.end()) return false;
  bytes_ -= it->second->data->size();
  files_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), id));
  return true;
}

size_t FileStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

json FileStore::list(const std::string& purpose, const std::string& order, const std::string& after, int64_t limit) const {
  if (order != "asc" && order != "desc") throw ApiError(400, "order must be 'asc' or 'desc'", "order");
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> ids = order_;
  if (order == "desc") std::reverse(ids.begin(), ids.end());
  auto from = ids.begin();
  if (!after.empty()) {
    from = std::find(ids.begin(), ids.end(), after);
    if (from == ids.end()) throw ApiError(404, fmt::format("No such File object: {}", after), "after");
    ++from;
  }
  std::vector<json> items;
  bool more = false;
  for (auto it = from; it != ids.end(); ++it) {
    const StoredFile& f = *files_.at(*it);
    if (!purpose.empty() && f.purpose != purpose) continue;
    if (static_cast<int64_t>(items.size()) == limit) {
      more = true;
      break;
    }
    items.push_back(f.to_json());
  }
  return list_object(std::move(items), more);
}

struct BatchManager::Batch {
  std::string id, endpoint, input_file_id, completion_window;
  json metadata;
  std::shared_ptr<const std::string> input;  // kept even if the file is deleted meanwhile
  std::string status = "validating";
  int64_t created_at = 0, expires_at = 0;
  std::chrono::steady_clock::time_point deadline;  // expires_at on a clock that does not jump
  bool expired = false;  // stopped at its deadline (cancel set too)
  std::optional<int64_t> in_progress_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at, cancelled_at;
  int64_t total = 0, completed = 0, failed = 0;
  json errors;  // null, or OpenAI's list of {code, message, param, line}
  std::string output_file_id, error_file_id;
  std::atomic<bool> cancel{false};
};

BatchManager::BatchManager(FileStore& files, HttpHandler handler, size_t window,
                           std::chrono::milliseconds completion_window)
    : files_(files), handler_(std::move(handler)), window_(std::max<size_t>(1, window)),
      completion_window_(completion_window) {}

BatchManager::~BatchManager() {
  stop();
  if (thread_.joinable()) thread_.join();
}

void BatchManager::stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  stopping_ = true;
  const int64_t now = unix_seconds();
  for (auto& b : queue_) {
    b->status = "cancelled";
    b->cancelled_at = now;
  }
  queue_.clear();
  for (auto& [id, b] : batches_) {
    if (b->status == "in_progress") {
      b->status = "cancelling";
      b->cancelling_at = now;
    }
    b->cancel = true;
  }
  wake_.notify_all();
}

json BatchManager::create(const json& body) {
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object {input_file_id, endpoint, completion_window}");
  auto text = [&](const char* key) {
    if (!body.contains(key) || !body[key].is_string()) throw ApiError(400, fmt::format("'{}' must be a string", key), key);
    return body[key].get<std::string>();
  };
  auto b = std::make_shared<Batch>();
  b->input_file_id = text("input_file_id");
  b->endpoint = text("endpoint");
  b->completion_window = text("completion_window");
  if (!batch_route(b->endpoint)) {
    throw ApiError(400, fmt::format("endpoint '{}' is not one a batch runs (/v1/chat/completions, /v1/completions, "
                                    "/v1/embeddings, /v1/responses)", b->endpoint), "endpoint");
  }
  if (b->completion_window != "24h") throw ApiError(400, "completion_window must be '24h'", "completion_window");
  if (body.contains("metadata") && !body["metadata"].is_null()) {
    const json& m = body["metadata"];
    bool ok = m.is_object() && m.size() <= 16;
    for (auto it = m.begin(); ok && it != m.end(); ++it) {
      ok = it.key().size() <= 64 && it.value().is_string() && it.value().get_ref<const std::string&>().size() <= 512;
    }
    if (!ok) throw ApiError(400, "metadata must be an object of at most 16 string values (keys up to 64 characters, "
                                 "values up to 512)", "metadata");
    b->metadata = m;
  }
  const auto file = files_.get(b->input_file_id);
  if (!file) throw ApiError(404, fmt::format("No such File object: {}", b->input_file_id), "input_file_id");
  if (file->purpose != "batch") {
    throw ApiError(400, fmt::format("the file {} has purpose '{}'; a batch's input has purpose 'batch'", file->id,
                                    file->purpose), "input_file_id");
  }
  b->input = file->data;
  b->id = unique_id("batch_");
  b->created_at = unix_seconds();
  b->expires_at = b->created_at + std::chrono::duration_cast<std::chrono::seconds>(completion_window_).count();
  b->deadline = std::chrono::steady_clock::now() + completion_window_;
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) throw ApiError(503, "the server is stopping");
  batches_[b->id] = b;
  order_.push_back(b->id);
  queue_.push_back(b);
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  wake_.notify_all();
  return to_json(*b);
}

json BatchManager::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = batches_.find(id);
  if (it == batches_.end()) throw ApiError(404, fmt::format("No such Batch object: {}", id), "batch_id");
  return to_json(*it->second);
}

json BatchManager::list(const std::string& after, int64_t limit) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto from = order_.rbegin();
  if (!after.empty()) {
    from = std::find(order_.rbegin(), order_.rend(), after);
    if (from == order_.rend()) throw ApiError(404, fmt::format("No such Batch object: {}", after), "after");
    ++from;
  }
  std::vector<json> items;
  for (auto it = from; it != order_.rend() && static_cast<int64_t>(items.size()) < limit; ++it) {
    items.push_back(to_json(*batches_.at(*it)));
  }
  const bool more = std::distance(from, order_.rend()) > limit;
  return list_object(std::move(items), more);
}

json BatchManager::cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = batches_.find(id);
  if (it == batches_.end()) throw ApiError(404, fmt::format("No such Batch object: {}", id), "batch_id");
  Batch& b = *it->second;
  const int64_t now = unix_seconds();
  if (b.status == "validating") {
    // Not started: it never will.
    queue_.erase(std::remove(queue_.begin(), queue_.end(), it->second), queue_.end());
    b.cancel = true;  // the thread may be validating it now
    b.status = "cancelled";
    b.cancelling_at = now;
    b.cancelled_at = now;
  } else if (b.status == "in_progress") {
    b.status = "cancelling";
    b.cancelling_at = now;
    b.cancel = true;
  } else if (b.status != "cancelling") {
    throw ApiError(400, fmt::format("the batch {} is {}: only a batch that has not ended can be cancelled", id, b.status),
                   "batch_id");
  }
  return to_json(b);
}

std::vector<std::pair<std::string, int64_t>> BatchManager::counts() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const char* s : {"validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"}) {
    out.emplace_back(s, 0);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [id, b] : batches_) {
    for (auto& [status, n] : out) n += status == b->status;
  }
  return out;
}

json BatchManager::to_json(const Batch& b) const {
  return {{"id", b.id},
          {"object", "batch"},
          {"endpoint", b.endpoint},
          {"errors", b.errors},
          {"input_file_id", b.input_file_id},
          {"completion_window", b.completion_window},
          {"status", b.status},
          {"output_file_id", b.output_file_id.empty() ? json(nullptr) : json(b.output_file_id)},
          {"error_file_id", b.error_file_id.empty() ? json(nullptr) : json(b.error_file_id)},
          {"created_at", b.created_at},
          {"in_progress_at", optional_time(b.in_progress_at)},
          {"expires_at", b.expires_at},
          {"finalizing_at", optional_time(b.finalizing_at)},
          {"completed_at", optional_time(b.completed_at)},
          {"failed_at", optional_time(b.failed_at)},
          {"expired_at", optional_time(b.expired_at)},
          {"cancelling_at", optional_time(b.cancelling_at)},
          {"cancelled_at", optional_time(b.cancelled_at)},
          {"request_counts", {{"total", b.total}, {"completed", b.completed}, {"failed", b.failed}}},
          {"metadata", b.metadata}};
}

void BatchManager::run() {
  for (;;) {
    std::shared_ptr<Batch> b;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      b = queue_.front();
      queue_.pop_front();
    }
    execute(*b);
  }
}

void BatchManager::execute(Batch& b) {
  auto fail_batch = [&](const std::string& code, const std::string& message, int64_t line) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (b.status == "cancelled") return;
    b.errors = {{"object", "list"}, {"data", json::array()}};
    b.errors["data"].push_back({{"code", code}, {"message", message}, {"param", nullptr},
                                {"line", line > 0 ? json(line) : json(nullptr)}});
    b.status = "failed";
    b.failed_at = unix_seconds();
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::chrono::steady_clock::now() >= b.deadline) {
      b.status = "expired";
      b.expired_at = unix_seconds();
      return;
    }
  }
  // Validation: every line a request for the batch's endpoint, as OpenAI checks before it runs.
  ViewBuffer check_buffer(*b.input);
  std::istream check(&check_buffer);
  int64_t total = 0;
  const std::vector<BatchLineError> invalid = validate_batch_lines(check, b.endpoint, 100, &total);
  if (!invalid.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (b.status == "cancelled") return;
    b.errors = {{"object", "list"}, {"data", json::array()}};
    for (const BatchLineError& e : invalid) {
      b.errors["data"].push_back({{"code", e.code}, {"message", e.message}, {"param", nullptr}, {"line", e.line}});
    }
    b.status = "failed";
    b.failed_at = unix_seconds();
    return;
  }
  if (total == 0) return fail_batch("empty_file", "the input file holds no requests", 0);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (b.cancel) {
      if (b.status != "cancelled") {
        b.status = "cancelled";
        b.cancelled_at = unix_seconds();
      }
      return;
    }
    b.status = "in_progress";
    b.in_progress_at = unix_seconds();
    b.total = total;
  }
  ViewBuffer run_buffer(*b.input);
  std::istream in(&run_buffer);
  std::ostringstream out, errors;
  BatchRunOptions options;
  options.max_in_flight = window_;
  options.endpoint = b.endpoint;
  options.errors = &errors;
  options.cancel = &b.cancel;
  options.progress_seconds = 0.2;
  options.default_priority = kBatchPriority;
  const BatchRunStats stats = run_batch_lines(in, out, handler_, options, [&](const BatchRunStats& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    b.completed = s.succeeded;
    b.failed = s.failed;
    if (!b.cancel && std::chrono::steady_clock::now() >= b.deadline) {
      b.expired = true;
      b.cancel = true;
    }
  });
  {
    std::lock_guard<std::mutex> lock(mutex_);
    b.completed = stats.succeeded;
    b.failed = stats.failed;
    b.finalizing_at = unix_seconds();
    if (b.status == "in_progress") b.status = "finalizing";
  }
  std::string output_id, error_id;
  std::string output = std::move(out).str(), failures = std::move(errors).str();
  try {
    if (!output.empty()) output_id = files_.put(fmt::format("{}_output.jsonl", b.id), "batch_output", std::move(output)).id;
    if (!failures.empty()) error_id = files_.put(fmt::format("{}_error.jsonl", b.id), "batch_output", std::move(failures)).id;
  } catch (const std::exception& e) {
    if (!output_id.empty()) files_.erase(output_id);
    return fail_batch("file_store_full", fmt::format("the results could not be kept: {}", e.what()), 0);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  b.output_file_id = output_id;
  b.error_file_id = error_id;
  if (b.expired && b.status != "cancelling") {
    b.status = "expired";
    b.expired_at = unix_seconds();
  } else if (b.cancel) {
    b.status = "cancelled";
    b.cancelled_at = unix_seconds();
  } else {
    b.status = "completed";
    b.completed_at = unix_seconds();
  }
}

}  // namespace duet::server
