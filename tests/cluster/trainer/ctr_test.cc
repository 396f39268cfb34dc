// The ctr model (sparse embeddings on the servers + dense tower), gradient accumulation, and
// evaluation merged across workers.
//
// Sync training with M = 2 workers of batch B must give, step by step, the parameters of --local
// training with batch 2B (trainer.h): the servers average the workers' per-row embedding gradients
// and dense gradients, which is the gradient of the local mean loss. Only the dense tower is
// compared step by step, but it sees the embeddings at every step (their pooled values are its
// input), so a wrong sparse update shows up in it from the next step on; the final evaluation,
// which reads every test id's embedding row, is compared too.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "support/cluster.h"
#include "ferry/trainer/models.h"
#include "worker_runs.h"

namespace ferry::trainer {
namespace {

using test::ExpectTracesMatch;
using test::MaxRel;

class CtrSync : public testing::TestWithParam<OptimizerType> {};

TEST_P(CtrSync, TwoWorkersMatchLocalWithDoubleBatchAndMergedEvalMatchesLocalEval) {
  constexpr int64_t kBatch = 4, kSteps = 14;  // 96 examples: 12 local steps of 8 per epoch, so it crosses one
  const float lr = GetParam() == OptimizerType::kAdam ? 0.01f : 0.1f;
  TrainerOptions base = test::CtrOptions(GetParam(), lr, kSteps);
  auto data = LoadCtrData(base);
  ASSERT_TRUE(data.ok()) << data.status();
  const Datasets ds{nullptr, nullptr, &*data};
  std::printf("%s\n", data->source.c_str());

  TrainerOptions local = base;
  local.batch = 2 * kBatch;
  const test::WorkerRun ref = test::RunLocal(local, ds);
  ASSERT_TRUE(ref.report.ok()) << ref.report.status();

  ServerOptions so;
  so.compute_threads = 1;
  auto cluster = ferry::test::LocalCluster::Start(2, false, so);
  TrainerOptions o = base;
  o.batch = kBatch;
  const auto worker = test::RunWorkers(cluster, 2, o, ds, /*record=*/true);
  ASSERT_TRUE(worker[0].report.ok()) << worker[0].report.status();
  ASSERT_TRUE(worker[1].report.ok()) << worker[1].report.status();
  ExpectTracesMatch(worker[0].trace, ref.trace, 1e-5);
  EXPECT_EQ(worker[0].trace, worker[1].trace);

  // Worker 0 reports the evaluation merged over both workers' halves of the test set: the same
  // examples, counts and (up to float rounding of nearly equal parameters) metrics as one process.
  const EvalSummary& a = worker[0].report->eval;
  const EvalSummary& b = ref.report->eval;
  EXPECT_EQ(a.count, 64);
  EXPECT_EQ(b.count, 64);
  EXPECT_NEAR(a.loss, b.loss, 1e-4);
  EXPECT_NEAR(a.accuracy, b.accuracy, 1e-9);
  EXPECT_NEAR(a.auc, b.auc, 1e-9);
  EXPECT_GT(a.auc, 0.0);
  EXPECT_EQ(worker[1].report->eval.count, 0) << "only worker 0 reports";
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CtrSync, testing::Values(OptimizerType::kAdagrad, OptimizerType::kAdam),
                         [](const testing::TestParamInfo<OptimizerType>& info) {
                           return std::string(OptimizerName(info.param));
                         });

// --push-by-layer: the ctr tower's layers go while backward computes the layers below and the
// embeddings' gradients (hidden 4096,16: the top two layers hold 256 KiB and go first, the first
// layer then goes before the embeddings' backward, each part in messages of its own); sync
// training gives the bits of the step sent whole.
TEST(CtrSyncPipeline, PushByLayerGivesTheBitsOfTheWholePush) {
  test::ExpectPushByLayerGivesTheBitsOfTheWholePush(DeviceKind::kCpu);
}

// --accumulate k with batch B pushes the mean gradient over kB examples: the same step as batch kB.
TEST(Accumulate, KMicroBatchesMatchOneBatchOfKTimesTheSize) {
  TrainerOptions base = test::CtrOptions(OptimizerType::kAdam, 0.01f, 10);
  auto data = LoadCtrData(base);
  ASSERT_TRUE(data.ok()) << data.status();
  const Datasets ds{nullptr, nullptr, &*data};
  TrainerOptions big = base;
  big.batch = 12;
  TrainerOptions micro = base;
  micro.batch = 4;
  micro.accumulate = 3;
  const test::WorkerRun a = test::RunLocal(big, ds);
  const test::WorkerRun b = test::RunLocal(micro, ds);
  ASSERT_TRUE(a.report.ok()) << a.report.status();
  ASSERT_TRUE(b.report.ok()) << b.report.status();
  ExpectTracesMatch(b.trace, a.trace, 1e-5);
  EXPECT_EQ(a.report->examples, b.report->examples);
}

// The ctr model learns the planted model on a cluster, and the metrics file has every event.
// Async training of the ctr model, 2 workers: 40,000 synthetic examples of 100 ids per field,
// one epoch of batches of 128, 4,000 test examples.
TrainerOptions AsyncCtr() {
  TrainerOptions base = test::CtrOptions(OptimizerType::kAdam, 0.01f, 0);
  base.ctr().vocab = 100;
  base.ctr().train = 40000;
  base.ctr().test = 4000;
  base.hidden = {16};
  base.batch = 128;
  base.epochs = 1;
  base.consistency = Consistency::kAsync;
  return base;
}

// Trains `base` with two workers on `cluster`: both finish, and worker 0's final evaluation of
// the 4,000 test examples has learned (AUC above 0.70 and within 0.1 of the planted model's).
// *steps: worker 0's.
void ExpectTwoWorkersLearn(const ferry::test::LocalCluster& cluster, const TrainerOptions& base, const CtrData& data,
                           int64_t* steps) {
  const Datasets ds{nullptr, nullptr, &data};
  const auto runs = test::RunWorkers(cluster, 2, base, ds);
  ASSERT_TRUE(runs[0].report.ok()) << runs[0].report.status();
  ASSERT_TRUE(runs[1].report.ok()) << runs[1].report.status();
  const EvalSummary& e = runs[0].report->eval;
  *steps = runs[0].report->steps;
  std::printf("planted AUC %.4f; trained AUC %.4f after %lld steps x 2 workers\n", data.planted_auc, e.auc,
              static_cast<long long>(*steps));
  EXPECT_EQ(e.count, 4000);
  EXPECT_GT(e.auc, 0.70);  // 0.5 is chance
  EXPECT_GT(e.auc, data.planted_auc - 0.1);
}

TEST(CtrTraining, AsyncClusterLearnsAndWritesMetrics) {
  TrainerOptions base = AsyncCtr();
  base.eval_every = 50;
  auto data = LoadCtrData(base);
  ASSERT_TRUE(data.ok()) << data.status();
  auto cluster = ferry::test::LocalCluster::Start(2);
  const std::string metrics = testing::TempDir() + "/ctr_metrics_{rank}.jsonl";
  base.metrics_out = metrics;
  int64_t steps = 0;
  ExpectTwoWorkersLearn(cluster, base, *data, &steps);

  // Worker 0's file: start, train, eval, end lines; the end line has the staleness histogram.
  std::ifstream in(testing::TempDir() + "/ctr_metrics_0.jsonl");
  ASSERT_TRUE(in.good());
  std::string line;
  int starts = 0, trains = 0, evals = 0, ends = 0;
  while (std::getline(in, line)) {
    const nlohmann::ordered_json ev = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(ev.is_object()) << "not a JSON object: " << line;
    ASSERT_EQ(ev.begin().key(), "event") << line;  // the event first, for a reader of the file
    EXPECT_EQ(ev.at("rank"), 0) << line;
    const std::string event = ev.at("event");
    if (event == "start") ++starts;
    if (event == "train") ++trains;
    if (event == "eval") ++evals;
    if (event == "end") {
      ++ends;
      EXPECT_GT(ev.at("staleness").value("0", 0), 0) << line;
      EXPECT_TRUE(ev.at("train_s").is_number()) << line;
      EXPECT_TRUE(ev.at("final_wait_s").is_number()) << line;
      EXPECT_EQ(ev.at("final").at("count"), 4000) << line;
    }
  }
  EXPECT_EQ(starts, 1);
  EXPECT_GE(trains, 1);
  EXPECT_GE(evals, 3);
  EXPECT_EQ(ends, 1);
}

// The ctr model under --pipeline prefetch with --push-by-layer: its rows read ahead, the tower's
// parts, and the sparse push travelling in the exchange the parts began. One async worker is
// deterministic: the bits of the whole push.
TEST(CtrAsyncPipeline, PrefetchPushByLayerGivesOneWorkerTheBitsOfTheWholePush) {
  TrainerOptions base = AsyncCtr();
  base.steps = 10;
  base.batch = 16;
  base.ctr().train = 2000;
  base.ctr().test = 64;
  base.hidden = {4096, 16};
  base.pipeline = Pipeline::kPrefetch;
  auto data = LoadCtrData(base);
  ASSERT_TRUE(data.ok()) << data.status();
  const Datasets ds{nullptr, nullptr, &*data};
  test::Trace traces[2];
  for (const bool by_layer : {false, true}) {
    auto cluster = ferry::test::LocalCluster::Start(2);
    TrainerOptions o = base;
    o.push_by_layer = by_layer;
    const auto worker = test::RunWorkers(cluster, 1, o, ds, /*record=*/true);
    ASSERT_TRUE(worker[0].report.ok()) << worker[0].report.status();
    EXPECT_EQ(worker[0].report->progress.pushes_used, 10);
    traces[by_layer ? 1 : 0] = worker[0].trace;
  }
  ASSERT_EQ(traces[0].size(), 11u);
  for (size_t t = 0; t < traces[0].size(); ++t) EXPECT_EQ(traces[0][t], traces[1][t]) << "step " << t;
  EXPECT_GT(MaxRel(traces[0].back(), traces[0].front()), 1e-3) << "the parameters did not move";
}

// --pipeline prefetch: each step's batch is loaded a step ahead and its rows read while the
// step before computes and pushes (one step more of staleness, async): the model still learns.
TEST(CtrTraining, AsyncPrefetchReadsRowsAheadAndLearns) {
  TrainerOptions base = AsyncCtr();
  base.pipeline = Pipeline::kPrefetch;
  base.eval_every = 100;  // evaluations between steps, while a batch's rows are in flight
  auto data = LoadCtrData(base);
  ASSERT_TRUE(data.ok()) << data.status();
  auto cluster = ferry::test::LocalCluster::Start(2, /*tcp=*/true);
  int64_t steps = 0;
  ExpectTwoWorkersLearn(cluster, base, *data, &steps);
  EXPECT_EQ(steps, 40000 / 2 / 128 + 1);
}

// Criteo TSV files train the same model, streamed: two training files (one gzipped would do the
// same; the reader's tests cover it) whose label is set by one categorical field are learned
// over two passes and more, and the malformed line is skipped, counted and reported with its
// file and line in each pass's event, not fatal.
TEST(CtrTraining, LearnsFromStreamedCriteoFilesAndReportsBadLines) {
  auto write = [](const std::string& path, int lines, uint64_t seed, bool bad) {
    std::ofstream f(path);
    uint64_t x = seed;
    auto next = [&x] {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      return x >> 33;
    };
    for (int i = 0; i < lines; ++i) {
      const int c1 = static_cast<int>(next() % 20);
      const bool click = (c1 < 10) != (next() % 10 == 0);  // 90% determined by C1
      f << (click ? 1 : 0);
      for (int j = 0; j < 13; ++j) f << '\t' << (j == 0 ? "" : std::to_string(next() % 100));
      f << "\ta" << c1;  // C1
      for (int j = 1; j < 26; ++j) f << '\t' << next() % 50;
      f << '\n';
      if (bad && i == 100) f << "1\tnot\tenough\tcolumns\n";
    }
  };
  const std::string dir = testing::TempDir();
  const std::string train0 = dir + "/criteo_train_0.tsv", train1 = dir + "/criteo_train_1.tsv";
  const std::string test = dir + "/criteo_test.tsv";
  write(train0, 2000, 1, true);
  write(train1, 2000, 3, false);
  write(test, 1000, 2, false);
  TrainerOptions o = test::CtrOptions(OptimizerType::kAdam, 0.01f, 0);
  o.ctr().criteo_train = dir + "/criteo_train_*.tsv";
  o.ctr().criteo_test = test;
  o.batch = 64;
  o.steps = 150;  // 9600 examples: two passes over the 4000, and part of a third
  o.metrics_out = dir + "/criteo_metrics.jsonl";
  auto data = LoadCtrData(o);
  ASSERT_TRUE(data.ok()) << data.status();
  std::printf("%s", data->source.c_str());
  EXPECT_TRUE(data->train.empty()) << "the training files were loaded, not streamed";
  ASSERT_NE(data->train_stream, nullptr);
  EXPECT_EQ(data->test.size(), 1000);
  const test::WorkerRun run = test::RunLocal(o, Datasets{nullptr, nullptr, &*data});
  ASSERT_TRUE(run.report.ok()) << run.report.status();
  std::printf("Criteo-format test AUC %.4f (labels 90%% set by C1: best about 0.9)\n", run.report->eval.auc);
  EXPECT_EQ(run.report->eval.count, 1000);
  EXPECT_EQ(run.report->examples, 150 * 64);
  EXPECT_GT(run.report->eval.auc, 0.8);

  std::ifstream in(o.metrics_out);
  std::string line;
  int passes = 0;
  while (std::getline(in, line)) {
    const nlohmann::ordered_json ev = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(ev.is_object()) << line;
    if (ev.at("event") == "train") {
      EXPECT_TRUE(ev.contains("pass")) << line;
    }
    if (ev.at("event") != "pass") continue;
    ++passes;
    EXPECT_EQ(ev.at("pass"), passes) << line;
    EXPECT_EQ(ev.at("examples"), 4000) << line;
    EXPECT_EQ(ev.at("files"), 2) << line;
    EXPECT_EQ(ev.at("bad_lines"), 1) << line;
    ASSERT_EQ(ev.at("first_bad_lines").size(), 1u) << line;
    EXPECT_EQ(ev.at("first_bad_lines")[0], train0 + ":102: 4 tab-separated fields, expected 40") << line;
  }
  EXPECT_EQ(passes, 2);

  o.ctr().criteo_train = dir + "/no_such_file_*.tsv";
  auto missing = LoadCtrData(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no_such_file_*.tsv"), std::string::npos) << missing.status();

  // A file with no usable line fails the run at its first step, naming the file and the reason.
  const std::string junk = dir + "/criteo_junk.tsv";
  std::ofstream(junk) << "not a criteo line\n";
  o.ctr().criteo_train = junk;
  o.metrics_out.clear();
  auto junk_data = LoadCtrData(o);
  ASSERT_TRUE(junk_data.ok()) << junk_data.status();
  const test::WorkerRun failed = test::RunLocal(o, Datasets{nullptr, nullptr, &*junk_data});
  ASSERT_FALSE(failed.report.ok());
  EXPECT_NE(failed.report.status().message().find(junk + ":1: 1 tab-separated fields"), std::string::npos)
      << failed.report.status();
}

// The hybrid PERSIA uses, per table: the tower's dense tensors sync, the embeddings async
// (--consistency sync --table 'ctr/emb*:consistency=async'). The dense parameters are the same
// on both workers at every step, as in sync mode; each worker's embedding gradients are applied
// as they come: one update per worker per table and step, where sync mode applies one per step
// (the servers' updates_applied counts exactly that many more). FTRL chosen for the embeddings
// the same way is what their tables are declared with.
TEST(CtrTraining, HybridDenseSyncEmbeddingsAsync) {
  constexpr int64_t kSteps = 12;
  TrainerOptions base = test::CtrOptions(OptimizerType::kAdam, 0.01f, kSteps);
  auto data = LoadCtrData(base);
  ASSERT_TRUE(data.ok()) << data.status();
  const Datasets ds{nullptr, nullptr, &*data};
  auto run = [&](const std::vector<TableOverride>& tables, int64_t* updates) {
    TrainerOptions o = base;
    o.tables = tables;
    auto cluster = ferry::test::LocalCluster::Start(1);
    auto runs = test::RunWorkers(cluster, 2, o, ds, /*record=*/true);
    *updates = cluster.servers[0]->stats().counters["updates_applied"];
    return runs;
  };
  int64_t sync_updates = 0, hybrid_updates = 0;
  const auto sync = run({}, &sync_updates);
  const auto hybrid = run({{"ctr/emb*", {{"consistency", "async"}}}}, &hybrid_updates);
  for (const auto* runs : {&sync, &hybrid}) {
    ASSERT_TRUE((*runs)[0].report.ok()) << (*runs)[0].report.status();
    ASSERT_TRUE((*runs)[1].report.ok()) << (*runs)[1].report.status();
  }
  ASSERT_EQ(hybrid[0].trace.size(), hybrid[1].trace.size());
  for (size_t t = 0; t < hybrid[0].trace.size(); ++t) {
    EXPECT_EQ(hybrid[0].trace[t], hybrid[1].trace[t]) << "the workers' dense parameters differ at step " << t;
  }
  std::printf("updates applied: sync %lld, hybrid %lld\n", static_cast<long long>(sync_updates),
              static_cast<long long>(hybrid_updates));
  EXPECT_EQ(hybrid_updates - sync_updates, kSteps * base.ctr().fields);
  EXPECT_EQ(hybrid[0].report->progress.pushes_used, kSteps);

  // A setting that names no table, or one that does not apply, is refused before training.
  TrainerOptions bad = base;
  bad.tables = {{"ctr/embedding*", {{"consistency", "async"}}}};
  auto cluster = ferry::test::LocalCluster::Start(1);
  const auto refused = test::RunWorkers(cluster, 1, bad, ds);
  ASSERT_FALSE(refused[0].report.ok());
  EXPECT_NE(refused[0].report.status().message().find("matches none of the model's tables (ctr/"), std::string::npos)
      << refused[0].report.status();
}

}  // namespace
}  // namespace ferry::trainer
