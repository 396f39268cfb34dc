// ferry/metrics/worker.h — a training worker's series for Prometheus at http://HOST:PORT/metrics,
// the same names for ferry-trainer (--metrics) and for a Python worker (ferry.torch, with
// FERRY_METRICS, which ferry-launch sets), so that one dashboard (launch/grafana/ferry.json)
// shows either kind. Each is labelled worker="<rank>":
//   ferry_trainer_step                       steps done (gauge)
//   ferry_trainer_examples_total             training examples processed
//   ferry_trainer_loss                       the last step's mean training loss (gauge)
//   ferry_trainer_time_seconds_total{part}   the worker's time by part: pull, push, compute, wait,
//                                            eval (the parts add up to its wall time)
//   ferry_trainer_sent_bytes_total, ferry_trainer_received_bytes_total   by its client
// and the process's own (ferry/metrics/process.h). All are 0 until the first Update.
//
// Thread-safety: Update from any thread while the endpoint's threads scrape (a mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ferry/metrics/http.h"
#include "ferry/mutex.h"
#include "ferry/status.h"

namespace ferry::metrics {

// Where a worker is: cumulative since it started, but loss (the last step's).
struct WorkerProgress {
  int64_t step = 0;
  int64_t examples = 0;
  double loss = 0;
  double pull_s = 0, push_s = 0, compute_s = 0, wait_s = 0, eval_s = 0;
  int64_t bytes_sent = 0, bytes_received = 0;
};

class WorkerEndpoint {
 public:
  // Serves worker `rank`'s series on `bind` ("PORT" or "HOST:PORT"; port 0 picks a free one).
  static StatusOr<std::unique_ptr<WorkerEndpoint>> Start(const std::string& bind, int rank);
  WorkerEndpoint(const WorkerEndpoint&) = delete;
  WorkerEndpoint& operator=(const WorkerEndpoint&) = delete;

  void Update(const WorkerProgress& progress);
  // http://HOST:PORT/metrics
  const std::string& url() const { return http_->url(); }

 private:
  explicit WorkerEndpoint(int rank) : rank_(rank) {}
  std::optional<std::string> Render();

  const int rank_;
  Mutex mu_;
  WorkerProgress last_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<HttpEndpoint> http_;  // last: stopped before the rest goes
};

}  // namespace ferry::metrics
