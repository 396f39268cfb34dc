#include "internal/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
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
int64_t Dispatch(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n,
                 size_t slot_stride, int64_t step, std::index_sequence<I...>) {
  int64_t refused = 0;
  (void)((opt.type == kOptimizers[I].type &&
          (refused = kOptimizers[I].update(opt, params, grad, state, n, slot_stride, step), true)) ||
         ...);
  return refused;
}

}  // namespace

int64_t ApplyUpdate(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n,
                    size_t slot_stride, int64_t step) {
  constexpr size_t kMost = size_t{1} << 31;  // a rule counts its refusals in 32 bits
  if (n <= kMost) [[likely]] {  // one call (a tail call: a sparse row's update is this)
    return Dispatch(opt, params, grad, state, n, slot_stride, step, std::make_index_sequence<kNumOptimizers>());
  }
  int64_t refused = 0;
  for (size_t b = 0; b < n; b += kMost) {
    refused += Dispatch(opt, params + b, grad + b, state == nullptr ? nullptr : state + b, std::min(kMost, n - b),
                        slot_stride, step, std::make_index_sequence<kNumOptimizers>());
  }
  return refused;
}

void NotFinite::Merge(const NotFinite& o) {
  if (!o.any()) return;
  const int64_t total = count + o.count;
  if (!any() || o.id < id || (o.id == id && o.first < first)) *this = o;
  count = total;
}

NotFinite ApplyUpdateChecked(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n,
                             size_t slot_stride, int64_t step) {
  const int64_t refused = ApplyUpdate(opt, params, grad, state, n, slot_stride, step);
  if (refused == 0) [[likely]] return NotFinite{};
  return LocateNotFinite(opt, params, grad, state, n, slot_stride, step, refused);
}

NotFinite LocateNotFinite(const OptimizerSpec& opt, const float* params, const float* grad, const float* state,
                          size_t n, size_t slot_stride, int64_t step, int64_t refused) {
  NotFinite nf;
  nf.count = refused;
  // Which ones: the refused elements kept their value and state, so the same update of each alone,
  // on a copy, is refused again. An element updated already may be refused too if updated twice:
  // `exact` only when no more are found than were refused.
  const size_t slots = static_cast<size_t>(StateSlots(opt.type));
  int64_t found = 0;
  for (size_t i = 0; i < n; ++i) {
    float p = params[i];
    float s[4] = {};
    for (size_t k = 0; k < slots && k < 4; ++k) s[k] = state[k * slot_stride + i];
    if (ApplyUpdate(opt, &p, grad + i, s, 1, 1, step) == 0) continue;
    if (found++ == 0) {
      nf.first = static_cast<int64_t>(i);
      nf.value = params[i];
      nf.grad = grad[i];
    }
  }
  nf.exact = found == nf.count;
  return nf;
}

std::string DescribeNotFinite(const OptimizerSpec& opt, const NotFinite& nf, const std::string& element) {
  const OptimizerInfo* info = FindOptimizer(opt.type);
  char value[40], grad[40], lr[40];
  std::snprintf(value, sizeof value, "%.9g", static_cast<double>(nf.value));
  std::snprintf(grad, sizeof grad, "%.9g", static_cast<double>(nf.grad));
  std::snprintf(lr, sizeof lr, "%g", static_cast<double>(opt.learning_rate));
  const std::string many = "the updates of " + std::to_string(nf.count) + " elements, the first ";
  std::string what = nf.count == 1 ? "the update of " + element
                     : nf.exact    ? many + element + ","
                                   : many + "at or after " + element + ",";
  what += std::string(" would not be finite (") + (info ? std::string(info->name) : "?") + ", lr " + lr + "; " +
          (nf.count == 1 || nf.exact ? "it" : element) + " is " + value + ", its gradient " + grad + ")";
  return what;
}

}  // namespace ferry::ps
