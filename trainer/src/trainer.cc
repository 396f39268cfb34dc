#include "ferry/trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cinttypes>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "ferry/data/shard.h"
#include "ferry/kernels.h"
#include "ferry/trainer/param_store.h"

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

std::string ConsistencyName(const TrainerOptions& o) {
  if (o.consistency == Consistency::kSsp) return "ssp:" + std::to_string(o.staleness);
  return o.consistency == Consistency::kSync ? "sync" : "async";
}

// "{rank}" in the path becomes the rank.
std::string MetricsPath(std::string path, int rank) {
  for (size_t at; (at = path.find("{rank}")) != std::string::npos;) path.replace(at, 6, std::to_string(rank));
  return path;
}

// A JSON number: finite values as %.6g-style text, anything else as null.
std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

std::string TimesJson(const StepTimes& t) {
  return "{\"pull_s\": " + Num(t.pull_s) + ", \"compute_s\": " + Num(t.compute_s) + ", \"push_s\": " + Num(t.push_s) +
         ", \"wait_s\": " + Num(t.wait_s) + ", \"eval_s\": " + Num(t.eval_s) + "}";
}

std::string EvalJson(const EvalSummary& e, bool binary) {
  std::string s = "\"count\": " + std::to_string(e.count) + ", \"loss\": " + Num(e.loss) + ", \"accuracy\": " + Num(e.accuracy);
  if (binary) s += ", \"auc\": " + (e.auc >= 0 ? Num(e.auc) : std::string("null")) + ", \"log_loss\": " + Num(e.loss);
  return s;
}

StatusOr<std::unique_ptr<Model>> CreateModel(const TrainerOptions& o, Device* device, const Datasets& data) {
  if (o.model == "ctr") {
    if (data.ctr == nullptr) return InvalidArgumentError("RunTraining: --model ctr needs ctr data");
    return CreateCtrModel(device, o, data.ctr);
  }
  if (data.train == nullptr || data.train->count == 0) return InvalidArgumentError("RunTraining: no training data");
  return CreateClassifier(device, o, data.train, data.test);
}

}  // namespace

