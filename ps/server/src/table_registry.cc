#include "internal/table_registry.h"

#include <cstdio>
#include <string>

#include <absl/container/flat_hash_set.h>

#include "ferry/messages/placement.h"
#include "ferry/messages/wire.h"

namespace ferry::ps {

Status TableRegistry::Create(TableSpec spec, uint64_t claimed_id, int num_workers) {
  bool pending = false;
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Table> table, Declare(std::move(spec), claimed_id, num_workers, &pending));
  if (table == nullptr) return Status::Ok();
  if (Status s = Build(*table, num_workers); !s.ok()) {
    Forget(table->id);
    return s;
  }
  Adopt(std::move(table));
  return Status::Ok();
}

const TableSpec* TableRegistry::SpecOf(uint64_t id) const {
  if (auto it = pending_.find(id); it != pending_.end()) return &it->second;
  if (auto it = tables_.find(id); it != tables_.end()) return &it->second->spec;
  return nullptr;
}

StatusOr<std::unique_ptr<Table>> TableRegistry::Declare(TableSpec spec, uint64_t claimed_id, int num_workers,
                                                        bool* pending, bool take_chunking) {
  *pending = false;
  const uint64_t id = TableId(spec.name);
  if (claimed_id != id) {
    return InvalidArgumentError("table_id " + std::to_string(claimed_id) + " is not the hash of the name '" +
                                spec.name + "' (" + std::to_string(id) + ")");
  }
  const TableSpec* have = nullptr;
  Table* restored = nullptr;
  if (auto it = tables_.find(id); it != tables_.end()) {
    have = &it->second->spec;
    if (it->second->settings_open) restored = it->second.get();
  }
  if (auto it = pending_.find(id); it != pending_.end()) have = &it->second, *pending = true;
  if (have != nullptr) {
    if (have->name != spec.name) {
      return AlreadyExistsError("table names '" + have->name + "' and '" + spec.name +
                                "' hash to the same id; rename one");
    }
    // Chunking is this server's layout: a client that reads it from the reply takes the table's.
    if (take_chunking && have->type == TableType::kDense && spec.type == TableType::kDense) {
      spec.chunk_elems = have->chunk_elems;
    }
    // The first declaration the restored table accepts closes its window for new settings.
    if (*have == spec) {
      if (restored != nullptr) restored->settings_open = false;
      return std::unique_ptr<Table>();  // idempotent
    }
    const SpecChanges changes = CompareSpecs(*have, spec);
    if (!changes.fixed.empty()) {
      return AlreadyExistsError("table '" + spec.name + "' cannot change its " + changes.fixed +
                                " (a table keeps its shape, dimension, chunking, optimizer type, consistency, "
                                "initialisation, and whether it has a row lifecycle, for its life)");
    }
    if (restored == nullptr) {
      return AlreadyExistsError("table '" + spec.name + "' is declared with other settings: " + changes.settings +
                                " (settings change only when a job resumes from a checkpoint, at the first "
                                "declaration of each table; the workers of a job declare the same)");
    }
    TableSpec changed = restored->spec;
    TakeSettings(spec, &changed);
    if (!(changed == spec)) {  // a field CompareSpecs does not know: refused whole
      return AlreadyExistsError("table '" + spec.name + "' is already declared as " + have->ToString() +
                                "; the new declaration " + spec.ToString() + " conflicts with it");
    }
    if (restored->sparse && restored->spec.has_lifecycle()) {
      FERRY_RETURN_IF_ERROR(restored->sparse->ChangeLifecycle(changed));
    }
    std::fprintf(stderr, "ferry-ps: table '%s' resumes with new settings: %s\n", wire::Printable(spec.name).c_str(),
                 changes.settings.c_str());
    restored->spec = std::move(changed);
    restored->settings_open = false;
    return std::unique_ptr<Table>();
  }
  if (spec.consistency == Consistency::kSync && spec.replicas_to_aggregate > num_workers) {
    return InvalidArgumentError("table '" + spec.name + "': replicas_to_aggregate " +
                                std::to_string(spec.replicas_to_aggregate) + " exceeds the job's " +
                                std::to_string(num_workers) + " workers");
  }
  if (spec.disk_tier && disk_ == nullptr) {
    return FailedPreconditionError("table '" + spec.name + "' is declared with disk_tier, but server " +
                                   std::to_string(rank_) +
                                   " has no disk tier: start ferry-ps with --disk-tier-dir (ferry-launch: "
                                   "--disk-tier-dir), or declare the table without disk_tier");
  }
  auto table = std::make_unique<Table>();
  table->spec = std::move(spec);
  table->id = id;
  // A dense shard is charged whole before it is allocated; a sparse one its admission filter, and
  // then row by row.
  FERRY_RETURN_IF_ERROR(budget_->Take(BuildBytes(*table), "table '" + table->spec.name + "' (this server's shard)"));
  pending_.emplace(id, table->spec);
  return table;
}

