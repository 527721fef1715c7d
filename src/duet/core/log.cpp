#include "duet/core/log.h"

#include <chrono>
#include <ctime>
#include <string>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/basic_file_sink.h>
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

LogFormat g_format = LogFormat::kText;

}  // namespace

void configure_logging(std::string_view level, LogFormat format, const std::string& file) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    fail(ErrorCode::kInvalidArgument, "unknown log level '{}' (expected trace, debug, info, warn, error or off)",
         level);
  }
  spdlog::drop("duet");
  std::shared_ptr<spdlog::logger> logger;
  try {
    logger = file.empty() ? spdlog::stderr_color_mt("duet") : spdlog::basic_logger_mt("duet", file, false);
  } catch (const spdlog::spdlog_ex& e) {
    fail(ErrorCode::kUnavailable, "cannot open log file '{}': {}", file, e.what());
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
