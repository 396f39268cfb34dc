// CUDA bias add and bias gradient.
#include "cuda/common.h"
#include "internal/shapes.h"

namespace ferry::kernels::cuda {
namespace {

// x[r][c] += bias[c]: blockIdx.x/threadIdx.x walk the columns, blockIdx.y strides over the rows,
// so no element index needs a division.
__global__ void BiasAddKernel(const float* bias, int64_t rows, int64_t cols, float* x) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= cols) return;
  const float b = bias[c];
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) x[r * cols + c] += b;
}

// dbias[c] = sum over r of dy[r][c]. A block owns kGradCols columns; its kGradRowLanes rows of
// threads sum every kGradRowLanes-th row in ascending order, and row lane 0 adds their partial sums
// in lane order. No atomics: the order depends on the shapes only.
constexpr int kGradCols = 32;
constexpr int kGradRowLanes = 16;

__global__ void BiasGradKernel(const float* dy, int64_t rows, int64_t cols, float* dbias) {
  __shared__ float partial[kGradRowLanes][kGradCols + 1];
  const int64_t c = blockIdx.x * int64_t{kGradCols} + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kGradRowLanes) sum += dy[r * cols + c];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
#pragma unroll
    for (int lane = 0; lane < kGradRowLanes; ++lane) total += partial[lane][threadIdx.x];
    dbias[c] = total;
  }
}

Status LaunchBiasAdd(const float* bias, int64_t rows, int64_t cols, float* x,
                     cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>((cols + detail::kBlock - 1) / detail::kBlock),
                  static_cast<unsigned int>(std::min<int64_t>(rows, 65535)));
  BiasAddKernel<<<grid, detail::kBlock, 0, stream>>>(bias, rows, cols, x);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED("BiasAdd", BiasAddKernel);
  return Status::Ok();
}

Status LaunchBiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias,
                      cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>((cols + kGradCols - 1) / kGradCols));
  const dim3 block(kGradCols, kGradRowLanes);
  BiasGradKernel<<<grid, block, 0, stream>>>(dy, rows, cols, dbias);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED("BiasGrad", BiasGradKernel);
  return Status::Ok();
}

}  // namespace

Status BiasAdd(const float* bias, int64_t rows, int64_t cols, float* x, cudaStream_t stream) {
  FERRY_RETURN_IF_ERROR(internal::CheckBiasAdd(bias, rows, cols, x));
  FERRY_RETURN_IF_ERROR(detail::CheckStream("BiasAdd", stream));
  if (rows == 0 || cols == 0) return Status::Ok();
  return LaunchBiasAdd(bias, rows, cols, x, stream);
}

Status BiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias, cudaStream_t stream) {
  FERRY_RETURN_IF_ERROR(internal::CheckBiasGrad(dy, rows, cols, dbias));
  FERRY_RETURN_IF_ERROR(detail::CheckStream("BiasGrad", stream));
  if (cols == 0) return Status::Ok();
  return LaunchBiasGrad(dy, rows, cols, dbias, stream);  // rows == 0 writes zeros.
}

}  // namespace ferry::kernels::cuda
