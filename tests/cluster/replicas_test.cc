// Replicas (protocol 1.21, PROTOCOL.md "Replicas"), on in-process clusters: with replication 2
// each server forwards the updates it applies to its backup (the next server), which applies them
// to its replica of the primary's slots in the same order, so that after an async job with two
// workers pushing at once every replica holds its primary's bits; a push is answered only once
// the backup has its update, and fails naming the backup when it never confirms; a replica
// restored with its primary follows it on; what replicas cannot follow yet is refused.
#include <atomic>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <stdlib.h>

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
  o.failover_timeout = 1s;
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

// 1.23: a sync step's close is seen by pulls only once the backup has it (or was given up on):
// no worker computes from a step its server's replacement might not have.
TEST(Replicas, ASyncStepsPullsWaitForItsBackupToHaveItsClose) {
  ServerOptions o = Replicated(2);
  o.failover_timeout = 1s;  // a close never confirmed is given up on after 2.5 s (BackupTimeout)
  auto c = LocalCluster::Start(2, false, o);
  ASSERT_EQ(c.servers.size(), 2u);
  std::unique_ptr<Client> w[2] = {c.Connect(0, 2, NoHeartbeats()), c.Connect(1, 2, NoHeartbeats())};
  // One chunk, on server 0: its pushes and pulls go there alone (a stopped server 1 is seen by
  // nothing but server 0's wait for its backup).
  TableSpec spec = SgdTable("one", 4, Consistency::kSync);
  spec.chunk_elems = 4;
  for (int k = 0; placement::ChunkServer(TableId(spec.name), 0, 2) != 0; ++k) spec.name = "one" + std::to_string(k);
  for (auto& me : w) ASSERT_TRUE(me->Declare(spec).ok());
  const std::vector<float> g(4, 0.5f);
  std::vector<float> out(4);
  for (auto& me : w) ASSERT_TRUE(me->PushDense(spec.name, g, 0).wait(20s).ok());
  ASSERT_TRUE(w[0]->PullDense(spec.name, out, 1).wait(20s).ok());  // (step 0 closed and confirmed)
  ASSERT_TRUE(w[0]->PushDense(spec.name, g, 1).wait(20s).ok());    // held, and on the backup
  c.servers[1]->Stop();
  Handle closing = w[1]->PushDense(spec.name, g, 1);  // closes step 1 on server 0 at once
  Handle pull = w[0]->PullDense(spec.name, out, 2);
  Status s = pull.wait(1500ms);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;  // the backup has not confirmed the close
  s = closing.wait(20s);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("has not confirmed it"), std::string::npos) << s;
  s = pull.wait(20s);
  EXPECT_TRUE(s.ok()) << s;  // given up on: served
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

// Failover (1.22): one worker trains `steps` async steps from `first` (deterministic: one worker),
// pushing and pulling "w", "emb" and "big" as Train does; after step `replace_at` (if in range), the
// test calls `replace` while the worker goes on.
void TrainOne(const LocalCluster& c, int64_t first, int64_t steps, int64_t replace_at = -1,
              const std::function<void()>& replace = nullptr) {
  std::atomic<int64_t> done{first};
  std::thread replacer;
  if (replace) {
    replacer = std::thread([&] {
      while (done.load() <= replace_at) std::this_thread::sleep_for(1ms);
      replace();
    });
  }
  {
    std::unique_ptr<Client> me = c.Connect(0, 1, NoHeartbeats());
    ASSERT_NE(me, nullptr);
    for (const TableSpec& spec : {Dense(), Sparse(), Big()}) ASSERT_TRUE(me->Declare(spec).ok());
    std::vector<float> g(kDense), out(kDense), rows(16 * kDim), grads(16 * kDim), big(kBig);
    for (int64_t step = first; step < first + steps; ++step) {
      for (int64_t i = 0; i < kDense; ++i) g[static_cast<size_t>(i)] = Grad(0, step, i);
      const DenseIn in{"w", g};
      const DenseOut o{"w", out};
      Status s = me->PushPullDense(std::span(&in, 1), std::span(&o, 1), step).wait(60s);
      ASSERT_TRUE(s.ok()) << "step " << step << ": " << s;
      const std::vector<int64_t> ids = Ids(0, step);
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = Grad(0, step, static_cast<int64_t>(i) + 200);
      // Not waited for one by one: a replacement finds several in flight.
      Handle sparse = me->PushSparse("emb", ids, grads, step);
      for (int64_t i = 0; i < kBig; i += 997) big[static_cast<size_t>(i)] = Grad(0, step, i);
      Handle dense = me->PushDense("big", big, step);
      s = sparse.wait(60s);
      ASSERT_TRUE(s.ok()) << "step " << step << ": " << s;
      s = dense.wait(60s);
      ASSERT_TRUE(s.ok()) << "step " << step << ": " << s;
      s = me->PullSparse("emb", ids, rows, step + 1).wait(60s);
      ASSERT_TRUE(s.ok()) << "step " << step << ": " << s;
      done.store(step + 1);
    }
  }
  if (replacer.joinable()) replacer.join();
}

