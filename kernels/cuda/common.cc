// CUDA error mapping, stream and scratch checks, DeviceCount.
#include "cuda/common.h"

#include <string>

namespace ferry::kernels::cuda {
namespace detail {

Status CudaStatus(cudaError_t error, const char* op, const char* call) {
  std::string message = std::string(op) + ": " + call + " failed: " + cudaGetErrorName(error) +
                        ": " + cudaGetErrorString(error);
  switch (error) {
    case cudaErrorMemoryAllocation:
      return ResourceExhaustedError(std::move(message));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return UnavailableError(std::move(message));
    default:
      return InternalError(std::move(message));
  }
}

Status CheckStream(const char* op, cudaStream_t stream) {
  if (stream == nullptr) {
    return InvalidArgumentError(std::string(op) +
                                ": stream is null (the implicit default stream); pass a stream "
                                "you created, or cudaStreamPerThread");
  }
  return Status::Ok();
}

Status CheckScratch(const char* op, const size_t* scratch_bytes, size_t needed) {
  if (*scratch_bytes < needed) {
    return InvalidArgumentError(std::string(op) + ": scratch holds " +
                                std::to_string(*scratch_bytes) + " bytes, needs " +
                                std::to_string(needed) + " (query it with scratch == nullptr)");
  }
  return Status::Ok();
}

}  // namespace detail

StatusOr<int> DeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) {
    static_cast<void>(cudaGetLastError());  // Not sticky; leave no error behind for the caller.
    return 0;
  }
  if (error != cudaSuccess) return detail::CudaStatus(error, "DeviceCount", "cudaGetDeviceCount");
  return count;
}

}  // namespace ferry::kernels::cuda
