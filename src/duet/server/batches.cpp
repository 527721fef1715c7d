#include "duet/server/batches.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <streambuf>
#include <tuple>

#include <fmt/format.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include "duet/core/error.h"
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
  explicit ViewBuffer(std::string_view s) {
    char* p = const_cast<char*>(s.data());
    setg(p, p, p + s.size());
  }
};

// Text that stays readable while `owner` lives: a file's contents in memory, or a file mapped.
struct HeldText {
  std::string_view text;
  std::shared_ptr<const void> owner;
};

// The file at `path` mapped read-only (the page cache holds it, not the heap: a batch's input of
// gigabytes costs no memory of its own); throws Error when it cannot be opened.
HeldText map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorCode::kNotFound, "cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(ErrorCode::kDataLoss, "cannot read {}: {}", path, std::strerror(errno));
  }
  const auto size = static_cast<size_t>(st.st_size);
  void* p = size > 0 ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  ::close(fd);
  if (p == MAP_FAILED) fail(ErrorCode::kDataLoss, "cannot map {}: {}", path, std::strerror(errno));
  if (p == nullptr) return {};
  return {std::string_view(static_cast<const char*>(p), size),
          std::shared_ptr<const void>(p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); })};
}

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

// Files or batches read from a folder, in the order they were made.
template <typename T>
void sort_by_creation(std::vector<std::shared_ptr<T>>& v) {
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return std::tie(a->created_ns, a->id) < std::tie(b->created_ns, b->id); });
}

int64_t unix_nanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace fs = std::filesystem;

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::kNotFound, "cannot open {}", path);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(ErrorCode::kDataLoss, "cannot read {}", path);
  return data;
}

// Writes `data` to `path` whole or not at all: a file beside it, flushed to the disk, renamed.
void write_atomically(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(ErrorCode::kUnavailable, "cannot write {}: {}", tmp, std::strerror(errno));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(ErrorCode::kUnavailable, "cannot write {}: {}", tmp, std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(ErrorCode::kUnavailable, "cannot write {}: {}", path, std::strerror(err));
  }
}

}  // namespace

int64_t expires_after_seconds(const json& v, const char* param) {
  if (v.is_null()) return kFileLifetimeSeconds;
  const bool ok = v.is_object() && v.contains("anchor") && v["anchor"] == "created_at" && v.contains("seconds") &&
                  v["seconds"].is_number_integer() && v["seconds"].get<int64_t>() >= 3600 &&
                  v["seconds"].get<int64_t>() <= kFileLifetimeSeconds;
  if (!ok) {
    throw ApiError(400, fmt::format("{} must be {{\"anchor\": \"created_at\", \"seconds\": 3600 to {}}}, got {}", param,
                                    kFileLifetimeSeconds, v.dump()), param);
  }
  return v["seconds"].get<int64_t>();
}

json StoredFile::to_json() const {
  return {{"id", id},
          {"object", "file"},
          {"bytes", bytes},
          {"created_at", created_at},
          {"expires_at", expires_at > 0 ? json(expires_at) : json(nullptr)},
          {"filename", filename},
          {"purpose", purpose},
          {"status", "processed"},
          {"status_details", nullptr}};
}

FileStore::FileStore(size_t max_bytes, std::string dir, std::function<int64_t()> clock)
    : max_bytes_(max_bytes), dir_(std::move(dir)), clock_(clock ? std::move(clock) : std::function<int64_t()>(unix_seconds)) {
  if (dir_.empty() || max_bytes_ == 0) return;
  std::error_code ec;
  fs::create_directories(fs::path(dir_) / "files", ec);
  if (ec) fail(ErrorCode::kInvalidArgument, "--files-dir {}: cannot make {}/files: {}", dir_, dir_, ec.message());
  fs::create_directories(fs::path(dir_) / "batches", ec);
  if (ec) fail(ErrorCode::kInvalidArgument, "--files-dir {}: cannot make {}/batches: {}", dir_, dir_, ec.message());
  const std::string lock = dir_ + "/lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) fail(ErrorCode::kInvalidArgument, "--files-dir {}: cannot open {}: {}", dir_, lock, std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    fail(ErrorCode::kUnavailable, "--files-dir {}: another server uses this folder (it holds {})", dir_, lock);
  }
  // What a stop halfway through a write left: a .tmp, or contents whose description never came.
  std::vector<std::shared_ptr<StoredFile>> found;
  for (const fs::directory_entry& e : fs::directory_iterator(fs::path(dir_) / "files")) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".tmp")) {
      fs::remove(e.path(), ec);
      continue;
    }
    if (!name.ends_with(".json")) {
      if (!fs::exists(e.path().string() + ".json")) fs::remove(e.path(), ec);
      continue;
    }
    try {
      const json meta = json::parse(read_whole(e.path().string()));
      auto f = std::make_shared<StoredFile>();
      f->id = meta.at("id").get<std::string>();
      f->filename = meta.at("filename").get<std::string>();
      f->purpose = meta.at("purpose").get<std::string>();
      f->created_at = meta.at("created_at").get<int64_t>();
      f->expires_at = meta.value("expires_at", int64_t{0});
      f->created_ns = meta.value("created_ns", int64_t{0});
      f->bytes = meta.at("bytes").get<size_t>();
      const std::string contents = content_path(f->id);
      if (name != f->id + ".json" || !fs::exists(contents) || fs::file_size(contents) != f->bytes) {
        fail(ErrorCode::kDataLoss, "its contents are missing or not {} bytes", f->bytes);
      }
      found.push_back(std::move(f));
    } catch (const std::exception& ex) {
      spdlog::warn("--files-dir: {} is not a file's description ({}); left out", e.path().string(), ex.what());
    }
  }
  sort_by_creation(found);
  for (auto& f : found) {
    bytes_ += f->bytes;
    order_.push_back(f->id);
    files_[f->id] = std::move(f);
  }
  if (!found.empty()) spdlog::info("--files-dir {}: {} files ({} bytes) kept from before", dir_, found.size(), bytes_);
}

