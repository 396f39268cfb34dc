// ferry/trainer/options.h — every setting of ferry-trainer, parsed in one place.
//
// ParseTrainerFlags turns argv into a TrainerOptions and checks every value; a bad flag or value
// is INVALID_ARGUMENT with a message that names the flag. Nothing else in the trainer reads argv
// or the environment.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "ferry/data/criteo.h"
#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "ferry/trainer/param_store.h"

namespace ferry::trainer {

enum class DeviceKind { kAuto, kCpu, kCuda };

// --table PATTERN:key=value,...: settings for the model's tables whose names match PATTERN
// (fnmatch(3): "ctr/emb*"), over the job's defaults. Keys: consistency (sync|async|ssp:S),
// optimizer (a name of the catalogue, ferry/optimizers.h), lr, wire (f32|fp16|bf16), and the
// numeric options of SetSpecOption (each optimizer hyperparameter, topk, ...). E.g. the hybrid
// PERSIA uses: --consistency sync --table 'ctr/emb*:consistency=async';
// gradient compression: --table 'mlp/*:wire=fp16,topk=0.01'.
struct TableOverride {
  std::string pattern;
  std::vector<std::pair<std::string, std::string>> settings;  // in the order given

  std::string ToString() const;  // as the flag was written
};

// What only the mlp model reads (--model mlp).
struct MlpModelOptions {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";  // --data-dir: the Fashion-MNIST files
};

// What only the ctr model reads (--model ctr): its embeddings, and its data: synthetic (default)
// or Criteo TSV files.
struct CtrModelOptions {
  int64_t emb_dim = 16;     // --emb-dim E: floats per embedding row
  int fields = 8;           // --ctr-fields F: categorical fields (synthetic)
  int64_t vocab = 1000;     // --ctr-vocab V: ids per field (synthetic)
  int dense = 4;            // --ctr-dense D: dense features (synthetic)
  int64_t train = 1000000;  // --ctr-train N: synthetic training examples
  int64_t test = 20000;     // --ctr-test N: synthetic test examples
  double zipf = 1.1;        // --ctr-zipf S: Zipf exponent of the ids (synthetic)
  uint64_t data_seed = 1;   // --data-seed S: the synthetic data and its planted model
  // --criteo-train LIST: train on Criteo TSV files (plain or .gz; comma-separated paths and glob
  // patterns, ExpandCriteoPaths), streamed: the run is sized by --steps, passing over them again
  // at their end. --criteo-test LIST: evaluate on them (held in memory: cap with --test-limit).
  std::string criteo_train;
  std::string criteo_test;
  data::CriteoShardBy criteo_shard = data::CriteoShardBy::kAuto;  // --criteo-shard auto|file|line
  // --audit-examples: counts on the servers every example the job trains on, in the sparse table
  // "ctr/audit" (one row of one float per distinct example, keyed by a hash of its label,
  // features and ids; each step pushes -n to the row of an example met n times in it, SGD at
  // learning rate 1): a checkpoint's row is then how often the job trained on that example, to
  // check that a resumed job neither repeats nor skips one. Async, ssp and --local (sync averages
  // the workers' gradients).
  bool audit_examples = false;
};

// One alternative per model of the registry (model_registry.h), in its order.
using ModelOptions = std::variant<MlpModelOptions, CtrModelOptions>;

struct TrainerOptions {
  // ---- Cluster ----
  std::vector<std::string> servers;  // --servers tcp://a,tcp://b (required unless --local)
  int rank = 0;                      // --rank R, in [0, num_workers)
  int num_workers = 1;               // --num-workers M
  // --incarnation N: which start of this worker's rank this process is (ferry-launch counts its
  // restarts); the servers give the rank to the highest (ClientOptions::incarnation).
  uint32_t incarnation = 0;
  bool local = false;                // --local: one process, local optimizer, no servers
  std::string cluster_source;        // where servers/rank/num_workers came from when not flags

  // ---- Device ----
  DeviceKind device = DeviceKind::kAuto;  // --device cuda|cpu|auto
  int gpu = 0;                            // --gpu N (CUDA device ordinal)

  // ---- Model ----
  // The model (--model, one of ModelNames(), model_registry.h) and its own options, which only
  // that model has: SetModel selects both. A run carries no other model's fields.
  std::string model = "mlp";
  ModelOptions model_options;                // the alternative of `model`
  std::vector<int64_t> hidden = {256, 128};  // --hidden 256,128 (empty list "": no hidden layer)
  uint64_t seed = 1;                         // --seed: parameter init and data shuffle

  // Selects model `name` with its options at their defaults (an unknown name: the model's
  // options stay, and Validate refuses the name).
  void SetModel(std::string_view name);
  // The options of the model selected; a caller that asks for another model's aborts (a bug:
  // only that model's code asks).
  MlpModelOptions& mlp();
  const MlpModelOptions& mlp() const;
  CtrModelOptions& ctr();
  const CtrModelOptions& ctr() const;

