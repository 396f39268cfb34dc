#include "internal/shapes.h"

#include <algorithm>
#include <initializer_list>
#include <string>

namespace ferry::kernels::internal {
namespace {

struct Size {
  const char* name;
  int64_t value;
};

// A tensor argument: it may be null only when it holds no elements.
struct Buffer {
  const char* name;
  const void* ptr;
  int64_t numel;
};

Status Invalid(const char* op, const std::string& what) {
  return InvalidArgumentError(std::string(op) + ": " + what);
}

Status CheckSizes(const char* op, std::initializer_list<Size> sizes) {
  for (const Size& s : sizes) {
    if (s.value < 0 || s.value > kMaxSize) {
      return Invalid(op, std::string(s.name) + " = " + std::to_string(s.value) +
                             " is outside [0, " + std::to_string(kMaxSize) + "]");
    }
  }
  return Status::Ok();
}

Status CheckBuffers(const char* op, std::initializer_list<Buffer> buffers) {
  for (const Buffer& b : buffers) {
    if (b.ptr == nullptr && b.numel > 0) {
      return Invalid(op, std::string(b.name) + " is null but must hold " +
                             std::to_string(b.numel) + " elements");
    }
  }
  return Status::Ok();
}

Status CheckPooling(const char* op, Pooling pooling) {
  if (pooling != Pooling::kSum && pooling != Pooling::kMean) {
    return Invalid(op, "pooling = " + std::to_string(static_cast<int>(pooling)) +
                           " is neither kSum nor kMean");
  }
  return Status::Ok();
}

// A row-major [rows x cols] operand stored with row stride ld: checks ld and returns, in *numel,
// the extent it spans in elements.
Status CheckOperand(const char* name, int64_t rows, int64_t cols, int64_t ld, int64_t* numel) {
  if (ld < std::max<int64_t>(1, cols)) {
    return Invalid("Gemm", std::string("ld") + name + " = " + std::to_string(ld) +
                               " is less than the stored row length of " + name + " (" +
                               std::to_string(cols) + ")");
  }
  *numel = rows > 0 && cols > 0 ? (rows - 1) * ld + cols : 0;
  return Status::Ok();
}

}  // namespace

Status CheckSize(const char* op, const char* name, int64_t value) {
  return CheckSizes(op, {{name, value}});
}

Status CheckGemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                 const float* a, int64_t lda, const float* b, int64_t ldb, const float* c,
                 int64_t ldc) {
  for (Transpose t : {trans_a, trans_b}) {
    if (t != Transpose::kNo && t != Transpose::kYes) {
      return Invalid("Gemm", "a transpose flag is neither kNo nor kYes");
    }
  }
  FERRY_RETURN_IF_ERROR(CheckSizes(
      "Gemm", {{"m", m}, {"n", n}, {"k", k}, {"lda", lda}, {"ldb", ldb}, {"ldc", ldc}}));
  const bool ta = trans_a == Transpose::kYes;
  const bool tb = trans_b == Transpose::kYes;
  int64_t a_numel = 0, b_numel = 0, c_numel = 0;
  FERRY_RETURN_IF_ERROR(CheckOperand("a", ta ? k : m, ta ? m : k, lda, &a_numel));
  FERRY_RETURN_IF_ERROR(CheckOperand("b", tb ? n : k, tb ? k : n, ldb, &b_numel));
  FERRY_RETURN_IF_ERROR(CheckOperand("c", m, n, ldc, &c_numel));
  return CheckBuffers("Gemm", {{"a", a, a_numel}, {"b", b, b_numel}, {"c", c, c_numel}});
}

Status CheckBiasAdd(const float* bias, int64_t rows, int64_t cols, const float* x) {
  FERRY_RETURN_IF_ERROR(CheckSizes("BiasAdd", {{"rows", rows}, {"cols", cols}}));
  return CheckBuffers("BiasAdd", {{"bias", bias, cols}, {"x", x, rows * cols}});
}

Status CheckBiasGrad(const float* dy, int64_t rows, int64_t cols, const float* dbias) {
  FERRY_RETURN_IF_ERROR(CheckSizes("BiasGrad", {{"rows", rows}, {"cols", cols}}));
  return CheckBuffers("BiasGrad", {{"dy", dy, rows * cols}, {"dbias", dbias, cols}});
}

Status CheckReluForward(const float* x, int64_t n, const float* y) {
  FERRY_RETURN_IF_ERROR(CheckSizes("ReluForward", {{"n", n}}));
  return CheckBuffers("ReluForward", {{"x", x, n}, {"y", y, n}});
}

