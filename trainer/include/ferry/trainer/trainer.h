// ferry/trainer/trainer.h — one worker's training loop (and the --local reference), usable
// in-process by tests and by the ferry-trainer binary.
//
// Per step t (0-based) of a worker, with the model's tables declared in its ParamStore (the
// servers, or this process for --local; see model.h for what each call does):
//   [evaluate, every --eval-every steps, or at the start of every epoch after the first]
//   load batch t; pull (dense tables + the batch's sparse rows) at step t; forward + backward over
//   --accumulate micro-batches; push the step's gradients for step t; ssp: advance the clock.
// With --pipeline exchange (the default) the push of the dense gradients also pulls the dense
// tables for step t + 1, in one round trip per server, and the worker loads batch t + 1 while it
// travels: step t + 1's pull then asks only for its sparse rows. With --pipeline prefetch (async
// and ssp) the parameters of that round trip are used at step t + 2, so it overlaps the whole of
// step t + 1 (ParamStore's Pipeline says what each costs in staleness).
// Before step 0 the workers meet at a barrier (every worker has connected). After the last step
// the worker tells the servers it has finished (Client::Finish: sync steps stop waiting for it, so
// workers with fewer steps never hold the others up), the workers meet at a barrier, then each
// pulls the final parameters and evaluates: they hold every worker's updates in every mode.
//
// Sync steps: the worker pulls at the global step it knows and its push counts for the step it
// was served (ParamStore::progress). A worker that fell behind (backup workers) or joined a job
// in progress moves to the current global step, as TensorFlow's SyncReplicasOptimizer moves a
// late worker. A run none of whose gradients was used fails instead of reporting success (with
// --backup-workers it is reported as a warning: being dropped is a backup worker's role).
//
// Data order: worker r of M visits data::EpochIndices(N, {r, M}, epoch, {shuffle, seed}); batch t
// of an epoch is shard positions [t kB, (t + 1) kB) (k = --accumulate). Every worker runs
// ceil(ShardSize(N, {M-1, M}) / kB) steps per epoch, so all workers run the same number of steps,
// and the epoch's last step takes the rest of the worker's shard (1 .. kB + 1 examples: shards
// differ by at most one), so every example is used once per epoch. With shuffling the permutation
// does not depend on M, so sync training on M workers of batch B sees, at step t, exactly the
// examples that --local with batch M*B sees at its step t (for N divisible by M; otherwise the
// last step's workers hold one example more or less, and the servers' plain average of their
// mean gradients weighs those examples very slightly differently). (Criteo data is read per
// worker — each its own lines — and visited in a per-worker shuffled order.)
//
// Evaluation: in sync mode the test set is split among the workers (contiguous ranges) and the
// sum-mergeable metric states are added up over the servers (Client::AllReduceSum), so the
// reported metrics weigh every example once. In async and ssp modes, and in sync mode with backup
// workers, the workers are not in step, so a collective would hold the fast ones back to the
// slowest (with backup workers it would undo what they are for): worker 0 evaluates the whole
// test set alone. Either way worker 0 reports.
//
// Metrics file (--metrics-out), JSON lines; every line has "event", "rank" and "wall_s" (seconds
// since this worker started training), "time" the cumulative split {"pull_s", "compute_s",
// "push_s", "wait_s", "eval_s"}. Every moment since the start goes to exactly one part, so the
// parts add up to wall_s (at "train" and "end" lines; a test checks it):
//   wait_s    waiting for other workers: the time the servers held this worker's pulls until
//             their step was reached (sync: the others' gradients; ssp: their clocks; measured
//             by the servers, protocol 1.2 held_us), the barriers at the start and the end, and
//             the merged evaluation's all-reduce
//   pull_s    the rest of the pulls (transfer), including the final one, and reading counters
//   push_s    pushing the step's gradients (and, ssp, sending the clock); worker 0's asking for
//             and committing checkpoints
//   compute_s loading the batch, forward + backward (a straggler's delay included), logging
//   eval_s    evaluation less its waiting
// Epochs are counted from 1.
//   start  num_workers, model, consistency, tables (the --table settings), backup_workers,
//          device, batch, accumulate, blas_threads, pipeline (none|exchange|prefetch|local),
//          train_examples, steps (and, for synthetic ctr data, planted_auc, planted_log_loss)
//   train  step, epoch (or pass, for streamed Criteo files: the pass being read), examples
//          (cumulative, this worker), loss (mean over the window),
//          accuracy, examples_per_sec (window), bytes_sent, bytes_received, comm_s (below)
//   eval   step, examples, count (test examples), loss, accuracy, auc (ctr), log_loss (ctr),
//          merged (true when the workers' shards were merged) — worker 0 only
//   end    steps, examples, examples_per_sec (over this worker's steps, evaluation included),
//          train_s (seconds to the end of its last step, less evaluation), final_wait_s (the
//          closing barrier: waiting for the other workers; part of wait_s), global_step (sync:
//          the step this worker's last push counted for), pushes_used / pushes_dropped (steps
//          whose gradient counted / was dropped whole as late), bytes_sent, bytes_received,
//          peak_rss_kib (this program's peak resident memory: VmHWM, not ru_maxrss), comm_s
//          (StoreProgress::comm_s over the steps: each call's round trips, less the servers'
//          holding; with --pipeline it overlaps compute_s, so train_s / steps against
//          max(compute_s, comm_s) / steps says how well a step hides its communication);
//          worker 0 adds
//          "staleness" {"k": updates applied k versions stale, summed over servers} and "final"
//          (the last eval's fields); first_step (> 0: the step a --resume worker began at);
//          with FERRY_DEVICE_TIMING=1 on a GPU, "device_time" (DeviceTimes: h2d_s, compute_s,
//          d2h_s, h2d_bytes, d2h_bytes, pageable_bytes, ops, by_op {"Gemm": {s, calls}, ...})
//   pass   (streamed Criteo files) a pass over this worker's files ended: pass (from 1),
//          examples, bad_lines, files, bytes (of text read), first_bad_lines ["file:line: reason"]
//   checkpoint  (worker 0, --checkpoint-every) step, ok; bytes (all shards), servers_paused_ms
//          (the longest any server stopped serving to copy its tables), saved_within_s (from
//          asking to committing: the servers write while training goes on, and the commit is
//          seen at a step boundary); or error
//
// Thread-safety: RunTraining may run on several threads at once (one Device and Client each).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ferry/client.h"
#include "ferry/data/fashion_mnist.h"
#include "ferry/status.h"
#include "ferry/trainer/device.h"
#include "ferry/trainer/models.h"
#include "ferry/trainer/options.h"

