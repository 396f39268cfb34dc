// The synthetic click-through generator: determinism, layout, Zipf ids, and the planted model's
// AUC against a random model's.
#include "ferry/data/synthetic_ctr.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "ferry/data/metrics.h"
#include "ferry/data/shard.h"

namespace ferry::data {
namespace {

SyntheticCtr MakeGenerator(const SyntheticCtrOptions& options = {}) {
  StatusOr<SyntheticCtr> gen = SyntheticCtr::Create(options);
  EXPECT_TRUE(gen.ok()) << gen.status();
  return *gen;
}

TEST(SyntheticCtrTest, DeterministicForASeedAndPerIndex) {
  const SyntheticCtr a = MakeGenerator();
  const SyntheticCtr b = MakeGenerator();
  CtrBatch ba, bb;
  std::vector<float> pa, pb;
  a.GenerateRange(0, 500, &ba, &pa);
  b.GenerateRange(0, 500, &bb, &pb);
  EXPECT_EQ(ba.labels, bb.labels);
  EXPECT_EQ(ba.dense, bb.dense);
  EXPECT_EQ(ba.ids, bb.ids);
  EXPECT_EQ(pa, pb);

  // Example i does not depend on which other examples share its batch: a shuffled shard sees the
  // same rows.
  StatusOr<std::vector<int64_t>> indices = EpochIndices(500, {1, 3}, 2, {true, 9});
  ASSERT_TRUE(indices.ok());
  CtrBatch shard;
  std::vector<float> shard_probs;
  a.Generate(*indices, &shard, &shard_probs);
  ASSERT_EQ(shard.size(), static_cast<int64_t>(indices->size()));
  for (size_t k = 0; k < indices->size(); ++k) {
    const int64_t i = (*indices)[k];
    const int64_t row = static_cast<int64_t>(k);
    EXPECT_EQ(shard.labels[k], ba.labels[static_cast<size_t>(i)]);
    EXPECT_TRUE(std::equal(shard.id_row(row).begin(), shard.id_row(row).end(), ba.id_row(i).begin()));
    EXPECT_TRUE(std::equal(shard.dense_row(row).begin(), shard.dense_row(row).end(), ba.dense_row(i).begin()));
    EXPECT_EQ(shard_probs[k], pa[static_cast<size_t>(i)]);
  }

  // Another seed, other data and another model.
  SyntheticCtrOptions other;
  other.seed = 2;
  const SyntheticCtr c = MakeGenerator(other);
  CtrBatch bc;
  c.GenerateRange(0, 500, &bc, nullptr);
  EXPECT_NE(ba.ids, bc.ids);
  EXPECT_NE(ba.dense, bc.dense);
  EXPECT_NE(a.id_weight(0), c.id_weight(0));
}

TEST(SyntheticCtrTest, LayoutAndIdRanges) {
  SyntheticCtrOptions options;
  options.vocab_sizes = {5, 1, 100};
  options.num_dense = 3;
  const SyntheticCtr gen = MakeGenerator(options);
  EXPECT_EQ(gen.num_fields(), 3);
  EXPECT_EQ(gen.num_dense(), 3);
  EXPECT_EQ(gen.field_offset(0), 0);
  EXPECT_EQ(gen.field_offset(1), 5);
  EXPECT_EQ(gen.field_offset(2), 6);
  EXPECT_EQ(gen.total_vocab(), 106);
  CtrBatch batch;
  std::vector<float> probs;
  gen.GenerateRange(0, 2000, &batch, &probs);
  ASSERT_EQ(batch.size(), 2000);
  EXPECT_EQ(batch.num_dense, 3);
  EXPECT_EQ(batch.num_fields, 3);
  ASSERT_EQ(batch.dense.size(), 6000u);
  ASSERT_EQ(batch.ids.size(), 6000u);
  ASSERT_EQ(probs.size(), 2000u);
  for (int64_t i = 0; i < batch.size(); ++i) {
    const auto ids = batch.id_row(i);
    EXPECT_GE(ids[0], 0);
    EXPECT_LT(ids[0], 5);
    EXPECT_EQ(ids[1], 5);  // a vocabulary of one
    EXPECT_GE(ids[2], 6);
    EXPECT_LT(ids[2], 106);
    EXPECT_TRUE(batch.labels[i] == 0.0f || batch.labels[i] == 1.0f);
    // The exposed probability is the planted model's on the stored (float) features.
    EXPECT_NEAR(probs[i], 1.0 / (1.0 + std::exp(-gen.PlantedLogit(batch, i))), 1e-6);
  }
  // Dense features are standard normal.
  const double mean = std::accumulate(batch.dense.begin(), batch.dense.end(), 0.0) / batch.dense.size();
  double var = 0.0;
  for (float x : batch.dense) var += (x - mean) * (x - mean);
  var /= batch.dense.size();
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(var, 1.0, 0.08);
}

// Frequencies of the first ranks match the Zipf pmf k^-s / H(n, s).
void CheckZipf(double s) {
  SyntheticCtrOptions options;
  options.vocab_sizes = {50};
  options.num_dense = 0;
  options.zipf_exponent = s;
  const SyntheticCtr gen = MakeGenerator(options);
  constexpr int64_t kN = 40000;
  CtrBatch batch;
  gen.GenerateRange(0, kN, &batch, nullptr);
  std::vector<int64_t> counts(50, 0);
  for (int64_t id : batch.ids) counts[static_cast<size_t>(id)]++;
  double norm = 0.0;
  for (int k = 1; k <= 50; ++k) norm += std::pow(k, -s);
  for (int k = 1; k <= 5; ++k) {
    const double p = std::pow(k, -s) / norm;
    const double sd = std::sqrt(kN * p * (1 - p));
    EXPECT_NEAR(counts[static_cast<size_t>(k - 1)], kN * p, 4 * sd) << "s=" << s << " rank " << k;
  }
  EXPECT_GT(counts[0], counts[1]);
  EXPECT_GT(counts[1], counts[9]);
}

TEST(SyntheticCtrTest, IdsAreZipfDistributed) {
  CheckZipf(0.8);
  CheckZipf(1.0);  // the logarithmic special case of the sampler
  CheckZipf(1.5);
}

TEST(SyntheticCtrTest, PlantedModelBeatsChanceAndRandomWeightsDoNot) {
  const SyntheticCtr gen = MakeGenerator();
  constexpr int64_t kN = 20000;
  CtrBatch batch;
  std::vector<float> true_probs;
  gen.GenerateRange(0, kN, &batch, &true_probs);

  // Labels follow the true probabilities.
  const double label_mean = std::accumulate(batch.labels.begin(), batch.labels.end(), 0.0) / kN;
  const double prob_mean = std::accumulate(true_probs.begin(), true_probs.end(), 0.0) / kN;
  EXPECT_NEAR(label_mean, prob_mean, 4 * std::sqrt(prob_mean * (1 - prob_mean) / kN));

  StatusOr<double> planted_auc = ExactAuc(true_probs, batch.labels);
  ASSERT_TRUE(planted_auc.ok()) << planted_auc.status();
  EXPECT_GT(*planted_auc, 0.75) << "the planted model should separate the classes well";

  // The planted model's log-loss beats predicting the base rate.
  StatusOr<double> planted_loss = LogLoss(true_probs, batch.labels);
  ASSERT_TRUE(planted_loss.ok());
  const double base_loss = -(label_mean * std::log(label_mean) + (1 - label_mean) * std::log(1 - label_mean));
  EXPECT_LT(*planted_loss, base_loss - 0.05);

  // Models of the same form with random weights are no better than chance. One such model can
  // land a few hundredths either side of 0.5 (the head ids of each Zipf field carry much of the
  // weight), so 16 are drawn: each is far below the planted model and their mean is near 0.5.
  constexpr int kModels = 16;
  double mean_auc = 0.0;
  for (int model = 0; model < kModels; ++model) {
    std::mt19937_64 rng(1000 + model);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> id_w(static_cast<size_t>(gen.total_vocab()));
    for (double& w : id_w) w = normal(rng);
    std::vector<double> dense_w(static_cast<size_t>(gen.num_dense()));
    for (double& w : dense_w) w = normal(rng);
    std::vector<float> scores(kN);
    for (int64_t i = 0; i < kN; ++i) {
      double logit = 0.0;
      for (int64_t id : batch.id_row(i)) logit += id_w[static_cast<size_t>(id)];
      for (int j = 0; j < gen.num_dense(); ++j) logit += dense_w[static_cast<size_t>(j)] * batch.dense_row(i)[j];
      scores[static_cast<size_t>(i)] = static_cast<float>(logit);
    }
    StatusOr<double> auc = ExactAuc(scores, batch.labels);
    ASSERT_TRUE(auc.ok());
    EXPECT_LT(*auc, *planted_auc - 0.15) << "random model " << model;
    EXPECT_GT(*auc, 1.0 - *planted_auc + 0.15) << "random model " << model;
    mean_auc += *auc / kModels;
  }
  EXPECT_NEAR(mean_auc, 0.5, 0.03) << "planted AUC " << *planted_auc;
}

TEST(SyntheticCtrTest, InvalidOptions) {
  auto code = [](SyntheticCtrOptions o) { return SyntheticCtr::Create(o).status().code(); };
  SyntheticCtrOptions o;
  o.vocab_sizes = {};
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o = {};
  o.vocab_sizes = {10, 0};
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o = {};
  o.zipf_exponent = 0.0;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o = {};
  o.num_dense = -1;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o = {};
  o.id_weight_stddev = -0.1;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o = {};
  o.vocab_sizes = {int64_t{1} << 52, int64_t{1} << 52};
  EXPECT_TRUE(SyntheticCtr::Create(o).ok());
}

}  // namespace
}  // namespace ferry::data
