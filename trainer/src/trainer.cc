#include "ferry/trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "ferry/data/criteo.h"
#include "ferry/data/shard.h"
#include "ferry/kernels.h"
#include "ferry/messages/placement.h"
#include "ferry/trainer/model_registry.h"
#include "ferry/trainer/param_store.h"
#include "models/tower.h"

namespace ferry::trainer {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct FileCloser {
  void operator()(std::FILE* f) const { if (f != nullptr) std::fclose(f); }
};

// Splits a worker's wall time into parts: every interval between two marks goes to exactly one
// part, so the parts add up to the wall time by construction (the test checks it does).
class Lap {
 public:
  explicit Lap(Clock::time_point start) : last_(start) {}
  // Adds the time since the last mark to *part and marks now; returns that time.
  double To(double* part) {
    const Clock::time_point now = Clock::now();
    const double dt = Seconds(last_, now);
    *part += dt;
    last_ = now;
    return dt;
  }
  // Like To(part), but `waited` seconds of it (at most all) go to *wait instead.
  void Split(double* part, double* wait, double waited) {
    double other = 0;
    const double dt = To(&other);
    const double w = std::clamp(waited, 0.0, dt);
    *wait += w;
    *part += dt - w;
  }

 private:
  Clock::time_point last_;
};

// The --table settings as given (an empty list: every table as the job's defaults).
std::vector<std::string> TablesJson(const TrainerOptions& o) {
  std::vector<std::string> out;
  for (const TableOverride& t : o.tables) out.push_back(t.ToString());
  return out;
}

std::string ConsistencyName(const TrainerOptions& o) {
  if (o.consistency == Consistency::kSsp) return "ssp:" + std::to_string(o.staleness);
  return o.consistency == Consistency::kSync ? "sync" : "async";
}

// --pipeline's name ("local" for --local, which has no servers to talk to).
std::string PipelineName(const TrainerOptions& o) {
  if (o.local) return "local";
  switch (o.pipeline) {
    case Pipeline::kNone: return "none";
    case Pipeline::kExchange: return "exchange";
    case Pipeline::kPrefetch: return "prefetch";
  }
  return "?";
}

// This program's peak resident memory so far, in KiB: VmHWM of /proc/self/status, the high-water
// mark of the memory this program mapped (-1 if unknown). Not getrusage's ru_maxrss: Linux keeps
// that across exec, so it starts at the RSS the parent had when it forked us (a Python test that
// generated 100 MB of data made a CPU-only trainer's peak read 113 MiB, its own being 28).
int64_t PeakRssKiB() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long long kib = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib;
}

// "{rank}" in the path becomes the rank.
std::string MetricsPath(std::string path, int rank) {
  for (size_t at; (at = path.find("{rank}")) != std::string::npos;) path.replace(at, 6, std::to_string(rank));
  return path;
}

// The metrics file's lines are JSON objects whose members keep the order they are added in.
// A non-finite number is written as null.
using Json = nlohmann::ordered_json;

Json TimesJson(const StepTimes& t) {
  return {{"pull_s", t.pull_s},
          {"compute_s", t.compute_s},
          {"push_s", t.push_s},
          {"wait_s", t.wait_s},
          {"eval_s", t.eval_s}};
}

Json EvalJson(const EvalSummary& e, bool binary) {
  Json j = {{"count", e.count}, {"loss", e.loss}, {"accuracy", e.accuracy}};
  if (binary) {
    j["auc"] = e.auc >= 0 ? Json(e.auc) : Json(nullptr);  // -1: undefined (one class only)
    j["log_loss"] = e.loss;
  }
  return j;
}

// "45s", "3m05s", "2h03m".
std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  return buf;
}

// The model's row of the registry (options have passed Validate: the model is known).
const ModelInfo& ModelOf(const TrainerOptions& o) {
  const ModelInfo* m = FindModel(o.model);
  return m ? *m : Models()[0];
}

std::vector<TableSpec> PlannedTables(const TrainerOptions& o) { return ModelOf(o).plan_tables(o); }

bool SameNames(std::span<const TableSpec> a, std::span<const TableSpec> b) {
  return std::ranges::equal(a, b, [](const TableSpec& x, const TableSpec& y) { return x.name == y.name; });
}

StatusOr<std::unique_ptr<Model>> CreateModel(const TrainerOptions& o, Device* device, const Datasets& data) {
  return ModelOf(o).create(device, o, data);
}

// Which examples a worker trains on, and for how many steps.
struct DataPlan {
  data::ShardSpec shard;       // this worker's part of the training set
  int64_t train_n = 0;         // training examples in use (--train-limit applied); kStreamed
  bool streamed = false;       // the training set is a stream (Criteo files): no epochs, steps
  int64_t step_examples = 0;   // batch x accumulate
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;     // the job's (sync: global steps)
  int64_t test_n = 0;          // test examples in use (--test-limit applied)
  // Sync workers without backup workers are in step: they split the test set and merge.
  // Otherwise (async, ssp, or backup workers, whose point is that the job does not wait for the
  // slowest) a collective would hold the fast workers back: worker 0 does it all.
  bool merged_eval = false;
};

// A checkpoint worker 0 has asked for and not yet committed.
struct PendingCheckpoint {
  int64_t step = 0;
  Clock::time_point asked;
  std::vector<CheckpointShard> shards;  // filled in by SaveCheckpoint
  Handle handle;
};

// One worker's training, as RunTraining runs it: Prepare (model, tables, data plan, metrics
// file), then Step per step, then Finish (the closing barrier, the final pull and evaluation,
// the end event). Every interval of its wall time goes to one part of `report_.times` (Lap).
// Thread-safety: used once, by one thread.
class WorkerRun final : public TrainingRun {
 public:
  WorkerRun(const TrainerOptions& options, Device* device, Client* client, const Datasets& data,
            const TrainHooks& hooks, std::FILE* out)
      : options_(options),
        device_(device),
        client_(client),
        data_(data),
        hooks_(hooks),
        out_(out),
        num_workers_(options.local ? 1 : options.num_workers),
        rank_(options.local ? 0 : options.rank) {
    for (const TrainerOptions::WorkerAt& j : options_.join) timeline_.push_back({j.rank, j.step, true});
    for (const TrainerOptions::WorkerAt& l : options_.leave) timeline_.push_back({l.rank, l.step, false});
    std::ranges::stable_sort(timeline_, {}, &Change::step);
  }

  StatusOr<TrainReport> Run() override {
    FERRY_ASSIGN_OR_RETURN(t0_, StartStep());
    report_.first_step = t0_;
    // Evaluations fall on the job's steps: every eval_every (or steps_per_epoch) of them. The
    // job's step is this worker's t, except in sync mode with backup workers, where a worker
    // that fell behind moves to the global step: job_t is then the step after the one it last
    // pushed for. A resumed worker evaluates where the uninterrupted job would have.
    const int64_t eval_period =
        options_.eval_every > 0 ? options_.eval_every : options_.eval_each_epoch ? plan_.steps_per_epoch : 0;
    // A resumed worker takes the leaves and joins the servers know (asked while the job ran, 1.26
    // and 1.27) as the workers that saw them take them (a new process that waits to join again
    // checks its buffers' room once it knows its step).
    if (options_.resume && client_ != nullptr) {
      FERRY_RETURN_IF_ERROR(FollowServers(t0_, /*check_room=*/!options_.rejoin));
    }
    // --rejoin: a new process of a worker that left waits until the job takes it back.
    if (options_.rejoin && client_ != nullptr) {
      FERRY_ASSIGN_OR_RETURN(const int64_t at, WaitToRejoin());
      AddChange(rank_, at, /*present=*/true);
      // (and what was handed while it waited: its client heard server 0 again)
      FERRY_RETURN_IF_ERROR(FollowServers(at, /*check_room=*/true));
      store_->JoinAt(at);  // (its pulls until now were of the step it began waiting at)
      t0_ = report_.first_step = at;
      rejoined_ = true;
    }
    int64_t last_eval = t0_ > 0 ? t0_ - 1 : 0;
    // --leave: a worker resumed at or after its step (the job's last one included) leaves at once.
    if (LeftBy(t0_)) return LeaveJob(t0_);
    for (int64_t t = t0_; t < plan_.total_steps; ++t) {
      if (LeftBy(t)) return LeaveJob(t);
      const int64_t join = options_.JoinStep(rank_);
      // (--join has no backup workers: every worker is at step t; a joiner's pulls began late.)
      const int64_t job_t = t == t0_ ? t0_ : sync_servers_ && join == 0 ? JobStep() + 1 : t;
      if (join > 0 && t == join) {  // its first step: its pulls (an evaluation's too) wait for the step before
        store_->JoinAt(t);
        joined_ = window_start_ = Clock::now();  // its throughput counts from here
      }
      if (t < join) FERRY_RETURN_IF_ERROR(WaitToJoin(t));
      if (eval_period > 0 && job_t < plan_.total_steps && job_t / eval_period > last_eval / eval_period) {
        FERRY_RETURN_IF_ERROR(Evaluate(job_t));
        last_eval = job_t;
      }
      if (t < join) {  // a move's barriers, after the evaluation as the others meet them
        FERRY_RETURN_IF_ERROR(MaybeMoveSlots(t));
        FERRY_RETURN_IF_ERROR(MaybeTakeAskedMove(t));
        lap_.To(&report_.times.wait_s);
        continue;
      }
      FERRY_ASSIGN_OR_RETURN(const bool stepped, Step(t));
      if (!stepped) break;
    }
    FERRY_RETURN_IF_ERROR(Finish());
    return std::move(report_);
  }

