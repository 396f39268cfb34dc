// Block-wide reductions for the CUDA kernels, after ggml-cuda's warp_reduce_*: xor shuffles, so
// every lane ends with the same value and the order of operations depends on blockDim alone.
// Private to kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace ferry::kernels::cuda::detail {

inline constexpr int kWarp = 32;

__device__ __forceinline__ float WarpReduceSum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

__device__ __forceinline__ float WarpReduceMax(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Reduces v over a 1-D block whose size is a multiple of 32 (at most 1024); every thread gets the
// result. `shared` holds 32 floats; the call may be repeated with the same `shared`.
template <bool kMax>
__device__ __forceinline__ float BlockReduce(float v, float* shared) {
  v = kMax ? WarpReduceMax(v) : WarpReduceSum(v);
  const int warps = blockDim.x / kWarp;
  if (warps == 1) return v;
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  __syncthreads();  // A previous call may still be reading `shared`.
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const float identity = kMax ? -INFINITY : 0.0f;
  v = lane < warps ? shared[lane] : identity;
  return kMax ? WarpReduceMax(v) : WarpReduceSum(v);
}

__device__ __forceinline__ float BlockReduceSum(float v, float* shared) {
  return BlockReduce<false>(v, shared);
}
__device__ __forceinline__ float BlockReduceMax(float v, float* shared) {
  return BlockReduce<true>(v, shared);
}

}  // namespace ferry::kernels::cuda::detail
