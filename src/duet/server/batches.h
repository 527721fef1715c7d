// OpenAI's Files and Batches APIs on the server: files uploaded for batches (POST /v1/files) kept
// under a byte budget, and batches (POST /v1/batches) that run a file's lines through the server's
// own request handling (batch_runner.h), beside live traffic (one batch at a time unless told more), their results
// written to output and error files. In memory, or in a folder (--files-dir) where files and
// batches outlive the server: a batch that was running when the server stopped (or died) goes on
// where it was when the next server on that folder has loaded its models.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
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
  int64_t expires_at = 0;  // when the store deletes it (0: never)
  size_t bytes = 0;
  std::shared_ptr<const std::string> data;  // in memory (no folder); FileStore::content reads either
  int64_t created_ns = 0;                   // orders files created in the same second

  nlohmann::json to_json() const;
};

// OpenAI's default: a batch's files (inputs, outputs) expire 30 days after they are made.
inline constexpr int64_t kFileLifetimeSeconds = 30 * 24 * 3600;

// A file to keep: its name, purpose, and how long it is kept (OpenAI's expires_after.seconds;
// 0: until it is deleted).
struct NewFile {
  std::string filename;
  std::string purpose;
  int64_t expires_after = kFileLifetimeSeconds;
};

// OpenAI's expires_after object ({"anchor": "created_at", "seconds": 3600 to 2592000}) as seconds;
// kFileLifetimeSeconds when `v` is null. Throws ApiError (400) naming `param`.
int64_t expires_after_seconds(const nlohmann::json& v, const char* param);

// The files, up to `max_bytes` of contents in all (--files-store-mib). Thread-safe. A file past
// its expires_at is deleted (checked whenever the store is used).
// With a folder (`dir`, --files-dir): the files are kept in DIR/files (contents and a JSON of what
// they are), read there when asked for, and found again by the next store on that folder; DIR/lock
// keeps a second server from using the same folder at once. The constructor makes the folder if
// needed and throws Error when it cannot be used.
class FileStore {
 public:
  // `clock`: the time in Unix seconds (tests pass their own).
  explicit FileStore(size_t max_bytes, std::string dir = {}, std::function<int64_t()> clock = {});
  ~FileStore();
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;
  bool enabled() const { return max_bytes_ > 0; }
  const std::string& dir() const { return dir_; }  // empty: in memory
  // Keeps a file; throws ApiError (400) when it does not fit in what is left. `reserved`: its size
  // was held with reserve() (an upload's), and is now the file's.
  StoredFile put(NewFile file, std::string data, bool reserved = false);
  // Keeps the file at `path` (with a folder, on its file system: moved in), as put.
  StoredFile adopt(NewFile file, const std::string& path, bool reserved = false);
  // Holds `bytes` of the room for a file to come (an upload's declared size); throws ApiError (400)
  // when they are not left. release() gives them back.
  void reserve(size_t bytes);
  void release(size_t bytes);
  std::shared_ptr<const StoredFile> get(const std::string& id) const;
  // A file's contents (read from the folder when it has one); nullptr when there is no such file.
  std::shared_ptr<const std::string> content(const std::string& id) const;
  // The same as a body read piece by piece (GET /v1/files/{id}/content): from memory, or from the
  // folder's file opened now, so deleting the file meanwhile does not cut the download short.
  // nullopt when there is no such file.
  std::optional<BodySource> open_content(const std::string& id) const;
  // With a folder: `path` becomes a second name of the file's contents (a hard link, or a copy),
  // which deleting the file leaves in place. False when there is no such file.
  bool link_content(const std::string& id, const std::string& path) const;
  bool erase(const std::string& id);
  // OpenAI's list: newest first (order "desc") or oldest first ("asc"), those after the file
  // `after` in that order, at most `limit` (1 or more: the route checks it), only `purpose` when
  // it is not empty.
  nlohmann::json list(const std::string& purpose, const std::string& order, const std::string& after, int64_t limit) const;
  size_t bytes() const;

 private:
  StoredFile keep(std::shared_ptr<StoredFile> f, std::string* data, const std::string* from_path, bool reserved);
  void check_room(size_t bytes) const;  // mutex_ held
  void remove_locked(std::map<std::string, std::shared_ptr<const StoredFile>>::iterator it) const;  // mutex_ held
  void expire_locked() const;  // mutex_ held: deletes the files past their expires_at
  std::string content_path(const std::string& id) const;

  const size_t max_bytes_;
  const std::string dir_;
  const std::function<int64_t()> clock_;
  int lock_fd_ = -1;
  // Mutable: the readers (get, list, bytes) delete what has expired first.
  mutable std::mutex mutex_;
  mutable std::map<std::string, std::shared_ptr<const StoredFile>> files_;
  mutable std::vector<std::string> order_;  // ids as created
  mutable size_t bytes_ = 0;
  size_t reserved_ = 0;  // held for uploads not completed
};

