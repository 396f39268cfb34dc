// Placement versions (protocol 1.17, PROTOCOL.md "Placement versions"), on in-process clusters:
// slots move between the servers of a running sync job (all of server 1's to server 0, then back)
// and the job ends with the bits of one whose placement never changed; the other worker's
// requests placed by the old map are answered "moved" and sent again by the new one; a hand-over
// that would lose an update is refused and changes nothing, as is one while a client that cannot
// follow a new map (before 1.17) is connected.
#include <barrier>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ferry/messages/placement.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "support/cluster.h"
#include "support/temp_dir.h"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int64_t kDense = 40;  // 10 chunks of 4: on both servers
constexpr int64_t kDim = 4;
constexpr int kWorkers = 2;

TableSpec Dense() {
  TableSpec spec = SgdTable("w", kDense, Consistency::kSync);
  spec.chunk_elems = 4;
  spec.optimizer.type = OptimizerType::kAdam;  // state that must move with the values
  spec.optimizer.learning_rate = 0.01f;
  return spec;
}

TableSpec Sparse() {
  TableSpec spec = SgdSparseTable("emb", kDim, Consistency::kSync);
  spec.optimizer.type = OptimizerType::kAdagrad;
  spec.optimizer.learning_rate = 0.1f;
  return spec;
}

// Worker `rank`'s ids of `step`: 12 of 0..59, on both servers, repeating across steps.
std::vector<int64_t> Ids(int rank, int64_t step) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 12; ++i) ids.push_back((step * 7 + rank * 13 + i * 5) % 60);
  return ids;
}

float Grad(int rank, int64_t step, int64_t i) {
  return static_cast<float>(((rank + 1) * 31 + step * 17 + i * 7) % 23) / 23.0f - 0.4f;
}

// Servers of a job of `workers` that write checkpoints into `dir`.
ServerOptions WithFolder(const fs::path& dir, int workers) {
  ServerOptions o;
  o.checkpoint_dir = dir.string();
  o.num_workers = workers;
  return o;
}

struct Outcome {
  std::vector<float> dense, rows;
  int64_t moved_answered = 0;
  uint64_t w1_version = 0;
};

// Trains `steps` sync steps with two workers; at each step of `moves` (after every worker's pull
// of it), worker 0 checkpoints, and with `move` set moves the slots to that entry's map between
// two barriers (without: the same checkpoint and barriers, nothing moved).
Outcome Train(const fs::path& dir, int64_t steps, const std::vector<std::pair<int64_t, std::vector<uint16_t>>>& moves,
              bool move) {
  ServerOptions o = WithFolder(dir, kWorkers);
  auto c = LocalCluster::Start(2, false, o);
  std::vector<std::unique_ptr<Client>> w;
  for (int r = 0; r < kWorkers; ++r) w.push_back(c.Connect(r, kWorkers));
  for (auto& client : w) {
    EXPECT_TRUE(client->Declare(Dense()).ok());
    EXPECT_TRUE(client->Declare(Sparse()).ok());
  }
  uint64_t version = 1;
  auto worker = [&](int rank) {
    Client& me = *w[static_cast<size_t>(rank)];
    std::vector<float> g(kDense), out(kDense), rows(12 * kDim), grads(12 * kDim);
    for (int64_t step = 0; step < steps; ++step) {
      for (const auto& [at, owners] : moves) {
        if (at != step) continue;
        if (rank == 0) {
          EXPECT_TRUE(me.Checkpoint(step).ok());
        }
        EXPECT_TRUE(me.Barrier().ok());
        if (rank == 0 && move) {
          const Status s = me.MoveSlots(++version, owners, step);
          EXPECT_TRUE(s.ok()) << s;
        }
        EXPECT_TRUE(me.Barrier().ok());
      }
      for (int64_t i = 0; i < kDense; ++i) g[static_cast<size_t>(i)] = Grad(rank, step, i);
      const std::vector<int64_t> ids = Ids(rank, step);
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = Grad(rank, step, static_cast<int64_t>(i) + 100);
      Handle push = me.PushDense("w", g, step);
      Status s;
      if (rank == 0) {
        s = push.wait(20s);
        EXPECT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
        s = me.PullDense("w", out, step + 1).wait(20s);
      } else {
        // A view, waited for before the push: after a move both are answered "moved", and the
        // pull, sent again, waits on the servers for this very push, which goes again first (the
        // pull's waiter sends it). The view's one object is filled by the re-run.
        std::shared_ptr<const PulledDense> view;
        const std::string_view names[] = {"w"};
        s = me.PullDenseView(names, step + 1, &view).wait(20s);
        if (s.ok()) s = view->CopyTo(0, out);
        EXPECT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
        s = push.wait(20s);
      }
      EXPECT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
      s = me.PushSparse("emb", ids, grads, step).wait(20s);
      EXPECT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
      s = me.PullSparse("emb", ids, rows, step + 1).wait(20s);
      EXPECT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
    }
  };
  std::thread t1(worker, 1);
  worker(0);
  t1.join();
  Outcome result;
  result.dense.resize(kDense);
  EXPECT_TRUE(w[0]->PullDense("w", result.dense, steps).wait(20s).ok());
  std::vector<int64_t> all(60);
  for (int64_t i = 0; i < 60; ++i) all[static_cast<size_t>(i)] = i;
  result.rows.resize(60 * kDim);
  EXPECT_TRUE(w[0]->PullSparse("emb", all, result.rows, steps).wait(20s).ok());
  for (const auto& server : c.servers) result.moved_answered += server->stats().counters.at("moved_answered");
  result.w1_version = w[1]->placement_version();
  return result;
}

TEST(PlacementVersions, SlotsMovedWhileASyncJobTrainsLeaveItsBitsAsTheyWere) {
  TempDir moved_dir("placement-moved"), still_dir("placement-still");
  const placement::Placement first = placement::Placement::First(2);
  const placement::Placement drained = *first.Drain(1);  // every slot on server 0
  // Step 3: all of server 1's slots to server 0; step 6: back to the first map's.
  const std::vector<std::pair<int64_t, std::vector<uint16_t>>> moves = {{3, drained.Owners()},
                                                                        {6, first.Owners()}};
  const Outcome moved = Train(moved_dir.path(), 9, moves, true);
  const Outcome still = Train(still_dir.path(), 9, moves, false);
  ASSERT_EQ(moved.dense.size(), still.dense.size());
  EXPECT_EQ(std::memcmp(moved.dense.data(), still.dense.data(), moved.dense.size() * sizeof(float)), 0)
      << "dense values differ from the job that never moved";
  EXPECT_EQ(std::memcmp(moved.rows.data(), still.rows.data(), moved.rows.size() * sizeof(float)), 0)
      << "sparse rows differ from the job that never moved";
  EXPECT_NE(moved.dense, std::vector<float>(kDense, 0.0f));  // it trained
  // Worker 1 placed its first requests after each move by the old map: answered "moved", sent
  // again by the new one, which it took from the answer.
  EXPECT_GT(moved.moved_answered, 0);
  EXPECT_EQ(moved.w1_version, 3u);
  EXPECT_EQ(still.moved_answered, 0);
  EXPECT_EQ(still.w1_version, 1u);
}

