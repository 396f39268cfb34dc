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
#include <thread>

#include "ferry/mutex.h"
#include "ferry/messages/deadlines.h"
#include "ferry/messages/event_loop.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "internal/collectives.h"
#include "internal/held.h"
#include "internal/request.h"
#include "internal/sync.h"
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
  kNumCounters
};
constexpr std::array<const char*, kNumCounters> kCounterNames = {
    "messages", "bad_messages", "errors_sent", "late_gradients_dropped", "updates_applied",
    "pulls_held", "held_expired", "bytes_in", "bytes_out"};
constexpr size_t kStalenessBuckets = 65;

class ServerImpl final : public Server {
 public:
  ServerImpl(ServerOptions options, std::shared_ptr<Context> context, zmq::socket_t socket, std::string endpoint)
      : options_(std::move(options)),
        context_(std::move(context)),
        socket_(std::move(socket)),
        endpoint_(std::move(endpoint)),
        pool_(options_.compute_threads),
        updater_(pool_),
        tables_(options_.rank, options_.num_servers) {
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
    h.next_deadline = [this] { return transport::Earliest(held_.NextDeadline(), collectives_.NextDeadline()); };
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

  // Checks the message as a whole (header, frame count, size, payload shape) and dispatches it;
  // every refusal and failure is answered with an error naming the request.
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
    if (workers_.count() == 0) return FailedPreconditionError("no Hello yet: the client must handshake first");
    if (h.rank() < 0 || h.rank() >= workers_.count()) {
      return InvalidArgumentError("rank " + std::to_string(h.rank()) + " is outside [0, " +
                                  std::to_string(workers_.count()) + ")");
    }
    if (h.step() < 0 || h.step() > ps::kMaxStep) {
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
      case Kind::AllReduce: return OnCollective(req);
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
    FERRY_RETURN_IF_ERROR(workers_.Join(h.rank(), h.num_workers()));
    {
      MutexLock lock(&by_rank_mu_);
      if (used_by_rank_.empty()) {
        used_by_rank_.assign(static_cast<size_t>(workers_.count()), 0);
        dropped_by_rank_.assign(static_cast<size_t>(workers_.count()), 0);
      }
    }
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
    FERRY_RETURN_IF_ERROR(tables_.Create(std::move(spec), req.h()->table_id(), workers_.count()));
    SendOk(req);
    return Status::Ok();
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

  // ---- pushes ------------------------------------------------------------------------------

  Status OnPushDense(Request& req, bool then_pull) {
    const Header& h = *req.h();
    const int rank = h.rank();
    std::vector<ps::TableRegistry::SliceRef> refs;
    FERRY_RETURN_IF_ERROR(tables_.ResolveSlices(h, options_.max_message_bytes, &refs));
    // Check sync preconditions for every slice before touching any of them.
    for (const auto& r : refs) {
      if (r.table->spec.consistency != Consistency::kSync) continue;
      FERRY_RETURN_IF_ERROR(ps::CheckSyncPush(r.table->spec, r.chunk->sync, r.chunk->version, rank, h.step()));
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
        ps::HoldGradient(c->sync, rank, std::move(req.payload[i]));
        if (workers_.StepComplete(t->spec, c->sync)) {
          CloseSyncStep(*t, *c);
          applied = true;
        }
      } else {
        ++info.used;
        RecordStaleness(c->version - c->last_pulled[static_cast<size_t>(rank)]);
        std::vector<float> scratch;
        updater_.ApplyDense(t->spec.optimizer, *c, View<float>(req.payload[i], scratch).data(), c->version + 1);
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
      req.info = info;
      req.payload.clear();
      HoldOrServe(std::move(req));
    }
    if (applied || then_pull) ServeHeld();
    return Status::Ok();
  }

  Status OnPushSparse(Request& req) {
    const Header& h = *req.h();
    const int rank = h.rank();
    FERRY_ASSIGN_OR_RETURN(ps::Table * t, FindSparse(h));
    ps::SparseShard& shard = *t->sparse;
    std::vector<int64_t> id_scratch;
    auto ids = View<int64_t>(req.payload[0], id_scratch);
    FERRY_RETURN_IF_ERROR(tables_.CheckIds(*t, ids));
    if (t->spec.consistency == Consistency::kSync) {
      FERRY_RETURN_IF_ERROR(ps::CheckSyncPush(t->spec, shard.sync, shard.version, rank, h.step()));
      if (h.step() < shard.version) {
        Count(kLateGradientsDropped);
        CountPush(rank, 0, 1);
        Send(req, wire::MakeReply(h.request_id(), h.kind(), {.version = shard.version, .dropped = 1}));
        return Status::Ok();
      }
      ps::HoldGradient(shard.sync, rank, std::move(req.payload[0]), std::move(req.payload[1]));
      if (workers_.StepComplete(t->spec, shard.sync)) CloseSyncStep(shard);
    } else {
      RecordStaleness(shard.version - shard.last_pulled[static_cast<size_t>(rank)]);
      std::vector<float> g_scratch;
      updater_.ApplyRows(shard, ids, View<float>(req.payload[1], g_scratch).data());
      ++shard.version;
      Count(kUpdatesApplied);
    }
    CountPush(rank, 1, 0);
    Send(req, wire::MakeReply(h.request_id(), h.kind(), {.version = shard.version, .used = 1}));
    ServeHeld();
    return Status::Ok();
  }

  void CloseSyncStep(const ps::Table& t, ps::DenseChunk& c) {
    ps::CloseSyncStep(updater_, t.spec, c, workers_.count());
    Count(kUpdatesApplied);
  }

  void CloseSyncStep(ps::SparseShard& shard) {
    ps::CloseSyncStep(updater_, shard, workers_.count());
    Count(kUpdatesApplied);
  }

  // A sparse table named by the header, with the header's dim.
  StatusOr<ps::Table*> FindSparse(const Header& h) {
    FERRY_ASSIGN_OR_RETURN(ps::Table * t, tables_.Find(h.table_id(), TableType::kSparse));
    if (h.dim() != t->spec.dim) {
      return InvalidArgumentError("table '" + t->spec.name + "' has dim " + std::to_string(t->spec.dim) +
                                  ", the request says " + std::to_string(h.dim()));
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

  Status OnPullSparse(Request& req) {
    const Header& h = *req.h();
    FERRY_ASSIGN_OR_RETURN(ps::Table * t, FindSparse(h));
    if (h.num_ids() > options_.max_message_bytes / (t->spec.dim * static_cast<int64_t>(sizeof(float)))) {
      return ResourceExhaustedError("table '" + t->spec.name + "': " + std::to_string(h.num_ids()) + " rows of dim " +
                                    std::to_string(t->spec.dim) + " exceed this server's message limit of " +
                                    std::to_string(options_.max_message_bytes) + " bytes");
    }
    std::vector<int64_t> scratch;
    FERRY_RETURN_IF_ERROR(tables_.CheckIds(*t, View<int64_t>(req.payload[0], scratch)));
    req.pull_step = h.step();
    HoldOrServe(std::move(req));
    return Status::Ok();
  }

  // Serves a pull whose condition holds; false when it must keep waiting. Tables cannot be
  // dropped, so the slices resolved on arrival still resolve.
  bool TryServe(Request& req) {
    const Header& h = *req.h();
    const size_t rank = static_cast<size_t>(h.rank());
    if (h.kind() == Kind::PullSparse) {
      auto t = tables_.Find(h.table_id(), TableType::kSparse);
      if (!t.ok()) return SendError(req, t.status()), true;
      ps::SparseShard& shard = *(*t)->sparse;
      if (!workers_.Ready((*t)->spec, shard.version, req.pull_step)) return false;
      req.info.held_us = req.waited_us();  // the wait, not the copy below
      std::vector<int64_t> scratch;
      auto ids = View<int64_t>(req.payload[0], scratch);
      zmq::message_t out(ids.size() * static_cast<size_t>(shard.dim()) * sizeof(float));
      updater_.ReadRows(shard, ids, static_cast<float*>(out.data()));
      Frames payload;
      payload.push_back(std::move(out));
      req.info.version = shard.version;
      Send(req, wire::MakeReply(h.request_id(), h.kind(), req.info), std::move(payload));
      shard.last_pulled[rank] = shard.version;
      return true;
    }
    std::vector<ps::TableRegistry::SliceRef> refs;
    if (Status s = tables_.ResolveSlices(h, options_.max_message_bytes, &refs); !s.ok()) return SendError(req, s), true;
    for (auto& r : refs) {
      if (!workers_.Ready(r.table->spec, r.chunk->version, req.pull_step)) return false;
    }
    req.info.held_us = req.waited_us();  // the wait, not the copies below
    Frames payload;
    payload.reserve(refs.size());
    int64_t version = INT64_MAX;
    for (auto& r : refs) {
      zmq::message_t frame(static_cast<size_t>(r.chunk->size) * sizeof(float));
      updater_.ReadDense(*r.chunk, static_cast<float*>(frame.data()));
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
    held_.Hold(std::move(req), Clock::now() + options_.max_wait);
  }

  size_t HeldCount() const { return held_.size() + collectives_.size(); }

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
    tables_.ForEach([this](ps::Table& t) {
      if (t.spec.consistency != Consistency::kSync) return;
      if (t.dense) {
        for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
          ps::DenseChunk* c = t.dense->chunk(i);
          if (c != nullptr && workers_.StepComplete(t.spec, c->sync)) CloseSyncStep(t, *c);
        }
      } else if (workers_.StepComplete(t.spec, t.sparse->sync)) {
        CloseSyncStep(*t.sparse);
      }
    });
    SendOk(req);
    ServeHeld();
    return Status::Ok();
  }

  Status OnCollective(Request& req) {
    FERRY_RETURN_IF_ERROR(collectives_.CheckEntry(req));
    if (HeldCount() >= options_.max_held) {
      return ResourceExhaustedError("server holds " + std::to_string(HeldCount()) +
                                    " waiting requests already; refusing more");
    }
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

  // ---- deadlines ---------------------------------------------------------------------------

  // What a held pull still waits for, naming the workers it waits on.
  std::string WaitingFor(const Request& req) const {
    const Header& h = *req.h();
    auto describe = [&](const ps::Table& t, int64_t version, const ps::SyncSlots& sync, const std::string& part) {
      if (t.spec.consistency == Consistency::kSsp) {
        return "table '" + t.spec.name + "' (ssp:" + std::to_string(t.spec.staleness) + ") waits for worker(s) " +
               workers_.Behind(req.pull_step, t.spec.staleness);
      }
      return "table '" + t.spec.name + "'" + part + " is at step " + std::to_string(version) +
             " and waits for the gradients of worker(s) " + workers_.MissingRanks(sync);
    };
    if (h.kind() == Kind::PullSparse) {
      const ps::Table* t = tables_.Find(h.table_id());
      if (t != nullptr && t->sparse) return describe(*t, t->sparse->version, t->sparse->sync, "");
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
    return "its step was not reached";
  }

  void ExpireHeld() {
    const auto now = Clock::now();
    const std::string waited = std::to_string(options_.max_wait.count()) + " ms";
    for (Request& r : held_.TakeExpired(now)) {
      Count(kHeldExpired);
      SendError(r, DeadlineExceededError(std::string(wire::KindName(r.h()->kind())) + " for step " +
                                         std::to_string(r.pull_step) + " waited " + waited + " on server " +
                                         std::to_string(options_.rank) + ": " + WaitingFor(r) +
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
  std::shared_ptr<Context> context_;  // keeps the zmq context alive for socket_
  zmq::socket_t socket_;              // owned by the I/O thread after construction
  const std::string endpoint_;
  transport::Waker waker_;
  std::atomic<bool> stopping_{false};
  ps::ThreadPool pool_;

  // Everything below, to the counters, is owned by the I/O thread.
  ps::Updater updater_;  // uses pool_
  ps::TableRegistry tables_;
  ps::Workers workers_;
  ps::HeldPulls held_;          // waiting pulls; with collectives_, at most options_.max_held
  ps::Collectives collectives_;

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
