#include "internal/held.h"

namespace ferry::ps {

void HeldPulls::Hold(Request req, Clock::time_point deadline) {
  const uint64_t seq = next_seq_++;
  req.deadline = deadline;
  deadlines_.Add(deadline, seq);
  pulls_.emplace(seq, std::move(req));
}

std::vector<Request> HeldPulls::TakeExpired(Clock::time_point now) {
  std::vector<Request> expired;
  for (uint64_t seq : deadlines_.TakeDue(now)) {
    auto it = pulls_.find(seq);
    expired.push_back(std::move(it->second));
    pulls_.erase(it);
  }
  return expired;
}

}  // namespace ferry::ps
