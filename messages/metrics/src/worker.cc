#include "ferry/metrics/worker.h"

#include <utility>

#include "ferry/metrics/page.h"
#include "ferry/metrics/process.h"

namespace ferry::metrics {

StatusOr<std::unique_ptr<WorkerEndpoint>> WorkerEndpoint::Start(const std::string& bind, int rank) {
  std::unique_ptr<WorkerEndpoint> m(new WorkerEndpoint(rank));
  auto http = HttpEndpoint::Start(bind, [p = m.get()] { return p->Render(); });
  if (!http.ok()) return http.status().WithContext("worker " + std::to_string(rank) + "'s metrics");
  m->http_ = std::move(*http);
  return m;
}

void WorkerEndpoint::Update(const WorkerProgress& progress) {
  MutexLock lock(&mu_);
  last_ = progress;
}

std::optional<std::string> WorkerEndpoint::Render() {
  WorkerProgress s;
  {
    MutexLock lock(&mu_);
    s = last_;
  }
  const Labels worker = {{"worker", std::to_string(rank_)}};
  Page page;
  page.Gauge("ferry_trainer_step", "Steps this worker has done", worker, static_cast<double>(s.step));
  page.Counter("ferry_trainer_examples_total", "Training examples this worker has processed", worker,
               static_cast<double>(s.examples));
  page.Gauge("ferry_trainer_loss", "Mean training loss of this worker's last step", worker, s.loss);
  const std::pair<const char*, double> parts[] = {
      {"pull", s.pull_s}, {"push", s.push_s}, {"compute", s.compute_s}, {"wait", s.wait_s}, {"eval", s.eval_s}};
  for (const auto& [part, seconds] : parts) {
    Labels labels = worker;
    labels.emplace_back("part", part);
    page.Counter("ferry_trainer_time_seconds_total",
                 "This worker's time by part: pull (transfer), push, compute, wait (held for other workers), "
                 "eval; the parts add up to its wall time",
                 labels, seconds);
  }
  page.Counter("ferry_trainer_sent_bytes_total", "Bytes this worker's client has sent", worker,
               static_cast<double>(s.bytes_sent));
  page.Counter("ferry_trainer_received_bytes_total", "Bytes this worker's client has received", worker,
               static_cast<double>(s.bytes_received));
  AddProcessMetrics(page, worker);
  return page.Text();
}

}  // namespace ferry::metrics
