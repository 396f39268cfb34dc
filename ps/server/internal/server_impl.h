// ps/server/internal/server_impl.h — the parameter server behind ferry/server.h: one I/O thread
// owns the ROUTER socket and every table; large updates and pulls are shared with a small
// compute pool. One class, its methods in one file per job:
//   src/server.cc                the front: Start, the loop, reading and checking each message,
//                                dispatching it by kind (one route per kind: HandlerOf)
//   src/serving.cc               the serving core: replies, held requests, closing sync steps,
//                                expiry and liveness, the rate-limited log
//   src/peers.cc                 who may speak: CURVE keys, connections, a worker's rank
//   src/handlers/admin.cc        Hello, Stats, Heartbeat; the counters and the metrics page
//   src/handlers/tables.cc       CreateTable, and tables built aside
//   src/handlers/dense.cc        PushDense, PushPullDense, PullDense
//   src/handlers/sparse.cc       PullSparse(Tables), PushSparse(Tables)
//   src/handlers/collectives.cc  Clock, Finish, Barrier, AllReduce
//   src/handlers/checkpoints.cc  Checkpoint, CommitCheckpoint, and the file jobs behind them
// What each message kind is (its frames, whether it comes before Hello): ferry/messages/kinds.h.
// The parts the handlers use each have their own header here: table_registry.h, updates.h,
// sync.h, workers.h, held.h, collectives.h, connections.h, checkpoint.h.
//
// Thread-safety: as ferry/server.h; everything not marked otherwise is the I/O thread's.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ferry/mutex.h"
#include "ferry/server.h"
#include "ferry/messages/event_loop.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "ferry/metrics/http.h"
#include "internal/checkpoint.h"
#include "internal/collectives.h"
#include "internal/connections.h"
#include "internal/disk_readers.h"
#include "internal/held.h"
#include "internal/pieces.h"
#include "internal/recovery.h"
#include "internal/request.h"
#include "internal/server_metrics.h"
#include "internal/table_builder.h"
#include "internal/table_registry.h"
#include "internal/thread_pool.h"
#include "internal/updates.h"
#include "internal/workers.h"

namespace ferry::ps {

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
  kPiecesHeld,
  kPieceCallsRefused,
  kNonFiniteUpdatesRefused,
  kReplayedUpdatesSkipped,
  kFeedPages,
  kFeedRowsSent,
  kDiskTierErrors,
  kDiskTierRequestsHeld,
  kDiskTierRowsReadAhead,
  kDiskTierIoThreadWaits,
  kMovedAnswered,
  kUpdatesForwarded,
  kReplicaUpdatesApplied,
  kReplicaErrors,
  kConnectionsUnfinishedClosed,
  kNumCounters
};
inline constexpr std::array<const char*, kNumCounters> kCounterNames = {
    "messages", "bad_messages", "errors_sent", "late_gradients_dropped", "updates_applied",
    "pulls_held", "held_expired", "bytes_in", "bytes_out", "checkpoints_saved", "failed_for_silent_worker",
    "nonfinite_pushes_refused", "nonfinite_rows_skipped", "curve_refused", "permission_denied", "held_refused",
    "connections_refused", "connections_idle_closed", "rank_conflicts", "replies_dropped",
    "wire_values_saturated", "pieces_held", "piece_calls_refused", "nonfinite_updates_refused",
    "replayed_updates_skipped", "feed_pages", "feed_rows_sent", "disk_tier_errors",
    "disk_tier_requests_held", "disk_tier_rows_read_ahead", "disk_tier_io_thread_waits", "moved_answered",
    "updates_forwarded", "replica_updates_applied", "replica_errors", "connections_unfinished_closed"};
inline constexpr size_t kStalenessBuckets = kTableStalenessBuckets;  // the server's and each table's
// Replies queued for one peer (the ROUTER socket's send high-water mark): twice a client's own
// bound on its requests in flight (ClientOptions::max_in_flight, 4096), so a client that keeps
// to it never loses a reply however slowly its side reads; a peer that sends without reading
// loses replies beyond it (counted as replies_dropped).
inline constexpr int kReplyQueue = 8192;
// Of the backup's queue (kReplyQueue), what pushes leave to the sync closes no push waits for
// (ServerImpl::RoomToForward, ForwardSyncOps).
inline constexpr int kSyncOpsRoom = 64;
// What ZeroMQ's framing may add on the wire to a message's bytes (a frame's header, and with CURVE
// its command, nonce and MAC: at most 42 bytes for each of wire::kMaxFrames + 1 frames) and a
// handshake's bytes, with room: a connection may hold a message's limit and this (CheckConnections).
inline constexpr uint64_t kFramingAllowance = uint64_t{1} << 20;
// What connections that speak for no worker are judged by, at least, before the server's memory
// is looked at (CheckUnfinished): more than a handshake's bytes and ZeroMQ's heartbeats (a PING of
// 9 to 42 bytes a few seconds, never a message) over the idle timeout.
inline constexpr uint64_t kHoldingSome = uint64_t{64} << 10;
// What came of messages not finished since the last check that makes the next one come sooner.
inline constexpr uint64_t kArrivingMuch = uint64_t{64} << 10;
// The server's heap beyond what its budget charges (tables, held payloads) and an image it serves
// that is not taken for unfinished messages of connections that speak for no worker: replies
// being sent, buffers (CheckUnfinished).
inline constexpr uint64_t kMemorySlack = uint64_t{256} << 20;

