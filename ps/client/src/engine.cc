// The client's I/O engine (engine.h): sockets, the I/O thread, requests in flight, and the
// callers that drive the sockets while they wait.
#include "engine.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include <absl/container/flat_hash_set.h>

#include "ferry/messages/codec.h"
#include "ferry/messages/event_loop.h"
#include "ferry/messages/kinds.h"

namespace ferry {

using io::SteadyClock;

// ---- Handle ----------------------------------------------------------------------------------

namespace {
// Reads the sockets on the calling thread until `op` is answered or `deadline` passes, unless
// another caller already does so or the client is closing (then the caller waits to be told).
void DriveUntilAnswered(Handle::State& op, SteadyClock::time_point deadline) {
  io::IoGate& gate = *op.gate;
  io::Engine* engine = nullptr;
  {
    MutexLock lock(&gate.mu);
    if (gate.engine == nullptr || gate.driving) return;
    gate.driving = true;
    engine = gate.engine;
  }
  engine->Drive(op, deadline);
  MutexLock lock(&gate.mu);
  gate.driving = false;
  gate.idle.SignalAll();
}
}  // namespace

namespace {
// Once every request of `op` is answered: if some were answered "moved" (1.17) and no push was
// applied, sends the operation again by the client's new map (true: it did, and is in flight
// again, or another caller did and it is in flight); if a push was, or the re-runs are spent, the
// operation fails with the moved status.
// One caller re-runs at a time: the re-run counts as a request of the operation until it has
// sent (so no other caller finds it answered meanwhile), and holds the client's Stop back (a
// Handle may outlive its client: then the operation fails, CANCELLED).
bool RerunOne(const std::shared_ptr<Handle::State>& op) {
  {
    MutexLock lock(&op->mu);
    if (op->pending != 0) return true;  // another caller sent it again: wait for that
    if (op->moved == 0) return false;
    const Status moved = op->moved_status;
    op->moved = 0;
    op->moved_status = Status::Ok();
    if (!op->status.ok()) return false;  // failed otherwise too: that failure is the operation's
    if (op->applied > 0) {
      op->status = Status(moved.code(), moved.message() + "; " + std::to_string(op->applied) +
                                            " push request(s) of the operation were applied, so it is not sent "
                                            "again (a push may not run twice): the placement changed while it ran");
      return false;
    }
    if (++op->reruns > Handle::State::kMaxReruns) {
      op->status = Status(moved.code(), moved.message() + "; sent " + std::to_string(Handle::State::kMaxReruns) +
                                            " times again, answered \"moved\" each time");
      return false;
    }
    ++op->pending;  // the re-run itself
  }
  io::IoGate& gate = *op->gate;
  bool alive = false;
  {
    MutexLock lock(&gate.mu);
    alive = gate.engine != nullptr;
    if (alive) ++gate.rerunning;
  }
  const Status sent =
      alive ? op->rerun(op)
            : CancelledError("client closed before the operation could be sent again by the new placement");
  if (alive) {
    MutexLock lock(&gate.mu);
    --gate.rerunning;
    gate.idle.SignalAll();
  }
  MutexLock lock(&op->mu);
  if (!sent.ok() && op->status.ok()) op->status = sent;
  if (--op->pending == 0) {
    op->finished = SteadyClock::now();
    op->cv.SignalAll();
  }
  return true;
}

// Sends again, in order, the operations `waiting` (taken from IoGate::moved) that still exist.
void RerunAll(const std::deque<std::weak_ptr<Handle::State>>& waiting) {
  for (const auto& w : waiting) {
    if (auto op = w.lock()) RerunOne(op);
  }
}

// RerunOne for `op`, after the client's other operations that wait to be sent again (IoGate::moved).
bool RerunIfMoved(const std::shared_ptr<Handle::State>& op) {
  if (!op->rerun) return false;
  std::deque<std::weak_ptr<Handle::State>> waiting;
  {
    MutexLock lock(&op->gate->mu);
    waiting.swap(op->gate->moved);
  }
  RerunAll(waiting);  // (op among them: sent there, and RerunOne below then waits for it)
  return RerunOne(op);
}
}  // namespace

Status Handle::wait(std::chrono::milliseconds timeout) const {
  if (!state_) return Status::Ok();
  const auto deadline = SteadyClock::now() + timeout;
  do {
    if (state_->gate && !state_->Answered()) DriveUntilAnswered(*state_, deadline);
    MutexLock lock(&state_->mu);
    while (state_->pending != 0) {
      if (!state_->cv.WaitUntil(&state_->mu, deadline) && state_->pending != 0) {
        return DeadlineExceededError("operation still in flight after " + std::to_string(timeout.count()) + " ms");
      }
    }
  } while (RerunIfMoved(state_));
  if (state_->lender && !state_->lender->WaitReturned(deadline)) {
    return DeadlineExceededError("operation answered, but ZeroMQ still holds " +
                                 std::to_string(state_->lender->outstanding()) +
                                 " of its pushed buffers; wait again before reusing them");
  }
  MutexLock lock(&state_->mu);
  return state_->status;
}

Status Handle::wait() const { return wait(std::chrono::hours(24 * 365)); }

Served Handle::served() const {
  if (!state_) return {};
  MutexLock lock(&state_->mu);
  return state_->served;
}

std::chrono::nanoseconds Handle::elapsed() const {
  if (!state_) return std::chrono::nanoseconds(0);
  MutexLock lock(&state_->mu);
  if (state_->pending != 0 || state_->finished < state_->started) return std::chrono::nanoseconds(0);
  return state_->finished - state_->started;
}

bool Handle::done() const {
  if (!state_) return true;
  if (RerunIfMoved(state_)) return false;
  MutexLock lock(&state_->mu);
  return state_->pending == 0 && (!state_->lender || state_->lender->outstanding() == 0);
}

namespace io {

Status ExpectFrames(const Frames& payload, size_t n) {
  if (payload.size() == n) return Status::Ok();
  return DataLossError("reply has " + std::to_string(payload.size()) + " payload frames, expected " +
                       std::to_string(n));
}

Status ExpectBytes(const zmq::message_t& frame, size_t bytes) {
  if (frame.size() == bytes) return Status::Ok();
  return DataLossError("reply frame has " + std::to_string(frame.size()) + " bytes, expected " + std::to_string(bytes));
}

// ---- starting and stopping -------------------------------------------------------------------

Engine::Engine(const ClientOptions& options, std::shared_ptr<Context> context)
    : options_(options),
      context_(std::move(context)),
      server_minor_(options.servers.size()),
      server_epoch_(options.servers.size()),
      replicated_(options.servers.size()),
      gate_(std::make_shared<IoGate>()) {
  MutexLock lock(&gate_->mu);
  gate_->engine = this;
}

Status Engine::Start(OnMoved on_moved, MakeHello make_hello) {
  on_moved_ = std::move(on_moved);
  make_hello_ = std::move(make_hello);
  if (!waker_.ok() || !driver_waker_.ok()) return InternalError("cannot create an eventfd for the client's I/O");
  {
    MutexLock lock(&io_mu_);
    sockets_.resize(options_.servers.size());
    monitors_.resize(options_.servers.size());
    handshaken_.resize(options_.servers.size());
    gone_since_.resize(options_.servers.size());
    rehello_.resize(options_.servers.size());
    lost_.resize(options_.servers.size());
    held_.resize(options_.servers.size());
    for (size_t s = 0; s < options_.servers.size(); ++s) FERRY_RETURN_IF_ERROR(OpenSocket(static_cast<int>(s)));
  }
  MutexLock lock(&stop_mu_);
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void Engine::StartHeartbeats() {
  heartbeats_on_.store(HeartbeatEvery().count() > 0);
  waker_.Notify();  // the I/O thread starts its heartbeat timer
}

void Engine::Stop() {
  MutexLock stop(&stop_mu_);
  stopping_.store(true);
  {
    // A caller driving the sockets leaves (it looks at stopping_ whenever it wakes); no other
    // starts. Its operations, and everything else in flight, fail as the I/O thread ends (FailAll).
    driver_waker_.Notify();
    {
      MutexLock lock(&room_mu_);  // a re-run waiting for room leaves (stopping_)
      room_cv_.SignalAll();
    }
    MutexLock lock(&gate_->mu);
    gate_->engine = nullptr;
    while (gate_->driving || gate_->rerunning > 0) gate_->idle.Wait(&gate_->mu);
  }
  {
    MutexLock lock(&room_mu_);
    room_cv_.SignalAll();
  }
  waker_.Notify();
  if (thread_.joinable()) thread_.join();
}

ClientStats Engine::stats() const {
  ClientStats s;
  s.requests = requests_.load();
  s.bytes_sent = bytes_sent_.load();
  s.bytes_received = bytes_received_.load();
  return s;
}

// ---- building and submitting -----------------------------------------------------------------

wire::HeaderBuilder Engine::BeginHeader(flatbuffers::FlatBufferBuilder& fbb, Kind kind) {
  wire::HeaderBuilder h(fbb);
  h.add_major(wire::kMajor);
  h.add_minor(wire::kMinor);
  h.add_kind(kind);
  h.add_rank(options_.rank);
  h.add_incarnation(options_.incarnation);  // (not on the wire while 0, FlatBuffers' default)
  h.add_request_id(next_request_id_.fetch_add(1, std::memory_order_relaxed));
  return h;
}

zmq::message_t Engine::FinishHeader(flatbuffers::FlatBufferBuilder& fbb, wire::HeaderBuilder& h) {
  wire::FinishHeaderBuffer(fbb, h.Finish());
  return wire::ToFrame(fbb);
}

std::shared_ptr<Handle::State> Engine::NewOp() {
  auto op = std::make_shared<Handle::State>();
  op->gate = gate_;
  return op;
}

Handle Engine::Failed(const std::shared_ptr<Handle::State>& op, const Status& s) {
  op->Fail(s);
  return Handle(op);
}

zmq::message_t Engine::Lend(const std::shared_ptr<Handle::State>& op, int server, const void* data, size_t size) {
  if (options_.servers[static_cast<size_t>(server)].starts_with("inproc://")) return zmq::message_t(data, size);
  if (!op->lender) op->lender = std::make_shared<transport::Lender>();
  return transport::Borrow(data, size, op->lender);
}

void Engine::Submit(const std::shared_ptr<Handle::State>& op, int server, Kind kind, zmq::message_t header,
                    Frames payload, OnReply on_reply, std::chrono::milliseconds timeout) {
  const Header* h = nullptr;
  if (Status s = wire::VerifyHeader(header, &h); !s.ok()) {  // our own header: also aligns it
    op->Fail(InternalError("built an invalid header: " + s.ToString()));
    return;
  }
  {
    // Backpressure: wait for room rather than queue without bound.
    MutexLock lock(&room_mu_);
    const auto deadline = SteadyClock::now() + timeout;
    while (outstanding_ >= options_.max_in_flight && !stopping_.load()) {
      if (!room_cv_.WaitUntil(&room_mu_, deadline) && outstanding_ >= options_.max_in_flight && !stopping_.load()) {
        op->Fail(ResourceExhaustedError(std::to_string(options_.max_in_flight) + " requests already in flight to " +
                                        ServerName(server) + "; no room within the request timeout"));
        return;
      }
    }
    ++outstanding_;
  }
  Request r;
  r.id = h->request_id();
  r.server = server;
  r.kind = kind;
  r.frames.reserve(1 + payload.size());
  r.frames.push_back(std::move(header));
  for (auto& p : payload) r.frames.push_back(std::move(p));
  if (replicated_[static_cast<size_t>(server)].load(std::memory_order_relaxed) && make_hello_) {
    r.resend.resize(r.frames.size());
    for (size_t i = 0; i < r.frames.size(); ++i) r.resend[i].copy(r.frames[i]);
  }
  r.on_reply = std::move(on_reply);
  r.op = op;
  r.sent = SteadyClock::now();
  r.deadline = r.sent + timeout;
  {
    MutexLock lock(&op->mu);
    ++op->pending;
  }
  MutexLock lock(&io_mu_);
  if (dead_) return Done(r, dead_status_);
  SendNow(r);
  // Someone must read the reply: a caller driving the sockets does; otherwise the I/O thread,
  // which is told to watch them if it does not (the caller may wait at once, and drive, or
  // not; the I/O thread wakes while the request travels).
  if (!driving_.load()) TellIoThread();
}

void Engine::SendNow(Request& r) {
  const size_t server = static_cast<size_t>(r.server);
  // 1.22: a server that keeps replicas may have gone since the monitors were last read: a request
  // for it must not go on the old connection (ZeroMQ would take it to a replacement, without Hello).
  if (replicated_[server].load(std::memory_order_relaxed) && make_hello_ && rehello_[server] == 0) {
    ReadMonitor(r.server);
  }
  if (rehello_[server] != 0 && r.kind != Kind::Hello) {
    // 1.22: its server is being replaced: held until what the lost one had goes again first, so
    // that the replacement gets this worker's requests in the order they were made (Replaced).
    held_[server].push_back(r.id);
    deadlines_.Add(r.deadline, r.id);
    const uint64_t id = r.id;
    in_flight_.emplace(id, std::move(r));
    return;
  }
  int64_t bytes = 0;
  for (auto& f : r.frames) bytes += static_cast<int64_t>(f.size());
  Status s = transport::Send(sockets_[server], r.frames, /*dontwait=*/true);
  if (!s.ok() && !handshaken_[server]) {
    // Nothing could be queued before the connection's handshake completed: the server may have
    // closed it (a CURVE mismatch), and the monitor then says why. The request is in flight
    // while the monitor's news is read, so that it fails with that reason (FailServer).
    const uint64_t id = r.id;
    in_flight_.emplace(id, std::move(r));
    ReadMonitor(static_cast<int>(server));
    auto it = in_flight_.find(id);
    if (it == in_flight_.end()) return;  // failed, with the monitor's reason
    DoneInFlight(it, s.WithContext("sending " + std::string(wire::KindName(it->second.kind)) + " to " +
                                   ServerName(it->second.server)));
  } else if (!s.ok()) {
    Done(r, s.WithContext("sending " + std::string(wire::KindName(r.kind)) + " to " + ServerName(r.server)));
  } else {
    requests_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
    if (server < last_sent_.size()) last_sent_[server] = SteadyClock::now();
    deadlines_.Add(r.deadline, r.id);
    const uint64_t id = r.id;
    in_flight_.emplace(id, std::move(r));
  }
  // A send may have consumed the socket's signal that replies wait (ZMQ_FD is edge-like):
  // read them now (this one's too, if it is already back), or no poll would wake for them.
  Pump(server);
}

void Engine::TellIoThread() {
  if (!io_watching_.load() && !io_told_.exchange(true)) waker_.Notify();
}

void Engine::Done(Request& r, const Status& s, bool moved) {
  r.resend.clear();  // (a lent frame goes back once ZeroMQ and these have let it go)
  r.op->Finish(s, moved,
               r.kind == Kind::PushDense || r.kind == Kind::PushPullDense || r.kind == Kind::PushSparse ||
                   r.kind == Kind::PushSparseTables);
  if (moved && r.op->WaitsForRerun()) {
    MutexLock lock(&gate_->mu);
    gate_->moved.push_back(r.op);
  }
  if (driving_.load() && std::this_thread::get_id() != driver_thread_) driver_waker_.Notify();
  {
    MutexLock lock(&room_mu_);
    --outstanding_;
  }
  room_cv_.Signal();  // after the unlock: the woken submitter need not wait for the lock
}

void Engine::DoneInFlight(std::unordered_map<uint64_t, Request>::iterator it, const Status& s) {
  Request r = std::move(it->second);
  in_flight_.erase(it);
  deadlines_.Remove(r.deadline, r.id);
  Done(r, s);
}

void Engine::Drive(Handle::State& op, SteadyClock::time_point deadline) {
  {
    MutexLock lock(&io_mu_);
    if (dead_) return;
    driving_.store(true);
    driver_thread_ = std::this_thread::get_id();
  }
  // No socket needs reading before the first poll: whoever used one last read it until it had
  // nothing (Pump), which re-arms its ZMQ_FD.
  std::vector<pollfd> fds;
  while (true) {
    int timeout_ms = 0;
    {
      MutexLock lock(&io_mu_);
      if (!dead_) {
        PumpFired(fds);
        Tick();
      }
      const auto now = SteadyClock::now();
      if (dead_ || op.Answered() || stopping_.load() || now >= deadline) break;
      fds.clear();
      fds.push_back({driver_waker_.fd(), POLLIN, 0});
      AddSocketFds(&fds);
      timeout_ms = PollTimeout(transport::Earliest(NextDeadline(), deadline), now);
    }
    if (RerunQueued()) continue;  // (it sent: look at the sockets again at once)
    if (::poll(fds.data(), fds.size(), timeout_ms) > 0 && (fds[0].revents & POLLIN)) driver_waker_.Drain();
  }
  MutexLock lock(&io_mu_);
  driving_.store(false);
  // Replies for other operations are the I/O thread's again: it watches the sockets. (If it
  // saw this caller driving, it stored io_watching_ false before it looked: seen here.)
  if (!in_flight_.empty() || more_) TellIoThread();
}

bool Engine::RerunQueued() {
  std::deque<std::weak_ptr<Handle::State>> waiting;
  {
    MutexLock lock(&gate_->mu);
    if (gate_->moved.empty()) return false;
    {
      // A driver waiting for room would wait for itself: with none, the re-runs wait for a wait().
      MutexLock room(&room_mu_);
      if (outstanding_ >= options_.max_in_flight) return false;
    }
    waiting.swap(gate_->moved);
  }
  RerunAll(waiting);
  return true;
}

std::string Engine::ServerName(int s) const {
  return "server " + std::to_string(s) + " (" + options_.servers[static_cast<size_t>(s)] + ")";
}

Status Engine::OpenSocket(int s) {
  FERRY_ASSIGN_OR_RETURN(zmq::socket_t sock,
                         transport::MakeSocket(transport::Zmq(*context_), zmq::socket_type::dealer, 100000));
  try {
    if (const auto t = options_.heartbeat_timeout.count(); t > 0) {
      sock.set(zmq::sockopt::heartbeat_ivl, static_cast<int>(std::max<int64_t>(t / 4, 1)));
      sock.set(zmq::sockopt::heartbeat_timeout, static_cast<int>(t));
      sock.set(zmq::sockopt::heartbeat_ttl, static_cast<int>(std::min<int64_t>(t, 6553500)));
    }
  } catch (const zmq::error_t& e) {
    return InternalError("cannot set up the connection to " + ServerName(s) + ": " + e.what());
  }
  if (options_.curve) {
    if (const Status keys = curve::SetClientKeys(sock.handle(), *options_.curve); !keys.ok()) {
      return InternalError("cannot set up the connection to " + ServerName(s) + ": " + keys.message());
    }
  }
  // Handshake failures too: a server that refuses this client's key (or speaks another
  // mechanism) would otherwise look like one that never answers.
  auto monitor = transport::Watch(transport::Zmq(*context_), sock,
                                  ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                      ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
  if (!monitor.ok()) {
    return InternalError("cannot watch the connection to " + ServerName(s) + ": " + monitor.status().message());
  }
  try {
    sock.connect(options_.servers[static_cast<size_t>(s)]);
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError("cannot connect to " + ServerName(s) + ": " + e.what());
  }
  // The old monitor first: the old socket's last events go nowhere.
  monitors_[static_cast<size_t>(s)] = std::move(*monitor);
  sockets_[static_cast<size_t>(s)] = std::move(sock);
  handshaken_[static_cast<size_t>(s)] = false;
  return Status::Ok();
}

// ---- the I/O thread --------------------------------------------------------------------------

std::chrono::milliseconds Engine::HeartbeatEvery() const {
  return options_.heartbeat_timeout.count() > 0 ? std::max(options_.heartbeat_timeout / 4, std::chrono::milliseconds(1))
                                                : std::chrono::milliseconds(0);
}

void Engine::SendHeartbeats() {
  // (A goodbye, the heartbeat owed to a server that stopped being one of the map's, goes at the
  // next tick, heartbeats or not: a server waiting to leave the job waits for it.)
  const bool on = heartbeats_on_.load(std::memory_order_relaxed);
  const bool owed = goodbyes_owed_.load(std::memory_order_relaxed);
  if (!on && !owed) return;
  const auto now = SteadyClock::now();
  const bool beat = on && now >= next_heartbeat_;
  if (!beat && !owed) return;
  const auto every = HeartbeatEvery();
  if (beat) next_heartbeat_ = now + every;
  if (last_sent_.size() != sockets_.size()) last_sent_.assign(sockets_.size(), SteadyClock::time_point{});
  uint64_t version = 0;
  std::vector<bool> member, goodbye;
  {
    MutexLock lock(&map_mu_);
    version = map_version_;
    member = member_;
    goodbye = goodbye_;
  }
  for (size_t s = 0; s < sockets_.size(); ++s) {
    const bool last = s < member.size() && !member[s];
    if (last ? !goodbye[s] : (!beat || now - last_sent_[s] < every)) continue;
    flatbuffers::FlatBufferBuilder fbb(64);
    wire::HeaderBuilder h(fbb);
    h.add_major(wire::kMajor);
    h.add_minor(wire::kMinor);
    h.add_kind(Kind::Heartbeat);
    h.add_rank(options_.rank);
    // A restarted worker's too: without it a server took the heartbeat for its predecessor's
    // (incarnation 0), refused it, and called the waiting worker silent.
    h.add_incarnation(options_.incarnation);
    if (version > 0) h.add_placement_version(version);  // 1.20: the map this client holds
    wire::FinishHeaderBuffer(fbb, h.Finish());
    Frames frames;
    frames.push_back(wire::ToFrame(fbb));
    // A full queue already carries traffic to that server: nothing is lost by dropping this.
    if (transport::Send(sockets_[s], frames, /*dontwait=*/true).ok()) {
      last_sent_[s] = now;
      if (last) {
        MutexLock lock(&map_mu_);
        if (s < goodbye_.size() && map_version_ == version) goodbye_[s] = false;  // (a newer map owes it another)
        goodbyes_owed_.store(std::ranges::any_of(goodbye_, [](bool b) { return b; }));
      }
    }
    Pump(s);  // as after any send (SendNow)
  }
}

void Engine::Loop() {
  std::vector<pollfd> fds;
  Status failed;
  while (!stopping_.load()) {
    int timeout_ms = 0;
    fds.clear();
    fds.push_back({waker_.fd(), POLLIN, 0});
    io_told_.store(false);
    io_watching_.store(false);
    if (driving_.load()) {
      // A caller reads the sockets and keeps the time while it waits; it tells this thread
      // when it leaves with requests still in flight. Without taking io_mu_ (the caller
      // needs it at once when its reply comes): wake for heartbeats only.
      timeout_ms = heartbeats_on_.load() ? static_cast<int>(HeartbeatEvery().count()) : -1;
    } else {
      MutexLock lock(&io_mu_);
      io_watching_.store(!driving_.load());
      if (io_watching_.load()) AddSocketFds(&fds);
      timeout_ms = PollTimeout(NextDeadline(), SteadyClock::now());
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      failed = InternalError(std::string("poll failed: ") + std::strerror(errno));
      break;
    }
    if (fds[0].revents & POLLIN) waker_.Drain();
    if (driving_.load()) continue;
    MutexLock lock(&io_mu_);
    if (driving_.load()) continue;
    PumpFired(fds);
    Tick();
  }
  MutexLock lock(&io_mu_);
  FailAll(failed.ok() ? CancelledError("client closed")
                      : InternalError("client I/O thread stopped: " + failed.message()));
}

void Engine::Tick() {
  ExpireRequests();
  CheckMonitors();
  SendHeartbeats();
  NoteLongWaits();
}

void Engine::NoteLongWaits() {
  const auto every = options_.long_wait_every;
  if (!options_.on_long_wait || every.count() <= 0 || in_flight_.empty()) return;
  const auto now = SteadyClock::now();
  AskWhyTheyWait(now, every / 2);
  if (now < next_wait_notice_) return;
  next_wait_notice_ = now + every;
  std::map<std::pair<int, Kind>, const Request*> oldest;
  for (const auto& [id, r] : in_flight_) {
    if (now - r.sent < every || r.kind == Kind::Waiting) continue;
    const Request*& o = oldest[{r.server, r.kind}];
    if (o == nullptr || r.sent < o->sent) o = &r;
  }
  auto seconds = [](SteadyClock::duration d) {
    return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(d).count());
  };
  for (const auto& [key, r] : oldest) {
    const Asked::Answer* answer = asked_[static_cast<size_t>(r->server)].Latest();
    const bool told = answer != nullptr && answer->when > r->sent && !answer->text.empty();
    options_.on_long_wait("waiting " + seconds(now - r->sent) + " s (of " + seconds(r->deadline - r->sent) + ") for " +
                          ServerName(r->server) + " to answer " + std::string(wire::KindName(r->kind)) +
                          (told ? "; it holds " + answer->text : WhyItWaits(r->kind)));
  }
}

void Engine::AskWhyTheyWait(SteadyClock::time_point now, SteadyClock::duration after) {
  if (now < next_ask_check_) return;
  next_ask_check_ = now + after / 4;
  if (asked_.size() != sockets_.size()) asked_.resize(sockets_.size());
  std::vector<bool> ask(sockets_.size(), false);
  for (const auto& [id, r] : in_flight_) {
    const wire::KindInfo* info = wire::FindKind(r.kind);
    if (info != nullptr && (info->wait == wire::Wait::kStep || info->wait == wire::Wait::kAllWorkers) &&
        now - r.sent >= after) {
      ask[static_cast<size_t>(r.server)] = true;
    }
  }
  for (size_t s = 0; s < ask.size(); ++s) {
    Asked& a = asked_[s];
    if (!ask[s] || server_minor_[s].load() < 8 || (a.op && !a.op->Answered()) || now - a.sent < after) continue;
    a.sent = now;
    if (a.pending && a.pending->done) a.last = std::move(a.pending);
    a.pending = std::make_shared<Asked::Answer>();
    flatbuffers::FlatBufferBuilder fbb(64);
    auto h = BeginHeader(fbb, Kind::Waiting);
    zmq::message_t header = FinishHeader(fbb, h);
    const Header* verified = nullptr;
    if (!wire::VerifyHeader(header, &verified).ok()) return;  // (our own header: also aligns it)
    Request r;
    r.id = verified->request_id();
    r.server = static_cast<int>(s);
    r.kind = Kind::Waiting;
    r.frames.push_back(std::move(header));
    r.on_reply = [answer = a.pending](const Header& reply, Frames& payload) -> Status {
      FERRY_RETURN_IF_ERROR(ExpectFrames(payload, 0));
      answer->text = reply.waiting() ? wire::Printable(reply.waiting()->string_view()) : "";
      answer->when = SteadyClock::now();
      answer->done = true;
      return Status::Ok();
    };
    r.op = NewOp();
    {
      MutexLock lock(&r.op->mu);
      r.op->pending = 1;
    }
    a.op = r.op;
    r.sent = now;
    r.deadline = now + options_.request_timeout;
    {
      MutexLock lock(&room_mu_);
      ++outstanding_;  // Done frees it
    }
    SendNow(r);
  }
}

std::string Engine::WhyItWaits(Kind kind) {
  const wire::KindInfo* info = wire::FindKind(kind);
  switch (info != nullptr ? info->wait : wire::Wait::kNothing) {
    case wire::Wait::kServer: return " (is it running, and is this its address?)";
    case wire::Wait::kStep:
      return " (a sync pull waits for every worker's push of the step before, an ssp pull for the slowest "
             "worker's clock)";
    case wire::Wait::kAllWorkers: return " (it waits for every worker to arrive)";
    case wire::Wait::kNothing: break;
  }
  return "";
}

std::optional<SteadyClock::time_point> Engine::NextDeadline() {
  auto next = deadlines_.Next();
  if (!in_flight_.empty()) next = transport::Earliest(next, last_monitor_check_ + kMonitorEvery);
  if (heartbeats_on_.load(std::memory_order_relaxed)) next = transport::Earliest(next, next_heartbeat_);
  return next;
}

int Engine::PollTimeout(std::optional<SteadyClock::time_point> next, SteadyClock::time_point now) const {
  if (more_) return 0;
  if (!next) return -1;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*next - now).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

void Engine::AddSocketFds(std::vector<pollfd>* fds) {
  for (auto& sock : sockets_) fds->push_back({sock.get(zmq::sockopt::fd), POLLIN, 0});
}

void Engine::PumpFired(const std::vector<pollfd>& fds) {
  const bool all = more_;
  more_ = false;
  for (size_t s = 0; s < sockets_.size(); ++s) {
    if (all || (s + 1 < fds.size() && (fds[s + 1].revents & POLLIN))) Pump(s);
  }
}

void Engine::Pump(size_t s) {
  for (int i = 0; i < transport::EventLoop::kBatch; ++i) {
    bool got = false, truncated = false;
    if (s >= sockets_.size() ||
        !transport::RecvNonBlocking(sockets_[s], &pump_frames_, &got, wire::kMaxFrames + 1, &truncated).ok() || !got) {
      return;
    }
    HandleReply(static_cast<int>(s), pump_frames_, truncated);
  }
  more_ = true;
}

void Engine::HandleReply(int server, Frames& frames, bool truncated) {
  int64_t bytes = 0;
  for (auto& f : frames) bytes += static_cast<int64_t>(f.size());
  bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
  if (frames.empty()) return;
  const Header* h = nullptr;
  const Status verified = wire::VerifyHeader(frames[0], &h);
  if (h == nullptr) return;  // not a reply we can match; dropped
  auto it = in_flight_.find(h->request_id());
  if (it == in_flight_.end() || it->second.server != server) return;  // late reply to a timed-out request
  Request r = std::move(it->second);
  in_flight_.erase(it);
  deadlines_.Remove(r.deadline, r.id);
  const std::string where = std::string(wire::KindName(r.kind)) + " on " + ServerName(server);
  // A reply in another major version (wire.h): its id matched; say which versions differ.
  if (!verified.ok()) return FailReply(r, verified.WithContext(where + ": the server's reply"));
  if (truncated) return FailReply(r, DataLossError(where + ": reply has too many frames"));
  if (h->kind() == Kind::Error) {
    const bool moved = h->placement() != nullptr && on_moved_ && r.op->rerun;
    if (moved) on_moved_(server, *h);
    return FailReply(r, wire::ErrorStatus(*h).WithContext(where), moved);
  }
  if (h->kind() != Kind::Reply || h->request_kind() != r.kind) {
    return FailReply(r, DataLossError(where + ": unexpected reply kind " + std::string(wire::KindName(h->kind()))));
  }
  Frames payload;
  for (size_t i = 1; i < frames.size(); ++i) payload.push_back(std::move(frames[i]));
  r.op->Record(*h);
  Status s = r.on_reply ? r.on_reply(*h, payload) : ExpectFrames(payload, 0);
  Done(r, s.ok() ? s : s.WithContext(where));
}

void Engine::FailReply(Request& r, const Status& s, bool moved) {
  // 1.22: the Hello to a replacement, failed: what waits for it fails too (Replaced).
  if (r.kind == Kind::Hello && rehello_[static_cast<size_t>(r.server)] == r.id) {
    Replaced(r.server, r.id, 0, s.WithContext("the Hello sent on a new connection after the old one closed"));
  }
  Done(r, s, moved);
}

void Engine::ExpireRequests() {
  const auto now = SteadyClock::now();
  std::vector<int> dead;
  for (uint64_t id : deadlines_.TakeDue(now)) {
    const int s = in_flight_.at(id).server;
    if (const uint64_t hello = rehello_[static_cast<size_t>(s)]; hello != 0 && id != hello) {
      // 1.22: its server is being replaced: this request fails alone (the Hello's deadline ends the wait).
      auto it = in_flight_.find(id);
      DoneInFlight(it, DeadlineExceededError(std::string(wire::KindName(it->second.kind)) + " got no reply from " +
                                             ServerName(s) + " in time: it was waiting for that server's replacement"));
      continue;
    }
    dead.push_back(s);
  }
  std::sort(dead.begin(), dead.end());
  dead.erase(std::unique(dead.begin(), dead.end()), dead.end());
  for (int s : dead) {
    FailServer(s, [&](const Request& r) {
      return r.deadline <= now ? DeadlineExceededError(std::string(wire::KindName(r.kind)) + " got no reply from " +
                                                       ServerName(s) + " in time (is it running and reachable?)")
                               : UnavailableError(std::string(wire::KindName(r.kind)) + " abandoned: " + ServerName(s) +
                                                  " stopped answering");
    });
  }
}

void Engine::CheckMonitors() {
  const auto now = SteadyClock::now();
  if (now - last_monitor_check_ < kMonitorEvery) return;
  last_monitor_check_ = now;
  for (int s = 0; s < num_servers(); ++s) ReadMonitor(s);
  const auto after = options_.heartbeat_timeout;
  for (int s = 0; s < num_servers(); ++s) {
    const std::optional<SteadyClock::time_point>& gone = gone_since_[static_cast<size_t>(s)];
    if (!gone || handshaken_[static_cast<size_t>(s)] || after.count() <= 0 || now - *gone < after) continue;
    if (std::none_of(in_flight_.begin(), in_flight_.end(), [s](const auto& kv) { return kv.second.server == s; })) {
      continue;
    }
    const std::string since = std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - *gone).count());
    FailServer(s, [&](const Request& r) {
      return UnavailableError(std::string(wire::KindName(r.kind)) + " abandoned: " + ServerName(s) +
                              " closed the connection " + since +
                              " s ago and has not taken a new one since (killed, hung, or unreachable?)");
    });
  }
}

void Engine::ReadMonitor(int s) {
  Frames frames;
  for (int i = 0; i < 16; ++i) {
    bool got = false, truncated = false;
    if (!transport::RecvNonBlocking(monitors_[static_cast<size_t>(s)], &frames, &got, 4, &truncated).ok() || !got) {
      return;
    }
    if (OnMonitorEvent(s, frames)) return;  // the socket and its monitor were rebuilt
  }
}

bool Engine::OnMonitorEvent(int s, Frames& frames) {
  const auto e = transport::ReadMonitorEvent(frames);
  if (!e) return false;
  const uint16_t event = e->event;
  const uint32_t value = e->value;
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH || event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
    const std::string why =
        event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
            ? " refused this client's CURVE key (ZAP status " + std::to_string(value) +
                  "): it is not one of the job's worker keys, or not worker " + std::to_string(options_.rank) + "'s"
            : std::string(options_.curve ? " does not take CURVE (is it started without the job's keys?)"
                                         : " requires CURVE: give this client the job's keys") +
                  " (ZeroMQ handshake error " + std::to_string(value) + ")";
    FailServer(s, [&](const Request& r) {
      return PermissionDeniedError(std::string(wire::KindName(r.kind)) + " refused: " + ServerName(s) + why);
    });
    return true;
  }
  if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
    handshaken_[static_cast<size_t>(s)] = true;
    gone_since_[static_cast<size_t>(s)].reset();
  }
  if (event != ZMQ_EVENT_DISCONNECTED) return false;
  if (!handshaken_[static_cast<size_t>(s)] && rehello_[static_cast<size_t>(s)] != 0) {
    // 1.22: a replacement awaited: the dead process's port, closing, took the connection and
    // dropped it (or a replacement died before its handshake). ZeroMQ connects again by itself;
    // the Hello and what waits behind it are still queued, and the Hello's deadline bounds the wait.
    return false;
  }
  if (!handshaken_[static_cast<size_t>(s)]) {
    // Closed before the handshake completed. A CURVE server drops a client whose first message it
    // cannot open (one that has another public key for it than its own) and one that offers no
    // CURVE at all; a killed server or another program on the port do so too, rarely.
    FailServer(s, [&](const Request& r) {
      const std::string what = std::string(wire::KindName(r.kind)) + " refused: " + ServerName(s) +
                               " closed the connection during the handshake: ";
      return options_.curve ? PermissionDeniedError(what +
                                                    "the servers' public key this client has (server.pub) is not "
                                                    "its key, or it does not use CURVE")
                            : UnavailableError(what +
                                               "does it require CURVE? (give this client the job's keys: "
                                               "--curve-keys) Or it is at its connection limit (see its log), not a "
                                               "Ferry server, or stopped");
    });
    return true;
  }
  if (replicated_[static_cast<size_t>(s)].load() && make_hello_) {
    AwaitReplacement(s);
    return true;
  }
  const std::string why = options_.heartbeat_timeout.count() > 0
                              ? " closed the connection or left heartbeats unanswered for " +
                                    std::to_string(options_.heartbeat_timeout.count()) + " ms"
                              : " closed the connection";
  if (!gone_since_[static_cast<size_t>(s)]) gone_since_[static_cast<size_t>(s)] = SteadyClock::now();
  FailServer(s, [&](const Request& r) {
    return UnavailableError(std::string(wire::KindName(r.kind)) + " abandoned: " + ServerName(s) + why +
                            " (killed, hung, or unreachable?)");
  });
  return true;
}

