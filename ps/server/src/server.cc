// The parameter server's front (internal/server_impl.h says where the rest is): Start binds the
// socket and restores the tables; the I/O thread's loop reads each message, checks it whole
// (header, frames, size, CURVE key, rank and step) and dispatches it by kind to its handler
// (handlers/*.cc), answering every refusal and failure with an error naming the request.
#include "internal/server_impl.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include <sys/resource.h>
#include <sys/stat.h>

#include "ferry/curve.h"
#include "ferry/messages/deadlines.h"
#include "ferry/messages/event_loop.h"
#include "ferry/messages/kinds.h"
#include "ferry/messages/placement.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "internal/checkpoint.h"

namespace ferry::ps {
namespace {

// --disk-tier-dir is emptied at every start: the checkpoint folder must not lie inside it (nor it
// inside the checkpoint folder). A checkpoint folder on another file system works, but its
// copies of the store are then copies, not links: said once, at start.
Status CheckDiskTierDir(const ServerOptions& options) {
  if (options.checkpoint_dir.empty()) return Status::Ok();
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path tier = fs::weakly_canonical(options.disk_tier_dir, ec),
                 ckpt = fs::weakly_canonical(options.checkpoint_dir, ec);
  auto inside = [](const fs::path& a, const fs::path& b) {  // a within b (or b itself)
    auto [end, _] = std::mismatch(b.begin(), b.end(), a.begin(), a.end());
    return end == b.end();
  };
  if (inside(ckpt, tier) || inside(tier, ckpt)) {
    return InvalidArgumentError(
        "ferry-ps rank " + std::to_string(options.rank) + ": --checkpoint-dir " + options.checkpoint_dir +
        " and --disk-tier-dir " + options.disk_tier_dir +
        " overlap; the disk tier's folder is emptied at every start: give them separate folders");
  }
  struct stat a {
  }, b{};
  fs::path probe = ckpt;
  while (!probe.empty() && ::stat(probe.c_str(), &b) != 0) probe = probe.parent_path();
  fs::path tier_probe = tier;
  while (!tier_probe.empty() && ::stat(tier_probe.c_str(), &a) != 0) tier_probe = tier_probe.parent_path();
  if (!probe.empty() && !tier_probe.empty() && a.st_dev != b.st_dev) {
    std::fprintf(stderr,
                 "ferry-ps %d: --checkpoint-dir %s is on another file system than --disk-tier-dir %s: each "
                 "checkpoint copies the store's files (the server serves nothing meanwhile) instead of linking them\n",
                 options.rank, options.checkpoint_dir.c_str(), options.disk_tier_dir.c_str());
  }
  return Status::Ok();
}

}  // namespace

ServerImpl::ServerImpl(ServerOptions options, std::shared_ptr<Context> context, zmq::socket_t socket,
                       zmq::socket_t monitor, zmq::socket_t zap, std::string endpoint, ps::TableRegistry tables,
                       int64_t restored_step, const std::vector<int64_t>& restored_worker_steps,
                       std::unique_ptr<ps::DiskTier> disk_tier, std::unique_ptr<ps::TableRegistry> replicas,
                       ps::Recovered recovered)
    : options_(std::move(options)),
      context_(std::move(context)),
      sockets_{std::move(socket), std::move(monitor), std::move(zap)},
      endpoint_(std::move(endpoint)),
      restored_step_(restored_step),
      pool_(options_.compute_threads),
      updater_(pool_),
      disk_tier_(std::move(disk_tier)),
      tables_(std::move(tables)),
      replicas_(std::move(replicas)),
      connections_(options_.max_connections, options_.idle_timeout) {
  incarnation_ = recovered.incarnation;
  primary_incarnation_ = replica_fence_ = recovered.primary_incarnation;
  replica_recovered_ = recovered.done;
  replica_image_incarnation_ = recovered.primary_incarnation;
  replica_image_covers_ = recovered.primary_covers;
  if (options_.num_workers > 0) workers_.SetCount(options_.num_workers).IgnoreError();  // checked in Start
  if (restored_step_ >= 0) workers_.SetDone(restored_worker_steps, restored_step_);  // (a restore has the count)
  // A replacement (1.22): the workers as its peers saw them (their clocks, who finished or left).
  for (size_t w = 0; w < recovered.workers.size() && static_cast<int>(w) < workers_.count(); ++w) {
    const ps::WorkerState& ws = recovered.workers[w];
    workers_.AdvanceClock(static_cast<int>(w), ws.clock);
    if (ws.left) {
      workers_.Leave(static_cast<int>(w));
    } else if (ws.finished) {
      workers_.Finish(static_cast<int>(w));
    }
  }
  tables_.ForEach([&](const ps::Table& t) { restored_tables_.push_back(t.spec.name); });
  std::ranges::sort(restored_tables_);
  if (options_.curve) {
    for (size_t r = 0; r < options_.curve->workers.size(); ++r) {
      worker_keys_[curve::Decode(options_.curve->workers[r])] = static_cast<int>(r);
    }
    for (size_t r = 0; r < options_.curve->readers.size(); ++r) {
      reader_keys_[curve::Decode(options_.curve->readers[r])] = static_cast<int>(r);
    }
  }
  for (auto& c : counters_) c.store(0);
  for (auto& b : staleness_) b.store(0);
  if (disk_tier_ && options_.disk_tier_readers > 0) {
    readers_ = std::make_unique<ps::DiskReaders>(options_.disk_tier_readers, [this] { waker_.Notify(); });
  }
  // A server restored to a map that drained it (it had slots in the job's first map, and a later
  // map took them): every worker restarts with the job and learns the map from server 0, so none
  // will send here. (One outside the first map may not have joined yet: it stays.)
  if (restored_step_ >= 0 && options_.exit_when_drained && options_.rank != 0 &&
      (options_.active_servers == 0 || options_.rank < options_.active_servers) &&
      tables_.placement().version() > 1 && tables_.placement().SlotsOf(options_.rank) == 0) {
    BeginLeaving(/*restored=*/true);
  }
  thread_ = std::thread([this] { Loop(); });
}

void ServerImpl::Stop() {
  stopping_.store(true);
  waker_.Notify();
  // Several threads may call Stop() at once: one joins, the others wait for that join.
  {
    MutexLock closing(&metrics_mu_);  // a scrape waiting for the loop is answered 503 now
    metrics_closed_ = true;
    metrics_cv_.SignalAll();
  }
  MutexLock lock(&stop_mu_);
  metrics_http_.reset();  // waits for a scrape in flight, which no longer waits for the loop
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  // The loop has ended: a file job still running is finished (its reply is not sent).
  if (!thread_.joinable() && job_thread_.joinable()) job_thread_.join();
  // And a table being built is given up (its declarations get no reply).
  if (!thread_.joinable()) builder_.Stop();
}

void ServerImpl::Loop() {
  heap_base_ = std::max<int64_t>(0, transport::HeapInUseBytes() - TablesUsed());
  if (replica_recovered_) {
    // A replacement (1.23): a sync step whose every gradient its image holds, which its
    // predecessor closed (or would have) but its backup did not hear of, closes now, as it would
    // have there: the same gradients by the same function (and the backup is told).
    try {
      if (Status s = CloseCompleteSteps(); !s.ok()) LogRateLimited(s.message());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry-ps %d: %s closing the steps its image held complete; continuing\n", options_.rank,
                   e.what());
    }
  }
  transport::EventLoop::Handlers h;
  // Out of memory while serving (HandleMessage answers its own errors): the request in hand is
  // lost, the server goes on; its client times out with a clear error.
  h.on_message = [this](size_t socket, Frames& frames, bool truncated) {
    try {
      if (socket == kZap && options_.curve) return OnZapRequest(frames);
      if (socket == kBackup && Replicating()) return OnBackupReply(frames);
      if (socket == kMonitor) return OnMonitorEvent(frames);
      HandleMessage(frames, truncated);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry-ps %d: %s while serving; continuing\n", options_.rank, e.what());
    }
  };
  h.on_wake = [this] {
    FinishFileJob();
    FinishBuilds();
    FinishDiskReads();
    AnswerMetrics();
  };
  h.next_deadline = [this] {
    return transport::Earliest(
        transport::Earliest(transport::Earliest(held_.NextDeadline(), collectives_.NextDeadline()),
                            calls_.NextDeadline()),
        transport::Earliest(transport::Earliest(NextLivenessCheck(), NextConnectionCheck()),
                            transport::Earliest(
                                transport::Earliest(transport::Earliest(next_heap_check_, NextBackupDeadline()),
                                                    image_ ? std::optional(image_->until) : std::nullopt),
                                handover_read_ ? std::optional(handover_read_->until) : std::nullopt)));
  };
  h.on_tick = [this] {
    try {
      ExpireHeld();
      CheckLiveness();
      CheckConnections();
      CheckHeap(Clock::now());
      CheckDiskWaits(Clock::now());
      ExpireBackupWaits(Clock::now());
      if (image_ && Clock::now() >= image_->until) image_.reset();  // its replacement went away
      if (handover_read_ && Clock::now() >= handover_read_->until) handover_read_.reset();  // no adopting round came
      if (leaving_) CheckLeaving();
      {
        MutexLock lock(&job_mu_);
        if (prepared_ && Clock::now() >= prepared_->until) prepared_.reset();  // no hand-over came
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry-ps %d: %s while expiring held requests; continuing\n", options_.rank, e.what());
    }
  };
  const size_t sockets = options_.curve || Replicating() ? 3 : 2;  // (kZap, or kBackup)
  const Status s = transport::EventLoop::Run({sockets_.data(), sockets}, waker_, stopping_,
                                             wire::kMaxFrames + 1, h);
  if (!s.ok()) std::fprintf(stderr, "ferry-ps %d: %s; stopping\n", options_.rank, s.message().c_str());
}

void ServerImpl::HandleMessage(Frames& frames, bool truncated) {
  Count(kMessages);
  int64_t bytes = 0;
  for (auto& f : frames) bytes += static_cast<int64_t>(f.size());
  Count(kBytesIn, bytes);
  if (frames.empty()) return;
  Request req;
  req.arrived = req.wait_from = Clock::now();
  req.routing = std::move(frames[0]);
  // From a frame of the message itself: ROUTER makes the routing id frame of a peer's first
  // messages afresh, without the descriptor.
  req.fd = zmq_msg_get(frames[frames.size() > 1 ? 1 : 0].handle(), ZMQ_SRCFD);
  // A connection not seen yet: the events ZeroMQ reported before its first message, ACCEPTED
  // among them (connections.h). Known ones need no look: this stays off the common path. A
  // descriptor known under another routing id is a new connection on a descriptor freed by one
  // whose DISCONNECTED is still unread (the loop reads messages before events): without the look
  // its Hello would bind a rank to the old connection's record, and that DISCONNECTED would then
  // take the rank's live connection away with it.
  if (req.fd >= 0 && !connections_.Knows(req.fd, req.peer())) DrainMonitor();
  // A connection refused for the cap gets only that refusal, once its request can be named.
  const Status refused = connections_.Heard(req.fd, req.peer(), req.arrived);
  // A malformed message: counted, logged (rate-limited, naming the peer) and answered.
  auto bad = [&](const Status& s) {
    Count(kBadMessages);
    NoteRefused(bytes, truncated, req.arrived);
    LogRateLimited("refused a message from " + connections_.PeerOf(req.fd) + ": " + s.message());
    SendError(req, s);
  };
  if (frames.size() < 2) return bad(InvalidArgumentError("message has no header frame"));
  // CURVE: the rank of the connection's key, which ZeroMQ attached to the frames (read before
  // the header is verified: that may copy it into an aligned frame without them).
  const int key_rank = options_.curve ? KeyRank(frames[1]) : -1;
  // The header first, so that even a refusal for size can name the request it answers.
  req.header_frame = std::move(frames[1]);
  const Header* header = nullptr;
  Status s = wire::VerifyHeader(req.header_frame, &header);
  // A header of another major version that verifies is answered with the request's id and
  // kind, so its sender can match the refusal instead of waiting out its timeout.
  req.verified = header != nullptr;
  if (!s.ok()) return bad(s);
  if (!refused.ok()) return SendError(req, refused);
  if (options_.curve) {
    if (s = CheckKeyRank(req, key_rank); !s.ok()) {
      Count(kPermissionDenied);
      LogRateLimited(s.message());
      return SendError(req, s);
    }
  }
  if (truncated) {
    return bad(InvalidArgumentError("message has more than " + std::to_string(wire::kMaxFrames) + " frames"));
  }
  // A primary forwards a push's 16-bit values as float32 (1.21 Replicate): twice the bytes at most.
  const int64_t limit = options_.max_message_bytes * (header->kind() == Kind::Replicate ? 2 : 1);
  if (bytes > limit) {
    return bad(ResourceExhaustedError("message of " + std::to_string(bytes) + " bytes exceeds this server's limit of " +
                                      std::to_string(limit) + " bytes"));
  }
  for (size_t i = 2; i < frames.size(); ++i) req.payload.push_back(std::move(frames[i]));
  s = wire::CheckPayloadShape(*header, req.payload, [this](uint64_t table_id) {
    const ps::Table* t = tables_.Find(table_id);
    return t ? wire::TableCoding{t->spec.wire, t->spec.topk_ratio} : wire::TableCoding{};
  });
  if (!s.ok()) return bad(s.WithContext(std::string(wire::KindName(req.h()->kind()))));
  // A client that cannot follow a moved map (OnPlacement); a current one costs no lookup here.
  // (1.20: and one that would go on sending a server that left the job its clocks: CheckLeaving.)
  if (header->minor() < wire::kMembersSinceMinor) connections_.SawOldMinor(req.fd, header->minor());
  DispatchAndAnswer(req);
}

void ServerImpl::DispatchAndAnswer(Request& req) {
  const Kind kind = req.h() ? req.h()->kind() : Kind::Invalid;  // (a handler may move req on)
  const int fd = req.fd;
  Status s;
  try {
    s = Dispatch(req);
  } catch (const ps::BudgetExceeded& e) {
    LogRateLimited(std::string(e.what()) + "; refused");
    s = ResourceExhaustedError("server " + std::to_string(options_.rank) + ": " + e.what());
  } catch (const ps::DiskTierError& e) {  // thrown before anything of its table changed
    Count(kDiskTierErrors);
    LogRateLimited(e.status().ToString() + "; refused");
    s = e.status();
  } catch (const std::bad_alloc&) {
    s = ResourceExhaustedError("server " + std::to_string(options_.rank) + " ran out of memory serving this request");
  } catch (const zmq::error_t& e) {
    s = ResourceExhaustedError(std::string("server ") + std::to_string(options_.rank) + ": " + e.what());
  }
  if (!s.ok() && req.h()) SendError(req, s.WithContext(std::string(wire::KindName(req.h()->kind()))));
  // Another server's connection (Connections::FromServer), once one of its requests was taken:
  // a refused one marks nothing.
  if (s.ok() && !req.read_ahead && (kind == Kind::Replicate || kind == Kind::Snapshot)) {
    connections_.FromServer(fd, Clock::now());
  }
}

int ServerImpl::KeyRank(zmq::message_t& frame) {
  const char* user = zmq_msg_gets(frame.handle(), "User-Id");
  if (user == nullptr || *user == '\0') return -1;
  if (std::strncmp(user, "reader-", 7) == 0) return -2 - std::atoi(user + 7);  // OnZapRequest's reader keys
  return std::atoi(user);
}

Status ServerImpl::CheckKeyRank(const Request& req, int key_rank) {
  // Reading (the change feed, Stats) changes nothing: any of the job's keys may, a reader's too.
  const Kind kind = req.h()->kind();
  if (kind == Kind::Changes || kind == Kind::Stats) return Status::Ok();
  if (key_rank <= -2) {
    return PermissionDeniedError("this connection's CURVE key is reader " + std::to_string(-2 - key_rank) +
                                 "'s: a reader may read (Changes, Stats) and nothing else, not send " +
                                 std::string(wire::KindName(kind)));
  }
  if (key_rank != req.h()->rank()) {
    return PermissionDeniedError("this connection's CURVE key is worker " +
                                 (key_rank >= 0 ? std::to_string(key_rank) : std::string("?")) +
                                 "'s; it cannot speak for worker " + std::to_string(req.h()->rank()));
  }
  return Status::Ok();
}

Status ServerImpl::Dispatch(Request& req) {
  const Header& h = *req.h();
  const Handler handle = HandlerOf(h.kind());
  // VerifyHeader passed: the kind has a row.
  // (A peer's Replicate carries the rank and step of the worker whose push it forwards: checked there.)
  if (const wire::Route route = wire::FindKind(h.kind())->route; route == wire::Route::kBeforeHello ||
                                                                  route == wire::Route::kPeer) {
    return (this->*handle)(req);
  }
  if (workers_.count() == 0) return FailedPreconditionError("no Hello yet: the client must handshake first");
  if (h.rank() < 0 || h.rank() >= workers_.count()) {
    return InvalidArgumentError("rank " + std::to_string(h.rank()) + " is outside [0, " +
                                std::to_string(workers_.count()) + ")");
  }
  if (h.step() < 0 || h.step() > ps::kMaxStep) {
    return InvalidArgumentError("step " + std::to_string(h.step()) + " is outside [0, 2^62]");
  }
  FERRY_RETURN_IF_ERROR(CheckIncarnation(req, h.rank()));
  if (!req.read_ahead) {  // (a request that waited for the disk did both on arrival: its descriptor
                          // may be another connection's now, and its arrival older than what was heard since)
    FERRY_RETURN_IF_ERROR(ClaimRank(req, h.rank()));
    workers_.Heard(h.rank(), req.arrived);
  }
  if (leaving_) HeardMapOf(h.rank(), h.placement_version());
  if (handle == nullptr) {
    return InvalidArgumentError("a server does not accept " + std::string(wire::KindName(h.kind())) + " messages");
  }
  if (AnswerMoved(req)) return Status::Ok();
  if (readers_ != nullptr && !req.read_ahead && WaitForDisk(req)) return Status::Ok();  // (taken: it waits)
  const int rank = h.rank();
  const int64_t step = h.step();
  const Kind kind = h.kind();  // (req may be moved from: a held request)
  FERRY_RETURN_IF_ERROR((this->*handle)(req));
  if (kind == Kind::PushDense || kind == Kind::PushPullDense || kind == Kind::PushSparse ||
      kind == Kind::PushSparseTables) {
    workers_.Did(rank, step);  // taken (applied, aggregated or held for its step)
  }
  return Status::Ok();
}

// One row per kind a server takes; what each kind is, and which are taken before Hello:
// ferry/messages/kinds.h.
ServerImpl::Handler ServerImpl::HandlerOf(Kind kind) {
  struct Route {
    Kind kind;
    Handler handle;
  };
  static constexpr Route kRoutes[] = {
      {Kind::Hello, &ServerImpl::OnHello},
      {Kind::Stats, &ServerImpl::OnStats},
      {Kind::Heartbeat, &ServerImpl::OnHeartbeat},
      {Kind::Waiting, &ServerImpl::OnWaiting},
      {Kind::Changes, &ServerImpl::OnChanges},
      {Kind::CreateTable, &ServerImpl::OnCreateTable},
      {Kind::PullDense, &ServerImpl::OnPullDense},
      {Kind::PushDense, &ServerImpl::OnPushDense},
      {Kind::PushPullDense, &ServerImpl::OnPushPullDense},
      {Kind::PullSparse, &ServerImpl::OnPullSparse},
      {Kind::PullSparseTables, &ServerImpl::OnPullSparse},
      {Kind::PushSparse, &ServerImpl::OnPushSparse},
      {Kind::PushSparseTables, &ServerImpl::OnPushSparse},
      {Kind::Clock, &ServerImpl::OnClock},
      {Kind::Finish, &ServerImpl::OnFinish},
      {Kind::Barrier, &ServerImpl::OnCollective},
      {Kind::AllReduce, &ServerImpl::OnCollective},
      {Kind::Checkpoint, &ServerImpl::OnCheckpoint},
      {Kind::CommitCheckpoint, &ServerImpl::OnCommitCheckpoint},
      {Kind::Placement, &ServerImpl::OnPlacement},
      {Kind::Replicate, &ServerImpl::OnReplicate},
      {Kind::Snapshot, &ServerImpl::OnSnapshot},
      {Kind::MoveAsk, &ServerImpl::OnMoveAsk},
  };
  static constexpr std::array<Handler, 256> kByKind = [] {
    std::array<Handler, 256> by{};
    for (const Route& r : kRoutes) by[static_cast<uint8_t>(r.kind)] = r.handle;
    return by;
  }();
  static_assert(std::ranges::all_of(wire::kKinds,
                                    [](const wire::KindInfo& k) {
                                      return (k.route == wire::Route::kReply) ==
                                             (kByKind[static_cast<uint8_t>(k.kind)] == nullptr);
                                    }),
                "every kind routed to a server (ferry/messages/kinds.h) has a handler here, and no other");
  return kByKind[static_cast<uint8_t>(kind)];
}

}  // namespace ferry::ps

