// The change feed's part of a sparse shard (SparseShard::StartFeed, Cut, ScanChanged,
// EvictedSince): a scan in pages of a few units of work finds exactly the rows made or updated
// after a cut, passing unchanged blocks over; evictions are logged with the clock, the log has a
// bound past which a reader from before it needs everything; the feed's memory is charged.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/table_spec.h"
#include "internal/memory_budget.h"
#include "internal/tables.h"

namespace ferry::ps {
namespace {

constexpr uint64_t kTableId = 0xfeed;
constexpr int64_t kDim = 2;

TableSpec Spec() {
  TableSpec s;
  s.name = "emb";
  s.type = TableType::kSparse;
  s.dim = kDim;
  s.optimizer.learning_rate = 1.0f;
  s.consistency = Consistency::kAsync;
  return s;
}

void Push(SparseShard& shard, const std::vector<int64_t>& ids, float g = 1.0f) {
  std::vector<float> grads(ids.size() * kDim, g);
  std::vector<RowIndex> rows;
  shard.ApplyRows(ids, grads.data(), &rows);
}

// Every row stamped after `after`, scanning in pages of `work` units; `*pages` counts them.
std::vector<int64_t> ScanAll(const SparseShard& shard, int64_t after, uint64_t work, int* pages,
                             std::vector<float>* values = nullptr) {
  std::vector<int64_t> ids;
  std::vector<float> scratch;
  uint64_t from = 0;
  *pages = 0;
  do {
    from = shard.ScanChanged(after, from, 1000, work, &ids, values ? values : &scratch);
    ++*pages;
  } while (from != 0 && *pages < 100000);
  return ids;
}

TEST(FeedShard, AScanInPagesFindsExactlyTheRowsChangedAfterTheCut) {
  const TableSpec spec = Spec();
  SparseShard shard(spec, kTableId, 1);
  std::vector<int64_t> all(5000);
  for (int64_t i = 0; i < 5000; ++i) all[static_cast<size_t>(i)] = i;
  Push(shard, all, 0.0f);
  ASSERT_TRUE(shard.StartFeed().ok());
  int pages = 0;
  EXPECT_EQ(ScanAll(shard, -1, 1 << 20, &pages).size(), 5000u);  // everything
  EXPECT_EQ(pages, 5);  // (1000 rows a page)
  const int64_t cut = shard.Cut();
  Push(shard, {3, 2500, 4999, 7000});  // 7000: a new row
  std::vector<float> values;
  std::vector<int64_t> got = ScanAll(shard, cut, 3, &pages, &values);
  EXPECT_GT(pages, 1);
  std::vector<int64_t> sorted = got;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int64_t>{3, 2500, 4999, 7000}));
  for (size_t i = 0; i < got.size(); ++i) {
    const float* row = shard.row(shard.Find(got[i]));
    EXPECT_EQ(values[i * kDim], row[0]);
    EXPECT_EQ(values[i * kDim + 1], row[1]);
  }
  // Unchanged blocks are passed over at one unit each: an idle round of 5001 slots (5 blocks of
  // 1024) takes one page of 8 units.
  const int64_t cut2 = shard.Cut();
  EXPECT_TRUE(ScanAll(shard, cut2, 8, &pages).empty());
  EXPECT_EQ(pages, 1);
  // The older cut still sees what changed after it.
  EXPECT_EQ(ScanAll(shard, cut, 1 << 20, &pages).size(), 4u);
}

// A row given up in a placement hand-over (Forget) before the feed starts leaves a slot without a
// row: a reader's first, full round passes it by (not "id 0" with the departed row's values), and a
// new row that takes the slot is found by its own id.
TEST(FeedShard, AFirstRoundPassesBySlotsOfRowsGivenUp) {
  const TableSpec spec = Spec();
  SparseShard shard(spec, kTableId, 1);
  Push(shard, {10, 11, 12, 13});
  shard.Forget(11);
  shard.Forget(12);
  ASSERT_TRUE(shard.StartFeed().ok());
  int pages = 0;
  std::vector<int64_t> got = ScanAll(shard, -1, 1 << 20, &pages);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<int64_t>{10, 13}));
  const int64_t cut = shard.Cut();
  Push(shard, {20});  // takes a given-up slot
  EXPECT_EQ(shard.slots(), 4u);
  EXPECT_EQ(ScanAll(shard, cut, 1 << 20, &pages), (std::vector<int64_t>{20}));
  got = ScanAll(shard, -1, 1 << 20, &pages);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<int64_t>{10, 13, 20}));
}

TEST(FeedShard, EvictionsAreLoggedAndTheLogHasABound) {
  TableSpec spec = Spec();
  spec.max_rows = 10;  // row lifecycle: a new row past 10 evicts one
  SparseShard shard(spec, kTableId, 1);
  std::vector<int64_t> first(10);
  for (int64_t i = 0; i < 10; ++i) first[static_cast<size_t>(i)] = i;
  Push(shard, first);
  ASSERT_TRUE(shard.StartFeed().ok());
  EXPECT_EQ(shard.FeedRowBytes(), 8);  // lifecycle slots know their ids
  const int64_t cut = shard.Cut();
  for (int64_t i = 10; i < 20; ++i) Push(shard, {i});
  std::vector<int64_t> evicted;
  shard.EvictedSince(cut, &evicted);
  EXPECT_EQ(evicted.size(), 10u);
  for (int64_t id : evicted) EXPECT_EQ(shard.Find(id), kNoRow) << id;
  // The rows made since and still held (a new row may have been a later one's victim).
  std::vector<int64_t> held;
  for (int64_t i = 10; i < 20; ++i) {
    if (shard.Find(i) != kNoRow) held.push_back(i);
  }
  int pages = 0;
  std::vector<int64_t> got = ScanAll(shard, cut, 1 << 20, &pages);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, held);
  EXPECT_EQ(shard.feed_log_floor(), -1);
  // Past max(4096, slots) evictions the oldest half goes: a reader from `cut` needs everything
  // (the handler's rule: a cursor below the floor gets a full round).
  shard.Cut();
  for (int64_t i = 20; i < 5000; ++i) Push(shard, {i});
  EXPECT_GT(shard.feed_log_floor(), cut);
}

TEST(FeedShard, TheFeedIsChargedToTheMemoryBudget) {
  const TableSpec spec = Spec();
  MemoryBudget budget(int64_t{1} << 30);
  SparseShard shard(spec, kTableId, 1, &budget);
  std::vector<int64_t> ids(1000);
  for (int64_t i = 0; i < 1000; ++i) ids[static_cast<size_t>(i)] = i;
  Push(shard, ids);
  const int64_t before = budget.used();
  ASSERT_TRUE(shard.StartFeed().ok());
  EXPECT_EQ(budget.used() - before, 1000 * shard.FeedRowBytes());
  EXPECT_EQ(shard.FeedRowBytes(), 16);

  MemoryBudget tight(1);
  SparseShard small(spec, kTableId, 1, &tight);
  std::vector<float> grads(kDim, 1.0f);
  std::vector<RowIndex> rows;
  small.ApplyRows(std::vector<int64_t>{1}, grads.data(), &rows, /*over_budget_ok=*/true);
  const Status s = small.StartFeed();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_FALSE(small.feeding());
}

}  // namespace
}  // namespace ferry::ps