// Servers leaving (protocol 1.20, PROTOCOL.md "Servers leaving"): a sync job of 2 workers on 3
// servers over tcp, each with exit_when_drained, trains 9 steps; with `move`, worker 0 drains
// server 2 at step 3 (its checkpoint, between two barriers). Server 2 stays while worker 1, which
// holds the old map, is connected; it leaves once worker 1 has been answered "moved", and is
// then stopped; the job trains on, and checkpoints at step 6 with server 2's shard written,
// empty, by server 0.
// Worker `rank`'s sync step `step`: its pushes and pulls of "w" and "emb", each waited for.
void SyncStep(Client& me, int rank, int64_t step) {
  std::vector<float> g(kDense), out(kDense), rows(12 * kDim), grads(12 * kDim);
  for (int64_t i = 0; i < kDense; ++i) g[static_cast<size_t>(i)] = Grad(rank, step, i);
  const std::vector<int64_t> ids = Ids(rank, step);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = Grad(rank, step, static_cast<int64_t>(i) + 100);
  Status s = me.PushDense("w", g, step).wait(20s);
  EXPECT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
  s = me.PullDense("w", out, step + 1).wait(20s);
  EXPECT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
  s = me.PushSparse("emb", ids, grads, step).wait(20s);
  EXPECT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
  s = me.PullSparse("emb", ids, rows, step + 1).wait(20s);
  EXPECT_TRUE(s.ok()) << "worker " << rank << " step " << step << ": " << s;
}

// After `steps` steps: the values of "w" and of rows 0..59 of "emb" (worker 0 pulls them); then
// every worker finishes.
void Finish(std::vector<std::unique_ptr<Client>>& w, int64_t steps, std::vector<float>* dense,
            std::vector<float>* rows) {
  dense->resize(kDense);
  EXPECT_TRUE(w[0]->PullDense("w", *dense, steps).wait(20s).ok());
  std::vector<int64_t> all(60);
  for (int64_t i = 0; i < 60; ++i) all[static_cast<size_t>(i)] = i;
  rows->resize(60 * kDim);
  EXPECT_TRUE(w[0]->PullSparse("emb", all, *rows, steps).wait(20s).ok());
  for (auto& client : w) EXPECT_TRUE(client->Finish().ok());
}

struct LeftOutcome {
  std::vector<float> dense, rows;
  bool left_while_a_worker_held_the_old_map = false;
  bool left = false;
};

LeftOutcome TrainLeaving(const fs::path& dir, bool move) {
  ServerOptions o = WithFolder(dir, kWorkers);
  o.exit_when_drained = true;
  auto c = LocalCluster::Start(3, /*tcp=*/true, o);
  std::vector<std::unique_ptr<Client>> w;
  for (int r = 0; r < kWorkers; ++r) w.push_back(c.Connect(r, kWorkers));
  for (auto& client : w) {
    EXPECT_TRUE(client->Declare(Dense()).ok());
    EXPECT_TRUE(client->Declare(Sparse()).ok());
  }
  LeftOutcome result;
  const placement::Placement drained = *placement::Placement::First(3).Drain(2);
  constexpr int64_t kSteps = 9;
  auto worker = [&](int rank) {
    Client& me = *w[static_cast<size_t>(rank)];
    for (int64_t step = 0; step < kSteps; ++step) {
      if (step == 3) {
        if (rank == 0) {
          EXPECT_TRUE(me.Checkpoint(step).ok());
        }
        EXPECT_TRUE(me.Barrier().ok());
        if (rank == 0 && move) {
          const Status s = me.MoveSlots(2, drained.Owners(), step);
          EXPECT_TRUE(s.ok()) << s;
          // Worker 1 waits in the barrier with the first map, connected to server 2 (longer than
          // the 2 s a server waits once every worker holds the map).
          std::this_thread::sleep_for(3s);
          result.left_while_a_worker_held_the_old_map = c.servers[2]->left();
        }
        EXPECT_TRUE(me.Barrier().ok());
      }
      if (step == 6 && rank == 0 && move) {
        // Worker 1 has pushed steps 3 to 5 since: it was answered "moved" at step 3.
        for (int i = 0; i < 2000 && !c.servers[2]->left(); ++i) std::this_thread::sleep_for(10ms);
        result.left = c.servers[2]->left();
        c.servers[2]->Stop();  // as ferry-ps exits
      }
      if (step == 6 && rank == 0) {
        EXPECT_TRUE(me.Checkpoint(step).ok());
      }
      SyncStep(me, rank, step);
    }
  };
  std::thread t1(worker, 1);
  worker(0);
  t1.join();
  Finish(w, kSteps, &result.dense, &result.rows);  // (Finish is not sent to server 2, which is gone)
  return result;
}

TEST(PlacementVersions, ADrainedServerLeavesOnceNoWorkerHoldsTheOldMapAndTheJobKeepsItsBits) {
  TempDir left_dir("placement-left"), still_dir("placement-left-still");
  const LeftOutcome left = TrainLeaving(left_dir.path(), true);
  const LeftOutcome still = TrainLeaving(still_dir.path(), false);
  EXPECT_FALSE(left.left_while_a_worker_held_the_old_map);
  EXPECT_TRUE(left.left);
  ASSERT_EQ(left.dense.size(), still.dense.size());
  EXPECT_EQ(std::memcmp(left.dense.data(), still.dense.data(), left.dense.size() * sizeof(float)), 0)
      << "dense values differ from the job whose server set never changed";
  EXPECT_EQ(std::memcmp(left.rows.data(), still.rows.data(), left.rows.size() * sizeof(float)), 0)
      << "sparse rows differ from the job whose server set never changed";
  // Step 6's manifest lists a shard per server: server 2's, written by server 0, holds no table.
  nlohmann::json manifest;
  std::ifstream(left_dir.path() / "MANIFEST-00000000000000000006") >> manifest;
  ASSERT_EQ(manifest.at("shards").size(), 3u) << manifest.dump();
  const auto& shard2 = manifest.at("shards").at(2);
  EXPECT_EQ(shard2.at("file"), "step-00000000000000000006-shard-00002-of-00003.ckpt");
  EXPECT_LT(shard2.at("bytes").get<int64_t>(), 100) << manifest.dump();
  EXPECT_EQ(shard2.at("bytes").get<int64_t>(),
            static_cast<int64_t>(fs::file_size(left_dir.path() / shard2.at("file").get<std::string>())));

  // Restored, server 2 leaves at once (its map gives it nothing); a client that connects to the
  // restored job speaks to servers 0 and 1 alone, and finds the values of step 6's checkpoint.
  ServerOptions o = WithFolder(left_dir.path(), kWorkers);
  o.exit_when_drained = true;
  o.restore = true;
  auto c = LocalCluster::Start(3, /*tcp=*/true, o);
  EXPECT_FALSE(c.servers[0]->left());
  EXPECT_FALSE(c.servers[1]->left());
  EXPECT_TRUE(c.servers[2]->left());
  c.servers[2]->Stop();
  for (int r = 0; r < kWorkers; ++r) {
    auto w = c.Connect(r, kWorkers);
    ASSERT_EQ(w->placement_version(), 2u);
    ASSERT_TRUE(w->Declare(Dense()).ok());
    ASSERT_TRUE(w->Declare(Sparse()).ok());
    std::vector<float> dense(kDense);
    EXPECT_TRUE(w->PullDense("w", dense, 6).wait(20s).ok());
    EXPECT_NE(dense, std::vector<float>(kDense, 0.0f));
  }
}

// Servers joining (1.20): a sync job of 2 workers whose first map gives slots to servers 0 and 1
// of 3 (ServerOptions::active_servers); no client speaks to server 2 until worker 0 gives it a
// fair share at step 3 (MoveSlots by Placement::Grow(2), after it says Hello there and declares
// the tables); worker 1 learns the map from a "moved" answer and says Hello to it before its
// next request; at step 6 it is drained again and leaves. The job ends with the bits of the job
// of 2 servers whose set never changed.
struct JoinOutcome {
  std::vector<float> dense, rows;
  int64_t spoken_to_before = -1, took_after = -1;
  bool left = false;
};

