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

std::unique_ptr<ParamStore> CreateServerStore(Client* client, Consistency consistency) {
  return std::make_unique<ServerStore>(client, consistency);
}
std::unique_ptr<ParamStore> CreateLocalStore() { return std::make_unique<LocalStore>(); }

}  // namespace ferry::trainer
