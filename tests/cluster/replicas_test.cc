// Replicas (protocol 1.21, PROTOCOL.md "Replicas"), on in-process clusters: with replication 2
// each server forwards the updates it applies to its backup (the next server), which applies them
// to its replica of the primary's slots in the same order, so that after an async job with two
// workers pushing at once every replica holds its primary's bits; a push is answered only once
// the backup has its update, and fails naming the backup when it never confirms; a replica
// restored with its primary follows it on; what replicas cannot follow yet is refused.
#include <filesystem>
#include <limits>
#include <optional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/messages/placement.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "support/cluster.h"
#include "support/temp_dir.h"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kDense = 60;  // 15 chunks of 4: on every server
constexpr int64_t kDim = 4;
constexpr int kWorkers = 2;

TableSpec Dense() {
  TableSpec spec = SgdTable("w", kDense, Consistency::kAsync);
  spec.chunk_elems = 4;
  spec.optimizer.type = OptimizerType::kAdam;  // state the replica must follow too
  spec.optimizer.learning_rate = 0.01f;
  return spec;
}

TableSpec Sparse() {
  TableSpec spec = SgdSparseTable("emb", kDim, Consistency::kAsync);
  spec.optimizer.type = OptimizerType::kAdagrad;
  spec.optimizer.learning_rate = 0.1f;
  return spec;
}

// Pushed in several messages a server (128 KiB chunks, about 1 MiB a message), each replicated.
constexpr int64_t kBig = 3 * (1 << 18);
TableSpec Big() {
  TableSpec spec = SgdTable("big", kBig, Consistency::kAsync);
  spec.chunk_elems = 1 << 15;
  spec.optimizer.type = OptimizerType::kMomentum;
  spec.optimizer.learning_rate = 0.01f;
  return spec;
}

// Rows that travel as bfloat16: forwarded as the float32 the primary applied.
TableSpec Bf16() {
  TableSpec spec = Sparse();
  spec.name = "emb16";
  spec.wire = WireFormat::kBf16;
  return spec;
}

std::vector<int64_t> Ids(int rank, int64_t step) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 16; ++i) ids.push_back((step * 11 + rank * 5 + i * 7) % 90);
  return ids;
}

float Grad(int rank, int64_t step, int64_t i) {
  return static_cast<float>(((rank + 1) * 29 + step * 13 + i * 5) % 19) / 19.0f - 0.45f;
}

ServerOptions Replicated(int workers) {
  ServerOptions o;
  o.replication = 2;
  o.num_workers = workers;
  return o;
}

// Both workers train `steps` async steps at once: a push+pull of "w", a push of "emb" and a pull.
void Train(const LocalCluster& c, int64_t first, int64_t steps) {
  auto worker = [&](int rank) {
    std::unique_ptr<Client> me = c.Connect(rank, kWorkers, NoHeartbeats());
    ASSERT_NE(me, nullptr);
    ASSERT_TRUE(me->Declare(Dense()).ok());
    ASSERT_TRUE(me->Declare(Sparse()).ok());
    ASSERT_TRUE(me->Declare(Big()).ok());
    ASSERT_TRUE(me->Declare(Bf16()).ok());
    std::vector<float> g(kDense), out(kDense), rows(16 * kDim), grads(16 * kDim), big(kBig);
    for (int64_t step = first; step < first + steps; ++step) {
      for (int64_t i = 0; i < kDense; ++i) g[static_cast<size_t>(i)] = Grad(rank, step, i);
      const DenseIn in{"w", g};
      const DenseOut o{"w", out};
      Status s = me->PushPullDense(std::span(&in, 1), std::span(&o, 1), step).wait(20s);
      ASSERT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
      const std::vector<int64_t> ids = Ids(rank, step);
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = Grad(rank, step, static_cast<int64_t>(i) + 200);
      s = me->PushSparse("emb", ids, grads, step).wait(20s);
      ASSERT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
      s = me->PushSparse("emb16", ids, grads, step).wait(20s);
      ASSERT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
      if (step % 4 == rank) {
        for (int64_t i = 0; i < kBig; i += 997) big[static_cast<size_t>(i)] = Grad(rank, step, i);
        s = me->PushDense("big", big, step).wait(20s);
        ASSERT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
      }
      s = me->PullSparse("emb", ids, rows, step + 1).wait(20s);
      ASSERT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
    }
  };
  std::thread other(worker, 1);
  worker(0);
  other.join();
}

