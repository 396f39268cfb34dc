#include "internal/tables.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include <absl/container/flat_hash_set.h>

#include "ferry/messages/placement.h"
#include "internal/init.h"
#include "internal/optimizer.h"

namespace ferry::ps {

void SyncSlots::Reset(int num_workers, bool sparse) {
  by_rank.clear();
  by_rank.resize(static_cast<size_t>(num_workers));
  ids_by_rank.clear();
  if (sparse) ids_by_rank.resize(static_cast<size_t>(num_workers));
  received = 0;
  restored.clear();
}

DenseShard::DenseShard(const TableSpec& spec, uint64_t table_id, int rank, const placement::Placement& placement,
                       int num_workers, const std::atomic<bool>* cancel) {
  chunks_.resize(static_cast<size_t>(spec.num_chunks()));
  for (int64_t c = 0; c < spec.num_chunks(); ++c) {
    if (placement.ChunkServer(table_id, c) != rank) continue;
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) throw Cancelled();
    Take(spec, table_id, c, num_workers);
  }
}

DenseChunk* DenseShard::Take(const TableSpec& spec, uint64_t table_id, int64_t index, int num_workers) {
  if (DenseChunk* held = chunk(index)) return held;
  auto ch = std::make_unique<DenseChunk>();
  ch->offset = index * spec.chunk_elems;
  ch->size = ChunkElems(spec, index);
  ch->params = SharedFloats(static_cast<size_t>(ch->size));
  InitDense(spec, table_id, ch->offset, ch->params.data(), ch->size);
  ch->state.resize(static_cast<size_t>(ch->size) * static_cast<size_t>(StateSlots(spec.optimizer.type)));
  InitState(spec.optimizer, ch->state.data(), static_cast<size_t>(ch->size));
  ch->last_pulled.assign(static_cast<size_t>(num_workers), 0);
  ch->sync.Reset(num_workers, /*sparse=*/false);
  chunks_[static_cast<size_t>(index)] = std::move(ch);
  ++held_;
  return chunks_[static_cast<size_t>(index)].get();
}

void DenseShard::Drop(int64_t index) {
  if (chunk(index) == nullptr) return;
  chunks_[static_cast<size_t>(index)].reset();
  --held_;
}

int64_t DenseShard::ChunkBytes(const TableSpec& spec, int64_t index) {
  return ChunkElems(spec, index) * (1 + StateSlots(spec.optimizer.type)) * static_cast<int64_t>(sizeof(float));
}

DenseChunk* DenseShard::chunk(int64_t index) {
  if (index < 0 || index >= static_cast<int64_t>(chunks_.size())) return nullptr;
  return chunks_[static_cast<size_t>(index)].get();
}

int64_t DenseShard::HeldBytes(const TableSpec& spec, uint64_t table_id, int rank,
                              const placement::Placement& placement) {
  int64_t held = 0;
  for (int64_t c = 0; c < spec.num_chunks(); ++c) {
    if (placement.ChunkServer(table_id, c) == rank) held += ChunkBytes(spec, c);
  }
  return held;
}

SparseShard::SparseShard(const TableSpec& spec, uint64_t table_id, int num_workers, MemoryBudget* budget,
                         RowLifecycleTotals* totals)
    : spec_(spec),
      table_id_(table_id),
      budget_(budget),
      totals_(totals),
      dim_(spec.dim),
      row_floats_(spec.dim * (1 + StateSlots(spec.optimizer.type))),
      block_rows_(static_cast<uint64_t>(std::max<int64_t>(1, (int64_t{16} << 20) / (row_floats_ * 4)))),
      lifecycle_(spec.has_lifecycle()) {
  last_pulled.assign(static_cast<size_t>(num_workers), 0);
  sync.Reset(num_workers, /*sparse=*/true);
  if (!lifecycle_) return;
  // The clock ticks once a sync step, and once a worker's push otherwise.
  ticks_per_step_ = spec.consistency == Consistency::kSync ? 1 : std::max(1, num_workers);
  if (__builtin_mul_overflow(spec.evict_after_steps, ticks_per_step_, &evict_after_ticks_)) {
    evict_after_ticks_ = INT64_MAX;
  }
  const uint64_t key = placement::Mix64(spec.seed ^ placement::Mix64(table_id));
  coin_key_ = placement::Mix64(key ^ 0xC014ull);
  random_ = placement::Mix64(key ^ 0xE71C7ull) | 1;
  if (AdmissionFilter::Wanted(spec)) filter_ = std::make_unique<AdmissionFilter>(spec, table_id);
}

Status SparseShard::ChangeLifecycle(const TableSpec& to) {
  if (!lifecycle_ || !to.has_lifecycle()) {
    return FailedPreconditionError("sparse table '" + spec_.name + "': a row lifecycle is turned on or off only when "
                                   "the table is made");
  }
  const int64_t had = AdmissionFilter::Bytes(spec_), will = AdmissionFilter::Bytes(to);
  if (budget_ != nullptr && will > had) {
    FERRY_RETURN_IF_ERROR(
        budget_->Take(will - had, "table '" + spec_.name +
                                      "': its admission filter for admit_after=" + std::to_string(to.admit_after)));
  }
  if (budget_ != nullptr && will < had) budget_->Give(had - will);
  if (!AdmissionFilter::Wanted(to)) {
    filter_.reset();
  } else if (filter_ == nullptr || will != had) {
    filter_ = std::make_unique<AdmissionFilter>(to, table_id_);
  }
  if (__builtin_mul_overflow(to.evict_after_steps, ticks_per_step_, &evict_after_ticks_)) {
    evict_after_ticks_ = INT64_MAX;
  }
  return Status::Ok();
}

