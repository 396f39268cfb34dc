// The client: a DEALER socket per server, one I/O thread, and the callers' own threads. Every
// socket operation happens under one lock (io_mu_), on whichever thread holds it: a caller sends
// its own requests; a caller waiting for its operation reads the replies itself (Handle::wait
// "drives" the sockets, so a round trip costs no hand-off between threads); the I/O thread reads
// them when no caller waits, and keeps the time (deadlines, the connection monitors,
// heartbeats). Replies are matched to requests by id. A request that gets no reply by its
// deadline fails, and the socket to that server is rebuilt so nothing stays queued for a dead
// peer (which also returns every buffer lent to ZeroMQ).
#include "ferry/client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include <poll.h>
#include <tuple>
#include <unordered_map>

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include "ferry/mutex.h"
#include "ferry/messages/codec.h"
#include "ferry/messages/deadlines.h"
#include "ferry/messages/kinds.h"
#include "ferry/messages/event_loop.h"
#include "ferry/messages/placement.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"

namespace ferry {

using SteadyClock = std::chrono::steady_clock;
using transport::Frames;
using wire::Header;
using wire::Kind;

// ---- Handle ----------------------------------------------------------------------------------

namespace {
class ClientImpl;

// How a waiting caller reaches its client's sockets: the client while it lives (it closes the
// gate, and waits for a driving caller to leave, before it stops); one caller drives at a time.
struct IoGate {
  Mutex mu;
  CondVar idle;                                    // signalled when the driving caller leaves
  ClientImpl* client ABSL_GUARDED_BY(mu) = nullptr;
  bool driving ABSL_GUARDED_BY(mu) = false;
};
}  // namespace

struct Handle::State {
  Mutex mu;
  CondVar cv;                                  // signalled when pending reaches zero
  int pending ABSL_GUARDED_BY(mu) = 0;               // requests without an answer
  Status status ABSL_GUARDED_BY(mu);                 // the first failure
  Served served ABSL_GUARDED_BY(mu);                 // what the replies reported
  std::shared_ptr<transport::Lender> lender;         // frames lent to ZeroMQ (tcp/ipc pushes); set before sharing
  std::shared_ptr<IoGate> gate;                      // the client's; set before sharing
  const SteadyClock::time_point started = SteadyClock::now();  // the call
  SteadyClock::time_point finished ABSL_GUARDED_BY(mu);        // its last reply

  void Finish(const Status& s) {
    MutexLock lock(&mu);
    if (!s.ok() && status.ok()) status = s;
    if (--pending == 0) {
      finished = SteadyClock::now();
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
    if (pending == 0) finished = SteadyClock::now();
  }
  bool Answered() {
    MutexLock lock(&mu);
    return pending == 0;
  }
};

namespace {
// Reads the sockets on the calling thread until `op` is answered or `deadline` passes, unless
// another caller already does so or the client is closing (then the caller waits to be told).
void DriveUntilAnswered(Handle::State& op, SteadyClock::time_point deadline);
}  // namespace

Status Handle::wait(std::chrono::milliseconds timeout) const {
  if (!state_) return Status::Ok();
  const auto deadline = SteadyClock::now() + timeout;
  if (state_->gate && !state_->Answered()) DriveUntilAnswered(*state_, deadline);
  {
    MutexLock lock(&state_->mu);
    while (state_->pending != 0) {
      if (!state_->cv.WaitUntil(&state_->mu, deadline) && state_->pending != 0) {
        return DeadlineExceededError("operation still in flight after " + std::to_string(timeout.count()) + " ms");
      }
    }
  }
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
  MutexLock lock(&state_->mu);
  return state_->pending == 0 && (!state_->lender || state_->lender->outstanding() == 0);
}

namespace {

// Called on the I/O thread with a verified Reply header and its payload frames.
using OnReply = std::function<Status(const Header&, Frames&)>;

// One message to one server, waiting to be sent or answered.
struct Request {
  uint64_t id = 0;
  int server = 0;
  Kind kind = Kind::Invalid;
  Frames frames;  // [header][payload...]; empty once sent
  OnReply on_reply;
  std::shared_ptr<Handle::State> op;
  SteadyClock::time_point sent, deadline;
};

Status ExpectFrames(const Frames& payload, size_t n) {
  if (payload.size() == n) return Status::Ok();
  return DataLossError("reply has " + std::to_string(payload.size()) + " payload frames, expected " +
                       std::to_string(n));
}

Status ExpectBytes(const zmq::message_t& frame, size_t bytes) {
  if (frame.size() == bytes) return Status::Ok();
  return DataLossError("reply frame has " + std::to_string(frame.size()) + " bytes, expected " + std::to_string(bytes));
}

class ClientImpl final : public Client {
 public:
  ClientImpl(ClientOptions options, std::shared_ptr<Context> context)
      : options_(std::move(options)), context_(std::move(context)), gate_(std::make_shared<IoGate>()) {
    MutexLock lock(&gate_->mu);
    gate_->client = this;
  }

  ~ClientImpl() override {
    stopping_.store(true);
    {
      // A caller driving the sockets leaves (it looks at stopping_ whenever it wakes); no other
      // starts. Its operations, and everything else in flight, fail below (FailAll).
      driver_waker_.Notify();
      MutexLock lock(&gate_->mu);
      gate_->client = nullptr;
      while (gate_->driving) gate_->idle.Wait(&gate_->mu);
    }
    {
      MutexLock lock(&room_mu_);
      room_cv_.SignalAll();
    }
    waker_.Notify();
    if (thread_.joinable()) thread_.join();
  }