int64_t TableRegistry::BuildBytes(const Table& table) const {
  return table.spec.type == TableType::kDense ? DenseShard::HeldBytes(table.spec, table.id, rank_, placement_)
                                              : AdmissionFilter::Bytes(table.spec);
}

Status TableRegistry::Build(Table& table, int num_workers, const std::atomic<bool>* cancel) {
  try {
    if (table.spec.type == TableType::kDense) {
      table.dense = std::make_unique<DenseShard>(table.spec, table.id, rank_, placement_, num_workers, cancel);
    } else {
      table.sparse = std::make_unique<SparseShard>(table.spec, table.id, num_workers, budget_.get(), lifecycle_.get());
      if (table.spec.disk_tier) {
        if (Status s = table.sparse->AttachDisk(disk_); !s.ok()) {
          table.sparse.reset();
          budget_->Give(BuildBytes(table));
          return s;
        }
      }
    }
  } catch (const std::bad_alloc&) {
    budget_->Give(BuildBytes(table));
    return ResourceExhaustedError("out of memory creating table '" + table.spec.name + "'");
  } catch (const Cancelled& e) {
    budget_->Give(BuildBytes(table));
    return CancelledError("creating table '" + table.spec.name + "': " + e.what());
  }
  return Status::Ok();
}

void TableRegistry::Adopt(std::unique_ptr<Table> table) {
  pending_.erase(table->id);
  const uint64_t id = table->id;
  tables_.emplace(id, std::move(table));
}

StatusOr<Table*> TableRegistry::Find(uint64_t id, TableType type) {
  auto it = tables_.find(id);
  if (it == tables_.end()) {
    if (auto p = pending_.find(id); p != pending_.end()) {
      return FailedPreconditionError("table '" + p->second.name +
                                     "' is still being created on this server (wait for its CreateTable reply)");
    }
    return NotFoundError("unknown table id " + std::to_string(id) + " (declare it first)");
  }
  if (it->second->spec.type != type) {
    return InvalidArgumentError("table '" + it->second->spec.name + "' is " +
                                (type == TableType::kDense ? "sparse, not dense" : "dense, not sparse"));
  }
  return it->second.get();
}

const Table* TableRegistry::Find(uint64_t id) const {
  auto it = tables_.find(id);
  return it == tables_.end() ? nullptr : it->second.get();
}

Status TableRegistry::ResolveSlices(const wire::Header& h, int64_t max_reply_bytes, std::vector<SliceRef>* out) {
  out->clear();
  absl::flat_hash_set<std::pair<uint64_t, int64_t>> seen;
  int64_t reply_bytes = 0;
  for (flatbuffers::uoffset_t i = 0; i < h.slices()->size(); ++i) {
    const auto* sl = h.slices()->Get(i);
    if (!seen.emplace(sl->table_id(), sl->chunk()).second) {
      return InvalidArgumentError("slice " + std::to_string(i) + " repeats chunk " + std::to_string(sl->chunk()) +
                                  " of table id " + std::to_string(sl->table_id()) +
                                  " (name each table once per request)");
    }
    FERRY_ASSIGN_OR_RETURN(Table * t, Find(sl->table_id(), TableType::kDense));
    DenseChunk* c = t->dense->chunk(sl->chunk());
    if (c == nullptr) {
      if (sl->chunk() < 0 || sl->chunk() >= t->dense->num_chunks()) {
        return OutOfRangeError("table '" + t->spec.name + "' has no chunk " + std::to_string(sl->chunk()));
      }
      return FailedPreconditionError(
          "table '" + t->spec.name + "' chunk " + std::to_string(sl->chunk()) + " belongs to server " +
          std::to_string(placement_.ChunkServer(t->id, sl->chunk())) + ", not " +
          std::to_string(rank_) + ": client and server disagree on the cluster");
    }
    if (sl->count() != c->size) {
      return InvalidArgumentError("table '" + t->spec.name + "' chunk " + std::to_string(sl->chunk()) + " has " +
                                  std::to_string(c->size) + " elements, the slice says " + std::to_string(sl->count()));
    }
    reply_bytes += c->size * static_cast<int64_t>(sizeof(float));
    if (reply_bytes > max_reply_bytes) {
      return ResourceExhaustedError("the chunks requested add up to more than this server's message limit of " +
                                    std::to_string(max_reply_bytes) + " bytes");
    }
    out->push_back({t, c});
  }
  return Status::Ok();
}

Status TableRegistry::CheckIds(const Table& t, std::span<const int64_t> ids) const {
  if (placement_.SlotsOf(rank_) == placement::kSlots) return Status::Ok();  // every id is here
  for (int64_t id : ids) {
    const int owner = placement_.IdServer(id);
    if (owner != rank_) {
      return FailedPreconditionError("table '" + t.spec.name + "': id " + std::to_string(id) + " belongs to server " +
                                     std::to_string(owner) + ", not " + std::to_string(rank_) +
                                     ": client and server disagree on the cluster");
    }
  }
  return Status::Ok();
}

}  // namespace ferry::ps
