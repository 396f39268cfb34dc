// Checkpoint requests over the wire (protocol 1.3, PROTOCOL.md "Checkpoints"), on in-process
// clusters: what the servers write, what they refuse and why, starting from a checkpoint, and a
// worker whose process restarts (its rank connects again) taking up the step it died in.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ferry/messages/placement.h"
#include "support/cluster.h"
#include "support/temp_dir.h"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TableSpec SyncSgd(const std::string& name, int64_t n) {
  TableSpec spec = SgdTable(name, n, Consistency::kSync);
  spec.chunk_elems = 4;  // several chunks, on every server
  return spec;
}

class CheckpointRequests : public testing::Test {
 protected:
  void SetUp() override { fs::remove_all(dir_); }  // the folder is made by the tests that want one

  ServerOptions WithFolder(const fs::path& d, int num_workers = 0) const {
    ServerOptions o;
    o.checkpoint_dir = d.string();
    o.num_workers = num_workers;
    return o;
  }

  TempDir tmp_{"ckpt-req"};
  const fs::path dir_ = tmp_.path();
};

TEST_F(CheckpointRequests, ASyncCheckpointIsACutAtTheStepEveryServerIsAt) {
  auto c = LocalCluster::Start(2, false, WithFolder(dir_));
  auto w0 = c.Connect(0, 2), w1 = c.Connect(1, 2);
  ASSERT_TRUE(w0->Declare(SyncSgd("w", 12)).ok());
  ASSERT_TRUE(w1->Declare(SyncSgd("w", 12)).ok());
  std::vector<float> g(12, 1.0f), out(12);
  // Step 0 closes on both servers (two pushes), so every chunk is at step 1.
  ASSERT_TRUE(w0->PushDense("w", g, 0).wait().ok());
  ASSERT_TRUE(w1->PushDense("w", g, 0).wait().ok());
  // Asking for step 0 now is refused, naming the table, its chunk and the step it is at.
  Status s = w0->Checkpoint(0);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("table 'w' chunk"), std::string::npos) << s;
  EXPECT_NE(s.message().find("is at step 1, not 0"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(dir_ / "CURRENT"));
  // Worker 1 has pushed step 1 already (held, not applied): the cut at 1 leaves it out.
  ASSERT_TRUE(w1->PushDense("w", g, 1).wait().ok());
  std::vector<CheckpointShard> shards(2);
  ASSERT_TRUE(w0->SaveCheckpoint(1, shards).wait().ok());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(shards[static_cast<size_t>(r)].file,
              "step-00000000000000000001-shard-0000" + std::to_string(r) + "-of-00002.ckpt");
    EXPECT_EQ(fs::file_size(dir_ / shards[static_cast<size_t>(r)].file), shards[static_cast<size_t>(r)].bytes);
  }
  EXPECT_FALSE(fs::exists(dir_ / "CURRENT")) << "no manifest before the commit";
  ASSERT_TRUE(w0->CommitCheckpoint(1, shards).ok());
  std::ifstream current(dir_ / "CURRENT");
  std::string line;
  std::getline(current, line);
  EXPECT_EQ(line, "MANIFEST-00000000000000000001");
  EXPECT_EQ(c.servers[0]->stats().counters.at("checkpoints_saved"), 1);

  // Servers restored from it (one, now) are at step 1 with -g applied once, and the step-1
  // gradient held when it was taken is not in it: worker 1 pushes step 1 again.
  c = {};
  ServerOptions ro = WithFolder(dir_, 2);
  ro.restore = true;
  auto restored = LocalCluster::Start(1, false, ro);
  ASSERT_EQ(restored.servers.size(), 1u);
  EXPECT_EQ(restored.servers[0]->restored_step(), 1);
  auto v0 = restored.Connect(0, 2), v1 = restored.Connect(1, 2);
  EXPECT_EQ(v0->restored_step(), 1);
  // Another model's table is refused: the job resumes the tables it saved, not a fresh model
  // beside them.
  const Status other = v0->Declare(SyncSgd("mlp/w0", 12));
  EXPECT_EQ(other.code(), StatusCode::kFailedPrecondition) << other;
  EXPECT_NE(other.message().find("table 'mlp/w0' is not in the checkpoint of step 1 this server restored, which "
                                 "holds 'w'"),
            std::string::npos)
      << other;
  ASSERT_TRUE(v0->Declare(SyncSgd("w", 12)).ok());
  ASSERT_TRUE(v1->Declare(SyncSgd("w", 12)).ok());
  Handle pull = v0->PullDense("w", out, 1);
  ASSERT_TRUE(pull.wait(5s).ok());
  EXPECT_EQ(pull.served().version, 1);
  EXPECT_EQ(out, std::vector<float>(12, -1.0f));
  ASSERT_TRUE(v0->PushDense("w", g, 1).wait().ok());
  ASSERT_TRUE(v1->PushDense("w", g, 1).wait().ok());
  ASSERT_TRUE(v0->PullDense("w", out, 2).wait(5s).ok());
  EXPECT_EQ(out, std::vector<float>(12, -2.0f));
}

