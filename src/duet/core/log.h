// Logging goes through spdlog's default logger; this sets it up once for the whole program.
// Text lines for people, or JSON lines (one object per line: ts, level, logger, msg, plus the
// fields of structured records) that Filebeat/ELK ingest as they are.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace duet {

enum class LogFormat { kText, kJson };

// level: trace, debug, info, warn, error, off. Logs go to stderr, or to `file` when given
// (appended). Throws kInvalidArgument for an unknown level and kUnavailable for a file that
// cannot be opened.
void configure_logging(std::string_view level, LogFormat format = LogFormat::kText, const std::string& file = "");

// Opens the log file again under its name (after logrotate moved it away; `duet serve` does it on
// SIGHUP) and returns its path; "" when logs go to stderr. Throws kUnavailable, leaving the old
// file in use, when it cannot be opened.
std::string reopen_log_file();

// Logs one structured record at info level: `message` plus `fields` as top-level keys of the
// JSON line (in text format: message key=value ...).
void log_record(std::string_view message, const nlohmann::json& fields);

}  // namespace duet
