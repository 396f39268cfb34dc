// CPU GEMM: row-major cblas_sgemm (OpenBLAS).
#include <cblas.h>

#include "ferry/kernels.h"
#include "internal/shapes.h"

namespace ferry::kernels::cpu {

Status Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) {
  FERRY_RETURN_IF_ERROR(internal::CheckGemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc));
  if (m == 0 || n == 0) return Status::Ok();
  if (k == 0) {  // BLAS leaves this corner to the implementation; spell it out: C = beta * C.
    for (int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      for (int64_t j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
    }
    return Status::Ok();
  }
  auto op = [](Transpose t) { return t == Transpose::kYes ? CblasTrans : CblasNoTrans; };
  // Sizes were checked to fit an int (kMaxSize).
  cblas_sgemm(CblasRowMajor, op(trans_a), op(trans_b), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
  return Status::Ok();
}

void SetGemmThreads(int threads) { openblas_set_num_threads(threads); }
int GemmThreads() { return openblas_get_num_threads(); }

}  // namespace ferry::kernels::cpu
