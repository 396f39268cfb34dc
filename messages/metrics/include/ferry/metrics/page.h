// ferry/metrics/page.h — one scrape's page in the Prometheus text format (0.0.4): series added
// from values the caller has read (a snapshot), serialized by prometheus-cpp. Names follow
// Prometheus' conventions, which the programs' tests check on what they serve: a counter's name
// ends in _total, a unit is in the name (_seconds, _bytes), who and what (worker, server, table,
// kind) are labels.
//
// Thread-safety: Page is plain data of one thread; a LatencyHistogram may be observed and
// collected from any thread (prometheus::Histogram locks).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <prometheus/client_metric.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>

namespace ferry::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Bucket bounds in seconds for latencies, 10 us to 60 s (and +Inf).
const prometheus::Histogram::BucketBoundaries& LatencyBuckets();

// A histogram of durations in seconds over LatencyBuckets().
class LatencyHistogram {
 public:
  LatencyHistogram();
  void Observe(double seconds) { histogram_.Observe(seconds); }
  prometheus::ClientMetric::Histogram Collect() const { return histogram_.Collect().histogram; }

 private:
  prometheus::Histogram histogram_;
};

class Page {
 public:
  // Adds one sample of the series `name` with `labels`. A name's first sample sets its type and
  // help; its samples appear together, families in the order first named.
  void Counter(const std::string& name, const std::string& help, const Labels& labels, double value);
  void Gauge(const std::string& name, const std::string& help, const Labels& labels, double value);
  // `h`: cumulative bucket counts ending with the +Inf bucket, as prometheus::Histogram gives.
  void Histogram(const std::string& name, const std::string& help, const Labels& labels,
                 prometheus::ClientMetric::Histogram h);

  // The text exposition of every series added.
  std::string Text() const;

 private:
  prometheus::ClientMetric& Add(const std::string& name, const std::string& help, prometheus::MetricType type,
                                const Labels& labels);
  std::vector<prometheus::MetricFamily> families_;
  std::map<std::string, size_t> index_;  // name -> its family in families_
};

}  // namespace ferry::metrics
