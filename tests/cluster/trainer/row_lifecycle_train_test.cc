// The trainer's ctr model (embeddings on the servers + an MLP tower) with the row lifecycle set
// through --table, on synthetic data of 2^40 ids a field (new ids every step): the servers' rows
// stay under the bound the settings give, and the test AUC stays within the noise of unbounded
// runs (their spread over --seed, which sets the initial parameters and the data order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "internal/row_lifecycle.h"
#include "support/cluster.h"
#include "ferry/trainer/models.h"
#include "worker_runs.h"

namespace ferry::trainer {
namespace {

constexpr int kFields = 4;
constexpr int64_t kMaxRows = 2000;  // per server and table

TrainerOptions Options(uint64_t seed) {
  TrainerOptions o = test::CtrOptions(OptimizerType::kAdam, 0.01f, 0);
  o.ctr().fields = kFields;
  o.ctr().vocab = int64_t{1} << 40;
  o.ctr().zipf = 1.1;
  o.ctr().train = 2 * 128 * 400;  // 400 steps of 2 workers, one epoch: every example once
  o.ctr().test = 10000;
  o.hidden = {16};
  o.batch = 128;
  o.epochs = 1;
  o.seed = seed;
  return o;
}

struct Result {
  double auc = 0;
  int64_t rows = 0, evicted = 0, not_admitted = 0, max_server_bytes = 0;
};

Result Train(const TrainerOptions& o, const Datasets& ds) {
  auto cluster = ferry::test::LocalCluster::Start(2);
  const auto runs = test::RunWorkers(cluster, 2, o, ds);
  Result r;
  EXPECT_TRUE(runs[0].report.ok()) << runs[0].report.status();
  EXPECT_TRUE(runs[1].report.ok()) << runs[1].report.status();
  if (!runs[0].report.ok()) return r;
  r.auc = runs[0].report->eval.auc;
  for (const auto& s : cluster.servers) {
    const auto c = s->stats().counters;
    const int64_t held = c.at("rows_admitted") - c.at("rows_evicted_age") - c.at("rows_evicted_capacity");
    EXPECT_LE(held, kFields * kMaxRows) << "a server holds more rows than its tables' max_rows";
    r.rows += held;
    r.evicted += c.at("rows_evicted_age") + c.at("rows_evicted_capacity");
    r.not_admitted += c.at("rows_not_admitted");
    r.max_server_bytes = std::max(r.max_server_bytes, c.at("memory_budget_used_bytes"));
  }
  return r;
}

TEST(RowLifecycleTraining, BoundedEmbeddingsTrainAsWellAsUnboundedOnesOnAnUnboundedIdStream) {
  const TrainerOptions base = Options(1);
  auto data = LoadCtrData(base);
  ASSERT_TRUE(data.ok()) << data.status();
  const Datasets ds{nullptr, nullptr, &*data};

  std::vector<double> unbounded;
  int64_t unbounded_bytes = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const Result r = Train(Options(seed), ds);
    ASSERT_FALSE(testing::Test::HasFailure());
    unbounded.push_back(r.auc);
    unbounded_bytes = std::max(unbounded_bytes, r.max_server_bytes);
  }
  double mean = 0, var = 0;
  for (double a : unbounded) mean += a / static_cast<double>(unbounded.size());
  for (double a : unbounded) var += (a - mean) * (a - mean) / static_cast<double>(unbounded.size() - 1);
  const double sd = std::sqrt(var);

  TrainerOptions o = base;
  o.tables.push_back({"ctr/emb*", {{"admit_after", "2"}, {"max_rows", std::to_string(kMaxRows)},
                                   {"evict_after_steps", "100"}}});
  const Result b = Train(o, ds);
  ASSERT_FALSE(testing::Test::HasFailure());
  TableSpec emb;
  emb.type = TableType::kSparse;
  emb.admit_after = 2;
  emb.max_rows = kMaxRows;
  // Per server: each table's max_rows of rows (dim 4, Adam: 12 floats + 24 + 16 bytes) and its
  // filter, and the tower (much smaller).
  const int64_t row_bytes = 4 * 3 * 4 + 24 + 16;
  const int64_t bound = kFields * (kMaxRows * row_bytes + ps::AdmissionFilter::Bytes(emb)) + (int64_t{1} << 20);
  std::printf("planted AUC %.4f; unbounded AUC over seeds 1-4: %.4f %.4f %.4f %.4f (mean %.4f, sd %.4f); bounded "
              "(seed 1): %.4f\nbounded: %lld rows held on the 2 servers, %lld evicted, %lld pushed rows not stored; "
              "largest server's memory %lld bytes (bound %lld), unbounded %lld\n",
              data->planted_auc, unbounded[0], unbounded[1], unbounded[2], unbounded[3], mean, sd, b.auc,
              static_cast<long long>(b.rows), static_cast<long long>(b.evicted), static_cast<long long>(b.not_admitted),
              static_cast<long long>(b.max_server_bytes), static_cast<long long>(bound),
              static_cast<long long>(unbounded_bytes));
  EXPECT_GT(b.evicted, 0);
  EXPECT_GT(b.not_admitted, 0);
  EXPECT_LE(b.max_server_bytes, bound);
  EXPECT_GT(b.auc, 0.6);
  EXPECT_NEAR(b.auc, mean, std::max(3 * sd, 0.005)) << "outside the unbounded runs' noise";
}

}  // namespace
}  // namespace ferry::trainer
