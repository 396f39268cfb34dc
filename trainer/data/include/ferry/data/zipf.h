// ferry/data/zipf.h — Zipf-distributed ranks without a probability table.
// Thread-safety: a ZipfSampler is immutable after construction; Sample() may be called from any
// thread with its own uniform source.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ferry::data {

// Zipf(n, s) over ranks [1, n] by rejection-inversion (W. Hörmann, G. Derflinger, "Rejection-
// inversion to generate variates from monotone discrete distributions", 1996), as in Apache
// Commons RNG's RejectionInversionZipfSampler: O(1) memory, ~1 uniform per draw.
class ZipfSampler {
 public:
  ZipfSampler(int64_t n, double s) : n_(n), s_(s) {
    h_integral_x1_ = HIntegral(1.5) - 1.0;
    h_integral_n_ = HIntegral(static_cast<double>(n) + 0.5);
    threshold_ = 2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0));
  }

  // A rank in [1, n]. `unit()` returns uniform doubles in [0, 1); one call per attempt.
  template <typename Unit>
  int64_t Sample(Unit&& unit) const {
    if (n_ == 1) return 1;
    for (;;) {
      // u is uniform in (h_integral_x1_, h_integral_n_].
      const double u = h_integral_n_ + unit() * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      int64_t k = static_cast<int64_t>(x + 0.5);
      k = std::clamp<int64_t>(k, 1, n_);
      if (static_cast<double>(k) - x <= threshold_ ||
          u >= HIntegral(static_cast<double>(k) + 0.5) - H(static_cast<double>(k))) {
        return k;
      }
    }
  }

 private:
  // h(x) = x^-s and its integral H(x) = (x^(1-s) - 1) / (1 - s) (log x at s = 1), computed stably.
  double H(double x) const { return std::exp(-s_ * std::log(x)); }
  double HIntegral(double x) const {
    const double log_x = std::log(x);
    return Helper2((1.0 - s_) * log_x) * log_x;
  }
  double HIntegralInverse(double x) const {
    double t = x * (1.0 - s_);
    if (t < -1.0) t = -1.0;
    return std::exp(Helper1(t) * x);
  }
  // log1p(x) / x and expm1(x) / x, with their series near 0.
  static double Helper1(double x) {
    return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  static double Helper2(double x) {
    return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
  }

  int64_t n_;
  double s_;
  double h_integral_x1_;
  double h_integral_n_;
  double threshold_;
};

}  // namespace ferry::data
