#include "ferry/data/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

namespace ferry::data {
namespace {

Status CheckSameSize(const char* fn, size_t a, size_t b) {
  if (a == b) return Status::Ok();
  return InvalidArgumentError(std::string(fn) + ": " + std::to_string(a) + " predictions but " + std::to_string(b) +
                              " labels");
}

// Binary labels must be exactly 0 or 1.
Status CheckBinaryLabels(const char* fn, std::span<const float> labels) {
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != 0.0f && labels[i] != 1.0f) {
      return InvalidArgumentError(std::string(fn) + ": label " + std::to_string(labels[i]) + " at " +
                                  std::to_string(i) + " is not 0 or 1");
    }
  }
  return Status::Ok();
}

Status CheckProbabilities(const char* fn, std::span<const float> probs) {
  for (size_t i = 0; i < probs.size(); ++i) {
    if (!(probs[i] >= 0.0f && probs[i] <= 1.0f)) {
      return InvalidArgumentError(std::string(fn) + ": probability " + std::to_string(probs[i]) + " at " +
                                  std::to_string(i) + " is not in [0, 1]");
    }
  }
  return Status::Ok();
}

double ClippedLogLoss(float prob, float label) {
  const double p = std::clamp(static_cast<double>(prob), kLogLossEpsilon, 1.0 - kLogLossEpsilon);
  return label == 1.0f ? -std::log(p) : -std::log1p(-p);
}

StatusOr<double> AucFromCounts(uint64_t twice_wins, uint64_t positives, uint64_t negatives, const char* fn) {
  if (positives == 0 || negatives == 0) {
    return FailedPreconditionError(std::string(fn) + ": AUC is undefined with " + std::to_string(positives) +
                                   " positive and " + std::to_string(negatives) + " negative examples");
  }
  return static_cast<double>(twice_wins) / (2.0 * static_cast<double>(positives) * static_cast<double>(negatives));
}

bool IsCount(double v) { return v >= 0.0 && v <= 0x1.0p53 && std::floor(v) == v; }

}  // namespace

StatusOr<double> ExactAuc(std::span<const float> scores, std::span<const float> labels) {
  FERRY_RETURN_IF_ERROR(CheckSameSize("ExactAuc", scores.size(), labels.size()));
  FERRY_RETURN_IF_ERROR(CheckBinaryLabels("ExactAuc", labels));
  std::vector<std::pair<float, bool>> pairs(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    if (std::isnan(scores[i])) return InvalidArgumentError("ExactAuc: score at " + std::to_string(i) + " is NaN");
    pairs[i] = {scores[i], labels[i] == 1.0f};
  }
  std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Walk groups of tied scores in ascending order. A positive beats every negative below its
  // group and ties (one half) with the negatives inside it; counted doubled to stay integral.
  uint64_t twice_wins = 0, positives = 0, negatives = 0;
  for (size_t i = 0; i < pairs.size();) {
    size_t j = i;
    uint64_t pos = 0, neg = 0;
    for (; j < pairs.size() && pairs[j].first == pairs[i].first; ++j) (pairs[j].second ? pos : neg)++;
    twice_wins += 2 * pos * negatives + pos * neg;
    positives += pos;
    negatives += neg;
    i = j;
  }
  return AucFromCounts(twice_wins, positives, negatives, "ExactAuc");
}

StatusOr<double> LogLoss(std::span<const float> probs, std::span<const float> labels) {
  FERRY_RETURN_IF_ERROR(CheckSameSize("LogLoss", probs.size(), labels.size()));
  FERRY_RETURN_IF_ERROR(CheckBinaryLabels("LogLoss", labels));
  FERRY_RETURN_IF_ERROR(CheckProbabilities("LogLoss", probs));
  if (probs.empty()) return FailedPreconditionError("LogLoss: no examples");
  double sum = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) sum += ClippedLogLoss(probs[i], labels[i]);
  return sum / static_cast<double>(probs.size());
}

StatusOr<double> BinaryAccuracy(std::span<const float> probs, std::span<const float> labels, float threshold) {
  FERRY_RETURN_IF_ERROR(CheckSameSize("BinaryAccuracy", probs.size(), labels.size()));
  FERRY_RETURN_IF_ERROR(CheckBinaryLabels("BinaryAccuracy", labels));
  if (probs.empty()) return FailedPreconditionError("BinaryAccuracy: no examples");
  int64_t correct = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (std::isnan(probs[i])) return InvalidArgumentError("BinaryAccuracy: score at " + std::to_string(i) + " is NaN");
    correct += (probs[i] >= threshold) == (labels[i] == 1.0f);
  }
  return static_cast<double>(correct) / static_cast<double>(probs.size());
}

