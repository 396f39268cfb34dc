#include "trainer/trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <memory>
#include <string>

#include "ferry/data/metrics.h"
#include "ferry/data/shard.h"
#include "ps/internal/init.h"
#include "ps/internal/optimizer.h"
#include "trainer/trainer/mlp.h"

namespace ferry::trainer {
namespace {

constexpr int64_t kEvalBatch = 512;

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct FileCloser {
  void operator()(std::FILE* f) const { if (f != nullptr) std::fclose(f); }
};

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
};

// Evaluates the model's current host parameters on the first `limit` (0 = all) test examples.
StatusOr<EvalResult> Evaluate(Mlp& model, const data::ImageDataset& test, int64_t limit) {
  FERRY_RETURN_IF_ERROR(model.UploadParams());
  const int64_t n = limit > 0 ? std::min(limit, test.count) : test.count;
  data::ClassificationMetrics metrics(test.num_classes);
  std::vector<float> logits;
  const int64_t px = test.pixels_per_image();
  for (int64_t first = 0; first < n; first += kEvalBatch) {
    const int64_t rows = std::min(kEvalBatch, n - first);
    FERRY_RETURN_IF_ERROR(model.Predict(test.images.data() + first * px, rows, &logits));
    FERRY_RETURN_IF_ERROR(metrics.Add(logits, std::span<const int32_t>(test.labels.data() + first, static_cast<size_t>(rows))));
  }
  return EvalResult{metrics.mean_cross_entropy(), metrics.accuracy(), metrics.count()};
}

}  // namespace

