// CPU sigmoid binary cross-entropy with logits, forward and backward.
#include <cmath>

#include "ferry/kernels.h"
#include "internal/shapes.h"

namespace ferry::kernels::cpu {
namespace {

// Never exponentiates a positive number, so it neither overflows nor loses the small tail.
float Sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

}  // namespace

Status SigmoidCrossEntropyForward(const float* logits, const float* targets, int64_t n,
                                  float* loss, float* mean_loss, float* probs) {
  FERRY_RETURN_IF_ERROR(
      internal::CheckSigmoidCrossEntropyForward(logits, targets, n, loss, mean_loss));
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = logits[i];
    loss[i] = std::fmax(x, 0.0f) - x * targets[i] + std::log1p(std::exp(-std::fabs(x)));
    total += loss[i];
    if (probs != nullptr) probs[i] = Sigmoid(x);
  }
  mean_loss[0] = n > 0 ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
  return Status::Ok();
}

Status SigmoidCrossEntropyBackward(const float* logits, const float* targets, int64_t n,
                                   float scale, float* dlogits) {
  FERRY_RETURN_IF_ERROR(
      internal::CheckSigmoidCrossEntropyBackward(logits, targets, n, dlogits));
  for (int64_t i = 0; i < n; ++i) dlogits[i] = scale * (Sigmoid(logits[i]) - targets[i]);
  return Status::Ok();
}

}  // namespace ferry::kernels::cpu