JoinOutcome TrainJoining(const fs::path& dir, bool join) {
  ServerOptions o = WithFolder(dir, kWorkers);
  o.exit_when_drained = true;
  if (join) o.active_servers = 2;
  auto c = LocalCluster::Start(join ? 3 : 2, /*tcp=*/true, o);
  std::vector<std::unique_ptr<Client>> w;
  for (int r = 0; r < kWorkers; ++r) w.push_back(c.Connect(r, kWorkers));
  for (auto& client : w) {
    EXPECT_TRUE(client->Declare(Dense()).ok());
    EXPECT_TRUE(client->Declare(Sparse()).ok());
  }
  JoinOutcome result;
  constexpr int64_t kSteps = 9;
  auto worker = [&](int rank) {
    Client& me = *w[static_cast<size_t>(rank)];
    for (int64_t step = 0; step < kSteps; ++step) {
      if (step == 3 || step == 6) {
        if (rank == 0) {
          EXPECT_TRUE(me.Checkpoint(step).ok());
        }
        EXPECT_TRUE(me.Barrier().ok());
        if (rank == 0 && join) {
          auto now = placement::Placement::FromOwners(me.placement_version(), me.placement_owners(), 3);
          EXPECT_TRUE(now.ok()) << now.status();
          if (step == 3) result.spoken_to_before = c.servers[2]->stats().counters.at("messages");
          auto next = step == 3 ? now->Grow(2) : now->Drain(2);
          EXPECT_TRUE(next.ok()) << next.status();
          const Status s = me.MoveSlots(next->version(), next->Owners(), step);
          EXPECT_TRUE(s.ok()) << s;
        }
        EXPECT_TRUE(me.Barrier().ok());
      }
      if (step == 7 && rank == 0 && join) {
        // Worker 1 has pushed step 6 since: it was answered "moved" then.
        for (int i = 0; i < 2000 && !c.servers[2]->left(); ++i) std::this_thread::sleep_for(10ms);
        result.left = c.servers[2]->left();
        c.servers[2]->Stop();  // as ferry-ps exits
      }
      SyncStep(me, rank, step);
      if (join && rank == 0 && step == 5) result.took_after = c.servers[2]->stats().counters.at("updates_applied");
    }
  };
  std::thread t1(worker, 1);
  worker(0);
  t1.join();
  Finish(w, kSteps, &result.dense, &result.rows);
  return result;
}

TEST(PlacementVersions, AServerLeftOutOfTheFirstMapJoinsLeavesAgainAndTheJobKeepsItsBits) {
  TempDir join_dir("placement-join"), still_dir("placement-join-still");
  const JoinOutcome joined = TrainJoining(join_dir.path(), true);
  const JoinOutcome still = TrainJoining(still_dir.path(), false);
  EXPECT_EQ(joined.spoken_to_before, 0);  // no client sent server 2 anything before it joined
  EXPECT_GT(joined.took_after, 0);        // then it applied updates of steps 3 to 5
  EXPECT_TRUE(joined.left);
  ASSERT_EQ(joined.dense.size(), still.dense.size());
  EXPECT_EQ(std::memcmp(joined.dense.data(), still.dense.data(), joined.dense.size() * sizeof(float)), 0)
      << "dense values differ from the job of 2 servers";
  EXPECT_EQ(std::memcmp(joined.rows.data(), still.rows.data(), joined.rows.size() * sizeof(float)), 0)
      << "sparse rows differ from the job of 2 servers";
  // The checkpoint of step 3 was written before server 2 joined: server 0 wrote its shard.
  nlohmann::json manifest;
  std::ifstream(join_dir.path() / "MANIFEST-00000000000000000003") >> manifest;
  EXPECT_LT(manifest.at("shards").at(2).at("bytes").get<int64_t>(), 100) << manifest.dump();
  // It records the first map, which is not the first map of 3 servers a reader would assume.
  EXPECT_EQ(manifest.at("placement_version"), 1) << manifest.dump();
}