  Status Start() {
    if (!waker_.ok() || !driver_waker_.ok()) return InternalError("cannot create an eventfd for the client's I/O");
    server_minor_ = std::vector<std::atomic<int>>(options_.servers.size());
    {
      MutexLock lock(&io_mu_);
      sockets_.resize(options_.servers.size());
      monitors_.resize(options_.servers.size());
      handshaken_.resize(options_.servers.size());
      for (size_t s = 0; s < options_.servers.size(); ++s) FERRY_RETURN_IF_ERROR(OpenSocket(static_cast<int>(s)));
    }
    thread_ = std::thread([this] { Loop(); });
    // A server refuses a Hello for this rank while another connection that is alive speaks for
    // it: this worker's predecessor, whose connection may not have closed yet (a client closed
    // just now in this process: ZeroMQ closes it in the background; a stopped process: the
    // server gives up on it after twice its heartbeat interval). Asked again for a while.
    const auto retry_until =
        SteadyClock::now() + std::min<std::chrono::milliseconds>(
                                 options_.connect_timeout, std::max<std::chrono::milliseconds>(
                                                               options_.heartbeat_timeout, std::chrono::seconds(1)));
    while (true) {
      Status st = Handshake();
      if (st.code() == StatusCode::kAlreadyExists && SteadyClock::now() < retry_until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      if (!st.ok()) return st.WithContext("handshake");
      break;
    }
    heartbeats_on_.store(HeartbeatEvery().count() > 0);
    waker_.Notify();  // the I/O thread starts its heartbeat timer
    return Status::Ok();
  }

  // Says Hello to every server at once. Server 0 says where the job is: the step of the
  // checkpoint it started from, and the id of the job's next collective (a restarted worker
  // continues the sequence the others are in).
  Status Handshake() {
    auto op = NewOp();
    for (int s = 0; s < num_servers(); ++s) {
      flatbuffers::FlatBufferBuilder fbb(128);
      auto h = BeginHeader(fbb, Kind::Hello);
      h.add_num_workers(options_.num_workers);
      h.add_num_servers(num_servers());
      h.add_server_rank(s);
      h.add_heartbeat_ms(HeartbeatEvery().count());
      OnReply on_reply = [this, s](const Header& reply, Frames&) -> Status {
        server_minor_[static_cast<size_t>(s)].store(reply.minor());
        if (s == 0) {
          restored_step_.store(reply.version());
          first_collective_.store(reply.next_collective());
          barrier_generation_.store(reply.next_collective());
        }
        return Status::Ok();
      };
      Submit(op, s, Kind::Hello, FinishHeader(fbb, h), {}, std::move(on_reply), options_.connect_timeout);
    }
    return Handle(op).wait(options_.connect_timeout + std::chrono::seconds(1));
  }

  int rank() const override { return options_.rank; }
  int num_workers() const override { return options_.num_workers; }
  int num_servers() const override { return static_cast<int>(options_.servers.size()); }

  ClientStats stats() const override {
    ClientStats s;
    s.requests = requests_.load();
    s.bytes_sent = bytes_sent_.load();
    s.bytes_received = bytes_received_.load();
    s.values_saturated = values_saturated_.load();
    return s;
  }

  // ---- tables ------------------------------------------------------------------------------

  Status Declare(const TableSpec& spec) override {
    FERRY_RETURN_IF_ERROR(spec.Validate());
    // A server before 1.6 would read a compressed table's frames as float32: refused here, before
    // any server is asked.
    if (spec.wire != WireFormat::kF32 || spec.topk_ratio > 0.0f) {
      for (int s = 0; s < num_servers(); ++s) {
        const int minor = server_minor_[static_cast<size_t>(s)].load();
        if (minor >= 6) continue;
        return FailedPreconditionError(
            "table '" + spec.name + "' is declared with " +
            (spec.wire != WireFormat::kF32 ? "wire=" + std::string(WireFormatName(spec.wire)) : std::string("topk")) +
            ", but server " + std::to_string(s) + " speaks protocol 1." + std::to_string(minor) +
            ", which would misread its compressed frames (they need 1.6); declare it with wire=f32 and no topk, or "
            "upgrade the servers");
      }
    }
    auto op = NewOp();
    for (int s = 0; s < num_servers(); ++s) {
      flatbuffers::FlatBufferBuilder fbb(512);
      auto wspec = wire::SpecToWire(fbb, spec);
      auto h = BeginHeader(fbb, Kind::CreateTable);
      h.add_table_id(TableId(spec.name));
      h.add_spec(wspec);
      Submit(op, s, Kind::CreateTable, FinishHeader(fbb, h), {}, nullptr, options_.request_timeout);
    }
    FERRY_RETURN_IF_ERROR(Handle(op).wait());
    MutexLock lock(&tables_mu_);
    tables_[spec.name] = spec;
    if (spec.topk_ratio > 0.0f && !residuals_.contains(spec.name)) {
      auto r = std::make_shared<Residual>();
      MutexLock rl(&r->mu);
      r->acc.assign(static_cast<size_t>(spec.num_elements()), 0.0f);
      residuals_[spec.name] = std::move(r);
    }
    return Status::Ok();
  }

  StatusOr<TableSpec> Lookup(std::string_view name, TableType type) const {
    MutexLock lock(&tables_mu_);
    auto it = tables_.find(std::string(name));
    if (it == tables_.end()) return NotFoundError("table '" + std::string(name) + "' was not declared by this client");
    if (it->second.type != type) {
      return InvalidArgumentError("table '" + std::string(name) + "' is " +
                                  (it->second.type == TableType::kDense ? "dense" : "sparse"));
    }
    return it->second;
  }

  // ---- dense -------------------------------------------------------------------------------

  // One chunk of one tensor, routed to its server.
  struct ChunkRef {
    uint64_t table_id;
    int64_t chunk;
    int64_t offset;
    int64_t count;
    size_t tensor;  // index into the call's tensor list
    WireFormat wire;  // the table's value format (1.6)
    float topk_ratio;  // the table's top-k ratio (pushes; 0: off)
  };

  // Splits tensors into chunks grouped per server, each group cut into messages of at most
  // max_message_bytes.
  StatusOr<std::vector<std::vector<std::vector<ChunkRef>>>> Route(std::span<const std::string_view> names,
                                                                  std::span<const size_t> sizes) const {
    std::vector<std::vector<std::vector<ChunkRef>>> per_server(static_cast<size_t>(num_servers()));
    std::vector<int64_t> bytes(static_cast<size_t>(num_servers()), 0);
    for (size_t t = 0; t < names.size(); ++t) {
      FERRY_ASSIGN_OR_RETURN(TableSpec spec, Lookup(names[t], TableType::kDense));
      if (static_cast<int64_t>(sizes[t]) != spec.num_elements()) {
        return InvalidArgumentError("table '" + spec.name + "' has " + std::to_string(spec.num_elements()) +
                                    " elements, the buffer has " + std::to_string(sizes[t]));
      }
      const uint64_t id = TableId(spec.name);
      for (int64_t c = 0; c < spec.num_chunks(); ++c) {
        const int s = placement::ChunkServer(id, c, num_servers());
        const int64_t offset = c * spec.chunk_elems;
        const int64_t count = std::min(spec.chunk_elems, spec.num_elements() - offset);
        auto& msgs = per_server[static_cast<size_t>(s)];
        const int64_t b = count * static_cast<int64_t>(sizeof(float));
        if (msgs.empty() || bytes[static_cast<size_t>(s)] + b > options_.max_message_bytes ||
            msgs.back().size() + 1 >= wire::kMaxFrames) {
          msgs.emplace_back();
          bytes[static_cast<size_t>(s)] = 0;
        }
        msgs.back().push_back({id, c, offset, count, t, spec.wire, spec.topk_ratio});
        bytes[static_cast<size_t>(s)] += b;
      }
    }
    return per_server;
  }

  zmq::message_t DenseHeader(Kind kind, const std::vector<ChunkRef>& chunks, int64_t step) {
    flatbuffers::FlatBufferBuilder fbb(128 + 24 * chunks.size());
    std::vector<wire::DenseSlice> slices;
    slices.reserve(chunks.size());
    for (const auto& c : chunks) slices.emplace_back(c.table_id, c.chunk, c.count);
    auto vec = fbb.CreateVectorOfStructs(slices);
    auto h = BeginHeader(fbb, kind);
    h.add_step(step);
    h.add_slices(vec);
    return FinishHeader(fbb, h);
  }

  // Copies each reply frame into its tensor's output span.
  static OnReply ScatterDense(std::vector<ChunkRef> chunks, std::vector<std::span<float>> outs) {
    return [chunks = std::move(chunks), outs = std::move(outs)](const Header&, Frames& payload) -> Status {
      FERRY_RETURN_IF_ERROR(ExpectFrames(payload, chunks.size()));
      for (size_t i = 0; i < chunks.size(); ++i) {
        const auto& c = chunks[i];
        FERRY_RETURN_IF_ERROR(ExpectBytes(payload[i], static_cast<size_t>(c.count * wire::ValueBytes(c.wire))));
        wire::DecodeValues(c.wire, payload[i].data(), c.count, outs[c.tensor].data() + c.offset);
      }
      return Status::Ok();
    };
  }

  Handle DenseOp(Kind kind, std::span<const DenseIn> grads, std::span<const DenseOut> outs, int64_t step) {
    auto op = NewOp();
    std::vector<std::string_view> names;
    std::vector<size_t> sizes;
    if (kind == Kind::PullDense) {
      for (const auto& o : outs) names.push_back(o.table), sizes.push_back(o.data.size());
    } else {
      for (const auto& g : grads) names.push_back(g.table), sizes.push_back(g.data.size());
    }
    if (kind == Kind::PushPullDense) {
      if (outs.size() != grads.size())
        return Failed(op, InvalidArgumentError("PushPullDense: grads and outputs differ in count"));
      for (size_t t = 0; t < outs.size(); ++t) {
        if (outs[t].table != grads[t].table || outs[t].data.size() != grads[t].data.size()) {
          return Failed(op, InvalidArgumentError("PushPullDense: output " + std::to_string(t) + " ('" +
                                                 std::string(outs[t].table) + "') does not match gradient '" +
                                                 std::string(grads[t].table) + "'"));
        }
      }
    }
    for (size_t i = 0; i < names.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (names[i] == names[j]) {
          return Failed(op, InvalidArgumentError("table '" + std::string(names[i]) +
                                                 "' appears twice in one call; name each table once"));
        }
      }
    }
    auto routed = Route(names, sizes);
    if (!routed.ok()) return Failed(op, routed.status());
    std::vector<std::span<float>> out_spans;
    for (const auto& o : outs) out_spans.push_back(o.data);
    for (int s = 0; s < num_servers(); ++s) {
      for (auto& chunks : (*routed)[static_cast<size_t>(s)]) {
        Frames payload;
        if (kind != Kind::PullDense) {
          for (const auto& c : chunks) {
            const float* g = grads[c.tensor].data.data() + c.offset;
            if (c.wire == WireFormat::kF32 && c.topk_ratio == 0.0f) {
              payload.push_back(Lend(op, s, g, static_cast<size_t>(c.count) * sizeof(float)));
            } else {
              payload.push_back(EncodePush(grads[c.tensor].table, c, g));
            }
          }
        }
        OnReply on_reply = kind == Kind::PushDense ? OnReply() : ScatterDense(chunks, out_spans);
        Submit(op, s, kind, DenseHeader(kind, chunks, step), std::move(payload), std::move(on_reply),
               options_.request_timeout);
      }
    }
    return Handle(op);
  }