StatusOr<TrainReport> RunTraining(const TrainerOptions& options, Device* device, Client* client,
                                  const Datasets& data, const TrainHooks& hooks, std::FILE* out) {
  FERRY_RETURN_IF_ERROR(options.Validate());
  if (device == nullptr) return InvalidArgumentError("RunTraining: null device");
  if (options.local != (client == nullptr)) {
    return InvalidArgumentError("RunTraining: a client is required without --local and refused with it");
  }
  const int num_workers = options.local ? 1 : options.num_workers;
  const int rank = options.local ? 0 : options.rank;
  if (client != nullptr && (client->rank() != rank || client->num_workers() != num_workers)) {
    return InvalidArgumentError("RunTraining: the client's rank/num_workers differ from the options'");
  }
  // The GEMM thread count (OpenBLAS's process-wide pool) when one is asked for; it is recorded
  // either way, since results repeat bitwise only for one count.
  if (options.blas_threads > 0) kernels::cpu::SetGemmThreads(options.blas_threads);
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, CreateModel(options, device, data));
  std::unique_ptr<ParamStore> store =
      options.local ? CreateLocalStore() : CreateServerStore(client, options.consistency);
  FERRY_RETURN_IF_ERROR(store->Declare(model->TableSpecs()));

  // The data plan: which examples, how many steps.
  const bool own_shard = data.ctr != nullptr && options.model == "ctr" && data.ctr->train_is_shard;
  const data::ShardSpec shard = own_shard ? data::ShardSpec{} : data::ShardSpec{rank, num_workers};
  const int64_t n = options.train_limit > 0 ? std::min(options.train_limit, model->train_size()) : model->train_size();
  const int64_t step_examples = options.batch * options.accumulate;
  // Every worker runs ceil(smallest shard / kB) steps an epoch, so all run the same number; the
  // epoch's last step takes what is left of the worker's own shard (shards differ by at most one
  // example, so that is 1 .. kB + 1 examples): every example is used once per epoch.
  const int64_t smallest_shard = own_shard ? n : data::ShardSize(n, {num_workers - 1, num_workers});
  if (smallest_shard == 0) {
    return InvalidArgumentError(std::to_string(n) + " training examples leave worker " + std::to_string(num_workers - 1) +
                                " of " + std::to_string(num_workers) + " with none");
  }
  const int64_t steps_per_epoch = (smallest_shard + step_examples - 1) / step_examples;
  const int64_t total_steps = options.steps > 0 ? options.steps : options.epochs * steps_per_epoch;
  const int64_t test_n = options.test_limit > 0 ? std::min(options.test_limit, model->test_size()) : model->test_size();
  // Sync workers without backup workers are in step: they split the test set and merge.
  // Otherwise (async, ssp, or backup workers, whose point is that the job does not wait for the
  // slowest) a collective would hold the fast workers back: worker 0 does it all.
  const bool merged_eval = client != nullptr && options.consistency == Consistency::kSync && num_workers > 1 &&
                           options.backup_workers == 0;

  std::unique_ptr<std::FILE, FileCloser> metrics_file;
  if (!options.metrics_out.empty()) {
    const std::string path = MetricsPath(options.metrics_out, rank);
    metrics_file.reset(std::fopen(path.c_str(), "w"));
    if (!metrics_file) return NotFoundError("--metrics-out: cannot open '" + path + "' for writing");
  }
  const Clock::time_point start = Clock::now();
  auto wall = [&] { return Seconds(start, Clock::now()); };
  auto json = [&](const std::string& event, const std::string& fields) {
    if (!metrics_file) return;
    std::fprintf(metrics_file.get(), "{\"event\": \"%s\", \"rank\": %d, \"wall_s\": %s, %s}\n", event.c_str(), rank,
                 Num(wall()).c_str(), fields.c_str());
    std::fflush(metrics_file.get());
  };
  auto bytes_json = [&] {
    const ClientStats st = client != nullptr ? client->stats() : ClientStats{};
    return "\"bytes_sent\": " + std::to_string(st.bytes_sent) + ", \"bytes_received\": " + std::to_string(st.bytes_received);
  };
  {
    std::string f = "\"num_workers\": " + std::to_string(num_workers) + ", \"model\": \"" + options.model +
                    "\", \"consistency\": \"" + ConsistencyName(options) + "\", \"backup_workers\": " +
                    std::to_string(options.backup_workers) + ", \"device\": \"" + device->name() +
                    "\", \"batch\": " + std::to_string(options.batch) + ", \"accumulate\": " +
                    std::to_string(options.accumulate) + ", \"blas_threads\": " +
                    std::to_string(kernels::cpu::GemmThreads()) + ", \"train_examples\": " + std::to_string(n) +
                    ", \"steps\": " + std::to_string(total_steps);
    if (data.ctr != nullptr && data.ctr->planted_auc >= 0) {
      f += ", \"planted_auc\": " + Num(data.ctr->planted_auc) + ", \"planted_log_loss\": " + Num(data.ctr->planted_log_loss);
    }
    json("start", f);
  }

  TrainReport report;
  StepTimes& times = report.times;
  Lap lap(start);
  auto pull_wait = [&] { return store->progress().pull_wait_s; };

  // Evaluation with the parameters of `step`. The wait in its pulls and its collective go to
  // wait_s, the rest to eval_s.
  auto evaluate_now = [&](int64_t step) -> Status {
    if (test_n == 0 || (!merged_eval && rank != 0)) return Status::Ok();
    std::vector<double> state;
    const int64_t first = merged_eval ? test_n * rank / num_workers : 0;
    const int64_t last = merged_eval ? test_n * (rank + 1) / num_workers : test_n;
    const double waited_before = pull_wait();
    FERRY_RETURN_IF_ERROR(model->Evaluate(*store, step, first, last - first, &state).WithContext("evaluating at step " + std::to_string(step)));
    lap.Split(&times.eval_s, &times.wait_s, pull_wait() - waited_before);
    if (merged_eval) {
      // Every worker's state has the same length; a shard with no example adds zeros.
      FERRY_ASSIGN_OR_RETURN(state, client->AllReduceSum(state));
      lap.To(&times.wait_s);
    }
    if (rank != 0) return Status::Ok();
    FERRY_ASSIGN_OR_RETURN(EvalSummary e, model->Summarize(state));
    report.eval = e;
    if (out != nullptr) {
      if (model->is_binary()) {
        std::fprintf(out, "[worker %d] eval  step %" PRId64 ": test AUC %.4f  log-loss %.4f  accuracy %.4f  (%" PRId64 " examples)\n",
                     rank, step, e.auc, e.loss, e.accuracy, e.count);
      } else {
        std::fprintf(out, "[worker %d] eval  step %" PRId64 ": test loss %.4f  accuracy %.4f  (%" PRId64 " examples)\n",
                     rank, step, e.loss, e.accuracy, e.count);
      }
      std::fflush(out);
    }
    lap.To(&times.eval_s);
    json("eval", "\"step\": " + std::to_string(step) + ", \"examples\": " + std::to_string(report.examples) + ", " +
                     EvalJson(e, model->is_binary()) + ", \"merged\": " + (merged_eval ? "true" : "false") +
                     ", \"time\": " + TimesJson(times));
    return Status::Ok();
  };

  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  double window_loss = 0;
  int64_t window_correct = 0, window_examples = 0;
  Clock::time_point window_start = start;
  const bool straggler = rank == options.straggler_rank && !options.local;
  const bool sync_servers = client != nullptr && options.consistency == Consistency::kSync;

  // Evaluations fall on the job's steps: every eval_every (or steps_per_epoch) of them. The job's
  // step is this worker's t, except in sync mode with backup workers, where a worker that fell
  // behind moves to the global step: job_t is then the step after the one it last pushed for.
  const int64_t eval_period = options.eval_every > 0 ? options.eval_every : options.eval_each_epoch ? steps_per_epoch : 0;
  int64_t job_t = 0, last_eval = 0;

  for (int64_t t = 0; t < total_steps; ++t) {
    const int64_t epoch = t / steps_per_epoch;
    const int64_t step_in_epoch = t % steps_per_epoch;
    if (t > 0) {
      const StoreProgress p = store->progress();
      job_t = sync_servers ? p.step - p.first_served + 1 : t;
    }
    if (eval_period > 0 && job_t < total_steps && job_t / eval_period > last_eval / eval_period) {
      FERRY_RETURN_IF_ERROR(evaluate_now(job_t));
      last_eval = job_t;
    }
    if (epoch != order_epoch) {
      FERRY_ASSIGN_OR_RETURN(order, data::EpochIndices(n, shard, epoch, {options.shuffle, options.seed}));
      order_epoch = epoch;
    }
    const int64_t first = step_in_epoch * step_examples;
    const int64_t examples =
        step_in_epoch + 1 == steps_per_epoch ? static_cast<int64_t>(order.size()) - first : step_examples;
    FERRY_RETURN_IF_ERROR(model->LoadTrainBatch(
        std::span<const int64_t>(order).subspan(static_cast<size_t>(first), static_cast<size_t>(examples))));
    lap.To(&times.compute_s);
    const double waited_before = pull_wait();
    FERRY_RETURN_IF_ERROR(model->Pull(*store, t));
    lap.Split(&times.pull_s, &times.wait_s, pull_wait() - waited_before);
    // The workers meet after their first pull, before any gradient is pushed: every one of them
    // has connected (so none is still counted as finished by an earlier job on the same servers),
    // and every first pull was served at the same global step, the job's first (a fast worker
    // cannot have moved the job on before a slow one's first pull: with backup workers it
    // otherwise could, and the slow one would count its budget from a later step).
    if (t == 0 && client != nullptr) {
      FERRY_RETURN_IF_ERROR(client->Barrier().WithContext("waiting for every worker to connect"));
      lap.To(&times.wait_s);
    }
    if (t == 0 && sync_servers && store->progress().first_served > 0 && out != nullptr) {
      std::fprintf(out, "[worker %d] the servers are already at global step %" PRId64
                        " (an earlier job on them, or this worker restarted): joining at that step\n",
                   rank, store->progress().first_served);
      std::fflush(out);
    }
    // Sync: the budget is the job's, in global steps. A worker that fell behind (a backup worker
    // late in some steps) stops once the others have taken the job to its last step, rather than
    // running the rest of its own steps alone after them. Without backup workers every worker is
    // at global step t here, so this ends none early.
    if (sync_servers) {
      const StoreProgress p = store->progress();
      if (p.step - p.first_served >= total_steps) {
        if (out != nullptr) {
          std::fprintf(out, "[worker %d] the job reached its %" PRId64 " steps (global step %" PRId64
                            ") after %" PRId64 " of this worker's: stopping\n",
                       rank, total_steps, p.step, t);
          std::fflush(out);
        }
        break;
      }
    }
    report.steps = t + 1;
    if (hooks.on_params) hooks.on_params(t, model->dense_params());
    double loss_sum = 0;
    int64_t correct = 0;
    {
      const Clock::time_point c0 = Clock::now();
      // Micro-batches of --batch (the epoch's last step may end with a smaller one, or hold one
      // more): each weighted by its share of the step's examples, so the step's gradient is that
      // of the mean loss over all of them (1/k each for a full step).
      for (int64_t m = 0; m * options.batch < examples; ++m) {
        const int64_t rows = std::min(options.batch, examples - m * options.batch);
        const float scale = static_cast<float>(rows) / static_cast<float>(examples);
        FERRY_RETURN_IF_ERROR(model->ComputeGradients(m * options.batch, rows, scale, m > 0, &loss_sum, &correct));
      }
      if (straggler) {
        const double busy = Seconds(c0, Clock::now());
        const double delay = options.straggler_delay_ms / 1e3 + (options.straggler_factor - 1) * busy;
        if (delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      }
    }
    lap.To(&times.compute_s);
    FERRY_RETURN_IF_ERROR(model->Push(*store, t));
    FERRY_RETURN_IF_ERROR(store->EndStep(t));  // ssp: sends the clock without waiting
    lap.To(&times.push_s);

    const double step_loss = loss_sum / static_cast<double>(examples);
    if (t == 0) report.first_loss = step_loss;
    report.examples += examples;
    window_loss += loss_sum;
    window_correct += correct;
    window_examples += examples;
    const bool last = t + 1 == total_steps;
    if ((options.log_every > 0 && (t + 1) % options.log_every == 0) || last) {
      const Clock::time_point now = Clock::now();
      const double dt = Seconds(window_start, now);
      const double eps = dt > 0 ? static_cast<double>(window_examples) / dt : 0.0;
      const double mean_loss = window_loss / static_cast<double>(window_examples);
      const double acc = static_cast<double>(window_correct) / static_cast<double>(window_examples);
      report.last_loss = mean_loss;
      // Epochs are counted from 1, as users count them.
      if (out != nullptr && !options.quiet) {
        std::fprintf(out, "[worker %d] step %" PRId64 "/%" PRId64 " epoch %" PRId64 "/%" PRId64 ": loss %.4f  accuracy %.4f  %.0f examples/s  %.1f s\n",
                     rank, t + 1, total_steps, epoch + 1, (total_steps + steps_per_epoch - 1) / steps_per_epoch,
                     mean_loss, acc, eps, Seconds(start, now));
        std::fflush(out);
      }
      lap.To(&times.compute_s);  // the worker's own bookkeeping counts as its compute
      json("train", "\"step\": " + std::to_string(t + 1) + ", \"epoch\": " + std::to_string(epoch + 1) +
                        ", \"examples\": " + std::to_string(report.examples) + ", \"loss\": " + Num(mean_loss) +
                        ", \"accuracy\": " + Num(acc) + ", \"examples_per_sec\": " + Num(eps) + ", \"time\": " +
                        TimesJson(times) + ", " + bytes_json());
      window_loss = 0;
      window_correct = window_examples = 0;
      window_start = now;
    }
  }

  // This worker's training ends here: train_s is its time so far less evaluation.
  lap.To(&times.compute_s);
  report.wall_s = wall();
  report.examples_per_sec = report.wall_s > 0 ? static_cast<double>(report.examples) / report.wall_s : 0.0;
  const double train_s = report.wall_s - times.eval_s;
  const StoreProgress progress = store->progress();
  if (sync_servers && total_steps > 0 && progress.pushes_used == 0) {
    const std::string what = "worker " + std::to_string(rank) + ": none of its " +
                             std::to_string(progress.pushes_dropped) +
                             " gradients was used: each came after the servers had closed its step (global step now " +
                             std::to_string(progress.step) + ")";
    // Never "succeed" having trained nothing. With backup workers that is a backup's role (the
    // first M - K gradients make each step), so it is reported, not an error.
    if (options.backup_workers == 0) return FailedPreconditionError(what);
    if (out != nullptr) {
      std::fprintf(out, "[worker %d] warning: %s; it was a backup worker in every step\n", rank, what.c_str());
      std::fflush(out);
    }
  }

  // The final model holds every worker's updates. The worker tells the servers it has finished
  // (sync steps stop waiting for it), then the workers meet at a barrier (a fast worker's wait
  // for the others is final_wait_s, a part of wait_s), then pull and evaluate.
  double final_wait_s = 0;
  if (client != nullptr) {
    FERRY_RETURN_IF_ERROR(client->Finish().WithContext("telling the servers this worker has finished"));
    FERRY_RETURN_IF_ERROR(client->Barrier().WithContext("waiting for the other workers to finish"));
    final_wait_s = lap.To(&times.wait_s);
  }
  {
    const double waited_before = pull_wait();
    FERRY_RETURN_IF_ERROR(model->Pull(*store, total_steps));
    lap.Split(&times.pull_s, &times.wait_s, pull_wait() - waited_before);
  }
  if (hooks.on_params) hooks.on_params(total_steps, model->dense_params());
  const std::span<const float> final_params = model->dense_params();
  report.final_params.assign(final_params.begin(), final_params.end());
  FERRY_RETURN_IF_ERROR(evaluate_now(total_steps));

  // Worker 0 reports the servers' staleness histogram (every worker is done: they met above).
  std::map<int64_t, int64_t> staleness;
  if (client != nullptr && rank == 0) {
    constexpr std::string_view kPrefix = "staleness_";
    for (int s = 0; s < client->num_servers(); ++s) {
      FERRY_ASSIGN_OR_RETURN(auto counters, client->ServerCounters(s));
      for (const auto& [name, value] : counters) {
        if (name.rfind(kPrefix, 0) == 0 && value > 0) staleness[std::stoll(name.substr(kPrefix.size()))] += value;
      }
    }
  }
  lap.To(&times.pull_s);  // reading the servers' counters
  std::string end = "\"steps\": " + std::to_string(report.steps) + ", \"examples\": " + std::to_string(report.examples) +
                    ", \"examples_per_sec\": " + Num(report.examples_per_sec) + ", \"train_s\": " + Num(train_s) +
                    ", \"final_wait_s\": " + Num(final_wait_s) + ", \"global_step\": " + std::to_string(progress.step) +
                    ", \"pushes_used\": " + std::to_string(progress.pushes_used) +
                    ", \"pushes_dropped\": " + std::to_string(progress.pushes_dropped) + ", \"time\": " +
                    TimesJson(times) + ", " + bytes_json();
  if (rank == 0) {
    std::string hist;
    for (const auto& [k, v] : staleness) hist += (hist.empty() ? "" : ", ") + ("\"" + std::to_string(k) + "\": " + std::to_string(v));
    end += ", \"staleness\": {" + hist + "}";
    if (report.eval.count > 0) end += ", \"final\": {" + EvalJson(report.eval, model->is_binary()) + "}";
  }
  json("end", end);
  report.progress = progress;
  return report;
}

}  // namespace ferry::trainer