// Every server's counters with the tables' digests, asked by a client of `c`.
std::vector<std::map<std::string, int64_t>> Counters(const LocalCluster& c) {
  std::unique_ptr<Client> reader = c.Connect(0, kWorkers, NoHeartbeats());
  std::vector<std::map<std::string, int64_t>> all;
  for (size_t s = 0; s < c.servers.size(); ++s) {
    auto counters = reader->ServerCounters(static_cast<int>(s), /*digests=*/true);
    EXPECT_TRUE(counters.ok()) << counters.status();
    all.push_back(counters.ok() ? *counters : std::map<std::string, int64_t>{});
  }
  return all;
}

// Server s's tables hold the bits of server s+1's replica of them, and every update it applied
// (some, unless `restored` just now) went there.
void ExpectReplicasHoldTheirPrimariesBits(const std::vector<std::map<std::string, int64_t>>& counters,
                                          bool restored = false) {
  const size_t n = counters.size();
  for (size_t s = 0; s < n; ++s) {
    const auto& primary = counters[s];
    const auto& backup = counters[(s + 1) % n];
    for (const char* table : {"w", "emb", "emb16", "big"}) {
      const std::string name = table;
      ASSERT_TRUE(primary.contains("digest:" + name)) << "server " << s;
      ASSERT_TRUE(backup.contains("replica_digest:" + name)) << "server " << (s + 1) % n;
      EXPECT_EQ(primary.at("digest:" + name), backup.at("replica_digest:" + name))
          << "table " << name << ": server " << s << "'s replica on server " << (s + 1) % n;
      // Not a digest of nothing: each server holds its own part.
      EXPECT_NE(primary.at("digest:" + name), counters[(s + 1) % n].at("digest:" + name)) << "table " << name;
    }
    EXPECT_EQ(primary.at("updates_applied") > 0, !restored) << "server " << s;
    EXPECT_EQ(primary.at("updates_forwarded"), primary.at("updates_applied")) << "server " << s;
    EXPECT_EQ(backup.at("replica_updates_applied"), primary.at("updates_forwarded")) << "server " << s;
    EXPECT_EQ(primary.at("replica_errors"), 0) << "server " << s;
  }
}

TEST(Replicas, EveryReplicaHoldsItsPrimarysBitsAfterTwoWorkersPushedAtOnce) {
  auto c = LocalCluster::Start(3, false, Replicated(kWorkers));
  ASSERT_EQ(c.servers.size(), 3u);
  Train(c, 0, 40);
  ExpectReplicasHoldTheirPrimariesBits(Counters(c));
}

TEST(Replicas, APushIsAnsweredOnlyOnceItsBackupHasItAndFailsNamingABackupThatNeverConfirms) {
  ServerOptions o = Replicated(1);
  o.worker_timeout = 1s;
  auto c = LocalCluster::Start(2, false, o);
  ASSERT_EQ(c.servers.size(), 2u);
  std::unique_ptr<Client> me = c.Connect(0, 1, NoHeartbeats());
  ASSERT_TRUE(me->Declare(Sparse()).ok());
  // Ids of server 0 alone: the push goes to server 0, which forwards it to server 1.
  std::vector<int64_t> ids;
  for (int64_t id = 0; ids.size() < 8; ++id) {
    if (placement::IdServer(id, 2) == 0) ids.push_back(id);
  }
  const std::vector<float> grads(ids.size() * kDim, 0.5f);
  ASSERT_TRUE(me->PushSparse("emb", ids, grads, 0).wait(20s).ok());
  c.servers[1]->Stop();
  const Status s = me->PushSparse("emb", ids, grads, 1).wait(20s);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("its backup, server 1, has not confirmed it"), std::string::npos) << s;
  const auto counters = c.servers[0]->stats().counters;
  EXPECT_EQ(counters.at("updates_applied"), 2);  // applied here: only the confirmation is missing
  EXPECT_EQ(counters.at("updates_forwarded"), 2);
  EXPECT_EQ(counters.at("replica_errors"), 1);
}

