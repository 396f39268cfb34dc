// Placement is stable (fixed values, independent of process and build) and balanced; table
// specs validate and parse.
#include <vector>

#include <gtest/gtest.h>

#include "ferry/table_spec.h"
#include "ferry/messages/placement.h"
#include "internal/init.h"

namespace ferry {
namespace {

TEST(Placement, TableIdIsFnv1a64OfTheName) {
  EXPECT_EQ(TableId(""), 14695981039346656037ull);
  EXPECT_EQ(TableId("a"), 0xaf63dc4c8601ec8cull);  // the published FNV-1a test vector
}

TEST(Placement, StableAcrossCalls) {
  // Fixed expectations: a change to the placement function changes these and breaks clusters
  // that mix old and new binaries, so it must be deliberate.
  EXPECT_EQ(placement::Mix64(0), 0xe220a8397b1dcdafull);
  for (int64_t id = 0; id < 1000; ++id) EXPECT_EQ(placement::IdServer(id, 7), placement::IdServer(id, 7));
}

TEST(Placement, DenseChunksBalancedWithinOne) {
  for (int servers = 1; servers <= 8; ++servers) {
    for (int64_t chunks : {1, 2, 3, 7, 64, 1000}) {
      std::vector<int> load(static_cast<size_t>(servers), 0);
      for (int64_t c = 0; c < chunks; ++c)
        ++load[static_cast<size_t>(placement::ChunkServer(TableId("t"), c, servers))];
      const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
      EXPECT_LE(*hi - *lo, 1) << servers << " servers, " << chunks << " chunks";
    }
  }
}

TEST(Placement, SparseIdsBalanced) {
  const int servers = 4;
  const int64_t n = 400000;
  std::vector<int64_t> load(servers, 0);
  // Sequential ids (the common case for vocabularies) must still spread evenly.
  for (int64_t id = 0; id < n; ++id) ++load[static_cast<size_t>(placement::IdServer(id, servers))];
  for (int64_t l : load) EXPECT_NEAR(static_cast<double>(l), n / servers, 0.01 * n / servers);
}

TEST(Placement, InitialValuesIndependentOfServerCount) {
  TableSpec s;
  s.name = "w";
  s.shape = {100};
  s.init = InitType::kUniform;
  s.init_scale = 1.0f;
  s.seed = 3;
  std::vector<float> whole(100), parts(100);
  ps::InitDense(s, TableId("w"), 0, whole.data(), 100);
  ps::InitDense(s, TableId("w"), 0, parts.data(), 37);
  ps::InitDense(s, TableId("w"), 37, parts.data() + 37, 63);
  EXPECT_EQ(whole, parts);
  float lo = 1, hi = -1;
  for (float v : whole) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_LT(lo, -0.5f);
  EXPECT_GT(hi, 0.5f);
  EXPECT_GE(lo, -1.0f);
  EXPECT_LT(hi, 1.0f);
}

TEST(TableSpec, ParsesConsistency) {
  Consistency c;
  int32_t s = -1;
  ASSERT_TRUE(ParseConsistency("ssp:3", &c, &s).ok());
  EXPECT_EQ(c, Consistency::kSsp);
  EXPECT_EQ(s, 3);
  ASSERT_TRUE(ParseConsistency("sync", &c, &s).ok());
  EXPECT_EQ(c, Consistency::kSync);
  EXPECT_FALSE(ParseConsistency("ssp:", &c, &s).ok());
  EXPECT_FALSE(ParseConsistency("ssp:-1", &c, &s).ok());
  Status bad = ParseConsistency("eventual", &c, &s);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("eventual"), std::string::npos);
}

TEST(TableSpec, ValidateNamesTheField) {
  TableSpec s;
  s.name = "w";
  EXPECT_NE(s.Validate().message().find("shape"), std::string::npos);
  s.shape = {4, 0};
  EXPECT_NE(s.Validate().message().find("shape[1]"), std::string::npos);
  s.shape = {4, 4};
  EXPECT_TRUE(s.Validate().ok());
  s.replicas_to_aggregate = 2;  // async table
  EXPECT_NE(s.Validate().message().find("replicas_to_aggregate"), std::string::npos);
  EXPECT_EQ(s.num_chunks(), 1);
  s.replicas_to_aggregate = 0;
  s.chunk_elems = 5;
  EXPECT_EQ(s.num_chunks(), 4);
}

}  // namespace
}  // namespace ferry