FileStore::~FileStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string FileStore::content_path(const std::string& id) const { return dir_ + "/files/" + id; }

namespace {

std::shared_ptr<StoredFile> new_file(NewFile file, int64_t now) {
  auto f = std::make_shared<StoredFile>();
  f->filename = std::move(file.filename);
  f->purpose = std::move(file.purpose);
  f->created_at = now;
  f->expires_at = file.expires_after > 0 ? now + file.expires_after : 0;
  return f;
}

}  // namespace

StoredFile FileStore::put(NewFile file, std::string data, bool reserved) {
  return keep(new_file(std::move(file), clock_()), &data, nullptr, reserved);
}

StoredFile FileStore::adopt(NewFile file, const std::string& path, bool reserved) {
  if (dir_.empty()) {
    std::string data = read_whole(path);
    std::error_code ec;
    fs::remove(path, ec);
    return put(std::move(file), std::move(data), reserved);
  }
  return keep(new_file(std::move(file), clock_()), nullptr, &path, reserved);
}

void FileStore::remove_locked(std::map<std::string, std::shared_ptr<const StoredFile>>::iterator it) const {
  const std::string id = it->first;
  if (!dir_.empty()) {
    // The description first: contents without one are cleared away by the next start.
    std::error_code ec;
    fs::remove(content_path(id) + ".json", ec);
    fs::remove(content_path(id), ec);
  }
  bytes_ -= it->second->bytes;
  files_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), id));
}

void FileStore::expire_locked() const {
  const int64_t now = clock_();
  for (auto it = files_.begin(); it != files_.end();) {
    auto next = std::next(it);
    if (it->second->expires_at > 0 && it->second->expires_at <= now) {
      remove_locked(it);
    }
    it = next;
  }
}

void FileStore::check_room(size_t size) const {
  const size_t used = bytes_ + reserved_;
  if (used + size > max_bytes_) {
    throw ApiError(400, fmt::format("the file is {} bytes and the server's file store has {} of its {} left "
                                    "(--files-store-mib): delete files with DELETE /v1/files/{{id}}",
                                    size, max_bytes_ - std::min(used, max_bytes_), max_bytes_), "file");
  }
}

void FileStore::reserve(size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  expire_locked();
  check_room(size);
  reserved_ += size;
}

void FileStore::release(size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ -= std::min(size, reserved_);
}

StoredFile FileStore::keep(std::shared_ptr<StoredFile> f, std::string* data, const std::string* from_path, bool reserved) {
  f->id = unique_id("file-");
  f->created_ns = unix_nanoseconds();
  f->bytes = data != nullptr ? data->size() : static_cast<size_t>(fs::file_size(*from_path));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    expire_locked();
    if (reserved) {
      reserved_ -= std::min(f->bytes, reserved_);
    } else {
      check_room(f->bytes);
    }
    bytes_ += f->bytes;  // held while it is written
  }
  if (dir_.empty()) {
    f->data = std::make_shared<const std::string>(std::move(*data));
  } else {
    try {
      if (data != nullptr) {
        write_atomically(content_path(f->id), *data);
      } else if (::rename(from_path->c_str(), content_path(f->id).c_str()) != 0) {
        fail(ErrorCode::kUnavailable, "cannot move {} into the file store: {}", *from_path, std::strerror(errno));
      }
      write_atomically(content_path(f->id) + ".json",
                       json{{"id", f->id}, {"filename", f->filename}, {"purpose", f->purpose}, {"created_at", f->created_at},
                            {"expires_at", f->expires_at},
                            {"created_ns", f->created_ns}, {"bytes", f->bytes}}.dump());
    } catch (const std::exception& e) {
      std::error_code ec;
      fs::remove(content_path(f->id), ec);
      std::lock_guard<std::mutex> lock(mutex_);
      bytes_ -= f->bytes;
      if (reserved) reserved_ += f->bytes;  // still the upload's
      throw ApiError(500, fmt::format("the file could not be kept: {}", e.what()), "file");
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  files_[f->id] = f;
  order_.push_back(f->id);
  return *f;
}

std::shared_ptr<const StoredFile> FileStore::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  expire_locked();
  auto it = files_.find(id);
  return it == files_.end() ? nullptr : it->second;
}

std::shared_ptr<const std::string> FileStore::content(const std::string& id) const {
  const auto f = get(id);
  if (!f) return nullptr;
  if (dir_.empty()) return f->data;
  try {
    return std::make_shared<const std::string>(read_whole(content_path(id)));
  } catch (const std::exception&) {
    return nullptr;  // deleted meanwhile
  }
}