// Every server's digests of its own tables, by server and table.
std::vector<std::map<std::string, int64_t>> Digests(const LocalCluster& c, int workers, int rank = 0) {
  std::unique_ptr<Client> reader = c.Connect(rank, workers, NoHeartbeats());
  std::vector<std::map<std::string, int64_t>> all(c.servers.size());
  for (size_t s = 0; s < c.servers.size(); ++s) {
    auto counters = reader->ServerCounters(static_cast<int>(s), /*digests=*/true);
    // (A server spends a fifth of its time on digests at most: it says when to ask again.)
    for (int i = 0; i < 100 && counters.status().code() == StatusCode::kUnavailable; ++i) {
      std::this_thread::sleep_for(50ms);
      counters = reader->ServerCounters(static_cast<int>(s), /*digests=*/true);
    }
    EXPECT_TRUE(counters.ok()) << counters.status();
    if (!counters.ok()) continue;
    for (const auto& [name, v] : *counters) {
      if (name.starts_with("digest:") || name.starts_with("replica_digest:") || name.starts_with("replica_out_of"))
        all[s][name] = v;
    }
  }
  return all;
}

// A worker's new process keeps the gradient its predecessor pushed (its Hello marks it as sent;
// 1.23 dropped it, and from the replica too), on the primary and on the replica alike. With backup
// workers (2 of 3 gradients make a step) the step closes with it and the next worker's, the new
// process's push of the step taken for its predecessor's sent again: a replica that dropped it, or
// took the new push, would hold a step of other gradients (it says so: out of step, by the counts).
TEST(Replicas, AGradientAWorkersNewProcessRepeatsStaysOnThePrimaryAndTheReplica) {
  auto c = LocalCluster::Start(3, false, Replicated(3));
  ASSERT_EQ(c.servers.size(), 3u);
  TableSpec spec = Dense();
  spec.name = "sw";
  spec.consistency = Consistency::kSync;
  spec.replicas_to_aggregate = 2;
  std::unique_ptr<Client> w[3];
  for (int r = 0; r < 3; ++r) {
    w[r] = c.Connect(r, 3, NoHeartbeats());
    ASSERT_TRUE(w[r]->Declare(spec).ok());
  }
  auto g = [](int r) { return std::vector<float>(kDense, 0.25f * static_cast<float>(r + 1)); };
  ASSERT_TRUE(w[0]->PushDense("sw", g(0), 0).wait(20s).ok());  // held on every server, and its backup
  w[0].reset();
  ClientOptions again = NoHeartbeats();
  again.incarnation = 1;  // worker 0's next process: its Hello marks what the first had pushed as sent
  w[0] = c.Connect(0, 3, again);
  ASSERT_NE(w[0], nullptr);
  ASSERT_TRUE(w[0]->Declare(spec).ok());
  auto summed = [&](const char* counter) {
    int64_t n = 0;
    for (int s = 0; s < 3; ++s) {
      auto counters = w[1]->ServerCounters(s);
      EXPECT_TRUE(counters.ok()) << counters.status();
      if (counters.ok() && counters->contains(counter)) n += counters->at(counter);
    }
    return n;
  };
  const int64_t forwarded = summed("updates_forwarded"), replayed = summed("replayed_updates_skipped");
  ASSERT_TRUE(w[0]->PushDense("sw", g(2), 0).wait(20s).ok());  // taken for the first's sent again
  // Each chunk's held gradient went to its backup again before the answer (the first push's forward
  // might not have been confirmed, or lost).
  EXPECT_EQ(summed("replayed_updates_skipped"), replayed + kDense / 4);
  EXPECT_EQ(summed("updates_forwarded"), forwarded + kDense / 4);
  for (int r : {1, 2}) ASSERT_TRUE(w[r]->PushDense("sw", g(r), 0).wait(20s).ok());  // the step: 0 and 1
  std::vector<float> out(kDense);
  ASSERT_TRUE(w[1]->PullDense("sw", out, 1).wait(20s).ok());
  const auto d = Digests(c, 3, /*rank=*/1);  // (rank 0's first incarnation was replaced)
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_FALSE(d[(s + 1) % 3].contains("replica_out_of_step:sw")) << "server " << (s + 1) % 3;
    ASSERT_TRUE(d[s].contains("digest:sw") && d[(s + 1) % 3].contains("replica_digest:sw"));
    EXPECT_EQ(d[s].at("digest:sw"), d[(s + 1) % 3].at("replica_digest:sw")) << "server " << s << "'s replica";
  }
}

