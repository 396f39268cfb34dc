// ps/server/internal/updates.h — the work on a shard's numbers: applying gradients with the
// table's optimizer, and copying sparse rows out for a pull (a dense pull sends the chunk's values
// without a copy: shared_floats.h). Big chunks and batches of rows are
// shared with the compute pool; the I/O thread takes a share and waits for the rest.
//
// Thread-safety: one thread at a time (the server's I/O thread), like the pool it drives.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/table_spec.h"
#include "internal/tables.h"
#include "internal/thread_pool.h"

namespace ferry::ps {

class Updater {
 public:
  explicit Updater(ThreadPool& pool) : pool_(pool) {}

  // Ranges of about this many floats go to one thread: 2^18 (1 MiB), so that a tensor of up to
  // 1 MiB is never split across the helper threads, whose hand-off cost more than the work it
  // shared (bench/RESULTS.md "The server's threads, decided": over 15 rounds, 2^18 with one
  // helper was within 1.086 of the best of four settings on every benchmark; 2^16, as before,
  // was 1.305 behind on 1 MiB pushes).
  static constexpr int64_t kGrain = 1 << 18;

  // One gradient of the whole chunk, as the chunk's update number `step` (1-based). Elements whose
  // update would not be finite keep their value and state: returned, `first` an index in the chunk.
  NotFinite ApplyDense(const OptimizerSpec& opt, DenseChunk& c, const float* grad, int64_t step);
  // One gradient row per id (see SparseShard::ApplyRows).
  NotFinite ApplyRows(SparseShard& shard, std::span<const int64_t> ids, const float* grads,
                      bool over_budget_ok = false) {
    return shard.ApplyRows(ids, grads, &rows_, over_budget_ok);
  }
  // The sum of `grads[k][i]` over k, divided by grads.size(), applied as update `step`: a sync
  // step's gradients added in the order given (rank order), so every run adds the same numbers
  // in the same order whatever the thread count.
  // What was refused as ApplyDense says.
  NotFinite ApplyDenseAverage(const OptimizerSpec& opt, DenseChunk& c, std::span<const float* const> grads,
                              int64_t step);

  // One table's rows of a pull: the rows of `ids` into `dst` (ids.size() x dim floats).
  struct RowRead {
    SparseShard* shard;
    std::span<const int64_t> ids;
    float* dst;
  };
  // The rows of one or more tables (each table at most once). Existing rows of tables without
  // lifecycle settings are looked up in parallel; then, serially, such a table creates its new
  // rows (creation charges the budget and may throw) and a table with lifecycle settings finds
  // (and stamps) its rows; every row is then copied in one parallel loop over all the tables, an
  // id without a row (not admitted, or evicted) getting its initial values.
  void ReadRows(std::span<const RowRead> reads);
  void ReadRows(SparseShard& shard, std::span<const int64_t> ids, float* dst) {
    const RowRead one{&shard, ids, dst};
    ReadRows(std::span<const RowRead>(&one, 1));
  }

 private:
  // Merges a range's refusals (first: relative to `begin`) into `into`, from any pool thread.
  void Refused(NotFinite nf, int64_t begin, NotFinite* into);

  ThreadPool& pool_;
  Mutex refused_mu_;  // Refused's
  std::vector<float> avg_;     // scratch for ApplyDenseAverage
  std::vector<RowIndex> rows_;  // scratch for row indices
  std::vector<size_t> starts_;  // scratch: ReadRows' first position of each table in rows_
};

}  // namespace ferry::ps
