// Deterministic random numbers, identical on every platform (the standard library's
// distributions are not): sampling seeds and synthetic weights both rely on that.
#pragma once

#include <cstdint>

namespace duet {

// 2^64 over the golden ratio: splitmix64's step, and an odd constant for mixing.
inline constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// The splitmix64 finalizer: a bijection on 64-bit values with good avalanche (the prefix cache's
// block hashes and the Redis tier's checksums are built on it; their values must not change).
constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

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
