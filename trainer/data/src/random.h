// Private: the integer hashing and random streams behind sharding, Criteo ids and the synthetic
// generator. Everything here is fixed arithmetic on uint64_t, so it gives the same bits on every
// platform; changing any constant changes shuffles, ids and synthetic data (tests pin them).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>

namespace ferry::data::internal {

// SplitMix64's output function (Steele, Lea & Flood 2014): a bijective 64-bit mixer.
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Hash of a pair, order-sensitive.
constexpr uint64_t HashPair(uint64_t a, uint64_t b) { return Mix64(Mix64(a) ^ (b * 0xd6e8feb86659fd93ull)); }

// FNV-1a, 64-bit.
constexpr uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// A SplitMix64 stream: the n-th output is Mix64(seed + n * gamma).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t x = state_;
    state_ += 0x9e3779b97f4a7c15ull;
    return Mix64(x);
  }

  // Uniform in [0, bound), bound >= 1, without modulo bias (rejection of the short last block).
  uint64_t Below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    for (;;) {
      uint64_t x = Next();
      if (x >= threshold) return x % bound;
    }
  }

  // Uniform in [0, 1), 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// A standard normal from a 64-bit key (Box–Muller over two uniforms derived from the key).
inline double NormalFromKey(uint64_t key) {
  SplitMix64 rng(key);
  const double u1 = 1.0 - rng.Uniform();  // (0, 1]: log stays finite
  const double u2 = rng.Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace ferry::data::internal