StatusOr<TrainReport> RunTraining(const TrainerOptions& options, Device* device, Client* client,
                                  const Datasets& data, const TrainHooks& hooks, std::FILE* out) {
  FERRY_RETURN_IF_ERROR(options.Validate());
  if (device == nullptr) return InvalidArgumentError("RunTraining: null device");
  if (data.train == nullptr || data.train->count == 0) return InvalidArgumentError("RunTraining: no training data");
  if (options.local != (client == nullptr)) {
    return InvalidArgumentError("RunTraining: a client is required without --local and refused with it");
  }
  const int num_workers = options.local ? 1 : options.num_workers;
  const int rank = options.local ? 0 : options.rank;
  if (client != nullptr && (client->rank() != rank || client->num_workers() != num_workers)) {
    return InvalidArgumentError("RunTraining: the client's rank/num_workers differ from the options'");
  }
  const data::ImageDataset& train = *data.train;
  const int64_t n = options.train_limit > 0 ? std::min(options.train_limit, train.count) : train.count;
  const int64_t batch = options.batch;
  const int64_t steps_per_epoch = data::ShardSize(n, {num_workers - 1, num_workers}) / batch;
  if (steps_per_epoch == 0) {
    return InvalidArgumentError("--batch " + std::to_string(batch) + " is larger than a worker's shard (" +
                                std::to_string(data::ShardSize(n, {num_workers - 1, num_workers})) + " examples)");
  }
  const int64_t total_steps = options.steps > 0 ? options.steps : options.epochs * steps_per_epoch;

  MlpConfig config;
  config.input = train.pixels_per_image();
  config.hidden = options.hidden;
  config.classes = train.num_classes;
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Mlp> model, Mlp::Create(device, config, std::max(batch, kEvalBatch)));
  const std::vector<TableSpec> specs =
      model->TableSpecs(options.optimizer, options.consistency, options.staleness, options.seed);

  // Parameters: declared on the servers, or initialised here with the servers' init code.
  std::vector<std::vector<float>> opt_state;  // --local: per tensor, StateSlots * size floats
  std::vector<DenseOut> pulls;
  std::vector<DenseIn> pushes;
  for (int i = 0; i < model->num_tensors(); ++i) {
    const TableSpec& spec = specs[static_cast<size_t>(i)];
    if (options.local) {
      FERRY_RETURN_IF_ERROR(spec.Validate());
      std::span<float> p = model->host_param(i);
      ps::InitDense(spec, TableId(spec.name), 0, p.data(), static_cast<int64_t>(p.size()));
      std::vector<float> state(static_cast<size_t>(ps::StateSlots(spec.optimizer.type)) * p.size());
      ps::InitState(spec.optimizer, state.data(), p.size());  // n: parameters (all slots filled)
      opt_state.push_back(std::move(state));
    } else {
      FERRY_RETURN_IF_ERROR(client->Declare(spec).WithContext("declaring " + spec.name));
    }
    pulls.push_back(DenseOut{spec.name, model->host_param(i)});
    pushes.push_back(DenseIn{spec.name, model->host_grad(i)});
  }
  // The DenseOut/DenseIn names point into `specs`, which lives to the end of this function.

  std::unique_ptr<std::FILE, FileCloser> metrics_file;
  if (!options.metrics_out.empty()) {
    metrics_file.reset(std::fopen(options.metrics_out.c_str(), "w"));
    if (!metrics_file) return NotFoundError("--metrics-out: cannot open '" + options.metrics_out + "' for writing");
  }
  auto write_json = [&](int64_t step, const char* split, double loss, double acc, double eps, double wall) {
    if (!metrics_file) return;
    std::fprintf(metrics_file.get(),
                 "{\"step\": %" PRId64 ", \"split\": \"%s\", \"loss\": %.6f, \"accuracy\": %.6f, "
                 "\"examples_per_sec\": %.1f, \"wall_s\": %.3f}\n",
                 step, split, loss, acc, eps, wall);
    std::fflush(metrics_file.get());
  };

  TrainReport report;
  report.steps = total_steps;
  const Clock::time_point start = Clock::now();
  auto evaluate_now = [&](int64_t step) -> Status {
    if (rank != 0 || data.test == nullptr || data.test->count == 0) return Status::Ok();
    FERRY_ASSIGN_OR_RETURN(EvalResult r, Evaluate(*model, *data.test, options.test_limit));
    const double wall = Seconds(start, Clock::now());
    const double eps = wall > 0 ? static_cast<double>(report.examples) / wall : 0.0;
    if (out != nullptr) {
      std::fprintf(out, "[worker %d] eval  step %" PRId64 ": test loss %.4f  accuracy %.4f  (%" PRId64 " examples)\n",
                   rank, step, r.loss, r.accuracy, r.count);
      std::fflush(out);
    }
    write_json(step, "test", r.loss, r.accuracy, eps, wall);
    report.eval_loss = r.loss;
    report.eval_accuracy = r.accuracy;
    return Status::Ok();
  };
  auto pull = [&](int64_t step) -> Status {
    if (options.local) return Status::Ok();
    return client->PullDense(pulls, step).wait().WithContext("pull at step " + std::to_string(step));
  };

  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  std::vector<float> xs;
  std::vector<int32_t> ys;
  double window_loss = 0;
  int64_t window_correct = 0, window_examples = 0, window_steps = 0;
  Clock::time_point window_start = start;

  for (int64_t t = 0; t < total_steps; ++t) {
    const int64_t epoch = t / steps_per_epoch;
    if (epoch != order_epoch) {
      FERRY_ASSIGN_OR_RETURN(order, data::EpochIndices(n, {rank, num_workers}, epoch,
                                                       {options.shuffle, options.seed}));
      order_epoch = epoch;
    }
    const int64_t first = (t % steps_per_epoch) * batch;
    FERRY_RETURN_IF_ERROR(train.Gather(std::span<const int64_t>(order).subspan(static_cast<size_t>(first), static_cast<size_t>(batch)), &xs, &ys));

    FERRY_RETURN_IF_ERROR(pull(t));
    if (hooks.on_params) hooks.on_params(t, model->host_params());
    if (options.eval_every > 0 && t > 0 && t % options.eval_every == 0) FERRY_RETURN_IF_ERROR(evaluate_now(t));
    FERRY_RETURN_IF_ERROR(model->UploadParams());
    float loss = 0;
    int64_t correct = 0;
    FERRY_RETURN_IF_ERROR(model->TrainStep(xs.data(), ys.data(), batch, &loss, &correct));
    if (options.local) {
      for (int i = 0; i < model->num_tensors(); ++i) {
        std::span<float> p = model->host_param(i);
        ps::ApplyUpdate(options.optimizer, p.data(), model->host_grad(i).data(), opt_state[static_cast<size_t>(i)].data(),
                        p.size(), p.size(), t + 1);
      }
    } else {
      FERRY_RETURN_IF_ERROR(client->PushDense(pushes, t).wait().WithContext("push at step " + std::to_string(t)));
      if (options.consistency == Consistency::kSsp) FERRY_RETURN_IF_ERROR(client->AdvanceClock(t + 1));
    }

    if (t == 0) report.first_loss = loss;
    report.examples += batch;
    window_loss += loss;
    window_correct += correct;
    window_examples += batch;
    ++window_steps;
    const bool last = t + 1 == total_steps;
    if ((options.log_every > 0 && (t + 1) % options.log_every == 0) || last) {
      const Clock::time_point now = Clock::now();
      const double dt = Seconds(window_start, now);
      const double eps = dt > 0 ? static_cast<double>(window_examples) / dt : 0.0;
      const double mean_loss = window_loss / static_cast<double>(window_steps);
      const double acc = static_cast<double>(window_correct) / static_cast<double>(window_examples);
      report.last_loss = mean_loss;
      if (out != nullptr && !options.quiet) {
        std::fprintf(out, "[worker %d] step %" PRId64 "/%" PRId64 " epoch %" PRId64 ": loss %.4f  accuracy %.4f  %.0f examples/s  %.1f s\n",
                     rank, t + 1, total_steps, epoch, mean_loss, acc, eps, Seconds(start, now));
        std::fflush(out);
      }
      write_json(t + 1, "train", mean_loss, acc, eps, Seconds(start, now));
      window_loss = 0;
      window_correct = window_examples = window_steps = 0;
      window_start = now;
    }
  }

  FERRY_RETURN_IF_ERROR(pull(total_steps));
  if (hooks.on_params) hooks.on_params(total_steps, model->host_params());
  report.final_params.assign(model->host_params().begin(), model->host_params().end());
  report.wall_s = Seconds(start, Clock::now());
  report.examples_per_sec = report.wall_s > 0 ? static_cast<double>(report.examples) / report.wall_s : 0.0;
  FERRY_RETURN_IF_ERROR(evaluate_now(total_steps));
  return report;
}

}  // namespace ferry::trainer
