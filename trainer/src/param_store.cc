#include "ferry/trainer/param_store.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ferry/local_tables.h"

namespace ferry::trainer {
namespace {

class ServerStore final : public ParamStore {
 public:
  ServerStore(Client* client, Pipeline pipeline) : client_(client), pipeline_(pipeline) {}

  // Buffers lent to requests still in flight must outlive them.
  ~ServerStore() override {
    for (Exchange& e : exchanges_) {
      for (const Handle& h : e.handles) (void)h.wait();
    }
    DropPart();
    DropSparseAhead();
  }

  Status Declare(std::span<const TableSpec> specs) override {
    FERRY_RETURN_IF_ERROR(CheckPipelineFits(pipeline_, specs));
    for (const TableSpec& s : specs) {
      FERRY_RETURN_IF_ERROR(client_->Declare(s).WithContext("declaring " + s.name));
      consistency_[s.name] = s.consistency;
      any_sync_ = any_sync_ || s.consistency == Consistency::kSync;
      any_ssp_ = any_ssp_ || s.consistency == Consistency::kSsp;
    }
    return Status::Ok();
  }

  Status Pull(std::span<const DenseOut> dense, std::span<const SparseOut> sparse, int64_t step) override {
    if (part_.open()) {
      return FailedPreconditionError("Pull at step " + std::to_string(step) + ": step " + std::to_string(part_.step) +
                                     "'s push was sent in part (PushPart) and its Push has not come");
    }
    // Sync tables are read at the global step this worker knows, the others at the loop's.
    const int64_t want = any_sync_ ? next_step_ : step;
    // The exchanges whose parameters are for this step (or that write into these buffers) end
    // first; what they pulled ahead is then taken instead of asking again.
    int64_t served = -1;
    std::chrono::microseconds held{0};
    auto on_served = [&](const Served& s, bool sync) {
      if (sync && s.version >= 0) served = served < 0 ? s.version : std::min(served, s.version);
      held = std::max(held, s.held);
    };
    // An exchange that failed (its push refused: a gradient holding NaN, say) ends the step here:
    // the pulls below would wait for a sync step that cannot close without that push.
    FERRY_RETURN_IF_ERROR(SettleExchanges(dense, step, on_served));
    // Rows read ahead for this step into these buffers are taken; a read ahead into buffers
    // this pull writes is waited for (and read again here).
    const bool take_sparse = MatchesSparseAhead(sparse, step);
    if (!take_sparse && OverlapsSparseAhead(sparse)) DropSparseAhead();
    pulls_.clear();
    for (const DenseOut& d : dense) {
      if (!TakeAhead(d, step)) pulls_.push_back(d);
    }
    handles_.clear();
    sync_handle_.clear();
    ForEachGroup(std::span<const DenseOut>(pulls_), [&](std::span<const DenseOut> group, bool sync) {
      Add(client_->PullDense(group, sync ? want : step), sync);
    });
    // Every sparse table of a kind in one message per server; a model's ids are distinct.
    if (take_sparse) {
      for (Handle& h : sparse_ahead_.handles) Add(std::move(h), false);
      sparse_ahead_ = {};
    } else {
      ForEachGroup(sparse, [&](std::span<const SparseOut> group, bool sync) {
        Add(client_->PullSparse(group, sync ? want : step, SparseIds::kDistinct), sync);
      });
    }
    // The last step's clock (ssp) travelled ahead of these pulls on each server's connection; its
    // replies are collected here rather than waited for alone after the step.
    const Status clock = std::exchange(clock_, Handle()).wait();
    double comm = 0;
    const Status pulled = WaitAll("pull", want, &comm, on_served);
    progress_.comm_s += comm;
    FERRY_RETURN_IF_ERROR(pulled);
    FERRY_RETURN_IF_ERROR(clock.WithContext("advancing the clock before step " + std::to_string(step)));
    progress_.pull_wait_s += std::chrono::duration<double>(held).count();
    // Sync: the servers answered once every sync table had reached `want`; a table served at a
    // later step means the job moved on without this worker (it was late, or joined late): its
    // next push counts for the step it was served.
    progress_.step = any_sync_ && served >= want ? served : want;
    if (progress_.first_served < 0) progress_.first_served = progress_.step;
    return Status::Ok();
  }

