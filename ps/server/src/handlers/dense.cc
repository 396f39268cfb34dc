// Handlers of dense tables: PushDense, PushPullDense and PullDense, and serving a dense pull.
#include "internal/server_impl.h"

#include <algorithm>

#include "ferry/messages/codec.h"
#include "internal/finite.h"
#include "internal/sync.h"

namespace ferry::ps {

Status ServerImpl::PushDense(Request& req, bool then_pull) {
  if (req.h()->call() != 0) return PushDensePiece(req, then_pull);
  std::vector<ps::TableRegistry::SliceRef> refs;
  std::vector<std::vector<float>> scratch;
  std::vector<std::span<const float>> grads;
  FERRY_RETURN_IF_ERROR(CheckPush(req, &refs, &scratch, &grads));
  FERRY_RETURN_IF_ERROR(RoomToForward(PayloadBytes(req.payload)));
  ApplyPush(req, refs, grads, then_pull);
  return Status::Ok();
}

Status ServerImpl::CheckPush(Request& req, std::vector<ps::TableRegistry::SliceRef>* refs,
                             std::vector<std::vector<float>>* scratch, std::vector<std::span<const float>>* grads,
                             bool values) {
  const Header& h = *req.h();
  const int rank = h.rank();
  FERRY_RETURN_IF_ERROR(tables_.ResolveSlices(h, options_.max_message_bytes, refs));
  if (values) FERRY_RETURN_IF_ERROR(DecodePush(req, *refs));
  // Check every slice before touching any of them: finite values, and the sync preconditions.
  // The views (a copy only for a frame not aligned for float) serve the updates too.
  scratch->assign(refs->size(), {});
  grads->assign(refs->size(), {});
  for (size_t i = 0; i < refs->size(); ++i) {
    const auto& r = (*refs)[i];
    (*grads)[i] = View<float>(req.payload[i], (*scratch)[i]);
    if (!values) continue;
    if (const int64_t bad = ps::FirstNonFinite((*grads)[i]); bad >= 0) {
      return RefuseNonFinite(*r.table, " chunk " + std::to_string(h.slices()->Get(static_cast<uint32_t>(i))->chunk()),
                             "element " + std::to_string(bad), rank);
    }
  }
  for (const auto& r : *refs) {
    FERRY_RETURN_IF_ERROR(Diverged(*r.table));
    if (r.table->spec.consistency != Consistency::kSync) continue;
    FERRY_RETURN_IF_ERROR(ps::CheckSyncPush(r.table->spec, r.chunk->sync, r.chunk->version, rank, h.step()));
    FERRY_RETURN_IF_ERROR(CheckJoined(rank, h.step()));
  }
  return Status::Ok();
}

Status ServerImpl::PushDensePiece(Request& req, bool then_pull) {
  const Header& h = *req.h();
  const int rank = h.rank();
  const uint64_t call = h.call();
  if (Status s = calls_.Admit(rank, call, h.piece(), h.pieces(), Clock::now() + options_.max_wait); !s.ok()) {
    // A piece that does not fit its call (out of order, or the call's id used twice) ends it too.
    if (auto open = calls_.Take(rank, call)) FailCall(std::move(*open), s);
    return s;
  }
  std::vector<ps::TableRegistry::SliceRef> refs;
  std::vector<std::vector<float>> scratch;
  std::vector<std::span<const float>> grads;
  Status s = CheckPush(req, &refs, &scratch, &grads);
  for (size_t i = 0; s.ok() && i < refs.size(); ++i) {
    s = calls_.Claim(rank, call, refs[i].table->id, h.slices()->Get(static_cast<uint32_t>(i))->chunk());
  }
  if (s.ok()) s = RoomToHold(req);
  if (!s.ok()) {
    // The call ends here: nothing of it is applied, and the pieces held are told why.
    FailCall(*calls_.Take(rank, call), s);
    return s;  // this piece's own answer
  }
  Count(kPiecesHeld);
  if (!calls_.Hold(std::move(req))) return Status::Ok();
  ps::HeldCalls::Call c = *calls_.Take(rank, call);
  // Every piece verified as it arrived. The sync preconditions once more, for all of them, before
  // any is applied: a step may have moved since the first piece came. What this finds (slices,
  // views of the frames) serves the updates.
  struct Checked {
    std::vector<ps::TableRegistry::SliceRef> refs;
    std::vector<std::vector<float>> scratch;
    std::vector<std::span<const float>> grads;
  };
  std::vector<Checked> checked(c.held.size());
  int64_t bytes = 0;
  for (size_t i = 0; i < c.held.size(); ++i) {
    Checked& k = checked[i];
    if (Status again = CheckPush(c.held[i], &k.refs, &k.scratch, &k.grads, /*values=*/false); !again.ok()) {
      FailCall(std::move(c), again);
      return Status::Ok();
    }
    bytes += PayloadBytes(c.held[i].payload);
  }
  // The whole call, before any piece is applied (its pieces' own charges given back first: the
  // bytes waiting for the backup take their place).
  if (Replicating()) {
    for (Request& r : c.held) r.held_bytes = {};
  }
  if (Status room = RoomToForward(bytes); !room.ok()) {
    FailCall(std::move(c), room);
    return Status::Ok();
  }
  for (size_t i = 0; i < c.held.size(); ++i) {
    c.held[i].held_by_peer = {};
    ApplyPush(c.held[i], checked[i].refs, checked[i].grads, then_pull);
  }
  return Status::Ok();
}

void ServerImpl::FailCall(ps::HeldCalls::Call c, const Status& why) {
  Count(kPieceCallsRefused);
  for (Request& r : c.held) {
    SendError(r, Status(why.code(), "piece " + std::to_string(r.h()->piece()) + " of " + std::to_string(c.pieces) +
                                        " of call " + std::to_string(c.id) +
                                        " was not applied, nor any of the call: " + why.message()));
  }
}

void ServerImpl::ApplyPush(Request& req, std::span<const ps::TableRegistry::SliceRef> refs,
                           std::span<const std::span<const float>> grads, bool then_pull) {
  const Header& h = *req.h();
  const int rank = h.rank();
  bool applied = false;
  Status refused = Status::Ok();  // an update that would not be finite (the first)
  wire::ReplyInfo info;
  Forward fwd;  // replication 2: what was applied, for the backup
  const ps::Table* last = nullptr;
  for (size_t i = 0; i < refs.size(); ++i) {
    const auto& [t, c] = refs[i];
    if (t->spec.consistency == Consistency::kSync && h.step() < c->version) {
      Count(kLateGradientsDropped);
      ++info.dropped;
      continue;
    }
    // Accepted: counted for its table (a request's slices of one table count once).
    if (t != last) ++t->counters.push_requests;
    last = t;
    t->counters.rows_pushed += c->size;
    if (t->spec.consistency == Consistency::kSync) {
      ++info.used;
      if (ps::ResentHold(c->sync, c->version, rank, h.step())) {
        // Held already: a replacement's, from its image, or a worker's earlier process's (its new
        // one says Hello). Forwarded again as held, so that the answer comes once the backup has it
        // (the earlier push's forward may not be confirmed yet, or may have been lost).
        Count(kReplayedUpdatesSkipped);
        ForwardHold(fwd, *t, h.slices()->Get(static_cast<uint32_t>(i))->chunk(), c->version, c->sync, rank, false);
        continue;
      }
      ps::HoldGradient(c->sync, rank, std::move(req.payload[i]));
      const bool closes = workers_.StepComplete(t->spec, c->sync, c->version);
      ForwardHold(fwd, *t, h.slices()->Get(static_cast<uint32_t>(i))->chunk(), c->version, c->sync, rank, closes);
      if (closes) {
        if (Status s = CloseSyncStep(*t, *c); refused.ok()) refused = s;
        applied = true;
      }
    } else if ((t->replay && c->replay_owner >= 0 && h.step() < t->replay->Floor(c->replay_owner, rank)) ||
               c->steps_taken.Replayed(rank, h.step())) {
      // A replay, after a restore (the checkpoint holds this step's update already) or of the
      // worker's predecessor process (this chunk took this step of it already).
      ++info.used;
      Count(kReplayedUpdatesSkipped);
    } else {
      ++info.used;
      RecordStaleness(*t, c->version - c->last_pulled[static_cast<size_t>(rank)]);
      const ps::NotFinite nf = updater_.ApplyDense(t->spec.optimizer, *c, grads[i].data(), c->version + 1);
      ++c->version;
      c->feed_seq = t->dense->feed_clock;
      c->steps_taken.Took(rank, h.step());
      Count(kUpdatesApplied);
      applied = true;
      if (Replicating()) {
        fwd.versions.push_back(c->version - 1);  // (before this update)
        fwd.ops.push_back(kApplied);
        fwd.counts.push_back(0);
        fwd.dense.emplace_back(t->id, h.slices()->Get(static_cast<uint32_t>(i))->chunk(), c->size);
        fwd.frames.push_back(Applied(req.payload[i], std::as_bytes(grads[i])));
      }
      if (nf.any()) {  // every table's refusal is noted; the reply names the first
        Status s = NotFiniteUpdate(*t, nf, c->offset, "worker " + std::to_string(rank) + "'s push");
        if (refused.ok()) refused = std::move(s);
      }
    }
  }
  CountPush(rank, info.used, info.dropped);
  if (refused.ok() && !then_pull) {
    info.version = INT64_MAX;
    for (const auto& r : refs) info.version = std::min(info.version, r.chunk->version);
  }
  AnswerPush(req, std::move(fwd), std::move(refused), info, then_pull);
  if (applied || then_pull) ServeHeld();
}

void ServerImpl::FinishPush(Request& req, const Status& refused, const wire::ReplyInfo& info, bool then_pull) {
  const Header& h = *req.h();
  if (!refused.ok()) {
    SendError(req, refused);
  } else if (!then_pull) {
    Send(req, wire::MakeReply(h.request_id(), h.kind(), info));
  } else {
    // PushPullDense at step t: push for t, clock to t + 1, pull for t + 1.
    workers_.AdvanceClock(h.rank(), h.step() + 1);
    req.pull_step = h.step() + 1;
    req.wait_from = Clock::now();
    req.info = info;
    req.payload.clear();
    HoldOrServe(std::move(req));
  }
}

Status ServerImpl::DecodePush(Request& req, std::span<const ps::TableRegistry::SliceRef> refs) {
  const Header& h = *req.h();
  const int rank = h.rank();
  for (size_t i = 0; i < refs.size(); ++i) {
    const ps::Table& t = *refs[i].table;
    if (t.spec.wire == WireFormat::kF32 && t.spec.topk_ratio == 0.0f) continue;
    const int64_t n = refs[i].chunk->size;
    zmq::message_t dense(static_cast<size_t>(n) * sizeof(float));
    auto* out = static_cast<float*>(dense.data());
    if (t.spec.topk_ratio > 0.0f) {
      Status s = wire::DecodeTopK(t.spec.wire, t.spec.topk_ratio, req.payload[i].data(), req.payload[i].size(), n, out);
      if (!s.ok()) {
        // A malformed message, as HandleMessage treats one: counted, logged naming the peer.
        Count(kBadMessages);
        s = s.WithContext("table '" + t.spec.name + "' chunk " +
                          std::to_string(h.slices()->Get(static_cast<uint32_t>(i))->chunk()) + " from worker " +
                          std::to_string(rank) + ", nothing of the push applied");
        LogRateLimited("refused a message from " + connections_.PeerOf(req.fd) + ": " + s.message());
        return s;
      }
    } else {
      wire::DecodeValues(t.spec.wire, req.payload[i].data(), n, out);
    }
    req.payload[i] = std::move(dense);
  }
  return Status::Ok();
}

Status ServerImpl::OnPullDense(Request& req) {
  std::vector<ps::TableRegistry::SliceRef> refs;
  FERRY_RETURN_IF_ERROR(tables_.ResolveSlices(*req.h(), options_.max_message_bytes, &refs));
  req.pull_step = req.h()->step();
  HoldOrServe(std::move(req));
  return Status::Ok();
}

bool ServerImpl::TryServeDense(Request& req) {
  const Header& h = *req.h();
  const size_t rank = static_cast<size_t>(h.rank());
  std::vector<ps::TableRegistry::SliceRef> refs;
  if (Status s = tables_.ResolveSlices(h, options_.max_message_bytes, &refs); !s.ok()) return SendError(req, s), true;
  for (auto& r : refs) {
    if (!workers_.Ready(r.table->spec, Settled(r.chunk->version, r.chunk->sync), req.pull_step)) return false;
  }
  req.released = Clock::now();
  req.info.held_us = req.waited_us();  // the wait, not the copies below
  Frames payload;
  payload.reserve(refs.size());
  int64_t version = INT64_MAX;
  const ps::Table* last = nullptr;
  for (auto& r : refs) {
    if (r.table != last) ++r.table->counters.pull_requests;  // a request's slices of one table count once
    last = r.table;
    r.table->counters.rows_pulled += r.chunk->size;
    const WireFormat w = r.table->spec.wire;
    if (w == WireFormat::kF32) {
      payload.push_back(r.chunk->params.Frame());  // the values themselves, not a copy (shared_floats.h)
    } else {  // 1.6: sent in the table's 16-bit format
      zmq::message_t frame(static_cast<size_t>(r.chunk->size * wire::ValueBytes(w)));
      const int64_t saturated = wire::EncodeValues(w, r.chunk->params.data(), r.chunk->size, frame.data());
      if (saturated > 0) CountSaturated(r.table->spec, saturated);
      payload.push_back(std::move(frame));
    }
    r.chunk->last_pulled[rank] = r.chunk->version;
    version = std::min(version, r.chunk->version);
  }
  req.info.version = version;
  Send(req, wire::MakeReply(h.request_id(), h.kind(), req.info), std::move(payload));
  return true;
}

}  // namespace ferry::ps
