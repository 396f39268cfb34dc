// Handlers of Hello (the handshake), Stats and Waiting, and the server's counters and metrics page.
#include "internal/server_impl.h"

#include <algorithm>
#include <cstdio>

#include "ferry/messages/placement.h"
#include "ferry/messages/wire.h"
#include "internal/sync.h"

namespace ferry::ps {

Status ServerImpl::StartMetrics() {
  if (options_.metrics_bind.empty()) return Status::Ok();
  auto http = metrics::HttpEndpoint::Start(options_.metrics_bind, [this] { return MetricsPage(); });
  if (!http.ok()) return http.status().WithContext("ferry-ps rank " + std::to_string(options_.rank));
  metrics_http_ = std::move(*http);
  metrics_url_ = metrics_http_->url();
  return Status::Ok();
}

ServerStats ServerImpl::stats() const {
  ServerStats s;
  for (int i = 0; i < kNumCounters; ++i) s.counters[kCounterNames[i]] = counters_[i].load();
  for (auto& b : staleness_) s.staleness_histogram.push_back(b.load());
  // The memory budget (atomics, safe from any thread): refusals count up; the other two are
  // levels, not counters.
  const ps::MemoryBudget& budget = tables_.budget();
  s.counters["memory_budget_refused"] = budget.refusals();
  s.counters["memory_budget_bytes"] = budget.limit();
  s.counters["memory_budget_used_bytes"] = budget.used();
  if (replicas_) {  // (replication 2: the replica's half of the budget)
    s.counters["replica_memory_budget_bytes"] = replicas_->budget().limit();
    s.counters["replica_memory_budget_used_bytes"] = replicas_->budget().used();
  }
  s.counters["held_payload_bytes"] = held_payloads_.used();
  s.counters["held_payload_limit_bytes"] = held_payloads_.limit();
  s.counters["connections_open"] = connections_open_.load(std::memory_order_relaxed);
  s.counters["unfinished_message_bytes"] = unfinished_bytes_.load(std::memory_order_relaxed);
  s.counters["tables_being_created"] = tables_being_created_.load(std::memory_order_relaxed);
  s.counters["compute_threads"] = pool_.helpers();  // a level: the helper threads it runs
  // The sparse tables' row lifecycle, summed over tables (per table: the metrics page).
  const ps::RowLifecycleTotals& rows = tables_.lifecycle();
  s.counters["rows_admitted"] = rows.admitted.load(std::memory_order_relaxed);
  s.counters["rows_not_admitted"] = rows.not_admitted.load(std::memory_order_relaxed);
  s.counters["rows_evicted_age"] = rows.evicted_age.load(std::memory_order_relaxed);
  s.counters["rows_evicted_capacity"] = rows.evicted_capacity.load(std::memory_order_relaxed);
  s.counters["rows_demoted"] = rows.demoted.load(std::memory_order_relaxed);
  s.counters["rows_promoted"] = rows.promoted.load(std::memory_order_relaxed);
  if (disk_tier_) {  // the store's own counts (its atomics: any thread)
    const ps::DiskTier::Stats d = disk_tier_->stats();
    s.counters["disk_tier_reads"] = d.reads;
    s.counters["disk_tier_rows_asked"] = d.rows_asked;
    s.counters["disk_tier_rows_found"] = d.rows_found;
    s.counters["disk_tier_rows_written"] = d.rows_written;
    s.counters["disk_tier_rows_erased"] = d.rows_erased;
    s.counters["disk_tier_rows_read_inline"] = rows.read_inline.load(std::memory_order_relaxed);
    s.counters["disk_tier_requests_waiting"] = disk_waiting_.load(std::memory_order_relaxed);
    s.counters["disk_tier_rows_kept"] = rows.read_ahead_kept.load(std::memory_order_relaxed);
  }
  // Per worker, only where non-zero: a job of many workers keeps its Stats reply small.
  MutexLock lock(&by_rank_mu_);
  for (size_t r = 0; r < used_by_rank_.size(); ++r) {
    if (used_by_rank_[r] != 0) s.counters["gradients_used_rank_" + std::to_string(r)] = used_by_rank_[r];
    if (dropped_by_rank_[r] != 0) s.counters["gradients_dropped_rank_" + std::to_string(r)] = dropped_by_rank_[r];
  }
  return s;
}

Status ServerImpl::OnHello(Request& req) {
  const Header& h = *req.h();
  if (h.num_servers() != options_.num_servers || h.server_rank() != options_.rank) {
    return FailedPreconditionError(
        "cluster mismatch: the client expects server rank " + std::to_string(h.server_rank()) + " of " +
        std::to_string(h.num_servers()) + " at " + endpoint_ + ", but this is server rank " +
        std::to_string(options_.rank) + " of " + std::to_string(options_.num_servers));
  }
  if (!placement::PlacesAlike(h.minor(), options_.num_servers)) {
    return FailedPreconditionError("placement mismatch: a client of protocol 1." + std::to_string(h.minor()) +
                                   " places ids and chunks by the rule before 1.16's slots, which for a job of " +
                                   std::to_string(options_.num_servers) +
                                   " servers puts them elsewhere: upgrade the client to this server's 1." +
                                   std::to_string(wire::kMinor));
  }
  // A client before 1.17 places by the job's first map and cannot follow another: once slots
  // have moved it is refused (while one is connected, a hand-over is: OnPlacement).
  if (h.minor() < wire::kPlacementVersionsSinceMinor &&
      tables_.placement().Owners() != placement::Placement::First(options_.num_servers).Owners()) {
    return FailedPreconditionError("placement mismatch: a client of protocol 1." + std::to_string(h.minor()) +
                                   " places ids and chunks by the job's first map, and this job's servers moved them "
                                   "(placement version " + std::to_string(tables_.placement().version()) +
                                   "): upgrade the client to this server's 1." + std::to_string(wire::kMinor));
  }
  // A client before 1.20 takes a map of the server's version only when it is newer than its own
  // first one: the first map of a job whose first servers are fewer than its ranks it would not.
  if (h.minor() < wire::kMembersSinceMinor && tables_.placement().version() == 1 &&
      tables_.placement().ActiveServers() < options_.num_servers) {
    return FailedPreconditionError("placement mismatch: a client of protocol 1." + std::to_string(h.minor()) +
                                   " places ids and chunks by a first map of all " +
                                   std::to_string(options_.num_servers) + " servers, and this job's gives slots to " +
                                   std::to_string(tables_.placement().ActiveServers()) +
                                   " (ferry-ps --active-servers): upgrade the client to this server's 1." +
                                   std::to_string(wire::kMinor));
  }
  if (h.joins_at() < 0 || h.joins_at() > ps::kMaxStep) {
    return InvalidArgumentError("Hello: joins_at " + std::to_string(h.joins_at()) + " is outside [0, 2^62]");
  }
  // 1.27: a new process of a worker that left, waiting to join again: out of the job's steps and
  // collectives (it stays left) until server 0 hands its join (OnMoveAsk, Complete). Only for a
  // worker that left: a worker that waits would otherwise drop out of the job with its share of
  // the examples unread.
  const bool waits_to_rejoin = h.joins_at() == wire::kWaitsToRejoin;
  if (waits_to_rejoin && !workers_.left(h.rank())) {
    return FailedPreconditionError("worker " + std::to_string(h.rank()) +
                                   " says it waits to join the job again (--rejoin), but " +
                                   (workers_.count() == 0 ? std::string("no worker has said Hello yet")
                                                          : "it has not left the job") +
                                   " as " + Who() + " knows");
  }
  // Before Join: a Hello refused for speaking for a live worker, or from a replaced incarnation
  // of it, changes nothing of it. A later incarnation takes the rank over from whichever
  // connection has it: the launcher restarted the worker, so its predecessor is gone or fenced.
  const int num_workers = workers_.count() > 0 ? workers_.count() : h.num_workers();
  bool took_over = false;
  const uint32_t was = workers_.incarnation(h.rank());
  if (h.rank() >= 0 && h.rank() < num_workers) {
    FERRY_RETURN_IF_ERROR(workers_.CheckJoin(h.rank(), h.num_workers()));  // (a bad Hello takes nothing over)
    FERRY_RETURN_IF_ERROR(CheckIncarnation(req, h.rank()));
    took_over = h.incarnation() > was;
    FERRY_RETURN_IF_ERROR(ClaimRank(req, h.rank(), took_over));
  }
  const bool count_from_worker = workers_.count() == 0;  // no --num-workers, no worker yet
  // 1.22: the same process, to a replacement: what its peers said of it stays (finished, left).
  const bool rejoins = h.rejoins() && h.rank() >= 0 && h.rank() < workers_.count();
  const bool was_finished = rejoins && workers_.finished(h.rank()), was_left = rejoins && workers_.left(h.rank());
  // The ranks whose `step_of` is known (0 or more), with those steps: for the reply.
  auto with_steps = [this](int64_t (Workers::*step_of)(int) const, std::vector<int32_t>& ranks,
                           std::vector<int64_t>& steps) {
    for (int w = 0; w < workers_.count(); ++w) {
      if (const int64_t at = (workers_.*step_of)(w); at >= 0) {
        ranks.push_back(w);
        steps.push_back(at);
      }
    }
  };
  // 1.26: the workers that leave or left with a known step (a restarted worker reads their shares
  // of each step from it on, as the workers that saw the leave do; a new process of a worker that
  // left learns it did); 1.27: the workers handed their join again, with their steps (server 0: a
  // worker restarted later splits the examples as the others do).
  std::vector<int32_t> left_ranks, rejoin_ranks;
  std::vector<int64_t> left_at_steps, rejoin_steps;
  with_steps(&Workers::left_at, left_ranks, left_at_steps);
  with_steps(&Workers::rejoins_at, rejoin_ranks, rejoin_steps);
  FERRY_RETURN_IF_ERROR(workers_.Join(h.rank(), h.num_workers(), h.incarnation(), h.joins_at()));
  if (was_left || waits_to_rejoin) {
    workers_.Leave(h.rank());  // (its step, left_at, stays: a Hello does not clear it)
  } else if (was_finished) {
    workers_.Finish(h.rank());
  }
  if (h.resumes() && h.rank() >= 0 && h.rank() < workers_.count()) {
    // The new process resumes at the lowest step any server knew: what this server took of its
    // predecessor's later steps is not applied again (ps::StepsTaken).
    tables_.ForEach([&](ps::Table& t) {
      if (t.spec.consistency == Consistency::kSync) return;
      if (t.sparse) t.sparse->steps_taken.Restarted(h.rank());
      if (t.dense) {
        for (int64_t c = 0; c < t.dense->num_chunks(); ++c) {
          if (ps::DenseChunk* chunk = t.dense->chunk(c)) chunk->steps_taken.Restarted(h.rank());
        }
      }
    });
  }
  if (took_over) {
    LogRateLimited("worker " + std::to_string(h.rank()) + " says Hello as its incarnation " +
                   std::to_string(h.incarnation()) + " (was " + std::to_string(was) + ") from " +
                   connections_.PeerOf(req.fd) + ": the rank is its; requests of earlier incarnations are refused");
  }
  if (count_from_worker) {
    std::fprintf(stderr,
                 "ferry-ps %d: the job has %d worker%s, as worker %d (the first to connect) says; without "
                 "--num-workers this server keeps that count for the rest of its life\n",
                 options_.rank, workers_.count(), workers_.count() == 1 ? "" : "s", h.rank());
  }
  workers_.Promise(h.rank(), h.heartbeat_ms(), req.arrived);
  {
    MutexLock lock(&by_rank_mu_);
    if (used_by_rank_.empty()) {
      used_by_rank_.assign(static_cast<size_t>(workers_.count()), 0);
      dropped_by_rank_.assign(static_cast<size_t>(workers_.count()), 0);
    }
  }
  // A rank that connects again is a new process of that worker (the old one died). A gradient the
  // old one pushed for a sync step still open stays held, marked as sent already: the new process,
  // which resumes at the servers' step, pushes that step again, and its push is taken for the same
  // one sent again (ResentHold), not a second. Dropped instead, the step could close on one server
  // with the old gradient (another worker's push coming before this Hello) and stay open on
  // another, where the new process's gradient would be computed from the first's next step.
  // (Not one that rejoins, 1.22: the same process, whose pushes a replacement holds from its image.)
  if (!rejoins) {
    ForEachSyncUnit([&](ps::Table&, int64_t, int64_t, ps::SyncSlots& sync) { ps::MarkSent(sync, h.rank()); });
  }
  collectives_.Forget(h.rank());
  // 1.18: a worker that joins at a later step is not waited for before it; a step that waited
  // only for it (servers restored before its Hello) closes now. (A refused update was logged
  // and marked its table; the step's pushes learn of it from the table.)
  if (h.joins_at() > 0) {
    if (Status s = CloseCompleteSteps(); !s.ok()) LogRateLimited(s.message());
    ServeHeld();
  }
  for (ps::HeldCalls::Call& c : calls_.TakeRank(h.rank())) {
    FailCall(std::move(c), AbortedError("worker " + std::to_string(h.rank()) + " said Hello again (a new process)"));
  }
  // The reply tells the client where the job is: the step of the checkpoint this server started
  // from, and (server 0) the id the next collective takes.
  flatbuffers::FlatBufferBuilder fbb(12 * 1024);
  auto owners = PlacementVector(fbb);  // 1.17: the map requests are placed by (10 KiB)
  const auto left_ranks_vec = left_ranks.empty() ? 0 : fbb.CreateVector(left_ranks);
  const auto left_at_vec = left_ranks.empty() ? 0 : fbb.CreateVector(left_at_steps);
  const auto rejoin_ranks_vec = rejoin_ranks.empty() ? 0 : fbb.CreateVector(rejoin_ranks);
  const auto rejoin_at_vec = rejoin_ranks.empty() ? 0 : fbb.CreateVector(rejoin_steps);
  wire::HeaderBuilder b = BeginReply(fbb, Kind::Hello, h.request_id());
  if (!left_ranks.empty()) {
    b.add_left_ranks(left_ranks_vec);
    b.add_left_at(left_at_vec);
  }
  if (!rejoin_ranks.empty()) {
    b.add_rejoin_ranks(rejoin_ranks_vec);
    b.add_rejoin_at(rejoin_at_vec);
    if (rejoin_barrier_ >= collectives_.next_id()) b.add_rejoin_barrier(rejoin_barrier_);
  }
  b.add_placement_version(tables_.placement().version());
  b.add_placement(owners);
  b.add_version(std::max<int64_t>(restored_step_, 0));
  b.add_next_collective(collectives_.next_id());
  b.add_worker_step(WorkerStepKnown(h.rank()));
  b.add_worker_step_restored(restored_step_ >= 0 && !workers_.pushed(h.rank()));
  b.add_epoch(process_epoch_);              // 1.22: this process (a replacement is another)
  if (Replicating()) b.add_replication(2);  // 1.22: a client that loses this server waits for its replacement
  wire::FinishHeaderBuffer(fbb, b.Finish());
  Send(req, wire::ToFrame(fbb));
  return Status::Ok();
}

std::vector<DenseUpdates> ServerImpl::dense_updates() const {
  MutexLock lock(&stop_mu_);
  if (thread_.joinable() || !stopping_.load()) return {};  // (the I/O thread owns the tables)
  std::vector<DenseUpdates> out;
  tables_.ForEach([&](const ps::Table& t) {
    if (!t.dense) return;
    DenseUpdates d{t.spec.name, 0, 0, 0};
    for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
      const ps::DenseChunk* c = t.dense->chunk(i);
      if (c == nullptr) continue;
      d.least = d.chunks == 0 ? c->version : std::min(d.least, c->version);
      d.most = std::max(d.most, c->version);
      ++d.chunks;
    }
    if (d.chunks > 0) out.push_back(std::move(d));
  });
  return out;
}

