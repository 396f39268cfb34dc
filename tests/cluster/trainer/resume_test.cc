// Checkpoint and resume of a training job (issue 14): in sync mode, a run stopped and resumed
// from a checkpoint gives bitwise the same final state as an uninterrupted run, whatever the
// number of servers it is restored into. Worker 0 asks for the checkpoints (--checkpoint-every);
// the servers write them (ServerOptions::checkpoint_dir); new servers start from the newest one
// that verifies (ServerOptions::restore) and the workers continue from its step (--resume): the
// data position, epoch and shuffle follow from the step alone.
//
// "Final state" is every table on the servers, read back from each run's final checkpoint:
// every parameter, every optimizer slot, every sparse row with its update count, every version.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/trainer/models.h"
#include "internal/checkpoint.h"
#include "support/cluster.h"
#include "support/temp_dir.h"
#include "worker_runs.h"

namespace ferry::trainer {
namespace {

namespace fs = std::filesystem;

// A small MLP job on the CPU (hidden layer of 6, batch 4), for `steps` steps.
TrainerOptions SmallMlp(int64_t steps) {
  TrainerOptions o;
  o.device = DeviceKind::kCpu;
  o.hidden = {6};
  o.batch = 4;
  o.log_every = 0;
  o.steps = steps;
  return o;
}

// The ctr model on a small dataset (batch 8, 32 test examples), sync, one BLAS thread.
TrainerOptions SmallCtr(OptimizerType optimizer, float lr, int64_t checkpoint_every) {
  TrainerOptions o = test::CtrOptions(optimizer, lr, 0);
  o.ctr().test = 32;
  o.batch = 8;
  o.checkpoint_every = checkpoint_every;
  o.blas_threads = 1;
  return o;
}

// SmallMlp, async, with a checkpoint every 5 steps.
TrainerOptions AsyncMlp(int64_t steps) {
  TrainerOptions o = SmallMlp(steps);
  o.consistency = Consistency::kAsync;
  o.checkpoint_every = 5;
  return o;
}

class ResumeTest : public testing::Test {
 protected:

  // Servers that write checkpoints into `dir` (and start from its newest one with `restore`).
  // `max_wait`: how long a held pull may wait (a test of one that should not wait shortens it).
  // `deltas`: ServerOptions::checkpoint_deltas (delta checkpoints).
  static ferry::test::LocalCluster Servers(int n, const fs::path& dir, int num_workers, bool restore,
                                           std::chrono::milliseconds max_wait = ServerOptions().max_wait,
                                           int deltas = 0) {
    ServerOptions so;
    so.checkpoint_deltas = deltas;
    so.checkpoint_delta_share = 100;  // (the test's tables change whole between checkpoints)
    so.compute_threads = 1;
    so.checkpoint_dir = dir.string();
    so.num_workers = num_workers;
    so.restore = restore;
    so.keep_checkpoints = 10;
    so.max_wait = max_wait;
    return ferry::test::LocalCluster::Start(n, false, so);
  }

  // Restores `servers` servers from the newest checkpoint of `dir` (of step `from`) and resumes
  // the job's `workers` to `to` steps: each begins at `from` and runs the rest, and the job's
  // final checkpoint is of `to`.
  static void ResumeTo(TrainerOptions o, const Datasets& data, const fs::path& dir, int servers, int workers,
                       int64_t from, int64_t to, std::chrono::milliseconds max_wait = ServerOptions().max_wait) {
    o.steps = to;
    o.resume = true;
    auto cluster = Servers(servers, dir, workers, true, max_wait);
    auto runs = test::RunWorkers(cluster, workers, o, data);
    ExpectAllOk(runs);
    for (const auto& r : runs) {
      if (!r.report.ok()) continue;
      EXPECT_EQ(r.report->first_step, from);
      EXPECT_EQ(r.report->steps, to - from);
    }
    EXPECT_EQ(Final(dir).step, to);
  }

  static void ExpectAllOk(const std::vector<test::WorkerRun>& runs) {
    for (size_t r = 0; r < runs.size(); ++r)
      ASSERT_TRUE(runs[r].report.ok()) << "worker " << r << ": " << runs[r].report.status();
  }

