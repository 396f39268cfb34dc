#include "internal/pieces.h"

namespace ferry::ps {

Status HeldCalls::Admit(int rank, uint64_t id, uint32_t piece, uint32_t pieces, Clock::time_point deadline) {
  const std::string what = "piece " + std::to_string(piece) + " of " + std::to_string(pieces) + " of call " +
                           std::to_string(id) + " from worker " + std::to_string(rank);
  if (pieces < 2 || pieces > kMaxPieces) {
    return InvalidArgumentError(what + ": a call in pieces has 2 to " + std::to_string(kMaxPieces) + " of them");
  }
  if (piece >= pieces) return InvalidArgumentError(what + ": no such piece");
  auto it = calls_.find(Key{rank, id});
  if (piece == 0) {
    if (it != calls_.end()) return InvalidArgumentError(what + ": that call is open already (a call id used twice)");
    Call c;
    c.rank = rank;
    c.id = id;
    c.pieces = pieces;
    c.deadline = deadline;
    calls_.emplace(Key{rank, id}, std::move(c));
    deadlines_.Add(deadline, Key{rank, id});
    return Status::Ok();
  }
  if (it == calls_.end()) {
    return InvalidArgumentError(what + ": the call is not open here (an earlier piece of it was refused, or it " +
                                "waited past its deadline); nothing of it was applied");
  }
  const Call& c = it->second;
  if (c.pieces != pieces || c.held.size() != piece) {
    return InvalidArgumentError(what + ": the call expects piece " + std::to_string(c.held.size()) + " of " +
                                std::to_string(c.pieces) + " next");
  }
  return Status::Ok();
}

Status HeldCalls::Claim(int rank, uint64_t id, uint64_t table, int64_t chunk) {
  auto it = calls_.find(Key{rank, id});
  if (it == calls_.end()) return InvalidArgumentError("call " + std::to_string(id) + " is not open");
  if (!claimed_.insert({rank, Chunk{table, chunk}}).second) {
    return AlreadyExistsError("chunk " + std::to_string(chunk) + " is in an open call of worker " +
                              std::to_string(rank) + " already (a chunk goes once in the pieces held of a worker)");
  }
  it->second.chunks.emplace_back(table, chunk);
  return Status::Ok();
}

bool HeldCalls::Hold(Request req) {
  const wire::Header& h = *req.h();
  Call& c = calls_.at(Key{h.rank(), h.call()});
  c.held.push_back(std::move(req));
  ++held_;
  return c.held.size() == c.pieces;
}

HeldCalls::Call HeldCalls::Remove(Key key) {
  auto it = calls_.find(key);
  Call c = std::move(it->second);
  calls_.erase(it);
  for (const Chunk& k : c.chunks) claimed_.erase({c.rank, k});
  held_ -= c.held.size();
  return c;
}

std::optional<HeldCalls::Call> HeldCalls::Take(int rank, uint64_t id) {
  auto it = calls_.find(Key{rank, id});
  if (it == calls_.end()) return std::nullopt;
  deadlines_.Remove(it->second.deadline, it->first);
  return Remove(Key{rank, id});
}

std::vector<HeldCalls::Call> HeldCalls::TakeExpired(Clock::time_point now) {
  std::vector<Call> expired;
  for (const Key& k : deadlines_.TakeDue(now)) expired.push_back(Remove(k));
  return expired;
}

std::vector<HeldCalls::Call> HeldCalls::TakeRank(int rank) {
  std::vector<Key> keys;
  for (const auto& [k, c] : calls_) {
    if (k.first == rank) keys.push_back(k);
  }
  std::vector<Call> taken;
  for (const Key& k : keys) taken.push_back(*Take(k.first, k.second));
  return taken;
}

}  // namespace ferry::ps
