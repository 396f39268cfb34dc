// The CUDA backend of ferry::trainer::Device (compiled only when FERRY_HAVE_CUDA).
// Not exercised on machines without a GPU: it compiles everywhere nvcc does.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ferry/kernels_cuda.h"
#include "ferry/trainer/device.h"
#include "internal/cuda_device.h"

namespace ferry::trainer::internal {
namespace {

namespace k = ferry::kernels::cuda;

Status CudaStatus(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return Status::Ok();
  std::string msg = std::string(call) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  if (err == cudaErrorMemoryAllocation) return ResourceExhaustedError(std::move(msg));
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return UnavailableError(std::move(msg));
  return InternalError(std::move(msg));
}

Status CublasStatus(cublasStatus_t st, const char* call) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  std::string msg = std::string(call) + ": cuBLAS status " + std::to_string(static_cast<int>(st));
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return ResourceExhaustedError(std::move(msg));
  return InternalError(std::move(msg));
}

#define FERRY_CUDA_RETURN_IF_ERROR(call) FERRY_RETURN_IF_ERROR(CudaStatus((call), #call))

// Deleters for DeviceBuffer; errors on free cannot be reported from a destructor.
void FreeDevice(void* p) { (void)cudaFree(p); }
void FreeHostPinned(void* p) { (void)cudaFreeHost(p); }

// Owns one stream and one cuBLAS handle on one GPU. All work goes to stream_.
class CudaDevice final : public Device {
 public:
  static StatusOr<std::unique_ptr<Device>> Create(int gpu) {
    FERRY_CUDA_RETURN_IF_ERROR(cudaSetDevice(gpu));
    cudaDeviceProp prop{};
    FERRY_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, gpu));
    std::unique_ptr<CudaDevice> dev(new CudaDevice(gpu, prop.name));
    const char* timing = std::getenv("FERRY_DEVICE_TIMING");
    dev->timing_ = timing != nullptr && *timing != '\0' && std::strcmp(timing, "0") != 0;
    dev->times_.measured = dev->timing_;
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&dev->stream_, cudaStreamNonBlocking));
    FERRY_RETURN_IF_ERROR(CublasStatus(cublasCreate(&dev->cublas_), "cublasCreate"));
    FERRY_RETURN_IF_ERROR(CublasStatus(cublasSetStream(dev->cublas_, dev->stream_), "cublasSetStream"));
    return std::unique_ptr<Device>(std::move(dev));
  }

  ~CudaDevice() override {
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    for (const Timed& t : pending_) {
      free_events_.push_back(t.begin);
      free_events_.push_back(t.end);
    }
    for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
    if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda:" + std::to_string(gpu_) + " (" + gpu_name_ + ")"; }
  bool is_cuda() const override { return true; }

  StatusOr<DeviceBuffer> Alloc(int64_t bytes) override {
    if (bytes < 0) return InvalidArgumentError("Alloc: negative size " + std::to_string(bytes));
    if (bytes == 0) return DeviceBuffer();
    void* p = nullptr;
    FERRY_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, static_cast<size_t>(bytes)));
    return DeviceBuffer(p, bytes, &FreeDevice);
  }
  StatusOr<DeviceBuffer> AllocHost(int64_t bytes) override {
    if (bytes < 0) return InvalidArgumentError("AllocHost: negative size " + std::to_string(bytes));
    if (bytes == 0) return DeviceBuffer();
    void* p = nullptr;
    FERRY_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, static_cast<size_t>(bytes)));
    return DeviceBuffer(p, bytes, &FreeHostPinned);
  }

  Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return Status::Ok();
    return Time(Kind::kH2d, "h2d", bytes, src, [&] {
      return CudaStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_),
                        "cudaMemcpyAsync (host to device)");
    });
  }
  Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return Status::Ok();
    return Time(Kind::kD2h, "d2h", bytes, dst, [&] {
      return CudaStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_),
                        "cudaMemcpyAsync (device to host)");
    });
  }
  Status Synchronize() override {
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    FERRY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return CollectTimes();
  }
  DeviceTimes times() const override { return times_; }

  Status Gemm(kernels::Transpose ta, kernels::Transpose tb, int64_t m, int64_t n, int64_t kk, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    return Compute("Gemm",
                   [&] { return k::Gemm(cublas_, ta, tb, m, n, kk, alpha, a, lda, b, ldb, beta, c, ldc, stream_); });
  }
  Status BiasAdd(const float* bias, int64_t rows, int64_t cols, float* x) override {
    return Compute("BiasAdd", [&] { return k::BiasAdd(bias, rows, cols, x, stream_); });
  }
  Status BiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias) override {
    return Compute("BiasGrad", [&] { return k::BiasGrad(dy, rows, cols, dbias, stream_); });
  }
  Status ReluForward(const float* x, int64_t n, float* y) override {
    return Compute("ReluForward", [&] { return k::ReluForward(x, n, y, stream_); });
  }
  Status ReluBackward(const float* y, const float* dy, int64_t n, float* dx) override {
    return Compute("ReluBackward", [&] { return k::ReluBackward(y, dy, n, dx, stream_); });
  }
  Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                    float* probs, float* row_loss, float* mean_loss) override {
    return Compute("SoftmaxCrossEntropyForward", [&] {
      return k::SoftmaxCrossEntropyForward(logits, labels, rows, classes, probs, row_loss, mean_loss, stream_);
    });
  }
  Status SoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels, int64_t rows, int64_t classes,
                                     float scale, float* dlogits) override {
    return Compute("SoftmaxCrossEntropyBackward", [&] {
      return k::SoftmaxCrossEntropyBackward(probs, labels, rows, classes, scale, dlogits, stream_);
    });
  }
  Status SigmoidCrossEntropyForward(const float* logits, const float* targets, int64_t n, float* loss, float* mean_loss,
                                    float* probs) override {
    return Compute("SigmoidCrossEntropyForward",
                   [&] { return k::SigmoidCrossEntropyForward(logits, targets, n, loss, mean_loss, probs, stream_); });
  }
  Status SigmoidCrossEntropyBackward(const float* logits, const float* targets, int64_t n, float scale,
                                     float* dlogits) override {
    return Compute("SigmoidCrossEntropyBackward",
                   [&] { return k::SigmoidCrossEntropyBackward(logits, targets, n, scale, dlogits, stream_); });
  }
  Status EmbeddingBagForward(const float* table, int64_t num_rows, int64_t dim, const int32_t* offsets,
                             const int32_t* indices, int64_t batch, int64_t nnz, kernels::Pooling pooling,
                             float* out) override {
    return Compute("EmbeddingBagForward", [&] {
      return k::EmbeddingBagForward(table, num_rows, dim, offsets, indices, batch, nnz, pooling, out, stream_);
    });
  }
  Status EmbeddingBagBackward(const float* dout, int64_t dim, const int32_t* offsets, const int32_t* inverse,
                              int64_t batch, int64_t nnz, int64_t num_unique, kernels::Pooling pooling,
                              float* grads) override {
    size_t need = 0;
    FERRY_RETURN_IF_ERROR(k::EmbeddingBagBackward(nullptr, &need, dout, dim, offsets, inverse, batch, nnz, num_unique,
                                                  pooling, grads, stream_));
    FERRY_RETURN_IF_ERROR(ScratchOf(need));
    size_t have = static_cast<size_t>(scratch_.bytes());
    return Compute("EmbeddingBagBackward", [&] {
      return k::EmbeddingBagBackward(scratch_.data(), &have, dout, dim, offsets, inverse, batch, nnz, num_unique,
                                     pooling, grads, stream_);
    });
  }

  Status Dedup(const int64_t* ids, int64_t n, int64_t* unique_ids, int32_t* inverse, int32_t* num_unique) override {
    size_t need = 0;
    FERRY_RETURN_IF_ERROR(k::Dedup(nullptr, &need, ids, n, unique_ids, inverse, num_unique, stream_));
    FERRY_RETURN_IF_ERROR(ScratchOf(need));
    size_t have = static_cast<size_t>(scratch_.bytes());
    return Compute("Dedup",
                   [&] { return k::Dedup(scratch_.data(), &have, ids, n, unique_ids, inverse, num_unique, stream_); });
  }

 private:
  enum class Kind { kH2d, kD2h, kCompute };
  struct Timed {
    cudaEvent_t begin, end;
    Kind kind;
    const char* op;  // a string literal
  };

  CudaDevice(int gpu, std::string gpu_name) : gpu_(gpu), gpu_name_(std::move(gpu_name)) {}

  template <typename Enqueue>
  Status Compute(const char* op, Enqueue&& enqueue) {
    return Time(Kind::kCompute, op, 0, nullptr, std::forward<Enqueue>(enqueue));
  }

  // Enqueues the call; with timing on, between two events on the stream (read at Synchronize).
  // `host` is a copy's host side (counted as pageable when it is not pinned).
  template <typename Enqueue>
  Status Time(Kind kind, const char* op, int64_t bytes, const void* host, Enqueue&& enqueue) {
    if (!timing_) return enqueue();
    FERRY_ASSIGN_OR_RETURN(cudaEvent_t begin, Event());
    StatusOr<cudaEvent_t> made = Event();
    if (!made.ok()) {
      free_events_.push_back(begin);
      return made.status();
    }
    const cudaEvent_t end = *made;
    pending_.push_back(Timed{begin, end, kind, op});
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventRecord(begin, stream_));
    if (Status enqueued = enqueue(); !enqueued.ok()) {  // nothing to time: its events go back unread
      pending_.pop_back();
      free_events_.push_back(begin);
      free_events_.push_back(end);
      return enqueued;
    }
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventRecord(end, stream_));
    if (kind == Kind::kCompute) return Status::Ok();
    (kind == Kind::kH2d ? times_.h2d_bytes : times_.d2h_bytes) += bytes;
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, host) != cudaSuccess || attributes.type == cudaMemoryTypeUnregistered) {
      static_cast<void>(cudaGetLastError());  // not sticky: an unregistered pointer is not an error here
      times_.pageable_bytes += bytes;
    }
    return Status::Ok();
  }

  StatusOr<cudaEvent_t> Event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    return e;
  }

  // After the stream has run everything: adds each timed call's device time to its kind.
  Status CollectTimes() {
    for (const Timed& t : pending_) {
      float ms = 0;
      const cudaError_t err = cudaEventElapsedTime(&ms, t.begin, t.end);
      free_events_.push_back(t.begin);
      free_events_.push_back(t.end);
      if (err != cudaSuccess) continue;  // its end event was never recorded (that record failed)
      const double s = ms / 1e3;
      ++times_.ops;
      DeviceTimes::Op& op = times_.by_op[t.op];
      op.s += s;
      ++op.calls;
      switch (t.kind) {
        case Kind::kH2d: times_.h2d_s += s; break;
        case Kind::kD2h: times_.d2h_s += s; break;
        case Kind::kCompute: times_.compute_s += s; break;
      }
    }
    pending_.clear();
    static_cast<void>(cudaGetLastError());
    return Status::Ok();
  }

  // Makes scratch_ at least `need` bytes. The ops that use it run in order on the one stream, so
  // they share it.
  Status ScratchOf(size_t need) {
    if (static_cast<int64_t>(need) <= scratch_.bytes()) return Status::Ok();
    // The old buffer may still be read by enqueued work: wait before freeing it.
    FERRY_RETURN_IF_ERROR(Synchronize());
    scratch_ = DeviceBuffer();
    FERRY_ASSIGN_OR_RETURN(scratch_, Alloc(static_cast<int64_t>(need) * 2));
    return Status::Ok();
  }

  const int gpu_;
  const std::string gpu_name_;
  DeviceBuffer scratch_;  // EmbeddingBagBackward's and Dedup's; grows when a call needs more
  cudaStream_t stream_ = nullptr;    // owned; destroyed in the destructor
  cublasHandle_t cublas_ = nullptr;  // owned; bound to stream_
  bool timing_ = false;               // FERRY_DEVICE_TIMING: every call between two events
  DeviceTimes times_;
  std::vector<Timed> pending_;            // timed calls not yet read (since the last Synchronize)
  std::vector<cudaEvent_t> free_events_;  // owned
};

}  // namespace

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int gpu) { return CudaDevice::Create(gpu); }

}  // namespace ferry::trainer::internal
