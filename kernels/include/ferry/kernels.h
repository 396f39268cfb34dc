// ferry/kernels.h — the ops a trainer's models need, CPU reference twins.
//
// Every op exists twice with the same name and the same arguments: here in ferry::kernels::cpu,
// and in ferry::kernels::cuda (ferry/kernels_cuda.h), where device resources come first (a cuBLAS
// handle, a scratch buffer) and a cudaStream_t comes last. Both twins check sizes and pointers
// with the same code, so a shape mistake gives the same Status from either; the CPU twins also
// check the data (labels, CSR offsets, indices), which a CUDA twin cannot see without a sync.
//
// Conventions, for every function below:
//  - Tensors are dense, row-major float32 ([rows x cols] means cols contiguous floats per row).
//    Ids are int64; positions (indices into a table, CSR offsets, labels, the inverse map of
//    Dedup) are int32. Every size is an int64 in [0, INT32_MAX].
//  - The caller owns every buffer; the CPU twins take host pointers and write only their outputs.
//    A pointer may be null only when the tensor it points to has no elements. Unless a comment
//    says "may alias", inputs and outputs must not overlap.
//  - A caller mistake (a negative or too large size, a null pointer, an inconsistent shape, a
//    label or index out of range, malformed CSR offsets) returns INVALID_ARGUMENT, naming the op
//    and the argument, before any output is written. OK means every output was written.
//  - Determinism: every CPU op is bitwise reproducible from run to run on the same machine (Gemm:
//    for a fixed OpenBLAS build and thread count). See ferry/kernels_cuda.h for the GPU contract.
//
// Thread-safety: these are free functions without shared state; concurrent calls are safe when
// their outputs do not overlap. Gemm runs on OpenBLAS's own thread pool.
#pragma once

#include <cstdint>

#include "ferry/status.h"

namespace ferry::kernels {

// op(X) = X or X^T.
enum class Transpose : int { kNo = 0, kYes = 1 };

// How an embedding bag reduces its rows: their sum, or their mean (an empty bag gives zeros).
enum class Pooling : int { kSum = 0, kMean = 1 };

namespace cpu {

// The threads the CPU Gemm uses (OpenBLAS's pool, shared by the whole process). Gemm results are
// bitwise reproducible only for one thread count: trainers fix it (--blas-threads) and record it.
void SetGemmThreads(int threads);
int GemmThreads();

// ---- GEMM --------------------------------------------------------------------------------------
// C[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * C   (row-major, like cblas RowMajor).
// A is stored as [m x k] (kNo) or [k x m] (kYes) with row stride lda >= its stored row length;
// likewise B is [k x n] or [n x k] with stride ldb; C is [m x n] with stride ldc >= n.
// When beta == 0, C is not read (it may hold NaN). k == 0 gives C = beta * C.
Status Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc);

// ---- Bias --------------------------------------------------------------------------------------
// x[r][c] += bias[c] for x [rows x cols], bias [cols]. In place.
Status BiasAdd(const float* bias, int64_t rows, int64_t cols, float* x);

// dbias[c] = sum over r of dy[r][c], for dy [rows x cols]; dbias [cols] is overwritten (rows == 0
// gives zeros).
Status BiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias);

// ---- ReLU --------------------------------------------------------------------------------------
// y[i] = max(x[i], 0) for n elements. y may alias x.
Status ReluForward(const float* x, int64_t n, float* y);

// dx[i] = y[i] > 0 ? dy[i] : 0, where y is the forward output (the forward input works too: same
// sign; the gradient at 0 is 0). dx may alias dy.
Status ReluBackward(const float* y, const float* dy, int64_t n, float* dx);

// ---- Softmax cross-entropy ---------------------------------------------------------------------
// For logits [rows x classes] and labels [rows] in [0, classes):
//   probs[r][c] = softmax(logits[r])[c]                          (the row max subtracted first)
//   row_loss[r] = -log probs[r][labels[r]] = logsumexp(logits[r]) - logits[r][labels[r]]  (nats)
//   mean_loss[0] = sum(row_loss) / rows                          (0 when rows == 0)
// classes >= 1. All three outputs are required; mean_loss points to one float.
Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t rows,
                                  int64_t classes, float* probs, float* row_loss,
                                  float* mean_loss);

