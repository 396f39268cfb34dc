// The trainer's ctr model, sync, its embeddings declared with a disk tier through --table
// ('ctr/emb*:max_rows=K,disk_tier=1') on servers whose memory budget holds a few percent of the
// rows the job makes: it trains to the bits of the same job with every row in RAM (the tower's
// parameters at every step, the test AUC), no row lost (none evicted, none refused), the rows
// beyond the RAM tier demoted to each server's store and promoted back when pulled or pushed. And
// stopped, then resumed from a checkpoint (its RAM tiers' rows and a hard-linked copy of each
// server's store) into three servers, it ends with the tables of the uninterrupted run, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "internal/checkpoint.h"
#include "support/cluster.h"
#include "support/temp_dir.h"
#include "ferry/trainer/models.h"
#include "worker_runs.h"

namespace ferry::trainer {
namespace {

namespace fs = std::filesystem;

constexpr int kFields = 4;
constexpr int64_t kRamRows = 256;  // the RAM tier: rows per server and table

TrainerOptions Options() {
  TrainerOptions o = test::CtrOptions(OptimizerType::kAdam, 0.01f, 0);
  o.ctr().fields = kFields;
  o.ctr().vocab = int64_t{1} << 40;  // new ids every step
  o.ctr().zipf = 1.1;
  o.ctr().train = 2 * 128 * 1500;  // 1500 steps of 2 workers, one epoch
  o.ctr().test = 4000;
  o.hidden = {16};
  o.batch = 128;
  o.epochs = 1;
  o.seed = 3;
  return o;
}

struct JobRun {
  std::vector<test::WorkerRun> workers;
  std::map<std::string, int64_t> totals;  // the servers' counters, summed
  int64_t max_used_bytes = 0;             // the largest server's memory_budget_used_bytes
};

JobRun Train(const TrainerOptions& o, const Datasets& ds, ServerOptions server) {
  auto cluster = ferry::test::LocalCluster::Start(2, /*tcp=*/false, server);
  JobRun r;
  if (cluster.servers.size() != 2) return r;
  r.workers = test::RunWorkers(cluster, 2, o, ds, /*record=*/true);
  for (const auto& s : cluster.servers) {
    for (const auto& [name, value] : s->stats().counters) r.totals[name] += value;
    r.max_used_bytes = std::max(r.max_used_bytes, s->stats().counters.at("memory_budget_used_bytes"));
  }
  return r;
}

TEST(DiskTierTraining, ASyncCtrJobWithMostRowsOnDiskGivesTheBitsOfOneWithEveryRowInRam) {
  const TrainerOptions base = Options();
  auto data = LoadCtrData(base);
  ASSERT_TRUE(data.ok()) << data.status();
  const Datasets ds{nullptr, nullptr, &*data};

  const JobRun ram = Train(base, ds, {});
  ASSERT_EQ(2u, ram.workers.size());
  ASSERT_TRUE(ram.workers[0].report.ok()) << ram.workers[0].report.status();
  ASSERT_TRUE(ram.workers[1].report.ok()) << ram.workers[1].report.status();

  ferry::test::TempDir dir("disk-tier-train");
  TrainerOptions tiered = base;
  tiered.tables.push_back({"ctr/emb*", {{"max_rows", std::to_string(kRamRows)}, {"disk_tier", "1"}}});
  ServerOptions server;
  server.disk_tier_dir = (dir.path() / "tier").string();
  server.disk_tier_cache_bytes = int64_t{1} << 20;
  // The tables' memory on each server: the RAM tiers (a step names at most 256 ids of a table,
  // about half of them a server's, so a tier holds at most kRamRows + 256 rows for a moment) and
  // the tower. Far less than the job without a tier takes (asserted below).
  const int64_t row_bytes = 4 * 3 * 4 + 24 + 16;  // dim 4 with Adam's two slots; count, index; id, clock
  // (At least 4 MiB: a quarter of the budget, shared by the workers, bounds what requests held
  // while they wait may carry, and the evaluation's all-reduce of 0.3 MiB waits for both workers.)
  // And each table's filter of pushes, which chooses the rows its RAM tier keeps: 4 x 2^16
  // one-byte counters (the least AdmissionFilter makes).
  const int64_t filter_bytes = 4 * (int64_t{1} << 16);
  const int64_t tables_bytes = kFields * ((kRamRows + 256) * row_bytes + filter_bytes) + (int64_t{64} << 10);
  server.memory_budget_bytes = std::max(tables_bytes, int64_t{4} << 20);
  const JobRun disk = Train(tiered, ds, server);
  ASSERT_EQ(2u, disk.workers.size());
  ASSERT_TRUE(disk.workers[0].report.ok()) << disk.workers[0].report.status();
  ASSERT_TRUE(disk.workers[1].report.ok()) << disk.workers[1].report.status();

  const int64_t made = disk.totals.at("rows_admitted");
  std::printf(
      "AUC: %.6f every row in RAM, %.6f with the disk tier; rows made %lld (RAM tier %lld a server and "
      "table), demoted %lld, promoted %lld; disk reads %lld (%lld ids, %lld found); tables' memory: %lld "
      "bytes at most a server with the tier (budget %lld), %lld without; requests held for the disk readers "
      "%lld, rows read ahead %lld, read by the I/O thread itself %lld\n",
      ram.workers[0].report->eval.auc, disk.workers[0].report->eval.auc, static_cast<long long>(made),
      static_cast<long long>(kRamRows), static_cast<long long>(disk.totals.at("rows_demoted")),
      static_cast<long long>(disk.totals.at("rows_promoted")),
      static_cast<long long>(disk.totals.at("disk_tier_reads")),
      static_cast<long long>(disk.totals.at("disk_tier_rows_asked")),
      static_cast<long long>(disk.totals.at("disk_tier_rows_found")), static_cast<long long>(disk.max_used_bytes),
      static_cast<long long>(server.memory_budget_bytes), static_cast<long long>(ram.max_used_bytes),
      static_cast<long long>(disk.totals.at("disk_tier_requests_held")),
      static_cast<long long>(disk.totals.at("disk_tier_rows_read_ahead")),
      static_cast<long long>(disk.totals.at("disk_tier_rows_read_inline")));

  // The same computation, bit for bit: the tower at every step, and the evaluation (whose pulls
  // read rows back from disk).
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(ram.workers[static_cast<size_t>(w)].trace, disk.workers[static_cast<size_t>(w)].trace)
        << "worker " << w << "'s dense parameters differ";
  }
  EXPECT_EQ(ram.workers[0].report->eval.auc, disk.workers[0].report->eval.auc);
  EXPECT_EQ(ram.workers[0].report->eval.loss, disk.workers[0].report->eval.loss);
  EXPECT_GT(disk.workers[0].report->eval.auc, 0.6);

