// Facts about the machine the engine sizes itself by.
#pragma once

#include <cstdint>

namespace duet {

// MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read.
int64_t available_memory_bytes();
// MemTotal from /proc/meminfo, in bytes; 0 when it cannot be read.
int64_t total_memory_bytes();

}  // namespace duet