template <typename Why>
void Engine::FailServer(int s, Why&& why) {
  absl::flat_hash_set<const Handle::State*> failed;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->second.server != s) {
      ++it;
      continue;
    }
    failed.insert(it->second.op.get());
    Done(it->second, why(it->second));
    deadlines_.Remove(it->second.deadline, it->first);  // one not yet due
    it = in_flight_.erase(it);
  }
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (!failed.contains(it->second.op.get())) {
      ++it;
      continue;
    }
    Done(it->second, CancelledError(std::string(wire::KindName(it->second.kind)) + " on " +
                                    ServerName(it->second.server) + " abandoned: another part failed"));
    deadlines_.Remove(it->second.deadline, it->first);
    it = in_flight_.erase(it);
  }
  rehello_[static_cast<size_t>(s)] = 0;  // (a replacement awaited: failed, with what waited for it)
  lost_[static_cast<size_t>(s)].clear();
  held_[static_cast<size_t>(s)].clear();
  Status st = OpenSocket(s);
  if (!st.ok()) std::fprintf(stderr, "ferry client: %s\n", st.ToString().c_str());
}

void Engine::AwaitReplacement(int s) {
  const uint64_t known = server_epoch_[static_cast<size_t>(s)].load();
  const uint64_t before = rehello_[static_cast<size_t>(s)];  // a replacement awaited already
  // What the old socket still queued goes; what waits for an answer stays in flight.
  if (Status st = OpenSocket(s); !st.ok()) {
    std::fprintf(stderr, "ferry client: %s\n", st.ToString().c_str());
    return;
  }
  zmq::message_t header = make_hello_(s, /*rejoins=*/true);
  const Header* verified = nullptr;
  if (!wire::VerifyHeader(header, &verified).ok()) return;  // (our own header: also aligns it)
  Request hello;
  hello.id = verified->request_id();
  hello.server = s;
  hello.kind = Kind::Hello;
  hello.frames.push_back(std::move(header));
  const uint64_t id = hello.id;
  rehello_[static_cast<size_t>(s)] = id;
  hello.on_reply = [this, s, id](const Header& reply, Frames&) -> Status {
    Replaced(s, id, reply.epoch(), Status::Ok());
    return Status::Ok();
  };
  hello.op = NewOp();
  {
    MutexLock lock(&hello.op->mu);
    hello.op->pending = 1;
  }
  hello.sent = SteadyClock::now();
  // A replacement comes within seconds, or not at all: what waits for it fails after kReplacementWait.
  hello.deadline = hello.sent + std::min<std::chrono::milliseconds>(options_.request_timeout, kReplacementWait);
  {
    MutexLock lock(&room_mu_);
    ++outstanding_;  // Done frees it
  }
  // What was in flight to the lost process (an earlier Hello to a replacement among it): what
  // Replaced sends again or fails. What is sent from now on goes after this Hello, on the new
  // connection, and is answered as any request.
  std::vector<uint64_t>& lost = lost_[static_cast<size_t>(s)];
  if (before != 0) {
    // A replacement lost before it answered: what was lost and held stays so; its Hello goes.
    auto old = in_flight_.find(before);
    if (old != in_flight_.end()) {
      DoneInFlight(old, CancelledError("Hello to " + ServerName(s) + "'s replacement: it went before it answered"));
    }
  } else {
    lost.clear();
    for (const auto& [rid, r] : in_flight_) {
      if (r.server == s) lost.push_back(rid);
    }
    std::sort(lost.begin(), lost.end());
  }
  const int64_t waiting = static_cast<int64_t>(lost.size() + held_[static_cast<size_t>(s)].size());
  std::fprintf(stderr,
               "ferry client: worker %d: %s closed the connection (process %llx); it keeps replicas: %lld request(s) "
               "wait for its replacement, to be sent again once it listens\n",
               options_.rank, ServerName(s).c_str(), static_cast<unsigned long long>(known),
               static_cast<long long>(waiting));
  SendNow(hello);
  // A Hello that fails (or is never answered) fails what waits too.
  auto it = in_flight_.find(id);
  if (it == in_flight_.end() && rehello_[static_cast<size_t>(s)] == id) {
    Replaced(s, id, known, UnavailableError("the Hello to its replacement failed"));
  }
}

