// ps/server/internal/collectives.h — barriers and all-reduce. Each worker's request waits here
// until every worker of the job that takes part (one that has not left it, 1.18) has entered the
// same collective (by id), or until the first arrival's deadline passes; an all-reduce's values
// are summed in rank order, so every run adds the same numbers in the same order.
//
// Thread-safety: none; the server's I/O thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ferry/messages/deadlines.h"
#include "ferry/status.h"
#include "internal/request.h"

namespace ferry::ps {

class Collectives {
 public:
  // Requests waiting, all collectives together.
  size_t size() const { return waiting_; }

  // Whether `req` (a Barrier or AllReduce) may join its collective: refused when its rank has
  // entered already, when it disagrees with the first arrival (kind, number of values), or when
  // the collective has ended without it (below next_id()), for the workers would never complete it.
  Status CheckEntry(const Request& req) const;

  // `part`, in every call below: per worker rank, whether it takes part (Workers::TakingPart):
  // a collective completes once every rank that takes part has entered it.
  //
  // Adds `req` (checked) to its collective, to wait until `deadline`. When that completes it,
  // returns every request of it in rank order (and forgets them); else nothing.
  std::vector<Request> Enter(Request req, Clock::time_point deadline, const std::vector<bool>& part);
  // Removes and returns, each in rank order, the collectives that are complete now: every rank
  // that takes part has entered (after a worker left, 1.18).
  std::vector<std::vector<Request>> TakeComplete(const std::vector<bool>& part);

  // The id the job's next collective takes: one past the highest that ended (completed, expired
  // or failed; 0 before any).
  // A worker that connects again (restarted) continues the sequence from here.
  int64_t next_id() const { return next_id_; }
  // Forgets `rank`'s entries in collectives still waiting (its process died; a new one of the
  // same rank enters them again).
  void Forget(int rank);
  // Takes `rank`'s entry out of collective `id` (nothing if it has none), to be answered by the
  // caller: the others go on waiting in it, and a collective left empty is forgotten without
  // ending (next_id() stays), so the rank's next process enters it again.
  std::optional<Request> Withdraw(int64_t id, int rank);
  // Calls fn(id, arrived requests, missing ranks) for each collective waiting.
  template <typename Fn>
  void ForEach(const std::vector<bool>& part, Fn&& fn) const {
    for (const auto& [id, arrived] : by_id_) fn(id, arrived, Missing(arrived, part));
  }

  // What the collectives `rank` has entered wait for, one clause each: "Barrier 3 waits for
  // worker(s) 1 (1 of 2 arrived)" (the Waiting request).
  std::vector<std::string> Describe(int rank, const std::vector<bool>& part) const;

  // How many of `arrived` take part (a rank that left may have entered before it left).
  static size_t ArrivedTakingPart(const std::vector<Request>& arrived, const std::vector<bool>& part);

  // The element-wise sum, in the order given, of the values each request of an all-reduce carries.
  static std::vector<double> Sum(const std::vector<Request>& group);

  struct Expired {
    int64_t id;
    std::vector<Request> arrived;
    std::string missing;  // the ranks that never came: "1, 3"
    std::vector<int> missing_ranks;
  };
  std::optional<Clock::time_point> NextDeadline() const { return deadlines_.Next(); }
  // Removes and returns the collectives whose first arrival's deadline has passed.
  std::vector<Expired> TakeExpired(Clock::time_point now, const std::vector<bool>& part);
  // Removes and returns the collectives for which `pred(arrived requests, missing ranks)` is true.
  template <typename Pred>
  std::vector<Expired> TakeIf(const std::vector<bool>& part, Pred&& pred) {
    std::vector<int64_t> ids;
    for (const auto& [id, arrived] : by_id_) {
      if (pred(arrived, Missing(arrived, part))) ids.push_back(id);
    }
    std::vector<Expired> out;
    for (int64_t id : ids) {
      deadlines_.Remove(by_id_.at(id)[0].deadline, id);
      out.push_back(Take(id, part));
    }
    return out;
  }

 private:
  // Removes the collective `id` (its deadline already removed or taken), naming who never came.
  Expired Take(int64_t id, const std::vector<bool>& part);
  // Removes the entries of `it`'s collective for which pred(request) holds, keeping its deadline
  // that of its first arrival left, and the collective if none is; returns them. `it` moves on.
  template <typename Pred>
  std::vector<Request> RemoveFrom(std::map<int64_t, std::vector<Request>>::iterator& it, Pred&& pred);
  // The ranks that take part and have not entered.
  static std::vector<int> Missing(const std::vector<Request>& arrived, const std::vector<bool>& part);

  std::map<int64_t, std::vector<Request>> by_id_;
  size_t waiting_ = 0;
  int64_t next_id_ = 0;
  transport::Deadlines<int64_t> deadlines_;  // one per collective: its first arrival's deadline
};

}  // namespace ferry::ps
