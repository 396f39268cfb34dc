// ps/server/internal/table_registry.h — the tables one server holds, by id, and the checks that
// tie a request to them: declaring a table (idempotently), finding one of the right type,
// resolving a request's dense slices to the chunks held here, and checking that sparse ids
// belong to this server. Tables are never dropped, so a Table* stays valid.
//
// Thread-safety: none; the server's I/O thread owns it. Build alone may run on another thread
// (table_builder.h), on a table no one else touches.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "ferry/messages/wire.h"
#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "ferry/messages/placement.h"
#include "internal/memory_budget.h"
#include "internal/row_lifecycle.h"
#include "internal/tables.h"

namespace ferry::ps {

class TableRegistry {
 public:
  // Server `rank` of a job of `num_servers` (placed by their first map, placement.h).
  // `memory_budget`: the bytes this server's tables may take (0: MemoryBudget::DefaultLimit()).
  TableRegistry(int rank, int num_servers, int64_t memory_budget = 0)
      : rank_(rank),
        placement_(placement::Placement::First(num_servers)),  // (Server::Start: active_servers' first map)
        budget_(std::make_unique<MemoryBudget>(memory_budget)),
        lifecycle_(std::make_unique<RowLifecycleTotals>()) {}

  // The store where tables declared with disk_tier keep their rows beyond max_rows (must outlive
  // the registry); without one such tables are refused (FAILED_PRECONDITION).
  void SetDiskTier(DiskTier* disk) { disk_ = disk; }
  DiskTier* disk_tier() const { return disk_; }
  const placement::Placement& placement() const { return placement_; }
  // The map from now on (a hand-over's, HandOver in checkpoint.h, once the shards hold what it
  // gives this server).
  void SetPlacement(placement::Placement next) { placement_ = std::move(next); }

  // Declares `spec` under `claimed_id` (which must be the hash of its name) for a job of
  // `num_workers`. Declaring the same spec again is a no-op; a different spec under the same
  // name or id is AlreadyExists. ResourceExhausted when the shard would go over the memory
  // budget (saying how much it needs and how much is left) or cannot be allocated.
  // Create = Declare, Build, Adopt, on the calling thread.
  Status Create(TableSpec spec, uint64_t claimed_id, int num_workers);

  // Creation in steps, so that a large shard can be built off the I/O thread:
  //  Declare checks the declaration, charges the memory budget and returns the new table to
  //  build (its shard not yet made), or nullptr when the table exists already or is being built
  //  (`*pending` says which) under the same spec. Until Adopt or Forget the id is pending: a
  //  declaration for it is compared with this one, and requests for it are refused.
  //  Build makes the shard (any thread; it touches only `table` and the budget's atomic count).
  //  On failure (out of memory, cancelled) it gives the charge back.
  //  Adopt makes a built table this registry's; Forget drops a pending one whose Build failed.
  //  `take_chunking` (a client of 1.9 or later, which routes by the chunking the reply names): a
  //  dense table that exists keeps its chunk_elems, and a declaration that differs only there
  //  is the same declaration.
  StatusOr<std::unique_ptr<Table>> Declare(TableSpec spec, uint64_t claimed_id, int num_workers, bool* pending,
                                           bool take_chunking = false);
  // The spec of table `id`, declared or pending; nullptr when neither.
  const TableSpec* SpecOf(uint64_t id) const;
  Status Build(Table& table, int num_workers, const std::atomic<bool>* cancel = nullptr);
  void Adopt(std::unique_ptr<Table> table);
  void Forget(uint64_t id) { pending_.erase(id); }
  // The bytes Build will take for `table` (its dense shard; a sparse one's admission filter).
  int64_t BuildBytes(const Table& table) const;
  size_t pending() const { return pending_.size(); }

  // What the tables may take and have taken (dense shards when declared, sparse rows as created).
  const MemoryBudget& budget() const { return *budget_; }
  MemoryBudget& budget() { return *budget_; }
  // The sparse tables' row lifecycle counts, summed (atomics: any thread may read them).
  const RowLifecycleTotals& lifecycle() const { return *lifecycle_; }

  // NotFound for an undeclared id; InvalidArgument for a table of the other type.
  StatusOr<Table*> Find(uint64_t id, TableType type);
  const Table* Find(uint64_t id) const;  // nullptr when undeclared

  struct SliceRef {
    Table* table;
    DenseChunk* chunk;
  };
  // Resolves and checks every slice of a dense request (each chunk named once, held here, of
  // the size the slice says, the chunks together within `max_reply_bytes`) before anything is
  // changed.
  Status ResolveSlices(const wire::Header& h, int64_t max_reply_bytes, std::vector<SliceRef>* out);

  // FailedPrecondition when an id belongs to another server (client and server disagree on the cluster).
  Status CheckIds(const Table& t, std::span<const int64_t> ids) const;

  // Calls fn(Table&) for every table.
  template <typename Fn>
  void ForEach(Fn&& fn) {
    for (auto& [id, t] : tables_) fn(*t);
  }
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [id, t] : tables_) fn(static_cast<const Table&>(*t));
  }

 private:
  const int rank_;
  placement::Placement placement_;  // which server holds each chunk and id
  std::unique_ptr<MemoryBudget> budget_;  // behind a pointer: shards keep its address across moves
  std::unique_ptr<RowLifecycleTotals> lifecycle_;  // likewise
  DiskTier* disk_ = nullptr;                       // SetDiskTier
  std::unordered_map<uint64_t, std::unique_ptr<Table>> tables_;
  std::unordered_map<uint64_t, TableSpec> pending_;  // declared, being built
};

}  // namespace ferry::ps
