// ps/client/src/engine.h — the client's I/O engine: a DEALER socket per server, one I/O thread,
// and the callers' own threads. Every socket operation happens under one lock (io_mu_), on
// whichever thread holds it: a caller sends its own requests; a caller waiting for its operation
// reads the replies itself (Handle::wait "drives" the sockets, so a round trip costs no hand-off
// between threads); the I/O thread reads them when no caller waits, and keeps the time
// (deadlines, the connection monitors, heartbeats, the long-wait notes). Replies are matched to
// requests by id. A request that gets no reply by its deadline fails, and the socket to that
// server is rebuilt so nothing stays queued for a dead peer (which also returns every buffer lent
// to ZeroMQ).
//
// The operations (client.cc: tables, dense, sparse, collectives, checkpoints) build their
// requests and submit them here, each with the function that reads its reply; the engine knows
// no message kind but Hello's heartbeat interval, Heartbeat and Waiting (its own requests).
//
//   client.cc (ClientImpl: the operations) --Submit/Drive--> Engine --> one DEALER per server
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <poll.h>

#include "ferry/client.h"
#include "ferry/mutex.h"
#include "ferry/messages/deadlines.h"
#include "ferry/messages/kinds.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"

namespace ferry {
namespace io {
class Engine;
using SteadyClock = std::chrono::steady_clock;

// How a waiting caller reaches its client's sockets: the engine while it runs (Stop closes the
// gate, and waits for a driving caller to leave); one caller drives at a time.
struct IoGate {
  Mutex mu;
  CondVar idle;  // signalled when the driving caller leaves
  Engine* engine ABSL_GUARDED_BY(mu) = nullptr;
  bool driving ABSL_GUARDED_BY(mu) = false;
  int rerunning ABSL_GUARDED_BY(mu) = 0;  // callers sending an operation again (1.17); Stop waits for them
  // Operations every request of which is answered, some "moved", not yet sent again, in the order
  // they became so: whoever sends one again sends these first (Handle's RerunIfMoved), so that a
  // re-sent sync pull does not wait for this worker's own push of the step, answered "moved" too
  // but not yet waited for.
  std::deque<std::weak_ptr<Handle::State>> moved ABSL_GUARDED_BY(mu);
};
}  // namespace io

struct Handle::State {
  Mutex mu;
  CondVar cv;                                 // signalled when pending reaches zero
  int pending ABSL_GUARDED_BY(mu) = 0;        // requests without an answer
  Status status ABSL_GUARDED_BY(mu);          // the first failure
  Served served ABSL_GUARDED_BY(mu);          // what the replies reported
  std::shared_ptr<transport::Lender> lender;  // frames lent to ZeroMQ (tcp/ipc pushes); set before sharing
  std::shared_ptr<io::IoGate> gate;           // the client's; set before sharing
  const io::SteadyClock::time_point started = io::SteadyClock::now();  // the call
  io::SteadyClock::time_point finished ABSL_GUARDED_BY(mu);        // its last reply

  // 1.17: a request answered "moved" (placed by another map than its server's) is not a failure
  // yet: once every request of the operation is answered, Handle::wait runs it again by the
  // client's new map (`rerun`) if none of its requests was applied, or fails with the moved
  // status if some were (RerunIfMoved).
  std::function<Status(const std::shared_ptr<State>&)> rerun;  // set before sharing; null: never re-run
  int moved ABSL_GUARDED_BY(mu) = 0;        // requests answered "moved" (this run)
  int applied ABSL_GUARDED_BY(mu) = 0;      // push requests answered OK (this run): not to be sent twice
  int reruns ABSL_GUARDED_BY(mu) = 0;
  Status moved_status ABSL_GUARDED_BY(mu);  // the first "moved" answer
  static constexpr int kMaxReruns = 4;

