// Training on a CUDA GPU against the CPU twin: the MLP alone (--local), the ctr model in sync on an
// in-process cluster of 2 servers with 2 workers sharing the GPU (its ids deduplicated by the CUDA
// Dedup inside every sparse step), and --push-by-layer on the GPU. Each compares the parameters
// every step uses with the CPU device's (the kernels sum in other orders than the CPU twins, so
// within float rounding, not bit for bit) and runs the GPU twice: sync training on one GPU must
// give the same bits run to run (kernels_cuda.h: no atomics, fixed reduction orders; cuBLAS with
// the same handle settings). Every test skips, saying why, where there is no CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "ferry/trainer/models.h"
#include "support/cluster.h"
#include "worker_runs.h"

namespace ferry::trainer {
namespace {

// Skips the test unless this build has CUDA and the process sees a GPU.
#define FERRY_SKIP_WITHOUT_GPU()                                                                       \
  do {                                                                                                 \
    std::string choice;                                                                                \
    auto probe = CreateDevice(DeviceKind::kAuto, 0, &choice);                                          \
    if (!probe.ok() || !(*probe)->is_cuda()) GTEST_SKIP() << "no CUDA GPU here (" << choice << ")"; \
    std::printf("%s\n", choice.c_str());                                                               \
  } while (0)

using test::ExpectTracesMatch;
using test::MaxRel;

TrainerOptions OnDevice(TrainerOptions o, DeviceKind device) {
  o.device = device;
  return o;
}

TEST(CudaTraining, MlpLocalFollowsTheCpuTwinAndRepeatsItsBits) {
  FERRY_SKIP_WITHOUT_GPU();
  const data::ImageDataset train = test::MakeImages(200, 2024);
  const data::ImageDataset test_set = test::MakeImages(64, 2025);
  const Datasets ds{&train, &test_set};
  TrainerOptions o;
  o.hidden = {64, 32};
  o.optimizer.type = OptimizerType::kAdam;
  o.optimizer.learning_rate = 0.01f;
  o.batch = 32;
  o.steps = 30;
  o.seed = 3;
  o.log_every = 0;
  const test::WorkerRun cpu = test::RunLocal(OnDevice(o, DeviceKind::kCpu), ds);
  const test::WorkerRun gpu = test::RunLocal(OnDevice(o, DeviceKind::kCuda), ds);
  const test::WorkerRun again = test::RunLocal(OnDevice(o, DeviceKind::kCuda), ds);
  ASSERT_TRUE(cpu.report.ok()) << cpu.report.status();
  ASSERT_TRUE(gpu.report.ok()) << gpu.report.status();
  ASSERT_TRUE(again.report.ok()) << again.report.status();
  ExpectTracesMatch(gpu.trace, cpu.trace, 1e-4);
  EXPECT_EQ(gpu.trace, again.trace) << "two GPU runs differ";
  EXPECT_EQ(gpu.report->eval.count, 64);
  EXPECT_NEAR(gpu.report->eval.loss, cpu.report->eval.loss, 1e-4);
  EXPECT_NEAR(gpu.report->eval.accuracy, cpu.report->eval.accuracy, 2.0 / 64);
}

// Two workers on one GPU, 2 servers, sync: the servers average the GPU's gradients as they do the
// CPU's. The ctr model deduplicates each field's ids with the CUDA Dedup and pulls and pushes the
// rows it names, so a wrong unique list or inverse map would change every step after it.
TEST(CudaTraining, CtrSyncTwoWorkersOnOneGpuFollowTheCpuTwinAndRepeatTheirBits) {
  FERRY_SKIP_WITHOUT_GPU();
  TrainerOptions base = test::CtrOptions(OptimizerType::kAdam, 0.01f, 14);
  base.batch = 4;
  auto data = LoadCtrData(base);
  ASSERT_TRUE(data.ok()) << data.status();
  const Datasets ds{nullptr, nullptr, &*data};
  ServerOptions so;
  so.compute_threads = 1;
  std::vector<test::WorkerRun> runs[3];  // CPU, GPU, GPU again
  const DeviceKind devices[3] = {DeviceKind::kCpu, DeviceKind::kCuda, DeviceKind::kCuda};
  for (int i = 0; i < 3; ++i) {
    auto cluster = ferry::test::LocalCluster::Start(2, false, so);
    runs[i] = test::RunWorkers(cluster, 2, OnDevice(base, devices[i]), ds, /*record=*/true);
    for (const test::WorkerRun& w : runs[i]) ASSERT_TRUE(w.report.ok()) << w.report.status();
    EXPECT_EQ(runs[i][0].trace, runs[i][1].trace) << "the workers of run " << i << " pulled different parameters";
  }
  ExpectTracesMatch(runs[1][0].trace, runs[0][0].trace, 1e-4);
  EXPECT_EQ(runs[1][0].trace, runs[2][0].trace) << "two sync runs on the GPU differ";
  const EvalSummary& gpu = runs[1][0].report->eval;
  const EvalSummary& cpu = runs[0][0].report->eval;
  EXPECT_EQ(gpu.count, cpu.count);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-4);
  EXPECT_NEAR(gpu.auc, cpu.auc, 0.02);
  EXPECT_EQ(runs[1][0].report->eval.loss, runs[2][0].report->eval.loss);
}

// --push-by-layer on the GPU: the layers' gradients go while the layers below compute; sync
// training gives the bits of the step pushed whole on the same GPU.
TEST(CudaTraining, PushByLayerOnTheGpuGivesTheBitsOfTheWholePush) {
  FERRY_SKIP_WITHOUT_GPU();
  test::ExpectPushByLayerGivesTheBitsOfTheWholePush(DeviceKind::kCuda);
}

}  // namespace
}  // namespace ferry::trainer
