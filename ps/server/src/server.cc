// The parameter server: one I/O thread owns the ROUTER socket and every table; large updates
// and pulls are shared with a small compute pool. This file is the server's front: it reads
// and checks each message, dispatches it by kind, and answers. The jobs behind it each have
// their own file under internal/:
//   table_registry.h  the tables held here, and the checks that tie a request to them
//   updates.h         applying gradients (optimizer.h) and copying values out, with the pool
//   sync.h            sync aggregation: holding a step's gradients and closing the step
//   workers.h         the job's workers: count, finished, clocks, quorum and readiness
//   held.h            pulls that must wait, with their deadlines
//   collectives.h     barriers and all-reduce
#include "ferry/server.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include <sys/resource.h>

#include "absl/container/flat_hash_map.h"
#include "ferry/curve.h"
#include "ferry/mutex.h"
#include "ferry/messages/codec.h"
#include "ferry/messages/deadlines.h"
#include "ferry/messages/event_loop.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "ferry/metrics/http.h"
#include "internal/checkpoint.h"
#include "internal/collectives.h"
#include "internal/connections.h"
#include "internal/finite.h"
#include "internal/held.h"
#include "internal/request.h"
#include "internal/server_metrics.h"
#include "internal/sync.h"
#include "internal/table_builder.h"
#include "internal/table_registry.h"
#include "internal/thread_pool.h"
#include "internal/updates.h"
#include "internal/workers.h"

namespace ferry {
namespace {

using ps::Clock;
using ps::Request;
using ps::View;
using transport::Frames;
using wire::Header;
using wire::Kind;

// Counters kept by the server; names are the keys of ServerStats::counters.
enum Counter : int {
  kMessages,
  kBadMessages,
  kErrorsSent,
  kLateGradientsDropped,
  kUpdatesApplied,
  kPullsHeld,
  kHeldExpired,
  kBytesIn,
  kBytesOut,
  kCheckpointsSaved,
  kFailedForSilentWorker,
  kNonFinitePushesRefused,
  kNonFiniteRowsSkipped,
  kCurveRefused,
  kPermissionDenied,
  kHeldRefused,
  kConnectionsRefused,
  kConnectionsIdleClosed,
  kRankConflicts,
  kRepliesDropped,
  kWireValuesSaturated,
  kNumCounters
};
constexpr std::array<const char*, kNumCounters> kCounterNames = {
    "messages", "bad_messages", "errors_sent", "late_gradients_dropped", "updates_applied",
    "pulls_held", "held_expired", "bytes_in", "bytes_out", "checkpoints_saved", "failed_for_silent_worker",
    "nonfinite_pushes_refused", "nonfinite_rows_skipped", "curve_refused", "permission_denied", "held_refused",
    "connections_refused", "connections_idle_closed", "rank_conflicts", "replies_dropped",
    "wire_values_saturated"};
constexpr size_t kStalenessBuckets = ps::kTableStalenessBuckets;  // the server's and each table's
// Replies queued for one peer (the ROUTER socket's send high-water mark): twice a client's own
// bound on its requests in flight (ClientOptions::max_in_flight, 4096), so a client that keeps
// to it never loses a reply however slowly its side reads; a peer that sends without reading
// loses replies beyond it (counted as replies_dropped).
constexpr int kReplyQueue = 8192;

class ServerImpl final : public Server {
 public:
  // `tables`: empty, or restored from the checkpoint of `restored_step`.
  // `monitor`: receives `socket`'s ACCEPTED and DISCONNECTED events. `zap`: with CURVE, the
  // socket bound at ZeroMQ's ZAP endpoint that this server's handshakes ask; empty otherwise.
  ServerImpl(ServerOptions options, std::shared_ptr<Context> context, zmq::socket_t socket, zmq::socket_t monitor,
             zmq::socket_t zap, std::string endpoint, ps::TableRegistry tables, int64_t restored_step)
      : options_(std::move(options)),
        context_(std::move(context)),
        sockets_{std::move(socket), std::move(monitor), std::move(zap)},
        endpoint_(std::move(endpoint)),
        restored_step_(restored_step),
        pool_(options_.compute_threads),
        updater_(pool_),
        tables_(std::move(tables)),
        connections_(options_.max_connections, options_.idle_timeout) {
    if (options_.num_workers > 0) workers_.SetCount(options_.num_workers).IgnoreError();  // checked in Start
    tables_.ForEach([&](const ps::Table& t) { restored_tables_.push_back(t.spec.name); });
    std::ranges::sort(restored_tables_);
    if (options_.curve) {
      for (size_t r = 0; r < options_.curve->workers.size(); ++r) {
        worker_keys_[curve::Decode(options_.curve->workers[r])] = static_cast<int>(r);
      }
    }
    for (auto& c : counters_) c.store(0);
    for (auto& b : staleness_) b.store(0);
    thread_ = std::thread([this] { Loop(); });
  }

  ~ServerImpl() override { Stop(); }

  std::string endpoint() const override { return endpoint_; }
  int64_t restored_step() const override { return restored_step_; }
  std::string metrics_url() const override { return metrics_url_; }

  // Starts the metrics endpoint (ServerOptions::metrics_bind), if any; before the server is used.
  Status StartMetrics() {
    if (options_.metrics_bind.empty()) return Status::Ok();
    auto http = metrics::HttpEndpoint::Start(options_.metrics_bind, [this] { return MetricsPage(); });
    if (!http.ok()) return http.status().WithContext("ferry-ps rank " + std::to_string(options_.rank));
    metrics_http_ = std::move(*http);
    metrics_url_ = metrics_http_->url();
    return Status::Ok();
  }

  ServerStats stats() const override {
    ServerStats s;
    for (int i = 0; i < kNumCounters; ++i) s.counters[kCounterNames[i]] = counters_[i].load();
    for (auto& b : staleness_) s.staleness_histogram.push_back(b.load());
    // The memory budget (atomics, safe from any thread): refusals count up; the other two are
    // levels, not counters.
    const ps::MemoryBudget& budget = tables_.budget();
    s.counters["memory_budget_refused"] = budget.refusals();
    s.counters["memory_budget_bytes"] = budget.limit();
    s.counters["memory_budget_used_bytes"] = budget.used();
    s.counters["connections_open"] = connections_open_.load(std::memory_order_relaxed);
    s.counters["tables_being_created"] = tables_being_created_.load(std::memory_order_relaxed);
    s.counters["compute_threads"] = pool_.helpers();  // a level: the helper threads it runs
    // The sparse tables' row lifecycle, summed over tables (per table: the metrics page).
    const ps::RowLifecycleTotals& rows = tables_.lifecycle();
    s.counters["rows_admitted"] = rows.admitted.load(std::memory_order_relaxed);
    s.counters["rows_not_admitted"] = rows.not_admitted.load(std::memory_order_relaxed);
    s.counters["rows_evicted_age"] = rows.evicted_age.load(std::memory_order_relaxed);
    s.counters["rows_evicted_capacity"] = rows.evicted_capacity.load(std::memory_order_relaxed);
    // Per worker, only where non-zero: a job of many workers keeps its Stats reply small.
    MutexLock lock(&by_rank_mu_);
    for (size_t r = 0; r < used_by_rank_.size(); ++r) {
      if (used_by_rank_[r] != 0) s.counters["gradients_used_rank_" + std::to_string(r)] = used_by_rank_[r];
      if (dropped_by_rank_[r] != 0) s.counters["gradients_dropped_rank_" + std::to_string(r)] = dropped_by_rank_[r];
    }
    return s;
  }

