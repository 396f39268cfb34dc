// CPU id deduplication with the inverse map.
#include <algorithm>
#include <utility>
#include <vector>

#include "ferry/kernels.h"
#include "internal/shapes.h"

namespace ferry::kernels::cpu {

Status Dedup(const int64_t* ids, int64_t n, int64_t* unique_ids, int32_t* inverse,
             int32_t* num_unique) {
  FERRY_RETURN_IF_ERROR(internal::CheckDedup(ids, n, unique_ids, inverse, num_unique));
  // Sort (id, position) pairs; equal ids stay in position order, as in the CUDA twin's stable
  // radix sort.
  std::vector<std::pair<int64_t, int32_t>> sorted(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sorted[i] = {ids[i], static_cast<int32_t>(i)};
  std::sort(sorted.begin(), sorted.end());
  int32_t u = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || sorted[i].first != sorted[i - 1].first) unique_ids[u++] = sorted[i].first;
    inverse[sorted[i].second] = u - 1;
  }
  num_unique[0] = u;
  return Status::Ok();
}

}  // namespace ferry::kernels::cpu
