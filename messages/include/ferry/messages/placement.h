// ferry/messages/placement.h — which server holds what. Both sides compute it; the server
// checks every chunk and id it receives against it, so a client with a different cluster view is
// refused instead of silently writing to the wrong shard.
//
// Ids and chunks hash to one of kSlots slots, and slots belong to servers. A job's first map gives
// slot s to server s mod S: since kSlots is a multiple of every S up to 10 (and of 12, 14, 15, 16,
// 18, 20, 21, 24, 28, ...), that is exactly the rule of protocol 1.15 and before (an id on server
// mix64(id) mod S, chunk c of table t on (mix64(t) mod S + c) mod S) for those server counts. A
// server set that changes moves whole slots (Placement::Grow and Drain): adding a server to S
// moves about 1/(S + 1) of the rows and chunks, removing one about 1/S, where a rule of "mod S"
// would move nearly all of them.
//
// Limits of whole slots: a server holds 5040 / S of them, rounded, so the most loaded server of a
// first map holds up to 1 + S / 5040 times the mean (1.002 at S = 10, 1.19 at S = 1000); and for
// an S that does not divide 5040 the chunks of a table whose slots wrap past 5039 to 0 may put
// two of S consecutive chunks on one server.
//
// Thread-safety: pure functions; a Placement is a value (const use from any thread).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::placement {

// A strong 64-bit mix (splitmix64 finaliser): stable across processes, builds and platforms.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// 7! = 5040: divisible by 1..10, so the first map of up to 10 servers (and many counts beyond)
// spreads whole rounds of slots, and a modulo by this constant compiles to a multiply.
inline constexpr int kSlots = 5040;

// The slot of sparse id `id` (independent of the table, so a row keeps its slot whatever else is
// declared).
inline int IdSlot(int64_t id) { return static_cast<int>(Mix64(static_cast<uint64_t>(id)) % kSlots); }

// The slot of dense chunk `chunk` of table `table_id`: a stable hash of the table picks chunk 0's
// slot, the following chunks take the following slots, so that under the first map they go
// round-robin over the servers (a pure per-chunk hash would pile the two chunks of a small table
// onto one server half the time).
inline int ChunkSlot(uint64_t table_id, int64_t chunk) {
  return static_cast<int>((Mix64(table_id) % kSlots + static_cast<uint64_t>(chunk) % kSlots) % kSlots);
}

// Under the first map of `num_servers` servers (a job whose server set has not changed).
inline int IdServer(int64_t id, int num_servers) { return IdSlot(id) % num_servers; }
inline int ChunkServer(uint64_t table_id, int64_t chunk, int num_servers) {
  return ChunkSlot(table_id, chunk) % num_servers;
}

// The protocol minor version since which ids and chunks are placed by slots (1.16).
inline constexpr uint16_t kSlotsSinceMinor = 16;
// Whether a peer of protocol 1.`minor` places the ids and chunks of a job of `num_servers` servers
// where this build does: by slots, or by the rule before for a count where the two agree.
inline bool PlacesAlike(uint16_t minor, int num_servers) {
  return minor >= kSlotsSinceMinor || kSlots % num_servers == 0;
}

// The rule of protocol 1.15 and before, for what checkpoints written under it recorded (the server
// that held a chunk or row): the same as the first map for server counts dividing kSlots.
inline int IdServerBeforeSlots(int64_t id, int num_servers) {
  return static_cast<int>(Mix64(static_cast<uint64_t>(id)) % static_cast<uint64_t>(num_servers));
}
inline int ChunkServerBeforeSlots(uint64_t table_id, int64_t chunk, int num_servers) {
  const uint64_t first = Mix64(table_id) % static_cast<uint64_t>(num_servers);
  return static_cast<int>((first + static_cast<uint64_t>(chunk)) % static_cast<uint64_t>(num_servers));
}

// A map of slots to servers, with the version that names it. Servers are ranks 0..size()-1; a
// rank drained of every slot stays a rank that owns nothing (the ranks of the others do not move).
class Placement {
 public:
  // The first map of `num_servers` servers (version 1): slot s on server s mod num_servers.
  // num_servers in [1, kSlots] (the callers check it: Server::Start, Client::Connect).
  static Placement First(int num_servers);
  // The first map of a job of `num_servers` server ranks of which the first `active` own slots
  // (slot s on server s mod active; the others own none until a map gives them a share: Grow).
  // 1 <= active <= num_servers <= kSlots.
  static Placement First(int active, int num_servers);
  // The map `owners` lists (the server of each of the kSlots slots, in slot order) as version
  // `version`, of a job of `num_servers` server ranks (1.17: a Hello reply's or a "moved" error's,
  // a Placement request's). INVALID_ARGUMENT, saying what is wrong, for version 0, a list of
  // another length, or a server outside [0, num_servers).
  static StatusOr<Placement> FromOwners(uint64_t version, std::span<const uint16_t> owners, int num_servers);
  // The server of each slot, in slot order (what FromOwners reads).
  std::vector<uint16_t> Owners() const;

  uint64_t version() const { return version_; }
  int num_servers() const { return static_cast<int>(slots_of_.size()); }  // ranks, drained ones too
  int SlotServer(int slot) const { return owner_[static_cast<size_t>(slot)]; }
  int IdServer(int64_t id) const { return owner_[static_cast<size_t>(IdSlot(id))]; }
  int ChunkServer(uint64_t table_id, int64_t chunk) const {
    return owner_[static_cast<size_t>(ChunkSlot(table_id, chunk))];
  }
  // How many slots server `rank` owns.
  int SlotsOf(int rank) const { return slots_of_[static_cast<size_t>(rank)]; }
  // The servers that own at least one slot.
  int ActiveServers() const;

  // The next version with one more server, rank num_servers() (or `rank`, one that owns no
  // slot: INVALID_ARGUMENT for another): it takes kSlots / (active + 1) slots (rounded so that
  // every active server ends with the floor or the ceiling of the fair share), each from a server
  // above its new share, at an even pace around the ring of slots (so a table's consecutive
  // chunks stay spread). Nothing else moves. FAILED_PRECONDITION when every slot has a server of
  // its own already.
  StatusOr<Placement> Grow(int rank = -1) const;
  // The next version without server `rank`'s slots: each goes to the active server with the
  // fewest (the lowest rank among equals). Nothing else moves. INVALID_ARGUMENT for a rank that
  // owns nothing, FAILED_PRECONDITION for the last one that owns slots.
  StatusOr<Placement> Drain(int rank) const;

  // The slots whose server differs between a and b (any two versions).
  static int SlotsMoved(const Placement& a, const Placement& b);

 private:
  uint64_t version_ = 0;
  std::vector<int> owner_;     // kSlots entries: the server of each slot
  std::vector<int> slots_of_;  // per rank: how many slots it owns
};

}  // namespace ferry::placement
