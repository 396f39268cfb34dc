// ps/server/internal/tables.h — one server's shard of a table: storage, optimizer state, versions and
// the gradients held for a sync step. Pure data structures: no sockets, no locks (the server's
// I/O thread owns them; compute helpers only touch disjoint ranges during ParallelFor).
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <zmq.hpp>

#include "ferry/messages/placement.h"
#include "ferry/table_spec.h"
#include "internal/disk_tier.h"
#include "internal/optimizer.h"
#include "internal/memory_budget.h"
#include "internal/row_lifecycle.h"
#include "internal/shared_floats.h"
#include "internal/table_metrics.h"
#include "internal/thread_pool.h"

namespace ferry::ps {

// Gradients received for the current sync step, one slot per worker rank.
struct SyncSlots {
  std::vector<std::optional<zmq::message_t>> by_rank;   // dense: the gradient frame
  std::vector<std::optional<zmq::message_t>> ids_by_rank;  // sparse: the id frame (grads in by_rank)
  int received = 0;
  // Ranks whose held gradient is marked as sent already: one a replacement took from its backup's
  // image (1.23: the worker, told it was held, sends it again only if the answer was lost), or one
  // a worker's earlier process pushed (its new process's Hello marks it, and the new process sends
  // the step again). Such a push of the step is a replay, not a second push (ResentHold).
  std::vector<bool> restored;
  // 1.23, replication 2: the closes of this unit forwarded to the backup and not confirmed yet;
  // pulls see the version less these (ServerImpl::Settled). Not cleared by Reset.
  int closes_unconfirmed = 0;

  void Reset(int num_workers, bool sparse);
};

// Exactly once across a worker's restart (async and ssp tables): by worker rank, one more than the
// highest step of its pushes this part (a dense chunk, or a server's shard of a sparse table)
// applied, and the step below which a push of that rank replays its predecessor's: set by a Hello
// that says it `resumes` (ServerImpl::OnHello), so the restarted worker, which resumes at the
// lowest step any server knew, is not applied twice where a server had taken it.
struct StepsTaken {
  std::vector<int64_t> taken;
  std::vector<int64_t> floor;
  void Took(int rank, int64_t step) {
    const size_t r = static_cast<size_t>(rank);
    if (r >= taken.size()) taken.resize(r + 1, 0);
    taken[r] = std::max(taken[r], step + 1);
  }
  bool Replayed(int rank, int64_t step) const {
    const size_t r = static_cast<size_t>(rank);
    return r < floor.size() && step < floor[r];
  }
  void Restarted(int rank) {
    const size_t r = static_cast<size_t>(rank);
    if (r >= floor.size()) floor.resize(r + 1, 0);
    floor[r] = r < taken.size() ? taken[r] : 0;
  }
};

struct DenseChunk {
  int64_t offset = 0;  // first element of the chunk in the flattened tensor
  int64_t size = 0;    // elements
  SharedFloats params;         // shared with the pull replies that send them (copy-on-write)
  std::vector<float> state;  // StateSlots() arrays of `size` floats
  int64_t version = 0;       // updates applied
  int64_t saved_version = -1;  // version when the last checkpoint copied it (-1: none has): a delta takes it if changed
  std::vector<int64_t> last_pulled;  // per rank: version at that worker's last pull (staleness)
  SyncSlots sync;
  // Restored: the server that held it at the checkpoint, for its replay floors (Table::replay); -1: none.
  int replay_owner = -1;
  int64_t feed_seq = 0;  // the change feed: its shard's feed_clock when it last changed (ServerImpl stamps it)
  StepsTaken steps_taken;  // async and ssp pushes
};

// A table's creation given up because the server is stopping.
struct Cancelled : std::exception {
  const char* what() const noexcept override { return "cancelled: the server is stopping"; }
};

class DenseShard {
 public:
  // Allocates and initialises the chunks that `placement` assigns to server `rank`. Throws
  // Cancelled if `cancel` becomes true on the way (looked at between chunks).
  DenseShard(const TableSpec& spec, uint64_t table_id, int rank, const placement::Placement& placement,
             int num_workers, const std::atomic<bool>* cancel = nullptr);
  // The bytes the chunks of `spec` held by server `rank` take (parameters and optimizer state),
  // computed before anything is allocated.
  static int64_t HeldBytes(const TableSpec& spec, uint64_t table_id, int rank, const placement::Placement& placement);
  // nullptr when `chunk` is out of range or not held here.
  DenseChunk* chunk(int64_t index);
  // A placement hand-over (1.17): chunk `index` comes here (allocated and initialised as the
  // constructor would: the caller then gives it the values it had), or goes (its frames already
  // sent keep their values: SharedFloats). Take of a chunk held, or Drop of one not, is a no-op.
  // Take throws std::bad_alloc as the constructor does.
  DenseChunk* Take(const TableSpec& spec, uint64_t table_id, int64_t index, int num_workers);
  void Drop(int64_t index);
  // The elements of chunk `index` of `spec` (the last may be shorter), and the bytes it takes
  // (parameters and optimizer state).
  static int64_t ChunkElems(const TableSpec& spec, int64_t index) {
    return std::min(spec.chunk_elems, spec.num_elements() - index * spec.chunk_elems);
  }
  static int64_t ChunkBytes(const TableSpec& spec, int64_t index);
  const DenseChunk* chunk(int64_t index) const { return const_cast<DenseShard*>(this)->chunk(index); }
  int64_t num_chunks() const { return static_cast<int64_t>(chunks_.size()); }
  int64_t held_chunks() const { return held_; }

