#include "trainer/trainer/param_store.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ps/internal/init.h"
#include "ps/internal/optimizer.h"
#include "ps/internal/tables.h"

namespace ferry::trainer {
namespace {

class ServerStore final : public ParamStore {
 public:
  ServerStore(Client* client, Consistency consistency) : client_(client), consistency_(consistency) {}

  Status Declare(std::span<const TableSpec> specs) override {
    for (const TableSpec& s : specs) FERRY_RETURN_IF_ERROR(client_->Declare(s).WithContext("declaring " + s.name));
    return Status::Ok();
  }

  Status Pull(std::span<const DenseOut> dense, std::span<const SparseOut> sparse, int64_t step) override {
    const bool sync = consistency_ == Consistency::kSync;
    const int64_t want = sync ? next_step_ : step;
    handles_.clear();
    if (!dense.empty()) handles_.push_back(client_->PullDense(dense, want));
    for (const SparseOut& s : sparse) handles_.push_back(client_->PullSparse(s.table, s.ids, s.rows, want));
    // The last step's clock (ssp) travelled ahead of these pulls on each server's connection; its
    // replies are collected here rather than waited for alone after the step.
    const Status clock = std::exchange(clock_, Handle()).wait();
    int64_t served = -1;
    std::chrono::microseconds held{0};
    FERRY_RETURN_IF_ERROR(WaitAll("pull", want, [&](const Served& s) {
      if (s.version >= 0) served = served < 0 ? s.version : std::min(served, s.version);
      held = std::max(held, s.held);
    }));
    FERRY_RETURN_IF_ERROR(clock.WithContext("advancing the clock before step " + std::to_string(step)));
    progress_.pull_wait_s += std::chrono::duration<double>(held).count();
    // Sync: the servers answered once every table had reached `want`; a table served at a later
    // step means the job moved on without this worker (it was late, or joined late): its next
    // push counts for the step it was served.
    progress_.step = sync && served >= want ? served : want;
    if (progress_.first_served < 0) progress_.first_served = progress_.step;
    return Status::Ok();
  }

  Status Push(std::span<const DenseIn> dense, std::span<const SparseIn> sparse, int64_t step) override {
    const bool sync = consistency_ == Consistency::kSync;
    const int64_t tag = sync ? progress_.step : step;
    handles_.clear();
    if (!dense.empty()) handles_.push_back(client_->PushDense(dense, tag));
    for (const SparseIn& s : sparse) handles_.push_back(client_->PushSparse(s.table, s.ids, s.grads, tag));
    int64_t used = 0, dropped = 0;
    FERRY_RETURN_IF_ERROR(WaitAll("push", tag, [&](const Served& s) {
      used += s.used;
      dropped += s.dropped;
    }));
    if (used > 0 || dropped == 0) {
      ++progress_.pushes_used;
    } else {
      ++progress_.pushes_dropped;
    }
    if (sync) next_step_ = tag + 1;
    return Status::Ok();
  }

  // ssp: sends the clock and returns; the next Pull collects its replies.
  Status EndStep(int64_t step) override {
    if (consistency_ == Consistency::kSsp) clock_ = client_->AdvanceClock(step + 1);
    return Status::Ok();
  }

  StoreProgress progress() const override { return progress_; }
  Client* client() override { return client_; }

 private:
  // Waits for every handle (even after a failure: the buffers they use must not be released
  // while ZeroMQ still holds them), passes each one's report to `on_served`, and returns the
  // first error.
  template <typename OnServed>
  Status WaitAll(const char* what, int64_t step, OnServed&& on_served) {
    Status first;
    for (const Handle& h : handles_) {
      Status s = h.wait();
      if (s.ok()) on_served(h.served());
      if (!s.ok() && first.ok()) first = std::move(s);
    }
    handles_.clear();
    if (!first.ok()) return first.WithContext(std::string(what) + " at step " + std::to_string(step));
    return Status::Ok();
  }