SparseShard::~SparseShard() {
  ahead_.clear();
  CountKept();
  if (budget_ != nullptr) budget_->Give(RowBytes() * static_cast<int64_t>(steps_.size()));
}

int64_t SparseShard::NewRows(std::span<const int64_t> ids) const {
  if (lifecycle_) return 0;
  absl::flat_hash_set<int64_t> fresh;
  for (int64_t id : ids) {
    if (!index_.contains(id)) fresh.insert(id);
  }
  // The first of them take the slots of rows given up (Forget), charged already.
  return std::max<int64_t>(0, static_cast<int64_t>(fresh.size()) - static_cast<int64_t>(forgotten_.size()));
}

void SparseShard::InitialRow(int64_t id, float* out) const {
  InitSparseRow(spec_, table_id_, id, out);
}

RowIndex SparseShard::FindOrCreate(int64_t id, bool over_budget_ok) {
  if (const RowIndex r = Find(id); r != kNoRow) return r;
  all_pinned_ = false;  // (a call of its own: nothing is pinned)
  return MakeRow(id, over_budget_ok, /*drop_if_no_room=*/false);
}

RowIndex SparseShard::FindForPull(int64_t id) {
  if (!lifecycle_) return FindOrCreate(id);
  const RowIndex r = Find(id);
  if (r != kNoRow && (touch_[r] & kPinned) == 0) touch_[r] = clock_;
  return r;
}

Status SparseShard::AttachDisk(DiskTier* disk) {
  if (!lifecycle_) {
    return FailedPreconditionError("sparse table '" + spec_.name +
                                   "': a disk tier needs row lifecycle settings (max_rows: the rows its RAM tier "
                                   "holds on each server)");
  }
  if (feed_ != nullptr || track_) {
    return FailedPreconditionError("sparse table '" + spec_.name +
                                   "': the disk tier does not work with the change feed or delta checkpoints yet");
  }
  if (!spec_.disk_tier || filter_ == nullptr) {  // (its filter of pushes chooses what RAM keeps)
    return FailedPreconditionError("sparse table '" + spec_.name + "': a disk tier needs a spec with disk_tier set");
  }
  FERRY_RETURN_IF_ERROR(disk->AddTable(table_id_, spec_.name, row_floats_));
  disk_ = disk;
  return Status::Ok();
}

void SparseShard::ShrinkToMaxRows() {
  while (spec_.max_rows > 0 &&
         static_cast<int64_t>(index_.size()) - static_cast<int64_t>(probation_.size()) > spec_.max_rows) {
    if (EvictOne(kAlwaysWins) != Room::kMade) return;
  }
}

void SparseShard::DemoteProbation(std::span<const int64_t> ids, bool keep_recent) {
  if (probation_.empty()) return;
  call_ids_.clear();
  call_ids_.insert(ids.begin(), ids.end());
  leaving_.clear();
  for (int64_t id : probation_) {
    // Kept while this call names it, or (async and ssp, whose clock ticks a worker's push) it was
    // touched within the last ticks_per_step_ - 1 pushes: another worker's push between a
    // worker's pull and its own push does not take its rows. (Sync: the step's push names them.)
    if (call_ids_.contains(id) || (keep_recent && touch_[Find(id)] > clock_ - ticks_per_step_)) continue;
    leaving_.push_back(id);
  }
  std::sort(leaving_.begin(), leaving_.end());  // an order of its own, not the hash set's
  for (int64_t id : leaving_) {
    const RowIndex slot = Find(id);  // (on probation: in RAM)
    Demote(slot);                    // (throws: the rest stay on probation, in RAM)
    Evict(slot, &counts_.demoted, totals_ ? &totals_->demoted : nullptr);  // takes it off probation
  }
}

void SparseShard::PromoteForPull(std::span<const int64_t> ids) {
  if (disk_ == nullptr) return;
  all_pinned_ = false;
  // Pulls alone (an evaluation, a table only read) do not tick the clock: past max_rows / 8 rows
  // on probation, or twice this pull's ids if more (the other workers' pulls of a step), those
  // this pull does not name are demoted.
  const int64_t cap = std::max<int64_t>(spec_.max_rows / 8, 2 * static_cast<int64_t>(ids.size()));
  if (static_cast<int64_t>(probation_.size()) > cap) DemoteProbation(ids, /*keep_recent=*/false);
  ShrinkToMaxRows();
  std::vector<RowIndex> made;
  struct Guard {
    SparseShard* shard;
    std::vector<RowIndex>* made;
    ~Guard() { shard->Unpin(*made); }
  } guard{this, &made};
  PromoteCold(ids, /*over_budget_ok=*/false, &made);
}