  // The change feed (PROTOCOL.md, "The change feed"): rounds cut so far. A chunk updated is
  // stamped with it (DenseChunk::feed_seq), so a round cut at c sends the chunks stamped after c.
  int64_t feed_clock = 0;

 private:
  std::vector<std::unique_ptr<DenseChunk>> chunks_;  // indexed by chunk; null where not held
  int64_t held_ = 0;
};

// A row's index in its shard: 64-bit, so a shard never wraps around at 2^32 rows.
using RowIndex = uint64_t;
// No row (SparseShard::FindForPull, and ApplyRows's `rows` for a gradient not stored).
inline constexpr RowIndex kNoRow = ~RowIndex{0};

// id -> row of `dim` floats. Rows live in blocks that never move, so growing the table never
// copies it.
//
// A table without lifecycle settings (TableSpec::has_lifecycle) creates a row on first touch, pull
// or push, and keeps it forever. With them (the README's "Row lifecycle"):
//  - only a push makes a row, once the id is admitted (AdmissionFilter, then a deterministic coin
//    of admit_probability: a hash of seed, table, id and the shard's sightings so far); a pull of
//    an id without a row serves InitialRow and changes nothing; a push's row not admitted is
//    counted and dropped;
//  - the shard's clock counts its ApplyRows calls (one a step for sync tables and --local; one a
//    worker push for async and ssp, so evict_after_steps is scaled by the workers there). A pull
//    or push of a row stamps it with the clock;
//  - each ApplyRows ends with an age sweep of a bounded number of slots (kSweepSlots + 2 a row
//    pushed), from a cursor that goes round the table, evicting the rows older than
//    evict_after_steps: no pause grows with the table;
//  - a row beyond max_rows, or one the memory budget has no room for, takes the place of a victim:
//    of kEvictionSample live rows drawn at random (a seeded generator: deterministic), the least
//    recently touched, ties to the fewest updates. Rows of the ApplyRows in progress are never
//    victims. With a filter (admit_after > 1), which then counts the pushes of every id, the new
//    row takes the victim's place only if the filter says it was pushed more often (TinyLFU's
//    rule: a full table does not trade a recurring row for a passing one). Otherwise, or with no
//    victim, the new row is not stored (counted as not admitted);
//  - an evicted row's slot goes on a free list and is reused by the next new row. A slot stays
//    charged to the memory budget (its memory stays allocated), so the budget's count remains the
//    truth; a table under max_rows never holds more than max_rows slots.
//
// The disk tier (issue 37; AttachDisk, a table with lifecycle settings): a row that would be
// evicted to make room (max_rows, or the memory budget) is written to the store first, with its
// optimizer state and update count (demoted), so no row is lost; a row that is not in RAM but on
// disk is read back and made a row again (promoted) before a push updates it (ApplyRows, which
// reads the push's cold ids in one batch) or a pull serves it (PromoteForPull first). A promoted
// row's copy stays on disk, stale and shadowed by the RAM row: the next demotion overwrites it,
// and an age eviction erases it (an id aged out starts anew, as without the tier). No row of a
// call is ever dropped for want of room: a call that names more rows than max_rows holds them
// all, and the next call first demotes the RAM tier back to max_rows (ShrinkToMaxRows). Reads and
// writes are synchronous on the calling thread. A checkpoint copies the RAM tier's rows and the
// store (checkpoint.h, CopyDiskTier); delta checkpoints and the change feed do not follow such a
// shard: AttachDisk refuses a shard that feeds or tracks changes, and StartFeed a shard with a disk.
// Which rows stay in RAM (TinyLFU's rule): such a shard keeps an AdmissionFilter of its pushes
// (admitting every row when admit_after <= 1). Its victim is the least pushed of the sample, ties
// to the least recently touched, and a row made or promoted takes the victim's place only if the
// filter counts more pushes of it (a promoted row's earlier pushes; a new row's, this one
// included); otherwise it is made beside the tier, on probation: used from RAM, never a victim,
// until an ApplyRows that does not name it demotes it (DemoteProbation; pulls alone demote them
// past max_rows / 8 of them). So a stream of rows pushed once passes through without taking the
// place of recurring ones.
class SparseShard {
 public:
  static constexpr int kEvictionSample = 8;   // live rows looked at for one victim
  static constexpr int kEvictionDraws = 32;   // random slots drawn to find them
  static constexpr int64_t kSweepSlots = 64;  // slots each ApplyRows looks at for aged rows, + 2 a row