// A resumed job may change its tables' settings (a new learning rate): the first declaration of
// each restored table sets them on every server, the step after the checkpoint applies them, and
// the next checkpoint records them. A running job's, or a shape's, change is refused naming it.
TEST_F(CheckpointRequests, AResumedJobMayChangeItsLearningRate) {
  std::vector<float> g(12, 1.0f), out(12);
  {
    auto c = LocalCluster::Start(2, false, WithFolder(dir_));
    auto w0 = c.Connect(0, 2), w1 = c.Connect(1, 2);
    ASSERT_TRUE(w0->Declare(SyncSgd("w", 12)).ok());  // lr 1
    ASSERT_TRUE(w1->Declare(SyncSgd("w", 12)).ok());
    TableSpec other_lr = SyncSgd("w", 12);
    other_lr.optimizer.learning_rate = 0.5f;
    const Status running = w1->Declare(other_lr);
    EXPECT_EQ(running.code(), StatusCode::kAlreadyExists) << running;
    EXPECT_NE(running.message().find("table 'w' is declared with other settings: lr 1 -> 0.5 (settings change only "
                                     "when a job resumes"),
              std::string::npos)
        << running;
    ASSERT_TRUE(w0->PushDense("w", g, 0).wait().ok());
    ASSERT_TRUE(w1->PushDense("w", g, 0).wait().ok());
    ASSERT_TRUE(w0->PullDense("w", out, 1).wait(5s).ok());
    ASSERT_TRUE(w0->Checkpoint(1).ok());  // w = -1 everywhere
  }
  for (int servers : {3, 1}) {  // resumed into another server count, then from its own checkpoint
    ServerOptions ro = WithFolder(dir_, 2);
    ro.restore = true;
    auto c = LocalCluster::Start(servers, false, ro);
    auto v0 = c.Connect(0, 2), v1 = c.Connect(1, 2);
    TableSpec resumed = SyncSgd("w", 12);
    resumed.optimizer.learning_rate = 0.25f;
    if (servers == 3) {
      TableSpec adam = resumed;
      adam.optimizer.type = OptimizerType::kAdam;
      const Status fixed = v0->Declare(adam);
      EXPECT_EQ(fixed.code(), StatusCode::kAlreadyExists) << fixed;
      EXPECT_NE(fixed.message().find("table 'w' cannot change its optimizer sgd -> adam"), std::string::npos) << fixed;
      ASSERT_TRUE(v0->Declare(resumed).ok());
      ASSERT_TRUE(v1->Declare(resumed).ok());  // the same settings: agreed
      const Status late = v1->Declare(SyncSgd("w", 12));
      EXPECT_NE(late.message().find("lr 0.25 -> 1"), std::string::npos) << late;
    } else {
      // The checkpoint of step 2 recorded lr 0.25: declaring it again changes nothing.
      ASSERT_TRUE(v0->Declare(resumed).ok());
      ASSERT_TRUE(v1->Declare(resumed).ok());
    }
    const int64_t step = servers == 3 ? 1 : 2;
    ASSERT_TRUE(v0->PullDense("w", out, step).wait(5s).ok());
    EXPECT_EQ(out, std::vector<float>(12, servers == 3 ? -1.0f : -1.25f));
    ASSERT_TRUE(v0->PushDense("w", g, step).wait().ok());
    ASSERT_TRUE(v1->PushDense("w", g, step).wait().ok());
    ASSERT_TRUE(v0->PullDense("w", out, step + 1).wait(5s).ok());
    // The step after the checkpoint at the new rate: exactly what SGD at lr 0.25 gives.
    EXPECT_EQ(out, std::vector<float>(12, servers == 3 ? -1.25f : -1.5f));
    if (servers == 3) {
      ASSERT_TRUE(v0->Checkpoint(2).ok());
    }
  }
}

