#include "internal/trainer_metrics.h"

#include <utility>

#include "ferry/metrics/page.h"
#include "ferry/metrics/process.h"

namespace ferry::trainer::internal {

StatusOr<std::unique_ptr<TrainerMetrics>> TrainerMetrics::Start(const std::string& bind, int rank) {
  std::unique_ptr<TrainerMetrics> m(new TrainerMetrics(rank));
  auto http = metrics::HttpEndpoint::Start(bind, [p = m.get()] { return p->Render(); });
  if (!http.ok()) return http.status().WithContext("ferry-trainer rank " + std::to_string(rank));
  m->http_ = std::move(*http);
  return m;
}

void TrainerMetrics::OnStep(const StepDone& step) {
  MutexLock lock(&mu_);
  last_ = step;
}

std::optional<std::string> TrainerMetrics::Render() {
  StepDone s;
  {
    MutexLock lock(&mu_);
    s = last_;
  }
  const metrics::Labels worker = {{"worker", std::to_string(rank_)}};
  metrics::Page page;
  page.Gauge("ferry_trainer_step", "Steps this worker has done", worker, static_cast<double>(s.step));
  page.Counter("ferry_trainer_examples_total", "Training examples this worker has processed", worker,
               static_cast<double>(s.examples));
  page.Gauge("ferry_trainer_loss", "Mean training loss of this worker's last step", worker, s.loss);
  const std::pair<const char*, double> parts[] = {{"pull", s.times.pull_s},
                                                  {"push", s.times.push_s},
                                                  {"compute", s.times.compute_s},
                                                  {"wait", s.times.wait_s},
                                                  {"eval", s.times.eval_s}};
  for (const auto& [part, seconds] : parts) {
    metrics::Labels labels = worker;
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
  metrics::AddProcessMetrics(page, worker);
  return page.Text();
}

}  // namespace ferry::trainer::internal
