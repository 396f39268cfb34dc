// ferry.torch's bags (ps/client/python/bags.h) against a plain reference: pooling and its
// gradient per bag and id, sum and mean, weights, empty bags; deduplication in order of first
// appearance; every refusal names the table and the problem.
#include "bags.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace ferry::python {
namespace {

struct Case {
  std::vector<int64_t> ids, starts;
  std::vector<float> weights;
  int64_t dim;
  bool mean;
};

Case RandomCase(uint32_t seed, bool weighted, bool mean) {
  std::mt19937 g(seed);
  Case c{{}, {}, {}, 5, mean};
  for (int b = 0; b < 40; ++b) {
    c.starts.push_back(static_cast<int64_t>(c.ids.size()));
    const int size = static_cast<int>(g() % 5);  // empty bags too
    for (int j = 0; j < size; ++j) c.ids.push_back(static_cast<int64_t>(g() % 23) - 7);  // negative ids too
  }
  if (weighted) {
    for (size_t j = 0; j < c.ids.size(); ++j) c.weights.push_back(0.25f + static_cast<float>(g() % 8) / 4);
  }
  return c;
}

StatusOr<TableBags> Make(const Case& c, std::string_view table = "t") {
  absl::flat_hash_map<int64_t, int32_t> scratch;
  return TableBags::Make({.table = table, .ids = c.ids, .starts = c.starts,
                          .weights = c.weights.empty() ? nullptr : c.weights.data(), .dim = c.dim, .mean = c.mean},
                         &scratch);
}

TEST(TableBags, PoolsAndDifferentiatesAsAPlainLoopOverBagsAndIds) {
  for (const auto& [weighted, mean] : {std::pair{false, false}, {false, true}, {true, false}}) {
    SCOPED_TRACE(testing::Message() << "weighted " << weighted << " mean " << mean);
    const Case c = RandomCase(7, weighted, mean);
    auto t = Make(c);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const std::vector<int64_t>& distinct = t->distinct();
    const int64_t dim = c.dim, bags = static_cast<int64_t>(c.starts.size()), n = static_cast<int64_t>(c.ids.size());
    ASSERT_EQ(t->num_bags(), bags);
    auto row_of = [&](int64_t id) {
      return static_cast<int64_t>(std::find(distinct.begin(), distinct.end(), id) - distinct.begin());
    };
    std::vector<float> rows(distinct.size() * dim);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 11) - 3.5f;
    std::vector<float> out(bags * dim, -1.0f), want(bags * dim, 0.0f);
    t->Pool(rows.data(), out.data());
    std::vector<float> dout(bags * dim), grads(distinct.size() * dim, 99.0f), want_grads(distinct.size() * dim, 0.0f);
    for (size_t i = 0; i < dout.size(); ++i) dout[i] = static_cast<float>(i % 7) * 0.5f - 1.0f;
    t->RowGradients(dout.data(), dim, grads.data());
    for (int64_t b = 0; b < bags; ++b) {
      const int64_t lo = c.starts[b], hi = b + 1 < bags ? c.starts[b + 1] : n;
      for (int64_t j = lo; j < hi; ++j) {
        const int64_t r = row_of(c.ids[j]);
        ASSERT_LT(r, static_cast<int64_t>(distinct.size()));
        const float w = weighted ? c.weights[j] : mean ? 1.0f / static_cast<float>(hi - lo) : 1.0f;
        for (int64_t d = 0; d < dim; ++d) {
          want[b * dim + d] += (weighted ? c.weights[j] : 1.0f) * rows[r * dim + d];
          want_grads[r * dim + d] += w * dout[b * dim + d];
        }
      }
      if (mean && hi > lo) {
        for (int64_t d = 0; d < dim; ++d) want[b * dim + d] /= static_cast<float>(hi - lo);
      }
    }
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-5f) << "out " << i;
    for (size_t i = 0; i < grads.size(); ++i) EXPECT_NEAR(grads[i], want_grads[i], 1e-5f) << "grad " << i;
  }
}

TEST(TableBags, ReadsAGradientWhoseRowsAreAColumnBlockOfAWiderOne) {
  const Case c = RandomCase(11, false, true);
  auto t = Make(c);
  ASSERT_TRUE(t.ok());
  const int64_t dim = c.dim, bags = t->num_bags(), wide = 3 * dim;
  std::vector<float> dout(bags * dim), block(bags * wide, 1e9f);  // block: columns [dim, 2 dim) of wide rows
  for (int64_t b = 0; b < bags; ++b) {
    for (int64_t d = 0; d < dim; ++d) block[b * wide + dim + d] = dout[b * dim + d] = static_cast<float>(b - d);
  }
  std::vector<float> want(t->distinct().size() * dim), got(want.size());
  t->RowGradients(dout.data(), dim, want.data());
  t->RowGradients(block.data() + dim, wide, got.data());
  EXPECT_EQ(got, want);
}

TEST(TableBags, DistinctIdsComeInOrderOfFirstAppearance) {
  auto t = Make({{9, -2, 9, 4, -2, 0}, {0, 3}, {}, 2, false});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->distinct(), (std::vector<int64_t>{9, -2, 4, 0}));
  EXPECT_EQ(t->num_ids(), 6);
  // No ids, no bags: nothing to pool, and a table that takes part in a step with nothing.
  auto none = Make({{}, {}, {}, 3, true});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->num_bags(), 0);
  EXPECT_TRUE(none->distinct().empty());
}

TEST(TableBags, RefusalsNameTheTableAndTheProblem) {
  const std::vector<std::pair<Case, std::string>> cases = {
      {{{1, 2}, {1}, {}, 2, false}, "table 'user': offsets must start at 0, not 1"},
      {{{1, 2, 3}, {0, 2, 1}, {}, 2, false},
       "table 'user': offsets must not decrease: offsets[2] = 1 < offsets[1] = 2"},
      {{{1, 2}, {0, 3}, {}, 2, false}, "table 'user': offsets run past the end of the ids: offsets[1] = 3 > 2 ids"},
      {{{1, 2}, {}, {}, 2, false}, "table 'user': 2 ids but no offsets (no bags)"},
      {{{1, 2}, {0}, {1.0f, std::nanf("")}, 2, false}, "table 'user': per_sample_weights hold NaN or Inf"},
      {{{1, 2}, {0}, {1.0f, 1.0f}, 2, true}, "table 'user': per-sample weights need sum pooling, not mean"},
      {{{1, 2}, {0}, {}, 0, false}, "table 'user': dim must be >= 1, not 0"},
  };
  for (const auto& [c, message] : cases) {
    auto t = Make(c, "user");
    ASSERT_FALSE(t.ok()) << message;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.status().message(), message);
  }
}

}  // namespace
}  // namespace ferry::python