  // `budget` (may be null: no limit) is charged RowBytes() for every slot created. `totals` (may
  // be null) receives this shard's lifecycle counts as well.
  SparseShard(const TableSpec& spec, uint64_t table_id, int num_workers, MemoryBudget* budget = nullptr,
              RowLifecycleTotals* totals = nullptr);
  ~SparseShard();

  // The row's index, creating and initialising it if new (whatever the lifecycle settings:
  // restoring a checkpoint uses it). Strong guarantee: if creating the row throws (std::bad_alloc;
  // BudgetExceeded when the budget has no room for it, or a table at max_rows has no row to give
  // up), the shard is as it was (no id without a row, no half-made row), except for a row it
  // evicted to make room.
  // `over_budget_ok`: charge the budget even past its limit (see MemoryBudget::Force).
  RowIndex FindOrCreate(int64_t id, bool over_budget_ok = false);
  // A resumed job's new lifecycle settings (`to`: admit_after, admit_probability,
  // evict_after_steps, max_rows), before the owning Table's spec becomes `to`; the shard must
  // have lifecycle settings before and after (CompareSpecs refuses turning them on or off). The
  // admission filter is made anew when its size changes or admit_after goes above 1 (its counts
  // start over) and dropped at admit_after 1, the memory budget charged or given the
  // difference (RESOURCE_EXHAUSTED when it has no room: nothing changes); a lower max_rows takes
  // effect as rows come (each new row evicts one while the table is at or above it).
  Status ChangeLifecycle(const TableSpec& to);
  // Puts the rows of this table into `disk` (which must outlive the shard) from now on: adds the
  // table to it. FAILED_PRECONDITION without lifecycle settings, or when the shard feeds or
  // tracks changes.
  Status AttachDisk(DiskTier* disk);
  bool has_disk() const { return disk_ != nullptr; }
  // Before a pull of `ids` is served by FindForPull: the ids without a row in RAM that are on disk
  // are promoted (one batched read). A call that names more rows than max_rows takes them all:
  // the RAM tier holds more than max_rows until the next call (a pull or push) demotes the rows
  // beyond it; rows promoted onto probation stay beside it (DemoteProbation). Throws
  // DiskTierError when the disk fails, BudgetExceeded when the memory budget has no room. Nothing
  // is promoted without a disk.
  void PromoteForPull(std::span<const int64_t> ids);
  // Reading ahead (with a disk; the server's disk readers, so that its I/O thread never waits for
  // the disk): the rows a call will need from disk are read on other threads before the call, and
  // kept here ("read ahead") until PromoteCold uses them. A kept row is always the store's current
  // row: every write or erase of an id drops what was read ahead of it, and a read that raced
  // with a write of an id keeps nothing of it (EndReadAhead). At most max(max_rows, 1024) rows of
  // the table are kept (beside the memory budget); one more lets them all go (those of requests
  // refused, or late: never used). A row PromoteCold needs and finds no read of, it reads on its
  // own thread (counted: lifecycle().read_inline).
  //
  // The distinct ids of `ids` a call would read from disk (neither in RAM nor read ahead), after
  // a look without I/O (DiskTier::ReadCached): what that finds, or knows to be absent, is kept as
  // read ahead; the rest, which need a read of the disk, go to `need`. A failed look keeps
  // nothing and returns its error (the call then meets it).
  Status ColdForReadAhead(std::span<const int64_t> ids, std::vector<int64_t>* need);
  // A read of the disk on another thread begins (returned: its mark, for EndReadAhead) or ends:
  // its rows (`found`, `steps`, `rows` as DiskTier::Read's; `ok` false: a failed read, nothing
  // kept) are kept, except ids in RAM now and ids written or erased since it began.
  uint64_t BeginReadAhead();
  void EndReadAhead(uint64_t mark, std::span<const int64_t> ids, const float* rows, const int64_t* steps,
                    const std::vector<bool>& found, bool ok);
  // The row that serves a pull of `id`: with lifecycle settings, its row (stamped with the clock)
  // or kNoRow when it has none (serve InitialRow); without, FindOrCreate(id).
  RowIndex FindForPull(int64_t id);
  // The row of `id`, or kNoRow when it has none; touches nothing (no clock stamp). Read-only:
  // threads may look up at once while nothing creates or evicts rows.
  RowIndex Find(int64_t id) const {
    auto it = index_.find(id);
    return it == index_.end() ? kNoRow : it->second;
  }
  // Starts loading the index slot of `id` into the cache: a lookup in a table larger than the
  // cache waits on memory, so a loop over ids prefetches a few ids ahead (kPrefetchAhead).
  void Prefetch(int64_t id) const { index_.prefetch(id); }
  static constexpr size_t kPrefetchAhead = 16;
  // `id`'s initial values (dim floats): what a row made for it would start with.
  void InitialRow(int64_t id, float* out) const;
  // How many rows pushing or pulling `ids` could ask of the memory budget: the distinct ids of
  // `ids` without a row; 0 for a table with lifecycle settings (a pull makes no row, and a push
  // evicts to make room or does not store the row).
  int64_t NewRows(std::span<const int64_t> ids) const;
  // Applies one gradient row per id (grads: ids.size() x dim) with the table's optimizer, each
  // row counting its own updates. Every row is found or created before any is updated, so
  // running out of memory leaves no update half-applied. A repeated id is applied in order.
  // With lifecycle settings, rows not admitted are skipped ((*rows)[i] = kNoRow), and the age
  // sweep follows. With a disk, the push's ids on disk are promoted first (their updates then
  // apply to their rows; throws DiskTierError or BudgetExceeded as PromoteForPull, before any
  // update). `rows` is scratch. An element whose update would not be finite keeps its value
  // and state (ApplyUpdate); what was refused is returned, `first` its element in the row of `id`
  // (a row none of whose elements took the update does not count it in its steps).
  NotFinite ApplyRows(std::span<const int64_t> ids, const float* grads, std::vector<RowIndex>* rows,
                      bool over_budget_ok = false);
  float* row(RowIndex index) { return &blocks_[index / block_rows_][(index % block_rows_) * row_floats_]; }
  const float* row(RowIndex index) const { return &blocks_[index / block_rows_][(index % block_rows_) * row_floats_]; }
  int64_t steps(RowIndex index) const { return steps_[index]; }
  // Floats a row holds: its dim values, then its optimizer state.
  int64_t row_floats() const { return row_floats_; }
  // A placement hand-over (1.17): the row of `id` leaves this server (another holds it from now
  // on): its id is unindexed, and noted as deleted where an eviction would be (delta checkpoints,
  // the change feed). Its slot is freed for the next row this shard makes (and stays allocated
  // and charged to the memory budget until then: memory reused, not returned). A no-op for an id
  // without a row.
  void Forget(int64_t id);
  // Calls fn(id, index) for every row, in no particular order (evicted rows are gone).
  template <typename Fn>
  void ForEachRow(Fn&& fn) const {
    for (const auto& [id, index] : index_) fn(id, index);
  }
  float* state(RowIndex index) { return row(index) + dim_; }
  int64_t& steps(RowIndex index) { return steps_[index]; }
  int64_t dim() const { return dim_; }
  size_t size() const { return index_.size(); }
  // Row slots allocated: rows held plus free slots of evicted rows.
  size_t slots() const { return steps_.size(); }
  // What one row costs the memory budget: its floats, its update count, its index entry, and
  // with lifecycle settings its id and clock stamp.
  int64_t RowBytes() const {
    return row_floats_ * static_cast<int64_t>(sizeof(float)) + 24 + (lifecycle_ ? 16 : 0) +
           (feed_ ? FeedRowBytes() : 0);
  }
  // What the shard holds: its slots, and its admission filter (charged when the table was declared).
  int64_t HeldBytes() const {
    return static_cast<int64_t>(slots()) * RowBytes() + AdmissionFilter::Bytes(spec_);
  }
  bool has_lifecycle() const { return lifecycle_; }
  const RowLifecycleCounts& lifecycle() const { return counts_; }

