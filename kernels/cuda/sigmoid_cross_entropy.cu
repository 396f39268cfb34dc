// CUDA sigmoid binary cross-entropy with logits, forward and backward.
#include "cuda/common.h"
#include "internal/shapes.h"

namespace ferry::kernels::cuda {
namespace {

// As the CPU twin: never exponentiates a positive number.
__device__ __forceinline__ float Sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

__global__ void SigmoidCrossEntropyForwardKernel(const float* logits, const float* targets,
                                                 int64_t n, float* loss, float* probs) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = logits[i];
    loss[i] = fmaxf(x, 0.0f) - x * targets[i] + log1pf(expf(-fabsf(x)));
    if (probs != nullptr) probs[i] = Sigmoid(x);
  }
}

__global__ void SigmoidCrossEntropyBackwardKernel(const float* logits, const float* targets,
                                                  int64_t n, float scale, float* dlogits) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dlogits[i] = scale * (Sigmoid(logits[i]) - targets[i]);
  }
}

Status LaunchSigmoidCrossEntropyForward(const float* logits, const float* targets, int64_t n,
                                        float* loss, float* mean_loss, float* probs,
                                        cudaStream_t stream) {
  constexpr const char* kOp = "SigmoidCrossEntropyForward";
  if (n > 0) {
    SigmoidCrossEntropyForwardKernel<<<detail::GridFor(n), detail::kBlock, 0, stream>>>(
        logits, targets, n, loss, probs);
    FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(kOp, SigmoidCrossEntropyForwardKernel);
  }
  return detail::LaunchMean(kOp, loss, n, mean_loss, stream);
}

Status LaunchSigmoidCrossEntropyBackward(const float* logits, const float* targets, int64_t n,
                                         float scale, float* dlogits, cudaStream_t stream) {
  SigmoidCrossEntropyBackwardKernel<<<detail::GridFor(n), detail::kBlock, 0, stream>>>(
      logits, targets, n, scale, dlogits);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED("SigmoidCrossEntropyBackward",
                                     SigmoidCrossEntropyBackwardKernel);
  return Status::Ok();
}

}  // namespace

Status SigmoidCrossEntropyForward(const float* logits, const float* targets, int64_t n,
                                  float* loss, float* mean_loss, float* probs,
                                  cudaStream_t stream) {
  FERRY_RETURN_IF_ERROR(
      internal::CheckSigmoidCrossEntropyForward(logits, targets, n, loss, mean_loss));
  FERRY_RETURN_IF_ERROR(detail::CheckStream("SigmoidCrossEntropyForward", stream));
  return LaunchSigmoidCrossEntropyForward(logits, targets, n, loss, mean_loss, probs, stream);
}

Status SigmoidCrossEntropyBackward(const float* logits, const float* targets, int64_t n,
                                   float scale, float* dlogits, cudaStream_t stream) {
  FERRY_RETURN_IF_ERROR(internal::CheckSigmoidCrossEntropyBackward(logits, targets, n, dlogits));
  FERRY_RETURN_IF_ERROR(detail::CheckStream("SigmoidCrossEntropyBackward", stream));
  if (n == 0) return Status::Ok();
  return LaunchSigmoidCrossEntropyBackward(logits, targets, n, scale, dlogits, stream);
}

}  // namespace ferry::kernels::cuda
