// CUDA softmax cross-entropy forward and backward.
#include "cuda/common.h"
#include "cuda/reduce.cuh"
#include "internal/shapes.h"

namespace ferry::kernels::cuda {
namespace {

// Wide rows, one block each: the row max, the sum of exp(x - max), then probs and the loss.
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

// Narrow rows (classes <= kWarpRowClasses, the MLP's 10): one warp per row, kWarpRows rows per
// block (blockDim = (32, kWarpRows)). A block per row would leave most of its threads idle and
// launch a block per row: on an H100, 4M rows of 10 classes took 4.0 ms forward and 2.5 ms
// backward that way, 3% and 5% of the memory bandwidth (bench/RESULTS.md, "The CUDA half").
constexpr int kWarpRows = 8;
constexpr int64_t kWarpRowClasses = 128;

__global__ void SoftmaxCrossEntropyForwardWarpKernel(const float* logits, const int32_t* labels,
                                                     int64_t rows, int64_t classes, float* probs,
                                                     float* row_loss) {
  const int64_t row = blockIdx.x * int64_t{kWarpRows} + threadIdx.y;
  if (row >= rows) return;  // the whole warp: row is the warp's
  const float* x = logits + row * classes;
  float* p = probs + row * classes;
  float max = -INFINITY;
  for (int64_t c = threadIdx.x; c < classes; c += detail::kWarp) max = fmaxf(max, x[c]);
  max = detail::WarpReduceMax(max);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < classes; c += detail::kWarp) sum += expf(x[c] - max);
  sum = detail::WarpReduceSum(sum);
  for (int64_t c = threadIdx.x; c < classes; c += detail::kWarp) p[c] = expf(x[c] - max) / sum;
  if (threadIdx.x == 0) {
    const int32_t label = labels[row];
    row_loss[row] = label >= 0 && label < classes ? logf(sum) - (x[label] - max) : NAN;
  }
}

__global__ void SoftmaxCrossEntropyBackwardWarpKernel(const float* probs, const int32_t* labels,
                                                      int64_t rows, int64_t classes, float scale,
                                                      float* dlogits) {
  const int64_t row = blockIdx.x * int64_t{kWarpRows} + threadIdx.y;
  if (row >= rows) return;
  const int32_t label = labels[row];
  const bool valid = label >= 0 && label < classes;
  const float* p = probs + row * classes;
  float* d = dlogits + row * classes;
  for (int64_t c = threadIdx.x; c < classes; c += detail::kWarp) {
    d[c] = valid ? scale * (p[c] - (c == label ? 1.0f : 0.0f)) : NAN;
  }
}

unsigned int WarpRowGrid(int64_t rows) {
  return static_cast<unsigned int>((rows + kWarpRows - 1) / kWarpRows);
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
  if (rows > 0 && classes <= kWarpRowClasses) {
    SoftmaxCrossEntropyForwardWarpKernel<<<WarpRowGrid(rows), dim3(detail::kWarp, kWarpRows), 0,
                                           stream>>>(logits, labels, rows, classes, probs,
                                                     row_loss);
    FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(kOp, SoftmaxCrossEntropyForwardWarpKernel);
  } else if (rows > 0) {
    SoftmaxCrossEntropyForwardKernel<<<static_cast<unsigned int>(rows), BlockForClasses(classes),
                                       0, stream>>>(logits, labels, classes, probs, row_loss);
    FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(kOp, SoftmaxCrossEntropyForwardKernel);
  }
  return detail::LaunchMean(kOp, row_loss, rows, mean_loss, stream);
}

Status LaunchSoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels, int64_t rows,
                                         int64_t classes, float scale, float* dlogits,
                                         cudaStream_t stream) {
  if (classes <= kWarpRowClasses) {
    SoftmaxCrossEntropyBackwardWarpKernel<<<WarpRowGrid(rows), dim3(detail::kWarp, kWarpRows), 0,
                                            stream>>>(probs, labels, rows, classes, scale, dlogits);
    FERRY_CUDA_RETURN_IF_LAUNCH_FAILED("SoftmaxCrossEntropyBackward",
                                       SoftmaxCrossEntropyBackwardWarpKernel);
    return Status::Ok();
  }
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
