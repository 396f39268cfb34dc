// ferry/client.h — the client library a trainer (or any program) uses to talk to Ferry's
// parameter servers.
//
// Connect() handshakes with every server. Operations are asynchronous: they send their requests
// on the calling thread and return a Handle at once; all servers involved are in flight
// together. A thread waiting on a Handle reads the replies itself (one thread at a time; other
// waiters are woken), so a round trip costs no hand-off between threads; replies nobody waits
// for are read by the client's I/O thread, which also keeps the deadlines and heartbeats.
// Every failure — a server unreachable, a timeout, an error reply — comes back as a Status that
// says what and where, and no operation waits forever (each has the request timeout).
//
// Buffers: the spans passed to an operation must stay valid and unchanged (but for the outputs)
// until its Handle is done; pulled values are written into the output spans before it is done.
//
// Thread-safety: a Client may be used from several threads at once. A Handle may be waited on
// from any thread.
#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/context.h"
#include "ferry/curve.h"
#include "ferry/status.h"
#include "ferry/table_spec.h"

namespace ferry {

struct ClientOptions {
  std::vector<std::string> servers;  // one endpoint per server, in server-rank order
  int rank = 0;                      // this worker's rank in [0, num_workers)
  int num_workers = 1;               // workers in the job
  // This process's incarnation of its rank: 0 for the first process started as the worker, then
  // one more at each restart (ferry-launch passes --incarnation / FERRY_INCARNATION). The servers
  // give the rank to the highest incarnation that has said Hello, at once, even while an earlier
  // one's connection looks alive (a stopped or cut-off predecessor), and refuse every later
  // request of an earlier one with FAILED_PRECONDITION. Leave it 0 where nothing counts the
  // restarts: the rank then goes to a new connection once the old one has closed, or has sent
  // nothing for twice its ping interval (heartbeat_timeout / 2), Connect() asking meanwhile.
  uint32_t incarnation = 0;
  // This process resumes its rank's training where the servers say (worker_step()), its
  // predecessor dead (ferry-trainer --resume sets it): each server then skips this worker's async
  // and ssp pushes of steps it had taken of the rank already, part by part (a dense chunk, its
  // share of a sparse table), so a step the dead process pushed to some servers is applied once
  // everywhere. Only for a program that counts its steps and resumes at worker_step(): one that
  // pushes step 0 again and again must leave it false. Servers before 1.14 ignore it.
  bool resumes = false;
  // The first sync step this worker takes part in (protocol 1.18; 0: every step from now on): no
  // server waits for its gradient of an earlier step, while it still takes part in the job's
  // barriers and all-reduces (ferry-trainer --join). Connect() refuses servers before 1.18,
  // which would wait for it.
  int64_t joins_at = 0;
  // This process is a new one of a worker that left the job (Leave), and waits to join it again
  // (protocol 1.27; ferry-trainer --resume --rejoin): its Hello says so, and until server 0 hands
  // its join (AskToRejoin) no sync step and no collective waits for it. Connect() refuses servers
  // before 1.27, and each server refuses the Hello of a worker that has not left.
  bool waits_to_rejoin = false;
  // Longest the handshake with every server may take in Connect().
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(30)};
  // Told about long waits, so that no wait is silent: every `long_wait_every` while requests
  // wait for their replies, one line per server and kind of request that has waited that long,
  // e.g. "waiting 20 s (of 360) for server 1 (tcp://h:p) to answer PullDense (a sync pull waits
  // for every worker's push of the step before)". Empty: not told. Called on the client's I/O
  // thread or a waiting caller's, with the client's lock held: it must not call the client.
  std::function<void(const std::string& line)> on_long_wait;
  std::chrono::milliseconds long_wait_every{std::chrono::seconds(5)};
  // Longest any one request may wait for its reply (sync pulls wait for the slowest worker, so
  // keep it above the servers' max wait).
  std::chrono::milliseconds request_timeout{std::chrono::minutes(6)};
  // A server whose connection closes (killed) or that stops answering ZeroMQ's heartbeats for
  // this long (hung, or its host unreachable) fails every request in flight to it at once with
  // UNAVAILABLE, naming it, instead of each waiting out the request timeout. Pings go every
  // quarter of it. 0: no heartbeats (a closed connection is still noticed).
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(5)};
  // Requests larger than this are split into several messages per server.
  int64_t max_message_bytes = int64_t{64} << 20;
  // A dense call (PushDense, PullDense, PushPullDense) sends each server its chunks in messages
  // of about this size, cut between chunks (a larger chunk goes alone), the servers' in turns and
  // each sent as soon as it is built: a server checks and applies one while the next travels and
  // the reply to the one before comes back, so a large call costs about its slowest part rather
  // than their sum. 0: one message per server (up to max_message_bytes). bench/RESULTS.md
  // ("Dense pieces") measures the size against the table's chunk size (TableSpec::chunk_elems).
  int64_t dense_message_bytes = int64_t{1} << 20;
  // A sparse call (PullSparse / PushSparse of several tables) sends a server its tables in one
  // message, or, when its share is larger than this, in messages of about this size (cut between
  // tables), each sent as soon as it is built so that the server works on one while the next is
  // built and travels. 0: one message per server (up to max_message_bytes). bench/RESULTS.md
  // "A Criteo-shaped step" measures the choice.
  int64_t sparse_message_bytes = int64_t{512} << 10;
  // Messages queued or awaiting a reply at once; an operation that would exceed it waits for
  // room (up to the request timeout, then fails with RESOURCE_EXHAUSTED). Bounds the memory a
  // fast producer can pin.
  int max_in_flight = 4096;
  // CURVE (ferry/curve.h; curve::LoadClientKeys reads a job's key folder): authenticate to the
  // servers with this worker's key and encrypt every message. Needed when the servers use
  // CURVE; a server that refuses the key, or a mismatch (one side without CURVE), fails the
  // operation with PERMISSION_DENIED saying so. tcp:// and ipc:// only.
  std::optional<CurveClientKeys> curve;
  // Required for inproc:// servers (share the servers' Context); optional otherwise.
  std::shared_ptr<Context> context;
};