  // ---- Optimization ----
  OptimizerSpec optimizer = [] {
    OptimizerSpec o;
    o.type = OptimizerType::kSgd;  // --optimizer NAME (ferry/optimizers.h)
    o.learning_rate = 0.1f;        // --lr
    return o;
  }();
  Consistency consistency = Consistency::kSync;  // --consistency sync|async|ssp:S
  int32_t staleness = 0;                         // S of ssp:S
  std::vector<TableOverride> tables;             // --table PATTERN:key=value,... (repeatable)
  int backup_workers = 0;    // --backup-workers K (sync): each step aggregates M - K gradients
  int64_t accumulate = 1;    // --accumulate k: k micro-batches of --batch per push
  Pipeline pipeline = Pipeline::kExchange;  // --pipeline none|exchange|prefetch (param_store.h)
  // --push-by-layer: the step's last micro-batch sends the layers' gradients as backward yields
  // them (Model::PushDuringBackward, ParamStore::PushPart; layers under 64 KiB wait to go with
  // the next). With --local nothing is sent early (LocalStore applies the step at Push): the
  // same result, by the same sums. Refused with --straggler and --pipeline none.
  bool push_by_layer = false;
  // --blas-threads N: threads of the CPU GEMM (OpenBLAS); 0 keeps OpenBLAS's own count (its
  // OPENBLAS_NUM_THREADS, else the cores). The count used is recorded in the metrics; sync runs
  // are bitwise reproducible for the same count, so set it to compare machines (PROTOCOL.md).
  int blas_threads = 0;

  // The servers' replicas_to_aggregate for sync tables (0 = every worker).
  int32_t replicas_to_aggregate() const {
    return backup_workers > 0 ? static_cast<int32_t>(num_workers - backup_workers) : 0;
  }

  // ---- Data and schedule ----
  int64_t batch = 64;       // --batch B: examples per worker per step
  int64_t epochs = 1;       // --epochs E (ignored when --steps is given)
  int64_t steps = 0;        // --steps N: total steps per worker; 0 = use --epochs
  bool shuffle = true;      // --no-shuffle turns the per-epoch shuffle off
  int64_t train_limit = 0;  // --train-limit N: use only the first N training examples (0 = all)
  int64_t test_limit = 0;   // --test-limit N: evaluate on the first N test examples (0 = all)

  // ---- Checkpoints and resuming (the servers hold the checkpoint folder: ferry-ps --checkpoint-dir) ----
  // --checkpoint-every N: worker 0 asks the servers for a checkpoint every N steps of the job
  // (sync: global steps) and at its end; 0: never.
  int64_t checkpoint_every = 0;
  // --checkpoint-every-s S: ... and when S seconds have passed since the last one (0: never).
  double checkpoint_every_s = 0;
  // --max-checkpoint-failures N: after N checkpoints in a row fail (a full disk, a folder gone),
  // worker 0 stops the job with the last one's cause (exit status 2: a restart would fail the
  // same way); 0: it warns and trains on without checkpoints.
  int64_t max_checkpoint_failures = 3;
  // --resume: continue the job the servers hold (restored from a checkpoint, or running, for a
  // restarted worker) instead of starting one: begin at the servers' step (sync: the global step;
  // async/ssp: the step of the checkpoint they restored), at that step's place in this worker's
  // data (epoch, position and shuffle follow from the step), without waiting for the others.
  bool resume = false;

  // --move-slots STEP:drain=K|first[,...]: at step STEP (after its pull, before its push) every
  // worker meets at a barrier, worker 0 takes a checkpoint of the step and moves the servers'
  // slots (Client::MoveSlots; protocol 1.17): drain=K gives all of server K's to the others
  // (Placement::Drain of the map the job has), first gives them back by the job's first map; a
  // second barrier lets the workers go on. The servers need a checkpoint folder. In step order.
  struct SlotMove {
    int64_t step = 0;
    int drain = -1;  // the server emptied; -1: the first map (or `join`)
    int join = -1;   // the server, owning no slot, given a share (Placement::Grow)
  };
  std::vector<SlotMove> move_slots;
  // --move-asks-every N: every N steps (at steps N, 2N, ...; where a --move-slots move would
  // be) every worker meets at a barrier that takes a move asked of server 0 since (ferry-move,
  // AskMove; protocol 1.24), and when one was, they make it there as a --move-slots move of that
  // step. 0: moves are not asked for.
  int64_t move_asks_every = 0;
  // --max-asked-leaves N (1.26): with --move-asks-every, how many workers may be asked to leave
  // while the job runs (ferry-move leave-worker=W): the batch buffers are sized for that many
  // more absent workers' shares, and a leave past it is said and not made. 0: none.
  int64_t max_asked_leaves = 1;
  // --rejoin (1.27): with --resume, this process is a new one of a worker that left the job (a
  // leave asked, or --leave): it asks server 0 to take it back (Client::AskToRejoin), waits,
  // and joins at the step after the next move check (--move-asks-every, the same as the others'),
  // from which the others read its share of each step's examples no more.
  bool rejoin = false;
  // The move whose hand-over the servers should read the checkpoint of `step` ahead for (protocol
  // 1.19; worker 0, once that checkpoint is committed, at step `now`, having taken
  // `seconds_per_step` a step so far): the first move after `step`, unless another checkpoint is
  // due before it (by checkpoint_every, from its next multiple; by checkpoint_every_s, at that
  // pace). Null: none.
  const SlotMove* ReadAheadFor(int64_t step, int64_t now, double seconds_per_step) const;

