// tests/cluster/trainer/worker_runs.h — trainers of an in-process cluster, one thread each, and the
// --local reference, for the training tests.
#pragma once

#include <cstdio>
#include <span>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/cluster.h"
#include "ferry/trainer/device.h"
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

// Runs `num_workers` trainers with `options` (servers, rank and num_workers set here) on the CPU
// device against `cluster`, one thread each, and waits for all. Progress lines go to `out`.
inline std::vector<WorkerRun> RunWorkers(const ferry::test::LocalCluster& cluster, int num_workers,
                                         const TrainerOptions& options, const Datasets& data,
                                         bool record = false, std::FILE* out = nullptr) {
  std::vector<WorkerRun> runs(static_cast<size_t>(num_workers));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < num_workers; ++rank) {
    threads.emplace_back([&, rank] {
      TrainerOptions o = options;
      o.servers = cluster.endpoints;
      o.rank = rank;
      o.num_workers = num_workers;
      auto client = cluster.Connect(rank, num_workers);
      auto device = CreateCpuDevice();
      WorkerRun& run = runs[static_cast<size_t>(rank)];
      run.report = RunTraining(o, device.get(), client.get(), data, record ? Recorder(&run.trace) : TrainHooks{}, out);
    });
  }
  for (auto& t : threads) t.join();
  return runs;
}

// The --local reference run of `options`, recording its trace.
inline WorkerRun RunLocal(TrainerOptions options, const Datasets& data) {
  options.local = true;
  WorkerRun run;
  auto device = CreateCpuDevice();
  run.report = RunTraining(options, device.get(), nullptr, data, Recorder(&run.trace), nullptr);
  return run;
}

}  // namespace ferry::trainer::test
