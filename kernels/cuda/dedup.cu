// CUDA id deduplication with the inverse map: a stable CUB radix sort of (id, position), head
// flags, an inclusive scan of the flags (each id's rank among the unique ids), and a scatter.
// Integer work only, so the outputs equal the CPU twin's exactly.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <string>

#include "cuda/common.h"
#include "internal/shapes.h"

namespace ferry::kernels::cuda {
namespace {

constexpr const char* kOp = "Dedup";

__global__ void IotaKernel(int64_t n, int32_t* positions) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    positions[i] = static_cast<int32_t>(i);
  }
}

// flags[i] = 1 where sorted_ids[i] starts a run of equal ids.
__global__ void HeadFlagsKernel(const int64_t* sorted_ids, int64_t n, int32_t* flags) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    flags[i] = i == 0 || sorted_ids[i] != sorted_ids[i - 1] ? 1 : 0;
  }
}

// ranks is the inclusive scan of flags: the run of sorted_ids[i] is unique position ranks[i] - 1.
__global__ void ScatterKernel(const int64_t* sorted_ids, const int32_t* sorted_positions,
                              const int32_t* flags, const int32_t* ranks, int64_t n,
                              int64_t* unique_ids, int32_t* inverse, int32_t* num_unique) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int32_t u = ranks[i] - 1;
    inverse[sorted_positions[i]] = u;
    if (flags[i] != 0) unique_ids[u] = sorted_ids[i];
    if (i == n - 1) num_unique[0] = ranks[i];
  }
}

struct DedupScratch {
  detail::ScratchLayout layout;
  int sorted_ids = 0, positions = 0, sorted_positions = 0, flags = 0, ranks = 0, cub = 0;
  size_t cub_bytes = 0;
};

StatusOr<DedupScratch> PlanDedup(int64_t n) {
  DedupScratch s;
  const int items = static_cast<int>(n);
  size_t sort_bytes = 0, scan_bytes = 0;
  FERRY_CUDA_RETURN_IF_ERROR(
      kOp, cub::DeviceRadixSort::SortPairs(
               nullptr, sort_bytes, static_cast<const int64_t*>(nullptr),
               static_cast<int64_t*>(nullptr), static_cast<const int32_t*>(nullptr),
               static_cast<int32_t*>(nullptr), items));
  FERRY_CUDA_RETURN_IF_ERROR(
      kOp, cub::DeviceScan::InclusiveSum(nullptr, scan_bytes,
                                         static_cast<const int32_t*>(nullptr),
                                         static_cast<int32_t*>(nullptr), items));
  s.cub_bytes = std::max(sort_bytes, scan_bytes);  // The sort and the scan run one after the other.
  const size_t positions = sizeof(int32_t) * static_cast<size_t>(n);
  s.sorted_ids = s.layout.Reserve(sizeof(int64_t) * static_cast<size_t>(n));
  s.positions = s.layout.Reserve(positions);
  s.sorted_positions = s.layout.Reserve(positions);
  s.flags = s.layout.Reserve(positions);
  s.ranks = s.layout.Reserve(positions);
  s.cub = s.layout.Reserve(s.cub_bytes);
  return s;
}

Status LaunchDedup(const DedupScratch& plan, void* scratch, const int64_t* ids, int64_t n,
                   int64_t* unique_ids, int32_t* inverse, int32_t* num_unique,
                   cudaStream_t stream) {
  if (n == 0) {
    FERRY_CUDA_RETURN_IF_ERROR(kOp, cudaMemsetAsync(num_unique, 0, sizeof(int32_t), stream));
    return Status::Ok();
  }
  int64_t* sorted_ids = plan.layout.Get<int64_t>(scratch, plan.sorted_ids);
  int32_t* positions = plan.layout.Get<int32_t>(scratch, plan.positions);
  int32_t* sorted_positions = plan.layout.Get<int32_t>(scratch, plan.sorted_positions);
  int32_t* flags = plan.layout.Get<int32_t>(scratch, plan.flags);
  int32_t* ranks = plan.layout.Get<int32_t>(scratch, plan.ranks);
  void* cub_storage = plan.layout.Get<void>(scratch, plan.cub);
  const int items = static_cast<int>(n);
  const unsigned int grid = detail::GridFor(n);

  IotaKernel<<<grid, detail::kBlock, 0, stream>>>(n, positions);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(kOp, IotaKernel);
  // Stable: equal ids keep ascending positions. All 64 bits: ids are arbitrary (hashes).
  size_t sort_bytes = plan.cub_bytes;
  FERRY_CUDA_RETURN_IF_ERROR(
      kOp, cub::DeviceRadixSort::SortPairs(cub_storage, sort_bytes, ids, sorted_ids, positions,
                                           sorted_positions, items, 0, 64, stream));
  HeadFlagsKernel<<<grid, detail::kBlock, 0, stream>>>(sorted_ids, n, flags);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(kOp, HeadFlagsKernel);
  size_t scan_bytes = plan.cub_bytes;
  FERRY_CUDA_RETURN_IF_ERROR(
      kOp, cub::DeviceScan::InclusiveSum(cub_storage, scan_bytes, flags, ranks, items, stream));
  ScatterKernel<<<grid, detail::kBlock, 0, stream>>>(sorted_ids, sorted_positions, flags, ranks,
                                                     n, unique_ids, inverse, num_unique);
  FERRY_CUDA_RETURN_IF_LAUNCH_FAILED(kOp, ScatterKernel);
  return Status::Ok();
}

}  // namespace

Status Dedup(void* scratch, size_t* scratch_bytes, const int64_t* ids, int64_t n,
             int64_t* unique_ids, int32_t* inverse, int32_t* num_unique, cudaStream_t stream) {
  if (scratch_bytes == nullptr) {
    return InvalidArgumentError(std::string(kOp) + ": scratch_bytes is null");
  }
  if (scratch == nullptr) {  // Phase one: the size only.
    FERRY_RETURN_IF_ERROR(internal::CheckSize(kOp, "n", n));
    FERRY_ASSIGN_OR_RETURN(const DedupScratch plan, PlanDedup(n));
    *scratch_bytes = plan.layout.bytes();
    return Status::Ok();
  }
  FERRY_RETURN_IF_ERROR(internal::CheckDedup(ids, n, unique_ids, inverse, num_unique));
  FERRY_RETURN_IF_ERROR(detail::CheckStream(kOp, stream));
  FERRY_ASSIGN_OR_RETURN(const DedupScratch plan, PlanDedup(n));
  FERRY_RETURN_IF_ERROR(detail::CheckScratch(kOp, scratch_bytes, plan.layout.bytes()));
  return LaunchDedup(plan, scratch, ids, n, unique_ids, inverse, num_unique, stream);
}

}  // namespace ferry::kernels::cuda