TEST(Replicas, AReplicaRestoredWithItsPrimaryHoldsItsBitsAndFollowsItOn) {
  TempDir dir("replicas");
  ServerOptions o = Replicated(kWorkers);
  o.checkpoint_dir = dir.path().string();
  {
    auto c = LocalCluster::Start(3, false, o);
    Train(c, 0, 10);
    std::unique_ptr<Client> w0 = c.Connect(0, kWorkers, NoHeartbeats());
    ASSERT_TRUE(w0->Checkpoint(10).ok());
  }
  o.restore = true;
  auto c = LocalCluster::Start(3, false, o);
  ASSERT_EQ(c.servers.size(), 3u);
  ExpectReplicasHoldTheirPrimariesBits(Counters(c), /*restored=*/true);
  Train(c, 10, 10);
  ExpectReplicasHoldTheirPrimariesBits(Counters(c));
}

// A peer that sends a backup Replicate messages by hand, as a primary would.
struct Primary {
  Primary(Context& context, const std::string& backup) {
    auto made = transport::MakeSocket(transport::Zmq(context), zmq::socket_type::dealer);
    EXPECT_TRUE(made.ok());
    socket = std::move(*made);
    socket.set(zmq::sockopt::rcvtimeo, 10000);
    socket.set(zmq::sockopt::linger, 0);
    socket.connect(backup);
  }
  // The backup's answer: OK, or its error. `versions`: each part's before the update (none: 1 each).
  Status Send(int rank, const std::vector<wire::DenseSlice>& dense, const std::vector<wire::SparseSlice>& sparse,
              std::vector<std::string> frames, std::optional<std::vector<int64_t>> versions = std::nullopt) {
    if (!versions) versions = std::vector<int64_t>(dense.size() + sparse.size(), 1);
    flatbuffers::FlatBufferBuilder fbb;
    flatbuffers::Offset<flatbuffers::Vector<const wire::DenseSlice*>> d;
    flatbuffers::Offset<flatbuffers::Vector<const wire::SparseSlice*>> sp;
    if (!dense.empty()) d = fbb.CreateVectorOfStructs(dense);
    if (!sparse.empty()) sp = fbb.CreateVectorOfStructs(sparse);
    flatbuffers::Offset<flatbuffers::Vector<int64_t>> v;
    if (!versions->empty()) v = fbb.CreateVector(*versions);
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(wire::Kind::Replicate);
    b.add_request_id(++id);
    b.add_rank(rank);
    b.add_step(3);
    if (!d.IsNull()) b.add_slices(d);
    if (!sp.IsNull()) b.add_sparse(sp);
    if (!v.IsNull()) b.add_versions(v);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    transport::Frames f;
    f.push_back(wire::ToFrame(fbb));
    for (const std::string& frame : frames) f.emplace_back(frame.data(), frame.size());
    FERRY_RETURN_IF_ERROR(transport::Send(socket, f));
    transport::Frames reply;
    FERRY_RETURN_IF_ERROR(transport::Recv(socket, &reply));
    const wire::Header* h = nullptr;
    FERRY_RETURN_IF_ERROR(wire::VerifyHeader(reply[0], &h));
    EXPECT_EQ(h->request_id(), id);
    return h->kind() == wire::Kind::Error ? wire::ErrorStatus(*h) : Status::Ok();
  }
  zmq::socket_t socket;
  uint64_t id = 0;
};

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(Replicas, AMalformedReplicateIsRefusedWholeAndChangesNothing) {
  auto c = LocalCluster::Start(2, false, Replicated(1));
  ASSERT_EQ(c.servers.size(), 2u);
  std::unique_ptr<Client> me = c.Connect(0, 1, NoHeartbeats());
  ASSERT_TRUE(me->Declare(Dense()).ok());
  ASSERT_TRUE(me->Declare(Sparse()).ok());
  // Server 1 keeps server 0's replica: a chunk of each, and ids of each.
  const uint64_t dense_id = TableId("w"), sparse_id = TableId("emb");
  int64_t chunk0 = -1, chunk1 = -1;
  for (int64_t k = 0; k < kDense / 4; ++k) {
    (placement::ChunkServer(dense_id, k, 2) == 0 ? chunk0 : chunk1) = k;
  }
  ASSERT_GE(chunk0, 0);
  ASSERT_GE(chunk1, 0);
  std::vector<int64_t> ids0, ids1;
  for (int64_t id = 0; ids0.size() < 2 || ids1.size() < 2; ++id) {
    (placement::IdServer(id, 2) == 0 ? ids0 : ids1).push_back(id);
  }
  ids0.resize(2);
  ids1.resize(2);
  // The replicas exist (a replica's table is made by its first update), equal to their primaries.
  ASSERT_TRUE(me->PushDense("w", std::vector<float>(kDense, 0.25f), 0).wait(20s).ok());
  ASSERT_TRUE(me->PushSparse("emb", ids0, std::vector<float>(2 * kDim, 0.5f), 0).wait(20s).ok());
  auto digests = [&] { return *me->ServerCounters(1, /*digests=*/true); };
  const auto before = digests();
  EXPECT_EQ(before.at("replica_digest:w"), me->ServerCounters(0, true)->at("digest:w"));
  const std::string four = Bytes(std::vector<float>(4, 1.0f)), rows = Bytes(std::vector<float>(2 * kDim, 1.0f));
  Primary p(*c.context, c.endpoints[1]);
  struct Case {
    const char* what;
    int rank;
    std::vector<wire::DenseSlice> dense;
    std::vector<wire::SparseSlice> sparse;
    std::vector<std::string> frames;
    StatusCode code;
    const char* says;
    std::optional<std::vector<int64_t>> versions = std::nullopt;
  };
  std::vector<float> nan(4, 1.0f);
  nan[2] = std::numeric_limits<float>::quiet_NaN();
  const Case cases[] = {
      {"a chunk of its own", 0, {{dense_id, chunk1, 4}}, {}, {four}, StatusCode::kFailedPrecondition,
       "is not server 0's"},
      {"no frame", 0, {{dense_id, chunk0, 4}}, {}, {}, StatusCode::kInvalidArgument, "payload frames"},
      {"a short frame", 0, {{dense_id, chunk0, 4}}, {}, {four.substr(4)}, StatusCode::kInvalidArgument, "carries"},
      {"an unknown table", 0, {{12345, chunk0, 4}}, {}, {four}, StatusCode::kFailedPrecondition, "has no table"},
      {"a worker outside the job", 1, {{dense_id, chunk0, 4}}, {}, {four}, StatusCode::kInvalidArgument, "outside"},
      {"both kinds", 0, {{dense_id, chunk0, 4}}, {{sparse_id, kDim, 2}}, {four, Bytes(ids0), rows},
       StatusCode::kInvalidArgument, "one kind"},
      {"ids of its own", 0, {}, {{sparse_id, kDim, 2}}, {Bytes(ids1), rows}, StatusCode::kFailedPrecondition,
       "belongs to server 1"},
      {"another dim", 0, {}, {{sparse_id, kDim + 1, 2}}, {Bytes(ids0), rows}, StatusCode::kInvalidArgument, "dim"},
      // Checked whole: a good chunk beside a bad one applies neither.
      {"a good part and a bad one", 0, {{dense_id, chunk0, 4}, {dense_id, chunk1, 4}}, {}, {four, four},
       StatusCode::kFailedPrecondition, "is not server 0's"},
      {"no versions", 0, {{dense_id, chunk0, 4}}, {}, {four}, StatusCode::kInvalidArgument, "one version",
       std::vector<int64_t>{}},
      {"NaN", 0, {{dense_id, chunk0, 4}}, {}, {Bytes(nan)}, StatusCode::kInvalidArgument, "NaN"},
      {"a count that overflows", 0, {}, {{sparse_id, kDim, (int64_t{1} << 61) + 1}}, {Bytes(ids0), rows},
       StatusCode::kInvalidArgument, "carries"},
      {"a negative count", 0, {}, {{sparse_id, kDim, -2}}, {Bytes(ids0), rows}, StatusCode::kInvalidArgument,
       "carries"},
      {"a chunk twice", 0, {{dense_id, chunk0, 4}, {dense_id, chunk0, 4}}, {}, {four, four},
       StatusCode::kInvalidArgument, "appears twice"},
  };
  for (const Case& k : cases) {
    const Status s = p.Send(k.rank, k.dense, k.sparse, k.frames, k.versions);
    EXPECT_EQ(s.code(), k.code) << k.what << ": " << s;
    EXPECT_NE(s.message().find(k.says), std::string::npos) << k.what << ": " << s;
  }
  const auto after = digests();
  EXPECT_EQ(after.at("replica_digest:w"), before.at("replica_digest:w"));
  EXPECT_EQ(after.at("replica_digest:emb"), before.at("replica_digest:emb"));
  EXPECT_EQ(after.at("replica_updates_applied"), before.at("replica_updates_applied"));
  // And one that is well formed changes the replica (which is then no longer its primary's).
  ASSERT_TRUE(p.Send(0, {{dense_id, chunk0, 4}}, {}, {four}).ok());
  EXPECT_NE(digests().at("replica_digest:w"), before.at("replica_digest:w"));
  EXPECT_EQ(digests().at("replica_updates_applied"), before.at("replica_updates_applied") + 1);
  // An update for another version than the replica's (one lost, or sent twice): the replica is out
  // of step, said in Stats, and takes nothing more of that table, even at the right version.
  Status s = p.Send(0, {{dense_id, chunk0, 4}}, {}, {four}, std::vector<int64_t>{1});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("chunk " + std::to_string(chunk0) + " at version 2 here and 1 on server 0"),
            std::string::npos)
      << s;
  s = p.Send(0, {{dense_id, chunk0, 4}}, {}, {four}, std::vector<int64_t>{2});
  EXPECT_NE(s.message().find("since: table 'w' chunk"), std::string::npos) << s;
  EXPECT_EQ(digests().at("replica_out_of_step:w"), 1);
  EXPECT_FALSE(digests().contains("replica_out_of_step:emb"));
  // A server without replication takes none.
  auto plain = LocalCluster::Start(1);
  std::unique_ptr<Client> other = plain.Connect(0, 1, NoHeartbeats());
  ASSERT_TRUE(other->Declare(Dense()).ok());
  Primary q(*plain.context, plain.endpoints[0]);
  s = q.Send(0, {{dense_id, 0, 4}}, {}, {four});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("keeps no replica"), std::string::npos) << s;
}

