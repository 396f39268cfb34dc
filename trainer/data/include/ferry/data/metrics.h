// ferry/data/metrics.h — evaluation metrics for the trainer: exact AUC, log-loss, accuracy, and
// accumulators that merge across batches and workers.
//
// Merging across workers:
//   - log-loss and accuracy are means: merge the sums and counts (the accumulators' State), which
//     is the same as weighting each worker's mean by its example count. Never average the
//     workers' means unweighted.
//   - AUC is not a mean of per-worker AUCs. Either concatenate every worker's (score, label) lists
//     and call ExactAuc, or merge BinaryMetrics histograms (per-bin positive/negative counts add
//     up) and take the histogram AUC, which is within AucErrorBound() of the exact one.
//   - State() flattens an accumulator into doubles (counts are exact below 2^53) to ship it
//     between processes; FromState() + Merge() rebuild and combine. Merging is exact integer
//     addition for counts, so the merged counts do not depend on the order; the float loss sums
//     may differ in the last bits with the order (merge in rank order for bitwise repeatability).
//
// Conventions: binary labels are floats equal to 0 or 1; probabilities are in [0, 1]; a NaN
// score or probability, a label that is not 0/1 and mismatched lengths are INVALID_ARGUMENT. An
// AUC without both a positive and a negative example is FAILED_PRECONDITION (it is undefined).
//
// Thread-safety: the free functions are pure. An accumulator is not thread-safe: one per thread,
// then Merge.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ferry/status.h"

namespace ferry::data {

// ROC AUC: the probability that a random positive scores above a random negative, ties counting
// one half (Mann–Whitney U / (P * N)). Scores may be any finite floats (probabilities, logits).
// O(n log n) time, O(n) extra memory. Exact up to the final division for n < 2^32.
StatusOr<double> ExactAuc(std::span<const float> scores, std::span<const float> labels);

// Mean binary cross-entropy -[y log p + (1 - y) log(1 - p)] in nats, with p clipped to
// [kLogLossEpsilon, 1 - kLogLossEpsilon] so a saturated p = 0 or 1 stays finite. Empty input is
// FAILED_PRECONDITION.
inline constexpr double kLogLossEpsilon = 1e-7;
StatusOr<double> LogLoss(std::span<const float> probs, std::span<const float> labels);

// Fraction of examples with (prob >= threshold) == (label == 1).
StatusOr<double> BinaryAccuracy(std::span<const float> probs, std::span<const float> labels,
                                float threshold = 0.5f);

// Fraction of predicted[i] == labels[i].
StatusOr<double> Accuracy(std::span<const int32_t> predicted, std::span<const int32_t> labels);

// Row-wise argmax of a [rows * num_classes] row-major matrix (the first maximum wins; NaN never
// wins). Requires num_classes >= 1 and logits.size() % num_classes == 0.
std::vector<int32_t> ArgMaxRows(std::span<const float> logits, int num_classes);

// Accumulates binary-classification metrics over batches: mean log-loss, accuracy at 0.5 and a
// histogram AUC (probabilities binned into num_bins equal-width bins of [0, 1]; examples in one
// bin count as tied).
class BinaryMetrics {
 public:
  static constexpr int kDefaultBins = 1 << 14;

  // num_bins >= 1 (smaller values are raised to 1). Memory: 16 bytes per bin.
  explicit BinaryMetrics(int num_bins = kDefaultBins);

  // Adds a batch. INVALID_ARGUMENT (and nothing added) for mismatched lengths, a label not 0/1 or
  // a probability outside [0, 1] or NaN.
  Status Add(std::span<const float> probs, std::span<const float> labels);
  // Adds `other`'s examples. INVALID_ARGUMENT if the bin counts differ.
  Status Merge(const BinaryMetrics& other);

  int num_bins() const { return static_cast<int>(pos_.size()); }
  int64_t count() const { return count_; }
  int64_t positives() const { return positives_; }
  double mean_log_loss() const;  // NaN when empty
  double accuracy() const;       // NaN when empty
  // Histogram AUC; FAILED_PRECONDITION without both classes.
  StatusOr<double> auc() const;
  // |auc() - ExactAuc(same examples)| <= AucErrorBound(): half the fraction of positive/negative
  // pairs that share a bin. 0 when the AUC is undefined.
  double AucErrorBound() const;

  // [num_bins, count, positives, correct, loss_sum, pos[num_bins], neg[num_bins]].
  std::vector<double> State() const;
  // INVALID_ARGUMENT if `state` is not a well-formed State().
  static StatusOr<BinaryMetrics> FromState(std::span<const double> state);

 private:
  int64_t count_ = 0;
  int64_t positives_ = 0;
  int64_t correct_ = 0;
  double loss_sum_ = 0.0;
  std::vector<int64_t> pos_;  // positives per probability bin
  std::vector<int64_t> neg_;  // negatives per probability bin
};

// Accumulates multi-class metrics from logits: mean softmax cross-entropy (nats) and accuracy.
class ClassificationMetrics {
 public:
  // num_classes >= 1 (smaller values are raised to 1).
  explicit ClassificationMetrics(int num_classes);

  // `logits` is [labels.size() * num_classes] row-major. INVALID_ARGUMENT (and nothing added) for
  // a size mismatch, a label outside [0, num_classes) or a non-finite logit.
  Status Add(std::span<const float> logits, std::span<const int32_t> labels);
  // INVALID_ARGUMENT if the class counts differ.
  Status Merge(const ClassificationMetrics& other);

  int num_classes() const { return num_classes_; }
  int64_t count() const { return count_; }
  double mean_cross_entropy() const;  // NaN when empty
  double accuracy() const;            // NaN when empty

  // [num_classes, count, correct, loss_sum].
  std::vector<double> State() const;
  static StatusOr<ClassificationMetrics> FromState(std::span<const double> state);

 private:
  int num_classes_ = 1;
  int64_t count_ = 0;
  int64_t correct_ = 0;
  double loss_sum_ = 0.0;
};

}  // namespace ferry::data