  // A compressed table's chunk as it travels (1.6): 16-bit values, or a top-k frame of the chunk
  // plus the table's residual (which keeps what is not sent, for the table's next push).
  zmq::message_t EncodePush(std::string_view table, const ChunkRef& c, const float* g) {
    if (c.topk_ratio == 0.0f) {
      zmq::message_t frame(static_cast<size_t>(c.count * wire::ValueBytes(c.wire)));
      values_saturated_.fetch_add(wire::EncodeValues(c.wire, g, c.count, frame.data()));
      return frame;
    }
    std::shared_ptr<Residual> r;
    {
      MutexLock lock(&tables_mu_);
      r = residuals_.at(std::string(table));  // made by Declare for every top-k table
    }
    zmq::message_t frame(static_cast<size_t>(wire::TopKFrameBytes(c.wire, c.topk_ratio, c.count)));
    MutexLock lock(&r->mu);
    float* acc = r->acc.data() + c.offset;
    for (int64_t i = 0; i < c.count; ++i) acc[i] += g[i];
    values_saturated_.fetch_add(wire::EncodeTopK(c.wire, c.topk_ratio, acc, c.count, frame.data(), &r->scratch));
    return frame;
  }

  Handle PullDense(std::span<const DenseOut> tensors, int64_t step) override {
    return DenseOp(Kind::PullDense, {}, tensors, step);
  }
  Handle PushDense(std::span<const DenseIn> grads, int64_t step) override {
    return DenseOp(Kind::PushDense, grads, {}, step);
  }
  Handle PushPullDense(std::span<const DenseIn> grads, std::span<const DenseOut> out, int64_t step) override {
    return DenseOp(Kind::PushPullDense, grads, out, step);
  }

  // ---- sparse ------------------------------------------------------------------------------

  // One table's share of a sparse call on one server: the ids it sends there and where their
  // rows go in (pull) or come from (push) the caller's buffers.
  struct SparseShare {
    size_t table = 0;   // index into the call's tables
    int64_t dim = 0;
    WireFormat wire = WireFormat::kF32;  // the table's value format (1.6)
    uint64_t table_id = 0;
    std::span<const int64_t> ids;   // what travels: the caller's span (one server, distinct ids) or own_ids
    std::vector<int64_t> own_ids;
    // Pull: (position in the caller's ids, row in `ids`) for every position (none: rows map
    // one to one, in order). Push: unused.
    std::vector<std::pair<int64_t, int64_t>> positions;
    // Push: the gradient rows in `ids` order (none: the caller's rows travel as they are).
    std::vector<float> own_grads;
  };

  // Deduplicates (unless the caller says the ids are distinct) and groups one table's ids per
  // server. `grads` (push) is summed per distinct id, in order of appearance; `shares` gets
  // this table's share for each server (an empty one where the server holds none of its ids).
  void ShareTable(size_t table, const TableSpec& spec, std::span<const int64_t> ids, const float* grads, bool distinct,
                  bool push, std::vector<std::vector<SparseShare>>* shares) const {
    const int S = num_servers();
    const int64_t dim = spec.dim;
    std::vector<SparseShare> mine(static_cast<size_t>(S));
    for (auto& sh : mine) sh.table = table, sh.dim = dim, sh.table_id = TableId(spec.name), sh.wire = spec.wire;
    if (distinct && S == 1) {  // nothing to group: the caller's buffers travel as they are
      mine[0].ids = ids;
    } else {
      // Where each distinct id went: its server and its row there (only needed when ids repeat).
      absl::flat_hash_map<int64_t, std::pair<int, int64_t>> where;
      if (!distinct) where.reserve(ids.size());
      for (size_t p = 0; p < ids.size(); ++p) {
        int s = 0;
        int64_t row = 0;
        bool first = true;
        if (distinct) {
          s = placement::IdServer(ids[p], S);
          row = static_cast<int64_t>(mine[static_cast<size_t>(s)].own_ids.size());
        } else {
          auto [it, inserted] = where.try_emplace(ids[p]);
          if (inserted) {
            const int to = placement::IdServer(ids[p], S);
            it->second = {to, static_cast<int64_t>(mine[static_cast<size_t>(to)].own_ids.size())};
          }
          std::tie(s, row) = it->second;
          first = inserted;
        }
        SparseShare& sh = mine[static_cast<size_t>(s)];
        if (first) sh.own_ids.push_back(ids[p]);
        const float* g = push ? grads + static_cast<int64_t>(p) * dim : nullptr;
        if (!push) {
          sh.positions.emplace_back(static_cast<int64_t>(p), row);
        } else if (first) {  // the first occurrence is copied, later ones added
          sh.own_grads.insert(sh.own_grads.end(), g, g + dim);
        } else {
          float* acc = sh.own_grads.data() + row * dim;
          for (int64_t j = 0; j < dim; ++j) acc[j] += g[j];
        }
      }
      for (auto& sh : mine) sh.ids = sh.own_ids;
    }
    for (int s = 0; s < S; ++s) (*shares)[static_cast<size_t>(s)].push_back(std::move(mine[static_cast<size_t>(s)]));
  }