// A move asked while the job runs (1.24, MoveAsk): server 0 checks it against its map, keeps one
// at a time, and hands it to every worker at once at the first barrier all of them enter to take
// moves (a plain barrier leaves it kept), then forgets it.
TEST(PlacementVersions, AMoveAskedWhileTheJobRunsIsHandedToEveryWorkerAtOneBarrier) {
  TempDir dir("placement-ask");
  ServerOptions o = WithFolder(dir.path(), kWorkers);
  o.active_servers = 2;
  auto c = LocalCluster::Start(3, /*tcp=*/true, o);
  auto ask = [&](int server, int join, int drain) {
    AskMoveOptions a;
    a.server0 = c.endpoints[static_cast<size_t>(server)];
    a.join = join;
    a.drain = drain;
    a.timeout = 20s;
    return AskMove(a);
  };
  Status s = ask(1, 2, -1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;  // not server 0
  EXPECT_NE(s.message().find("not server 0"), std::string::npos) << s;
  s = ask(0, 7, -1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;  // no such server
  EXPECT_NE(s.message().find("the job has 3 servers"), std::string::npos) << s;
  s = ask(0, 1, -1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;  // server 1 owns slots: it cannot join
  s = ask(0, -1, 2);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;  // server 2 owns none: nothing to drain
  EXPECT_EQ(ask(0, -1, -1).code(), StatusCode::kInvalidArgument);  // no move named (refused before sending)
  s = ask(0, 2, -1);
  ASSERT_TRUE(s.ok()) << s;
  s = ask(0, -1, 1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;  // one is kept already
  EXPECT_NE(s.message().find("server 2 to join"), std::string::npos) << s;

  std::vector<std::unique_ptr<Client>> w;
  for (int r = 0; r < kWorkers; ++r) w.push_back(c.Connect(r, kWorkers));
  auto both = [&](auto enter) {
    std::vector<StatusOr<Client::AskedMove>> got(kWorkers, Client::AskedMove{});
    std::thread t1([&] { got[1] = enter(*w[1]); });
    got[0] = enter(*w[0]);
    t1.join();
    return got;
  };
  auto taking = [](Client& me) { return me.BarrierTakingMoves(); };
  // A plain barrier hands nothing over: the ask stays kept.
  both([](Client& me) -> StatusOr<Client::AskedMove> {
    FERRY_RETURN_IF_ERROR(me.Barrier());
    return Client::AskedMove{};
  });
  EXPECT_EQ(ask(0, -1, 1).code(), StatusCode::kFailedPrecondition);
  for (const auto& got : both(taking)) {
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->join, 2);
    EXPECT_EQ(got->drain, -1);
  }
  // Handed over: forgotten, and the next barrier that takes moves gets none.
  for (const auto& got : both(taking)) {
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_FALSE(got->asked());
  }
  // Another may be asked now (server 1 drained: it owns slots).
  s = ask(0, -1, 1);
  EXPECT_TRUE(s.ok()) << s;
  for (const auto& got : both(taking)) {
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->drain, 1);
    EXPECT_EQ(got->join, -1);
  }
  // A barrier some worker entered without taking moves hands nothing over: the ask stays kept.
  ASSERT_TRUE(ask(0, 2, -1).ok());
  {
    StatusOr<Client::AskedMove> got0 = Client::AskedMove{};
    std::thread t1([&] { EXPECT_TRUE(w[1]->Barrier().ok()); });
    got0 = w[0]->BarrierTakingMoves();
    t1.join();
    ASSERT_TRUE(got0.ok()) << got0.status();
    EXPECT_FALSE(got0->asked());
  }
  // A move made meanwhile (here by worker 0 itself, from a checkpoint) leaves the ask out of
  // date: server 0 drops it at the next barrier that takes moves instead of handing it over.
  {
    ASSERT_TRUE(w[0]->Checkpoint(0).ok());
    auto now = placement::Placement::FromOwners(w[0]->placement_version(), w[0]->placement_owners(), 3);
    ASSERT_TRUE(now.ok()) << now.status();
    auto next = now->Grow(2);
    ASSERT_TRUE(next.ok()) << next.status();
    const Status moved = w[0]->MoveSlots(next->version(), next->Owners(), 0);
    ASSERT_TRUE(moved.ok()) << moved;
  }
  for (const auto& got : both(taking)) {
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_FALSE(got->asked());
  }
  EXPECT_TRUE(ask(0, -1, 2).ok());  // (dropped: not kept any more)
  // What the client refuses to send, server 0 refuses too: no server named, both, a rank below -1.
  {
    auto made = transport::MakeSocket(transport::Zmq(*c.context), zmq::socket_type::dealer);
    ASSERT_TRUE(made.ok());
    zmq::socket_t raw = std::move(*made);
    raw.set(zmq::sockopt::rcvtimeo, 20000);
    raw.connect(c.endpoints[0]);
    uint64_t id = 100;
    for (const auto& [join, drain] : std::vector<std::pair<int, int>>{{-1, -1}, {2, 1}, {-5, -1}}) {
      flatbuffers::FlatBufferBuilder fbb;
      wire::HeaderBuilder b(fbb);
      b.add_major(wire::kMajor);
      b.add_minor(wire::kMinor);
      b.add_kind(wire::Kind::MoveAsk);
      b.add_request_id(++id);
      b.add_move_join(join);
      b.add_move_drain(drain);
      wire::FinishHeaderBuffer(fbb, b.Finish());
      transport::Frames f;
      f.push_back(wire::ToFrame(fbb));
      ASSERT_TRUE(transport::Send(raw, f).ok());
      transport::Frames reply;
      ASSERT_TRUE(transport::Recv(raw, &reply).ok());
      const wire::Header* h = nullptr;
      ASSERT_TRUE(wire::VerifyHeader(reply[0], &h).ok());
      EXPECT_EQ(h->request_id(), id);
      ASSERT_EQ(h->kind(), wire::Kind::Error) << join << " " << drain;
      EXPECT_NE(wire::ErrorStatus(*h).message().find("a MoveAsk names one server"), std::string::npos)
          << wire::ErrorStatus(*h);
    }
  }
  // A server before 1.24 refuses the unknown kind with an Error of request id 0 (it could not read
  // the header): that is the answer, not a reply to wait past.
  {
    zmq::socket_t router(transport::Zmq(*c.context), zmq::socket_type::router);
    router.set(zmq::sockopt::rcvtimeo, 20000);
    router.bind("inproc://placement-ask-old-server-0");
    std::thread old([&] {
      transport::Frames in;  // routing id, header
      if (!transport::Recv(router, &in).ok() || in.empty()) return;
      transport::Frames out;
      out.push_back(std::move(in[0]));
      out.push_back(wire::MakeError(0, wire::Kind::Invalid, InvalidArgumentError("unknown message kind 23")));
      EXPECT_TRUE(transport::Send(router, out).ok());
    });
    AskMoveOptions a;
    a.server0 = "inproc://placement-ask-old-server-0";
    a.context = c.context;
    a.join = 2;
    a.timeout = 20s;
    s = AskMove(a);
    old.join();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("does not know MoveAsk"), std::string::npos) << s;
  }
  // A silent address: DEADLINE_EXCEEDED within the timeout, naming it.
  AskMoveOptions silent;
  silent.server0 = "tcp://127.0.0.1:9";  // (discard: nothing listens there)
  silent.join = 2;
  silent.timeout = 300ms;
  s = AskMove(silent);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("tcp://127.0.0.1:9"), std::string::npos) << s;
}

// A worker's leave asked while the job runs (1.26, MoveAsk's `move_leave_worker`): server 0 keeps
// it (one ask at a time, with the servers' moves), hands it to every worker at a barrier that
// takes moves, as a move; the worker's Leave says the step it leaves before, every server keeps
// it, and a worker connecting later (a restarted one, or the leaver's own new process) hears it
// in the handshake.
TEST(PlacementVersions, AWorkersLeaveAskedWhileTheJobRunsIsHandedOverAndItsStepToldToLaterWorkers) {
  constexpr int kThree = 3;
  TempDir dir("placement-ask-leave");
  auto c = LocalCluster::Start(2, /*tcp=*/true, WithFolder(dir.path(), kThree));
  auto ask = [&](int worker) {
    AskMoveOptions a;
    a.server0 = c.endpoints[0];
    a.leave_worker = worker;
    a.timeout = 20s;
    return AskMove(a);
  };
  Status s = ask(0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;  // worker 0 stays
  EXPECT_NE(s.message().find("worker 0 stays"), std::string::npos) << s;
  s = ask(3);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;  // no such worker
  EXPECT_NE(s.message().find("workers are 0 to 2"), std::string::npos) << s;
  {
    AskMoveOptions both;  // a server and a worker: refused before sending
    both.server0 = c.endpoints[0];
    both.join = 1;
    both.leave_worker = 2;
    EXPECT_EQ(AskMove(both).code(), StatusCode::kInvalidArgument);
  }
  ASSERT_TRUE(ask(2).ok());
  s = ask(1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;  // one is kept already
  EXPECT_NE(s.message().find("worker 2 to leave the job"), std::string::npos) << s;

  std::vector<std::unique_ptr<Client>> w;
  for (int r = 0; r < kThree; ++r) w.push_back(c.Connect(r, kThree));
  EXPECT_TRUE(w[1]->workers_left().empty());
  std::vector<StatusOr<Client::AskedMove>> got(kThree, Client::AskedMove{});
  {
    std::vector<std::thread> others;
    for (int r = 1; r < kThree; ++r) {
      others.emplace_back([&, r] { got[static_cast<size_t>(r)] = w[static_cast<size_t>(r)]->BarrierTakingMoves(6); });
    }
    got[0] = w[0]->BarrierTakingMoves(6);
    for (auto& t : others) t.join();
  }
  for (const auto& g : got) {
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->leave_worker, 2);
    EXPECT_EQ(g->join, -1);
    EXPECT_EQ(g->drain, -1);
  }
  // Handed over at step 6: worker 2 leaves before step 7, which a worker restarted now hears
  // from server 0 already, before worker 2's Finish says it.
  auto restart = [&](int r) {
    w[static_cast<size_t>(r)].reset();
    w[static_cast<size_t>(r)] = c.Connect(r, kThree);
    return w[static_cast<size_t>(r)]->workers_left();
  };
  EXPECT_EQ(restart(1), (std::map<int, int64_t>{{2, 7}}));
  // Worker 2 leaves (after its step 6): the barriers go on without it, and asking its leave
  // again is refused.
  EXPECT_EQ(w[2]->Leave(int64_t{1} << 62 | 1).code(), StatusCode::kInvalidArgument);  // (past 2^62: not sent)
  ASSERT_TRUE(w[2]->Leave(7).ok());
  {
    std::thread t1([&] { EXPECT_TRUE(w[1]->Barrier().ok()); });
    EXPECT_TRUE(w[0]->Barrier().ok());
    t1.join();
  }
  s = ask(2);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("has left already"), std::string::npos) << s;
  // A new process of worker 1, and one of worker 2 itself, hear of the leave and its step, in
  // whichever order they say Hello.
  EXPECT_EQ(restart(2), (std::map<int, int64_t>{{2, 7}}));
  EXPECT_EQ(restart(1), (std::map<int, int64_t>{{2, 7}}));
  // Until worker 2 pushes a step at or past 7: then it takes part again, and no one hears of it.
  TableSpec both = SgdTable("leave-w", 8, Consistency::kAsync);
  both.chunk_elems = 4;  // two chunks, on consecutive slots: one on each server
  for (auto& client : w) ASSERT_TRUE(client->Declare(both).ok());
  std::vector<float> ones(8, 1.0f);
  ASSERT_TRUE(w[2]->PushDense("leave-w", ones, 6).wait().ok());
  EXPECT_EQ(restart(1), (std::map<int, int64_t>{{2, 7}}));
  ASSERT_TRUE(w[2]->PushDense("leave-w", ones, 7).wait().ok());
  EXPECT_TRUE(restart(1).empty());
  std::thread t1([&] { EXPECT_TRUE(w[1]->Barrier().ok()); });
  std::thread t2([&] { EXPECT_TRUE(w[2]->Barrier().ok()); });
  EXPECT_TRUE(w[0]->Barrier().ok());  // all three meet
  t1.join();
  t2.join();
}

