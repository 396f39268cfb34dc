#include "internal/table_metrics.h"

#include <algorithm>

namespace ferry::ps {

void HotIds::Count(int64_t id) {
  int free_slot = -1;
  for (int i = 0; i < kHotSlots; ++i) {
    if (counts_[i] > 0 && ids_[i] == id) {
      ++counts_[i];
      return;
    }
    if (counts_[i] == 0 && free_slot < 0) free_slot = i;
  }
  if (free_slot >= 0) {
    ids_[free_slot] = id;
    counts_[free_slot] = 1;
    return;
  }
  for (int64_t& c : counts_) --c;  // Misra-Gries: every counter pays for the id not kept
}

void HotIds::Add(std::span<const int64_t> ids) {
  // The first sampled id of this call: the one at the next multiple of kHotSampleEvery.
  const uint64_t skip = (kHotSampleEvery - position_ % kHotSampleEvery) % kHotSampleEvery;
  for (size_t i = skip; i < ids.size(); i += kHotSampleEvery) Count(ids[i]);
  position_ += ids.size();
}

std::vector<std::pair<int64_t, int64_t>> HotIds::Top(int n) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int i = 0; i < kHotSlots; ++i) {
    if (counts_[i] > 0) out.emplace_back(ids_[i], counts_[i] * kHotSampleEvery);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (static_cast<int>(out.size()) > n) out.resize(static_cast<size_t>(std::max(n, 0)));
  return out;
}

void TableCounters::RecordStaleness(int64_t versions) {
  ++staleness[static_cast<size_t>(std::clamp<int64_t>(versions, 0, kTableStalenessBuckets - 1))];
}

}  // namespace ferry::ps