  // The newest checkpoint of `dir`, read back whole.
  static ps::CheckpointData Final(const fs::path& dir) {
    auto c = ps::ReadCheckpoint(dir.string());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : ps::CheckpointData{};
  }

  // Every table of `a` and `b` bitwise equal (values, optimizer state, row counts, versions).
  static void ExpectSameTables(const ps::CheckpointData& a, const ps::CheckpointData& b) {
    ASSERT_EQ(a.step, b.step);
    ASSERT_EQ(a.tables.size(), b.tables.size());
    size_t rows = 0, chunks = 0;
    for (const auto& [id, ta] : a.tables) {
      ASSERT_EQ(b.tables.count(id), 1u) << ta.spec.name;
      const auto& tb = b.tables.at(id);
      EXPECT_TRUE(ta.spec == tb.spec) << ta.spec.name;
      EXPECT_EQ(ta.sparse_version, tb.sparse_version) << ta.spec.name;
      ASSERT_EQ(ta.chunks.size(), tb.chunks.size()) << ta.spec.name;
      for (const auto& [i, ca] : ta.chunks) {
        const auto& cb = tb.chunks.at(i);
        EXPECT_EQ(ca.version, cb.version) << ta.spec.name << " chunk " << i;
        EXPECT_EQ(ca.params, cb.params) << ta.spec.name << " chunk " << i;
        EXPECT_EQ(ca.state, cb.state) << ta.spec.name << " chunk " << i << " optimizer state";
        ++chunks;
      }
      ASSERT_EQ(ta.rows.size(), tb.rows.size()) << ta.spec.name;
      for (const auto& [id_row, ra] : ta.rows) {
        ASSERT_EQ(tb.rows.count(id_row), 1u) << ta.spec.name << " id " << id_row;
        EXPECT_EQ(ra.steps, tb.rows.at(id_row).steps) << ta.spec.name << " id " << id_row;
        EXPECT_EQ(ra.values, tb.rows.at(id_row).values) << ta.spec.name << " id " << id_row;
        ++rows;
      }
    }
    std::printf("compared %zu tables: %zu dense chunks, %zu sparse rows\n", a.tables.size(), chunks, rows);
    EXPECT_GT(chunks, 0u);
  }

  // Runs the job uninterrupted for `steps` on `servers_before` servers, and again stopped after
  // `stop_at` steps, then restored into `servers_after` servers from the checkpoint of
  // `resume_from` (newer ones are deleted: the job "died" after writing it) and resumed to
  // `steps`; returns the two final checkpoints. The stopped and resumed runs' servers write
  // `deltas` delta checkpoints after each full one.
  std::pair<ps::CheckpointData, ps::CheckpointData> StopAndResume(TrainerOptions o, const Datasets& data, int workers,
                                                                  int servers_before, int servers_after, int64_t steps,
                                                                  int64_t stop_at, int64_t resume_from,
                                                                  int deltas = 0) {
    const fs::path whole = root_ / "whole", cut = root_ / "cut";
    o.steps = steps;
    {
      auto cluster = Servers(servers_before, whole, workers, false);
      auto runs = test::RunWorkers(cluster, workers, o, data);
      ExpectAllOk(runs);
      EXPECT_GE(runs[0].report->checkpoints, 2);
    }
    o.steps = stop_at;
    {
      auto cluster = Servers(servers_before, cut, workers, false, ServerOptions().max_wait, deltas);
      ExpectAllOk(test::RunWorkers(cluster, workers, o, data));
    }
    // The job died after its checkpoint of `resume_from`: what came after never happened.
    for (const auto& e : fs::directory_iterator(cut)) {
      const std::string n = e.path().filename().string();
      if (n.starts_with("MANIFEST-") && std::stoll(n.substr(9)) > resume_from) fs::remove(e.path());
    }
    o.steps = steps;
    o.resume = true;
    {
      auto cluster = Servers(servers_after, cut, workers, true, ServerOptions().max_wait, deltas);
      for (const auto& s : cluster.servers) EXPECT_EQ(s->restored_step(), resume_from);
      auto runs = test::RunWorkers(cluster, workers, o, data);
      ExpectAllOk(runs);
      for (const auto& r : runs) {
        EXPECT_EQ(r.report->first_step, resume_from);
        EXPECT_EQ(r.report->steps, steps - resume_from);
      }
    }
    return {Final(whole), Final(cut)};
  }

