// Replicas (protocol 1.21, PROTOCOL.md "Replicas"; ServerOptions::replication): a primary
// forwards the updates it applied to its backup and answers the push once the backup has applied
// them too; the backup applies them to its replica of the primary's slots, in the order they came.
#include "internal/server_impl.h"

#include <cstring>

#include <zlib.h>

#include "ferry/messages/kinds.h"
#include "internal/finite.h"
#include "internal/sync.h"

namespace ferry::ps {
namespace {

// Mixes a 64-bit value (splitmix64's finaliser): digests add these, so they need no order.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Crc(uint64_t key, const float* values, size_t n) {
  uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(&key), sizeof key);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(values), static_cast<uInt>(n * sizeof(float)));
  return Mix((key << 32) ^ static_cast<uint64_t>(crc));
}

// A digest of what a table holds on one server, the same whatever order its rows were made in:
// each dense chunk held (values and optimizer state, by index), and each sparse row pushed at least
// once (values, state and update count, by id; a row only ever pulled holds its initial values,
// which the id alone decides, and a replica makes it only when it is pushed).
uint64_t Digest(const Table& t) {
  uint64_t d = 0;
  if (t.dense) {
    for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
      const DenseChunk* c = t.dense->chunk(i);
      if (c == nullptr) continue;
      d += Crc(static_cast<uint64_t>(i), c->params.data(), static_cast<size_t>(c->size));
      d += Crc(static_cast<uint64_t>(i) | (uint64_t{1} << 63), c->state.data(), c->state.size());
    }
  } else {
    const SparseShard& s = *t.sparse;
    s.ForEachRow([&](int64_t id, RowIndex r) {
      if (s.steps(r) == 0) return;
      d += Crc(static_cast<uint64_t>(id), s.row(r), static_cast<size_t>(s.row_floats())) +
           Mix(static_cast<uint64_t>(s.steps(r)) ^ (static_cast<uint64_t>(id) << 20));  // and its update count
    });
  }
  return d;
}

}  // namespace

Status ServerImpl::ReplicaRefusal(const TableSpec& spec) const {
  if (!Replicating()) return Status::Ok();
  const char* why = spec.type == TableType::kSparse && (spec.has_lifecycle() || spec.disk_tier)
                        ? "a sparse table with lifecycle settings or a disk tier"
                    : spec.topk_ratio > 0.0f ? "a top-k table"
                                             : nullptr;
  if (why == nullptr) return Status::Ok();
  return FailedPreconditionError("table '" + spec.name + "': " + Who() +
                                 " keeps replicas (replication 2), which do not follow " + why +
                                 " yet: declare it async or ssp without them, or run with replication 1");
}

zmq::message_t ServerImpl::Applied(zmq::message_t& frame, std::span<const std::byte> applied) {
  if (applied.data() == frame.data() && applied.size() == frame.size()) return std::move(frame);
  return zmq::message_t(applied.data(), applied.size());
}

Status ServerImpl::RoomToForward(int64_t bytes) {
  if (!Replicating()) return Status::Ok();
  // At most as many as the backup's queue holds (its send high-water mark): a push applied then
  // always finds room there, never failing after the fact.
  // (Less some room for the closes no push waits for: ForwardSyncOps.)
  const size_t most = std::min<size_t>(options_.max_held, kReplyQueue - kSyncOpsRoom);
  if (awaiting_backup_.size() >= most || held_payloads_.used() + bytes > held_payloads_.limit()) {
    Count(kHeldRefused);
    return ResourceExhaustedError(Who() + "'s backup, server " + std::to_string(BackupRank()) + ", has " +
                                  std::to_string(awaiting_backup_.size()) +
                                  " updates to confirm, and what waits on this server (" +
                                  ps::Mib(held_payloads_.used()) + " of " + ps::Mib(held_payloads_.limit()) +
                                  ") has no room for this push's " + ps::Mib(bytes) +
                                  " more: nothing applied; "
                                  "send it again once the backup has caught up");
  }
  return Status::Ok();
}

// A replacement takes up to failover_timeout per peer (and the launcher that long and 30 s more):
// the pushes that wait for a dead backup wait for its replacement as long.
std::chrono::milliseconds ServerImpl::BackupTimeout() const {
  return 2 * options_.failover_timeout + std::min(options_.failover_timeout / 2, std::chrono::milliseconds(30000));
}