  // Pulls (grads empty) or pushes sparse rows of several tables. Every table is checked before
  // anything is sent. Then, table by table, each server's share joins that server's next message,
  // which is sent once it holds about sparse_message_bytes (cut between tables; never past
  // max_message_bytes or the frame limit): the server starts on it while the client builds the
  // rest. A server older than protocol 1.5 gets one PullSparse / PushSparse per table instead.
  Handle SparseOp(std::span<const SparseOut> pulls, std::span<const SparseIn> pushes, int64_t step, SparseIds id_kind) {
    auto op = NewOp();
    const bool push = !pushes.empty();
    const size_t T = push ? pushes.size() : pulls.size();
    const int S = num_servers();
    const bool distinct = id_kind == SparseIds::kDistinct;
    std::vector<TableSpec> specs(T);
    std::vector<std::span<float>> outs(T);
    std::vector<std::span<const float>> ins(T);
    for (size_t t = 0; t < T; ++t) {
      const std::string_view name = push ? pushes[t].table : pulls[t].table;
      const std::span<const int64_t> ids = push ? pushes[t].ids : pulls[t].ids;
      for (size_t u = 0; u < t; ++u) {
        if ((push ? pushes[u].table : pulls[u].table) == name) {
          return Failed(op, InvalidArgumentError("table '" + std::string(name) +
                                                 "' appears twice in one call; name each table once"));
        }
      }
      auto spec = Lookup(name, TableType::kSparse);
      if (!spec.ok()) return Failed(op, spec.status());
      const size_t want = ids.size() * static_cast<size_t>(spec->dim);
      const size_t have = push ? pushes[t].grads.size() : pulls[t].rows.size();
      if (have != want) {
        return Failed(op, InvalidArgumentError(std::string(push ? "PushSparse '" : "PullSparse '") + spec->name +
                                               "': " + (push ? "gradient" : "output") + " has " + std::to_string(have) +
                                               " floats, ids x dim is " + std::to_string(want)));
      }
      specs[t] = std::move(*spec);
      if (push) {
        ins[t] = pushes[t].grads;
      } else {
        outs[t] = pulls[t].rows;
      }
    }
    std::vector<std::vector<SparseShare>> shares(static_cast<size_t>(S));
    std::vector<size_t> first_unsent(static_cast<size_t>(S), 0);
    std::vector<int64_t> unsent_bytes(static_cast<size_t>(S), 0);
    // Sends server s's shares not sent yet, up to (not including) `end`.
    auto send_unsent = [&](int s, size_t end) {
      size_t& from = first_unsent[static_cast<size_t>(s)];
      if (from == end) return;
      const bool legacy = server_minor_[static_cast<size_t>(s)].load() < 5;
      SendSparse(op, s, std::span<SparseShare>(shares[static_cast<size_t>(s)]).subspan(from, end - from), push, legacy,
                 step, ins, outs);
      from = end;
      unsent_bytes[static_cast<size_t>(s)] = 0;
    };
    const size_t most_tables = (wire::kMaxFrames - 1) / (push ? 2 : 1);
    for (size_t t = 0; t < T; ++t) {
      ShareTable(t, specs[t], push ? pushes[t].ids : pulls[t].ids, push ? pushes[t].grads.data() : nullptr, distinct,
                 push, &shares);
      // A sync table reaches every server, even with no ids there: each server closes every step
      // with every worker's (maybe empty) gradient, and a pull for step t waits until every server
      // has closed step t - 1.
      const bool sync = specs[t].consistency == Consistency::kSync;
      for (int s = 0; s < S; ++s) {
        auto& list = shares[static_cast<size_t>(s)];
        if (list.back().ids.empty() && !sync) {
          list.pop_back();
          continue;
        }
        const int64_t bytes = static_cast<int64_t>(list.back().ids.size()) * (8 + list.back().dim * 4);
        const size_t unsent = list.size() - first_unsent[static_cast<size_t>(s)];
        if (unsent > 1 &&
            (unsent_bytes[static_cast<size_t>(s)] + bytes > options_.max_message_bytes || unsent > most_tables)) {
          send_unsent(s, list.size() - 1);  // this table goes in the next message
        }
        unsent_bytes[static_cast<size_t>(s)] += bytes;
        const int64_t cut = options_.sparse_message_bytes;
        if (server_minor_[static_cast<size_t>(s)].load() < 5 ||
            (cut > 0 && unsent_bytes[static_cast<size_t>(s)] >= cut)) {
          send_unsent(s, list.size());
        }
      }
    }
    for (int s = 0; s < S; ++s) send_unsent(s, shares[static_cast<size_t>(s)].size());
    return Handle(op);
  }

  void SendSparse(const std::shared_ptr<Handle::State>& op, int s, std::span<SparseShare> group, bool push, bool legacy,
                  int64_t step, std::span<const std::span<const float>> ins, std::span<const std::span<float>> outs) {
    const Kind kind = legacy ? (push ? Kind::PushSparse : Kind::PullSparse)
                             : (push ? Kind::PushSparseTables : Kind::PullSparseTables);
    flatbuffers::FlatBufferBuilder fbb(128 + 24 * group.size());
    flatbuffers::Offset<flatbuffers::Vector<const wire::SparseSlice*>> vec;
    if (!legacy) {
      std::vector<wire::SparseSlice> slices;
      slices.reserve(group.size());
      for (const auto& sh : group) slices.emplace_back(sh.table_id, sh.dim, static_cast<int64_t>(sh.ids.size()));
      vec = fbb.CreateVectorOfStructs(slices);
    }
    auto h = BeginHeader(fbb, kind);
    h.add_step(step);
    if (legacy) {
      h.add_table_id(group[0].table_id);
      h.add_num_ids(static_cast<int64_t>(group[0].ids.size()));
      h.add_dim(group[0].dim);
    } else {
      h.add_sparse(vec);
    }
    zmq::message_t header = FinishHeader(fbb, h);
    Frames payload;
    payload.reserve(group.size() * (push ? 2 : 1));
    for (auto& sh : group) {
      const size_t id_bytes = sh.ids.size() * sizeof(int64_t);
      if (id_bytes == 0) {
        payload.emplace_back();
      } else if (sh.own_ids.empty()) {
        payload.push_back(Lend(op, s, sh.ids.data(), id_bytes));
      } else {
        payload.push_back(transport::Adopt(std::move(sh.own_ids)));
      }
      if (!push) continue;
      if (id_bytes == 0) {
        payload.emplace_back();
      } else if (sh.wire != WireFormat::kF32) {  // 1.6: the rows in the table's 16-bit format
        const float* rows = sh.own_grads.empty() ? ins[sh.table].data() : sh.own_grads.data();
        const int64_t values = static_cast<int64_t>(sh.ids.size()) * sh.dim;
        zmq::message_t frame(static_cast<size_t>(values * wire::ValueBytes(sh.wire)));
        values_saturated_.fetch_add(wire::EncodeValues(sh.wire, rows, values, frame.data()));
        payload.push_back(std::move(frame));
      } else if (sh.own_grads.empty()) {
        payload.push_back(Lend(op, s, ins[sh.table].data(), ins[sh.table].size() * sizeof(float)));
      } else {
        payload.push_back(transport::Adopt(std::move(sh.own_grads)));
      }
    }
    OnReply on_reply;
    if (!push) {
      struct Scatter {
        std::span<float> out;
        int64_t dim, rows;
        WireFormat wire;
        std::vector<std::pair<int64_t, int64_t>> positions;
      };
      std::vector<Scatter> scatter;
      scatter.reserve(group.size());
      for (auto& sh : group) {
        scatter.push_back(
            {outs[sh.table], sh.dim, static_cast<int64_t>(sh.ids.size()), sh.wire, std::move(sh.positions)});
      }
      on_reply = [scatter = std::move(scatter)](const Header&, Frames& reply) -> Status {
        FERRY_RETURN_IF_ERROR(ExpectFrames(reply, scatter.size()));
        std::vector<float> wide;  // a 16-bit table's rows as float32, when they do not map one to one
        for (size_t i = 0; i < scatter.size(); ++i) {
          const Scatter& sc = scatter[i];
          const size_t row_bytes = static_cast<size_t>(sc.dim) * sizeof(float);
          FERRY_RETURN_IF_ERROR(
              ExpectBytes(reply[i], static_cast<size_t>(sc.rows * sc.dim * wire::ValueBytes(sc.wire))));
          const float* rows = static_cast<const float*>(reply[i].data());
          if (sc.positions.empty()) {  // one to one, in order
            if (sc.rows > 0) wire::DecodeValues(sc.wire, reply[i].data(), sc.rows * sc.dim, sc.out.data());
            continue;
          }
          if (sc.wire != WireFormat::kF32) {
            wide.resize(static_cast<size_t>(sc.rows * sc.dim));
            wire::DecodeValues(sc.wire, reply[i].data(), sc.rows * sc.dim, wide.data());
            rows = wide.data();
          }
          for (auto [p, r] : sc.positions) std::memcpy(sc.out.data() + p * sc.dim, rows + r * sc.dim, row_bytes);
        }
        return Status::Ok();
      };
    }
    Submit(op, s, kind, std::move(header), std::move(payload), std::move(on_reply), options_.request_timeout);
  }

