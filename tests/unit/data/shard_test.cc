// Sharding: every example exactly once per epoch across workers, deterministic shuffles.
#include "ferry/data/shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace ferry::data {
namespace {

TEST(ShardTest, EveryExampleExactlyOncePerEpoch) {
  for (int64_t n : {0, 1, 2, 7, 100, 1001}) {
    for (int m = 1; m <= 5; ++m) {
      for (bool shuffle : {false, true}) {
        for (int64_t epoch = 0; epoch < 3; ++epoch) {
          std::vector<int64_t> all;
          for (int r = 0; r < m; ++r) {
            StatusOr<std::vector<int64_t>> mine = EpochIndices(n, {r, m}, epoch, {shuffle, 7});
            ASSERT_TRUE(mine.ok()) << mine.status();
            EXPECT_EQ(static_cast<int64_t>(mine->size()), ShardSize(n, {r, m}));
            // Shard sizes differ by at most one.
            EXPECT_LE(static_cast<int64_t>(mine->size()), (n + m - 1) / m);
            EXPECT_GE(static_cast<int64_t>(mine->size()), n / m);
            all.insert(all.end(), mine->begin(), mine->end());
          }
          std::sort(all.begin(), all.end());
          std::vector<int64_t> expected(static_cast<size_t>(n));
          std::iota(expected.begin(), expected.end(), int64_t{0});
          EXPECT_EQ(all, expected) << "n=" << n << " m=" << m << " shuffle=" << shuffle << " epoch=" << epoch;
        }
      }
    }
  }
}

TEST(ShardTest, UnshuffledIsStrided) {
  StatusOr<std::vector<int64_t>> mine = EpochIndices(10, {1, 3}, 0, {false, 0});
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(*mine, (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(ShardSize(10, {0, 3}), 4);
  EXPECT_EQ(ShardSize(10, {1, 3}), 3);
  EXPECT_EQ(ShardSize(10, {2, 3}), 3);
  EXPECT_EQ(ShardSize(2, {2, 3}), 0);
}

TEST(ShardTest, ShuffleIsDeterministicAndPinned) {
  // Pinned: the permutation is part of the reproducibility contract (computed independently from
  // the SplitMix64 / Fisher–Yates definition).
  EXPECT_EQ(EpochPermutation(10, 0, {true, 42}), (std::vector<int64_t>{6, 1, 8, 5, 2, 7, 4, 3, 9, 0}));
  EXPECT_EQ(EpochPermutation(10, 1, {true, 42}), (std::vector<int64_t>{8, 2, 4, 0, 9, 1, 7, 3, 5, 6}));

  const std::vector<int64_t> a = EpochPermutation(1000, 3, {true, 5});
  EXPECT_EQ(a, EpochPermutation(1000, 3, {true, 5}));
  EXPECT_NE(a, EpochPermutation(1000, 4, {true, 5}));  // a new order every epoch
  EXPECT_NE(a, EpochPermutation(1000, 3, {true, 6}));  // and per seed
  // Shard r's list is positions r, r + M, ... of the epoch order.
  StatusOr<std::vector<int64_t>> mine = EpochIndices(1000, {2, 3}, 3, {true, 5});
  ASSERT_TRUE(mine.ok());
  for (size_t k = 0; k < mine->size(); ++k) EXPECT_EQ((*mine)[k], a[2 + 3 * k]);
}

TEST(ShardTest, ShuffleIsRoughlyUniform) {
  // Where element 0 lands in a permutation of 8, over 8000 epochs: ~1000 per position.
  std::vector<int> landed(8, 0);
  for (int64_t epoch = 0; epoch < 8000; ++epoch) {
    const std::vector<int64_t> order = EpochPermutation(8, epoch, {true, 11});
    landed[static_cast<size_t>(std::find(order.begin(), order.end(), 0) - order.begin())]++;
  }
  for (int count : landed) {
    EXPECT_GT(count, 850);
    EXPECT_LT(count, 1150);
  }
}

TEST(ShardTest, InvalidSpecs) {
  EXPECT_EQ(EpochIndices(10, {-1, 2}, 0, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EpochIndices(10, {2, 2}, 0, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EpochIndices(10, {0, 0}, 0, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EpochIndices(-1, {0, 1}, 0, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((ShardSpec{1, 2}).Validate().ok());
}

TEST(ShardTest, WorkersThatLeaveHandTheirShareToTheOthersAndEveryExampleIsStillReadOncePerEpoch) {
  // 1003 examples, 4 workers, steps of 10 examples a worker: 25 steps an epoch (the smallest shard
  // has 250), the last one taking the rest (the first 3 shards hold 251). Worker 1 leaves before
  // step 7 and worker 3 before step 31 (epoch 1), as ferry-trainer --leave 1@7,3@31 reads them:
  // from its step on, each step's slice of a worker that left is split among the workers that
  // remain (StepBatch, which the trainer calls).
  constexpr int64_t kN = 1003, kStep = 10, kStepsPerEpoch = 25;
  constexpr int kWorkers = 4;
  auto leave_step = [](int w) -> int64_t { return w == 1 ? 7 : w == 3 ? 31 : -1; };
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::vector<int64_t>> orders;
    for (int w = 0; w < kWorkers; ++w) orders.push_back(*EpochIndices(kN, {w, kWorkers}, epoch, {true, 9}));
    std::vector<int> reads(kN, 0);
    for (int64_t k = 0; k < kStepsPerEpoch; ++k) {
      const int64_t t = epoch * kStepsPerEpoch + k;
      std::vector<int> present;
      for (int w = 0; w < kWorkers; ++w) {
        if (leave_step(w) < 0 || t < leave_step(w)) present.push_back(w);
      }
      size_t read_this_step = 0, slices_this_step = 0;
      for (int w = 0; w < kWorkers; ++w) {
        const std::span<const int64_t> slice = StepSlice(orders[static_cast<size_t>(w)], k, kStepsPerEpoch, kStep);
        EXPECT_EQ(slice.size(), k + 1 < kStepsPerEpoch ? 10u : w < 3 ? 11u : 10u);  // the rest of 251 or 250
        slices_this_step += slice.size();
      }
      for (int rank : present) {
        // Only the orders of `rank` and of the absent workers are needed.
        std::vector<const std::vector<int64_t>*> needed(kWorkers, nullptr);
        for (int w = 0; w < kWorkers; ++w) {
          if (w == rank || std::find(present.begin(), present.end(), w) == present.end()) {
            needed[static_cast<size_t>(w)] = &orders[static_cast<size_t>(w)];
          }
        }
        const std::vector<int64_t> batch = StepBatch(rank, present, needed, k, kStepsPerEpoch, kStep);
        // Its own slice first, then a part of each absent worker's (10 / 3 or 10 / 2 examples of 10 or 11).
        const std::span<const int64_t> own = StepSlice(orders[static_cast<size_t>(rank)], k, kStepsPerEpoch, kStep);
        ASSERT_GE(batch.size(), own.size());
        EXPECT_TRUE(std::equal(own.begin(), own.end(), batch.begin()));
        EXPECT_LE(batch.size(), own.size() + (kWorkers - present.size()) * (kStep / 2 + 1));
        for (int64_t id : batch) ++reads[static_cast<size_t>(id)];
        read_this_step += batch.size();
      }
      EXPECT_EQ(read_this_step, slices_this_step) << "step " << t;  // the step's examples, as if none left
    }
    for (int64_t id = 0; id < kN; ++id) {
      ASSERT_EQ(reads[static_cast<size_t>(id)], 1) << "example " << id << " epoch " << epoch;
    }
  }
  // The split itself: contiguous, in order, sizes differing by at most one.
  const std::vector<int64_t> slice = {10, 11, 12, 13, 14, 15, 16};
  std::vector<int64_t> a, b, c;
  AppendLeftShare(slice, 0, 3, &a);
  AppendLeftShare(slice, 1, 3, &b);
  AppendLeftShare(slice, 2, 3, &c);
  EXPECT_EQ(a, (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(b, (std::vector<int64_t>{12, 13}));
  EXPECT_EQ(c, (std::vector<int64_t>{14, 15, 16}));
}

}  // namespace
}  // namespace ferry::data