// A short folder for ipc endpoints (a socket's path has at most 107 bytes), removed at the end.
struct IpcDir {
  IpcDir() {
    char name[] = "/tmp/ffoXXXXXX";
    EXPECT_NE(::mkdtemp(name), nullptr);
    path = name;
  }
  ~IpcDir() { std::filesystem::remove_all(path); }
  std::string path;
};

// Three servers on ipc endpoints in `dir`, replication 2.
ServerOptions ReplicatedOn(const IpcDir& dir, int workers) {
  ServerOptions o = Replicated(workers);
  for (int s = 0; s < 3; ++s) o.peers.push_back("ipc://" + dir.path + "/ps" + std::to_string(s));
  o.failover_timeout = 30s;
  return o;
}

// Server 1 of `c` (started from `base`) replaced by one started with `recover`, as ferry-launch does.
void Replace1(LocalCluster& c, const ServerOptions& base) {
  ServerOptions o = base;
  o.bind = base.peers[1];
  o.rank = 1;
  o.num_servers = 3;
  o.context = c.context;
  o.compute_threads = 1;
  o.recover = true;
  auto replacement = Server::Start(o);
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  c.servers[1] = std::move(replacement).value();
}

TEST(Failover, AServerReplacedWithRecoverWhileAWorkerTrainsEndsWithTheBitsOfAJobThatLostNone) {
  constexpr int64_t kSteps = 24;
  // The job that lost no server.
  IpcDir ref_dir;
  auto ref = LocalCluster::Start(3, false, ReplicatedOn(ref_dir, 1));
  ASSERT_EQ(ref.servers.size(), 3u);
  TrainOne(ref, 0, kSteps);
  const auto want = Digests(ref, 1);

  IpcDir dir;
  const ServerOptions base = ReplicatedOn(dir, 1);
  auto c = LocalCluster::Start(3, false, base);
  ASSERT_EQ(c.servers.size(), 3u);
  TrainOne(c, 0, kSteps, /*replace_at=*/9, [&] {
    c.servers[1].reset();  // stopped, its sockets closed: the worker and server 0 lose it
    std::this_thread::sleep_for(200ms);  // pushes wait meanwhile
    Replace1(c, base);
  });
  const auto got = Digests(c, 1);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    EXPECT_FALSE(got[s].empty()) << "server " << s;
    EXPECT_EQ(got[s], want[s]) << "server " << s;  // its tables and its replica, bit for bit
  }
  // The replacement took the steps its predecessor had taken with its slots (it came after step 9):
  // a push of one of them, sent again (its reply lost with the old process), is skipped as a replay;
  // one of a later step is applied.
  std::vector<int64_t> ids;
  for (int64_t id = 0; ids.size() < 4; ++id) {
    if (placement::IdServer(id, 3) == 1) ids.push_back(id);
  }
  const std::vector<float> grads(ids.size() * kDim, 0.25f);
  const int64_t skipped = c.servers[1]->stats().counters.at("replayed_updates_skipped");
  for (const int64_t step : {int64_t{5}, kSteps}) {
    {
      std::unique_ptr<Client> me = c.Connect(0, 1, NoHeartbeats());
      ASSERT_TRUE(me->Declare(Sparse()).ok());
      const Status again = me->PushSparse("emb", ids, grads, step).wait(20s);
      ASSERT_TRUE(again.ok()) << again;
    }
    const bool replay = step < 10;
    EXPECT_EQ(c.servers[1]->stats().counters.at("replayed_updates_skipped"), skipped + 1) << "step " << step;
    EXPECT_EQ(Digests(c, 1)[1].at("digest:emb") == want[1].at("digest:emb"), replay) << "step " << step;
  }
  for (auto& server : c.servers) server->Stop();
  for (size_t s = 0; s < c.servers.size(); ++s) {
    for (const DenseUpdates& d : c.servers[s]->dense_updates()) {
      EXPECT_EQ(d.least, kSteps) << "server " << s << " table " << d.table;  // each push once: none lost
      EXPECT_EQ(d.most, kSteps) << "server " << s << " table " << d.table;   // none twice
    }
  }
}

