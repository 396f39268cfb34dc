// The client's operations: tables, dense and sparse pushes and pulls, clocks, collectives and
// checkpoints. Each builds its requests (routing dense chunks and sparse ids to their servers),
// submits them to the I/O engine (engine.h: the sockets, the I/O thread, requests in flight) with
// the function that reads each reply, and returns a Handle.
#include "ferry/client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "engine.h"
#include "ferry/messages/codec.h"
#include "ferry/messages/kinds.h"
#include "ferry/messages/placement.h"

namespace ferry {

Status PulledDense::CopyTo(size_t t, std::span<float> out) const {
  size_t at = 0;
  for (const Piece& p : pieces(t)) {
    if (static_cast<size_t>(p.offset) != at || p.values.empty()) {
      return InvalidArgumentError("tensor " + std::to_string(t) + " lacks its piece at element " + std::to_string(at) +
                                  " (was its pull done and OK?)");
    }
    at += p.values.size();
  }
  if (at != out.size()) {
    return InvalidArgumentError("tensor " + std::to_string(t) + " has " + std::to_string(at) +
                                " elements, the buffer " + std::to_string(out.size()));
  }
  for (const Piece& p : pieces(t)) {
    std::memcpy(out.data() + p.offset, p.values.data(), p.values.size() * sizeof(float));
  }
  return Status::Ok();
}

namespace {

using io::ExpectBytes;
using io::ExpectFrames;
using io::OnReply;
using io::SteadyClock;
using transport::Frames;
using wire::Header;
using wire::Kind;

class ClientImpl final : public Client {
 public:
  ClientImpl(ClientOptions options, std::shared_ptr<Context> context)
      : options_(std::move(options)),
        engine_(options_, std::move(context)),
        placement_(std::make_shared<const placement::Placement>(
            placement::Placement::First(static_cast<int>(options_.servers.size())))) {
    joins_at_.store(options_.waits_to_rejoin ? wire::kWaitsToRejoin : options_.joins_at);
  }

  // The engine stops first: replies read on its thread call into this object.
  ~ClientImpl() override { engine_.Stop(); }

  Status Start() {
    FERRY_RETURN_IF_ERROR(engine_.Start([this](int s, const Header& h) { AdoptFrom(s, h); },
                                        [this](int s, bool rejoins) { return HelloHeader(s, rejoins); }));
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
    engine_.StartHeartbeats();
    return Status::Ok();
  }

  // Says Hello to server 0, then to the other servers of its map at once (1.20: those that own
  // slots; every one under a server 0 before 1.20). Server 0 says where the job is: the step of
  // the checkpoint it started from, the id of the job's next collective (a restarted worker
  // continues the sequence the others are in), and the map.
  Status Handshake() {
    lowest_worker_step_.store(INT64_MAX);
    some_step_not_restored_.store(false);
    some_server_before_1_11_.store(false);
    some_server_before_1_13_.store(false);
    {
      MutexLock lock(&greet_mu_);
      greeted_.assign(static_cast<size_t>(num_servers()), false);
    }
    FERRY_RETURN_IF_ERROR(Greet({0}, options_.connect_timeout));
    const auto map = Map();
    std::vector<int> rest;
    for (int s : Members(*map)) {
      if (s != 0) rest.push_back(s);
    }
    FERRY_RETURN_IF_ERROR(Greet(rest, options_.connect_timeout));
    greeted_version_.store(map->version(), std::memory_order_release);
    ShareMap();
    return Status::Ok();
  }

  // Hello to each of `servers` this client has not greeted yet, all at once; waits for the
  // replies (a server that refuses is greeted again next time).
  Status Greet(const std::vector<int>& servers, std::chrono::milliseconds timeout) {
    std::vector<int> sent;
    Handle hello = GreetAsync(servers, timeout, /*assume_minor=*/false, &sent);
    const Status s = hello.wait(timeout + std::chrono::seconds(1));
    if (!s.ok()) Ungreet(sent);
    return s;
  }

  void Ungreet(const std::vector<int>& servers) {
    MutexLock lock(&greet_mu_);
    for (const int s : servers) greeted_[static_cast<size_t>(s)] = false;
    greeted_version_.store(0);
  }

  // Sends Hello to each of `servers` this client has not greeted yet (`sent`), all in one
  // operation, and counts them greeted: a request sent after the Hello on the same connection
  // reaches the server after it (another thread's too: hello_mu_ holds it back until the Hello is
  // submitted). Waits for no reply (it may run on the thread that reads the sockets, sending an
  // operation again). With `assume_minor`, a server's protocol is taken to be 1.20 until its reply
  // says (only such a server can join: MoveSlots checks).
  Handle GreetAsync(const std::vector<int>& servers, std::chrono::milliseconds timeout, bool assume_minor,
                    std::vector<int>* sent) {
    MutexLock ordered(&hello_mu_);
    {
      MutexLock lock(&greet_mu_);  // (held for the marks alone: the I/O thread takes it in ShareMap)
      for (const int s : servers) {
        if (greeted_[static_cast<size_t>(s)]) continue;
        greeted_[static_cast<size_t>(s)] = true;
        sent->push_back(s);
      }
    }
    if (sent->empty()) return Handle();
    auto op = engine_.NewOp();
    for (const int s : *sent) {
      if (assume_minor && engine_.minor(s) == 0) engine_.set_minor(s, wire::kMembersSinceMinor);
      OnReply on_reply = [this, s](const Header& reply, Frames&) -> Status {
        engine_.set_minor(s, reply.minor());
        engine_.set_server(s, reply.epoch(), reply.replication() == 2);
        if (!placement::PlacesAlike(reply.minor(), num_servers())) {
          return FailedPreconditionError("placement mismatch: server " + std::to_string(s) + " speaks protocol 1." +
                                         std::to_string(reply.minor()) +
                                         ", which places ids and chunks of a job of " + std::to_string(num_servers()) +
                                         " servers by the rule before 1.16's slots: upgrade the servers");
        }
        if (options_.joins_at > 0 && reply.minor() < wire::kLeavesSinceMinor) {
          return FailedPreconditionError("server " + std::to_string(s) + " speaks protocol 1." +
                                         std::to_string(reply.minor()) + ", which would wait for this worker (joins " +
                                         "at step " + std::to_string(options_.joins_at) +
                                         ") from now on (joining later needs 1.18): upgrade the servers");
        }
        if (options_.waits_to_rejoin && reply.minor() < wire::kRejoinsSinceMinor) {
          return FailedPreconditionError("server " + std::to_string(s) + " speaks protocol 1." +
                                         std::to_string(reply.minor()) + ", which does not know a worker that waits " +
                                         "to join the job again (1." + std::to_string(wire::kRejoinsSinceMinor) +
                                         "): upgrade the servers");
        }
        // The lowest over the servers that know (-1: this one does not, or is before 1.11).
        if (reply.minor() < 11) some_server_before_1_11_.store(true);
        if (reply.minor() < 13) some_server_before_1_13_.store(true);
        if (const int64_t known = reply.worker_step(); known >= 0) {
          int64_t low = lowest_worker_step_.load();
          while (known < low && !lowest_worker_step_.compare_exchange_weak(low, known)) {
          }
          if (!reply.worker_step_restored()) some_step_not_restored_.store(true);
        }
        // 1.17: the map the server places by; server 0's at the handshake whatever its version (1.20:
        // a job's first map may give slots to some of its servers alone, ferry-ps --active-servers).
        AdoptFrom(s, reply, /*even_same_version=*/s == 0 && reply.minor() >= wire::kMembersSinceMinor);
        // 1.26: the workers that left, with their steps (each server that saw the leave knows it;
        // a replacement server may not: the union); 1.27: the workers handed their join again.
        FERRY_RETURN_IF_ERROR(ReadMembers(s, reply));
        if (s == 0 && reply.rejoin_ranks() != nullptr) {
          rejoin_barrier_.store(reply.rejoin_barrier() >= 0 ? reply.rejoin_barrier() : -1);
        }
        if (s == 0) {
          restored_step_.store(reply.version());
          first_collective_.store(reply.next_collective());
          barrier_generation_.store(reply.next_collective());
        }
        return Status::Ok();
      };
      engine_.Submit(op, s, Kind::Hello, HelloHeader(s), {}, std::move(on_reply), timeout);
    }
    return Handle(op);
  }

