// StatusOr::value() on an error dies loudly, with the status, in every build type (this suite is
// built with -DNDEBUG in the default RelWithDebInfo build, so an assert alone would not fire).
#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "ferry/status.h"

namespace ferry {
namespace {

StatusOr<std::string> Missing() { return NotFoundError("no table named emb"); }

TEST(StatusOrDeathTest, ValueOfAnErrorPrintsTheStatusAndAborts) {
  StatusOr<std::string> s = Missing();
  EXPECT_DEATH((void)s.value(), "value\\(\\) called on an error: NOT_FOUND: no table named emb");
  const StatusOr<std::string>& cs = s;
  EXPECT_DEATH((void)cs.value(), "NOT_FOUND: no table named emb");
  EXPECT_DEATH((void)std::move(s).value(), "NOT_FOUND: no table named emb");
  EXPECT_DEATH((void)*Missing(), "NOT_FOUND: no table named emb");
  StatusOr<std::unique_ptr<int>> p = InternalError("broken");
  EXPECT_DEATH((void)p->get(), "INTERNAL: broken");
}

TEST(StatusOr, ValueOfAnOkResultIsTheValue) {
  StatusOr<std::string> s = std::string("x");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s.value(), "x");
  EXPECT_EQ(*s, "x");
  EXPECT_EQ(std::move(s).value(), "x");
}

TEST(Status, WithContextKeepsTheCode) {
  Status s = DataLossError("bad magic").WithContext("/tmp/f");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.ToString(), "DATA_LOSS: /tmp/f: bad magic");
  EXPECT_TRUE(Status::Ok().WithContext("x").ok());
}

}  // namespace
}  // namespace ferry