  ferry::test::TempDir tmp_{"resume"};
  const fs::path root_ = tmp_.path();
};

TEST_F(ResumeTest, SyncMlpStoppedAndResumedIntoThreeServersIsBitwiseTheUninterruptedRun) {
  // 44 examples, batch 4 per worker: 6 steps an epoch (the last one short), so the resumed part
  // starts mid-epoch and crosses epoch boundaries, with their reshuffles.
  const data::ImageDataset train = test::MakeImages(44, 12345), test_set = test::MakeImages(16, 777);
  const Datasets data{&train, &test_set};
  TrainerOptions o;
  o.device = DeviceKind::kCpu;
  o.hidden = {8, 6};
  o.optimizer.type = OptimizerType::kAdam;
  o.optimizer.learning_rate = 0.01f;
  o.batch = 4;
  o.seed = 7;
  o.log_every = 0;
  o.eval_every = 5;  // evaluations (a collective over both workers) before and after the cut
  o.checkpoint_every = 4;
  o.blas_threads = 1;
  auto [whole, resumed] = StopAndResume(o, data, /*workers=*/2, /*servers_before=*/2, /*servers_after=*/3,
                                        /*steps=*/22, /*stop_at=*/11, /*resume_from=*/8);
  EXPECT_EQ(whole.step, 22);
  ExpectSameTables(whole, resumed);
}

TEST_F(ResumeTest, SyncCtrWithSparseTablesResumedIntoOneServerIsBitwiseTheUninterruptedRun) {
  const TrainerOptions o = SmallCtr(OptimizerType::kAdagrad, 0.05f, /*checkpoint_every=*/5);
  auto ctr = LoadCtrData(o);
  ASSERT_TRUE(ctr.ok()) << ctr.status();
  Datasets data;
  data.ctr = &*ctr;
  auto [whole, resumed] = StopAndResume(o, data, /*workers=*/2, /*servers_before=*/2, /*servers_after=*/1,
                                        /*steps=*/16, /*stop_at=*/12, /*resume_from=*/10);
  size_t sparse_rows = 0;
  for (const auto& [id, t] : whole.tables) sparse_rows += t.rows.size();
  EXPECT_GT(sparse_rows, 0u) << "the ctr model has sparse tables";
  ExpectSameTables(whole, resumed);
}

// Delta checkpoints: every 2 steps, 3 deltas after each full one, so step 8 is the third delta
// over step 2's full shards; restored from that chain into 3 servers (which write a new chain)
// and resumed, the job ends with the bits of the uninterrupted run without deltas.
TEST_F(ResumeTest, SyncCtrResumedFromAChainOfDeltasIsBitwiseTheUninterruptedRun) {
  const TrainerOptions o = SmallCtr(OptimizerType::kAdam, 0.02f, /*checkpoint_every=*/2);
  auto ctr = LoadCtrData(o);
  ASSERT_TRUE(ctr.ok()) << ctr.status();
  Datasets data;
  data.ctr = &*ctr;
  auto [whole, resumed] = StopAndResume(o, data, /*workers=*/2, /*servers_before=*/2, /*servers_after=*/3,
                                        /*steps=*/14, /*stop_at=*/11, /*resume_from=*/8, /*deltas=*/3);
  nlohmann::json m;
  std::ifstream(root_ / "cut" / "MANIFEST-00000000000000000008") >> m;
  EXPECT_EQ(m["format"], 2) << m.dump();
  ASSERT_EQ(m["shards"][0]["base"].size(), 3u) << m.dump();  // steps 2 (full), 4, 6
  EXPECT_NE(m["shards"][0]["base"][0]["file"].get<std::string>().find("step-00000000000000000002-"),
            std::string::npos);
  ExpectSameTables(whole, resumed);
}

TEST_F(ResumeTest, AsyncWorkersResumeAtTheRestoredCheckpointsStep) {
  const data::ImageDataset train = test::MakeImages(64, 99);
  const Datasets data{&train, nullptr};
  TrainerOptions o = AsyncMlp(12);
  const fs::path dir = root_ / "async";
  {
    auto cluster = Servers(2, dir, 2, false);
    auto runs = test::RunWorkers(cluster, 2, o, data);
    ExpectAllOk(runs);
    EXPECT_EQ(runs[0].report->checkpoints, 3);  // steps 5, 10 and the end (12)
  }
  EXPECT_EQ(Final(dir).step, 12);
  EXPECT_NE(Final(dir).meaning.find("async"), std::string::npos) << Final(dir).meaning;
  ResumeTo(o, data, dir, 2, 2, 12, 20);
}

// Async: each worker counts its own steps, so a checkpoint records every worker's (as server 0
// had taken their pushes when it saved), and each resumes at its own: a worker that was behind
// worker 0 does not skip the examples between, nor one ahead repeat them. Before protocol 1.11
// every worker resumed at the checkpoint's step, worker 0's. Worker 1, restored at a step of its
// own below 10 (possibly 0), must not wait at the job's start barrier for worker 0, who resumes
// past it.
TEST_F(ResumeTest, AsyncWorkersEachResumeAtTheirOwnStep) {
  const data::ImageDataset train = test::MakeImages(64, 99);
  const Datasets data{&train, nullptr};
  TrainerOptions o = AsyncMlp(30);
  o.straggler_rank = 1;  // worker 1 falls behind worker 0 (100 ms a step)
  o.straggler_delay_ms = 100;
  const fs::path dir = root_ / "own";
  {
    auto cluster = Servers(2, dir, 2, false);
    ExpectAllOk(test::RunWorkers(cluster, 2, o, data));
  }
  // The job "died" after its checkpoint of step 10: what came after never happened.
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("MANIFEST-") && std::stoll(n.substr(9)) > 10) fs::remove(e.path());
  }
  const ps::CheckpointData ckpt = Final(dir);
  ASSERT_EQ(ckpt.step, 10);
  ASSERT_EQ(ckpt.worker_steps.size(), 2u);
  EXPECT_EQ(ckpt.worker_steps[0], 10) << "worker 0 asks after its pull of step 10, before its push";
  EXPECT_LT(ckpt.worker_steps[1], 10) << "worker 1 was behind";
  o.resume = true;
  o.straggler_rank = -1;
  auto cluster = Servers(2, dir, 2, true);
  auto runs = test::RunWorkers(cluster, 2, o, data);
  ExpectAllOk(runs);
  for (size_t r = 0; r < runs.size(); ++r) {
    EXPECT_EQ(runs[r].report->first_step, ckpt.worker_steps[r]) << "worker " << r;
    EXPECT_EQ(runs[r].report->steps, 30 - ckpt.worker_steps[r]) << "worker " << r;
  }
  // The final checkpoint comes after every worker has finished: all at 30.
  EXPECT_EQ(Final(dir).worker_steps, std::vector<int64_t>({30, 30}));
}