  Handle PullSparse(std::span<const SparseOut> tables, int64_t step, SparseIds ids) override {
    return SparseOp(tables, {}, step, ids);
  }
  Handle PushSparse(std::span<const SparseIn> tables, int64_t step, SparseIds ids) override {
    if (tables.empty()) return Handle();
    return SparseOp({}, tables, step, ids);
  }

  // ---- clocks, barriers, stats -------------------------------------------------------------

  // One header-only request of `kind` (with `step`) to every server, all in flight together.
  Handle ToEveryServer(Kind kind, int64_t step) {
    auto op = NewOp();
    for (int s = 0; s < num_servers(); ++s) {
      flatbuffers::FlatBufferBuilder fbb(96);
      auto h = BeginHeader(fbb, kind);
      h.add_step(step);
      Submit(op, s, kind, FinishHeader(fbb, h), {}, nullptr, options_.request_timeout);
    }
    return Handle(op);
  }

  Handle AdvanceClock(int64_t clock) override { return ToEveryServer(Kind::Clock, clock); }

  Status Finish() override { return ToEveryServer(Kind::Finish, 0).wait(); }

  Status Barrier() override {
    auto op = NewOp();
    flatbuffers::FlatBufferBuilder fbb(96);
    auto h = BeginHeader(fbb, Kind::Barrier);
    h.add_barrier_id(barrier_generation_.fetch_add(1));
    Submit(op, 0, Kind::Barrier, FinishHeader(fbb, h), {}, nullptr, options_.request_timeout);
    return Handle(op).wait();
  }

  StatusOr<std::vector<double>> AllReduceSum(std::span<const double> values) override {
    auto op = NewOp();
    auto result = std::make_shared<std::vector<double>>(values.size());
    flatbuffers::FlatBufferBuilder fbb(96);
    auto h = BeginHeader(fbb, Kind::AllReduce);
    h.add_barrier_id(barrier_generation_.fetch_add(1));
    h.add_num_ids(static_cast<int64_t>(values.size()));
    Frames payload;
    payload.emplace_back(values.data(), values.size() * sizeof(double));  // a copy: the caller's span may go
    OnReply on_reply = [result](const Header&, Frames& reply) -> Status {
      FERRY_RETURN_IF_ERROR(ExpectFrames(reply, 1));
      FERRY_RETURN_IF_ERROR(ExpectBytes(reply[0], result->size() * sizeof(double)));
      std::memcpy(result->data(), reply[0].data(), result->size() * sizeof(double));
      return Status::Ok();
    };
    Submit(op, 0, Kind::AllReduce, FinishHeader(fbb, h), std::move(payload), std::move(on_reply),
           options_.request_timeout);
    FERRY_RETURN_IF_ERROR(Handle(op).wait());
    return std::move(*result);
  }

  int64_t restored_step() const override { return restored_step_.load(); }
  int64_t first_collective() const override { return first_collective_.load(); }

  Handle SaveCheckpoint(int64_t step, std::span<CheckpointShard> shards) override {
    auto op = NewOp();
    if (shards.size() != static_cast<size_t>(num_servers())) {
      return Failed(op, InvalidArgumentError("SaveCheckpoint: " + std::to_string(shards.size()) +
                                             " shard slots for " + std::to_string(num_servers()) + " servers"));
    }
    for (int s = 0; s < num_servers(); ++s) {
      flatbuffers::FlatBufferBuilder fbb(96);
      auto h = BeginHeader(fbb, Kind::Checkpoint);
      h.add_step(step);
      CheckpointShard* out = &shards[static_cast<size_t>(s)];
      OnReply on_reply = [out](const Header& reply, Frames&) -> Status {
        if (!reply.shards() || reply.shards()->size() != 1 || !reply.shards()->Get(0)->file()) {
          return DataLossError("Checkpoint reply does not name one shard file");
        }
        const auto* f = reply.shards()->Get(0);
        *out = {f->file()->str(), f->bytes(), f->crc32(), std::chrono::microseconds(reply.snapshot_us())};
        return Status::Ok();
      };
      Submit(op, s, Kind::Checkpoint, FinishHeader(fbb, h), {}, std::move(on_reply), options_.request_timeout);
    }
    return Handle(op);
  }

  Status CommitCheckpoint(int64_t step, std::span<const CheckpointShard> shards) override {
    auto op = NewOp();
    flatbuffers::FlatBufferBuilder fbb(128 + 96 * shards.size());
    std::vector<flatbuffers::Offset<wire::ShardFile>> files;
    for (const auto& f : shards)
      files.push_back(wire::CreateShardFile(fbb, fbb.CreateString(f.file), f.bytes, f.crc32));
    auto vec = fbb.CreateVector(files);
    auto h = BeginHeader(fbb, Kind::CommitCheckpoint);
    h.add_step(step);
    h.add_shards(vec);
    Submit(op, 0, Kind::CommitCheckpoint, FinishHeader(fbb, h), {}, nullptr, options_.request_timeout);
    return Handle(op).wait();
  }

  StatusOr<std::map<std::string, int64_t>> ServerCounters(int server) override {
    if (server < 0 || server >= num_servers()) return InvalidArgumentError("no server " + std::to_string(server));
    auto op = NewOp();
    auto result = std::make_shared<std::map<std::string, int64_t>>();
    flatbuffers::FlatBufferBuilder fbb(96);
    auto h = BeginHeader(fbb, Kind::Stats);
    OnReply on_reply = [result](const Header& reply, Frames&) -> Status {
      if (reply.counters()) {
        for (const auto* c : *reply.counters()) {
          if (c->name()) (*result)[c->name()->str()] = c->value();
        }
      }
      return Status::Ok();
    };
    Submit(op, server, Kind::Stats, FinishHeader(fbb, h), {}, std::move(on_reply), options_.request_timeout);
    FERRY_RETURN_IF_ERROR(Handle(op).wait());
    return *result;
  }

