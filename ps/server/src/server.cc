// The parameter server: one I/O thread owns the ROUTER socket and every table; large updates
// and pulls are shared with a small compute pool (ParallelFor). Requests that must wait (a sync
// pull for a version not yet applied, an ssp pull ahead of the bound, a barrier) are held in a
// bounded list with a deadline and answered when their condition holds or the deadline passes.
#include "ferry/server.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <list>
#include <thread>
#include <unordered_map>

#include <absl/container/flat_hash_set.h>

#include "ferry/mutex.h"
#include "ferry/messages/event_loop.h"
#include "ferry/messages/placement.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "internal/optimizer.h"
#include "internal/tables.h"
#include "internal/thread_pool.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;
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
  kNumCounters
};
constexpr std::array<const char*, kNumCounters> kCounterNames = {
    "messages", "bad_messages", "errors_sent", "late_gradients_dropped", "updates_applied",
    "pulls_held", "held_expired", "bytes_in", "bytes_out"};
constexpr size_t kStalenessBuckets = 65;

// A received request: routing id, verified header frame, payloads. The header is read through
// h() on every use: ZeroMQ keeps small frames inline, so moving a Request moves the bytes and a
// stored pointer would dangle.
struct Request {
  zmq::message_t routing;
  zmq::message_t header_frame;
  bool verified = false;  // header_frame passed wire::VerifyHeader
  const Header* h() const { return verified && header_frame.size() > 0 ? wire::GetHeader(header_frame.data()) : nullptr; }
  Frames payload;
  Clock::time_point arrived;   // when the server read it (a held pull reports how long it waited)
  Clock::time_point deadline;
  int64_t pull_step = 0;  // the step/clock the (held) pull is for
  wire::ReplyInfo info;   // PushPullDense: what its push did, reported with the pull's reply
};

// A read-only view of a frame as T[], copying only when the frame is not aligned for T.
template <typename T>
std::span<const T> View(const zmq::message_t& frame, std::vector<T>& scratch) {
  const size_t n = frame.size() / sizeof(T);
  if (reinterpret_cast<uintptr_t>(frame.data()) % alignof(T) == 0) {
    return {static_cast<const T*>(frame.data()), n};
  }
  scratch.resize(n);
  std::memcpy(scratch.data(), frame.data(), n * sizeof(T));
  return {scratch.data(), n};
}

class ServerImpl final : public Server {
 public:
  ServerImpl(ServerOptions options, std::shared_ptr<Context> context, zmq::socket_t socket, std::string endpoint)
      : options_(std::move(options)),
        context_(std::move(context)),
        socket_(std::move(socket)),
        endpoint_(std::move(endpoint)),
        pool_(options_.compute_threads) {
    for (auto& c : counters_) c.store(0);
    for (auto& b : staleness_) b.store(0);
    thread_ = std::thread([this] { Loop(); });
  }

  ~ServerImpl() override { Stop(); }

  std::string endpoint() const override { return endpoint_; }