  Client* const client_;
  const Consistency consistency_;
  std::vector<Handle> handles_;
  Handle clock_;           // the last EndStep's clock, not yet waited for (ssp)
  int64_t next_step_ = 0;  // sync: the step the next pull asks for (last push's step + 1)
  StoreProgress progress_;
};

class LocalStore final : public ParamStore {
 public:
  Status Declare(std::span<const TableSpec> specs) override {
    for (const TableSpec& s : specs) {
      FERRY_RETURN_IF_ERROR(s.Validate().WithContext("table '" + s.name + "'"));
      if (tables_.count(s.name) != 0) return AlreadyExistsError("table '" + s.name + "' declared twice");
      auto t = std::make_unique<LocalTable>();
      t->spec = s;
      t->id = TableId(s.name);
      if (s.type == TableType::kDense) {
        const int64_t n = s.num_elements();
        t->params.resize(static_cast<size_t>(n));
        ps::InitDense(t->spec, t->id, 0, t->params.data(), n);
        t->state.resize(static_cast<size_t>(ps::StateSlots(s.optimizer.type) * n));
        ps::InitState(s.optimizer, t->state.data(), static_cast<size_t>(n));
      } else {
        // spec must not move: the shard keeps a reference (LocalTable lives behind unique_ptr).
        t->sparse = std::make_unique<ps::SparseShard>(t->spec, t->id, /*num_workers=*/1);
      }
      tables_.emplace(s.name, std::move(t));
    }
    return Status::Ok();
  }

  Status Pull(std::span<const DenseOut> dense, std::span<const SparseOut> sparse, int64_t step) override {
    progress_.step = step;
    if (progress_.first_served < 0) progress_.first_served = step;
    for (const DenseOut& d : dense) {
      FERRY_ASSIGN_OR_RETURN(LocalTable * t, Find(d.table, TableType::kDense, d.data.size()));
      std::copy(t->params.begin(), t->params.end(), d.data.begin());
    }
    for (const SparseOut& s : sparse) {
      FERRY_ASSIGN_OR_RETURN(LocalTable * t, Find(s.table, TableType::kSparse, 0));
      const size_t dim = static_cast<size_t>(t->spec.dim);
      if (s.rows.size() != s.ids.size() * dim) return InvalidArgumentError("pull of '" + std::string(s.table) + "': rows size");
      for (size_t i = 0; i < s.ids.size(); ++i) {
        const float* row = t->sparse->row(t->sparse->FindOrCreate(s.ids[i]));
        std::copy(row, row + dim, s.rows.begin() + static_cast<std::ptrdiff_t>(i * dim));
      }
    }
    return Status::Ok();
  }

  Status Push(std::span<const DenseIn> dense, std::span<const SparseIn> sparse, int64_t step) override {
    for (const DenseIn& d : dense) {
      FERRY_ASSIGN_OR_RETURN(LocalTable * t, Find(d.table, TableType::kDense, d.data.size()));
      ps::ApplyUpdate(t->spec.optimizer, t->params.data(), d.data.data(), t->state.data(), t->params.size(),
                      t->params.size(), step + 1);
    }
    for (const SparseIn& s : sparse) {
      FERRY_ASSIGN_OR_RETURN(LocalTable * t, Find(s.table, TableType::kSparse, 0));
      ps::SparseShard& shard = *t->sparse;
      const size_t dim = static_cast<size_t>(t->spec.dim);
      if (s.grads.size() != s.ids.size() * dim) return InvalidArgumentError("push to '" + std::string(s.table) + "': grads size");
      for (size_t i = 0; i < s.ids.size(); ++i) {
        const ps::RowIndex r = shard.FindOrCreate(s.ids[i]);
        ps::ApplyUpdate(t->spec.optimizer, shard.row(r), s.grads.data() + i * dim, shard.state(r), dim, dim,
                        ++shard.steps(r));
      }
    }
    ++progress_.pushes_used;
    return Status::Ok();
  }

  Status EndStep(int64_t) override { return Status::Ok(); }
  StoreProgress progress() const override { return progress_; }

 private:
  struct LocalTable {
    TableSpec spec;
    uint64_t id = 0;
    std::vector<float> params, state;        // dense
    std::unique_ptr<ps::SparseShard> sparse;  // sparse
  };

  StatusOr<LocalTable*> Find(std::string_view name, TableType type, size_t dense_elems) {
    auto it = tables_.find(name);
    if (it == tables_.end()) return NotFoundError("table '" + std::string(name) + "' was not declared");
    LocalTable* t = it->second.get();
    if (t->spec.type != type) return InvalidArgumentError("table '" + std::string(name) + "' has another type");
    if (type == TableType::kDense && dense_elems != t->params.size()) {
      return InvalidArgumentError("table '" + std::string(name) + "' has " + std::to_string(t->params.size()) +
                                  " elements, the buffer " + std::to_string(dense_elems));
    }
    return t;
  }

  std::map<std::string, std::unique_ptr<LocalTable>, std::less<>> tables_;
  StoreProgress progress_;
};

}  // namespace

std::unique_ptr<ParamStore> CreateServerStore(Client* client, Consistency consistency) {
  return std::make_unique<ServerStore>(client, consistency);
}
std::unique_ptr<ParamStore> CreateLocalStore() { return std::make_unique<LocalStore>(); }

}  // namespace ferry::trainer
