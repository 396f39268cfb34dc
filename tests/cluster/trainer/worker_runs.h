// tests/cluster/trainer/worker_runs.h — trainers of an in-process cluster, one thread each, and the
// --local reference, for the training tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/cluster.h"
#include "ferry/data/fashion_mnist.h"
#include "ferry/trainer/device.h"
#include "ferry/trainer/models.h"
#include "ferry/trainer/options.h"
#include "ferry/trainer/trainer.h"

namespace ferry::trainer::test {

using Trace = std::vector<std::vector<float>>;  // dense parameters used at each step, then the final ones

struct WorkerRun {
  StatusOr<TrainReport> report = InternalError("not run");
  Trace trace;  // filled when the run was asked to record it
};

// Hooks that append every step's dense parameters to *trace.
inline TrainHooks Recorder(Trace* trace) {
  TrainHooks hooks;
  hooks.on_params = [trace](int64_t, std::span<const float> p) { trace->emplace_back(p.begin(), p.end()); };
  return hooks;
}

// Relative error with a floor of 1e-2 on the scale (zero-initialised biases).
inline double MaxRel(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double{a[i]} - double{b[i]}) / std::max(std::abs(double{b[i]}), 1e-2));
  }
  return worst;
}

// `got` follows `want` within `tolerance` (MaxRel) at every step from the same initial parameters,
// and training moved them.
inline void ExpectTracesMatch(const Trace& got, const Trace& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(got[0], want[0]) << "the initial parameters differ";
  double worst = 0;
  for (size_t t = 0; t < want.size(); ++t) {
    const double rel = MaxRel(got[t], want[t]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, tolerance) << "step " << t;
  }
  EXPECT_GT(MaxRel(want.back(), want.front()), 1e-3) << "the parameters did not move";
  std::printf("max relative error over %zu steps: %.3g\n", want.size(), worst);
}

// Changes one worker's options and hooks before it runs (RunWorkers).
using PerRank = std::function<void(int rank, TrainerOptions& options, TrainHooks& hooks)>;

// The device a test's trainer runs on: the CUDA device when its options ask for one (the GPU tests
// skip before that where there is none), else the CPU backend (whatever `device` says, so that the
// training tests compute the same on a machine with a GPU).
inline std::unique_ptr<Device> TestDevice(const TrainerOptions& o) {
  if (o.device != DeviceKind::kCuda) return CreateCpuDevice();
  auto dev = CreateDevice(DeviceKind::kCuda, o.gpu);
  EXPECT_TRUE(dev.ok()) << dev.status();
  return dev.ok() ? std::move(*dev) : nullptr;
}

// Runs `num_workers` trainers with `options` (servers, rank and num_workers set here; then
// `per_rank`, if any) on TestDevice against `cluster`, one thread each, and waits for all.
// Progress lines go to `out`; the clients connect with `client_options`.
inline std::vector<WorkerRun> RunWorkers(const ferry::test::LocalCluster& cluster, int num_workers,
                                         const TrainerOptions& options, const Datasets& data,
                                         bool record = false, std::FILE* out = nullptr,
                                         const PerRank& per_rank = {}, const ClientOptions& client_options = {}) {
  std::vector<WorkerRun> runs(static_cast<size_t>(num_workers));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < num_workers; ++rank) {
    threads.emplace_back([&, rank] {
      TrainerOptions o = options;
      o.servers = cluster.endpoints;
      o.rank = rank;
      o.num_workers = num_workers;
      WorkerRun& run = runs[static_cast<size_t>(rank)];
      TrainHooks hooks = record ? Recorder(&run.trace) : TrainHooks{};
      if (per_rank) per_rank(rank, o, hooks);
      auto client = cluster.Connect(rank, num_workers, client_options);
      auto device = TestDevice(o);
      if (device == nullptr) return;
      run.report = RunTraining(o, device.get(), client.get(), data, hooks, out);
    });
  }
  for (auto& t : threads) t.join();
  return runs;
}

