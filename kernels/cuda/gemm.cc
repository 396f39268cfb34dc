// CUDA GEMM: row-major C = alpha * op(A) op(B) + beta * C through column-major cublasSgemm.
// No kernel of our own, so this is plain C++ against the cuBLAS API.
#include <cublas_v2.h>

#include <string>

#include "cuda/common.h"
#include "internal/shapes.h"

namespace ferry::kernels::cuda {
namespace {

constexpr const char* kOp = "Gemm";

Status CublasStatus(cublasStatus_t status, const char* call) {
  std::string message = std::string(kOp) + ": " + call + " failed: " +
                        cublasGetStatusName(status) + ": " + cublasGetStatusString(status);
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return ResourceExhaustedError(std::move(message));
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return FailedPreconditionError(std::move(message));
    default:
      return InternalError(std::move(message));
  }
}

#define FERRY_CUBLAS_RETURN_IF_ERROR(call)                              \
  do {                                                                  \
    const cublasStatus_t ferry_cublas_status_ = (call);                 \
    if (ferry_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                \
      return CublasStatus(ferry_cublas_status_, #call);                 \
    }                                                                   \
  } while (0)

cublasOperation_t Op(Transpose t) { return t == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N; }

// A row-major [rows x cols] matrix with stride ld is, to column-major cuBLAS, its transpose
// [cols x rows] with leading dimension ld. So C^T = op(B)^T op(A)^T is one column-major Sgemm
// with A and B swapped and the same transpose flags.
Status LaunchGemm(cublasHandle_t handle, Transpose trans_a, Transpose trans_b, int m, int n,
                  int k, float alpha, const float* a, int lda, const float* b, int ldb,
                  float beta, float* c, int ldc, cudaStream_t stream) {
  FERRY_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream));
  FERRY_CUBLAS_RETURN_IF_ERROR(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
  if (k == 0) {  // C = beta * C, without reading C when beta == 0 (BLAS semantics).
    if (beta == 0.0f) {
      FERRY_CUDA_RETURN_IF_ERROR(kOp, cudaMemset2DAsync(c, sizeof(float) * ldc, 0,
                                                        sizeof(float) * n, m, stream));
      return Status::Ok();
    }
    const float zero = 0.0f;  // In place: C (as [n x m] column-major) = beta * C + 0 * C.
    FERRY_CUBLAS_RETURN_IF_ERROR(cublasSgeam(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, &beta, c,
                                             ldc, &zero, c, ldc, c, ldc));
    return Status::Ok();
  }
  FERRY_CUBLAS_RETURN_IF_ERROR(cublasSgemm(handle, Op(trans_b), Op(trans_a), n, m, k, &alpha, b,
                                           ldb, a, lda, &beta, c, ldc));
  return Status::Ok();
}

}  // namespace

Status Gemm(cublasHandle_t handle, Transpose trans_a, Transpose trans_b, int64_t m, int64_t n,
            int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
            float beta, float* c, int64_t ldc, cudaStream_t stream) {
  FERRY_RETURN_IF_ERROR(internal::CheckGemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc));
  if (handle == nullptr) return InvalidArgumentError("Gemm: cuBLAS handle is null");
  FERRY_RETURN_IF_ERROR(detail::CheckStream(kOp, stream));
  if (m == 0 || n == 0) return Status::Ok();
  // Sizes were checked to fit an int (internal::kMaxSize).
  return LaunchGemm(handle, trans_a, trans_b, static_cast<int>(m), static_cast<int>(n),
                    static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
                    static_cast<int>(ldb), beta, c, static_cast<int>(ldc), stream);
}

}  // namespace ferry::kernels::cuda