namespace ferry {
namespace {

// ServerOptions::max_connections when unset: 4096, or the descriptor limit less 128 (files,
// ZeroMQ's own) if that is lower.
size_t DefaultMaxConnections() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return 4096;
  const rlim_t spare = lim.rlim_cur > 128 + 16 ? lim.rlim_cur - 128 : 16;
  return static_cast<size_t>(std::min<rlim_t>(spare, 4096));
}

// CURVE needs a private context (one ZAP handler per context), a transport with handshakes, and
// keys that decode; the worker count follows from the keys.
Status CheckCurveOptions(ServerOptions* options) {
  const std::string who = "ferry-ps rank " + std::to_string(options->rank) + ": CURVE";
  if (!curve::Available()) return UnimplementedError(who + ": this libzmq was built without CURVE");
  if (options->context)
    return InvalidArgumentError(who + " needs the server's own Context (leave options.context unset)");
  if (options->bind.starts_with("inproc://"))
    return InvalidArgumentError(who + " needs tcp:// or ipc://, not inproc://");
  FERRY_RETURN_IF_ERROR(curve::CheckKeypair(options->curve->server, who + " server keypair"));
  const auto& workers = options->curve->workers;
  if (workers.empty()) return InvalidArgumentError(who + ": no worker keys");
  for (size_t r = 0; r < workers.size(); ++r) {
    FERRY_RETURN_IF_ERROR(curve::CheckPublicKey(workers[r], who + " key of worker " + std::to_string(r)));
  }
  for (size_t r = 0; r < options->curve->readers.size(); ++r) {
    FERRY_RETURN_IF_ERROR(
        curve::CheckPublicKey(options->curve->readers[r], who + " key of reader " + std::to_string(r)));
  }
  const int n = static_cast<int>(workers.size());
  if (options->num_workers == 0) options->num_workers = n;
  if (options->num_workers != n) {
    return InvalidArgumentError(who + ": " + std::to_string(n) + " worker keys for a job of " +
                                std::to_string(options->num_workers) + " workers");
  }
  return Status::Ok();
}

// Replication 2 (ServerOptions::replication): every server's endpoint, and none of what it cannot
// follow yet.
Status CheckReplicationOptions(const ServerOptions& o) {
  const std::string who = "ferry-ps rank " + std::to_string(o.rank) + ": replication " + std::to_string(o.replication);
  if (o.replication == 1) {
    if (!o.peers.empty()) return InvalidArgumentError(who + ": peers are for replication 2");
    if (o.recover) return InvalidArgumentError(who + ": recover takes a dead server's state from its replicas: "
                                               "it needs replication 2");
    return Status::Ok();
  }
  if (o.replication != 2) return InvalidArgumentError(who + ": 1 (none) or 2 (a backup of each server's slots)");
  if (o.num_servers < 2) return InvalidArgumentError(who + " needs at least 2 servers (a backup is another server)");
  if (o.peers.size() != static_cast<size_t>(o.num_servers)) {
    return InvalidArgumentError(who + " needs every server's endpoint (peers): " + std::to_string(o.peers.size()) +
                                " given for " + std::to_string(o.num_servers) + " servers");
  }
  for (const std::string& p : o.peers) {
    if (!p.starts_with("tcp://") && !p.starts_with("ipc://") && !p.starts_with("inproc://")) {
      return InvalidArgumentError(who + ": peer endpoint '" + p + "' is not tcp://, ipc:// or inproc://");
    }
  }
  const char* not_yet = o.curve                      ? "CURVE"
                        : o.active_servers > 0       ? "active_servers (servers joining)"
                        : o.exit_when_drained        ? "exit_when_drained (servers leaving)"
                        : !o.disk_tier_dir.empty()   ? "a disk tier"
                                                     : nullptr;
  if (not_yet != nullptr) return UnimplementedError(who + " does not work with " + not_yet + " yet");
  if (o.recover && o.restore) {
    return InvalidArgumentError(who + ": recover (from the peers) and restore (from a checkpoint) are exclusive");
  }
  if (o.failover_timeout.count() <= 0) return InvalidArgumentError(who + ": failover_timeout must be positive");
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  if (options.num_servers < 1 || options.rank < 0 || options.rank >= options.num_servers) {
    return InvalidArgumentError("server rank " + std::to_string(options.rank) + " is outside [0, " +
                                std::to_string(options.num_servers) + ")");
  }
  if (options.num_servers > placement::kSlots) {
    return InvalidArgumentError("num_servers " + std::to_string(options.num_servers) + " is above " +
                                std::to_string(placement::kSlots) + " (the placement's slots: each server needs one)");
  }
  if (options.max_message_bytes < 1024) return InvalidArgumentError("max_message_bytes must be at least 1024");
  transport::TuneAllocatorForLargeMessages();  // once per process; FERRY_MALLOC_TUNING=off opts out
  if (options.compute_threads > 1024) {
    return InvalidArgumentError("compute_threads " + std::to_string(options.compute_threads) + " is above 1024");
  }
  if (options.compute_threads < 0) {
    options.compute_threads = std::max(0, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  }
  if (options.num_workers < 0 || options.num_workers > 65536) {
    return InvalidArgumentError("num_workers " + std::to_string(options.num_workers) + " is outside [0, 65536]");
  }
  if (options.keep_checkpoints < 1) return InvalidArgumentError("keep_checkpoints must be at least 1");
  if (options.checkpoint_deltas < 0) return InvalidArgumentError("checkpoint_deltas must be >= 0");
  if (!(options.checkpoint_delta_share > 0.0 && options.checkpoint_delta_share <= 100.0)) {
    return InvalidArgumentError("checkpoint_delta_share must be in (0, 100]");
  }
  if (options.curve) FERRY_RETURN_IF_ERROR(CheckCurveOptions(&options));
  if (options.memory_budget_bytes < 0) return InvalidArgumentError("memory_budget_bytes must be >= 0");
  if (options.idle_timeout.count() < 0) return InvalidArgumentError("idle_timeout must be >= 0");
  if (options.max_connections == 0) options.max_connections = DefaultMaxConnections();
  std::unique_ptr<ps::DiskTier> disk_tier;  // before the tables: their shards point to it
  FERRY_RETURN_IF_ERROR(CheckReplicationOptions(options));
  // With replication 2 the budget is the shard's and its replica's together: half each.
  int64_t budget = options.memory_budget_bytes;
  if (options.replication == 2) budget = (budget > 0 ? budget : ps::MemoryBudget::DefaultLimit()) / 2;
  ps::TableRegistry tables(options.rank, options.num_servers, budget);
  if (options.active_servers < 0 || options.active_servers > options.num_servers) {
    return InvalidArgumentError("ferry-ps rank " + std::to_string(options.rank) + ": active_servers " +
                                std::to_string(options.active_servers) + " is outside [0, " +
                                std::to_string(options.num_servers) + "] (0: all)");
  }
  if (options.active_servers > 0) {
    tables.SetPlacement(placement::Placement::First(options.active_servers, options.num_servers));
  }
  std::unique_ptr<ps::TableRegistry> replicas;  // the replica of server rank-1's slots, placed as its
  const int primary = (options.rank + options.num_servers - 1) % options.num_servers;
  if (options.replication == 2) replicas = std::make_unique<ps::TableRegistry>(primary, options.num_servers, budget);
  if (!options.disk_tier_dir.empty()) {
    if (options.disk_tier_cache_bytes < 0) return InvalidArgumentError("disk_tier_cache_bytes must be >= 0");
    FERRY_RETURN_IF_ERROR(ps::CheckDiskTierDir(options));
    ps::DiskTier::Options o;
    o.path = options.disk_tier_dir;
    o.block_cache_bytes = options.disk_tier_cache_bytes;
    o.read_delay = options.disk_tier_read_delay;
    o.direct_reads = options.disk_tier_direct_reads;
    if (options.disk_tier_readers < 0 || options.disk_tier_readers > 64) {
      return InvalidArgumentError("disk_tier_readers must be in [0, 64], not " +
                                  std::to_string(options.disk_tier_readers));
    }
    FERRY_RETURN_IF_ERROR(ps::DiskTier::Open(o, &disk_tier)
                              .WithContext("ferry-ps rank " + std::to_string(options.rank) + ": --disk-tier-dir"));
    tables.SetDiskTier(disk_tier.get());
  }
  int64_t restored_step = -1;
  std::vector<int64_t> restored_worker_steps;
  if (options.restore) {
    const std::string who = "ferry-ps rank " + std::to_string(options.rank);
    if (options.checkpoint_dir.empty()) return InvalidArgumentError(who + ": restore needs a checkpoint folder");
    if (options.num_workers == 0)
      return InvalidArgumentError(who + ": restore needs the job's worker count (--num-workers)");
    std::vector<std::string> skipped;
    auto ckpt = ps::ReadCheckpoint(options.checkpoint_dir, &skipped);
    if (!ckpt.ok()) return ckpt.status().WithContext(who);
    for (const auto& s : skipped) std::fprintf(stderr, "%s: passed over a checkpoint: %s\n", who.c_str(), s.c_str());
    // A job of the checkpoint's servers restores the map they held (1.17: the manifest's, if a
    // hand-over had changed it): every server of the job restores from the same checkpoint.
    if (ckpt->placement && ckpt->num_servers == options.num_servers) tables.SetPlacement(*ckpt->placement);
    if (replicas && tables.placement().version() > 1) {
      return FailedPreconditionError(who + ": " + ckpt->manifest +
                                     " was written under a moved map: replication 2 keeps replicas of the first "
                                     "map's slots only, for now");
    }
    try {
      FERRY_RETURN_IF_ERROR(ps::RestoreShard(*ckpt, options.rank, options.num_workers, &tables)
                                .WithContext(who + ": restoring " + ckpt->manifest));
      if (replicas) {  // the primary's shard, as it restores it
        FERRY_RETURN_IF_ERROR(
            ps::RestoreShard(*ckpt, primary, options.num_workers, replicas.get())
                .WithContext(who + ": restoring the replica of server " + std::to_string(primary) + "'s shard from " +
                             ckpt->manifest));
      }
    } catch (const ps::BudgetExceeded& e) {
      return ResourceExhaustedError(who + ": restoring " + ckpt->manifest + ": " + e.what());
    } catch (const ps::DiskTierError& e) {
      return e.status().WithContext(who + ": restoring " + ckpt->manifest);
    }
    restored_step = ckpt->step;
    restored_worker_steps = ckpt->worker_steps;
  }
  auto context = options.context ? options.context : Context::Create(1);
  if (!transport::Waker().ok()) return InternalError("cannot create an eventfd (file descriptors exhausted?)");
  FERRY_ASSIGN_OR_RETURN(zmq::socket_t socket,
                         transport::MakeSocket(transport::Zmq(*context), zmq::socket_type::router));
  zmq::socket_t zap;
  std::string endpoint;
  // Watched from before the bind, so no connection is accepted unseen.
  FERRY_ASSIGN_OR_RETURN(zmq::socket_t monitor, transport::Watch(transport::Zmq(*context), socket,
                                                                 ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED));
  try {
    // ZeroMQ drops the connection of a peer whose single frame exceeds this hard limit; frames
    // below it but over max_message_bytes get an error reply.
    socket.set(zmq::sockopt::maxmsgsize, options.max_message_bytes * 2);
    // Room for every reply a client may have outstanding (Send): a full queue drops the reply.
    socket.set(zmq::sockopt::sndhwm, ps::kReplyQueue);
    socket.set(zmq::sockopt::router_mandatory, 1);
    if (options.curve) {
      // The handler first: a handshake that finds none bound would accept every key.
      FERRY_ASSIGN_OR_RETURN(zap, transport::MakeSocket(transport::Zmq(*context), zmq::socket_type::rep));
      zap.bind("inproc://zeromq.zap.01");
      const std::string secret = curve::Decode(options.curve->server.secret_key);
      socket.set(zmq::sockopt::curve_server, 1);
      if (zmq_setsockopt(socket.handle(), ZMQ_CURVE_SECRETKEY, secret.data(), secret.size()) != 0) throw zmq::error_t();
      socket.set(zmq::sockopt::zap_domain, "ferry");
    }
    socket.bind(options.bind);
    endpoint = transport::LastEndpoint(socket);
  } catch (const zmq::error_t& e) {
    return UnavailableError("ferry-ps rank " + std::to_string(options.rank) + ": cannot bind " + options.bind + ": " +
                            e.what());
  }
  ps::Recovered recovered;
  if (options.recover) {
    // After the bind (a live server at the endpoint fails it before any peer is asked, or fenced),
    // before the first read: what clients send meanwhile waits in ZeroMQ's queues.
    FERRY_ASSIGN_OR_RETURN(recovered, ps::Recover(options, transport::Zmq(*context), &tables, replicas.get()));
    options.num_workers = recovered.num_workers;
  }
  if (options.replication == 2) {
    // The backup's connection (in kZap's place: never with CURVE). Its queue holds as many
    // updates as may wait for the backup (ServerImpl::RoomToForward's bound), so a push applied
    // always finds room in it.
    const std::string& backup = options.peers[static_cast<size_t>((options.rank + 1) % options.num_servers)];
    FERRY_ASSIGN_OR_RETURN(zap, transport::MakeSocket(transport::Zmq(*context), zmq::socket_type::dealer));
    try {
      zap.set(zmq::sockopt::sndhwm, ps::kReplyQueue);
      zap.set(zmq::sockopt::linger, 0);
      zap.connect(backup);
    } catch (const zmq::error_t& e) {
      return InvalidArgumentError("ferry-ps rank " + std::to_string(options.rank) + ": cannot connect to its backup " +
                                  backup + ": " + e.what());
    }
  }
  auto server = std::make_unique<ps::ServerImpl>(std::move(options), std::move(context), std::move(socket),
                                                std::move(monitor), std::move(zap), endpoint, std::move(tables),
                                                restored_step, restored_worker_steps, std::move(disk_tier),
                                                std::move(replicas), recovered);
  FERRY_RETURN_IF_ERROR(server->StartMetrics());
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace ferry

