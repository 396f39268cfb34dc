// Handlers of the workers' progress and meetings: Clock, Finish, Barrier and AllReduce.
#include "internal/server_impl.h"

#include <algorithm>
#include <cstdio>

#include "internal/sync.h"

namespace ferry::ps {

Status ServerImpl::OnClock(Request& req) {
  SendOk(req, workers_.AdvanceClock(req.h()->rank(), req.h()->step()));
  ServeHeld();
  return Status::Ok();
}

Status ServerImpl::OnFinish(Request& req) {
  const int rank = req.h()->rank();
  // 1.18: a worker that leaves the job while it trains is out of its collectives too; the ones
  // that now have every worker that takes part complete.
  const bool leaves = req.h()->leaves();
  const int64_t leaves_at = req.h()->leaves_at();  // 1.26: the first step it takes no part in
  if (leaves && (leaves_at < -1 || leaves_at > ps::kMaxStep)) {
    return InvalidArgumentError("Finish: leaves_at " + std::to_string(leaves_at) +
                                " is outside [0, 2^62] (or -1: not said)");
  }
  if (leaves) {
    workers_.Leave(rank, leaves_at);
  } else {
    workers_.Finish(rank);
  }
  // An update that would not be finite marks its table diverged, and this worker's Finish,
  // the request that closed the step, is told (its job must not end as if trained).
  Status refused = CloseCompleteSteps();
  if (refused.ok()) {
    SendOk(req);
  } else {
    SendError(req, refused);
  }
  if (leaves) {
    for (std::vector<Request>& group : collectives_.TakeComplete(workers_.TakingPart())) Complete(group);
  }
  ServeHeld();
  return Status::Ok();
}

Status ServerImpl::OnCollective(Request& req) {
  FERRY_RETURN_IF_ERROR(collectives_.CheckEntry(req));
  FERRY_RETURN_IF_ERROR(RoomToHold(req));
  req.held = true;
  std::vector<Request> group =
      collectives_.Enter(std::move(req), Clock::now() + options_.max_wait, workers_.TakingPart());
  if (!group.empty()) Complete(group);
  return Status::Ok();
}

Status ServerImpl::CheckJoined(int rank, int64_t step) const {
  if (const int64_t from = workers_.joins_at(rank); step < from) {
    return FailedPreconditionError("worker " + std::to_string(rank) + " takes part from step " + std::to_string(from) +
                                   " (its Hello's joins_at): its sync push for step " + std::to_string(step) +
                                   " is refused");
  }
  return Status::Ok();
}

Status ServerImpl::CloseCompleteSteps() {
  Status refused = Status::Ok();
  Forward closes[2];  // replication 2: the backup closes the same steps of its replica (dense, sparse)
  ForEachSyncUnit([&](ps::Table& t, int64_t chunk, int64_t version, ps::SyncSlots& sync) {
    if (!workers_.StepComplete(t.spec, sync, version)) return;
    if (Replicating()) AddSyncOp(closes[chunk < 0], t, chunk, version, kClosed, sync.received);
    Status s = chunk < 0 ? CloseSyncStep(t) : CloseSyncStep(t, *t.dense->chunk(chunk));
    if (refused.ok()) refused = std::move(s);
  });
  for (Forward& f : closes) ForwardSyncOps(std::move(f));
  return refused;
}

void ServerImpl::Complete(std::vector<Request>& group) {
  if (group[0].h()->kind() == Kind::AllReduce) {
    const std::vector<double> sum = ps::Collectives::Sum(group);
    for (auto& r : group) {
      Frames payload;
      payload.emplace_back(sum.data(), sum.size() * sizeof(double));
      Send(r, wire::MakeReply(r.h()->request_id(), r.h()->kind(), 0), std::move(payload));
    }
    return;
  }
  // 1.24: a barrier every worker entered to take moves hands them the move asked since (the
  // same to each: they make it together), and server 0 forgets it. The map may have changed since
  // it was asked (a move made meanwhile): one that no longer fits it is dropped, said here, rather
  // than handed to workers who would fail to make it. (No hand-over runs while every worker waits
  // here: the map is the one they will move from.)
  const bool all_take_moves = std::ranges::all_of(group, [](Request& r) { return r.h()->takes_moves(); });
  const int64_t at = group[0].h()->step();  // (1.26: the step every worker is at, when each says the same)
  const bool same_step = at > 0 && std::ranges::all_of(group, [at](Request& r) { return r.h()->step() == at; });
  if (asked_move_ && all_take_moves) {
    Status fits = AskedMoveFits(*asked_move_);
    // 1.26: a worker's leave goes only to workers that know the field (an older one would train
    // on, or read no share of the leaver's examples, while the others take it).
    // 1.27: likewise a worker's join, which also needs the step the workers are at (the join is
    // from the next), and its process heard from lately (it asks every few milliseconds, and a
    // gap of 2 s only puts its join off to a later check): the workers would wait for a dead one
    // at the hand-over's second barrier.
    const bool rejoin = asked_move_->rejoin_worker >= 0;
    if (fits.ok() && (asked_move_->leave_worker >= 0 || rejoin)) {
      const uint16_t since = rejoin ? wire::kRejoinsSinceMinor : wire::kAskedLeavesSinceMinor;
      for (Request& r : group) {
        if (r.h()->minor() < since) {
          fits = FailedPreconditionError("worker " + std::to_string(r.h()->rank()) + " speaks protocol 1." +
                                         std::to_string(r.h()->minor()) + ", which does not know a " +
                                         (rejoin ? "join" : "leave") + " asked (1." + std::to_string(since) + ")");
          break;
        }
      }
    }
    if (fits.ok() && rejoin && !same_step) {
      fits = FailedPreconditionError("the workers' barrier does not say one step they are at");
    }
    if (fits.ok() && rejoin &&
        workers_.SilentFor(asked_move_->rejoin_worker, Clock::now()) >
            std::max<Clock::duration>(std::chrono::seconds(2), 2 * workers_.promised(asked_move_->rejoin_worker))) {
      fits = FailedPreconditionError("its process has sent nothing for " +
                                     std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                        workers_.SilentFor(asked_move_->rejoin_worker, Clock::now()))
                                                        .count()) +
                                     " ms");
    }
    if (!fits.ok()) {
      std::fprintf(stderr, "ferry-ps 0: dropped the move asked (%s): %s\n", asked_move_->What().c_str(),
                   fits.message().c_str());
      asked_move_.reset();
    }
  }
  if (!asked_move_ || !all_take_moves) {
    for (auto& r : group) SendOk(r);
    return;
  }
  for (auto& r : group) {
    flatbuffers::FlatBufferBuilder fbb(96);
    wire::HeaderBuilder b = BeginReply(fbb, Kind::Barrier, r.h()->request_id());
    if (asked_move_->join >= 0) b.add_move_join(asked_move_->join);
    if (asked_move_->drain >= 0) b.add_move_drain(asked_move_->drain);
    if (asked_move_->leave_worker >= 0) b.add_move_leave_worker(asked_move_->leave_worker);
    if (asked_move_->rejoin_worker >= 0) b.add_move_rejoin_worker(asked_move_->rejoin_worker);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    Send(r, wire::ToFrame(fbb));
  }
  // 1.26: a leave handed over at step T (every worker's barrier says it) is before T + 1: kept
  // for the Hello replies from now on, so a worker restarted before the leaver's Finish comes
  // hears of it too.
  if (asked_move_->leave_worker >= 0 && same_step) workers_.LeavingAt(asked_move_->leave_worker, at + 1);
  // 1.27: a join handed at step T is from T + 1: the worker takes part in the collectives at once
  // (the workers meet it at a second barrier, once it has told every server the step), and its
  // next ask is answered with the step.
  if (asked_move_->rejoin_worker >= 0) {
    workers_.Rejoin(asked_move_->rejoin_worker, at + 1);
    rejoin_barrier_ = collectives_.next_id();  // (this barrier has ended: the next is the second)
  }
  std::fprintf(stderr, "ferry-ps 0: handed the move asked (%s) to the %zu workers at a barrier\n",
               asked_move_->What().c_str(), group.size());
  asked_move_.reset();
}

}  // namespace ferry::ps
