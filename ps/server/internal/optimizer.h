// ps/server/internal/optimizer.h — the server's use of the optimizers' catalogue
// (ferry/optimizers.h, which holds each optimizer's update rule and state slots): one code path for
// dense chunks and sparse rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

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
// `step` is the 1-based update count (used by adam). `opt` has passed Validate. An element whose
// new value or state would not be finite keeps both (UpdateFn); returns how many did.
int64_t ApplyUpdate(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n,
                    size_t slot_stride, int64_t step);

// What an update refused: elements whose new value or optimizer state would not have been finite
// (finite gradients overflowing: 3e38, or lr = 3e38, or g^2 past FLT_MAX), each of which kept its
// value and state.
struct NotFinite {
  int64_t count = 0;   // elements refused
  int64_t first = -1;  // the lowest of them, an index into params (the caller may rebase it)
  int64_t id = -1;     // a sparse row's: its id (`first` is then the element within the row)
  bool exact = true;   // false: `first` is only a lower bound (see ApplyUpdateChecked)
  float value = 0;     // element `first`'s value, kept
  float grad = 0;      // and its gradient

  bool any() const { return count > 0; }
  // Adds `o`'s refusals, keeping the lowest `first` (of the lowest id) as the one named.
  void Merge(const NotFinite& o);
};

// ApplyUpdate, and when it refused any element, which: each element is updated again alone, on a
// copy (only then: the common case costs ApplyUpdate's own check, bench/ferry_bench.cc `opt/`).
NotFinite ApplyUpdateChecked(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n,
                             size_t slot_stride, int64_t step);
// Its second half, for a caller that called ApplyUpdate itself (a sparse row's update, where the
// call's cost counts): which of params[0, n) the update that refused `refused` elements refused.
NotFinite LocateNotFinite(const OptimizerSpec& opt, const float* params, const float* grad, const float* state,
                          size_t n, size_t slot_stride, int64_t step, int64_t refused);

// A clause about `nf` (non-empty) for an error: "the update of <element> would not be finite (sgd,
// lr 0.01; it is 1.5, its gradient 3e+38)". `element` names element `nf.first` ("chunk 3 element 17",
// "id 42 element 5").
std::string DescribeNotFinite(const OptimizerSpec& opt, const NotFinite& nf, const std::string& element);

// What a user does about a table that diverged, for its errors.
inline constexpr std::string_view kDivergedAdvice = "lower the learning rate or clip the gradients";

}  // namespace ferry::ps