std::optional<BodySource> FileStore::open_content(const std::string& id) const {
  const auto f = get(id);
  if (!f) return std::nullopt;
  if (dir_.empty()) {
    std::shared_ptr<const std::string> data = f->data;
    return BodySource{data->size(), [data](uint64_t offset, size_t max) {
                        return offset < data->size() ? data->substr(static_cast<size_t>(offset), max) : std::string();
                      }};
  }
  const int raw = ::open(content_path(id).c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) return std::nullopt;  // deleted meanwhile
  auto fd = std::shared_ptr<int>(new int(raw), [](int* p) {
    ::close(*p);
    delete p;
  });
  struct stat st {};
  if (::fstat(raw, &st) != 0) return std::nullopt;
  return BodySource{static_cast<uint64_t>(st.st_size), [fd, path = content_path(id)](uint64_t offset, size_t max) {
                      std::string piece(max, '\0');
                      size_t got = 0;
                      while (got < max) {
                        const ssize_t n = ::pread(*fd, piece.data() + got, max - got, static_cast<off_t>(offset + got));
                        if (n < 0 && errno == EINTR) continue;
                        if (n < 0) fail(ErrorCode::kDataLoss, "cannot read {}: {}", path, std::strerror(errno));
                        if (n == 0) break;
                        got += static_cast<size_t>(n);
                      }
                      piece.resize(got);
                      return piece;
                    }};
}

bool FileStore::link_content(const std::string& id, const std::string& path) const {
  if (!get(id)) return false;
  std::error_code ec;
  fs::remove(path, ec);
  fs::create_hard_link(content_path(id), path, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(content_path(id), path, fs::copy_options::overwrite_existing, ec);
  }
  return !ec;
}

bool FileStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = files_.find(id);
  if (it == files_.end()) return false;
  remove_locked(it);
  return true;
}

size_t FileStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  expire_locked();
  return bytes_;
}

json FileStore::list(const std::string& purpose, const std::string& order, const std::string& after, int64_t limit) const {
  if (order != "asc" && order != "desc") throw ApiError(400, "order must be 'asc' or 'desc'", "order");
  std::lock_guard<std::mutex> lock(mutex_);
  expire_locked();
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
  // In memory: the input file's contents, kept even if the file is deleted meanwhile. With a
  // folder, DIR/batches/ID.input holds them (a second name of the file), mapped while the batch
  // runs.
  std::optional<HeldText> input;
  std::string status = "validating";
  int64_t created_at = 0, expires_at = 0, created_ns = 0;
  std::chrono::steady_clock::time_point deadline;  // expires_at on a clock that does not jump
  bool expired = false;  // stopped at its deadline (cancel set too)
  std::optional<int64_t> in_progress_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at, cancelled_at;
  int64_t total = 0, completed = 0, failed = 0;
  json errors;  // null, or OpenAI's list of {code, message, param, line}
  std::string output_file_id, error_file_id;
  int64_t output_expires_after = kFileLifetimeSeconds;  // the output and error files' lifetime
  std::atomic<bool> cancel{false};
};

bool batch_has_ended(const std::string& status) {
  return status == "completed" || status == "failed" || status == "expired" || status == "cancelled";
}

namespace {

// The answers an earlier run of a batch wrote to `path` (its output or error file so far): their
// custom_ids go to `answered`; returns how many. A line the stop cut short is cut off the file.
int64_t keep_answered(const std::string& path, std::unordered_set<std::string>& answered) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return 0;
  const std::string data = read_whole(path);
  const size_t end = data.rfind('\n');
  const size_t whole = end == std::string::npos ? 0 : end + 1;
  if (whole < data.size()) fs::resize_file(path, whole, ec);
  int64_t n = 0;
  for (size_t pos = 0; pos < whole;) {
    const size_t eol = data.find('\n', pos);
    try {
      const json line = json::parse(std::string_view(data).substr(pos, eol - pos));
      if (line.contains("custom_id") && line["custom_id"].is_string()) answered.insert(line["custom_id"].get<std::string>());
      ++n;
    } catch (const std::exception&) {
      // Not one of ours: its line will run again.
    }
    pos = eol + 1;
  }
  return n;
}

}  // namespace

BatchManager::BatchManager(FileStore& files, HttpHandler handler, size_t window,
                           std::chrono::milliseconds completion_window, size_t max_running)
    : files_(files), handler_(std::move(handler)), window_(std::max<size_t>(1, window)),
      completion_window_(completion_window), max_running_(std::max<size_t>(1, max_running)) {
  if (files_.enabled() && !files_.dir().empty()) load_kept();
}

BatchManager::~BatchManager() {
  stop();
  for (std::thread& t : threads_) t.join();
}

std::string BatchManager::batch_path(const Batch& b, const char* suffix) const {
  return files_.dir() + "/batches/" + b.id + suffix;
}

void BatchManager::save(const Batch& b) const {
  if (files_.dir().empty()) return;
  json j = to_json(b);
  j["duet"] = {{"created_ns", b.created_ns}, {"expired", b.expired}, {"output_expires_after", b.output_expires_after}};
  try {
    write_atomically(batch_path(b, ".json"), j.dump());
  } catch (const std::exception& e) {
    spdlog::error("batch {} could not be saved: {}", b.id, e.what());
  }
  if (batch_has_ended(b.status)) {
    // What only a batch that goes on needs.
    std::error_code ec;
    for (const char* suffix : {".input", ".output.jsonl", ".errors.jsonl"}) fs::remove(batch_path(b, suffix), ec);
  }
}

