// CPU bias add and bias gradient.
#include <algorithm>

#include "ferry/kernels.h"
#include "internal/shapes.h"

namespace ferry::kernels::cpu {

Status BiasAdd(const float* bias, int64_t rows, int64_t cols, float* x) {
  FERRY_RETURN_IF_ERROR(internal::CheckBiasAdd(bias, rows, cols, x));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
  return Status::Ok();
}

Status BiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias) {
  FERRY_RETURN_IF_ERROR(internal::CheckBiasGrad(dy, rows, cols, dbias));
  std::fill(dbias, dbias + cols, 0.0f);
  // Rows outer, so dy is read in order; each column is summed in ascending row order.
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = dy + r * cols;
    for (int64_t c = 0; c < cols; ++c) dbias[c] += row[c];
  }
  return Status::Ok();
}

}  // namespace ferry::kernels::cpu
