// ps/server/internal/workers.h — the job's workers as one server sees them: how many there are
// (from the first Hello), which have finished, their clocks (ssp), and what follows from these:
// whether a sync step has its quorum, whether a pull may be served, and who is being waited for.
// See PROTOCOL.md, "Sync steps".
//
// Thread-safety: none; the server's I/O thread owns it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "internal/tables.h"

namespace ferry::ps {

// Steps and clocks from the network are within [0, kMaxStep]: no overflow in +1 or -staleness.
inline constexpr int64_t kMaxStep = int64_t{1} << 62;

class Workers {
 public:
  // 0 until the first Hello fixes it.
  int count() const { return count_; }

  // Fixes the count before any Hello (the server's configuration says it).
  Status SetCount(int num_workers);
  // A Hello from `rank` of a job of `num_workers`, sent by its process of `incarnation`: fixes the
  // count on the first one, refuses one that disagrees with it, and makes `rank` take part
  // (again), with `incarnation` as the rank's (CheckIncarnation has passed), in the sync steps
  // from `joins_at` on (1.18; 0: at once).
  Status Join(int rank, int num_workers, uint32_t incarnation = 0, int64_t joins_at = 0);
  // What Join would refuse, changing nothing.
  Status CheckJoin(int rank, int num_workers) const;

  // Incarnations (protocol 1.11). A launcher numbers the processes it starts for a rank: 0, then
  // 1, 2, ... at each restart (ClientOptions::incarnation; 0 for a program that does not say).
  // The highest a Hello has brought is the rank's. A request from a lower one comes from a
  // process that was replaced (a stopped or cut-off predecessor that came back): refused with
  // FAILED_PRECONDITION, so that it can change nothing of the job its successor now takes part in.
  uint32_t incarnation(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < incarnations_.size() ? incarnations_[static_cast<size_t>(rank)] : 0;
  }
  Status CheckIncarnation(int rank, uint32_t incarnation) const;