void BatchManager::load_kept() {
  std::vector<std::shared_ptr<Batch>> found;
  const int64_t now = unix_seconds();
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(fs::path(files_.dir()) / "batches")) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".tmp")) fs::remove(e.path(), ec);
    if (!name.ends_with(".json")) continue;
    try {
      const json j = json::parse(read_whole(e.path().string()));
      auto b = std::make_shared<Batch>();
      b->id = j.at("id").get<std::string>();
      b->endpoint = j.at("endpoint").get<std::string>();
      b->input_file_id = j.at("input_file_id").get<std::string>();
      b->completion_window = j.at("completion_window").get<std::string>();
      b->metadata = j.value("metadata", json());
      b->status = j.at("status").get<std::string>();
      b->created_at = j.at("created_at").get<int64_t>();
      b->expires_at = j.at("expires_at").get<int64_t>();
      auto time = [&](const char* key, std::optional<int64_t>& t) {
        if (j.contains(key) && j[key].is_number_integer()) t = j[key].get<int64_t>();
      };
      time("in_progress_at", b->in_progress_at);
      time("finalizing_at", b->finalizing_at);
      time("completed_at", b->completed_at);
      time("failed_at", b->failed_at);
      time("expired_at", b->expired_at);
      time("cancelling_at", b->cancelling_at);
      time("cancelled_at", b->cancelled_at);
      const json& counts = j.at("request_counts");
      b->total = counts.at("total").get<int64_t>();
      b->completed = counts.at("completed").get<int64_t>();
      b->failed = counts.at("failed").get<int64_t>();
      b->errors = j.value("errors", json());
      if (j.contains("output_file_id") && j["output_file_id"].is_string()) b->output_file_id = j["output_file_id"];
      if (j.contains("error_file_id") && j["error_file_id"].is_string()) b->error_file_id = j["error_file_id"];
      if (j.contains("duet")) {
        b->created_ns = j["duet"].value("created_ns", int64_t{0});
        b->expired = j["duet"].value("expired", false);
        b->output_expires_after = j["duet"].value("output_expires_after", kFileLifetimeSeconds);
      }
      if (name != b->id + ".json") fail(ErrorCode::kDataLoss, "it describes {}", b->id);
      b->deadline = std::chrono::steady_clock::now() + std::chrono::seconds(b->expires_at - now);
      if (b->status == "cancelling" || b->expired) b->cancel = true;
      found.push_back(std::move(b));
    } catch (const std::exception& ex) {
      spdlog::warn("--files-dir: {} is not a batch ({}); left out", e.path().string(), ex.what());
    }
  }
  sort_by_creation(found);
  size_t going_on = 0;
  for (auto& b : found) {
    order_.push_back(b->id);
    if (!batch_has_ended(b->status)) {
      queue_.push_back(b);
      ++going_on;
    }
    batches_[b->id] = std::move(b);
  }
  if (!found.empty()) {
    spdlog::info("--files-dir {}: {} batches kept from before, {} of them to go on with", files_.dir(), found.size(),
                 going_on);
  }
}

void BatchManager::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  started_ = true;
  for (size_t i = 0; i < queue_.size(); ++i) add_thread_locked();
}

void BatchManager::stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  stopping_ = true;
  if (!files_.dir().empty()) {
    // Kept as they are, for the next server on the folder.
    interrupt_ = true;
    wake_.notify_all();
    return;
  }
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
                                    "/v1/embeddings, /v1/responses, /v1/messages)", b->endpoint), "endpoint");
  }
  if (b->completion_window != "24h") throw ApiError(400, "completion_window must be '24h'", "completion_window");
  b->output_expires_after = expires_after_seconds(json_field(body, "output_expires_after"), "output_expires_after");
  const json& metadata = json_field(body, "metadata");
  check_metadata(metadata);
  if (!metadata.is_null()) b->metadata = metadata;
  const auto file = files_.get(b->input_file_id);
  if (!file) throw ApiError(404, fmt::format("No such File object: {}", b->input_file_id), "input_file_id");
  if (file->purpose != "batch") {
    throw ApiError(400, fmt::format("the file {} has purpose '{}'; a batch's input has purpose 'batch'", file->id,
                                    file->purpose), "input_file_id");
  }
  b->id = unique_id("batch_");
  if (files_.dir().empty()) {
    const std::shared_ptr<const std::string> data = files_.content(file->id);
    if (!data) throw ApiError(404, fmt::format("No such File object: {}", b->input_file_id), "input_file_id");
    b->input = HeldText{*data, data};
  } else if (!files_.link_content(file->id, batch_path(*b, ".input"))) {
    throw ApiError(500, fmt::format("the input file {} could not be kept for the batch in --files-dir", file->id));
  }
  b->created_at = unix_seconds();
  b->created_ns = unix_nanoseconds();
  b->expires_at = b->created_at + std::chrono::duration_cast<std::chrono::seconds>(completion_window_).count();
  b->deadline = std::chrono::steady_clock::now() + completion_window_;
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) {
    std::error_code ec;
    if (!files_.dir().empty()) fs::remove(batch_path(*b, ".input"), ec);
    throw ApiError(503, "the server is stopping");
  }
  batches_[b->id] = b;
  order_.push_back(b->id);
  queue_.push_back(b);
  save(*b);
  add_thread_locked();
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
  save(b);
  return to_json(b);
}