  // The workers that left and those that join again with their steps, from server `s`'s Hello
  // reply (1.26, 1.27). Servers that disagree on a leave: a leave handed over is noted by server 0
  // before the leaver's Finish says the step to all, and (1.27) a worker that came back and left
  // again is at its later leave on server 0 first: the latest stands.
  Status ReadMembers(int s, const Header& reply) {
    FERRY_RETURN_IF_ERROR(ReadRankSteps(s, reply.left_ranks(), reply.left_at(), 0, 0, "left", "left before step",
                                        [this](int w, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(left_mu_) {
                                          auto [it, fresh] = workers_left_.try_emplace(w, step);
                                          if (!fresh) it->second = std::max(it->second, step);
                                        }));
    return ReadRankSteps(s, reply.rejoin_ranks(), reply.rejoin_at(), 1, 1, "join again", "joins again at step",
                         [this](int w, int64_t step)
                             ABSL_EXCLUSIVE_LOCKS_REQUIRED(left_mu_) { workers_rejoined_[w] = step; });
  }
  // A Hello reply's workers with a step each (1.26 left_ranks and left_at, 1.27 rejoin_ranks and
  // rejoin_at; both absent: none), checked (paired, ranks from `lowest` to the job's last, steps
  // from `lowest_step` to 2^62), each given to `take` under left_mu_.
  template <typename Take>
  Status ReadRankSteps(int s, const flatbuffers::Vector<int32_t>* ranks, const flatbuffers::Vector<int64_t>* at,
                       int lowest, int64_t lowest_step, std::string_view did, std::string_view when, Take take) {
    if (ranks == nullptr && at == nullptr) return Status::Ok();
    if (ranks == nullptr || at == nullptr || ranks->size() != at->size()) {
      return DataLossError("server " + std::to_string(s) + "'s Hello reply lists workers that " + std::string(did) +
                           " (" + std::to_string(ranks ? ranks->size() : 0) + ") and their steps (" +
                           std::to_string(at ? at->size() : 0) + ") unpaired");
    }
    MutexLock lock(&left_mu_);
    for (flatbuffers::uoffset_t i = 0; i < ranks->size(); ++i) {
      const int w = ranks->Get(i);
      const int64_t step = at->Get(i);
      if (w < lowest || w >= options_.num_workers || step < lowest_step || step > kMaxLeaveStep) {
        return DataLossError("server " + std::to_string(s) + "'s Hello reply says worker " + std::to_string(w) + " " +
                             std::string(when) + " " + std::to_string(step) + ": no such worker or step");
      }
      take(w, step);
    }
    return Status::Ok();
  }

  // This worker's Hello to server `s` (a replacement's too, 1.22: the engine sends that one).
  zmq::message_t HelloHeader(int s, bool rejoins = false) {
    flatbuffers::FlatBufferBuilder fbb(128);
    auto h = engine_.BeginHeader(fbb, Kind::Hello);
    h.add_num_workers(options_.num_workers);
    h.add_num_servers(num_servers());
    h.add_server_rank(s);
    h.add_heartbeat_ms(engine_.HeartbeatEvery().count());
    if (options_.resumes) h.add_resumes(true);
    if (const int64_t joins_at = joins_at_.load(); joins_at > 0) h.add_joins_at(joins_at);
    if (rejoins) h.add_rejoins(true);
    return engine_.FinishHeader(fbb, h);
  }

  // The servers this client speaks to under `map` (1.20, PROTOCOL.md "Servers joining and
  // leaving"): server 0 (the collectives, the checkpoints' manifests) and those that own slots;
  // every server while server 0 is before 1.20 (it would not write the shard of one that owns
  // none).
  std::vector<bool> MemberFlags(const placement::Placement& map) const {
    const bool all = engine_.minor(0) < wire::kMembersSinceMinor;
    std::vector<bool> member(static_cast<size_t>(num_servers()));
    for (int s = 0; s < num_servers(); ++s) member[static_cast<size_t>(s)] = all || s == 0 || map.SlotsOf(s) > 0;
    return member;
  }
  std::vector<int> Members(const placement::Placement& map) const {
    const std::vector<bool> member = MemberFlags(map);
    std::vector<int> out;
    for (int s = 0; s < num_servers(); ++s) {
      if (member[static_cast<size_t>(s)]) out.push_back(s);
    }
    return out;
  }
  std::vector<int> Members() const { return Members(*Map()); }
  std::vector<int> servers_in_job() const override { return Members(); }

  // The map requests are placed by, once this client has said Hello to every server it names (a
  // server that joined the job since: its Hello goes first, not waited for). A greeting that
  // failed is said, and sent again by the next call.
  std::shared_ptr<const placement::Placement> GreetedMap() {
    auto map = Map();
    if (greeted_version_.load(std::memory_order_acquire) == map->version() && !greeting_.load()) return map;
    std::vector<int> sent;
    Handle hello = GreetAsync(Members(*map), options_.request_timeout, /*assume_minor=*/true, &sent);
    bool failed = false;
    {
      MutexLock lock(&greet_mu_);
      for (auto it = greetings_.begin(); it != greetings_.end();) {
        if (!it->first.done()) {
          ++it;
          continue;
        }
        if (Status st = it->first.wait(std::chrono::milliseconds(0)); !st.ok()) {
          std::fprintf(stderr, "ferry client: worker %d: a Hello to a server that joined the job failed: %s\n",
                       options_.rank, st.ToString().c_str());
          for (const int s : it->second) greeted_[static_cast<size_t>(s)] = false;
          failed = true;
        }
        it = greetings_.erase(it);
      }
      if (!sent.empty()) greetings_.emplace_back(std::move(hello), std::move(sent));
      greeting_.store(!greetings_.empty());
    }
    // (A failed one is sent again by the next call: its server is not greeted.)
    greeted_version_.store(failed ? 0 : map->version(), std::memory_order_release);
    ShareMap();
    return map;
  }

  // Tells the engine which servers to send heartbeats to (those of the map this client has said
  // Hello to), and the map's version they carry.
  void ShareMap() {
    const auto map = Map();
    std::vector<bool> member = MemberFlags(*map);
    {
      MutexLock lock(&greet_mu_);
      if (was_member_.size() != member.size()) was_member_.assign(member.size(), false);
      for (int s = 0; s < num_servers(); ++s) {
        const auto i = static_cast<size_t>(s);
        const bool is = member[i];
        member[i] = is && greeted_[i];
        // One that stops being a server of the map may leave: a process of it that comes back is new.
        if (!is && was_member_[i]) greeted_[i] = false;
        was_member_[i] = is;
      }
    }
    engine_.SetMap(map->version(), std::move(member));
  }

  int rank() const override { return options_.rank; }
  int num_workers() const override { return options_.num_workers; }
  int num_servers() const override { return engine_.num_servers(); }

  // ---- placement versions (1.17) -----------------------------------------------------------

  // The map requests are placed by now.
  std::shared_ptr<const placement::Placement> Map() const {
    MutexLock lock(&placement_mu_);
    return placement_;
  }
  uint64_t placement_version() const override { return Map()->version(); }
  std::vector<uint16_t> placement_owners() const override { return Map()->Owners(); }

  // Takes the map a server's header carries (a Hello reply, a "moved" error) when it is newer
  // than this client's. One that does not parse is ignored (the request then fails as moved).
  void AdoptFrom(int s, const Header& h, bool even_same_version = false) {
    if (h.placement() == nullptr) return;
    auto map = placement::Placement::FromOwners(h.placement_version(), {h.placement()->data(), h.placement()->size()},
                                                num_servers());
    if (!map.ok()) {
      std::fprintf(stderr, "ferry client: server %d sent a placement this client cannot use: %s\n", s,
                   map.status().ToString().c_str());
      return;
    }
    Adopt(std::move(*map), even_same_version);
  }

  // `map` from now on, if it is newer than this client's (or as new, with `even_same_version`).
  void Adopt(placement::Placement map, bool even_same_version = false) {
    {
      MutexLock lock(&placement_mu_);
      if (map.version() < placement_->version() || (map.version() == placement_->version() && !even_same_version)) {
        return;
      }
      placement_ = std::make_shared<const placement::Placement>(std::move(map));
    }
    ShareMap();
  }

  Status MoveSlots(uint64_t version, std::span<const uint16_t> owners, int64_t step) override {
    FERRY_ASSIGN_OR_RETURN(placement::Placement next,
                           placement::Placement::FromOwners(version, owners, num_servers()));
    // The same map again is sent again (a MoveSlots that failed half-way: the servers that took it
    // answer OK at once); an older version, or another map of this one, is refused.
    if (const auto map = Map(); next.version() < map->version() ||
                                (next.version() == map->version() && next.Owners() != map->Owners())) {
      return FailedPreconditionError("MoveSlots: version " + std::to_string(version) + ", this client is at " +
                                     std::to_string(map->version()) + " already");
    }
    // 1.20: a server the new map gives slots to that this client does not speak to yet (one that
    // owned none) is greeted, and given this client's tables, first.
    const std::vector<int> servers = RoundServers(next);
    FERRY_RETURN_IF_ERROR(Greet(servers, options_.request_timeout).WithContext("MoveSlots (greeting the servers)"));
    FERRY_RETURN_IF_ERROR(DeclareOnJoining(next).WithContext("MoveSlots (declaring the tables where they move)"));
    const auto map = Map();
    for (const int s : servers) {
      if (engine_.minor(s) < wire::kPlacementVersionsSinceMinor) {
        return FailedPreconditionError("MoveSlots: server " + std::to_string(s) + " speaks protocol 1." +
                                       std::to_string(engine_.minor(s)) + ", which has no placement versions (1.17)");
      }
      // Under a server 0 of 1.20 a server that owns no slot hears nothing of the job: one that
      // joins or leaves must know so (it takes the step from the checkpoint, or leaves).
      if (s != 0 && engine_.minor(0) >= wire::kMembersSinceMinor &&
          (map->SlotsOf(s) == 0) != (next.SlotsOf(s) == 0) && engine_.minor(s) < wire::kMembersSinceMinor) {
        return FailedPreconditionError("MoveSlots: server " + std::to_string(s) + " speaks protocol 1." +
                                       std::to_string(engine_.minor(s)) + ", and the map makes it " +
                                       (next.SlotsOf(s) == 0 ? "leave" : "join") +
                                       " the job, which needs 1.20: upgrade it");
      }
    }
    // Two rounds: every server checks that it can, and only then does any adopt the map.
    for (const bool adopt : {false, true}) {
      if (Status st = PlacementRound(servers, version, owners, step, adopt, /*prepare=*/false).wait(); !st.ok()) {
        return st.WithContext(adopt ? "MoveSlots (adopting; the servers that answered OK hold the new map)"
                                    : "MoveSlots (checking; nothing changed)");
      }
    }
    Adopt(std::move(next));
    return Status::Ok();
  }

  Handle PrepareMoveSlots(uint64_t version, std::span<const uint16_t> owners, int64_t step) override {
    auto op = engine_.NewOp();
    auto next = placement::Placement::FromOwners(version, owners, num_servers());
    if (!next.ok()) return engine_.Failed(op, next.status().WithContext("PrepareMoveSlots"));
    const std::vector<int> servers = RoundServers(*next);
    if (Status st = Greet(servers, options_.request_timeout); !st.ok()) {
      return engine_.Failed(op, st.WithContext("PrepareMoveSlots (greeting the servers)"));
    }
    if (const uint64_t now = Map()->version(); version <= now) {
      return engine_.Failed(op, FailedPreconditionError("PrepareMoveSlots: version " + std::to_string(version) +
                                                        ", this client is at " + std::to_string(now) + " already"));
    }
    for (const int s : servers) {
      if (engine_.minor(s) >= wire::kPrepareSinceMinor) continue;
      // A server before 1.19 would take it for a MoveSlots' check round.
      return engine_.Failed(op, FailedPreconditionError("PrepareMoveSlots: server " + std::to_string(s) +
                                                        " speaks protocol 1." + std::to_string(engine_.minor(s)) +
                                                        ", which cannot read a hand-over ahead (1.19)"));
    }
    return PlacementRound(servers, version, owners, step, /*adopt=*/false, /*prepare=*/true);
  }

  // The servers a hand-over to `next` involves: this client's now, and those `next` gives slots.
  std::vector<int> RoundServers(const placement::Placement& next) const {
    std::vector<int> now = Members(), then = Members(next), out;
    std::ranges::set_union(now, then, std::back_inserter(out));
    return out;
  }

  // Declares this client's tables on each server `next` gives slots to that owns none now: it
  // may have been started after they were declared, or drained while they were.
  Status DeclareOnJoining(const placement::Placement& next) {
    const auto map = Map();
    std::vector<int> joining;
    for (const int s : Members(next)) {
      if (map->SlotsOf(s) == 0 && s != 0) joining.push_back(s);
    }
    if (joining.empty()) return Status::Ok();
    std::vector<TableSpec> specs;
    {
      MutexLock lock(&tables_mu_);
      for (const auto& [name, spec] : tables_) specs.push_back(spec);
    }
    auto op = engine_.NewOp();
    for (const TableSpec& spec : specs) {
      for (const int s : joining) SubmitCreateTable(op, s, spec, nullptr);
    }
    return Handle(op).wait();
  }

  // A CreateTable of `spec` to server `s`, in `op`.
  void SubmitCreateTable(const std::shared_ptr<Handle::State>& op, int s, const TableSpec& spec, OnReply on_reply) {
    flatbuffers::FlatBufferBuilder fbb(512);
    auto wspec = wire::SpecToWire(fbb, spec);
    auto h = engine_.BeginHeader(fbb, Kind::CreateTable);
    h.add_table_id(TableId(spec.name));
    h.add_spec(wspec);
    engine_.Submit(op, s, Kind::CreateTable, engine_.FinishHeader(fbb, h), {}, std::move(on_reply),
                   options_.request_timeout);
  }

  // One Placement request of the map to each of `servers`, all in flight together.
  Handle PlacementRound(const std::vector<int>& servers, uint64_t version, std::span<const uint16_t> owners,
                        int64_t step, bool adopt, bool prepare) {
    auto op = engine_.NewOp();
    for (const int s : servers) {
      flatbuffers::FlatBufferBuilder fbb(12 * 1024);
      auto vec = fbb.CreateVector(owners.data(), owners.size());
      auto h = engine_.BeginHeader(fbb, Kind::Placement);
      h.add_step(step);
      h.add_placement_version(version);
      h.add_placement(vec);
      h.add_full(adopt);
      if (prepare) h.add_prepare(true);
      engine_.Submit(op, s, Kind::Placement, engine_.FinishHeader(fbb, h), {}, nullptr, options_.request_timeout);
    }
    return Handle(op);
  }

  ClientStats stats() const override {
    ClientStats s = engine_.stats();
    s.values_saturated = values_saturated_.load();
    return s;
  }

  // ---- tables ------------------------------------------------------------------------------

  Status Declare(const TableSpec& spec) override {
    FERRY_RETURN_IF_ERROR(spec.Validate());
    // The servers of this client's map (1.20): one that owns no slot gets the table when a map
    // gives it slots (DeclareOnJoining).
    const std::vector<int> servers = Members(*GreetedMap());
    // A server before 1.6 would read a compressed table's frames as float32: refused here, before
    // any server is asked.
    if (spec.wire != WireFormat::kF32 || spec.topk_ratio > 0.0f) {
      for (const int s : servers) {
        const int minor = engine_.minor(s);
        if (minor >= 6) continue;
        return FailedPreconditionError(
            "table '" + spec.name + "' is declared with " +
            (spec.wire != WireFormat::kF32 ? "wire=" + std::string(WireFormatName(spec.wire)) : std::string("topk")) +
            ", but server " + std::to_string(s) + " speaks protocol 1." + std::to_string(minor) +
            ", which would misread its compressed frames (they need 1.6); declare it with wire=f32 and no topk, or "
            "upgrade the servers");
      }
    }
    // A server before 1.15 would not see disk_tier: it would keep max_rows rows and drop the rest.
    if (spec.disk_tier) {
      for (const int s : servers) {
        const int minor = engine_.minor(s);
        if (minor >= 15) continue;
        return FailedPreconditionError("table '" + spec.name + "' is declared with disk_tier, but server " +
                                       std::to_string(s) + " speaks protocol 1." + std::to_string(minor) +
                                       ", which has no disk tier and would evict the rows beyond max_rows (it "
                                       "needs 1.15); upgrade the servers");
      }
    }
    auto op = engine_.NewOp();
    // Each server's chunking of the table (1.9: the reply's spec; -1: not said). A table that
    // exists keeps its own (a checkpoint's, another worker's), which this client then routes by.
    auto chunking = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(num_servers()), -1);
    for (const int s : servers) {
      OnReply on_reply = [chunking, s](const Header& reply, Frames& payload) -> Status {
        FERRY_RETURN_IF_ERROR(ExpectFrames(payload, 0));
        if (reply.spec() != nullptr) (*chunking)[static_cast<size_t>(s)] = reply.spec()->chunk_elems();
        return Status::Ok();
      };
      SubmitCreateTable(op, s, spec, std::move(on_reply));
    }
    FERRY_RETURN_IF_ERROR(Handle(op).wait());
    TableSpec held = spec;
    if (spec.type == TableType::kDense) {
      for (const int s : servers) {
        const int64_t c = (*chunking)[static_cast<size_t>(s)];
        if (c < 0 || c == held.chunk_elems) continue;
        if (held.chunk_elems != spec.chunk_elems) {
          return FailedPreconditionError("table '" + spec.name + "': the servers hold it in chunks of " +
                                         std::to_string(held.chunk_elems) + " and " + std::to_string(c) +
                                         " elements (server " + std::to_string(s) +
                                         "): they do not belong to one job");
        }
        held.chunk_elems = c;
      }
      FERRY_RETURN_IF_ERROR(held.Validate().WithContext("table '" + spec.name + "' as the servers hold it"));
    }
    MutexLock lock(&tables_mu_);
    tables_[spec.name] = held;
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
    size_t tensor;     // index into the call's tensor list
    WireFormat wire;   // the table's value format (1.6)
    float topk_ratio;  // the table's top-k ratio (pushes; 0: off)
    bool sync;         // a sync table's: a push in pieces that has one is held until its last piece (1.10)
  };