  // What changed since the last checkpoint, for delta checkpoints (messages/CHECKPOINT.md). Off
  // until TrackChanges (the first checkpoint of a server that writes deltas turns it on); from
  // then on each row a push reaches is noted once (before any row of the push is updated: no
  // half-applied push on running out of memory), and the id of each row evicted with updates.
  // TakeChanges hands both over and starts counting anew. Costs 1 byte a slot, 16 bytes a row
  // noted (compacted to the rows still held when the list passes twice the slots) and an entry a
  // deleted id, not charged to the memory budget. Past 2 x slots + 1024 deleted ids (a table
  // whose rows churn through its max_rows), or when recording one runs out of memory, the count
  // gives up until TakeChanges: `complete` is then false, and the table is copied whole.
  struct Changes {
    std::vector<std::pair<int64_t, RowIndex>> rows;  // rows with updates noted since, in no particular order
    std::vector<int64_t> deleted;                     // ids evicted since with updates, ascending
    bool complete = true;                             // false: gave up (rows and deleted are empty)
  };
  void TrackChanges() { track_ = true; }
  bool tracking() const { return track_; }
  bool changes_complete() const { return !overflow_; }
  Changes TakeChanges();
  // At least the rows TakeChanges would give now (rows noted, some maybe evicted since).
  size_t ChangedRowsBound() const { return changed_list_.size(); }
  int64_t clock() const { return clock_; }