// A resumed job may change a sparse table's row lifecycle settings too (admission, eviction, the
// row bound), not whether it has one.
TEST_F(CheckpointRequests, AResumedJobMayChangeItsRowLifecycle) {
  TableSpec spec = SgdSparseTable("emb", 4, Consistency::kSync);  // SGD at lr 1
  spec.init = InitType::kZeros;
  spec.admit_after = 3;  // an id gets its row at its third push
  const std::vector<float> g(4, 1.0f);
  std::vector<float> out(4);
  const std::vector<int64_t> id = {77};
  {
    auto c = LocalCluster::Start(1, false, WithFolder(dir_));
    auto w = c.Connect(0, 1);
    ASSERT_TRUE(w->Declare(spec).ok());
    ASSERT_TRUE(w->PushSparse("emb", id, g, 0).wait().ok());
    ASSERT_TRUE(w->PullSparse("emb", id, out, 1).wait(5s).ok());
    EXPECT_EQ(out, std::vector<float>(4, 0.0f)) << "one push of three: no row";
    ASSERT_TRUE(w->Checkpoint(1).ok());
  }
  ServerOptions ro = WithFolder(dir_, 1);
  ro.restore = true;
  auto c = LocalCluster::Start(1, false, ro);
  auto w = c.Connect(0, 1);
  TableSpec plain = spec;
  plain.admit_after = 1;  // no lifecycle at all
  const Status off = w->Declare(plain);
  EXPECT_EQ(off.code(), StatusCode::kAlreadyExists) << off;
  EXPECT_NE(off.message().find("table 'emb' cannot change its row lifecycle on -> off"), std::string::npos) << off;
  TableSpec resumed = spec;
  resumed.admit_after = 1;
  resumed.max_rows = 1000;  // still a lifecycle: admission at the first push, and a row bound
  ASSERT_TRUE(w->Declare(resumed).ok());
  ASSERT_TRUE(w->PushSparse("emb", id, g, 1).wait().ok());
  ASSERT_TRUE(w->PullSparse("emb", id, out, 2).wait(5s).ok());
  EXPECT_EQ(out, std::vector<float>(4, -1.0f)) << "admitted at this push under the new settings";
}

TEST_F(CheckpointRequests, RefusalsSayWhy) {
  // A server without a folder.
  {
    auto c = LocalCluster::Start(1);
    auto w = c.Connect(0, 1);
    const Status s = w->Checkpoint(0);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("--checkpoint-dir"), std::string::npos) << s;
  }
  // Servers that do not share their folder: the commit finds the other server's shard missing.
  {
    auto c = LocalCluster::Start(1, false, WithFolder(dir_ / "a"));
    auto other = LocalCluster::Start(1, false, WithFolder(dir_ / "b"));
    auto w = c.Connect(0, 1);
    std::vector<CheckpointShard> shards(1);
    ASSERT_TRUE(w->SaveCheckpoint(3, shards).wait().ok());
    // A manifest may name only the files a checkpoint of that step and server count has.
    std::vector<CheckpointShard> wrong = shards;
    wrong[0].file = "../../etc/passwd";
    Status s = w->CommitCheckpoint(3, wrong);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("must be 'step-00000000000000000003-shard-00000-of-00001.ckpt'"), std::string::npos)
        << s;
    EXPECT_EQ(w->CommitCheckpoint(4, shards).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(w->CommitCheckpoint(3, {}).code(), StatusCode::kInvalidArgument);
    auto w2 = other.Connect(0, 1);
    s = w2->CommitCheckpoint(3, shards);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("is missing"), std::string::npos) << s;
    EXPECT_NE(s.message().find("share the checkpoint folder"), std::string::npos) << s;
    std::vector<CheckpointShard> short_by_one = shards;
    short_by_one[0].bytes -= 1;
    s = w->CommitCheckpoint(3, short_by_one);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("its server wrote"), std::string::npos) << s;
    EXPECT_FALSE(fs::exists(dir_ / "a" / "CURRENT"));
    ASSERT_TRUE(w->CommitCheckpoint(3, shards).ok());
    EXPECT_TRUE(fs::exists(dir_ / "a" / "CURRENT"));
  }
  // Starting from a folder with no checkpoint, or without the worker count.
  {
    ServerOptions o = WithFolder(dir_ / "empty", 2);
    o.restore = true;
    fs::create_directories(dir_ / "empty");
    auto s = Server::Start(o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kNotFound) << s.status();
    EXPECT_NE(s.status().message().find("no usable checkpoint in " + (dir_ / "empty").string()), std::string::npos)
        << s.status();
    o.num_workers = 0;
    s = Server::Start(o);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("--num-workers"), std::string::npos) << s.status();
  }
  // A worker count that disagrees with the server's.
  {
    auto c = LocalCluster::Start(1, false, WithFolder(dir_, 2));
    ClientOptions o;
    o.servers = c.endpoints;
    o.num_workers = 3;
    o.context = c.context;
    auto client = Client::Connect(o);
    ASSERT_FALSE(client.ok());
    EXPECT_NE(client.status().message().find("but it has 2"), std::string::npos) << client.status();
  }
}