class ServerImpl final : public Server {
 public:
  // `tables`: empty, or restored from the checkpoint of `restored_step`.
  // `monitor`: receives `socket`'s ACCEPTED and DISCONNECTED events. `zap`: with CURVE, the
  // socket bound at ZeroMQ's ZAP endpoint that this server's handshakes ask; with replication 2
  // (never with CURVE), the DEALER connected to this server's backup; empty otherwise.
  // `replicas`: with replication 2, the replica of server rank-1's slots (restored with `tables`).
  ServerImpl(ServerOptions options, std::shared_ptr<Context> context, zmq::socket_t socket, zmq::socket_t monitor,
             zmq::socket_t zap, std::string endpoint, ps::TableRegistry tables, int64_t restored_step,
             const std::vector<int64_t>& restored_worker_steps = {}, std::unique_ptr<ps::DiskTier> disk_tier = nullptr,
             std::unique_ptr<ps::TableRegistry> replicas = nullptr, ps::Recovered recovered = {});
  ~ServerImpl() override { Stop(); }

  std::string endpoint() const override { return endpoint_; }
  int64_t restored_step() const override { return restored_step_; }
  std::string metrics_url() const override { return metrics_url_; }
  bool left() const override { return left_.load(); }
  ServerStats stats() const override;  // handlers/admin.cc
  void Stop() override;
  std::vector<DenseUpdates> dense_updates() const override;  // handlers/admin.cc

  // Starts the metrics endpoint (ServerOptions::metrics_bind), if any; before the server is used.
  Status StartMetrics();  // handlers/admin.cc

 private:
  // A handler of one message kind (HandlerOf). An error it returns is answered by the front.
  using Handler = Status (ServerImpl::*)(Request&);

  void Count(Counter c, int64_t n = 1) { counters_[c].fetch_add(n, std::memory_order_relaxed); }

  // ---- the front (server.cc) -----------------------------------------------------------------

  void Loop();
  // Checks the message as a whole (header, frame count, size, payload shape) and dispatches it;
  // every refusal and failure is answered with an error naming the request.
  void HandleMessage(Frames& frames, bool truncated);
  // The worker rank our ZAP handler gave the key of the connection `frame` came on; -1 if none.
  static int KeyRank(zmq::message_t& frame);
  // CURVE: the rank a message speaks for must be its connection's key's. Hello, Stats and every
  // worker request carry the sender's rank.
  Status CheckKeyRank(const Request& req, int key_rank);
  Status Dispatch(Request& req);
  // The handler of `kind`; nullptr for a kind a server does not take (replies).
  static Handler HandlerOf(Kind kind);

  // ---- the serving core (serving.cc) ---------------------------------------------------------

  void Send(Request& req, zmq::message_t header, Frames payload = {});
  // The request's service time and wait (server_metrics.h), as its reply goes.
  void ObserveLatency(const Request& req);
  void SendError(Request& req, const Status& s);
  // A Reply header answering `request_kind` / `request_id`, for replies with fields of their own
  // (add them, everything built in `fbb` before this call, then finish).
  static wire::HeaderBuilder BeginReply(flatbuffers::FlatBufferBuilder& fbb, Kind request_kind, uint64_t request_id);
  void SendOk(Request& req, int64_t version = 0) {
    Send(req, wire::MakeReply(req.h()->request_id(), req.h()->kind(), version));
  }
  // One line on stderr, at most once a second; the lines held back are counted in the next one.
  void LogRateLimited(const std::string& line);

  void CountPush(int rank, int64_t used, int64_t dropped);
  void RecordStaleness(ps::Table& t, int64_t staleness);
  // Values of a pull beyond the table's 16-bit range, sent as its largest value: counted, logged
  // (at most once a second).
  void CountSaturated(const TableSpec& spec, int64_t n);
  // A push whose gradient holds NaN or Inf: refused whole, counted, logged (at most once a second).
  Status RefuseNonFinite(const ps::Table& t, const std::string& part, const std::string& where, int rank);

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
  // Closes the step of a sync unit; an update that would not be finite marks the table diverged
  // (NotFiniteUpdate), and the error is returned for the request that closed it.
  Status CloseSyncStep(ps::Table& t, ps::DenseChunk& c);
  Status CloseSyncStep(ps::Table& t);
  // An update of `t` whose result would not have been finite in the elements `nf` names (they
  // kept their values; `offset`: the chunk's first element, 0 for sparse rows): counted
  // (nonfinite_updates_refused), logged, the table marked diverged. `whose`: "worker 1's push", "the
  // sync step 12". The error for the request that carried it.
  Status NotFiniteUpdate(ps::Table& t, const ps::NotFinite& nf, int64_t offset, const std::string& whose);
  // The refusal of a push to (or a checkpoint of) a table marked diverged; OK for the others.
  Status Diverged(const ps::Table& t) const;
  // The refusal of anything of a table whose disk tier failed a sync step (Table::disk_failed);
  // OK for the others. Diverged includes it.
  Status DiskFailed(const ps::Table& t) const;

  // Serves a pull whose condition holds; false when it must keep waiting. Tables cannot be
  // dropped, so the slices resolved on arrival still resolve.
  bool TryServe(Request& req);
  void HoldOrServe(Request req);
  // Whether `req` may wait here: the server's room (max_held) and its connection's share of it
  // (max_held_per_peer), and room for its payload in the held payloads' bound and in its
  // connection's share of that (the bound over the job's workers), so that one peer cannot fill
  // either for the others. If so, charges them to `req` (held_by_peer, held_bytes) until it goes.
  Status RoomToHold(Request& req);
  // Waiting requests: held pulls, collectives, and declarations of tables being built (few).
  size_t HeldCount() const;
  void ServeHeld();