// 1.27: a worker that left joins again while the job runs. Its new process says in its Hello
// that it waits (refused for a worker that has not left), asks server 0 until a barrier that
// takes moves hands its join (step T), and then tells every server it takes part from T + 1: no
// sync step before waits for it, the step T + 1 waits for it on every server, the workers meet it
// at a second barrier, and a worker restarted in between hears of the join.
TEST(PlacementVersions, AWorkerThatLeftJoinsAgainWhenServer0HandsItsJoinAndEveryServerWaitsForIt) {
  constexpr int kThree = 3;
  TempDir dir("placement-rejoin");
  auto c = LocalCluster::Start(2, /*tcp=*/true, WithFolder(dir.path(), kThree));
  std::vector<std::unique_ptr<Client>> w;
  for (int r = 0; r < kThree; ++r) w.push_back(c.Connect(r, kThree));
  TableSpec sync = SgdTable("rejoin-w", 8, Consistency::kSync);
  sync.chunk_elems = 4;  // two chunks, on consecutive slots: one on each server
  for (auto& client : w) ASSERT_TRUE(client->Declare(sync).ok());
  ClientOptions waits;
  waits.servers = c.endpoints;
  waits.rank = 2;
  waits.num_workers = kThree;
  waits.incarnation = 1;
  waits.waits_to_rejoin = true;
  {
    auto refused = Client::Connect(waits);  // worker 2 has not left
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_NE(refused.status().message().find("it has not left the job"), std::string::npos) << refused.status();
  }
  auto ask = [&] {
    AskMoveOptions a;
    a.server0 = c.endpoints[0];
    a.rejoin_worker = 2;
    a.timeout = 20s;
    return AskMove(a);
  };
  Status s = ask();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("no process of it waits"), std::string::npos) << s;
  ASSERT_TRUE(w[2]->Leave(0).ok());
  w[2].reset();
  auto joined = Client::Connect(waits);
  ASSERT_TRUE(joined.ok()) << joined.status();
  w[2] = std::move(joined).value();
  ASSERT_TRUE(w[2]->Declare(sync).ok());
  std::vector<float> ones(8, 1.0f);
  s = w[2]->PushDense("rejoin-w", ones, 0).wait();  // no step waits for it, nor takes its push
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  // Steps 0-8 close with workers 0 and 1, and their barriers go on without worker 2.
  for (int64_t t = 0; t < 9; ++t) {
    auto a = w[0]->PushDense("rejoin-w", ones, t);
    ASSERT_TRUE(w[1]->PushDense("rejoin-w", ones, t).wait().ok());
    ASSERT_TRUE(a.wait().ok());
  }
  {
    std::thread t1([&] { EXPECT_TRUE(w[1]->Barrier().ok()); });
    EXPECT_TRUE(w[0]->Barrier().ok());
    t1.join();
  }
  StatusOr<int64_t> at = w[2]->AskToRejoin();
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, 0);  // kept; not handed yet
  at = w[2]->AskToRejoin();
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, 0);
  EXPECT_TRUE(ask().ok());  // the same join, asked by another: taken for the one kept
  std::vector<StatusOr<Client::AskedMove>> got(2, Client::AskedMove{});
  {
    std::thread t1([&] { got[1] = w[1]->BarrierTakingMoves(8); });
    got[0] = w[0]->BarrierTakingMoves(8);
    t1.join();
  }
  for (const auto& g : got) {
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->rejoin_worker, 2);
    EXPECT_EQ(g->leave_worker, -1);
  }
  // A worker restarted now hears of the join, from server 0.
  w[1].reset();
  w[1] = c.Connect(1, kThree);
  ASSERT_TRUE(w[1]->Declare(sync).ok());
  EXPECT_EQ(w[1]->workers_rejoined(), (std::map<int, int64_t>{{2, 9}}));
  EXPECT_EQ(w[1]->rejoin_barrier(), w[1]->first_collective());  // the second barrier, not ended: it enters it
  EXPECT_GE(w[1]->rejoin_barrier(), 0);
  // Worker 2's next ask gets the step, and its client tells every server; the workers meet it at
  // the hand-over's second barrier.
  at = w[2]->AskToRejoin();
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, 9);
  EXPECT_EQ(w[2]->AskToRejoin().status().code(), StatusCode::kFailedPrecondition);  // joined already
  {
    std::thread t1([&] { EXPECT_TRUE(w[1]->Barrier().ok()); });
    std::thread t2([&] { EXPECT_TRUE(w[2]->Barrier().ok()); });
    EXPECT_TRUE(w[0]->Barrier().ok());  // all three meet
    t1.join();
    t2.join();
  }
  // Step 9 waits for worker 2 on both servers (a chunk on each): the pull of step 10 comes once
  // its push does, and each chunk took its gradient.
  auto a = w[0]->PushDense("rejoin-w", ones, 9);
  ASSERT_TRUE(w[1]->PushDense("rejoin-w", ones, 9).wait().ok());
  ASSERT_TRUE(a.wait().ok());
  std::vector<float> got_w(8);
  auto pull = w[0]->PullDense("rejoin-w", got_w, 10);
  EXPECT_EQ(pull.wait(300ms).code(), StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(w[2]->PushDense("rejoin-w", std::vector<float>(8, 4.0f), 9).wait().ok());
  ASSERT_TRUE(pull.wait().ok());
  // Steps 0-8 took 2 gradients of 1 each, step 9 three: 1, 1 and 4 (SGD, lr 1: the mean gradient).
  for (const float v : got_w) EXPECT_FLOAT_EQ(v, -9.0f - 2.0f);
  // Pushed past its step, worker 2 takes part as any other: a worker restarted now hears of no
  // leave, and of the join (server 0 keeps it: a --leave in the flags, or a server worker 2
  // pushes nothing to, would otherwise say it is gone), its second barrier ended.
  w[1].reset();
  w[1] = c.Connect(1, kThree);
  EXPECT_EQ(w[1]->workers_rejoined(), (std::map<int, int64_t>{{2, 9}}));
  EXPECT_TRUE(w[1]->workers_left().empty());
  EXPECT_EQ(w[1]->rejoin_barrier(), -1);
  // Asked to leave again (its Finish says before step 12), a new process of it waits again: its
  // ask is kept anew, not answered with the step of the join before.
  ASSERT_TRUE(w[2]->Leave(12).ok());
  w[2].reset();
  waits.incarnation = 2;
  auto second = Client::Connect(waits);
  ASSERT_TRUE(second.ok()) << second.status();
  at = (*second)->AskToRejoin();
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, 0);
  EXPECT_EQ((*second)->workers_left(), (std::map<int, int64_t>{{2, 12}}));
  EXPECT_EQ((*second)->workers_rejoined(), (std::map<int, int64_t>{{2, 9}}));
}