// OpenAI's Uploads API, for files past one request body's limit: POST /v1/uploads declares a
// file (filename, purpose, bytes, mime_type), .../parts adds its parts one request each, and
// .../complete makes them one file (in the order named, optionally checked against an MD5), or
// .../cancel drops them. An upload holds its declared size of the file store's room from the start,
// so a completed one always fits; its parts wait in memory or, with a folder, in DIR/uploads. One
// not completed within `lifetime` (an hour) expires. With a folder, a pending upload outlives the
// server: DIR/uploads/ID holds its description and parts, and the next store on the folder goes on
// with it (same id, same parts, its room held again) until it expires. Thread-safe.
class UploadStore {
 public:
  explicit UploadStore(FileStore& files, std::chrono::milliseconds lifetime = std::chrono::hours(1));
  ~UploadStore();
  UploadStore(const UploadStore&) = delete;
  UploadStore& operator=(const UploadStore&) = delete;

  // Each returns OpenAI's Upload (or Part) object, or throws ApiError (400, 404).
  nlohmann::json create(const nlohmann::json& body);
  nlohmann::json add_part(const std::string& id, std::string_view data);
  nlohmann::json complete(const std::string& id, const nlohmann::json& body);
  nlohmann::json cancel(const std::string& id);

 private:
  struct Upload;
  void expire_due();                                     // mutex_ held
  std::shared_ptr<Upload> find(const std::string& id);  // mutex_ held; expires what is due first
  void drop(Upload& u);                                  // mutex_ held: its parts and its room
  nlohmann::json to_json(const Upload& u) const;
  std::string part_path(const Upload& u, const std::string& part) const;

  FileStore& files_;
  const std::chrono::milliseconds lifetime_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Upload>> uploads_;
};

// Whether a batch in OpenAI's `status` has ended: completed, failed, expired or cancelled.
bool batch_has_ended(const std::string& status);

// Where a batch's lines stand in the engine's queue under --scheduling-policy priority (lower
// runs first): after live requests, which are 0 unless they say. A line's own `priority` wins.
inline constexpr int32_t kBatchPriority = 1000;

// The batches. `handler` answers each line (the server's own); at most `window` lines of a batch
// are in flight. Batches run in the order they were made, `max_running` at once (each on a thread
// of its own), from start() on.
// A batch not finished `completion_window` after it was made (24 hours; shorter in tests) is
// stopped as a cancel would, and `expired`, keeping the results it has.
// When the file store has a folder, each batch is kept in DIR/batches (what GET shows, its input
// and its results so far, written as they come), and the manager finds them again: a batch that
// had not ended goes on from where it was (the lines already answered are not sent again).
class BatchManager {
 public:
  // `max_running`: batches that run at once (--max-running-batches), each with `window` lines in
  // flight.
  BatchManager(FileStore& files, HttpHandler handler, size_t window,
               std::chrono::milliseconds completion_window = std::chrono::hours(24), size_t max_running = 1);
  // Stops as stop() does and waits for the lines in flight to be answered.
  ~BatchManager();
  BatchManager(const BatchManager&) = delete;
  BatchManager& operator=(const BatchManager&) = delete;

  // POST /v1/batches {input_file_id, endpoint, completion_window, metadata}: the new batch
  // (status "validating"). Throws ApiError (400, 404) for a body that cannot make one.
  nlohmann::json create(const nlohmann::json& body);
  nlohmann::json get(const std::string& id) const;  // throws ApiError 404
  nlohmann::json list(const std::string& after, int64_t limit) const;  // newest first; limit 1 or more
  nlohmann::json cancel(const std::string& id);  // throws ApiError 404, or 400 once it ended
  // Forgets a batch that has ended, with its output and error files (Anthropic's batches can be
  // deleted; OpenAI's cannot). Returns what get() showed last. Throws ApiError 404, or 400 while it
  // has not ended.
  nlohmann::json erase(const std::string& id);
  // How many batches are in each status (OpenAI's eight, in their order of progress).
  std::vector<std::pair<std::string, int64_t>> counts() const;
  // Batches run from now on (the server's models are loaded): those a folder kept, then new ones.
  void start();
  // The server is stopping: in memory, every batch is cancelled, running or waiting; with a folder,
  // the running batch's lines in flight are aborted and it stays as it is, with what waits, for the
  // next server on the folder to go on with.
  void stop();

 private:
  struct Batch;
  void run();  // a thread
  void add_thread_locked();  // mutex_ held: one more thread when a batch waits and none is idle
  void execute(Batch& b);
  void finish(Batch& b, std::string output, std::string failures);
  // OpenAI's `errors` list of the batch (line 0: none named), and `failed`; mutex_ held.
  void mark_failed(Batch& b, const std::vector<BatchLineError>& errors);
  nlohmann::json to_json(const Batch& b) const;  // mutex_ held
  void save(const Batch& b) const;                // with a folder, mutex_ held
  void load_kept();                               // with a folder, from the constructor
  std::string batch_path(const Batch& b, const char* suffix) const;

  FileStore& files_;
  const HttpHandler handler_;
  const size_t window_;
  const std::chrono::milliseconds completion_window_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::string, std::shared_ptr<Batch>> batches_;
  std::vector<std::string> order_;        // ids as created
  std::deque<std::shared_ptr<Batch>> queue_;  // waiting to run
  bool started_ = false;
  bool stopping_ = false;
  std::atomic<bool> interrupt_{false};  // with a folder: stopping, the running batch kept as it is
  size_t max_running_ = 1;
  size_t idle_ = 0;                  // threads waiting for a batch
  std::vector<std::thread> threads_;  // up to max_running_, started as batches wait
};

}  // namespace duet::server
