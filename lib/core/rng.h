// rng.h — deterministic random numbers that do not depend on the standard library's
// implementation-defined distributions: splitmix64 streams keyed by (seed, stream id).
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

namespace ptq {

inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t hash_str(std::string_view s, uint64_t h = 0xcbf29ce484222325ull) {   // FNV-1a
  for (unsigned char c : s) { h ^= c; h *= 0x100000001b3ull; }
  return h;
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed, uint64_t stream = 0) : s(seed * 0x9E3779B97F4A7C15ull ^ (stream + 0x632BE59BD9B4E019ull)) { splitmix64(s); }
  uint64_t next() { return splitmix64(s); }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }          // [0, 1)
  uint64_t below(uint64_t n) {                                             // [0, n), unbiased
    const uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next(); while (x >= lim);
    return x % n;
  }
  double normal() {                                                        // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace ptq