  // `push`: the request applies something when it succeeds (pulls do not).
  void Finish(const Status& s, bool was_moved = false, bool push = false) {
    MutexLock lock(&mu);
    if (was_moved) {
      ++moved;
      if (moved_status.ok()) moved_status = s;
    } else if (!s.ok() && status.ok()) {
      status = s;
    } else if (s.ok() && push) {
      ++applied;
    }
    if (--pending == 0) {
      finished = io::SteadyClock::now();
      cv.SignalAll();
    }
  }
  // Adds one reply's report (I/O thread).
  void Record(const wire::Header& h) {
    MutexLock lock(&mu);
    if (const wire::KindInfo* kind = wire::FindKind(h.request_kind()); kind != nullptr && kind->reports_version) {
      served.version = served.version < 0 ? h.version() : std::min(served.version, h.version());
    }
    served.used += h.used();
    served.dropped += h.dropped();
    served.held = std::max(served.held, std::chrono::microseconds(h.held_us()));
  }
  void Fail(const Status& s) {  // before any request was sent
    MutexLock lock(&mu);
    if (status.ok()) status = s;
    if (pending == 0) finished = io::SteadyClock::now();
  }
  bool Answered() {
    MutexLock lock(&mu);
    return pending == 0;
  }
  // Every request answered, some "moved": it waits to be sent again (RerunIfMoved).
  bool WaitsForRerun() {
    MutexLock lock(&mu);
    return rerun && pending == 0 && moved > 0;
  }
};

namespace io {

using transport::Frames;
using wire::Header;
using wire::Kind;

// Called with a verified Reply header and its payload frames, on the thread reading the replies.
using OnReply = std::function<Status(const Header&, Frames&)>;
// Called with a verified "moved" Error header (one with a `placement`, 1.17) from server `s`, on
// the thread reading the replies, before its request completes as moved.
using OnMoved = std::function<void(int s, const Header&)>;
// Builds a Hello header (BeginHeader, FinishHeader) for server `s` (1.22: the engine greets a
// replacement server itself, on the thread reading the replies).
// `rejoins`: the Hello to a replacement (1.22 Hello `rejoins`).
using MakeHello = std::function<zmq::message_t(int s, bool rejoins)>;

// A reply's payload has `n` frames / a frame has `bytes` (DATA_LOSS saying what it has).
Status ExpectFrames(const Frames& payload, size_t n);
Status ExpectBytes(const zmq::message_t& frame, size_t bytes);

class Engine {
 public:
  // `options` must outlive the engine (the client's own).
  Engine(const ClientOptions& options, std::shared_ptr<Context> context);
  ~Engine() { Stop(); }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Opens a socket per server and starts the I/O thread. `on_moved`: see OnMoved (may be null).
  // `make_hello`: see MakeHello (null: a lost server fails what is in flight to it, always).
  Status Start(OnMoved on_moved = nullptr, MakeHello make_hello = nullptr);
  // Heartbeats go from now on (after the handshake: a server takes them from a worker it knows).
  void StartHeartbeats();
  // The client's map (1.20): heartbeats carry its version, and go to the servers `member` marks
  // (by rank; empty: every one); a server that stops being one is sent one heartbeat more (a
  // server waiting to leave hears so that this client holds the map that drained it).
  void SetMap(uint64_t version, std::vector<bool> member) {
    bool owed = false;
    {
      MutexLock lock(&map_mu_);
      if (version < map_version_) return;  // (an older map's, set late by another thread)
      if (goodbye_.size() != member.size()) goodbye_.assign(member.size(), false);
      for (size_t s = 0; s < member.size(); ++s) {
        if (!member[s] && s < member_.size() && member_[s]) goodbye_[s] = true;
        if (member[s]) goodbye_[s] = false;
        owed = owed || goodbye_[s];
      }
      map_version_ = version;
      member_ = std::move(member);
      goodbyes_owed_.store(owed);
    }
    if (owed) waker_.Notify();  // the I/O thread sends it at its next tick
  }
  // Fails everything in flight or submitted from now on ("client closed"), lets a driving caller
  // go, and joins the I/O thread. Idempotent.
  void Stop();