  // The job's rows are at least 10x what the RAM tiers hold, and none was lost or refused.
  EXPECT_GE(made, 10 * 2 * kFields * kRamRows);
  EXPECT_EQ(0, disk.totals.at("rows_evicted_capacity"));
  EXPECT_EQ(0, disk.totals.at("rows_evicted_age"));
  EXPECT_EQ(0, disk.totals.at("rows_not_admitted"));
  EXPECT_EQ(0, disk.totals.at("disk_tier_errors"));
  EXPECT_GE(disk.totals.at("rows_demoted"), made - 2 * kFields * (kRamRows + 256));
  EXPECT_GT(disk.totals.at("rows_promoted"), 0);
  EXPECT_GT(disk.totals.at("disk_tier_rows_found"), 0);
  // The servers' I/O threads left the disk to their readers: of the rows a request needed from
  // disk, under 5% were read by the I/O thread itself (132 of 33,420 here: rows read ahead for a
  // held pull that its step's close wrote again meanwhile).
  EXPECT_GT(disk.totals.at("disk_tier_rows_read_ahead"), 0);
  EXPECT_LT(20 * disk.totals.at("disk_tier_rows_read_inline"), disk.totals.at("disk_tier_rows_read_ahead"));
  // Within the RAM tiers' bound and the budget, which the job without a tier exceeds many times over.
  EXPECT_LE(disk.max_used_bytes, tables_bytes);
  EXPECT_LE(disk.max_used_bytes, server.memory_budget_bytes);
  EXPECT_GT(ram.max_used_bytes, 4 * server.memory_budget_bytes);
}

TEST(DiskTierTraining, ATableWithADiskTierIsRefusedByServersWithoutOne) {
  TrainerOptions o = Options();
  o.ctr().train = 2 * 128 * 4;
  o.ctr().test = 128;
  auto data = LoadCtrData(o);
  ASSERT_TRUE(data.ok()) << data.status();
  const Datasets ds{nullptr, nullptr, &*data};
  o.tables.push_back({"ctr/emb*", {{"max_rows", "64"}, {"disk_tier", "1"}}});
  auto cluster = ferry::test::LocalCluster::Start(2);
  const auto runs = test::RunWorkers(cluster, 2, o, ds);
  ASSERT_FALSE(runs[0].report.ok());
  EXPECT_NE(std::string::npos, runs[0].report.status().message().find("--disk-tier-dir")) << runs[0].report.status();
}

// Every table of a checkpoint, the rows in its disk stores folded in: (steps, floats) by table and id.
using AllTables = std::map<std::string, std::map<int64_t, std::pair<int64_t, std::vector<float>>>>;
AllTables ReadAll(const fs::path& dir, int64_t* step) {
  AllTables out;
  auto c = ps::ReadCheckpoint(dir.string());
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return out;
  *step = c->step;
  for (const auto& [id, t] : c->tables) {
    auto& rows = out[t.spec.name];
    for (const auto& [chunk, ch] : t.chunks) {
      std::vector<float> v = ch.params;
      v.insert(v.end(), ch.state.begin(), ch.state.end());
      rows[chunk] = {ch.version, std::move(v)};
    }
    for (const auto& [row_id, row] : t.rows) rows[row_id] = {row.steps, row.values};
    const size_t floats = static_cast<size_t>(t.spec.dim * 3);  // Adam
    Status s = ps::ForEachDiskRow(t, id, [&](int64_t row_id, int64_t steps, const float* row) {
      rows[row_id] = {steps, std::vector<float>(row, row + floats)};
      return Status::Ok();
    });
    EXPECT_TRUE(s.ok()) << s;
  }
  return out;
}

TEST(DiskTierTraining, StoppedAndResumedIntoThreeServersItIsBitwiseTheUninterruptedRun) {
  TrainerOptions o = Options();
  o.ctr().train = 2 * 128 * 300;
  o.ctr().test = 1000;
  o.steps = 300;
  o.checkpoint_every = 50;
  o.tables.push_back({"ctr/emb*", {{"max_rows", std::to_string(kRamRows)}, {"disk_tier", "1"}}});
  auto data = LoadCtrData(o);
  ASSERT_TRUE(data.ok()) << data.status();
  const Datasets ds{nullptr, nullptr, &*data};
  ferry::test::TempDir dir("disk-tier-resume");
  auto servers = [&](int n, const fs::path& ckpt, const std::string& tier, bool restore) {
    ServerOptions so;
    so.checkpoint_dir = ckpt.string();
    so.disk_tier_dir = (dir.path() / tier).string();
    so.disk_tier_cache_bytes = int64_t{1} << 20;
    so.num_workers = 2;
    so.restore = restore;
    so.keep_checkpoints = 10;
    return ferry::test::LocalCluster::Start(n, false, so);
  };
  const fs::path whole = dir.path() / "whole", cut = dir.path() / "cut";
  double auc_whole = 0, auc_resumed = 0;
  {
    auto cluster = servers(2, whole, "tier-whole", false);
    auto runs = test::RunWorkers(cluster, 2, o, ds);
    ASSERT_TRUE(runs[0].report.ok()) << runs[0].report.status();
    ASSERT_TRUE(runs[1].report.ok()) << runs[1].report.status();
    EXPECT_GE(runs[0].report->checkpoints, 6);  // steps 50, ..., 300
    auc_whole = runs[0].report->eval.auc;
  }
  {
    TrainerOptions stop = o;
    stop.steps = 200;
    auto cluster = servers(2, cut, "tier-cut", false);
    auto runs = test::RunWorkers(cluster, 2, stop, ds);
    ASSERT_TRUE(runs[0].report.ok()) << runs[0].report.status();
  }
  // The job died after its checkpoint of step 150: what came after never happened.
  for (const auto& e : fs::directory_iterator(cut)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("MANIFEST-") && std::stoll(n.substr(9)) > 150) fs::remove(e.path());
  }
  {
    TrainerOptions resumed = o;
    resumed.resume = true;
    auto cluster = servers(3, cut, "tier-resumed", true);
    for (const auto& s : cluster.servers) EXPECT_EQ(150, s->restored_step());
    auto runs = test::RunWorkers(cluster, 2, resumed, ds);
    ASSERT_TRUE(runs[0].report.ok()) << runs[0].report.status();
    EXPECT_EQ(150, runs[0].report->first_step);
    auc_resumed = runs[0].report->eval.auc;
  }
  int64_t step_whole = -1, step_cut = -1;
  const AllTables a = ReadAll(whole, &step_whole), b = ReadAll(cut, &step_cut);
  EXPECT_EQ(300, step_whole);
  EXPECT_EQ(300, step_cut);
  size_t rows = 0;
  for (const auto& [name, t] : a) rows += t.size();
  std::printf(
      "AUC %.6f uninterrupted (2 servers), %.6f stopped at 200, resumed from 150 into 3 servers; %zu rows "
      "and chunks compared\n",
      auc_whole, auc_resumed, rows);
  EXPECT_GT(rows, static_cast<size_t>(10 * 2 * kFields * kRamRows));
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [name, ta] : a) {
    ASSERT_EQ(1u, b.count(name)) << name;
    const auto& tb = b.at(name);
    EXPECT_EQ(ta.size(), tb.size()) << name << ": rows (or chunks)";
    int shown = 0;
    for (const auto& [key, row] : ta) {
      auto it = tb.find(key);
      if (it != tb.end() && it->second == row) continue;
      EXPECT_LT(shown, 5) << "more differences";
      if (shown++ >= 5) break;
      ADD_FAILURE() << name << " " << key << ": "
                    << (it == tb.end() ? std::string("missing from the resumed run")
                                       : "update count " + std::to_string(row.first) + " against " +
                                             std::to_string(it->second.first) +
                                             (row.second == it->second.second ? ", same values" : ", other values"));
    }
  }
  EXPECT_EQ(auc_whole, auc_resumed);
}

}  // namespace
}  // namespace ferry::trainer