Status ServerImpl::SendReplicate(uint64_t id, int rank, int64_t step, Forward& fwd) {
  flatbuffers::FlatBufferBuilder fbb(256 + 24 * (fwd.dense.size() + fwd.sparse.size()));
  flatbuffers::Offset<flatbuffers::Vector<const wire::DenseSlice*>> dense;
  flatbuffers::Offset<flatbuffers::Vector<const wire::SparseSlice*>> sparse;
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> ops;
  flatbuffers::Offset<flatbuffers::Vector<int32_t>> counts;
  if (!fwd.dense.empty()) dense = fbb.CreateVectorOfStructs(fwd.dense);
  if (!fwd.sparse.empty()) sparse = fbb.CreateVectorOfStructs(fwd.sparse);
  if (fwd.any_sync()) {
    ops = fbb.CreateVector(fwd.ops);
    counts = fbb.CreateVector(fwd.counts);
  }
  auto versions = fbb.CreateVector(fwd.versions);
  wire::HeaderBuilder b(fbb);
  b.add_major(wire::kMajor);
  b.add_minor(wire::kMinor);
  b.add_kind(Kind::Replicate);
  b.add_request_id(id);
  b.add_rank(rank);
  b.add_step(step);
  b.add_incarnation(incarnation_);  // 1.22: a replaced primary's late updates are refused
  if (!dense.IsNull()) b.add_slices(dense);
  if (!sparse.IsNull()) b.add_sparse(sparse);
  if (!ops.IsNull()) b.add_sync_ops(ops);
  if (!counts.IsNull()) b.add_sync_counts(counts);
  b.add_versions(versions);
  wire::FinishHeaderBuffer(fbb, b.Finish());
  Frames out;
  out.reserve(1 + fwd.frames.size());
  out.push_back(wire::ToFrame(fbb));
  for (auto& f : fwd.frames) out.push_back(std::move(f));
  // Never blocks: a backup that reads nothing fills the queue, and the push fails instead.
  return transport::Send(sockets_[kBackup], out, /*dontwait=*/true);
}

void ServerImpl::ForwardHold(Forward& fwd, const ps::Table& t, int64_t chunk, int64_t version,
                             const ps::SyncSlots& sync, int rank, bool closed) {
  if (!Replicating()) return;
  const size_t r = static_cast<size_t>(rank);
  AddSyncOp(fwd, t, chunk, version, closed ? kHeldAndClosed : kHeld, sync.received);
  // Copies: the hold keeps its frames until the step closes, and a frame shared across threads
  // would be freed under ZeroMQ's reference count alone.
  if (chunk < 0) {
    const zmq::message_t& ids = *sync.ids_by_rank[r];
    fwd.sparse.back() = wire::SparseSlice(t.id, t.spec.dim, static_cast<int64_t>(ids.size() / sizeof(int64_t)));
    fwd.frames.emplace_back(ids.data(), ids.size());
  }
  fwd.frames.emplace_back(sync.by_rank[r]->data(), sync.by_rank[r]->size());
}

void ServerImpl::AddSyncOp(Forward& fwd, const ps::Table& t, int64_t chunk, int64_t version, SyncOp op, int received) {
  fwd.versions.push_back(version);
  fwd.ops.push_back(op);
  fwd.counts.push_back(received);
  if (op == kClosed || op == kHeldAndClosed) fwd.closes.emplace_back(t.id, chunk);
  if (chunk >= 0) {
    fwd.dense.emplace_back(t.id, chunk, t.dense->chunk(chunk)->size);
  } else {
    fwd.sparse.emplace_back(t.id, t.spec.dim, 0);
  }
}

void ServerImpl::ForwardSyncOps(Forward fwd) {
  if (!Replicating() || fwd.empty()) return;
  const size_t parts = fwd.versions.size();
  const uint64_t id = ++next_replicate_;
  if (Status s = SendReplicate(id, 0, 0, fwd); !s.ok()) {
    Count(kReplicaErrors);
    LogRateLimited(Who() + " could not forward " + std::to_string(parts) + " sync step close(s) to its " +
                   "backup, server " + std::to_string(BackupRank()) + " (" + s.message() +
                   "): the replica misses them");
    return;
  }
  Count(kUpdatesForwarded, static_cast<int64_t>(parts));
  // Awaited, though no request waits: its closes hold the pulls back until the backup has them,
  // and a refusal is counted and said.
  Await(id, fwd).answers = false;
}

ServerImpl::AwaitingBackup& ServerImpl::Await(uint64_t id, Forward& fwd) {
  AwaitingBackup& a = awaiting_backup_[id];
  a.sent = Clock::now();
  a.closes = std::move(fwd.closes);
  for (const auto& [table, chunk] : a.closes) {
    if (ps::SyncSlots* s = UnitSync(table, chunk)) ++s->closes_unconfirmed;
  }
  return a;
}

void ServerImpl::AnswerAwaited(AwaitingBackup& a) {
  if (!a.answers) return;
  FinishPush(a.req, a.refused, a.info, a.then_pull);
}

std::string ServerImpl::Forwarded(const AwaitingBackup& a) {
  if (!a.answers) return " closed sync steps";
  const Header& h = *a.req.h();
  return " applied worker " + std::to_string(h.rank()) + "'s push of step " + std::to_string(h.step());
}

