// ps/server/internal/row_lifecycle.h — the parts of a sparse table's row lifecycle
// (TableSpec::admit_after, admit_probability, evict_after_steps, max_rows) that live beside the
// rows: the counting filter that admits ids, and what was admitted and evicted.
//
// Thread-safety: AdmissionFilter and RowLifecycleCounts are plain data of one thread (the
// server's I/O thread, through its SparseShard); RowLifecycleTotals are atomics that any thread
// may read (ServerStats) while the I/O thread adds to them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "ferry/table_spec.h"

namespace ferry::ps {

// What one table's shard did with its rows.
struct RowLifecycleCounts {
  int64_t admitted = 0;          // rows a push made once the filter let the id in
  int64_t not_admitted = 0;      // pushed rows counted, not stored: not admitted yet, or no room
  int64_t evicted_age = 0;       // rows untouched for evict_after_steps
  int64_t evicted_capacity = 0;  // rows given up for a new one: max_rows, or the memory budget
  int64_t demoted = 0;           // with a disk tier: rows written to disk to make room (not lost)
  int64_t promoted = 0;          // with a disk tier: rows read back from disk into RAM
  int64_t read_inline = 0;       // with a disk tier: ids looked up on disk by the calling thread (none read ahead)
};

// The same, summed over a server's tables.
struct RowLifecycleTotals {
  std::atomic<int64_t> admitted{0}, not_admitted{0}, evicted_age{0}, evicted_capacity{0}, demoted{0}, promoted{0};
  // Disk tier: ids looked up on disk by the calling thread itself (SparseShard::read_inline).
  std::atomic<int64_t> read_inline{0};
  // Disk tier: rows read ahead and kept for requests not yet served (SparseShard's), a level.
  std::atomic<int64_t> read_ahead_kept{0};
};

// A count-min sketch of pushes per id (of every id pushed to the shard, with a row or not): kDepth
// rows of saturating 8-bit counters, updated
// conservatively (only the smallest counters go up), so Add's estimate never undercounts an id's
// pushes since the last halvings and overcounts only through collisions. Every width()/2 adds all
// counters are halved, so ids seen long ago fade out and the filter does not fill up: an id is
// admitted when it is pushed admit_after times within about one such period (more, if its
// sightings span halvings).
class AdmissionFilter {
 public:
  static constexpr int kDepth = 4;
  static constexpr int kMaxCount = 255;

  // A filter for `spec`'s shard: width = 16 x max_rows rounded up to a power of two, within
  // [2^16, 2^22] counters a row (2^20 when max_rows is 0): 256 KiB to 16 MiB.
  AdmissionFilter(const TableSpec& spec, uint64_t table_id);
  // Whether a shard of `spec` keeps a filter: to admit rows (admit_after > 1), or to choose the
  // rows its disk tier's RAM keeps (disk_tier: the least pushed of a sample is demoted).
  static bool Wanted(const TableSpec& spec);
  // The bytes a filter for `spec` takes; 0 when the spec wants none.
  static int64_t Bytes(const TableSpec& spec);

  // Counts one more push of `id`; returns its estimated pushes (1..kMaxCount).
  int Add(int64_t id);
  // `id`'s estimated pushes, without counting one.
  int Estimate(int64_t id) const;
  int64_t width() const { return width_; }

 private:
  static int64_t Width(const TableSpec& spec);
  // The kDepth counters of `id`.
  void Cells(int64_t id, uint8_t* (&cell)[kDepth]) const;

  const int64_t width_;
  const uint64_t salt_;
  std::unique_ptr<uint8_t[]> counts_;  // kDepth x width_
  int64_t adds_ = 0;                   // since the last halving
};

}  // namespace ferry::ps