TEST_F(CheckpointRequests, ServersStartFromTheNewestCheckpointThatVerifies) {
  {
    auto c = LocalCluster::Start(2, false, WithFolder(dir_));
    auto w = c.Connect(0, 1);
    ASSERT_TRUE(w->Declare(SyncSgd("w", 12)).ok());
    std::vector<float> g(12, 1.0f);
    for (int64_t step = 0; step < 3; ++step) {
      ASSERT_TRUE(w->Checkpoint(step).ok());
      ASSERT_TRUE(w->PushDense("w", g, step).wait().ok());
    }
  }
  // The newest (step 2): one byte of server 1's shard flipped.
  const fs::path shard = dir_ / "step-00000000000000000002-shard-00001-of-00002.ckpt";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(40);
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x5a);
    f.seekp(40);
    f.write(&b, 1);
  }
  ServerOptions ro = WithFolder(dir_, 1);
  ro.restore = true;
  testing::internal::CaptureStderr();
  auto restored = LocalCluster::Start(1, false, ro);
  const std::string said = testing::internal::GetCapturedStderr();
  ASSERT_EQ(restored.servers.size(), 1u);
  EXPECT_EQ(restored.servers[0]->restored_step(), 1);
  EXPECT_NE(said.find("passed over a checkpoint"), std::string::npos) << said;
  EXPECT_NE(said.find(shard.filename().string()), std::string::npos) << said;
  auto w = restored.Connect(0, 1);
  ASSERT_TRUE(w->Declare(SyncSgd("w", 12)).ok());
  std::vector<float> out(12);
  ASSERT_TRUE(w->PullDense("w", out, 1).wait(5s).ok());
  EXPECT_EQ(out, std::vector<float>(12, -1.0f));  // one step applied, as at step 1
}

TEST_F(CheckpointRequests, ARestartedWorkersPushOfTheStepItsDeadProcessHadPushedIsTakenForThatPush) {
  auto c = LocalCluster::Start(2);
  auto w0 = c.Connect(0, 2);
  std::vector<float> g(12, 1.0f), out(12);
  ASSERT_TRUE(w0->Declare(SyncSgd("w", 12)).ok());
  {
    // Worker 1 pushes step 0, then its process dies before the step closes.
    auto w1 = c.Connect(1, 2);
    ASSERT_TRUE(w1->Declare(SyncSgd("w", 12)).ok());
    ASSERT_TRUE(w1->PushDense("w", std::vector<float>(12, 100.0f), 0).wait().ok());
  }
  // Its new process connects, pulls (the global step is still 0), and pushes step 0 again:
  // answered, and taken for the dead process's push sent again: the step keeps that gradient, the
  // one computed from the step's parameters (the new process's may not be: a step closed already
  // on another server gives it the next step's). A different one here, to tell them apart.
  ClientOptions next;
  next.incarnation = 1;
  auto w1 = c.Connect(1, 2, next);
  ASSERT_TRUE(w1->Declare(SyncSgd("w", 12)).ok());
  Handle p = w1->PullDense("w", out, 0);
  ASSERT_TRUE(p.wait(5s).ok());
  EXPECT_EQ(p.served().version, 0);
  ASSERT_TRUE(w1->PushDense("w", g, 0).wait().ok());
  ASSERT_TRUE(w0->PushDense("w", g, 0).wait().ok());
  ASSERT_TRUE(w0->PullDense("w", out, 1).wait(5s).ok());
  EXPECT_EQ(out, std::vector<float>(12, -50.5f));  // 0 - (100 + 1) / 2
}

// A worker's steps (protocol 1.11) come from the servers that hold what it pushes: of 3 servers,
// the two that hold nothing of this async table know nothing of its steps, and neither a
// restarted worker nor the checkpoint takes their ignorance for step 0.
TEST_F(CheckpointRequests, AWorkersStepsComeFromTheServersThatHoldWhatItPushes) {
  std::vector<int64_t> recorded;
  {
    auto c = LocalCluster::Start(3, false, WithFolder(dir_, 1));
    auto w0 = c.Connect(0, 1);
    EXPECT_EQ(w0->worker_step(), 0) << "no server knows a step: it has pushed nothing";
    ASSERT_TRUE(w0->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());  // one chunk: on one server
    const std::vector<float> g(4, 1.0f);
    for (int step = 0; step < 5; ++step) ASSERT_TRUE(w0->PushDense("w", g, step).wait().ok());
    ClientOptions next;
    next.incarnation = 1;
    auto restarted = c.Connect(0, 1, next);
    EXPECT_EQ(restarted->worker_step(), 5);
    EXPECT_FALSE(restarted->worker_step_restored());
    ASSERT_TRUE(restarted->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());
    ASSERT_TRUE(restarted->PushDense("w", g, 5).wait().ok());
    ASSERT_TRUE(restarted->Checkpoint(6).ok());
    std::ifstream in(dir_ / "MANIFEST-00000000000000000006");
    ASSERT_TRUE(in);
    recorded = nlohmann::json::parse(in).at("worker_steps").get<std::vector<int64_t>>();
  }
  EXPECT_EQ(recorded, std::vector<int64_t>({6}));
  ServerOptions ro = WithFolder(dir_, 1);
  ro.restore = true;
  auto restored = LocalCluster::Start(2, false, ro);
  auto w0 = restored.Connect(0, 1);
  EXPECT_EQ(w0->worker_step(), 6);
  EXPECT_TRUE(w0->worker_step_restored());
}