// What the servers reported about an operation (protocol 1.2); complete once it is done.
struct Served {
  // Pulls and pushes: the lowest table version any reply carried (-1: no reply carried one). For a
  // sync pull this is the step whose parameters were served: the global step, which a worker that
  // fell behind uses to tag its next push (see PROTOCOL.md, "Sync steps").
  int64_t version = -1;
  int64_t used = 0;     // pushes: parts (dense chunks, sparse shards) whose gradient counted
  int64_t dropped = 0;  // pushes: parts whose gradient came after its sync step had closed (late)
  // Pulls: the longest any server held a request of this operation waiting for its step
  // (sync: for the other workers' gradients; ssp: for their clocks).
  std::chrono::microseconds held{0};
};

// The completion of an asynchronous operation (like c10d's Work).
class Handle {
 public:
  struct State;
  Handle() = default;  // an empty handle: done, OK
  explicit Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // Waits at most `timeout`. DEADLINE_EXCEEDED if the operation is still running then (it goes
  // on; wait again later); otherwise the operation's own status.
  Status wait(std::chrono::milliseconds timeout) const;
  // Waits until the operation ends; bounded by the client's request timeout.
  Status wait() const;
  bool done() const;
  // What the servers reported (meaningful once the operation is done).
  Served served() const;
  // How long the operation took, from the call to its last reply, measured by the client: the
  // building of its messages, the wire both ways, the servers' work and any time they held it
  // (Served::held). Zero until it is done, and for an empty handle.
  std::chrono::nanoseconds elapsed() const;

 private:
  std::shared_ptr<State> state_;
};

// A dense tensor to pull into: `data` has the table's element count.
struct DenseOut {
  std::string_view table;
  std::span<float> data;
};
// A dense gradient to push: `data` has the table's element count.
struct DenseIn {
  std::string_view table;
  std::span<const float> data;
};

