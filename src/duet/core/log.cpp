#include "duet/core/log.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "duet/core/error.h"

namespace duet {
namespace {

// The fields of the record being logged on this thread (loggers here are synchronous, so the
// formatter runs on the logging thread).
thread_local const nlohmann::json* tl_fields = nullptr;

std::string iso_time(std::chrono::system_clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03}Z", buf, ms % 1000);
}

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    nlohmann::json j = {{"ts", iso_time(msg.time)},
                        {"level", std::string(spdlog::level::to_string_view(msg.level).data(),
                                              spdlog::level::to_string_view(msg.level).size())},
                        {"logger", std::string(msg.logger_name.data(), msg.logger_name.size())},
                        {"msg", std::string(msg.payload.data(), msg.payload.size())}};
    if (tl_fields != nullptr && tl_fields->is_object()) {
      for (auto it = tl_fields->begin(); it != tl_fields->end(); ++it) j[it.key()] = it.value();
    }
    const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

// Appends to a file that can be opened again under the same name (after logrotate moved it), with
// the sink's lock held so that no line is half in each file.
class LogFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit LogFileSink(std::string path) : path_(std::move(path)), file_(open(path_)) {}
  ~LogFileSink() override { std::fclose(file_); }
  LogFileSink(const LogFileSink&) = delete;
  LogFileSink& operator=(const LogFileSink&) = delete;

  const std::string& path() const { return path_; }
  // The old file stays in use when the new one cannot be opened (the error says why).
  void reopen() {
    std::FILE* fresh = open(path_);
    std::lock_guard<std::mutex> lock(mutex_);
    std::fclose(file_);
    file_ = fresh;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    std::fwrite(line.data(), 1, line.size(), file_);  // a full disk loses lines, not the server
  }
  void flush_() override { std::fflush(file_); }

 private:
  // Makes the file's folder first (as spdlog's file sink did; after a rotation that removed it,
  // it comes back).
  static std::FILE* open(const std::string& path) {
    std::error_code ignored;  // fopen says what is wrong
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ignored);
    std::FILE* f = std::fopen(path.c_str(), "ae");
    if (f == nullptr) fail(ErrorCode::kUnavailable, "cannot open log file '{}': {}", path, std::strerror(errno));
    return f;
  }

  std::string path_;
  std::FILE* file_;
};

LogFormat g_format = LogFormat::kText;
std::shared_ptr<LogFileSink> g_file_sink;  // set before the threads that log start

}  // namespace

void configure_logging(std::string_view level, LogFormat format, const std::string& file) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    fail(ErrorCode::kInvalidArgument, "unknown log level '{}' (expected trace, debug, info, warn, error or off)",
         level);
  }
  spdlog::drop("duet");
  std::shared_ptr<spdlog::logger> logger;
  if (file.empty()) {
    g_file_sink.reset();
    logger = spdlog::stderr_color_mt("duet");
  } else {
    g_file_sink = std::make_shared<LogFileSink>(file);
    logger = std::make_shared<spdlog::logger>("duet", g_file_sink);
  }
  if (format == LogFormat::kJson) {
    logger->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  }
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::info);
  g_format = format;
  spdlog::set_default_logger(logger);
}

std::string reopen_log_file() {
  if (!g_file_sink) return {};
  g_file_sink->reopen();
  return g_file_sink->path();
}

void log_record(std::string_view message, const nlohmann::json& fields) {
  if (g_format == LogFormat::kJson) {
    tl_fields = &fields;
    spdlog::info("{}", message);
    tl_fields = nullptr;
    return;
  }
  std::string line(message);
  for (auto it = fields.begin(); it != fields.end(); ++it) {
    line += " " + it.key() + "=" + (it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
  }
  spdlog::info("{}", line);
}

}  // namespace duet
