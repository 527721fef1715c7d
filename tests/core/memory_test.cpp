// AnonymousMemory with huge pages: the buffer starts on a 2 MiB boundary, spans whole 2 MiB
// pages, and every byte of it is this process's own mapping (never past the reservation).
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/memory.h"

namespace duet {
namespace {

// Whether [begin, end) is covered by the mappings listed in /proc/self/maps.
bool mapped(uintptr_t begin, uintptr_t end) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    uintptr_t a = 0, b = 0;
    char dash = 0;
    in >> std::hex >> a >> dash >> b;
    ranges.emplace_back(a, b);
  }
  uintptr_t at = begin;
  for (bool grew = true; grew && at < end;) {
    grew = false;
    for (const auto& [a, b] : ranges) {
      if (a <= at && at < b) {
        at = b;
        grew = true;
      }
    }
  }
  return at >= end;
}

TEST(AnonymousMemory, HugePageBuffersAreAlignedAndOwned) {
  constexpr size_t kHuge = size_t{2} << 20;
  std::vector<AnonymousMemory> held;
  for (size_t bytes : {size_t{1}, size_t{3} << 20, (size_t{5} << 20) + 4096, kHuge}) {
    for (int i = 0; i < 6; ++i) {
      AnonymousMemory m(bytes, /*huge_pages=*/true);
      const auto p = reinterpret_cast<uintptr_t>(m.data());
      EXPECT_EQ(p % kHuge, 0u) << bytes;
      EXPECT_GE(m.size(), bytes);
      EXPECT_EQ(m.size() % kHuge, 0u);
      EXPECT_LT(m.size() - bytes, kHuge);
      ASSERT_TRUE(mapped(p, p + m.size())) << "bytes " << bytes << ": the buffer runs past its own mapping";
      static_cast<uint8_t*>(m.data())[m.size() - 1] = 1;
      held.push_back(std::move(m));
    }
  }
  AnonymousMemory plain(100);
  EXPECT_EQ(plain.size(), 100u);
}

}  // namespace
}  // namespace duet
