// Nearest(): the suggestion for a misspelled flag or key.
#include "ferry/nearest.h"

#include <string_view>

#include <gtest/gtest.h>

namespace ferry {
namespace {

constexpr std::string_view kKeys[] = {"lr", "optimizer", "consistency", "wire", "momentum", "l1", "l2", "beta1"};

TEST(Nearest, FindsTheLikelyMisspelling) {
  EXPECT_EQ(Nearest("optimiser", kKeys), "optimizer");    // a substitution
  EXPECT_EQ(Nearest("consistncy", kKeys), "consistency");  // a deletion
  EXPECT_EQ(Nearest("momentumm", kKeys), "momentum");     // an insertion
  EXPECT_EQ(Nearest("wrie", kKeys), "wire");              // a swap of neighbours
  EXPECT_EQ(Nearest("l3", kKeys), "lr");                  // ties (lr, l1, l2) go to the earliest name
}

TEST(Nearest, SuggestsNothingForAWordTooFarFromEveryName) {
  EXPECT_EQ(Nearest("learning_rate", kKeys), "");
  EXPECT_EQ(Nearest("zz", kKeys), "");
  EXPECT_EQ(Nearest("x", {}), "");
  EXPECT_EQ(DidYouMean("zz", kKeys), "");
  EXPECT_EQ(DidYouMean("optimiser", kKeys), " (did you mean optimizer?)");
  EXPECT_EQ(JoinNames(std::span<const std::string_view>(kKeys).first(3)), "lr, optimizer, consistency");
}

}  // namespace
}  // namespace ferry
