// ps/server/internal/optimizer.h — the server-side optimizers, one code path for dense chunks and
// sparse rows.
//
// Update rules (g = gradient, p = parameter, t = 1-based update count of this chunk or row):
//   sgd:      p -= lr * g
//   momentum: v = momentum * v + g;  p -= lr * v                (nesterov: p -= lr * (g + momentum * v))
//   adagrad:  a += g * g;            p -= lr * g / (sqrt(a) + eps)        (a starts at initial_accumulator)
//   adam:     m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//             p -= lr_t * m / (sqrt(v) + eps),  lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)
//   ftrl:     FTRL-Proximal (McMahan et al., "Ad click prediction", KDD 2013), alpha = lr:
//             sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z += g - sigma * p;  n += g^2;
//             p = 0 if |z| <= l1, else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)
//             (z starts at 0, n at initial_accumulator)
// Element-wise, so the result does not depend on how a range is split across threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/table_spec.h"

namespace ferry::ps {

// Floats of optimizer state kept per parameter (0 for sgd, 1 for momentum/adagrad, 2 for adam
// and ftrl).
int StateSlots(OptimizerType type);

// Initial value of each state slot (adagrad's accumulator and ftrl's n start at
// initial_accumulator). Slot k of parameter i is state[k * n + i].
void InitState(const OptimizerSpec& opt, float* state, size_t n);

// Applies one update to params[0, n). Slot k of the optimizer state for params[i] is
// state[k * slot_stride + i] (slot_stride >= n; a sub-range of a chunk passes the chunk's size).
// `step` is the 1-based update count (used by adam).
void ApplyUpdate(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n,
                 size_t slot_stride, int64_t step);

}  // namespace ferry::ps