  ServerStats stats() const override {
    ServerStats s;
    for (int i = 0; i < kNumCounters; ++i) s.counters[kCounterNames[i]] = counters_[i].load();
    for (auto& b : staleness_) s.staleness_histogram.push_back(b.load());
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
    MutexLock lock(&stop_mu_);
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

 private:
  void Count(Counter c, int64_t n = 1) { counters_[c].fetch_add(n, std::memory_order_relaxed); }

  // ---- the loop ----------------------------------------------------------------------------

  void Loop() {
    transport::EventLoop::Handlers h;
    // Out of memory while serving (HandleMessage answers its own errors): the request in hand is
    // lost, the server goes on; its client times out with a clear error.
    h.on_message = [this](size_t, Frames& frames, bool truncated) {
      try {
        HandleMessage(frames, truncated);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ferry-ps %d: %s while serving; continuing\n", options_.rank, e.what());
      }
    };
    h.next_deadline = [this] { return NextDeadline(); };
    h.on_tick = [this] {
      try {
        ExpireHeld();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ferry-ps %d: %s while expiring held requests; continuing\n", options_.rank, e.what());
      }
    };
    const Status s = transport::EventLoop::Run({&socket_, 1}, waker_, stopping_, wire::kMaxFrames + 1, h);
    if (!s.ok()) std::fprintf(stderr, "ferry-ps %d: %s; stopping\n", options_.rank, s.message().c_str());
  }

  void HandleMessage(Frames& frames, bool truncated) {
    Count(kMessages);
    int64_t bytes = 0;
    for (auto& f : frames) bytes += static_cast<int64_t>(f.size());
    Count(kBytesIn, bytes);
    if (frames.empty()) return;
    Request req;
    req.arrived = Clock::now();
    req.routing = std::move(frames[0]);
    auto bad = [&](const Status& s) {
      Count(kBadMessages);
      SendError(req, s);
    };
    if (frames.size() < 2) return bad(InvalidArgumentError("message has no header frame"));
    // The header first, so that even a refusal for size can name the request it answers.
    req.header_frame = std::move(frames[1]);
    const Header* header = nullptr;
    Status s = wire::VerifyHeader(req.header_frame, &header);
    if (!s.ok()) return bad(s);
    req.verified = true;
    if (truncated) {
      return bad(InvalidArgumentError("message has more than " + std::to_string(wire::kMaxFrames) + " frames"));
    }
    if (bytes > options_.max_message_bytes) {
      return bad(ResourceExhaustedError("message of " + std::to_string(bytes) + " bytes exceeds this server's limit of " +
                                        std::to_string(options_.max_message_bytes) + " bytes"));
    }
    for (size_t i = 2; i < frames.size(); ++i) req.payload.push_back(std::move(frames[i]));
    s = wire::CheckPayloadShape(*header, req.payload);
    if (!s.ok()) return bad(s.WithContext(std::string(wire::KindName(req.h()->kind()))));
    try {
      s = Dispatch(req);
    } catch (const std::bad_alloc&) {
      s = ResourceExhaustedError("server " + std::to_string(options_.rank) + " ran out of memory serving this request");
    } catch (const zmq::error_t& e) {
      s = ResourceExhaustedError(std::string("server ") + std::to_string(options_.rank) + ": " + e.what());
    }
    if (!s.ok() && req.h()) SendError(req, s.WithContext(std::string(wire::KindName(req.h()->kind()))));
  }

  Status Dispatch(Request& req) {
    const Header& h = *req.h();
    switch (h.kind()) {
      case Kind::Hello: return OnHello(req);
      case Kind::Stats: return OnStats(req);
      default: break;
    }
    if (num_workers_ == 0) return FailedPreconditionError("no Hello yet: the client must handshake first");
    if (h.rank() < 0 || h.rank() >= num_workers_) {
      return InvalidArgumentError("rank " + std::to_string(h.rank()) + " is outside [0, " +
                                  std::to_string(num_workers_) + ")");
    }
    if (h.step() < 0 || h.step() > kMaxStep) {
      return InvalidArgumentError("step " + std::to_string(h.step()) + " is outside [0, 2^62]");
    }
    switch (h.kind()) {
      case Kind::CreateTable: return OnCreateTable(req);
      case Kind::PushDense: return OnPushDense(req, /*then_pull=*/false);
      case Kind::PushPullDense: return OnPushDense(req, /*then_pull=*/true);
      case Kind::PullDense: return OnPullDense(req);
      case Kind::PullSparse: return OnPullSparse(req);
      case Kind::PushSparse: return OnPushSparse(req);
      case Kind::Clock: return OnClock(req);
      case Kind::Finish: return OnFinish(req);
      case Kind::Barrier:
      case Kind::AllReduce: return OnBarrier(req);
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
    int64_t bytes = 0;
    for (auto& f : out) bytes += static_cast<int64_t>(f.size());
    Count(kBytesOut, bytes);
    // A peer that went away simply does not get its reply (ROUTER drops it).
    transport::Send(socket_, out).IgnoreError();
  }

  void SendError(Request& req, const Status& s) {
    Count(kErrorsSent);
    const uint64_t id = req.h() ? req.h()->request_id() : 0;
    const Kind kind = req.h() ? req.h()->kind() : Kind::Invalid;
    Send(req, wire::MakeError(id, kind, s));
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
    if (h.num_workers() <= 0 || h.num_workers() > 65536) {
      return InvalidArgumentError("num_workers " + std::to_string(h.num_workers()) + " is outside [1, 65536]");
    }
    if (h.rank() < 0 || h.rank() >= h.num_workers()) {
      return InvalidArgumentError("worker rank " + std::to_string(h.rank()) + " is outside [0, " +
                                  std::to_string(h.num_workers()) + ")");
    }
    if (num_workers_ != 0 && num_workers_ != h.num_workers()) {
      return FailedPreconditionError("worker " + std::to_string(h.rank()) + " says the job has " +
                                     std::to_string(h.num_workers()) + " workers, but earlier workers said " +
                                     std::to_string(num_workers_));
    }
    if (num_workers_ == 0) {
      num_workers_ = h.num_workers();
      clocks_.assign(static_cast<size_t>(num_workers_), 0);
      finished_.assign(static_cast<size_t>(num_workers_), false);
      MutexLock lock(&by_rank_mu_);
      used_by_rank_.assign(static_cast<size_t>(num_workers_), 0);
      dropped_by_rank_.assign(static_cast<size_t>(num_workers_), 0);
    }
    // A worker that connects (again) takes part in the sync quorum (again).
    SetFinished(h.rank(), false);
    SendOk(req);
    return Status::Ok();
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
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(Kind::Reply);
    b.add_request_kind(Kind::Stats);
    b.add_request_id(req.h()->request_id());
    b.add_counters(vec);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    Send(req, wire::ToFrame(fbb));
    return Status::Ok();
  }

  Status OnCreateTable(Request& req) {
    TableSpec spec;
    FERRY_RETURN_IF_ERROR(wire::SpecFromWire(req.h()->spec(), &spec));
    const uint64_t id = TableId(spec.name);
    if (req.h()->table_id() != id) {
      return InvalidArgumentError("table_id " + std::to_string(req.h()->table_id()) + " is not the hash of the name '" +
                                  spec.name + "' (" + std::to_string(id) + ")");
    }
    if (auto it = tables_.find(id); it != tables_.end()) {
      const TableSpec& have = it->second->spec;
      if (have.name != spec.name) {
        return AlreadyExistsError("table names '" + have.name + "' and '" + spec.name +
                                  "' hash to the same id; rename one");
      }
      if (!(have == spec)) {
        return AlreadyExistsError("table '" + spec.name + "' is already declared as " + have.ToString() +
                                  "; the new declaration " + spec.ToString() + " conflicts with it");
      }
      SendOk(req);  // idempotent
      return Status::Ok();
    }
    if (spec.consistency == Consistency::kSync && spec.replicas_to_aggregate > num_workers_) {
      return InvalidArgumentError("table '" + spec.name + "': replicas_to_aggregate " +
                                  std::to_string(spec.replicas_to_aggregate) + " exceeds the job's " +
                                  std::to_string(num_workers_) + " workers");
    }
    auto table = std::make_unique<ps::Table>();
    table->spec = std::move(spec);
    table->id = id;
    try {
      if (table->spec.type == TableType::kDense) {
        table->dense = std::make_unique<ps::DenseShard>(table->spec, id, options_.rank, options_.num_servers, num_workers_);
      } else {
        table->sparse = std::make_unique<ps::SparseShard>(table->spec, id, num_workers_);
      }
    } catch (const std::bad_alloc&) {
      return ResourceExhaustedError("out of memory creating table '" + table->spec.name + "'");
    }
    tables_.emplace(id, std::move(table));
    SendOk(req);
    return Status::Ok();
  }

  StatusOr<ps::Table*> FindTable(uint64_t id, TableType type) {
    auto it = tables_.find(id);
    if (it == tables_.end()) return NotFoundError("unknown table id " + std::to_string(id) + " (declare it first)");
    if (it->second->spec.type != type) {
      return InvalidArgumentError("table '" + it->second->spec.name + "' is " +
                                  (type == TableType::kDense ? "sparse, not dense" : "dense, not sparse"));
    }
    return it->second.get();
  }

  // A sync step closes once it holds the gradients of min(replicas_to_aggregate, workers that
  // take part) workers, where a worker takes part unless it has finished (a finished worker's
  // gradient already held for the step still counts). See PROTOCOL.md, "Sync steps".
  bool StepComplete(const TableSpec& spec, const ps::SyncSlots& sync) const {
    if (sync.received == 0) return false;
    int taking_part = num_workers_;  // the common case, no worker finished: no scan per push
    if (num_finished_ > 0) {
      taking_part = 0;
      for (size_t r = 0; r < finished_.size(); ++r) taking_part += (!finished_[r] || sync.by_rank[r]) ? 1 : 0;
    }
    const int wanted = spec.replicas_to_aggregate > 0 ? spec.replicas_to_aggregate : num_workers_;
    return sync.received >= std::min(wanted, taking_part);
  }

  void SetFinished(int rank, bool finished) {
    auto&& f = finished_[static_cast<size_t>(rank)];
    if (f != finished) num_finished_ += finished ? 1 : -1;
    f = finished;
  }

  // The ranks still expected for a sync step: they take part and have not pushed it.
  std::string MissingRanks(const ps::SyncSlots& sync) const {
    std::string out;
    for (size_t r = 0; r < finished_.size(); ++r) {
      if (!finished_[r] && !sync.by_rank[r]) out += (out.empty() ? "" : ", ") + std::to_string(r);
    }
    return out.empty() ? "none" : out;
  }

  // The slowest clock among the workers still training (ssp); finished workers hold no one back.
  int64_t MinClock() const {
    int64_t m = INT64_MAX;
    for (size_t r = 0; r < clocks_.size(); ++r) {
      if (!finished_[r]) m = std::min(m, clocks_[r]);
    }
    return m == INT64_MAX ? kMaxStep : m;
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

  void RecordStaleness(int64_t staleness) {
    const size_t bucket = static_cast<size_t>(std::clamp<int64_t>(staleness, 0, kStalenessBuckets - 1));
    staleness_[bucket].fetch_add(1, std::memory_order_relaxed);
  }

  // ---- dense -------------------------------------------------------------------------------

  struct SliceRef {
    ps::Table* table;
    ps::DenseChunk* chunk;
  };

  // Resolves and checks every slice before anything is changed.
  Status ResolveSlices(const Header& h, std::vector<SliceRef>* out) {
    out->clear();
    absl::flat_hash_set<std::pair<uint64_t, int64_t>> seen;
    int64_t reply_bytes = 0;
    for (flatbuffers::uoffset_t i = 0; i < h.slices()->size(); ++i) {
      const auto* sl = h.slices()->Get(i);
      if (!seen.emplace(sl->table_id(), sl->chunk()).second) {
        return InvalidArgumentError("slice " + std::to_string(i) + " repeats chunk " + std::to_string(sl->chunk()) +
                                    " of table id " + std::to_string(sl->table_id()) +
                                    " (name each table once per request)");
      }
      FERRY_ASSIGN_OR_RETURN(ps::Table * t, FindTable(sl->table_id(), TableType::kDense));
      ps::DenseChunk* c = t->dense->chunk(sl->chunk());
      if (c == nullptr) {
        if (sl->chunk() < 0 || sl->chunk() >= t->dense->num_chunks()) {
          return OutOfRangeError("table '" + t->spec.name + "' has no chunk " + std::to_string(sl->chunk()));
        }
        return FailedPreconditionError(
            "table '" + t->spec.name + "' chunk " + std::to_string(sl->chunk()) + " belongs to server " +
            std::to_string(placement::ChunkServer(t->id, sl->chunk(), options_.num_servers)) + ", not " +
            std::to_string(options_.rank) + ": client and server disagree on the cluster");
      }
      if (sl->count() != c->size) {
        return InvalidArgumentError("table '" + t->spec.name + "' chunk " + std::to_string(sl->chunk()) + " has " +
                                    std::to_string(c->size) + " elements, the slice says " +
                                    std::to_string(sl->count()));
      }
      reply_bytes += c->size * static_cast<int64_t>(sizeof(float));
      if (reply_bytes > options_.max_message_bytes) {
        return ResourceExhaustedError("the chunks requested add up to more than this server's message limit of " +
                                      std::to_string(options_.max_message_bytes) + " bytes");
      }
      out->push_back({t, c});
    }
    return Status::Ok();
  }

  Status OnPushDense(Request& req, bool then_pull) {
    const Header& h = *req.h();
    const int rank = h.rank();
    std::vector<SliceRef> refs;
    FERRY_RETURN_IF_ERROR(ResolveSlices(h, &refs));
    // Check sync preconditions for every slice before touching any of them.
    for (const auto& r : refs) {
      if (r.table->spec.consistency != Consistency::kSync) continue;
      if (h.step() > r.chunk->version) {
        return FailedPreconditionError("table '" + r.table->spec.name + "': push for step " + std::to_string(h.step()) +
                                       " but the table is at step " + std::to_string(r.chunk->version));
      }
      if (h.step() == r.chunk->version && r.chunk->sync.by_rank[static_cast<size_t>(rank)]) {
        return FailedPreconditionError("table '" + r.table->spec.name + "': rank " + std::to_string(rank) +
                                       " pushed step " + std::to_string(h.step()) + " twice");
      }
    }
    bool applied = false;
    wire::ReplyInfo info;
    for (size_t i = 0; i < refs.size(); ++i) {
      auto& [t, c] = refs[i];
      if (t->spec.consistency == Consistency::kSync) {
        if (h.step() < c->version) {
          Count(kLateGradientsDropped);
          ++info.dropped;
          continue;
        }
        ++info.used;
        c->sync.by_rank[static_cast<size_t>(rank)] = std::move(req.payload[i]);
        ++c->sync.received;
        if (StepComplete(t->spec, c->sync)) {
          ApplySyncDense(*t, *c);
          applied = true;
        }
      } else {
        ++info.used;
        RecordStaleness(c->version - c->last_pulled[static_cast<size_t>(rank)]);
        std::vector<float> scratch;
        auto g = View<float>(req.payload[i], scratch);
        ApplyDenseRange(t->spec.optimizer, *c, g.data(), c->version + 1);
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
      if (rank < static_cast<int>(clocks_.size())) {
        clocks_[static_cast<size_t>(rank)] = std::max(clocks_[static_cast<size_t>(rank)], h.step() + 1);
      }
      req.pull_step = h.step() + 1;
      req.info = info;
      req.payload.clear();
      HoldOrServe(std::move(req));
    }
    if (applied || then_pull) ServeHeld();
    return Status::Ok();
  }

  void ApplyDenseRange(const OptimizerSpec& opt, ps::DenseChunk& c, const float* grad, int64_t step) {
    pool_.ParallelFor(c.size, kGrain, [&](int64_t b, int64_t e) {
      ps::ApplyUpdate(opt, c.params.data() + b, grad + b, c.state.data() + b, static_cast<size_t>(e - b),
                      static_cast<size_t>(c.size), step);
    });
  }

  // Sums the held gradients in rank order, averages over the quorum, applies once.
  void ApplySyncDense(ps::Table& t, ps::DenseChunk& c) {
    std::vector<const float*> grads;
    std::vector<std::vector<float>> scratch(c.sync.by_rank.size());
    for (size_t r = 0; r < c.sync.by_rank.size(); ++r) {
      if (c.sync.by_rank[r]) grads.push_back(View<float>(*c.sync.by_rank[r], scratch[r]).data());
    }
    const float k = static_cast<float>(grads.size());
    avg_.resize(static_cast<size_t>(c.size));
    pool_.ParallelFor(c.size, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        float s = 0.0f;
        for (const float* g : grads) s += g[i];
        avg_[static_cast<size_t>(i)] = s / k;
      }
      ps::ApplyUpdate(t.spec.optimizer, c.params.data() + b, avg_.data() + b, c.state.data() + b,
                      static_cast<size_t>(e - b), static_cast<size_t>(c.size), c.version + 1);
    });
    ++c.version;
    c.sync.Reset(num_workers_, /*sparse=*/false);
    Count(kUpdatesApplied);
  }

  Status OnPullDense(Request& req) {
    std::vector<SliceRef> refs;
    FERRY_RETURN_IF_ERROR(ResolveSlices(*req.h(), &refs));
    req.pull_step = req.h()->step();
    HoldOrServe(std::move(req));
    return Status::Ok();
  }

  bool Ready(const TableSpec& spec, int64_t version, int64_t step) const {
    switch (spec.consistency) {
      case Consistency::kSync: return version >= step;
      case Consistency::kSsp: return MinClock() >= step - spec.staleness;
      case Consistency::kAsync: return true;
    }
    return true;
  }

  // Serves a pull whose condition holds; false when it must keep waiting. Tables cannot be
  // dropped, so the slices resolved on arrival still resolve.
  bool TryServe(Request& req) {
    const Header& h = *req.h();
    const size_t rank = static_cast<size_t>(h.rank());
    if (h.kind() == Kind::PullSparse) {
      auto t = FindTable(h.table_id(), TableType::kSparse);
      if (!t.ok()) return SendError(req, t.status()), true;
      ps::SparseShard& shard = *(*t)->sparse;
      if (!Ready((*t)->spec, shard.version, req.pull_step)) return false;
      ServeSparse(req, shard);
      shard.last_pulled[rank] = shard.version;
      return true;
    }
    std::vector<SliceRef> refs;
    if (Status s = ResolveSlices(h, &refs); !s.ok()) return SendError(req, s), true;
    for (auto& r : refs) {
      if (!Ready(r.table->spec, r.chunk->version, req.pull_step)) return false;
    }
    req.info.held_us = HeldMicros(req);  // the wait, not the copies below
    Frames payload;
    payload.reserve(refs.size());
    int64_t version = INT64_MAX;
    for (auto& r : refs) {
      // The values are copied (a later push may change them while ZeroMQ still sends); big
      // chunks are copied by the compute pool alongside the I/O thread.
      zmq::message_t frame(static_cast<size_t>(r.chunk->size) * sizeof(float));
      float* dst = static_cast<float*>(frame.data());
      const float* src = r.chunk->params.data();
      pool_.ParallelFor(r.chunk->size, kGrain, [&](int64_t b, int64_t e) {
        std::memcpy(dst + b, src + b, static_cast<size_t>(e - b) * sizeof(float));
      });
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
    if (HeldCount() >= options_.max_held) {
      return SendError(req, ResourceExhaustedError("server holds " + std::to_string(held_.size()) +
                                                   " waiting requests already; refusing more"));
    }
    Count(kPullsHeld);
    req.deadline = Clock::now() + options_.max_wait;
    held_.push_back(std::move(req));
  }

  size_t HeldCount() const { return held_.size() + held_barriers_; }

  void ServeHeld() {
    for (auto it = held_.begin(); it != held_.end();) {
      if (TryServe(*it)) {
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // ---- sparse ------------------------------------------------------------------------------

  Status CheckIds(const ps::Table& t, std::span<const int64_t> ids) const {
    if (options_.num_servers == 1) return Status::Ok();
    for (int64_t id : ids) {
      const int owner = placement::IdServer(id, options_.num_servers);
      if (owner != options_.rank) {
        return FailedPreconditionError("table '" + t.spec.name + "': id " + std::to_string(id) + " belongs to server " +
                                       std::to_string(owner) + ", not " + std::to_string(options_.rank) +
                                       ": client and server disagree on the cluster");
      }
    }
    return Status::Ok();
  }

  Status OnPullSparse(Request& req) {
    const Header& h = *req.h();
    FERRY_ASSIGN_OR_RETURN(ps::Table * t, FindTable(h.table_id(), TableType::kSparse));
    if (h.dim() != t->spec.dim) {
      return InvalidArgumentError("table '" + t->spec.name + "' has dim " + std::to_string(t->spec.dim) +
                                  ", the request says " + std::to_string(h.dim()));
    }
    if (h.num_ids() > options_.max_message_bytes / (t->spec.dim * static_cast<int64_t>(sizeof(float)))) {
      return ResourceExhaustedError("table '" + t->spec.name + "': " + std::to_string(h.num_ids()) + " rows of dim " +
                                    std::to_string(t->spec.dim) + " exceed this server's message limit of " +
                                    std::to_string(options_.max_message_bytes) + " bytes");
    }
    std::vector<int64_t> scratch;
    FERRY_RETURN_IF_ERROR(CheckIds(*t, View<int64_t>(req.payload[0], scratch)));
    req.pull_step = h.step();
    HoldOrServe(std::move(req));
    return Status::Ok();
  }

  void ServeSparse(Request& req, ps::SparseShard& shard) {
    req.info.held_us = HeldMicros(req);  // the wait, not the copy below
    std::vector<int64_t> scratch;
    auto ids = View<int64_t>(req.payload[0], scratch);
    const int64_t dim = shard.dim();
    rows_.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) rows_[i] = shard.FindOrCreate(ids[i]);  // creation is serial
    zmq::message_t out(ids.size() * static_cast<size_t>(dim) * sizeof(float));
    float* dst = static_cast<float*>(out.data());
    pool_.ParallelFor(static_cast<int64_t>(ids.size()), kGrain / dim + 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        std::memcpy(dst + i * dim, shard.row(rows_[static_cast<size_t>(i)]), static_cast<size_t>(dim) * sizeof(float));
      }
    });
    Frames payload;
    payload.push_back(std::move(out));
    req.info.version = shard.version;
    Send(req, wire::MakeReply(req.h()->request_id(), req.h()->kind(), req.info), std::move(payload));
  }

  static int64_t HeldMicros(const Request& req) {
    return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - req.arrived).count();
  }

  void ApplySparseRows(const OptimizerSpec& opt, ps::SparseShard& shard, std::span<const int64_t> ids, const float* grads) {
    const int64_t dim = shard.dim();
    rows_.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) rows_[i] = shard.FindOrCreate(ids[i]);
    // Rows are distinct within one push (the client deduplicates); a repeated id is applied in order.
    for (size_t i = 0; i < ids.size(); ++i) {
      const ps::RowIndex r = rows_[i];
      ps::ApplyUpdate(opt, shard.row(r), grads + static_cast<int64_t>(i) * dim, shard.state(r),
                      static_cast<size_t>(dim), static_cast<size_t>(dim), ++shard.steps(r));
    }
  }

  Status OnPushSparse(Request& req) {
    const Header& h = *req.h();
    const int rank = h.rank();
    FERRY_ASSIGN_OR_RETURN(ps::Table * t, FindTable(h.table_id(), TableType::kSparse));
    ps::SparseShard& shard = *t->sparse;
    if (h.dim() != t->spec.dim) {
      return InvalidArgumentError("table '" + t->spec.name + "' has dim " + std::to_string(t->spec.dim) +
                                  ", the request says " + std::to_string(h.dim()));
    }
    std::vector<int64_t> id_scratch;
    auto ids = View<int64_t>(req.payload[0], id_scratch);
    FERRY_RETURN_IF_ERROR(CheckIds(*t, ids));
    if (t->spec.consistency == Consistency::kSync) {
      if (h.step() > shard.version) {
        return FailedPreconditionError("table '" + t->spec.name + "': push for step " + std::to_string(h.step()) +
                                       " but the table is at step " + std::to_string(shard.version));
      }
      if (h.step() < shard.version) {
        Count(kLateGradientsDropped);
        CountPush(rank, 0, 1);
        Send(req, wire::MakeReply(h.request_id(), h.kind(), {.version = shard.version, .dropped = 1}));
        return Status::Ok();
      }
      auto& slot = shard.sync.by_rank[static_cast<size_t>(rank)];
      if (slot) {
        return FailedPreconditionError("table '" + t->spec.name + "': rank " + std::to_string(rank) +
                                       " pushed step " + std::to_string(h.step()) + " twice");
      }
      shard.sync.ids_by_rank[static_cast<size_t>(rank)] = std::move(req.payload[0]);
      slot = std::move(req.payload[1]);
      ++shard.sync.received;
      if (StepComplete(t->spec, shard.sync)) ApplySyncSparse(*t, shard);
    } else {
      RecordStaleness(shard.version - shard.last_pulled[static_cast<size_t>(rank)]);
      std::vector<float> g_scratch;
      ApplySparseRows(t->spec.optimizer, shard, ids, View<float>(req.payload[1], g_scratch).data());
      ++shard.version;
      Count(kUpdatesApplied);
    }
    CountPush(rank, 1, 0);
    Send(req, wire::MakeReply(h.request_id(), h.kind(), {.version = shard.version, .used = 1}));
    ServeHeld();
    return Status::Ok();
  }

  // Sums each row's gradients in rank order (rows first seen in rank order), averages over the
  // quorum and applies once per row.
  void ApplySyncSparse(ps::Table& t, ps::SparseShard& shard) {
    const int64_t dim = shard.dim();
    absl::flat_hash_map<int64_t, uint32_t> slot_of;
    std::vector<int64_t> ids;
    std::vector<float> sum;
    int k = 0;
    for (size_t r = 0; r < shard.sync.by_rank.size(); ++r) {
      if (!shard.sync.by_rank[r]) continue;
      ++k;
      std::vector<int64_t> id_scratch;
      std::vector<float> g_scratch;
      auto rids = View<int64_t>(*shard.sync.ids_by_rank[r], id_scratch);
      const float* g = View<float>(*shard.sync.by_rank[r], g_scratch).data();
      for (size_t i = 0; i < rids.size(); ++i) {
        auto [it, inserted] = slot_of.try_emplace(rids[i], static_cast<uint32_t>(ids.size()));
        if (inserted) {
          ids.push_back(rids[i]);
          sum.resize(sum.size() + static_cast<size_t>(dim), 0.0f);
        }
        float* s = sum.data() + static_cast<size_t>(it->second) * static_cast<size_t>(dim);
        for (int64_t j = 0; j < dim; ++j) s[j] += g[static_cast<int64_t>(i) * dim + j];
      }
    }
    const float kf = static_cast<float>(k);
    for (float& v : sum) v /= kf;
    ApplySparseRows(t.spec.optimizer, shard, ids, sum.data());
    ++shard.version;
    shard.sync.Reset(num_workers_, /*sparse=*/true);
    Count(kUpdatesApplied);
  }

  // ---- clocks and barriers -----------------------------------------------------------------

  Status OnClock(Request& req) {
    auto& c = clocks_[static_cast<size_t>(req.h()->rank())];
    c = std::max(c, req.h()->step());
    SendOk(req, c);
    ServeHeld();
    return Status::Ok();
  }

  // The worker has ended its training: it is no longer waited for. Sync steps that were missing
  // only its gradient close now; ssp pulls no longer wait for its clock. A later Hello from the
  // same rank makes it take part again.
  Status OnFinish(Request& req) {
    SetFinished(req.h()->rank(), true);
    for (auto& [id, t] : tables_) {
      if (t->spec.consistency != Consistency::kSync) continue;
      if (t->dense) {
        for (int64_t i = 0; i < t->dense->num_chunks(); ++i) {
          ps::DenseChunk* c = t->dense->chunk(i);
          if (c != nullptr && StepComplete(t->spec, c->sync)) ApplySyncDense(*t, *c);
        }
      } else if (StepComplete(t->spec, t->sparse->sync)) {
        ApplySyncSparse(*t, *t->sparse);
      }
    }
    SendOk(req);
    ServeHeld();
    return Status::Ok();
  }

  Status OnBarrier(Request& req) {
    const int64_t id = req.h()->barrier_id();
    auto& arrived = barriers_[id];
    for (auto& r : arrived) {
      if (r.h()->rank() == req.h()->rank()) {
        return FailedPreconditionError("rank " + std::to_string(req.h()->rank()) + " entered barrier " +
                                       std::to_string(id) + " twice");
      }
    }
    if (!arrived.empty() && (arrived[0].h()->kind() != req.h()->kind() || arrived[0].h()->num_ids() != req.h()->num_ids())) {
      // The workers disagree on the collective: they would never complete it.
      const Request& first = arrived[0];
      auto describe = [](const Request& r) {
        return std::string(wire::KindName(r.h()->kind())) + " of " + std::to_string(r.h()->num_ids()) + " values from rank " +
               std::to_string(r.h()->rank());
      };
      return FailedPreconditionError("collective " + std::to_string(id) + ": " + describe(req) + " does not match " +
                                     describe(first));
    }
    if (HeldCount() >= options_.max_held) {
      if (arrived.empty()) barriers_.erase(id);
      return ResourceExhaustedError("server holds " + std::to_string(HeldCount()) +
                                    " waiting requests already; refusing more");
    }
    req.deadline = Clock::now() + options_.max_wait;
    arrived.push_back(std::move(req));
    ++held_barriers_;
    if (static_cast<int>(arrived.size()) == num_workers_) {
      if (arrived[0].h()->kind() == Kind::AllReduce) {
        // Sum in rank order, so every run adds the same numbers in the same order.
        std::sort(arrived.begin(), arrived.end(), [](const Request& a, const Request& b) { return a.h()->rank() < b.h()->rank(); });
        const size_t n = static_cast<size_t>(arrived[0].h()->num_ids());
        std::vector<double> sum(n, 0.0);
        for (auto& r : arrived) {
          std::vector<double> scratch;
          auto v = View<double>(r.payload[0], scratch);
          for (size_t i = 0; i < n; ++i) sum[i] += v[i];
        }
        for (auto& r : arrived) {
          Frames payload;
          payload.emplace_back(sum.data(), n * sizeof(double));
          Send(r, wire::MakeReply(r.h()->request_id(), r.h()->kind(), 0), std::move(payload));
        }
      } else {
        for (auto& r : arrived) SendOk(r);
      }
      held_barriers_ -= arrived.size();
      barriers_.erase(id);
    }
    return Status::Ok();
  }

  // ---- deadlines ---------------------------------------------------------------------------

  // What a held pull still waits for, naming the workers it waits on.
  std::string WaitingFor(const Request& req) const {
    const Header& h = *req.h();
    auto describe = [&](const ps::Table& t, int64_t version, const ps::SyncSlots& sync, const std::string& part) {
      if (t.spec.consistency == Consistency::kSsp) {
        std::string behind;
        for (size_t r = 0; r < clocks_.size(); ++r) {
          if (!finished_[r] && clocks_[r] < req.pull_step - t.spec.staleness) {
            behind += (behind.empty() ? "" : ", ") + std::to_string(r) + " (clock " + std::to_string(clocks_[r]) + ")";
          }
        }
        return "table '" + t.spec.name + "' (ssp:" + std::to_string(t.spec.staleness) + ") waits for worker(s) " + behind;
      }
      return "table '" + t.spec.name + "'" + part + " is at step " + std::to_string(version) +
             " and waits for the gradients of worker(s) " + MissingRanks(sync);
    };
    if (h.kind() == Kind::PullSparse) {
      auto it = tables_.find(h.table_id());
      if (it != tables_.end() && it->second->sparse) {
        const ps::Table& t = *it->second;
        return describe(t, t.sparse->version, t.sparse->sync, "");
      }
    } else if (h.slices()) {
      for (const auto* sl : *h.slices()) {
        auto it = tables_.find(sl->table_id());
        if (it == tables_.end() || !it->second->dense) continue;
        const ps::Table& t = *it->second;
        const ps::DenseChunk* c = t.dense->chunk(sl->chunk());
        if (c != nullptr && !Ready(t.spec, c->version, req.pull_step)) {
          return describe(t, c->version, c->sync, " chunk " + std::to_string(sl->chunk()));
        }
      }
    }
    return "its step was not reached";
  }

  std::optional<Clock::time_point> NextDeadline() const {
    std::optional<Clock::time_point> next;
    for (const auto& r : held_) next = next ? std::min(*next, r.deadline) : r.deadline;
    for (const auto& [id, rs] : barriers_) {
      for (const auto& r : rs) next = next ? std::min(*next, r.deadline) : r.deadline;
    }
    return next;
  }

  void ExpireHeld() {
    const auto now = Clock::now();
    const std::string waited = std::to_string(options_.max_wait.count()) + " ms";
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->deadline <= now) {
        Count(kHeldExpired);
        SendError(*it, DeadlineExceededError(
                           std::string(wire::KindName(it->h()->kind())) + " for step " + std::to_string(it->pull_step) +
                           " waited " + waited + " on server " + std::to_string(options_.rank) + ": " +
                           WaitingFor(*it) + " (stopped, or fell behind?)"));
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = barriers_.begin(); it != barriers_.end();) {
      auto& rs = it->second;
      const bool expired = std::any_of(rs.begin(), rs.end(), [&](const Request& r) { return r.deadline <= now; });
      if (expired) {
        std::vector<bool> arrived(static_cast<size_t>(num_workers_), false);
        for (const auto& r : rs) arrived[static_cast<size_t>(r.h()->rank())] = true;
        std::string missing;
        for (size_t w = 0; w < arrived.size(); ++w) {
          if (!arrived[w]) missing += (missing.empty() ? "" : ", ") + std::to_string(w);
        }
        for (auto& r : rs) {
          Count(kHeldExpired);
          SendError(r, DeadlineExceededError(std::string(wire::KindName(r.h()->kind())) + " " + std::to_string(it->first) +
                                             " waited " + waited + " on server " + std::to_string(options_.rank) +
                                             " for worker(s) " + missing + " (" + std::to_string(rs.size()) + " of " +
                                             std::to_string(num_workers_) + " arrived)"));
        }
        held_barriers_ -= rs.size();
        it = barriers_.erase(it);
      } else {
        ++it;
      }
    }
  }

