// ps/server/internal/table_metrics.h — what a server counts per table, for its metrics page
// (ServerOptions::metrics_bind; the page itself: server_metrics.h).
//
// Per table, kept by the I/O thread (no locks; a snapshot crosses to the HTTP thread):
// requests and rows (elements, for dense tables) pulled and pushed, a staleness histogram of the
// async and ssp updates, and the hot ids: a Misra-Gries heavy-hitters summary of every
// kHotSampleEvery-th id pulled, kHotSlots counters. Misra-Gries guarantees that an id making up
// more than 1/(kHotSlots + 1) of the sample is among the kept ones; a kept id's count is a lower
// bound of its sampled count, within sample/(kHotSlots + 1) of it. Counts are reported scaled
// back by kHotSampleEvery (estimates of pulls of that id).
//
// Thread-safety: TableCounters and HotIds are plain data of one thread.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "internal/row_lifecycle.h"

namespace ferry::ps {

inline constexpr int kHotSlots = 16;
inline constexpr int kHotSampleEvery = 8;
inline constexpr size_t kTableStalenessBuckets = 65;  // staleness 0..63, and 64 or more

class HotIds {
 public:
  // Takes every kHotSampleEvery-th id of the stream (counting across calls).
  void Add(std::span<const int64_t> ids);
  // Up to `n` kept ids with their estimated pulls (the sampled count x kHotSampleEvery), most
  // first (ties: smaller id first).
  std::vector<std::pair<int64_t, int64_t>> Top(int n) const;

 private:
  void Count(int64_t id);
  std::array<int64_t, kHotSlots> ids_{};
  std::array<int64_t, kHotSlots> counts_{};  // 0: the slot is free
  uint64_t position_ = 0;
};

struct TableCounters {
  int64_t pull_requests = 0, push_requests = 0;
  int64_t rows_pulled = 0, rows_pushed = 0;  // sparse: rows; dense: elements
  std::array<int64_t, kTableStalenessBuckets> staleness{};
  HotIds hot;  // sparse tables: ids pulled

  void RecordStaleness(int64_t versions);
};

// One table as a snapshot shows it.
struct TableMetrics {
  std::string name;
  bool sparse = false;
  bool has_staleness = false;  // async and ssp tables: their updates' staleness is counted
  int64_t rows = 0;   // sparse: rows held; dense: elements held
  int64_t bytes = 0;  // what they take (values and optimizer state; sparse: slots and admission filter)
  TableCounters counters;
  RowLifecycleCounts lifecycle;  // sparse tables with lifecycle settings
  bool disk_tier = false;        // sparse tables with a disk tier: the two below are set
  int64_t disk_rows = 0;         // rows in its store (RocksDB's estimate: stale copies of promoted rows count)
  int64_t disk_bytes = 0;        // bytes of its store's files
};

}  // namespace ferry::ps