TEST(Replicas, WhatReplicasCannotFollowYetIsRefused) {
  ServerOptions o = Replicated(1);
  o.bind = "inproc://replicas-refused";
  o.num_servers = 1;
  o.peers = {o.bind};
  EXPECT_EQ(Server::Start(o).status().code(), StatusCode::kInvalidArgument);  // no other server to back it up
  o.num_servers = 2;
  EXPECT_EQ(Server::Start(o).status().code(), StatusCode::kInvalidArgument);  // one peer for two servers
  o.peers = {o.bind, "udp://10.0.0.1:5"};
  EXPECT_EQ(Server::Start(o).status().code(), StatusCode::kInvalidArgument);
  o.peers = {o.bind, o.bind};
  o.active_servers = 1;
  EXPECT_EQ(Server::Start(o).status().code(), StatusCode::kUnimplemented);

  auto c = LocalCluster::Start(2, false, Replicated(1));
  std::unique_ptr<Client> me = c.Connect(0, 1, NoHeartbeats());
  Status s = me->Declare(SgdTable("sync", 8, Consistency::kSync));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("do not follow a sync table"), std::string::npos) << s;
  TableSpec bounded = Sparse();
  bounded.max_rows = 100;
  s = me->Declare(bounded);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  ASSERT_TRUE(me->Declare(Dense()).ok());
  std::vector<uint16_t> owners(placement::kSlots, 0);
  s = me->MoveSlots(2, owners, 0);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s;
}

}  // namespace
}  // namespace ferry::test