// A pull's values left where they arrived (PullDenseView, PushPullDenseView): nothing is copied
// into a buffer of the caller's. Each tensor comes as the pieces its servers sent, one per chunk
// (TableSpec::chunk_elems: a table of one chunk is one piece), each a span into a received
// message that this object holds until it is destroyed. Values of a 16-bit wire format, and a
// piece whose message is not aligned for float, are put in memory of its own first.
// Thread-safety: filled while its Handle runs; once the Handle is done OK, read-only from any
// thread. Before then, or after a failed Handle, its pieces may be missing (empty spans).
class PulledDense {
 public:
  struct Piece {
    int64_t offset = 0;  // its first element in the tensor
    std::span<const float> values;
  };
  virtual ~PulledDense() = default;
  // How many tensors: the call's, in the order it named them.
  virtual size_t size() const = 0;
  // Tensor `t`'s pieces in element order, which cover it.
  virtual std::span<const Piece> pieces(size_t t) const = 0;
  // Tensor `t` as one span when it came in one piece; empty otherwise.
  std::span<const float> whole(size_t t) const {
    const auto p = pieces(t);
    return p.size() == 1 ? p[0].values : std::span<const float>();
  }
  // Copies tensor `t` into `out`; INVALID_ARGUMENT (nothing copied) unless `out` holds the
  // tensor's element count, or the pieces do not cover it (the Handle failed, or is not done).
  [[nodiscard]] Status CopyTo(size_t t, std::span<float> out) const;
};

// A sparse table's rows to pull: `rows` holds ids.size() * dim floats.
struct SparseOut {
  std::string_view table;
  std::span<const int64_t> ids;
  std::span<float> rows;
};
// A sparse table's gradients to push: one row of dim floats per id.
struct SparseIn {
  std::string_view table;
  std::span<const int64_t> ids;
  std::span<const float> grads;
};
// What a sparse call's caller knows of its ids.
enum class SparseIds : uint8_t {
  kMayRepeat,  // deduplicated before sending (a repeated id's gradients are summed)
  kDistinct,   // no id repeats within a table: sent as they are (one server: no copy at all)
};

// One server's shard of a checkpoint, as the server reported it (the manifest lists these).
struct CheckpointShard {
  std::string file;     // its name in the servers' checkpoint folder
  uint64_t bytes = 0;
  uint32_t crc32 = 0;   // zlib CRC-32 of the whole file
  // How long the server stopped serving to copy its tables; the write itself happens while it
  // serves.
  std::chrono::microseconds paused{0};
  // By worker rank, the steps each worker had done as the server knew them when it saved (-1:
  // it knew none of that worker's; empty: a server before 1.11). CommitCheckpoint records the
  // lowest any server knew in the manifest (0 where none knew: the worker had pushed nothing):
  // where each async/ssp worker resumes.
  std::vector<int64_t> worker_steps;
  // By table id, each async/ssp table's share on the server, by worker rank: one more than the
  // highest step of that worker's pushes it applied (1.25; empty: a server before it). A
  // restore skips a replayed push where its table's share had taken that step.
  std::map<uint64_t, std::vector<int64_t>> table_steps;
  // The placement version the server held when it saved (1.17; 0: a server before it): every
  // shard of a checkpoint must be of one map (CommitCheckpoint refuses shards of two).
  uint64_t placement_version = 0;
};

struct ClientStats {
  int64_t requests = 0;       // messages sent
  int64_t bytes_sent = 0;     // all frames
  int64_t bytes_received = 0; // all frames
  // Finite values of pushes to fp16 / bf16 tables beyond the format's range, sent as its largest
  // value instead (1.6; README, "Wire formats").
  int64_t values_saturated = 0;
};