  Status PushPart(std::span<const DenseIn> dense, int64_t step, std::span<const DenseOut> then_pull) override {
    if (pull_ahead() == 0 || dense.empty()) return Status::Ok();
    FERRY_RETURN_IF_ERROR(CheckPairs(dense, then_pull).WithContext("PushPart"));
    if (part_.open() && part_.step != step) {
      return FailedPreconditionError("PushPart at step " + std::to_string(step) + ": step " +
                                     std::to_string(part_.step) + "'s parts are still waiting for its Push");
    }
    for (const DenseIn& d : dense) {
      if (part_.Sent(d)) {
        return InvalidArgumentError("PushPart: table '" + std::string(d.table) + "' was already sent for step " +
                                    std::to_string(step));
      }
    }
    FERRY_RETURN_IF_ERROR(SettleExchanges(then_pull, INT64_MIN, [](const Served&, bool) {}));
    if (!part_.open()) {
      part_.step = step;
      part_.exchange.step = step + pull_ahead();
      part_.exchange.tag = any_sync_ ? progress_.step : step;
    }
    SendExchange(dense, then_pull, step, &part_.exchange);
    for (const DenseIn& d : dense) part_.sent.push_back(d.data.data());
    for (const DenseOut& d : then_pull) part_.pulls.push_back(d.data.data());
    PullingAhead(then_pull, part_.exchange.step);
    return Status::Ok();
  }

  Status Push(std::span<const DenseIn> dense, std::span<const SparseIn> sparse, int64_t step,
              std::span<const DenseOut> then_pull) override {
    const int64_t tag = any_sync_ ? progress_.step : step;
    const bool exchange = pull_ahead() > 0 && !then_pull.empty() && !dense.empty();
    if (part_.open()) {
      Status bad;
      if (part_.step != step) {
        bad = FailedPreconditionError("step " + std::to_string(part_.step) +
                                      " was sent in part, and then its Push came for step " + std::to_string(step));
      } else if (!exchange) {
        bad = InvalidArgumentError("the parts sent for step " + std::to_string(step) +
                                   " pull ahead: the Push must too (then_pull)");
      }
      if (bad.ok()) {
        // Every part must be among the tables pushed, in the buffers it was sent from: else the
        // Push would send it again.
        size_t named = 0;
        for (const DenseIn& d : dense) {
          named += part_.Sent(d) ? 1 : 0;
        }
        if (named != part_.sent.size()) {
          bad = InvalidArgumentError("the Push of step " + std::to_string(step) + " names " + std::to_string(named) +
                                     " of the " + std::to_string(part_.sent.size()) +
                                     " tables its parts sent (in the buffers they were sent from)");
        }
      }
      if (!bad.ok()) {
        DropPart();
        return bad.WithContext("Push");
      }
    }
    if (exchange) {
      // On failure here the parts stay in flight until Flush or the destructor waits for them.
      FERRY_RETURN_IF_ERROR(CheckPairs(dense, then_pull));
      // An exchange still writing into these buffers (a model that does not alternate them)
      // ends first.
      FERRY_RETURN_IF_ERROR(SettleExchanges(then_pull, INT64_MIN, [](const Served&, bool) {}));
    }
    // The step's parts already sent (PushPart) begin its exchange; the rest goes here.
    Part part = std::exchange(part_, Part());
    handles_.clear();
    sync_handle_.clear();
    Exchange e = std::move(part.exchange);
    e.step = step + pull_ahead();
    e.tag = tag;
    if (exchange) {
      rest_in_.clear();
      rest_out_.clear();
      for (size_t i = 0; i < dense.size(); ++i) {
        if (part.Sent(dense[i])) continue;
        rest_in_.push_back(dense[i]);
        rest_out_.push_back(then_pull[i]);
      }
      SendExchange(rest_in_, rest_out_, step, &e);
    } else {
      ForEachGroup(dense, [&](std::span<const DenseIn> grads, bool sync) {
        Add(client_->PushDense(grads, sync ? tag : step), sync);
      });
    }
    // Prefetch: the sparse push travels with the exchange too, and ends with it (by the Pull of
    // step + 2); otherwise it is waited for here.
    const bool sparse_with_exchange = exchange && pipeline_ == Pipeline::kPrefetch;
    ForEachGroup(sparse, [&](std::span<const SparseIn> group, bool sync) {
      Handle h = client_->PushSparse(group, sync ? tag : step, SparseIds::kDistinct);
      if (!sparse_with_exchange) return Add(std::move(h), sync);
      e.handles.push_back(std::move(h));
      e.sync.push_back(sync);
    });
    // With sync tables, whether the step's push counted is theirs to say: the async tables'
    // parts are always applied.
    Status waited = WaitAll("push", tag, &e.sparse_comm_s,
                            [&](const Served& s, bool sync) { e.count.Add(s, sync, any_sync_); });
    if (any_sync_) next_step_ = tag + 1;
    if (!exchange) {
      progress_.comm_s += e.sparse_comm_s;
      FERRY_RETURN_IF_ERROR(waited);
      e.count.Finish(&progress_);
      return Status::Ok();
    }
    // Whatever the dense exchange pulls is for step e.step, into then_pull's buffers.
    PullingAhead(then_pull, e.step);
    e.first_error = std::move(waited);
    exchanges_.push_back(std::move(e));
    return Status::Ok();
  }

