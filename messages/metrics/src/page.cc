#include "ferry/metrics/page.h"

#include <prometheus/text_serializer.h>

namespace ferry::metrics {

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,    0.1,      0.25,    0.5,    1,       2.5,    5,     10,     30,    60};
  return kBuckets;
}

LatencyHistogram::LatencyHistogram() : histogram_(LatencyBuckets()) {}

prometheus::ClientMetric& Page::Add(const std::string& name, const std::string& help, prometheus::MetricType type,
                                    const Labels& labels) {
  const auto [at, added] = index_.try_emplace(name, families_.size());
  if (added) families_.push_back(prometheus::MetricFamily{name, help, type, {}});
  prometheus::ClientMetric& m = families_[at->second].metric.emplace_back();
  for (const auto& [label, value] : labels) m.label.push_back({label, value});
  return m;
}

void Page::Counter(const std::string& name, const std::string& help, const Labels& labels, double value) {
  Add(name, help, prometheus::MetricType::Counter, labels).counter.value = value;
}

void Page::Gauge(const std::string& name, const std::string& help, const Labels& labels, double value) {
  Add(name, help, prometheus::MetricType::Gauge, labels).gauge.value = value;
}

void Page::Histogram(const std::string& name, const std::string& help, const Labels& labels,
                     prometheus::ClientMetric::Histogram h) {
  Add(name, help, prometheus::MetricType::Histogram, labels).histogram = std::move(h);
}

std::string Page::Text() const { return prometheus::TextSerializer().Serialize(families_); }

}  // namespace ferry::metrics