void Engine::Replaced(int s, uint64_t hello, uint64_t epoch, const Status& failed) {
  rehello_[static_cast<size_t>(s)] = 0;
  const uint64_t known = server_epoch_[static_cast<size_t>(s)].load();
  std::vector<uint64_t> ids;  // those still in flight (their deadline may have failed some)
  for (const uint64_t id : lost_[static_cast<size_t>(s)]) {
    if (id != hello && in_flight_.contains(id)) ids.push_back(id);
  }
  lost_[static_cast<size_t>(s)].clear();
  const bool same = failed.ok() && epoch == known;
  if (!failed.ok() || same) {
    const std::string why = !failed.ok() ? failed.message()
                                         : "it is the same process (the connection alone was lost): it may have "
                                           "applied them, so they are not sent again";
    for (const uint64_t id : ids) {
      auto it = in_flight_.find(id);
      DoneInFlight(it, UnavailableError(std::string(wire::KindName(it->second.kind)) + " abandoned: " + ServerName(s) +
                                        " closed the connection; " + why));
    }
    SendHeld(s, failed);
    return;
  }
  server_epoch_[static_cast<size_t>(s)].store(epoch);
  int64_t sent = 0, failed_now = 0;
  for (const uint64_t id : ids) {
    auto it = in_flight_.find(id);
    Request& r = it->second;
    Status st = r.resend.empty() ? UnavailableError("sent before this client knew it keeps replicas: not kept")
                                 : Status::Ok();
    if (st.ok()) {
      Frames again(r.resend.size());
      for (size_t i = 0; i < again.size(); ++i) again[i].copy(r.resend[i]);
      st = transport::Send(sockets_[static_cast<size_t>(s)], again, /*dontwait=*/true);
    }
    if (st.ok()) {
      ++sent;
      continue;
    }
    ++failed_now;
    DoneInFlight(it, UnavailableError(std::string(wire::KindName(r.kind)) + " to " + ServerName(s) +
                                      " could not be sent again to its replacement: " + st.message()));
  }
  SendHeld(s, Status::Ok());
  std::fprintf(stderr,
               "ferry client: worker %d: %s was replaced (process %llx): %lld request(s) sent again%s\n",
               options_.rank, ServerName(s).c_str(), static_cast<unsigned long long>(epoch),
               static_cast<long long>(sent),
               failed_now > 0 ? (", " + std::to_string(failed_now) + " failed").c_str() : "");
}