// Sync tables (1.23): two workers train sync steps of a dense table (Adam) and a sparse one
// (Adagrad) from one thread, in a fixed order; server 1 is replaced (if `replace`) at three points
// of a step: with worker 0's gradient held and worker 1's not sent yet (its image must hold the
// first), with worker 0's sparse push in flight (sent again, or held already), and with every push
// of the step answered and the pulls not sent.
std::vector<std::map<std::string, int64_t>> TrainSync(bool replace, std::vector<DenseUpdates>* updates) {
  constexpr int64_t kSteps = 18;
  IpcDir dir;
  const ServerOptions base = ReplicatedOn(dir, 2);
  auto c = LocalCluster::Start(3, false, base);
  EXPECT_EQ(c.servers.size(), 3u);
  TableSpec dense = Dense(), sparse = Sparse();
  dense.name = "sw";
  sparse.name = "semb";
  dense.consistency = sparse.consistency = Consistency::kSync;
  std::unique_ptr<Client> w[2] = {c.Connect(0, 2, NoHeartbeats()), c.Connect(1, 2, NoHeartbeats())};
  for (auto& me : w) {
    EXPECT_TRUE(me->Declare(dense).ok());
    EXPECT_TRUE(me->Declare(sparse).ok());
  }
  auto kill = [&](int64_t step, int64_t at) {
    if (!replace || step != at) return;
    c.servers[1].reset();
    std::this_thread::sleep_for(200ms);
    Replace1(c, base);
  };
  std::vector<float> g[2], out(kDense), rows(16 * kDim), grads[2];
  for (int64_t step = 0; step < kSteps; ++step) {
    for (int r = 0; r < 2; ++r) {
      g[r].resize(kDense);
      for (int64_t i = 0; i < kDense; ++i) g[r][static_cast<size_t>(i)] = Grad(r, step, i);
      grads[r].resize(16 * kDim);
      for (size_t i = 0; i < grads[r].size(); ++i) grads[r][i] = Grad(r, step, static_cast<int64_t>(i) + 200);
    }
    // (The first failure ends the job: later steps would only wait for it.)
#define FERRY_OR_END(what, s)                                                     \
  if (Status e = (s); !e.ok()) {                                                  \
    ADD_FAILURE() << what << " step " << step << ": " << e;                       \
    return {};                                                                    \
  }
    FERRY_OR_END("worker 0's dense push", w[0]->PushDense("sw", g[0], step).wait(30s));
    kill(step, 4);  // worker 0's gradient held: the replacement's image holds it
    FERRY_OR_END("worker 1's dense push", w[1]->PushDense("sw", g[1], step).wait(30s));
    Handle in_flight = w[0]->PushSparse("semb", Ids(0, step), grads[0], step);
    kill(step, 9);
    FERRY_OR_END("worker 0's sparse push", in_flight.wait(30s));
    FERRY_OR_END("worker 1's sparse push", w[1]->PushSparse("semb", Ids(1, step), grads[1], step).wait(30s));
    kill(step, 14);  // the step closed everywhere: its pulls go to the replacement
    for (int r = 0; r < 2; ++r) {
      FERRY_OR_END("a dense pull", w[r]->PullDense("sw", out, step + 1).wait(30s));
      FERRY_OR_END("a sparse pull", w[r]->PullSparse("semb", Ids(r, step), rows, step + 1).wait(30s));
    }
#undef FERRY_OR_END
  }
  for (auto& me : w) me.reset();
  auto digests = Digests(c, 2);
  for (auto& server : c.servers) {
    server->Stop();
    for (const DenseUpdates& d : server->dense_updates()) updates->push_back(d);
  }
  return digests;
}