  static constexpr int64_t kGrain = 1 << 16;
  static constexpr int64_t kMaxStep = int64_t{1} << 62;  // steps/clocks from the network: no overflow in +1 or -s

  const ServerOptions options_;
  std::shared_ptr<Context> context_;  // keeps the zmq context alive for socket_
  zmq::socket_t socket_;              // owned by the I/O thread after construction
  const std::string endpoint_;
  transport::Waker waker_;
  std::atomic<bool> stopping_{false};
  ps::ThreadPool pool_;

  // Everything below is owned by the I/O thread.
  int num_workers_ = 0;  // from the first Hello
  std::vector<bool> finished_;   // per worker rank: sent Finish (and no Hello since)
  int num_finished_ = 0;         // the true entries of finished_
  std::unordered_map<uint64_t, std::unique_ptr<ps::Table>> tables_;
  std::vector<int64_t> clocks_;  // per worker rank (ssp)
  std::list<Request> held_;      // waiting pulls, at most options_.max_held
  std::map<int64_t, std::vector<Request>> barriers_;
  size_t held_barriers_ = 0;     // requests in barriers_, counted with held_ against max_held
  std::vector<float> avg_;       // scratch for sync averaging
  std::vector<ps::RowIndex> rows_;  // scratch for sparse row indices