void SparseShard::PromoteCold(std::span<const int64_t> ids, bool over_budget_ok, std::vector<RowIndex>* made) {
  cold_ids_.clear();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kPrefetchAhead < ids.size()) Prefetch(ids[i + kPrefetchAhead]);
    if (Find(ids[i]) == kNoRow) cold_ids_.push_back(ids[i]);
  }
  if (cold_ids_.empty()) return;
  // The request's rows in RAM are pinned first: making room for a cold row must not demote one of
  // them (the request would then miss it).
  made->reserve(made->size() + ids.size());
  for (int64_t id : ids) {
    if (const RowIndex r = Find(id); r != kNoRow && (touch_[r] & kPinned) == 0) {
      touch_[r] = clock_ | kPinned;
      made->push_back(r);
    }
  }
  std::sort(cold_ids_.begin(), cold_ids_.end());
  cold_ids_.erase(std::unique(cold_ids_.begin(), cold_ids_.end()), cold_ids_.end());
  const size_t n = cold_ids_.size(), floats = static_cast<size_t>(row_floats_);
  cold_rows_.resize(n * floats);
  cold_steps_.resize(n);
  cold_found_.assign(n, false);
  // What was read ahead first (used up here); the rest from the disk, on this thread.
  std::vector<size_t> unread;
  for (size_t i = 0; i < n; ++i) {
    auto it = ahead_.empty() ? ahead_.end() : ahead_.find(cold_ids_[i]);
    if (it == ahead_.end()) {
      unread.push_back(i);
      continue;
    }
    if (it->second.row != nullptr) {
      cold_found_[i] = true;
      cold_steps_[i] = it->second.steps;
      std::memcpy(&cold_rows_[i * floats], it->second.row.get(), floats * sizeof(float));
    }
    ahead_.erase(it);
  }
  CountKept();
  if (unread.size() == n) {  // nothing read ahead (no readers): straight into the buffers
    if (Status s = disk_->Read(table_id_, cold_ids_, cold_rows_.data(), cold_steps_.data(), &cold_found_); !s.ok()) {
      throw DiskTierError(s);
    }
  } else if (!unread.empty()) {
    std::vector<int64_t> ids_left(unread.size()), steps_left(unread.size());
    std::vector<float> rows_left(unread.size() * floats);
    std::vector<bool> found_left;
    for (size_t k = 0; k < unread.size(); ++k) ids_left[k] = cold_ids_[unread[k]];
    if (Status s = disk_->Read(table_id_, ids_left, rows_left.data(), steps_left.data(), &found_left); !s.ok()) {
      throw DiskTierError(s);
    }
    for (size_t k = 0; k < unread.size(); ++k) {
      if (!found_left[k]) continue;
      const size_t i = unread[k];
      cold_found_[i] = true;
      cold_steps_[i] = steps_left[k];
      std::memcpy(&cold_rows_[i * floats], &rows_left[k * floats], floats * sizeof(float));
    }
  }
  const auto read_here = static_cast<int64_t>(unread.size());  // (read on this thread)
  counts_.read_inline += read_here;
  if (totals_ != nullptr) totals_->read_inline.fetch_add(read_here, std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    if (!cold_found_[i]) continue;
    shadowed_.reserve(shadowed_.size() + 1);  // (may throw: before the row is made)
    // It takes a victim's place only if pushed more often (else it goes on probation).
    const int pushes = filter_ != nullptr ? filter_->Estimate(cold_ids_[i]) : kAlwaysWins;
    const RowIndex r = MakeRow(cold_ids_[i], over_budget_ok, /*drop_if_no_room=*/false, pushes);
    std::memcpy(row(r), &cold_rows_[i * floats], floats * sizeof(float));
    steps_[r] = cold_steps_[i];
    touch_[r] = clock_ | kPinned;
    made->push_back(r);
    shadowed_.insert(cold_ids_[i]);
    ++counts_.promoted;
    if (totals_ != nullptr) totals_->promoted.fetch_add(1, std::memory_order_relaxed);
  }
}

void SparseShard::Demote(RowIndex slot) {
  const int64_t id = ids_[slot], steps = steps_[slot];
  Wrote(id);  // (before the write: a failed one may have changed the store's row)
  if (Status s = disk_->Write(table_id_, {&id, 1}, {&steps, 1}, row(slot)); !s.ok()) throw DiskTierError(s);
  shadowed_.erase(id);  // its copy on disk is the row now
}

void SparseShard::Wrote(int64_t id) {
  ++write_mark_;
  if (!ahead_.empty() && ahead_.erase(id) > 0) CountKept();
  if (!marks_in_flight_.empty()) written_.emplace_back(write_mark_, id);
}

void SparseShard::KeepReadAhead(int64_t id, int64_t steps, const float* row) {
  // Full: what was read for requests that never used it (refused, or late) is let go, all of it.
  if (ahead_.size() >= MaxReadAhead() && !ahead_.contains(id)) ahead_.clear();
  ReadAhead& a = ahead_[id];
  a.steps = steps;
  if (row == nullptr) {
    a.row.reset();
    return;
  }
  a.row = std::make_unique<float[]>(static_cast<size_t>(row_floats_));
  std::memcpy(a.row.get(), row, static_cast<size_t>(row_floats_) * sizeof(float));
}

