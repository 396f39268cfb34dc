// CUDA embedding bag: pooled lookup over CSR bags, and its per-unique-row gradient computed by a
// sort-based segmented reduction (no atomics).
#include <cub/device/device_radix_sort.cuh>

#include <string>

#include "cuda/common.h"
#include "internal/shapes.h"

namespace ferry::kernels::cuda {
namespace {

constexpr const char* kForwardOp = "EmbeddingBagForward";
constexpr const char* kBackwardOp = "EmbeddingBagBackward";

// Both kernels give each output row (a bag, a unique id) to a row of threads: threadIdx.x walks
// the dim columns, threadIdx.y picks the row, so narrow rows still fill the warps.
constexpr int kRowBlock = 128;

dim3 RowBlock(int64_t dim) {
  unsigned int x = 1;
  while (x < kRowBlock && x < dim) x *= 2;
  return dim3(x, kRowBlock / x);
}

unsigned int RowGrid(int64_t rows, dim3 block) {
  return static_cast<unsigned int>((rows + block.y - 1) / block.y);
}

// The bag [begin, end) of positions, clamped to [0, nnz): disordered offsets read as empty.
__device__ __forceinline__ void BagRange(const int32_t* offsets, int64_t b, int64_t nnz,
                                         int64_t* begin, int64_t* end) {
  const int64_t lo = offsets[b], hi = offsets[b + 1];
  *begin = lo < 0 ? 0 : (lo > nnz ? nnz : lo);
  *end = hi < *begin ? *begin : (hi > nnz ? nnz : hi);
}

__global__ void EmbeddingBagForwardKernel(const float* table, int64_t num_rows, int64_t dim,
                                          const int32_t* offsets, const int32_t* indices,
                                          int64_t batch, int64_t nnz, Pooling pooling,
                                          float* out) {
  const int64_t b = blockIdx.x * int64_t{blockDim.y} + threadIdx.y;
  if (b >= batch) return;
  int64_t begin, end;
  BagRange(offsets, b, nnz, &begin, &end);
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float sum = 0.0f;
    bool bad_index = false;
    for (int64_t j = begin; j < end; ++j) {
      const int32_t row = indices[j];
      if (row < 0 || row >= num_rows) {
        bad_index = true;
        continue;
      }
      sum += table[row * dim + d];
    }
    if (pooling == Pooling::kMean && end > begin) sum /= static_cast<float>(end - begin);
    out[b * dim + d] = bad_index ? NAN : sum;
  }
}

// bag_of[j] = the bag holding position j, or -1 when none does (offsets not covering [0, nnz)).
__global__ void BagOfKernel(const int32_t* offsets, int64_t batch, int64_t nnz, int32_t* bag_of) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < nnz;
       j += int64_t{gridDim.x} * blockDim.x) {
    // The last bag b in [0, batch) with offsets[b] <= j.
    int64_t lo = 0, hi = batch;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (offsets[mid] <= j) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const int64_t b = lo - 1;
    bag_of[j] = b >= 0 && j >= offsets[b] && j < offsets[b + 1] ? static_cast<int32_t>(b) : -1;
  }
}

// Over the inverse map sorted by key: [begin[u], end[u]) is the run of key u (begin = end = 0,
// from the memset, when u does not occur). Keys outside [0, num_unique) are skipped.
__global__ void SegmentBoundsKernel(const int32_t* keys, int64_t nnz, int64_t num_unique,
                                    int32_t* begin, int32_t* end) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < nnz;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int32_t key = keys[i];
    if (key < 0 || key >= num_unique) continue;
    if (i == 0 || keys[i - 1] != key) begin[key] = static_cast<int32_t>(i);
    if (i == nnz - 1 || keys[i + 1] != key) end[key] = static_cast<int32_t>(i + 1);
  }
}

