// ps/server/internal/tables.h — one server's shard of a table: storage, optimizer state, versions and
// the gradients held for a sync step. Pure data structures: no sockets, no locks (the server's
// I/O thread owns them; compute helpers only touch disjoint ranges during ParallelFor).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <absl/container/flat_hash_map.h>
#include <zmq.hpp>

#include "ferry/table_spec.h"
#include "internal/memory_budget.h"
#include "internal/table_metrics.h"
#include "internal/thread_pool.h"

namespace ferry::ps {

// Gradients received for the current sync step, one slot per worker rank.
struct SyncSlots {
  std::vector<std::optional<zmq::message_t>> by_rank;   // dense: the gradient frame
  std::vector<std::optional<zmq::message_t>> ids_by_rank;  // sparse: the id frame (grads in by_rank)
  int received = 0;

  void Reset(int num_workers, bool sparse);
};

struct DenseChunk {
  int64_t offset = 0;  // first element of the chunk in the flattened tensor
  int64_t size = 0;    // elements
  std::vector<float> params;
  std::vector<float> state;  // StateSlots() arrays of `size` floats
  int64_t version = 0;       // updates applied
  std::vector<int64_t> last_pulled;  // per rank: version at that worker's last pull (staleness)
  SyncSlots sync;
};

// A table's creation given up because the server is stopping.
struct Cancelled : std::exception {
  const char* what() const noexcept override { return "cancelled: the server is stopping"; }
};

class DenseShard {
 public:
  // Allocates and initialises the chunks that `placement` assigns to server `rank`. Throws
  // Cancelled if `cancel` becomes true on the way (looked at between chunks).
  DenseShard(const TableSpec& spec, uint64_t table_id, int rank, int num_servers, int num_workers,
             const std::atomic<bool>* cancel = nullptr);
  // The bytes the chunks of `spec` held by server `rank` take (parameters and optimizer state),
  // computed before anything is allocated.
  static int64_t HeldBytes(const TableSpec& spec, uint64_t table_id, int rank, int num_servers);
  // nullptr when `chunk` is out of range or not held here.
  DenseChunk* chunk(int64_t index);
  const DenseChunk* chunk(int64_t index) const { return const_cast<DenseShard*>(this)->chunk(index); }
  int64_t num_chunks() const { return static_cast<int64_t>(chunks_.size()); }
  int64_t held_chunks() const { return held_; }

 private:
  std::vector<std::unique_ptr<DenseChunk>> chunks_;  // indexed by chunk; null where not held
  int64_t held_ = 0;
};

// A row's index in its shard: 64-bit, so a shard never wraps around at 2^32 rows.
using RowIndex = uint64_t;

// id -> row of `dim` floats, rows created (and initialised) on first touch. Rows live in blocks
// that never move, so growing the table never copies it.
class SparseShard {
 public:
  // `budget` (may be null: no limit) is charged RowBytes() for every row created.
  SparseShard(const TableSpec& spec, uint64_t table_id, int num_workers, MemoryBudget* budget = nullptr);
  ~SparseShard();

  // The row's index, creating and initialising it if new. Strong guarantee: if creating the row
  // throws (std::bad_alloc; BudgetExceeded when the budget has no room for it), the shard is as it
  // was (no id without a row, no half-made row).
  // `over_budget_ok`: charge the budget even past its limit (see MemoryBudget::Force).
  RowIndex FindOrCreate(int64_t id, bool over_budget_ok = false);
  // The row of `id`, or kNoRow when it has none. Read-only: threads may look up at once while
  // nothing creates rows.
  static constexpr RowIndex kNoRow = ~RowIndex{0};
  RowIndex Find(int64_t id) const {
    auto it = index_.find(id);
    return it == index_.end() ? kNoRow : it->second;
  }
  // Starts loading the index slot of `id` into the cache: a lookup in a table larger than the
  // cache waits on memory, so a loop over ids prefetches a few ids ahead (kPrefetchAhead).
  void Prefetch(int64_t id) const { index_.prefetch(id); }
  static constexpr size_t kPrefetchAhead = 16;
  // How many distinct ids of `ids` have no row yet (what creating them would cost the budget).
  int64_t NewRows(std::span<const int64_t> ids) const;
  // Applies one gradient row per id (grads: ids.size() x dim) with the table's optimizer, each
  // row counting its own updates. Every row is found or created before any is updated, so
  // running out of memory leaves no update half-applied. A repeated id is applied in order.
  // `rows` is scratch.
  void ApplyRows(std::span<const int64_t> ids, const float* grads, std::vector<RowIndex>* rows,
                 bool over_budget_ok = false);
  float* row(RowIndex index) { return &blocks_[index / block_rows_][(index % block_rows_) * row_floats_]; }
  const float* row(RowIndex index) const { return &blocks_[index / block_rows_][(index % block_rows_) * row_floats_]; }
  int64_t steps(RowIndex index) const { return steps_[index]; }
  // Floats a row holds: its dim values, then its optimizer state.
  int64_t row_floats() const { return row_floats_; }
  // Calls fn(id, index) for every row, in no particular order.
  template <typename Fn>
  void ForEachRow(Fn&& fn) const {
    for (const auto& [id, index] : index_) fn(id, index);
  }
  float* state(RowIndex index) { return row(index) + dim_; }
  int64_t& steps(RowIndex index) { return steps_[index]; }
  int64_t dim() const { return dim_; }
  size_t size() const { return index_.size(); }
  // What one row costs the memory budget: its floats, its update count, its index entry.
  int64_t RowBytes() const { return row_floats_ * static_cast<int64_t>(sizeof(float)) + 24; }

  int64_t version = 0;  // pushes applied to this shard
  std::vector<int64_t> last_pulled;
  SyncSlots sync;

 private:
  const TableSpec& spec_;  // the owning Table's spec (Tables live behind unique_ptr and never move)
  uint64_t table_id_;
  MemoryBudget* budget_;  // the registry's; outlives the shard
  int64_t dim_;
  int64_t row_floats_;  // params + optimizer state of one row
  uint64_t block_rows_;  // rows per block: about 16 MiB a block, at least one row
  absl::flat_hash_map<int64_t, RowIndex> index_;
  size_t index_reserved_ = 0;  // index_ holds this many ids without growing (FindOrCreate)
  std::vector<std::unique_ptr<float[]>> blocks_;
  std::vector<int64_t> steps_;
};

struct Table {
  TableSpec spec;
  uint64_t id = 0;
  TableCounters counters;  // what the server counts of it (table_metrics.h)
  std::unique_ptr<DenseShard> dense;    // set for dense tables
  std::unique_ptr<SparseShard> sparse;  // set for sparse tables
};

}  // namespace ferry::ps