  Status Prepare() {
    if (client_ != nullptr && (client_->rank() != rank_ || client_->num_workers() != num_workers_)) {
      return InvalidArgumentError("RunTraining: the client's rank/num_workers differ from the options'");
    }
    // The GEMM thread count (OpenBLAS's process-wide pool) when one is asked for; it is recorded
    // either way, since results repeat bitwise only for one count.
    if (options_.blas_threads > 0) kernels::cpu::SetGemmThreads(options_.blas_threads);
    FERRY_ASSIGN_OR_RETURN(model_, CreateModel(options_, device_, data_));
    store_ = options_.local ? CreateLocalStore() : CreateServerStore(client_, options_.pipeline);
    std::vector<TableSpec> specs = model_->TableSpecs();
    if (!SameNames(specs, PlannedTables(options_))) {
      return InternalError("the model declares other tables than CheckSettings checked (" + options_.model + ")");
    }
    FERRY_RETURN_IF_ERROR(ApplyTableOverrides(options_, &specs));
    FERRY_RETURN_IF_ERROR(store_->Declare(specs));
    // Per table (--table): the job steps in sync when any table is sync (the global step comes
    // from those), and its workers are in lockstep only when every table is.
    all_sync_ = std::ranges::all_of(specs, [](const TableSpec& s) { return s.consistency == Consistency::kSync; });
    any_ssp_ = std::ranges::any_of(specs, [](const TableSpec& s) { return s.consistency == Consistency::kSsp; });
    sync_servers_ = client_ != nullptr &&
                    std::ranges::any_of(specs, [](const TableSpec& s) { return s.consistency == Consistency::kSync; });
    // --join: the smallest dense sync table, which a worker waiting to join pulls each step to
    // keep in step with the job (WaitToJoin).
    for (const TableSpec& s : specs) {
      if (s.type == TableType::kDense && s.consistency == Consistency::kSync &&
          (pace_table_.name.empty() || s.num_elements() < pace_table_.num_elements())) {
        pace_table_ = s;
      }
    }
    FERRY_RETURN_IF_ERROR(PlanData());
    if (!options_.metrics_out.empty()) {
      const std::string path = MetricsPath(options_.metrics_out, rank_);
      metrics_file_.reset(std::fopen(path.c_str(), "w"));
      if (!metrics_file_) return NotFoundError("--metrics-out: cannot open '" + path + "' for writing");
    }
    start_ = Clock::now();
    lap_ = Lap(start_);
    window_start_ = start_;
    Json f = {{"num_workers", num_workers_},
              {"model", options_.model},
              {"consistency", ConsistencyName(options_)},
              {"tables", TablesJson(options_)},
              {"backup_workers", options_.backup_workers},
              {"device", device_->name()},
              {"batch", options_.batch},
              {"accumulate", options_.accumulate},
              {"blas_threads", kernels::cpu::GemmThreads()},
              {"pipeline", PipelineName(options_)},
              {"push_by_layer", options_.push_by_layer && !options_.local},
              {"train_examples", plan_.train_n},
              {"steps", plan_.total_steps}};
    if (data_.ctr != nullptr && data_.ctr->planted_auc >= 0) {
      f["planted_auc"] = data_.ctr->planted_auc;
      f["planted_log_loss"] = data_.ctr->planted_log_loss;
    }
    Event("start", std::move(f));
    return Status::Ok();
  }

 private:
  Status PlanData() {
    plan_.step_examples = options_.batch * options_.accumulate;
    plan_.test_n = options_.test_limit > 0 ? std::min(options_.test_limit, model_->test_size()) : model_->test_size();
    plan_.merged_eval = client_ != nullptr && all_sync_ && num_workers_ > 1 &&
                        options_.backup_workers == 0;
    const bool membership = !options_.leave.empty() || !options_.join.empty();
    if (membership && (client_ == nullptr || !all_sync_)) {
      return InvalidArgumentError(
          "--leave and --join need every table sync (a sync step is what waits for a worker, and what does not)");
    }
    if (!options_.join.empty() && pace_table_.name.empty()) {
      return InvalidArgumentError("--join: model '" + options_.model +
                                  "' has no dense sync table, which a worker waiting to join pulls each step to "
                                  "keep in step with the job");
    }
    if (model_->train_size() == Model::kStreamed) {
      if (membership) {
        return InvalidArgumentError(
            "--leave and --join: a streamed training set cannot hand an absent worker's share to the others; load "
            "it in memory");
      }
      // Each worker streams its own part of the data (the reader shards it) and passes over it
      // again at its end; the run is as long as --steps says (TrainerOptions::Validate).
      if (options_.steps <= 0 || options_.eval_each_epoch) {
        return InvalidArgumentError("a streamed training set needs --steps and no --eval-every epoch");
      }
      plan_.streamed = true;
      plan_.train_n = Model::kStreamed;
      plan_.total_steps = plan_.steps_per_epoch = options_.steps;
      return Status::Ok();
    }
    plan_.shard = data::ShardSpec{rank_, num_workers_};
    plan_.train_n =
        options_.train_limit > 0 ? std::min(options_.train_limit, model_->train_size()) : model_->train_size();
    // Every worker runs ceil(smallest shard / kB) steps an epoch, so all run the same number; the
    // epoch's last step takes what is left of the worker's own shard (shards differ by at most
    // one example, so that is 1 .. kB + 1 examples): every example is used once per epoch.
    const int64_t smallest_shard = data::ShardSize(plan_.train_n, {num_workers_ - 1, num_workers_});
    if (smallest_shard == 0) {
      return InvalidArgumentError(std::to_string(plan_.train_n) + " training examples leave worker " +
                                  std::to_string(num_workers_ - 1) + " of " + std::to_string(num_workers_) +
                                  " with none");
    }
    plan_.steps_per_epoch = (smallest_shard + plan_.step_examples - 1) / plan_.step_examples;
    plan_.total_steps = options_.steps > 0 ? options_.steps : options_.epochs * plan_.steps_per_epoch;
    for (const auto* list : {&options_.leave, &options_.join}) {
      for (const TrainerOptions::WorkerAt& w : *list) {
        if (w.step >= plan_.total_steps) {
          return InvalidArgumentError(std::string(list == &options_.leave ? "--leave" : "--join") + ": worker " +
                                      std::to_string(w.rank) + " at step " + std::to_string(w.step) +
                                      ", and the job has " + std::to_string(plan_.total_steps) + " steps");
        }
      }
    }
    return Status::Ok();
  }

  // Sync: how many global steps the job has taken, by this worker's last pull (a resumed job
  // counts from its start, not from where this process began).
  int64_t JobStep() const {
    const StoreProgress p = store_->progress();
    return options_.resume ? p.step : p.step - p.first_served;
  }

  // The step this worker begins at: 0, or with --resume the step of the job the servers hold
  // (sync: the global step, which a pull reports at once; async/ssp: this worker's own, as the
  // servers know it: the steps of its predecessor's pushes they took, or what the checkpoint they
  // restored recorded for it (servers before 1.11: the checkpoint's step, worker 0's); an ssp
  // worker first moves its clock there). Epoch, position and shuffle of this worker's data follow
  // from the step alone (LoadBatch), so a resumed worker neither repeats nor skips its examples
  // beyond the steps its servers lost.
  StatusOr<int64_t> StartStep() {
    if (!options_.resume) return int64_t{0};
    int64_t step = 0;
    bool own = false;
    if (sync_servers_) {
      StepTimes& times = report_.times;
      const double waited_before = PullWait();
      FERRY_RETURN_IF_ERROR(model_->Pull(*store_, 0).WithContext("reading the servers' global step"));
      lap_.Split(&times.pull_s, &times.wait_s, PullWait() - waited_before);
      step = store_->progress().step;
    } else if (client_->worker_step() >= 0) {
      step = std::min(client_->worker_step(), plan_.total_steps);
      own = true;
    } else {
      step = client_->restored_step();
    }
    // ssp tables (alone, or beside sync ones: --table): a restored server's clocks start at 0,
    // so each worker first moves its own to the step it resumes at.
    if (any_ssp_ && step > 0) FERRY_RETURN_IF_ERROR(store_->EndStep(step - 1));
    ckpt_last_ = step;  // that step's checkpoint is the one resumed from, or comes at the next multiple
    // "of its own": the step counts this worker's steps (async/ssp), not the job's (ferry-launch
    // reads it to count the steps a recovery lost).
    Say("resuming the job at step " + std::to_string(step) + " of " + std::to_string(plan_.total_steps) +
        (own ? " of its own" : "") +
        (plan_.streamed ? std::string()
                        : " (epoch " + std::to_string(step / plan_.steps_per_epoch + 1) + ", step " +
                              std::to_string(step % plan_.steps_per_epoch) + " of it)"));
    return step;
  }

  // ---- moving slots between the servers (--move-slots) ----

