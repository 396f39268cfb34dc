// The mean of a device vector, in one block so that the order of the sum is fixed.
#include "cuda/common.h"
#include "cuda/reduce.cuh"

namespace ferry::kernels::cuda::detail {
namespace {

constexpr int kMeanBlock = 1024;

// Each thread sums a strided slice in ascending order, then the block reduces the partial sums.
__global__ void MeanKernel(const float* x, int64_t n, float* mean) {
  __shared__ float shared[kWarp];
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += x[i];
  sum = BlockReduceSum(sum, shared);
  if (threadIdx.x == 0) mean[0] = n > 0 ? sum / static_cast<float>(n) : 0.0f;
}

}  // namespace

Status LaunchMean(const char* op, const float* x, int64_t n, float* mean, cudaStream_t stream) {
  MeanKernel<<<1, kMeanBlock, 0, stream>>>(x, n, mean);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(op, MeanKernel);
  return Status::Ok();
}

}  // namespace ferry::kernels::cuda::detail
