// Argument checks shared by the CPU and CUDA twins, so both refuse the same mistakes with the
// same Status. Check<Op> takes exactly the op's arguments and looks at sizes and pointers only,
// never at the pointed-to data (which may live on the device). It returns OK or INVALID_ARGUMENT
// with a message "<Op>: <what is wrong>".
#pragma once

#include <cstdint>

#include "ferry/kernels.h"
#include "ferry/status.h"

namespace ferry::kernels::internal {

// The largest size any op accepts: int32 positions and cuBLAS's int sizes stay in range, and
// every element count (a product of two sizes) fits an int64.
inline constexpr int64_t kMaxSize = INT32_MAX;

// One size argument: in [0, kMaxSize].
Status CheckSize(const char* op, const char* name, int64_t value);

Status CheckGemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                 const float* a, int64_t lda, const float* b, int64_t ldb, const float* c,
                 int64_t ldc);
Status CheckBiasAdd(const float* bias, int64_t rows, int64_t cols, const float* x);
Status CheckBiasGrad(const float* dy, int64_t rows, int64_t cols, const float* dbias);
Status CheckReluForward(const float* x, int64_t n, const float* y);
Status CheckReluBackward(const float* y, const float* dy, int64_t n, const float* dx);
Status CheckSoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t rows,
                                       int64_t classes, const float* probs,
                                       const float* row_loss, const float* mean_loss);
Status CheckSoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels, int64_t rows,
                                        int64_t classes, const float* dlogits);
Status CheckSigmoidCrossEntropyForward(const float* logits, const float* targets, int64_t n,
                                       const float* loss, const float* mean_loss);
Status CheckSigmoidCrossEntropyBackward(const float* logits, const float* targets, int64_t n,
                                        const float* dlogits);
Status CheckEmbeddingBagForward(const float* table, int64_t num_rows, int64_t dim,
                                const int32_t* offsets, const int32_t* indices, int64_t batch,
                                int64_t nnz, Pooling pooling, const float* out);
Status CheckEmbeddingBagBackward(const float* dout, int64_t dim, const int32_t* offsets,
                                 const int32_t* inverse, int64_t batch, int64_t nnz,
                                 int64_t num_unique, Pooling pooling, const float* grads);
Status CheckDedup(const int64_t* ids, int64_t n, const int64_t* unique_ids,
                  const int32_t* inverse, const int32_t* num_unique);

}  // namespace ferry::kernels::internal
