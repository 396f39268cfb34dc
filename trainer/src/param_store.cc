#include "ferry/trainer/param_store.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ferry/local_tables.h"

namespace ferry::trainer {
namespace {

class ServerStore final : public ParamStore {
 public:
  explicit ServerStore(Client* client) : client_(client) {}

  Status Declare(std::span<const TableSpec> specs) override {
    for (const TableSpec& s : specs) {
      FERRY_RETURN_IF_ERROR(client_->Declare(s).WithContext("declaring " + s.name));
      consistency_[s.name] = s.consistency;
      any_sync_ = any_sync_ || s.consistency == Consistency::kSync;
      any_ssp_ = any_ssp_ || s.consistency == Consistency::kSsp;
    }
    return Status::Ok();
  }

  Status Pull(std::span<const DenseOut> dense, std::span<const SparseOut> sparse, int64_t step) override {
    // Sync tables are read at the global step this worker knows, the others at the loop's.
    const int64_t want = any_sync_ ? next_step_ : step;
    handles_.clear();
    sync_handle_.clear();
    ForEachGroup(dense, [&](std::span<const DenseOut> group, bool sync) {
      Add(client_->PullDense(group, sync ? want : step), sync);
    });
    // Every sparse table of a kind in one message per server; a model's ids are distinct.
    ForEachGroup(sparse, [&](std::span<const SparseOut> group, bool sync) {
      Add(client_->PullSparse(group, sync ? want : step, SparseIds::kDistinct), sync);
    });
    // The last step's clock (ssp) travelled ahead of these pulls on each server's connection; its
    // replies are collected here rather than waited for alone after the step.
    const Status clock = std::exchange(clock_, Handle()).wait();
    int64_t served = -1;
    std::chrono::microseconds held{0};
    FERRY_RETURN_IF_ERROR(WaitAll("pull", want, [&](const Served& s, bool sync) {
      if (sync && s.version >= 0) served = served < 0 ? s.version : std::min(served, s.version);
      held = std::max(held, s.held);
    }));
    FERRY_RETURN_IF_ERROR(clock.WithContext("advancing the clock before step " + std::to_string(step)));
    progress_.pull_wait_s += std::chrono::duration<double>(held).count();
    // Sync: the servers answered once every sync table had reached `want`; a table served at a
    // later step means the job moved on without this worker (it was late, or joined late): its
    // next push counts for the step it was served.
    progress_.step = any_sync_ && served >= want ? served : want;
    if (progress_.first_served < 0) progress_.first_served = progress_.step;
    return Status::Ok();
  }

  Status Push(std::span<const DenseIn> dense, std::span<const SparseIn> sparse, int64_t step) override {
    const int64_t tag = any_sync_ ? progress_.step : step;
    handles_.clear();
    sync_handle_.clear();
    ForEachGroup(dense, [&](std::span<const DenseIn> group, bool sync) {
      Add(client_->PushDense(group, sync ? tag : step), sync);
    });
    ForEachGroup(sparse, [&](std::span<const SparseIn> group, bool sync) {
      Add(client_->PushSparse(group, sync ? tag : step, SparseIds::kDistinct), sync);
    });
    // With sync tables, whether the step's push counted is theirs to say: the async tables'
    // parts are always applied.
    int64_t used = 0, dropped = 0;
    FERRY_RETURN_IF_ERROR(WaitAll("push", tag, [&](const Served& s, bool sync) {
      if (any_sync_ && !sync) return;
      used += s.used;
      dropped += s.dropped;
    }));
    if (used > 0 || dropped == 0) {
      ++progress_.pushes_used;
    } else {
      ++progress_.pushes_dropped;
    }
    if (any_sync_) next_step_ = tag + 1;
    return Status::Ok();
  }

  // ssp: sends the clock and returns; the next Pull collects its replies.
  Status EndStep(int64_t step) override {
    if (any_ssp_) clock_ = client_->AdvanceClock(step + 1);
    return Status::Ok();
  }

  StoreProgress progress() const override { return progress_; }
  Client* client() override { return client_; }

