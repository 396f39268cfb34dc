// ferry/kernels_cuda.h — the CUDA twins of ferry/kernels.h.
//
// Each function has the name and the arguments of its CPU twin (read ferry/kernels.h for what it
// computes), with device resources first (a cuBLAS handle, a scratch buffer) and the stream last.
// This header includes no CUDA header: cudaStream_t and cublasHandle_t are declared here exactly
// as the CUDA headers declare them. Link ferry_kernels_cuda; it defines FERRY_HAVE_CUDA=1.
//
// Contract of every function below:
//  - Tensor pointers are device pointers (or managed memory). Sizes are host values; sizes and
//    pointers are checked by the CPU twin's own code before anything is enqueued.
//  - Work is enqueued on `stream` and the call returns without synchronizing. `stream` must be a
//    stream the caller created (or cudaStreamPerThread); a null stream — the implicit legacy
//    default stream — is refused with INVALID_ARGUMENT.
//  - No function allocates device memory. Ops that need temporary memory (EmbeddingBagBackward,
//    Dedup) take a caller-owned scratch buffer with CUB's two-phase protocol: call once with
//    scratch == nullptr to read the size into *scratch_bytes (nothing is enqueued and the tensor
//    arguments are not looked at; CUB asks the current device for its tuning, so this query too
//    needs a device), then call again with a buffer of at least that many bytes. The buffer is in
//    use until the stream has run the call: later work on the same stream may reuse it at once.
//  - Status: caller mistakes as for the CPU twin; a failed CUDA/cuBLAS call or kernel launch
//    gives INTERNAL naming the call (RESOURCE_EXHAUSTED for out-of-memory, UNAVAILABLE for no
//    device or driver). Faults inside running kernels surface at the caller's next sync.
//  - Values the host cannot check without a synchronization are not checked: CSR offsets, indices,
//    labels and inverse maps that live on the device. Kernels stay within the buffers whatever
//    those hold: a label or table index out of range makes that row's output NaN, a bag whose
//    offsets are out of order is read as empty, an inverse entry out of range is skipped.
//
// Determinism: no kernel here uses atomics, and every reduction runs in an order fixed by the
// shapes alone, so every op is bitwise reproducible from run to run on the same GPU model.
// EmbeddingBag* sum in the CPU twin's order (ascending position); Dedup's integer outputs equal
// the CPU twin's exactly. Gemm is as reproducible as cuBLAS: bitwise for the same toolkit
// version, GPU model and handle settings (math mode, workspace), not across them.
//
// Thread-safety: free functions without shared state. A cuBLAS handle must not be used by two
// threads at once (Gemm rebinds it to the stream it is given).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/kernels.h"
#include "ferry/status.h"

// Identical to the declarations in driver_types.h and cublas_api.h.
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
struct cublasContext;
typedef struct cublasContext* cublasHandle_t;

namespace ferry::kernels::cuda {

// The number of CUDA devices this process can use; 0 (not an error) when there is no device or
// no driver. Other CUDA failures are returned as errors.
StatusOr<int> DeviceCount();

// ---- GEMM (cuBLAS) -----------------------------------------------------------------------------
// Binds `handle` to `stream` and to host pointer mode, then runs cublasSgemm. The handle's math
// mode is left as the caller set it (the default, CUBLAS_DEFAULT_MATH, computes in full FP32; a
// TF32 mode trades precision for speed). cuBLAS may use the workspace owned by the handle
// (cublasSetWorkspace); it allocates none per call.
Status Gemm(cublasHandle_t handle, Transpose trans_a, Transpose trans_b, int64_t m, int64_t n,
            int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
            float beta, float* c, int64_t ldc, cudaStream_t stream);

// ---- Bias --------------------------------------------------------------------------------------
Status BiasAdd(const float* bias, int64_t rows, int64_t cols, float* x, cudaStream_t stream);
Status BiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias, cudaStream_t stream);

// ---- ReLU --------------------------------------------------------------------------------------
Status ReluForward(const float* x, int64_t n, float* y, cudaStream_t stream);
Status ReluBackward(const float* y, const float* dy, int64_t n, float* dx, cudaStream_t stream);

// ---- Softmax cross-entropy ---------------------------------------------------------------------
// mean_loss is a device pointer to one float.
Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t rows,
                                  int64_t classes, float* probs, float* row_loss,
                                  float* mean_loss, cudaStream_t stream);
Status SoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels, int64_t rows,
                                   int64_t classes, float scale, float* dlogits,
                                   cudaStream_t stream);

// ---- Sigmoid binary cross-entropy with logits --------------------------------------------------
Status SigmoidCrossEntropyForward(const float* logits, const float* targets, int64_t n,
                                  float* loss, float* mean_loss, float* probs,
                                  cudaStream_t stream);
Status SigmoidCrossEntropyBackward(const float* logits, const float* targets, int64_t n,
                                   float scale, float* dlogits, cudaStream_t stream);

// ---- Embedding bag -----------------------------------------------------------------------------
Status EmbeddingBagForward(const float* table, int64_t num_rows, int64_t dim,
                           const int32_t* offsets, const int32_t* indices, int64_t batch,
                           int64_t nnz, Pooling pooling, float* out, cudaStream_t stream);

// A sort-based segmented reduction (stable radix sort of inverse, then one sequential sum per
// unique row): no atomics. Scratch: two-phase, see above; the size depends on nnz and num_unique.
Status EmbeddingBagBackward(void* scratch, size_t* scratch_bytes, const float* dout, int64_t dim,
                            const int32_t* offsets, const int32_t* inverse, int64_t batch,
                            int64_t nnz, int64_t num_unique, Pooling pooling, float* grads,
                            cudaStream_t stream);

// ---- Dedup -------------------------------------------------------------------------------------
// CUB radix sort of (id, position), a head-flag scan, and a scatter. num_unique is a device
// pointer to one int32: copy it to the host (and synchronize) to learn u. Scratch: two-phase, see
// above; the size depends on n only.
Status Dedup(void* scratch, size_t* scratch_bytes, const int64_t* ids, int64_t n,
             int64_t* unique_ids, int32_t* inverse, int32_t* num_unique, cudaStream_t stream);

}  // namespace ferry::kernels::cuda