  // At a step of --move-slots, after the step's pull and before anything of it is pushed (or the
  // next step's rows asked for), every worker meets at a barrier: nothing is in flight then, and
  // nothing is pushed between the checkpoint and the hand-over (PROTOCOL.md, "Placement
  // versions"). Worker 0 commits a checkpoint in flight, takes one of the step and moves the
  // slots; a second barrier lets every worker go on. The others learn the map from the servers'
  // "moved" answers to their next requests, which their client sends again by it. A move changes
  // where values are held, never what they are: when one cannot be made the job trains on
  // without it, saying so. A worker restarted at that very step skips it (it cannot tell which
  // of the move's barriers the others wait in): they are refused there, restarted, and skip it
  // too (README, "Moving rows and chunks between servers").
  Status MaybeMoveSlots(int64_t t) {
    if (client_ == nullptr) return Status::Ok();
    for (const TrainerOptions::SlotMove& move : options_.move_slots) {
      if (move.step != t) continue;
      const std::string at = "moving slots at step " + std::to_string(t);
      if (options_.resume && t == t0_ && !rejoined_) {
        Say("not " + at + ": this worker was restarted at that step (the job trains on without the move)");
        continue;
      }
      FERRY_RETURN_IF_ERROR(client_->Barrier().WithContext("waiting for every worker before " + at));
      if (rank_ == 0) FERRY_RETURN_IF_ERROR(MoveSlots(move, t, at));
      FERRY_RETURN_IF_ERROR(client_->Barrier().WithContext("waiting for worker 0 " + at));
    }
    return Status::Ok();
  }

  // --move-asks-every N: at steps N, 2N, ... (where a --move-slots move would be) every worker
  // meets at a barrier that takes the move asked of server 0 since, if any (protocol 1.24,
  // Client::BarrierTakingMoves: every worker gets the same answer); one asked is made there as a
  // --move-slots move of this step, the barrier its first. A step with a --move-slots move of its
  // own takes none (the next check does), and so does a worker restarted at that very step, as
  // for --move-slots (MaybeMoveSlots).
  Status MaybeTakeAskedMove(int64_t t) {
    const int64_t every = options_.move_asks_every;
    if (client_ == nullptr || every <= 0 || t == 0 || t % every != 0) return Status::Ok();
    if (std::ranges::any_of(options_.move_slots, [t](const TrainerOptions::SlotMove& m) { return m.step == t; })) {
      return Status::Ok();
    }
    if (options_.resume && t == t0_ && !rejoined_) {
      // 1.27: restarted between a join's hand-over at this step and its second barrier, which the
      // others wait in (server 0 said so at the handshake): it meets them there.
      const bool pending =
          client_->rejoin_barrier() >= 0 && client_->first_collective() == client_->rejoin_barrier() &&
          std::ranges::any_of(timeline_, [t](const Change& c) { return c.present && c.step == t + 1; });
      if (!pending) return Status::Ok();
      Say("meeting the others at the second barrier of a join handed at step " + std::to_string(t));
      return client_->Barrier().WithContext("waiting for every worker at the hand-over of a join at step " +
                                            std::to_string(t));
    }
    StatusOr<Client::AskedMove> asked = client_->BarrierTakingMoves(t);
    if (!asked.ok()) {
      return asked.status().WithContext("waiting for every worker at step " + std::to_string(t) +
                                        " to take a move asked of the servers");
    }
    if (!asked->asked()) return Status::Ok();
    if (asked->leave_worker >= 0) return TakeAskedLeave(asked->leave_worker, t);
    if (asked->rejoin_worker >= 0) return TakeAskedRejoin(asked->rejoin_worker, t);
    const TrainerOptions::SlotMove move{t, asked->drain, asked->join};
    const std::string at = "making the move asked (" +
                           (move.join >= 0 ? "server " + std::to_string(move.join) + " to join"
                                           : "server " + std::to_string(move.drain) + " drained") +
                           ") at step " + std::to_string(t);
    if (rank_ == 0) FERRY_RETURN_IF_ERROR(MoveSlots(move, t, at, /*asked=*/true));
    return client_->Barrier().WithContext("waiting for worker 0 " + at);
  }

  // A worker's leave asked of server 0 while the job runs (1.26, MaybeTakeAskedMove at step t):
  // every worker got the same answer at the same barrier, so each takes it as a --leave W@t+1 (W
  // trains step t, then leaves; the others read its share of each step's examples from t + 1 on).
  // One this job cannot follow (not every table sync, ...) is said and not made, by every worker
  // alike (they share the options the checks read).
  Status TakeAskedLeave(int w, int64_t t) {
    const int64_t at = t + 1;
    if (!TakesPart(w, at)) {
      Say("worker " + std::to_string(w) + "'s leave asked at step " + std::to_string(t) +
          ": it takes no part in step " + std::to_string(at) + " already");
      return Status::Ok();
    }
    if (const Status can = CanLeave(w, at, /*asked=*/true); !can.ok()) {
      Say("warning: not making worker " + std::to_string(w) + "'s leave asked at step " + std::to_string(t) + ": " +
          std::string(can.message()) + "; the job trains on with it");
      return Status::Ok();
    }
    AddChange(w, at, /*present=*/false);
    Say("worker " + std::to_string(w) + " leaves the job before step " + std::to_string(at) +
        " (asked of server 0): " + (w == rank_ ? "this worker" : "the others read its share of each step's examples"));
    Json f = {{"step", t}, {"worker", w}, {"leaves_at", at}};
    Event("leave_asked", std::move(f));
    return Status::Ok();
  }

  // Why the job cannot make worker `w` leave before step `at` (as --leave W@AT's checks; `asked`:
  // one more leave asked, which the batch buffers must have room for), or OK. (Its callers pass
  // over a leave the worker makes already, at or before `at`.)
  Status CanLeave(int w, int64_t at, bool asked) const {
    if (w <= 0 || w >= num_workers_) {
      return InvalidArgumentError("worker " + std::to_string(w) + " is not one of workers 1 to " +
                                  std::to_string(num_workers_ - 1) + " (worker 0 takes part in every step)");
    }
    if (client_ == nullptr || !all_sync_) {
      return FailedPreconditionError("a leave needs every table sync (a sync step is what waits for a worker)");
    }
    if (plan_.streamed) {
      return FailedPreconditionError("a streamed training set cannot hand an absent worker's share to the others");
    }
    if (options_.backup_workers > 0) {
      return FailedPreconditionError("not with --backup-workers (a step's quorum would count a worker absent from it)");
    }
    if (at >= plan_.total_steps) {
      return FailedPreconditionError("step " + std::to_string(at) + " is past the job's last (" +
                                     std::to_string(plan_.total_steps - 1) + ")");
    }
    if (asked && options_.move_asks_every <= 0) {
      return FailedPreconditionError("a leave asked needs --move-asks-every (the batch buffers hold no share for it)");
    }
    if (asked) return Room(at, w);
    return Status::Ok();
  }

  // Whether the batch buffers hold the shares of the workers absent from each step from `from` on
  // (as many as MaxBatch counts), with worker `also_absent` (-1: none) absent too: the count
  // changes only at a leave's or a join's step.
  Status Room(int64_t from, int also_absent = -1) const {
    const int64_t room = models::MaxAbsent(options_);
    std::vector<int64_t> steps = {from};
    for (const Change& c : timeline_) {
      if (c.step > from) steps.push_back(c.step);
    }
    for (const int64_t t : steps) {
      int64_t absent = 0;
      for (int v = 0; v < num_workers_; ++v) absent += (v == also_absent || !TakesPart(v, t)) ? 1 : 0;
      if (absent > room) {
        return FailedPreconditionError("the batch buffers hold the shares of " + std::to_string(room) +
                                       " absent worker(s), and step " + std::to_string(t) + " would have " +
                                       std::to_string(absent) + " (--max-asked-leaves, with --move-asks-every)");
      }
    }
    return Status::Ok();
  }

  // The leaves and joins the servers know (1.26, 1.27: each server says a worker's latest of
  // each, its client their latest), taken in step order as the workers that saw them take them;
  // those it knows already (its flags, or taken before) pass. One it cannot follow (not every
  // table sync, ..., or, with `check_room`, no room in its buffers from `from` on) fails it: it
  // would read other examples than the others expect.
  Status FollowServers(int64_t from, bool check_room) {
    std::vector<Change> said;
    for (const auto& [w, at] : client_->workers_left()) said.push_back({w, at, false});
    for (const auto& [w, at] : client_->workers_rejoined()) said.push_back({w, at, true});
    std::ranges::stable_sort(said, {}, &Change::step);
    const std::string advice = " (resume it with the others' flags: --move-asks-every, --max-asked-leaves)";
    for (const Change& c : said) {
      if (TakesPart(c.rank, c.step) == c.present) continue;
      const std::string what = "worker " + std::to_string(c.rank) +
                               (c.present ? " joins the job again at step " : " left the job before step ") +
                               std::to_string(c.step);
      if (!c.present && c.rank != rank_) {
        if (const Status can = CanLeave(c.rank, c.step, /*asked=*/false); !can.ok()) {
          return FailedPreconditionError("the servers say " + what + ", which this worker cannot follow as the " +
                                         "others did: " + std::string(can.message()) + advice);
        }
      }
      AddChange(c.rank, c.step, c.present);
      if (c.rank != rank_ || c.present) {  // (its own leave: LeaveJob says it)
        Say(what + " (the servers say so): its share of each step's examples from then on is " +
            (c.present ? "its own" : "the others'"));
      }
    }
    if (!check_room) return Status::Ok();
    if (const Status room = Room(from); !room.ok()) {
      return FailedPreconditionError("this worker cannot follow the leaves the servers say the others took: " +
                                     std::string(room.message()) + advice);
    }
    return Status::Ok();
  }

