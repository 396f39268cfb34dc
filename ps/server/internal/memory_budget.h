// ps/server/internal/memory_budget.h — the memory a server's tables may take
// (ServerOptions::memory_budget_bytes, ferry-ps --memory-budget-mb): a dense table's shard is
// charged when it is declared, a sparse row when it is created. What would go over is refused
// with how much was asked and how much is left, before anything is allocated, so a peer cannot
// declare tables or touch rows until the server is OOM-killed.
//
// Thread-safety: Take and Give may be called from any thread (an atomic count).
#pragma once

#include <atomic>
#include <cstdint>
#include <new>
#include <string>
#include <utility>

#include "ferry/status.h"

namespace ferry::ps {

// `bytes` in MiB for messages: "12.5 MiB".
std::string Mib(int64_t bytes);

// Thrown where a row would go over the budget (inside code whose out-of-memory path is
// std::bad_alloc, which it keeps exception-safe); what() says what was asked and what is left.
class BudgetExceeded : public std::bad_alloc {
 public:
  explicit BudgetExceeded(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

class MemoryBudget {
 public:
  // `limit` bytes; 0: DefaultLimit().
  explicit MemoryBudget(int64_t limit) : limit_(limit > 0 ? limit : DefaultLimit()) {}

  // 80% of the memory this process may use: the machine's, or its cgroup's limit if lower.
  static int64_t DefaultLimit();

  // The memory limit of this process's cgroups, or 0 when none is set: the lowest memory.max
  // (cgroup v2) or memory.limit_in_bytes (v1) of its own cgroup and every ancestor up to the
  // hierarchy's mount, of every hierarchy that holds the memory controller. `proc_cgroup` and
  // `mountinfo` are the texts of /proc/self/cgroup and /proc/self/mountinfo; `root` is prefixed
  // to every path read ("" for the real files; a temporary tree in the tests). A process in a
  // cgroup namespace sees its own cgroup as "/" and the mount's root as "/": it reads the mount.
  static int64_t CgroupLimit(const std::string& proc_cgroup, const std::string& mountinfo,
                             const std::string& root = "");

  int64_t limit() const { return limit_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  // Charges refused so far.
  int64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

  // Charges `bytes` if they fit; otherwise false and nothing is charged.
  bool TryTake(int64_t bytes);
  // As TryTake, or ResourceExhausted with Refusal(bytes, what).
  Status Take(int64_t bytes, const std::string& what);
  void Give(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  // Charges `bytes` even past the limit: for what was accepted already and must be kept (the
  // rows of a sync step whose pushes each fit when they came).
  void Force(int64_t bytes) { used_.fetch_add(bytes, std::memory_order_relaxed); }
  // Counts a refusal decided by the caller (a request whose rows would not fit).
  void CountRefusal() { refusals_.fetch_add(1, std::memory_order_relaxed); }

  // "<what> would take X MiB; the server's memory budget (--memory-budget-mb) has Y MiB of Z MiB left".
  std::string Refusal(int64_t bytes, const std::string& what) const;

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
  std::atomic<int64_t> refusals_{0};
};

// Bytes charged to a budget for as long as this object lives (it moves with what holds them):
// a held request's payload, against the server's bound on those (ServerImpl::RoomToHold).
class BudgetCharge {
 public:
  BudgetCharge() = default;
  BudgetCharge(MemoryBudget* budget, int64_t bytes) : budget_(budget), bytes_(bytes) {}
  BudgetCharge(BudgetCharge&& o) noexcept : budget_(std::exchange(o.budget_, nullptr)), bytes_(o.bytes_) {}
  BudgetCharge& operator=(BudgetCharge&& o) noexcept {
    if (this != &o) {
      Release();
      budget_ = std::exchange(o.budget_, nullptr);
      bytes_ = o.bytes_;
    }
    return *this;
  }
  BudgetCharge(const BudgetCharge&) = delete;
  BudgetCharge& operator=(const BudgetCharge&) = delete;
  ~BudgetCharge() { Release(); }

 private:
  void Release() {
    if (budget_ != nullptr) budget_->Give(bytes_);
    budget_ = nullptr;
  }
  MemoryBudget* budget_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace ferry::ps
