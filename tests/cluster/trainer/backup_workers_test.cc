// Sync mode with backup workers (replicas_to_aggregate = M - K) through the trainer's ParamStore:
// a late worker moves to the global step and contributes again; a slow worker contributes
// whenever it is among the first M - K; the job advances without its slowest workers.
//
// Arrival order decides which gradients a step uses, so the tests fix it: a Turns object makes
// the workers push each global step in a given order (each push is answered before the next
// worker's is sent), and a worker can be held back for a while. No timing is involved.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "support/cluster.h"
#include "ferry/trainer/param_store.h"

namespace ferry::trainer {
namespace {

using namespace std::chrono_literals;
constexpr int kWorkers = 3;
constexpr int kQuorum = 2;

std::vector<TableSpec> Tables() {
  TableSpec dense;
  dense.name = "w";
  dense.shape = {8};
  dense.consistency = Consistency::kSync;
  dense.replicas_to_aggregate = kQuorum;
  TableSpec sparse;
  sparse.name = "emb";
  sparse.type = TableType::kSparse;
  sparse.dim = 2;
  sparse.consistency = Consistency::kSync;
  sparse.replicas_to_aggregate = kQuorum;
  return {dense, sparse};
}

// The order in which the workers push each global step.
class Turns {
 public:
  // order(g): ranks in push order for step g. away(rank, g): the rank's push is not waited for at
  // g. unreached(rank, g): nor its pull (by default: never; every rank is waited for until its
  // pull has been served step g, so no step closes before a rank that should see it pulled it).
  Turns(std::function<std::vector<int>(int64_t)> order, std::function<bool(int, int64_t)> away,
        std::function<bool(int, int64_t)> unreached = [](int, int64_t) { return false; })
      : order_(std::move(order)), away_(std::move(away)), unreached_(std::move(unreached)) {
    for (int r = 0; r < kWorkers; ++r) reached_[r] = -1;  // no pull yet
  }

  // Blocks until every other rank has reached (pulled) step g and every rank before `rank` in
  // order(g) has pushed g, unless that rank is away at g or has ended.
  void WaitTurn(int rank, int64_t g) {
    std::unique_lock lock(mu_);
    const bool ok = cv_.wait_for(lock, 20s, [&] {
      auto excused = [&](int r) { return away_(r, g) || ended_.count(r) > 0; };
      for (const auto& [r, step] : reached_) {
        if (r != rank && step < g && !unreached_(r, g) && !ended_.count(r)) return false;
      }
      for (int r : order_(g)) {
        if (r == rank) return true;
        if (!pushed_[g].count(r) && !excused(r)) return false;
      }
      return true;
    });
    if (!ok) ADD_FAILURE() << "worker " << rank << " waited 20 s for its turn at step " << g;
  }
  // The rank's pull was served step g.
  void Reached(int rank, int64_t g) {
    std::lock_guard lock(mu_);
    reached_[rank] = g;
    cv_.notify_all();
  }
  void Pushed(int rank, int64_t g) {
    std::lock_guard lock(mu_);
    pushed_[g].insert(rank);
    cv_.notify_all();
  }
  void Ended(int rank) {
    std::lock_guard lock(mu_);
    ended_.insert(rank);
    cv_.notify_all();
  }
  // Blocks until each of `ranks` has pushed step g.
  void WaitPushed(const std::vector<int>& ranks, int64_t g) {
    std::unique_lock lock(mu_);
    const bool ok = cv_.wait_for(lock, 20s, [&] {
      for (int r : ranks) {
        if (!pushed_[g].count(r)) return false;
      }
      return true;
    });
    if (!ok) ADD_FAILURE() << "waited 20 s for step " << g << " to be pushed";
  }

