// The row lifecycle of a sparse table's shard (TableSpec::admit_after, admit_probability,
// evict_after_steps, max_rows; tables.h): admission by a counting filter and by a deterministic
// coin, age eviction by the incremental sweep, capacity eviction by sampled LRU (hot rows stay),
// slot reuse, the memory budget (a full budget evicts instead of refusing; slots stay charged and
// are given back with the shard), the counters, a checkpoint of a shard that evicted rows, and new
// settings when a job resumes.
// Everything here is deterministic: the shards' samplers and coins are seeded by the spec.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/messages/placement.h"
#include "ferry/table_spec.h"
#include "internal/checkpoint.h"
#include "internal/init.h"
#include "internal/memory_budget.h"
#include "internal/table_registry.h"
#include "internal/tables.h"
#include "support/temp_dir.h"

namespace ferry::ps {
namespace {

constexpr uint64_t kTableId = 0x11fe;
constexpr int64_t kDim = 4;

TableSpec Spec() {
  TableSpec s;
  s.name = "emb";
  s.type = TableType::kSparse;
  s.dim = kDim;
  s.optimizer.type = OptimizerType::kSgd;
  s.optimizer.learning_rate = 0.5f;
  s.consistency = Consistency::kSync;
  s.init = InitType::kUniform;
  s.init_scale = 0.1f;
  s.seed = 3;
  return s;
}

// Pushes gradient 1.0 for every element of `ids`' rows, as one ApplyRows (one step of the clock).
void Push(SparseShard& shard, const std::vector<int64_t>& ids) {
  std::vector<float> grads(ids.size() * kDim, 1.0f);
  std::vector<RowIndex> rows;
  shard.ApplyRows(ids, grads.data(), &rows);
}

std::vector<float> Initial(const TableSpec& spec, int64_t id) {
  std::vector<float> v(kDim);
  InitSparseRow(spec, kTableId, id, v.data());
  return v;
}

// What a pull of `id` serves.
std::vector<float> Pulled(SparseShard& shard, int64_t id) {
  std::vector<float> v(kDim);
  if (const RowIndex r = shard.FindForPull(id); r != kNoRow) {
    std::copy(shard.row(r), shard.row(r) + kDim, v.begin());
  } else {
    shard.InitialRow(id, v.data());
  }
  return v;
}

bool Held(const SparseShard& shard, int64_t id) {
  bool found = false;
  shard.ForEachRow([&](int64_t i, RowIndex) { found = found || i == id; });
  return found;
}

TEST(RowLifecycle, NoSettingsKeepsEveryRowAsBefore) {
  const TableSpec spec = Spec();
  ASSERT_FALSE(spec.has_lifecycle());
  SparseShard shard(spec, kTableId, 1);
  EXPECT_NE(shard.FindForPull(5), kNoRow) << "a pull makes the row, as always";
  Push(shard, {6, 7});
  EXPECT_EQ(shard.size(), 3u);
  EXPECT_EQ(shard.NewRows(std::vector<int64_t>{5, 8, 9}), 2);
  EXPECT_EQ(shard.lifecycle().admitted, 0);
}

TEST(RowLifecycle, AnIdGetsItsRowAtItsNthPushAndPullsMakeNothing) {
  TableSpec spec = Spec();
  spec.admit_after = 3;
  ASSERT_TRUE(spec.Validate().ok());
  MemoryBudget budget(int64_t{1} << 30);
  RowLifecycleTotals totals;
  SparseShard shard(spec, kTableId, 1, &budget, &totals);
  const int64_t id = 42;
  for (int k = 0; k < 2; ++k) {
    for (int p = 0; p < 5; ++p) EXPECT_EQ(Pulled(shard, id), Initial(spec, id)) << "pulls neither count nor make a row";
    Push(shard, {id});
    EXPECT_EQ(shard.size(), 0u) << "push " << k + 1;
  }
  EXPECT_EQ(budget.used(), 0) << "no row, no charge";
  EXPECT_EQ(shard.NewRows(std::vector<int64_t>{id, 43}), 0);
  Push(shard, {id});  // the third: admitted, and this push's gradient applied
  ASSERT_EQ(shard.size(), 1u);
  std::vector<float> want = Initial(spec, id);
  for (float& v : want) v -= 0.5f;  // sgd, lr 0.5, gradient 1
  EXPECT_EQ(Pulled(shard, id), want);
  EXPECT_EQ(shard.steps(shard.FindForPull(id)), 1);
  EXPECT_EQ(shard.lifecycle().admitted, 1);
  EXPECT_EQ(shard.lifecycle().not_admitted, 2);
  EXPECT_EQ(totals.admitted.load(), 1);
  EXPECT_EQ(totals.not_admitted.load(), 2);
  EXPECT_EQ(budget.used(), shard.RowBytes());
}

TEST(RowLifecycle, AdmissionByProbabilityIsWithinBinomialBoundsAndDeterministic) {
  TableSpec spec = Spec();
  spec.admit_probability = 0.25f;
  SparseShard a(spec, kTableId, 1), b(spec, kTableId, 1);
  constexpr int64_t n = 20000;
  for (int64_t step = 0; step < n / 100; ++step) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 100; ++i) ids.push_back(step * 100 + i);
    Push(a, ids);
    Push(b, ids);
  }
  const double mean = n * 0.25, sd = std::sqrt(n * 0.25 * 0.75);
  const int64_t admitted = a.lifecycle().admitted;
  std::printf("admitted %lld of %lld ids pushed once at p = 0.25 (expected %.0f +- %.0f)\n",
              static_cast<long long>(admitted), static_cast<long long>(n), mean, sd);
  EXPECT_NEAR(static_cast<double>(admitted), mean, 5 * sd);
  EXPECT_EQ(static_cast<int64_t>(a.size()), admitted);
  EXPECT_EQ(a.lifecycle().not_admitted, n - admitted);
  std::set<int64_t> in_a, in_b;
  a.ForEachRow([&](int64_t id, RowIndex) { in_a.insert(id); });
  b.ForEachRow([&](int64_t id, RowIndex) { in_b.insert(id); });
  EXPECT_EQ(in_a, in_b) << "the same pushes admit the same ids";
  // An id pushed again and again is admitted soon: 1 - 0.75^k.
  int64_t repeated = 0;
  for (int k = 0; k < 40; ++k) {
    Push(a, {-7});
    repeated += Held(a, -7) ? 0 : 1;
  }
  EXPECT_TRUE(Held(a, -7));
  EXPECT_LT(repeated, 40);
}