  // Steps each worker has done as this server knows them (protocol 1.11): one more than the
  // highest step of a push from the rank that this server took (async: the worker's own step
  // count; sync: the global step), or what a restored checkpoint recorded. A worker restarted
  // alone, or after the servers restored a checkpoint, resumes there (the Hello reply's
  // worker_step): an async job's workers each at their own step, not worker 0's. A server that
  // holds nothing a worker pushes knows nothing of its steps (-1), and is not counted.
  void Did(int rank, int64_t step) {
    auto& d = done_[static_cast<size_t>(rank)];
    d = std::max(d, step + 1);
    pushed_[static_cast<size_t>(rank)] = true;
    trained_[static_cast<size_t>(rank)] = true;
    // A push at or past the step it left before: the rank takes part again (a new process).
    if (auto& l = left_at_[static_cast<size_t>(rank)]; l >= 0 && step >= l) l = -1;
  }
  // Whether `rank` is training: it pushed (Did) since its last Hello (Join), and has not finished.
  bool training(int rank) const {
    return trained_[static_cast<size_t>(rank)] && !finished_[static_cast<size_t>(rank)];
  }
  // -1: unknown (no push of the rank taken, no restored record).
  int64_t done(int rank) const {
    return restored_ || pushed_[static_cast<size_t>(rank)] ? done_[static_cast<size_t>(rank)] : -1;
  }
  // Every rank's done(), for a checkpoint.
  std::vector<int64_t> KnownDone() const;
  // Whether a push of `rank` was taken since this server started.
  bool pushed(int rank) const { return pushed_[static_cast<size_t>(rank)]; }
  // After a restore (the count is set): the checkpoint's record `per_rank` where it has one
  // entry per worker and knows the rank (>= 0), else `step` (a checkpoint before 1.11, of another
  // worker count, or whose servers knew nothing of that worker).
  void SetDone(const std::vector<int64_t>& per_rank, int64_t step);
  // The worker has ended its training: it is no longer waited for.
  void Finish(int rank) { SetFinished(rank, true); }
  // The worker has left the job while it trains (1.18, Finish's `leaves`): finished, and out of
  // the job's collectives too, until its rank says Hello again. `at` (1.26, Finish's `leaves_at`):
  // the first step it takes no part in (LeavingAt); -1 not said.
  void Leave(int rank, int64_t at = -1) {
    SetFinished(rank, true);
    left_[static_cast<size_t>(rank)] = true;
    if (at >= 0) left_at_[static_cast<size_t>(rank)] = at;
  }
  bool left(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < left_.size() && left_[static_cast<size_t>(rank)];
  }
  // 1.26: the worker leaves (or left) the job before step `at`: its Finish said so (Leave), or
  // server 0 handed the workers its leave asked at step at - 1 (before its Finish comes). Kept,
  // for the Hello replies (left_at), until a push of the rank at or past `at` is taken (Did: a new
  // process takes part again), not cleared by a Hello: a worker restarted before or after the
  // leaver's new process says Hello hears the same.
  void LeavingAt(int rank, int64_t at) { left_at_[static_cast<size_t>(rank)] = at; }
  // The step `rank` leaves or left before, as LeavingAt; -1: none known.
  int64_t left_at(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < left_at_.size() ? left_at_[static_cast<size_t>(rank)] : -1;
  }
  // 1.27: whether `rank` left and its new process waits to join again (its Hello's joins_at
  // wire::kWaitsToRejoin): out of the job's steps and collectives until its join is handed.
  bool waits_to_rejoin(int rank) const { return left(rank) && joins_at(rank) >= kMaxStep; }
  // Server 0 handed the workers the join of `rank` (waits_to_rejoin) at step at - 1: it takes part
  // in the job's collectives at once (the hand-over's second barrier waits for it) and in its sync
  // steps from `at`. Kept for the rank's asks and the Hello replies (rejoins_at), pushes or not: a
  // worker restarted later, whose flags may say the rank left (--leave), or which hears of the
  // leave from a server the rank pushes nothing to, learns that it came back.
  void Rejoin(int rank, int64_t at) {
    SetFinished(rank, false);
    left_[static_cast<size_t>(rank)] = false;
    auto& j = joins_at_[static_cast<size_t>(rank)];
    num_joining_ += (at > 0 ? 1 : 0) - (j > 0 ? 1 : 0);
    j = at;
    rejoins_at_[static_cast<size_t>(rank)] = at;
  }
  // The step from which `rank` takes part again (its latest Rejoin); -1: none handed.
  int64_t rejoins_at(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < rejoins_at_.size() ? rejoins_at_[static_cast<size_t>(rank)] : -1;
  }
  // Per rank: whether it takes part in the job's collectives (it has not left).
  std::vector<bool> TakingPart() const;

  // Raises the clock of `rank` to `clock` (clocks never go back); returns the clock.
  int64_t AdvanceClock(int rank, int64_t clock);

  // A sync step closes once it holds the gradients of min(replicas_to_aggregate, workers that
  // take part) workers, where a worker takes part unless it has finished (a finished worker's
  // gradient already held for the step still counts) or joins at a later step than `step` (the
  // unit's version: the step it is at).
  bool StepComplete(const TableSpec& spec, const SyncSlots& sync, int64_t step) const;
  // Whether the step can still get its quorum without the gradients of `silent` workers (with
  // backup workers it may: the others are enough).
  bool CanCompleteWithout(const TableSpec& spec, const SyncSlots& sync, int64_t step,
                          const std::vector<int>& silent) const;
  // Whether a pull for `step` of a table (or chunk) at `version` may be served now.
  bool Ready(const TableSpec& spec, int64_t version, int64_t step) const;

