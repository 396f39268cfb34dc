// CPU ReLU forward and backward.
#include "ferry/kernels.h"
#include "internal/shapes.h"

namespace ferry::kernels::cpu {

Status ReluForward(const float* x, int64_t n, float* y) {
  FERRY_RETURN_IF_ERROR(internal::CheckReluForward(x, n, y));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  return Status::Ok();
}

Status ReluBackward(const float* y, const float* dy, int64_t n, float* dx) {
  FERRY_RETURN_IF_ERROR(internal::CheckReluBackward(y, dy, n, dx));
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  return Status::Ok();
}

}  // namespace ferry::kernels::cpu