TEST(RowLifecycle, RowsUntouchedForTStepsAreEvictedAndTheirSlotsReused) {
  TableSpec spec = Spec();
  spec.evict_after_steps = 5;
  MemoryBudget budget(int64_t{1} << 30);
  SparseShard shard(spec, kTableId, 1, &budget);
  Push(shard, {1, 2, 3});  // clock 1
  for (int step = 2; step <= 5; ++step) Push(shard, {1});
  EXPECT_EQ(shard.size(), 3u) << "within 5 steps: kept";
  EXPECT_EQ(Pulled(shard, 3)[0], Initial(spec, 3)[0] - 0.5f);  // pulled at clock 5: 3 is touched
  for (int step = 6; step <= 7; ++step) Push(shard, {1});
  // Clock 7: row 2, last touched at clock 1, is 6 steps old; row 3 was pulled at clock 5.
  EXPECT_TRUE(Held(shard, 1));
  EXPECT_FALSE(Held(shard, 2));
  EXPECT_TRUE(Held(shard, 3));
  EXPECT_EQ(shard.lifecycle().evicted_age, 1);
  EXPECT_EQ(Pulled(shard, 2), Initial(spec, 2)) << "an evicted row serves its initial values again";
  const size_t slots = shard.slots();
  Push(shard, {9});  // reuses the freed slot
  EXPECT_EQ(shard.slots(), slots);
  EXPECT_EQ(budget.used(), static_cast<int64_t>(slots) * shard.RowBytes()) << "slots stay charged";
}

TEST(RowLifecycle, AgeIsCountedInStepsOfAllWorkersForAsyncTables) {
  TableSpec spec = Spec();
  spec.consistency = Consistency::kAsync;
  spec.evict_after_steps = 2;
  SparseShard shard(spec, kTableId, /*num_workers=*/4);
  Push(shard, {1, 2});
  for (int push = 0; push < 8; ++push) Push(shard, {1});  // clock 9: row 2 is 8 pushes (2 steps of 4 workers) old
  EXPECT_TRUE(Held(shard, 2));
  Push(shard, {1});  // 9 pushes old: more than 2 steps
  EXPECT_FALSE(Held(shard, 2));
}

