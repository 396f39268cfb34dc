#include "internal/row_lifecycle.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "ferry/messages/placement.h"

namespace ferry::ps {

int64_t AdmissionFilter::Width(const TableSpec& spec) {
  if (spec.max_rows <= 0) return int64_t{1} << 20;
  const uint64_t want =
      static_cast<uint64_t>(std::clamp<int64_t>(16 * spec.max_rows, int64_t{1} << 16, int64_t{1} << 22));
  return static_cast<int64_t>(std::bit_ceil(want));
}

bool AdmissionFilter::Wanted(const TableSpec& spec) {
  return spec.type == TableType::kSparse && (spec.admit_after > 1 || spec.disk_tier);
}

int64_t AdmissionFilter::Bytes(const TableSpec& spec) { return Wanted(spec) ? kDepth * Width(spec) : 0; }

AdmissionFilter::AdmissionFilter(const TableSpec& spec, uint64_t table_id)
    : width_(Width(spec)),
      salt_(placement::Mix64(spec.seed ^ placement::Mix64(table_id ^ 0xAD317ull))),
      counts_(std::make_unique<uint8_t[]>(static_cast<size_t>(kDepth * width_))) {}

void AdmissionFilter::Cells(int64_t id, uint8_t* (&cell)[kDepth]) const {
  // Double hashing: kDepth cells from two hashes of the id (salted: not the server's placement hash).
  const uint64_t h1 = placement::Mix64(static_cast<uint64_t>(id) ^ salt_);
  const uint64_t h2 = placement::Mix64(h1) | 1;
  const uint64_t mask = static_cast<uint64_t>(width_) - 1;
  for (int d = 0; d < kDepth; ++d) {
    cell[d] = &counts_[static_cast<size_t>(d * width_) + ((h1 + static_cast<uint64_t>(d) * h2) & mask)];
  }
}

int AdmissionFilter::Estimate(int64_t id) const {
  uint8_t* cell[kDepth];
  Cells(id, cell);
  int least = kMaxCount;
  for (const uint8_t* c : cell) least = std::min<int>(least, *c);
  return least;
}

int AdmissionFilter::Add(int64_t id) {
  uint8_t* cell[kDepth];
  Cells(id, cell);
  int least = kMaxCount;
  for (const uint8_t* c : cell) least = std::min<int>(least, *c);
  const int now = std::min(least + 1, kMaxCount);
  for (uint8_t* c : cell) *c = static_cast<uint8_t>(std::max<int>(*c, now));  // conservative update
  if (++adds_ >= width_ / 2) {
    adds_ = 0;
    for (int64_t i = 0; i < kDepth * width_; ++i) counts_[static_cast<size_t>(i)] >>= 1;
  }
  return now;
}

}  // namespace ferry::ps
