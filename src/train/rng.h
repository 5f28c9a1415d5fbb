#pragma once
// The training engine's random numbers: splitmix64, specified by its few lines, so a seed gives
// the same weights, data order and dropout on every machine and standard library (std::
// distributions are implementation-defined).
#include <cmath>
#include <cstdint>

namespace tern::train {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n) (n > 0), by rejection so every value is equally likely.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next(); while (x >= limit);
    return x % n;
  }
  // Standard normal (Box-Muller, one value per call).
  double normal() {
    double u1 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

// A stream of its own per (seed, purpose, index), e.g. the data order of epoch 3.
inline uint64_t mix_seed(uint64_t seed, uint64_t purpose, uint64_t index) {
  Rng r(seed ^ (purpose * 0xD1B54A32D192ED03ull) ^ (index * 0x8CB92BA72F3D8DD7ull));
  return r.next();
}

}  // namespace tern::train