  // What a held pull still waits for: a sentence naming the workers, and their ranks.
  struct Waiting {
    std::string what;
    std::vector<int> ranks;
  };
  // With `silent`, `ranks` are only those whose silence blocks the pull: a sync step that can
  // still get its quorum from the others (backup workers) is not blocked.
  Waiting WaitingOn(const Request& req, const std::vector<int>* silent = nullptr) const;
  std::chrono::milliseconds LivenessPeriod() const;
  std::optional<Clock::time_point> NextLivenessCheck() const;
  // A silent worker (Workers::Silent) will not send what others wait for: their held pulls and
  // collectives fail now, naming it. When every worker still training is silent, the job looks
  // gone: said once (the tables stay; a restarted job can go on with them).
  void CheckLiveness();
  // A collective whose workers a held sync pull waits for (their gradients of the pull's step),
  // while the pull's own worker is missing from the collective, cannot complete: the pull waits
  // for them and they for it (a worker started without --resume into a job in progress waits at
  // the job's start barrier). Likewise a collective that a worker entered as the job's start
  // (Barrier `start`, 1.12; it pushed nothing since its Hello) while a worker missing from it is
  // training (pushed since its Hello, heard from since the start came): it may wait for the
  // first one's gradient on another server, where this one cannot see it, and never comes to a
  // start. Once they have waited kDeadlockAfter, the workers that hold it up (those the pull
  // waits for; the one at the start) are withdrawn from it with FAILED_PRECONDITION saying so,
  // instead of everyone waiting for max_wait; the others wait on. Run by CheckLiveness.
  static constexpr std::chrono::seconds kDeadlockAfter{2};
  void FailDeadlockedCollectives(Clock::time_point now);
  void ExpireHeld();

  // ---- who may speak (peers.cc) --------------------------------------------------------------

  // One ZAP request from libzmq (RFC 27): [version][request id][domain][address][routing id]
  // [mechanism][client public key]. A key of one of the job's workers is accepted with that
  // worker's rank as its user id (every message of the connection carries it); any other key is
  // refused, counted and logged, and its peer never gets to send a message.
  void OnZapRequest(Frames& frames);
  // The request's connection speaks for `rank`: refused while another live one does, unless
  // `take_over` (the Hello of a later incarnation of the worker).
  Status ClaimRank(const Request& req, int rank, bool take_over = false);
  // The request comes from the rank's current incarnation, or a later one (Workers); a replaced
  // process's request is refused, counted as a rank conflict and logged.
  Status CheckIncarnation(const Request& req, int rank);
  void DrainMonitor();
  // One event of the ROUTER socket's monitor: [uint16 event, uint32 value][endpoint].
  void OnMonitorEvent(Frames& frames);
  std::optional<Clock::time_point> NextConnectionCheck() const;
  // The heap's free memory back to the system (transport::GiveFreeMemoryBack) a second after a
  // refused message of 1 MiB or more (or of too many frames): its memory has no use to come. At
  // most once in 5 s (a trim walks every free chunk: an attacker cannot keep the thread at it).
  void NoteRefused(int64_t bytes, bool truncated, Clock::time_point now);
  // Gives the heap's free memory back a second on (CheckHeap), at most once in 5 s.
  void TrimSoon(Clock::time_point now);
  void CheckHeap(Clock::time_point now);
  // Closes the connections whose time is up (connections.h): refused ones after their grace,
  // idle ones.
  void CheckConnections();
  // What ZeroMQ holds of messages not finished: the connections to close (CheckConnections).
  void CheckUnfinished(Clock::time_point now);
  // The bytes the tables and replicas are charged (their memory budgets).
  int64_t TablesUsed() const;

  // ---- handshake, stats, metrics (handlers/admin.cc) -----------------------------------------

  Status OnHello(Request& req);
  Status OnStats(Request& req);
  Status OnHeartbeat(Request&) { return Status::Ok(); }  // never answered: it only says the worker is alive
  // Waiting (1.8): what this server holds the asking worker's requests for, one clause each
  // (held pulls: WaitingOn; collectives: Collectives::Describe), answered at once.
  Status OnWaiting(Request& req);
  // Changes (protocol 1.14, PROTOCOL.md "The change feed"): one page of a reader's round over a
  // table's rows (sparse) or chunks (dense) changed after its cursor (handlers/feed.cc).
  Status OnChanges(Request& req);
  // On an HTTP thread: asks the I/O thread for the page and waits for it (2 s at most: none).
  std::optional<std::string> MetricsPage();
  // On the I/O thread, after a wake-up: the page for every scrape waiting, from a snapshot of
  // the tables (which only this thread touches) and the counters.
  void AnswerMetrics();

  // ---- tables (handlers/tables.cc) -----------------------------------------------------------

  // A table is declared at once; its shard is made at once if small, or else aside
  // (table_builder.h) while this thread serves the others. Either way the request is answered
  // once the table is ready, and so is every declaration of it that arrives meanwhile.
  Status OnCreateTable(Request& req);
  // The reply to a CreateTable: the table's spec as this server holds it (1.9), whose chunking a
  // client of 1.9 routes by.
  void ReplyDeclared(Request& req, const TableSpec& spec);
  // A resumed job declares the tables it checkpointed: a table the restored checkpoint lacks
  // belongs to another model (a ctr checkpoint resumed with --model mlp), which would otherwise
  // start afresh beside the restored tables, in silence.
  Status CheckRestoredHolds(const std::string& name) const;
  // On the I/O thread, after a wake-up: adopts the tables built aside and answers their
  // declarations (or fails them with why the table could not be made).
  void FinishBuilds();

  // ---- dense tables (handlers/dense.cc) ------------------------------------------------------