  std::array<std::atomic<int64_t>, kNumCounters> counters_;
  std::array<std::atomic<int64_t>, kStalenessBuckets> staleness_;
  mutable Mutex by_rank_mu_;  // Stats() reads these from any thread
  std::vector<int64_t> used_by_rank_ ABSL_GUARDED_BY(by_rank_mu_);     // push messages that counted
  std::vector<int64_t> dropped_by_rank_ ABSL_GUARDED_BY(by_rank_mu_);  // push messages dropped as late
  Mutex stop_mu_;  // serialises the join in Stop()

  // Last: starts after everything above is built. Joined only under stop_mu_.
  std::thread thread_ ABSL_GUARDED_BY(stop_mu_);
};

}  // namespace

StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  if (options.num_servers < 1 || options.rank < 0 || options.rank >= options.num_servers) {
    return InvalidArgumentError("server rank " + std::to_string(options.rank) + " is outside [0, " +
                                std::to_string(options.num_servers) + ")");
  }
  if (options.max_message_bytes < 1024) return InvalidArgumentError("max_message_bytes must be at least 1024");
  if (options.compute_threads <= 0) {
    options.compute_threads = std::max(0, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  }
  auto context = options.context ? options.context : Context::Create(1);
  if (!transport::Waker().ok()) return InternalError("cannot create an eventfd (file descriptors exhausted?)");
  FERRY_ASSIGN_OR_RETURN(zmq::socket_t socket, transport::MakeSocket(transport::Zmq(*context), zmq::socket_type::router));
  std::string endpoint;
  try {
    // ZeroMQ drops the connection of a peer whose single frame exceeds this hard limit; frames
    // below it but over max_message_bytes get an error reply.
    socket.set(zmq::sockopt::maxmsgsize, options.max_message_bytes * 2);
    socket.bind(options.bind);
    endpoint = transport::LastEndpoint(socket);
  } catch (const zmq::error_t& e) {
    return UnavailableError("ferry-ps rank " + std::to_string(options.rank) + ": cannot bind " + options.bind + ": " +
                            e.what());
  }
  return std::unique_ptr<Server>(new ServerImpl(std::move(options), std::move(context), std::move(socket), endpoint));
}

}  // namespace ferry