namespace ferry::trainer {

// The data of options.model: images for mlp, ctr for ctr.
struct Datasets {
  const data::ImageDataset* train = nullptr;
  const data::ImageDataset* test = nullptr;  // optional: no evaluation without it
  const CtrData* ctr = nullptr;
};

struct StepTimes {
  double pull_s = 0, compute_s = 0, push_s = 0, wait_s = 0, eval_s = 0;
};

// Where a worker is after one of its steps (TrainHooks::on_step; ferry-trainer --metrics).
struct StepDone {
  int64_t step = 0;      // steps done: the step's index + 1
  int64_t examples = 0;  // training examples this worker processed (cumulative)
  double loss = 0;       // the step's mean training loss
  StepTimes times;       // the worker's time so far by part (cumulative; the metrics file's "time")
  int64_t bytes_sent = 0, bytes_received = 0;  // by its client (cumulative; 0 for --local)
};

struct TrainHooks {
  // Called with the dense parameters used by step t (all tensors back to back, in the model's
  // table order), after its pull; and once more with t = total steps and the final parameters.
  std::function<void(int64_t step, std::span<const float> params)> on_params;
  // Worker 0 calls it once a step (after its pull); true asks the servers for a checkpoint at
  // that step (ferry-trainer: SIGUSR1 sets it). Empty: never.
  std::function<bool()> checkpoint_requested;
  // Called at the end of every step of this worker, on the thread that trains. Empty: never.
  std::function<void(const StepDone&)> on_step;
};

struct TrainReport {
  // The steps this worker ran: the job's steps, or fewer for a sync backup worker that fell
  // behind (the job ends when the global step reaches its budget) or a resumed worker (from
  // first_step on).
  int64_t steps = 0;
  int64_t first_step = 0;         // the step it began at (> 0: --resume)
  int64_t checkpoints = 0;        // worker 0 with --checkpoint-every: checkpoints saved
  int64_t checkpoints_failed = 0; // ... and refused or failed (training went on)
  int64_t examples = 0;           // training examples this worker processed
  double wall_s = 0;
  double examples_per_sec = 0;    // this worker's
  double first_loss = 0;          // step 0's training batch loss
  double last_loss = 0;           // mean training batch loss over the last logging window
  StepTimes times;
  // The final evaluation (count 0: none on this worker).
  EvalSummary eval;
  StoreProgress progress;  // at the end of the last step
  std::vector<float> final_params;
};

// Runs options.steps (or options.epochs) steps; in sync mode these are global steps (the job's,
// as with TensorFlow's SyncReplicasOptimizer): a worker stops once the job has reached them.
// `client` is null for options.local; otherwise a connected client of this worker (its rank /
// num_workers must match options). `out` gets the progress lines (null: none). Declares the
// model's tables itself. PrepareTraining and then TrainingRun::Run.
StatusOr<TrainReport> RunTraining(const TrainerOptions& options, Device* device, Client* client,
                                  const Datasets& data, const TrainHooks& hooks = {},
                                  std::FILE* out = stdout);

// The refusals of the user's settings that need no data, no device and no server: each --table
// pattern must match one of the model's tables (CtrTableSpecs / ClassifierTableSpecs) and its
// settings apply, and --pipeline prefetch takes no sync table. INVALID_ARGUMENT saying which.
// ferry-trainer checks these before it loads its data; PrepareTraining checks them again.
Status CheckSettings(const TrainerOptions& options);

// A run prepared by PrepareTraining. Thread-safety: used by one thread.
class TrainingRun {
 public:
  virtual ~TrainingRun() = default;
  // Trains from the job's step to the end (once).
  virtual StatusOr<TrainReport> Run() = 0;
};

// RunTraining's first part: builds the model, declares its tables on the servers, plans the data
// and opens the metrics file; nothing is trained. Its errors are refusals of the user's settings
// (IsSettingsRefusal: a restart with the same settings would meet them again) except those a
// restart may cure (a server not reached or too slow). Every argument must outlive the run.
StatusOr<std::unique_ptr<TrainingRun>> PrepareTraining(const TrainerOptions& options, Device* device,
                                                       Client* client, const Datasets& data,
                                                       const TrainHooks& hooks = {}, std::FILE* out = stdout);

// Whether an error of PrepareTraining (or of what ferry-trainer does before it: the device, the
// data, the keys) refuses what the user asked for, so that a restart would fail the same way:
// every code but UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, CANCELLED, INTERNAL, UNKNOWN and
// DATA_LOSS. ferry-trainer exits 2 (the usage status, which the launcher never restarts) on one.
bool IsSettingsRefusal(const Status& status);

}  // namespace ferry::trainer