  Status OnPushDense(Request& req) { return PushDense(req, /*then_pull=*/false); }
  Status OnPushPullDense(Request& req) { return PushDense(req, /*then_pull=*/true); }
  Status PushDense(Request& req, bool then_pull);
  // Everything a push must pass before any of it is applied: its slices resolve; (`values`) its
  // frames decode (compressed tables) and hold no NaN or Inf; the sync preconditions. Fills
  // `grads` with views of its frames (`scratch`: copies of frames not aligned for float).
  Status CheckPush(Request& req, std::vector<ps::TableRegistry::SliceRef>* refs,
                   std::vector<std::vector<float>>* scratch, std::vector<std::span<const float>>* grads,
                   bool values = true);
  // A checked push applied: its chunks updated (async, ssp) or its gradients held for their
  // step (sync), then its reply, or (then_pull) its pull served or held.
  void ApplyPush(Request& req, std::span<const ps::TableRegistry::SliceRef> refs,
                 std::span<const std::span<const float>> grads, bool then_pull);
  // A piece of a push call in pieces (1.10, pieces.h): checked and held; the call's last piece
  // applies them all, in order, or a refused piece ends the call with none applied.
  Status PushDensePiece(Request& req, bool then_pull);
  // Answers every held piece of an ended call with `why`, naming the call.
  void FailCall(ps::HeldCalls::Call c, const Status& why);
  // Compressed tables (1.6): each frame of the push becomes the float32 gradient it encodes,
  // checked (top-k indices) before anything of the push is used; from here on every frame is
  // float32. A frame that does not decode refuses the whole push, as a malformed message.
  Status DecodePush(Request& req, std::span<const ps::TableRegistry::SliceRef> refs);
  Status OnPullDense(Request& req);
  // TryServe for a dense pull (PullDense, PushPullDense).
  bool TryServeDense(Request& req);

  // ---- sparse tables (handlers/sparse.cc) ----------------------------------------------------

  // One sparse table's part of a request: the table and where its frames are in the payload.
  // PullSparse / PushSparse carry one (the header names it); PullSparseTables / PushSparseTables
  // one per `sparse` entry (1.5).
  struct SparsePart {
    ps::Table* table = nullptr;
    size_t ids_frame = 0;
    size_t grads_frame = 0;  // pushes
  };
  StatusOr<std::vector<SparsePart>> SparseParts(const Header& h);
  // The sparse table `table_id`, which the request says has rows of `dim`.
  StatusOr<ps::Table*> FindSparse(uint64_t table_id, int64_t dim);
  // A push of one or more sparse tables. Every part is checked (ids, non-finite values, memory,
  // sync step) before any is applied, so a refused push changes nothing.
  Status OnPushSparse(Request& req);
  // OK when the rows of the parts' ids that do not exist yet fit in the memory budget;
  // otherwise RESOURCE_EXHAUSTED saying how many, how much and how much is left (counted,
  // logged), before any row is made.
  Status RoomForRows(std::span<const SparsePart> parts, std::span<const std::span<const int64_t>> ids);
  // An async/ssp push of `step` by `rank` to table `t` after a restore: leaves out the rows whose
  // server at the checkpoint had taken that step of that worker (Table::replay), counted; the
  // kept rows go to the scratch vectors, which `ids` and `grads` then view.
  void SkipReplayedRows(const ps::Table& t, int64_t step, int rank, std::span<const int64_t>* ids,
                        std::span<const float>* grads, std::vector<int64_t>* id_scratch, std::vector<float>* g_scratch);
  // nonfinite=skip_rows: replaces the id and gradient frames of a sparse push with its rows that
  // are all finite; the others are counted, logged and dropped.
  void DropNonFiniteRows(const ps::Table& t, std::span<const int64_t> ids, std::span<const float> grads, int rank,
                         zmq::message_t* id_frame, zmq::message_t* grad_frame);
  // A pull of one or more sparse tables; checked whole on arrival, served once every table is
  // ready (TryServe).
  Status OnPullSparse(Request& req);
  // Serves a sparse pull once every table it reads is ready; false while one is not.
  bool TryServeSparse(Request& req);

  // ---- waiting for the disk tier's rows (disk_reads.cc) --------------------------------------
  //
  // The I/O thread never waits for the disk (README, "Embedding tables larger than memory"): a
  // sparse pull or push whose rows are on disk is held while the disk readers read them
  // (SparseShard's read-ahead), and the server serves the other requests meanwhile. Requests of one
  // connection stay in order: a request from a connection with one held waits behind it (a pull
  // after a push sees the push). At most kMaxDiskWaits requests and kMaxDiskWaitBytes of their
  // payloads and the rows being read for them wait; beyond, the I/O thread waits for a read to end (counted:
  // disk_tier_io_thread_waits). A request read ahead for is dispatched again, as it came.

  static constexpr size_t kMaxDiskWaits = 1024;
  static constexpr int64_t kMaxDiskWaitBytes = int64_t{256} << 20;
  // A request's ids to read from disk go to the readers in up to one piece each, of at least this many.
  static constexpr size_t kMinReadPiece = 8;
  // Whether `req` waits (taken: moved from): its rows on disk being read, or behind its
  // connection's requests that wait. Called by Dispatch once the request may be served.
  bool WaitForDisk(Request& req);
  // On the I/O thread, after a wake-up: keeps the rows read, and dispatches the requests whose
  // reads are done, in order of arrival per connection.
  void FinishDiskReads();
  // A request that waited too long for the disk (10 s) is said, at most once in 10 s.
  void CheckDiskWaits(Clock::time_point now);
  // Dispatch, answering its failure (HandleMessage's end; a request that waited, again).
  void DispatchAndAnswer(Request& req);

  // ---- clocks, finishing, collectives (handlers/collectives.cc) ------------------------------

