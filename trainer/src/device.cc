#include "ferry/trainer/device.h"

#include <cstdlib>
#include <cstring>

#include "ferry/kernels.h"
#if defined(FERRY_HAVE_CUDA)
#include "ferry/kernels_cuda.h"
#include "internal/cuda_device.h"
#endif

namespace ferry::trainer {
namespace {

namespace k = ferry::kernels::cpu;

// The CPU backend: host memory everywhere, every call runs at once.
class CpuDevice final : public Device {
 public:
  std::string name() const override { return "cpu"; }
  bool is_cuda() const override { return false; }

  StatusOr<DeviceBuffer> Alloc(int64_t bytes) override {
    if (bytes < 0) return InvalidArgumentError("Alloc: negative size " + std::to_string(bytes));
    if (bytes == 0) return DeviceBuffer();
    const int64_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc needs a multiple of the alignment
    void* p = std::aligned_alloc(64, static_cast<size_t>(rounded));
    if (p == nullptr) return ResourceExhaustedError("Alloc: " + std::to_string(bytes) + " bytes of host memory");
    return DeviceBuffer(p, bytes, &std::free);
  }
  StatusOr<DeviceBuffer> AllocHost(int64_t bytes) override { return Alloc(bytes); }

  Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return Status::Ok();
  }
  Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return Status::Ok();
  }
  Status Synchronize() override { return Status::Ok(); }

  Status Gemm(kernels::Transpose ta, kernels::Transpose tb, int64_t m, int64_t n, int64_t kk, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) override {
    return k::Gemm(ta, tb, m, n, kk, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  Status BiasAdd(const float* bias, int64_t rows, int64_t cols, float* x) override {
    return k::BiasAdd(bias, rows, cols, x);
  }
  Status BiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias) override {
    return k::BiasGrad(dy, rows, cols, dbias);
  }
  Status ReluForward(const float* x, int64_t n, float* y) override { return k::ReluForward(x, n, y); }
  Status ReluBackward(const float* y, const float* dy, int64_t n, float* dx) override {
    return k::ReluBackward(y, dy, n, dx);
  }
  Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                    float* probs, float* row_loss, float* mean_loss) override {
    return k::SoftmaxCrossEntropyForward(logits, labels, rows, classes, probs, row_loss, mean_loss);
  }
  Status SoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels, int64_t rows, int64_t classes,
                                     float scale, float* dlogits) override {
    return k::SoftmaxCrossEntropyBackward(probs, labels, rows, classes, scale, dlogits);
  }
  Status SigmoidCrossEntropyForward(const float* logits, const float* targets, int64_t n, float* loss,
                                    float* mean_loss, float* probs) override {
    return k::SigmoidCrossEntropyForward(logits, targets, n, loss, mean_loss, probs);
  }
  Status SigmoidCrossEntropyBackward(const float* logits, const float* targets, int64_t n, float scale,
                                     float* dlogits) override {
    return k::SigmoidCrossEntropyBackward(logits, targets, n, scale, dlogits);
  }
  Status EmbeddingBagForward(const float* table, int64_t num_rows, int64_t dim, const int32_t* offsets,
                             const int32_t* indices, int64_t batch, int64_t nnz, kernels::Pooling pooling,
                             float* out) override {
    return k::EmbeddingBagForward(table, num_rows, dim, offsets, indices, batch, nnz, pooling, out);
  }
  Status EmbeddingBagBackward(const float* dout, int64_t dim, const int32_t* offsets, const int32_t* inverse,
                              int64_t batch, int64_t nnz, int64_t num_unique, kernels::Pooling pooling,
                              float* grads) override {
    return k::EmbeddingBagBackward(dout, dim, offsets, inverse, batch, nnz, num_unique, pooling, grads);
  }
  Status Dedup(const int64_t* ids, int64_t n, int64_t* unique_ids, int32_t* inverse, int32_t* num_unique) override {
    return k::Dedup(ids, n, unique_ids, inverse, num_unique);
  }
};

}  // namespace

std::unique_ptr<Device> CreateCpuDevice() { return std::make_unique<CpuDevice>(); }

StatusOr<std::unique_ptr<Device>> CreateDevice(DeviceKind kind, int gpu, std::string* choice) {
  auto say = [&](std::string s) {
    if (choice != nullptr) *choice = std::move(s);
  };
  if (kind == DeviceKind::kCpu) {
    say("device: cpu (--device cpu)");
    return CreateCpuDevice();
  }
#if defined(FERRY_HAVE_CUDA)
  StatusOr<int> counted = kernels::cuda::DeviceCount();
  if (!counted.ok()) {
    // A driver that cannot start (missing, too old, a container without the device nodes) is
    // "no GPU" to auto, and an error naming the cause to --device cuda.
    if (kind == DeviceKind::kAuto) {
      say("device: cpu (--device auto: CUDA is unusable here: " + counted.status().message() + ")");
      return CreateCpuDevice();
    }
    return counted.status().WithContext("--device cuda");
  }
  const int count = *counted;
  if (kind == DeviceKind::kAuto && count == 0) {
    say("device: cpu (--device auto: no CUDA device found)");
    return CreateCpuDevice();
  }
  if (count == 0) return UnavailableError("--device cuda: no CUDA device is visible to this process");
  if (gpu >= count) {
    return UnavailableError("--gpu " + std::to_string(gpu) + ": this process sees " + std::to_string(count) +
                            " CUDA device(s)");
  }
  FERRY_ASSIGN_OR_RETURN(auto dev, internal::CreateCudaDevice(gpu));
  say("device: " + dev->name() +
      (kind == DeviceKind::kAuto ? " (--device auto: CUDA device found)" : " (--device cuda)"));
  return dev;
#else
  (void)gpu;
  if (kind == DeviceKind::kCuda) {
    return FailedPreconditionError("--device cuda: this ferry-trainer was built without CUDA");
  }
  say("device: cpu (--device auto: built without CUDA)");
  return CreateCpuDevice();
#endif
}

}  // namespace ferry::trainer