  // How many gradients a sync step needs to close (StepComplete): min(replicas_to_aggregate,
  // workers that take part), or every worker that takes part.
  int Quorum(const TableSpec& spec, const SyncSlots& sync, int64_t step) const;
  // The ranks still expected for sync step `step` ("none" if none): they take part and have not pushed it.
  std::string MissingRanks(const SyncSlots& sync, int64_t step) const;
  std::vector<int> Missing(const SyncSlots& sync, int64_t step) const;
  // The step from which `rank` takes part in sync steps (1.18 Hello's joins_at; 0: from its Hello).
  int64_t joins_at(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < joins_at_.size() ? joins_at_[static_cast<size_t>(rank)] : 0;
  }
  // The workers an ssp pull for `step` waits for, with their clocks: "1 (clock 3), 2 (clock 4)".
  std::string Behind(int64_t step, int staleness) const;
  std::vector<int> BehindRanks(int64_t step, int staleness) const;

  // Liveness. A worker promises in its Hello to send something at least every `heartbeat_ms`
  // (0: no promise, never called silent); every message from it is Heard.
  using Clock = std::chrono::steady_clock;
  void Promise(int rank, int64_t heartbeat_ms, Clock::time_point now);
  void Heard(int rank, Clock::time_point now) { heard_[static_cast<size_t>(rank)] = now; }
  // What `rank` promised (0: nothing, or no Hello yet), and whether it has finished.
  std::chrono::milliseconds promised(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < promised_ms_.size()
               ? std::chrono::milliseconds(promised_ms_[static_cast<size_t>(rank)])
               : std::chrono::milliseconds(0);
  }
  // Its clock (ssp; 0: none yet).
  int64_t clock(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < clocks_.size() ? clocks_[static_cast<size_t>(rank)] : 0;
  }
  bool finished(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < finished_.size() && finished_[static_cast<size_t>(rank)];
  }
  // The workers still training that promised heartbeats and have sent nothing for longer than
  // max(timeout, 4 x their promise): dead, stopped, or cut off.
  std::vector<int> Silent(Clock::time_point now, std::chrono::milliseconds timeout) const;
  // How long `rank` has been silent, and whether every worker still training is (the job is gone).
  Clock::duration SilentFor(int rank, Clock::time_point now) const { return now - heard_[static_cast<size_t>(rank)]; }
  Clock::time_point heard(int rank) const { return heard_[static_cast<size_t>(rank)]; }
  bool AllSilent(const std::vector<int>& silent) const {
    return !silent.empty() && static_cast<int>(silent.size()) == count_ - num_finished_;
  }

 private:
  void SetFinished(int rank, bool finished);
  // Whether `rank` takes part in sync step `step`: not finished, and joined at or before it.
  bool TakesPart(size_t rank, int64_t step) const;
  int Needed(const TableSpec& spec, const SyncSlots& sync, int64_t step) const;
  // The slowest clock among the workers still training; finished workers hold no one back.
  int64_t MinClock() const;

  int count_ = 0;
  std::vector<bool> finished_;   // per rank: sent Finish (and no Hello since)
  int num_finished_ = 0;         // the true entries of finished_
  std::vector<bool> left_;       // per rank: left the job (Leave; and no Hello since)
  std::vector<int64_t> left_at_;  // per rank: the step it leaves or left before (LeavingAt; -1 none)
  std::vector<int64_t> rejoins_at_;  // per rank: the step it takes part from again (Rejoin; -1 none)
  std::vector<int64_t> joins_at_;  // per rank: the first sync step it takes part in (its last Hello's)
  int num_joining_ = 0;            // ranks whose joins_at_ is above 0
  std::vector<int64_t> clocks_;  // per rank (ssp)
  std::vector<uint32_t> incarnations_;  // per rank: the highest incarnation a Hello brought
  std::vector<int64_t> done_;            // per rank: steps done (Did)
  std::vector<bool> pushed_;             // per rank: Did since this server started
  std::vector<bool> trained_;            // per rank: Did since its last Join
  bool restored_ = false;                // SetDone: every rank's done_ holds the checkpoint's record
  std::vector<int64_t> promised_ms_;     // per rank: its heartbeat promise (0: none)
  std::vector<Clock::time_point> heard_;  // per rank: when it last sent anything
};

}  // namespace ferry::ps