  // The change feed (PROTOCOL.md, "The change feed"): off until a reader's first Changes request
  // (StartFeed). From then on every row made or updated is stamped with the feed's clock (the
  // rounds cut so far), and every row evicted is logged with it, so a round cut at c sends the
  // rows stamped after c and the ids evicted after c. Costs FeedRowBytes() a slot, charged to the
  // memory budget (RESOURCE_EXHAUSTED, nothing changed, when it has no room), and 16 bytes an
  // eviction logged: the log keeps at most max(kFeedLogMin, slots) entries, dropping its oldest
  // half when full (a cursor from before what it still holds gets a full round).
  static constexpr uint64_t kFeedBlock = 1024;    // slots per entry of the feed's block index
  static constexpr size_t kFeedLogMin = 4096;
  Status StartFeed();
  bool feeding() const { return feed_ != nullptr; }
  int64_t FeedRowBytes() const { return lifecycle_ ? 8 : 16; }
  // The feed's clock now; Cut() returns it and moves it on (a round's cut).
  int64_t feed_clock() const { return feed_->clock; }
  int64_t Cut() { return feed_->clock++; }
  // A cursor below this needs a full round: the evictions after it are no longer all logged.
  int64_t feed_log_floor() const { return feed_->log_floor; }
  // Appends the rows stamped after `after` (ids, and dim values each) from slot `from` on, until
  // `max_rows` rows are found or `max_work` units of work are done (a slot looked at, or a block
  // of kFeedBlock slots passed over as unchanged, is one); returns the slot to go on from, 0 when
  // the scan reached the end. Rows of every slot below the returned one were looked at.
  uint64_t ScanChanged(int64_t after, uint64_t from, size_t max_rows, uint64_t max_work, std::vector<int64_t>* ids,
                       std::vector<float>* values) const;
  // The ids evicted after `after`, in order of eviction (an id may repeat).
  void EvictedSince(int64_t after, std::vector<int64_t>* ids) const;

  int64_t version = 0;  // pushes applied to this shard
  std::vector<int64_t> last_pulled;
  SyncSlots sync;
  StepsTaken steps_taken;  // async and ssp pushes