Status SparseShard::ColdForReadAhead(std::span<const int64_t> ids, std::vector<int64_t>* need) {
  need->clear();
  if (disk_ == nullptr) return Status::Ok();
  std::vector<int64_t> cold;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kPrefetchAhead < ids.size()) Prefetch(ids[i + kPrefetchAhead]);
    if (Find(ids[i]) == kNoRow && (ahead_.empty() || !ahead_.contains(ids[i]))) cold.push_back(ids[i]);
  }
  if (cold.empty()) return Status::Ok();
  std::sort(cold.begin(), cold.end());
  cold.erase(std::unique(cold.begin(), cold.end()), cold.end());
  const size_t floats = static_cast<size_t>(row_floats_);
  std::vector<float> rows(cold.size() * floats);
  std::vector<int64_t> steps(cold.size());
  std::vector<DiskTier::Lookup> state;
  FERRY_RETURN_IF_ERROR(disk_->ReadCached(table_id_, cold, rows.data(), steps.data(), &state));
  for (size_t i = 0; i < cold.size(); ++i) {
    switch (state[i]) {
      case DiskTier::Lookup::kNeedsDisk: need->push_back(cold[i]); break;
      case DiskTier::Lookup::kFound: KeepReadAhead(cold[i], steps[i], &rows[i * floats]); break;
      case DiskTier::Lookup::kAbsent: KeepReadAhead(cold[i], 0, nullptr); break;
    }
  }
  CountKept();
  return Status::Ok();
}

uint64_t SparseShard::BeginReadAhead() {
  ++marks_in_flight_[write_mark_];
  return write_mark_;
}

void SparseShard::EndReadAhead(uint64_t mark, std::span<const int64_t> ids, const float* rows, const int64_t* steps,
                               const std::vector<bool>& found, bool ok) {
  if (ok) {
    absl::flat_hash_set<int64_t> changed;  // written or erased while the read ran: marks after its
    auto after = std::upper_bound(written_.begin(), written_.end(), std::pair<uint64_t, int64_t>(mark, INT64_MAX));
    for (; after != written_.end(); ++after) changed.insert(after->second);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (Find(ids[i]) != kNoRow || changed.contains(ids[i])) continue;
      KeepReadAhead(ids[i], steps[i], found[i] ? rows + i * static_cast<size_t>(row_floats_) : nullptr);
    }
    CountKept();
  }
  if (auto m = marks_in_flight_.find(mark); m != marks_in_flight_.end() && --m->second == 0) marks_in_flight_.erase(m);
  // What no read in flight began before is of no more use.
  const uint64_t oldest = marks_in_flight_.empty() ? UINT64_MAX : marks_in_flight_.begin()->first;
  while (!written_.empty() && written_.front().first <= oldest) written_.pop_front();
}

void SparseShard::ReserveOneMore() {
  // A table with lifecycle settings erases ids, and absl's flat_hash_map then reuses the erased
  // ("deleted") slots. It rehashes in place, without allocating, when it runs out of empty slots
  // while at most 25/32 full; fuller, it would grow inside emplace, which must not throw. So such
  // a table grows index_ here, by the copy below, once 3/4 of what was reserved is in use.
  const size_t limit = lifecycle_ || erases_ ? index_reserved_ / 4 * 3 : index_reserved_;
  if (index_.size() + 1 <= limit) return;
  // absl's flat_hash_map (Debian's 20220623) is not exception-safe when it grows: it records
  // the new capacity before allocating, so after a bad_alloc the map is corrupt (even its
  // destructor frees memory it never allocated). So grow a copy, and swap it in only once it
  // holds everything: a failure leaves index_ untouched. A copy whose reserve threw cannot be
  // destroyed safely: its few bytes are leaked on purpose. Doubling keeps the copies amortised
  // O(1) per row, with the peak memory of an in-place rehash.
  // index_reserved_ is what the map holds without growing: 7/8 of its capacity (a power of two
  // less one). Asking for twice that doubles the capacity: the map is then 7/16 full, and 7/8 at
  // the next growth. (Reserving a power of two instead rounds the capacity up past it, to 1/4 to
  // 1/2 full: 16 bytes a slot then cost 34 to 68 bytes a row.)
  const size_t reserve = std::max<size_t>(56, 2 * index_reserved_);
  auto grown = std::make_unique<absl::flat_hash_map<int64_t, RowIndex>>();
  try {
    grown->reserve(reserve);
  } catch (...) {
    (void)grown.release();
    throw;
  }
  grown->insert(index_.begin(), index_.end());  // within the reserved size: no allocation
  index_.swap(*grown);
  index_reserved_ = index_.capacity() - index_.capacity() / 8;  // absl's most before it grows
}

