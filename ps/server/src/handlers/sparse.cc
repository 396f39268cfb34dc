// Handlers of sparse tables: PullSparse, PullSparseTables, PushSparse, PushSparseTables, and
// serving a sparse pull.
#include "internal/server_impl.h"

#include <algorithm>

#include "ferry/messages/codec.h"
#include "ferry/messages/placement.h"
#include "internal/finite.h"
#include "internal/sync.h"

namespace ferry::ps {

StatusOr<std::vector<ServerImpl::SparsePart>> ServerImpl::SparseParts(const Header& h) {
  const bool push = h.kind() == Kind::PushSparse || h.kind() == Kind::PushSparseTables;
  std::vector<SparsePart> parts;
  if (h.kind() == Kind::PullSparse || h.kind() == Kind::PushSparse) {
    FERRY_ASSIGN_OR_RETURN(ps::Table * t, FindSparse(h.table_id(), h.dim()));
    parts.push_back({t, 0, 1});
    return parts;
  }
  const size_t per = push ? 2 : 1;
  parts.reserve(h.sparse()->size());
  for (flatbuffers::uoffset_t i = 0; i < h.sparse()->size(); ++i) {
    const wire::SparseSlice& sl = *h.sparse()->Get(i);
    FERRY_ASSIGN_OR_RETURN(ps::Table * t, FindSparse(sl.table_id(), sl.dim()));
    for (const SparsePart& p : parts) {
      if (p.table == t) return InvalidArgumentError("table '" + t->spec.name + "' appears twice in one request");
    }
    parts.push_back({t, i * per, i * per + 1});
  }
  return parts;
}

Status ServerImpl::OnPushSparse(Request& req) {
  const Header& h = *req.h();
  const int rank = h.rank();
  FERRY_ASSIGN_OR_RETURN(const std::vector<SparsePart> parts, SparseParts(h));
  const size_t n = parts.size();
  std::vector<std::vector<int64_t>> id_scratch(n);
  std::vector<std::vector<float>> g_scratch(n);
  std::vector<std::span<const int64_t>> ids(n);
  std::vector<std::span<const float>> grads(n);
  for (size_t i = 0; i < n; ++i) {
    const ps::Table& t = *parts[i].table;
    Frames& pl = req.payload;
    ids[i] = View<int64_t>(pl[parts[i].ids_frame], id_scratch[i]);
    FERRY_RETURN_IF_ERROR(tables_.CheckIds(t, ids[i]));
    if (t.spec.wire != WireFormat::kF32) {  // 1.6: 16-bit rows become float32 here
      const int64_t values = static_cast<int64_t>(ids[i].size()) * t.spec.dim;
      zmq::message_t rows(static_cast<size_t>(values) * sizeof(float));
      wire::DecodeValues(t.spec.wire, pl[parts[i].grads_frame].data(), values, static_cast<float*>(rows.data()));
      pl[parts[i].grads_frame] = std::move(rows);
    }
    grads[i] = View<float>(pl[parts[i].grads_frame], g_scratch[i]);
    if (const int64_t bad = ps::FirstNonFinite(grads[i]); bad >= 0) {
      const int64_t row = bad / t.spec.dim;
      if (t.spec.nonfinite == NonFinite::kRefuse) {
        return RefuseNonFinite(t, "", "id " + std::to_string(ids[i][static_cast<size_t>(row)]), rank);
      }
      DropNonFiniteRows(t, ids[i], grads[i], rank, &pl[parts[i].ids_frame], &pl[parts[i].grads_frame]);
      ids[i] = View<int64_t>(pl[parts[i].ids_frame], id_scratch[i]);
      grads[i] = View<float>(pl[parts[i].grads_frame], g_scratch[i]);
    }
    FERRY_RETURN_IF_ERROR(Diverged(t));
    if (t.spec.consistency == Consistency::kSync) {
      FERRY_RETURN_IF_ERROR(ps::CheckSyncPush(t.spec, t.sparse->sync, t.sparse->version, rank, h.step()));
      FERRY_RETURN_IF_ERROR(CheckJoined(rank, h.step()));
    }
  }
  FERRY_RETURN_IF_ERROR(RoomForRows(parts, ids));
  FERRY_RETURN_IF_ERROR(RoomToForward(PayloadBytes(req.payload)));
  int64_t used = 0, dropped = 0, version = INT64_MAX;
  Status refused = Status::Ok();  // an update that would not be finite (the first)
  Forward fwd;                    // replication 2: what was applied, for the backup
  for (size_t i = 0; i < n; ++i) {
    ps::Table& t = *parts[i].table;
    ps::SparseShard& shard = *t.sparse;
    const int64_t rows = static_cast<int64_t>(ids[i].size());
    if (t.spec.consistency == Consistency::kSync) {
      if (h.step() < shard.version) {  // its step closed without this worker: late
        Count(kLateGradientsDropped);
        ++dropped;
        version = std::min(version, shard.version);
        continue;
      }
      if (ps::ResentHold(shard.sync, shard.version, rank, h.step())) {  // (as in ApplyPush: held already)
        Count(kReplayedUpdatesSkipped);
        ForwardHold(fwd, t, -1, shard.version, shard.sync, rank, false);
        ++used;
        version = std::min(version, shard.version);
        continue;
      }
      ps::HoldGradient(shard.sync, rank, std::move(req.payload[parts[i].ids_frame]),
                       std::move(req.payload[parts[i].grads_frame]));
      const bool closes = workers_.StepComplete(t.spec, shard.sync, shard.version);
      ForwardHold(fwd, t, -1, shard.version, shard.sync, rank, closes);
      if (closes) {
        if (Status s = CloseSyncStep(t); refused.ok()) refused = s;
      }
    } else if (shard.steps_taken.Replayed(rank, h.step())) {
      Count(kReplayedUpdatesSkipped);  // the worker's predecessor's push of this step was applied here
    } else {
      RecordStaleness(t, shard.version - shard.last_pulled[static_cast<size_t>(rank)]);
      SkipReplayedRows(t, h.step(), rank, &ids[i], &grads[i], &id_scratch[i], &g_scratch[i]);
      ps::NotFinite nf;
      try {
        nf = updater_.ApplyRows(shard, ids[i], grads[i].data());
      } catch (const ps::DiskTierError& e) {
        // Thrown before any row of this table changed. The push's other tables are applied (each
        // table's update is its own, as async pushes are), and the reply names this failure.
        Count(kDiskTierErrors);
        LogRateLimited(e.status().ToString() + "; worker " + std::to_string(rank) + "'s push to it refused");
        if (refused.ok()) refused = e.status();
        continue;
      } catch (const ps::BudgetExceeded& e) {
        if (refused.ok()) refused = ResourceExhaustedError("server " + std::to_string(options_.rank) + ": " + e.what());
        continue;
      }
      ++shard.version;
      shard.steps_taken.Took(rank, h.step());
      Count(kUpdatesApplied);
      if (Replicating()) {
        fwd.versions.push_back(shard.version - 1);  // (before this update)
        fwd.ops.push_back(kApplied);
        fwd.counts.push_back(0);
        fwd.sparse.emplace_back(t.id, t.spec.dim, static_cast<int64_t>(ids[i].size()));
        fwd.frames.push_back(Applied(req.payload[parts[i].ids_frame], std::as_bytes(ids[i])));
        fwd.frames.push_back(Applied(req.payload[parts[i].grads_frame], std::as_bytes(grads[i])));
      }
      if (nf.any()) {  // every table's refusal is noted; the reply names the first
        Status s = NotFiniteUpdate(t, nf, 0, "worker " + std::to_string(rank) + "'s push");
        if (refused.ok()) refused = std::move(s);
      }
    }
    ++used;
    ++t.counters.push_requests;
    t.counters.rows_pushed += rows;
    version = std::min(version, shard.version);
  }
  CountPush(rank, used, dropped);
  AnswerPush(req, std::move(fwd), std::move(refused), {.version = version, .used = used, .dropped = dropped},
             /*then_pull=*/false);
  ServeHeld();
  return Status::Ok();
}

void ServerImpl::SkipReplayedRows(const ps::Table& t, int64_t step, int rank, std::span<const int64_t>* ids,
                                  std::span<const float>* grads, std::vector<int64_t>* id_scratch,
                                  std::vector<float>* g_scratch) {
  if (!t.replay || step >= t.replay->until[static_cast<size_t>(rank)]) [[likely]] return;
  const ps::Table::Replay& r = *t.replay;
  const size_t dim = static_cast<size_t>(t.spec.dim);
  std::vector<int64_t> kept_ids;
  std::vector<float> kept;
  for (size_t i = 0; i < ids->size(); ++i) {
    const int64_t id = (*ids)[i];
    if (step < r.Floor(r.IdServer(id), rank)) {
      Count(kReplayedUpdatesSkipped);
      continue;
    }
    kept_ids.push_back(id);
    kept.insert(kept.end(), grads->begin() + static_cast<std::ptrdiff_t>(i * dim),
                grads->begin() + static_cast<std::ptrdiff_t>((i + 1) * dim));
  }
  if (kept_ids.size() == ids->size()) return;
  *id_scratch = std::move(kept_ids);
  *g_scratch = std::move(kept);
  *ids = *id_scratch;
  *grads = *g_scratch;
}

Status ServerImpl::RoomForRows(std::span<const SparsePart> parts, std::span<const std::span<const int64_t>> ids) {
  ps::MemoryBudget& budget = tables_.budget();
  const int64_t left = budget.limit() - budget.used();
  int64_t most = 0;  // bytes if every id were new: the cheap bound, enough almost always
  for (size_t i = 0; i < parts.size(); ++i) {
    most += static_cast<int64_t>(ids[i].size()) * parts[i].table->sparse->RowBytes();
  }
  if (most <= left) return Status::Ok();
  int64_t need = 0, fresh = 0, named = 0;
  std::string tables;
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t rows = parts[i].table->sparse->NewRows(ids[i]);
    if (rows == 0) continue;
    need += rows * parts[i].table->sparse->RowBytes();
    fresh += rows;
    tables.append(named++ == 0 ? "'" : ", '").append(parts[i].table->spec.name).append("'");
  }
  // No new row is always room, even with the budget forced past its limit by a sync step; a
  // table with lifecycle settings asks for none: it evicts or drops instead.
  if (fresh == 0 || need <= left) return Status::Ok();
  budget.CountRefusal();
  const std::string why = budget.Refusal(
      need, std::to_string(fresh) + " new rows of sparse table" + (named > 1 ? "s " : " ") + tables);
  LogRateLimited(why + "; refused");
  return ResourceExhaustedError(why);
}