ps::SyncSlots* ServerImpl::UnitSync(uint64_t table, int64_t chunk) {
  // (Tables are never dropped, nor moved with replication 2.)
  auto t = tables_.Find(table, chunk < 0 ? TableType::kSparse : TableType::kDense);
  if (!t.ok()) return nullptr;
  if (chunk < 0) return &(*t)->sparse->sync;
  ps::DenseChunk* c = (*t)->dense->chunk(chunk);
  return c != nullptr ? &c->sync : nullptr;
}

bool ServerImpl::SettleCloses(const AwaitingBackup& a) {
  for (const auto& [table, chunk] : a.closes) {
    if (ps::SyncSlots* s = UnitSync(table, chunk); s != nullptr && s->closes_unconfirmed > 0) --s->closes_unconfirmed;
  }
  return !a.closes.empty();
}

void ServerImpl::AnswerPush(Request& req, Forward fwd, Status refused, wire::ReplyInfo info, bool then_pull) {
  if (fwd.empty()) return FinishPush(req, refused, info, then_pull);
  const Header& h = *req.h();
  const uint64_t id = ++next_replicate_;
  int64_t bytes = 0;
  for (const auto& f : fwd.frames) bytes += static_cast<int64_t>(f.size());
  if (Status s = SendReplicate(id, h.rank(), h.step(), fwd); !s.ok()) {
    Count(kReplicaErrors);
    const std::string why = Who() + " applied worker " + std::to_string(h.rank()) + "'s push of step " +
                            std::to_string(h.step()) + " but could not forward it to its backup, server " +
                            std::to_string(BackupRank()) + " (" + s.message() +
                            "): the replica misses it; is the backup running?";
    LogRateLimited(why);
    return FinishPush(req, UnavailableError(why), info, then_pull);
  }
  Count(kUpdatesForwarded, static_cast<int64_t>(fwd.dense.size() + fwd.sparse.size()));
  AwaitingBackup& a = Await(id, fwd);
  a.refused = std::move(refused);
  a.info = info;
  a.then_pull = then_pull;
  // What waits for the backup is charged in place of what the request held (pieces of a call).
  held_payloads_.Force(bytes);
  a.charge = ps::BudgetCharge(&held_payloads_, bytes);
  req.payload.clear();  // (its frames went to the backup, or are no longer needed)
  req.held_bytes = {};
  a.req = std::move(req);
}

void ServerImpl::OnBackupReply(Frames& frames) {
  if (frames.empty()) return;
  const Header* h = nullptr;
  zmq::message_t header = std::move(frames[0]);
  if (Status s = wire::VerifyHeader(header, &h); !s.ok() || h->request_kind() != Kind::Replicate) {
    Count(kReplicaErrors);
    LogRateLimited(Who() + ": its backup, server " + std::to_string(BackupRank()) +
                   ", sent a message that answers no Replicate: " + (s.ok() ? "another kind" : s.message()));
    return;
  }
  auto it = awaiting_backup_.find(h->request_id());
  if (it == awaiting_backup_.end()) return;  // failed already for the backup's silence (ExpireBackupWaits)
  AwaitingBackup a = std::move(it->second);
  awaiting_backup_.erase(it);
  const bool settled = SettleCloses(a);  // (refused too: the pulls do not wait for it for ever)
  if (h->kind() == Kind::Error) {
    Count(kReplicaErrors);
    const Status why = wire::ErrorStatus(*h);
    const std::string what = Who() + Forwarded(a) + ", but its backup, server " + std::to_string(BackupRank()) +
                             ", refused it (" + why.ToString() + "): the replica misses it";
    LogRateLimited(what);
    if (a.refused.ok())
      a.refused = Status(why.code() == StatusCode::kUnknown ? StatusCode::kInternal : why.code(), what);
  }
  AnswerAwaited(a);
  if (a.then_pull || settled) ServeHeld();
}

std::optional<Clock::time_point> ServerImpl::NextBackupDeadline() const {
  if (awaiting_backup_.empty()) return std::nullopt;
  return awaiting_backup_.begin()->second.sent + BackupTimeout();
}

