// Host-side helpers shared by the CUDA twins: CUDA error -> Status, stream and scratch checks,
// launch geometry, scratch layout. Private to kernels/.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>

#include "ferry/kernels_cuda.h"
#include "ferry/status.h"

namespace ferry::kernels::cuda::detail {

// "<op>: <call> failed: <cudaErrorName>: <description>"; RESOURCE_EXHAUSTED for out-of-memory,
// UNAVAILABLE for no device or driver, INTERNAL otherwise.
Status CudaStatus(cudaError_t error, const char* op, const char* call);

// The entry point's stream must be explicit: null is the implicit legacy default stream.
Status CheckStream(const char* op, cudaStream_t stream);

// Two-phase scratch, second phase: the caller's buffer must hold `needed` bytes.
Status CheckScratch(const char* op, const size_t* scratch_bytes, size_t needed);

// Threads per block for the 1-D kernels, and the largest grid they launch (they stride beyond).
inline constexpr int kBlock = 256;
inline constexpr int64_t kMaxGrid = int64_t{1} << 20;

inline unsigned int GridFor(int64_t n, int block = kBlock) {
  return static_cast<unsigned int>(std::clamp<int64_t>((n + block - 1) / block, 1, kMaxGrid));
}

// Sub-buffers carved from one caller-provided scratch buffer. Each starts 256-byte aligned
// (what CUB asks for), whatever the alignment of the buffer itself: bytes() includes the slack.
class ScratchLayout {
 public:
  // Reserves `bytes` and returns the sub-buffer's index.
  int Reserve(size_t bytes) {
    assert(count_ < kMaxBuffers);
    offsets_[count_] = total_;
    total_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return count_++;
  }
  size_t bytes() const { return total_ + kAlign; }
  template <typename T>
  T* Get(void* scratch, int index) const {
    const uintptr_t base = (reinterpret_cast<uintptr_t>(scratch) + kAlign - 1) / kAlign * kAlign;
    return reinterpret_cast<T*>(base + offsets_[index]);
  }

 private:
  static constexpr size_t kAlign = 256;
  static constexpr int kMaxBuffers = 8;
  size_t offsets_[kMaxBuffers] = {};
  size_t total_ = 0;
  int count_ = 0;
};

// mean[0] = sum(x[0 .. n)) / n (0 when n == 0), one block, fixed order: deterministic.
// Defined in reduce.cu.
Status LaunchMean(const char* op, const float* x, int64_t n, float* mean, cudaStream_t stream);

}  // namespace ferry::kernels::cuda::detail

// Returns the CUDA call's failure from the enclosing function as a Status.
#define FERRY_CUDA_RETURN_IF_ERROR(op, call)                                                \
  do {                                                                                      \
    const cudaError_t ferry_cuda_error_ = (call);                                           \
    if (ferry_cuda_error_ != cudaSuccess) {                                                 \
      return ::ferry::kernels::cuda::detail::CudaStatus(ferry_cuda_error_, (op), #call); \
    }                                                                                       \
  } while (0)

// After a <<<...>>> launch of `kernel`: a bad configuration, or an earlier sticky error.
#define FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(op, kernel)                                        \
  do {                                                                                        \
    const cudaError_t ferry_cuda_error_ = cudaGetLastError();                                 \
    if (ferry_cuda_error_ != cudaSuccess) {                                                   \
      return ::ferry::kernels::cuda::detail::CudaStatus(ferry_cuda_error_, (op),            \
                                                          "launching " #kernel);              \
    }                                                                                         \
  } while (0)