 private:
  // ---- building and submitting -------------------------------------------------------------

  wire::HeaderBuilder BeginHeader(flatbuffers::FlatBufferBuilder& fbb, Kind kind) {
    wire::HeaderBuilder h(fbb);
    h.add_major(wire::kMajor);
    h.add_minor(wire::kMinor);
    h.add_kind(kind);
    h.add_rank(options_.rank);
    h.add_request_id(next_request_id_.fetch_add(1, std::memory_order_relaxed));
    return h;
  }
  static zmq::message_t FinishHeader(flatbuffers::FlatBufferBuilder& fbb, wire::HeaderBuilder& h) {
    wire::FinishHeaderBuffer(fbb, h.Finish());
    return wire::ToFrame(fbb);
  }

  std::shared_ptr<Handle::State> NewOp() {
    auto op = std::make_shared<Handle::State>();
    op->gate = gate_;
    return op;
  }

  static Handle Failed(const std::shared_ptr<Handle::State>& op, const Status& s) {
    op->Fail(s);
    return Handle(op);
  }

  // A payload frame over the caller's memory: lent without copying over tcp/ipc; copied for
  // inproc, where the receiving server could otherwise keep pointing at it.
  zmq::message_t Lend(const std::shared_ptr<Handle::State>& op, int server, const void* data, size_t size) {
    if (options_.servers[static_cast<size_t>(server)].starts_with("inproc://")) return zmq::message_t(data, size);
    if (!op->lender) op->lender = std::make_shared<transport::Lender>();
    return transport::Borrow(data, size, op->lender);
  }

  void Submit(const std::shared_ptr<Handle::State>& op, int server, Kind kind, zmq::message_t header, Frames payload,
              OnReply on_reply, std::chrono::milliseconds timeout) {
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

  // Sends one request on the calling thread, and records it in flight (or completes it with the
  // send's failure).
  void SendNow(Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    const size_t server = static_cast<size_t>(r.server);
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
      Request left = std::move(it->second);
      in_flight_.erase(it);
      Done(left, s.WithContext("sending " + std::string(wire::KindName(left.kind)) + " to " + ServerName(left.server)));
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

  // Tells the I/O thread to watch the sockets, unless it does or was told since it last looked.
  void TellIoThread() {
    if (!io_watching_.load() && !io_told_.exchange(true)) waker_.Notify();
  }

  // Completes one request and frees its slot. A caller driving the sockets is told when another
  // thread completed something (its own operation, perhaps: a failed server, an expired request).
  void Done(Request& r, const Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    r.op->Finish(s);
    if (driving_.load() && std::this_thread::get_id() != driver_thread_) driver_waker_.Notify();
    {
      MutexLock lock(&room_mu_);
      --outstanding_;
    }
    room_cv_.Signal();  // after the unlock: the woken submitter need not wait for the lock
  }

 public:
  // Reads the sockets on the calling thread until `op` is answered, `deadline` passes or the
  // client closes (see DriveUntilAnswered, which lets one caller in at a time).
  void Drive(Handle::State& op, SteadyClock::time_point deadline) {
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
      if (::poll(fds.data(), fds.size(), timeout_ms) > 0 && (fds[0].revents & POLLIN)) driver_waker_.Drain();
    }
    MutexLock lock(&io_mu_);
    driving_.store(false);
    // Replies for other operations are the I/O thread's again: it watches the sockets. (If it
    // saw this caller driving, it stored io_watching_ false before it looked: seen here.)
    if (!in_flight_.empty() || more_) TellIoThread();
  }

 private:
  std::string ServerName(int s) const {
    return "server " + std::to_string(s) + " (" + options_.servers[static_cast<size_t>(s)] + ")";
  }

  // (Re)opens the socket to server `s` and its monitor (a PAIR that receives the socket's
  // ZMQ_EVENT_DISCONNECTED: the connection closed, or heartbeats went unanswered).
  Status OpenSocket(int s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    FERRY_ASSIGN_OR_RETURN(zmq::socket_t sock,
                           transport::MakeSocket(transport::Zmq(*context_), zmq::socket_type::dealer, 100000));
    try {
      if (const auto t = options_.heartbeat_timeout.count(); t > 0) {
        sock.set(zmq::sockopt::heartbeat_ivl, static_cast<int>(std::max<int64_t>(t / 4, 1)));
        sock.set(zmq::sockopt::heartbeat_timeout, static_cast<int>(t));
        sock.set(zmq::sockopt::heartbeat_ttl, static_cast<int>(std::min<int64_t>(t, 6553500)));
      }
      if (options_.curve) {
        const std::string server = curve::Decode(options_.curve->server_public);
        const std::string pub = curve::Decode(options_.curve->client.public_key);
        const std::string sec = curve::Decode(options_.curve->client.secret_key);
        if (zmq_setsockopt(sock.handle(), ZMQ_CURVE_SERVERKEY, server.data(), server.size()) != 0 ||
            zmq_setsockopt(sock.handle(), ZMQ_CURVE_PUBLICKEY, pub.data(), pub.size()) != 0 ||
            zmq_setsockopt(sock.handle(), ZMQ_CURVE_SECRETKEY, sec.data(), sec.size()) != 0) {
          throw zmq::error_t();
        }
      }
    } catch (const zmq::error_t& e) {
      return InternalError("cannot set up the connection to " + ServerName(s) + ": " + e.what());
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

  // ---- the I/O thread ----------------------------------------------------------------------

  // How often this client sends something to each server, at least (protocol 1.3 heartbeats:
  // the servers notice a worker that fell silent); 0: never. A quarter of the heartbeat timeout,
  // as for ZeroMQ's own pings to the servers.
  std::chrono::milliseconds HeartbeatEvery() const {
    return options_.heartbeat_timeout.count() > 0
               ? std::max(options_.heartbeat_timeout / 4, std::chrono::milliseconds(1))
               : std::chrono::milliseconds(0);
  }

  // Sends a Heartbeat (never answered) to every server this client sent nothing to for a
  // heartbeat interval; a busy client sends none.
  void SendHeartbeats() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    if (!heartbeats_on_.load(std::memory_order_relaxed)) return;
    const auto now = SteadyClock::now();
    if (now < next_heartbeat_) return;
    const auto every = HeartbeatEvery();
    next_heartbeat_ = now + every;
    if (last_sent_.size() != sockets_.size()) last_sent_.assign(sockets_.size(), SteadyClock::time_point{});
    for (size_t s = 0; s < sockets_.size(); ++s) {
      if (now - last_sent_[s] < every) continue;
      flatbuffers::FlatBufferBuilder fbb(64);
      wire::HeaderBuilder h(fbb);
      h.add_major(wire::kMajor);
      h.add_minor(wire::kMinor);
      h.add_kind(Kind::Heartbeat);
      h.add_rank(options_.rank);
      wire::FinishHeaderBuffer(fbb, h.Finish());
      Frames frames;
      frames.push_back(wire::ToFrame(fbb));
      // A full queue already carries traffic to that server: nothing is lost by dropping this.
      if (transport::Send(sockets_[s], frames, /*dontwait=*/true).ok()) last_sent_[s] = now;
      Pump(s);  // as after any send (SendNow)
    }
  }

  // The I/O thread: watches the sockets while no caller drives them, and keeps the time.
  void Loop() {
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

  // What is due without a message: expired requests, the monitors' news, heartbeats.
  void Tick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    ExpireRequests();
    CheckMonitors();
    SendHeartbeats();
    NoteLongWaits();
  }

  // Tells options_.on_long_wait, at most every long_wait_every, of the requests that have waited
  // that long: one line per server and kind, for the one waiting longest. A server of protocol
  // 1.8 or later is asked (Waiting) once such a request has waited half that long, and again
  // each half period while it waits: the line then says what it holds this worker's requests for
  // ("PullDense: table 'w' is at step 4 and waits for the gradients of worker(s) 1"), which
  // names who is missing; otherwise (no answer yet, an older server) what such a kind waits for.
  void NoteLongWaits() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
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
      options_.on_long_wait("waiting " + seconds(now - r->sent) + " s (of " + seconds(r->deadline - r->sent) +
                            ") for " + ServerName(r->server) + " to answer " + std::string(wire::KindName(r->kind)) +
                            (told ? "; it holds " + answer->text : WhyItWaits(r->kind)));
    }
  }