  // Splits tensors into chunks grouped per server, each group cut between chunks into messages
  // of about dense_message_bytes (0: of at most max_message_bytes; never more).
  StatusOr<std::vector<std::vector<std::vector<ChunkRef>>>> Route(const placement::Placement& map,
                                                                  std::span<const std::string_view> names,
                                                                  std::span<const size_t> sizes) const {
    std::vector<std::vector<std::vector<ChunkRef>>> per_server(static_cast<size_t>(num_servers()));
    std::vector<int64_t> bytes(static_cast<size_t>(num_servers()), 0);
    const int64_t cut = options_.dense_message_bytes > 0
                            ? std::min(options_.dense_message_bytes, options_.max_message_bytes)
                            : options_.max_message_bytes;
    for (size_t t = 0; t < names.size(); ++t) {
      FERRY_ASSIGN_OR_RETURN(TableSpec spec, Lookup(names[t], TableType::kDense));
      if (sizes[t] != kAnySize && static_cast<int64_t>(sizes[t]) != spec.num_elements()) {
        return InvalidArgumentError("table '" + spec.name + "' has " + std::to_string(spec.num_elements()) +
                                    " elements, the buffer has " + std::to_string(sizes[t]));
      }
      const uint64_t id = TableId(spec.name);
      for (int64_t c = 0; c < spec.num_chunks(); ++c) {
        const int s = map.ChunkServer(id, c);
        const int64_t offset = c * spec.chunk_elems;
        const int64_t count = std::min(spec.chunk_elems, spec.num_elements() - offset);
        auto& msgs = per_server[static_cast<size_t>(s)];
        const int64_t b = count * static_cast<int64_t>(sizeof(float));
        if (msgs.empty() || bytes[static_cast<size_t>(s)] + b > cut ||
            msgs.back().size() + 1 >= wire::kMaxFrames) {
          msgs.emplace_back();
          bytes[static_cast<size_t>(s)] = 0;
        }
        msgs.back().push_back(
            {id, c, offset, count, t, spec.wire, spec.topk_ratio, spec.consistency == Consistency::kSync});
        bytes[static_cast<size_t>(s)] += b;
      }
    }
    return per_server;
  }

