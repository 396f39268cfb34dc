// The serving core: replies (every answer goes through Send), requests held until they can be
// served or expire, sync steps closed once their quorum is in, and what a held request waits for
// when a worker falls silent. Handlers (handlers/*.cc) call these; server.cc's loop drives the
// expiry and liveness checks.
#include "internal/server_impl.h"

#include <algorithm>
#include <cstdio>

#include "internal/sync.h"

namespace ferry::ps {

void ServerImpl::Send(Request& req, zmq::message_t header, Frames payload) {
  Frames out;
  out.reserve(2 + payload.size());
  zmq::message_t routing;
  routing.copy(req.routing);
  out.push_back(std::move(routing));
  out.push_back(std::move(header));
  for (auto& p : payload) out.push_back(std::move(p));
  ObserveLatency(req);
  // Answered: what the request held counts against the bounds no more. Released before the reply
  // leaves, so that whoever reads the gauges after the reply (a test did, under load) sees it.
  req.held_bytes = {};
  req.held_by_peer = {};
  int64_t bytes = 0;
  for (auto& f : out) bytes += static_cast<int64_t>(f.size());
  Count(kBytesOut, bytes);
  // Never blocks (ZMQ_ROUTER_MANDATORY, dontwait). A peer that went away simply does not get
  // its reply; one with kReplyQueue replies unread (it sends without reading) loses this one,
  // counted and logged, instead of the server waiting on it.
  // (transport::Send: RESOURCE_EXHAUSTED for a full queue, UNAVAILABLE for an unknown peer.)
  if (transport::Send(sockets_[kMain], out, /*dontwait=*/true).code() == StatusCode::kResourceExhausted) {
    Count(kRepliesDropped);
    LogRateLimited("dropped a reply to " + connections_.PeerOf(req.fd) + ": " + std::to_string(kReplyQueue) +
                   " replies to it are queued unread already");
  }
}

void ServerImpl::ObserveLatency(const Request& req) {
  const Header* h = req.h();
  if (h == nullptr) return;  // too malformed to name its kind
  const Clock::time_point now = Clock::now();
  Clock::duration service = now - req.arrived;
  double held_s = -1;
  if (req.held) {
    const Clock::duration held = (req.released == Clock::time_point{} ? now : req.released) - req.wait_from;
    service -= held;
    held_s = std::chrono::duration<double>(held).count();
  }
  latencies_.Observe(h->kind(), std::chrono::duration<double>(service).count(), held_s);
}

void ServerImpl::SendError(Request& req, const Status& s) {
  Count(kErrorsSent);
  const uint64_t id = req.h() ? req.h()->request_id() : 0;
  const Kind kind = req.h() ? req.h()->kind() : Kind::Invalid;
  Send(req, wire::MakeError(id, kind, s));
}

wire::HeaderBuilder ServerImpl::BeginReply(flatbuffers::FlatBufferBuilder& fbb, Kind request_kind,
                                           uint64_t request_id) {
  wire::HeaderBuilder b(fbb);
  b.add_major(wire::kMajor);
  b.add_minor(wire::kMinor);
  b.add_kind(Kind::Reply);
  b.add_request_kind(request_kind);
  b.add_request_id(request_id);
  return b;
}

void ServerImpl::CountPush(int rank, int64_t used, int64_t dropped) {
  MutexLock lock(&by_rank_mu_);
  // One push message is one gradient of this worker: used if any of its parts counted.
  if (used > 0) {
    ++used_by_rank_[static_cast<size_t>(rank)];
  } else if (dropped > 0) {
    ++dropped_by_rank_[static_cast<size_t>(rank)];
  }
}

void ServerImpl::RecordStaleness(ps::Table& t, int64_t staleness) {
  const size_t bucket = static_cast<size_t>(std::clamp<int64_t>(staleness, 0, kStalenessBuckets - 1));
  staleness_[bucket].fetch_add(1, std::memory_order_relaxed);
  t.counters.RecordStaleness(staleness);
}

void ServerImpl::CountSaturated(const TableSpec& spec, int64_t n) {
  Count(kWireValuesSaturated, n);
  LogRateLimited("table '" + spec.name + "': " + std::to_string(n) + " value(s) of a pull beyond " +
                 std::string(WireFormatName(spec.wire)) + "'s range sent as its largest (saturated)");
}

Status ServerImpl::RefuseNonFinite(const ps::Table& t, const std::string& part, const std::string& where, int rank) {
  Count(kNonFinitePushesRefused);
  const std::string what = "table '" + t.spec.name + "'" + part + ": the gradient of worker " + std::to_string(rank) +
                           " holds NaN or Inf (" + where + ")";
  LogRateLimited(what + "; refused");
  return InvalidArgumentError(what + ": server " + std::to_string(options_.rank) +
                              " refuses the push and applies nothing of it (parts sent to other servers are theirs "
                              "to check)");
}

void ServerImpl::LogRateLimited(const std::string& line) {
  const auto now = Clock::now();
  if (now - last_log_ < std::chrono::seconds(1)) {
    ++logs_held_back_;
    return;
  }
  // One write of the whole line: the main thread prints to stdout on the same pipe (a launcher's
  // task merges them), and a line written in pieces let "listening on" land inside this one.
  // A pipe keeps a write whole up to PIPE_BUF (4096) bytes: a longer line (a peer's message in it)
  // is cut. A newline a peer's text brings is written as \n: one line stays one line.
  constexpr size_t kMaxLine = 3800;
  std::string text = "ferry-ps " + std::to_string(options_.rank) + ": ";
  for (char c : wire::Printable(line)) {
    if (c == '\n') {
      text += "\\n";
    } else {
      text += c;
    }
  }
  if (text.size() > kMaxLine) text.resize(kMaxLine), text += " [...]";
  if (logs_held_back_ > 0) text += " (and " + std::to_string(logs_held_back_) + " similar line(s) held back)";
  text += '\n';
  std::fwrite(text.data(), 1, text.size(), stderr);
  last_log_ = now;
  logs_held_back_ = 0;
}

Status ServerImpl::CloseSyncStep(ps::Table& t, ps::DenseChunk& c) {
  const int64_t step = c.version;
  const ps::NotFinite refused = ps::CloseSyncStep(updater_, t.spec, c, workers_.count());
  c.feed_seq = t.dense->feed_clock;
  Count(kUpdatesApplied);
  if (!refused.any()) [[likely]] return Status::Ok();
  return NotFiniteUpdate(t, refused, c.offset, "sync step " + std::to_string(step));
}

Status ServerImpl::CloseSyncStep(ps::Table& t) {
  const int64_t step = t.sparse->version;
  ps::NotFinite refused;
  try {
    refused = ps::CloseSyncStep(updater_, *t.sparse, workers_.count());
  } catch (const ps::DiskTierError& e) {  // before any update: the step is not applied
    t.disk_failed = "sync step " + std::to_string(step) + ": " + e.status().ToString();
    t.sparse->sync.Reset(workers_.count(), /*sparse=*/true);
    LogRateLimited("table '" + t.spec.name + "': " + t.disk_failed + "; the table takes no more pushes or pulls");
    return DiskFailed(t);
  }
  Count(kUpdatesApplied);
  if (!refused.any()) [[likely]] return Status::Ok();
  return NotFiniteUpdate(t, refused, 0, "sync step " + std::to_string(step));
}

Status ServerImpl::NotFiniteUpdate(ps::Table& t, const ps::NotFinite& nf, int64_t offset, const std::string& whose) {
  Count(kNonFiniteUpdatesRefused, nf.count);
  const std::string element = nf.id >= 0 ? "id " + std::to_string(nf.id) + " element " + std::to_string(nf.first)
                                         : "element " + std::to_string(offset + nf.first);
  const std::string what = whose + ": " + ps::DescribeNotFinite(t.spec.optimizer, nf, element);
  if (t.diverged.empty()) t.diverged = what;
  LogRateLimited("table '" + t.spec.name + "' diverged: " + what +
                 "; those elements kept their values, and the table takes no more pushes");
  return InvalidArgumentError("table '" + t.spec.name + "' diverged: " + what + ": server " +
                              std::to_string(options_.rank) +
                              " kept those elements' values and optimizer state, applied the rest of the update, and "
                              "refuses every later push to the table (" + std::string(ps::kDivergedAdvice) +
                              ", then resume from a checkpoint)");
}

Status ServerImpl::DiskFailed(const ps::Table& t) const {
  if (t.disk_failed.empty()) [[likely]] return Status::Ok();
  return UnavailableError("table '" + t.spec.name + "': its disk tier failed (" + t.disk_failed + "): server " +
                          std::to_string(options_.rank) +
                          " could not apply that step and refuses every push, pull and checkpoint of the table "
                          "(free or mend the disk of --disk-tier-dir, then resume from a checkpoint)");
}

Status ServerImpl::Diverged(const ps::Table& t) const {
  FERRY_RETURN_IF_ERROR(DiskFailed(t));
  if (t.diverged.empty()) [[likely]] return Status::Ok();
  return InvalidArgumentError("table '" + t.spec.name + "' diverged (" + t.diverged + "): server " +
                              std::to_string(options_.rank) +
                              " refuses every push to it and every checkpoint (" + std::string(ps::kDivergedAdvice) +
                              ", then resume from a checkpoint)");
}

bool ServerImpl::TryServe(Request& req) {
  const Kind kind = req.h()->kind();
  if (kind == Kind::PullSparse || kind == Kind::PullSparseTables) return TryServeSparse(req);
  return TryServeDense(req);
}

void ServerImpl::HoldOrServe(Request req) {
  if (TryServe(req)) return;
  if (Status s = RoomToHold(req); !s.ok()) return SendError(req, s);
  Count(kPullsHeld);
  req.held = true;
  held_.Hold(std::move(req), Clock::now() + options_.max_wait);
}

Status ServerImpl::RoomToHold(Request& req) {
  if (HeldCount() >= options_.max_held) {
    Count(kHeldRefused);
    return ResourceExhaustedError("server " + std::to_string(options_.rank) + " holds " +
                                  std::to_string(HeldCount()) + " waiting requests already (its limit); refusing more");
  }
  if (const size_t mine = peer_load_.held(req.peer()); mine >= options_.max_held_per_peer) {
    Count(kHeldRefused);
    LogRateLimited("a connection of worker " + std::to_string(req.h()->rank()) + " has " + std::to_string(mine) +
                   " requests waiting, the most one connection may; refused one more");
    return ResourceExhaustedError("this connection has " + std::to_string(mine) + " requests waiting on server " +
                                  std::to_string(options_.rank) +
                                  " already, the most one connection may (max_held_per_peer); wait for some to be "
                                  "answered");
  }
  // Its payload stays in memory while it waits: charged to the held payloads' bound until it is
  // answered (apart from the tables' budget, which a sparse table may fill by design).
  int64_t bytes = 0;
  for (const auto& f : req.payload) bytes += static_cast<int64_t>(f.size());
  if (bytes > 0) {
    if (!held_payloads_.TryTake(bytes)) {
      Count(kHeldRefused);
      return ResourceExhaustedError("holding this " + std::string(wire::KindName(req.h()->kind())) + "'s payload (" +
                                    ps::Mib(bytes) + ") while it waits would put what server " +
                                    std::to_string(options_.rank) + " holds past its bound (a quarter of "
                                    "--memory-budget-mb): " + ps::Mib(held_payloads_.used()) + " of " +
                                    ps::Mib(held_payloads_.limit()) + " held");
    }
    // One connection's share: the bound over the job's workers, so that each can hold its
    // part of a step (an all-reduce's values, its push pieces) whatever another peer holds.
    const int64_t share = held_payloads_.limit() / std::max(1, workers_.count());
    if (const int64_t mine = peer_load_.held_bytes(req.peer()); mine + bytes > share) {
      held_payloads_.Give(bytes);
      Count(kHeldRefused);
      LogRateLimited("a connection of worker " + std::to_string(req.h()->rank()) + " holds " + ps::Mib(mine) +
                     " of payloads waiting, the most one connection may hold is " + ps::Mib(share) + "; refused " +
                     ps::Mib(bytes) + " more");
      return ResourceExhaustedError("holding this " + std::string(wire::KindName(req.h()->kind())) + "'s payload (" +
                                    ps::Mib(bytes) + ") while it waits would put what this connection holds on " +
                                    "server " + std::to_string(options_.rank) + " (" + ps::Mib(mine) +
                                    ") past its share of the held payloads' bound (" + ps::Mib(share) + ": " +
                                    ps::Mib(held_payloads_.limit()) + " over " + std::to_string(workers_.count()) +
                                    " workers)");
    }
    req.held_bytes = ps::BudgetCharge(&held_payloads_, bytes);
  }
  req.held_by_peer = peer_load_.Acquire(req.peer(), bytes);
  return Status::Ok();
}

size_t ServerImpl::HeldCount() const {
  size_t n = held_.size() + collectives_.size() + calls_.size();
  for (const auto& [id, b] : builds_) n += b.waiting.size();
  return n;
}

void ServerImpl::ServeHeld() {
  held_.ServeReady([this](Request& r) { return TryServe(r); });
}

ServerImpl::Waiting ServerImpl::WaitingOn(const Request& req, const std::vector<int>* silent) const {
  const Header& h = *req.h();
  auto describe = [&](const ps::Table& t, int64_t version, const ps::SyncSlots& sync, const std::string& part) {
    if (t.spec.consistency == Consistency::kSsp) {
      return Waiting{"table '" + t.spec.name + "' (ssp:" + std::to_string(t.spec.staleness) + ") waits for worker(s) " +
                         workers_.Behind(req.pull_step, t.spec.staleness),
                     workers_.BehindRanks(req.pull_step, t.spec.staleness)};
    }
    if (sync.closes_unconfirmed > 0 && workers_.Ready(t.spec, version, req.pull_step)) {  // (1.23: no worker is)
      return Waiting{"table '" + t.spec.name + "'" + part + " closed step " + std::to_string(version - 1) +
                         " and waits for its backup, server " + std::to_string(BackupRank()) + ", to confirm it",
                     {}};
    }
    const bool blocked = silent == nullptr || !workers_.CanCompleteWithout(t.spec, sync, version, *silent);
    return Waiting{"table '" + t.spec.name + "'" + part + " is at step " + std::to_string(version) +
                       " and waits for the gradients of worker(s) " + workers_.MissingRanks(sync, version) + " (" +
                       std::to_string(sync.received) + " of " +
                       std::to_string(workers_.Quorum(t.spec, sync, version)) + " pushed)",
                   blocked ? workers_.Missing(sync, version) : std::vector<int>{}};
  };
  if (h.kind() == Kind::PullSparse) {
    const ps::Table* t = tables_.Find(h.table_id());
    if (t != nullptr && t->sparse) return describe(*t, t->sparse->version, t->sparse->sync, "");
  } else if (h.kind() == Kind::PullSparseTables && h.sparse()) {
    for (const auto* sl : *h.sparse()) {
      const ps::Table* t = tables_.Find(sl->table_id());
      if (t != nullptr && t->sparse &&
          !workers_.Ready(t->spec, Settled(t->sparse->version, t->sparse->sync), req.pull_step)) {
        return describe(*t, t->sparse->version, t->sparse->sync, "");
      }
    }
  } else if (h.slices()) {
    for (const auto* sl : *h.slices()) {
      const ps::Table* t = tables_.Find(sl->table_id());
      if (t == nullptr || !t->dense) continue;
      const ps::DenseChunk* c = t->dense->chunk(sl->chunk());
      if (c != nullptr && !workers_.Ready(t->spec, Settled(c->version, c->sync), req.pull_step)) {
        return describe(*t, c->version, c->sync, " chunk " + std::to_string(sl->chunk()));
      }
    }
  }
  return {"its step was not reached", {}};
}

std::chrono::milliseconds ServerImpl::LivenessPeriod() const {
  return std::clamp<std::chrono::milliseconds>(options_.worker_timeout / 4, std::chrono::milliseconds(20),
                                               std::chrono::seconds(1));
}

std::optional<Clock::time_point> ServerImpl::NextLivenessCheck() const {
  if (options_.worker_timeout.count() <= 0 || workers_.count() == 0) return std::nullopt;
  return last_liveness_check_ + LivenessPeriod();
}

constexpr const char* kStartedWithoutResume =
    "A worker that joins a job in progress must be started with --resume (it then rejoins at the job's step); "
    "started without, it waits for the others at the job's start";

void ServerImpl::FailDeadlockedCollectives(Clock::time_point now) {
  if (collectives_.size() == 0) return;
  // Each held sync pull that has waited long enough: its worker, and the workers whose gradients it waits for.
  struct Blocked {
    int rank;
    Waiting waiting;
    const Request* req;
  };
  std::vector<Blocked> blocked;
  held_.ForEach([&](const Request& r) {
    if (now - r.wait_from < kDeadlockAfter) return;
    Waiting w = WaitingOn(r);
    if (!w.ranks.empty()) blocked.push_back({r.h()->rank(), std::move(w), &r});
  });
  // The entries to refuse: only the workers that hold the others up, not everyone in the
  // collective (a finished worker at the closing barrier did nothing wrong); the collective
  // goes on waiting for the rest, and the refused ones' next processes enter it again.
  struct Refusal {
    int64_t id;
    int rank;
    std::string why;
  };
  std::vector<Refusal> refusals;
  auto in = [](const std::vector<int>& ranks, int r) {
    return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
  };
  auto refuse = [&](int64_t id, int rank, std::string why) {
    for (const Refusal& r : refusals) {
      if (r.id == id && r.rank == rank) return;
    }
    refusals.push_back({id, rank, std::move(why)});
  };
  collectives_.ForEach(workers_.TakingPart(), [&](int64_t id, const std::vector<Request>& arrived,
                                             const std::vector<int>& missing) {
    // A worker at the job's start (protocol 1.12) that has pushed nothing since its Hello, while
    // one missing here has pushed since its own and was heard from after the start came: that
    // one is training (it may wait for this one's gradient on another server, out of this
    // server's sight), and will never come to a start.
    for (const Request& a : arrived) {
      const int r = a.h()->rank();
      if (now - a.arrived < kDeadlockAfter || !a.h()->start() || workers_.training(r)) continue;
      for (int w : missing) {
        if (!workers_.training(w) || workers_.heard(w) <= a.arrived) continue;
        refuse(id, r,
               "worker " + std::to_string(r) + " waits at the job's start, and worker " + std::to_string(w) +
                   " is training already (it pushed to this server since it connected, and was heard from since): "
                   "it will not come to the start. " +
                   kStartedWithoutResume);
        break;
      }
    }
    // A held sync pull of a worker missing here waits for the gradients of workers that are all
    // here: those are refused.
    for (const Blocked& b : blocked) {
      if (!in(missing, b.rank)) continue;
      auto here = [&](int r) {
        return std::any_of(arrived.begin(), arrived.end(), [&](const Request& a) {
          return a.h()->rank() == r && now - a.arrived >= kDeadlockAfter;
        });
      };
      if (!std::all_of(b.waiting.ranks.begin(), b.waiting.ranks.end(), here)) continue;
      for (int r : b.waiting.ranks) {
        refuse(id, r,
               "worker " + std::to_string(b.rank) + "'s " + std::string(wire::KindName(b.req->h()->kind())) +
                   " for step " + std::to_string(b.req->pull_step) + " waits for their gradients (" +
                   b.waiting.what + "), and it is not here: neither can go on. " + kStartedWithoutResume);
      }
    }
  });
  for (Refusal& f : refusals) {
    std::optional<Request> r = collectives_.Withdraw(f.id, f.rank);
    if (!r) continue;
    const Status s = FailedPreconditionError(std::string(wire::KindName(r->h()->kind())) + " " +
                                             std::to_string(f.id) + " on server " + std::to_string(options_.rank) +
                                             ": worker(s) " + std::to_string(f.rank) + " wait here, but " + f.why);
    LogRateLimited(s.message());
    SendError(*r, s);
  }
}

void ServerImpl::CheckLiveness() {
  const auto now = Clock::now();
  const auto next = NextLivenessCheck();
  if (!next || now < *next) return;
  last_liveness_check_ = now;
  FailDeadlockedCollectives(now);
  const std::vector<int> silent = workers_.Silent(now, options_.worker_timeout);
  if (silent.empty()) {
    said_job_gone_ = false;
    return;
  }
  auto silence = [&](int rank) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "worker %d has sent nothing for %.1f s (dead, stopped, or cut off?)", rank,
                  std::chrono::duration<double>(workers_.SilentFor(rank, now)).count());
    return std::string(buf);
  };
  auto first_silent = [&](const std::vector<int>& ranks) {
    for (int r : ranks) {
      if (std::find(silent.begin(), silent.end(), r) != silent.end()) return r;
    }
    return -1;
  };
  held_.ServeReady([&](Request& r) {
    const Waiting w = WaitingOn(r, &silent);
    const int dead = first_silent(w.ranks);
    if (dead < 0) return false;
    Count(kFailedForSilentWorker);
    SendError(r, UnavailableError(std::string(wire::KindName(r.h()->kind())) + " for step " +
                                  std::to_string(r.pull_step) + " on server " + std::to_string(options_.rank) + ": " +
                                  w.what + "; " + silence(dead)));
    return true;
  });
  // A barrier carries no values: once everyone missing from it is silent, the others go on
  // without them (a dead backup worker does not hold the job's end). An all-reduce would sum
  // without their values: it fails as soon as one of them is silent.
  auto all_silent = [&](const std::vector<int>& ranks) {
    return std::all_of(ranks.begin(), ranks.end(), [&](int r) { return first_silent({r}) >= 0; });
  };
  auto taken = collectives_.TakeIf(workers_.TakingPart(), [&](const std::vector<Request>& arrived,
                                                         const std::vector<int>& missing) {
    return arrived[0].h()->kind() == Kind::Barrier ? all_silent(missing) : first_silent(missing) >= 0;
  });
  for (auto& c : taken) {
    const bool barrier = c.arrived[0].h()->kind() == Kind::Barrier;
    if (barrier) {
      std::fprintf(stderr, "ferry-ps %d: barrier %lld completes without worker(s) %s: %s\n", options_.rank,
                   static_cast<long long>(c.id), c.missing.c_str(), silence(c.missing_ranks[0]).c_str());
    }
    for (auto& r : c.arrived) {
      if (barrier) {
        SendOk(r);
        continue;
      }
      Count(kFailedForSilentWorker);
      SendError(r, UnavailableError(std::string(wire::KindName(r.h()->kind())) + " " + std::to_string(c.id) +
                                    " on server " + std::to_string(options_.rank) + " waits for worker(s) " +
                                    c.missing + "; " + silence(first_silent(c.missing_ranks))));
    }
  }
  if (workers_.AllSilent(silent) && !said_job_gone_) {
    said_job_gone_ = true;
    std::fprintf(stderr,
                 "ferry-ps %d: every worker still training is silent (%s): the job looks gone; this server keeps "
                 "its tables and goes on serving\n",
                 options_.rank, silence(silent[0]).c_str());
  }
}