json BatchManager::erase(const std::string& id) {
  std::shared_ptr<Batch> b;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = batches_.find(id);
    if (it == batches_.end()) throw ApiError(404, fmt::format("No such Batch object: {}", id), "batch_id");
    if (!batch_has_ended(it->second->status)) {
      throw ApiError(400, fmt::format("the batch {} is {}: only a batch that has ended can be deleted (cancel it first)",
                                      id, it->second->status), "batch_id");
    }
    b = it->second;
    batches_.erase(it);
    order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
    if (!files_.dir().empty()) {
      std::error_code ec;
      fs::remove(batch_path(*b, ".json"), ec);
    }
  }
  for (const std::string& file : {b->output_file_id, b->error_file_id}) {
    if (!file.empty()) files_.erase(file);
  }
  return to_json(*b);
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

void BatchManager::add_thread_locked() {
  if (!started_ || stopping_ || queue_.empty() || idle_ >= queue_.size() || threads_.size() >= max_running_) return;
  ++idle_;  // it takes a batch as soon as it runs
  threads_.emplace_back([this] { run(); });
}

void BatchManager::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (stopping_ || queue_.empty()) return;
    std::shared_ptr<Batch> b = queue_.front();
    queue_.pop_front();
    add_thread_locked();  // another batch waits: another thread, while there may be more
    lock.unlock();
    execute(*b);
    b->input.reset();
    lock.lock();
    ++idle_;
  }
}

void BatchManager::execute(Batch& b) {
  const bool folder = !files_.dir().empty();
  auto fail_batch = [&](const std::string& code, const std::string& message, int64_t line) {
    std::lock_guard<std::mutex> lock(mutex_);
    mark_failed(b, {BatchLineError{line, code, message}});
  };
  bool resumed = false;  // an earlier server on the folder started it
  {
    std::lock_guard<std::mutex> lock(mutex_);
    resumed = b.status != "validating";
    const bool late = std::chrono::steady_clock::now() >= b.deadline;
    if (!resumed && late) {
      b.status = "expired";
      b.expired_at = unix_seconds();
      save(b);
      return;
    }
    if (resumed && late && !b.cancel) {
      b.expired = true;
      b.cancel = true;
    }
  }
  if (!b.input) {
    try {
      b.input = map_file(batch_path(b, ".input"));
    } catch (const std::exception& e) {
      return fail_batch("input_lost", fmt::format("the batch's input is gone from --files-dir: {}", e.what()), 0);
    }
  }
  if (!resumed) {
    // Validation: every line a request for the batch's endpoint, as OpenAI checks before it runs.
    ViewBuffer check_buffer(b.input->text);
    std::istream check(&check_buffer);
    int64_t total = 0;
    const std::vector<BatchLineError> invalid = validate_batch_lines(check, b.endpoint, 100, &total);
    if (!invalid.empty()) {
      std::lock_guard<std::mutex> lock(mutex_);
      mark_failed(b, invalid);
      return;
    }
    if (total == 0) return fail_batch("empty_file", "the input file holds no requests", 0);
    std::lock_guard<std::mutex> lock(mutex_);
    if (b.cancel) {
      if (b.status != "cancelled") {
        b.status = "cancelled";
        b.cancelled_at = unix_seconds();
        save(b);
      }
      return;
    }
    b.status = "in_progress";
    b.in_progress_at = unix_seconds();
    b.total = total;
    save(b);
  }
  // The results: in memory, or in the folder as they come (after what an earlier run wrote).
  std::ostringstream memory_out, memory_errors;
  std::ofstream file_out, file_errors;
  std::unordered_set<std::string> answered;
  int64_t done_before = 0, failed_before = 0;
  if (folder) {
    try {
      done_before = keep_answered(batch_path(b, ".output.jsonl"), answered);
      failed_before = keep_answered(batch_path(b, ".errors.jsonl"), answered);
    } catch (const std::exception& e) {
      return fail_batch("results_lost", fmt::format("the batch's results so far could not be read: {}", e.what()), 0);
    }
    file_out.open(batch_path(b, ".output.jsonl"), std::ios::binary | std::ios::app);
    file_errors.open(batch_path(b, ".errors.jsonl"), std::ios::binary | std::ios::app);
    if (!file_out || !file_errors) {
      return fail_batch("results_lost", fmt::format("cannot write the batch's results in {}/batches", files_.dir()), 0);
    }
    if (resumed) spdlog::info("batch {}: going on after {} answered lines", b.id, answered.size());
  }
  std::ostream& out = folder ? static_cast<std::ostream&>(file_out) : memory_out;
  std::ostream& errors = folder ? static_cast<std::ostream&>(file_errors) : memory_errors;
  ViewBuffer run_buffer(b.input->text);
  std::istream in(&run_buffer);
  BatchRunOptions options;
  options.max_in_flight = window_;
  options.endpoint = b.endpoint;
  options.errors = &errors;
  options.cancel = &b.cancel;
  options.interrupt = &interrupt_;
  options.skip = folder ? &answered : nullptr;
  options.progress_seconds = 0.2;
  options.default_priority = kBatchPriority;
  auto last_save = std::chrono::steady_clock::now();
  const BatchRunStats stats = run_batch_lines(in, out, handler_, options, [&](const BatchRunStats& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    b.completed = done_before + s.succeeded;
    b.failed = failed_before + s.failed;
    const auto now = std::chrono::steady_clock::now();
    if (!b.cancel && now >= b.deadline) {
      b.expired = true;
      b.cancel = true;
    }
    if (now - last_save >= std::chrono::seconds(2)) {
      last_save = now;
      save(b);
    }
  });
  if (folder) {
    file_out.close();
    file_errors.close();
  }
  if (interrupt_) {
    // The server stops: the batch stays as it is, to go on where its results end (the answers of
    // the lines aborted in flight were not written).
    std::unordered_set<std::string> written;
    int64_t done = 0, failed = 0;
    try {
      done = keep_answered(batch_path(b, ".output.jsonl"), written);
      failed = keep_answered(batch_path(b, ".errors.jsonl"), written);
    } catch (const std::exception&) {
    }
    std::lock_guard<std::mutex> lock(mutex_);
    b.completed = done;
    b.failed = failed;
    save(b);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    b.completed = done_before + stats.succeeded;
    b.failed = failed_before + stats.failed;
    b.finalizing_at = unix_seconds();
    if (b.status == "in_progress") b.status = "finalizing";
    save(b);
  }
  finish(b, std::move(memory_out).str(), std::move(memory_errors).str());
}