void ServerImpl::ExpireBackupWaits(Clock::time_point now) {
  const auto timeout = BackupTimeout();
  if (!awaiting_backup_.empty() && now - awaiting_backup_.begin()->second.sent >= std::chrono::seconds(2) &&
      now - backup_waits_said_ >= std::chrono::seconds(10)) {
    backup_waits_said_ = now;
    std::fprintf(stderr,
                 "ferry-ps %d: %zu update(s) forwarded wait for its backup, server %d, to confirm them, the oldest "
                 "for %.1f s (dead and being replaced? they fail after %lld ms: --failover-timeout-s)\n",
                 options_.rank, awaiting_backup_.size(), BackupRank(),
                 std::chrono::duration<double>(now - awaiting_backup_.begin()->second.sent).count(),
                 static_cast<long long>(timeout.count()));
  }
  int64_t failed = 0;
  bool settled = false;
  while (!awaiting_backup_.empty() && awaiting_backup_.begin()->second.sent + timeout <= now) {
    AwaitingBackup a = std::move(awaiting_backup_.begin()->second);
    awaiting_backup_.erase(awaiting_backup_.begin());
    ++failed;
    Count(kReplicaErrors);  // (before the error is sent: a client that reads the counters then sees it)
    settled = SettleCloses(a) || settled;
    if (!a.answers) continue;
    const std::string why = Who() + Forwarded(a) + ", but its backup, server " + std::to_string(BackupRank()) +
                            ", has not confirmed it in " + std::to_string(timeout.count()) +
                            " ms (dead, stopped or cut off?)";
    SendError(a.req, UnavailableError(why));
  }
  if (settled) ServeHeld();
  if (failed == 0) return;
  if (now - backup_said_ >= std::chrono::seconds(10)) {
    backup_said_ = now;
    std::fprintf(stderr,
                 "ferry-ps %d: its backup, server %d, has not confirmed %lld update(s) in %lld ms: "
                 "their pushes failed (UNAVAILABLE), and their sync closes are served\n",
                 options_.rank, BackupRank(), static_cast<long long>(failed), static_cast<long long>(timeout.count()));
  }
}

StatusOr<ps::Table*> ServerImpl::ReplicaTable(uint64_t id, TableType type) {
  // Every server of the job has the same declaration (a restored table's new settings too).
  const ps::Table* here = tables_.Find(id);
  if (here == nullptr) {
    return FailedPreconditionError(Who() + " has no table of id " + std::to_string(id) +
                                   " declared: it cannot keep its replica");
  }
  // (Made when the table was declared here, or restored; one declared before this server kept
  // replicas, by a restore without them, is made now.)
  if (replicas_->Find(id) == nullptr) FERRY_RETURN_IF_ERROR(replicas_->Create(here->spec, id, workers_.count()));
  FERRY_ASSIGN_OR_RETURN(ps::Table * t, replicas_->Find(id, type));
  if (!(t->spec == here->spec)) t->spec = here->spec;  // a restored table's new settings (the shard reads them)
  return t;
}

Status ServerImpl::OutOfStep(const ps::Table& t, std::string why) {
  Count(kReplicaErrors);
  const std::string what = Who() + ": its replica of server " + std::to_string(PrimaryRank()) + "'s part of table '" +
                           t.spec.name + "' is out of step (" + why +
                           "): it takes no more updates, and every push to that part fails; restart the job (from "
                           "its checkpoint) to replicate it again";
  if (out_of_step_.emplace(t.id, why).second) std::fprintf(stderr, "ferry-ps %d: %s\n", options_.rank, what.c_str());
  return FailedPreconditionError(what);
}

