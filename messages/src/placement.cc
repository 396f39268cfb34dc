// Placement maps: the first map of a server count, and the next map when a server joins or
// leaves (ferry/messages/placement.h).
#include "ferry/messages/placement.h"

#include <algorithm>
#include <cassert>

namespace ferry::placement {

Placement Placement::First(int num_servers) { return First(num_servers, num_servers); }

Placement Placement::First(int active, int num_servers) {
  assert(active >= 1 && active <= num_servers && num_servers <= kSlots);
  Placement p;
  p.version_ = 1;
  p.owner_.resize(kSlots);
  p.slots_of_.assign(static_cast<size_t>(num_servers), 0);
  for (int s = 0; s < kSlots; ++s) {
    p.owner_[static_cast<size_t>(s)] = s % active;
    ++p.slots_of_[static_cast<size_t>(s % active)];
  }
  return p;
}

StatusOr<Placement> Placement::FromOwners(uint64_t version, std::span<const uint16_t> owners, int num_servers) {
  if (version == 0) return InvalidArgumentError("placement version 0 (versions start at 1)");
  if (owners.size() != static_cast<size_t>(kSlots)) {
    return InvalidArgumentError("placement version " + std::to_string(version) + " lists " +
                                std::to_string(owners.size()) + " slots, not " + std::to_string(kSlots));
  }
  if (num_servers < 1 || num_servers > kSlots) {
    return InvalidArgumentError("a placement of " + std::to_string(num_servers) + " servers (1 to " +
                                std::to_string(kSlots) + ")");
  }
  Placement p;
  p.version_ = version;
  p.owner_.resize(kSlots);
  p.slots_of_.assign(static_cast<size_t>(num_servers), 0);
  for (int s = 0; s < kSlots; ++s) {
    const int owner = owners[static_cast<size_t>(s)];
    if (owner >= num_servers) {
      return InvalidArgumentError("placement version " + std::to_string(version) + " gives slot " + std::to_string(s) +
                                  " to server " + std::to_string(owner) + " of a job of " +
                                  std::to_string(num_servers));
    }
    p.owner_[static_cast<size_t>(s)] = owner;
    ++p.slots_of_[static_cast<size_t>(owner)];
  }
  return p;
}

std::vector<uint16_t> Placement::Owners() const {
  std::vector<uint16_t> owners(owner_.size());
  for (size_t s = 0; s < owner_.size(); ++s) owners[s] = static_cast<uint16_t>(owner_[s]);
  return owners;
}

int Placement::ActiveServers() const {
  return static_cast<int>(std::count_if(slots_of_.begin(), slots_of_.end(), [](int n) { return n > 0; }));
}

StatusOr<Placement> Placement::Grow(int rank) const {
  const int active = ActiveServers() + 1;
  if (active > kSlots) {
    return FailedPreconditionError("placement version " + std::to_string(version_) + " gives each of its " +
                                   std::to_string(kSlots) + " slots a server of its own: no server can be added");
  }
  if (rank >= 0 && (rank >= num_servers() || slots_of_[static_cast<size_t>(rank)] > 0)) {
    return InvalidArgumentError("server " + std::to_string(rank) + (rank >= num_servers() ? " is not one of the " +
                                std::to_string(num_servers()) + " servers" : " owns slots") +
                                " of placement version " + std::to_string(version_) + ": only a server that owns "
                                "none can take a share");
  }
  Placement next = *this;
  ++next.version_;
  const int added = rank >= 0 ? rank : num_servers();
  if (rank < 0) next.slots_of_.push_back(0);
  // Fair shares: every active server ends with kSlots / active slots, the first kSlots % active
  // of them (the most loaded now, then the lowest ranks) with one more. The new server is last
  // among equals, so it takes the floor.
  std::vector<int> order;
  for (int r = 0; r < num_servers(); ++r) {
    if (slots_of_[static_cast<size_t>(r)] > 0) order.push_back(r);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return slots_of_[static_cast<size_t>(a)] > slots_of_[static_cast<size_t>(b)];
  });
  std::vector<int> give(static_cast<size_t>(num_servers()), 0);
  int total = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const int share = kSlots / active + (static_cast<int>(i) < kSlots % active ? 1 : 0);
    const int r = order[i];
    give[static_cast<size_t>(r)] = std::max(0, slots_of_[static_cast<size_t>(r)] - share);
    total += give[static_cast<size_t>(r)];
  }
  // Around the ring once at an even pace (one slot in kSlots / total), each taken from its owner
  // while that owner has some to give; a pass after takes what the pace passed over. Taking each
  // donor's slots at an even pace along its own list would not do: in a first map every donor
  // gives the same count, so all would pick the same places and the new server would get runs of
  // consecutive slots (a table's consecutive chunks all on it).
  auto take = [&](int s) {
    int& left = give[static_cast<size_t>(owner_[static_cast<size_t>(s)])];
    if (left == 0 || next.owner_[static_cast<size_t>(s)] == added) return false;
    --left;
    --next.slots_of_[static_cast<size_t>(owner_[static_cast<size_t>(s)])];
    next.owner_[static_cast<size_t>(s)] = added;
    ++next.slots_of_[static_cast<size_t>(added)];
    return true;
  };
  int64_t pace = kSlots / 2;  // in units of 1/kSlots of a slot: take one each time it passes kSlots
  for (int s = 0; s < kSlots; ++s) {
    pace += total;
    if (pace >= kSlots && take(s)) pace -= kSlots;
  }
  for (int s = 0; s < kSlots && next.slots_of_[static_cast<size_t>(added)] < total; ++s) take(s);
  return next;
}

StatusOr<Placement> Placement::Drain(int rank) const {
  if (rank < 0 || rank >= num_servers() || slots_of_[static_cast<size_t>(rank)] == 0) {
    return InvalidArgumentError("server " + std::to_string(rank) + " owns no slot of placement version " +
                                std::to_string(version_));
  }
  if (ActiveServers() == 1) {
    return FailedPreconditionError("server " + std::to_string(rank) +
                                   " is the last one that owns slots: nothing could take them");
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
  return next;
}

int Placement::SlotsMoved(const Placement& a, const Placement& b) {
  int moved = 0;
  for (int s = 0; s < kSlots; ++s) moved += a.owner_[static_cast<size_t>(s)] != b.owner_[static_cast<size_t>(s)];
  return moved;
}

}  // namespace ferry::placement