 private:
  bool IsSync(std::string_view table) const {
    auto it = consistency_.find(table);
    return it != consistency_.end() && it->second == Consistency::kSync;
  }

  // Calls fn(group, sync) for the runs of `tables` of one kind (sync or not), in order: one
  // request per run (a model's dense tensors, and its embedding tables, are usually each all of
  // one kind: one request each).
  template <typename T, typename Fn>
  void ForEachGroup(std::span<const T> tables, Fn&& fn) const {
    for (size_t at = 0; at < tables.size();) {
      const bool sync = IsSync(tables[at].table);
      size_t end = at + 1;
      while (end < tables.size() && IsSync(tables[end].table) == sync) ++end;
      fn(tables.subspan(at, end - at), sync);
      at = end;
    }
  }

  void Add(Handle h, bool sync) {
    handles_.push_back(std::move(h));
    sync_handle_.push_back(sync);
  }

  // Waits for every handle (even after a failure: the buffers they use must not be released
  // while ZeroMQ still holds them), passes each one's report and whether it was a sync table's
  // to `on_served`, and returns the first error.
  template <typename OnServed>
  Status WaitAll(const char* what, int64_t step, OnServed&& on_served) {
    Status first;
    for (size_t i = 0; i < handles_.size(); ++i) {
      Status s = handles_[i].wait();
      if (s.ok()) on_served(handles_[i].served(), sync_handle_[i]);
      if (!s.ok() && first.ok()) first = std::move(s);
    }
    handles_.clear();
    if (!first.ok()) return first.WithContext(std::string(what) + " at step " + std::to_string(step));
    return Status::Ok();
  }

  Client* const client_;
  std::map<std::string, Consistency, std::less<>> consistency_;  // per declared table
  bool any_sync_ = false, any_ssp_ = false;
  std::vector<Handle> handles_;
  std::vector<bool> sync_handle_;  // handles_[i] is a sync table's request
  Handle clock_;           // the last EndStep's clock, not yet waited for (ssp)
  int64_t next_step_ = 0;  // sync: the step the next pull asks for (last push's step + 1)
  StoreProgress progress_;
};

// The --local reference: every table in this process, with the servers' own init and optimizer
// code (ferry::ps::LocalTables).
class LocalStore final : public ParamStore {
 public:
  Status Declare(std::span<const TableSpec> specs) override {
    for (const TableSpec& s : specs) FERRY_RETURN_IF_ERROR(tables_->Declare(s));
    return Status::Ok();
  }

  Status Pull(std::span<const DenseOut> dense, std::span<const SparseOut> sparse, int64_t step) override {
    progress_.step = step;
    if (progress_.first_served < 0) progress_.first_served = step;
    for (const DenseOut& d : dense) FERRY_RETURN_IF_ERROR(tables_->ReadDense(d.table, d.data));
    for (const SparseOut& s : sparse) FERRY_RETURN_IF_ERROR(tables_->ReadRows(s.table, s.ids, s.rows));
    return Status::Ok();
  }

  Status Push(std::span<const DenseIn> dense, std::span<const SparseIn> sparse, int64_t step) override {
    for (const DenseIn& d : dense) FERRY_RETURN_IF_ERROR(tables_->ApplyDense(d.table, d.data, step + 1));
    for (const SparseIn& s : sparse) FERRY_RETURN_IF_ERROR(tables_->ApplyRows(s.table, s.ids, s.grads));
    ++progress_.pushes_used;
    return Status::Ok();
  }

  Status EndStep(int64_t) override { return Status::Ok(); }
  StoreProgress progress() const override { return progress_; }

 private:
  std::unique_ptr<ps::LocalTables> tables_ = ps::LocalTables::Create();
  StoreProgress progress_;
};

}  // namespace

std::unique_ptr<ParamStore> CreateServerStore(Client* client) { return std::make_unique<ServerStore>(client); }
std::unique_ptr<ParamStore> CreateLocalStore() { return std::make_unique<LocalStore>(); }

}  // namespace ferry::trainer