void BatchManager::mark_failed(Batch& b, const std::vector<BatchLineError>& errors) {
  if (b.status == "cancelled") return;  // cancelled before it ran: that stands
  b.errors = {{"object", "list"}, {"data", json::array()}};
  for (const BatchLineError& e : errors) {
    b.errors["data"].push_back({{"code", e.code}, {"message", e.message}, {"param", nullptr},
                                {"line", e.line > 0 ? json(e.line) : json(nullptr)}});
  }
  b.status = "failed";
  b.failed_at = unix_seconds();
  save(b);
}

// The output and error files of a batch that ran, and its end.
void BatchManager::finish(Batch& b, std::string output, std::string failures) {
  const bool folder = !files_.dir().empty();
  std::string output_id, error_id;
  auto keep = [&](const char* suffix, const char* name, std::string& data) -> std::string {
    const NewFile file{fmt::format("{}_{}.jsonl", b.id, name), "batch_output", b.output_expires_after};
    if (!folder) return data.empty() ? std::string() : files_.put(file, std::move(data)).id;
    const std::string path = batch_path(b, suffix);
    std::error_code ec;
    if (fs::file_size(path, ec) == 0 || ec) return {};
    return files_.adopt(file, path).id;
  };
  try {
    output_id = keep(".output.jsonl", "output", output);
    error_id = keep(".errors.jsonl", "error", failures);
  } catch (const std::exception& e) {
    if (!output_id.empty()) files_.erase(output_id);
    std::lock_guard<std::mutex> lock(mutex_);
    mark_failed(b, {BatchLineError{0, "file_store_full", fmt::format("the results could not be kept: {}", e.what())}});
    return;
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
  save(b);
}

struct UploadStore::Upload {
  std::string id, filename, purpose, mime_type;
  size_t bytes = 0;     // declared
  size_t received = 0;  // in the parts so far
  int64_t file_expires_after = kFileLifetimeSeconds;  // the completed file's
  int64_t created_at = 0;
  int64_t expires_at_ms = 0;  // when it expires, in Unix milliseconds (its expires_at is this in seconds)
  std::chrono::steady_clock::time_point deadline;
  std::string status = "pending";
  std::map<std::string, std::string> parts;  // in memory: part id -> its bytes (a folder holds them as files)
  std::map<std::string, size_t> part_sizes;   // every part's size, by id
  json file;  // the File object once completed
};

namespace {

int64_t unix_milliseconds() { return unix_nanoseconds() / 1000000; }

}  // namespace

UploadStore::UploadStore(FileStore& files, std::chrono::milliseconds lifetime) : files_(files), lifetime_(lifetime) {
  if (!files_.enabled() || files_.dir().empty()) return;
  // The uploads pending when the last server on the folder stopped go on, with the same ids, the
  // parts they had and their room held again, until they expire.
  const fs::path root = fs::path(files_.dir()) / "uploads";
  std::error_code ec;
  std::vector<fs::path> folders;
  for (const auto& e : fs::directory_iterator(root, ec)) folders.push_back(e.path());
  const int64_t now_ms = unix_milliseconds();
  for (const fs::path& folder : folders) {
    auto u = std::make_shared<Upload>();
    std::vector<fs::path> stray;
    try {
      const json j = json::parse(read_whole((folder / "upload.json").string()));
      u->id = j.at("id").get<std::string>();
      if (u->id != folder.filename().string()) fail(ErrorCode::kDataLoss, "it describes {}", u->id);
      u->filename = j.at("filename").get<std::string>();
      u->purpose = j.at("purpose").get<std::string>();
      u->mime_type = j.at("mime_type").get<std::string>();
      u->bytes = j.at("bytes").get<size_t>();
      u->file_expires_after = j.at("file_expires_after").get<int64_t>();
      u->created_at = j.at("created_at").get<int64_t>();
      u->expires_at_ms = j.at("expires_at_ms").get<int64_t>();
      for (const auto& e : fs::directory_iterator(folder)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("part_", 0) == 0 && name.find('.') == std::string::npos) {
          u->part_sizes[name] = static_cast<size_t>(fs::file_size(e.path()));
          u->received += u->part_sizes[name];
        } else if (name != "upload.json") {
          stray.push_back(e.path());  // a part or the joined file a stop cut short
        }
      }
      if (u->received > u->bytes) fail(ErrorCode::kDataLoss, "its parts hold {} bytes of the {} declared", u->received, u->bytes);
    } catch (const std::exception& e) {
      spdlog::warn("--files-dir: {} is not a pending upload ({}); removed", folder.string(), e.what());
      fs::remove_all(folder, ec);
      continue;
    }
    if (u->expires_at_ms <= now_ms) {
      fs::remove_all(folder, ec);
      continue;
    }
    try {
      files_.reserve(u->bytes);
    } catch (const ApiError& e) {
      spdlog::warn("--files-dir: the pending upload {} no longer fits ({}); removed", u->id, e.what());
      fs::remove_all(folder, ec);
      continue;
    }
    for (const fs::path& p : stray) fs::remove(p, ec);
    u->deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(u->expires_at_ms - now_ms);
    uploads_[u->id] = u;
  }
  if (!uploads_.empty()) spdlog::info("--files-dir {}: pending uploads kept from before: {}", files_.dir(), uploads_.size());
}

