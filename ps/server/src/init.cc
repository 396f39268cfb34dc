#include "internal/init.h"

#include <cmath>
#include <numbers>

#include "ferry/messages/placement.h"

namespace ferry::ps {
namespace {

using placement::Mix64;

// Uniform in [0, 1) from 24 random bits (exact in float).
inline float Unit(uint64_t bits) { return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f); }

inline float Value(const TableSpec& spec, uint64_t key) {
  switch (spec.init) {
    case InitType::kZeros: return 0.0f;
    case InitType::kConstant: return spec.init_scale;
    case InitType::kUniform: return (2.0f * Unit(Mix64(key)) - 1.0f) * spec.init_scale;
    case InitType::kNormal: {
      // Box-Muller from two independent hashes of the same key.
      const double u1 = (static_cast<double>(Mix64(key) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
      const double u2 = static_cast<double>(Mix64(key ^ 0xA5A5A5A5A5A5A5A5ull) >> 11) * 0x1.0p-53;
      return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2)) *
             spec.init_scale;
    }
  }
  return 0.0f;
}

inline uint64_t Key(const TableSpec& spec, uint64_t table_id, uint64_t a, uint64_t b) {
  return Mix64(Mix64(Mix64(spec.seed ^ table_id) ^ a) ^ b);
}

}  // namespace

void InitDense(const TableSpec& spec, uint64_t table_id, int64_t first, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Value(spec, Key(spec, table_id, static_cast<uint64_t>(first + i), 0));
}

void InitSparseRow(const TableSpec& spec, uint64_t table_id, int64_t id, float* out) {
  for (int64_t j = 0; j < spec.dim; ++j) {
    out[j] = Value(spec, Key(spec, table_id, static_cast<uint64_t>(id), static_cast<uint64_t>(j) + 1));
  }
}

}  // namespace ferry::ps