Status CheckReluBackward(const float* y, const float* dy, int64_t n, const float* dx) {
  FERRY_RETURN_IF_ERROR(CheckSizes("ReluBackward", {{"n", n}}));
  return CheckBuffers("ReluBackward", {{"y", y, n}, {"dy", dy, n}, {"dx", dx, n}});
}

Status CheckSoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t rows,
                                       int64_t classes, const float* probs,
                                       const float* row_loss, const float* mean_loss) {
  const char* op = "SoftmaxCrossEntropyForward";
  FERRY_RETURN_IF_ERROR(CheckSizes(op, {{"rows", rows}, {"classes", classes}}));
  if (classes < 1) return Invalid(op, "classes must be at least 1");
  return CheckBuffers(op, {{"logits", logits, rows * classes},
                           {"labels", labels, rows},
                           {"probs", probs, rows * classes},
                           {"row_loss", row_loss, rows},
                           {"mean_loss", mean_loss, 1}});
}

Status CheckSoftmaxCrossEntropyBackward(const float* probs, const int32_t* labels, int64_t rows,
                                        int64_t classes, const float* dlogits) {
  const char* op = "SoftmaxCrossEntropyBackward";
  FERRY_RETURN_IF_ERROR(CheckSizes(op, {{"rows", rows}, {"classes", classes}}));
  if (classes < 1) return Invalid(op, "classes must be at least 1");
  return CheckBuffers(op, {{"probs", probs, rows * classes},
                           {"labels", labels, rows},
                           {"dlogits", dlogits, rows * classes}});
}

Status CheckSigmoidCrossEntropyForward(const float* logits, const float* targets, int64_t n,
                                       const float* loss, const float* mean_loss) {
  const char* op = "SigmoidCrossEntropyForward";
  FERRY_RETURN_IF_ERROR(CheckSizes(op, {{"n", n}}));
  return CheckBuffers(op, {{"logits", logits, n},
                           {"targets", targets, n},
                           {"loss", loss, n},
                           {"mean_loss", mean_loss, 1}});
}

Status CheckSigmoidCrossEntropyBackward(const float* logits, const float* targets, int64_t n,
                                        const float* dlogits) {
  const char* op = "SigmoidCrossEntropyBackward";
  FERRY_RETURN_IF_ERROR(CheckSizes(op, {{"n", n}}));
  return CheckBuffers(op,
                      {{"logits", logits, n}, {"targets", targets, n}, {"dlogits", dlogits, n}});
}

Status CheckEmbeddingBagForward(const float* table, int64_t num_rows, int64_t dim,
                                const int32_t* offsets, const int32_t* indices, int64_t batch,
                                int64_t nnz, Pooling pooling, const float* out) {
  const char* op = "EmbeddingBagForward";
  FERRY_RETURN_IF_ERROR(CheckSizes(
      op, {{"num_rows", num_rows}, {"dim", dim}, {"batch", batch}, {"nnz", nnz}}));
  FERRY_RETURN_IF_ERROR(CheckPooling(op, pooling));
  return CheckBuffers(op, {{"table", table, num_rows * dim},
                           {"offsets", offsets, batch + 1},
                           {"indices", indices, nnz},
                           {"out", out, batch * dim}});
}

Status CheckEmbeddingBagBackward(const float* dout, int64_t dim, const int32_t* offsets,
                                 const int32_t* inverse, int64_t batch, int64_t nnz,
                                 int64_t num_unique, Pooling pooling, const float* grads) {
  const char* op = "EmbeddingBagBackward";
  FERRY_RETURN_IF_ERROR(CheckSizes(
      op, {{"dim", dim}, {"batch", batch}, {"nnz", nnz}, {"num_unique", num_unique}}));
  FERRY_RETURN_IF_ERROR(CheckPooling(op, pooling));
  return CheckBuffers(op, {{"dout", dout, batch * dim},
                           {"offsets", offsets, batch + 1},
                           {"inverse", inverse, nnz},
                           {"grads", grads, num_unique * dim}});
}

Status CheckDedup(const int64_t* ids, int64_t n, const int64_t* unique_ids,
                  const int32_t* inverse, const int32_t* num_unique) {
  FERRY_RETURN_IF_ERROR(CheckSizes("Dedup", {{"n", n}}));
  return CheckBuffers("Dedup", {{"ids", ids, n},
                                {"unique_ids", unique_ids, n},
                                {"inverse", inverse, n},
                                {"num_unique", num_unique, 1}});
}

}  // namespace ferry::kernels::internal