 private:
  std::function<std::vector<int>(int64_t)> order_;
  std::function<bool(int, int64_t)> away_;
  std::function<bool(int, int64_t)> unreached_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, std::set<int>> pushed_;
  std::map<int, int64_t> reached_;
  std::set<int> ended_;
};

struct Outcome {
  StoreProgress progress;
  std::vector<int64_t> tags;  // the step each push counted for (or was dropped at)
};

// Runs `steps[r]` loop steps on each worker: pull (dense + the ids {1, 2}), a gradient of ones,
// wait for the turn at the served step, push, then Finish. `hold(rank, loop_step)` runs before
// the turn (a worker held back).
std::vector<Outcome> RunWorkers(const ferry::test::LocalCluster& cluster, Turns& turns, std::vector<int64_t> steps,
                         const std::function<void(int, int64_t)>& hold) {
  std::vector<Outcome> out(kWorkers);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorkers; ++rank) {
    threads.emplace_back([&, rank] {
      auto client = cluster.Connect(rank, kWorkers);
      auto store = CreateServerStore(client.get());
      const auto specs = Tables();
      ASSERT_TRUE(store->Declare(specs).ok());
      std::vector<float> w(8), g(8, 1.0f), rows(4), rg(4, 1.0f);
      const std::vector<int64_t> ids = {1, 2};
      for (int64_t t = 0; t < steps[static_cast<size_t>(rank)]; ++t) {
        const DenseOut pull{"w", w};
        const SparseOut spull{"emb", ids, rows};
        Status s = store->Pull({&pull, 1}, {&spull, 1}, t);
        ASSERT_TRUE(s.ok()) << s;
        const int64_t tag = store->progress().step;
        turns.Reached(rank, tag);
        if (hold) hold(rank, t);
        turns.WaitTurn(rank, tag);
        const DenseIn push{"w", g};
        const SparseIn spush{"emb", ids, rg};
        s = store->Push({&push, 1}, {&spush, 1}, t);
        ASSERT_TRUE(s.ok()) << s;
        out[static_cast<size_t>(rank)].tags.push_back(tag);
        turns.Pushed(rank, tag);
      }
      ASSERT_TRUE(client->Finish().ok());
      turns.Ended(rank);
      out[static_cast<size_t>(rank)].progress = store->progress();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

int64_t Counter(const ferry::test::LocalCluster& c, const std::string& name) {
  return c.servers[0]->stats().counters[name];
}

TEST(BackupWorkers, AWorkerLateOnceContributesAgainFromTheNextStep) {
  constexpr int64_t kSteps = 30;
  auto c = ferry::test::LocalCluster::Start(1);
  // Worker 2 pushes first and worker 1 last at every step (with a quorum of 2, worker 1's
  // gradient is the late one), except that worker 2 is held back at its loop step 5 until
  // workers 0 and 1 have pushed steps 5, 6 and 7 without it.
  Turns turns([](int64_t) { return std::vector<int>{2, 0, 1}; },
              [](int rank, int64_t g) { return rank == 2 && g >= 5 && g < 8; },
              [](int rank, int64_t g) { return rank == 2 && g >= 6 && g < 8; });
  auto out = RunWorkers(c, turns, {kSteps, kSteps, kSteps}, [&](int rank, int64_t t) {
    if (rank == 2 && t == 5) turns.WaitPushed({0, 1}, 7);
  });
  ASSERT_FALSE(::testing::Test::HasFailure());
  // Worker 2's step-5 gradient came after step 5 had closed: dropped. Its next pull was served at
  // the global step 8, and it pushed for 8, 9, ... from then on (before the fix it kept tagging
  // its own loop counter, 6, 7, ..., always behind, and every later gradient was dropped).
  const auto& late = out[2];
  EXPECT_EQ(late.tags[5], 5);
  EXPECT_EQ(late.tags[6], 8);
  EXPECT_EQ(late.progress.pushes_dropped, 1);
  EXPECT_EQ(late.progress.pushes_used, kSteps - 1);
  EXPECT_EQ(out[0].progress.pushes_used, kSteps);
  // Worker 1 counted only while worker 2 was away (steps 5, 6, 7).
  EXPECT_EQ(out[1].progress.pushes_used, 3);
  EXPECT_EQ(out[1].progress.pushes_dropped, kSteps - 3);
  // The servers' per-worker counters agree (two push messages a step: the dense and the sparse
  // table, both on the one server).
  EXPECT_EQ(Counter(c, "gradients_used_rank_2"), 2 * (kSteps - 1));
  EXPECT_EQ(Counter(c, "gradients_dropped_rank_2"), 2);
  EXPECT_EQ(Counter(c, "gradients_used_rank_1"), 2 * 3);
  EXPECT_EQ(Counter(c, "gradients_dropped_rank_1"), 2 * (kSteps - 3));
  // Workers 0 and 1 ended at step kSteps - 1; worker 2, two steps behind, ended alone (the quorum
  // shrank to it once the others had finished).
  EXPECT_EQ(out[0].progress.step, kSteps - 1);
  EXPECT_EQ(late.progress.step, kSteps + 1);
}

TEST(BackupWorkers, ASlowWorkerContributesWheneverItIsAmongTheFirstQuorum) {
  constexpr int64_t kSteps = 30;
  auto c = ferry::test::LocalCluster::Start(1);
  // Worker 1 is slow all along: last, except at every third step, where it beats worker 2.
  Turns turns([](int64_t g) { return g % 3 == 0 ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 2, 1}; },
              [](int, int64_t) { return false; });
  auto out = RunWorkers(c, turns, {kSteps, kSteps, kSteps}, nullptr);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const int64_t thirds = (kSteps + 2) / 3;  // steps 0, 3, 6, ...
  EXPECT_EQ(out[1].progress.pushes_used, thirds);
  EXPECT_EQ(out[1].progress.pushes_dropped, kSteps - thirds);
  EXPECT_EQ(out[2].progress.pushes_used, kSteps - thirds);
  EXPECT_EQ(out[0].progress.pushes_used, kSteps);
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(out[static_cast<size_t>(r)].progress.step, kSteps - 1) << r;
}

TEST(BackupWorkers, TheJobAdvancesWithoutItsSlowestWorker) {
  constexpr int64_t kSteps = 20;
  auto c = ferry::test::LocalCluster::Start(1);
  // Worker 2 pulls step 0 with the others (they wait for that), then does not push at all until
  // workers 0 and 1 have run all their steps: it is away from step 1 on.
  auto from_step_1 = [](int rank, int64_t g) { return rank == 2 && g >= 1; };
  Turns turns([](int64_t) { return std::vector<int>{0, 1, 2}; }, from_step_1, from_step_1);
  auto out = RunWorkers(c, turns, {kSteps, kSteps, kSteps}, [&](int rank, int64_t t) {
    if (rank == 2 && t == 0) turns.WaitPushed({0, 1}, kSteps - 1);
  });
  ASSERT_FALSE(::testing::Test::HasFailure());
  // Workers 0 and 1 completed every step with the quorum of 2, never waiting for worker 2.
  EXPECT_EQ(out[0].progress.pushes_used, kSteps);
  EXPECT_EQ(out[1].progress.pushes_used, kSteps);
  EXPECT_EQ(out[0].progress.step, kSteps - 1);
  // Worker 2's first gradient (for step 0) was late; its next pull was served the current step,
  // kSteps, and from there its steps counted, alone (the others had finished).
  EXPECT_EQ(out[2].tags[0], 0);
  EXPECT_EQ(out[2].tags[1], kSteps);
  EXPECT_EQ(out[2].progress.pushes_dropped, 1);
  EXPECT_EQ(out[2].progress.pushes_used, kSteps - 1);
  EXPECT_EQ(out[2].progress.step, 2 * kSteps - 2);
}

}  // namespace
}  // namespace ferry::trainer
