// Placement versions (protocol 1.17, PROTOCOL.md "Placement versions"): the "moved" answer to a
// request placed by another map, and Placement, by which a server adopts a new map.
#include "internal/server_impl.h"

#include <cstdio>

#include "ferry/messages/kinds.h"
#include "ferry/messages/placement.h"
#include "internal/checkpoint.h"

namespace ferry::ps {
namespace {

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

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
  if (leaving_) HeardMapOf(h.rank(), map.version());  // this reply gives it the map
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

Status ServerImpl::AskedMoveFits(const AskedMove& asked) const {
  if (asked.rejoin_worker >= 0) {
    const int w = asked.rejoin_worker;
    if (!workers_.waits_to_rejoin(w)) {
      return FailedPreconditionError("cannot ask for " + asked.What() +
                                     ": no process of it waits to join (a worker that left, restarted with "
                                     "ferry-trainer --resume --rejoin, says so in its Hello)");
    }
    for (int v = 0; v < workers_.count(); ++v) {
      if (v != w && !workers_.finished(v)) return Status::Ok();
    }
    return FailedPreconditionError("cannot ask for " + asked.What() +
                                   ": every other worker has finished its training (no job left to join)");
  }
  if (asked.leave_worker >= 0) {
    const int w = asked.leave_worker;
    if (workers_.count() == 0) return Status::Ok();  // (no worker yet: checked again at the hand-over)
    if (w >= workers_.count()) {  // (asked before the count was known)
      return FailedPreconditionError("cannot ask for " + asked.What() + ": the job's workers are 0 to " +
                                     std::to_string(workers_.count() - 1));
    }
    if (workers_.left(w)) return FailedPreconditionError("cannot ask for " + asked.What() + ": it has left already");
    if (workers_.finished(w)) {
      return FailedPreconditionError("cannot ask for " + asked.What() + ": it has finished its training");
    }
    return Status::Ok();
  }
  const placement::Placement& map = tables_.placement();
  StatusOr<placement::Placement> next = asked.join >= 0 ? map.Grow(asked.join) : map.Drain(asked.drain);
  if (next.ok()) return Status::Ok();
  return FailedPreconditionError("cannot ask for " + asked.What() + " at placement version " +
                                 std::to_string(map.version()) + ": " + next.status().message());
}

Status ServerImpl::MovesPossible() const {
  if (Replicating()) {
    return UnimplementedError(Who() + " keeps replicas (replication 2): its slots cannot move yet");
  }
  return Status::Ok();
}

Status ServerImpl::OnMoveAsk(Request& req) {
  const Header& h = *req.h();
  if (options_.rank != 0) {
    return InvalidArgumentError(Who() + " is not server 0: a move is asked of server 0, which hands it to the job");
  }
  const int join = h.move_join();
  const int drain = h.move_drain();
  const int leave = h.move_leave_worker();    // 1.26
  const int rejoin = h.move_rejoin_worker();  // 1.27
  if ((join >= 0) + (drain >= 0) + (leave >= 0) + (rejoin >= 0) != 1 || join < -1 || drain < -1 || leave < -1 ||
      rejoin < -1) {
    return InvalidArgumentError(
        "a MoveAsk names one server, to join (move_join) or to drain (move_drain), or one worker to leave "
        "(move_leave_worker) or to join again (move_rejoin_worker); it names " +
        std::to_string(join) + " to join, " + std::to_string(drain) + " to drain, worker " + std::to_string(leave) +
        " to leave and worker " + std::to_string(rejoin) + " to join again");
  }
  if (const int w = std::max(leave, rejoin); w >= 0) {
    // Worker 0 checkpoints, moves the slots and reports: it stays (as for ferry-trainer --leave).
    const int workers = workers_.count() > 0 ? workers_.count() : options_.num_workers;
    if (w == 0 || (workers > 0 && w >= workers)) {
      return InvalidArgumentError("a MoveAsk asks worker " + std::to_string(w) +
                                  (leave >= 0 ? " to leave; " : " to join again; ") +
                                  (workers > 0 ? "the job's workers are 0 to " + std::to_string(workers - 1) + ", and "
                                               : std::string()) +
                                  "worker 0 stays (it checkpoints and reports)");
    }
    // 1.27: the worker's new process asks until the answer says its step (handed at a barrier);
    // its asks are what the hand-over hears of it by (Complete).
    if (rejoin >= 0 && h.rank() == rejoin && rejoin < workers_.count()) workers_.Heard(rejoin, req.arrived);
    // (a join handed earlier, after which the worker left again: a new join is asked)
    if (rejoin >= 0 && workers_.rejoins_at(rejoin) >= 0 && !workers_.left(rejoin)) {
      return AnswerRejoin(req, workers_.rejoins_at(rejoin));
    }
    if (rejoin >= 0 && asked_move_ && asked_move_->rejoin_worker == rejoin) {
      // (kept: not yet, unless it can no longer be made, e.g. the others have finished)
      if (Status fits = AskedMoveFits(*asked_move_); !fits.ok()) {
        std::fprintf(stderr, "ferry-ps 0: dropped the move asked (%s): %s\n", asked_move_->What().c_str(),
                     fits.message().c_str());
        asked_move_.reset();
        return fits;
      }
      return AnswerRejoin(req, 0);
    }
  } else if (const int target = std::max(join, drain); target >= options_.num_servers) {
    return InvalidArgumentError("a MoveAsk names server " + std::to_string(target) + "; the job has " +
                                std::to_string(options_.num_servers) + " servers (0 to " +
                                std::to_string(options_.num_servers - 1) + ")");
  } else {
    FERRY_RETURN_IF_ERROR(MovesPossible());
  }
  const AskedMove asked{join, drain, leave, rejoin, Clock::now()};
  if (asked_move_ && rejoin >= 0) {
    // (its process asks again until its own ask is kept, then handed: not yet)
    FERRY_RETURN_IF_ERROR(AskedMoveFits(asked));
    return AnswerRejoin(req, 0);
  }
  if (asked_move_) {
    return FailedPreconditionError(
        "a move is asked already (" + asked_move_->What() + ", " +
        std::to_string(std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - asked_move_->at).count()) +
        " s ago) and the job has not taken it yet (its workers take one at their next move check: "
        "ferry-trainer --move-asks-every); ask again once it is made");
  }
  // Checked against the map now, and again when a barrier would hand it over (Complete).
  FERRY_RETURN_IF_ERROR(AskedMoveFits(asked));
  asked_move_ = asked;
  std::fprintf(stderr, "ferry-ps 0: asked for %s; the workers take it at their next move check\n",
               asked_move_->What().c_str());
  if (rejoin >= 0) return AnswerRejoin(req, 0);
  SendOk(req);
  return Status::Ok();
}

Status ServerImpl::AnswerRejoin(Request& req, int64_t joins_at) {
  flatbuffers::FlatBufferBuilder fbb(128);
  wire::HeaderBuilder b = BeginReply(fbb, Kind::MoveAsk, req.h()->request_id());
  b.add_joins_at(joins_at);
  // (the id of the collective the workers wait in for it: the hand-over's second barrier)
  b.add_next_collective(collectives_.next_id());
  wire::FinishHeaderBuffer(fbb, b.Finish());
  Send(req, wire::ToFrame(fbb));
  return Status::Ok();
}

Status ServerImpl::OnPlacement(Request& req) {
  const Header& h = *req.h();
  FERRY_RETURN_IF_ERROR(MovesPossible());
  FERRY_RETURN_IF_ERROR(CheckpointPossible());
  if (h.placement() == nullptr) return InvalidArgumentError("Placement without a map (`placement`)");
  if (left_.load()) return FailedPreconditionError(Who() + " has left the job (it owned no slot): it takes no map");
  FERRY_ASSIGN_OR_RETURN(placement::Placement next,
                         placement::Placement::FromOwners(h.placement_version(),
                                                          {h.placement()->data(), h.placement()->size()},
                                                          options_.num_servers));
  const placement::Placement& now = tables_.placement();
  const int now_slots = now.SlotsOf(options_.rank);  // (`now` is the new map once it is adopted)
  const bool check_only = !h.full();
  if (next.version() == now.version() && next.Owners() == now.Owners()) {
    SendOk(req, static_cast<int64_t>(now.version()));  // adopted already (a Placement sent again)
    return Status::Ok();
  }
  if (h.prepare()) return PrepareHandOver(req, next);
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
  const Clock::time_point began = Clock::now();
  double read_s = 0, checked_s = 0;  // the check round's, for the adopting round's log
  int from_ahead = -1;               // chains started from a read ahead (-1: none was there)
  if (handover_read_ && handover_read_->step == h.step() && handover_read_->version == next.version() &&
      handover_read_->owners == owners) {
    ckpt = handover_read_->ckpt;
    read_s = handover_read_->read_s;
    checked_s = handover_read_->checked_s;
    from_ahead = handover_read_->ahead;
  } else {
    const ps::CheckpointFilter filter = ps::HandOverFilter(now, next, options_.rank);
    std::optional<ps::PreparedChains> ahead;  // read ahead for this map (1.19): the read starts from it
    {
      MutexLock lock(&job_mu_);
      if (prepared_ && prepared_->version == next.version() && prepared_->owners == owners) {
        ahead = std::move(prepared_->chains);
      }
      prepared_.reset();
    }
    FERRY_ASSIGN_OR_RETURN(ps::CheckpointData read, ps::ReadCheckpointAt(options_.checkpoint_dir, h.step(), &filter,
                                                                         ahead ? &*ahead : nullptr));
    ckpt = std::make_shared<const ps::CheckpointData>(std::move(read));
    if (ahead) from_ahead = ahead->used;
  }
  handover_read_.reset();
  const Clock::time_point read = Clock::now();
  FERRY_ASSIGN_OR_RETURN(const ps::HandOverCounts moved,
                         ps::HandOver(*ckpt, next, options_.rank, workers_.count(), &tables_, check_only));
  if (check_only) {
    handover_read_ = HandOverRead{h.step(), next.version(), std::move(owners), std::move(ckpt),
                                  Clock::now() + options_.max_wait, Seconds(began, read), Seconds(read, Clock::now()),
                                  from_ahead};
  }
  if (!check_only) {
    {
      // The next checkpoint of this server is whole: a delta of the shard before would not say
      // which rows and chunks left. A read ahead was filtered by the map before.
      MutexLock lock(&job_mu_);
      saved_ = SavedShard{};
      prepared_.reset();
    }
    std::fprintf(stderr,
                 "ferry-ps %d: placement version %llu from the checkpoint of step %lld: took %lld chunks and %lld "
                 "rows, gave up %lld chunks and %lld rows (checking: read %.3f s, checked %.3f s; adopting: read "
                 "%.3f s, applied %.3f s)%s\n",
                 options_.rank, static_cast<unsigned long long>(next.version()), static_cast<long long>(h.step()),
                 static_cast<long long>(moved.chunks_taken), static_cast<long long>(moved.rows_taken),
                 static_cast<long long>(moved.chunks_dropped), static_cast<long long>(moved.rows_dropped),
                 read_s, checked_s, Seconds(began, read), Seconds(read, Clock::now()),
                 from_ahead < 0 ? ""
                                : ("; " + std::to_string(from_ahead) + " shard chain(s) started from the read ahead")
                                      .c_str());
  }
  if (!check_only && now_slots == 0 && next.SlotsOf(options_.rank) > 0) {
    // It joins (1.20): it heard no clock since it owned no slot; every worker is at the step of
    // the hand-over's checkpoint (the workers wait between it and the hand-over).
    for (int r = 0; r < workers_.count(); ++r) workers_.AdvanceClock(r, h.step());
  }
  if (!check_only) {
    if (options_.exit_when_drained && options_.rank != 0 && next.SlotsOf(options_.rank) == 0) {
      BeginLeaving(/*restored=*/false);
    } else if (leaving_) {
      leaving_.reset();  // slots again before it could leave: it stays
      std::fprintf(stderr, "ferry-ps %d: placement version %llu gives it slots again: it stays in the job\n",
                   options_.rank, static_cast<unsigned long long>(next.version()));
    }
  }
  SendOk(req, static_cast<int64_t>(next.version()));
  return Status::Ok();
}

void ServerImpl::BeginLeaving(bool restored) {
  const uint64_t version = tables_.placement().version();
  const auto now = Clock::now();
  leaving_ = Leaving{version, std::vector<bool>(static_cast<size_t>(workers_.count()), restored), now,
                     now + std::chrono::seconds(10), std::nullopt, restored};
  std::fprintf(stderr,
               "ferry-ps %d: owns no slot of placement version %llu%s: it leaves the job once every worker holds "
               "that map (--exit-when-drained)\n",
               options_.rank, static_cast<unsigned long long>(version), restored ? " (restored)" : "");
  CheckLeaving();
}

void ServerImpl::CheckLeaving() {
  if (!leaving_ || left_.load()) return;
  // A worker that has left, or finished, or has no connection here sends nothing here again: a
  // restarted one learns the map from server 0 (its Hello) and never speaks to this server. A
  // client before 1.20 would go on sending its clocks and checkpoints here.
  std::string workers, waits_for;
  for (int r = 0; r < static_cast<int>(leaving_->holds.size()); ++r) {
    if (leaving_->holds[static_cast<size_t>(r)] || workers_.left(r) || workers_.finished(r) ||
        !connections_.HasRank(r)) {
      continue;
    }
    workers += (workers.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!workers.empty()) waits_for = "worker(s) " + workers + " connected here and not known to hold it";
  if (const std::vector<std::string> old = connections_.PeersBelow(wire::kMembersSinceMinor); !old.empty()) {
    waits_for += (waits_for.empty() ? "" : "; ") + std::to_string(old.size()) +
                 " client(s) before 1.20, which would send here whatever the map (" + old.front() +
                 (old.size() > 1 ? ", ..." : "") + ")";
  }
  const auto now = Clock::now();
  if (!waits_for.empty()) {
    leaving_->all_hold_since.reset();
  } else if (!leaving_->all_hold_since) {
    leaving_->all_hold_since = now;
  }
  // Then a grace (none after a restore): a request its client placed by the old map before it
  // took the new one may still be on its way, and is answered "moved" here and sent again.
  if (waits_for.empty() && (leaving_->restored || now - *leaving_->all_hold_since >= kLeaveGrace)) {
    left_.store(true);
    std::fprintf(stderr,
                 "ferry-ps %d: owns no slot of placement version %llu and no worker will send here again: left "
                 "the job after %.3f s (every worker held the map after %.3f s)\n",
                 options_.rank, static_cast<unsigned long long>(leaving_->version), Seconds(leaving_->since, now),
                 Seconds(leaving_->since, *leaving_->all_hold_since));
    return;
  }
  if (waits_for.empty() || now < leaving_->next_say) return;
  leaving_->next_say = now + std::chrono::seconds(10);
  std::fprintf(stderr,
               "ferry-ps %d: still waits to leave the job (placement version %llu gives it no slot, for %.0f s): "
               "%s; a worker's next request or heartbeat says it holds the map\n",
               options_.rank, static_cast<unsigned long long>(leaving_->version), Seconds(leaving_->since, now),
               waits_for.c_str());
}

// The read ahead runs on the file job's thread while the server goes on serving: it touches no
// table, only the checkpoint folder, and keeps what it read for the check round of the same map
// (OnPlacement), which then reads only the files written since.
Status ServerImpl::PrepareHandOver(Request& req, const placement::Placement& next) {
  const Header& h = *req.h();
  const placement::Placement& now = tables_.placement();
  if (next.version() <= now.version()) {
    return FailedPreconditionError(Who() + " is at placement version " + std::to_string(now.version()) +
                                   " already; a map to read ahead for needs a higher version than " +
                                   std::to_string(next.version()));
  }
  ps::CheckpointFilter filter = ps::HandOverFilter(now, next, options_.rank);
  {
    MutexLock lock(&job_mu_);
    prepared_.reset();  // replaced, or of no use
  }
  if (!filter.KeepsAny()) {  // none of this server's slots move: its hand-over reads nothing
    SendOk(req, static_cast<int64_t>(next.version()));
    return Status::Ok();
  }
  const int64_t step = h.step();  // (no file job runs: OnPlacement checked CheckpointPossible)
  const uint64_t id = h.request_id();
  RunFileJob(std::move(req),
             "the read ahead of the checkpoint of step " + std::to_string(step) + " for placement version " +
                 std::to_string(next.version()),
             [this, step, id, filter = std::move(filter), version = next.version(), owners = next.Owners(),
              budget = &tables_.budget()]() mutable -> StatusOr<zmq::message_t> {
               FERRY_ASSIGN_OR_RETURN(ps::PreparedChains chains,
                                      ps::PrepareChains(options_.checkpoint_dir, step, filter));
               // Kept while the job trains: on the budget (the read itself, as a hand-over's, is not).
               const int64_t bytes = chains.Bytes();
               FERRY_RETURN_IF_ERROR(budget->Take(bytes, Who() + ": keeping the read ahead of the checkpoint of step " +
                                                             std::to_string(step)));
               MutexLock lock(&job_mu_);
               prepared_ = PreparedRead{version, std::move(owners), std::move(chains), Clock::now() + kPreparedKeep,
                                        ps::BudgetCharge(budget, bytes)};
               return wire::MakeReply(id, Kind::Placement, static_cast<int64_t>(version));
             });
  return Status::Ok();
}

}  // namespace ferry::ps