TEST(Failover, SyncStepsStayExactAcrossAReplacement) {
  std::vector<DenseUpdates> want_updates, got_updates;
  const auto want = TrainSync(false, &want_updates);
  const auto got = TrainSync(true, &got_updates);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    EXPECT_TRUE(got[s].contains("digest:sw") && got[s].contains("replica_digest:semb")) << "server " << s;
    EXPECT_EQ(got[s], want[s]) << "server " << s;  // its tables and its replica, bit for bit
  }
  ASSERT_FALSE(got_updates.empty());
  for (const DenseUpdates& d : got_updates) {
    EXPECT_EQ(d.least, 18) << d.table;  // every chunk: one update a step, none lost
    EXPECT_EQ(d.most, 18) << d.table;   // none twice
  }
}

// A push in flight when the server went, and one sent while its replacement is awaited (after the
// client's Hello to it), are each applied once: the first sent again, the second not.
TEST(Failover, WhatWasInFlightIsSentAgainAndWhatWasSentSinceIsNot) {
  std::vector<int64_t> ids;
  for (int64_t id = 0; ids.size() < 4; ++id) {
    if (placement::IdServer(id, 3) == 1) ids.push_back(id);  // server 1's alone: one request each
  }
  auto run = [&](bool replace) {
    IpcDir dir;
    const ServerOptions base = ReplicatedOn(dir, 1);
    auto c = LocalCluster::Start(3, false, base);
    EXPECT_EQ(c.servers.size(), 3u);
    std::unique_ptr<Client> me = c.Connect(0, 1, NoHeartbeats());
    EXPECT_TRUE(me->Declare(Sparse()).ok());
    auto grads = [&](int64_t step) { return std::vector<float>(ids.size() * kDim, 0.1f * static_cast<float>(step)); };
    for (int64_t step = 0; step < 3; ++step) EXPECT_TRUE(me->PushSparse("emb", ids, grads(step), step).wait(20s).ok());
    if (replace) c.servers[1].reset();
    const std::vector<float> g3 = grads(3), g4 = grads(4);
    Handle in_flight = me->PushSparse("emb", ids, g3, 3);
    std::this_thread::sleep_for(500ms);  // the client saw the connection close, and said Hello again
    Handle since = me->PushSparse("emb", ids, g4, 4);
    if (replace) Replace1(c, base);
    EXPECT_TRUE(in_flight.wait(30s).ok());
    EXPECT_TRUE(since.wait(30s).ok());
    me.reset();
    auto d = Digests(c, 1);
    return std::pair(d[1].at("digest:emb"), d[2].at("replica_digest:emb"));
  };
  const auto want = run(false);
  const auto got = run(true);
  EXPECT_EQ(got.first, want.first);    // server 1's rows: steps 0-4, each once
  EXPECT_EQ(got.second, want.second);  // and its replica on server 2
  EXPECT_EQ(got.first, got.second);
}

// An ssp pull on a replacement waits for the workers' clocks: it takes them from its peers, with
// who has finished, so that a worker whose Clock the dead server had taken is not waited for.
TEST(Failover, AReplacementKnowsTheWorkersClocksAndWhoFinished) {
  IpcDir dir;
  ServerOptions base = ReplicatedOn(dir, 2);
  base.max_wait = 5s;  // a pull that would wait for a clock that never comes fails soon
  auto c = LocalCluster::Start(3, false, base);
  ASSERT_EQ(c.servers.size(), 3u);
  TableSpec spec = SgdTable("ssp", kDense, Consistency::kSsp);
  spec.chunk_elems = 4;  // on every server
  spec.staleness = 0;
  // Worker 1 finished, and its process lives on (as at a job's closing barrier).
  std::unique_ptr<Client> done = c.Connect(1, 2, NoHeartbeats());
  ASSERT_TRUE(done->Declare(spec).ok());
  ASSERT_TRUE(done->Finish().ok());
  std::unique_ptr<Client> me = c.Connect(0, 2, NoHeartbeats());
  ASSERT_TRUE(me->Declare(spec).ok());
  std::vector<float> p(kDense), g(kDense, 0.1f);
  auto step = [&](int64_t clock) {
    Status s = me->PullDense("ssp", p, clock).wait(30s);
    ASSERT_TRUE(s.ok()) << "clock " << clock << ": " << s;
    ASSERT_TRUE(me->PushDense("ssp", g, clock).wait(30s).ok());
    ASSERT_TRUE(me->AdvanceClock(clock + 1).wait(30s).ok());
  };
  for (int64_t clock = 0; clock < 5; ++clock) step(clock);
  c.servers[1].reset();
  Replace1(c, base);
  // The finished worker's client meets the replacement (its Hello says it rejoins): still finished.
  std::vector<float> seen(kDense);
  ASSERT_TRUE(done->PullDense("ssp", seen, 0).wait(30s).ok());
  for (int64_t clock = 5; clock < 8; ++clock) step(clock);
}