void ServerImpl::DropNonFiniteRows(const ps::Table& t, std::span<const int64_t> ids, std::span<const float> grads,
                                   int rank, zmq::message_t* id_frame, zmq::message_t* grad_frame) {
  const size_t dim = static_cast<size_t>(t.spec.dim);
  std::vector<int64_t> kept_ids;
  std::vector<float> kept;
  kept_ids.reserve(ids.size());
  kept.reserve(grads.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    const auto row = grads.subspan(r * dim, dim);
    if (ps::FirstNonFinite(row) >= 0) continue;
    kept_ids.push_back(ids[r]);
    kept.insert(kept.end(), row.begin(), row.end());
  }
  const int64_t skipped = static_cast<int64_t>(ids.size() - kept_ids.size());
  Count(kNonFiniteRowsSkipped, skipped);
  LogRateLimited("table '" + t.spec.name + "': " + std::to_string(skipped) + " row(s) of a push from worker " +
                 std::to_string(rank) + " hold NaN or Inf; skipped (nonfinite=skip_rows)");
  *id_frame = zmq::message_t(kept_ids.data(), kept_ids.size() * sizeof(int64_t));
  *grad_frame = zmq::message_t(kept.data(), kept.size() * sizeof(float));
}

StatusOr<ps::Table*> ServerImpl::FindSparse(uint64_t table_id, int64_t dim) {
  FERRY_ASSIGN_OR_RETURN(ps::Table * t, tables_.Find(table_id, TableType::kSparse));
  if (dim != t->spec.dim) {
    return InvalidArgumentError("table '" + t->spec.name + "' has dim " + std::to_string(t->spec.dim) +
                                ", the request says " + std::to_string(dim));
  }
  return t;
}