UploadStore::~UploadStore() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, u] : uploads_) {
    if (files_.dir().empty()) {
      drop(*u);
    } else if (u->status == "pending") {
      files_.release(u->bytes);  // its folder stays, for the next server
    }
  }
}

std::string UploadStore::part_path(const Upload& u, const std::string& part) const {
  return files_.dir() + "/uploads/" + u.id + "/" + part;
}

void UploadStore::drop(Upload& u) {
  if (u.status == "pending") files_.release(u.bytes);
  u.parts.clear();
  if (!files_.dir().empty()) {
    std::error_code ec;
    fs::remove_all(fs::path(files_.dir()) / "uploads" / u.id, ec);
  }
}

json UploadStore::to_json(const Upload& u) const {
  return {{"id", u.id},         {"object", "upload"},          {"bytes", u.bytes},
          {"created_at", u.created_at}, {"filename", u.filename}, {"purpose", u.purpose},
          {"status", u.status}, {"expires_at", u.expires_at_ms / 1000}, {"file", u.file}};
}

void UploadStore::expire_due() {
  // Past its deadline a pending upload expires; one more lifetime later any upload is forgotten.
  const auto now = std::chrono::steady_clock::now();
  for (auto it = uploads_.begin(); it != uploads_.end();) {
    Upload& u = *it->second;
    if (u.status == "pending" && now >= u.deadline) {
      drop(u);
      u.status = "expired";
    }
    it = now >= u.deadline + lifetime_ ? uploads_.erase(it) : std::next(it);
  }
}

std::shared_ptr<UploadStore::Upload> UploadStore::find(const std::string& id) {
  expire_due();
  auto it = uploads_.find(id);
  if (it == uploads_.end()) throw ApiError(404, fmt::format("No such Upload object: {}", id), "upload_id");
  return it->second;
}

json UploadStore::create(const json& body) {
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object {filename, purpose, bytes, mime_type}");
  auto text = [&](const char* key) {
    if (!body.contains(key) || !body[key].is_string() || body[key].get_ref<const std::string&>().empty()) {
      throw ApiError(400, fmt::format("'{}' must be a non-empty string", key), key);
    }
    return body[key].get<std::string>();
  };
  auto u = std::make_shared<Upload>();
  u->filename = text("filename");
  u->purpose = text("purpose");
  u->mime_type = text("mime_type");
  if (u->purpose != "batch") {
    throw ApiError(400, fmt::format("purpose is '{}': duet keeps files for batches, purpose 'batch'", u->purpose.substr(0, 64)),
                   "purpose");
  }
  if (!body.contains("bytes") || !body["bytes"].is_number_integer() || body["bytes"].get<int64_t>() < 0) {
    throw ApiError(400, "'bytes' must be the file's size, a whole number of 0 or more", "bytes");
  }
  u->bytes = body["bytes"].get<size_t>();
  u->file_expires_after = expires_after_seconds(json_field(body, "expires_after"), "expires_after");
  std::lock_guard<std::mutex> lock(mutex_);
  expire_due();
  files_.reserve(u->bytes);
  u->id = unique_id("upload_");
  const int64_t now_ms = unix_milliseconds();
  u->created_at = now_ms / 1000;
  u->expires_at_ms = now_ms + lifetime_.count();
  u->deadline = std::chrono::steady_clock::now() + lifetime_;
  if (!files_.dir().empty()) {
    // Its folder: the parts, and what the upload is (written whole through a rename), which the
    // next server on the folder reads to go on with it.
    const fs::path folder = fs::path(files_.dir()) / "uploads" / u->id;
    std::error_code ec;
    fs::create_directories(folder, ec);
    try {
      if (ec) fail(ErrorCode::kUnavailable, "{}", ec.message());
      write_atomically((folder / "upload.json").string(),
                       json{{"id", u->id}, {"filename", u->filename}, {"purpose", u->purpose}, {"mime_type", u->mime_type},
                            {"bytes", u->bytes}, {"file_expires_after", u->file_expires_after},
                            {"created_at", u->created_at}, {"expires_at_ms", u->expires_at_ms}}.dump());
    } catch (const std::exception& e) {
      files_.release(u->bytes);
      fs::remove_all(folder, ec);
      throw ApiError(500, fmt::format("cannot keep the upload in --files-dir: {}", e.what()));
    }
  }
  uploads_[u->id] = u;
  return to_json(*u);
}

