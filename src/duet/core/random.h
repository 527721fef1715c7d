// Deterministic random numbers, identical on every platform (the standard library's
// distributions are not): sampling seeds and synthetic weights both rely on that.
#pragma once

#include <cstdint>

namespace duet {

// A small, fast generator (xoshiro256**), seeded through splitmix64; identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_[4];
};

}  // namespace duet
