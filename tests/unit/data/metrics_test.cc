// Metrics: AUC against hand-computed values (with ties) and brute force, histogram AUC against
// exact, log-loss, accuracy, and merging across "workers".
#include "ferry/data/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace ferry::data {
namespace {

// P(s+ > s-) + 0.5 P(s+ == s-) over all pairs.
double BruteForceAuc(const std::vector<float>& scores, const std::vector<float>& labels) {
  double wins = 0.0, pairs = 0.0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (labels[i] != 1.0f) continue;
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[j] != 0.0f) continue;
      pairs += 1;
      wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
    }
  }
  return wins / pairs;
}

double Auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  StatusOr<double> auc = ExactAuc(scores, labels);
  EXPECT_TRUE(auc.ok()) << auc.status();
  return auc.ok() ? *auc : -1.0;
}

TEST(MetricsTest, ExactAucHandComputed) {
  // The classic example: 3 of the 4 positive/negative pairs are ordered right.
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);
  // Perfect, reversed.
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.2f, 0.8f, 0.9f}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc({0.9f, 0.8f, 0.2f, 0.1f}, {0, 0, 1, 1}), 0.0);
  // Ties: positives {0.5, 0.9}, negatives {0.1, 0.5}: 1 + 0.5 + 1 + 1 = 3.5 of 4.
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.5f, 0.5f, 0.9f}, {0, 1, 0, 1}), 0.875);
  // All tied: one half.
  EXPECT_DOUBLE_EQ(Auc({0.3f, 0.3f, 0.3f, 0.3f, 0.3f}, {0, 1, 0, 1, 1}), 0.5);
  // Positives {2, 2, 3}, negatives {1, 2}: (1 + .5) + (1 + .5) + (1 + 1) = 5 of 6.
  EXPECT_DOUBLE_EQ(Auc({2, 1, 2, 3, 2}, {1, 0, 1, 1, 0}), 5.0 / 6.0);
  // Order of the input does not matter; logits work as well as probabilities.
  EXPECT_DOUBLE_EQ(Auc({2, 2, 3, 1, 2}, {0, 1, 1, 0, 1}), 5.0 / 6.0);
  EXPECT_DOUBLE_EQ(Auc({-3.0f, 4.0f}, {0, 1}), 1.0);
}

TEST(MetricsTest, ExactAucMatchesBruteForceWithManyTies) {
  std::mt19937 rng(2024);
  std::uniform_int_distribution<int> level(0, 20);  // 21 distinct scores: many ties
  std::bernoulli_distribution coin(0.3);
  std::vector<float> scores(700), labels(700);
  for (size_t i = 0; i < scores.size(); ++i) {
    labels[i] = coin(rng) ? 1.0f : 0.0f;
    scores[i] = static_cast<float>(level(rng)) / 20.0f + (labels[i] == 1.0f ? 0.1f : 0.0f);
  }
  EXPECT_NEAR(Auc(scores, labels), BruteForceAuc(scores, labels), 1e-12);
}

