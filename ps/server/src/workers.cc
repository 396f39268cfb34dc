#include "internal/workers.h"

#include <algorithm>

namespace ferry::ps {

Status Workers::SetCount(int num_workers) {
  if (num_workers <= 0 || num_workers > 65536) {
    return InvalidArgumentError("num_workers " + std::to_string(num_workers) + " is outside [1, 65536]");
  }
  if (count_ != 0) return FailedPreconditionError("the worker count is set already");
  count_ = num_workers;
  clocks_.assign(static_cast<size_t>(count_), 0);
  finished_.assign(static_cast<size_t>(count_), false);
  left_.assign(static_cast<size_t>(count_), false);
  left_at_.assign(static_cast<size_t>(count_), -1);
  rejoins_at_.assign(static_cast<size_t>(count_), -1);
  joins_at_.assign(static_cast<size_t>(count_), 0);
  promised_ms_.assign(static_cast<size_t>(count_), 0);
  incarnations_.assign(static_cast<size_t>(count_), 0);
  done_.assign(static_cast<size_t>(count_), 0);
  pushed_.assign(static_cast<size_t>(count_), false);
  trained_.assign(static_cast<size_t>(count_), false);
  heard_.assign(static_cast<size_t>(count_), Clock::time_point{});
  return Status::Ok();
}

void Workers::SetDone(const std::vector<int64_t>& per_rank, int64_t step) {
  for (size_t r = 0; r < done_.size(); ++r) {
    done_[r] = per_rank.size() == done_.size() && per_rank[r] >= 0 ? per_rank[r] : std::max<int64_t>(step, 0);
  }
  restored_ = true;
}

std::vector<int64_t> Workers::KnownDone() const {
  std::vector<int64_t> out(done_.size());
  for (size_t r = 0; r < done_.size(); ++r) out[r] = done(static_cast<int>(r));
  return out;
}

Status Workers::CheckIncarnation(int rank, uint32_t incarnation) const {
  const uint32_t have = this->incarnation(rank);
  if (incarnation >= have) return Status::Ok();
  return FailedPreconditionError("worker " + std::to_string(rank) + "'s process of incarnation " +
                                 std::to_string(incarnation) + " was replaced by its incarnation " +
                                 std::to_string(have) +
                                 " (restarted while this one was stopped or cut off?): this process can no longer "
                                 "speak for the worker and should exit");
}

Status Workers::CheckJoin(int rank, int num_workers) const {
  if (num_workers <= 0 || num_workers > 65536) {
    return InvalidArgumentError("num_workers " + std::to_string(num_workers) + " is outside [1, 65536]");
  }
  if (rank < 0 || rank >= num_workers) {
    return InvalidArgumentError("worker rank " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(num_workers) + ")");
  }
  if (count_ != 0 && count_ != num_workers) {
    return FailedPreconditionError("worker " + std::to_string(rank) + " says the job has " +
                                   std::to_string(num_workers) + " workers, but it has " + std::to_string(count_) +
                                   " (the server's --num-workers, or the first worker to connect, said so)");
  }
  return Status::Ok();
}

Status Workers::Join(int rank, int num_workers, uint32_t incarnation, int64_t joins_at) {
  FERRY_RETURN_IF_ERROR(CheckJoin(rank, num_workers));
  if (count_ == 0) FERRY_RETURN_IF_ERROR(SetCount(num_workers));
  // A worker that connects (again) takes part in the sync quorum (again).
  SetFinished(rank, false);
  left_[static_cast<size_t>(rank)] = false;
  auto& j = joins_at_[static_cast<size_t>(rank)];
  num_joining_ += (joins_at > 0 ? 1 : 0) - (j > 0 ? 1 : 0);
  j = std::clamp<int64_t>(joins_at, 0, kMaxStep);
  trained_[static_cast<size_t>(rank)] = false;  // this process has pushed nothing yet
  auto& have = incarnations_[static_cast<size_t>(rank)];
  have = std::max(have, incarnation);
  return Status::Ok();
}

std::vector<bool> Workers::TakingPart() const {
  std::vector<bool> part(left_.size());
  for (size_t r = 0; r < left_.size(); ++r) part[r] = !left_[r];
  return part;
}

void Workers::SetFinished(int rank, bool finished) {
  auto&& f = finished_[static_cast<size_t>(rank)];
  if (f != finished) num_finished_ += finished ? 1 : -1;
  f = finished;
}

int64_t Workers::AdvanceClock(int rank, int64_t clock) {
  auto& c = clocks_[static_cast<size_t>(rank)];
  c = std::max(c, clock);
  return c;
}

bool Workers::TakesPart(size_t rank, int64_t step) const {
  return !finished_[rank] && joins_at_[rank] <= step;
}

// The gradients a sync step needs: min(replicas_to_aggregate, workers taking part).
int Workers::Needed(const TableSpec& spec, const SyncSlots& sync, int64_t step) const {
  int taking_part = count_;  // the common case, no worker finished or joining later: no scan per push
  if (num_finished_ > 0 || num_joining_ > 0) {
    taking_part = 0;
    for (size_t r = 0; r < finished_.size(); ++r) taking_part += (TakesPart(r, step) || sync.by_rank[r]) ? 1 : 0;
  }
  const int wanted = spec.replicas_to_aggregate > 0 ? spec.replicas_to_aggregate : count_;
  return std::min(wanted, taking_part);
}

bool Workers::StepComplete(const TableSpec& spec, const SyncSlots& sync, int64_t step) const {
  if (sync.received == 0) return false;
  return sync.received >= Needed(spec, sync, step);
}

int Workers::Quorum(const TableSpec& spec, const SyncSlots& sync, int64_t step) const {
  return Needed(spec, sync, step);
}

bool Workers::CanCompleteWithout(const TableSpec& spec, const SyncSlots& sync, int64_t step,
                                 const std::vector<int>& silent) const {
  int possible = sync.received;
  for (int r : Missing(sync, step)) possible += std::find(silent.begin(), silent.end(), r) == silent.end() ? 1 : 0;
  return possible >= Needed(spec, sync, step);
}

int64_t Workers::MinClock() const {
  int64_t m = INT64_MAX;
  for (size_t r = 0; r < clocks_.size(); ++r) {
    if (!finished_[r]) m = std::min(m, clocks_[r]);
  }
  return m == INT64_MAX ? kMaxStep : m;
}

bool Workers::Ready(const TableSpec& spec, int64_t version, int64_t step) const {
  switch (spec.consistency) {
    case Consistency::kSync: return version >= step;
    case Consistency::kSsp: return MinClock() >= step - spec.staleness;
    case Consistency::kAsync: return true;
  }
  return true;
}

std::vector<int> Workers::Missing(const SyncSlots& sync, int64_t step) const {
  std::vector<int> out;
  for (size_t r = 0; r < finished_.size(); ++r) {
    if (TakesPart(r, step) && !sync.by_rank[r]) out.push_back(static_cast<int>(r));
  }
  return out;
}

std::string Workers::MissingRanks(const SyncSlots& sync, int64_t step) const {
  std::string out;
  for (int r : Missing(sync, step)) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out.empty() ? "none" : out;
}

std::vector<int> Workers::BehindRanks(int64_t step, int staleness) const {
  std::vector<int> out;
  for (size_t r = 0; r < clocks_.size(); ++r) {
    if (!finished_[r] && clocks_[r] < step - staleness) out.push_back(static_cast<int>(r));
  }
  return out;
}

void Workers::Promise(int rank, int64_t heartbeat_ms, Clock::time_point now) {
  // From the network: at most an hour, so 4 x the promise cannot overflow.
  promised_ms_[static_cast<size_t>(rank)] = std::clamp<int64_t>(heartbeat_ms, 0, int64_t{3600} * 1000);
  heard_[static_cast<size_t>(rank)] = now;
}

std::vector<int> Workers::Silent(Clock::time_point now, std::chrono::milliseconds timeout) const {
  std::vector<int> out;
  for (size_t r = 0; r < promised_ms_.size(); ++r) {
    if (finished_[r] || promised_ms_[r] == 0) continue;
    const auto limit = std::max<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(4 * promised_ms_[r]));
    if (now - heard_[r] > limit) out.push_back(static_cast<int>(r));
  }
  return out;
}

std::string Workers::Behind(int64_t step, int staleness) const {
  std::string out;
  for (int r : BehindRanks(step, staleness)) {
    out += (out.empty() ? "" : ", ") + std::to_string(r) + " (clock " +
           std::to_string(clocks_[static_cast<size_t>(r)]) + ")";
  }
  return out;
}

}  // namespace ferry::ps