// Servers with --checkpoint-deltas: the client's second checkpoint is a delta over its first;
// the same step asked for again is saved whole (a delta would overwrite the file it is a delta
// of); a delta follows again.
TEST_F(CheckpointRequests, DeltasFollowTheCheckpointTheClientCommitted) {
  ServerOptions o = WithFolder(dir_, 1);
  o.checkpoint_deltas = 3;
  auto c = LocalCluster::Start(2, false, o);
  auto w = c.Connect(0, 1);
  ASSERT_TRUE(w->Declare(SgdSparseTable("e", 2)).ok());
  std::vector<int64_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
  ASSERT_TRUE(w->PushSparse("e", ids, std::vector<float>(2000, 1.0f), 0).wait().ok());
  const auto format = [&](int step) {
    std::ifstream in(dir_ / ("MANIFEST-0000000000000000000" + std::to_string(step)));
    return nlohmann::json::parse(in).at("format").get<int>();
  };
  ASSERT_TRUE(w->Checkpoint(1).ok());
  EXPECT_EQ(format(1), 1);
  const std::vector<int64_t> few = {3, 4};
  ASSERT_TRUE(w->PushSparse("e", few, std::vector<float>(4, 1.0f), 1).wait().ok());
  ASSERT_TRUE(w->Checkpoint(2).ok());
  EXPECT_EQ(format(2), 2);
  ASSERT_TRUE(w->PushSparse("e", few, std::vector<float>(4, 1.0f), 2).wait().ok());
  ASSERT_TRUE(w->Checkpoint(2).ok());  // the same step again
  EXPECT_EQ(format(2), 1);
  ASSERT_TRUE(w->PushSparse("e", few, std::vector<float>(4, 1.0f), 3).wait().ok());
  ASSERT_TRUE(w->Checkpoint(4).ok());
  EXPECT_EQ(format(4), 2);
  std::vector<float> rows(4);
  ASSERT_TRUE(w->PullSparse("e", few, rows, 4).wait(5s).ok());
  EXPECT_EQ(rows, std::vector<float>(4, -4.0f));
  for (int step : {4, 2}) {  // the chain 2 (the second, full), 4; then 2 alone
    ServerOptions ro = WithFolder(dir_, 1);
    ro.restore = true;
    if (step == 2) fs::remove(dir_ / "MANIFEST-00000000000000000004");
    auto restored = LocalCluster::Start(3, false, ro);
    auto r = restored.Connect(0, 1);
    ASSERT_TRUE(r->Declare(SgdSparseTable("e", 2)).ok());
    ASSERT_TRUE(r->PullSparse("e", few, rows, 0).wait(5s).ok());
    EXPECT_EQ(rows, std::vector<float>(4, step == 4 ? -4.0f : -3.0f)) << "restored step " << step;
  }
}

// Exactly once across a restore (async): a checkpoint is no cut of a worker's steps, for each
// server saves when it gets the request, so one server can hold a worker's push of step 5 that
// another has not taken. The worker resumes at the lowest step any server knew (5) and pushes step
// 5 again: the server that held it skips that push for what it held (counted), the other applies
// it, so every step counts once on every chunk and row, also when the servers are re-placed.
// Two one-chunk tables on different servers of 2, and 3 sparse ids on each.
struct TwoServerParts {
  std::string on0, on1;              // dense tables whose one chunk is on server 0, on server 1
  std::vector<int64_t> ids0, ids1;   // sparse ids on server 0, on server 1
  TwoServerParts() {
    for (int k = 0; on0.empty() || on1.empty(); ++k) {
      const std::string name = "t" + std::to_string(k);
      (placement::ChunkServer(TableId(name), 0, 2) == 0 ? on0 : on1) = name;
    }
    for (int64_t id = 0; ids0.size() < 3 || ids1.size() < 3; ++id) {
      (placement::IdServer(id, 2) == 0 ? ids0 : ids1).push_back(id);
    }
  }
  // Declares both dense tables (async, 4 floats) and the sparse table "e" (dim 2).
  void Declare(Client& w) const {
    for (const auto& name : {on0, on1}) ASSERT_TRUE(w.Declare(SgdTable(name, 4, Consistency::kAsync)).ok());
    ASSERT_TRUE(w.Declare(SgdSparseTable("e", 2)).ok());
  }
};