TEST(Failover, ARecoverWithoutItsPeersFailsNamingThem) {
  IpcDir dir;
  ServerOptions o = ReplicatedOn(dir, 1);
  o.bind = o.peers[1];
  o.rank = 1;
  o.num_servers = 3;
  o.recover = true;
  o.failover_timeout = 1s;
  auto s = Server::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDeadlineExceeded) << s.status();
  EXPECT_NE(s.status().message().find("server 2 (" + o.peers[2] + ") sent no image of server 1's slots"),
            std::string::npos)
      << s.status();
  o.recover = true;
  o.restore = true;
  o.checkpoint_dir = dir.path;
  s = Server::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("exclusive"), std::string::npos) << s.status();
  o.restore = false;
  o.replication = 1;
  o.peers.clear();
  s = Server::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("it needs replication 2"), std::string::npos) << s.status();
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
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
              std::vector<std::string> frames, std::optional<std::vector<int64_t>> versions = std::nullopt,
              const std::vector<uint8_t>& ops = {}, std::optional<std::vector<int32_t>> counts = std::nullopt) {
    if (!counts) counts = std::vector<int32_t>(ops.size(), 1);  // (one held: a first hold's, or a close's)
    if (!versions) versions = std::vector<int64_t>(dense.size() + sparse.size(), 1);
    flatbuffers::FlatBufferBuilder fbb;
    flatbuffers::Offset<flatbuffers::Vector<const wire::DenseSlice*>> d;
    flatbuffers::Offset<flatbuffers::Vector<const wire::SparseSlice*>> sp;
    if (!dense.empty()) d = fbb.CreateVectorOfStructs(dense);
    if (!sparse.empty()) sp = fbb.CreateVectorOfStructs(sparse);
    flatbuffers::Offset<flatbuffers::Vector<int64_t>> v;
    if (!versions->empty()) v = fbb.CreateVector(*versions);
    flatbuffers::Offset<flatbuffers::Vector<uint8_t>> o;
    flatbuffers::Offset<flatbuffers::Vector<int32_t>> n;
    if (!ops.empty()) o = fbb.CreateVector(ops);
    if (!counts->empty()) n = fbb.CreateVector(*counts);
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(wire::Kind::Replicate);
    b.add_request_id(++id);
    b.add_rank(rank);
    b.add_step(3);
    b.add_incarnation(incarnation);
    if (!d.IsNull()) b.add_slices(d);
    if (!sp.IsNull()) b.add_sparse(sp);
    if (!v.IsNull()) b.add_versions(v);
    if (!o.IsNull()) b.add_sync_ops(o);
    if (!n.IsNull()) b.add_sync_counts(n);
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
  // A page of the image of server `whose`'s slots (1.22 Snapshot): its header's fields, and its bytes.
  struct Page {
    Status status;
    int64_t total = 0, position = 0;
    uint64_t epoch = 0;
    uint32_t incarnation = 0;
    std::string bytes;
  };
  Page Snapshot(int whose, int64_t position, uint64_t epoch, int64_t max_bytes) {
    flatbuffers::FlatBufferBuilder fbb;
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(wire::Kind::Snapshot);
    b.add_request_id(++id);
    b.add_server_rank(whose);
    b.add_position(position);
    b.add_epoch(epoch);
    b.add_max_bytes(max_bytes);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    transport::Frames f;
    f.push_back(wire::ToFrame(fbb));
    Page page;
    if (page.status = transport::Send(socket, f); !page.status.ok()) return page;
    transport::Frames reply;
    if (page.status = transport::Recv(socket, &reply); !page.status.ok()) return page;
    const wire::Header* h = nullptr;
    if (page.status = wire::VerifyHeader(reply[0], &h); !page.status.ok()) return page;
    if (h->kind() == wire::Kind::Error) {
      page.status = wire::ErrorStatus(*h);
      return page;
    }
    page.total = h->version();
    page.position = h->position();
    page.epoch = h->epoch();
    page.incarnation = h->incarnation();
    if (reply.size() > 1) page.bytes.assign(static_cast<const char*>(reply[1].data()), reply[1].size());
    return page;
  }
  zmq::socket_t socket;
  uint64_t id = 0;
  uint32_t incarnation = 0;  // the primary's (1.22)
};