RowIndex SparseShard::MakeRow(int64_t id, bool over_budget_ok, bool drop_if_no_room, int pushes) {
  auto no_room = [&](const std::string& why) -> RowIndex {
    if (drop_if_no_room) return kNoRow;
    throw BudgetExceeded(why);
  };
  bool on_probation = false;
  // (Rows on probation are beside the tier: a new row may take a free place in it.)
  if (lifecycle_ && spec_.max_rows > 0 &&
      static_cast<int64_t>(index_.size()) - static_cast<int64_t>(probation_.size()) >= spec_.max_rows) {
    switch (EvictOne(pushes)) {
      case Room::kMade: break;
      case Room::kVictimHotter:
        if (disk_ == nullptr) return kNoRow;
        probation_.reserve(probation_.size() + 1);  // (may throw: before the row is made)
        on_probation = true;
        break;
      case Room::kNoVictim:
        // With a disk every row of this call is kept: the RAM tier goes past max_rows for it, and
        // ShrinkToMaxRows takes it back down at the next call.
        if (disk_ != nullptr) break;
        return no_room("sparse table '" + spec_.name + "' holds max_rows=" + std::to_string(spec_.max_rows) +
                       " rows on this server, every one in use by this request");
    }
  }
  // A new slot is charged to the budget first: refused, nothing has changed (a table with
  // lifecycle settings gives up a row instead, and reuses its slot). Charged, every later
  // failure gives it back. A free slot (evicted, or given up by Forget) is charged already.
  MemoryBudget* charged = nullptr;
  if (free_head_ == kNoRow && forgotten_.empty() && budget_ != nullptr) {
    const std::string what = "a new row of sparse table '" + spec_.name + "'";
    if (!lifecycle_) {
      if (over_budget_ok) {
        budget_->Force(RowBytes());
      } else if (!budget_->TryTake(RowBytes())) {
        throw BudgetExceeded(budget_->Refusal(RowBytes(), what));
      }
      charged = budget_;
    } else if (budget_->used() <= budget_->limit() - RowBytes() && budget_->TryTake(RowBytes())) {
      charged = budget_;
    } else if (const Room room = EvictOne(disk_ != nullptr ? kAlwaysWins : pushes); room == Room::kVictimHotter) {
      return kNoRow;  // (with a disk the budget's limit takes any victim)
    } else if (room == Room::kMade) {
      on_probation = false;  // its slot is free now: the row takes the victim's place
    } else if (over_budget_ok) {
      budget_->Force(RowBytes());
      charged = budget_;
    } else {
      budget_->CountRefusal();
      return no_room(budget_->Refusal(RowBytes(), what));
    }
  }
  struct Refund {
    MemoryBudget* budget;
    int64_t bytes;
    ~Refund() {
      if (budget != nullptr) budget->Give(bytes);
    }
  } refund{charged, RowBytes()};
  const bool reuse = lifecycle_ ? free_head_ != kNoRow : !forgotten_.empty();
  const RowIndex index = !reuse ? steps_.size() : lifecycle_ ? free_head_ : forgotten_.back();
  // Every step that can throw comes before the id is indexed, and each leaves the shard valid:
  // a block allocated for a row that then failed is simply used by the next row.
  if (!reuse && index / block_rows_ >= blocks_.size()) {
    blocks_.push_back(std::make_unique_for_overwrite<float[]>(static_cast<size_t>(row_floats_ * block_rows_)));
  }
  ReserveOneMore();
  if (feed_ != nullptr) FeedGrow(index + 1);
  if (!reuse) {
    // One more slot in each per-slot array, all or none.
    steps_.push_back(0);
    if (lifecycle_) {
      try {
        ids_.push_back(kFree);
        touch_.push_back(kFree);
      } catch (...) {
        if (ids_.size() > steps_.size() - 1) ids_.pop_back();
        steps_.pop_back();
        throw;
      }
    }
  }
  // Nothing below throws.
  if (reuse && lifecycle_) free_head_ = static_cast<RowIndex>(ids_[index]);
  if (reuse && !lifecycle_) forgotten_.pop_back();
  index_.emplace(id, index);  // within the reserved size: no allocation, cannot throw
  steps_[index] = 0;
  if (lifecycle_) {
    ids_[index] = id;
    touch_[index] = clock_;
  }
  InitSparseRow(spec_, table_id_, id, row(index));
  InitState(spec_.optimizer, state(index), static_cast<size_t>(dim_));
  if (feed_ != nullptr) [[unlikely]] FeedStamp(index, id);
  if (on_probation) probation_.insert(id);  // (reserved above: cannot throw)
  refund.budget = nullptr;  // the row exists: it keeps its charge
  return index;
}

int SparseShard::Admit(int64_t id) {
  ++sightings_;
  const int pushes = filter_ != nullptr ? filter_->Add(id) : kAlwaysWins;
  if (pushes < spec_.admit_after) return 0;  // (admit_after <= 1 with a disk tier's filter: admitted)
  if (spec_.admit_probability < 1.0f) {
    // A coin from (seed, table, id, sightings so far): the same pushes in the same order (a sync
    // job) admit the same ids.
    const uint64_t h = placement::Mix64(placement::Mix64(coin_key_ ^ static_cast<uint64_t>(id)) + sightings_);
    if (!(static_cast<float>(h >> 40) * (1.0f / 16777216.0f) < spec_.admit_probability)) return 0;
  }
  return pushes;
}

uint64_t SparseShard::NextRandom() {
  random_ ^= random_ << 13;  // xorshift64
  random_ ^= random_ >> 7;
  random_ ^= random_ << 17;
  return random_;
}