TEST_F(CheckpointRequests, AnAsyncPushReplayedAfterARestoreCountsOnceWhereTheCheckpointHeldIt) {
  // Two one-chunk tables, on different servers of 2; a sparse table's rows on both.
  const TwoServerParts parts;
  const std::string &on0 = parts.on0, &on1 = parts.on1;
  const std::vector<int64_t> &ids0 = parts.ids0, &ids1 = parts.ids1;
  const std::vector<float> g(4, 1.0f);
  std::vector<float> a(4), b(4), r0(6), r1(6);
  {
    auto c = LocalCluster::Start(2, false, WithFolder(dir_, 1));
    auto w = c.Connect(0, 1);
    for (const auto& name : {on0, on1}) ASSERT_TRUE(w->Declare(SgdTable(name, 4, Consistency::kAsync)).ok());
    ASSERT_TRUE(w->Declare(SgdSparseTable("e", 2)).ok());
    const std::vector<float> rows(6, 1.0f);
    for (int step = 0; step < 5; ++step) {
      ASSERT_TRUE(w->PushDense(on0, g, step).wait().ok());
      ASSERT_TRUE(w->PushDense(on1, g, step).wait().ok());
      ASSERT_TRUE(w->PushSparse("e", ids0, rows, step).wait().ok());
      ASSERT_TRUE(w->PushSparse("e", ids1, rows, step).wait().ok());
    }
    // Step 5 reached server 0 only when the checkpoint was taken.
    ASSERT_TRUE(w->PushDense(on0, g, 5).wait().ok());
    ASSERT_TRUE(w->PushSparse("e", ids0, rows, 5).wait().ok());
    ASSERT_TRUE(w->Checkpoint(6).ok());
    ASSERT_TRUE(w->PullDense(on0, a, 6).wait(5s).ok());
    ASSERT_TRUE(w->PullDense(on1, b, 6).wait(5s).ok());
    EXPECT_EQ(a, std::vector<float>(4, -6.0f));
    EXPECT_EQ(b, std::vector<float>(4, -5.0f));
  }
  for (const int servers : {2, 3}) {
    ServerOptions ro = WithFolder(dir_, 1);
    ro.restore = true;
    auto c = LocalCluster::Start(servers, false, ro);
    auto w = c.Connect(0, 1);
    ASSERT_EQ(w->worker_step(), 5) << "the worker resumes at the lowest step a server knew";
    for (const auto& name : {on0, on1}) ASSERT_TRUE(w->Declare(SgdTable(name, 4, Consistency::kAsync)).ok());
    ASSERT_TRUE(w->Declare(SgdSparseTable("e", 2)).ok());
    // The replay of step 5, whole: counted once everywhere.
    const std::vector<float> rows(6, 1.0f);
    ASSERT_TRUE(w->PushDense(on0, g, 5).wait().ok());
    ASSERT_TRUE(w->PushDense(on1, g, 5).wait().ok());
    ASSERT_TRUE(w->PushSparse("e", ids0, rows, 5).wait().ok());
    ASSERT_TRUE(w->PushSparse("e", ids1, rows, 5).wait().ok());
    ASSERT_TRUE(w->PullDense(on0, a, 6).wait(5s).ok());
    ASSERT_TRUE(w->PullDense(on1, b, 6).wait(5s).ok());
    ASSERT_TRUE(w->PullSparse("e", ids0, r0, 6).wait(5s).ok());
    ASSERT_TRUE(w->PullSparse("e", ids1, r1, 6).wait(5s).ok());
    EXPECT_EQ(a, std::vector<float>(4, -6.0f)) << servers << " servers: server 0's step 5 applied twice";
    EXPECT_EQ(b, std::vector<float>(4, -6.0f)) << servers << " servers";
    EXPECT_EQ(r0, std::vector<float>(6, -6.0f)) << servers << " servers: server 0's rows of step 5 applied twice";
    EXPECT_EQ(r1, std::vector<float>(6, -6.0f)) << servers << " servers";
    int64_t skipped = 0;
    for (const auto& s : c.servers) skipped += s->stats().counters["replayed_updates_skipped"];
    EXPECT_EQ(skipped, 1 + 3) << "server 0's chunk and its 3 rows";
    // The next step is no replay: applied everywhere.
    ASSERT_TRUE(w->PushDense(on0, g, 6).wait().ok());
    ASSERT_TRUE(w->PullDense(on0, a, 7).wait(5s).ok());
    EXPECT_EQ(a, std::vector<float>(4, -7.0f));
  }
}

