#include "internal/optimizer.h"

#include <algorithm>
#include <utility>

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

namespace {

// One direct call per optimizer of the catalogue, chosen by type. A call through the table's
// function pointer measured 1.25x slower on sparse rows of dim 64 out of cache (the row updates
// of a push overlap less): bench/results/optimizer_catalogue.
template <size_t... I>
void Dispatch(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n, size_t slot_stride,
              int64_t step, std::index_sequence<I...>) {
  (void)((opt.type == kOptimizers[I].type &&
          (kOptimizers[I].update(opt, params, grad, state, n, slot_stride, step), true)) ||
         ...);
}

}  // namespace

void ApplyUpdate(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n,
                 size_t slot_stride, int64_t step) {
  Dispatch(opt, params, grad, state, n, slot_stride, step, std::make_index_sequence<kNumOptimizers>());
}

}  // namespace ferry::ps
