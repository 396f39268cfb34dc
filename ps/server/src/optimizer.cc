#include "internal/optimizer.h"

#include <cmath>

namespace ferry::ps {

int StateSlots(OptimizerType type) {
  switch (type) {
    case OptimizerType::kSgd: return 0;
    case OptimizerType::kMomentum: return 1;
    case OptimizerType::kAdagrad: return 1;
    case OptimizerType::kAdam: return 2;
  }
  return 0;
}

void InitState(const OptimizerSpec& opt, float* state, size_t n) {
  const float v = opt.type == OptimizerType::kAdagrad ? opt.initial_accumulator : 0.0f;
  const size_t total = n * static_cast<size_t>(StateSlots(opt.type));
  for (size_t i = 0; i < total; ++i) state[i] = v;
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
  }
}

}  // namespace ferry::ps