TEST(RowLifecycle, AtMaxRowsNewRowsReplaceColdOnesAndHotOnesStay) {
  TableSpec spec = Spec();
  spec.max_rows = 1000;
  MemoryBudget budget(int64_t{1} << 30);
  RowLifecycleTotals totals;
  SparseShard shard(spec, kTableId, 1, &budget, &totals);
  std::vector<int64_t> hot;
  for (int64_t i = 0; i < 100; ++i) hot.push_back(1'000'000 + i);
  int64_t fresh = 0;
  for (int step = 0; step < 300; ++step) {
    // The new ids first: the hot rows are not yet in use by this push when the new ones look for
    // victims (rows of the push in progress are never victims).
    std::vector<int64_t> ids;
    for (int i = 0; i < 200; ++i) ids.push_back(fresh++);  // a new id every time
    ids.insert(ids.end(), hot.begin(), hot.end());
    Push(shard, ids);
    ASSERT_LE(shard.size(), 1000u) << "step " << step;
    ASSERT_LE(shard.slots(), 1000u) << "step " << step;
  }
  for (int64_t id : hot) EXPECT_TRUE(Held(shard, id)) << "hot id " << id;
  for (int64_t id : hot) EXPECT_EQ(shard.steps(shard.FindForPull(id)), 300) << "hot id " << id << " kept every update";
  const RowLifecycleCounts& c = shard.lifecycle();
  EXPECT_EQ(c.admitted, 100 + fresh);
  EXPECT_EQ(c.evicted_capacity, c.admitted - static_cast<int64_t>(shard.size()));
  EXPECT_EQ(c.not_admitted, 0);
  EXPECT_EQ(totals.evicted_capacity.load(), c.evicted_capacity);
  EXPECT_EQ(budget.used(), 1000 * shard.RowBytes());
  std::printf("max_rows 1000: %lld rows made, %lld evicted, %zu held, all 100 hot rows kept\n",
              static_cast<long long>(c.admitted), static_cast<long long>(c.evicted_capacity), shard.size());
}

// With a filter, a full table trades a row for a new one only if the new id was pushed more often
// (TinyLFU): a stream of ids pushed twice does not displace rows pushed three times, one pushed
// five times does.
TEST(RowLifecycle, AFullTableWithAFilterKeepsRowsPushedMoreOftenThanTheNewcomer) {
  TableSpec spec = Spec();
  spec.admit_after = 2;
  spec.max_rows = 10;
  SparseShard shard(spec, kTableId, 1);
  std::vector<int64_t> settled;
  for (int64_t i = 0; i < 10; ++i) settled.push_back(100 + i);
  for (int k = 0; k < 3; ++k) Push(shard, settled);  // admitted at their second push; 3 pushes each
  ASSERT_EQ(shard.size(), 10u);
  for (int64_t id = 1000; id < 1200; ++id) {
    Push(shard, {id});
    Push(shard, {id});  // its second push: admitted by the filter, but not hotter than a victim
  }
  EXPECT_EQ(shard.lifecycle().evicted_capacity, 0);
  EXPECT_EQ(shard.lifecycle().not_admitted, 10 + 400);  // (the settled ids' first pushes too)
  for (int64_t id : settled) EXPECT_TRUE(Held(shard, id)) << id;
  for (int k = 0; k < 5; ++k) Push(shard, {7});  // pushes 2 and 3 lose to the victims; push 4 wins
  EXPECT_TRUE(Held(shard, 7));
  EXPECT_EQ(shard.steps(shard.FindForPull(7)), 2) << "admitted at its 4th push";
  EXPECT_EQ(shard.lifecycle().evicted_capacity, 1);
  EXPECT_EQ(shard.size(), 10u);
}

TEST(RowLifecycle, APushWithMoreNewIdsThanMaxRowsStoresWhatFitsAndCountsTheRest) {
  TableSpec spec = Spec();
  spec.max_rows = 4;
  SparseShard shard(spec, kTableId, 1);
  Push(shard, {1, 2, 3, 4, 5, 6});  // every row of this push is in use: no victim for 5 and 6
  EXPECT_EQ(shard.size(), 4u);
  EXPECT_EQ(shard.lifecycle().not_admitted, 2);
  Push(shard, {7});  // the next push evicts the least recently used: any of 1..4 (all of clock 1)
  EXPECT_EQ(shard.size(), 4u);
  EXPECT_TRUE(Held(shard, 7));
  EXPECT_EQ(shard.lifecycle().evicted_capacity, 1);
}