  Status OnClock(Request& req);
  // The worker has ended its training: it is no longer waited for. Sync steps that were missing
  // only its gradient close now; ssp pulls no longer wait for its clock. A later Hello from the
  // same rank makes it take part again. One that `leaves` (1.18) is out of the collectives too:
  // those that then hold every worker that takes part complete.
  Status OnFinish(Request& req);
  Status OnCollective(Request& req);
  // Answers a complete collective's requests (in rank order): an all-reduce's sum, or OK.
  void Complete(std::vector<Request>& group);
  // Closes every sync step that has all it waits for now (after a Finish, or a Hello of a worker
  // that joins later, 1.18); the first refusal of an update that would not be finite.
  Status CloseCompleteSteps();
  // A sync push of `rank` for `step`, before the step its Hello said it joins at (1.18): refused.
  Status CheckJoined(int rank, int64_t step) const;

  // ---- placement versions (handlers/placement.cc) ---------------------------------------------

  // A placed request (kinds.h) names the map its client placed it by: another than this
  // server's is refused whole as "moved", with this server's map (true: answered so).
  bool AnswerMoved(Request& req);
  // This server's map, into a reply or error header being built (its vector built before).
  flatbuffers::Offset<flatbuffers::Vector<uint16_t>> PlacementVector(flatbuffers::FlatBufferBuilder& fbb) const;
  // Placement: adopt the request's map, taking over from the checkpoint of its step (HandOver);
  // with `full` false only checks that it could (the first of the client's two rounds).
  Status OnPlacement(Request& req);
  // MoveAsk (1.24), to server 0: keeps the asked move (a server to join or drain, checked against
  // the map held here) until a Barrier that takes moves hands it to the workers (Complete).
  Status OnMoveAsk(Request& req);
  // A move asked by a MoveAsk (1.24): a server to join, or one to drain; 1.26: or a worker to
  // leave the job.
  struct AskedMove {
    int join = -1;
    int drain = -1;
    int leave_worker = -1;
    int rejoin_worker = -1;  // 1.27
    Clock::time_point at;
    std::string What() const {
      return join >= 0           ? "server " + std::to_string(join) + " to join"
             : drain >= 0        ? "server " + std::to_string(drain) + " to leave (drained)"
             : leave_worker >= 0 ? "worker " + std::to_string(leave_worker) + " to leave the job"
                                 : "worker " + std::to_string(rejoin_worker) + " to join the job again";
    }
  };
  // The reply to a worker's rejoin asked (1.27): `joins_at` the step it takes part from, once its
  // join is handed (0: not yet), and the id of the job's next collective.
  Status AnswerRejoin(Request& req, int64_t joins_at);
  // The id of the second barrier of the latest join handed (1.27; -1: none): a worker resumed at
  // the hand-over's step enters it while it has not ended (the Hello reply's rejoin_barrier).
  int64_t rejoin_barrier_ = -1;
  // OK when the map held here can make `asked` (Placement::Grow or Drain), or the worker it asks
  // to leave takes part in the job, else why not.
  Status AskedMoveFits(const AskedMove& asked) const;
  // OK where this server's slots can move (a Placement or a MoveAsk): not while it keeps replicas.
  Status MovesPossible() const;
  // Servers leaving (1.20, ServerOptions::exit_when_drained): once the map held here leaves this
  // server no slot, it waits until every worker holds that map (or a later one), then leaves.
  // Starts the wait (the map was just adopted, or restored: `restored`, when no worker can hold
  // an older map that names this server).
  void BeginLeaving(bool restored);
  // Worker `rank` holds the map of `version` (a request or heartbeat named it, or a "moved" reply
  // carried it).
  void HeardMapOf(int rank, uint64_t version) {
    if (leaving_ && version >= leaving_->version && rank >= 0 && static_cast<size_t>(rank) < leaving_->holds.size()) {
      leaving_->holds[static_cast<size_t>(rank)] = true;
    }
  }
  // On the tick: leaves once no worker may still send here; says whom it waits for, every 10 s.
  void CheckLeaving();

  // ---- replicas (handlers/replicas.cc; protocol 1.21, PROTOCOL.md "Replicas") ---------------
  //
  // With replication 2 every server keeps a replica of server rank-1's slots (replicas_, a
  // registry placed as that server's) and is the backup of its own at server rank+1. A primary
  // forwards each update it applied (the gradients as applied: after decoding, and without the
  // rows or chunks it skipped) to its backup, on one connection, in the order applied, so that the
  // backup's optimizer makes the same bits; the push is answered once the backup has applied them.

