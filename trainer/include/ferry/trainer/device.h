// ferry/trainer/device.h — where a worker's forward and backward run: the CPU (the reference
// ops of ferry/kernels.h on host memory) or one CUDA GPU (ferry/kernels_cuda.h on device memory,
// one stream, one cuBLAS handle, pinned host staging buffers).
//
// Contract:
//  - Device buffers (Alloc) are what the ops take; host buffers (AllocHost) are what the CPU
//    reads and writes (pinned on CUDA, so copies are true DMA). On the CPU backend both are plain
//    host memory.
//  - Ops and copies are enqueued in order on the device's one stream and may return before they
//    ran (CUDA); Synchronize() waits for all of them and reports a fault from a running kernel.
//    A host buffer given to a copy must stay valid and untouched until Synchronize(). The CPU
//    backend runs everything at once.
//  - Every failure is a Status: caller mistakes as in ferry/kernels.h, CUDA/cuBLAS failures as
//    INTERNAL (RESOURCE_EXHAUSTED for out of memory, UNAVAILABLE for no device) naming the call.
//  - This header includes no CUDA header.
//
// Thread-safety: a Device is not thread-safe; one per worker thread. Buffers are owned by their
// DeviceBuffer (RAII) and must be destroyed before the Device that made them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "ferry/kernels.h"
#include "ferry/status.h"
#include "ferry/trainer/options.h"

namespace ferry::trainer {

// An owned allocation (device memory, pinned host memory or plain host memory).
class DeviceBuffer {
 public:
  using FreeFn = void (*)(void*);
  DeviceBuffer() = default;
  DeviceBuffer(void* ptr, int64_t bytes, FreeFn free_fn) : ptr_(ptr), bytes_(bytes), free_(free_fn) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      free_ = std::exchange(o.free_, nullptr);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  void* data() const { return ptr_; }
  int64_t bytes() const { return bytes_; }

 private:
  void Reset() {
    if (ptr_ != nullptr && free_ != nullptr) free_(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
  FreeFn free_ = nullptr;
};

// The time a device spent on the work enqueued so far, by kind: each copy and each op timed on the
// device itself, between two CUDA events around it, so the time from one call's end to the next
// call's begin counts in none. A call's time starts at its begin event: where the device waits
// there for the host to launch the call (small calls), that wait counts, and the figure measures
// launches rather than kernels. Measured only by a CUDA device with timing on
// (FERRY_DEVICE_TIMING=1 in its environment when it is created): an event pair per call costs the
// host a few microseconds. Summed at each Synchronize().
struct DeviceTimes {
  bool measured = false;
  double h2d_s = 0, d2h_s = 0, compute_s = 0;  // copies host->device, device->host; kernels and GEMMs
  int64_t h2d_bytes = 0, d2h_bytes = 0;
  int64_t pageable_bytes = 0;  // of those copies, the bytes whose host side was not pinned
  int64_t ops = 0;             // calls timed
  struct Op {
    double s = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Op> by_op;  // the same time by call: "Gemm", "Dedup", "h2d", ...
};

class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda:N (<GPU name>)".
  virtual std::string name() const = 0;
  virtual bool is_cuda() const = 0;

  // `bytes` (>= 0) of device memory / of host memory for staging (pinned on CUDA). Contents are
  // unspecified. A zero-byte request gives an empty buffer.
  virtual StatusOr<DeviceBuffer> Alloc(int64_t bytes) = 0;
  virtual StatusOr<DeviceBuffer> AllocHost(int64_t bytes) = 0;

  // Enqueued copies between host and device memory (see the contract above).
  virtual Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) = 0;
  virtual Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) = 0;
  // Waits for everything enqueued so far.
  virtual Status Synchronize() = 0;
  // What the device has measured of its work up to the last Synchronize() (see DeviceTimes).
  virtual DeviceTimes times() const { return {}; }

  // The ops of ferry/kernels.h, on device pointers (see there for what each computes).
  virtual Status Gemm(kernels::Transpose trans_a, kernels::Transpose trans_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                      int64_t ldb, float beta, float* c, int64_t ldc) = 0;
  virtual Status BiasAdd(const float* bias, int64_t rows, int64_t cols, float* x) = 0;
  virtual Status BiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias) = 0;
  virtual Status ReluForward(const float* x, int64_t n, float* y) = 0;
  virtual Status ReluBackward(const float* y, const float* dy, int64_t n, float* dx) = 0;
  virtual Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels,
                                            int64_t rows, int64_t classes, float* probs,
                                            float* row_loss, float* mean_loss) = 0;
  virtual Status SoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels,
                                             int64_t rows, int64_t classes, float scale,
                                             float* dlogits) = 0;
  virtual Status SigmoidCrossEntropyForward(const float* logits, const float* targets, int64_t n, float* loss,
                                            float* mean_loss, float* probs) = 0;
  virtual Status SigmoidCrossEntropyBackward(const float* logits, const float* targets, int64_t n, float scale,
                                             float* dlogits) = 0;
  virtual Status EmbeddingBagForward(const float* table, int64_t num_rows, int64_t dim, const int32_t* offsets,
                                     const int32_t* indices, int64_t batch, int64_t nnz, kernels::Pooling pooling,
                                     float* out) = 0;
  // The CUDA backend keeps the scratch memory this op needs and grows it when a call needs more
  // (the one allocation an op may make; it happens on the first steps only).
  virtual Status EmbeddingBagBackward(const float* dout, int64_t dim, const int32_t* offsets, const int32_t* inverse,
                                      int64_t batch, int64_t nnz, int64_t num_unique, kernels::Pooling pooling,
                                      float* grads) = 0;
  // Dedup of ferry/kernels.h on device pointers: the distinct ids of ids[0, n), ascending, into
  // unique_ids; inverse[i] = the position of ids[i] among them; *num_unique (device memory, one
  // int32) = how many. Both backends give the same outputs exactly. The CUDA backend keeps the
  // scratch memory it needs, as for EmbeddingBagBackward.
  virtual Status Dedup(const int64_t* ids, int64_t n, int64_t* unique_ids, int32_t* inverse, int32_t* num_unique) = 0;
};

// The CPU backend.
std::unique_ptr<Device> CreateCpuDevice();

// kCpu: the CPU backend. kCuda: GPU `gpu` (FAILED_PRECONDITION when this build has no CUDA,
// UNAVAILABLE when there is no such device). kAuto: CUDA GPU `gpu` when the build has CUDA and
// cudaGetDeviceCount() > 0, else the CPU; `*choice` (if not null) gets a line saying which and why.
StatusOr<std::unique_ptr<Device>> CreateDevice(DeviceKind kind, int gpu, std::string* choice = nullptr);

}  // namespace ferry::trainer
