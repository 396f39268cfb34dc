// trainer/trainer/options.h — every setting of ferry-trainer, parsed in one place.
//
// ParseTrainerFlags turns argv into a TrainerOptions and checks every value; a bad flag or value
// is INVALID_ARGUMENT with a message that names the flag. Nothing else in the trainer reads argv
// or the environment.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/table_spec.h"

namespace ferry::trainer {

enum class DeviceKind { kAuto, kCpu, kCuda };

struct TrainerOptions {
  // ---- Cluster ----
  std::vector<std::string> servers;  // --servers tcp://a,tcp://b (required unless --local)
  int rank = 0;                      // --rank R, in [0, num_workers)
  int num_workers = 1;               // --num-workers M
  bool local = false;                // --local: one process, local optimizer, no servers

  // ---- Device ----
  DeviceKind device = DeviceKind::kAuto;  // --device cuda|cpu|auto
  int gpu = 0;                            // --gpu N (CUDA device ordinal)

  // ---- Model ----
  std::string model = "mlp";                // --model mlp (the only model so far)
  std::vector<int64_t> hidden = {256, 128};  // --hidden 256,128 (empty list "": softmax regression)
  uint64_t seed = 1;                        // --seed: parameter init and data shuffle

  // ---- Optimization ----
  OptimizerSpec optimizer = [] {
    OptimizerSpec o;
    o.type = OptimizerType::kSgd;  // --optimizer sgd|momentum|adagrad|adam
    o.learning_rate = 0.1f;        // --lr
    return o;
  }();
  Consistency consistency = Consistency::kSync;  // --consistency sync|async|ssp:S
  int32_t staleness = 0;                         // S of ssp:S

  // ---- Data and schedule ----
  std::string data_dir = "/usr/share/datasets/fashion-mnist";  // --data-dir
  int64_t batch = 64;         // --batch B: examples per worker per step
  int64_t epochs = 1;         // --epochs E (ignored when --steps is given)
  int64_t steps = 0;          // --steps N: total steps per worker; 0 = use --epochs
  bool shuffle = true;        // --no-shuffle turns the per-epoch shuffle off
  int64_t train_limit = 0;    // --train-limit N: use only the first N training examples (0 = all)
  int64_t test_limit = 0;     // --test-limit N: evaluate on the first N test examples (0 = all)

  // ---- Reporting ----
  int64_t log_every = 100;    // --log-every N: a progress line every N steps (0 = none)
  int64_t eval_every = 0;     // --eval-every N: evaluate every N steps (0 = only at the end)
  std::string metrics_out;    // --metrics-out FILE: JSON lines, one per progress line / eval
  bool quiet = false;         // --quiet: no progress lines on stdout
  bool help = false;          // --help: print TrainerUsage() and exit

  // Checks the combination of values (what the flags cannot check one at a time).
  Status Validate() const;
};

// Parses argv[1..argc) ("--flag value" or "--flag=value") and validates the result (unless
// --help was given, which sets `help` and skips validation).
StatusOr<TrainerOptions> ParseTrainerFlags(int argc, const char* const* argv);

// The usage text.
std::string TrainerUsage();

}  // namespace ferry::trainer