class Client {
 public:
  // Also tunes glibc's malloc for large messages, once per process, unless the program opts out
  // with FERRY_MALLOC_TUNING=off or set glibc.malloc tunables itself (ferry/messages/transport.h,
  // TuneAllocatorForLargeMessages; README, "Using the client library").
  static StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);
  virtual ~Client() = default;  // fails what is still in flight with CANCELLED

  virtual int rank() const = 0;
  virtual int num_workers() const = 0;
  virtual int num_servers() const = 0;

  // Declares a table on every server (idempotent; a conflicting declaration is an error naming
  // both specs). A table must be declared by this client before it is used. A compressed table
  // (spec.wire not f32, or topk_ratio > 0) needs servers of protocol 1.6 or later: on an older
  // one Declare fails with FAILED_PRECONDITION and sends nothing. A top-k table's residual (what
  // its pushes have not sent yet) lives in this client from its declaration on.
  virtual Status Declare(const TableSpec& spec) = 0;

  // Dense tables. Several tensors in one call travel as one message per server, so a step's
  // many small tensors cost about one round trip per server. `step` is the sync step / ssp
  // clock of the read (ignored by async tables).
  virtual Handle PullDense(std::span<const DenseOut> tensors, int64_t step) = 0;
  virtual Handle PushDense(std::span<const DenseIn> grads, int64_t step) = 0;
  // Push gradients for `step`, then pull the same tables for `step + 1`, in one round trip;
  // `grads` and `out` name the same tables in the same order. For ssp tables this also
  // advances this worker's clock to step + 1 on the servers involved.
  virtual Handle PushPullDense(std::span<const DenseIn> grads, std::span<const DenseOut> out, int64_t step) = 0;
  // PullDense and PushPullDense without the copy into the caller's buffers: `*values` is set at
  // once to an object that the replies fill with the values as they arrived (PulledDense; null
  // when the call fails before anything is sent, an unknown table say: its Handle says why). A
  // caller that reads the values where they are (or moves them to a device) saves a pass over
  // them; bench/RESULTS.md measures it against the copying calls.
  virtual Handle PullDenseView(std::span<const std::string_view> tables, int64_t step,
                               std::shared_ptr<const PulledDense>* values) = 0;
  virtual Handle PushPullDenseView(std::span<const DenseIn> grads, int64_t step,
                                   std::shared_ptr<const PulledDense>* values) = 0;

  // Sparse (embedding) tables: rows of `dim` floats by int64 id. All the tables of one call
  // travel together (protocol 1.5): one message per server, or, for a share larger than
  // sparse_message_bytes, messages of about that size cut between tables and pipelined; every
  // server in flight together. The whole call is checked before any of it is sent; each message
  // is checked whole by its server before any of it is applied. Ids are grouped per server and, unless
  // the caller says they are distinct, deduplicated first (a repeated id's gradients are summed
  // in order of appearance). With SparseIds::kDistinct and one server the caller's id and
  // gradient buffers are sent without a copy (tcp/ipc): they must stay unchanged until the
  // handle is done. For sync tables a call reaches every server, with no ids where the worker
  // has none there: each server closes every step with every worker's (maybe empty) gradient,
  // and a pull for step t waits until every server has closed step t - 1. A server older than
  // 1.5 gets one message per table.
  virtual Handle PullSparse(std::span<const SparseOut> tables, int64_t step,
                            SparseIds ids = SparseIds::kMayRepeat) = 0;
  virtual Handle PushSparse(std::span<const SparseIn> tables, int64_t step,
                            SparseIds ids = SparseIds::kMayRepeat) = 0;
  // One table.
  Handle PullSparse(std::string_view table, std::span<const int64_t> ids, std::span<float> out, int64_t step) {
    const SparseOut t{table, ids, out};
    return PullSparse(std::span<const SparseOut>(&t, 1), step);
  }
  Handle PushSparse(std::string_view table, std::span<const int64_t> ids, std::span<const float> grads,
                    int64_t step) {
    const SparseIn t{table, ids, grads};
    return PushSparse(std::span<const SparseIn>(&t, 1), step);
  }

  // Advances this worker's clock to `clock` on every server (ssp: a pull at clock c waits until
  // every worker has reached c - s). Asynchronous: a later request of this client to a server
  // reaches it after the clock, so a worker need not wait for the clock before its next pull.
  virtual Handle AdvanceClock(int64_t clock) = 0;
  // Tells every server that this worker has ended its training: sync steps no longer wait for
  // its gradient (the quorum shrinks to the workers still training) and ssp pulls no longer wait
  // for its clock. Barriers and AllReduceSum still count it. A new Client of the same rank
  // (its Hello) makes the worker take part again.
  virtual Status Finish() = 0;
  // Tells every server that this worker leaves the job while the others train on (protocol
  // 1.18): as Finish, and besides no barrier or AllReduceSum waits for it any more (one waiting
  // only for it completes now). The worker's pushes sent before it are applied first. Call it
  // between steps, with no push in flight; a new Client of the same rank takes part again.
  // FAILED_PRECONDITION, nothing sent, when a server is older than 1.18. `at` (1.26): the first
  // step it takes no part in, which the servers keep and tell the workers that connect later
  // (workers_left); -1: not said.
  virtual Status Leave(int64_t at = -1) = 0;
  // Waits until every worker has entered the barrier (bounded by the request timeout).
  virtual Status Barrier() = 0;
  // The job's start: a Barrier that also says this worker has not trained yet (it begins at
  // step 0 of its data). Server 0 (protocol 1.12) refuses it with FAILED_PRECONDITION, once it
  // has waited 2 s, when another worker that is missing from it has pushed since it connected
  // and has been heard from since this one arrived: that worker is training, and will not come
  // to a start. A process restarted into a job in progress must rejoin at the job's step
  // instead (ferry-trainer --resume), and enters the job's next collective with Barrier. A
  // server before 1.12 takes it as a Barrier.
  virtual Status StartBarrier() = 0;
  // A move asked of the job while it runs (protocol 1.24, AskMove below): a server to join it
  // (`join`) or to drain (`drain`), or (1.26) a worker to leave the job (`leave_worker`); -1 each
  // when none was asked.
  struct AskedMove {
    int join = -1;
    int drain = -1;
    int leave_worker = -1;
    int rejoin_worker = -1;  // 1.27: a worker that left, whose new process waits, to join again
    bool asked() const { return join >= 0 || drain >= 0 || leave_worker >= 0 || rejoin_worker >= 0; }
  };
  // A Barrier at which the workers take the move asked of server 0 since the last one (AskMove):
  // server 0 hands it to every worker at once, when all of them entered this barrier (not a
  // plain one), and forgets it; the workers then make it together (ferry-trainer
  // --move-asks-every). None when nothing was asked, or server 0 is before 1.24. `step` (1.26):
  // the step every worker is at (the same for all; -1 not said): a worker's leave handed over
  // here is before step + 1, which server 0 then tells workers that connect (workers_left).
  virtual StatusOr<AskedMove> BarrierTakingMoves(int64_t step = -1) = 0;
  // A barrier that also adds up: every worker passes the same number of values and gets back
  // their element-wise sum over all workers, added in rank order on server 0 (so every worker,
  // and every run, gets the same bits). Barriers and AllReduceSums share one sequence: every
  // worker must call them in the same order. FAILED_PRECONDITION if the workers' counts differ.
  virtual StatusOr<std::vector<double>> AllReduceSum(std::span<const double> values) = 0;

  // Checkpoints (format: messages/CHECKPOINT.md). SaveCheckpoint asks every server to save its
  // shard of every table, as of `step`, in its checkpoint folder (ferry-ps --checkpoint-dir):
  // each server copies its tables (a short pause in serving), writes the copy while it goes on
  // serving, and answers once the file is durable; `shards` (one per server) is then filled in.
  // For sync tables `step` must be the global step every server is at: ask after this worker's
  // pull for `step` and before its push for it (with backup workers the step may close without
  // it: the servers then refuse with FAILED_PRECONDITION, and a later step will do). A server
  // writes one checkpoint at a time (UNAVAILABLE while busy). CommitCheckpoint then has server 0
  // write the manifest naming the shards: the checkpoint exists once it returns OK. Servers
  // started with --checkpoint-deltas may write only what changed since the newest checkpoint
  // this client committed (SaveCheckpoint names its step; a new client has committed none).
  virtual Handle SaveCheckpoint(int64_t step, std::span<CheckpointShard> shards) = 0;
  virtual Status CommitCheckpoint(int64_t step, std::span<const CheckpointShard> shards) = 0;
  // SaveCheckpoint, then CommitCheckpoint; waits for both.
  Status Checkpoint(int64_t step) {
    std::vector<CheckpointShard> shards(static_cast<size_t>(num_servers()));
    FERRY_RETURN_IF_ERROR(SaveCheckpoint(step, shards).wait());
    return CommitCheckpoint(step, shards);
  }
  // The step of the checkpoint the servers started from (ferry-ps --restore), as server 0 said
  // in the handshake; 0 when they started empty.
  virtual int64_t restored_step() const = 0;
  // How many steps this worker's rank has done, as the servers knew at the handshake (protocol
  // 1.11): one more than the highest step of its pushes they took (a predecessor's, for a
  // restarted worker; since 1.25 one fewer where a server holds that step in part: one of its
  // async/ssp tables took none of it), or what the checkpoint they restored recorded for it; the lowest over the
  // servers that know (one that holds nothing this worker pushes does not); 0 if none knows (the
  // rank pushed nothing: each of its steps pushes to some server). Where a restarted async or ssp
  // worker resumes (its own step count, not worker 0's). -1 if a server is older than 1.11.
  virtual int64_t worker_step() const = 0;
  // Whether worker_step() is, on every server, what the checkpoint they restored recorded (the
  // rank pushed nothing since): the whole job resumes from that checkpoint, every worker at its
  // own step; otherwise this worker rejoins a job that goes on.
  virtual bool worker_step_restored() const = 0;
  // The id this client's first Barrier or AllReduceSum takes, as server 0 said in the
  // handshake: 0 on servers where no collective has ended (a new job on fresh servers); more for
  // a client that joins a job in progress (a restarted worker continues the sequence the others
  // are in), or on servers an earlier job used.
  virtual int64_t first_collective() const = 0;
  // The workers that had left the job when this client connected, with the step each left
  // before (its Leave's `at`), by rank, as the servers said in the handshake (protocol 1.26; the
  // leaves whose step was not said are not listed). A restarted worker reads the shares of those
  // workers from their steps on, as the workers that saw them leave do.
  virtual std::map<int, int64_t> workers_left() const = 0;
  // The workers whose join again server 0 had handed when this client connected, with the step
  // each takes part from (protocol 1.27; the latest of each): a worker restarted later reads their
  // shares no more from then on.
  virtual std::map<int, int64_t> workers_rejoined() const = 0;
  // The id of the hand-over's second Barrier of the latest join handed (workers_rejoined), when
  // server 0 said at the handshake that it has not ended; -1 otherwise. A worker restarted at the
  // hand-over's step enters it (the others wait in it), as its next Barrier() does.
  virtual int64_t rejoin_barrier() const = 0;
  // For a client that connected waiting to join again (ClientOptions::waits_to_rejoin): asks
  // server 0 to take this worker back (a MoveAsk; protocol 1.27). Server 0 keeps the ask and hands
  // it to the workers at their next BarrierTakingMoves (step T); until then this returns 0: ask
  // again (every few milliseconds: the asks are what server 0 hears of this process by, and one
  // silent for 2 s is not handed its join). Once handed it returns T + 1, the first step this
  // worker takes part in, after telling every server so: the other workers wait for it at one more
  // Barrier, which its next Barrier() enters. While another move is asked it returns 0 too (its
  // ask is kept once that one is made). FAILED_PRECONDITION for a client that did not wait to
  // rejoin, or when the join can no longer be made (every other worker has finished).
  virtual StatusOr<int64_t> AskToRejoin() = 0;

  // One server's counters (messages, bad_messages, staleness_<k>, ...). With `digests` (a server
  // of 1.21 or later; PROTOCOL.md "Replicas"), also "digest:<table>" for each table it holds and,
  // with replication 2, "replica_digest:<table>" for its replica of server rank-1's: a replica
  // holds the bits of its primary when the two are equal (computed over every row: for checks).
  virtual StatusOr<std::map<std::string, int64_t>> ServerCounters(int server, bool digests = false) = 0;

  // ---- placement versions (protocol 1.17; PROTOCOL.md, "Placement versions") ----
  // Which server holds each slot of ids and chunks (ferry/messages/placement.h) can change while
  // the job runs. The servers say their map in the handshake; a request placed by an older map
  // is answered "moved" with the new one, and the client then sends the operation again by it
  // (when Handle::wait or done() finds every request answered and none applied; a push some of
  // whose requests were applied fails instead, as does one of a top-k table).
  //
  // Moves slots between the job's servers: every server adopts `owners` (the server of each of
  // placement::kSlots slots, by slot) as placement version `version` (above the job's), taking
  // over the rows and chunks of the slots it gains from the job's committed checkpoint of `step`
  // and dropping those of the slots it gives up. Nothing may be pushed between that checkpoint
  // and this call's return (a sync job: call it between steps, with the other workers waiting,
  // e.g. at a Barrier): a server refuses to give up a row or chunk updated since. Two rounds:
  // every server checks that it can (a refusal changes nothing), then every server adopts.
  virtual Status MoveSlots(uint64_t version, std::span<const uint16_t> owners, int64_t step) = 0;
  // Makes a later MoveSlots to the same `version` and `owners` pause the job for less: every
  // server whose slots that map moves reads the job's committed checkpoint of `step` (an earlier
  // one than the MoveSlots will name) now, on a thread of its own while the job trains, and keeps
  // what moves; the MoveSlots' hand-over then reads only the files written since (the deltas of a
  // server with --checkpoint-deltas; a full shard written since is read whole). Checks nothing and
  // changes nothing; the handle completes when every server has read. A server reads ahead for
  // one map at a time, keeps it for the next MoveSlots' check round or 30 minutes at most, on its
  // memory budget (RESOURCE_EXHAUSTED when there is no room), and refuses (UNAVAILABLE) while it
  // writes a checkpoint, as a checkpoint is refused while it reads: wait for the handle before the
  // next SaveCheckpoint. Servers of protocol 1.19 and later (FAILED_PRECONDITION before any is
  // asked).
  virtual Handle PrepareMoveSlots(uint64_t version, std::span<const uint16_t> owners, int64_t step) = 0;
  // The placement version this client places its requests by.
  virtual uint64_t placement_version() const = 0;
  // The map of that version: the server of each of placement::kSlots slots, by slot. A new map for
  // MoveSlots is this one with the slots that should move given their new server.
  virtual std::vector<uint16_t> placement_owners() const = 0;
  // The servers this client speaks to, by rank (1.20, PROTOCOL.md "Servers joining and
  // leaving"): server 0 and those its map gives slots; one that owns none may have left the job,
  // or not joined it yet. Every server while server 0 is before 1.20.
  virtual std::vector<int> servers_in_job() const = 0;
  virtual ClientStats stats() const = 0;

  // Single-tensor conveniences.
  Handle PullDense(std::string_view table, std::span<float> out, int64_t step) {
    const DenseOut t{table, out};
    return PullDense(std::span<const DenseOut>(&t, 1), step);
  }
  Handle PushDense(std::string_view table, std::span<const float> grad, int64_t step) {
    const DenseIn t{table, grad};
    return PushDense(std::span<const DenseIn>(&t, 1), step);
  }
};

