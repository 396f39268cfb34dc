// ps/server/internal/optimizer.h — the server's use of the optimizers' catalogue
// (ferry/optimizers.h, which holds each optimizer's update rule and state slots): one code path for
// dense chunks and sparse rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/table_spec.h"

namespace ferry::ps {

// Floats of optimizer state kept per parameter (0 for sgd, 1 for momentum/adagrad, 2 for adam,
// adamw and ftrl).
int StateSlots(OptimizerType type);

// Initial value of each state slot (0, or the hyperparameter the slot starts at: adagrad's
// accumulator and ftrl's n start at initial_accumulator). Slot k of parameter i is state[k * n + i].
void InitState(const OptimizerSpec& opt, float* state, size_t n);

// Applies one update to params[0, n). Slot k of the optimizer state for params[i] is
// state[k * slot_stride + i] (slot_stride >= n; a sub-range of a chunk passes the chunk's size).
// `step` is the 1-based update count (used by adam). `opt` has passed Validate.
void ApplyUpdate(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n,
                 size_t slot_stride, int64_t step);

}  // namespace ferry::ps