  bool Replicating() const { return replicas_ != nullptr; }
  int BackupRank() const { return (options_.rank + 1) % options_.num_servers; }
  int PrimaryRank() const { return (options_.rank + options_.num_servers - 1) % options_.num_servers; }
  // A declaration a replica cannot follow yet: sparse tables with lifecycle settings or a disk
  // tier (what they keep depends on pulls too), top-k tables (a forwarded push would be the
  // chunks decoded whole).
  // FAILED_PRECONDITION saying so; OK for the others, or without replication.
  Status ReplicaRefusal(const TableSpec& spec) const;
  // What one push applied, for the backup: the Replicate message's dense slices or sparse
  // entries, and their frames (float32 gradients; sparse: ids, then rows).
  struct Forward {
    std::vector<wire::DenseSlice> dense;
    std::vector<wire::SparseSlice> sparse;
    std::vector<int64_t> versions;  // each part's chunk or shard version before the update
    std::vector<uint8_t> ops;       // each part's SyncOp (1.23); kApplied for every part of async tables
    std::vector<int32_t> counts;    // each part's gradients held after its op (sync_counts; 0 if applied)
    std::vector<std::pair<uint64_t, int64_t>> closes;  // the units (table id, chunk; -1: sparse) it closed
    Frames frames;
    bool empty() const { return versions.empty(); }
    bool any_sync() const {
      return std::ranges::any_of(ops, [](uint8_t o) { return o != 0; });
    }
  };
  // 1.23 Replicate `sync_ops`: what the primary did with a part of a sync table.
  enum SyncOp : uint8_t { kApplied = 0, kHeld = 1, kHeldAndClosed = 2, kClosed = 3, kDropped = 4 };
  // The Replicate of `fwd`, as request `id` for worker `rank`'s `step`, queued for the backup
  // without blocking (a full queue: UNAVAILABLE, nothing queued).
  Status SendReplicate(uint64_t id, int rank, int64_t step, Forward& fwd);
  // Sync steps closed with no push to answer (a worker finished or left): forwarded to the backup,
  // whose answer nobody awaits (lost with a dead primary, they are redone by its replacement:
  // CloseCompleteSteps once it starts). Awaited all the same: its closes hold the pulls back.
  // (kDropped, 1.23: this primary no longer sends it, a Hello keeps held gradients; a backup takes it.)
  void ForwardSyncOps(Forward fwd);
  // A sync part (no frames: ForwardHold adds a held gradient's) of unit `chunk` (-1: the sparse shard) at `version`
  // (a Replicate's parts are of one kind: dense and sparse ones go in two).
  // `received`: the gradients the unit holds after the op, before a close.
  static void AddSyncOp(Forward& fwd, const ps::Table& t, int64_t chunk, int64_t version, SyncOp op, int received);
  // The sync slots of unit `chunk` (-1: the sparse shard) of table `table` here, or null.
  ps::SyncSlots* UnitSync(uint64_t table, int64_t chunk);
  // A sync part's held gradient (its copy; the hold keeps its own) for the backup.
  void ForwardHold(Forward& fwd, const ps::Table& t, int64_t chunk, int64_t version, const ps::SyncSlots& sync,
                   int rank, bool closed);
  // Before a push is applied (replication 2): room for its `bytes` to wait for the backup, in the
  // held requests' count and the held payloads' bound; RESOURCE_EXHAUSTED (nothing applied) when
  // the backup is that far behind. OK without replication.
  Status RoomToForward(int64_t bytes);
  // The frame of gradients `applied` (a view of `frame`, or of a copy): `frame` itself when it is
  // the view's, else a copy.
  static zmq::message_t Applied(zmq::message_t& frame, std::span<const std::byte> applied);
  // Answers a push with `refused` (its first refusal, if any) or its reply (`info`; PushPullDense:
  // then serves its pull): now, or, when it applied updates (`fwd` not empty), once the backup
  // has applied them too (OnBackupReply). Serves the held pulls its updates may release.
  void AnswerPush(Request& req, Forward fwd, Status refused, wire::ReplyInfo info, bool then_pull);
  void FinishPush(Request& req, const Status& refused, const wire::ReplyInfo& info, bool then_pull);
  // The backup's side: applies a primary's updates to the replica, in the order they come.
  Status OnReplicate(Request& req);
  // A sync unit's version as pulls see it (1.23): without its closes the backup has not confirmed,
  // so no worker computes from a step a replacement might not have.
  static int64_t Settled(int64_t version, const ps::SyncSlots& sync) { return version - sync.closes_unconfirmed; }
  // Closes the replica's sync step of chunk `c` (null: of the sparse shard) of `t`, as its primary did.
  void CloseReplicaStep(ps::Table* t, ps::DenseChunk* c);
  // The replica of table `id` (made on first use from the declaration held here).
  StatusOr<ps::Table*> ReplicaTable(uint64_t id, TableType type);
  // The primary's side: the backup's answer to a Replicate (the DEALER's frames: its header).
  void OnBackupReply(Frames& frames);
  // Pushes whose backup has not answered within BackupTimeout fail, naming it.
  void ExpireBackupWaits(Clock::time_point now);
  std::optional<Clock::time_point> NextBackupDeadline() const;
  std::chrono::milliseconds BackupTimeout() const;
  // Failover (1.22, PROTOCOL.md "Failover"): a replacement server, before it listens, asks its
  // backup for the image of its own slots (the backup's replica) and its primary for the image of
  // the primary's (Snapshot, in pages). The image is taken at the first page and kept for the
  // others (one at a time). The primary's updates that waited for the dead backup are in it:
  // once its last page went, their pushes are answered. A replica's image fences its old
  // primary: a Replicate of an earlier incarnation than the replacement's is refused from then on.
  Status OnSnapshot(Request& req);
  // Pushes applied here whose Replicate (id at most `upto`) the backup's replacement took in an
  // image: answered now.
  void ConfirmTakenInImage(uint64_t upto);
  struct ServedImage {
    uint64_t epoch = 0;
    int rank = -1;  // whose slots it holds
    std::vector<char> blob;  // recovery.h's format
    uint64_t covers = 0;     // own slots: the Replicates sent before it was taken
    uint32_t incarnation = 0;  // own slots: this server's; a replica: its replaced primary's
    Clock::time_point until;
  };
  static constexpr std::chrono::seconds kImageKeep{60};  // after its last page was asked for

  // Stats with `digests`: each table's digest here, and its replica's (PROTOCOL.md, "Replicas").
  // They read every row on the I/O thread: after digests that took d, more are refused
  // (UNAVAILABLE) for 4 d, so that no peer can keep the server at them more than a fifth of its time.
  Status AddDigests(flatbuffers::FlatBufferBuilder& fbb, std::vector<flatbuffers::Offset<wire::Counter>>* out);
  // A replica table out of step with its primary (a Replicate refused or lost): why, by table id.
  // It takes no more updates (each is refused, failing its push), until the job restarts.
  Status OutOfStep(const ps::Table& t, std::string why);