Status ServerImpl::OnPullSparse(Request& req) {
  const Header& h = *req.h();
  FERRY_ASSIGN_OR_RETURN(const std::vector<SparsePart> parts, SparseParts(h));
  std::vector<std::vector<int64_t>> scratch(parts.size());
  std::vector<std::span<const int64_t>> ids(parts.size());
  int64_t reply_bytes = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const ps::Table& t = *parts[i].table;
    ids[i] = View<int64_t>(req.payload[parts[i].ids_frame], scratch[i]);
    reply_bytes += static_cast<int64_t>(ids[i].size()) * t.spec.dim * static_cast<int64_t>(sizeof(float));
    if (reply_bytes > options_.max_message_bytes) {
      return ResourceExhaustedError("table '" + t.spec.name + "': the " + std::to_string(ids[i].size()) +
                                    " rows of dim " + std::to_string(t.spec.dim) +
                                    " asked for bring the reply past this server's message limit of " +
                                    std::to_string(options_.max_message_bytes) + " bytes");
    }
    FERRY_RETURN_IF_ERROR(tables_.CheckIds(t, ids[i]));
  }
  FERRY_RETURN_IF_ERROR(RoomForRows(parts, ids));
  req.pull_step = h.step();
  HoldOrServe(std::move(req));
  return Status::Ok();
}