// grads[u] = sum of dout[bag] (/ bag size) over u's run, in run order (= ascending position).
__global__ void EmbeddingBagBackwardKernel(const float* dout, int64_t dim,
                                           const int32_t* offsets, const int32_t* bags,
                                           const int32_t* begin, const int32_t* end,
                                           int64_t num_unique, Pooling pooling, float* grads) {
  const int64_t u = blockIdx.x * int64_t{blockDim.y} + threadIdx.y;
  if (u >= num_unique) return;
  const int32_t run_begin = begin[u];
  const int32_t run_end = end[u];
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int32_t i = run_begin; i < run_end; ++i) {
      const int32_t b = bags[i];
      if (b < 0) continue;
      const float g = dout[b * dim + d];
      if (pooling == Pooling::kMean) {
        sum += g / static_cast<float>(offsets[b + 1] - offsets[b]);
      } else {
        sum += g;
      }
    }
    grads[u * dim + d] = sum;
  }
}

// The backward's scratch: bag_of, the sorted keys and bags, the run bounds, CUB's sort storage.
struct BackwardScratch {
  detail::ScratchLayout layout;
  int bag_of = 0, sorted_keys = 0, sorted_bags = 0, run_begin = 0, run_end = 0, cub = 0;
  size_t cub_bytes = 0;
};

StatusOr<BackwardScratch> PlanBackward(int64_t nnz, int64_t num_unique) {
  BackwardScratch s;
  FERRY_CUDA_RETURN_IF_ERROR(
      kBackwardOp, cub::DeviceRadixSort::SortPairs(
                       nullptr, s.cub_bytes, static_cast<const int32_t*>(nullptr),
                       static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                       static_cast<int32_t*>(nullptr), static_cast<int>(nnz)));
  const size_t positions = sizeof(int32_t) * static_cast<size_t>(nnz);
  const size_t runs = sizeof(int32_t) * static_cast<size_t>(num_unique);
  s.bag_of = s.layout.Reserve(positions);
  s.sorted_keys = s.layout.Reserve(positions);
  s.sorted_bags = s.layout.Reserve(positions);
  s.run_begin = s.layout.Reserve(runs);
  s.run_end = s.layout.Reserve(runs);
  s.cub = s.layout.Reserve(s.cub_bytes);
  return s;
}

Status LaunchEmbeddingBagForward(const float* table, int64_t num_rows, int64_t dim,
                                 const int32_t* offsets, const int32_t* indices, int64_t batch,
                                 int64_t nnz, Pooling pooling, float* out, cudaStream_t stream) {
  const dim3 block = RowBlock(dim);
  EmbeddingBagForwardKernel<<<RowGrid(batch, block), block, 0, stream>>>(
      table, num_rows, dim, offsets, indices, batch, nnz, pooling, out);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(kForwardOp, EmbeddingBagForwardKernel);
  return Status::Ok();
}