  // A change of a worker's presence from a step on (timeline_).
  struct Change {
    int rank = 0;
    int64_t step = 0;
    bool present = false;
  };
  void AddChange(int w, int64_t step, bool present) {
    timeline_.push_back({w, step, present});
    std::ranges::stable_sort(timeline_, {}, &Change::step);
  }
  // Whether worker `w` takes part in step `t`: from the start unless it joins later (--join),
  // then as its changes up to `t` say, the latest standing.
  bool TakesPart(int w, int64_t t) const {
    bool present = options_.JoinStep(w) == 0;
    for (const Change& c : timeline_) {
      if (c.step > t) break;
      if (c.rank == w) present = c.present;
    }
    return present;
  }
  // The step of this worker's latest leave at or before `t`; -1: none.
  int64_t LastLeave(int64_t t) const {
    int64_t last = -1;
    for (const Change& c : timeline_) {
      if (c.step > t) break;
      if (c.rank == rank_ && !c.present) last = c.step;
    }
    return last;
  }
  // Whether this worker has left the job by step `t`: it takes no part in it, and not because it
  // joins later (--join, or a join again handed to the job).
  bool LeftBy(int64_t t) const {
    if (t < options_.JoinStep(rank_) || TakesPart(rank_, t)) return false;
    return std::ranges::none_of(timeline_, [&](const Change& c) { return c.rank == rank_ && c.present && c.step > t; });
  }