TEST(RowLifecycle, AFullMemoryBudgetEvictsInsteadOfRefusingAndTheShardGivesItBack) {
  TableSpec spec = Spec();
  spec.evict_after_steps = 1'000'000;  // lifecycle on, but no age eviction in this test
  const int64_t row_bytes = SparseShard(spec, kTableId, 1).RowBytes();
  MemoryBudget budget(10 * row_bytes);
  {
    SparseShard shard(spec, kTableId, 1, &budget);
    for (int64_t step = 0; step < 50; ++step) Push(shard, {step, 1000});  // 1000: hot
    EXPECT_EQ(shard.size(), 10u);
    EXPECT_EQ(budget.used(), 10 * row_bytes);
    EXPECT_TRUE(Held(shard, 1000));
    EXPECT_EQ(shard.lifecycle().evicted_capacity, 41);
    EXPECT_EQ(shard.lifecycle().not_admitted, 0);
    EXPECT_EQ(budget.refusals(), 0) << "a table that can evict is not refused";
    // Restoring a checkpoint (FindOrCreate) also makes room; an untouched table would be refused.
    EXPECT_NE(shard.FindOrCreate(5000), kNoRow);
    TableSpec plain = Spec();
    plain.name = "plain";
    SparseShard other(plain, kTableId + 1, 1, &budget);
    EXPECT_THROW(other.FindOrCreate(1), BudgetExceeded);
  }
  EXPECT_EQ(budget.used(), 0) << "the shard gave its slots back";
}

// A row given up in a placement hand-over (Forget) frees its slot in a table without lifecycle
// settings too: the next new rows take the slots (no new memory, nothing charged again), and the
// delta a checkpoint takes names each row by its own id, never a given-up id whose slot another
// row now holds.
TEST(RowLifecycle, RowsGivenUpWithoutSettingsLeaveSlotsTheNextRowsTake) {
  const TableSpec spec = Spec();
  ASSERT_FALSE(spec.has_lifecycle());
  const int64_t row_bytes = SparseShard(spec, kTableId, 1).RowBytes();
  MemoryBudget budget(1000 * row_bytes);
  SparseShard shard(spec, kTableId, 1, &budget);
  shard.TrackChanges();
  std::vector<int64_t> first(100);
  for (int64_t i = 0; i < 100; ++i) first[static_cast<size_t>(i)] = i;
  Push(shard, first);
  (void)shard.TakeChanges();
  const int64_t used = budget.used();
  EXPECT_EQ(used, 100 * row_bytes);
  for (int64_t id = 0; id < 100; id += 2) shard.Forget(id);  // 50 given up
  Push(shard, {1, 3});                                        // changed, kept
  std::vector<int64_t> fresh;
  for (int64_t i = 0; i < 50; ++i) fresh.push_back(1000 + i);
  // What a request's budget check counts as new memory: none for 50 new ids, one for 51.
  EXPECT_EQ(shard.NewRows(fresh), 0);
  std::vector<int64_t> more = fresh;
  more.push_back(7000);
  EXPECT_EQ(shard.NewRows(more), 1);
  Push(shard, fresh);
  EXPECT_EQ(shard.size(), 100u);
  EXPECT_EQ(shard.slots(), 100u) << "the new rows took the given-up slots";
  EXPECT_EQ(budget.used(), used) << "nothing charged twice";
  Push(shard, {7000});  // no free slot left: a new one, charged
  EXPECT_EQ(shard.slots(), 101u);
  EXPECT_EQ(budget.used(), used + row_bytes);

  const SparseShard::Changes delta = shard.TakeChanges();
  ASSERT_TRUE(delta.complete);
  std::set<int64_t> ids;
  for (const auto& [id, r] : delta.rows) {
    EXPECT_EQ(shard.Find(id), r) << "id " << id << " named by another row's slot";
    ids.insert(id);
  }
  std::set<int64_t> want(fresh.begin(), fresh.end());
  want.insert({1, 3, 7000});
  EXPECT_EQ(ids, want);
  EXPECT_EQ(delta.deleted.size(), 50u);
  EXPECT_EQ(delta.deleted.front(), 0);
  for (int64_t id : fresh) {  // each new row starts from its own initial values (one push)
    std::vector<float> v = Initial(spec, id);
    for (float& x : v) x -= 0.5f;
    EXPECT_EQ(Pulled(shard, id), v) << "id " << id;
  }
}

