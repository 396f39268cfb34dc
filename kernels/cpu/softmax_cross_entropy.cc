// CPU softmax cross-entropy forward and backward.
#include <cmath>
#include <limits>
#include <string>

#include "ferry/kernels.h"
#include "internal/shapes.h"

namespace ferry::kernels::cpu {
namespace {

Status CheckLabels(const char* op, const int32_t* labels, int64_t rows, int64_t classes) {
  for (int64_t r = 0; r < rows; ++r) {
    if (labels[r] < 0 || labels[r] >= classes) {
      return InvalidArgumentError(std::string(op) + ": labels[" + std::to_string(r) + "] = " +
                                  std::to_string(labels[r]) + " is outside [0, " +
                                  std::to_string(classes) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t rows,
                                  int64_t classes, float* probs, float* row_loss,
                                  float* mean_loss) {
  FERRY_RETURN_IF_ERROR(internal::CheckSoftmaxCrossEntropyForward(logits, labels, rows, classes,
                                                                  probs, row_loss, mean_loss));
  FERRY_RETURN_IF_ERROR(CheckLabels("SoftmaxCrossEntropyForward", labels, rows, classes));
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * classes;
    float* p = probs + r * classes;
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < classes; ++c) max = x[c] > max ? x[c] : max;
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(x[c] - max);
    for (int64_t c = 0; c < classes; ++c) p[c] = std::exp(x[c] - max) / sum;
    // -log p[label] = log(sum) - (x[label] - max): no exp of the label's logit is needed.
    row_loss[r] = std::log(sum) - (x[labels[r]] - max);
    total += row_loss[r];
  }
  mean_loss[0] = rows > 0 ? static_cast<float>(total / static_cast<double>(rows)) : 0.0f;
  return Status::Ok();
}

Status SoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels, int64_t rows,
                                   int64_t classes, float scale, float* dlogits) {
  FERRY_RETURN_IF_ERROR(
      internal::CheckSoftmaxCrossEntropyBackward(probs, labels, rows, classes, dlogits));
  FERRY_RETURN_IF_ERROR(CheckLabels("SoftmaxCrossEntropyBackward", labels, rows, classes));
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = probs + r * classes;
    float* d = dlogits + r * classes;
    for (int64_t c = 0; c < classes; ++c) {
      d[c] = scale * (p[c] - (c == labels[r] ? 1.0f : 0.0f));
    }
  }
  return Status::Ok();
}

}  // namespace ferry::kernels::cpu