 private:
  static constexpr int64_t kPinned = int64_t{1} << 62;  // touch_: a row of the ApplyRows in progress
  static constexpr int64_t kFree = -1;                  // touch_: a free slot
  static constexpr int kAlwaysWins = INT_MAX;           // MakeRow: a new row that takes any victim's place

  // Makes a row for `id` (not indexed yet), whose pushes the filter estimates at `pushes`
  // (kAlwaysWins: no comparison). kNoRow when there is no room and `drop_if_no_room`, or when
  // the victim was pushed as often as `id`; otherwise no room throws BudgetExceeded.
  RowIndex MakeRow(int64_t id, bool over_budget_ok, bool drop_if_no_room, int pushes = kAlwaysWins);
  // Grows index_ (by a swapped-in copy) so that one more id fits without allocating.
  void ReserveOneMore();
  // Whether a push of `id`, which has no row, admits it (counts the sighting): 0 if not, else
  // its estimated pushes (kAlwaysWins without a filter).
  int Admit(int64_t id);
  enum class Room { kMade, kNoVictim, kVictimHotter };
  // Evicts the victim of a sample of rows for a new row pushed `pushes` times: kVictimHotter
  // (nothing evicted) when the filter estimates the victim's pushes at `pushes` or more.
  Room EvictOne(int pushes);
  void Evict(RowIndex slot, int64_t* counter, std::atomic<int64_t>* total);
  // Row `slot` of `id` is leaving: noted as deleted for delta checkpoints and the change feed.
  void NoteGone(RowIndex slot, int64_t id);
  void SweepAged(int64_t slots);
  // TrackChanges: notes row `r` of `id` as changed (once until TakeChanges).
  void NoteChanged(int64_t id, RowIndex r);
  // The count of changes gives up until TakeChanges (its memory freed).
  void GiveUpChanges();
  // The feed's stamp of slot `r`, made or updated (the feed's arrays hold it already).
  void FeedStamp(RowIndex r, int64_t id) {
    feed_->seq[r] = feed_->clock;
    feed_->block_max[r / kFeedBlock] = feed_->clock;
    if (!lifecycle_) feed_->ids[r] = id;
  }
  // Sizes the feed's per-slot arrays for `slots` slots (may throw std::bad_alloc).
  void FeedGrow(size_t slots);
  // With a disk: pins the rows of `ids` in RAM, then promotes the ids without a row in RAM that
  // are on disk (one batched read; each distinct id once), pinned too; every row pinned is
  // appended to `made` (the caller unpins them, however it leaves).
  void PromoteCold(std::span<const int64_t> ids, bool over_budget_ok, std::vector<RowIndex>* made);
  // Stamps the rows of `made` with the clock (unpins them).
  void Unpin(const std::vector<RowIndex>& made) {
    for (RowIndex r : made) touch_[r] = clock_;
  }
  // With a disk: writes the row of `slot` to it before the slot is given up (throws DiskTierError).
  void Demote(RowIndex slot);
  // With a disk: demotes rows until the RAM tier holds max_rows (a call that used more rows than
  // max_rows left it above; nothing is pinned between calls), beside the rows on probation.
  // Throws DiskTierError.
  void ShrinkToMaxRows();
  // With a disk: demotes the rows on probation (brought into RAM by an earlier call although no
  // more pushed than the victim they would have replaced) that the call does not name (`ids`),
  // in id order. `keep_recent` (ApplyRows) keeps those touched within the last ticks_per_step_ - 1
  // clock ticks (async and ssp: another worker's push between a worker's pull and its own);
  // PromoteForPull calls it, without, once more than max(max_rows / 8, twice the pull's ids) rows
  // are on probation. Throws
  // DiskTierError (the rows not yet demoted stay on probation).
  void DemoteProbation(std::span<const int64_t> ids, bool keep_recent);
  // One row's update (ApplyRows), its refusals merged into `refused`.
  void UpdateRow(int64_t id, RowIndex r, const float* grad, NotFinite* refused);
  uint64_t NextRandom();