SparseShard::Room SparseShard::EvictOne(int pushes) {
  const uint64_t slots = steps_.size();
  if (slots == 0) return Room::kNoVictim;
  RowIndex best = kNoRow;
  int seen = 0, best_pushes = 0;
  for (int draw = 0; draw < kEvictionDraws && seen < kEvictionSample; ++draw) {
    const RowIndex s = NextRandom() % slots;
    const int64_t t = touch_[s];
    if (t < 0 || (t & kPinned) != 0) continue;  // free, or in use by this ApplyRows
    if (!probation_.empty() && probation_.contains(ids_[s])) continue;  // demoted by DemoteProbation
    ++seen;
    if (disk_ != nullptr && filter_ != nullptr) {
      // With a disk tier the RAM keeps the most pushed rows (the filter's estimate; TinyLFU's
      // frequency): the least pushed of the sample goes, ties to the least recently touched.
      const int f = filter_->Estimate(ids_[s]);
      if (best == kNoRow || f < best_pushes || (f == best_pushes && t < touch_[best])) {
        best = s;
        best_pushes = f;
      }
      continue;
    }
    if (best == kNoRow || t < touch_[best] || (t == touch_[best] && steps_[s] < steps_[best])) best = s;
  }
  if (best == kNoRow && disk_ != nullptr && !all_pinned_) {
    // With a disk a row is never dropped for want of a victim the sample missed: the first row in
    // no use by this request, if any. None: every row is pinned until the call ends, so the
    // call's later rows need not look again (a call of many more rows than max_rows would
    // otherwise scan the table once for each).
    for (int pass = probation_.empty() ? 1 : 0; pass < 2 && best == kNoRow; ++pass) {  // (probation rows last)
      for (RowIndex s = 0; s < slots && best == kNoRow; ++s) {
        if (touch_[s] >= 0 && (touch_[s] & kPinned) == 0 && (pass == 1 || !probation_.contains(ids_[s]))) best = s;
      }
    }
    all_pinned_ = best == kNoRow;
  }
  if (best == kNoRow) return Room::kNoVictim;
  if (disk_ != nullptr) {  // demoted, not lost
    // The newcomer must have been pushed more often than the victim (it then goes on probation).
    if (filter_ != nullptr && pushes != kAlwaysWins && filter_->Estimate(ids_[best]) >= pushes) {
      return Room::kVictimHotter;
    }
    Demote(best);
    Evict(best, &counts_.demoted, totals_ ? &totals_->demoted : nullptr);
    return Room::kMade;
  }
  if (filter_ != nullptr && pushes != kAlwaysWins && filter_->Estimate(ids_[best]) >= pushes)
    return Room::kVictimHotter;
  Evict(best, &counts_.evicted_capacity, totals_ ? &totals_->evicted_capacity : nullptr);
  return Room::kMade;
}

void SparseShard::Forget(int64_t id) {
  const RowIndex slot = Find(id);
  if (slot == kNoRow) return;
  if (lifecycle_) {
    int64_t moved = 0;  // (not an eviction of the lifecycle's: counted by the hand-over)
    return Evict(slot, &moved, nullptr);
  }
  NoteGone(slot, id);
  index_.erase(id);  // never throws
  erases_ = true;
  steps_[slot] = 0;
  // The feed's scans pass the slot by until a new row takes it (FeedStamp).
  if (feed_ != nullptr && slot < feed_->seq.size()) feed_->seq[slot] = INT64_MIN;
  try {
    forgotten_.push_back(slot);
  } catch (const std::bad_alloc&) {
    // (Forget never fails: the slot is then simply not reused)
  }
}

void SparseShard::Evict(RowIndex slot, int64_t* counter, std::atomic<int64_t>* total) {
  NoteGone(slot, ids_[slot]);
  if (!probation_.empty()) probation_.erase(ids_[slot]);
  index_.erase(ids_[slot]);  // never throws (it leaves a deleted slot: see ReserveOneMore)
  ids_[slot] = static_cast<int64_t>(free_head_);
  touch_[slot] = kFree;
  steps_[slot] = 0;
  free_head_ = slot;
  ++*counter;
  if (total != nullptr) total->fetch_add(1, std::memory_order_relaxed);
}

void SparseShard::NoteGone(RowIndex slot, int64_t id) {
  if (track_ && !overflow_) {
    if (slot < changed_.size()) changed_[slot] = 0;
    if (steps_[slot] > 0) {
      try {
        deleted_.insert(id);
      } catch (const std::bad_alloc&) {
        GiveUpChanges();  // (an eviction never fails: the next checkpoint copies the table whole)
      }
      if (deleted_.size() > 2 * steps_.size() + 1024) GiveUpChanges();
    }
  }
  if (feed_ != nullptr) [[unlikely]] {
    auto& log = feed_->evicted;
    try {
      if (log.size() >= std::max(kFeedLogMin, steps_.size())) {
        // Full: the oldest half goes (a reader from before it gets a full round).
        const size_t drop = log.size() / 2;
        feed_->log_floor = log[drop - 1].first;
        log.erase(log.begin(), log.begin() + static_cast<std::ptrdiff_t>(drop));
      }
      log.emplace_back(feed_->clock, id);
    } catch (const std::bad_alloc&) {
      // An eviction never fails: the log starts over, and every reader gets a full round.
      feed_->log_floor = feed_->clock;
      std::vector<std::pair<int64_t, int64_t>>().swap(log);
    }
  }
}

