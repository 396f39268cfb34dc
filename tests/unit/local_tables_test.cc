// ferry::ps::LocalTables: the servers' arithmetic in one process (the trainer's --local store).
#include "ferry/local_tables.h"

#include <vector>

#include <gtest/gtest.h>

namespace ferry::ps {
namespace {

TableSpec Dense(const char* name) {
  TableSpec s;
  s.name = name;
  s.type = TableType::kDense;
  s.shape = {2, 3};
  s.init = InitType::kConstant;
  s.init_scale = 1.0f;
  s.optimizer.type = OptimizerType::kSgd;
  s.optimizer.learning_rate = 0.5f;
  return s;
}

TableSpec Sparse(const char* name) {
  TableSpec s;
  s.name = name;
  s.type = TableType::kSparse;
  s.dim = 2;
  s.init = InitType::kConstant;
  s.init_scale = 3.0f;
  s.optimizer.type = OptimizerType::kSgd;
  s.optimizer.learning_rate = 1.0f;
  return s;
}

TEST(LocalTables, DenseStartsAtItsInitAndTakesOptimizerUpdates) {
  auto t = LocalTables::Create();
  ASSERT_TRUE(t->Declare(Dense("w")).ok());
  std::vector<float> v(6);
  ASSERT_TRUE(t->ReadDense("w", v).ok());
  EXPECT_EQ(v, std::vector<float>(6, 1.0f));
  const std::vector<float> g = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(t->ApplyDense("w", g, 1).ok());
  ASSERT_TRUE(t->ReadDense("w", v).ok());
  EXPECT_EQ(v, (std::vector<float>{0.5f, 0.0f, -0.5f, -1.0f, -1.5f, -2.0f}));  // p -= 0.5 g
}

TEST(LocalTables, SparseRowsAreCreatedOnFirstTouchAndUpdatedPerRow) {
  auto t = LocalTables::Create();
  ASSERT_TRUE(t->Declare(Sparse("emb")).ok());
  const std::vector<int64_t> ids = {7, -3};
  const std::vector<float> g = {1, 2, 0.5f, 0};
  ASSERT_TRUE(t->ApplyRows("emb", ids, g).ok());  // rows made at init 3, then p -= g
  std::vector<float> rows(6);
  const std::vector<int64_t> read = {-3, 7, 100};
  ASSERT_TRUE(t->ReadRows("emb", read, rows).ok());
  EXPECT_EQ(rows, (std::vector<float>{2.5f, 3.0f, 2.0f, 1.0f, 3.0f, 3.0f}));
}

TEST(LocalTables, MistakesAreNamedErrors) {
  auto t = LocalTables::Create();
  ASSERT_TRUE(t->Declare(Dense("w")).ok());
  ASSERT_TRUE(t->Declare(Sparse("emb")).ok());
  EXPECT_EQ(t->Declare(Dense("w")).code(), StatusCode::kAlreadyExists);
  TableSpec bad = Dense("bad");
  bad.shape = {};
  EXPECT_EQ(t->Declare(bad).code(), StatusCode::kInvalidArgument);

  std::vector<float> five(5), four(4);
  const std::vector<int64_t> ids = {1, 2};
  Status s = t->ReadDense("nope", five);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("'nope' was not declared"), std::string::npos) << s.ToString();
  s = t->ReadDense("w", five);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("has 6 elements, the buffer 5"), std::string::npos) << s.ToString();
  EXPECT_EQ(t->ReadDense("emb", five).code(), StatusCode::kInvalidArgument);  // sparse, not dense
  EXPECT_EQ(t->ReadRows("w", ids, four).code(), StatusCode::kInvalidArgument);  // dense, not sparse
  s = t->ApplyRows("emb", ids, five);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("2 ids of dim 2 need 4 floats, the buffer has 5"), std::string::npos) << s.ToString();
  // A refused call changed nothing.
  std::vector<float> rows(4);
  ASSERT_TRUE(t->ReadRows("emb", ids, rows).ok());
  EXPECT_EQ(rows, std::vector<float>(4, 3.0f));
}

}  // namespace
}  // namespace ferry::ps