Status ServerImpl::OnStats(Request& req) {
  ServerStats s = stats();
  flatbuffers::FlatBufferBuilder fbb(1024);
  std::vector<flatbuffers::Offset<wire::Counter>> cs;
  for (auto& [name, value] : s.counters) cs.push_back(wire::CreateCounter(fbb, fbb.CreateString(name), value));
  for (size_t i = 0; i < s.staleness_histogram.size(); ++i) {
    cs.push_back(wire::CreateCounter(fbb, fbb.CreateString("staleness_" + std::to_string(i)),
                                     s.staleness_histogram[i]));
  }
  if (req.h()->digests()) FERRY_RETURN_IF_ERROR(AddDigests(fbb, &cs));
  auto vec = fbb.CreateVector(cs);
  wire::HeaderBuilder b = BeginReply(fbb, Kind::Stats, req.h()->request_id());
  b.add_counters(vec);
  wire::FinishHeaderBuffer(fbb, b.Finish());
  Send(req, wire::ToFrame(fbb));
  return Status::Ok();
}

Status ServerImpl::OnWaiting(Request& req) {
  const int rank = req.h()->rank();
  std::vector<std::string> clauses;
  held_.ForEach([&](const Request& r) {
    if (r.h()->rank() != rank) return;
    std::string clause = std::string(wire::KindName(r.h()->kind())) + ": " + WaitingOn(r).what;
    if (std::find(clauses.begin(), clauses.end(), clause) == clauses.end()) clauses.push_back(std::move(clause));
  });
  for (std::string& c : collectives_.Describe(rank, workers_.TakingPart())) clauses.push_back(std::move(c));
  std::string text;
  for (const std::string& c : clauses) text += (text.empty() ? "" : "; ") + c;
  flatbuffers::FlatBufferBuilder fbb(128 + text.size());
  auto waiting = fbb.CreateString(text);
  wire::HeaderBuilder b = BeginReply(fbb, Kind::Waiting, req.h()->request_id());
  b.add_waiting(waiting);
  wire::FinishHeaderBuffer(fbb, b.Finish());
  Send(req, wire::ToFrame(fbb));
  return Status::Ok();
}

