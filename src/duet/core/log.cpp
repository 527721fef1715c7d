#include "duet/core/log.h"

#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "duet/core/error.h"

namespace duet {

void configure_logging(std::string_view level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    fail(ErrorCode::kInvalidArgument, "unknown log level '{}' (expected trace, debug, info, warn, error or off)",
         level);
  }
  spdlog::drop("duet");
  auto logger = spdlog::stderr_color_mt("duet");
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
}

}  // namespace duet