  // A push applied here, waiting for its backup (I/O thread), by its Replicate's id.
  struct AwaitingBackup {
    bool answers = true;  // a push's (false: ForwardSyncOps', which answers no request)
    std::vector<std::pair<uint64_t, int64_t>> closes;  // its sync closes, which pulls wait for (Settled)
    Request req;
    Status refused;
    wire::ReplyInfo info;
    bool then_pull = false;
    Clock::time_point sent;
    ps::BudgetCharge charge;  // the bytes forwarded, on the held payloads' bound until confirmed
  };
  // The entry of Replicate `id`, sent now, which forwarded `fwd`: its closes (taken from `fwd`) are
  // hidden from pulls until it is confirmed.
  AwaitingBackup& Await(uint64_t id, Forward& fwd);
  // The closes of `a` are confirmed (or given up on): pulls may see them. True if it had any.
  bool SettleCloses(const AwaitingBackup& a);
  // Answers what waited in `a` for its backup, which confirmed it (or the image that held it).
  void AnswerAwaited(AwaitingBackup& a);
  // What `a` forwarded, said in a failure: "... worker 3's push of step 7", or the like.
  static std::string Forwarded(const AwaitingBackup& a);

  // ---- checkpoints (handlers/checkpoints.cc) -------------------------------------------------

  std::string Who() const { return "server " + std::to_string(options_.rank); }
  // Refuses a checkpoint request this server cannot take now.
  Status CheckpointPossible() const;
  // A checkpoint's shards are all of one map: a CommitCheckpoint whose shards were written under
  // another placement version than this server's (the client says which, from the Checkpoint
  // replies) is refused (FAILED_PRECONDITION; 0: a client before 1.17).
  Status SamePlacement(const Header& h) const;
  // Checkpoint at `step`: the server copies its shard of every table (the pause), then writes the
  // copy on another thread while it goes on serving; the reply names the file once it is durable.
  Status OnCheckpoint(Request& req);
  // Checkpoint with another `server_rank` (1.20): server 0 writes that server's shard, empty, if
  // it owns no slot.
  Status StandInShard(Request& req, int rank);
  // What a checkpoint of the tables held here means (the manifest says it).
  std::string CheckpointMeaning(int64_t step) const;
  // The steps of worker `rank` this server holds whole (1.25, ps::WholeStep; -1: none known):
  // where it resumes, its Hello reply says.
  int64_t WorkerStepKnown(int rank) const;
  // Every server has written its shard of `step`: write the manifest naming them, then CURRENT.
  Status OnCommitCheckpoint(Request& req);
  // Runs `work` (file I/O) on its own thread; its reply, or its error, answers `req` from the
  // I/O thread once it is done (FinishFileJob). One job at a time.
  void RunFileJob(Request req, std::string what, std::function<StatusOr<zmq::message_t>()> work);
  // On the I/O thread, after a wake-up: answers the file job's request if it is done.
  void FinishFileJob();

  // ---- state ---------------------------------------------------------------------------------

  const ServerOptions options_;
  std::shared_ptr<Context> context_;  // keeps the zmq context alive for the sockets
  // Owned by the I/O thread after construction: the server's ROUTER, its monitor, and (CURVE)
  // its ZAP socket.
  // kBackup (replication 2) shares its place with kZap (CURVE): a server has one or the other.
  static constexpr size_t kMain = 0, kMonitor = 1, kZap = 2, kBackup = 2;
  std::array<zmq::socket_t, 3> sockets_;
  absl::flat_hash_map<std::string, int> worker_keys_;  // CURVE: raw public key -> worker rank
  absl::flat_hash_map<std::string, int> reader_keys_;  // CURVE: raw public key -> reader rank (read only)
  const std::string endpoint_;
  const int64_t restored_step_;  // -1: started empty
  std::vector<std::string> restored_tables_;  // the names of the tables restored, sorted
  transport::Waker waker_;
  std::atomic<bool> stopping_{false};
  ps::ThreadPool pool_;