// Asks a running job to move slots (protocol 1.24, MoveAsk; PROTOCOL.md "Moves asked while the
// job runs"): server 0 at `server0` (its endpoint) keeps the ask, checked against the map it holds,
// and hands it to the workers at their next BarrierTakingMoves; they then make server `join` join
// (a fair share of the slots) or server `drain` leave (its slots to the others), or (1.26) worker
// `leave_worker` leave the job after that step (its share of each later step's examples to the
// others), or (1.27) worker `rejoin_worker`, which left and whose new process waits to join
// again (ClientOptions::waits_to_rejoin; that process asks too: Client::AskToRejoin), join at
// the step after. Exactly one of `join`, `drain`, `leave_worker`, `rejoin_worker` is a rank, the
// others -1. With CURVE,
// `curve` holds a worker key of the job and `rank` that worker's rank (readers may not ask).
// Answered at once: OK once server 0 keeps the ask; FAILED_PRECONDITION when one is kept already,
// the map cannot make that move or the worker has left; DEADLINE_EXCEEDED when server 0 does not
// answer within `timeout`.
struct AskMoveOptions {
  std::string server0;
  int join = -1;
  int drain = -1;
  int leave_worker = -1;
  int rejoin_worker = -1;
  int rank = 0;
  std::optional<CurveClientKeys> curve;
  std::chrono::milliseconds timeout{10000};
  std::shared_ptr<Context> context;  // the servers' own, for an inproc:// endpoint; else one is made
};
Status AskMove(const AskMoveOptions& options);

}  // namespace ferry