  // Sends Waiting to each server of protocol 1.8 or later that holds a request which has waited
  // `after` for a step or for the other workers, unless one is in flight to it or went within
  // `after`. The reply lands in asked_[server] (Latest()). Like a heartbeat it is the client's own
  // request (no caller waits for it); it takes a slot beyond max_in_flight.
  // It looks at most every `after` / 4: Tick runs on every wake-up, a reply's too.
  void AskWhyTheyWait(SteadyClock::time_point now, SteadyClock::duration after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
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

  // What a server waits for before it answers a request of this kind.
  static std::string WhyItWaits(Kind kind) {
    const wire::KindInfo* info = wire::FindKind(kind);
    switch (info != nullptr ? info->wait : wire::Wait::kNothing) {
      case wire::Wait::kServer:
        return " (is it running, and is this its address?)";
      case wire::Wait::kStep:
        return " (a sync pull waits for every worker's push of the step before, an ssp pull for the slowest "
               "worker's clock)";
      case wire::Wait::kAllWorkers:
        return " (it waits for every worker to arrive)";
      case wire::Wait::kNothing:
        break;
    }
    return "";
  }

  // The earliest time Tick has something to do. While requests are in flight, at least every
  // kMonitorEvery (to look at the monitors).
  std::optional<SteadyClock::time_point> NextDeadline() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    auto next = deadlines_.Next();
    if (!in_flight_.empty()) next = transport::Earliest(next, last_monitor_check_ + kMonitorEvery);
    if (heartbeats_on_.load(std::memory_order_relaxed)) next = transport::Earliest(next, next_heartbeat_);
    return next;
  }

  // poll(2)'s timeout until `next` (none: -1, wait for an event); 0 while a socket has more to read.
  int PollTimeout(std::optional<SteadyClock::time_point> next, SteadyClock::time_point now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    if (more_) return 0;
    if (!next) return -1;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*next - now).count();
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
  }

  // Each socket's ZMQ_FD: readable when the socket's state may have changed (a reply arrived).
  // Edge-like: it fires again only after the socket was read until it had nothing (Pump).
  void AddSocketFds(std::vector<pollfd>* fds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    for (auto& sock : sockets_) fds->push_back({sock.get(zmq::sockopt::fd), POLLIN, 0});
  }

  // Reads the sockets whose ZMQ_FD fired in the last poll (`fds` as AddSocketFds built it,
  // after one other descriptor; empty: none fired), or every socket while one has more waiting.
  void PumpFired(const std::vector<pollfd>& fds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    const bool all = more_;
    more_ = false;
    for (size_t s = 0; s < sockets_.size(); ++s) {
      if (all || (s + 1 < fds.size() && (fds[s + 1].revents & POLLIN))) Pump(s);
    }
  }

  // Reads and handles the replies waiting on server `s`'s socket until it has none: a receive
  // that finds nothing has processed the socket's pending commands, which re-arms its ZMQ_FD
  // (edge-like: it fires only on a change). At most kBatch, so that a flood cannot starve the
  // deadlines; more_ then says to come back at once.
  void Pump(size_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    for (int i = 0; i < transport::EventLoop::kBatch; ++i) {
      bool got = false, truncated = false;
      if (s >= sockets_.size() ||
          !transport::RecvNonBlocking(sockets_[s], &pump_frames_, &got, wire::kMaxFrames + 1, &truncated).ok() ||
          !got) {
        return;
      }
      HandleReply(static_cast<int>(s), pump_frames_, truncated);
    }
    more_ = true;
  }

  void HandleReply(int server, Frames& frames, bool truncated) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
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
    if (!verified.ok()) return Done(r, verified.WithContext(where + ": the server's reply"));
    if (truncated) return Done(r, DataLossError(where + ": reply has too many frames"));
    if (h->kind() == Kind::Error) return Done(r, wire::ErrorStatus(*h).WithContext(where));
    if (h->kind() != Kind::Reply || h->request_kind() != r.kind) {
      return Done(r, DataLossError(where + ": unexpected reply kind " + std::string(wire::KindName(h->kind()))));
    }
    Frames payload;
    for (size_t i = 1; i < frames.size(); ++i) payload.push_back(std::move(frames[i]));
    r.op->Record(*h);
    Status s = r.on_reply ? r.on_reply(*h, payload) : ExpectFrames(payload, 0);
    Done(r, s.ok() ? s : s.WithContext(where));
  }

  void ExpireRequests() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    const auto now = SteadyClock::now();
    std::vector<int> dead;
    for (uint64_t id : deadlines_.TakeDue(now)) dead.push_back(in_flight_.at(id).server);
    std::sort(dead.begin(), dead.end());
    dead.erase(std::unique(dead.begin(), dead.end()), dead.end());
    for (int s : dead) {
      FailServer(s, [&](const Request& r) {
        return r.deadline <= now ? DeadlineExceededError(std::string(wire::KindName(r.kind)) + " got no reply from " +
                                                         ServerName(s) + " in time (is it running and reachable?)")
                                 : UnavailableError(std::string(wire::KindName(r.kind)) + " abandoned: " +
                                                    ServerName(s) + " stopped answering");
      });
    }
  }