// A resumed job's new settings (ChangeLifecycle, then the table's spec becomes them, as the
// registry does): admission, the row bound and the filter's share of the budget follow them at
// once; turning the lifecycle off, or a filter the budget has no room for, is refused and changes
// nothing.
TEST(RowLifecycle, ATableTakesNewLifecycleSettingsWhenItsJobResumes) {
  TableSpec spec = Spec();
  spec.admit_after = 3;
  const int64_t filter_bytes = AdmissionFilter::Bytes(spec);
  ASSERT_GT(filter_bytes, 0);
  MemoryBudget budget(filter_bytes + 64 * SparseShard(spec, kTableId, 1).RowBytes());
  ASSERT_TRUE(budget.Take(filter_bytes, "the filter").ok());  // as the registry charges it
  SparseShard shard(spec, kTableId, 1, &budget);
  Push(shard, {1});
  Push(shard, {1});
  EXPECT_FALSE(Held(shard, 1)) << "two pushes of three";

  TableSpec off = spec;
  off.admit_after = 1;
  ASSERT_FALSE(off.has_lifecycle());
  const Status refused = shard.ChangeLifecycle(off);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused;
  TableSpec huge = spec;
  huge.max_rows = int64_t{1} << 30;  // a 16 MiB filter: beyond this budget
  const Status no_room = shard.ChangeLifecycle(huge);
  EXPECT_EQ(no_room.code(), StatusCode::kResourceExhausted) << no_room;
  EXPECT_NE(no_room.message().find("table 'emb': its admission filter"), std::string::npos) << no_room;
  Push(shard, {1});
  EXPECT_TRUE(Held(shard, 1)) << "the third push, counted by the filter kept";

  TableSpec to = spec;
  to.admit_after = 1;
  to.max_rows = 2;
  const int64_t used = budget.used();
  ASSERT_TRUE(shard.ChangeLifecycle(to).ok());
  spec = to;  // the Table's spec, which the shard reads
  EXPECT_EQ(budget.used(), used - filter_bytes) << "the filter is gone, and its bytes given back";
  Push(shard, {2});
  EXPECT_TRUE(Held(shard, 2)) << "admitted at its first push";
  Push(shard, {3});
  EXPECT_EQ(shard.size(), 2u) << "max_rows 2: a new row takes an old one's place";
  EXPECT_TRUE(Held(shard, 3));
}

TEST(RowLifecycle, ACheckpointHoldsTheLiveRowsOnlyAndRestoresThem) {
  TableSpec spec = Spec();
  spec.max_rows = 50;
  spec.evict_after_steps = 20;
  TableRegistry reg(0, 1);
  ASSERT_TRUE(reg.Create(spec, TableId(spec.name), 1).ok());
  SparseShard& shard = *(*reg.Find(TableId(spec.name), TableType::kSparse))->sparse;
  for (int64_t step = 0; step < 100; ++step) Push(shard, {step, step + 1, 7});
  ASSERT_GT(shard.lifecycle().evicted_capacity + shard.lifecycle().evicted_age, 0);
  std::set<int64_t> live;
  shard.ForEachRow([&](int64_t id, RowIndex) { live.insert(id); });
  ASSERT_EQ(live.size(), shard.size());

  test::TempDir tmp("row-lifecycle-ckpt");
  auto file = WriteShard(tmp.path().string(), 0, 1, 100, reg);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(WriteManifest(tmp.path().string(), 100, {*file}, "test", 1).ok());
  auto ckpt = ReadCheckpoint(tmp.path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const auto& rows = ckpt->tables.at(TableId(spec.name)).rows;
  std::set<int64_t> saved;
  for (const auto& [id, row] : rows) saved.insert(id);
  EXPECT_EQ(saved, live) << "evicted rows and free slots are not saved";

  TableRegistry back(0, 1);
  ASSERT_TRUE(RestoreShard(*ckpt, 0, 1, &back).ok());
  SparseShard& restored = *(*back.Find(TableId(spec.name), TableType::kSparse))->sparse;
  EXPECT_EQ(restored.size(), live.size());
  for (int64_t id : live) EXPECT_EQ(Pulled(restored, id), Pulled(shard, id)) << "id " << id;
}

}  // namespace
}  // namespace ferry::ps