Status ServerImpl::OnReplicate(Request& req) {
  if (!Replicating()) {
    return FailedPreconditionError(Who() + " keeps no replica (replication 1): it takes no Replicate");
  }
  const Header& h = *req.h();
  const int rank = h.rank();
  if (rank < 0 || rank >= workers_.count()) {
    return InvalidArgumentError("Replicate for worker " + std::to_string(rank) + ", outside [0, " +
                                std::to_string(workers_.count()) + ")");
  }
  if (h.step() < 0 || h.step() > ps::kMaxStep) return InvalidArgumentError("Replicate: step outside [0, 2^62]");
  if (h.incarnation() < replica_fence_) {
    Count(kReplicaErrors);
    return FailedPreconditionError(Who() + ": a Replicate of server " + std::to_string(PrimaryRank()) +
                                   "'s incarnation " + std::to_string(h.incarnation()) +
                                   ", which its replacement (incarnation " + std::to_string(replica_fence_) +
                                   ") took over: refused, not applied");
  }
  const auto* slices = h.slices();
  const auto* sparse = h.sparse();
  const size_t n_dense = slices ? slices->size() : 0, n_sparse = sparse ? sparse->size() : 0;
  if ((n_dense == 0) == (n_sparse == 0)) {
    return InvalidArgumentError("Replicate carries dense slices or sparse entries, one kind of them");
  }
  const size_t n = n_dense + n_sparse;
  // 1.23: a sync table's parts say what the primary did (held, closed, dropped); frames come only
  // with a gradient (held, or applied).
  const auto* ops = h.sync_ops();
  if (ops != nullptr && ops->size() != n) {
    return InvalidArgumentError("Replicate with " + std::to_string(ops->size()) + " sync ops for its " +
                                std::to_string(n) + " parts");
  }
  const auto* counts = h.sync_counts();
  if (ops != nullptr && (counts == nullptr || counts->size() != n)) {
    return InvalidArgumentError("Replicate with sync ops without one sync count for each of its " + std::to_string(n) +
                                " parts");
  }
  auto op_of = [&](size_t i) { return ops != nullptr ? ops->Get(static_cast<uint32_t>(i)) : uint8_t{kApplied}; };
  size_t frames = 0;
  for (size_t i = 0; i < n; ++i) {
    if (op_of(i) > kDropped) {
      return InvalidArgumentError("Replicate part " + std::to_string(i) + " with sync op " + std::to_string(op_of(i)) +
                                  ", not one of 0-4");
    }
    if (op_of(i) <= kHeldAndClosed) frames += i < n_dense ? 1 : 2;
  }
  if (req.payload.size() != frames) {
    return InvalidArgumentError("Replicate with " + std::to_string(req.payload.size()) + " payload frames for " +
                                std::to_string(n) + " parts");
  }
  if (h.versions() == nullptr || h.versions()->size() != n) {
    return InvalidArgumentError("Replicate without one version for each of its " + std::to_string(n) + " parts");
  }
  // Everything checked before anything is applied, or confirmed.
  struct Part {
    ps::Table* table;
    ps::DenseChunk* chunk = nullptr;
    uint8_t op = kApplied;
    int64_t theirs = 0;  // its version on the primary
    size_t frame = 0;    // its first payload frame (with a gradient)
    std::vector<float> g_scratch;
    std::vector<int64_t> id_scratch;
    std::span<const float> grads;
    std::span<const int64_t> ids;
    ps::SyncSlots& sync() const { return chunk != nullptr ? chunk->sync : table->sparse->sync; }
    int64_t version() const { return chunk != nullptr ? chunk->version : table->sparse->version; }
  };
  std::vector<Part> parts(n);
  int64_t new_row_bytes = 0;
  // A part named twice would be applied twice against one version check (a primary never sends so).
  auto twice = [&](size_t i) {
    for (size_t k = 0; k < i; ++k) {
      if (parts[k].table == parts[i].table && parts[k].chunk == parts[i].chunk) return true;
    }
    return false;
  };
  size_t f = 0;
  for (size_t i = 0; i < n; ++i) {
    Part& p = parts[i];
    p.op = op_of(i);
    p.theirs = h.versions()->Get(static_cast<uint32_t>(i));
    const bool with_frames = p.op <= kHeldAndClosed;
    p.frame = f;
    std::string where;
    if (i < n_dense) {
      const wire::DenseSlice& sl = *slices->Get(static_cast<uint32_t>(i));
      FERRY_ASSIGN_OR_RETURN(p.table, ReplicaTable(sl.table_id(), TableType::kDense));
      const ps::Table& t = *p.table;
      where = "table '" + t.spec.name + "' chunk " + std::to_string(sl.chunk());
      p.chunk = t.dense->chunk(sl.chunk());
      if (p.chunk == nullptr) {
        return FailedPreconditionError(where + " is not server " + std::to_string(PrimaryRank()) +
                                       "'s, whose replica " + Who() + " keeps");
      }
      const size_t bytes = with_frames ? req.payload[f++].size() : static_cast<size_t>(p.chunk->size) * sizeof(float);
      if (sl.count() != p.chunk->size || bytes != static_cast<size_t>(p.chunk->size) * sizeof(float)) {
        return InvalidArgumentError(where + ": Replicate of " + std::to_string(p.chunk->size) + " floats carries " +
                                    std::to_string(bytes) + " bytes");
      }
      if (with_frames) p.grads = View<float>(req.payload[p.frame], p.g_scratch);
      if (twice(i)) return InvalidArgumentError(where + " appears twice in one Replicate");
    } else {
      const wire::SparseSlice& sl = *sparse->Get(static_cast<uint32_t>(i - n_dense));
      FERRY_ASSIGN_OR_RETURN(p.table, ReplicaTable(sl.table_id(), TableType::kSparse));
      const ps::Table& t = *p.table;
      where = "table '" + t.spec.name + "'";
      static const zmq::message_t kNone;
      const zmq::message_t& ids = with_frames ? req.payload[f] : kNone;
      const zmq::message_t& rows = with_frames ? req.payload[f + 1] : kNone;
      if (with_frames) f += 2;
      // By division: the counts a hostile header names cannot overflow anything.
      const size_t row_bytes = static_cast<size_t>(t.spec.dim) * sizeof(float);
      if (sl.dim() != t.spec.dim || sl.num_ids() < 0 || ids.size() % 8 != 0 ||
          ids.size() / 8 != static_cast<uint64_t>(sl.num_ids()) || rows.size() % row_bytes != 0 ||
          rows.size() / row_bytes != ids.size() / 8) {
        return InvalidArgumentError(where + ": Replicate of " + std::to_string(sl.num_ids()) + " rows of dim " +
                                    std::to_string(sl.dim()) + " carries " + std::to_string(ids.size()) +
                                    " id bytes and " + std::to_string(rows.size()) + " row bytes (the table's dim is " +
                                    std::to_string(t.spec.dim) + ")");
      }
      if (twice(i)) return InvalidArgumentError(where + " appears twice in one Replicate");
      if (with_frames) {
        p.ids = View<int64_t>(ids, p.id_scratch);
        p.grads = View<float>(rows, p.g_scratch);
      }
      FERRY_RETURN_IF_ERROR(replicas_->CheckIds(t, p.ids));
      // (A held gradient's rows are made when its step closes, as on the primary, which checked room.)
      if (p.op <= kHeldAndClosed) new_row_bytes += t.sparse->NewRows(p.ids) * t.sparse->RowBytes();
    }
    if ((p.op != kApplied) != (p.table->spec.consistency == Consistency::kSync)) {
      return InvalidArgumentError(where + ": Replicate with sync op " + std::to_string(p.op) + " for " +
                                  (p.op != kApplied ? "a table that is not sync" : "a sync table"));
    }
    if (const int64_t bad = ps::FirstNonFinite(p.grads); bad >= 0) {
      return InvalidArgumentError(where + ": Replicate holds NaN or Inf (value " + std::to_string(bad) +
                                  "), which no primary applies");
    }
  }
  // The message is refused whole from here on, its primary having applied it: every table it
  // names is out of step then.
  auto refuse_all = [&](const std::string& why) {
    Status first;
    for (const Part& p : parts) {
      Status s = OutOfStep(*p.table, why);
      if (first.ok()) first = s;
    }
    return first;
  };
  auto held = [&](const Part& p) {
    const ps::SyncSlots& s = p.sync();
    return static_cast<size_t>(rank) < s.by_rank.size() && s.by_rank[static_cast<size_t>(rank)].has_value();
  };
  // A replica taken from its primary's image (1.22) holds the updates the primary had applied when
  // it was taken: their Replicates, queued for the dead backup, come after it, each below the
  // replica's versions in every part (1.23: or a gradient of the open step the image holds).
  // Confirmed again, not applied again.
  size_t below = 0;
  for (size_t i = 0; i < n; ++i) {
    const Part& p = parts[i];
    const int64_t theirs = h.versions()->Get(static_cast<uint32_t>(i));
    if (theirs < p.version() || (p.op == kHeld && theirs == p.version() && held(p))) ++below;
  }
  if (replica_recovered_ && h.incarnation() == replica_image_incarnation_ && h.request_id() <= replica_image_covers_) {
    // The image was taken after its primary made every Replicate it covers: it holds their effect,
    // whatever later ones did (a sync hold dropped since, a drop at the image's version).
    if (below != n && ops == nullptr) {
      LogRateLimited(Who() + ": Replicate " + std::to_string(h.request_id()) + " of server " +
                     std::to_string(PrimaryRank()) + ", which its image covers, names updates at the image's " +
                     "versions (confirmed, not applied)");
    }
    SendOk(req);
    Count(kReplayedUpdatesSkipped, static_cast<int64_t>(n));
    transport::internal::HandoffDone();
    return Status::Ok();
  }
  for (size_t i = 0; i < n; ++i) {
    const Part& p = parts[i];
    if (auto it = out_of_step_.find(p.table->id); it != out_of_step_.end()) {
      return refuse_all("table '" + p.table->spec.name + "' since: " + it->second);
    }
    // The update the primary applied to what this replica holds, or the replica is out of step.
    const int64_t mine = p.version(), theirs = h.versions()->Get(static_cast<uint32_t>(i));
    const std::string part =
        "table '" + p.table->spec.name + "' " +
        (p.chunk != nullptr ? "chunk " + std::to_string(slices->Get(static_cast<uint32_t>(i))->chunk())
                            : std::string("rows"));
    if (theirs != mine) {
      return refuse_all(part + " at version " + std::to_string(mine) + " here and " + std::to_string(theirs) +
                        " on server " + std::to_string(PrimaryRank()) + " before worker " + std::to_string(rank) +
                        "'s update of step " + std::to_string(h.step()));
    }
    if (p.op != kApplied) {
      // As many gradients held as the primary holds after the op (before a close): a hold it missed
      // would close the step with fewer.
      const int now = p.sync().received;
      const int after = p.op == kHeld || p.op == kHeldAndClosed ? now + (held(p) ? 0 : 1)
                        : p.op == kDropped                      ? now - (held(p) ? 1 : 0)
                                                                : now;
      if (const int32_t want = counts->Get(static_cast<uint32_t>(i)); after != want) {
        return refuse_all(part + ": " + std::to_string(after) + " gradient(s) held here for step " +
                          std::to_string(mine) + " and " + std::to_string(want) + " on server " +
                          std::to_string(PrimaryRank()) + " (a hold or drop missed)");
      }
      if (p.op == kClosed && now == 0) {
        return refuse_all(part + ": its primary closed step " + std::to_string(mine) + ", of which this replica " +
                          "holds no gradient");
      }
    }
  }
  if (ps::MemoryBudget& budget = replicas_->budget();
      new_row_bytes > 0 && new_row_bytes > budget.limit() - budget.used()) {
    budget.CountRefusal();
    return refuse_all(budget.Refusal(new_row_bytes, "the replica's new rows"));
  }
  primary_incarnation_ = std::max(primary_incarnation_, h.incarnation());  // (a replacement's, once it is heard)
  // Confirmed before it is applied: the backup has the updates once it holds the message (it applies
  // them next, before it reads anything else), and the primary's push waits for no optimizer here.
  SendOk(req);
  // Applied as the primary applied them: the same gradients, in the same order, as the same
  // update numbers; whatever the primary's optimizer kept from a non-finite result, this keeps too.
  // A sync step is closed from the same gradients held, by the same function.
  for (Part& p : parts) {
    ps::Table& t = *p.table;
    const size_t r = static_cast<size_t>(rank);
    try {
      switch (p.op) {
        case kApplied:
          if (p.chunk != nullptr) {
            updater_.ApplyDense(t.spec.optimizer, *p.chunk, p.grads.data(), p.chunk->version + 1);
            ++p.chunk->version;
            p.chunk->steps_taken.Took(rank, h.step());
          } else {
            updater_.ApplyRows(*t.sparse, p.ids, p.grads.data());  // (room checked above)
            ++t.sparse->version;
            t.sparse->steps_taken.Took(rank, h.step());
          }
          break;
        case kHeld:
        case kHeldAndClosed: {
          ps::SyncSlots& s = p.sync();
          if (s.by_rank.size() <= r) {  // (sized for the job's workers when made, or at a close)
            s.by_rank.resize(std::max<size_t>(r + 1, static_cast<size_t>(workers_.count())));
            if (p.chunk == nullptr) s.ids_by_rank.resize(s.by_rank.size());
          }
          ps::DropGradient(s, rank);  // (one held already: the same push's, forwarded again)
          if (p.chunk != nullptr) {
            ps::HoldGradient(s, rank, std::move(req.payload[p.frame]));
          } else {
            ps::HoldGradient(s, rank, std::move(req.payload[p.frame]), std::move(req.payload[p.frame + 1]));
          }
          if (p.op == kHeldAndClosed) CloseReplicaStep(p.table, p.chunk);
          break;
        }
        case kClosed: CloseReplicaStep(p.table, p.chunk); break;
        case kDropped:
          if (p.theirs == p.version()) ps::DropGradient(p.sync(), rank);
          break;
      }
    } catch (const std::exception& e) {  // (out of memory: confirmed already, so said here)
      OutOfStep(t, std::string("an update it confirmed could not be applied: ") + e.what()).IgnoreError();
      continue;
    }
    Count(kReplicaUpdatesApplied);
  }
  // (Confirmed before it was applied: over inproc the frames may be the worker's own, which its
  // client, holding them to send again, frees once the last reference goes.)
  transport::internal::HandoffDone();
  return Status::Ok();
}