// dlogits[r][c] = scale * (probs[r][c] - (c == labels[r] ? 1 : 0)).
// scale is the derivative of the final loss with respect to each row's loss: pass 1 / rows for
// the gradient of mean_loss, 1 for the gradient of sum(row_loss). (Under synchronous data
// parallelism the servers average over workers, so each worker passes 1 / its own rows.)
// dlogits may alias probs.
Status SoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels, int64_t rows,
                                   int64_t classes, float scale, float* dlogits);

// ---- Sigmoid binary cross-entropy with logits --------------------------------------------------
// For n logits x and targets t in [0, 1] (n = batch x outputs, flattened):
//   loss[i] = max(x, 0) - x * t + log1p(exp(-|x|))    (= -t log s(x) - (1-t) log(1 - s(x)), nats,
//                                                       stable for any finite x)
//   mean_loss[0] = sum(loss) / n                       (0 when n == 0)
//   probs[i] = sigmoid(x[i])                           (optional: probs may be null to skip it)
Status SigmoidCrossEntropyForward(const float* logits, const float* targets, int64_t n,
                                  float* loss, float* mean_loss, float* probs);

// dlogits[i] = scale * (sigmoid(x[i]) - t[i]); scale as for SoftmaxCrossEntropyBackward (1 / n for
// the gradient of mean_loss). dlogits may alias logits.
Status SigmoidCrossEntropyBackward(const float* logits, const float* targets, int64_t n,
                                   float scale, float* dlogits);

// ---- Embedding bag -----------------------------------------------------------------------------
// One multi-hot field for a batch, as CSR: bag b holds the positions indices[offsets[b] ..
// offsets[b+1]) of rows in table [num_rows x dim]. offsets [batch + 1] starts at 0, never
// decreases and ends at nnz; indices [nnz] lie in [0, num_rows). In a trainer, table holds the
// pulled rows of the unique ids and indices is the inverse map from Dedup.
//   out[b] = sum of table[indices[j]] over j in bag b       (Pooling::kSum)
//          = that sum / bag size, or zeros for an empty bag (Pooling::kMean)
// out is [batch x dim]. Rows are summed in ascending j.
Status EmbeddingBagForward(const float* table, int64_t num_rows, int64_t dim,
                           const int32_t* offsets, const int32_t* indices, int64_t batch,
                           int64_t nnz, Pooling pooling, float* out);

// The gradient of EmbeddingBagForward with respect to the rows it read, one row per unique id:
//   grads[u] = sum over j with inverse[j] == u of dout[bag(j)] (/ size of bag(j) for kMean)
// dout [batch x dim]; offsets [batch + 1] and nnz as in the forward; inverse [nnz] in
// [0, num_unique); grads [num_unique x dim] is overwritten (a unique row no j refers to gets
// zeros). Contributions are summed in ascending j. Several fields that share one Dedup make one
// call: lay their bags out as one CSR (field after field) with dout to match.
Status EmbeddingBagBackward(const float* dout, int64_t dim, const int32_t* offsets,
                            const int32_t* inverse, int64_t batch, int64_t nnz,
                            int64_t num_unique, Pooling pooling, float* grads);

// ---- Dedup -------------------------------------------------------------------------------------
// For ids [n]: unique_ids[0 .. u) = the distinct ids in ascending (signed) order, inverse[i] = the
// position of ids[i] in unique_ids, num_unique[0] = u. unique_ids needs room for n ids (only the
// first u are written); inverse is [n]. Allocates O(n) host memory for the sort.
Status Dedup(const int64_t* ids, int64_t n, int64_t* unique_ids, int32_t* inverse,
             int32_t* num_unique);

}  // namespace cpu
}  // namespace ferry::kernels