bool ServerImpl::TryServeSparse(Request& req) {
  const Header& h = *req.h();
  auto parts = SparseParts(h);  // tables cannot be dropped: what resolved on arrival still does
  if (!parts.ok()) return SendError(req, parts.status()), true;
  for (const SparsePart& p : *parts) {
    if (Status s = DiskFailed(*p.table); !s.ok()) return SendError(req, s), true;
    if (!workers_.Ready(p.table->spec, Settled(p.table->sparse->version, p.table->sparse->sync), req.pull_step)) {
      return false;
    }
  }
  req.released = Clock::now();
  req.info.held_us = req.waited_us();  // the wait, not the copies below
  const size_t n = parts->size();
  std::vector<std::vector<int64_t>> scratch(n);
  std::vector<std::span<const int64_t>> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = View<int64_t>(req.payload[(*parts)[i].ids_frame], scratch[i]);
  // Checked on arrival; a held pull may find the budget spent since.
  if (Status s = RoomForRows(*parts, ids); !s.ok()) return SendError(req, s), true;
  Frames payload;
  payload.reserve(n);
  std::vector<ps::Updater::RowRead> reads;
  reads.reserve(n);
  std::vector<std::vector<float>> wide(n);  // compressed tables' rows as float32, before encoding
  for (size_t i = 0; i < n; ++i) {
    ps::SparseShard& shard = *(*parts)[i].table->sparse;
    const WireFormat w = (*parts)[i].table->spec.wire;
    const size_t values = ids[i].size() * static_cast<size_t>(shard.dim());
    payload.emplace_back(values * static_cast<size_t>(wire::ValueBytes(w)));
    float* dst = static_cast<float*>(payload.back().data());
    if (w != WireFormat::kF32) {
      wide[i].resize(values);
      dst = wide[i].data();
    }
    reads.push_back({&shard, ids[i], dst});
  }
  try {
    updater_.ReadRows(reads);  // with a disk tier, its rows on disk are read back first
  } catch (const ps::DiskTierError& e) {
    Count(kDiskTierErrors);
    LogRateLimited(e.status().ToString() + "; a pull refused");
    return SendError(req, e.status()), true;
  } catch (const ps::BudgetExceeded& e) {
    return SendError(req, ResourceExhaustedError("server " + std::to_string(options_.rank) + ": " + e.what())), true;
  }
  for (size_t i = 0; i < n; ++i) {
    const WireFormat w = (*parts)[i].table->spec.wire;
    if (w == WireFormat::kF32) continue;
    const int64_t saturated =
        wire::EncodeValues(w, wide[i].data(), static_cast<int64_t>(wide[i].size()), payload[i].data());
    if (saturated > 0) CountSaturated((*parts)[i].table->spec, saturated);
  }
  int64_t version = INT64_MAX;
  for (size_t i = 0; i < n; ++i) {
    ps::Table& t = *(*parts)[i].table;
    ps::SparseShard& shard = *t.sparse;
    ++t.counters.pull_requests;
    t.counters.rows_pulled += static_cast<int64_t>(ids[i].size());
    t.counters.hot.Add(ids[i]);
    version = std::min(version, shard.version);
  }
  req.info.version = version;
  Send(req, wire::MakeReply(h.request_id(), h.kind(), req.info), std::move(payload));
  const size_t rank = static_cast<size_t>(h.rank());
  for (const SparsePart& p : *parts) p.table->sparse->last_pulled[rank] = p.table->sparse->version;
  return true;
}

}  // namespace ferry::ps
