// CUDA softmax cross-entropy forward and backward.
#include "cuda/common.h"
#include "cuda/reduce.cuh"
#include "internal/shapes.h"

namespace ferry::kernels::cuda {
namespace {

// One block per row: the row max, the sum of exp(x - max), then probs and the row's loss.
__global__ void SoftmaxCrossEntropyForwardKernel(const float* logits, const int32_t* labels,
                                                 int64_t classes, float* probs,
                                                 float* row_loss) {
  __shared__ float shared[detail::kWarp];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * classes;
  float* p = probs + row * classes;

  float max = -INFINITY;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) max = fmaxf(max, x[c]);
  max = detail::BlockReduceMax(max, shared);

  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) sum += expf(x[c] - max);
  sum = detail::BlockReduceSum(sum, shared);

  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) p[c] = expf(x[c] - max) / sum;
  if (threadIdx.x == 0) {
    const int32_t label = labels[row];
    row_loss[row] = label >= 0 && label < classes ? logf(sum) - (x[label] - max) : NAN;
  }
}

__global__ void SoftmaxCrossEntropyBackwardKernel(const float* probs, const int32_t* labels,
                                                  int64_t classes, float scale,
                                                  float* dlogits) {
  const int64_t row = blockIdx.x;
  const int32_t label = labels[row];
  const bool valid = label >= 0 && label < classes;
  const float* p = probs + row * classes;
  float* d = dlogits + row * classes;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    d[c] = valid ? scale * (p[c] - (c == label ? 1.0f : 0.0f)) : NAN;
  }
}

// Enough threads for the row, in whole warps, at most 256 (ggml's softmax does likewise).
unsigned int BlockForClasses(int64_t classes) {
  unsigned int block = detail::kWarp;
  while (block < 256 && block < classes) block *= 2;
  return block;
}

Status LaunchSoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t rows,
                                        int64_t classes, float* probs, float* row_loss,
                                        float* mean_loss, cudaStream_t stream) {
  constexpr const char* kOp = "SoftmaxCrossEntropyForward";
  if (rows > 0) {
    SoftmaxCrossEntropyForwardKernel<<<static_cast<unsigned int>(rows), BlockForClasses(classes),
                                       0, stream>>>(logits, labels, classes, probs, row_loss);
    FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(kOp, SoftmaxCrossEntropyForwardKernel);
  }
  return detail::LaunchMean(kOp, row_loss, rows, mean_loss, stream);
}

Status LaunchSoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels, int64_t rows,
                                         int64_t classes, float scale, float* dlogits,
                                         cudaStream_t stream) {
  SoftmaxCrossEntropyBackwardKernel<<<static_cast<unsigned int>(rows), BlockForClasses(classes), 0,
                                      stream>>>(probs, labels, classes, scale, dlogits);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED("SoftmaxCrossEntropyBackward",
                                     SoftmaxCrossEntropyBackwardKernel);
  return Status::Ok();
}

}  // namespace

Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t rows,
                                  int64_t classes, float* probs, float* row_loss,
                                  float* mean_loss, cudaStream_t stream) {
  FERRY_RETURN_IF_ERROR(internal::CheckSoftmaxCrossEntropyForward(logits, labels, rows, classes,
                                                                  probs, row_loss, mean_loss));
  FERRY_RETURN_IF_ERROR(detail::CheckStream("SoftmaxCrossEntropyForward", stream));
  return LaunchSoftmaxCrossEntropyForward(logits, labels, rows, classes, probs, row_loss,
                                          mean_loss, stream);
}

Status SoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels, int64_t rows,
                                   int64_t classes, float scale, float* dlogits,
                                   cudaStream_t stream) {
  FERRY_RETURN_IF_ERROR(
      internal::CheckSoftmaxCrossEntropyBackward(probs, labels, rows, classes, dlogits));
  FERRY_RETURN_IF_ERROR(detail::CheckStream("SoftmaxCrossEntropyBackward", stream));
  if (rows == 0) return Status::Ok();
  return LaunchSoftmaxCrossEntropyBackward(probs, labels, rows, classes, scale, dlogits, stream);
}

}  // namespace ferry::kernels::cuda