  const TableSpec& spec_;  // the owning Table's spec (Tables live behind unique_ptr and never move)
  uint64_t table_id_;
  MemoryBudget* budget_;  // the registry's; outlives the shard
  RowLifecycleTotals* totals_;  // the registry's, or null
  int64_t dim_;
  int64_t row_floats_;  // params + optimizer state of one row
  uint64_t block_rows_;  // rows per block: about 16 MiB a block, at least one row
  absl::flat_hash_map<int64_t, RowIndex> index_;
  size_t index_reserved_ = 0;  // index_ holds this many ids without growing (FindOrCreate)
  // Whether ids are ever erased from index_ (lifecycle settings, or a row given up by Forget):
  // ReserveOneMore then grows it earlier (absl reuses erased entries only below 25/32 full).
  bool erases_ = false;
  // Without lifecycle settings: the slots of rows given up (Forget), which new rows take first.
  std::vector<RowIndex> forgotten_;
  // Whether slot `r`, noted for `id`, holds another id's row now (or none): `id` was evicted or
  // given up since. (Without lifecycle settings and with nothing ever given up, slots never change
  // hands: no lookup.)
  bool SlotTakenSince(int64_t id, RowIndex r) const {
    if (lifecycle_) return ids_[r] != id;
    return erases_ && Find(id) != r;
  }
  std::vector<std::unique_ptr<float[]>> blocks_;
  std::vector<int64_t> steps_;  // per slot: updates applied to its row
  bool track_ = false;          // TrackChanges
  bool overflow_ = false;       // the count of changes gave up (Changes::complete)
  std::vector<uint8_t> changed_;  // per slot (grown as noted): its row was noted since TakeChanges
  std::vector<std::pair<int64_t, RowIndex>> changed_list_;  // (id, slot) of each noted row
  absl::flat_hash_set<int64_t> deleted_;  // ids evicted with updates since TakeChanges
  struct Feed {
    int64_t clock = 0;                 // rounds cut
    std::vector<int64_t> seq;          // per slot: the clock when its row was last made or updated
    std::vector<int64_t> block_max;    // per kFeedBlock slots: the highest seq among them
    std::vector<int64_t> ids;          // per slot: its row's id (tables without lifecycle settings)
    std::vector<std::pair<int64_t, int64_t>> evicted;  // (clock, id) of each eviction, oldest first
    int64_t log_floor = -1;            // evictions at or before this clock may be missing from the log
  };
  std::unique_ptr<Feed> feed_;  // StartFeed

  // Lifecycle settings only.
  const bool lifecycle_;
  int64_t ticks_per_step_ = 1;     // clock ticks a step: 1 for sync, the worker count otherwise
  int64_t evict_after_ticks_ = 0;  // evict_after_steps in clock ticks (0: never)
  std::vector<int64_t> ids_;       // per slot: its row's id, or for a free slot the next free one
  std::vector<int64_t> touch_;     // per slot: the clock when last pulled or pushed; kFree; | kPinned
  RowIndex free_head_ = kNoRow;    // the free slots, linked through ids_
  int64_t clock_ = 0;              // ApplyRows calls
  uint64_t sightings_ = 0;         // pushes of ids without a row (the admission coin's counter)
  uint64_t coin_key_ = 0;
  uint64_t random_ = 0;            // the victim sampler's state
  uint64_t sweep_cursor_ = 0;
  std::unique_ptr<AdmissionFilter> filter_;  // admit_after > 1, or a disk tier (AdmissionFilter::Wanted)
  RowLifecycleCounts counts_;

