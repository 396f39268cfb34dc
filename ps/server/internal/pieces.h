// ps/server/internal/pieces.h — push calls that arrive in pieces and are applied whole (1.10).
//
// A client sends a server its share of a dense push that touches a sync table in several
// messages ("Dense calls in pieces", messages/PROTOCOL.md): pieces 0..n-1 of one call id, in
// order on the worker's connection. The server checks each piece as it arrives and holds it
// here; once the last has arrived and every piece verified, it takes the call and applies the
// pieces in order. A piece refused ends its call: the pieces held are answered with the refusal
// and none is applied, so a sync step takes a worker's call whole or not at all.
//
// Bounds: a call holds each (table, chunk) at most once, and a worker's open calls together
// hold a chunk at most once, so what one worker can hold here is at most one copy of this
// server's dense tables (charged to its memory budget when declared); each held piece also
// counts as a waiting request against max_held and max_held_per_peer; a call not completed
// within its deadline (the server's max_wait from its first piece) is taken by TakeExpired.
//
// Thread-safety: none; the server's I/O thread owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "ferry/messages/deadlines.h"
#include "ferry/status.h"
#include "internal/request.h"

namespace ferry::ps {

class HeldCalls {
 public:
  // The most pieces one call may have: 65,536 pieces of 1 MiB are 64 GiB of one server's share.
  static constexpr uint32_t kMaxPieces = 1u << 16;

  struct Call {
    int rank = -1;
    uint64_t id = 0;
    uint32_t pieces = 0;
    std::vector<Request> held;                         // pieces 0 .. held.size() - 1, each verified on arrival
    std::vector<std::pair<uint64_t, int64_t>> chunks;  // the (table id, chunk) they carry
    Clock::time_point deadline;
  };

  // Pieces held, in all calls.
  size_t size() const { return held_; }
  size_t calls() const { return calls_.size(); }

  // Piece `piece` of `pieces` of call `id` from worker `rank` may be held: the call's first
  // piece opens it (until `deadline`), a later one must be the next of an open call. Refused
  // with INVALID_ARGUMENT saying why, changing nothing.
  Status Admit(int rank, uint64_t id, uint32_t piece, uint32_t pieces, Clock::time_point deadline);
  // A chunk the admitted piece carries: refused (ALREADY_EXISTS) if this worker's open calls
  // hold it already. Call after Admit for each chunk of the piece, then Hold it, or Take the
  // call if anything refused the piece (which releases the claims made for it too).
  Status Claim(int rank, uint64_t id, uint64_t table, int64_t chunk);
  // Holds the admitted piece (its header names the call). True when it was the call's last
  // piece: Take the call.
  bool Hold(Request req);
  // Removes the call (its held pieces and claims) and returns it; nullopt if it is not open.
  std::optional<Call> Take(int rank, uint64_t id);
  // Removes and returns the calls whose deadline is at or before `now`, earliest first.
  std::vector<Call> TakeExpired(Clock::time_point now);
  // Removes and returns every open call of `rank` (a worker that says Hello again).
  std::vector<Call> TakeRank(int rank);
  std::optional<Clock::time_point> NextDeadline() const { return deadlines_.Next(); }

 private:
  using Key = std::pair<int, uint64_t>;        // (rank, call id)
  using Chunk = std::pair<uint64_t, int64_t>;  // (table id, chunk)
  Call Remove(Key key);

  absl::flat_hash_map<Key, Call> calls_;
  absl::flat_hash_set<std::pair<int, Chunk>> claimed_;  // (rank, chunk) of every open call
  transport::Deadlines<Key> deadlines_;
  size_t held_ = 0;
};

}  // namespace ferry::ps