  int num_servers() const { return static_cast<int>(options_.servers.size()); }
  std::string ServerName(int s) const;
  // Server `s`'s protocol minor (0 until its Hello reply said it: set_minor).
  int minor(int s) const { return server_minor_[static_cast<size_t>(s)].load(); }
  void set_minor(int s, int minor) { server_minor_[static_cast<size_t>(s)].store(minor); }
  // 1.22, from server `s`'s Hello reply: its process (`epoch`, a new one per process), and whether
  // it keeps replicas (replication 2). A client that loses such a server waits for its
  // replacement: from then on it keeps a copy of each request to it (a reference, not the bytes),
  // to send again what the lost one had not answered (PROTOCOL.md, "Failover").
  void set_server(int s, uint64_t epoch, bool replicated) {
    server_epoch_[static_cast<size_t>(s)].store(epoch);
    replicated_[static_cast<size_t>(s)].store(replicated);
  }
  // How often each server hears from this client at least (protocol 1.3 heartbeats: the servers
  // notice a worker that fell silent); 0: never. A quarter of the heartbeat timeout, as for
  // ZeroMQ's own pings to the servers.
  std::chrono::milliseconds HeartbeatEvery() const;
  // Requests sent and bytes sent and received (the rest of ClientStats is the operations').
  ClientStats stats() const;

  // ---- building and submitting -------------------------------------------------------------

  // An operation's state, which its requests share.
  std::shared_ptr<Handle::State> NewOp();
  // An operation that failed before any request went.
  static Handle Failed(const std::shared_ptr<Handle::State>& op, const Status& s);
  // A request header of `kind` from this worker with a fresh request id: add the kind's fields,
  // then FinishHeader.
  wire::HeaderBuilder BeginHeader(flatbuffers::FlatBufferBuilder& fbb, Kind kind);
  static zmq::message_t FinishHeader(flatbuffers::FlatBufferBuilder& fbb, wire::HeaderBuilder& h);
  // A payload frame over the caller's memory: lent without copying over tcp/ipc; copied for
  // inproc, where the receiving server could otherwise keep pointing at it.
  zmq::message_t Lend(const std::shared_ptr<Handle::State>& op, int server, const void* data, size_t size);
  // Sends one request of `op` to `server` (waiting for room while max_in_flight are in flight, at
  // most `timeout`); `on_reply` reads its reply (nullptr: a reply without payload), and it fails
  // unless answered within `timeout`.
  void Submit(const std::shared_ptr<Handle::State>& op, int server, Kind kind, zmq::message_t header, Frames payload,
              OnReply on_reply, std::chrono::milliseconds timeout);

  // Reads the sockets on the calling thread until `op` is answered, `deadline` passes or the
  // client closes (see DriveUntilAnswered, which lets one caller in at a time). Operations of
  // the client answered "moved" meanwhile (IoGate::moved) are sent again on the way.
  void Drive(Handle::State& op, SteadyClock::time_point deadline);

 private:
  // One message to one server, waiting to be sent or answered.
  struct Request {
    uint64_t id = 0;
    int server = 0;
    Kind kind = Kind::Invalid;
    Frames frames;  // [header][payload...]; empty once sent
    Frames resend;  // 1.22, to a server that keeps replicas: the frames again (zmq_msg_copy: shared)
    OnReply on_reply;
    std::shared_ptr<Handle::State> op;
    SteadyClock::time_point sent, deadline;
  };

  // ---- building and submitting -------------------------------------------------------------

