#include "internal/optimizer.h"

#include <algorithm>
#include <cmath>

namespace ferry::ps {

int StateSlots(OptimizerType type) {
  switch (type) {
    case OptimizerType::kSgd: return 0;
    case OptimizerType::kMomentum: return 1;
    case OptimizerType::kAdagrad: return 1;
    case OptimizerType::kAdam: return 2;
    case OptimizerType::kFtrl: return 2;
  }
  return 0;
}

void InitState(const OptimizerSpec& opt, float* state, size_t n) {
  const size_t total = n * static_cast<size_t>(StateSlots(opt.type));
  std::fill(state, state + total, 0.0f);
  // The accumulator: adagrad's only slot, ftrl's second (n; z, the first, starts at 0).
  if (opt.type == OptimizerType::kAdagrad) std::fill(state, state + n, opt.initial_accumulator);
  if (opt.type == OptimizerType::kFtrl) std::fill(state + n, state + 2 * n, opt.initial_accumulator);
}

void ApplyUpdate(const OptimizerSpec& opt, float* __restrict params, const float* __restrict grad,
                 float* __restrict state, size_t n, size_t slot_stride, int64_t step) {
  const float lr = opt.learning_rate;
  switch (opt.type) {
    case OptimizerType::kSgd:
      for (size_t i = 0; i < n; ++i) params[i] -= lr * grad[i];
      return;
    case OptimizerType::kMomentum: {
      float* __restrict v = state;
      const float mu = opt.momentum;
      if (opt.nesterov) {
        for (size_t i = 0; i < n; ++i) {
          v[i] = mu * v[i] + grad[i];
          params[i] -= lr * (grad[i] + mu * v[i]);
        }
      } else {
        for (size_t i = 0; i < n; ++i) {
          v[i] = mu * v[i] + grad[i];
          params[i] -= lr * v[i];
        }
      }
      return;
    }
    case OptimizerType::kAdagrad: {
      float* __restrict a = state;
      const float eps = opt.epsilon;
      for (size_t i = 0; i < n; ++i) {
        a[i] += grad[i] * grad[i];
        params[i] -= lr * grad[i] / (std::sqrt(a[i]) + eps);
      }
      return;
    }
    case OptimizerType::kAdam: {
      float* __restrict m = state;
      float* __restrict v = state + slot_stride;
      const float b1 = opt.beta1, b2 = opt.beta2, eps = opt.epsilon;
      const double t = static_cast<double>(step < 1 ? 1 : step);
      const float lr_t = static_cast<float>(lr * std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)) /
                                            (1.0 - std::pow(static_cast<double>(b1), t)));
      for (size_t i = 0; i < n; ++i) {
        m[i] = b1 * m[i] + (1.0f - b1) * grad[i];
        v[i] = b2 * v[i] + (1.0f - b2) * grad[i] * grad[i];
        params[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
      }
      return;
    }
    case OptimizerType::kFtrl: {
      float* __restrict z = state;
      float* __restrict acc = state + slot_stride;
      const float l1 = opt.l1, l2 = opt.l2, beta = opt.beta, inv_alpha = 1.0f / lr;
      for (size_t i = 0; i < n; ++i) {
        const float g = grad[i];
        const float n_new = acc[i] + g * g;
        const float sqrt_new = std::sqrt(n_new);
        const float sigma = (sqrt_new - std::sqrt(acc[i])) * inv_alpha;
        z[i] += g - sigma * params[i];
        acc[i] = n_new;
        const float zi = z[i];
        params[i] = std::fabs(zi) <= l1 ? 0.0f
                                        : -(zi - std::copysign(l1, zi)) / ((beta + sqrt_new) * inv_alpha + l2);
      }
      return;
    }
  }
}

}  // namespace ferry::ps
