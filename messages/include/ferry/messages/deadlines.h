// ferry/messages/deadlines.h — when the requests an I/O thread waits on expire, kept in one
// place for both ends: the client's requests in flight and the server's held pulls and
// collectives. The owner keeps its requests; this keeps (deadline, key) pairs in deadline order,
// so the event loop's next wake-up is the first entry and what is due is a prefix — no scan of
// every request on every wake-up.
//
// Thread-safety: none; one I/O thread owns it (as it owns the requests the keys name).
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace ferry::transport {

template <typename Key>
class Deadlines {
 public:
  using Clock = std::chrono::steady_clock;

  // `key` must be unique among the entries (a request id, a sequence number).
  void Add(Clock::time_point at, Key key) { entries_.emplace(at, std::move(key)); }
  // Forgets an entry (the request was answered); a pair never added is ignored.
  void Remove(Clock::time_point at, const Key& key) { entries_.erase({at, key}); }

  // The earliest deadline, if any: what EventLoop::Handlers::next_deadline returns.
  std::optional<Clock::time_point> Next() const {
    if (entries_.empty()) return std::nullopt;
    return entries_.begin()->first;
  }

  // Removes and returns the keys whose deadline is at or before `now`, earliest first.
  std::vector<Key> TakeDue(Clock::time_point now) {
    std::vector<Key> due;
    auto it = entries_.begin();
    for (; it != entries_.end() && it->first <= now; ++it) due.push_back(it->second);
    entries_.erase(entries_.begin(), it);
    return due;
  }

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

 private:
  std::set<std::pair<Clock::time_point, Key>> entries_;
};

// The earlier of two optional deadlines (for owners that keep more than one set).
inline std::optional<std::chrono::steady_clock::time_point> Earliest(
    std::optional<std::chrono::steady_clock::time_point> a, std::optional<std::chrono::steady_clock::time_point> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

}  // namespace ferry::transport