  // Sends one request on the calling thread, and records it in flight (or completes it with the
  // send's failure).
  void SendNow(Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // Sends again the operations waiting in IoGate::moved (1.17), on the driving caller's thread,
  // while there is room for their requests; true when it took any.
  bool RerunQueued() ABSL_LOCKS_EXCLUDED(io_mu_);

  // Tells the I/O thread to watch the sockets, unless it does or was told since it last looked.
  void TellIoThread();

  // Completes one request and frees its slot. A caller driving the sockets is told when another
  // thread completed something (its own operation, perhaps: a failed server, an expired request).
  void Done(Request& r, const Status& s, bool moved = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // Takes the request `it` names out of flight (and its deadline) and completes it with `s`.
  void DoneInFlight(std::unordered_map<uint64_t, Request>::iterator it, const Status& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // (Re)opens the socket to server `s` and its monitor (a PAIR that receives the socket's
  // ZMQ_EVENT_DISCONNECTED: the connection closed, or heartbeats went unanswered).
  Status OpenSocket(int s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // ---- the I/O thread ----------------------------------------------------------------------

  // Sends a Heartbeat (never answered) to every server this client sent nothing to for a
  // heartbeat interval; a busy client sends none.
  void SendHeartbeats() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // The I/O thread: watches the sockets while no caller drives them, and keeps the time.
  void Loop();

  // What is due without a message: expired requests, the monitors' news, heartbeats.
  void Tick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // Tells options_.on_long_wait, at most every long_wait_every, of the requests that have waited
  // that long: one line per server and kind, for the one waiting longest. A server of protocol
  // 1.8 or later is asked (Waiting) once such a request has waited half that long, and again
  // each half period while it waits: the line then says what it holds this worker's requests for
  // ("PullDense: table 'w' is at step 4 and waits for the gradients of worker(s) 1"), which
  // names who is missing; otherwise (no answer yet, an older server) what such a kind waits for.
  void NoteLongWaits() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // Sends Waiting to each server of protocol 1.8 or later that holds a request which has waited
  // `after` for a step or for the other workers, unless one is in flight to it or went within
  // `after`. The reply lands in asked_[server] (Latest()). Like a heartbeat it is the client's own
  // request (no caller waits for it); it takes a slot beyond max_in_flight.
  // It looks at most every `after` / 4: Tick runs on every wake-up, a reply's too.
  void AskWhyTheyWait(SteadyClock::time_point now, SteadyClock::duration after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // What a server waits for before it answers a request of this kind.
  static std::string WhyItWaits(Kind kind);

  // The earliest time Tick has something to do. While requests are in flight, at least every
  // kMonitorEvery (to look at the monitors).
  std::optional<SteadyClock::time_point> NextDeadline() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // poll(2)'s timeout until `next` (none: -1, wait for an event); 0 while a socket has more to read.
  int PollTimeout(std::optional<SteadyClock::time_point> next, SteadyClock::time_point now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // Each socket's ZMQ_FD: readable when the socket's state may have changed (a reply arrived).
  // Edge-like: it fires again only after the socket was read until it had nothing (Pump).
  void AddSocketFds(std::vector<pollfd>* fds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // Reads the sockets whose ZMQ_FD fired in the last poll (`fds` as AddSocketFds built it,
  // after one other descriptor; empty: none fired), or every socket while one has more waiting.
  void PumpFired(const std::vector<pollfd>& fds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // Reads and handles the replies waiting on server `s`'s socket until it has none: a receive
  // that finds nothing has processed the socket's pending commands, which re-arms its ZMQ_FD
  // (edge-like: it fires only on a change). At most kBatch, so that a flood cannot starve the
  // deadlines; more_ then says to come back at once.
  void Pump(size_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  void HandleReply(int server, Frames& frames, bool truncated) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // A request answered without success (`moved`: a "moved" error): completes it, and when it is the
  // Hello to a replacement (1.22) fails what waited for that too.
  void FailReply(Request& r, const Status& s, bool moved = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  void ExpireRequests() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // Reads what the monitors reported, at most every kMonitorEvery (they are not in the poll set:
  // polling them on every wake-up cost about 9% of a 4 KiB round trip with 2 servers).
  void CheckMonitors() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // Handles what server `s`'s monitor has reported (at most 16 events).
  void ReadMonitor(int s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // The monitor of server `s`'s socket reported an event: [u16 event, u32 value][endpoint].
  // True when it failed the server (and rebuilt its socket and monitor).
  bool OnMonitorEvent(int s, Frames& frames) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // Fails everything in flight to server `s` (each with why(request)): its replies can no longer
  // be trusted to come, and rebuilding the socket discards (and releases) whatever is still
  // queued for it. The other servers' parts of the same operations are abandoned too, so the
  // operation ends now with that failure rather than when they answer (a late reply is dropped).
  template <typename Why>
  void FailServer(int s, Why&& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // 1.22: server `s`, which keeps replicas, closed its connection: a new socket to the same
  // endpoint carries a Hello at once (queued until a replacement listens there), and what was in
  // flight to it waits. Its Hello reply then decides (Replaced): a new process gets it all again,
  // in the order first sent; the same process (the connection alone was lost) fails it, as
  // without replicas: it may have applied it.
  void AwaitReplacement(int s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // The Hello of AwaitReplacement was answered (`epoch`: the server's process; `hello`: its id),
  // or failed (`failed`). Runs from the reply's handler, io_mu_ held.
  void Replaced(int s, uint64_t hello, uint64_t epoch, const Status& failed) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Sends what SendNow held for server `s` while its replacement was awaited (or fails it with
  // `failed`).
  void SendHeld(int s, const Status& failed) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // The I/O thread is ending: fails everything in flight or queued, and (dead_) everything
  // submitted from now on.
  void FailAll(const Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  const ClientOptions& options_;
  OnMoved on_moved_;  // set by Start
  std::shared_ptr<Context> context_;
  transport::Waker waker_;
  std::atomic<bool> stopping_{false};
  std::vector<std::atomic<int>> server_minor_;  // each server's protocol minor, from its Hello reply
  std::vector<std::atomic<uint64_t>> server_epoch_;  // 1.22: each server's process, from its Hello reply
  std::vector<std::atomic<bool>> replicated_;        // 1.22: it keeps replicas (its Hello reply said)
  MakeHello make_hello_;                             // set by Start
  std::atomic<uint64_t> next_request_id_{1};
  std::atomic<int64_t> requests_{0}, bytes_sent_{0}, bytes_received_{0};

  Mutex room_mu_;
  CondVar room_cv_;                                // signalled when a slot frees up, or on stopping
  int outstanding_ ABSL_GUARDED_BY(room_mu_) = 0;  // requests submitted and not yet done

  // The sockets and everything in flight, whichever thread uses them (see the top of the file).
  // Lock order: io_mu_ before room_mu_ and a Handle::State's mu (a request completes under it).
  Mutex io_mu_ ABSL_ACQUIRED_BEFORE(room_mu_);
  bool dead_ ABSL_GUARDED_BY(io_mu_) = false;                    // the I/O thread has ended
  Status dead_status_ ABSL_GUARDED_BY(io_mu_);                   // why
  std::vector<zmq::socket_t> sockets_ ABSL_GUARDED_BY(io_mu_);   // one per server
  std::vector<zmq::socket_t> monitors_ ABSL_GUARDED_BY(io_mu_);  // one per server: its socket's disconnections
  std::vector<bool> handshaken_ ABSL_GUARDED_BY(io_mu_);         // per server: its current socket completed a handshake
  // Per server: when the connection to it closed and failed what was in flight (a server that
  // keeps no replica), until a new one completes a handshake. Requests sent to it meanwhile wait
  // on a socket that cannot connect: CheckMonitors fails them once it has been gone for the
  // heartbeat timeout, instead of at their own deadline.
  std::vector<std::optional<SteadyClock::time_point>> gone_since_ ABSL_GUARDED_BY(io_mu_);
  // Per server: the Hello to its replacement in flight (0: none).
  std::vector<uint64_t> rehello_ ABSL_GUARDED_BY(io_mu_);
  // Per server: what was in flight to it when its connection closed (AwaitReplacement), by id.
  std::vector<std::vector<uint64_t>> lost_ ABSL_GUARDED_BY(io_mu_);
  // Per server: what was submitted while its replacement's Hello was unanswered, in order (SendNow).
  std::vector<std::vector<uint64_t>> held_ ABSL_GUARDED_BY(io_mu_);
  static constexpr std::chrono::milliseconds kMonitorEvery{100};
  // 1.22: how long what waits for a lost server's replacement waits at most (its Hello's deadline;
  // ferry-ps --recover waits up to --failover-timeout-s, 60 s, for each of its two peers).
  static constexpr std::chrono::milliseconds kReplacementWait{std::chrono::minutes(3)};
  SteadyClock::time_point last_monitor_check_ ABSL_GUARDED_BY(io_mu_){};
  SteadyClock::time_point next_wait_notice_ ABSL_GUARDED_BY(io_mu_){};
  // Per server: the last Waiting request (AskWhyTheyWait) and its answer, which its reply writes
  // (on the thread holding io_mu_, as every reply is handled).
  struct Asked {
    struct Answer {
      bool done = false;
      std::string text;  // what the server holds this worker's requests for ("": nothing)
      SteadyClock::time_point when;
    };
    SteadyClock::time_point sent;
    std::shared_ptr<Handle::State> op;      // the last request: in flight until Answered()
    std::shared_ptr<Answer> pending, last;  // its answer (done once it came), the one before
    // The newest answer, or nullptr.
    const Answer* Latest() const {
      if (pending && pending->done) return pending.get();
      return last ? last.get() : nullptr;
    }
  };
  std::vector<Asked> asked_ ABSL_GUARDED_BY(io_mu_);
  SteadyClock::time_point next_ask_check_ ABSL_GUARDED_BY(io_mu_){};
  // Heartbeats: when each server was last sent anything, and when to look again.
  std::atomic<bool> heartbeats_on_{false};  // set once the handshake succeeded
  std::vector<SteadyClock::time_point> last_sent_ ABSL_GUARDED_BY(io_mu_);
  Mutex map_mu_;
  uint64_t map_version_ ABSL_GUARDED_BY(map_mu_) = 0;
  std::vector<bool> member_ ABSL_GUARDED_BY(map_mu_);
  std::vector<bool> goodbye_ ABSL_GUARDED_BY(map_mu_);  // per server: owes it a heartbeat (it stopped being one)
  std::atomic<bool> goodbyes_owed_{false};               // any goodbye_
  SteadyClock::time_point next_heartbeat_ ABSL_GUARDED_BY(io_mu_){};
  std::unordered_map<uint64_t, Request> in_flight_ ABSL_GUARDED_BY(io_mu_);
  transport::Deadlines<uint64_t> deadlines_ ABSL_GUARDED_BY(io_mu_);  // (deadline, id) of every request in in_flight_
  Frames pump_frames_ ABSL_GUARDED_BY(io_mu_);                        // Pump's, reused
  bool more_ ABSL_GUARDED_BY(io_mu_) = false;                         // a socket stopped at kBatch with replies left
  // Who reads the replies: a caller driving the sockets (Drive), or else the I/O thread.
  // driving_ is written under io_mu_ and read by the I/O thread without it (it keeps out of the
  // driving caller's way); io_watching_ is the I/O thread's, both orders seq_cst (see Drive).
  std::atomic<bool> driving_{false};
  std::thread::id driver_thread_ ABSL_GUARDED_BY(io_mu_);
  std::atomic<bool> io_watching_{false};  // the I/O thread polls the sockets now
  std::atomic<bool> io_told_{false};      // its waker was notified since it last looked
  transport::Waker driver_waker_;         // wakes the driving caller
  const std::shared_ptr<IoGate> gate_;

  Mutex stop_mu_;  // serialises Stop
  std::thread thread_ ABSL_GUARDED_BY(stop_mu_);
};

}  // namespace io
}  // namespace ferry