StatusOr<double> Accuracy(std::span<const int32_t> predicted, std::span<const int32_t> labels) {
  FERRY_RETURN_IF_ERROR(CheckSameSize("Accuracy", predicted.size(), labels.size()));
  if (predicted.empty()) return FailedPreconditionError("Accuracy: no examples");
  int64_t correct = 0;
  for (size_t i = 0; i < predicted.size(); ++i) correct += predicted[i] == labels[i];
  return static_cast<double>(correct) / static_cast<double>(predicted.size());
}

std::vector<int32_t> ArgMaxRows(std::span<const float> logits, int num_classes) {
  const size_t c = static_cast<size_t>(std::max(num_classes, 1));
  std::vector<int32_t> out(logits.size() / c);
  for (size_t r = 0; r < out.size(); ++r) {
    const float* row = logits.data() + r * c;
    int32_t best = 0;
    for (size_t k = 1; k < c; ++k) {
      if (row[k] > row[best] || (std::isnan(row[best]) && !std::isnan(row[k]))) best = static_cast<int32_t>(k);
    }
    out[r] = best;
  }
  return out;
}

// --- BinaryMetrics ---------------------------------------------------------------------------

BinaryMetrics::BinaryMetrics(int num_bins)
    : pos_(static_cast<size_t>(std::max(num_bins, 1)), 0), neg_(static_cast<size_t>(std::max(num_bins, 1)), 0) {}

Status BinaryMetrics::Add(std::span<const float> probs, std::span<const float> labels) {
  FERRY_RETURN_IF_ERROR(CheckSameSize("BinaryMetrics::Add", probs.size(), labels.size()));
  FERRY_RETURN_IF_ERROR(CheckBinaryLabels("BinaryMetrics::Add", labels));
  FERRY_RETURN_IF_ERROR(CheckProbabilities("BinaryMetrics::Add", probs));
  const int bins = num_bins();
  for (size_t i = 0; i < probs.size(); ++i) {
    const bool positive = labels[i] == 1.0f;
    const int bin = std::min(bins - 1, static_cast<int>(static_cast<double>(probs[i]) * bins));
    (positive ? pos_ : neg_)[static_cast<size_t>(bin)]++;
    correct_ += (probs[i] >= 0.5f) == positive;
    loss_sum_ += ClippedLogLoss(probs[i], labels[i]);
    positives_ += positive;
  }
  count_ += static_cast<int64_t>(probs.size());
  return Status::Ok();
}

Status BinaryMetrics::Merge(const BinaryMetrics& other) {
  if (other.num_bins() != num_bins()) {
    return InvalidArgumentError("BinaryMetrics::Merge: " + std::to_string(other.num_bins()) + " bins into " +
                                std::to_string(num_bins()));
  }
  for (size_t b = 0; b < pos_.size(); ++b) {
    pos_[b] += other.pos_[b];
    neg_[b] += other.neg_[b];
  }
  count_ += other.count_;
  positives_ += other.positives_;
  correct_ += other.correct_;
  loss_sum_ += other.loss_sum_;
  return Status::Ok();
}

double BinaryMetrics::mean_log_loss() const {
  return count_ == 0 ? std::numeric_limits<double>::quiet_NaN() : loss_sum_ / static_cast<double>(count_);
}

double BinaryMetrics::accuracy() const {
  return count_ == 0 ? std::numeric_limits<double>::quiet_NaN()
                     : static_cast<double>(correct_) / static_cast<double>(count_);
}

StatusOr<double> BinaryMetrics::auc() const {
  uint64_t twice_wins = 0, negatives = 0;
  for (size_t b = 0; b < pos_.size(); ++b) {
    const uint64_t pos = static_cast<uint64_t>(pos_[b]), neg = static_cast<uint64_t>(neg_[b]);
    twice_wins += 2 * pos * negatives + pos * neg;
    negatives += neg;
  }
  return AucFromCounts(twice_wins, static_cast<uint64_t>(positives_), negatives, "BinaryMetrics::auc");
}

double BinaryMetrics::AucErrorBound() const {
  const double negatives = static_cast<double>(count_ - positives_);
  if (positives_ == 0 || negatives == 0) return 0.0;
  double tied = 0.0;
  for (size_t b = 0; b < pos_.size(); ++b) tied += static_cast<double>(pos_[b]) * static_cast<double>(neg_[b]);
  return 0.5 * tied / (static_cast<double>(positives_) * negatives);
}

std::vector<double> BinaryMetrics::State() const {
  std::vector<double> s = {static_cast<double>(num_bins()), static_cast<double>(count_),
                           static_cast<double>(positives_), static_cast<double>(correct_), loss_sum_};
  s.insert(s.end(), pos_.begin(), pos_.end());
  s.insert(s.end(), neg_.begin(), neg_.end());
  return s;
}