// A worker waiting to join again is refused once no other worker trains (no check would hand it
// its join): its asks end rather than go on for ever.
TEST(PlacementVersions, AWorkerWaitingToJoinAgainIsRefusedOnceTheOthersHaveFinished) {
  TempDir dir("placement-rejoin-late");
  auto c = LocalCluster::Start(1, /*tcp=*/true, WithFolder(dir.path(), 2));
  auto w0 = c.Connect(0, 2);
  {
    auto w1 = c.Connect(1, 2);
    ASSERT_TRUE(w1->Leave(0).ok());
  }
  ClientOptions waits;
  waits.servers = c.endpoints;
  waits.rank = 1;
  waits.num_workers = 2;
  waits.incarnation = 1;
  waits.waits_to_rejoin = true;
  auto w1 = Client::Connect(waits);
  ASSERT_TRUE(w1.ok()) << w1.status();
  StatusOr<int64_t> at = (*w1)->AskToRejoin();
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, 0);
  ASSERT_TRUE(w0->Finish().ok());
  at = (*w1)->AskToRejoin();
  EXPECT_EQ(at.status().code(), StatusCode::kFailedPrecondition) << at.status();
  EXPECT_NE(at.status().message().find("every other worker has finished"), std::string::npos) << at.status();
}

// A pull held for a step is placed by the map it came with: a hand-over waits for the step.
TEST(PlacementVersions, AHandOverIsRefusedWhileAPullWaitsForItsStep) {
  TempDir dir("placement-held");
  ServerOptions o = WithFolder(dir.path(), 2);
  auto c = LocalCluster::Start(2, false, o);
  auto w0 = c.Connect(0, 2), w1 = c.Connect(1, 2);
  ASSERT_TRUE(w0->Declare(Dense()).ok());
  ASSERT_TRUE(w1->Declare(Dense()).ok());
  ASSERT_TRUE(w0->Checkpoint(0).ok());
  std::vector<float> out(kDense);
  Handle held = w1->PullDense("w", out, 1);  // waits for step 0's pushes
  const placement::Placement drained = *placement::Placement::First(2).Drain(1);
  // (two clients' messages are not ordered: the servers hold the pull first)
  for (int i = 0; i < 2000 && (c.servers[0]->stats().counters.at("pulls_held") == 0 ||
                               c.servers[1]->stats().counters.at("pulls_held") == 0);
       ++i) {
    std::this_thread::sleep_for(5ms);
  }
  const Status s = w0->MoveSlots(2, drained.Owners(), 0);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("pull(s) waiting for a step"), std::string::npos) << s;
  EXPECT_EQ(w0->placement_version(), 1u);
  std::vector<float> g(kDense, 0.5f);
  ASSERT_TRUE(w0->PushDense("w", g, 0).wait().ok());
  ASSERT_TRUE(w1->PushDense("w", g, 0).wait().ok());
  ASSERT_TRUE(held.wait(20s).ok());
}

// A raw socket to `endpoint` that sends one request of `kind` naming protocol 1.`minor` as worker
// 1 of 2 (a Hello also names server 1 of 2), and returns the kind of the answer.
struct OldPeer {
  OldPeer(Context& context, const std::string& endpoint) {
    auto made = transport::MakeSocket(transport::Zmq(context), zmq::socket_type::dealer);
    EXPECT_TRUE(made.ok());
    socket = std::move(*made);
    socket.set(zmq::sockopt::rcvtimeo, 10000);
    socket.set(zmq::sockopt::linger, 0);
    socket.connect(endpoint);
  }
  StatusOr<wire::Kind> Ask(wire::Kind kind, uint16_t minor, std::string* error = nullptr) {
    flatbuffers::FlatBufferBuilder fbb;
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(minor);
    b.add_kind(kind);
    b.add_request_id(++id);
    b.add_rank(1);
    b.add_num_workers(2);
    b.add_num_servers(servers);
    b.add_server_rank(1);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    transport::Frames f;
    f.push_back(wire::ToFrame(fbb));
    FERRY_RETURN_IF_ERROR(transport::Send(socket, f));
    transport::Frames reply;
    FERRY_RETURN_IF_ERROR(transport::Recv(socket, &reply));
    const wire::Header* h = nullptr;
    FERRY_RETURN_IF_ERROR(wire::VerifyHeader(reply[0], &h));
    if (error != nullptr && h->kind() == wire::Kind::Error) *error = wire::ErrorStatus(*h).ToString();
    return h->kind();
  }
  zmq::socket_t socket;
  uint64_t id = 0;
  int servers = 2;  // the job's, as its Hello says
};

// A client before 1.20 would place by the first map of all the servers: a job whose first map
// leaves some out refuses its Hello, saying why.
TEST(PlacementVersions, AClientBeforeServersJoiningIsRefusedByAJobWhoseFirstMapLeavesServersOut) {
  ServerOptions o;
  o.num_workers = 2;
  o.active_servers = 2;
  auto c = LocalCluster::Start(3, /*tcp=*/true, o);
  OldPeer old(*c.context, c.endpoints[1]);
  old.servers = 3;
  std::string error;
  StatusOr<wire::Kind> k = old.Ask(wire::Kind::Hello, 19, &error);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(*k, wire::Kind::Error);
  EXPECT_NE(error.find("a first map of all 3 servers, and this job's gives slots to 2 (ferry-ps --active-servers)"),
            std::string::npos)
      << error;
  OldPeer current(*c.context, c.endpoints[1]);
  current.servers = 3;
  k = current.Ask(wire::Kind::Hello, wire::kMinor);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(*k, wire::Kind::Reply);
}

