// ferry-trainer: one worker of a Ferry training job (or, with --local, the whole job in one
// process without servers — the reference). See `ferry-trainer --help` and trainer.h.
//
//   ferry-trainer --servers tcp://127.0.0.1:7470,tcp://127.0.0.1:7471 --rank 0 --num-workers 2
//                 --hidden 256,128 --optimizer adam --lr 0.001 --batch 64 --epochs 1
//   ferry-trainer --local --batch 128 --steps 500
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "ferry/messages/transport.h"
#include "ferry/client.h"
#include "ferry/trainer/device.h"
#include "ferry/trainer/model_registry.h"
#include "ferry/trainer/options.h"
#include "ferry/trainer/trainer.h"
#include "ferry/metrics/worker.h"

namespace {

// Exit statuses: 2 when the user's settings are refused, or a gradient (NaN or Inf: a diverged
// model) is, or the job stops after --max-checkpoint-failures (a restart would fail the same way:
// the launcher never restarts it), 1 for other failures.
constexpr int kExitFailure = 1, kExitUsage = 2;

int Fail(const char* what, const ferry::Status& s) {
  std::fprintf(stderr, "ferry-trainer: %s: %s\n", what, s.ToString().c_str());
  return ferry::trainer::IsSettingsRefusal(s) ? kExitUsage : kExitFailure;
}

}  // namespace

namespace {
// SIGUSR1 asks worker 0 for a checkpoint at its next step.
std::atomic<bool> checkpoint_signal{false};
extern "C" void OnCheckpointSignal(int) { checkpoint_signal.store(true); }
}  // namespace

int main(int argc, char** argv) {
  using namespace ferry;
  auto parsed = trainer::ParseTrainerFlags(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "ferry-trainer: %s\n%s", parsed.status().message().c_str(), trainer::TrainerUsage().c_str());
    return kExitUsage;
  }
  const trainer::TrainerOptions& options = *parsed;
  transport::TuneAllocatorForLargeMessages();
  if (options.help) {
    std::printf("%s", trainer::TrainerUsage().c_str());
    return 0;
  }
  // The settings are checked before the data is loaded (a million synthetic examples take a while).
  if (Status s = trainer::CheckSettings(options); !s.ok()) {
    std::fprintf(stderr, "ferry-trainer: %s\n", s.message().c_str());
    return kExitUsage;
  }

  std::string choice;
  auto device = trainer::CreateDevice(options.device, options.gpu, &choice);
  if (!device.ok()) return Fail("device", device.status());
  std::printf("%s\n", choice.c_str());
  if (!options.cluster_source.empty()) {
    std::printf("cluster: from %s: worker %d of %d, %zu server(s)\n", options.cluster_source.c_str(), options.rank,
                options.num_workers, options.servers.size());
  }

  // The model's data (its row of the registry: ferry/trainer/model_registry.h).
  auto data = trainer::FindModel(options.model)->load_data(options);
  if (!data.ok()) return Fail("data", data.status());
  for (const std::string& line : data->lines) std::printf("%s\n", line.c_str());
  const trainer::Datasets ds = data->view();

  std::unique_ptr<Client> client;
  if (!options.local) {
    ClientOptions co;
    co.servers = options.servers;
    co.rank = options.rank;
    co.num_workers = options.num_workers;
    co.incarnation = options.incarnation;
    co.resumes = options.resume;  // it starts at worker_step() (async, ssp) or the job's step (sync)
    co.joins_at = options.JoinStep(options.rank);  // --join: no server waits for it before then
    co.waits_to_rejoin = options.rejoin;  // --rejoin: nor for this process until its join is handed
    if (options.rejoin) co.joins_at = 0;  // (server 0 says the step)
    co.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(options.connect_timeout_s * 1000));
    // No wait is silent: a step held for a missing worker, a server that does not answer.
    const int rank = options.rank;
    co.on_long_wait = [rank](const std::string& line) {
      std::fprintf(stderr, "ferry-trainer: worker %d %s\n", rank, line.c_str());
    };
    if (!options.curve_keys.empty()) {
      auto keys = curve::LoadClientKeys(options.curve_keys, options.rank);
      if (!keys.ok()) return Fail("--curve-keys", keys.status());
      co.curve = std::move(*keys);
    }
    auto c = Client::Connect(co);
    if (!c.ok()) {
      std::fprintf(stderr, "ferry-trainer: connect: %s\n", c.status().ToString().c_str());
      return kExitFailure;  // the servers may not be up yet
    }
    client = std::move(*c);
  }

  trainer::TrainHooks hooks;
  std::unique_ptr<metrics::WorkerEndpoint> metrics;
  if (!options.metrics_bind.empty()) {
    auto m = metrics::WorkerEndpoint::Start(options.metrics_bind, options.rank);
    if (!m.ok()) return Fail("--metrics", m.status());
    metrics = std::move(*m);
    std::printf("ferry-trainer rank %d: metrics at %s\n", options.rank, metrics->url().c_str());
    std::fflush(stdout);
    hooks.on_step = [m = metrics.get()](const trainer::StepDone& s) {
      m->Update({.step = s.step, .examples = s.examples, .loss = s.loss, .pull_s = s.times.pull_s,
                 .push_s = s.times.push_s, .compute_s = s.times.compute_s, .wait_s = s.times.wait_s,
                 .eval_s = s.times.eval_s, .bytes_sent = s.bytes_sent, .bytes_received = s.bytes_received});
    };
  }
  if (!options.local && options.rank == 0) {
    static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");
    std::signal(SIGUSR1, OnCheckpointSignal);
    hooks.checkpoint_requested = [] { return checkpoint_signal.exchange(false); };
  }
  auto run = trainer::PrepareTraining(options, device->get(), client.get(), ds, hooks, stdout);
  if (!run.ok()) return Fail("preparing the run", run.status());
  auto report = (*run)->Run();
  if (!report.ok()) {
    std::fprintf(stderr, "ferry-trainer: training: %s\n", report.status().ToString().c_str());
    // INVALID_ARGUMENT: the servers refused what this worker sent (a gradient holding NaN or Inf:
    // the model diverged), which a restart would compute and send again. ABORTED: the trainer
    // stopped the job by its own policy (--max-checkpoint-failures), which a restart would meet
    // again until its cause is mended.
    const StatusCode code = report.status().code();
    return code == StatusCode::kInvalidArgument || code == StatusCode::kAborted ? kExitUsage : kExitFailure;
  }
  std::printf("done: %lld steps in %.2f s (%.0f examples/s on this worker)", static_cast<long long>(report->steps),
              report->wall_s, report->examples_per_sec);
  if (report->eval.count > 0) {
    if (report->eval.auc >= 0) {
      std::printf("; test AUC %.4f, log-loss %.4f, accuracy %.4f", report->eval.auc, report->eval.loss,
                  report->eval.accuracy);
    } else {
      std::printf("; test loss %.4f, accuracy %.4f", report->eval.loss, report->eval.accuracy);
    }
  }
  std::printf("\n");
  return 0;
}