void ServerImpl::CloseReplicaStep(ps::Table* t, ps::DenseChunk* c) {
  if (c != nullptr) {
    ps::CloseSyncStep(updater_, t->spec, *c, workers_.count());
  } else {
    ps::CloseSyncStep(updater_, *t->sparse, workers_.count());
  }
}

Status ServerImpl::AddDigests(flatbuffers::FlatBufferBuilder& fbb,
                              std::vector<flatbuffers::Offset<wire::Counter>>* out) {
  // A fifth of the I/O thread at most, however large the tables: after digests that took d, none
  // for 4 d.
  const Clock::time_point began = Clock::now();
  if (began < digests_since_) {
    return UnavailableError(
        Who() + " spends at most a fifth of its time on digests: ask again in " +
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(digests_since_ - began).count() + 1) +
        " ms");
  }
  auto add = [&](const std::string& name, uint64_t d) {
    out->push_back(wire::CreateCounter(fbb, fbb.CreateString(name), static_cast<int64_t>(d)));
  };
  tables_.ForEach([&](const ps::Table& t) { add("digest:" + t.spec.name, Digest(t)); });
  if (replicas_) {
    replicas_->ForEach([&](const ps::Table& t) {
      add("replica_digest:" + t.spec.name, Digest(t));
      if (out_of_step_.contains(t.id)) add("replica_out_of_step:" + t.spec.name, 1);
    });
  }
  const Clock::time_point ended = Clock::now();
  digests_since_ = ended + 4 * (ended - began);
  return Status::Ok();
}