  // --leave WORKER@STEP[,...]: worker WORKER leaves the job before step STEP (after pushing
  // STEP - 1; Client::Leave, protocol 1.18) and exits 0; the others train on without waiting for
  // it. --join WORKER@STEP[,...]: worker WORKER takes part from step STEP on (ClientOptions::
  // joins_at): its process starts with the job, meets the others at its barriers and evaluations,
  // and trains from STEP. Every worker is given the same lists: in each step, the share of the
  // data of a worker absent from it (not joined yet, or left) is split among the workers present,
  // so every example is still read once an epoch (data::StepBatch). Sync tables only; worker 0
  // takes part in every step (it checkpoints and reports).
  struct WorkerAt {
    int rank = 0;
    int64_t step = 0;
  };
  std::vector<WorkerAt> leave, join;
  // The step before which worker `worker` leaves; -1: it stays.
  int64_t LeaveStep(int worker) const {
    for (const WorkerAt& l : leave) {
      if (l.rank == worker) return l.step;
    }
    return -1;
  }
  // The first step worker `worker` takes part in; 0: from the start.
  int64_t JoinStep(int worker) const {
    for (const WorkerAt& j : join) {
      if (j.rank == worker) return j.step;
    }
    return 0;
  }
  // Whether worker `worker` takes part in step `step`.
  bool TakesPart(int worker, int64_t step) const {
    const int64_t leave_step = LeaveStep(worker);
    return step >= JoinStep(worker) && (leave_step < 0 || step < leave_step);
  }

  // --connect-timeout-s: the longest the first handshake with every server may take.
  double connect_timeout_s = 30;

  // --curve-keys: a job's CURVE key folder (ferry/curve.h): authenticate to the servers as this worker and
  // encrypt every message; empty: no CURVE.
  std::string curve_keys;

  // ---- Reporting ----
  int64_t log_every = 100;    // --log-every N: a progress line every N steps (0 = none)
  int64_t eval_every = 0;     // --eval-every N: evaluate every N steps (0 = only at the end)
  bool eval_each_epoch = false;  // --eval-every epoch: evaluate after every epoch (and at the end)
  std::string metrics_out;    // --metrics-out FILE: JSON lines (trainer.h); "{rank}" -> the rank
  // --metrics [HOST:]PORT: this worker's series for Prometheus (ferry/metrics/worker.h) at
  // http://HOST:PORT/metrics (port 0: a free one); empty: none.
  std::string metrics_bind;
  bool quiet = false;         // --quiet: no progress lines on stdout
  bool help = false;          // --help: print TrainerUsage() and exit

  // ---- Experiments ----
  // --straggler R:DELAY slows worker R each step: DELAY "50ms" sleeps 50 ms, "x2" sleeps
  // (2 - 1) x the step's compute time (the worker computes at half speed).
  int straggler_rank = -1;
  double straggler_delay_ms = 0;
  double straggler_factor = 1;

  // Checks the combination of values (what the flags cannot check one at a time).
  Status Validate() const;
};

// Parses argv[1..argc) ("--flag value" or "--flag=value") and validates the result (unless
// --help was given, which sets `help` and skips validation).
// Without --servers, --rank, --num-workers and --local, the cluster comes from `tf_config` (the
// TF_CONFIG environment variable by default; see ferry/cluster.h) when it is set.
StatusOr<TrainerOptions> ParseTrainerFlags(int argc, const char* const* argv,
                                           const char* tf_config = std::getenv("TF_CONFIG"));

// The usage text.
std::string TrainerUsage();

// Applies options.tables to the model's `specs`, in order (a later --table wins). A consistency
// set here also sets what goes with it (sync: replicas_to_aggregate per --backup-workers;
// ssp:S: the staleness; async: neither). INVALID_ARGUMENT naming the flag when a pattern matches
// no table (listing the tables) or a setting does not apply.
Status ApplyTableOverrides(const TrainerOptions& options, std::vector<TableSpec>* specs);

}  // namespace ferry::trainer
