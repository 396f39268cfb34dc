#include "internal/tables.h"

#include <algorithm>
#include <memory>

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
}

DenseShard::DenseShard(const TableSpec& spec, uint64_t table_id, int rank, int num_servers, int num_workers,
                       const std::atomic<bool>* cancel) {
  const int64_t n = spec.num_elements();
  const int64_t count = spec.num_chunks();
  const int slots = StateSlots(spec.optimizer.type);
  chunks_.resize(static_cast<size_t>(count));
  for (int64_t c = 0; c < count; ++c) {
    if (placement::ChunkServer(table_id, c, num_servers) != rank) continue;
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) throw Cancelled();
    auto ch = std::make_unique<DenseChunk>();
    ch->offset = c * spec.chunk_elems;
    ch->size = std::min(spec.chunk_elems, n - ch->offset);
    ch->params.resize(static_cast<size_t>(ch->size));
    InitDense(spec, table_id, ch->offset, ch->params.data(), ch->size);
    ch->state.resize(static_cast<size_t>(ch->size) * static_cast<size_t>(slots));
    InitState(spec.optimizer, ch->state.data(), static_cast<size_t>(ch->size));
    ch->last_pulled.assign(static_cast<size_t>(num_workers), 0);
    ch->sync.Reset(num_workers, /*sparse=*/false);
    chunks_[static_cast<size_t>(c)] = std::move(ch);
    ++held_;
  }
}

DenseChunk* DenseShard::chunk(int64_t index) {
  if (index < 0 || index >= static_cast<int64_t>(chunks_.size())) return nullptr;
  return chunks_[static_cast<size_t>(index)].get();
}

int64_t DenseShard::HeldBytes(const TableSpec& spec, uint64_t table_id, int rank, int num_servers) {
  const int64_t n = spec.num_elements();
  const int64_t floats_per_elem = 1 + StateSlots(spec.optimizer.type);
  int64_t held = 0;
  for (int64_t c = 0; c < spec.num_chunks(); ++c) {
    if (placement::ChunkServer(table_id, c, num_servers) != rank) continue;
    held += std::min(spec.chunk_elems, n - c * spec.chunk_elems);
  }
  return held * floats_per_elem * static_cast<int64_t>(sizeof(float));
}

SparseShard::SparseShard(const TableSpec& spec, uint64_t table_id, int num_workers, MemoryBudget* budget)
    : spec_(spec),
      table_id_(table_id),
      budget_(budget),
      dim_(spec.dim),
      row_floats_(spec.dim * (1 + StateSlots(spec.optimizer.type))),
      block_rows_(static_cast<uint64_t>(std::max<int64_t>(1, (int64_t{16} << 20) / (row_floats_ * 4)))) {
  last_pulled.assign(static_cast<size_t>(num_workers), 0);
  sync.Reset(num_workers, /*sparse=*/true);
}

SparseShard::~SparseShard() {
  if (budget_ != nullptr) budget_->Give(RowBytes() * static_cast<int64_t>(steps_.size()));
}

int64_t SparseShard::NewRows(std::span<const int64_t> ids) const {
  absl::flat_hash_set<int64_t> fresh;
  for (int64_t id : ids) {
    if (!index_.contains(id)) fresh.insert(id);
  }
  return static_cast<int64_t>(fresh.size());
}

RowIndex SparseShard::FindOrCreate(int64_t id, bool over_budget_ok) {
  if (auto it = index_.find(id); it != index_.end()) return it->second;
  // The budget first: refused, nothing has changed. Charged, every later failure gives it back.
  if (budget_ != nullptr && over_budget_ok) {
    budget_->Force(RowBytes());
  } else if (budget_ != nullptr && !budget_->TryTake(RowBytes())) {
    throw BudgetExceeded(budget_->Refusal(RowBytes(), "a new row of sparse table '" + spec_.name + "'"));
  }
  struct Refund {
    MemoryBudget* budget;
    int64_t bytes;
    ~Refund() {
      if (budget != nullptr) budget->Give(bytes);
    }
  } refund{budget_, RowBytes()};
  const RowIndex index = steps_.size();
  // Every step that can throw comes before the id is indexed, and each leaves the shard valid:
  // a block allocated for a row that then failed is simply used by the next row.
  if (index / block_rows_ >= blocks_.size()) {
    blocks_.push_back(std::make_unique_for_overwrite<float[]>(static_cast<size_t>(row_floats_ * block_rows_)));
  }
  if (index_.size() + 1 > index_reserved_) {
    // absl's flat_hash_map (Debian's 20220623) is not exception-safe when it grows: it records
    // the new capacity before allocating, so after a bad_alloc the map is corrupt (even its
    // destructor frees memory it never allocated). So grow a copy, and swap it in only once it
    // holds everything: a failure leaves index_ untouched. A copy whose reserve threw cannot be
    // destroyed safely: its few bytes are leaked on purpose. Doubling keeps the copies amortised
    // O(1) per row, with the peak memory of an in-place rehash.
    const size_t reserve = std::max<size_t>(64, 2 * index_reserved_);
    auto grown = std::make_unique<absl::flat_hash_map<int64_t, RowIndex>>();
    try {
      grown->reserve(reserve);
    } catch (...) {
      (void)grown.release();
      throw;
    }
    grown->insert(index_.begin(), index_.end());  // within the reserved size: no allocation
    index_.swap(*grown);
    index_reserved_ = reserve;
  }
  steps_.push_back(0);
  index_.emplace(id, index);  // within the reserved size: no allocation, cannot throw
  InitSparseRow(spec_, table_id_, id, row(index));
  InitState(spec_.optimizer, state(index), static_cast<size_t>(dim_));
  refund.budget = nullptr;  // the row exists: it keeps its charge
  return index;
}

void SparseShard::ApplyRows(std::span<const int64_t> ids, const float* grads, std::vector<RowIndex>* rows,
                            bool over_budget_ok) {
  rows->resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kPrefetchAhead < ids.size()) Prefetch(ids[i + kPrefetchAhead]);
    (*rows)[i] = FindOrCreate(ids[i], over_budget_ok);
  }
  const size_t dim = static_cast<size_t>(dim_);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kPrefetchAhead < ids.size()) __builtin_prefetch(row((*rows)[i + kPrefetchAhead]));
    const RowIndex r = (*rows)[i];
    ApplyUpdate(spec_.optimizer, row(r), grads + i * dim, state(r), dim, dim, ++steps_[r]);
  }
}

}  // namespace ferry::ps