Status ServerImpl::OnSnapshot(Request& req) {
  if (!Replicating()) {
    return FailedPreconditionError(Who() + " keeps no replica (replication 1): it has no image for a replacement");
  }
  const Header& h = *req.h();
  const int whose = h.server_rank();
  if (whose != options_.rank && whose != PrimaryRank()) {
    return InvalidArgumentError(Who() + " holds its own slots and its replica of server " +
                                std::to_string(PrimaryRank()) + "'s, not server " + std::to_string(whose) + "'s");
  }
  const Clock::time_point now = Clock::now();
  if (image_ && now >= image_->until) image_.reset();  // its replacement went away
  const int64_t position = h.position();
  if (position == 0 && h.epoch() == 0) {
    if (whose == PrimaryRank() && !out_of_step_.empty()) {
      // What it holds misses updates of its primary's: the replacement would lose them.
      std::string tables;
      replicas_->ForEach([&](const ps::Table& t) {
        if (out_of_step_.contains(t.id)) tables += (tables.empty() ? "'" : ", '") + t.spec.name + "'";
      });
      return FailedPreconditionError(Who() + "'s replica of server " + std::to_string(whose) + "'s slots is out of " +
                                     "step for table(s) " + tables + ": it cannot stand in for them (restart the job " +
                                     "from its checkpoint)");
    }
    // A new image, taken now: it holds every update applied here so far.
    ServedImage im;
    im.epoch = ++next_image_epoch_;
    im.rank = whose;
    const auto began = Clock::now();
    std::vector<ps::WorkerState> workers(static_cast<size_t>(workers_.count()));
    for (int w = 0; w < workers_.count(); ++w) {
      workers[static_cast<size_t>(w)] = {workers_.clock(w), workers_.finished(w), workers_.left(w)};
    }
    im.blob = ps::EncodeImage(whose == options_.rank ? tables_ : *replicas_, workers);
    im.covers = next_replicate_;
    if (whose == options_.rank) {
      im.incarnation = incarnation_;
    } else {
      // The replacement of the primary takes over from here: its predecessor's late updates are
      // refused (OnReplicate), and the replacement's incarnation is one more.
      im.incarnation = primary_incarnation_;
      replica_fence_ = primary_incarnation_ = std::max(primary_incarnation_, primary_incarnation_ + 1);  // (saturated)
    }
    std::fprintf(stderr, "ferry-ps %d: a replacement of server %d asked for %s (%zu bytes, copied in %.3f s)\n",
                 options_.rank, whose == options_.rank ? BackupRank() : whose,
                 whose == options_.rank ? "this server's slots, for its replica"
                                        : ("the replica of server " + std::to_string(whose) + "'s slots").c_str(),
                 im.blob.size(), std::chrono::duration<double>(Clock::now() - began).count());
    image_ = std::move(im);
  } else if (!image_ || image_->epoch != h.epoch() || image_->rank != whose) {
    return FailedPreconditionError(Who() + " no longer holds the image of epoch " + std::to_string(h.epoch()) +
                                   " (another was asked for since, or none for " + std::to_string(kImageKeep.count()) +
                                   " s): ask again from position 0");
  }
  ServedImage& im = *image_;
  if (position < 0 || static_cast<uint64_t>(position) > im.blob.size()) {
    return InvalidArgumentError("Snapshot: position " + std::to_string(position) + " outside the image's " +
                                std::to_string(im.blob.size()) + " bytes");
  }
  const int64_t most = std::clamp<int64_t>(h.max_bytes() > 0 ? h.max_bytes() : 16 << 20, 1, options_.max_message_bytes);
  const size_t n = static_cast<size_t>(std::min<int64_t>(most, static_cast<int64_t>(im.blob.size()) - position));
  flatbuffers::FlatBufferBuilder fbb(256);
  wire::HeaderBuilder b = BeginReply(fbb, Kind::Snapshot, h.request_id());
  b.add_version(static_cast<int64_t>(im.blob.size()));
  b.add_epoch(im.epoch);
  b.add_position(position);
  b.add_incarnation(im.incarnation);
  if (im.rank == options_.rank) b.add_covers(im.covers);
  b.add_num_workers(workers_.count());
  wire::FinishHeaderBuffer(fbb, b.Finish());
  Frames page;
  page.emplace_back(im.blob.data() + position, n);
  Send(req, wire::ToFrame(fbb), std::move(page));
  im.until = now + kImageKeep;
  if (static_cast<size_t>(position) + n == im.blob.size()) {
    if (im.rank == options_.rank) ConfirmTakenInImage(im.covers);
    image_.reset();
  }
  return Status::Ok();
}

void ServerImpl::ConfirmTakenInImage(uint64_t upto) {
  int64_t answered = 0;
  bool pulls = false;
  while (!awaiting_backup_.empty() && awaiting_backup_.begin()->first <= upto) {
    AwaitingBackup a = std::move(awaiting_backup_.begin()->second);
    awaiting_backup_.erase(awaiting_backup_.begin());
    pulls = SettleCloses(a) || pulls;
    if (!a.answers) continue;
    AnswerAwaited(a);
    pulls = pulls || a.then_pull;
    ++answered;
  }
  if (pulls) ServeHeld();
  if (answered > 0) {
    std::fprintf(stderr,
                 "ferry-ps %d: its backup's replacement took %lld update(s) that waited for the backup in this "
                 "server's image: their pushes are answered\n",
                 options_.rank, static_cast<long long>(answered));
  }
}

}  // namespace ferry::ps