  // Everything below, to the counters, is owned by the I/O thread.
  ps::Updater updater_;  // uses pool_
  std::unique_ptr<ps::DiskTier> disk_tier_;  // --disk-tier-dir (the tables' shards use it: declared before them)
  ps::TableRegistry tables_;
  // The payloads of requests held while they wait (RoomToHold): at most a quarter of the tables'
  // budget, beside it.
  ps::MemoryBudget held_payloads_{std::max<int64_t>(tables_.budget().limit() / 4, 1)};
  ps::Workers workers_;
  ps::PeerLoad peer_load_;      // before held_ and collectives_: their requests' tokens point at it
  ps::HeldPulls held_;          // waiting pulls; with collectives_, at most options_.max_held
  ps::Collectives collectives_;
  ps::HeldCalls calls_;  // push calls in pieces (1.10); their pieces count as held requests
  // Replication 2 (handlers/replicas.cc): the replica of server rank-1's slots, placed as that
  // server's, and the pushes applied here that wait for the backup (ids rise: in the order sent).
  std::unique_ptr<ps::TableRegistry> replicas_;
  std::map<uint64_t, AwaitingBackup> awaiting_backup_;
  uint64_t next_replicate_ = 0;
  Clock::time_point backup_said_{};  // the last log of a backup's silence
  Clock::time_point backup_waits_said_{};  // the last log of pushes waiting for a silent backup
  // Failover (1.22): this process's incarnation as a primary (a replacement's is its
  // predecessor's + 1; on Replicate), and of the primary this replica follows: Replicates of an
  // incarnation below replica_fence_ are refused (a replaced primary's). replica_recovered_: the
  // replica came from the primary's image, so a Replicate it holds already (below its version) is
  // confirmed without being applied again.
  const uint64_t process_epoch_ = ps::NewProcessEpoch();  // 1.22: in the Hello reply (never 0)
  uint32_t incarnation_ = 0;
  uint32_t primary_incarnation_ = 0;
  uint32_t replica_fence_ = 0;
  bool replica_recovered_ = false;
  // The primary's image the replica came from: its incarnation, and its Replicates (by id) it held.
  uint32_t replica_image_incarnation_ = 0;
  uint64_t replica_image_covers_ = 0;
  std::optional<ServedImage> image_;
  uint64_t next_image_epoch_ = 0;
  absl::flat_hash_map<uint64_t, std::string> out_of_step_;  // replica tables (OutOfStep)
  Clock::time_point digests_since_{};                       // AddDigests: none before then
  Clock::time_point last_liveness_check_{};
  std::optional<Clock::time_point> next_heap_check_;  // NoteRefused
  Clock::time_point last_heap_trim_{};
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
  // The disk tier's readers (with disk_tier_ only), and the requests waiting for them, in order of
  // arrival; after tables_ (their jobs point at its shards): stopped first.
  std::unique_ptr<ps::DiskReaders> readers_;
  struct DiskWait {
    Request req;
    int pending = 0;  // its reads not done
    int64_t bytes = 0;
  };
  std::deque<std::unique_ptr<DiskWait>> disk_waits_;
  absl::flat_hash_map<std::string, int> disk_waits_by_peer_;
  int64_t disk_wait_bytes_ = 0;
  Clock::time_point disk_wait_said_{};
  std::atomic<int64_t> disk_waiting_{0};  // disk_waits_.size(), for stats() from any thread
  Clock::time_point last_connection_check_{};
  std::atomic<int64_t> connections_open_{0};  // connections_.open(), for stats() from any thread
  std::atomic<int64_t> unfinished_bytes_{0};  // what Connections::Unfinished last judged by
  Clock::time_point last_unfinished_check_{};
  bool unfinished_arriving_ = false;  // the last check saw kArrivingMuch come (NextConnectionCheck)
  // This process's heap when the loop began, less its tables' (Loop): what CheckUnfinished takes
  // as given (libraries, an embedding program's own).
  int64_t heap_base_ = 0;

  std::array<std::atomic<int64_t>, kNumCounters> counters_;
  std::array<std::atomic<int64_t>, kStalenessBuckets> staleness_;
  mutable Mutex by_rank_mu_;  // Stats() reads these from any thread
  std::vector<int64_t> used_by_rank_ ABSL_GUARDED_BY(by_rank_mu_);     // push messages that counted
  std::vector<int64_t> dropped_by_rank_ ABSL_GUARDED_BY(by_rank_mu_);  // push messages dropped as late
  mutable Mutex stop_mu_;  // serialises the join in Stop()
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
  // This process's newest shard on disk, which a delta checkpoint may follow (written by the
  // file job once durable; step -1 while a checkpoint is being written, or after one failed).
  struct SavedShard {
    int64_t step = -1;
    ps::ShardFile file;
    int deltas = 0;            // written since the last full shard
    uint64_t base_bytes = 0;   // the last full shard's
    uint64_t chain_bytes = 0;  // the deltas' since
  };
  SavedShard saved_ ABSL_GUARDED_BY(job_mu_);
  // The checkpoint a Placement's check round read (I/O thread), kept for its adopting round
  // until max_wait has passed (on_tick); any other Placement drops it.
  struct HandOverRead {
    int64_t step = 0;
    uint64_t version = 0;
    std::vector<uint16_t> owners;  // the map it was read for (what it keeps depends on it)
    std::shared_ptr<const CheckpointData> ckpt;
    Clock::time_point until;
    double read_s = 0, checked_s = 0;  // what the check round took (the log of the adopting one)
    int ahead = -1;                     // chains it started from a read ahead (-1: none was there)
  };
  std::optional<HandOverRead> handover_read_;
  // A hand-over's checkpoint read ahead (1.19, Placement's `prepare`; a file job), for the check
  // round of that map: set by the file job, taken by that round, dropped by any adopting
  // Placement, another prepare, or kPreparedKeep after it was read (on_tick).
  struct PreparedRead {
    uint64_t version = 0;
    std::vector<uint16_t> owners;  // the map it was read for
    ps::PreparedChains chains;
    Clock::time_point until;
    ps::BudgetCharge charge;  // its bytes, on the memory budget while it is kept
  };
  static constexpr std::chrono::minutes kPreparedKeep{30};
  std::optional<PreparedRead> prepared_ ABSL_GUARDED_BY(job_mu_);
  // Placement with `prepare`: the read ahead, as a file job.
  Status PrepareHandOver(Request& req, const placement::Placement& next);

  // A server that owns no slot and waits to leave (I/O thread): the version of the map that
  // drained it, and which workers hold that map.
  struct Leaving {
    uint64_t version = 0;
    std::vector<bool> holds;
    Clock::time_point since, next_say;
    std::optional<Clock::time_point> all_hold_since;  // when no worker was left to wait for
    bool restored = false;                            // it restored that map: no worker holds another
  };
  static constexpr std::chrono::seconds kLeaveGrace{2};
  std::optional<Leaving> leaving_;
  std::atomic<bool> left_{false};
  // Server 0 (I/O thread): the move asked and not handed to the workers yet.
  std::optional<AskedMove> asked_move_;

  // Last: starts after everything above is built. Joined only under stop_mu_.
  std::thread thread_ ABSL_GUARDED_BY(stop_mu_);
};

}  // namespace ferry::ps