  void Stop() override {
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

 private:
  void Count(Counter c, int64_t n = 1) { counters_[c].fetch_add(n, std::memory_order_relaxed); }

  // ---- the loop ----------------------------------------------------------------------------

  void Loop() {
    transport::EventLoop::Handlers h;
    // Out of memory while serving (HandleMessage answers its own errors): the request in hand is
    // lost, the server goes on; its client times out with a clear error.
    h.on_message = [this](size_t socket, Frames& frames, bool truncated) {
      try {
        if (socket == kZap) return OnZapRequest(frames);
        if (socket == kMonitor) return OnMonitorEvent(frames);
        HandleMessage(frames, truncated);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ferry-ps %d: %s while serving; continuing\n", options_.rank, e.what());
      }
    };
    h.on_wake = [this] {
      FinishFileJob();
      FinishBuilds();
      AnswerMetrics();
    };
    h.next_deadline = [this] {
      return transport::Earliest(transport::Earliest(held_.NextDeadline(), collectives_.NextDeadline()),
                                 transport::Earliest(NextLivenessCheck(), NextConnectionCheck()));
    };
    h.on_tick = [this] {
      try {
        ExpireHeld();
        CheckLiveness();
        CheckConnections();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ferry-ps %d: %s while expiring held requests; continuing\n", options_.rank, e.what());
      }
    };
    const Status s = transport::EventLoop::Run({sockets_.data(), options_.curve ? 3u : 2u}, waker_, stopping_, wire::kMaxFrames + 1, h);
    if (!s.ok()) std::fprintf(stderr, "ferry-ps %d: %s; stopping\n", options_.rank, s.message().c_str());
  }

  // Checks the message as a whole (header, frame count, size, payload shape) and dispatches it;
  // every refusal and failure is answered with an error naming the request.
  void HandleMessage(Frames& frames, bool truncated) {
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
    // among them (connections.h). Known ones need no look: this stays off the common path.
    if (req.fd >= 0 && !connections_.Tracks(req.fd)) DrainMonitor();
    // A connection refused for the cap gets only that refusal, once its request can be named.
    const Status refused = connections_.Heard(req.fd, req.peer(), req.arrived);
    // A malformed message: counted, logged (rate-limited, naming the peer) and answered.
    auto bad = [&](const Status& s) {
      Count(kBadMessages);
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
    if (bytes > options_.max_message_bytes) {
      return bad(ResourceExhaustedError("message of " + std::to_string(bytes) + " bytes exceeds this server's limit of " +
                                        std::to_string(options_.max_message_bytes) + " bytes"));
    }
    for (size_t i = 2; i < frames.size(); ++i) req.payload.push_back(std::move(frames[i]));
    s = wire::CheckPayloadShape(*header, req.payload, [this](uint64_t table_id) {
      const ps::Table* t = tables_.Find(table_id);
      return t ? wire::TableCoding{t->spec.wire, t->spec.topk_ratio} : wire::TableCoding{};
    });
    if (!s.ok()) return bad(s.WithContext(std::string(wire::KindName(req.h()->kind()))));
    try {
      s = Dispatch(req);
    } catch (const ps::BudgetExceeded& e) {
      LogRateLimited(std::string(e.what()) + "; refused");
      s = ResourceExhaustedError("server " + std::to_string(options_.rank) + ": " + e.what());
    } catch (const std::bad_alloc&) {
      s = ResourceExhaustedError("server " + std::to_string(options_.rank) + " ran out of memory serving this request");
    } catch (const zmq::error_t& e) {
      s = ResourceExhaustedError(std::string("server ") + std::to_string(options_.rank) + ": " + e.what());
    }
    if (!s.ok() && req.h()) SendError(req, s.WithContext(std::string(wire::KindName(req.h()->kind()))));
  }

  // ---- CURVE --------------------------------------------------------------------------------

  // One ZAP request from libzmq (RFC 27): [version][request id][domain][address][routing id]
  // [mechanism][client public key]. A key of one of the job's workers is accepted with that
  // worker's rank as its user id (every message of the connection carries it); any other key is
  // refused, counted and logged, and its peer never gets to send a message.
  void OnZapRequest(Frames& frames) {
    auto text = [&](size_t i) { return i < frames.size() ? frames[i].to_string() : std::string(); };
    std::string code = "400", status = "not one of this job's worker keys", user;
    int rank = -1;
    if (frames.size() >= 7 && text(5) == "CURVE") {
      if (auto it = worker_keys_.find(text(6)); it != worker_keys_.end()) rank = it->second;
    }
    if (rank >= 0) {
      code = "200", status = "OK", user = std::to_string(rank);
    } else {
      Count(kCurveRefused);
      const std::string key = frames.size() >= 7 ? curve::Encode(text(6)) : std::string();
      LogRateLimited("refused a connection from " + text(3) + ": its CURVE key " +
                     (key.empty() ? std::string("(none)") : key) + " is not one of this job's workers'");
    }
    Frames reply;
    for (const std::string& f : {std::string("1.0"), text(1), code, status, user, std::string()}) {
      reply.emplace_back(f.data(), f.size());
    }
    transport::Send(sockets_[kZap], reply).IgnoreError();
  }

  // The worker rank our ZAP handler gave the key of the connection `frame` came on; -1 if none.
  static int KeyRank(zmq::message_t& frame) {
    const char* user = zmq_msg_gets(frame.handle(), "User-Id");
    return user != nullptr && *user != '\0' ? std::atoi(user) : -1;
  }

  // CURVE: the rank a message speaks for must be its connection's key's. Hello, Stats and every
  // worker request carry the sender's rank.
  Status CheckKeyRank(const Request& req, int key_rank) {
    if (key_rank != req.h()->rank()) {
      return PermissionDeniedError("this connection's CURVE key is worker " +
                                   (key_rank >= 0 ? std::to_string(key_rank) : std::string("?")) +
                                   "'s; it cannot speak for worker " + std::to_string(req.h()->rank()));
    }
    return Status::Ok();
  }

  Status Dispatch(Request& req) {
    const Header& h = *req.h();
    switch (h.kind()) {
      case Kind::Hello: return OnHello(req);
      case Kind::Stats: return OnStats(req);
      default: break;
    }
    if (workers_.count() == 0) return FailedPreconditionError("no Hello yet: the client must handshake first");
    if (h.rank() < 0 || h.rank() >= workers_.count()) {
      return InvalidArgumentError("rank " + std::to_string(h.rank()) + " is outside [0, " +
                                  std::to_string(workers_.count()) + ")");
    }
    if (h.step() < 0 || h.step() > ps::kMaxStep) {
      return InvalidArgumentError("step " + std::to_string(h.step()) + " is outside [0, 2^62]");
    }
    FERRY_RETURN_IF_ERROR(ClaimRank(req, h.rank()));
    workers_.Heard(h.rank(), req.arrived);
    switch (h.kind()) {
      case Kind::Heartbeat: return Status::Ok();  // never answered: it only says the worker is alive
      case Kind::CreateTable: return OnCreateTable(req);
      case Kind::PushDense: return OnPushDense(req, /*then_pull=*/false);
      case Kind::PushPullDense: return OnPushDense(req, /*then_pull=*/true);
      case Kind::PullDense: return OnPullDense(req);
      case Kind::PullSparse:
      case Kind::PullSparseTables: return OnPullSparse(req);
      case Kind::PushSparse:
      case Kind::PushSparseTables: return OnPushSparse(req);
      case Kind::Clock: return OnClock(req);
      case Kind::Finish: return OnFinish(req);
      case Kind::Barrier:
      case Kind::AllReduce: return OnCollective(req);
      case Kind::Checkpoint: return OnCheckpoint(req);
      case Kind::CommitCheckpoint: return OnCommitCheckpoint(req);
      default:
        return InvalidArgumentError("a server does not accept " + std::string(wire::KindName(h.kind())) + " messages");
    }
  }

  // ---- replies -----------------------------------------------------------------------------

  void Send(Request& req, zmq::message_t header, Frames payload = {}) {
    Frames out;
    out.reserve(2 + payload.size());
    zmq::message_t routing;
    routing.copy(req.routing);
    out.push_back(std::move(routing));
    out.push_back(std::move(header));
    for (auto& p : payload) out.push_back(std::move(p));
    ObserveLatency(req);
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

  // The request's service time and wait (server_metrics.h), as its reply goes.
  void ObserveLatency(const Request& req) {
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

  void SendError(Request& req, const Status& s) {
    Count(kErrorsSent);
    const uint64_t id = req.h() ? req.h()->request_id() : 0;
    const Kind kind = req.h() ? req.h()->kind() : Kind::Invalid;
    Send(req, wire::MakeError(id, kind, s));
  }

  // A Reply header answering `request_kind` / `request_id`, for replies with fields of their own
  // (add them, everything built in `fbb` before this call, then finish).
  static wire::HeaderBuilder BeginReply(flatbuffers::FlatBufferBuilder& fbb, Kind request_kind, uint64_t request_id) {
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(Kind::Reply);
    b.add_request_kind(request_kind);
    b.add_request_id(request_id);
    return b;
  }

  void SendOk(Request& req, int64_t version = 0) { Send(req, wire::MakeReply(req.h()->request_id(), req.h()->kind(), version)); }

  // ---- handshake, tables, stats --------------------------------------------------------------

  Status OnHello(Request& req) {
    const Header& h = *req.h();
    if (h.num_servers() != options_.num_servers || h.server_rank() != options_.rank) {
      return FailedPreconditionError(
          "cluster mismatch: the client expects server rank " + std::to_string(h.server_rank()) + " of " +
          std::to_string(h.num_servers()) + " at " + endpoint_ + ", but this is server rank " +
          std::to_string(options_.rank) + " of " + std::to_string(options_.num_servers));
    }
    // Before Join: a Hello refused for speaking for a live worker changes nothing of it.
    const int num_workers = workers_.count() > 0 ? workers_.count() : h.num_workers();
    if (h.rank() >= 0 && h.rank() < num_workers) FERRY_RETURN_IF_ERROR(ClaimRank(req, h.rank()));
    const bool count_from_worker = workers_.count() == 0;  // no --num-workers, no worker yet
    FERRY_RETURN_IF_ERROR(workers_.Join(h.rank(), h.num_workers()));
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
    // A rank that connects again is a new process of that worker (the old one died): what the old
    // one left waiting goes, so the new one can push its step and enter its collectives again.
    ForEachSyncUnit([&](ps::Table&, int64_t, int64_t, ps::SyncSlots& sync) { ps::DropGradient(sync, h.rank()); });
    collectives_.Forget(h.rank());
    // The reply tells the client where the job is: the step of the checkpoint this server started
    // from, and (server 0) the id the next collective takes.
    flatbuffers::FlatBufferBuilder fbb(128);
    wire::HeaderBuilder b = BeginReply(fbb, Kind::Hello, h.request_id());
    b.add_version(std::max<int64_t>(restored_step_, 0));
    b.add_next_collective(collectives_.next_id());
    wire::FinishHeaderBuffer(fbb, b.Finish());
    Send(req, wire::ToFrame(fbb));
    return Status::Ok();
  }

  // Calls fn(table, chunk index (-1: the sparse shard), version, slots) for every unit of a sync
  // table held here: each dense chunk, each sparse shard.
  template <typename Fn>
  void ForEachSyncUnit(Fn&& fn) {
    tables_.ForEach([&](ps::Table& t) {
      if (t.spec.consistency != Consistency::kSync) return;
      if (t.sparse) return fn(t, int64_t{-1}, t.sparse->version, t.sparse->sync);
      for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
        if (ps::DenseChunk* c = t.dense->chunk(i)) fn(t, i, c->version, c->sync);
      }
    });
  }

  Status OnStats(Request& req) {
    ServerStats s = stats();
    flatbuffers::FlatBufferBuilder fbb(1024);
    std::vector<flatbuffers::Offset<wire::Counter>> cs;
    for (auto& [name, value] : s.counters) cs.push_back(wire::CreateCounter(fbb, fbb.CreateString(name), value));
    for (size_t i = 0; i < s.staleness_histogram.size(); ++i) {
      cs.push_back(wire::CreateCounter(fbb, fbb.CreateString("staleness_" + std::to_string(i)),
                                       s.staleness_histogram[i]));
    }
    auto vec = fbb.CreateVector(cs);
    wire::HeaderBuilder b = BeginReply(fbb, Kind::Stats, req.h()->request_id());
    b.add_counters(vec);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    Send(req, wire::ToFrame(fbb));
    return Status::Ok();
  }

  // A table is declared at once; its shard is made at once if small, or else aside
  // (table_builder.h) while this thread serves the others. Either way the request is answered
  // once the table is ready, and so is every declaration of it that arrives meanwhile.
  Status OnCreateTable(Request& req) {
    TableSpec spec;
    FERRY_RETURN_IF_ERROR(wire::SpecFromWire(req.h()->spec(), &spec));
    FERRY_RETURN_IF_ERROR(CheckRestoredHolds(spec.name));
    bool pending = false;
    auto declared = tables_.Declare(std::move(spec), req.h()->table_id(), workers_.count(), &pending);
    if (!declared.ok()) {
      if (declared.status().code() == StatusCode::kResourceExhausted) LogRateLimited(declared.status().message() + "; refused");
      return declared.status();
    }
    std::unique_ptr<ps::Table> table = std::move(*declared);
    if (table == nullptr && !pending) {
      SendOk(req);
      return Status::Ok();
    }
    if (table == nullptr) {  // being built: answered with it
      FERRY_RETURN_IF_ERROR(RoomToHold(req));
      req.held_by_peer = peer_load_.Acquire(req.peer());
      req.held = true;
      builds_[req.h()->table_id()].waiting.push_back(std::move(req));
      return Status::Ok();
    }
    const int64_t bytes = tables_.BuildBytes(*table);
    if (bytes < ps::kBuildAsideBytes) {
      if (Status s = tables_.Build(*table, workers_.count()); !s.ok()) {
        tables_.Forget(table->id);
        return s;
      }
      tables_.Adopt(std::move(table));
      SendOk(req);
      return Status::Ok();
    }
    Building& b = builds_[table->id];
    b.started = Clock::now();
    b.bytes = bytes;
    b.table = std::move(table);
    req.held = true;
    b.waiting.push_back(std::move(req));
    builder_.Submit(b.table.get(), workers_.count());
    tables_being_created_.store(static_cast<int64_t>(builds_.size()), std::memory_order_relaxed);
    return Status::Ok();
  }

  // A resumed job declares the tables it checkpointed: a table the restored checkpoint lacks
  // belongs to another model (a ctr checkpoint resumed with --model mlp), which would otherwise
  // start afresh beside the restored tables, in silence.
  Status CheckRestoredHolds(const std::string& name) const {
    if (restored_tables_.empty() || std::ranges::binary_search(restored_tables_, name)) return Status::Ok();
    std::string held;
    for (const std::string& t : restored_tables_) held += (held.empty() ? "'" : ", '") + wire::Printable(t) + "'";
    return FailedPreconditionError("table '" + wire::Printable(name) + "' is not in the checkpoint of step " +
                                   std::to_string(restored_step_) + " this server restored, which holds " + held +
                                   ": a resumed job declares the tables it saved (another model needs another "
                                   "--checkpoint-dir, or servers started without --restore)");
  }

  // On the I/O thread, after a wake-up: adopts the tables built aside and answers their
  // declarations (or fails them with why the table could not be made).
  void FinishBuilds() {
    for (auto& [table, status] : builder_.TakeDone()) {
      auto it = builds_.find(table->id);
      if (it == builds_.end()) continue;  // cannot happen: every submitted table is in builds_
      Building b = std::move(it->second);
      builds_.erase(it);
      tables_being_created_.store(static_cast<int64_t>(builds_.size()), std::memory_order_relaxed);  // before replies
      const std::string name = b.table->spec.name;
      const double seconds = std::chrono::duration<double>(Clock::now() - b.started).count();
      if (status.ok()) {
        tables_.Adopt(std::move(b.table));
        std::fprintf(stderr, "ferry-ps %d: created table '%s' (%lld MiB here) in %.1f s\n", options_.rank,
                     wire::Printable(name).c_str(), static_cast<long long>(b.bytes >> 20), seconds);
        for (Request& r : b.waiting) SendOk(r);
      } else {
        tables_.Forget(table->id);
        LogRateLimited("creating table '" + name + "' failed: " + status.message());
        for (Request& r : b.waiting) SendError(r, status.WithContext("CreateTable"));
      }
    }
  }

  void CountPush(int rank, int64_t used, int64_t dropped) {
    MutexLock lock(&by_rank_mu_);
    // One push message is one gradient of this worker: used if any of its parts counted.
    if (used > 0) {
      ++used_by_rank_[static_cast<size_t>(rank)];
    } else if (dropped > 0) {
      ++dropped_by_rank_[static_cast<size_t>(rank)];
    }
  }

  void RecordStaleness(ps::Table& t, int64_t staleness) {
    const size_t bucket = static_cast<size_t>(std::clamp<int64_t>(staleness, 0, kStalenessBuckets - 1));
    staleness_[bucket].fetch_add(1, std::memory_order_relaxed);
    t.counters.RecordStaleness(staleness);
  }

  // ---- metrics (ServerOptions::metrics_bind) ------------------------------------------------

  // On an HTTP thread: asks the I/O thread for the page and waits for it (2 s at most: none).
  std::optional<std::string> MetricsPage() {
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

  // On the I/O thread, after a wake-up: the page for every scrape waiting, from a snapshot of
  // the tables (which only this thread touches) and the counters.
  void AnswerMetrics() {
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
    std::string page = ps::ServerMetricsText(options_.rank, stats(), latencies_, tables);
    MutexLock lock(&metrics_mu_);
    metrics_page_ = std::move(page);
    metrics_answered_ = asked;
    metrics_cv_.SignalAll();
  }

  // ---- pushes ------------------------------------------------------------------------------

  Status OnPushDense(Request& req, bool then_pull) {
    const Header& h = *req.h();
    const int rank = h.rank();
    std::vector<ps::TableRegistry::SliceRef> refs;
    FERRY_RETURN_IF_ERROR(tables_.ResolveSlices(h, options_.max_message_bytes, &refs));
    // Compressed tables (1.6): each frame becomes the float32 gradient it encodes, checked (top-k
    // indices) before anything of the push is used; from here on every frame is float32.
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
    // Check every slice before touching any of them: finite values, and the sync preconditions.
    // The views (a copy only for a frame not aligned for float) serve the updates below too.
    std::vector<std::vector<float>> scratch(refs.size());
    std::vector<std::span<const float>> grads(refs.size());
    for (size_t i = 0; i < refs.size(); ++i) {
      const auto& r = refs[i];
      grads[i] = View<float>(req.payload[i], scratch[i]);
      if (const int64_t bad = ps::FirstNonFinite(grads[i]); bad >= 0) {
        return RefuseNonFinite(*r.table, " chunk " + std::to_string(h.slices()->Get(static_cast<uint32_t>(i))->chunk()),
                               "element " + std::to_string(bad), rank);
      }
      if (r.table->spec.consistency != Consistency::kSync) continue;
      FERRY_RETURN_IF_ERROR(ps::CheckSyncPush(r.table->spec, r.chunk->sync, r.chunk->version, rank, h.step()));
    }
    bool applied = false;
    wire::ReplyInfo info;
    const ps::Table* last = nullptr;
    for (size_t i = 0; i < refs.size(); ++i) {
      auto& [t, c] = refs[i];
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
        ps::HoldGradient(c->sync, rank, std::move(req.payload[i]));
        if (workers_.StepComplete(t->spec, c->sync)) {
          CloseSyncStep(*t, *c);
          applied = true;
        }
      } else {
        ++info.used;
        RecordStaleness(*t, c->version - c->last_pulled[static_cast<size_t>(rank)]);
        updater_.ApplyDense(t->spec.optimizer, *c, grads[i].data(), c->version + 1);
        ++c->version;
        Count(kUpdatesApplied);
        applied = true;
      }
    }
    CountPush(rank, info.used, info.dropped);
    if (!then_pull) {
      info.version = INT64_MAX;
      for (const auto& r : refs) info.version = std::min(info.version, r.chunk->version);
      Send(req, wire::MakeReply(h.request_id(), h.kind(), info));
    } else {
      // PushPullDense at step t: push for t, clock to t + 1, pull for t + 1.
      workers_.AdvanceClock(rank, h.step() + 1);
      req.pull_step = h.step() + 1;
      req.wait_from = Clock::now();
      req.info = info;
      req.payload.clear();
      HoldOrServe(std::move(req));
    }
    if (applied || then_pull) ServeHeld();
    return Status::Ok();
  }

  // One sparse table's part of a request: the table and where its frames are in the payload.
  // PullSparse / PushSparse carry one (the header names it); PullSparseTables / PushSparseTables
  // one per `sparse` entry (1.5).
  struct SparsePart {
    ps::Table* table = nullptr;
    size_t ids_frame = 0;
    size_t grads_frame = 0;  // pushes
  };

  StatusOr<std::vector<SparsePart>> SparseParts(const Header& h) {
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

  // A push of one or more sparse tables. Every part is checked (ids, non-finite values, memory,
  // sync step) before any is applied, so a refused push changes nothing.
  Status OnPushSparse(Request& req) {
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
      if (t.spec.consistency == Consistency::kSync) {
        FERRY_RETURN_IF_ERROR(ps::CheckSyncPush(t.spec, t.sparse->sync, t.sparse->version, rank, h.step()));
      }
    }
    FERRY_RETURN_IF_ERROR(RoomForRows(parts, ids));
    int64_t used = 0, dropped = 0, version = INT64_MAX;
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
        ps::HoldGradient(shard.sync, rank, std::move(req.payload[parts[i].ids_frame]),
                         std::move(req.payload[parts[i].grads_frame]));
        if (workers_.StepComplete(t.spec, shard.sync)) CloseSyncStep(shard);
      } else {
        RecordStaleness(t, shard.version - shard.last_pulled[static_cast<size_t>(rank)]);
        updater_.ApplyRows(shard, ids[i], grads[i].data());
        ++shard.version;
        Count(kUpdatesApplied);
      }
      ++used;
      ++t.counters.push_requests;
      t.counters.rows_pushed += rows;
      version = std::min(version, shard.version);
    }
    CountPush(rank, used, dropped);
    Send(req, wire::MakeReply(h.request_id(), h.kind(), {.version = version, .used = used, .dropped = dropped}));
    ServeHeld();
    return Status::Ok();
  }

  // OK when the rows of the parts' ids that do not exist yet fit in the memory budget;
  // otherwise RESOURCE_EXHAUSTED saying how many, how much and how much is left (counted,
  // logged), before any row is made.
  Status RoomForRows(std::span<const SparsePart> parts, std::span<const std::span<const int64_t>> ids) {
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

  // Values of a pull beyond the table's 16-bit range, sent as its largest value: counted, logged
  // (at most once a second).
  void CountSaturated(const TableSpec& spec, int64_t n) {
    Count(kWireValuesSaturated, n);
    LogRateLimited("table '" + spec.name + "': " + std::to_string(n) + " value(s) of a pull beyond " +
                   std::string(WireFormatName(spec.wire)) + "'s range sent as its largest (saturated)");
  }

  // A push whose gradient holds NaN or Inf: refused whole, counted, logged (at most once a second).
  Status RefuseNonFinite(const ps::Table& t, const std::string& part, const std::string& where, int rank) {
    Count(kNonFinitePushesRefused);
    const std::string what = "table '" + t.spec.name + "'" + part + ": the gradient of worker " + std::to_string(rank) +
                             " holds NaN or Inf (" + where + ")";
    LogRateLimited(what + "; refused");
    return InvalidArgumentError(what + ": server " + std::to_string(options_.rank) +
                                " refuses the push and applies nothing of it (parts sent to other servers are theirs "
                                "to check)");
  }

  // nonfinite=skip_rows: replaces the id and gradient frames of a sparse push with its rows that
  // are all finite; the others are counted, logged and dropped.
  void DropNonFiniteRows(const ps::Table& t, std::span<const int64_t> ids, std::span<const float> grads, int rank,
                         zmq::message_t* id_frame, zmq::message_t* grad_frame) {
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

  // One line on stderr, at most once a second; the lines held back are counted in the next one.
  void LogRateLimited(const std::string& line) {
    const auto now = Clock::now();
    if (now - last_log_ < std::chrono::seconds(1)) {
      ++logs_held_back_;
      return;
    }
    std::fprintf(stderr, "ferry-ps %d: %s", options_.rank, wire::Printable(line).c_str());
    if (logs_held_back_ > 0) std::fprintf(stderr, " (and %lld similar line(s) held back)", static_cast<long long>(logs_held_back_));
    std::fputc('\n', stderr);
    last_log_ = now;
    logs_held_back_ = 0;
  }

  void CloseSyncStep(const ps::Table& t, ps::DenseChunk& c) {
    ps::CloseSyncStep(updater_, t.spec, c, workers_.count());
    Count(kUpdatesApplied);
  }

  void CloseSyncStep(ps::SparseShard& shard) {
    ps::CloseSyncStep(updater_, shard, workers_.count());
    Count(kUpdatesApplied);
  }

  // The sparse table `table_id`, which the request says has rows of `dim`.
  StatusOr<ps::Table*> FindSparse(uint64_t table_id, int64_t dim) {
    FERRY_ASSIGN_OR_RETURN(ps::Table * t, tables_.Find(table_id, TableType::kSparse));
    if (dim != t->spec.dim) {
      return InvalidArgumentError("table '" + t->spec.name + "' has dim " + std::to_string(t->spec.dim) +
                                  ", the request says " + std::to_string(dim));
    }
    return t;
  }

  // ---- pulls -------------------------------------------------------------------------------

  Status OnPullDense(Request& req) {
    std::vector<ps::TableRegistry::SliceRef> refs;
    FERRY_RETURN_IF_ERROR(tables_.ResolveSlices(*req.h(), options_.max_message_bytes, &refs));
    req.pull_step = req.h()->step();
    HoldOrServe(std::move(req));
    return Status::Ok();
  }

  // A pull of one or more sparse tables; checked whole on arrival, served once every table is
  // ready (TryServe).
  Status OnPullSparse(Request& req) {
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

  // Serves a sparse pull once every table it reads is ready; false while one is not.
  bool TryServeSparse(Request& req) {
    const Header& h = *req.h();
    auto parts = SparseParts(h);  // tables cannot be dropped: what resolved on arrival still does
    if (!parts.ok()) return SendError(req, parts.status()), true;
    for (const SparsePart& p : *parts) {
      if (!workers_.Ready(p.table->spec, p.table->sparse->version, req.pull_step)) return false;
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
    updater_.ReadRows(reads);
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

  // Serves a pull whose condition holds; false when it must keep waiting. Tables cannot be
  // dropped, so the slices resolved on arrival still resolve.
  bool TryServe(Request& req) {
    const Header& h = *req.h();
    const size_t rank = static_cast<size_t>(h.rank());
    if (h.kind() == Kind::PullSparse || h.kind() == Kind::PullSparseTables) return TryServeSparse(req);
    std::vector<ps::TableRegistry::SliceRef> refs;
    if (Status s = tables_.ResolveSlices(h, options_.max_message_bytes, &refs); !s.ok()) return SendError(req, s), true;
    for (auto& r : refs) {
      if (!workers_.Ready(r.table->spec, r.chunk->version, req.pull_step)) return false;
    }
    req.released = Clock::now();
    req.info.held_us = req.waited_us();  // the wait, not the copies below
    Frames payload;
    payload.reserve(refs.size());
    int64_t version = INT64_MAX;
    const ps::Table* last = nullptr;
    std::vector<float> wide;
    for (auto& r : refs) {
      if (r.table != last) ++r.table->counters.pull_requests;  // a request's slices of one table count once
      last = r.table;
      r.table->counters.rows_pulled += r.chunk->size;
      const WireFormat w = r.table->spec.wire;
      zmq::message_t frame(static_cast<size_t>(r.chunk->size * wire::ValueBytes(w)));
      if (w == WireFormat::kF32) {
        updater_.ReadDense(*r.chunk, static_cast<float*>(frame.data()));
      } else {  // 1.6: read as float32, sent in the table's 16-bit format
        wide.resize(static_cast<size_t>(r.chunk->size));
        updater_.ReadDense(*r.chunk, wide.data());
        const int64_t saturated = wire::EncodeValues(w, wide.data(), r.chunk->size, frame.data());
        if (saturated > 0) CountSaturated(r.table->spec, saturated);
      }
      payload.push_back(std::move(frame));
      r.chunk->last_pulled[rank] = r.chunk->version;
      version = std::min(version, r.chunk->version);
    }
    req.info.version = version;
    Send(req, wire::MakeReply(h.request_id(), h.kind(), req.info), std::move(payload));
    return true;
  }

  void HoldOrServe(Request req) {
    if (TryServe(req)) return;
    if (Status s = RoomToHold(req); !s.ok()) return SendError(req, s);
    Count(kPullsHeld);
    req.held_by_peer = peer_load_.Acquire(req.peer());
    req.held = true;
    held_.Hold(std::move(req), Clock::now() + options_.max_wait);
  }

  // Whether `req` may wait here: the server's room (max_held) and its connection's share of it
  // (max_held_per_peer), so that one peer cannot fill the room for the others.
  Status RoomToHold(const Request& req) {
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
    return Status::Ok();
  }

  // Waiting requests: held pulls, collectives, and declarations of tables being built (few).
  size_t HeldCount() const {
    size_t n = held_.size() + collectives_.size();
    for (const auto& [id, b] : builds_) n += b.waiting.size();
    return n;
  }

  void ServeHeld() {
    held_.ServeReady([this](Request& r) { return TryServe(r); });
  }

  // ---- clocks, finishing, collectives --------------------------------------------------------

  Status OnClock(Request& req) {
    SendOk(req, workers_.AdvanceClock(req.h()->rank(), req.h()->step()));
    ServeHeld();
    return Status::Ok();
  }

  // The worker has ended its training: it is no longer waited for. Sync steps that were missing
  // only its gradient close now; ssp pulls no longer wait for its clock. A later Hello from the
  // same rank makes it take part again.
  Status OnFinish(Request& req) {
    workers_.Finish(req.h()->rank());
    ForEachSyncUnit([this](ps::Table& t, int64_t chunk, int64_t, ps::SyncSlots& sync) {
      if (!workers_.StepComplete(t.spec, sync)) return;
      if (chunk < 0) return CloseSyncStep(*t.sparse);
      CloseSyncStep(t, *t.dense->chunk(chunk));
    });
    SendOk(req);
    ServeHeld();
    return Status::Ok();
  }

  Status OnCollective(Request& req) {
    FERRY_RETURN_IF_ERROR(collectives_.CheckEntry(req));
    FERRY_RETURN_IF_ERROR(RoomToHold(req));
    req.held_by_peer = peer_load_.Acquire(req.peer());
    req.held = true;
    std::vector<Request> group = collectives_.Enter(std::move(req), Clock::now() + options_.max_wait, workers_.count());
    if (group.empty()) return Status::Ok();
    if (group[0].h()->kind() == Kind::AllReduce) {
      const std::vector<double> sum = ps::Collectives::Sum(group);
      for (auto& r : group) {
        Frames payload;
        payload.emplace_back(sum.data(), sum.size() * sizeof(double));
        Send(r, wire::MakeReply(r.h()->request_id(), r.h()->kind(), 0), std::move(payload));
      }
    } else {
      for (auto& r : group) SendOk(r);
    }
    return Status::Ok();
  }

  // ---- checkpoints -------------------------------------------------------------------------

  std::string Who() const { return "server " + std::to_string(options_.rank); }

  // Refuses a checkpoint request this server cannot take now.
  Status CheckpointPossible() const {
    if (options_.checkpoint_dir.empty()) {
      return FailedPreconditionError(Who() + " was started without a checkpoint folder (ferry-ps --checkpoint-dir)");
    }
    if (job_req_) return UnavailableError(Who() + " is still writing " + job_what_ + "; ask again once it is done");
    return Status::Ok();
  }

  // Checkpoint at `step`: the server copies its shard of every table (the pause), then writes the
  // copy on another thread while it goes on serving; the reply names the file once it is durable.
  Status OnCheckpoint(Request& req) {
    const int64_t step = req.h()->step();
    FERRY_RETURN_IF_ERROR(CheckpointPossible());
    // A sync checkpoint is a cut at one global step: every sync unit here must be at `step`.
    std::string off;
    ForEachSyncUnit([&](ps::Table& t, int64_t chunk, int64_t version, ps::SyncSlots&) {
      if (!off.empty() || version == step) return;
      off = "table '" + t.spec.name + "'" + (chunk >= 0 ? " chunk " + std::to_string(chunk) : "") + " is at step " +
            std::to_string(version);
    });
    if (!off.empty()) {
      return FailedPreconditionError(Who() + ": " + off + ", not " + std::to_string(step) +
                                     ": a sync checkpoint is a cut at one global step, taken after the workers' "
                                     "pull for that step and before their push of it");
    }
    const auto t0 = Clock::now();
    ps::ShardImage image = ps::SnapshotShard(tables_);
    const int64_t snapshot_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
    const uint64_t id = req.h()->request_id();
    RunFileJob(std::move(req), "the checkpoint of step " + std::to_string(step),
               [this, step, id, snapshot_us, image = std::move(image)]() mutable -> StatusOr<zmq::message_t> {
                 const auto w0 = Clock::now();
                 FERRY_ASSIGN_OR_RETURN(ps::ShardFile f, ps::WriteShardImage(options_.checkpoint_dir, options_.rank,
                                                                             options_.num_servers, step, std::move(image)));
                 const double write_s = std::chrono::duration<double>(Clock::now() - w0).count();
                 Count(kCheckpointsSaved);
                 std::printf("ferry-ps %d: checkpoint of step %lld: %s, %.1f MB in %.3f s (serving paused %.1f ms)\n",
                             options_.rank, static_cast<long long>(step), f.name.c_str(), static_cast<double>(f.bytes) / 1e6,
                             write_s, static_cast<double>(snapshot_us) / 1e3);
                 std::fflush(stdout);
                 flatbuffers::FlatBufferBuilder fbb(256);
                 std::vector<flatbuffers::Offset<wire::ShardFile>> files = {
                     wire::CreateShardFile(fbb, fbb.CreateString(f.name), f.bytes, f.crc32)};
                 auto vec = fbb.CreateVector(files);
                 wire::HeaderBuilder b = BeginReply(fbb, Kind::Checkpoint, id);
                 b.add_version(step);
                 b.add_shards(vec);
                 b.add_snapshot_us(snapshot_us);
                 wire::FinishHeaderBuffer(fbb, b.Finish());
                 return wire::ToFrame(fbb);
               });
    return Status::Ok();
  }

  // What a checkpoint of the tables held here means (the manifest says it).
  std::string CheckpointMeaning(int64_t step) const {
    int sync = 0, other = 0;
    tables_.ForEach([&](const ps::Table& t) { ++(t.spec.consistency == Consistency::kSync ? sync : other); });
    const std::string at = std::to_string(step);
    if (other == 0) return "sync: every server at global step " + at;
    if (sync == 0) return "async/ssp: each server's tables as they were when it saved (trainer step " + at + ")";
    return "sync tables at global step " + at + " on every server; async/ssp tables as each server had them when it saved";
  }

  // Every server has written its shard of `step`: write the manifest naming them, then CURRENT.
  Status OnCommitCheckpoint(Request& req) {
    const Header& h = *req.h();
    FERRY_RETURN_IF_ERROR(CheckpointPossible());
    std::vector<ps::ShardFile> shards;
    if (h.shards()) {
      for (const auto* f : *h.shards()) shards.push_back({f->file() ? f->file()->str() : "", f->bytes(), f->crc32()});
    }
    FERRY_RETURN_IF_ERROR(ps::CheckShardList(h.step(), shards));
    const int64_t step = h.step();
    const uint64_t id = h.request_id();
    RunFileJob(std::move(req), "the manifest of step " + std::to_string(step),
               [this, step, id, shards = std::move(shards), meaning = CheckpointMeaning(step)]() -> StatusOr<zmq::message_t> {
                 // Each shard must be on disk as its server reported it.
                 for (const auto& f : shards) {
                   const std::string path = options_.checkpoint_dir + "/" + f.name;
                   std::error_code ec;
                   const uintmax_t size = std::filesystem::file_size(path, ec);
                   if (ec || size != f.bytes) {
                     return FailedPreconditionError(Who() + ": " + path + (ec ? " is missing (" + ec.message() + ")" :
                                                    " has " + std::to_string(size) + " bytes, its server wrote " +
                                                    std::to_string(f.bytes)) +
                                                    ": do all servers share the checkpoint folder?");
                   }
                 }
                 FERRY_RETURN_IF_ERROR(ps::WriteManifest(options_.checkpoint_dir, step, shards, meaning, options_.keep_checkpoints));
                 return wire::MakeReply(id, Kind::CommitCheckpoint, step);
               });
    return Status::Ok();
  }

  // Runs `work` (file I/O) on its own thread; its reply, or its error, answers `req` from the
  // I/O thread once it is done (FinishFileJob). One job at a time.
  void RunFileJob(Request req, std::string what, std::function<StatusOr<zmq::message_t>()> work) {
    job_req_ = std::move(req);
    job_what_ = std::move(what);
    job_thread_ = std::thread([this, work = std::move(work)] {
      StatusOr<zmq::message_t> reply = InternalError("the file job threw");
      try {
        reply = work();
      } catch (const std::exception& e) {
        reply = ResourceExhaustedError(Who() + ": " + e.what());
      }
      {
        MutexLock lock(&job_mu_);
        job_done_ = std::move(reply);
      }
      waker_.Notify();
    });
  }

  // On the I/O thread, after a wake-up: answers the file job's request if it is done.
  void FinishFileJob() {
    std::optional<StatusOr<zmq::message_t>> done;
    {
      MutexLock lock(&job_mu_);
      done.swap(job_done_);
    }
    if (!done) return;
    job_thread_.join();
    Request req = std::move(*job_req_);
    job_req_.reset();
    if (done->ok()) return Send(req, std::move(**done));
    std::fprintf(stderr, "ferry-ps %d: %s failed: %s\n", options_.rank, job_what_.c_str(), done->status().message().c_str());
    SendError(req, done->status().WithContext(std::string(wire::KindName(req.h()->kind()))));
  }

  // ---- connections (connections.h) --------------------------------------------------------

  // The request's connection speaks for `rank`: refused while another live one does.
  Status ClaimRank(const Request& req, int rank) {
    const auto stale_after = 2 * workers_.promised(rank);
    auto claim = [&] { return connections_.Claim(req.fd, rank, req.arrived, stale_after, ps::PeerClosed); };
    Status s = claim();
    if (!s.ok()) {
      // Before refusing: what ZeroMQ has reported since (the owner may be gone already).
      DrainMonitor();
      s = claim();
    }
    if (!s.ok()) {
      Count(kRankConflicts);
      LogRateLimited("refused a request for worker " + std::to_string(rank) + ": " + s.message());
    }
    return s;
  }

  void DrainMonitor() {
    Frames frames;
    while (true) {
      frames.clear();
      bool got = false, truncated = false;
      if (!transport::RecvNonBlocking(sockets_[kMonitor], &frames, &got, 4, &truncated).ok() || !got) return;
      OnMonitorEvent(frames);
    }
  }

  // One event of the ROUTER socket's monitor: [uint16 event, uint32 value][endpoint].
  void OnMonitorEvent(Frames& frames) {
    const auto e = transport::ReadMonitorEvent(frames);
    if (!e) return;
    const int fd = static_cast<int>(e->value);
    const auto now = Clock::now();
    if (e->event == ZMQ_EVENT_ACCEPTED) {
      std::string peer = ps::PeerName(fd);
      const auto admit = connections_.Accepted(fd, peer, now);
      if (admit != ps::Connections::Admit::kYes) {
        Count(kConnectionsRefused);
        LogRateLimited("refused a connection from " + peer + ": " + std::to_string(connections_.admitted()) +
                       " are open, the limit (--max-connections " + std::to_string(connections_.max_connections()) +
                       ")" + (admit == ps::Connections::Admit::kRefuseNow ? "; closed" : "; its first request is told so"));
        if (admit == ps::Connections::Admit::kRefuseNow) ps::CloseConnection(fd);
      }
    } else if (e->event == ZMQ_EVENT_DISCONNECTED) {
      auto gone = connections_.Disconnected(fd, now);
      // Lost connections are logged, but not the expected ones: a finished worker's, and those
      // this server refused or closed itself (logged when it did).
      if (gone && !gone->refused && !gone->closed_here && !stopping_.load() && !workers_.finished(gone->rank)) {
        char open_for[32];
        std::snprintf(open_for, sizeof open_for, "%.1f s", std::chrono::duration<double>(gone->open_for).count());
        LogRateLimited((gone->rank >= 0 ? "worker " + std::to_string(gone->rank) + "'s connection" : std::string("a connection")) +
                       " from " + gone->peer + " closed after " + open_for +
                       (gone->rank >= 0 ? " before the worker finished (killed, or cut off?)" : ""));
      }
    }
    connections_open_.store(static_cast<int64_t>(connections_.open()), std::memory_order_relaxed);
  }

  std::optional<Clock::time_point> NextConnectionCheck() const {
    if (connections_.open() == 0) return std::nullopt;
    return last_connection_check_ + std::chrono::milliseconds(250);
  }

  // Closes the connections whose time is up (connections.h): refused ones after their grace,
  // idle ones.
  void CheckConnections() {
    const auto now = Clock::now();
    const auto next = NextConnectionCheck();
    if (!next || now < *next) return;
    last_connection_check_ = now;
    DrainMonitor();
    for (const auto& c : connections_.Due(now, [&](std::string_view routing) { return peer_load_.held(routing); })) {
      if (c.idle) Count(kConnectionsIdleClosed);
      LogRateLimited("closing a connection " + c.why);
      ps::CloseConnection(c.fd);
    }
  }

  // ---- deadlines ---------------------------------------------------------------------------

  // What a held pull still waits for: a sentence naming the workers, and their ranks.
  struct Waiting {
    std::string what;
    std::vector<int> ranks;
  };
  // With `silent`, `ranks` are only those whose silence blocks the pull: a sync step that can
  // still get its quorum from the others (backup workers) is not blocked.
  Waiting WaitingOn(const Request& req, const std::vector<int>* silent = nullptr) const {
    const Header& h = *req.h();
    auto describe = [&](const ps::Table& t, int64_t version, const ps::SyncSlots& sync, const std::string& part) {
      if (t.spec.consistency == Consistency::kSsp) {
        return Waiting{"table '" + t.spec.name + "' (ssp:" + std::to_string(t.spec.staleness) + ") waits for worker(s) " +
                           workers_.Behind(req.pull_step, t.spec.staleness),
                       workers_.BehindRanks(req.pull_step, t.spec.staleness)};
      }
      const bool blocked = silent == nullptr || !workers_.CanCompleteWithout(t.spec, sync, *silent);
      return Waiting{"table '" + t.spec.name + "'" + part + " is at step " + std::to_string(version) +
                         " and waits for the gradients of worker(s) " + workers_.MissingRanks(sync),
                     blocked ? workers_.Missing(sync) : std::vector<int>{}};
    };
    if (h.kind() == Kind::PullSparse) {
      const ps::Table* t = tables_.Find(h.table_id());
      if (t != nullptr && t->sparse) return describe(*t, t->sparse->version, t->sparse->sync, "");
    } else if (h.kind() == Kind::PullSparseTables && h.sparse()) {
      for (const auto* sl : *h.sparse()) {
        const ps::Table* t = tables_.Find(sl->table_id());
        if (t != nullptr && t->sparse && !workers_.Ready(t->spec, t->sparse->version, req.pull_step)) {
          return describe(*t, t->sparse->version, t->sparse->sync, "");
        }
      }
    } else if (h.slices()) {
      for (const auto* sl : *h.slices()) {
        const ps::Table* t = tables_.Find(sl->table_id());
        if (t == nullptr || !t->dense) continue;
        const ps::DenseChunk* c = t->dense->chunk(sl->chunk());
        if (c != nullptr && !workers_.Ready(t->spec, c->version, req.pull_step)) {
          return describe(*t, c->version, c->sync, " chunk " + std::to_string(sl->chunk()));
        }
      }
    }
    return {"its step was not reached", {}};
  }

  // ---- liveness ----------------------------------------------------------------------------

  std::chrono::milliseconds LivenessPeriod() const {
    return std::clamp<std::chrono::milliseconds>(options_.worker_timeout / 4, std::chrono::milliseconds(20),
                                                 std::chrono::seconds(1));
  }
  std::optional<Clock::time_point> NextLivenessCheck() const {
    if (options_.worker_timeout.count() <= 0 || workers_.count() == 0) return std::nullopt;
    return last_liveness_check_ + LivenessPeriod();
  }

  // A silent worker (Workers::Silent) will not send what others wait for: their held pulls and
  // collectives fail now, naming it. When every worker still training is silent, the job looks
  // gone: said once (the tables stay; a restarted job can go on with them).
  void CheckLiveness() {
    const auto now = Clock::now();
    const auto next = NextLivenessCheck();
    if (!next || now < *next) return;
    last_liveness_check_ = now;
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
    auto taken = collectives_.TakeIf(workers_.count(), [&](Kind kind, const std::vector<int>& missing) {
      return kind == Kind::Barrier ? all_silent(missing) : first_silent(missing) >= 0;
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

  void ExpireHeld() {
    const auto now = Clock::now();
    const std::string waited = std::to_string(options_.max_wait.count()) + " ms";
    for (Request& r : held_.TakeExpired(now)) {
      Count(kHeldExpired);
      SendError(r, DeadlineExceededError(std::string(wire::KindName(r.h()->kind())) + " for step " +
                                         std::to_string(r.pull_step) + " waited " + waited + " on server " +
                                         std::to_string(options_.rank) + ": " + WaitingOn(r).what +
                                         " (stopped, or fell behind?)"));
    }
    for (auto& c : collectives_.TakeExpired(now, workers_.count())) {
      for (auto& r : c.arrived) {
        Count(kHeldExpired);
        SendError(r, DeadlineExceededError(std::string(wire::KindName(r.h()->kind())) + " " + std::to_string(c.id) +
                                           " waited " + waited + " on server " + std::to_string(options_.rank) +
                                           " for worker(s) " + c.missing + " (" + std::to_string(c.arrived.size()) +
                                           " of " + std::to_string(workers_.count()) + " arrived)"));
      }
    }
  }

  const ServerOptions options_;
  std::shared_ptr<Context> context_;  // keeps the zmq context alive for the sockets
  // Owned by the I/O thread after construction: the server's ROUTER, its monitor, and (CURVE)
  // its ZAP socket.
  static constexpr size_t kMain = 0, kMonitor = 1, kZap = 2;
  std::array<zmq::socket_t, 3> sockets_;
  absl::flat_hash_map<std::string, int> worker_keys_;  // CURVE: raw public key -> worker rank
  const std::string endpoint_;
  const int64_t restored_step_;  // -1: started empty
  std::vector<std::string> restored_tables_;  // the names of the tables restored, sorted
  transport::Waker waker_;
  std::atomic<bool> stopping_{false};
  ps::ThreadPool pool_;

  // Everything below, to the counters, is owned by the I/O thread.
  ps::Updater updater_;  // uses pool_
  ps::TableRegistry tables_;
  ps::Workers workers_;
  ps::PeerLoad peer_load_;      // before held_ and collectives_: their requests' tokens point at it
  ps::HeldPulls held_;          // waiting pulls; with collectives_, at most options_.max_held
  ps::Collectives collectives_;
  Clock::time_point last_liveness_check_{};
  Clock::time_point last_log_{};  // LogRateLimited
  int64_t logs_held_back_ = 0;
  bool said_job_gone_ = false;  // since the workers last fell silent
  ps::Connections connections_;
  // Tables being built aside, by id: the table, and the declarations waiting for it (the first
  // is the one that started it). Before builder_, which is stopped (and joined) first.
  struct Building {
    std::unique_ptr<ps::Table> table;
    std::vector<Request> waiting;
    Clock::time_point started;
    int64_t bytes = 0;
  };
  absl::flat_hash_map<uint64_t, Building> builds_;
  std::atomic<int64_t> tables_being_created_{0};
  ps::TableBuilder builder_{&tables_, [this] { waker_.Notify(); }};
  Clock::time_point last_connection_check_{};
  std::atomic<int64_t> connections_open_{0};  // connections_.open(), for stats() from any thread

  std::array<std::atomic<int64_t>, kNumCounters> counters_;
  std::array<std::atomic<int64_t>, kStalenessBuckets> staleness_;
  mutable Mutex by_rank_mu_;  // Stats() reads these from any thread
  std::vector<int64_t> used_by_rank_ ABSL_GUARDED_BY(by_rank_mu_);     // push messages that counted
  std::vector<int64_t> dropped_by_rank_ ABSL_GUARDED_BY(by_rank_mu_);  // push messages dropped as late
  Mutex stop_mu_;  // serialises the join in Stop()
  ps::RequestLatencies latencies_;  // the I/O thread's
  std::unique_ptr<metrics::HttpEndpoint> metrics_http_;  // set by StartMetrics, reset by Stop
  std::string metrics_url_;                        // set by StartMetrics, before any other thread
  Mutex metrics_mu_;
  CondVar metrics_cv_;
  uint64_t metrics_asked_ ABSL_GUARDED_BY(metrics_mu_) = 0;     // scrapes asked for
  uint64_t metrics_answered_ ABSL_GUARDED_BY(metrics_mu_) = 0;  // ... answered, in order
  bool metrics_closed_ ABSL_GUARDED_BY(metrics_mu_) = false;    // Stop has begun: answer none
  std::string metrics_page_ ABSL_GUARDED_BY(metrics_mu_);

  // The file job (a checkpoint's shard or manifest) in progress: its request and what it is (I/O
  // thread), its thread (started and joined by the I/O thread, or by Stop once the loop ended),
  // and its outcome once done.
  std::optional<Request> job_req_;
  std::string job_what_;
  std::thread job_thread_;
  Mutex job_mu_;
  std::optional<StatusOr<zmq::message_t>> job_done_ ABSL_GUARDED_BY(job_mu_);

  // Last: starts after everything above is built. Joined only under stop_mu_.
  std::thread thread_ ABSL_GUARDED_BY(stop_mu_);
};

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
  if (options->context) return InvalidArgumentError(who + " needs the server's own Context (leave options.context unset)");
  if (options->bind.starts_with("inproc://")) return InvalidArgumentError(who + " needs tcp:// or ipc://, not inproc://");
  FERRY_RETURN_IF_ERROR(curve::CheckKeypair(options->curve->server, who + " server keypair"));
  const auto& workers = options->curve->workers;
  if (workers.empty()) return InvalidArgumentError(who + ": no worker keys");
  for (size_t r = 0; r < workers.size(); ++r) {
    FERRY_RETURN_IF_ERROR(curve::CheckPublicKey(workers[r], who + " key of worker " + std::to_string(r)));
  }
  const int n = static_cast<int>(workers.size());
  if (options->num_workers == 0) options->num_workers = n;
  if (options->num_workers != n) {
    return InvalidArgumentError(who + ": " + std::to_string(n) + " worker keys for a job of " +
                                std::to_string(options->num_workers) + " workers");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  if (options.num_servers < 1 || options.rank < 0 || options.rank >= options.num_servers) {
    return InvalidArgumentError("server rank " + std::to_string(options.rank) + " is outside [0, " +
                                std::to_string(options.num_servers) + ")");
  }
  if (options.max_message_bytes < 1024) return InvalidArgumentError("max_message_bytes must be at least 1024");
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
  if (options.curve) FERRY_RETURN_IF_ERROR(CheckCurveOptions(&options));
  if (options.memory_budget_bytes < 0) return InvalidArgumentError("memory_budget_bytes must be >= 0");
  if (options.idle_timeout.count() < 0) return InvalidArgumentError("idle_timeout must be >= 0");
  if (options.max_connections == 0) options.max_connections = DefaultMaxConnections();
  ps::TableRegistry tables(options.rank, options.num_servers, options.memory_budget_bytes);
  int64_t restored_step = -1;
  if (options.restore) {
    const std::string who = "ferry-ps rank " + std::to_string(options.rank);
    if (options.checkpoint_dir.empty()) return InvalidArgumentError(who + ": restore needs a checkpoint folder");
    if (options.num_workers == 0) return InvalidArgumentError(who + ": restore needs the job's worker count (--num-workers)");
    std::vector<std::string> skipped;
    auto ckpt = ps::ReadCheckpoint(options.checkpoint_dir, &skipped);
    if (!ckpt.ok()) return ckpt.status().WithContext(who);
    for (const auto& s : skipped) std::fprintf(stderr, "%s: passed over a checkpoint: %s\n", who.c_str(), s.c_str());
    try {
      FERRY_RETURN_IF_ERROR(ps::RestoreShard(*ckpt, options.rank, options.num_servers, options.num_workers, &tables)
                                .WithContext(who + ": restoring " + ckpt->manifest));
    } catch (const ps::BudgetExceeded& e) {
      return ResourceExhaustedError(who + ": restoring " + ckpt->manifest + ": " + e.what());
    }
    restored_step = ckpt->step;
  }
  auto context = options.context ? options.context : Context::Create(1);
  if (!transport::Waker().ok()) return InternalError("cannot create an eventfd (file descriptors exhausted?)");
  FERRY_ASSIGN_OR_RETURN(zmq::socket_t socket, transport::MakeSocket(transport::Zmq(*context), zmq::socket_type::router));
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
    socket.set(zmq::sockopt::sndhwm, kReplyQueue);
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
  auto server = std::make_unique<ServerImpl>(std::move(options), std::move(context), std::move(socket), std::move(monitor),
                                            std::move(zap), endpoint, std::move(tables), restored_step);
  FERRY_RETURN_IF_ERROR(server->StartMetrics());
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace ferry
