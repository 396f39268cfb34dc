#include "internal/optimizer.h"

#include <algorithm>

namespace ferry::ps {

int StateSlots(OptimizerType type) {
  const OptimizerInfo* info = FindOptimizer(type);
  return info ? static_cast<int>(info->slots.size()) : 0;
}

void InitState(const OptimizerSpec& opt, float* state, size_t n) {
  const OptimizerInfo* info = FindOptimizer(opt.type);
  if (!info) return;
  for (const StateSlot& slot : info->slots) {
    std::fill(state, state + n, slot.starts_at ? opt.*slot.starts_at : 0.0f);
    state += n;
  }
}

void ApplyUpdate(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n,
                 size_t slot_stride, int64_t step) {
  if (const OptimizerInfo* info = FindOptimizer(opt.type)) info->update(opt, params, grad, state, n, slot_stride, step);
}

}  // namespace ferry::ps
