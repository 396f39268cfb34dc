// The CUDA backend of ferry::trainer::Device (compiled only when FERRY_HAVE_CUDA).
// Not exercised on machines without a GPU: it compiles everywhere nvcc does.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

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
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&dev->stream_, cudaStreamNonBlocking));
    FERRY_RETURN_IF_ERROR(CublasStatus(cublasCreate(&dev->cublas_), "cublasCreate"));
    FERRY_RETURN_IF_ERROR(CublasStatus(cublasSetStream(dev->cublas_, dev->stream_), "cublasSetStream"));
    return std::unique_ptr<Device>(std::move(dev));
  }

  ~CudaDevice() override {
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
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
    FERRY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
    return Status::Ok();
  }
  Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return Status::Ok();
    FERRY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_));
    return Status::Ok();
  }
  Status Synchronize() override {
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    FERRY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  }

  Status Gemm(kernels::Transpose ta, kernels::Transpose tb, int64_t m, int64_t n, int64_t kk, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) override {
    return k::Gemm(cublas_, ta, tb, m, n, kk, alpha, a, lda, b, ldb, beta, c, ldc, stream_);
  }
  Status BiasAdd(const float* bias, int64_t rows, int64_t cols, float* x) override {
    return k::BiasAdd(bias, rows, cols, x, stream_);
  }
  Status BiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias) override {
    return k::BiasGrad(dy, rows, cols, dbias, stream_);
  }
  Status ReluForward(const float* x, int64_t n, float* y) override { return k::ReluForward(x, n, y, stream_); }
  Status ReluBackward(const float* y, const float* dy, int64_t n, float* dx) override {
    return k::ReluBackward(y, dy, n, dx, stream_);
  }
  Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                    float* probs, float* row_loss, float* mean_loss) override {
    return k::SoftmaxCrossEntropyForward(logits, labels, rows, classes, probs, row_loss, mean_loss, stream_);
  }
  Status SoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels, int64_t rows, int64_t classes,
                                     float scale, float* dlogits) override {
    return k::SoftmaxCrossEntropyBackward(probs, labels, rows, classes, scale, dlogits, stream_);
  }
  Status SigmoidCrossEntropyForward(const float* logits, const float* targets, int64_t n, float* loss,
                                    float* mean_loss, float* probs) override {
    return k::SigmoidCrossEntropyForward(logits, targets, n, loss, mean_loss, probs, stream_);
  }
  Status SigmoidCrossEntropyBackward(const float* logits, const float* targets, int64_t n, float scale,
                                     float* dlogits) override {
    return k::SigmoidCrossEntropyBackward(logits, targets, n, scale, dlogits, stream_);
  }
  Status EmbeddingBagForward(const float* table, int64_t num_rows, int64_t dim, const int32_t* offsets,
                             const int32_t* indices, int64_t batch, int64_t nnz, kernels::Pooling pooling,
                             float* out) override {
    return k::EmbeddingBagForward(table, num_rows, dim, offsets, indices, batch, nnz, pooling, out, stream_);
  }
  Status EmbeddingBagBackward(const float* dout, int64_t dim, const int32_t* offsets, const int32_t* inverse,
                              int64_t batch, int64_t nnz, int64_t num_unique, kernels::Pooling pooling,
                              float* grads) override {
    size_t need = 0;
    FERRY_RETURN_IF_ERROR(k::EmbeddingBagBackward(nullptr, &need, dout, dim, offsets, inverse, batch, nnz, num_unique,
                                                  pooling, grads, stream_));
    FERRY_RETURN_IF_ERROR(ScratchOf(need));
    size_t have = static_cast<size_t>(scratch_.bytes());
    return k::EmbeddingBagBackward(scratch_.data(), &have, dout, dim, offsets, inverse, batch, nnz, num_unique,
                                   pooling, grads, stream_);
  }

  Status Dedup(const int64_t* ids, int64_t n, int64_t* unique_ids, int32_t* inverse, int32_t* num_unique) override {
    size_t need = 0;
    FERRY_RETURN_IF_ERROR(k::Dedup(nullptr, &need, ids, n, unique_ids, inverse, num_unique, stream_));
    FERRY_RETURN_IF_ERROR(ScratchOf(need));
    size_t have = static_cast<size_t>(scratch_.bytes());
    return k::Dedup(scratch_.data(), &have, ids, n, unique_ids, inverse, num_unique, stream_);
  }

 private:
  CudaDevice(int gpu, std::string gpu_name) : gpu_(gpu), gpu_name_(std::move(gpu_name)) {}

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
};

}  // namespace

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int gpu) { return CudaDevice::Create(gpu); }

}  // namespace ferry::trainer::internal