void SparseShard::SweepAged(int64_t count) {
  const uint64_t slots = steps_.size();
  if (evict_after_ticks_ <= 0 || slots == 0 || clock_ <= evict_after_ticks_) return;
  const int64_t oldest_kept = clock_ - evict_after_ticks_;  // touched before it: aged
  count = std::min<int64_t>(count, static_cast<int64_t>(slots));
  for (int64_t n = 0; n < count; ++n) {
    if (sweep_cursor_ >= slots) sweep_cursor_ = 0;
    const RowIndex s = sweep_cursor_++;
    const int64_t t = touch_[s];
    if (t >= 0 && (t & kPinned) == 0 && t < oldest_kept) {
      if (disk_ != nullptr && shadowed_.contains(ids_[s])) {
        // Its stale copy goes too, or a later promotion would bring back old values. A failed
        // erase keeps the row (the next write to the disk reports the failure).
        const int64_t id = ids_[s];
        Wrote(id);
        if (!disk_->Erase(table_id_, {&id, 1}).ok()) continue;
        shadowed_.erase(id);
      }
      Evict(s, &counts_.evicted_age, totals_ ? &totals_->evicted_age : nullptr);
    }
  }
}

NotFinite SparseShard::ApplyRows(std::span<const int64_t> ids, const float* grads, std::vector<RowIndex>* rows,
                                 bool over_budget_ok) {
  rows->resize(ids.size());
  const size_t dim = static_cast<size_t>(dim_);
  NotFinite refused;
  if (!lifecycle_) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i + kPrefetchAhead < ids.size()) Prefetch(ids[i + kPrefetchAhead]);
      (*rows)[i] = FindOrCreate(ids[i], over_budget_ok);
      if (track_) [[unlikely]] NoteChanged(ids[i], (*rows)[i]);
      if (feed_ != nullptr) [[unlikely]] FeedStamp((*rows)[i], ids[i]);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i + kPrefetchAhead < ids.size()) __builtin_prefetch(row((*rows)[i + kPrefetchAhead]));
      UpdateRow(ids[i], (*rows)[i], grads + i * dim, &refused);
    }
    return refused;
  }
  ++clock_;
  made_.clear();
  all_pinned_ = false;
  struct UnpinMade {
    SparseShard* shard;
    ~UnpinMade() { shard->Unpin(shard->made_); }
  } unpin_made{this};
  if (disk_ != nullptr) {
    DemoteProbation(ids, /*keep_recent=*/true);
    ShrinkToMaxRows();
    PromoteCold(ids, over_budget_ok, &made_);
  }
  {
    // The rows found or made so far are pinned (no victim of a later new row), and stamped with
    // the clock when done, however this block is left.
    struct Unpin {
      SparseShard* shard;
      const std::vector<RowIndex>* rows;
      size_t n = 0;
      ~Unpin() {
        for (size_t i = 0; i < n; ++i) {
          if ((*rows)[i] != kNoRow) shard->touch_[(*rows)[i]] = shard->clock_;
        }
      }
    } unpin{this, rows};
    for (size_t i = 0; i < ids.size(); ++i) {
      RowIndex r = Find(ids[i]);
      if (r != kNoRow && filter_ != nullptr) filter_->Add(ids[i]);  // (Admit counts the others)
      if (const int pushes = r == kNoRow ? Admit(ids[i]) : 0; pushes > 0) {
        r = MakeRow(ids[i], over_budget_ok, /*drop_if_no_room=*/true, pushes);
        if (r != kNoRow) {
          ++counts_.admitted;
          if (totals_ != nullptr) totals_->admitted.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (r == kNoRow) {
        ++counts_.not_admitted;
        if (totals_ != nullptr) totals_->not_admitted.fetch_add(1, std::memory_order_relaxed);
      } else {
        touch_[r] = clock_ | kPinned;
      }
      (*rows)[i] = r;
      unpin.n = i + 1;
      if (r != kNoRow && track_) [[unlikely]] NoteChanged(ids[i], r);
      if (r != kNoRow && feed_ != nullptr) [[unlikely]] FeedStamp(r, ids[i]);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const RowIndex r = (*rows)[i];
      if (r == kNoRow) continue;
      UpdateRow(ids[i], r, grads + i * dim, &refused);
    }
  }
  SweepAged(kSweepSlots + 2 * static_cast<int64_t>(ids.size()));
  return refused;
}

void SparseShard::GiveUpChanges() {
  overflow_ = true;
  std::vector<std::pair<int64_t, RowIndex>>().swap(changed_list_);
  absl::flat_hash_set<int64_t>().swap(deleted_);
  std::fill(changed_.begin(), changed_.end(), uint8_t{0});
}

void SparseShard::NoteChanged(int64_t id, RowIndex r) {
  if (overflow_ || (r < changed_.size() && changed_[r])) return;
  if (changed_list_.size() > 2 * steps_.size() + 1024) {
    // Slots evicted and reused left entries behind: keep one of each row still noted (marked 2
    // while kept, so a row noted twice is kept once).
    std::erase_if(changed_list_, [&](const std::pair<int64_t, RowIndex>& e) {
      const bool stale = changed_[e.second] != 1 || SlotTakenSince(e.first, e.second);
      if (!stale) changed_[e.second] = 2;
      return stale;
    });
    for (const auto& e : changed_list_) changed_[e.second] = 1;
  }
  // Both can throw (std::bad_alloc) before anything changes; both grow geometrically.
  if (changed_list_.size() == changed_list_.capacity()) changed_list_.reserve(2 * changed_list_.size() + 64);
  if (r >= changed_.size()) changed_.resize(steps_.size());
  changed_[r] = 1;
  changed_list_.emplace_back(id, r);
}

SparseShard::Changes SparseShard::TakeChanges() {
  Changes out;
  if (overflow_) {
    overflow_ = false;
    out.complete = false;
    return out;
  }
  out.rows.reserve(changed_list_.size());
  for (const auto& [id, r] : changed_list_) {
    if (r >= changed_.size() || !changed_[r]) continue;  // taken already, or evicted since
    if (SlotTakenSince(id, r)) continue;  // evicted or given up, its slot now another id's (noted apart)
    changed_[r] = 0;
    if (steps_[r] > 0) out.rows.emplace_back(id, r);  // (a push refused whole changed nothing)
  }
  changed_list_.clear();
  out.deleted.assign(deleted_.begin(), deleted_.end());
  std::sort(out.deleted.begin(), out.deleted.end());
  deleted_.clear();
  return out;
}

Status SparseShard::StartFeed() {
  if (feed_ != nullptr) return Status::Ok();
  if (disk_ != nullptr) {
    return FailedPreconditionError("sparse table '" + spec_.name +
                                   "': the change feed does not follow a table with a disk tier yet");
  }
  const int64_t bytes = FeedRowBytes() * static_cast<int64_t>(steps_.size());
  if (budget_ != nullptr) {
    FERRY_RETURN_IF_ERROR(budget_->Take(bytes, "the change feed of sparse table '" + spec_.name + "' (" +
                                                   std::to_string(FeedRowBytes()) + " bytes a row)"));
  }
  try {
    auto feed = std::make_unique<Feed>();
    // Every row there is now counts as changed at clock 0 (a reader's first, full round sends
    // it); a slot without a row (evicted, or given up by Forget) is passed by until a row takes it.
    feed->seq.assign(steps_.size(), INT64_MIN);
    for (const auto& [id, r] : index_) feed->seq[r] = 0;
    feed->block_max.assign((steps_.size() + kFeedBlock - 1) / kFeedBlock, 0);
    if (!lifecycle_) {
      feed->ids.assign(steps_.size(), 0);
      for (const auto& [id, r] : index_) feed->ids[r] = id;
    }
    feed_ = std::move(feed);
  } catch (const std::bad_alloc&) {
    if (budget_ != nullptr) budget_->Give(bytes);
    return ResourceExhaustedError("out of memory starting the change feed of sparse table '" + spec_.name + "'");
  }
  return Status::Ok();
}

void SparseShard::FeedGrow(size_t slots) {
  if (feed_->seq.size() >= slots) return;
  const size_t want = std::max(slots, 2 * feed_->seq.size());
  feed_->seq.reserve(want);
  feed_->block_max.reserve((want + kFeedBlock - 1) / kFeedBlock);
  if (!lifecycle_) feed_->ids.reserve(want);
  // Reserved: nothing below throws.
  feed_->seq.resize(slots, 0);
  feed_->block_max.resize((slots + kFeedBlock - 1) / kFeedBlock, 0);
  if (!lifecycle_) feed_->ids.resize(slots, 0);
}

uint64_t SparseShard::ScanChanged(int64_t after, uint64_t from, size_t max_rows, uint64_t max_work,
                                  std::vector<int64_t>* ids, std::vector<float>* values) const {
  const uint64_t slots = steps_.size();
  const size_t dim = static_cast<size_t>(dim_);
  uint64_t s = from;
  uint64_t work = 0;  // slots looked at, and blocks passed over (one each)
  size_t found = 0;
  while (s < slots && found < max_rows && work < max_work) {
    ++work;
    if (s % kFeedBlock == 0 && feed_->block_max[s / kFeedBlock] <= after) {
      s += kFeedBlock;  // nothing in this block changed after the cursor
      continue;
    }
    if (feed_->seq[s] > after && (!lifecycle_ || touch_[s] != kFree)) {
      ids->push_back(lifecycle_ ? ids_[s] : feed_->ids[s]);
      const float* r = row(s);
      values->insert(values->end(), r, r + dim);
      ++found;
    }
    ++s;
  }
  return s >= slots ? 0 : s;
}

void SparseShard::EvictedSince(int64_t after, std::vector<int64_t>* ids) const {
  const auto& log = feed_->evicted;
  auto it = std::upper_bound(log.begin(), log.end(), after,
                             [](int64_t a, const std::pair<int64_t, int64_t>& e) { return a < e.first; });
  for (; it != log.end(); ++it) ids->push_back(it->second);
}

void SparseShard::UpdateRow(int64_t id, RowIndex r, const float* grad, NotFinite* refused) {
  const size_t dim = static_cast<size_t>(dim_);
  const int64_t kept = ApplyUpdate(spec_.optimizer, row(r), grad, state(r), dim, dim, ++steps_[r]);
  if (kept == 0) [[likely]] return;
  NotFinite nf = LocateNotFinite(spec_.optimizer, row(r), grad, state(r), dim, dim, steps_[r], kept);
  if (nf.count == dim_) --steps_[r];  // no element took this update
  nf.id = id;
  refused->Merge(nf);
}

}  // namespace ferry::ps
