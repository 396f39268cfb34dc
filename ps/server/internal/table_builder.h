// ps/server/internal/table_builder.h — builds large table shards on a thread of their own, so
// that the I/O thread goes on serving every other client while a table of gigabytes is allocated
// and initialised (ServerOptions: tables of at least kBuildAsideBytes here).
//
// The I/O thread declares a table (TableRegistry::Declare), hands it here with Submit, and, when
// `done` (the Waker) fires, takes the finished ones with TakeDone and adopts or forgets them. One
// table is built at a time, in the order submitted.
//
// Thread-safety: Submit, TakeDone and Stop are for the I/O thread; the builder's thread touches
// only the tables handed to it (and the memory budget's atomic count).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/status.h"
#include "internal/table_registry.h"

namespace ferry::ps {

// A dense shard at least this large is built aside; smaller ones (and sparse shards, which start
// empty) are made at once on the I/O thread.
inline constexpr int64_t kBuildAsideBytes = int64_t{64} << 20;

class TableBuilder {
 public:
  // `registry` builds (TableRegistry::Build is safe off the I/O thread); `done` is called on the
  // builder's thread after each table.
  TableBuilder(TableRegistry* registry, std::function<void()> done) : registry_(registry), done_(std::move(done)) {}
  ~TableBuilder() { Stop(); }

  // Builds `table` (owned by the caller until TakeDone returns it) for a job of `num_workers`.
  void Submit(Table* table, int num_workers) {
    {
      MutexLock lock(&mu_);
      queue_.emplace_back(table, num_workers);
    }
    cv_.Signal();
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  }

  // The tables built (or failed) since the last call, with their outcome.
  std::vector<std::pair<Table*, Status>> TakeDone() {
    MutexLock lock(&mu_);
    std::vector<std::pair<Table*, Status>> out;
    out.swap(done_list_);
    return out;
  }

  // Gives up the table being built (it fails CANCELLED) and those waiting; joins the thread.
  void Stop() {
    cancel_.store(true);
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    cv_.SignalAll();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    while (true) {
      std::pair<Table*, int> job;
      {
        MutexLock lock(&mu_);
        while (queue_.empty() && !stopping_) cv_.Wait(&mu_);
        if (stopping_) return;
        job = queue_.front();
        queue_.pop_front();
      }
      Status s = registry_->Build(*job.first, job.second, &cancel_);
      {
        MutexLock lock(&mu_);
        done_list_.emplace_back(job.first, std::move(s));
      }
      done_();
    }
  }

  TableRegistry* const registry_;
  const std::function<void()> done_;
  std::atomic<bool> cancel_{false};
  Mutex mu_;
  CondVar cv_;
  std::deque<std::pair<Table*, int>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<Table*, Status>> done_list_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ferry::ps