  // The disk tier (AttachDisk).
  DiskTier* disk_ = nullptr;
  absl::flat_hash_set<int64_t> shadowed_;  // ids in RAM whose stale copy is still on disk (promoted)
  bool all_pinned_ = false;  // EvictOne found every row pinned (by the call in progress): no victim till it ends
  std::vector<int64_t> cold_ids_, cold_steps_;  // PromoteCold's scratch
  std::vector<float> cold_rows_;
  std::vector<bool> cold_found_;
  std::vector<RowIndex> made_;  // ApplyRows' promoted rows
  // The ids of the rows on probation: made beyond max_rows because the filter counts no more
  // pushes of them than of the victim they would have replaced (DemoteProbation). Never a victim;
  // Evict takes an id out.
  absl::flat_hash_set<int64_t> probation_;
  // Reading ahead: rows read for calls to come, by id (row null: not on disk). Every write and
  // erase of the store drops its id's; while reads are in flight (marks_in_flight_), it is also
  // logged (mark, id), in mark order, so that EndReadAhead leaves out what changed under a read;
  // the log keeps only what a read in flight may need (marks after the oldest one's).
  struct ReadAhead {
    int64_t steps = 0;
    std::unique_ptr<float[]> row;
  };
  absl::flat_hash_map<int64_t, ReadAhead> ahead_;
  std::map<uint64_t, int> marks_in_flight_;  // BeginReadAhead's marks not ended yet: how many each
  uint64_t write_mark_ = 0;                   // writes and erases of the store
  std::deque<std::pair<uint64_t, int64_t>> written_;
  // A write or erase of `id`'s row in the store: drops what was read ahead of it (see ahead_).
  void Wrote(int64_t id);
  size_t MaxReadAhead() const { return static_cast<size_t>(std::max<int64_t>(spec_.max_rows, 1024)); }
  // Keeps the row of `id` as read ahead (row null: absent).
  void KeepReadAhead(int64_t id, int64_t steps, const float* row);
  // Brings totals_->read_ahead_kept up to date with ahead_'s size.
  void CountKept() {
    if (totals_ == nullptr || static_cast<int64_t>(ahead_.size()) == ahead_counted_) return;
    totals_->read_ahead_kept.fetch_add(static_cast<int64_t>(ahead_.size()) - ahead_counted_, std::memory_order_relaxed);
    ahead_counted_ = static_cast<int64_t>(ahead_.size());
  }
  int64_t ahead_counted_ = 0;
  absl::flat_hash_set<int64_t> call_ids_;  // DemoteProbation's scratch
  std::vector<int64_t> leaving_;           // DemoteProbation's scratch
};

struct Table {
  TableSpec spec;
  uint64_t id = 0;
  TableCounters counters;  // what the server counts of it (table_metrics.h)
  std::unique_ptr<DenseShard> dense;    // set for dense tables
  std::unique_ptr<SparseShard> sparse;  // set for sparse tables
  // Restored from a checkpoint and not declared since: its first declaration may change its
  // settings (CompareSpecs' `settings`: a resumed job's new learning rate, ...).
  bool settings_open = false;
  // Exactly-once replay after a restore (async and ssp tables; RestoreShard): by the rank of
  // the server that held a chunk or row at the checkpoint (of `servers`), by worker rank, the
  // steps this table's share on that server had taken of that worker (1.25; before, the steps
  // that server had taken of any table). A push of worker w at step s < floor is a
  // replay of a push that server had applied: skipped for those chunks and rows. `until[w]`: the
  // highest floor of w (no push at or past it is a replay).
  struct Replay {
    int servers = 0;
    bool before_slots = false;  // written under the placement rule of 1.15 (placement.h)
    std::shared_ptr<const placement::Placement> map;  // a hand-over's map (1.17); null: the first map
    int IdServer(int64_t id) const {
      if (map) return map->IdServer(id);
      return before_slots ? placement::IdServerBeforeSlots(id, servers) : placement::IdServer(id, servers);
    }
    int ChunkServer(uint64_t table_id, int64_t chunk) const {
      if (map) return map->ChunkServer(table_id, chunk);
      return before_slots ? placement::ChunkServerBeforeSlots(table_id, chunk, servers)
                          : placement::ChunkServer(table_id, chunk, servers);
    }
    std::vector<std::vector<int64_t>> floors;
    std::vector<int64_t> until;
    int64_t Floor(int owner, int rank) const {
      const auto& f = floors[static_cast<size_t>(owner)];
      return static_cast<size_t>(rank) < f.size() ? f[static_cast<size_t>(rank)] : -1;
    }
  };
  std::optional<Replay> replay;
  // Set when an update of it would have made an element not finite (finite gradients
  // overflowing: the model diverged): what the first such update was. From then on every push to
  // the table, and every checkpoint, is refused with it (ServerImpl::Diverged).
  std::string diverged;
  // Set when a sync step of its disk tier could not be applied (the disk failed: full, or a read
  // error): what failed. From then on its pushes, pulls and checkpoints are refused with it (the
  // step's gradients cannot be applied later, and a pull would wait for a step that never comes).
  std::string disk_failed;
  // The change feed's epoch of this table on this server (0 until a reader first asks): a reader's
  // cursor of another epoch (another process) gets everything.
  uint64_t feed_epoch = 0;
};

}  // namespace ferry::ps
