// OpenAI's Files and Batches APIs on the server: files uploaded for batches (POST /v1/files) kept
// in memory under a byte budget, and batches (POST /v1/batches) that run a file's lines through
// the server's own request handling (batch_runner.h), one batch at a time beside live traffic,
// their results written to output and error files.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "duet/server/batch_runner.h"
#include "duet/server/http_server.h"

namespace duet::server {

struct StoredFile {
  std::string id;  // file-...
  std::string filename;
  std::string purpose;  // "batch" (uploaded) or "batch_output" (a batch's results)
  int64_t created_at = 0;
  std::shared_ptr<const std::string> data;

  nlohmann::json to_json() const;
};

// The files, up to `max_bytes` of contents in all (--files-store-mib). Thread-safe.
class FileStore {
 public:
  explicit FileStore(size_t max_bytes) : max_bytes_(max_bytes) {}
  bool enabled() const { return max_bytes_ > 0; }
  // Keeps a file; throws ApiError (400) when it does not fit in what is left.
  StoredFile put(std::string filename, std::string purpose, std::string data);
  std::shared_ptr<const StoredFile> get(const std::string& id) const;
  bool erase(const std::string& id);
  // OpenAI's list: newest first (order "desc") or oldest first ("asc"), those after the file
  // `after` in that order, at most `limit` (1 or more: the route checks it), only `purpose` when
  // it is not empty.
  nlohmann::json list(const std::string& purpose, const std::string& order, const std::string& after, int64_t limit) const;
  size_t bytes() const;

 private:
  const size_t max_bytes_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const StoredFile>> files_;
  std::vector<std::string> order_;  // ids as created
  size_t bytes_ = 0;
};

// Where a batch's lines stand in the engine's queue under --scheduling-policy priority (lower
// runs first): after live requests, which are 0 unless they say. A line's own `priority` wins.
inline constexpr int32_t kBatchPriority = 1000;

// The batches. `handler` answers each line (the server's own); at most `window` lines of a batch
// are in flight. Batches run one after another on a thread of their own, started with the first.
// A batch not finished `completion_window` after it was made (24 hours; shorter in tests) is
// stopped as a cancel would, and `expired`, keeping the results it has.
class BatchManager {
 public:
  BatchManager(FileStore& files, HttpHandler handler, size_t window,
               std::chrono::milliseconds completion_window = std::chrono::hours(24));
  // Cancels what runs and waits for its lines in flight to be answered.
  ~BatchManager();
  BatchManager(const BatchManager&) = delete;
  BatchManager& operator=(const BatchManager&) = delete;

  // POST /v1/batches {input_file_id, endpoint, completion_window, metadata}: the new batch
  // (status "validating"). Throws ApiError (400, 404) for a body that cannot make one.
  nlohmann::json create(const nlohmann::json& body);
  nlohmann::json get(const std::string& id) const;  // throws ApiError 404
  nlohmann::json list(const std::string& after, int64_t limit) const;  // newest first; limit 1 or more
  nlohmann::json cancel(const std::string& id);  // throws ApiError 404, or 400 once it ended
  // How many batches are in each status (OpenAI's eight, in their order of progress).
  std::vector<std::pair<std::string, int64_t>> counts() const;
  // Cancels every batch, running or waiting (the server is stopping).
  void stop();

 private:
  struct Batch;
  void run();  // the thread
  void execute(Batch& b);
  nlohmann::json to_json(const Batch& b) const;  // mutex_ held

  FileStore& files_;
  const HttpHandler handler_;
  const size_t window_;
  const std::chrono::milliseconds completion_window_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::string, std::shared_ptr<Batch>> batches_;
  std::vector<std::string> order_;        // ids as created
  std::deque<std::shared_ptr<Batch>> queue_;  // waiting to run
  bool stopping_ = false;
  std::thread thread_;  // started with the first batch
};

}  // namespace duet::server