// A worker's async step reaches a server in several requests (the dense push, then the sparse
// one): a checkpoint taken between them holds the dense part of the step and not the sparse one.
// Until protocol 1.25 the server's record of the worker's steps said the step was taken there, so
// the worker resumed past it and the sparse part was lost (launch_test's RecoveryTest.
// test_async_criteo_stream_killed_twice... counted 4 of 240 examples twice instead of 3 times
// once, stop 67). Now the server holds step 5 whole for no table share that lags (the sparse
// one), so the worker resumes at step 5, and the replay floors are by table share: the dense part
// is skipped, the sparse part applied, whether 2 servers restore the checkpoint or 3.
TEST_F(CheckpointRequests, AStepACheckpointCutBetweenItsDenseAndSparsePushIsReplayedWhereItWasNotHeld) {
  const TwoServerParts parts;
  const std::string& on0 = parts.on0;
  const std::vector<int64_t>& ids0 = parts.ids0;
  const std::vector<float> g(4, 1.0f), rows(6, 1.0f);
  std::vector<float> a(4), r0(6);
  {
    // Worker 1 trains; worker 0 asks for the checkpoint between its own steps (0 to 5, of a
    // table of its own: it never pushes "e", whose shares so lag its steps) while worker 1 is
    // between the two requests of its step 5.
    auto c = LocalCluster::Start(2, false, WithFolder(dir_, 2));
    auto w0 = c.Connect(0, 2);
    auto w = c.Connect(1, 2);
    ASSERT_TRUE(w->Declare(SgdTable(on0, 4, Consistency::kAsync)).ok());
    ASSERT_TRUE(w->Declare(SgdSparseTable("e", 2)).ok());
    ASSERT_TRUE(w0->Declare(SgdTable("own", 4, Consistency::kAsync)).ok());
    for (int step = 0; step < 5; ++step) {
      ASSERT_TRUE(w->PushDense(on0, g, step).wait().ok());
      ASSERT_TRUE(w->PushSparse("e", ids0, rows, step).wait().ok());
    }
    for (int step = 0; step <= 5; ++step) ASSERT_TRUE(w0->PushDense("own", g, step).wait().ok());
    ASSERT_TRUE(w->PushDense(on0, g, 5).wait().ok());  // step 5's dense part; its sparse part after the cut
    ASSERT_TRUE(w0->Checkpoint(6).ok());
  }
  for (const int servers : {2, 3}) {
    ServerOptions ro = WithFolder(dir_, 2);
    ro.restore = true;
    auto c = LocalCluster::Start(servers, false, ro);
    EXPECT_EQ(c.Connect(0, 2)->worker_step(), 6) << servers << " servers: the worker that asked had done 6 steps";
    auto w = c.Connect(1, 2);
    ASSERT_TRUE(w->Declare(SgdTable(on0, 4, Consistency::kAsync)).ok());
    ASSERT_TRUE(w->Declare(SgdSparseTable("e", 2)).ok());
    ASSERT_EQ(w->worker_step(), 5) << servers << " servers: step 5 is not whole in the checkpoint: it is replayed";
    ASSERT_TRUE(w->PushDense(on0, g, 5).wait().ok());
    ASSERT_TRUE(w->PushSparse("e", ids0, rows, 5).wait().ok());
    ASSERT_TRUE(w->PullDense(on0, a, 6).wait(5s).ok());
    ASSERT_TRUE(w->PullSparse("e", ids0, r0, 6).wait(5s).ok());
    EXPECT_EQ(a, std::vector<float>(4, -6.0f)) << servers << " servers: the dense part of step 5, held, applied again";
    EXPECT_EQ(r0, std::vector<float>(6, -6.0f))
        << servers << " servers: the sparse part of step 5, not held, not applied";
    int64_t skipped = 0;
    for (const auto& s : c.servers) skipped += s->stats().counters["replayed_updates_skipped"];
    EXPECT_EQ(skipped, 1) << servers << " servers: the dense chunk alone";
  }
}