Status LaunchEmbeddingBagBackward(const BackwardScratch& plan, void* scratch, const float* dout,
                                  int64_t dim, const int32_t* offsets, const int32_t* inverse,
                                  int64_t batch, int64_t nnz, int64_t num_unique,
                                  Pooling pooling, float* grads, cudaStream_t stream) {
  if (nnz == 0) {  // Nothing to sort: every unique row gets zeros.
    FERRY_CUDA_RETURN_IF_ERROR(
        kBackwardOp, cudaMemsetAsync(grads, 0, sizeof(float) * num_unique * dim, stream));
    return Status::Ok();
  }
  int32_t* bag_of = plan.layout.Get<int32_t>(scratch, plan.bag_of);
  int32_t* sorted_keys = plan.layout.Get<int32_t>(scratch, plan.sorted_keys);
  int32_t* sorted_bags = plan.layout.Get<int32_t>(scratch, plan.sorted_bags);
  int32_t* run_begin = plan.layout.Get<int32_t>(scratch, plan.run_begin);
  int32_t* run_end = plan.layout.Get<int32_t>(scratch, plan.run_end);
  void* cub_storage = plan.layout.Get<void>(scratch, plan.cub);
  size_t cub_bytes = plan.cub_bytes;

  BagOfKernel<<<detail::GridFor(nnz), detail::kBlock, 0, stream>>>(offsets, batch, nnz, bag_of);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(kBackwardOp, BagOfKernel);
  // A stable sort by unique position: each run keeps its positions in ascending order. All 32 key
  // bits take part, so stray keys (< 0 or >= num_unique) cannot split a valid key's run.
  FERRY_CUDA_RETURN_IF_ERROR(
      kBackwardOp,
      cub::DeviceRadixSort::SortPairs(cub_storage, cub_bytes, inverse, sorted_keys, bag_of,
                                      sorted_bags, static_cast<int>(nnz), 0, 32, stream));
  FERRY_CUDA_RETURN_IF_ERROR(
      kBackwardOp, cudaMemsetAsync(run_begin, 0, sizeof(int32_t) * num_unique, stream));
  FERRY_CUDA_RETURN_IF_ERROR(
      kBackwardOp, cudaMemsetAsync(run_end, 0, sizeof(int32_t) * num_unique, stream));
  SegmentBoundsKernel<<<detail::GridFor(nnz), detail::kBlock, 0, stream>>>(
      sorted_keys, nnz, num_unique, run_begin, run_end);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(kBackwardOp, SegmentBoundsKernel);
  const dim3 block = RowBlock(dim);
  EmbeddingBagBackwardKernel<<<RowGrid(num_unique, block), block, 0, stream>>>(
      dout, dim, offsets, sorted_bags, run_begin, run_end, num_unique, pooling, grads);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(kBackwardOp, EmbeddingBagBackwardKernel);
  return Status::Ok();
}

}  // namespace

Status EmbeddingBagForward(const float* table, int64_t num_rows, int64_t dim,
                           const int32_t* offsets, const int32_t* indices, int64_t batch,
                           int64_t nnz, Pooling pooling, float* out, cudaStream_t stream) {
  FERRY_RETURN_IF_ERROR(internal::CheckEmbeddingBagForward(table, num_rows, dim, offsets, indices,
                                                           batch, nnz, pooling, out));
  FERRY_RETURN_IF_ERROR(detail::CheckStream(kForwardOp, stream));
  if (batch == 0 || dim == 0) return Status::Ok();
  return LaunchEmbeddingBagForward(table, num_rows, dim, offsets, indices, batch, nnz, pooling,
                                   out, stream);
}

Status EmbeddingBagBackward(void* scratch, size_t* scratch_bytes, const float* dout, int64_t dim,
                            const int32_t* offsets, const int32_t* inverse, int64_t batch,
                            int64_t nnz, int64_t num_unique, Pooling pooling, float* grads,
                            cudaStream_t stream) {
  if (scratch_bytes == nullptr) {
    return InvalidArgumentError(std::string(kBackwardOp) + ": scratch_bytes is null");
  }
  if (scratch == nullptr) {  // Phase one: the size only. The sizes must be valid already.
    FERRY_RETURN_IF_ERROR(internal::CheckSize(kBackwardOp, "nnz", nnz));
    FERRY_RETURN_IF_ERROR(internal::CheckSize(kBackwardOp, "num_unique", num_unique));
    FERRY_ASSIGN_OR_RETURN(const BackwardScratch plan, PlanBackward(nnz, num_unique));
    *scratch_bytes = plan.layout.bytes();
    return Status::Ok();
  }
  FERRY_RETURN_IF_ERROR(internal::CheckEmbeddingBagBackward(dout, dim, offsets, inverse, batch,
                                                            nnz, num_unique, pooling, grads));
  FERRY_RETURN_IF_ERROR(detail::CheckStream(kBackwardOp, stream));
  FERRY_ASSIGN_OR_RETURN(const BackwardScratch plan, PlanBackward(nnz, num_unique));
  FERRY_RETURN_IF_ERROR(detail::CheckScratch(kBackwardOp, scratch_bytes, plan.layout.bytes()));
  if (num_unique == 0 || dim == 0) return Status::Ok();
  return LaunchEmbeddingBagBackward(plan, scratch, dout, dim, offsets, inverse, batch, nnz,
                                    num_unique, pooling, grads, stream);
}

}  // namespace ferry::kernels::cuda