TEST(Failover, AReplicasImageGoesInPagesAndFencesItsOldPrimary) {
  auto c = LocalCluster::Start(2, false, Replicated(1));
  ASSERT_EQ(c.servers.size(), 2u);
  std::unique_ptr<Client> me = c.Connect(0, 1, NoHeartbeats());
  ASSERT_TRUE(me->Declare(Dense()).ok());
  ASSERT_TRUE(me->PushDense("w", std::vector<float>(kDense, 0.25f), 0).wait(20s).ok());
  const uint64_t w = TableId("w");
  int64_t chunk0 = -1;
  for (int64_t k = 0; k < kDense / 4 && chunk0 < 0; ++k) {
    if (placement::ChunkServer(w, k, 2) == 0) chunk0 = k;
  }
  Primary p(*c.context, c.endpoints[1]);
  // Server 1 holds its own slots and server 0's replica, no other server's.
  EXPECT_EQ(p.Snapshot(5, 0, 0, 0).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Snapshot(1, 64, 77, 0).status.code(), StatusCode::kFailedPrecondition);  // no such image
  // Server 0's slots, as server 1's replica holds them, in pages of 100 bytes.
  Primary::Page first = p.Snapshot(0, 0, 0, 100);
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(first.bytes.size(), 100u);
  EXPECT_EQ(first.incarnation, 0u);
  std::string image = first.bytes;
  while (static_cast<int64_t>(image.size()) < first.total) {
    Primary::Page next = p.Snapshot(0, static_cast<int64_t>(image.size()), first.epoch, 100);
    ASSERT_TRUE(next.status.ok()) << next.status;
    ASSERT_EQ(next.position, static_cast<int64_t>(image.size()));
    ASSERT_FALSE(next.bytes.empty());
    image += next.bytes;
  }
  EXPECT_EQ(static_cast<int64_t>(image.size()), first.total);
  EXPECT_GT(first.total, 4 * kDense);  // the chunks' values and Adam's state, at least
  // The image went to server 0's replacement (incarnation 1): what its predecessor sends late is
  // refused, not applied; the replacement's updates are.
  const std::string four = Bytes(std::vector<float>(4, 1.0f));
  const auto before = *me->ServerCounters(1, /*digests=*/true);
  const wire::DenseSlice slice(w, chunk0, 4);
  Status late = p.Send(0, {slice}, {}, {four});
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late;
  EXPECT_NE(late.message().find("incarnation 0, which its replacement (incarnation 1) took over"), std::string::npos)
      << late;
  EXPECT_EQ(me->ServerCounters(1, true)->at("replica_digest:w"), before.at("replica_digest:w"));
  p.incarnation = 1;
  const Status next = p.Send(0, {slice}, {}, {four});
  EXPECT_TRUE(next.ok()) << next;
  std::this_thread::sleep_for(300ms);  // (digests: a fifth of the server's time at most)
  EXPECT_NE(me->ServerCounters(1, true)->at("replica_digest:w"), before.at("replica_digest:w"));
}