  Status PullSparseAhead(std::span<const SparseOut> sparse, int64_t step) override {
    // A prefetch store has no sync table (Declare refuses them).
    if (pipeline_ != Pipeline::kPrefetch || sparse.empty()) return Status::Ok();
    DropSparseAhead();  // one at a time
    sparse_ahead_.step = step;
    for (const SparseOut& t : sparse) {
      sparse_ahead_.tables.push_back({std::string(t.table), t.ids.data(), t.ids.size(), t.rows.data(), t.rows.size()});
    }
    ForEachGroup(sparse, [&](std::span<const SparseOut> group, bool) {
      sparse_ahead_.handles.push_back(client_->PullSparse(group, step, SparseIds::kDistinct));
    });
    return Status::Ok();
  }

  void JoinAt(int64_t step) override {
    if (any_sync_) next_step_ = step;
  }

  Status Flush() override {
    // A step sent in part whose Push never came (its caller failed mid-step): its requests end
    // here, and what they pulled is not used.
    DropPart();
    Status first = SettleExchanges({}, INT64_MAX, [&](const Served& s, bool) {
      progress_.pull_wait_s += std::chrono::duration<double>(s.held).count();
    });
    DropSparseAhead();
    ahead_.clear();
    const Status clock = std::exchange(clock_, Handle()).wait();
    FERRY_RETURN_IF_ERROR(first);
    return clock.WithContext("advancing the clock");
  }

  int pull_ahead() const override {
    switch (pipeline_) {
      case Pipeline::kNone: return 0;
      case Pipeline::kExchange: return 1;
      case Pipeline::kPrefetch: return 2;
    }
    return 0;
  }

  // ssp: sends the clock and returns; the next Pull collects its replies.
  Status EndStep(int64_t step) override {
    if (any_ssp_) clock_ = client_->AdvanceClock(step + 1);
    return Status::Ok();
  }

  StoreProgress progress() const override { return progress_; }
  Client* client() override { return client_; }

 private:
  // What one step's push reported, summed over its requests: whether the step counted.
  struct PushCount {
    int64_t used = 0, dropped = 0;
    void Add(const Served& s, bool sync, bool any_sync) {
      if (any_sync && !sync) return;
      used += s.used;
      dropped += s.dropped;
    }
    void Finish(StoreProgress* p) const {
      if (used > 0 || dropped == 0) {
        ++p->pushes_used;
      } else {
        ++p->pushes_dropped;
      }
    }
  };
  // A step's dense push and pull ahead (PushPullDense per group of one kind), in flight; with
  // Pipeline::kPrefetch its sparse push too (in handles, after the dense ones).
  struct Exchange {
    int64_t step = 0;  // the loop step its parameters are for
    int64_t tag = 0;   // the step its gradients count for
    std::vector<Handle> handles;
    std::vector<bool> sync;
    PushCount count;          // the step's sparse push, if already answered
    Status first_error;       // ... and its failure
    double sparse_comm_s = 0; // ... and its communication
  };
  // A dense table pulled ahead into `data` for loop step `step`; `ready` once its exchange
  // ended well.
  struct Ahead {
    std::string table;
    const float* data;
    size_t size;
    int64_t step;
    bool ready;
  };

  static Status CheckPairs(std::span<const DenseIn> dense, std::span<const DenseOut> then_pull) {
    if (then_pull.size() != dense.size()) {
      return InvalidArgumentError("Push: then_pull names " + std::to_string(then_pull.size()) + " tables, the push " +
                                  std::to_string(dense.size()));
    }
    for (size_t i = 0; i < dense.size(); ++i) {
      if (then_pull[i].table != dense[i].table || then_pull[i].data.size() != dense[i].data.size()) {
        return InvalidArgumentError("Push: then_pull " + std::to_string(i) + " ('" + std::string(then_pull[i].table) +
                                    "') does not match the pushed '" + std::string(dense[i].table) + "'");
      }
    }
    return Status::Ok();
  }