void Engine::SendHeld(int s, const Status& failed) {
  std::vector<uint64_t> held;
  held.swap(held_[static_cast<size_t>(s)]);
  for (const uint64_t id : held) {
    auto it = in_flight_.find(id);
    if (it == in_flight_.end()) continue;  // (failed meanwhile: its deadline)
    Status st = failed;
    {
      MutexLock lock(&it->second.op->mu);  // an operation failed elsewhere sends nothing more
      if (st.ok() && !it->second.op->status.ok()) st = CancelledError("another part of its operation failed");
    }
    int64_t bytes = 0;
    for (const auto& f : it->second.frames) bytes += static_cast<int64_t>(f.size());
    if (st.ok()) st = transport::Send(sockets_[static_cast<size_t>(s)], it->second.frames, /*dontwait=*/true);
    if (st.ok()) {
      requests_.fetch_add(1, std::memory_order_relaxed);
      bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
      if (static_cast<size_t>(s) < last_sent_.size()) last_sent_[static_cast<size_t>(s)] = SteadyClock::now();
      continue;
    }
    DoneInFlight(it, UnavailableError(std::string(wire::KindName(it->second.kind)) + " to " + ServerName(s) +
                                      " was not sent: " + st.message()));
  }
}

void Engine::FailAll(const Status& s) {
  for (auto& [id, r] : in_flight_) Done(r, s);
  in_flight_.clear();
  deadlines_ = {};
  dead_ = true;
  dead_status_ = s;
  monitors_.clear();
  sockets_.clear();  // closes (linger 0) and releases lent frames
}
}  // namespace io
}  // namespace ferry