// Messages the cluster's servers received (heartbeats too: count with clients that send none).
inline int64_t ServerMessages(const ferry::test::LocalCluster& cluster) {
  int64_t n = 0;
  for (const auto& s : cluster.servers) n += s->stats().counters.at("messages");
  return n;
}

// A small deterministic image dataset: 4x4 "images", 4 classes, labels tied to the pixels so
// there is something to learn. Values from SplitMix64 of `seed` (tests print it).
inline data::ImageDataset MakeImages(int64_t count, uint64_t seed) {
  data::ImageDataset d;
  d.count = count;
  d.rows = 4;
  d.cols = 4;
  d.num_classes = 4;
  uint64_t x = seed;
  auto next = [&x] {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (int64_t i = 0; i < count; ++i) {
    const int32_t label = static_cast<int32_t>(next() % 4);
    d.labels.push_back(label);
    for (int p = 0; p < 16; ++p) {
      float v = static_cast<float>(next() >> 40) / static_cast<float>(1 << 24);
      if (p % 4 == label) v += 0.5f;
      d.images.push_back(v);
    }
  }
  return d;
}

// A small synthetic ctr job (3 fields of 40 ids, dim 4, 96 training examples), sync, CPU.
inline TrainerOptions CtrOptions(OptimizerType opt, float lr, int64_t steps) {
  TrainerOptions o;
  o.SetModel("ctr");
  o.device = DeviceKind::kCpu;
  o.hidden = {8};
  o.ctr().emb_dim = 4;
  o.ctr().fields = 3;
  o.ctr().vocab = 40;
  o.ctr().dense = 2;
  o.ctr().train = 96;
  o.ctr().test = 64;
  o.ctr().data_seed = 5;
  o.optimizer.type = opt;
  o.optimizer.learning_rate = lr;
  o.consistency = Consistency::kSync;
  o.steps = steps;
  o.seed = 11;
  o.log_every = 0;
  return o;
}

// --push-by-layer in sync: the ctr tower's layers (hidden 4096,16: the top two hold 256 KiB and go
// first, the first layer then goes before the embeddings' backward, each part in messages of its
// own) give, on `device`, the bits of the step sent whole, in more messages.
inline void ExpectPushByLayerGivesTheBitsOfTheWholePush(DeviceKind device) {
  TrainerOptions base = CtrOptions(OptimizerType::kAdam, 0.01f, 8);
  auto data = LoadCtrData(base);
  ASSERT_TRUE(data.ok()) << data.status();
  const Datasets ds{nullptr, nullptr, &*data};
  base.batch = 4;
  base.hidden = {4096, 16};
  base.device = device;
  Trace traces[2];
  int64_t messages[2] = {0, 0};
  for (const bool by_layer : {false, true}) {
    auto cluster = ferry::test::LocalCluster::Start(2);
    TrainerOptions o = base;
    o.push_by_layer = by_layer;
    const auto worker = RunWorkers(cluster, 2, o, ds, /*record=*/true, nullptr, {}, ferry::test::NoHeartbeats());
    ASSERT_TRUE(worker[0].report.ok()) << worker[0].report.status();
    ASSERT_TRUE(worker[1].report.ok()) << worker[1].report.status();
    EXPECT_EQ(worker[0].trace, worker[1].trace);
    traces[by_layer ? 1 : 0] = worker[0].trace;
    messages[by_layer ? 1 : 0] = ServerMessages(cluster);
  }
  ASSERT_EQ(traces[0].size(), 9u);
  for (size_t t = 0; t < traces[0].size(); ++t) EXPECT_EQ(traces[0][t], traces[1][t]) << "step " << t;
  EXPECT_GT(MaxRel(traces[0].back(), traces[0].front()), 1e-3) << "the parameters did not move";
  EXPECT_GT(messages[1], messages[0]);
}

// The --local reference run of `options`, recording its trace.
inline WorkerRun RunLocal(TrainerOptions options, const Datasets& data) {
  options.local = true;
  WorkerRun run;
  auto device = TestDevice(options);
  if (device == nullptr) return run;
  run.report = RunTraining(options, device.get(), nullptr, data, Recorder(&run.trace), nullptr);
  return run;
}

}  // namespace ferry::trainer::test
