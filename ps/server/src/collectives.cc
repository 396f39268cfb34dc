#include "internal/collectives.h"

#include <algorithm>

namespace ferry::ps {

Status Collectives::CheckEntry(const Request& req) const {
  const int64_t id = req.h()->barrier_id();
  auto it = by_id_.find(id);
  if (it == by_id_.end()) {
    // (A client before 1.3 was not told next_collective: its ids begin at 0 whatever ended.)
    if (id >= next_id_ || req.h()->minor() < 3) return Status::Ok();
    // Ended without this rank: no other worker will come to it (they are past it).
    return FailedPreconditionError(std::string(wire::KindName(req.h()->kind())) + " " + std::to_string(id) +
                                   " has ended without worker " + std::to_string(req.h()->rank()) +
                                   " (it failed or expired, or completed while that worker was silent): the other "
                                   "workers are at collective " +
                                   std::to_string(next_id_) + " and will not come to it");
  }
  const std::vector<Request>& arrived = it->second;
  for (const auto& r : arrived) {
    if (r.h()->rank() == req.h()->rank()) {
      return FailedPreconditionError("rank " + std::to_string(req.h()->rank()) + " entered barrier " +
                                     std::to_string(id) + " twice");
    }
  }
  const Request& first = arrived[0];
  if (first.h()->kind() != req.h()->kind() || first.h()->num_ids() != req.h()->num_ids()) {
    auto describe = [](const Request& r) {
      return std::string(wire::KindName(r.h()->kind())) + " of " + std::to_string(r.h()->num_ids()) +
             " values from rank " + std::to_string(r.h()->rank());
    };
    return FailedPreconditionError("collective " + std::to_string(id) + ": " + describe(req) + " does not match " +
                                   describe(first));
  }
  return Status::Ok();
}

namespace {
void SortByRank(std::vector<Request>& group) {
  std::sort(group.begin(), group.end(),
            [](const Request& a, const Request& b) { return a.h()->rank() < b.h()->rank(); });
}
}  // namespace

std::vector<Request> Collectives::Enter(Request req, Clock::time_point deadline, const std::vector<bool>& part) {
  const int64_t id = req.h()->barrier_id();
  std::vector<Request>& arrived = by_id_[id];
  if (arrived.empty()) deadlines_.Add(deadline, id);
  req.deadline = deadline;
  arrived.push_back(std::move(req));
  ++waiting_;
  if (!Missing(arrived, part).empty()) return {};
  std::vector<Request> group = std::move(arrived);
  next_id_ = std::max(next_id_, id + 1);
  deadlines_.Remove(group[0].deadline, id);
  by_id_.erase(id);
  waiting_ -= group.size();
  SortByRank(group);
  return group;
}

std::vector<std::vector<Request>> Collectives::TakeComplete(const std::vector<bool>& part) {
  std::vector<std::vector<Request>> out;
  for (Expired& e : TakeIf(part, [](const std::vector<Request>&, const std::vector<int>& missing) {
         return missing.empty();
       })) {
    SortByRank(e.arrived);
    out.push_back(std::move(e.arrived));
  }
  return out;
}

template <typename Pred>
std::vector<Request> Collectives::RemoveFrom(std::map<int64_t, std::vector<Request>>::iterator& it, Pred&& pred) {
  std::vector<Request>& arrived = it->second;
  const Clock::time_point first_deadline = arrived[0].deadline;
  std::vector<Request> removed, kept;
  for (Request& r : arrived) (pred(r) ? removed : kept).push_back(std::move(r));
  arrived = std::move(kept);
  waiting_ -= removed.size();
  if (removed.empty()) {
    ++it;
    return removed;
  }
  // The collective's deadline is its first arrival's: re-key it when that one went.
  deadlines_.Remove(first_deadline, it->first);
  if (arrived.empty()) {
    it = by_id_.erase(it);
  } else {
    deadlines_.Add(arrived[0].deadline, it->first);
    ++it;
  }
  return removed;
}

void Collectives::Forget(int rank) {
  for (auto it = by_id_.begin(); it != by_id_.end();) {
    RemoveFrom(it, [rank](const Request& r) { return r.h()->rank() == rank; });
  }
}

std::optional<Request> Collectives::Withdraw(int64_t id, int rank) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  std::vector<Request> removed = RemoveFrom(it, [rank](const Request& r) { return r.h()->rank() == rank; });
  if (removed.empty()) return std::nullopt;
  return std::move(removed[0]);
}

std::vector<double> Collectives::Sum(const std::vector<Request>& group) {
  const size_t n = static_cast<size_t>(group[0].h()->num_ids());
  std::vector<double> sum(n, 0.0);
  for (const auto& r : group) {
    std::vector<double> scratch;
    auto v = View<double>(r.payload[0], scratch);
    for (size_t i = 0; i < n; ++i) sum[i] += v[i];
  }
  return sum;
}

size_t Collectives::ArrivedTakingPart(const std::vector<Request>& arrived, const std::vector<bool>& part) {
  return static_cast<size_t>(std::count_if(arrived.begin(), arrived.end(), [&](const Request& r) {
    const auto rank = static_cast<size_t>(r.h()->rank());
    return rank < part.size() && part[rank];
  }));
}

std::vector<int> Collectives::Missing(const std::vector<Request>& arrived, const std::vector<bool>& part) {
  std::vector<bool> came(part.size(), false);
  for (const auto& r : arrived) {
    if (static_cast<size_t>(r.h()->rank()) < came.size()) came[static_cast<size_t>(r.h()->rank())] = true;
  }
  std::vector<int> missing;
  for (size_t w = 0; w < came.size(); ++w) {
    if (part[w] && !came[w]) missing.push_back(static_cast<int>(w));
  }
  return missing;
}

Collectives::Expired Collectives::Take(int64_t id, const std::vector<bool>& part) {
  auto it = by_id_.find(id);
  std::vector<int> missing = Missing(it->second, part);
  Expired e{id, std::move(it->second), "", std::move(missing)};
  by_id_.erase(it);
  waiting_ -= e.arrived.size();
  for (int w : e.missing_ranks) e.missing += (e.missing.empty() ? "" : ", ") + std::to_string(w);
  next_id_ = std::max(next_id_, id + 1);  // it is over: a worker that connects later does not enter it
  return e;
}

std::vector<std::string> Collectives::Describe(int rank, const std::vector<bool>& part) const {
  const auto taking_part = static_cast<size_t>(std::count(part.begin(), part.end(), true));
  std::vector<std::string> out;
  for (const auto& [id, arrived] : by_id_) {
    if (std::none_of(arrived.begin(), arrived.end(), [&](const Request& r) { return r.h()->rank() == rank; })) {
      continue;
    }
    std::string missing;
    for (int w : Missing(arrived, part)) missing += (missing.empty() ? "" : ", ") + std::to_string(w);
    out.push_back(std::string(wire::KindName(arrived[0].h()->kind())) + " " + std::to_string(id) +
                  " waits for worker(s) " + missing + " (" + std::to_string(ArrivedTakingPart(arrived, part)) +
                  " of " + std::to_string(taking_part) + " arrived)");
  }
  return out;
}

std::vector<Collectives::Expired> Collectives::TakeExpired(Clock::time_point now, const std::vector<bool>& part) {
  std::vector<Expired> expired;
  for (int64_t id : deadlines_.TakeDue(now)) expired.push_back(Take(id, part));
  return expired;
}

}  // namespace ferry::ps
