// trainer/internal/trainer_metrics.h — ferry-trainer --metrics: this worker's series for
// Prometheus at http://HOST:PORT/metrics (ferry/metrics/http.h, the server's endpoint), each
// labelled worker="<rank>":
//   ferry_trainer_step                       steps done (gauge)
//   ferry_trainer_examples_total             training examples processed
//   ferry_trainer_loss                       the last step's mean training loss (gauge)
//   ferry_trainer_time_seconds_total{part}   the worker's time by part: pull, push, compute, wait,
//                                            eval (trainer.h; the parts add up to its wall time)
//   ferry_trainer_sent_bytes_total, ferry_trainer_received_bytes_total   by its client
// and the process's own (ferry/metrics/process.h). All are 0 until the first step ends.
//
// Thread-safety: OnStep from the training thread while the endpoint's threads scrape (a mutex).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "ferry/metrics/http.h"
#include "ferry/mutex.h"
#include "ferry/status.h"
#include "ferry/trainer/trainer.h"

namespace ferry::trainer::internal {

class TrainerMetrics {
 public:
  // Serves worker `rank`'s series on `bind` ("PORT" or "HOST:PORT"; port 0 picks a free one).
  static StatusOr<std::unique_ptr<TrainerMetrics>> Start(const std::string& bind, int rank);
  TrainerMetrics(const TrainerMetrics&) = delete;
  TrainerMetrics& operator=(const TrainerMetrics&) = delete;

  void OnStep(const StepDone& step);
  // http://HOST:PORT/metrics
  const std::string& url() const { return http_->url(); }

 private:
  explicit TrainerMetrics(int rank) : rank_(rank) {}
  std::optional<std::string> Render();

  const int rank_;
  Mutex mu_;
  StepDone last_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<metrics::HttpEndpoint> http_;  // last: stopped before the rest goes
};

}  // namespace ferry::trainer::internal