StatusOr<BinaryMetrics> BinaryMetrics::FromState(std::span<const double> state) {
  auto bad = [&](const std::string& what) {
    return InvalidArgumentError("BinaryMetrics::FromState: " + what);
  };
  if (state.size() < 5) return bad("state has " + std::to_string(state.size()) + " values, at least 5 needed");
  if (!IsCount(state[0]) || state[0] < 1 || state[0] > (1 << 26)) return bad("bad bin count");
  const size_t bins = static_cast<size_t>(state[0]);
  if (state.size() != 5 + 2 * bins) {
    return bad("state has " + std::to_string(state.size()) + " values, " + std::to_string(bins) + " bins need " +
               std::to_string(5 + 2 * bins));
  }
  for (size_t i = 1; i < state.size(); ++i) {
    if (i != 4 && !IsCount(state[i])) return bad("value " + std::to_string(i) + " is not a count");
  }
  if (!(state[4] >= 0.0) || !std::isfinite(state[4])) return bad("loss sum is not finite and >= 0");
  BinaryMetrics m(static_cast<int>(bins));
  m.count_ = static_cast<int64_t>(state[1]);
  m.positives_ = static_cast<int64_t>(state[2]);
  m.correct_ = static_cast<int64_t>(state[3]);
  m.loss_sum_ = state[4];
  int64_t pos_total = 0, neg_total = 0;
  for (size_t b = 0; b < bins; ++b) {
    m.pos_[b] = static_cast<int64_t>(state[5 + b]);
    m.neg_[b] = static_cast<int64_t>(state[5 + bins + b]);
    pos_total += m.pos_[b];
    neg_total += m.neg_[b];
  }
  if (pos_total != m.positives_ || pos_total + neg_total != m.count_ || m.correct_ > m.count_) {
    return bad("counts disagree with the histogram");
  }
  return m;
}

// --- ClassificationMetrics -------------------------------------------------------------------

ClassificationMetrics::ClassificationMetrics(int num_classes) : num_classes_(std::max(num_classes, 1)) {}

Status ClassificationMetrics::Add(std::span<const float> logits, std::span<const int32_t> labels) {
  const size_t c = static_cast<size_t>(num_classes_);
  if (logits.size() != labels.size() * c) {
    return InvalidArgumentError("ClassificationMetrics::Add: " + std::to_string(logits.size()) + " logits for " +
                                std::to_string(labels.size()) + " labels of " + std::to_string(c) + " classes");
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || labels[i] >= num_classes_) {
      return InvalidArgumentError("ClassificationMetrics::Add: label " + std::to_string(labels[i]) + " at " +
                                  std::to_string(i) + " is not in [0, " + std::to_string(c) + ")");
    }
  }
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) {
      return InvalidArgumentError("ClassificationMetrics::Add: logit " + std::to_string(i) + " is not finite");
    }
  }
  const std::vector<int32_t> predicted = ArgMaxRows(logits, num_classes_);
  for (size_t r = 0; r < labels.size(); ++r) {
    const float* row = logits.data() + r * c;
    const double max = row[predicted[r]];
    double sum = 0.0;
    for (size_t k = 0; k < c; ++k) sum += std::exp(static_cast<double>(row[k]) - max);
    loss_sum_ += max + std::log(sum) - static_cast<double>(row[labels[r]]);
    correct_ += predicted[r] == labels[r];
  }
  count_ += static_cast<int64_t>(labels.size());
  return Status::Ok();
}

Status ClassificationMetrics::Merge(const ClassificationMetrics& other) {
  if (other.num_classes_ != num_classes_) {
    return InvalidArgumentError("ClassificationMetrics::Merge: " + std::to_string(other.num_classes_) +
                                " classes into " + std::to_string(num_classes_));
  }
  count_ += other.count_;
  correct_ += other.correct_;
  loss_sum_ += other.loss_sum_;
  return Status::Ok();
}

double ClassificationMetrics::mean_cross_entropy() const {
  return count_ == 0 ? std::numeric_limits<double>::quiet_NaN() : loss_sum_ / static_cast<double>(count_);
}

double ClassificationMetrics::accuracy() const {
  return count_ == 0 ? std::numeric_limits<double>::quiet_NaN()
                     : static_cast<double>(correct_) / static_cast<double>(count_);
}

std::vector<double> ClassificationMetrics::State() const {
  return {static_cast<double>(num_classes_), static_cast<double>(count_), static_cast<double>(correct_), loss_sum_};
}

StatusOr<ClassificationMetrics> ClassificationMetrics::FromState(std::span<const double> state) {
  if (state.size() != 4 || !IsCount(state[0]) || state[0] < 1 || state[0] > (1 << 30) || !IsCount(state[1]) ||
      !IsCount(state[2]) || state[2] > state[1] || !(state[3] >= 0.0) || !std::isfinite(state[3])) {
    return InvalidArgumentError("ClassificationMetrics::FromState: not a well-formed state of 4 values");
  }
  ClassificationMetrics m(static_cast<int>(state[0]));
  m.count_ = static_cast<int64_t>(state[1]);
  m.correct_ = static_cast<int64_t>(state[2]);
  m.loss_sum_ = state[3];
  return m;
}

}  // namespace ferry::data
