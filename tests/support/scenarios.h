// tests/support/scenarios.h — end-to-end checks shared by the in-process (inproc://) and the
// multi-process (tcp loopback) cluster tests. Each runs `num_workers` worker threads against
// the servers at `endpoints` and fails the current test on any mismatch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/context.h"
#include "ferry/table_spec.h"

namespace ferry::test {

struct ClusterAddress {
  std::vector<std::string> endpoints;
  std::shared_ptr<Context> context;  // needed for inproc://
};

std::unique_ptr<Client> ConnectWorker(const ClusterAddress& cluster, int rank, int num_workers);

// Sync mode: the servers' parameters after `steps` steps equal, bit for bit, a sequential
// reference that applies the rank-ordered average of every worker's gradient (dense + sparse).
// Each worker touches `ids_per_step` sparse ids a step: fewer than the servers means most servers
// get no id from a given worker in a given step (their step must close all the same).
void ExpectSyncMatchesSequential(const ClusterAddress& cluster, int num_workers, OptimizerType optimizer, int steps,
                                 const std::string& table_prefix, int ids_per_step = 6);

// Async mode: every push lands — with SGD at lr 1 from zeros, the parameters are minus the sum
// of all gradients pushed (dense and sparse, push and push-pull).
void ExpectAsyncLosesNothing(const ClusterAddress& cluster, int num_workers, int steps,
                             const std::string& table_prefix);

// A deterministic value in [-1, 1) for (a, b, c).
float Noise(uint64_t a, uint64_t b, uint64_t c);

}  // namespace ferry::test