  // A step's push sent in part (PushPart), waiting for its Push.
  struct Part {
    int64_t step = 0;                 // the loop step
    Exchange exchange;                // its requests so far
    std::vector<const float*> sent;   // the gradient buffers sent (none: no part open)
    std::vector<const float*> pulls;  // the buffers they pull into
    bool open() const { return !sent.empty(); }
    bool Sent(const DenseIn& d) const { return std::find(sent.begin(), sent.end(), d.data.data()) != sent.end(); }
  };

  // Ends a step sent in part whose Push will not send it: waits for its requests, and forgets
  // what they pulled (nothing takes it).
  void DropPart() {
    Part part = std::exchange(part_, Part());
    for (const Handle& h : part.exchange.handles) (void)h.wait();
    std::erase_if(ahead_, [&](const Ahead& a) {
      return a.step == part.exchange.step &&
             std::find(part.pulls.begin(), part.pulls.end(), a.data) != part.pulls.end();
    });
  }

  // Sends `dense` with their pull ahead (`then_pull`, the same tables) into `e`: one
  // PushPullDense per group of one kind.
  void SendExchange(std::span<const DenseIn> dense, std::span<const DenseOut> then_pull, int64_t step, Exchange* e) {
    ForEachGroup(dense, [&](std::span<const DenseIn> grads, bool sync) {
      const auto outs = then_pull.subspan(static_cast<size_t>(grads.data() - dense.data()), grads.size());
      e->handles.push_back(client_->PushPullDense(grads, outs, sync ? e->tag : step));
      e->sync.push_back(sync);
    });
  }
  // What an exchange ending at loop step `step` pulls goes into `then_pull`'s buffers.
  void PullingAhead(std::span<const DenseOut> then_pull, int64_t step) {
    for (const DenseOut& d : then_pull) {
      std::erase_if(ahead_, [&](const Ahead& a) { return a.data == d.data.data(); });
      ahead_.push_back({std::string(d.table), d.data.data(), d.data.size(), step, false});
    }
  }

  // Sparse rows read ahead (PullSparseAhead), in flight until a Pull takes them; none while
  // `tables` is empty.
  struct SparseAhead {
    struct Table {
      std::string table;
      const int64_t* ids;
      size_t num_ids;
      const float* rows;
      size_t num_rows;
    };
    int64_t step = 0;
    std::vector<Table> tables;
    std::vector<Handle> handles;
  };

  bool MatchesSparseAhead(std::span<const SparseOut> sparse, int64_t step) const {
    if (sparse_ahead_.tables.empty() || sparse_ahead_.step != step || sparse.size() != sparse_ahead_.tables.size()) {
      return false;
    }
    for (size_t i = 0; i < sparse.size(); ++i) {
      const SparseAhead::Table& a = sparse_ahead_.tables[i];
      if (a.table != sparse[i].table || a.ids != sparse[i].ids.data() || a.num_ids != sparse[i].ids.size() ||
          a.rows != sparse[i].rows.data() || a.num_rows != sparse[i].rows.size()) {
        return false;
      }
    }
    return true;
  }
  bool OverlapsSparseAhead(std::span<const SparseOut> sparse) const {
    for (const SparseOut& t : sparse) {
      for (const SparseAhead::Table& a : sparse_ahead_.tables) {
        if (Overlaps(a.rows, a.num_rows, t.rows.data(), t.rows.size())) return true;
      }
    }
    return false;
  }
  // Waits for rows read ahead that no Pull took, and forgets them (their buffers are free again;
  // what they read is not used).
  void DropSparseAhead() {
    for (const Handle& h : sparse_ahead_.handles) (void)h.wait();
    sparse_ahead_ = {};
  }

  // True when `d` was pulled ahead for `step` into its buffer by an exchange that ended well.
  bool TakeAhead(const DenseOut& d, int64_t step) const {
    for (const Ahead& a : ahead_) {
      if (a.data == d.data.data()) return a.ready && a.step == step && a.size == d.data.size() && a.table == d.table;
    }
    return false;
  }

  static bool Overlaps(const float* a, size_t an, const float* b, size_t bn) { return a < b + bn && b < a + an; }

