// ps/server/internal/held.h — pulls that must wait: a sync pull for a step not yet applied, an
// ssp pull ahead of the staleness bound. Kept in arrival order with their deadlines (the
// expiry itself is transport::Deadlines, as for the client's requests in flight); the server
// offers them to be served whenever something changed, and answers those that expire.
//
// Thread-safety: none; the server's I/O thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "ferry/messages/deadlines.h"
#include "internal/request.h"

namespace ferry::ps {

class HeldPulls {
 public:
  size_t size() const { return pulls_.size(); }

  // Holds `req` until `deadline` (the caller has checked there is room).
  void Hold(Request req, Clock::time_point deadline);

  // Offers every held pull, oldest first, to `serve` (bool(Request&): true when it answered the
  // pull, which is then dropped; false to keep it waiting).
  template <typename Serve>
  void ServeReady(Serve&& serve) {
    for (auto it = pulls_.begin(); it != pulls_.end();) {
      if (serve(it->second)) {
        deadlines_.Remove(it->second.deadline, it->first);
        it = pulls_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Calls `look(const Request&)` for every held pull, oldest first.
  template <typename Look>
  void ForEach(Look&& look) const {
    for (const auto& [seq, req] : pulls_) look(req);
  }

  std::optional<Clock::time_point> NextDeadline() const { return deadlines_.Next(); }
  // Removes and returns the pulls whose deadline is at or before `now`, oldest deadline first.
  std::vector<Request> TakeExpired(Clock::time_point now);

 private:
  uint64_t next_seq_ = 0;
  std::map<uint64_t, Request> pulls_;  // by arrival
  transport::Deadlines<uint64_t> deadlines_;
};

}  // namespace ferry::ps
