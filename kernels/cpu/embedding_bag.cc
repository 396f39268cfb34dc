// CPU embedding bag: pooled lookup over CSR bags, and its per-unique-row gradient.
#include <algorithm>
#include <string>

#include "ferry/kernels.h"
#include "internal/shapes.h"

namespace ferry::kernels::cpu {
namespace {

Status CheckOffsets(const char* op, const int32_t* offsets, int64_t batch, int64_t nnz) {
  if (offsets[0] != 0) {
    return InvalidArgumentError(std::string(op) + ": offsets[0] = " + std::to_string(offsets[0]) +
                                ", must be 0");
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (offsets[b + 1] < offsets[b]) {
      return InvalidArgumentError(std::string(op) + ": offsets decrease at bag " +
                                  std::to_string(b) + " (" + std::to_string(offsets[b]) + " > " +
                                  std::to_string(offsets[b + 1]) + ")");
    }
  }
  if (offsets[batch] != nnz) {
    return InvalidArgumentError(std::string(op) + ": offsets[batch] = " +
                                std::to_string(offsets[batch]) + ", must equal nnz = " +
                                std::to_string(nnz));
  }
  return Status::Ok();
}

// Every positions[j] (j < nnz) lies in [0, limit).
Status CheckPositions(const char* op, const char* name, const int32_t* positions, int64_t nnz,
                      int64_t limit) {
  for (int64_t j = 0; j < nnz; ++j) {
    if (positions[j] < 0 || positions[j] >= limit) {
      return InvalidArgumentError(std::string(op) + ": " + name + "[" + std::to_string(j) +
                                  "] = " + std::to_string(positions[j]) + " is outside [0, " +
                                  std::to_string(limit) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

Status EmbeddingBagForward(const float* table, int64_t num_rows, int64_t dim,
                           const int32_t* offsets, const int32_t* indices, int64_t batch,
                           int64_t nnz, Pooling pooling, float* out) {
  const char* op = "EmbeddingBagForward";
  FERRY_RETURN_IF_ERROR(internal::CheckEmbeddingBagForward(table, num_rows, dim, offsets, indices,
                                                           batch, nnz, pooling, out));
  FERRY_RETURN_IF_ERROR(CheckOffsets(op, offsets, batch, nnz));
  FERRY_RETURN_IF_ERROR(CheckPositions(op, "indices", indices, nnz, num_rows));
  for (int64_t b = 0; b < batch; ++b) {
    float* o = out + b * dim;
    std::fill(o, o + dim, 0.0f);
    for (int64_t j = offsets[b]; j < offsets[b + 1]; ++j) {
      const float* row = table + static_cast<int64_t>(indices[j]) * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] += row[d];
    }
    const int64_t size = offsets[b + 1] - offsets[b];
    if (pooling == Pooling::kMean && size > 0) {
      for (int64_t d = 0; d < dim; ++d) o[d] /= static_cast<float>(size);
    }
  }
  return Status::Ok();
}

Status EmbeddingBagBackward(const float* dout, int64_t dim, const int32_t* offsets,
                            const int32_t* inverse, int64_t batch, int64_t nnz,
                            int64_t num_unique, Pooling pooling, float* grads) {
  const char* op = "EmbeddingBagBackward";
  FERRY_RETURN_IF_ERROR(internal::CheckEmbeddingBagBackward(dout, dim, offsets, inverse, batch,
                                                            nnz, num_unique, pooling, grads));
  FERRY_RETURN_IF_ERROR(CheckOffsets(op, offsets, batch, nnz));
  FERRY_RETURN_IF_ERROR(CheckPositions(op, "inverse", inverse, nnz, num_unique));
  std::fill(grads, grads + num_unique * dim, 0.0f);
  // Bags in order and positions in order within a bag: each unique row sums its contributions in
  // ascending j, the order the CUDA twin's stable sort gives.
  for (int64_t b = 0; b < batch; ++b) {
    const float* g = dout + b * dim;
    const float size = static_cast<float>(offsets[b + 1] - offsets[b]);
    for (int64_t j = offsets[b]; j < offsets[b + 1]; ++j) {
      float* row = grads + static_cast<int64_t>(inverse[j]) * dim;
      if (pooling == Pooling::kMean) {
        for (int64_t d = 0; d < dim; ++d) row[d] += g[d] / size;
      } else {
        for (int64_t d = 0; d < dim; ++d) row[d] += g[d];
      }
    }
  }
  return Status::Ok();
}

}  // namespace ferry::kernels::cpu
