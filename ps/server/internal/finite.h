// ps/server/internal/finite.h — finding NaN and Inf in a pushed gradient before it is used, so
// that one broken or hostile worker cannot poison a table for everyone.
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>

namespace ferry::ps {

// The index of the first NaN or Inf in `v`, or -1. The common case (all finite) is one pass the
// compiler vectorizes: a float is NaN or Inf exactly when its exponent bits are all ones. The
// index is looked for only when there is one.
inline int64_t FirstNonFinite(std::span<const float> v) {
  const float* p = v.data();
  const size_t n = v.size();
  uint32_t any = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof bits);
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (any == 0) return -1;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(p[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace ferry::ps
