// bench/zipf.h — Zipf(s) draws over [0, n) for the benchmarks' id streams.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace ferry::bench {

// Zipf(s) over [0, n): rank k drawn with weight 1 / (k + 1)^s, by inverting the cumulative
// weights (precomputed once: 8 bytes a rank).
class Zipf {
 public:
  Zipf(int64_t n, double s) : cdf_(static_cast<size_t>(n)) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) cdf_[static_cast<size_t>(i)] = sum += 1.0 / std::pow(static_cast<double>(i + 1), s);
    for (double& c : cdf_) c /= sum;
  }
  int64_t operator()(std::mt19937_64& g) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(g);
    return std::min(static_cast<int64_t>(cdf_.size()) - 1,
                    static_cast<int64_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin()));
  }
  // The probability of rank k.
  double Probability(int64_t k) const {
    const size_t i = static_cast<size_t>(k);
    return i == 0 ? cdf_[0] : cdf_[i] - cdf_[i - 1];
  }

 private:
  std::vector<double> cdf_;
};

}  // namespace ferry::bench