  // Reads what the monitors reported, at most every kMonitorEvery (they are not in the poll set:
  // polling them on every wake-up cost about 9% of a 4 KiB round trip with 2 servers).
  void CheckMonitors() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    const auto now = SteadyClock::now();
    if (now - last_monitor_check_ < kMonitorEvery) return;
    last_monitor_check_ = now;
    for (int s = 0; s < num_servers(); ++s) ReadMonitor(s);
  }

  // Handles what server `s`'s monitor has reported (at most 16 events).
  void ReadMonitor(int s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    Frames frames;
    for (int i = 0; i < 16; ++i) {
      bool got = false, truncated = false;
      if (!transport::RecvNonBlocking(monitors_[static_cast<size_t>(s)], &frames, &got, 4, &truncated).ok() || !got) {
        return;
      }
      if (OnMonitorEvent(s, frames)) return;  // the socket and its monitor were rebuilt
    }
  }

  // The monitor of server `s`'s socket reported an event: [u16 event, u32 value][endpoint].
  // True when it failed the server (and rebuilt its socket and monitor).
  bool OnMonitorEvent(int s, Frames& frames) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
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
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) handshaken_[static_cast<size_t>(s)] = true;
    if (event != ZMQ_EVENT_DISCONNECTED) return false;
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
    const std::string why = options_.heartbeat_timeout.count() > 0
                                ? " closed the connection or left heartbeats unanswered for " +
                                      std::to_string(options_.heartbeat_timeout.count()) + " ms"
                                : " closed the connection";
    FailServer(s, [&](const Request& r) {
      return UnavailableError(std::string(wire::KindName(r.kind)) + " abandoned: " + ServerName(s) + why +
                              " (killed, hung, or unreachable?)");
    });
    return true;
  }

  // Fails everything in flight to server `s` (each with why(request)): its replies can no longer
  // be trusted to come, and rebuilding the socket discards (and releases) whatever is still
  // queued for it. The other servers' parts of the same operations are abandoned too, so the
  // operation ends now with that failure rather than when they answer (a late reply is dropped).
  template <typename Why>
  void FailServer(int s, Why&& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
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
    Status st = OpenSocket(s);
    if (!st.ok()) std::fprintf(stderr, "ferry client: %s\n", st.ToString().c_str());
  }

  // The I/O thread is ending: fails everything in flight or queued, and (dead_) everything
  // submitted from now on.
  void FailAll(const Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    for (auto& [id, r] : in_flight_) Done(r, s);
    in_flight_.clear();
    deadlines_ = {};
    dead_ = true;
    dead_status_ = s;
    monitors_.clear();
    sockets_.clear();  // closes (linger 0) and releases lent frames
  }

  const ClientOptions options_;
  std::shared_ptr<Context> context_;
  transport::Waker waker_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> barrier_generation_{0};  // the next collective's id (server 0 says the first)
  std::atomic<int64_t> restored_step_{0};       // server 0's restored checkpoint step
  std::vector<std::atomic<int>> server_minor_;  // each server's protocol minor, from its Hello reply
  std::atomic<int64_t> values_saturated_{0};
  std::atomic<int64_t> first_collective_{0};    // server 0's next collective id at the handshake
  std::atomic<uint64_t> next_request_id_{1};
  std::atomic<int64_t> requests_{0}, bytes_sent_{0}, bytes_received_{0};

  mutable Mutex tables_mu_;
  std::unordered_map<std::string, TableSpec> tables_ ABSL_GUARDED_BY(tables_mu_);
  // Error feedback of a top-k table (1.6): what its pushes have not sent yet, one float per
  // element; a push adds its gradient, sends the top-k of each chunk and keeps the rest.
  struct Residual {
    Mutex mu;
    std::vector<float> acc ABSL_GUARDED_BY(mu);
    std::vector<uint32_t> scratch ABSL_GUARDED_BY(mu);  // SelectTopK's
  };
  std::unordered_map<std::string, std::shared_ptr<Residual>> residuals_ ABSL_GUARDED_BY(tables_mu_);

  Mutex room_mu_;
  CondVar room_cv_;                          // signalled when a slot frees up, or on stopping
  int outstanding_ ABSL_GUARDED_BY(room_mu_) = 0;  // requests submitted and not yet done

  // The sockets and everything in flight, whichever thread uses them (see the top of the file).
  // Lock order: io_mu_ before room_mu_ and a Handle::State's mu (a request completes under it).
  Mutex io_mu_ ABSL_ACQUIRED_BEFORE(room_mu_);
  bool dead_ ABSL_GUARDED_BY(io_mu_) = false;          // the I/O thread has ended
  Status dead_status_ ABSL_GUARDED_BY(io_mu_);         // why
  std::vector<zmq::socket_t> sockets_ ABSL_GUARDED_BY(io_mu_);   // one per server
  std::vector<zmq::socket_t> monitors_ ABSL_GUARDED_BY(io_mu_);  // one per server: its socket's disconnections
  std::vector<bool> handshaken_ ABSL_GUARDED_BY(io_mu_);  // per server: its current socket completed a handshake
  static constexpr std::chrono::milliseconds kMonitorEvery{100};
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
  SteadyClock::time_point next_heartbeat_ ABSL_GUARDED_BY(io_mu_){};
  std::unordered_map<uint64_t, Request> in_flight_ ABSL_GUARDED_BY(io_mu_);
  transport::Deadlines<uint64_t> deadlines_ ABSL_GUARDED_BY(io_mu_);  // (deadline, id) of every request in in_flight_
  Frames pump_frames_ ABSL_GUARDED_BY(io_mu_);  // Pump's, reused
  bool more_ ABSL_GUARDED_BY(io_mu_) = false;   // a socket stopped at kBatch with replies left
  // Who reads the replies: a caller driving the sockets (Drive), or else the I/O thread.
  // driving_ is written under io_mu_ and read by the I/O thread without it (it keeps out of the
  // driving caller's way); io_watching_ is the I/O thread's, both orders seq_cst (see Drive).
  std::atomic<bool> driving_{false};
  std::thread::id driver_thread_ ABSL_GUARDED_BY(io_mu_);
  std::atomic<bool> io_watching_{false};  // the I/O thread polls the sockets now
  std::atomic<bool> io_told_{false};      // its waker was notified since it last looked
  transport::Waker driver_waker_;                       // wakes the driving caller
  const std::shared_ptr<IoGate> gate_;

  std::thread thread_;
};

void DriveUntilAnswered(Handle::State& op, SteadyClock::time_point deadline) {
  IoGate& gate = *op.gate;
  ClientImpl* client = nullptr;
  {
    MutexLock lock(&gate.mu);
    if (gate.client == nullptr || gate.driving) return;
    gate.driving = true;
    client = gate.client;
  }
  client->Drive(op, deadline);
  MutexLock lock(&gate.mu);
  gate.driving = false;
  gate.idle.SignalAll();
}

}  // namespace

StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.servers.empty()) return InvalidArgumentError("ClientOptions.servers is empty: name at least one server");
  if (options.num_workers < 1 || options.rank < 0 || options.rank >= options.num_workers) {
    return InvalidArgumentError("worker rank " + std::to_string(options.rank) + " is outside [0, " +
                                std::to_string(options.num_workers) + ")");
  }
  if (options.max_message_bytes < 4096) return InvalidArgumentError("max_message_bytes must be at least 4096");
  if (options.sparse_message_bytes < 0) return InvalidArgumentError("sparse_message_bytes must not be negative");
  if (options.max_in_flight < 1) return InvalidArgumentError("max_in_flight must be at least 1");
  transport::TuneAllocatorForLargeMessages();  // once per process; FERRY_MALLOC_TUNING=off opts out
  for (const auto& e : options.servers) {
    if (e.starts_with("inproc://") && !options.context) {
      return InvalidArgumentError("server " + e + " is inproc://: pass the servers' Context in ClientOptions.context");
    }
    if (e.starts_with("inproc://") && options.curve) {
      return InvalidArgumentError("server " + e + " is inproc://: CURVE needs tcp:// or ipc://");
    }
  }
  if (options.curve) {
    if (!curve::Available()) return UnimplementedError("CURVE: this libzmq was built without it");
    const std::string who = "CURVE keys of worker " + std::to_string(options.rank);
    FERRY_RETURN_IF_ERROR(curve::CheckPublicKey(options.curve->server_public, who + ": the servers' public key"));
    FERRY_RETURN_IF_ERROR(curve::CheckKeypair(options.curve->client, who));
  }
  auto context = options.context ? options.context : Context::Create(1);
  auto client = std::make_unique<ClientImpl>(std::move(options), std::move(context));
  FERRY_RETURN_IF_ERROR(client->Start());
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace ferry