TEST(PlacementVersions, AHandOverIsRefusedWhileAClientBeforePlacementVersionsIsConnected) {
  TempDir dir("placement-old-client");
  auto c = LocalCluster::Start(2, /*tcp=*/true, WithFolder(dir.path(), 2));
  auto w0 = c.Connect(0, 2);
  ASSERT_TRUE(w0->Declare(Dense()).ok());
  ASSERT_TRUE(w0->Checkpoint(0).ok());
  // Worker 1 of protocol 1.16 says Hello to server 1 (a raw socket: this library speaks 1.17);
  // another connection of 1.0 sends a request without a Hello of its own (a client that
  // reconnected after a drop sends none again).
  OldPeer hello(*c.context, c.endpoints[1]), reconnected(*c.context, c.endpoints[1]);
  StatusOr<wire::Kind> k = hello.Ask(wire::Kind::Hello, 16);
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_EQ(*k, wire::Kind::Reply);
  ASSERT_TRUE(reconnected.Ask(wire::Kind::Stats, 0).ok());
  const placement::Placement drained = *placement::Placement::First(2).Drain(1);
  Status s = w0->MoveSlots(2, drained.Owners(), 0);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("2 client(s) of a protocol before 1.17 connected (127.0.0.1:"), std::string::npos) << s;
  EXPECT_NE(s.message().find("(1.16)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("(1.0)"), std::string::npos) << s;
  EXPECT_EQ(w0->placement_version(), 1u);
  // Gone, they no longer hold the map (the server learns of closed connections in its own time).
  hello.socket.close();
  reconnected.socket.close();
  for (int i = 0; i < 2000; ++i) {
    s = w0->MoveSlots(2, drained.Owners(), 0);
    if (s.ok() || s.message().find("before 1.17") == std::string::npos) break;
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(w0->placement_version(), 2u);
  // Slots moved, such a client is refused at its Hello.
  OldPeer late(*c.context, c.endpoints[1]);
  std::string error;
  k = late.Ask(wire::Kind::Hello, 16, &error);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(*k, wire::Kind::Error);
  EXPECT_NE(error.find("a client of protocol 1.16 places ids and chunks by the job's first map"), std::string::npos)
      << error;
}

// A hand-over charges a server's memory budget only for the rows that come beyond the slots of
// those that leave (charged already): two servers whose budgets are full can swap their rows; one
// of them cannot take the other's on top of its own.
TEST(PlacementVersions, ServersWithFullBudgetsCanSwapRowsButNotTakeMore) {
  constexpr int64_t kRows = 200;  // per server
  std::vector<int64_t> ids;       // kRows on each server, by the first map
  int on[2] = {0, 0};
  for (int64_t id = 0; on[0] < kRows || on[1] < kRows; ++id) {
    const int server = placement::IdServer(id, 2);
    if (on[server] < kRows) {
      ids.push_back(id);
      ++on[server];
    }
  }
  TableSpec spec = SgdSparseTable("emb", 64, Consistency::kAsync);
  std::vector<float> grads(ids.size() * 64);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i % 97) / 97.0f;
  auto fill = [&](LocalCluster& c, Client& w) {
    EXPECT_TRUE(w.Declare(spec).ok());
    EXPECT_TRUE(w.PushSparse("emb", ids, grads, 0).wait().ok());
    return std::max(c.servers[0]->stats().counters.at("memory_budget_used_bytes"),
                    c.servers[1]->stats().counters.at("memory_budget_used_bytes"));
  };
  int64_t used = 0;
  {
    TempDir dir("placement-budget-measure");
    auto c = LocalCluster::Start(2, false, WithFolder(dir.path(), 1));
    used = fill(c, *c.Connect(0, 1));
  }
  ASSERT_GT(used, kRows * 64 * 4);
  TempDir dir("placement-budget");
  ServerOptions o = WithFolder(dir.path(), 1);
  o.memory_budget_bytes = used + 1024;  // room for 3 more rows of 64 floats, not 200
  auto c = LocalCluster::Start(2, false, o);
  auto w = c.Connect(0, 1);
  ASSERT_EQ(fill(c, *w), used);
  std::vector<float> before(ids.size() * 64), after(ids.size() * 64);
  ASSERT_TRUE(w->PullSparse("emb", ids, before, 0).wait().ok());
  ASSERT_TRUE(w->Checkpoint(1).ok());
  const placement::Placement first = placement::Placement::First(2);
  // A read ahead is kept on the budget (1.19): no room for what server 0 would keep.
  Status s = w->PrepareMoveSlots(2, first.Drain(1)->Owners(), 1).wait();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("keeping the read ahead of the checkpoint of step 1"), std::string::npos) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(c.servers[r]->stats().counters.at("memory_budget_used_bytes"), used) << "server " << r;
  }
  s = w->MoveSlots(2, first.Drain(1)->Owners(), 1);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("server 0 would take"), std::string::npos) << s;
  std::vector<uint16_t> swapped = first.Owners();
  for (uint16_t& owner : swapped) owner = static_cast<uint16_t>(1 - owner);
  s = w->MoveSlots(2, swapped, 1);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(w->PullSparse("emb", ids, after, 0).wait().ok());
  EXPECT_EQ(before, after);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(c.servers[r]->stats().counters.at("memory_budget_used_bytes"), used) << "server " << r;
  }
}

// A hand-over reads only the shards of the servers that give slots up (and only their moving
// chunks and rows): with server 2's shard of the checkpoint broken, slots move between servers
// 0 and 1 and server 2 takes the map; a move of server 2's slots is refused naming its shard.
// Declares an async dense table "a" of kDense (chunks of 4: on every server) and an async sparse
// table "emb" on `w`, and pushes ones to "a" and halves to 300 rows of "emb" at step 0: returns
// their ids.
std::vector<int64_t> DeclareAndPushAsync(Client& w) {
  TableSpec dense = SgdTable("a", kDense, Consistency::kAsync);
  dense.chunk_elems = 4;
  EXPECT_TRUE(w.Declare(dense).ok());
  EXPECT_TRUE(w.Declare(SgdSparseTable("emb", kDim, Consistency::kAsync)).ok());
  std::vector<int64_t> ids(300);
  for (int64_t i = 0; i < 300; ++i) ids[static_cast<size_t>(i)] = i * 7 - 40;
  const std::vector<float> g(kDense, 1.0f), grads(ids.size() * kDim, 0.5f);
  EXPECT_TRUE(w.PushDense("a", g, 0).wait().ok());
  EXPECT_TRUE(w.PushSparse("emb", ids, grads, 0).wait().ok());
  return ids;
}

TEST(PlacementVersions, AHandOverReadsOnlyTheShardsOfTheSlotsThatMove) {
  TempDir dir("placement-shards");
  auto c = LocalCluster::Start(3, false, WithFolder(dir.path(), 1));
  auto w = c.Connect(0, 1);
  std::vector<int64_t> ids = DeclareAndPushAsync(*w);
  std::vector<float> g(kDense, 1.0f), grads(ids.size() * kDim, 0.5f), dense_before(kDense), dense_after(kDense),
      rows_before(grads.size()), rows_after(grads.size());
  ASSERT_TRUE(w->PullDense("a", dense_before, 1).wait().ok());
  ASSERT_TRUE(w->PullSparse("emb", ids, rows_before, 1).wait().ok());
  ASSERT_TRUE(w->Checkpoint(1).ok());
  const fs::path shard2 = dir.path() / "step-00000000000000000001-shard-00002-of-00003.ckpt";
  ASSERT_TRUE(fs::exists(shard2));
  {
    std::fstream f(shard2, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard2) / 2));
    f.put('\x5a');
  }
  const placement::Placement first = placement::Placement::First(3);
  std::vector<uint16_t> two_to_zero = first.Owners(), one_to_zero = first.Owners();
  for (uint16_t& owner : two_to_zero) owner = owner == 2 ? 0 : owner;
  for (uint16_t& owner : one_to_zero) owner = owner == 1 ? 0 : owner;
  Status s = w->MoveSlots(2, two_to_zero, 1);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(shard2.filename().string()), std::string::npos) << s;
  EXPECT_EQ(w->placement_version(), 1u);
  s = w->MoveSlots(2, one_to_zero, 1);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(w->placement_version(), 2u);
  ASSERT_TRUE(w->PullDense("a", dense_after, 1).wait().ok());
  ASSERT_TRUE(w->PullSparse("emb", ids, rows_after, 1).wait().ok());
  EXPECT_EQ(dense_after, dense_before);
  EXPECT_EQ(rows_after, rows_before);
  // Server 1 holds nothing now: a push is applied on servers 0 and 2 alone.
  const int64_t applied1 = c.servers[1]->stats().counters.at("updates_applied");
  ASSERT_TRUE(w->PushDense("a", g, 1).wait().ok());
  ASSERT_TRUE(w->PullDense("a", dense_after, 2).wait().ok());
  EXPECT_EQ(dense_after, std::vector<float>(kDense, -2.0f));
  EXPECT_EQ(c.servers[1]->stats().counters.at("updates_applied"), applied1);
  // Server 2, which read nothing, took the map: it answered none of the requests "moved".
  EXPECT_EQ(c.servers[2]->stats().counters.at("moved_answered"), 0);
}