json UploadStore::add_part(const std::string& id, std::string_view data) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto u = find(id);
  if (u->status != "pending") {
    throw ApiError(400, fmt::format("the upload {} is {}: parts are added to a pending upload", id, u->status), "upload_id");
  }
  if (u->received + data.size() > u->bytes) {
    throw ApiError(400, fmt::format("the upload was declared {} bytes and has {} in its parts: a part of {} bytes is too "
                                    "many", u->bytes, u->received, data.size()), "data");
  }
  const std::string part = unique_id("part_");
  if (files_.dir().empty()) {
    u->parts[part] = std::string(data);
  } else {
    try {
      write_atomically(part_path(*u, part), std::string(data));
    } catch (const std::exception& e) {
      throw ApiError(500, fmt::format("the part could not be kept: {}", e.what()));
    }
  }
  u->part_sizes[part] = data.size();
  u->received += data.size();
  return {{"id", part}, {"object", "upload.part"}, {"created_at", unix_seconds()}, {"upload_id", id}};
}

json UploadStore::complete(const std::string& id, const json& body) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto u = find(id);
  if (u->status != "pending") {
    throw ApiError(400, fmt::format("the upload {} is {}: only a pending upload is completed", id, u->status), "upload_id");
  }
  if (!body.is_object() || !body.contains("part_ids") || !body["part_ids"].is_array()) {
    throw ApiError(400, "'part_ids' must be the list of the upload's part ids, in the file's order", "part_ids");
  }
  std::vector<std::string> order;
  std::set<std::string> named;
  size_t total = 0;
  for (const json& p : body["part_ids"]) {
    if (!p.is_string() || u->part_sizes.count(p.get<std::string>()) == 0) {
      throw ApiError(400, fmt::format("{} is not a part of the upload {}", p.dump(), id), "part_ids");
    }
    if (!named.insert(p.get<std::string>()).second) throw ApiError(400, fmt::format("the part {} is named twice", p.dump()), "part_ids");
    order.push_back(p.get<std::string>());
    total += u->part_sizes.at(order.back());
  }
  if (total != u->bytes) {
    throw ApiError(400, fmt::format("the parts named hold {} bytes; the upload was declared {}", total, u->bytes), "part_ids");
  }
  std::string md5;
  if (body.contains("md5") && !body["md5"].is_null()) {
    if (!body["md5"].is_string()) throw ApiError(400, "'md5' must be a string of 32 hex digits", "md5");
    md5 = body["md5"].get<std::string>();
    std::transform(md5.begin(), md5.end(), md5.begin(), [](unsigned char c) { return std::tolower(c); });
  }
  // The file, put together in the order named (in the folder, a file beside the parts), and its MD5.
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> digest(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(digest.get(), EVP_md5(), nullptr);
  const bool folder = !files_.dir().empty();
  const std::string joined = folder ? files_.dir() + "/uploads/" + u->id + "/file" : std::string();
  if (folder) {
    std::ofstream out(joined, std::ios::binary | std::ios::trunc);
    for (const std::string& part : order) {
      const std::string data = read_whole(part_path(*u, part));
      EVP_DigestUpdate(digest.get(), data.data(), data.size());
      out.write(data.data(), static_cast<std::streamsize>(data.size()));
    }
    out.close();
    if (!out) throw ApiError(500, fmt::format("cannot write {}", joined));
  } else {
    for (const std::string& part : order) {
      const std::string& data = u->parts.at(part);
      EVP_DigestUpdate(digest.get(), data.data(), data.size());
    }
  }
  unsigned char sum[EVP_MAX_MD_SIZE];
  unsigned int sum_size = 0;
  EVP_DigestFinal_ex(digest.get(), sum, &sum_size);
  std::string hex;
  for (unsigned int i = 0; i < sum_size; ++i) hex += fmt::format("{:02x}", sum[i]);
  if (!md5.empty() && md5 != hex) {
    std::error_code ec;
    if (folder) fs::remove(joined, ec);
    throw ApiError(400, fmt::format("the parts' MD5 is {}, not the {} given", hex, md5), "md5");
  }
  std::string whole;
  if (!folder) {
    whole.reserve(total);
    for (const std::string& part : order) whole += u->parts.at(part);
  }
  const NewFile file{u->filename, u->purpose, u->file_expires_after};
  const StoredFile f = folder ? files_.adopt(file, joined, true) : files_.put(file, std::move(whole), true);
  u->status = "completed";
  u->file = f.to_json();
  drop(*u);
  return to_json(*u);
}

json UploadStore::cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto u = find(id);
  if (u->status != "pending") {
    throw ApiError(400, fmt::format("the upload {} is {}: only a pending upload is cancelled", id, u->status), "upload_id");
  }
  drop(*u);
  u->status = "cancelled";
  return to_json(*u);
}

}  // namespace duet::server