// Per-table consistency (--table): the ctr tower sync, its embeddings ssp:1. Resumed, the
// workers move their ssp clocks to the restored step too (a restored server's start at 0), or
// their first pull of an embedding table would wait for clocks no one moves, until max_wait.
TEST_F(ResumeTest, SyncAndSspTablesResumeTogether) {
  TrainerOptions o = test::CtrOptions(OptimizerType::kSgd, 0.1f, 12);
  o.tables = {{"ctr/emb*", {{"consistency", "ssp:1"}}}};
  o.checkpoint_every = 5;
  auto ctr = LoadCtrData(o);
  ASSERT_TRUE(ctr.ok()) << ctr.status();
  const Datasets data{nullptr, nullptr, &*ctr};
  const fs::path dir = root_ / "hybrid";
  const auto max_wait = std::chrono::seconds(5);  // a pull that waits for nothing fails in 5 s, not 5 min
  {
    auto cluster = Servers(1, dir, 2, false, max_wait);
    ExpectAllOk(test::RunWorkers(cluster, 2, o, data));
  }
  EXPECT_EQ(Final(dir).step, 12);
  ResumeTo(o, data, dir, 1, 2, 12, 20, max_wait);
}

TEST_F(ResumeTest, AWorkerRestartedBeforeTheJobBeganJoinsTheOthersAtTheStartBarrier) {
  // Worker 1's first process died before the start barrier: its restart (--resume) finds the
  // job at step 0 with no collective ended, and meets worker 0 there; the job is the same.
  const data::ImageDataset train = test::MakeImages(44, 5);
  const Datasets data{&train, nullptr};
  TrainerOptions o = SmallMlp(10);
  o.blas_threads = 1;
  o.checkpoint_every = 5;
  const fs::path plain = root_ / "plain", restarted = root_ / "restarted";
  {
    auto cluster = Servers(2, plain, 2, false);
    ExpectAllOk(test::RunWorkers(cluster, 2, o, data));
  }
  auto cluster = Servers(2, restarted, 2, false);
  auto runs = test::RunWorkers(cluster, 2, o, data, false, nullptr,
                               [](int rank, TrainerOptions& w, TrainHooks&) { w.resume = rank == 1; });
  ExpectAllOk(runs);
  EXPECT_EQ(runs[1].report->first_step, 0);
  EXPECT_EQ(runs[1].report->steps, 10);
  ExpectSameTables(Final(plain), Final(restarted));
}