// A hand-over read ahead (1.19, Client::PrepareMoveSlots): the servers read the checkpoint of
// step 1 for the map while the job trains; the MoveSlots from step 2's checkpoint, a delta of it,
// then reads only the deltas: it succeeds with step 1's shards gone, and moves the values as
// they are. A read ahead for a map not above the client's or the servers' is refused.
TEST(PlacementVersions, AHandOverReadAheadReadsOnlyTheDeltasWrittenSince) {
  TempDir dir("placement-ahead");
  ServerOptions o = WithFolder(dir.path(), 2);
  o.checkpoint_deltas = 4;
  o.checkpoint_delta_share = 1.0;
  auto c = LocalCluster::Start(2, false, o);
  auto w = c.Connect(0, 2);
  auto other = c.Connect(1, 2);  // a worker that pushes nothing: it stays at the first map
  std::vector<int64_t> ids = DeclareAndPushAsync(*w);
  std::vector<float> g(kDense, 1.0f), grads(ids.size() * kDim, 0.5f), dense_before(kDense), dense_after(kDense),
      rows_before(grads.size()), rows_after(grads.size());
  ASSERT_TRUE(w->Checkpoint(1).ok());
  const placement::Placement drained = *placement::Placement::First(2).Drain(1);
  EXPECT_EQ(w->PrepareMoveSlots(1, drained.Owners(), 1).wait().code(), StatusCode::kFailedPrecondition);
  Status s = w->PrepareMoveSlots(2, drained.Owners(), 1).wait();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(w->placement_version(), 1u);  // nothing changed
  // Training goes on; some ids only now.
  for (int64_t& id : ids) id += 1000;
  ASSERT_TRUE(w->PushDense("a", g, 1).wait().ok());
  ASSERT_TRUE(w->PushSparse("emb", ids, grads, 1).wait().ok());
  ASSERT_TRUE(w->Checkpoint(2).ok());
  ASSERT_TRUE(w->PullDense("a", dense_before, 2).wait().ok());
  ASSERT_TRUE(w->PullSparse("emb", ids, rows_before, 2).wait().ok());
  nlohmann::json m;
  std::ifstream(dir.path() / "MANIFEST-00000000000000000002") >> m;
  ASSERT_EQ(m["format"], 2) << m.dump();  // step 2's shards are deltas of step 1's
  for (int r = 0; r < 2; ++r) {
    const fs::path full = dir.path() / ("step-00000000000000000001-shard-0000" + std::to_string(r) + "-of-00002.ckpt");
    ASSERT_TRUE(fs::exists(full));
    fs::rename(full, dir.path() / ("away-" + std::to_string(r)));
  }
  s = w->MoveSlots(2, drained.Owners(), 2);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(w->placement_version(), 2u);
  ASSERT_TRUE(w->PullDense("a", dense_after, 2).wait().ok());
  ASSERT_TRUE(w->PullSparse("emb", ids, rows_after, 2).wait().ok());
  EXPECT_EQ(dense_after, dense_before);
  EXPECT_EQ(rows_after, rows_before);
  EXPECT_NE(rows_after, std::vector<float>(rows_after.size(), 0.0f));
  // A read ahead for a map not above the client's is refused by the client; one for the map the
  // servers hold is answered OK, and one for another map of their version is refused by them.
  s = w->PrepareMoveSlots(2, drained.Owners(), 2).wait();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  ASSERT_EQ(other->placement_version(), 1u);
  s = other->PrepareMoveSlots(2, drained.Owners(), 2).wait();
  EXPECT_TRUE(s.ok()) << s;
  s = other->PrepareMoveSlots(2, placement::Placement::First(2).Owners(), 2).wait();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("a map to read ahead for needs a higher version than 2"), std::string::npos) << s;
}

TEST(PlacementVersions, AHandOverThatWouldLoseAnUpdateIsRefusedAndChangesNothing) {
  TempDir dir("placement-refused");
  ServerOptions o = WithFolder(dir.path(), 1);
  auto c = LocalCluster::Start(2, false, o);
  auto w = c.Connect(0, 1);
  TableSpec spec = SgdTable("a", kDense, Consistency::kAsync);
  spec.chunk_elems = 4;
  ASSERT_TRUE(w->Declare(spec).ok());
  std::vector<float> g(kDense, 1.0f), out(kDense);
  ASSERT_TRUE(w->PushDense("a", g, 0).wait().ok());
  ASSERT_TRUE(w->Checkpoint(1).ok());
  ASSERT_TRUE(w->PushDense("a", g, 1).wait().ok());  // after the checkpoint: server 1's chunks would lose it
  const placement::Placement drained = *placement::Placement::First(2).Drain(1);
  Status s = w->MoveSlots(2, drained.Owners(), 1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("updated since"), std::string::npos) << s;
  EXPECT_NE(s.message().find("checking; nothing changed"), std::string::npos) << s;
  EXPECT_EQ(w->placement_version(), 1u);
  ASSERT_TRUE(w->PullDense("a", out, 2).wait().ok());
  EXPECT_EQ(out, std::vector<float>(kDense, -2.0f));
  // A version not above the job's, and a map of a server the job lacks, are refused too.
  s = w->MoveSlots(1, drained.Owners(), 1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  std::vector<uint16_t> bad = drained.Owners();
  bad[17] = 2;
  s = w->MoveSlots(2, bad, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("slot 17 to server 2"), std::string::npos) << s;
  // A checkpoint of the step after the push can be handed over from: server 1's chunks go to 0.
  ASSERT_TRUE(w->Checkpoint(2).ok());
  s = w->MoveSlots(2, drained.Owners(), 2);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(w->placement_version(), 2u);
  ASSERT_TRUE(w->PushDense("a", g, 2).wait().ok());
  ASSERT_TRUE(w->PullDense("a", out, 3).wait().ok());
  EXPECT_EQ(out, std::vector<float>(kDense, -3.0f));
  EXPECT_EQ(c.servers[1]->stats().counters.at("updates_applied"), 2 * 5);  // its 5 chunks, twice, before

  // A checkpoint under the new map says so in its manifest; a job of its servers restores that
  // map with every chunk (server 0's shard holds them all), and one of another count its first.
  ASSERT_TRUE(w->Checkpoint(3).ok());
  std::ifstream in(dir.path() / "MANIFEST-00000000000000000003");
  const nlohmann::json manifest = nlohmann::json::parse(in);
  EXPECT_EQ(manifest.at("placement_version"), 2);
  EXPECT_EQ(manifest.at("placement_owners").get<std::vector<uint16_t>>(), drained.Owners());
  w.reset();
  c = {};
  o.restore = true;
  for (const int servers : {2, 3}) {
    auto restored = LocalCluster::Start(servers, false, o);
    auto v = restored.Connect(0, 1);
    EXPECT_EQ(v->placement_version(), servers == 2 ? 2u : 1u);
    ASSERT_TRUE(v->Declare(spec).ok());
    ASSERT_TRUE(v->PullDense("a", out, 3).wait().ok());
    EXPECT_EQ(out, std::vector<float>(kDense, -3.0f));
    ASSERT_TRUE(v->PushDense("a", g, 3).wait().ok());
    ASSERT_TRUE(v->PullDense("a", out, 4).wait().ok());
    EXPECT_EQ(out, std::vector<float>(kDense, -4.0f));
    // Server 1 holds nothing under the restored map (version 2): nothing is applied there.
    EXPECT_EQ(restored.servers[1]->stats().counters.at("updates_applied"), servers == 2 ? 0 : 4);
  }
}

}  // namespace
}  // namespace ferry::test
