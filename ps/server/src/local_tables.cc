#include "ferry/local_tables.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "internal/init.h"
#include "internal/optimizer.h"
#include "internal/tables.h"

namespace ferry::ps {
namespace {

class LocalTablesImpl final : public LocalTables {
 public:
  Status Declare(const TableSpec& s) override {
    FERRY_RETURN_IF_ERROR(s.Validate().WithContext("table '" + s.name + "'"));
    if (tables_.count(s.name) != 0) return AlreadyExistsError("table '" + s.name + "' declared twice");
    auto t = std::make_unique<Entry>();
    t->spec = s;
    // A disk tier keeps every row, the ones beyond max_rows on disk; in one process every row
    // stays in RAM instead, which gives the same values (the row lifecycle stays on, unbounded).
    if (s.disk_tier) {
      t->spec.max_rows = int64_t{1} << 40;
      t->spec.disk_tier = false;  // (nor does it keep the disk tier's filter of pushes)
    }
    const uint64_t id = TableId(s.name);
    if (s.type == TableType::kDense) {
      const int64_t n = s.num_elements();
      t->params.resize(static_cast<size_t>(n));
      InitDense(t->spec, id, 0, t->params.data(), n);
      t->state.resize(static_cast<size_t>(StateSlots(s.optimizer.type) * n));
      InitState(s.optimizer, t->state.data(), static_cast<size_t>(n));
    } else {
      // The shard keeps a reference to the spec, which does not move (an Entry is behind unique_ptr).
      t->sparse = std::make_unique<SparseShard>(t->spec, id, /*num_workers=*/1);
    }
    tables_.emplace(s.name, std::move(t));
    return Status::Ok();
  }

  Status ReadDense(std::string_view table, std::span<float> out) override {
    FERRY_ASSIGN_OR_RETURN(Entry * t, FindDense(table, out.size()));
    std::copy(t->params.begin(), t->params.end(), out.begin());
    return Status::Ok();
  }

  Status ApplyDense(std::string_view table, std::span<const float> grad, int64_t step) override {
    FERRY_ASSIGN_OR_RETURN(Entry * t, FindDense(table, grad.size()));
    const NotFinite nf = ApplyUpdateChecked(t->spec.optimizer, t->params.data(), grad.data(), t->state.data(),
                                            t->params.size(), t->params.size(), step);
    return Refused(*t, nf, "element " + std::to_string(nf.first));
  }

  Status ReadRows(std::string_view table, std::span<const int64_t> ids, std::span<float> rows) override {
    FERRY_ASSIGN_OR_RETURN(Entry * t, FindSparse(table, ids.size(), rows.size(), "read"));
    SparseShard* shard = t->sparse.get();
    const size_t dim = static_cast<size_t>(shard->dim());
    for (size_t i = 0; i < ids.size(); ++i) {
      float* out = rows.data() + i * dim;
      if (const RowIndex r = shard->FindForPull(ids[i]); r != kNoRow) {
        std::copy(shard->row(r), shard->row(r) + dim, out);
      } else {
        shard->InitialRow(ids[i], out);  // a table with lifecycle settings: no row (yet)
      }
    }
    return Status::Ok();
  }

  Status ApplyRows(std::string_view table, std::span<const int64_t> ids, std::span<const float> grads) override {
    FERRY_ASSIGN_OR_RETURN(Entry * t, FindSparse(table, ids.size(), grads.size(), "update"));
    const NotFinite nf = t->sparse->ApplyRows(ids, grads.data(), &rows_);
    return Refused(*t, nf, "id " + std::to_string(nf.id) + " element " + std::to_string(nf.first));
  }

 private:
  struct Entry {
    TableSpec spec;
    std::vector<float> params, state;     // dense
    std::unique_ptr<SparseShard> sparse;  // sparse
  };

  StatusOr<Entry*> Find(std::string_view name, TableType type) {
    auto it = tables_.find(name);
    if (it == tables_.end()) return NotFoundError("table '" + std::string(name) + "' was not declared");
    if (it->second->spec.type != type) {
      return InvalidArgumentError("table '" + std::string(name) + "' is " +
                                  (type == TableType::kDense ? "sparse, not dense" : "dense, not sparse"));
    }
    return it->second.get();
  }

  // An update that refused elements whose result would not be finite (they kept their values): the
  // model diverged, which ends the run (INVALID_ARGUMENT, like a refused gradient on a server).
  static Status Refused(const Entry& t, const NotFinite& nf, const std::string& element) {
    if (!nf.any()) return Status::Ok();
    return InvalidArgumentError("table '" + t.spec.name +
                                "' diverged: " + DescribeNotFinite(t.spec.optimizer, nf, element) +
                                "; those elements kept their values and optimizer state (" +
                                std::string(kDivergedAdvice) + ")");
  }

  StatusOr<Entry*> FindDense(std::string_view name, size_t elements) {
    FERRY_ASSIGN_OR_RETURN(Entry * t, Find(name, TableType::kDense));
    if (elements != t->params.size()) {
      return InvalidArgumentError("table '" + std::string(name) + "' has " + std::to_string(t->params.size()) +
                                  " elements, the buffer " + std::to_string(elements));
    }
    return t;
  }

  StatusOr<Entry*> FindSparse(std::string_view name, size_t ids, size_t floats, const char* what) {
    FERRY_ASSIGN_OR_RETURN(Entry * t, Find(name, TableType::kSparse));
    const size_t dim = static_cast<size_t>(t->spec.dim);
    if (floats != ids * dim) {
      return InvalidArgumentError(std::string(what) + " of '" + std::string(name) + "': " + std::to_string(ids) +
                                  " ids of dim " + std::to_string(dim) + " need " + std::to_string(ids * dim) +
                                  " floats, the buffer has " + std::to_string(floats));
    }
    return t;
  }

  std::map<std::string, std::unique_ptr<Entry>, std::less<>> tables_;
  std::vector<RowIndex> rows_;  // scratch for ApplyRows
};

}  // namespace

std::unique_ptr<LocalTables> LocalTables::Create() { return std::make_unique<LocalTablesImpl>(); }

}  // namespace ferry::ps
