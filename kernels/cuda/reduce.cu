// The mean of a device vector, in one block so that the order of the sum is fixed.
#include "cuda/common.h"
#include "cuda/reduce.cuh"

namespace ferry::kernels::cuda::detail {
namespace {

constexpr int kMeanBlock = 1024;

// Each thread sums a strided slice into kLanes partial sums (element i goes to lane
// (i / blockDim) % kLanes, each in ascending order), adds them in lane order, then the block
// reduces the threads' sums: the order depends on n alone. The lanes keep kLanes loads in flight
// per thread (with one, SoftmaxCrossEntropyForward over 4M rows took 2.77 ms on an H100, its
// backward 0.60 ms: bench/RESULTS.md); a batch's mean, over a few thousand rows, is short either
// way. Tested over 10007 values (both loops).
constexpr int kLanes = 4;

__global__ void MeanKernel(const float* x, int64_t n, float* mean) {
  __shared__ float shared[kWarp];
  float lanes[kLanes] = {};
  const int64_t stride = blockDim.x;
  int64_t i = threadIdx.x;
  for (; i + (kLanes - 1) * stride < n; i += kLanes * stride) {
#pragma unroll
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[i + l * stride];
  }
#pragma unroll
  for (int l = 0; l < kLanes; ++l) {
    if (i + l * stride < n) lanes[l] += x[i + l * stride];
  }
  float sum = 0.0f;
#pragma unroll
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
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