std::optional<std::string> ServerImpl::MetricsPage() {
  MutexLock lock(&metrics_mu_);
  if (metrics_closed_) return std::nullopt;
  const uint64_t ticket = ++metrics_asked_;
  waker_.Notify();
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (metrics_answered_ < ticket) {
    if (metrics_closed_) return std::nullopt;
    if (!metrics_cv_.WaitUntil(&metrics_mu_, deadline) && metrics_answered_ < ticket) return std::nullopt;
  }
  return metrics_page_;
}

void ServerImpl::AnswerMetrics() {
  uint64_t asked = 0;
  {
    MutexLock lock(&metrics_mu_);
    asked = metrics_asked_;
    if (asked == metrics_answered_) return;
  }
  std::vector<ps::TableMetrics> tables;
  tables_.ForEach([&](const ps::Table& t) {
    ps::TableMetrics m;
    m.name = t.spec.name;
    m.sparse = t.sparse != nullptr;
    m.has_staleness = t.spec.consistency != Consistency::kSync;
    if (t.sparse) {
      m.rows = static_cast<int64_t>(t.sparse->size());
      m.bytes = t.sparse->HeldBytes();
      m.lifecycle = t.sparse->lifecycle();
      if (t.sparse->has_disk()) {
        m.disk_tier = true;
        m.disk_rows = disk_tier_->EstimatedRows(t.id);
        m.disk_bytes = disk_tier_->FileBytes(t.id);
      }
    } else if (t.dense) {
      for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
        if (const ps::DenseChunk* c = t.dense->chunk(i)) {
          m.rows += c->size;
          m.bytes += static_cast<int64_t>((c->params.size() + c->state.size()) * sizeof(float));
        }
      }
    }
    m.counters = t.counters;
    tables.push_back(std::move(m));
  });
  std::sort(tables.begin(), tables.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::optional<ps::DiskTier::Stats> disk;
  if (disk_tier_) disk = disk_tier_->stats();
  std::string page = ps::ServerMetricsText(options_.rank, stats(), latencies_, tables, disk ? &*disk : nullptr);
  MutexLock lock(&metrics_mu_);
  metrics_page_ = std::move(page);
  metrics_answered_ = asked;
  metrics_cv_.SignalAll();
}

}  // namespace ferry::ps
