// Logging goes through spdlog's default logger; this sets it up once for the whole program.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

namespace duet {

// level: trace, debug, info, warn, error, off. Logs go to stderr so stdout stays for results.
void configure_logging(std::string_view level);

}  // namespace duet
