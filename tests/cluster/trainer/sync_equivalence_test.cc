// The first correctness test of the whole system (DESIGN.md): sync training with M = 2 workers of
// batch B gives, step by step, the parameters of --local training with batch 2B on the same data
// order, within 1e-5 relative error. CPU backend, an in-process cluster of 2 servers, a small MLP.
//
// Data order (trainer.h): both runs visit the same seeded permutation of the examples each epoch;
// the local run's batch t is positions [2Bt, 2B(t+1)) of it, and worker r's batch t is the
// positions p of that range with p % 2 == r — together exactly the local batch. The servers
// average the two workers' mean-loss gradients, which is the gradient of the local mean loss;
// the two differ only by float rounding (sum order).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/data/fashion_mnist.h"
#include "support/cluster.h"
#include "worker_runs.h"

namespace ferry::trainer {
namespace {

constexpr uint64_t kDataSeed = 12345;

TrainerOptions BaseOptions(OptimizerType opt, float lr, int64_t steps) {
  TrainerOptions o;
  o.device = DeviceKind::kCpu;
  o.hidden = {8, 6};
  o.optimizer.type = opt;
  o.optimizer.learning_rate = lr;
  o.consistency = Consistency::kSync;
  o.steps = steps;
  o.seed = 7;
  o.log_every = 0;
  return o;
}

struct Case {
  OptimizerType opt;
  float lr;
};

class SyncEquivalence : public testing::TestWithParam<Case> {};

TEST_P(SyncEquivalence, TwoWorkersMatchLocalWithDoubleBatch) {
  // 44 examples: 6 local steps an epoch of 8, 8, 8, 8, 8 and 4 examples (each worker: 4 x 5, then 2),
  // so the run crosses an epoch boundary and its short last step.
  constexpr int64_t kBatch = 4, kExamples = 44, kSteps = 10;
  std::printf("data seed %llu, init seed 7, batch %lld per worker, %lld steps\n",
              static_cast<unsigned long long>(kDataSeed), static_cast<long long>(kBatch),
              static_cast<long long>(kSteps));
  const data::ImageDataset train = test::MakeImages(kExamples, kDataSeed);
  const Datasets ds{&train, nullptr};

  // The reference: one process, batch 2B, local optimizer.
  TrainerOptions o = BaseOptions(GetParam().opt, GetParam().lr, kSteps);
  o.batch = 2 * kBatch;
  const test::WorkerRun reference = test::RunLocal(o, ds);
  ASSERT_TRUE(reference.report.ok()) << reference.report.status();
  const test::Trace& local = reference.trace;

  // Two workers in sync mode against two in-process servers.
  ServerOptions so;
  so.compute_threads = 1;
  auto cluster = ferry::test::LocalCluster::Start(2, false, so);
  o.batch = kBatch;
  const auto runs = test::RunWorkers(cluster, 2, o, ds, /*record=*/true);
  ASSERT_TRUE(runs[0].report.ok()) << runs[0].report.status();
  ASSERT_TRUE(runs[1].report.ok()) << runs[1].report.status();
  const test::Trace worker[2] = {runs[0].trace, runs[1].trace};

  ASSERT_EQ(local.size(), static_cast<size_t>(kSteps + 1));
  ASSERT_EQ(worker[0].size(), local.size());
  ASSERT_EQ(worker[1].size(), local.size());
  // Step 0: the servers' init equals the local init exactly (same code, same seed).
  EXPECT_EQ(worker[0][0], local[0]);
  double worst = 0;
  for (size_t t = 0; t < local.size(); ++t) {
    // Both workers pull the same version at each step.
    EXPECT_EQ(worker[0][t], worker[1][t]) << "step " << t;
    double max_rel = 0, max_change = 0;
    for (size_t i = 0; i < local[t].size(); ++i) {
      const double a = worker[0][t][i], b = local[t][i];
      // Relative error, with a floor of 1e-2 on the scale so zero-initialised biases do not divide by ~0.
      max_rel = std::max(max_rel, std::abs(a - b) / std::max(std::abs(b), 1e-2));
      max_change = std::max(max_change, std::abs(b - local[0][i]));
    }
    worst = std::max(worst, max_rel);
    EXPECT_LE(max_rel, 1e-5) << "step " << t;
    if (t > 0) {
      EXPECT_GT(max_change, 1e-4) << "the parameters did not move by step " << t;
    }
  }
  std::printf("max relative error over %zu steps: %.3g\n", local.size(), worst);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, SyncEquivalence,
                         testing::Values(Case{OptimizerType::kSgd, 0.5f}, Case{OptimizerType::kMomentum, 0.1f},
                                         Case{OptimizerType::kAdagrad, 0.1f}, Case{OptimizerType::kAdam, 0.01f}),
                         [](const testing::TestParamInfo<Case>& info) {
                           return std::string(OptimizerName(info.param.opt));
                         });

// --pipeline exchange (the default) reads, at every step, the very parameters --pipeline none
// reads: sync training gives the same bits step by step (2 workers, 2 servers, Adam).
TEST(SyncPipeline, ExchangeGivesTheBitsOfSeparatePushAndPull) {
  const data::ImageDataset train = test::MakeImages(40, kDataSeed);
  const Datasets ds{&train, nullptr};
  test::Trace traces[2];
  for (const Pipeline pipeline : {Pipeline::kNone, Pipeline::kExchange}) {
    auto cluster = ferry::test::LocalCluster::Start(2);
    TrainerOptions o = BaseOptions(OptimizerType::kAdam, 0.01f, 8);
    o.batch = 4;
    o.pipeline = pipeline;
    const auto runs = test::RunWorkers(cluster, 2, o, ds, /*record=*/true);
    ASSERT_TRUE(runs[0].report.ok()) << runs[0].report.status();
    ASSERT_TRUE(runs[1].report.ok()) << runs[1].report.status();
    EXPECT_EQ(runs[0].trace, runs[1].trace);
    traces[pipeline == Pipeline::kNone ? 0 : 1] = runs[0].trace;
  }
  ASSERT_EQ(traces[0].size(), 9u);  // steps 0..7 and the final parameters
  for (size_t t = 0; t < traces[0].size(); ++t) EXPECT_EQ(traces[0][t], traces[1][t]) << "step " << t;
  EXPECT_NE(traces[0][0], traces[0][8]);
}

// --push-by-layer sends each layer's gradients as backward yields them, and sync training gives
// the very bits of the step sent whole; with --accumulate 2 the layers go with the second
// micro-batch, summed with the first's. 2 workers, 2 servers, Adam. A tower whose layers are all
// under 64 KiB (Tower::kMinPartBytes) sends nothing early: as many messages as the whole push.
// One of 4096 hidden units has two layers of 64 KiB and more, each sent early: more messages.
TEST(SyncPipeline, PushByLayerGivesTheBitsOfTheWholePush) {
  const data::ImageDataset train = test::MakeImages(48, kDataSeed);
  const Datasets ds{&train, nullptr};
  for (const bool wide : {false, true}) {
    for (const int64_t accumulate : {1, 2}) {
      SCOPED_TRACE(std::string(wide ? "hidden 8,4096" : "hidden 8,6") + ", accumulate " + std::to_string(accumulate));
      test::Trace traces[2];
      int64_t messages[2] = {0, 0};
      for (const bool by_layer : {false, true}) {
        auto cluster = ferry::test::LocalCluster::Start(2);
        TrainerOptions o = BaseOptions(OptimizerType::kAdam, 0.01f, 6);
        if (wide) o.hidden = {8, 4096};
        o.batch = 4;
        o.accumulate = accumulate;
        o.push_by_layer = by_layer;
        const auto runs =
            test::RunWorkers(cluster, 2, o, ds, /*record=*/true, nullptr, {}, ferry::test::NoHeartbeats());
        ASSERT_TRUE(runs[0].report.ok()) << runs[0].report.status();
        ASSERT_TRUE(runs[1].report.ok()) << runs[1].report.status();
        EXPECT_EQ(runs[0].trace, runs[1].trace);
        EXPECT_EQ(runs[0].report->progress.pushes_used, 6);
        traces[by_layer ? 1 : 0] = runs[0].trace;
        messages[by_layer ? 1 : 0] = test::ServerMessages(cluster);
      }
      ASSERT_EQ(traces[0].size(), 7u);  // steps 0..5 and the final parameters
      for (size_t t = 0; t < traces[0].size(); ++t) EXPECT_EQ(traces[0][t], traces[1][t]) << "step " << t;
      EXPECT_NE(traces[0][0], traces[0][6]);
      if (wide) {
        EXPECT_GT(messages[1], messages[0]);
      } else {
        EXPECT_EQ(messages[1], messages[0]);
      }
    }
  }
}

// One async worker is deterministic too: --push-by-layer gives it the bits of the whole push,
// with exchange and with prefetch (where the layers' pulls ahead go into the set the step is
// computing with, for the step after next). Hidden 8,4096: two parts a step.
TEST(AsyncPipeline, PushByLayerGivesOneWorkerTheBitsOfTheWholePush) {
  const data::ImageDataset train = test::MakeImages(48, kDataSeed);
  const Datasets ds{&train, nullptr};
  for (const Pipeline pipeline : {Pipeline::kExchange, Pipeline::kPrefetch}) {
    SCOPED_TRACE(pipeline == Pipeline::kExchange ? "exchange" : "prefetch");
    test::Trace traces[2];
    int64_t messages[2] = {0, 0};
    for (const bool by_layer : {false, true}) {
      auto cluster = ferry::test::LocalCluster::Start(2);
      TrainerOptions o = BaseOptions(OptimizerType::kAdam, 0.01f, 8);
      o.consistency = Consistency::kAsync;
      o.pipeline = pipeline;
      o.hidden = {8, 4096};
      o.batch = 4;
      o.push_by_layer = by_layer;
      const auto runs = test::RunWorkers(cluster, 1, o, ds, /*record=*/true, nullptr, {}, ferry::test::NoHeartbeats());
      ASSERT_TRUE(runs[0].report.ok()) << runs[0].report.status();
      EXPECT_EQ(runs[0].report->progress.pushes_used, 8);
      traces[by_layer ? 1 : 0] = runs[0].trace;
      messages[by_layer ? 1 : 0] = test::ServerMessages(cluster);
    }
    ASSERT_EQ(traces[0].size(), 9u);
    for (size_t t = 0; t < traces[0].size(); ++t) EXPECT_EQ(traces[0][t], traces[1][t]) << "step " << t;
    EXPECT_NE(traces[0][0], traces[0][8]);
    EXPECT_GT(messages[1], messages[0]);
  }
}

// A worker's leave asked of server 0 while the job runs (protocol 1.26, --move-asks-every) is made
// as the same leave given up front (--leave 2@5): worker 2 trains steps 0-4, the others read its
// share of every step from step 5, and the job's parameters are those of the job told so from the
// start, bit for bit, step by step. 3 workers, 2 servers, Adam; the ask is made before the job
// starts and handed over at the first check (step 4), so the leave is before step 5.
TEST(Membership, AWorkersLeaveAskedWhileTheJobRunsGivesTheBitsOfTheSameLeaveGivenUpFront) {
  const data::ImageDataset train = test::MakeImages(72, kDataSeed);
  const Datasets ds{&train, nullptr};
  test::Trace traces[2];
  int64_t steps_of_2[2] = {0, 0}, examples_of_0[2] = {0, 0};
  for (const bool asked : {false, true}) {
    SCOPED_TRACE(asked ? "asked of server 0" : "--leave 2@5");
    auto cluster = ferry::test::LocalCluster::Start(2);
    TrainerOptions o = BaseOptions(OptimizerType::kAdam, 0.01f, 10);
    o.batch = 4;
    o.move_asks_every = 4;
    if (asked) {
      AskMoveOptions a;
      a.server0 = cluster.endpoints[0];
      a.context = cluster.context;
      a.leave_worker = 2;
      ASSERT_TRUE(AskMove(a).ok());
    } else {
      o.leave = {{2, 5}};
    }
    const auto runs = test::RunWorkers(cluster, 3, o, ds, /*record=*/true);
    for (const auto& r : runs) ASSERT_TRUE(r.report.ok()) << r.report.status();
    EXPECT_EQ(runs[0].trace, runs[1].trace);
    traces[asked] = runs[0].trace;
    steps_of_2[asked] = runs[2].report->steps;
    examples_of_0[asked] = runs[0].report->examples;
    if (!asked) continue;
    // Workers resumed into the job (at its end) hear of the leave from the servers: 0 and 1 take
    // it as the others did, and worker 2's new process, at or past its step, leaves at once.
    std::FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    o.resume = true;
    const auto resumed = test::RunWorkers(cluster, 3, o, ds, false, out);
    for (const auto& r : resumed) ASSERT_TRUE(r.report.ok()) << r.report.status();
    EXPECT_EQ(resumed[2].report->steps, 0);
    std::string said(static_cast<size_t>(std::ftell(out)), '\0');
    std::rewind(out);
    said.resize(std::fread(said.data(), 1, said.size(), out));
    std::fclose(out);
    for (const int w : {0, 1}) {
      EXPECT_NE(said.find("[worker " + std::to_string(w) +
                          "] worker 2 left the job before step 5 (the servers say so)"),
                std::string::npos)
          << said;
    }
    EXPECT_NE(said.find("[worker 2] left the job before step 10 (asked while the job ran)"), std::string::npos)
        << said;
  }
  EXPECT_EQ(steps_of_2[0], 5);
  EXPECT_EQ(steps_of_2[1], 5);
  // Worker 0 read its 4 a step, and half of worker 2's 4 from step 5 on.
  EXPECT_EQ(examples_of_0[0], 10 * 4 + 5 * 2);
  EXPECT_EQ(examples_of_0[1], examples_of_0[0]);
  ASSERT_EQ(traces[0].size(), 11u);  // steps 0..9 and the final parameters
  for (size_t t = 0; t < traces[0].size(); ++t) EXPECT_EQ(traces[1][t], traces[0][t]) << "step " << t;
  EXPECT_NE(traces[0][0], traces[0][10]);
}

// A worker that left joins the job again while it runs (protocol 1.27): worker 2's leave is
// asked (taken at the check of step 4: it leaves before step 5), then its new process, resumed
// with --rejoin, asks server 0 to take it back; worker 0 holds step 7 until the ask is kept, so
// the check of step 8 hands the join and worker 2 trains from step 9; after step 10 worker 0 asks
// its leave again (taken at the check of step 12). Every example is read once: worker 0 reads its
// 4 a step, and half of worker 2's 4 in steps 5-8 and 13-15; worker 2 trains steps 0-4 and 9-12.
// The job is repeatable to the bit, and ends within float rounding of the job in which every
// worker trained throughout (a step's gradient is the same examples' sum, grouped otherwise).
TEST(Membership, AWorkerThatLeftJoinsAgainWhileTheJobRunsAndEveryExampleIsReadOnce) {
  const data::ImageDataset train = test::MakeImages(72, kDataSeed);
  const Datasets ds{&train, nullptr};
  test::Trace traces[3];
  for (int run = 0; run < 3; ++run) {
    const bool moves = run < 2;  // run 2: every worker throughout
    SCOPED_TRACE(moves ? "leave and join again, run " + std::to_string(run) : std::string("no leave"));
    auto cluster = ferry::test::LocalCluster::Start(2);
    TrainerOptions o = BaseOptions(OptimizerType::kAdam, 0.01f, 16);
    o.batch = 4;
    o.move_asks_every = 4;
    o.servers = cluster.endpoints;
    o.num_workers = 3;
    if (moves) {
      AskMoveOptions a;
      a.server0 = cluster.endpoints[0];
      a.context = cluster.context;
      a.leave_worker = 2;
      ASSERT_TRUE(AskMove(a).ok());
    }
    std::FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    test::WorkerRun runs[3], back;
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 3; ++rank) {
      threads.emplace_back([&, rank] {
        TrainerOptions w = o;
        w.rank = rank;
        TrainHooks hooks = test::Recorder(&runs[rank].trace);
        if (rank == 0 && moves) {
          // After step 6: until worker 2's new process waits with its join asked (an ask of the
          // same join from here is taken as that one, or kept for it; refused while none waits).
          hooks.on_step = [&](const StepDone& info) {
            if (info.step != 7 && info.step != 11) return;
            AskMoveOptions a;
            a.server0 = cluster.endpoints[0];
            a.context = cluster.context;
            (info.step == 7 ? a.rejoin_worker : a.leave_worker) = 2;
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
            while (!AskMove(a).ok() && std::chrono::steady_clock::now() < until) {
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
          };
        }
        auto device = test::TestDevice(w);
        if (device == nullptr) return;
        {
          auto client = cluster.Connect(rank, 3);
          runs[rank].report = RunTraining(w, device.get(), client.get(), ds, hooks, out);
        }
        if (rank != 2 || !moves) return;
        w.resume = true;
        w.rejoin = true;
        ClientOptions co;
        co.incarnation = 1;
        co.resumes = true;
        co.waits_to_rejoin = true;
        auto client = cluster.Connect(2, 3, co);
        back.report = RunTraining(w, device.get(), client.get(), ds, test::Recorder(&back.trace), out);
      });
    }
    for (auto& t : threads) t.join();
    std::string said(static_cast<size_t>(std::ftell(out)), '\0');
    std::rewind(out);
    said.resize(std::fread(said.data(), 1, said.size(), out));
    std::fclose(out);
    for (const auto& r : runs) ASSERT_TRUE(r.report.ok()) << r.report.status() << "\n" << said;
    EXPECT_EQ(runs[0].trace, runs[1].trace);
    traces[run] = runs[0].trace;
    if (!moves) {
      EXPECT_EQ(runs[0].report->examples, 16 * 4);
      EXPECT_EQ(runs[2].report->steps, 16);
      continue;
    }
    ASSERT_TRUE(back.report.ok()) << back.report.status() << "\n" << said;
    EXPECT_EQ(runs[2].report->steps, 5);
    EXPECT_EQ(runs[2].report->examples, 5 * 4);
    EXPECT_EQ(back.report->first_step, 9) << said;
    EXPECT_EQ(back.report->steps, 4) << said;
    EXPECT_EQ(back.report->examples, 4 * 4);
    EXPECT_EQ(runs[0].report->examples, 16 * 4 + 7 * 2);
    EXPECT_EQ(runs[1].report->examples, runs[0].report->examples);
    // From its first step on, the worker that joined again holds the others' parameters.
    ASSERT_GE(back.trace.size(), 4u);  // steps 9..12
    for (size_t i = 0; i < back.trace.size(); ++i) EXPECT_EQ(back.trace[i], runs[0].trace[9 + i]) << "step " << 9 + i;
    EXPECT_NE(said.find("[worker 2] left the job before step 13 (asked while the job ran)"), std::string::npos)
        << said;
    EXPECT_NE(said.find("[worker 0] worker 2 joins the job again at step 9 (asked of server 0)"), std::string::npos)
        << said;
    EXPECT_NE(said.find("[worker 2] joins the job again at step 9"), std::string::npos) << said;
    // Workers resumed into the job (at its end), even with flags that say worker 2 left before
    // step 5 (--leave 2@5), hear of its join (server 0) and of its later leave, in step order:
    // worker 2's own new process leaves at once.
    std::FILE* again = std::tmpfile();
    ASSERT_NE(again, nullptr);
    TrainerOptions resumed = o;
    resumed.resume = true;
    resumed.leave = {{2, 5}};
    ClientOptions later;
    later.incarnation = 2;  // (worker 2's last was 1)
    later.resumes = true;
    const auto ends = test::RunWorkers(cluster, 3, resumed, ds, false, again, {}, later);
    for (const auto& r : ends) ASSERT_TRUE(r.report.ok()) << r.report.status();
    std::string heard(static_cast<size_t>(std::ftell(again)), '\0');
    std::rewind(again);
    heard.resize(std::fread(heard.data(), 1, heard.size(), again));
    std::fclose(again);
    for (const int r : {0, 1, 2}) {
      EXPECT_NE(heard.find("[worker " + std::to_string(r) +
                           "] worker 2 joins the job again at step 9 (the servers say so)"),
                std::string::npos)
          << heard;
    }
    for (const int r : {0, 1}) {
      EXPECT_NE(heard.find("[worker " + std::to_string(r) +
                           "] worker 2 left the job before step 13 (the servers say so)"),
                std::string::npos)
          << heard;
    }
    EXPECT_NE(heard.find("[worker 2] left the job before step"), std::string::npos) << heard;
    EXPECT_EQ(ends[2].report->steps, 0);
  }
  ASSERT_EQ(traces[0].size(), 17u);  // steps 0..15 and the final parameters
  for (size_t t = 0; t < traces[0].size(); ++t) EXPECT_EQ(traces[1][t], traces[0][t]) << "step " << t;
  EXPECT_LT(test::MaxRel(traces[0].back(), traces[2].back()), 1e-4);
  EXPECT_GT(test::MaxRel(traces[0].back(), traces[0].front()), 1e-3) << "the parameters did not move";
}

// Every example is used once per epoch across the workers, whatever N, B and M: the epoch's
// last step takes the rest of each shard (trainer.h). 41 examples over 2 workers of batch 4:
// shards of 21 and 20, 5 steps an epoch, worker 0's last step holds 5 examples (kB + 1).
// --eval-every epoch evaluates after each epoch: worker 0's metrics file has one eval line per
// epoch, at its last step.
TEST(Epochs, EveryExampleOncePerEpochAndEvalEachEpoch) {
  for (const int64_t examples : {44, 45, 41}) {
    SCOPED_TRACE("examples " + std::to_string(examples));
    const data::ImageDataset train = test::MakeImages(examples, kDataSeed);
    const Datasets ds{&train, &train};
    const std::string metrics = testing::TempDir() + "/epochs_{rank}.jsonl";
    ServerOptions so;
    so.compute_threads = 1;
    auto cluster = ferry::test::LocalCluster::Start(2, false, so);
    TrainerOptions o = BaseOptions(OptimizerType::kSgd, 0.1f, 0);
    o.epochs = 3;
    o.eval_each_epoch = true;
    o.metrics_out = metrics;
    o.batch = 4;
    const auto runs = test::RunWorkers(cluster, 2, o, ds);
    ASSERT_TRUE(runs[0].report.ok()) << runs[0].report.status();
    ASSERT_TRUE(runs[1].report.ok()) << runs[1].report.status();
    const TrainReport* report[2] = {&*runs[0].report, &*runs[1].report};
    const int64_t smallest_shard = examples / 2;
    EXPECT_EQ(report[0]->steps, 3 * ((smallest_shard + 3) / 4));
    EXPECT_EQ(report[1]->steps, report[0]->steps);
    EXPECT_EQ(report[0]->examples, 3 * ((examples + 1) / 2));  // worker 0 holds the odd one out
    EXPECT_EQ(report[1]->examples, 3 * (examples / 2));

    std::ifstream in(testing::TempDir() + "/epochs_0.jsonl");
    ASSERT_TRUE(in.good());
    std::vector<int64_t> eval_steps;
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json ev = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      ASSERT_TRUE(ev.is_object()) << "not a JSON object: " << line;
      if (ev.at("event") == "eval") eval_steps.push_back(ev.at("step"));
    }
    const int64_t per_epoch = report[0]->steps / 3;
    EXPECT_EQ(eval_steps, (std::vector<int64_t>{per_epoch, 2 * per_epoch, 3 * per_epoch}));
  }
}

// Async and ssp workers are not in step: the fast one waits for the others at the end, so every
// worker's final parameters (and worker 0's final evaluation) hold every update, the straggler's
// last ones included.
// (With --pipeline prefetch too: the last step's exchange ends before the final pull.)
TEST(FinalModel, AsyncAndSspFinalParametersHoldEveryWorkersUpdates) {
  const data::ImageDataset train = test::MakeImages(64, kDataSeed);
  const Datasets ds{&train, &train};
  constexpr int64_t kSteps = 12;
  for (const Pipeline pipeline : {Pipeline::kExchange, Pipeline::kPrefetch})
  for (const Consistency mode : {Consistency::kAsync, Consistency::kSsp}) {
    SCOPED_TRACE(mode == Consistency::kAsync ? "async" : "ssp:2");
    SCOPED_TRACE(pipeline == Pipeline::kExchange ? "exchange" : "prefetch");
    auto cluster = ferry::test::LocalCluster::Start(2);
    TrainerOptions o = BaseOptions(OptimizerType::kSgd, 0.1f, kSteps);
    o.pipeline = pipeline;
    o.consistency = mode;
    o.staleness = 2;
    o.batch = 4;
    o.straggler_rank = 1;
    o.straggler_delay_ms = 15;
    // Worker 0 finishes its steps first, however a loaded machine schedules the two: worker 1
    // holds after its last step (its last exchange may still travel; its flush and finish are to
    // come) until worker 0 has done its last. Bounded: 60 s.
    std::mutex mu;
    std::condition_variable cv;
    bool fast_done = false;
    bool fast_was_first = false;
    const test::PerRank order = [&](int rank, TrainerOptions&, TrainHooks& hooks) {
      hooks.on_step = [&, rank](const StepDone& d) {
        if (d.step != kSteps) return;
        std::unique_lock<std::mutex> lock(mu);
        if (rank == 0) {
          fast_done = true;
          cv.notify_all();
        } else {
          fast_was_first = cv.wait_for(lock, std::chrono::seconds(60), [&] { return fast_done; });
        }
      };
    };
    const auto runs = test::RunWorkers(cluster, 2, o, ds, /*record=*/false, nullptr, order);
    ASSERT_TRUE(runs[0].report.ok()) << runs[0].report.status();
    ASSERT_TRUE(runs[1].report.ok()) << runs[1].report.status();
    EXPECT_TRUE(fast_was_first) << "worker 0 did not finish its steps in 60 s";
    EXPECT_EQ(runs[0].report->final_params, runs[1].report->final_params);
    EXPECT_EQ(runs[0].report->eval.count, 64);
  }
}

}  // namespace
}  // namespace ferry::trainer
