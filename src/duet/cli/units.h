// Human-readable sizes and counts for the commands' output.
#pragma once

#include <cstdint>
#include <string>

namespace duet::cli {

std::string human_bytes(double bytes);  // "723.63 MiB"
std::string human_count(int64_t n);     // "1.35 B"

}  // namespace duet::cli
