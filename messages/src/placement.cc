// Placement maps: the first map of a server count, and the next map when a server joins or
// leaves (ferry/messages/placement.h).
#include "ferry/messages/placement.h"

#include <algorithm>
#include <cassert>

namespace ferry::placement {

Placement Placement::First(int num_servers) {
  assert(num_servers >= 1 && num_servers <= kSlots);
  Placement p;
  p.version_ = 1;
  p.owner_.resize(kSlots);
  p.slots_of_.assign(static_cast<size_t>(num_servers), 0);
  for (int s = 0; s < kSlots; ++s) {
    p.owner_[static_cast<size_t>(s)] = s % num_servers;
    ++p.slots_of_[static_cast<size_t>(s % num_servers)];
  }
  return p;
}

int Placement::ActiveServers() const {
  return static_cast<int>(std::count_if(slots_of_.begin(), slots_of_.end(), [](int n) { return n > 0; }));
}

Placement Placement::Grow() const {
  Placement next = *this;
  ++next.version_;
  const int added = num_servers();
  next.slots_of_.push_back(0);
  const int active = ActiveServers() + 1;
  // Fair shares: every active server ends with kSlots / active slots, the first kSlots % active
  // of them (the most loaded now, then the lowest ranks) with one more. The new server is last
  // among equals, so it takes the floor.
  std::vector<int> order;
  for (int r = 0; r < added; ++r) {
    if (slots_of_[static_cast<size_t>(r)] > 0) order.push_back(r);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return slots_of_[static_cast<size_t>(a)] > slots_of_[static_cast<size_t>(b)];
  });
  order.push_back(added);
  std::vector<int> share(static_cast<size_t>(added) + 1, 0);
  for (size_t i = 0; i < order.size(); ++i) {
    share[static_cast<size_t>(order[i])] = kSlots / active + (static_cast<int>(i) < kSlots % active ? 1 : 0);
  }
  // Each donor gives its excess, taken evenly along its own slots (so that the slots a table's
  // consecutive chunks hash to stay spread over the servers).
  for (int r = 0; r < added; ++r) {
    const int give = slots_of_[static_cast<size_t>(r)] - share[static_cast<size_t>(r)];
    if (give <= 0) continue;
    std::vector<int> mine;
    mine.reserve(static_cast<size_t>(slots_of_[static_cast<size_t>(r)]));
    for (int s = 0; s < kSlots; ++s) {
      if (owner_[static_cast<size_t>(s)] == r) mine.push_back(s);
    }
    for (int i = 0; i < give; ++i) {
      const size_t pick = (static_cast<size_t>(2 * i + 1) * mine.size()) / (2 * static_cast<size_t>(give));
      next.owner_[static_cast<size_t>(mine[pick])] = added;
    }
    next.slots_of_[static_cast<size_t>(r)] -= give;
    next.slots_of_[static_cast<size_t>(added)] += give;
  }
  return next;
}

bool Placement::Drain(int rank, Placement* out, std::string* why) const {
  if (rank < 0 || rank >= num_servers() || slots_of_[static_cast<size_t>(rank)] == 0) {
    *why = "server " + std::to_string(rank) + " owns no slot of placement version " + std::to_string(version_);
    return false;
  }
  if (ActiveServers() == 1) {
    *why = "server " + std::to_string(rank) + " is the last one that owns slots: nothing could take them";
    return false;
  }
  Placement next = *this;
  ++next.version_;
  for (int s = 0; s < kSlots; ++s) {
    if (owner_[static_cast<size_t>(s)] != rank) continue;
    int to = -1;
    for (int r = 0; r < num_servers(); ++r) {
      if (r == rank || next.slots_of_[static_cast<size_t>(r)] == 0) continue;
      if (to < 0 || next.slots_of_[static_cast<size_t>(r)] < next.slots_of_[static_cast<size_t>(to)]) to = r;
    }
    next.owner_[static_cast<size_t>(s)] = to;
    ++next.slots_of_[static_cast<size_t>(to)];
    --next.slots_of_[static_cast<size_t>(rank)];
  }
  *out = std::move(next);
  return true;
}

int Placement::SlotsMoved(const Placement& a, const Placement& b) {
  int moved = 0;
  for (int s = 0; s < kSlots; ++s) moved += a.owner_[static_cast<size_t>(s)] != b.owner_[static_cast<size_t>(s)];
  return moved;
}

}  // namespace ferry::placement
