// trainer/trainer/trainer.h — one worker's training loop (and the --local reference), usable
// in-process by tests and by the ferry-trainer binary.
//
// Per step t (0-based), with the tables of the model declared on the servers:
//   PullDense(every table, step t)  -> one call, batched tensors, into the model's host staging
//   forward + backward on this worker's batch t (gradients of the MEAN loss over the batch)
//   PushDense(every gradient, step t) -> one call
//   ssp: AdvanceClock(t + 1)
// After the last step T the worker pulls at step T: those are the final parameters.
// --local runs the same steps without servers: the parameters are initialised with the servers'
// own init code (ps::InitDense) and updated with their optimizer code (ps::ApplyUpdate).
//
// Data order: worker r of M visits data::EpochIndices(N, {r, M}, epoch, {shuffle, seed}), batch t
// of an epoch being shard positions [t B, (t + 1) B). Every worker runs
// floor(ShardSize(N, {M-1, M}) / B) steps per epoch (the remainder is dropped), so all workers
// run the same number of steps. With shuffling the permutation does not depend on M, so sync
// training on M workers of batch B sees, at step t, exactly the examples that --local with batch
// M*B sees at its step t (worker r gets those at positions r, r + M, ... of the local batch).
//
// Thread-safety: RunTraining may run on several threads at once (one Device and Client each).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <vector>

#include "ferry/client.h"
#include "ferry/data/fashion_mnist.h"
#include "ferry/status.h"
#include "trainer/trainer/device.h"
#include "trainer/trainer/options.h"

namespace ferry::trainer {

struct Datasets {
  const data::ImageDataset* train = nullptr;  // required
  const data::ImageDataset* test = nullptr;   // optional: no evaluation without it
};

struct TrainHooks {
  // Called with the parameters used by step t (all tensors back to back, in the model's table
  // order), before its forward; and once more with t = total steps and the final parameters.
  std::function<void(int64_t step, std::span<const float> params)> on_params;
};

struct TrainReport {
  int64_t steps = 0;
  int64_t examples = 0;           // training examples this worker processed
  double wall_s = 0;
  double examples_per_sec = 0;    // this worker's
  double first_loss = 0;          // step 0's training batch loss
  double last_loss = 0;           // mean training batch loss over the last logging window
  double eval_loss = -1;          // test-set mean cross-entropy at the end (-1: not evaluated)
  double eval_accuracy = -1;      // test-set accuracy at the end (-1: not evaluated)
  std::vector<float> final_params;
};

// Runs options.steps (or options.epochs) steps. `client` is null for options.local; otherwise a
// connected client of this worker (its rank / num_workers must match options). `out` gets the
// progress lines (null: none). Declares the model's tables itself.
StatusOr<TrainReport> RunTraining(const TrainerOptions& options, Device* device, Client* client,
                                  const Datasets& data, const TrainHooks& hooks = {},
                                  std::FILE* out = stdout);

}  // namespace ferry::trainer
