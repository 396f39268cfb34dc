// CUDA ReLU forward and backward.
#include "cuda/common.h"
#include "internal/shapes.h"

namespace ferry::kernels::cuda {
namespace {

__global__ void ReluForwardKernel(const float* x, int64_t n, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
}

__global__ void ReluBackwardKernel(const float* y, const float* dy, int64_t n, float* dx) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }
}

Status LaunchReluForward(const float* x, int64_t n, float* y, cudaStream_t stream) {
  ReluForwardKernel<<<detail::GridFor(n), detail::kBlock, 0, stream>>>(x, n, y);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED("ReluForward", ReluForwardKernel);
  return Status::Ok();
}

Status LaunchReluBackward(const float* y, const float* dy, int64_t n, float* dx,
                          cudaStream_t stream) {
  ReluBackwardKernel<<<detail::GridFor(n), detail::kBlock, 0, stream>>>(y, dy, n, dx);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED("ReluBackward", ReluBackwardKernel);
  return Status::Ok();
}

}  // namespace

Status ReluForward(const float* x, int64_t n, float* y, cudaStream_t stream) {
  FERRY_RETURN_IF_ERROR(internal::CheckReluForward(x, n, y));
  FERRY_RETURN_IF_ERROR(detail::CheckStream("ReluForward", stream));
  if (n == 0) return Status::Ok();
  return LaunchReluForward(x, n, y, stream);
}

Status ReluBackward(const float* y, const float* dy, int64_t n, float* dx, cudaStream_t stream) {
  FERRY_RETURN_IF_ERROR(internal::CheckReluBackward(y, dy, n, dx));
  FERRY_RETURN_IF_ERROR(detail::CheckStream("ReluBackward", stream));
  if (n == 0) return Status::Ok();
  return LaunchReluBackward(y, dy, n, dx, stream);
}

}  // namespace ferry::kernels::cuda