  // --rejoin (1.27): a new process of a worker that left asks server 0 to take it back, every few
  // milliseconds (Client::AskToRejoin: server 0 hears it is alive by the asks), until the workers
  // are handed its join at a move check, step T: it then takes part from T + 1 (every server told,
  // by the client), and meets the others at the hand-over's second barrier. Says what it waits for
  // every 10 s; a refusal (the servers know no leave of it, the job's other workers have finished)
  // ends it.
  StatusOr<int64_t> WaitToRejoin() {
    Say("asks server 0 to take it back into the job (--rejoin): it joins at the step after the job's next move "
        "check (every " + std::to_string(options_.move_asks_every) + " steps)");
    const Clock::time_point since = Clock::now();
    Clock::time_point next_say = since + std::chrono::seconds(10);
    for (;;) {
      StatusOr<int64_t> at = client_->AskToRejoin();
      FERRY_RETURN_IF_ERROR(at.status().WithContext("joining the job again (--rejoin)"));
      if (*at > 0) {
        lap_.To(&report_.times.wait_s);
        Say("joins the job again at step " + std::to_string(*at) + " (handed at the move check of step " +
            std::to_string(*at - 1) + ")");
        FERRY_RETURN_IF_ERROR(client_->Barrier().WithContext("meeting the others at the hand-over of this worker's "
                                                             "join at step " + std::to_string(*at - 1)));
        Json f = {{"step", *at - 1}, {"worker", rank_}, {"joins_at", *at}};
        Event("rejoin", std::move(f));
        return *at;
      }
      if (const Clock::time_point now = Clock::now(); now >= next_say) {
        Say("still waiting, after " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - since).count()) +
            " s, for the job's next move check to take it back (asked of server 0)");
        next_say = now + std::chrono::seconds(10);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // A worker's join asked while the job runs (1.27, MaybeTakeAskedMove at step t): its new
  // process (--rejoin) asked server 0, which handed it to every worker at this barrier and now
  // counts it in; it takes part from t + 1, and the workers meet it at a second barrier, which it
  // enters once every server knows its step (before it no push of step t + 1 can reach a server
  // that would close that step without it).
  Status TakeAskedRejoin(int w, int64_t t) {
    const int64_t at = t + 1;
    AddChange(w, at, /*present=*/true);
    Say("worker " + std::to_string(w) + " joins the job again at step " + std::to_string(at) +
        " (asked of server 0): from then on it reads its share of each step's examples");
    Json f = {{"step", t}, {"worker", w}, {"joins_at", at}};
    Event("rejoin_asked", std::move(f));
    return client_->Barrier().WithContext("waiting for worker " + std::to_string(w) +
                                          " to join the job again at step " + std::to_string(at));
  }

  // Worker 0's part of a move (MaybeMoveSlots): the checkpoint of the step, as any other (the
  // launcher and the metrics see it), then the hand-over from it. A move the map cannot make
  // fails the job, but for one `asked` of server 0 (MaybeTakeAskedMove): server 0 checked it
  // against the map the workers move from (it hands over none that no longer fits), so that holds
  // but for a map worker 0 cannot read, which is said, not fatal.
  Status MoveSlots(const TrainerOptions::SlotMove& move, int64_t t, const std::string& at, bool asked = false) {
    StatusOr<placement::Placement> now = Map();
    StatusOr<placement::Placement> next = now.ok() ? NextMap(move, *now) : StatusOr<placement::Placement>(now.status());
    if (!next.ok()) {
      if (!asked) return next.status().WithContext(at);
      Say("warning: not " + at + ": " + next.status().ToString() + "; the job trains on without it");
      return Status::Ok();
    }
    const Clock::time_point began = Clock::now();
    // The checkpoints committed here read nothing ahead: this move reads its own, and the next
    // move's map is not known until this one is made.
    no_read_ahead_ = true;
    struct Moving {
      bool* no_read_ahead;
      ~Moving() { *no_read_ahead = false; }
    } moving{&no_read_ahead_};
    CommitCheckpoint(/*wait=*/true);
    FERRY_RETURN_IF_ERROR(ckpt_stop_);
    const int64_t step = sync_servers_ ? store_->progress().step : t;
    const int64_t saved_before = report_.checkpoints;
    AskCheckpoint(step);
    CommitCheckpoint(/*wait=*/true);
    FERRY_RETURN_IF_ERROR(ckpt_stop_);
    if (report_.checkpoints == saved_before) {
      Say("warning: not " + at + ": its checkpoint was not saved (above); the job trains on without the move");
      return Status::Ok();
    }
    const Clock::time_point saved = Clock::now();
    FERRY_RETURN_IF_ERROR(client_->MoveSlots(next->version(), next->Owners(), step).WithContext(at));
    char line[300];
    std::snprintf(line, sizeof line,
                  "moved %d slots at step %lld (%s): placement version %llu; checkpoint %.3f s, hand-over %.3f s%s",
                  placement::Placement::SlotsMoved(*now, *next), static_cast<long long>(step),
                  move.drain >= 0  ? ("server " + std::to_string(move.drain) + " drained").c_str()
                  : move.join >= 0 ? ("server " + std::to_string(move.join) + " joined").c_str()
                                   : "the first map",
                  static_cast<unsigned long long>(next->version()), Seconds(began, saved), Seconds(saved, Clock::now()),
                  ahead_ && ahead_->read && ahead_->move_step == t
                      ? (" (the servers had read the checkpoint of step " + std::to_string(ahead_->from) + " ahead)")
                            .c_str()
                      : "");
    Say(line);
    return Status::Ok();
  }

  // The servers' map now, as this client places by it.
  StatusOr<placement::Placement> Map() const {
    return placement::Placement::FromOwners(client_->placement_version(), client_->placement_owners(),
                                            client_->num_servers());
  }

  // The map `move` makes of `now`, at the version after it.
  StatusOr<placement::Placement> NextMap(const TrainerOptions::SlotMove& move, const placement::Placement& now) const {
    StatusOr<placement::Placement> next = move.drain >= 0  ? now.Drain(move.drain)
                                          : move.join >= 0 ? now.Grow(move.join)
                                                           : placement::Placement::First(client_->num_servers());
    FERRY_RETURN_IF_ERROR(next.status());
    return placement::Placement::FromOwners(now.version() + 1, next->Owners(), client_->num_servers());
  }

  // Worker 0, once the checkpoint of `step` is committed: when the next move comes before another
  // checkpoint is due, the servers read this one ahead for its hand-over while the job trains
  // (Client::PrepareMoveSlots), so that the move's pause reads only what its own checkpoint (a
  // delta of this one, with --checkpoint-deltas) adds. Failing to is said, not fatal.
  void ReadAheadFor(int64_t step) {
    if (no_read_ahead_) return;
    const int64_t now = std::max(step, at_step_);  // (the commit may come a few steps after its step)
    const double pace = now > t0_ ? Seconds(start_, Clock::now()) / static_cast<double>(now - t0_) : -1.0;
    const TrainerOptions::SlotMove* move = options_.ReadAheadFor(step, now, pace);
    if (move == nullptr) return;
    StatusOr<placement::Placement> next = Map();
    if (next.ok()) next = NextMap(*move, *next);
    if (!next.ok()) return;  // the move says why, when it comes
    WaitReadAhead();
    ahead_ = ReadAhead{move->step, step, client_->PrepareMoveSlots(next->version(), next->Owners(), step)};
  }

  // Waits for the servers' read ahead, if one is in flight, and says when it failed.
  void WaitReadAhead() {
    if (!ahead_ || ahead_->waited) return;
    const Status s = ahead_->handle.wait();
    ahead_->waited = true;
    ahead_->read = s.ok();
    if (s.ok()) return;
    Say("warning: the servers could not read the checkpoint of step " + std::to_string(ahead_->from) +
        " ahead for the move at step " + std::to_string(ahead_->move_step) + " (" + s.ToString() +
        "); its hand-over reads all it needs then");
  }

  // ---- checkpoints (worker 0, --checkpoint-every) ----

  bool Checkpointing() const {
    return (options_.checkpoint_every > 0 || options_.checkpoint_every_s > 0) && rank_ == 0 && client_ != nullptr;
  }

  // After the pull for step t, before its push (a sync checkpoint is a cut at the global step):
  // commits the checkpoint in flight if the servers have written it, and asks for a new one
  // when the job is at a multiple of --checkpoint-every, --checkpoint-every-s have passed since
  // the last, or one was requested (hooks: SIGUSR1). The servers write while training goes on;
  // one checkpoint is in flight at a time, so when the next is due before the last is written
  // (a disk slower than the checkpoints asked for), the worker waits for it and says so.
  Status MaybeCheckpoint(int64_t t) {
    if (rank_ != 0 || client_ == nullptr) return Status::Ok();
    at_step_ = t;
    const int64_t step = sync_servers_ ? store_->progress().step : t;
    if (ckpt_last_ < 0) {  // the job's first step: nothing to save yet
      ckpt_last_ = step;
      ckpt_last_time_ = Clock::now();
    }
    const bool requested = hooks_.checkpoint_requested && hooks_.checkpoint_requested();
    if (!Checkpointing() && !requested && !ckpt_) return Status::Ok();
    CommitCheckpoint(/*wait=*/false);
    FERRY_RETURN_IF_ERROR(ckpt_stop_);
    const bool due =
        (options_.checkpoint_every > 0 && step % options_.checkpoint_every == 0) ||
        (options_.checkpoint_every_s > 0 && Seconds(ckpt_last_time_, Clock::now()) >= options_.checkpoint_every_s);
    if (step == ckpt_last_ || !(due || requested)) return Status::Ok();
    if (ckpt_) {
      const Clock::time_point w0 = Clock::now();
      const int64_t previous = ckpt_->step;
      CommitCheckpoint(/*wait=*/true);
      FERRY_RETURN_IF_ERROR(ckpt_stop_);
      const double waited = Seconds(w0, Clock::now());
      if (waited > 0.1) {
        char line[200];
        std::snprintf(line, sizeof line,
                      "waited %.1f s for the checkpoint of step %lld before asking for step %lld's (checkpoints are "
                      "due faster than the servers write them)",
                      waited, static_cast<long long>(previous), static_cast<long long>(step));
        Say(line);
      }
    }
    AskCheckpoint(step);
    return Status::Ok();
  }

  void AskCheckpoint(int64_t step) {
    WaitReadAhead();  // a server refuses a checkpoint while it reads one
    ckpt_.emplace();
    ckpt_->step = step;
    ckpt_->asked = Clock::now();
    ckpt_->shards.resize(static_cast<size_t>(client_->num_servers()));
    ckpt_->handle = client_->SaveCheckpoint(step, ckpt_->shards);
    ckpt_last_ = step;
    ckpt_last_time_ = ckpt_->asked;
  }

  // Commits the checkpoint in flight once every server has written its shard (with `wait`, waits
  // for that). A checkpoint that fails is reported and training goes on: the previous one stands;
  // after --max-checkpoint-failures in a row, ckpt_stop_ holds why the job stops.
  void CommitCheckpoint(bool wait) {
    if (!ckpt_ || (!wait && !ckpt_->handle.done())) return;
    Status s = ckpt_->handle.wait();
    if (s.ok()) s = client_->CommitCheckpoint(ckpt_->step, ckpt_->shards);
    Json f = {{"step", ckpt_->step}, {"ok", s.ok()}};
    if (s.ok()) {
      uint64_t bytes = 0;
      std::chrono::microseconds paused{0};
      for (const auto& shard : ckpt_->shards) bytes += shard.bytes, paused = std::max(paused, shard.paused);
      const double took = Seconds(ckpt_->asked, Clock::now());
      f["bytes"] = bytes;
      f["servers_paused_ms"] = static_cast<double>(paused.count()) / 1e3;
      f["saved_within_s"] = took;
      ++report_.checkpoints;
      ckpt_failed_in_row_.clear();
      char line[160];
      std::snprintf(line, sizeof line,
                    "checkpoint of step %lld saved: %.1f MB from %zu server(s), serving paused at most %.1f ms",
                    static_cast<long long>(ckpt_->step), static_cast<double>(bytes) / 1e6, ckpt_->shards.size(),
                    static_cast<double>(paused.count()) / 1e3);
      Say(line);
      ReadAheadFor(ckpt_->step);
    } else {
      f["error"] = s.ToString();
      ++report_.checkpoints_failed;
      Say("warning: the checkpoint of step " + std::to_string(ckpt_->step) + " was not saved (" + s.ToString() +
          "); training goes on, the previous checkpoint stands");
      ckpt_failed_in_row_.push_back(ckpt_->step);
      const auto n = static_cast<int64_t>(ckpt_failed_in_row_.size());
      if (options_.max_checkpoint_failures > 0 && n >= options_.max_checkpoint_failures) {
        std::string steps;
        for (int64_t f : ckpt_failed_in_row_) steps += (steps.empty() ? "" : ", ") + std::to_string(f);
        ckpt_stop_ = AbortedError(std::to_string(n) + " checkpoints in a row failed (steps " + steps +
                                  "): the job stops rather than train on without one (--max-checkpoint-failures " +
                                  std::to_string(options_.max_checkpoint_failures) +
                                  "; 0 trains on). The last failure: " + s.ToString());
      }
    }
    Event("checkpoint", std::move(f));
    ckpt_.reset();
  }

  // Evaluation with the parameters of `step`. The wait in its pulls and its collective go to
  // wait_s, the rest to eval_s.
  Status Evaluate(int64_t step) {
    StepTimes& times = report_.times;
    if (plan_.test_n == 0 || (!plan_.merged_eval && rank_ != 0)) return Status::Ok();
    std::vector<double> state;
    // Merged: the workers that take part at `step` (--leave) split the test set.
    const std::vector<int> present = Present(step);
    const auto n = static_cast<int64_t>(present.size());
    const auto index = static_cast<int64_t>(std::ranges::find(present, rank_) - present.begin());
    // A worker that has not joined yet (--join) evaluates none of the test set, and adds zeros to
    // the merged state (one that left evaluates no more: LeaveJob comes first).
    const int64_t first = !plan_.merged_eval ? 0 : index == n ? plan_.test_n : plan_.test_n * index / n;
    const int64_t last = !plan_.merged_eval ? plan_.test_n : index == n ? plan_.test_n : plan_.test_n * (index + 1) / n;
    const double waited_before = PullWait();
    FERRY_RETURN_IF_ERROR(model_->Evaluate(*store_, step, first, last - first, &state)
                              .WithContext("evaluating at step " + std::to_string(step)));
    lap_.Split(&times.eval_s, &times.wait_s, PullWait() - waited_before);
    if (plan_.merged_eval) {
      // Every worker's state has the same length; a shard with no example adds zeros.
      FERRY_ASSIGN_OR_RETURN(state, client_->AllReduceSum(state));
      lap_.To(&times.wait_s);
    }
    if (rank_ != 0) return Status::Ok();
    FERRY_ASSIGN_OR_RETURN(EvalSummary e, model_->Summarize(state));
    report_.eval = e;
    if (out_ != nullptr) {
      if (model_->is_binary()) {
        std::fprintf(out_,
                     "[worker %d] eval  step %" PRId64 ": test AUC %.4f  log-loss %.4f  accuracy %.4f  (%" PRId64
                     " examples)\n",
                     rank_, step, e.auc, e.loss, e.accuracy, e.count);
      } else {
        std::fprintf(out_,
                     "[worker %d] eval  step %" PRId64 ": test loss %.4f  accuracy %.4f  (%" PRId64 " examples)\n",
                     rank_, step, e.loss, e.accuracy, e.count);
      }
      std::fflush(out_);
    }
    lap_.To(&times.eval_s);
    Json f = {{"step", step}, {"examples", report_.examples}};
    f.update(EvalJson(e, model_->is_binary()));
    f["merged"] = plan_.merged_eval;
    f["time"] = TimesJson(times);
    Event("eval", std::move(f));
    return Status::Ok();
  }

  // Step t of this worker: its batch, pull, compute, push. False, having pulled only, when the
  // job has already taken all its steps (sync: a worker that fell behind stops there).
  StatusOr<bool> Step(int64_t t) {
    StepTimes& times = report_.times;
    int64_t examples = 0, epoch = 0;
    if (next_.step == t) {  // loaded during step t - 1, its rows read ahead
      FERRY_RETURN_IF_ERROR(model_->UseNext());
      examples = next_.examples;
      epoch = next_.epoch;
      next_.step = -1;
    } else {
      FERRY_ASSIGN_OR_RETURN(examples, LoadBatch(t));
      epoch = EpochOf(t);
    }
    lap_.To(&times.compute_s);
    FERRY_RETURN_IF_ERROR(Pull(t));
    FERRY_RETURN_IF_ERROR(MaybeMoveSlots(t));  // before the next step's rows are asked for
    FERRY_RETURN_IF_ERROR(MaybeTakeAskedMove(t));
    lap_.To(&times.wait_s);
    FERRY_RETURN_IF_ERROR(ReadRowsAhead(t + 1));
    if (sync_servers_ && JobStep() >= plan_.total_steps) {
      // Sync: the budget is the job's, in global steps. A worker that fell behind (a backup
      // worker late in some steps) stops once the others have taken the job to its last step,
      // rather than running the rest of its own steps alone after them. Without backup workers
      // every worker is at global step t here, so this ends none early.
      Say("the job reached its " + std::to_string(plan_.total_steps) + " steps (global step " +
          std::to_string(store_->progress().step) + ") after " + std::to_string(t) + " of this worker's: stopping");
      return false;
    }
    report_.steps = t + 1 - std::max(t0_, options_.JoinStep(rank_));
    FERRY_RETURN_IF_ERROR(MaybeCheckpoint(t));
    lap_.To(&times.push_s);  // asking for or committing a checkpoint: talking to the servers
    if (hooks_.on_params) hooks_.on_params(t, model_->dense_params());
    double loss_sum = 0;
    int64_t correct = 0;
    FERRY_RETURN_IF_ERROR(Compute(t, examples, &loss_sum, &correct));
    lap_.To(&times.compute_s);
    FERRY_RETURN_IF_ERROR(model_->Push(*store_, t));
    FERRY_RETURN_IF_ERROR(store_->EndStep(t));  // ssp: sends the clock without waiting
    lap_.To(&times.push_s);

    if (t == std::max(t0_, options_.JoinStep(rank_))) report_.first_loss = loss_sum / static_cast<double>(examples);
    report_.examples += examples;
    window_loss_ += loss_sum;
    window_correct_ += correct;
    window_examples_ += examples;
    if ((options_.log_every > 0 && (t + 1) % options_.log_every == 0) || t + 1 == plan_.total_steps) {
      LogWindow(t, epoch);
    }
    if (hooks_.on_step) {
      const ClientStats st = client_ != nullptr ? client_->stats() : ClientStats{};
      hooks_.on_step({.step = t + 1,
                      .examples = report_.examples,
                      .loss = loss_sum / static_cast<double>(examples),
                      .times = times,
                      .bytes_sent = st.bytes_sent,
                      .bytes_received = st.bytes_received});
    }
    return true;
  }

  // --pipeline prefetch, with a model that holds two batches: loads step `next`'s examples into
  // the other batch and starts reading their sparse rows, which travel while this step computes
  // and pushes (model.h, ReadsRowsAhead).
  Status ReadRowsAhead(int64_t next) {
    if (next >= plan_.total_steps || store_->pull_ahead() < 2 || !model_->ReadsRowsAhead()) return Status::Ok();
    StepTimes& times = report_.times;
    model_->LoadIntoNext(true);
    StatusOr<int64_t> examples = LoadBatch(next);
    model_->LoadIntoNext(false);
    FERRY_RETURN_IF_ERROR(examples.status());
    next_.step = next;
    next_.examples = *examples;
    next_.epoch = EpochOf(next);
    lap_.To(&times.compute_s);
    FERRY_RETURN_IF_ERROR(model_->PullRowsAhead(*store_, next));
    lap_.To(&times.pull_s);
    return Status::Ok();
  }

  // The epoch (a stream's pass) of step t, just after its batch was loaded.
  int64_t EpochOf(int64_t t) const {
    return plan_.streamed ? data_.ctr->train_stream->pass() : t / plan_.steps_per_epoch;
  }

  // Loads step t's training examples (the epoch's order, shuffled per epoch); returns how many.
  StatusOr<int64_t> LoadBatch(int64_t t) {
    if (plan_.streamed) {
      data::CriteoStream& stream = *data_.ctr->train_stream;
      if (t == t0_ && t0_ > 0) {  // resumed: past the examples of the steps before
        Say("reading past the " + std::to_string(t0_ * plan_.step_examples) + " examples of the steps before " +
            std::to_string(t0_));
        FERRY_RETURN_IF_ERROR(stream.Skip(t0_ * plan_.step_examples).WithContext("resuming the training stream"));
        stream.TakeFinishedPasses();
      }
      FERRY_RETURN_IF_ERROR(model_->LoadNextTrainBatch(plan_.step_examples));
      for (const data::CriteoPass& p : stream.TakeFinishedPasses()) PassEnded(p);
      return plan_.step_examples;
    }
    const int64_t epoch = t / plan_.steps_per_epoch;
    const int64_t step_in_epoch = t % plan_.steps_per_epoch;
    if (epoch != order_epoch_) {
      FERRY_ASSIGN_OR_RETURN(order_,
                             data::EpochIndices(plan_.train_n, plan_.shard, epoch, {options_.shuffle, options_.seed}));
      order_epoch_ = epoch;
    }
    const std::vector<int> present = Present(t);
    if (static_cast<int>(present.size()) == num_workers_) {
      const std::span<const int64_t> mine =
          data::StepSlice(order_, step_in_epoch, plan_.steps_per_epoch, plan_.step_examples);
      FERRY_RETURN_IF_ERROR(model_->LoadTrainBatch(mine));
      return static_cast<int64_t>(mine.size());
    }
    // --leave: this worker's slice, then its part of each slice the workers that left would have read.
    std::vector<const std::vector<int64_t>*> orders(static_cast<size_t>(num_workers_), nullptr);
    orders[static_cast<size_t>(rank_)] = &order_;
    for (int w = 0; w < num_workers_; ++w) {
      if (std::ranges::find(present, w) != present.end()) continue;
      auto& [order_epoch, order] = left_orders_.try_emplace(w, -1, std::vector<int64_t>{}).first->second;
      if (order_epoch != epoch) {
        FERRY_ASSIGN_OR_RETURN(order, data::EpochIndices(plan_.train_n, data::ShardSpec{w, num_workers_}, epoch,
                                                         {options_.shuffle, options_.seed}));
        order_epoch = epoch;
      }
      orders[static_cast<size_t>(w)] = &order;
    }
    const std::vector<int64_t> batch =
        data::StepBatch(rank_, present, orders, step_in_epoch, plan_.steps_per_epoch, plan_.step_examples);
    FERRY_RETURN_IF_ERROR(model_->LoadTrainBatch(batch));
    return static_cast<int64_t>(batch.size());
  }

  // The workers that take part in step t, in rank order: all but those that left before it
  // (--leave) or join after it (--join).
  std::vector<int> Present(int64_t t) const {
    std::vector<int> present;
    for (int w = 0; w < num_workers_; ++w) {
      if (TakesPart(w, t)) present.push_back(w);
    }
    return present;
  }

  // --join: step t, before this worker's first: it trains nothing and pushes nothing (no server
  // waits for its gradient: ClientOptions::joins_at), but meets the others where they meet, in
  // their order: the job's start barrier (here), the evaluation and a move's barriers (Run; its
  // evaluations add nothing). Each step it pulls the smallest dense sync table at that step,
  // which waits for the step before to close: so it keeps in step with the job, and never waits
  // for it longer than a step (a pull or collective held past the servers' --max-wait-s fails).
  Status WaitToJoin(int64_t t) {
    if (client_ == nullptr) return Status::Ok();
    if (t == t0_) Say("joins the job at step " + std::to_string(options_.JoinStep(rank_)) + " (--join)");
    // The job's start barrier, as Pull enters it: unless resumed into a job that has begun.
    if (t == t0_ && (!options_.resume || (t0_ == 0 && client_->first_collective() == 0))) {
      FERRY_RETURN_IF_ERROR(client_->StartBarrier().WithContext("waiting for every worker to connect"));
      lap_.To(&report_.times.wait_s);
    }
    if (!pace_table_.name.empty()) {
      pace_.resize(static_cast<size_t>(pace_table_.num_elements()));
      FERRY_RETURN_IF_ERROR(client_->PullDense(pace_table_.name, pace_, t)
                                .wait()
                                .WithContext("following the job to step " + std::to_string(t) +
                                             " before joining it (--join)"));
    }
    lap_.To(&report_.times.wait_s);
    return Status::Ok();
  }

  // The fields of a worker's "end" event that every worker has (Finish, LeaveJob): what it did
  // (report_, filled in) and its bytes.
  Json EndJson(double train_s) {
    const StoreProgress& progress = report_.progress;
    Json f = {{"steps", report_.steps},
              {"examples", report_.examples},
              {"examples_per_sec", report_.examples_per_sec},
              {"train_s", train_s},
              {"global_step", progress.step},
              {"first_step", t0_},
              {"pushes_used", progress.pushes_used},
              {"pushes_dropped", progress.pushes_dropped},
              {"peak_rss_kib", PeakRssKiB()},
              {"time", TimesJson(report_.times)},
              {"comm_s", progress.comm_s}};
    AddBytes(f);
    return f;
  }

  // --leave: this worker leaves the job before step t. Its pushes of the steps before are
  // applied (Flush), then the servers are told (Client::Leave): no sync step and no collective
  // waits for it from now on, and the others split its share of each step's examples. A worker
  // restarted at or after its step leaves at once.
  StatusOr<TrainReport> LeaveJob(int64_t t) {
    StepTimes& times = report_.times;
    lap_.To(&times.compute_s);
    FERRY_RETURN_IF_ERROR(store_->Flush());
    lap_.To(&times.push_s);
    const int64_t leave = LastLeave(t);  // (a resumed worker leaves at once, past its step: the step it left)
    FERRY_RETURN_IF_ERROR(
        client_->Leave(leave >= 0 ? leave : t).WithContext("telling the servers this worker leaves the job"));
    report_.wall_s = Wall();
    report_.examples_per_sec = report_.wall_s > 0 ? static_cast<double>(report_.examples) / report_.wall_s : 0.0;
    report_.progress = store_->progress();
    const bool asked = options_.LeaveStep(rank_) < 0 || options_.LeaveStep(rank_) > t;
    Say("left the job before step " + std::to_string(t) + (asked ? " (asked while the job ran)" : " (--leave)") +
        ": the other workers train on without it");
    // Its "end" (as every worker's), saying where it left.
    Json f = EndJson(report_.wall_s - times.eval_s);
    f["left_at"] = t;
    Event("end", std::move(f));
    return std::move(report_);
  }

  // Pulls step t's parameters. After the first pull the workers meet, before any gradient is
  // pushed: every one of them has connected (so none is still counted as finished by an earlier
  // job on the same servers), and every first pull was served at the same global step, the
  // job's first (a fast worker cannot have moved the job on before a slow one's first pull: with
  // backup workers it otherwise could, and the slow one would count its budget from a later step).
  Status Pull(int64_t t) {
    StepTimes& times = report_.times;
    const double waited_before = PullWait();
    FERRY_RETURN_IF_ERROR(model_->Pull(*store_, t));
    lap_.Split(&times.pull_s, &times.wait_s, PullWait() - waited_before);
    // A resumed worker waits for no one: the others may be training already (a restarted
    // worker). Unless the job has not begun: no collective has ended and it is at step 0 (a
    // worker that died before the others passed the start barrier), where it joins them there;
    // not an async worker restored at step 0 of its own (worker 0 resumes past it).
    if (t != t0_) return Status::Ok();
    if (options_.resume && (t0_ != 0 || client_ == nullptr || client_->first_collective() != 0 ||
                            (!sync_servers_ && client_->worker_step_restored())))
      return Status::Ok();
    if (client_ != nullptr) {
      FERRY_RETURN_IF_ERROR(client_->StartBarrier().WithContext("waiting for every worker to connect"));
      lap_.To(&times.wait_s);
    }
    if (sync_servers_ && store_->progress().first_served > 0) {
      Say("the servers are already at global step " + std::to_string(store_->progress().first_served) +
          " (an earlier job on them, or this worker restarted): joining at that step");
    }
    return Status::Ok();
  }

  // Forward and backward over the loaded batch in micro-batches of --batch (the epoch's last step
  // may end with a smaller one, or hold one more): each weighted by its share of the step's
  // examples, so the step's gradient is that of the mean loss over all of them (1/k each for a
  // full step). A --straggler worker then sleeps as asked.
  Status Compute(int64_t t, int64_t examples, double* loss_sum, int64_t* correct) {
    const Clock::time_point c0 = Clock::now();
    for (int64_t m = 0; m * options_.batch < examples; ++m) {
      const int64_t rows = std::min(options_.batch, examples - m * options_.batch);
      const float scale = static_cast<float>(rows) / static_cast<float>(examples);
      // --push-by-layer: the last micro-batch's backward sends each layer as it yields it.
      const bool last = (m + 1) * options_.batch >= examples;
      if (last && options_.push_by_layer) model_->PushDuringBackward(store_.get(), t);
      const Status computed = model_->ComputeGradients(m * options_.batch, rows, scale, m > 0, loss_sum, correct);
      if (last && options_.push_by_layer) model_->PushDuringBackward(nullptr, t);
      FERRY_RETURN_IF_ERROR(computed);
    }
    if (rank_ == options_.straggler_rank && !options_.local) {
      const double busy = Seconds(c0, Clock::now());
      const double delay = options_.straggler_delay_ms / 1e3 + (options_.straggler_factor - 1) * busy;
      if (delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    }
    return Status::Ok();
  }

  // The progress line and train event for the steps since the last one.
  void LogWindow(int64_t t, int64_t epoch) {
    const Clock::time_point now = Clock::now();
    const double dt = Seconds(window_start_, now);
    const double eps = dt > 0 ? static_cast<double>(window_examples_) / dt : 0.0;
    const double mean_loss = window_loss_ / static_cast<double>(window_examples_);
    const double acc = static_cast<double>(window_correct_) / static_cast<double>(window_examples_);
    report_.last_loss = mean_loss;
    // Epochs are counted from 1, as users count them.
    if (out_ != nullptr && !options_.quiet) {
      const int64_t epochs = (plan_.total_steps + plan_.steps_per_epoch - 1) / plan_.steps_per_epoch;
      // A stream's passes are not known in advance: "pass P" (the pass being read).
      const std::string where = plan_.streamed ? "pass " + std::to_string(epoch + 1)
                                               : "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs);
      // The time left at this run's pace so far (a resumed run counts from where it began).
      const double elapsed = Seconds(start_, now);
      const int64_t done = t + 1 - t0_, left = plan_.total_steps - (t + 1);
      const std::string eta =
          done > 0 ? Duration(elapsed / static_cast<double>(done) * static_cast<double>(left)) : "?";
      std::fprintf(out_,
                   "[worker %d] step %" PRId64 "/%" PRId64
                   " %s: loss %.4f  accuracy %.4f  %.0f examples/s  %.1f s  ETA %s\n",
                   rank_, t + 1, plan_.total_steps, where.c_str(), mean_loss, acc, eps, elapsed, eta.c_str());
      std::fflush(out_);
    }
    lap_.To(&report_.times.compute_s);  // the worker's own bookkeeping counts as its compute
    Json f = {{"step", t + 1},         {plan_.streamed ? "pass" : "epoch", epoch + 1}, {"examples", report_.examples},
              {"loss", mean_loss},     {"accuracy", acc},            {"examples_per_sec", eps},
              {"time", TimesJson(report_.times)}, {"comm_s", store_->progress().comm_s}};
    AddBytes(f);
    Event("train", std::move(f));
    window_loss_ = 0;
    window_correct_ = window_examples_ = 0;
    window_start_ = now;
  }

  // A pass over a streamed training set ended: what it read, said and recorded ("pass" event).
  void PassEnded(const data::CriteoPass& p) {
    const data::CriteoStats& st = p.stats;
    std::string line = "pass " + std::to_string(p.pass + 1) + " over this worker's training data done: " +
                       std::to_string(st.examples) + " examples from " + std::to_string(st.files) + " file(s), " +
                       std::to_string(st.bad_lines) + " bad lines skipped";
    Json bad = Json::array();
    for (const data::CriteoBadLine& b : st.first_bad_lines) {
      line += "\n  " + b.ToString();
      bad.push_back(b.ToString());
    }
    Say(line);
    Event("pass", {{"pass", p.pass + 1},
                   {"examples", st.examples},
                   {"bad_lines", st.bad_lines},
                   {"files", st.files},
                   {"bytes", st.bytes},
                   {"first_bad_lines", std::move(bad)}});
  }

  // After the last step: the final model holds every worker's updates. The worker tells the
  // servers it has finished (sync steps stop waiting for it), then the workers meet at a barrier
  // (a fast worker's wait for the others is final_wait_s, a part of wait_s), then pull and
  // evaluate; worker 0 also reads the servers' staleness histogram.
  Status Finish() {
    StepTimes& times = report_.times;
    lap_.To(&times.compute_s);
    // The last step's exchange (--pipeline) ends: this worker's training ends here, and train_s
    // is its time so far less evaluation.
    const double flush_waited_before = PullWait();
    FERRY_RETURN_IF_ERROR(store_->Flush());
    lap_.Split(&times.push_s, &times.wait_s, PullWait() - flush_waited_before);
    report_.wall_s = Wall();
    // (--join: over the time since it joined.)
    const double trained_s = joined_ ? Seconds(*joined_, Clock::now()) : report_.wall_s;
    report_.examples_per_sec = trained_s > 0 ? static_cast<double>(report_.examples) / trained_s : 0.0;
    const double train_s = report_.wall_s - times.eval_s;
    report_.progress = store_->progress();
    FERRY_RETURN_IF_ERROR(CheckGradientsUsed());

    double final_wait_s = 0;
    if (client_ != nullptr) {
      FERRY_RETURN_IF_ERROR(client_->Finish().WithContext("telling the servers this worker has finished"));
      FERRY_RETURN_IF_ERROR(client_->Barrier().WithContext("waiting for the other workers to finish"));
      final_wait_s = lap_.To(&times.wait_s);
    }
    const double waited_before = PullWait();
    FERRY_RETURN_IF_ERROR(model_->Pull(*store_, plan_.total_steps));
    lap_.Split(&times.pull_s, &times.wait_s, PullWait() - waited_before);
    if (hooks_.on_params) hooks_.on_params(plan_.total_steps, model_->dense_params());
    FinalCheckpoint();
    lap_.To(&times.push_s);
    const std::span<const float> final_params = model_->dense_params();
    report_.final_params.assign(final_params.begin(), final_params.end());
    FERRY_RETURN_IF_ERROR(Evaluate(plan_.total_steps));

    FERRY_ASSIGN_OR_RETURN(Json staleness, StalenessJson());
    lap_.To(&times.pull_s);  // reading the servers' counters
    Json f = EndJson(train_s);
    f["final_wait_s"] = final_wait_s;
    if (const DeviceTimes d = device_->times(); d.measured) {  // FERRY_DEVICE_TIMING on a GPU
      f["device_time"] = {{"h2d_s", d.h2d_s},         {"compute_s", d.compute_s},
                          {"d2h_s", d.d2h_s},         {"h2d_bytes", d.h2d_bytes},
                          {"d2h_bytes", d.d2h_bytes}, {"pageable_bytes", d.pageable_bytes},
                          {"ops", d.ops}};
      Json by_op = Json::object();
      for (const auto& [name, op] : d.by_op) by_op[name] = {{"s", op.s}, {"calls", op.calls}};
      f["device_time"]["by_op"] = std::move(by_op);
    }
    if (rank_ == 0) {
      f["staleness"] = std::move(staleness);
      if (report_.eval.count > 0) f["final"] = EvalJson(report_.eval, model_->is_binary());
    }
    Event("end", std::move(f));
    return Status::Ok();
  }

  // Worker 0, with --checkpoint-every: after every worker has finished (the closing barrier) and
  // the final pull, the job's final state is saved too, unless that step's is already.
  void FinalCheckpoint() {
    no_read_ahead_ = true;  // no move is left to read ahead for
    WaitReadAhead();
    if (!Checkpointing()) {
      CommitCheckpoint(/*wait=*/true);  // one asked for on request
      return;
    }
    CommitCheckpoint(/*wait=*/true);
    const int64_t step = sync_servers_ ? store_->progress().step : plan_.total_steps;
    if (step == ckpt_last_) return;
    AskCheckpoint(step);
    CommitCheckpoint(/*wait=*/true);
  }

  // Never "succeed" having trained nothing: a sync run none of whose gradients was used fails.
  // With backup workers that is a backup's role (the first M - K gradients make each step), so
  // it is reported, not an error.
  Status CheckGradientsUsed() {
    const StoreProgress& p = report_.progress;
    // A resumed job already at its last step (its final checkpoint) had nothing left to train.
    if (!sync_servers_ || plan_.total_steps <= t0_ || p.pushes_used != 0) return Status::Ok();
    const std::string what = "worker " + std::to_string(rank_) + ": none of its " + std::to_string(p.pushes_dropped) +
                             " gradients was used: each came after the servers had closed its step (global step now " +
                             std::to_string(p.step) + ")";
    if (options_.backup_workers == 0) return FailedPreconditionError(what);
    Say("warning: " + what + "; it was a backup worker in every step");
    return Status::Ok();
  }

  // Worker 0: the servers' staleness histogram {"staleness": updates}, summed over the servers
  // in the job (every worker is done: they met in Finish). A server that owns no slot now is not
  // asked (it may have left the job): what it counted while it owned some is not in the sum.
  // Others: empty.
  StatusOr<Json> StalenessJson() {
    std::map<int64_t, int64_t> staleness;
    if (client_ != nullptr && rank_ == 0) {
      constexpr std::string_view kPrefix = "staleness_";
      for (const int s : client_->servers_in_job()) {
        FERRY_ASSIGN_OR_RETURN(auto counters, client_->ServerCounters(s));
        for (const auto& [name, value] : counters) {
          if (name.rfind(kPrefix, 0) == 0 && value > 0) staleness[std::stoll(name.substr(kPrefix.size()))] += value;
        }
      }
    }
    Json hist = Json::object();
    for (const auto& [k, v] : staleness) hist[std::to_string(k)] = v;
    return hist;
  }

  double Wall() const { return Seconds(start_, Clock::now()); }
  double PullWait() const { return store_->progress().pull_wait_s; }

  // One line of the metrics file (nothing without --metrics-out): the event, the rank, the wall
  // time, then `fields`.
  void Event(const char* event, Json fields) {
    if (!metrics_file_) return;
    Json line = {{"event", event}, {"rank", rank_}, {"wall_s", Wall()}};
    line.update(fields);
    std::fprintf(metrics_file_.get(), "%s\n", line.dump().c_str());
    std::fflush(metrics_file_.get());
  }

  // The bytes this worker's client has sent and received so far.
  void AddBytes(Json& f) const {
    const ClientStats st = client_ != nullptr ? client_->stats() : ClientStats{};
    f["bytes_sent"] = st.bytes_sent;
    f["bytes_received"] = st.bytes_received;
  }

  // A line for the user (`out`), naming this worker.
  void Say(const std::string& text) {
    if (out_ == nullptr) return;
    std::fprintf(out_, "[worker %d] %s\n", rank_, text.c_str());
    std::fflush(out_);
  }

  const TrainerOptions& options_;
  Device* const device_;
  Client* const client_;
  const Datasets& data_;
  const TrainHooks& hooks_;
  std::FILE* const out_;
  const int num_workers_, rank_;
  bool sync_servers_ = false;  // on servers, and some table is sync (Prepare)
  bool all_sync_ = false;      // every table is sync
  bool any_ssp_ = false;       // some table is ssp

  std::unique_ptr<Model> model_;
  std::unique_ptr<ParamStore> store_;
  // The batch loaded ahead (ReadRowsAhead) for step `step`; -1: none.
  struct NextBatch {
    int64_t step = -1, examples = 0, epoch = 0;
  } next_;
  DataPlan plan_;
  std::unique_ptr<std::FILE, FileCloser> metrics_file_;
  Clock::time_point start_;
  Lap lap_{Clock::now()};
  TrainReport report_;

  int64_t t0_ = 0;  // the step this worker began at (> 0: --resume)

  std::optional<PendingCheckpoint> ckpt_;  // worker 0's checkpoint in flight (--checkpoint-every)
  // Worker 0: the servers' last read ahead of a move's checkpoint (ReadAheadFor), in flight until
  // WaitReadAhead.
  struct ReadAhead {
    int64_t move_step = 0;  // the --move-slots step it is for
    int64_t from = 0;       // the checkpoint read
    Handle handle;
    bool waited = false, read = false;  // read: the servers said they had
  };
  std::optional<ReadAhead> ahead_;
  bool no_read_ahead_ = false;  // worker 0 is in MoveSlots or FinalCheckpoint
  int64_t at_step_ = 0;         // worker 0: the step of its last MaybeCheckpoint
  std::vector<int64_t> ckpt_failed_in_row_;  // the steps of the checkpoints that failed since the last saved
  Status ckpt_stop_;  // set once --max-checkpoint-failures in a row failed: the job stops with it
  int64_t ckpt_last_ = -1;  // the last step checkpointed (or resumed from); -1: none yet
  Clock::time_point ckpt_last_time_;  // when it was asked for (or training began)

  std::vector<int64_t> order_;  // this epoch's example order
  int64_t order_epoch_ = -1;
  std::optional<Clock::time_point> joined_;  // --join: when this worker took its first step
  TableSpec pace_table_;     // --join: what a worker waiting to join pulls each step (WaitToJoin)
  std::vector<float> pace_;  // ... into here
  // Who takes part in which step, beyond the start: every worker's changes of presence in step
  // order, what TakesPart reads. --join and --leave (from the start, first at a step), then as
  // they come the leaves and joins asked while the job ran (1.26, 1.27: TakeAskedLeave,
  // TakeAskedRejoin) and those the servers said at a resumed worker's handshake (FollowServers).
  std::vector<Change> timeline_;
  bool rejoined_ = false;  // --rejoin: this process joined the job again, at t0_
  // --leave: the epoch orders of the workers that left, by rank (with the epoch each is of).
  std::map<int, std::pair<int64_t, std::vector<int64_t>>> left_orders_;
  // The logging window: the steps since the last progress line.
  double window_loss_ = 0;
  int64_t window_correct_ = 0, window_examples_ = 0;
  Clock::time_point window_start_;
};

}  // namespace

Status CheckSettings(const TrainerOptions& options) {
  FERRY_RETURN_IF_ERROR(options.Validate());
  std::vector<TableSpec> specs = PlannedTables(options);
  FERRY_RETURN_IF_ERROR(ApplyTableOverrides(options, &specs));
  return options.local ? Status::Ok() : CheckPipelineFits(options.pipeline, specs);
}

StatusOr<std::unique_ptr<TrainingRun>> PrepareTraining(const TrainerOptions& options, Device* device, Client* client,
                                                       const Datasets& data, const TrainHooks& hooks, std::FILE* out) {
  FERRY_RETURN_IF_ERROR(CheckSettings(options));
  if (device == nullptr) return InvalidArgumentError("RunTraining: null device");
  if (options.local != (client == nullptr)) {
    return InvalidArgumentError("RunTraining: a client is required without --local and refused with it");
  }
  auto run = std::make_unique<WorkerRun>(options, device, client, data, hooks, out);
  FERRY_RETURN_IF_ERROR(run->Prepare());
  return std::unique_ptr<TrainingRun>(std::move(run));
}

StatusOr<TrainReport> RunTraining(const TrainerOptions& options, Device* device, Client* client,
                                  const Datasets& data, const TrainHooks& hooks, std::FILE* out) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<TrainingRun> run, PrepareTraining(options, device, client, data, hooks, out));
  return run->Run();
}

bool IsSettingsRefusal(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kAborted:
    case StatusCode::kCancelled:
    case StatusCode::kInternal:
    case StatusCode::kUnknown:
    case StatusCode::kDataLoss:
      return false;
    default:
      return true;
  }
}

}  // namespace ferry::trainer
