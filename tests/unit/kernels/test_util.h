// Helpers for the kernel tests: seeded random data, tolerant comparison, the all-zero guard.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ferry::kernels::testing {

// |got - want| <= atol + rtol * |want|, elementwise.
struct Tolerance {
  float atol;
  float rtol;
};

// Prints the seed and records it in the test's XML/JSON report, so a failure can be replayed.
inline std::mt19937 SeededRng(const std::string& name, uint32_t seed) {
  ::testing::Test::RecordProperty(name + "_seed", std::to_string(seed));
  std::cout << "[   SEED   ] " << name << " = " << seed << std::endl;
  return std::mt19937(seed);
}

inline std::vector<float> RandomFloats(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<int32_t> RandomInts(std::mt19937& rng, size_t n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

inline ::testing::AssertionResult AllClose(const std::vector<float>& got,
                                           const std::vector<float>& want, Tolerance tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "size " << got.size() << " != expected size " << want.size();
  }
  size_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const float limit = tol.atol + tol.rtol * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= limit)) {  // Also catches NaN.
      if (bad < 5) {
        first << "\n  [" << i << "] got " << got[i] << ", expected " << want[i] << " (|diff| "
              << std::fabs(got[i] - want[i]) << " > " << limit << ")";
      }
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size()
                                       << " elements outside atol=" << tol.atol
                                       << " rtol=" << tol.rtol << ":" << first.str();
}

// The guard against a kernel that wrote nothing (and a reference that computed nothing).
inline ::testing::AssertionResult NotAllZero(const std::vector<float>& v) {
  for (float x : v) {
    if (x != 0.0f) return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "all " << v.size() << " elements are zero";
}

}  // namespace ferry::kernels::testing