// The same cut by a worker's death: its process dies between its dense and sparse pushes of step
// 5 to server 0 (server 1 took the whole step). Restarted alone, it resumes at step 5, which
// server 0 does not hold whole, and the replay is applied where it was not taken.
TEST_F(CheckpointRequests, AnAsyncWorkerThatDiedBetweenTwoTablesPushesOfAStepResumesAtThatStep) {
  const TwoServerParts parts;
  const std::string &on0 = parts.on0, &on1 = parts.on1;
  const std::vector<int64_t> &ids0 = parts.ids0, &ids1 = parts.ids1;
  const std::vector<float> g(4, 1.0f), rows(6, 1.0f);
  auto c = LocalCluster::Start(2);
  {
    auto w = c.Connect(0, 1);
    parts.Declare(*w);
    for (int s = 0; s <= 5; ++s) {
      ASSERT_TRUE(w->PushDense(on1, g, s).wait().ok());
      ASSERT_TRUE(w->PushSparse("e", ids1, rows, s).wait().ok());
      ASSERT_TRUE(w->PushDense(on0, g, s).wait().ok());
      if (s == 5) break;  // the process dies before its sparse push of step 5 to server 0
      ASSERT_TRUE(w->PushSparse("e", ids0, rows, s).wait().ok());
    }
  }
  ClientOptions next;
  next.incarnation = 1;
  next.resumes = true;
  auto w = c.Connect(0, 1, next);
  ASSERT_EQ(w->worker_step(), 5) << "server 0 did not take step 5 whole";
  parts.Declare(*w);
  ASSERT_TRUE(w->PushDense(on1, g, 5).wait().ok());
  ASSERT_TRUE(w->PushSparse("e", ids1, rows, 5).wait().ok());
  ASSERT_TRUE(w->PushDense(on0, g, 5).wait().ok());
  ASSERT_TRUE(w->PushSparse("e", ids0, rows, 5).wait().ok());
  std::vector<float> a(4), b(4), r0(6), r1(6);
  ASSERT_TRUE(w->PullDense(on0, a, 6).wait(5s).ok());
  ASSERT_TRUE(w->PullDense(on1, b, 6).wait(5s).ok());
  ASSERT_TRUE(w->PullSparse("e", ids0, r0, 6).wait(5s).ok());
  ASSERT_TRUE(w->PullSparse("e", ids1, r1, 6).wait(5s).ok());
  EXPECT_EQ(a, std::vector<float>(4, -6.0f));
  EXPECT_EQ(b, std::vector<float>(4, -6.0f));
  EXPECT_EQ(r0, std::vector<float>(6, -6.0f)) << "server 0's rows of step 5, never pushed before, applied";
  EXPECT_EQ(r1, std::vector<float>(6, -6.0f));
  EXPECT_EQ(c.servers[0]->stats().counters["replayed_updates_skipped"], 1) << "server 0's chunk";
  EXPECT_EQ(c.servers[1]->stats().counters["replayed_updates_skipped"], 2) << "server 1's chunk and its rows";
}

// A worker restarted alone (the servers live on): its new process (a later incarnation) resumes
// at the lowest step any server knew and pushes that step again; a server that had taken it skips
// it, part by part (a dense chunk, a server's share of a sparse table), and one that had not
// applies it.
TEST_F(CheckpointRequests, AnAsyncWorkerRestartedAloneIsAppliedOnceWhereAServerTookItsStep) {
  const TwoServerParts parts;
  const std::string &on0 = parts.on0, &on1 = parts.on1;
  const std::vector<int64_t> &ids0 = parts.ids0, &ids1 = parts.ids1;
  const std::vector<float> g(4, 1.0f), rows(6, 1.0f);
  auto c = LocalCluster::Start(2);
  auto step = [&](Client& w, int s, bool server1_too) {
    ASSERT_TRUE(w.PushDense(on0, g, s).wait().ok());
    ASSERT_TRUE(w.PushSparse("e", ids0, rows, s).wait().ok());
    if (!server1_too) return;
    ASSERT_TRUE(w.PushDense(on1, g, s).wait().ok());
    ASSERT_TRUE(w.PushSparse("e", ids1, rows, s).wait().ok());
  };
  {
    auto w = c.Connect(0, 1);
    parts.Declare(*w);
    for (int s = 0; s < 5; ++s) step(*w, s, true);
    step(*w, 5, false);  // the process dies with step 5 taken by server 0 alone
  }
  ClientOptions next;
  next.incarnation = 1;  // the launcher's restart,
  next.resumes = true;   // with --resume: it starts at worker_step()
  auto w = c.Connect(0, 1, next);
  ASSERT_EQ(w->worker_step(), 5) << "the worker resumes at the lowest step a server knew";
  parts.Declare(*w);
  step(*w, 5, true);  // the replay of step 5, whole
  std::vector<float> a(4), b(4), r0(6), r1(6);
  ASSERT_TRUE(w->PullDense(on0, a, 6).wait(5s).ok());
  ASSERT_TRUE(w->PullDense(on1, b, 6).wait(5s).ok());
  ASSERT_TRUE(w->PullSparse("e", ids0, r0, 6).wait(5s).ok());
  ASSERT_TRUE(w->PullSparse("e", ids1, r1, 6).wait(5s).ok());
  EXPECT_EQ(a, std::vector<float>(4, -6.0f)) << "server 0's step 5 applied twice";
  EXPECT_EQ(b, std::vector<float>(4, -6.0f));
  EXPECT_EQ(r0, std::vector<float>(6, -6.0f)) << "server 0's rows of step 5 applied twice";
  EXPECT_EQ(r1, std::vector<float>(6, -6.0f));
  EXPECT_EQ(c.servers[0]->stats().counters["replayed_updates_skipped"], 2) << "server 0's chunk and its rows";
  EXPECT_EQ(c.servers[1]->stats().counters["replayed_updates_skipped"], 0);
  // The next step is no replay; nor is a second push of one step (async takes both).
  step(*w, 6, true);
  ASSERT_TRUE(w->PushDense(on0, g, 6).wait().ok());
  ASSERT_TRUE(w->PullDense(on0, a, 7).wait(5s).ok());
  EXPECT_EQ(a, std::vector<float>(4, -8.0f));
}

}  // namespace
}  // namespace ferry::test
