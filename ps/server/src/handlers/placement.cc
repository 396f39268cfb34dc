// Placement versions (protocol 1.17, PROTOCOL.md "Placement versions"): the "moved" answer to a
// request placed by another map, and Placement, by which a server adopts a new map.
#include "internal/server_impl.h"

#include <cstdio>

#include "ferry/messages/kinds.h"
#include "ferry/messages/placement.h"
#include "internal/checkpoint.h"

namespace ferry::ps {

flatbuffers::Offset<flatbuffers::Vector<uint16_t>> ServerImpl::PlacementVector(
    flatbuffers::FlatBufferBuilder& fbb) const {
  return fbb.CreateVector(tables_.placement().Owners());
}

bool ServerImpl::AnswerMoved(Request& req) {
  const Header& h = *req.h();
  const placement::Placement& map = tables_.placement();
  // 0: a client before 1.17, which cannot follow a map; the chunks and ids it names are checked
  // against this server's (ResolveSlices, CheckIds).
  if (h.placement_version() == 0 || h.placement_version() == map.version() || !wire::FindKind(h.kind())->placed) {
    return false;
  }
  Count(kMovedAnswered);
  const Status why = FailedPreconditionError(
      "moved: the request is placed by placement version " + std::to_string(h.placement_version()) + ", server " +
      std::to_string(options_.rank) + " is at version " + std::to_string(map.version()) +
      " (this reply carries it); nothing of the request was applied");
  Send(req, wire::MakeError(h.request_id(), h.kind(), why, map.version(), map.Owners()));
  Count(kErrorsSent);
  return true;
}

Status ServerImpl::SamePlacement(const Header& h) const {
  const uint64_t mine = tables_.placement().version();
  if (h.placement_version() == 0 || h.placement_version() == mine) return Status::Ok();
  return FailedPreconditionError(Who() + " is at placement version " + std::to_string(mine) +
                                 ", the shards were written under " + std::to_string(h.placement_version()) +
                                 ": a hand-over ran since they were; take the checkpoint again");
}

Status ServerImpl::OnPlacement(Request& req) {
  const Header& h = *req.h();
  FERRY_RETURN_IF_ERROR(CheckpointPossible());
  if (h.placement() == nullptr) return InvalidArgumentError("Placement without a map (`placement`)");
  FERRY_ASSIGN_OR_RETURN(placement::Placement next,
                         placement::Placement::FromOwners(h.placement_version(),
                                                          {h.placement()->data(), h.placement()->size()},
                                                          options_.num_servers));
  const placement::Placement& now = tables_.placement();
  const bool check_only = !h.full();
  if (next.version() == now.version() && next.Owners() == now.Owners()) {
    SendOk(req, static_cast<int64_t>(now.version()));  // adopted already (a Placement sent again)
    return Status::Ok();
  }
  // A client before 1.17 places by the first map whatever the servers hold, and cannot be told
  // otherwise: while one is connected the map stays.
  if (const std::vector<std::string> old = connections_.PeersBelow(wire::kPlacementVersionsSinceMinor);
      !old.empty()) {
    std::string peers;
    for (const std::string& p : old) peers += (peers.empty() ? "" : ", ") + p;
    return FailedPreconditionError(Who() + " has " + std::to_string(old.size()) + " client(s) of a protocol before 1." +
                                   std::to_string(wire::kPlacementVersionsSinceMinor) + " connected (" + peers +
                                   "), which cannot follow a new map: upgrade or stop them first");
  }
  // The hand-over is between steps: a pull held here waits for a step, and a push call in pieces
  // is half here; either would be served or applied by the map it was placed by.
  if (held_.size() > 0 || calls_.calls() > 0) {
    return FailedPreconditionError(Who() + " holds " + std::to_string(held_.size()) +
                                   " pull(s) waiting for a step and " +
                                   std::to_string(calls_.calls()) +
                                   " push call(s) in pieces: a hand-over is between steps (every worker waiting, "
                                   "e.g. at a barrier)");
  }
  if (next.version() <= now.version()) {
    return FailedPreconditionError(Who() + " is at placement version " + std::to_string(now.version()) +
                                   " already; a new map needs a higher version than " +
                                   std::to_string(next.version()));
  }
  // The pause of the hand-over: the checkpoint is read on the I/O thread (the workers wait for
  // the hand-over anyway; PROTOCOL.md), only the shards and slots that move to or from this
  // server (HandOverFilter).
  // The check round's read serves the adopting round that follows it (the same step and map).
  std::shared_ptr<const ps::CheckpointData> ckpt;
  std::vector<uint16_t> owners = next.Owners();
  if (handover_read_ && handover_read_->step == h.step() && handover_read_->version == next.version() &&
      handover_read_->owners == owners) {
    ckpt = handover_read_->ckpt;
  } else {
    const ps::CheckpointFilter filter = ps::HandOverFilter(now, next, options_.rank);
    FERRY_ASSIGN_OR_RETURN(ps::CheckpointData read,
                           ps::ReadCheckpointAt(options_.checkpoint_dir, h.step(), &filter));
    ckpt = std::make_shared<const ps::CheckpointData>(std::move(read));
  }
  handover_read_.reset();
  FERRY_ASSIGN_OR_RETURN(const ps::HandOverCounts moved,
                         ps::HandOver(*ckpt, next, options_.rank, workers_.count(), &tables_, check_only));
  if (check_only) {
    handover_read_ =
        HandOverRead{h.step(), next.version(), std::move(owners), std::move(ckpt), Clock::now() + options_.max_wait};
  }
  if (!check_only) {
    {
      // The next checkpoint of this server is whole: a delta of the shard before would not say
      // which rows and chunks left.
      MutexLock lock(&job_mu_);
      saved_ = SavedShard{};
    }
    std::fprintf(stderr,
                 "ferry-ps %d: placement version %llu from the checkpoint of step %lld: took %lld chunks and %lld "
                 "rows, gave up %lld chunks and %lld rows\n",
                 options_.rank, static_cast<unsigned long long>(next.version()), static_cast<long long>(h.step()),
                 static_cast<long long>(moved.chunks_taken), static_cast<long long>(moved.rows_taken),
                 static_cast<long long>(moved.chunks_dropped), static_cast<long long>(moved.rows_dropped));
  }
  SendOk(req, static_cast<int64_t>(next.version()));
  return Status::Ok();
}

}  // namespace ferry::ps