  // Route's size for a tensor of a PullDenseView: the table's own, whatever it is.
  static constexpr size_t kAnySize = ~size_t{0};

  // A PullDenseView's values: the reply frames, each chunk's the piece of its tensor.
  class PulledDenseImpl final : public PulledDense {
   public:
    // Room for a piece per chunk of each of `tensors` tensors, as Route placed them.
    PulledDenseImpl(const std::vector<std::vector<std::vector<ChunkRef>>>& routed, size_t tensors)
        : pieces_(tensors) {
      for (const auto& msgs : routed) {
        for (const auto& chunks : msgs) {
          for (const ChunkRef& c : chunks) {
            auto& p = pieces_[c.tensor];
            if (p.size() <= static_cast<size_t>(c.chunk)) p.resize(static_cast<size_t>(c.chunk) + 1);
            p[static_cast<size_t>(c.chunk)].offset = c.offset;
          }
        }
      }
    }
    size_t size() const override { return pieces_.size(); }
    std::span<const Piece> pieces(size_t t) const override { return pieces_.at(t); }

    // Chunk `c`'s values, in `frame` (its size checked): kept as they came when they are float32
    // and aligned for it, else decoded or copied into memory of this object's.
    void Keep(const ChunkRef& c, zmq::message_t frame) {
      const size_t n = static_cast<size_t>(c.count);
      // Where it lives from now on: a small frame's bytes are inside the message itself.
      const zmq::message_t& kept = frames_.emplace_back(std::move(frame));
      const float* values = static_cast<const float*>(kept.data());
      if (c.wire != WireFormat::kF32 || reinterpret_cast<uintptr_t>(kept.data()) % alignof(float) != 0) {
        auto& own = owned_.emplace_back(n);
        wire::DecodeValues(c.wire, kept.data(), c.count, own.data());
        values = own.data();
        frames_.pop_back();
      }
      pieces_[c.tensor][static_cast<size_t>(c.chunk)].values = {values, n};
    }

   private:
    std::vector<std::vector<Piece>> pieces_;  // [tensor][chunk]
    std::deque<zmq::message_t> frames_;        // what pieces_ point into (a deque's elements stay put)
    std::deque<std::vector<float>> owned_;     // what the rest point into
  };

  // The pieces of a push call to one server (1.10): its id (0: not sent in pieces), and this
  // message's place among them.
  struct Piece {
    uint64_t call = 0;
    uint32_t piece = 0;
    uint32_t pieces = 0;
  };

  zmq::message_t DenseHeader(Kind kind, const std::vector<ChunkRef>& chunks, int64_t step, Piece piece,
                             uint64_t placement_version) {
    flatbuffers::FlatBufferBuilder fbb(128 + 24 * chunks.size());
    std::vector<wire::DenseSlice> slices;
    slices.reserve(chunks.size());
    for (const auto& c : chunks) slices.emplace_back(c.table_id, c.chunk, c.count);
    auto vec = fbb.CreateVectorOfStructs(slices);
    auto h = engine_.BeginHeader(fbb, kind);
    h.add_step(step);
    h.add_slices(vec);
    h.add_placement_version(placement_version);
    if (piece.call != 0) {
      h.add_call(piece.call);
      h.add_piece(piece.piece);
      h.add_pieces(piece.pieces);
    }
    return engine_.FinishHeader(fbb, h);
  }