TEST(MetricsTest, ExactAucErrors) {
  EXPECT_EQ(ExactAuc(std::vector<float>{0.1f}, std::vector<float>{0, 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ExactAuc(std::vector<float>{0.1f, 0.2f}, std::vector<float>{0, 2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ExactAuc(std::vector<float>{0.1f, NAN}, std::vector<float>{0, 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ExactAuc(std::vector<float>{0.1f, 0.2f}, std::vector<float>{1, 1}).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(ExactAuc(std::vector<float>{}, std::vector<float>{}).status().code(), StatusCode::kFailedPrecondition);
}

TEST(MetricsTest, LogLossAndAccuracy) {
  StatusOr<double> loss = LogLoss(std::vector<float>{0.9f, 0.2f}, std::vector<float>{1, 0});
  ASSERT_TRUE(loss.ok());
  EXPECT_NEAR(*loss, -(std::log(0.9) + std::log(0.8)) / 2, 1e-7);
  // Saturated predictions are clipped, not infinite.
  loss = LogLoss(std::vector<float>{0.0f, 1.0f}, std::vector<float>{1, 0});
  ASSERT_TRUE(loss.ok());
  EXPECT_NEAR(*loss, -std::log(kLogLossEpsilon), 1e-6);
  EXPECT_EQ(LogLoss(std::vector<float>{1.5f}, std::vector<float>{1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LogLoss(std::vector<float>{}, std::vector<float>{}).status().code(), StatusCode::kFailedPrecondition);

  StatusOr<double> acc = BinaryAccuracy(std::vector<float>{0.9f, 0.2f, 0.5f, 0.4f}, std::vector<float>{1, 0, 0, 1});
  ASSERT_TRUE(acc.ok());
  EXPECT_DOUBLE_EQ(*acc, 0.5);  // 0.5 counts as a positive prediction

  acc = Accuracy(std::vector<int32_t>{1, 2, 3, 4}, std::vector<int32_t>{1, 2, 0, 4});
  ASSERT_TRUE(acc.ok());
  EXPECT_DOUBLE_EQ(*acc, 0.75);
  EXPECT_EQ(ArgMaxRows(std::vector<float>{0, 3, 1, 5, 5, -1}, 3), (std::vector<int32_t>{1, 0}));
}

// Probabilities from a noisy score, as a trained model would produce.
void MakeScores(int n, uint32_t seed, std::vector<float>* probs, std::vector<float>* labels) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::bernoulli_distribution coin(0.25);
  probs->resize(n);
  labels->resize(n);
  for (int i = 0; i < n; ++i) {
    const bool y = coin(rng);
    (*labels)[i] = y ? 1.0f : 0.0f;
    (*probs)[i] = static_cast<float>(1.0 / (1.0 + std::exp(-(noise(rng) + (y ? 1.2 : 0.0) - 1.0))));
  }
}

TEST(MetricsTest, HistogramAucIsCloseToExact) {
  std::vector<float> probs, labels;
  MakeScores(20000, 1, &probs, &labels);
  BinaryMetrics metrics;
  ASSERT_TRUE(metrics.Add(probs, labels).ok());
  StatusOr<double> hist = metrics.auc();
  ASSERT_TRUE(hist.ok());
  const double exact = Auc(probs, labels);
  EXPECT_GT(exact, 0.7);
  EXPECT_LE(std::abs(*hist - exact), metrics.AucErrorBound() + 1e-12);
  EXPECT_LT(std::abs(*hist - exact), 1e-3);
  EXPECT_LT(metrics.AucErrorBound(), 2e-3);

  // Coarse bins: a looser bound that still holds.
  BinaryMetrics coarse(16);
  ASSERT_TRUE(coarse.Add(probs, labels).ok());
  EXPECT_LE(std::abs(*coarse.auc() - exact), coarse.AucErrorBound() + 1e-12);
  EXPECT_GT(coarse.AucErrorBound(), metrics.AucErrorBound());

  EXPECT_NEAR(metrics.mean_log_loss(), *LogLoss(probs, labels), 1e-9);
  EXPECT_NEAR(metrics.accuracy(), *BinaryAccuracy(probs, labels), 1e-12);
  EXPECT_EQ(metrics.count(), 20000);
}

TEST(MetricsTest, MergingWorkersEqualsOneAccumulator) {
  std::vector<float> probs, labels;
  MakeScores(9000, 2, &probs, &labels);
  BinaryMetrics whole;
  ASSERT_TRUE(whole.Add(probs, labels).ok());

  // Three "workers" with unequal shares, shipped as State() and merged in rank order.
  const std::vector<std::pair<int, int>> parts = {{0, 1000}, {1000, 5000}, {5000, 9000}};
  BinaryMetrics merged;
  for (auto [begin, end] : parts) {
    BinaryMetrics worker;
    ASSERT_TRUE(worker.Add(std::span(probs).subspan(begin, end - begin),
                           std::span(labels).subspan(begin, end - begin)).ok());
    StatusOr<BinaryMetrics> shipped = BinaryMetrics::FromState(worker.State());
    ASSERT_TRUE(shipped.ok()) << shipped.status();
    ASSERT_TRUE(merged.Merge(*shipped).ok());
  }
  EXPECT_EQ(merged.count(), whole.count());
  EXPECT_EQ(merged.positives(), whole.positives());
  EXPECT_DOUBLE_EQ(*merged.auc(), *whole.auc());
  EXPECT_DOUBLE_EQ(merged.accuracy(), whole.accuracy());
  EXPECT_NEAR(merged.mean_log_loss(), whole.mean_log_loss(), 1e-12);

  EXPECT_EQ(merged.Merge(BinaryMetrics(8)).code(), StatusCode::kInvalidArgument);
  std::vector<double> state = whole.State();
  state[2] += 1;  // positives disagree with the histogram
  EXPECT_EQ(BinaryMetrics::FromState(state).status().code(), StatusCode::kInvalidArgument);
  state.pop_back();
  EXPECT_EQ(BinaryMetrics::FromState(state).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BinaryMetrics().auc().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(std::isnan(BinaryMetrics().mean_log_loss()));
  EXPECT_EQ(whole.Add(std::vector<float>{NAN}, std::vector<float>{1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(whole.count(), 9000);  // nothing added
}

TEST(MetricsTest, ClassificationMetrics) {
  ClassificationMetrics m(3);
  // Row 0: correct (class 2); row 1: wrong (predicts 0, label 1).
  const std::vector<float> logits = {0.0f, 1.0f, 3.0f, 2.0f, 0.0f, 0.0f};
  ASSERT_TRUE(m.Add(logits, std::vector<int32_t>{2, 1}).ok());
  auto ce = [](std::vector<double> row, int label) {
    double z = 0;
    for (double v : row) z += std::exp(v);
    return std::log(z) - row[static_cast<size_t>(label)];
  };
  EXPECT_NEAR(m.mean_cross_entropy(), (ce({0, 1, 3}, 2) + ce({2, 0, 0}, 1)) / 2, 1e-9);
  EXPECT_DOUBLE_EQ(m.accuracy(), 0.5);

  ClassificationMetrics other(3);
  ASSERT_TRUE(other.Add(std::vector<float>{5, 0, 0}, std::vector<int32_t>{0}).ok());
  StatusOr<ClassificationMetrics> shipped = ClassificationMetrics::FromState(other.State());
  ASSERT_TRUE(shipped.ok());
  ASSERT_TRUE(m.Merge(*shipped).ok());
  EXPECT_EQ(m.count(), 3);
  EXPECT_DOUBLE_EQ(m.accuracy(), 2.0 / 3.0);

  EXPECT_EQ(m.Add(logits, std::vector<int32_t>{3, 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Add(logits, std::vector<int32_t>{0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Add(std::vector<float>{INFINITY, 0, 0}, std::vector<int32_t>{0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Merge(ClassificationMetrics(4)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.count(), 3);
}

}  // namespace
}  // namespace ferry::data