TEST(Replicas, AMalformedReplicateIsRefusedWholeAndChangesNothing) {
  auto c = LocalCluster::Start(2, false, Replicated(1));
  ASSERT_EQ(c.servers.size(), 2u);
  std::unique_ptr<Client> me = c.Connect(0, 1, NoHeartbeats());
  ASSERT_TRUE(me->Declare(Dense()).ok());
  ASSERT_TRUE(me->Declare(Sparse()).ok());
  TableSpec sync = Dense();
  sync.name = "sw";
  sync.consistency = Consistency::kSync;
  ASSERT_TRUE(me->Declare(sync).ok());
  // Server 1 keeps server 0's replica: a chunk of each, and ids of each.
  const uint64_t dense_id = TableId("w"), sparse_id = TableId("emb"), sync_id = TableId("sw");
  int64_t sync0 = 0;
  while (placement::ChunkServer(sync_id, sync0, 2) != 0) ++sync0;
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
    std::vector<uint8_t> ops = {};
    std::optional<std::vector<int32_t>> counts = std::nullopt;
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
      // 1.23: sync ops, one per part, each of a sync table, frames only with a gradient.
      {"sync ops for another count", 0, {{sync_id, sync0, 4}}, {}, {four}, StatusCode::kInvalidArgument,
       "2 sync ops for its 1 parts", std::nullopt, {1, 1}},
      {"an unknown sync op", 0, {{sync_id, sync0, 4}}, {}, {four}, StatusCode::kInvalidArgument, "not one of 0-4",
       std::nullopt, {5}},
      {"a sync op for an async table", 0, {{dense_id, chunk0, 4}}, {}, {four}, StatusCode::kInvalidArgument,
       "a table that is not sync", std::nullopt, {1}},
      {"an update applied to a sync table", 0, {{sync_id, sync0, 4}}, {}, {four}, StatusCode::kInvalidArgument,
       "for a sync table"},
      {"a close with a frame", 0, {{sync_id, sync0, 4}}, {}, {four}, StatusCode::kInvalidArgument, "payload frames",
       std::nullopt, {3}},
      {"a held gradient without its frame", 0, {}, {{sparse_id, kDim, 2}}, {}, StatusCode::kInvalidArgument,
       "payload frames", std::nullopt, {2}},
      {"sync ops without their counts", 0, {{sync_id, sync0, 4}}, {}, {four}, StatusCode::kInvalidArgument,
       "without one sync count", std::nullopt, {1}, std::vector<int32_t>{}},
  };
  for (const Case& k : cases) {
    const Status s = p.Send(k.rank, k.dense, k.sparse, k.frames, k.versions, k.ops, k.counts);
    EXPECT_EQ(s.code(), k.code) << k.what << ": " << s;
    EXPECT_NE(s.message().find(k.says), std::string::npos) << k.what << ": " << s;
  }
  const auto after = digests();
  EXPECT_EQ(after.at("replica_digest:w"), before.at("replica_digest:w"));
  EXPECT_EQ(after.at("replica_digest:emb"), before.at("replica_digest:emb"));
  EXPECT_EQ(after.at("replica_updates_applied"), before.at("replica_updates_applied"));
  EXPECT_FALSE(after.contains("replica_out_of_step:sw"));
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
  // A replica out of step cannot stand in for its primary (1.22): a replacement would lose updates.
  const Primary::Page refused = p.Snapshot(0, 0, 0, 0);
  EXPECT_EQ(refused.status.code(), StatusCode::kFailedPrecondition) << refused.status;
  EXPECT_NE(refused.status.message().find("out of step for table(s) 'w'"), std::string::npos) << refused.status;
  EXPECT_TRUE(p.Snapshot(1, 0, 0, 0).status.ok());  // its own slots it gives
  // 1.23: a sync table's hold is taken; a close by a primary that holds more gradients than the
  // replica (a hold missed) puts the replica out of step rather than close with fewer.
  const std::vector<int64_t> step0{0};
  s = p.Send(0, {{sync_id, sync0, 4}}, {}, {four}, step0, {1});
  EXPECT_TRUE(s.ok()) << s;
  s = p.Send(0, {{sync_id, sync0, 4}}, {}, {}, step0, {3}, std::vector<int32_t>{2});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("1 gradient(s) held here for step 0 and 2 on server 0 (a hold or drop missed)"),
            std::string::npos)
      << s;
  EXPECT_EQ(digests().at("replica_out_of_step:sw"), 1);
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
  Status s = me->Declare(SgdTable("sync", 8, Consistency::kSync));  // (1.23: replicas follow sync tables)
  EXPECT_TRUE(s.ok()) << s;
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