  // Keeps each reply frame where it arrived, as its chunk's piece of its tensor (PulledDenseImpl).
  static OnReply KeepDense(std::vector<ChunkRef> chunks, std::shared_ptr<PulledDenseImpl> kept) {
    return [chunks = std::move(chunks), kept = std::move(kept)](const Header&, Frames& payload) -> Status {
      FERRY_RETURN_IF_ERROR(ExpectFrames(payload, chunks.size()));
      for (size_t i = 0; i < chunks.size(); ++i) {
        FERRY_RETURN_IF_ERROR(
            ExpectBytes(payload[i], static_cast<size_t>(chunks[i].count * wire::ValueBytes(chunks[i].wire))));
      }
      for (size_t i = 0; i < chunks.size(); ++i) kept->Keep(chunks[i], std::move(payload[i]));
      return Status::Ok();
    };
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

  // A dense call. With `view` (PullDenseView, PushPullDenseView) the pulled values are kept where
  // they arrive instead of being copied into `outs` (then empty), and `view_tables` names the
  // tables of a PullDenseView.
  // A call's arguments kept for a re-run (1.17: every request answered "moved"): the caller's
  // buffers stay theirs until the call is waited for; the lists and the names are copied.
  struct DenseArgs {
    std::vector<std::string> names_in, names_out, names_view;
    std::vector<DenseIn> grads;
    std::vector<DenseOut> outs;
    std::vector<std::string_view> view_tables;
    DenseArgs(std::span<const DenseIn> g, std::span<const DenseOut> o, std::span<const std::string_view> v) {
      for (const auto& x : g) names_in.emplace_back(x.table);
      for (const auto& x : o) names_out.emplace_back(x.table);
      for (const auto& x : v) names_view.emplace_back(x);
      for (size_t i = 0; i < g.size(); ++i) grads.push_back({names_in[i], g[i].data});
      for (size_t i = 0; i < o.size(); ++i) outs.push_back({names_out[i], o[i].data});
      for (const auto& n : names_view) view_tables.emplace_back(n);
    }
  };

  Handle DenseOp(Kind kind, std::span<const DenseIn> grads, std::span<const DenseOut> outs, int64_t step,
                 std::span<const std::string_view> view_tables = {},
                 std::shared_ptr<const PulledDense>* view = nullptr) {
    auto op = engine_.NewOp();
    // A view's values: one object, which a re-run fills (the caller may hold it already).
    auto kept = view != nullptr ? std::make_shared<std::shared_ptr<PulledDenseImpl>>() : nullptr;
    op->rerun = [this, kind, step, kept, args = std::make_shared<const DenseArgs>(grads, outs, view_tables)](
                    const std::shared_ptr<Handle::State>& again) {
      return SubmitDense(again, kind, args->grads, args->outs, step, args->view_tables, kept.get(), /*rerun=*/true);
    };
    const Status s = SubmitDense(op, kind, grads, outs, step, view_tables, kept.get(), /*rerun=*/false);
    if (view != nullptr) *view = *kept;
    if (!s.ok()) return engine_.Failed(op, s);
    return Handle(op);
  }

  // Builds and sends the requests of a dense call by the client's map (DenseOp; again, after
  // "moved", with `rerun`); an error before any is sent.
  Status SubmitDense(const std::shared_ptr<Handle::State>& op, Kind kind, std::span<const DenseIn> grads,
                     std::span<const DenseOut> outs, int64_t step, std::span<const std::string_view> view_tables,
                     std::shared_ptr<PulledDenseImpl>* view, bool rerun) {
    std::vector<std::string_view> names;
    std::vector<size_t> sizes;
    if (kind == Kind::PullDense && view != nullptr) {
      for (const auto& t : view_tables) names.push_back(t), sizes.push_back(kAnySize);
    } else if (kind == Kind::PullDense) {
      for (const auto& o : outs) names.push_back(o.table), sizes.push_back(o.data.size());
    } else {
      for (const auto& g : grads) names.push_back(g.table), sizes.push_back(g.data.size());
    }
    if (kind == Kind::PushPullDense && view == nullptr) {
      if (outs.size() != grads.size())
        return InvalidArgumentError("PushPullDense: grads and outputs differ in count");
      for (size_t t = 0; t < outs.size(); ++t) {
        if (outs[t].table != grads[t].table || outs[t].data.size() != grads[t].data.size()) {
          return InvalidArgumentError("PushPullDense: output " + std::to_string(t) + " ('" +
                                      std::string(outs[t].table) + "') does not match gradient '" +
                                      std::string(grads[t].table) + "'");
        }
      }
    }
    for (size_t i = 0; i < names.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (names[i] == names[j]) {
          return InvalidArgumentError("table '" + std::string(names[i]) +
                                      "' appears twice in one call; name each table once");
        }
      }
    }
    const std::shared_ptr<const placement::Placement> map = GreetedMap();
    auto routed = Route(*map, names, sizes);
    if (!routed.ok()) return routed.status();
    if (rerun && kind != Kind::PullDense) {
      for (const auto& msgs : *routed) {
        for (const auto& m : msgs) {
          for (const ChunkRef& c : m) {
            if (c.topk_ratio == 0.0f) continue;
            return FailedPreconditionError(
                "moved: the placement changed under this push, and a push of a top-k table cannot be sent again "
                "(its residual took the gradient already); nothing of it was applied");
          }
        }
      }
    }
    std::vector<std::span<float>> out_spans;
    for (const auto& o : outs) out_spans.push_back(o.data);
    std::shared_ptr<PulledDenseImpl> kept;
    if (view != nullptr) {
      if (*view == nullptr) *view = std::make_shared<PulledDenseImpl>(*routed, names.size());
      kept = *view;
    }
    // The servers' messages in turns (each server's first, then each one's second, ...), so that
    // every server starts on its share while the rest travels.
    // A push whose share of a server takes several messages and touches a sync table goes as one
    // call in pieces, which that server applies whole once the last piece has verified (1.10).
    size_t turns = 0;
    std::vector<uint64_t> calls(routed->size(), 0);
    for (size_t s = 0; s < routed->size(); ++s) {
      const auto& msgs = (*routed)[s];
      turns = std::max(turns, msgs.size());
      if (kind == Kind::PullDense || msgs.size() < 2) continue;
      const bool sync = std::any_of(msgs.begin(), msgs.end(), [](const auto& m) {
        return std::any_of(m.begin(), m.end(), [](const ChunkRef& c) { return c.sync; });
      });
      if (sync) calls[s] = next_call_++;
    }
    for (size_t m = 0; m < turns; ++m) {
      for (int s = 0; s < num_servers(); ++s) {
        if (m >= (*routed)[static_cast<size_t>(s)].size()) continue;
        auto& chunks = (*routed)[static_cast<size_t>(s)][m];
        Frames payload;
        if (kind != Kind::PullDense) {
          for (const auto& c : chunks) {
            const float* g = grads[c.tensor].data.data() + c.offset;
            if (c.wire == WireFormat::kF32 && c.topk_ratio == 0.0f) {
              payload.push_back(engine_.Lend(op, s, g, static_cast<size_t>(c.count) * sizeof(float)));
            } else {
              payload.push_back(EncodePush(grads[c.tensor].table, c, g));
            }
          }
        }
        OnReply on_reply = kind == Kind::PushDense ? OnReply()
                           : kept != nullptr       ? KeepDense(chunks, kept)
                                                   : ScatterDense(chunks, out_spans);
        const Piece piece{calls[static_cast<size_t>(s)], static_cast<uint32_t>(m),
                          static_cast<uint32_t>((*routed)[static_cast<size_t>(s)].size())};
        engine_.Submit(op, s, kind, DenseHeader(kind, chunks, step, piece, map->version()), std::move(payload),
                       std::move(on_reply), options_.request_timeout);
      }
    }
    return Status::Ok();
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
  Handle PullDenseView(std::span<const std::string_view> tables, int64_t step,
                       std::shared_ptr<const PulledDense>* values) override {
    return DenseOp(Kind::PullDense, {}, {}, step, tables, values);
  }
  Handle PushPullDenseView(std::span<const DenseIn> grads, int64_t step,
                           std::shared_ptr<const PulledDense>* values) override {
    return DenseOp(Kind::PushPullDense, grads, {}, step, {}, values);
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
    size_t table = 0;  // index into the call's tables
    int64_t dim = 0;
    WireFormat wire = WireFormat::kF32;  // the table's value format (1.6)
    uint64_t table_id = 0;
    std::span<const int64_t> ids;  // what travels: the caller's span (one server, distinct ids) or own_ids
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
  void ShareTable(const placement::Placement& map, size_t table, const TableSpec& spec, std::span<const int64_t> ids,
                  const float* grads, bool distinct, bool push, std::vector<std::vector<SparseShare>>* shares) const {
    const int S = num_servers();
    const int64_t dim = spec.dim;
    std::vector<SparseShare> mine(static_cast<size_t>(S));
    for (auto& sh : mine) sh.table = table, sh.dim = dim, sh.table_id = TableId(spec.name), sh.wire = spec.wire;
    if (distinct && S == 1) {  // nothing to group: the caller's buffers travel as they are
      mine[0].ids = ids;
    } else {
      // Where each distinct id went, (server << kRowBits) | its row there (only needed when ids
      // repeat). The table outgrows the caches for large calls: each id's slot is prefetched a
      // few ids ahead, and the shares' ids and a pull's positions (one per id) are sized once.
      // A push's summed rows are not: with many repeats that would reserve several times what
      // they take.
      constexpr int kRowBits = 40;
      constexpr size_t kAhead = 8;
      absl::flat_hash_map<int64_t, int64_t> where;
      if (!distinct) where.reserve(ids.size());
      const size_t per_server = ids.size() / static_cast<size_t>(S) + ids.size() / (8 * static_cast<size_t>(S)) + 16;
      for (auto& sh : mine) {
        sh.own_ids.reserve(std::min(ids.size(), per_server));
        if (!push) sh.positions.reserve(std::min(ids.size(), per_server));
      }
      for (size_t p = 0; p < ids.size(); ++p) {
        int s = 0;
        int64_t row = 0;
        bool first = true;
        if (distinct) {
          s = map.IdServer(ids[p]);
          row = static_cast<int64_t>(mine[static_cast<size_t>(s)].own_ids.size());
        } else {
          if (p + kAhead < ids.size()) where.prefetch(ids[p + kAhead]);
          auto [it, inserted] = where.try_emplace(ids[p], 0);
          if (inserted) {
            const int to = map.IdServer(ids[p]);
            it->second = (int64_t{to} << kRowBits) | static_cast<int64_t>(mine[static_cast<size_t>(to)].own_ids.size());
          }
          s = static_cast<int>(it->second >> kRowBits);
          row = it->second & ((int64_t{1} << kRowBits) - 1);
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
  struct SparseArgs {  // as DenseArgs
    std::vector<std::string> names;
    std::vector<SparseOut> pulls;
    std::vector<SparseIn> pushes;
    SparseArgs(std::span<const SparseOut> o, std::span<const SparseIn> g) {
      for (const auto& x : o) names.emplace_back(x.table);
      for (const auto& x : g) names.emplace_back(x.table);
      for (size_t i = 0; i < o.size(); ++i) pulls.push_back({names[i], o[i].ids, o[i].rows});
      for (size_t i = 0; i < g.size(); ++i) pushes.push_back({names[o.size() + i], g[i].ids, g[i].grads});
    }
  };

  Handle SparseOp(std::span<const SparseOut> pulls, std::span<const SparseIn> pushes, int64_t step, SparseIds id_kind) {
    auto op = engine_.NewOp();
    op->rerun = [this, step, id_kind, args = std::make_shared<const SparseArgs>(pulls, pushes)](
                    const std::shared_ptr<Handle::State>& again) {
      return SubmitSparse(again, args->pulls, args->pushes, step, id_kind);
    };
    if (Status s = SubmitSparse(op, pulls, pushes, step, id_kind); !s.ok()) return engine_.Failed(op, s);
    return Handle(op);
  }

  // Builds and sends the requests of a sparse call by the client's map (SparseOp; again, after
  // "moved"); an error before any is sent.
  Status SubmitSparse(const std::shared_ptr<Handle::State>& op, std::span<const SparseOut> pulls,
                      std::span<const SparseIn> pushes, int64_t step, SparseIds id_kind) {
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
          return InvalidArgumentError("table '" + std::string(name) +
                                      "' appears twice in one call; name each table once");
        }
      }
      auto spec = Lookup(name, TableType::kSparse);
      if (!spec.ok()) return spec.status();
      const size_t want = ids.size() * static_cast<size_t>(spec->dim);
      const size_t have = push ? pushes[t].grads.size() : pulls[t].rows.size();
      if (have != want) {
        return InvalidArgumentError(std::string(push ? "PushSparse '" : "PullSparse '") + spec->name + "': " +
                                    (push ? "gradient" : "output") + " has " + std::to_string(have) +
                                    " floats, ids x dim is " + std::to_string(want));
      }
      specs[t] = std::move(*spec);
      if (push) {
        ins[t] = pushes[t].grads;
      } else {
        outs[t] = pulls[t].rows;
      }
    }
    const std::shared_ptr<const placement::Placement> map = GreetedMap();
    const std::vector<bool> member = MemberFlags(*map);
    std::vector<std::vector<SparseShare>> shares(static_cast<size_t>(S));
    std::vector<size_t> first_unsent(static_cast<size_t>(S), 0);
    std::vector<int64_t> unsent_bytes(static_cast<size_t>(S), 0);
    // Sends server s's shares not sent yet, up to (not including) `end`.
    auto send_unsent = [&](int s, size_t end) {
      size_t& from = first_unsent[static_cast<size_t>(s)];
      if (from == end) return;
      const bool legacy = engine_.minor(s) < 5;
      SendSparse(op, s, std::span<SparseShare>(shares[static_cast<size_t>(s)]).subspan(from, end - from), push, legacy,
                 step, ins, outs, map->version());
      from = end;
      unsent_bytes[static_cast<size_t>(s)] = 0;
    };
    const size_t most_tables = (wire::kMaxFrames - 1) / (push ? 2 : 1);
    for (size_t t = 0; t < T; ++t) {
      ShareTable(*map, t, specs[t], push ? pushes[t].ids : pulls[t].ids, push ? pushes[t].grads.data() : nullptr,
                 distinct,
                 push, &shares);
      // A sync table reaches every server of the map, even with no ids there: each server closes
      // every step with every worker's (maybe empty) gradient, and a pull for step t waits until
      // every server has closed step t - 1. (1.20: not one that owns no slot; a hand-over that
      // gives it slots brings it to the checkpoint's step.)
      const bool sync = specs[t].consistency == Consistency::kSync;
      for (int s = 0; s < S; ++s) {
        auto& list = shares[static_cast<size_t>(s)];
        if (list.back().ids.empty() && (!sync || !member[static_cast<size_t>(s)])) {
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
        if (engine_.minor(s) < 5 || (cut > 0 && unsent_bytes[static_cast<size_t>(s)] >= cut)) {
          send_unsent(s, list.size());
        }
      }
    }
    for (int s = 0; s < S; ++s) send_unsent(s, shares[static_cast<size_t>(s)].size());
    return Status::Ok();
  }

  void SendSparse(const std::shared_ptr<Handle::State>& op, int s, std::span<SparseShare> group, bool push, bool legacy,
                  int64_t step, std::span<const std::span<const float>> ins, std::span<const std::span<float>> outs,
                  uint64_t placement_version) {
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
    auto h = engine_.BeginHeader(fbb, kind);
    h.add_step(step);
    h.add_placement_version(placement_version);
    if (legacy) {
      h.add_table_id(group[0].table_id);
      h.add_num_ids(static_cast<int64_t>(group[0].ids.size()));
      h.add_dim(group[0].dim);
    } else {
      h.add_sparse(vec);
    }
    zmq::message_t header = engine_.FinishHeader(fbb, h);
    Frames payload;
    payload.reserve(group.size() * (push ? 2 : 1));
    for (auto& sh : group) {
      const size_t id_bytes = sh.ids.size() * sizeof(int64_t);
      if (id_bytes == 0) {
        payload.emplace_back();
      } else if (sh.own_ids.empty()) {
        payload.push_back(engine_.Lend(op, s, sh.ids.data(), id_bytes));
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
        payload.push_back(engine_.Lend(op, s, ins[sh.table].data(), ins[sh.table].size() * sizeof(float)));
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
    engine_.Submit(op, s, kind, std::move(header), std::move(payload), std::move(on_reply), options_.request_timeout);
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
  // (1.20: every server of this client's map, PROTOCOL.md "Servers joining and leaving".)
  // (`leaves`: a Finish that leaves the job, before step `leaves_at` where that is 0 or more.)
  Handle ToEveryServer(Kind kind, int64_t step, bool leaves = false, int64_t leaves_at = -1) {
    auto op = engine_.NewOp();
    for (const int s : Members(*GreetedMap())) {
      flatbuffers::FlatBufferBuilder fbb(96);
      auto h = engine_.BeginHeader(fbb, kind);
      h.add_step(step);
      if (leaves) h.add_leaves(true);
      if (leaves && leaves_at >= 0) h.add_leaves_at(leaves_at);
      engine_.Submit(op, s, kind, engine_.FinishHeader(fbb, h), {}, nullptr, options_.request_timeout);
    }
    return Handle(op);
  }

  Handle AdvanceClock(int64_t clock) override { return ToEveryServer(Kind::Clock, clock); }

  Status Finish() override { return ToEveryServer(Kind::Finish, 0).wait(); }

  Status Leave(int64_t at) override {
    for (const int s : Members()) {
      if (engine_.minor(s) < wire::kLeavesSinceMinor) {
        return FailedPreconditionError("Leave: server " + std::to_string(s) + " speaks protocol 1." +
                                       std::to_string(engine_.minor(s)) +
                                       ", which would go on counting this worker in its collectives (leaving needs "
                                       "1.18); upgrade the servers");
      }
    }
    if (at < -1 || at > kMaxLeaveStep) {
      return InvalidArgumentError("Leave: step " + std::to_string(at) + " is outside [0, 2^62]");
    }
    return ToEveryServer(Kind::Finish, 0, /*leaves=*/true, at).wait();
  }

  Status Barrier() override { return EnterBarrier(false); }
  Status StartBarrier() override { return EnterBarrier(true); }
  StatusOr<AskedMove> BarrierTakingMoves(int64_t step) override {
    if (step < -1 || step > kMaxLeaveStep) {
      return InvalidArgumentError("BarrierTakingMoves: step " + std::to_string(step) + " is outside [0, 2^62]");
    }
    auto asked = std::make_shared<AskedMove>();
    FERRY_RETURN_IF_ERROR(EnterBarrier(false, asked, step));
    return *asked;
  }
  // `asked`: the barrier takes moves (1.24), and the reply's asked move goes there; `step` (1.26,
  // -1 none): the step the workers are at.
  Status EnterBarrier(bool start, const std::shared_ptr<AskedMove>& asked = nullptr, int64_t step = -1) {
    auto op = engine_.NewOp();
    flatbuffers::FlatBufferBuilder fbb(96);
    auto h = engine_.BeginHeader(fbb, Kind::Barrier);
    h.add_barrier_id(barrier_generation_.fetch_add(1));
    if (start) h.add_start(true);
    if (step >= 0) h.add_step(step);
    OnReply on_reply;
    if (asked) {
      h.add_takes_moves(true);
      const int servers = num_servers();
      const int workers = options_.num_workers;
      on_reply = [asked, servers, workers](const Header& reply, Frames&) -> Status {
        const int join = reply.move_join(), drain = reply.move_drain(), leave = reply.move_leave_worker();
        if (join < -1 || drain < -1 || join >= servers || drain >= servers || leave < -1 || leave == 0 ||
            leave >= workers || (join >= 0) + (drain >= 0) + (leave >= 0) > 1) {
          return DataLossError("server 0's barrier hands over a move of no server or worker of the job (join " +
                               std::to_string(join) + ", drain " + std::to_string(drain) + ", worker to leave " +
                               std::to_string(leave) + ")");
        }
        // 1.27: a worker that left, to join again.
        const int rejoin = reply.move_rejoin_worker();
        if (rejoin < -1 || rejoin == 0 || rejoin >= workers ||
            (rejoin >= 0 && (join >= 0 || drain >= 0 || leave >= 0))) {
          return DataLossError("server 0's barrier hands over the join of no worker of the job that left (" +
                               std::to_string(rejoin) + ")");
        }
        *asked = AskedMove{join, drain, leave, rejoin};
        return Status::Ok();
      };
    }
    engine_.Submit(op, 0, Kind::Barrier, engine_.FinishHeader(fbb, h), {}, std::move(on_reply),
                   options_.request_timeout);
    return Handle(op).wait();
  }

  StatusOr<std::vector<double>> AllReduceSum(std::span<const double> values) override {
    auto op = engine_.NewOp();
    auto result = std::make_shared<std::vector<double>>(values.size());
    flatbuffers::FlatBufferBuilder fbb(96);
    auto h = engine_.BeginHeader(fbb, Kind::AllReduce);
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
    engine_.Submit(op, 0, Kind::AllReduce, engine_.FinishHeader(fbb, h), std::move(payload), std::move(on_reply),
                   options_.request_timeout);
    FERRY_RETURN_IF_ERROR(Handle(op).wait());
    return std::move(*result);
  }

  int64_t restored_step() const override { return restored_step_.load(); }
  bool worker_step_restored() const override {
    return lowest_worker_step_.load() != INT64_MAX && !some_step_not_restored_.load();
  }
  int64_t worker_step() const override {
    const int64_t low = lowest_worker_step_.load();
    if (low != INT64_MAX) return low;
    // No server knows a step of this rank: it pushed nothing (every step pushes to some server),
    // unless a server is too old to say.
    return some_server_before_1_11_.load() ? -1 : 0;
  }
  int64_t first_collective() const override { return first_collective_.load(); }
  std::map<int, int64_t> workers_left() const override {
    MutexLock lock(&left_mu_);
    return workers_left_;
  }
  std::map<int, int64_t> workers_rejoined() const override {
    MutexLock lock(&left_mu_);
    return workers_rejoined_;
  }
  int64_t rejoin_barrier() const override { return rejoin_barrier_.load(); }

  StatusOr<int64_t> AskToRejoin() override {
    if (joins_at_.load() != wire::kWaitsToRejoin) {
      return FailedPreconditionError("AskToRejoin: this client " +
                                     std::string(options_.waits_to_rejoin ? "has joined again already (at step " +
                                                                                std::to_string(joins_at_.load()) + ")"
                                                                          : "did not connect waiting to join again "
                                                                            "(ClientOptions::waits_to_rejoin)"));
    }
    struct Answer {
      int64_t joins_at = 0;
      int64_t next_collective = 0;
    };
    auto answer = std::make_shared<Answer>();
    auto op = engine_.NewOp();
    flatbuffers::FlatBufferBuilder fbb(96);
    auto h = engine_.BeginHeader(fbb, Kind::MoveAsk);
    h.add_move_rejoin_worker(options_.rank);
    OnReply on_reply = [answer](const Header& reply, Frames&) -> Status {
      answer->joins_at = reply.joins_at();
      answer->next_collective = reply.next_collective();
      return Status::Ok();
    };
    engine_.Submit(op, 0, Kind::MoveAsk, engine_.FinishHeader(fbb, h), {}, std::move(on_reply),
                   options_.request_timeout);
    FERRY_RETURN_IF_ERROR(Handle(op).wait().WithContext("asking server 0 to take worker " +
                                                        std::to_string(options_.rank) + " back into the job"));
    const int64_t at = answer->joins_at;
    if (at == 0) return int64_t{0};  // (asked: not handed yet)
    if (at < 0 || at >= wire::kWaitsToRejoin || answer->next_collective < 0) {
      return DataLossError("server 0 answers worker " + std::to_string(options_.rank) + "'s join with step " +
                           std::to_string(at) + " and collective " + std::to_string(answer->next_collective));
    }
    // Handed: every server hears the step (a Hello saying it) before the workers meet at the
    // hand-over's second barrier, whose id server 0 said; no step from `at` on closes without
    // this worker.
    barrier_generation_.store(answer->next_collective);
    joins_at_.store(at);
    // Server 0 first, whose map this client takes (slots may have moved while it waited: a
    // server drained, or one joined), then every other server of that map; a server greeted here
    // for the first time is greeted again by GreetedMap, harmlessly (the same joins_at).
    auto first = engine_.NewOp();
    OnReply adopt = [this](const Header& reply, Frames&) -> Status {
      AdoptFrom(0, reply, /*even_same_version=*/reply.minor() >= wire::kMembersSinceMinor);
      // (and the leaves and joins handed while it waited, which the trainer takes too)
      return ReadMembers(0, reply);
    };
    engine_.Submit(first, 0, Kind::Hello, HelloHeader(0), {}, std::move(adopt), options_.request_timeout);
    FERRY_RETURN_IF_ERROR(Handle(first).wait().WithContext("telling server 0 worker " + std::to_string(options_.rank) +
                                                           " joins again at step " + std::to_string(at)));
    auto hello = engine_.NewOp();
    for (const int s : Members()) {
      if (s == 0) continue;
      engine_.Submit(hello, s, Kind::Hello, HelloHeader(s), {}, nullptr, options_.request_timeout);
    }
    FERRY_RETURN_IF_ERROR(Handle(hello).wait().WithContext(
        "telling the servers worker " + std::to_string(options_.rank) + " joins again at step " + std::to_string(at)));
    return at;
  }

  Handle SaveCheckpoint(int64_t step, std::span<CheckpointShard> shards) override {
    auto op = engine_.NewOp();
    if (shards.size() != static_cast<size_t>(num_servers())) {
      return engine_.Failed(op, InvalidArgumentError("SaveCheckpoint: " + std::to_string(shards.size()) +
                                                     " shard slots for " + std::to_string(num_servers()) + " servers"));
    }
    // 1.20: server 0 writes the shard of a server that owns no slot (empty), which may have left.
    const std::vector<bool> member = MemberFlags(*GreetedMap());
    for (int s = 0; s < num_servers(); ++s) {
      flatbuffers::FlatBufferBuilder fbb(96);
      auto h = engine_.BeginHeader(fbb, Kind::Checkpoint);
      h.add_step(step);
      if (!member[static_cast<size_t>(s)]) h.add_server_rank(s);
      // A server may write a delta over it, if server 0 records chains in manifests (1.13).
      h.add_previous_step(some_server_before_1_13_.load() ? -1 : last_committed_.load());
      CheckpointShard* out = &shards[static_cast<size_t>(s)];
      OnReply on_reply = [out](const Header& reply, Frames&) -> Status {
        if (!reply.shards() || reply.shards()->size() != 1 || !reply.shards()->Get(0)->file()) {
          return DataLossError("Checkpoint reply does not name one shard file");
        }
        const auto* f = reply.shards()->Get(0);
        *out = {f->file()->str(), f->bytes(), f->crc32(), std::chrono::microseconds(reply.snapshot_us()), {}, {}};
        if (reply.worker_steps()) out->worker_steps.assign(reply.worker_steps()->begin(), reply.worker_steps()->end());
        if (f->table_steps()) {  // 1.25
          for (const auto* t : *f->table_steps()) {
            if (!t->table_ids() || !t->steps()) continue;
            for (const uint64_t id : *t->table_ids()) {
              out->table_steps[id].assign(t->steps()->begin(), t->steps()->end());
            }
          }
        }
        out->placement_version = reply.placement_version();
        return Status::Ok();
      };
      engine_.Submit(op, member[static_cast<size_t>(s)] ? s : 0, Kind::Checkpoint, engine_.FinishHeader(fbb, h), {},
                     std::move(on_reply), options_.request_timeout);
    }
    return Handle(op);
  }

  Status CommitCheckpoint(int64_t step, std::span<const CheckpointShard> shards) override {
    // 1.17: the shards' map, which must be one (server 0 checks it is still its own).
    uint64_t map_version = shards.empty() ? 0 : shards[0].placement_version;
    for (size_t s = 1; s < shards.size(); ++s) {
      if (shards[s].placement_version == map_version) continue;
      return FailedPreconditionError("CommitCheckpoint of step " + std::to_string(step) +
                                     ": server 0 wrote its shard " +
                                     "under placement version " + std::to_string(map_version) + ", server " +
                                     std::to_string(s) + " under " + std::to_string(shards[s].placement_version) +
                                     ": a hand-over ran while they saved; take the checkpoint again");
    }
    auto op = engine_.NewOp();
    flatbuffers::FlatBufferBuilder fbb(128 + 96 * shards.size());
    std::vector<flatbuffers::Offset<wire::ShardFile>> files;
    for (const auto& f : shards) {  // with what each server knew of the workers' steps (1.13)
      auto name = fbb.CreateString(f.file);
      flatbuffers::Offset<flatbuffers::Vector<int64_t>> steps;
      if (!f.worker_steps.empty()) steps = fbb.CreateVector(f.worker_steps);
      auto tables = wire::TableStepsToWire(fbb, f.table_steps);  // (1.25)
      files.push_back(wire::CreateShardFile(fbb, name, f.bytes, f.crc32, steps, tables));
    }
    auto vec = fbb.CreateVector(files);
    // Each worker's steps: the lowest a server knew (one that holds nothing a worker pushes knew
    // none), -1 where none knew; none at all from servers before 1.11.
    std::vector<int64_t> steps;
    for (const auto& f : shards) {
      if (steps.size() < f.worker_steps.size()) steps.resize(f.worker_steps.size(), -1);
      for (size_t r = 0; r < f.worker_steps.size(); ++r) {
        const int64_t w = f.worker_steps[r];
        if (w >= 0 && (steps[r] < 0 || w < steps[r])) steps[r] = w;
      }
    }
    // A worker every step of which pushes to some server, and that no server knows a step of,
    // has pushed nothing: it has done 0 steps.
    for (int64_t& w : steps) w = std::max<int64_t>(w, 0);
    flatbuffers::Offset<flatbuffers::Vector<int64_t>> steps_vec;
    if (!steps.empty()) steps_vec = fbb.CreateVector(steps);
    auto h = engine_.BeginHeader(fbb, Kind::CommitCheckpoint);
    h.add_placement_version(map_version);
    h.add_step(step);
    h.add_shards(vec);
    if (!steps.empty()) h.add_worker_steps(steps_vec);
    engine_.Submit(op, 0, Kind::CommitCheckpoint, engine_.FinishHeader(fbb, h), {}, nullptr, options_.request_timeout);
    Status s = Handle(op).wait();
    if (s.ok()) last_committed_.store(step);
    return s;
  }

  StatusOr<std::map<std::string, int64_t>> ServerCounters(int server, bool digests) override {
    if (server < 0 || server >= num_servers()) return InvalidArgumentError("no server " + std::to_string(server));
    auto op = engine_.NewOp();
    auto result = std::make_shared<std::map<std::string, int64_t>>();
    flatbuffers::FlatBufferBuilder fbb(96);
    auto h = engine_.BeginHeader(fbb, Kind::Stats);
    if (digests) h.add_digests(true);
    OnReply on_reply = [result](const Header& reply, Frames&) -> Status {
      if (reply.counters()) {
        for (const auto* c : *reply.counters()) {
          if (c->name()) (*result)[c->name()->str()] = c->value();
        }
      }
      return Status::Ok();
    };
    engine_.Submit(op, server, Kind::Stats, engine_.FinishHeader(fbb, h), {}, std::move(on_reply),
                   options_.request_timeout);
    FERRY_RETURN_IF_ERROR(Handle(op).wait());
    return *result;
  }

 private:
  const ClientOptions options_;
  io::Engine engine_;                           // after options_, which it reads
  mutable Mutex placement_mu_;
  // Which server holds each chunk and id: the newest map a server sent (1.17), or the first.
  std::shared_ptr<const placement::Placement> placement_ ABSL_GUARDED_BY(placement_mu_);
  std::atomic<int64_t> barrier_generation_{0};  // the next collective's id (server 0 says the first)
  std::atomic<int64_t> restored_step_{0};       // server 0's restored checkpoint step
  std::atomic<int64_t> lowest_worker_step_{INT64_MAX};  // worker_step(): the lowest the servers said
  std::atomic<bool> some_step_not_restored_{false};      // a server's worker_step was not the checkpoint's
  std::atomic<bool> some_server_before_1_11_{false};     // a server said no worker_step at all
  std::atomic<bool> some_server_before_1_13_{false};     // a server that writes no delta chains into manifests
  std::atomic<int64_t> values_saturated_{0};
  std::atomic<uint64_t> next_call_{1};        // ids of push calls in pieces (1.10), never 0
  std::atomic<int64_t> first_collective_{0};  // server 0's next collective id at the handshake
  // 1.26: the workers that had left, by rank, with the step each left before (the Hello replies).
  mutable Mutex left_mu_;
  std::map<int, int64_t> workers_left_ ABSL_GUARDED_BY(left_mu_);
  std::map<int, int64_t> workers_rejoined_ ABSL_GUARDED_BY(left_mu_);  // 1.27: by rank, the step it joins again at
  // The joins_at this client's Hellos say (options_.joins_at; 1.27: wire::kWaitsToRejoin while it
  // waits to join again, then the step its join was handed for).
  std::atomic<int64_t> joins_at_{0};
  std::atomic<int64_t> rejoin_barrier_{-1};  // 1.27: server 0's Hello reply's rejoin_barrier
  static constexpr int64_t kMaxLeaveStep = int64_t{1} << 62;
  std::atomic<int64_t> last_committed_{-1};   // the step of the newest checkpoint this client committed
  // The servers this client has said Hello to (1.20: a server that joins the job later is greeted
  // when a map first names it), and the newest map whose servers it has greeted all.
  Mutex greet_mu_;
  std::vector<bool> greeted_ ABSL_GUARDED_BY(greet_mu_);
  std::atomic<uint64_t> greeted_version_{0};
  // Hellos in flight that GreetedMap did not wait for, with the servers each greets.
  std::vector<std::pair<Handle, std::vector<int>>> greetings_ ABSL_GUARDED_BY(greet_mu_);
  std::atomic<bool> greeting_{false};  // greetings_ holds some: GreetedMap looks whether they failed
  std::vector<bool> was_member_ ABSL_GUARDED_BY(greet_mu_);  // ShareMap's last map's servers
  Mutex hello_mu_;                     // GreetAsync's: marks a server greeted and submits its Hello, in one

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
};

}  // namespace

StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.servers.empty()) return InvalidArgumentError("ClientOptions.servers is empty: name at least one server");
  if (options.servers.size() > static_cast<size_t>(placement::kSlots)) {
    return InvalidArgumentError("ClientOptions.servers names " + std::to_string(options.servers.size()) +
                                " servers, more than the placement's " + std::to_string(placement::kSlots) + " slots");
  }
  if (options.num_workers < 1 || options.rank < 0 || options.rank >= options.num_workers) {
    return InvalidArgumentError("worker rank " + std::to_string(options.rank) + " is outside [0, " +
                                std::to_string(options.num_workers) + ")");
  }
  if (options.max_message_bytes < 4096) return InvalidArgumentError("max_message_bytes must be at least 4096");
  if (options.joins_at < 0 || options.joins_at >= wire::kWaitsToRejoin) {
    return InvalidArgumentError("joins_at " + std::to_string(options.joins_at) + " is outside [0, 2^62)");
  }
  if (options.waits_to_rejoin && (options.rank == 0 || options.joins_at > 0)) {
    return InvalidArgumentError(options.rank == 0 ? "waits_to_rejoin: worker 0 never leaves the job"
                                                  : "waits_to_rejoin and joins_at: the step a worker joins again at "
                                                    "is server 0's to say");
  }
  if (options.sparse_message_bytes < 0) return InvalidArgumentError("sparse_message_bytes must not be negative");
  if (options.dense_message_bytes < 0) return InvalidArgumentError("dense_message_bytes must not be negative");
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

Status AskMove(const AskMoveOptions& o) {
  const std::string where = "asking server 0 (" + o.server0 + ") for a move";
  if ((o.join >= 0) + (o.drain >= 0) + (o.leave_worker >= 0) + (o.rejoin_worker >= 0) != 1 || o.join < -1 ||
      o.drain < -1 || o.leave_worker < -1 || o.rejoin_worker < -1) {
    return InvalidArgumentError(where +
                                ": name one server, to join or to drain, or one worker to leave or to join "
                                "again");
  }
  if (o.server0.starts_with("inproc://") && !o.context) {
    return InvalidArgumentError(where + ": an inproc:// endpoint needs the servers' Context");
  }
  if (o.timeout.count() <= 0) return InvalidArgumentError(where + ": the timeout must be positive");
  const std::shared_ptr<Context> context = o.context ? o.context : Context::Create(1);
  FERRY_ASSIGN_OR_RETURN(zmq::socket_t sock, transport::MakeSocket(transport::Zmq(*context), zmq::socket_type::dealer));
  if (o.curve) FERRY_RETURN_IF_ERROR(curve::SetClientKeys(sock.handle(), *o.curve).WithContext(where));
  try {
    sock.connect(o.server0);
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError(where + ": cannot connect: " + e.what());
  }
  flatbuffers::FlatBufferBuilder fbb(128);
  wire::HeaderBuilder b(fbb);
  b.add_major(wire::kMajor);
  b.add_minor(wire::kMinor);
  b.add_kind(Kind::MoveAsk);
  b.add_rank(o.rank);
  b.add_request_id(1);
  if (o.join >= 0) b.add_move_join(o.join);
  if (o.drain >= 0) b.add_move_drain(o.drain);
  if (o.leave_worker >= 0) b.add_move_leave_worker(o.leave_worker);
  if (o.rejoin_worker >= 0) b.add_move_rejoin_worker(o.rejoin_worker);
  wire::FinishHeaderBuffer(fbb, b.Finish());
  Frames frames;
  frames.push_back(wire::ToFrame(fbb));
  // Blocking, but for the connection only: ZeroMQ queues the message until it connects.
  FERRY_RETURN_IF_ERROR(transport::Send(sock, frames, /*dontwait=*/false).WithContext(where));
  const auto deadline = std::chrono::steady_clock::now() + o.timeout;
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return DeadlineExceededError(where + ": no answer within " + std::to_string(o.timeout.count()) +
                                   " ms (is it running, at that address, and with these CURVE keys?)");
    }
    zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::min<std::chrono::milliseconds>(left, std::chrono::milliseconds(200)));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return UnavailableError(where + ": " + e.what());
    }
    if ((item.revents & ZMQ_POLLIN) == 0) continue;
    Frames reply;
    bool got = false, truncated = false;
    FERRY_RETURN_IF_ERROR(
        transport::RecvNonBlocking(sock, &reply, &got, wire::kMaxFrames, &truncated).WithContext(where));
    if (!got || reply.empty()) continue;
    const Header* h = nullptr;
    FERRY_RETURN_IF_ERROR(wire::VerifyHeader(reply[0], &h).WithContext(where + ": its answer"));
    // This socket sends one request: an Error of request id 0 is its refusal by a server that could
    // not read the header (one before 1.24 does not know the kind).
    if (h->kind() == Kind::Error && (h->request_id() == 0 || h->request_id() == 1)) {
      const std::string old =
          " (a server before protocol 1." + std::to_string(wire::kMoveAsksSinceMinor) + " does not know MoveAsk)";
      // A server of 1.24 or 1.25 reads no worker in it, and so no move.
      const std::string no_leaves =
          " (server 0 speaks protocol 1." + std::to_string(h->minor()) + ": a worker's " +
          (o.rejoin_worker >= 0 ? "join again is asked of 1." + std::to_string(wire::kRejoinsSinceMinor)
                                : "leave is asked of 1." + std::to_string(wire::kAskedLeavesSinceMinor)) +
          " and later)";
      const bool before_leaves = (o.leave_worker >= 0 && h->minor() < wire::kAskedLeavesSinceMinor) ||
                                 (o.rejoin_worker >= 0 && h->minor() < wire::kRejoinsSinceMinor);
      return wire::ErrorStatus(*h).WithContext(where + (h->request_id() == 0 ? old : before_leaves ? no_leaves : ""));
    }
    if (h->request_id() != 1 || h->request_kind() != Kind::MoveAsk) continue;  // (not ours)
    return Status::Ok();
  }
}

}  // namespace ferry