  // Ends (waits for) the exchanges in flight that are due by `step`, or that write into one of
  // `dense`'s buffers, oldest first: counts their pushes, passes each reply to `on_served`, and
  // marks what they pulled ready. Returns the first failure.
  template <typename OnServed>
  Status SettleExchanges(std::span<const DenseOut> dense, int64_t step, OnServed&& on_served) {
    Status first;
    for (auto it = exchanges_.begin(); it != exchanges_.end();) {
      bool due = it->step <= step;
      for (const Ahead& a : ahead_) {
        if (a.step != it->step) continue;
        for (const DenseOut& d : dense) due = due || Overlaps(a.data, a.size, d.data.data(), d.data.size());
      }
      if (!due) {
        ++it;
        continue;
      }
      Exchange& e = *it;
      Status s = std::move(e.first_error);
      double comm = e.sparse_comm_s;
      for (size_t i = 0; i < e.handles.size(); ++i) {
        Status w = e.handles[i].wait();
        if (w.ok()) {
          const Served served = e.handles[i].served();
          e.count.Add(served, e.sync[i], any_sync_);
          on_served(served, e.sync[i]);
          comm = std::max(comm, Seconds(e.handles[i].elapsed() - served.held));
        }
        if (!w.ok() && s.ok()) s = std::move(w);
      }
      progress_.comm_s += comm;
      for (Ahead& a : ahead_) {
        if (a.step == e.step) a.ready = s.ok();
      }
      if (s.ok()) {
        e.count.Finish(&progress_);
      } else if (first.ok()) {
        first = s.WithContext("push at step " + std::to_string(e.tag) + " (with the pull of step " +
                              std::to_string(e.step) + "'s dense tables)");
      }
      it = exchanges_.erase(it);
    }
    return first;
  }

  static double Seconds(std::chrono::nanoseconds d) { return std::max(0.0, std::chrono::duration<double>(d).count()); }

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
  // to `on_served`, sets *comm to their communication (the longest, less what the servers held),
  // and returns the first error.
  template <typename OnServed>
  Status WaitAll(const char* what, int64_t step, double* comm, OnServed&& on_served) {
    Status first;
    *comm = 0;
    for (size_t i = 0; i < handles_.size(); ++i) {
      Status s = handles_[i].wait();
      if (s.ok()) {
        const Served served = handles_[i].served();
        on_served(served, sync_handle_[i]);
        *comm = std::max(*comm, Seconds(handles_[i].elapsed() - served.held));
      }
      if (!s.ok() && first.ok()) first = std::move(s);
    }
    handles_.clear();
    if (!first.ok()) return first.WithContext(std::string(what) + " at step " + std::to_string(step));
    return Status::Ok();
  }

  Client* const client_;
  const Pipeline pipeline_;
  std::map<std::string, Consistency, std::less<>> consistency_;  // per declared table
  bool any_sync_ = false, any_ssp_ = false;
  std::vector<Handle> handles_;
  std::vector<bool> sync_handle_;  // handles_[i] is a sync table's request
  std::vector<DenseOut> pulls_;    // Pull: the dense tables not pulled ahead
  std::vector<DenseIn> rest_in_;   // Push: the tables no part sent ...
  std::vector<DenseOut> rest_out_; // ... and their pulls ahead
  Part part_;                      // the step's push sent in part so far
  std::deque<Exchange> exchanges_; // dense exchanges in flight, oldest first
  std::vector<Ahead> ahead_;       // what they pull (or pulled), by buffer
  SparseAhead sparse_ahead_;       // rows read ahead for a later Pull
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

  Status Push(std::span<const DenseIn> dense, std::span<const SparseIn> sparse, int64_t step,
              std::span<const DenseOut>) override {
    for (const DenseIn& d : dense) FERRY_RETURN_IF_ERROR(tables_->ApplyDense(d.table, d.data, step + 1));
    for (const SparseIn& s : sparse) FERRY_RETURN_IF_ERROR(tables_->ApplyRows(s.table, s.ids, s.grads));
    ++progress_.pushes_used;
    return Status::Ok();
  }

  Status EndStep(int64_t) override { return Status::Ok(); }
  Status Flush() override { return Status::Ok(); }
  int pull_ahead() const override { return 0; }
  StoreProgress progress() const override { return progress_; }

 private:
  std::unique_ptr<ps::LocalTables> tables_ = ps::LocalTables::Create();
  StoreProgress progress_;
};

}  // namespace

Status CheckPipelineFits(Pipeline pipeline, std::span<const TableSpec> specs) {
  if (pipeline != Pipeline::kPrefetch) return Status::Ok();
  for (const TableSpec& s : specs) {
    if (s.consistency == Consistency::kSync) {
      return InvalidArgumentError("table '" + s.name +
                                  "' is sync, and --pipeline prefetch reads parameters a step early, which a sync "
                                  "step's do not exist yet: use --pipeline exchange, or async / ssp tables");
    }
  }
  return Status::Ok();
}

std::unique_ptr<ParamStore> CreateServerStore(Client* client, Pipeline pipeline) {
  return std::make_unique<ServerStore>(client, pipeline);
}
std::unique_ptr<ParamStore> CreateLocalStore() { return std::make_unique<LocalStore>(); }

}  // namespace ferry::trainer