void ServerImpl::ExpireHeld() {
  const auto now = Clock::now();
  const std::string waited = std::to_string(options_.max_wait.count()) + " ms";
  for (Request& r : held_.TakeExpired(now)) {
    Count(kHeldExpired);
    SendError(r, DeadlineExceededError(std::string(wire::KindName(r.h()->kind())) + " for step " +
                                       std::to_string(r.pull_step) + " waited " + waited + " on server " +
                                       std::to_string(options_.rank) + ": " + WaitingOn(r).what +
                                       " (stopped, or fell behind?)"));
  }
  for (ps::HeldCalls::Call& c : calls_.TakeExpired(now)) {
    Count(kHeldExpired, static_cast<int64_t>(c.held.size()));
    Status why =
        DeadlineExceededError(std::to_string(c.held.size()) + " of its " + std::to_string(c.pieces) +
                              " pieces arrived within " + waited + " on server " + std::to_string(options_.rank));
    FailCall(std::move(c), why);
  }
  const std::vector<bool> part = workers_.TakingPart();
  const auto taking_part = std::count(part.begin(), part.end(), true);
  for (auto& c : collectives_.TakeExpired(now, part)) {
    const size_t arrived = ps::Collectives::ArrivedTakingPart(c.arrived, part);
    for (auto& r : c.arrived) {
      Count(kHeldExpired);
      SendError(r, DeadlineExceededError(std::string(wire::KindName(r.h()->kind())) + " " + std::to_string(c.id) +
                                         " waited " + waited + " on server " + std::to_string(options_.rank) +
                                         " for worker(s) " + c.missing + " (" + std::to_string(arrived) + " of " +
                                         std::to_string(taking_part) + " arrived)"));
    }
  }
}

}  // namespace ferry::ps