TEST_F(ResumeTest, ResumingAJobThatHadFinishedEndsAtOnce) {
  const data::ImageDataset train = test::MakeImages(32, 8);
  const Datasets data{&train, nullptr};
  TrainerOptions o = SmallMlp(6);
  o.checkpoint_every = 3;
  const fs::path dir = root_ / "done";
  {
    auto cluster = Servers(1, dir, 2, false);
    ExpectAllOk(test::RunWorkers(cluster, 2, o, data));
  }
  EXPECT_EQ(Final(dir).step, 6);
  o.resume = true;
  auto cluster = Servers(2, dir, 2, true);
  auto runs = test::RunWorkers(cluster, 2, o, data);
  ExpectAllOk(runs);
  for (const auto& r : runs) {
    EXPECT_EQ(r.report->first_step, 6);
    EXPECT_EQ(r.report->steps, 0);
  }
  EXPECT_EQ(Final(dir).step, 6);  // nothing new to save
}

TEST_F(ResumeTest, ACheckpointOnRequestAndEveryFewSeconds) {
  const data::ImageDataset train = test::MakeImages(64, 3);
  const Datasets data{&train, nullptr};
  TrainerOptions o = SmallMlp(12);
  // Worker 0 is asked for a checkpoint once, at its 4th step (ferry-trainer: SIGUSR1); no
  // periodic checkpoints, so none at the end either.
  const fs::path asked = root_ / "asked";
  {
    auto cluster = Servers(2, asked, 2, false);
    auto runs = test::RunWorkers(cluster, 2, o, data, false, nullptr, [](int, TrainerOptions&, TrainHooks& hooks) {
      auto calls = std::make_shared<int>(0);
      hooks.checkpoint_requested = [calls] { return ++*calls == 4; };
    });
    ExpectAllOk(runs);
    EXPECT_EQ(runs[0].report->checkpoints, 1);
  }
  EXPECT_EQ(Final(asked).step, 3);  // asked after the pull of step 3 (the 4th)
  // Every 1 ns: a checkpoint at every step after the first, each waited for before the next.
  o.checkpoint_every_s = 1e-9;
  const fs::path timed = root_ / "timed";
  {
    auto cluster = Servers(1, timed, 2, false);
    auto runs = test::RunWorkers(cluster, 2, o, data);
    ExpectAllOk(runs);
    EXPECT_EQ(runs[0].report->checkpoints, 12);  // steps 1 .. 11, and the end (12)
    EXPECT_EQ(runs[1].report->checkpoints, 0);   // worker 0 asks
  }
  EXPECT_EQ(Final(timed).step, 12);
}

}  // namespace
}  // namespace ferry::trainer
