// The change feed (ferry/feed.h, PROTOCOL.md "The change feed"): a reader polls while workers
// train, applies each round to a TableCopy, and once training stops the copy is the servers'
// tables bit for bit: rows made, changed and evicted during rounds in progress, pages cut small,
// dense chunks and sparse rows. The copy is checked against pulls of every id the workers pushed;
// after every Poll it holds each step acknowledged before the Poll began (the staleness bound).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/client.h"
#include "ferry/feed.h"
#include "support/cluster.h"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

constexpr int kServers = 3;

FeedOptions FeedOf(const LocalCluster& cluster, int64_t page_bytes) {
  FeedOptions o;
  o.servers = cluster.endpoints;
  o.context = cluster.context;
  o.request_timeout = 30s;
  o.page_bytes = page_bytes;
  return o;
}

// A step's own id, pushed by that step alone (outside every id_range): a Poll begun after the
// step's push was acknowledged must bring it.
constexpr int64_t kStepIds = int64_t{1} << 40;

// Pushes `steps` steps of gradients to the dense table `dense` (n floats) and the sparse table
// `sparse` (dim floats a row, ids drawn from [0, id_range), skewed, and kStepIds + step), as an
// async worker does, counting in `*acked` the steps whose sparse push was acknowledged; returns
// every id pushed.
std::set<int64_t> Train(Client& c, const std::string& dense, int64_t n, const std::string& sparse, int64_t dim,
                        int64_t id_range, int steps, uint64_t seed, std::atomic<int64_t>* acked) {
  std::mt19937_64 gen(seed);
  std::set<int64_t> pushed;
  std::vector<float> grad(static_cast<size_t>(n));
  for (int step = 0; step < steps; ++step) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 64; ++i) {
      const double u = std::uniform_real_distribution<double>(0, 1)(gen);
      ids.push_back(static_cast<int64_t>(static_cast<double>(id_range) * u * u));  // skewed to small ids
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    ids.push_back(kStepIds + step);
    std::vector<float> rows(ids.size() * static_cast<size_t>(dim));
    for (float& v : rows) v = std::uniform_real_distribution<float>(-1, 1)(gen);
    for (float& v : grad) v = std::uniform_real_distribution<float>(-1, 1)(gen);
    EXPECT_TRUE(c.PushSparse(sparse, ids, rows, step).wait().ok());
    acked->fetch_add(1);
    if (step % 2 == 0) {
      EXPECT_TRUE(c.PushDense(dense, grad, step).wait().ok());
    }
    pushed.insert(ids.begin(), ids.end());
  }
  return pushed;
}

// Every id pushed: the servers' row (pulled) is the copy's bit for bit where the copy holds it,
// and the initial row (zeros: nothing held) where it does not. Returns the ids held.
size_t ExpectCopyIsTheServers(Client& c, const std::string& table, int64_t dim, const std::set<int64_t>& pushed,
                              const TableCopy& copy) {
  const std::vector<int64_t> ids(pushed.begin(), pushed.end());
  std::vector<float> rows(ids.size() * static_cast<size_t>(dim));
  EXPECT_TRUE(c.PullSparse(table, ids, rows, 0).wait().ok());
  size_t held = 0, mismatched = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* server = rows.data() + i * static_cast<size_t>(dim);
    const float* mine = copy.row(ids[i]);
    if (mine != nullptr) {
      ++held;
      if (std::memcmp(server, mine, static_cast<size_t>(dim) * sizeof(float)) != 0) ++mismatched;
    } else if (std::any_of(server, server + dim, [](float v) { return v != 0.0f; })) {
      ++mismatched;  // the servers hold a row the copy lacks
    }
  }
  EXPECT_EQ(mismatched, 0u) << "of " << ids.size() << " ids pushed";
  EXPECT_EQ(copy.size(), held) << "the copy holds rows of ids never pushed";
  return held;
}

TEST(ChangeFeed, ACopyFollowingAsyncTrainingIsTheServersTablesBitForBitOnceTrainingStops) {
  LocalCluster cluster = LocalCluster::Start(kServers);
  auto worker = cluster.Connect(0, 1, NoHeartbeats());
  ASSERT_NE(worker, nullptr);
  TableSpec dense = SgdTable("w", 1000, Consistency::kAsync);
  dense.chunk_elems = 64;  // 16 chunks over 3 servers
  dense.optimizer.type = OptimizerType::kAdagrad;
  TableSpec sparse = SgdSparseTable("emb", 8);
  sparse.optimizer.type = OptimizerType::kAdagrad;
  ASSERT_TRUE(worker->Declare(dense).ok());
  ASSERT_TRUE(worker->Declare(sparse).ok());

  // Pages of about 4 rows (and one chunk): every round takes many pages while training goes on.
  auto feed = ChangeFeed::Connect(FeedOf(cluster, 128));
  ASSERT_TRUE(feed.ok()) << feed.status();
  TableCopy rows, weights;
  std::atomic<bool> done{false};
  std::atomic<int64_t> acked{0};
  std::set<int64_t> pushed;
  std::thread train([&] {
    pushed = Train(*worker, "w", 1000, "emb", 8, 5000, 300, 7, &acked);
    done = true;
  });
  int rounds = 0;
  int64_t late = 0;  // steps acknowledged before a Poll began that the copy lacked after it
  bool finished_before = false;
  while (!finished_before) {
    finished_before = done.load();  // one more round after training stopped: it holds everything
    const int64_t before = acked.load();
    TableChanges c;
    ASSERT_TRUE((*feed)->Poll("emb", &c).ok());
    ASSERT_TRUE(rows.Apply(c, (*feed)->num_servers()).ok());
    for (int64_t k = 0; k < before; ++k) late += rows.row(kStepIds + k) == nullptr;
    if (rounds == 0) {
      EXPECT_EQ(c.full_servers.size(), static_cast<size_t>(kServers));  // the first round: everything
    } else {
      EXPECT_TRUE(c.full_servers.empty());
    }
    TableChanges d;
    ASSERT_TRUE((*feed)->Poll("w", &d).ok());
    ASSERT_TRUE(weights.Apply(d, (*feed)->num_servers()).ok());
    ++rounds;
  }
  train.join();
  EXPECT_GE(rounds, 2);
  EXPECT_EQ(late, 0);  // the bound: a round holds every update acknowledged before it began
  const size_t held = ExpectCopyIsTheServers(*worker, "emb", 8, pushed, rows);
  EXPECT_EQ(held, pushed.size());  // no lifecycle: every id pushed has a row
  std::vector<float> w(1000);
  ASSERT_TRUE(worker->PullDense("w", w, 0).wait().ok());
  EXPECT_EQ(std::memcmp(w.data(), weights.dense().data(), w.size() * sizeof(float)), 0);
  // Nothing changed since: a round brings nothing.
  TableChanges idle;
  ASSERT_TRUE((*feed)->Poll("emb", &idle).ok());
  EXPECT_TRUE(idle.ids.empty() && idle.deleted.empty());
  ASSERT_TRUE((*feed)->Poll("w", &idle).ok());
  EXPECT_TRUE(idle.ranges.empty());
  int64_t pages = 0;
  for (const auto& server : cluster.servers) pages += server->stats().counters.at("feed_pages");
  EXPECT_GT(pages, 2 * kServers * rounds);  // rounds of many pages
}

TEST(ChangeFeed, RowsEvictedWhileFollowingLeaveTheCopy) {
  LocalCluster cluster = LocalCluster::Start(kServers);
  auto worker = cluster.Connect(0, 1, NoHeartbeats());
  ASSERT_NE(worker, nullptr);
  TableSpec dense = SgdTable("w", 100, Consistency::kAsync);
  TableSpec sparse = SgdSparseTable("emb", 4);
  sparse.max_rows = 40;  // per server: pushes of ~1000 ids evict all along
  ASSERT_TRUE(worker->Declare(dense).ok());
  ASSERT_TRUE(worker->Declare(sparse).ok());
  auto feed = ChangeFeed::Connect(FeedOf(cluster, 256));
  ASSERT_TRUE(feed.ok()) << feed.status();
  TableCopy rows;
  std::atomic<bool> done{false};
  std::atomic<int64_t> acked{0};
  std::set<int64_t> pushed;
  std::thread train([&] {
    pushed = Train(*worker, "w", 100, "emb", 4, 1000, 200, 11, &acked);
    done = true;
  });
  size_t deleted = 0;
  bool finished_before = false;
  while (!finished_before) {
    finished_before = done.load();
    TableChanges c;
    ASSERT_TRUE((*feed)->Poll("emb", &c).ok());
    ASSERT_TRUE(rows.Apply(c, (*feed)->num_servers()).ok());
    deleted += c.deleted.size();
  }
  train.join();
  EXPECT_GT(deleted, 0u);
  const size_t held = ExpectCopyIsTheServers(*worker, "emb", 4, pushed, rows);
  EXPECT_LE(held, static_cast<size_t>(40 * kServers));
  EXPECT_GT(held, 0u);
}

TEST(ChangeFeed, AnUndeclaredTableIsRefusedNamingTheServer) {
  LocalCluster cluster = LocalCluster::Start(2);
  auto feed = ChangeFeed::Connect(FeedOf(cluster, 0));
  ASSERT_TRUE(feed.ok()) << feed.status();
  TableChanges c;
  const Status s = (*feed)->Poll("nothing", &c);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("server 0"), std::string::npos) << s;
}

}  // namespace
}  // namespace ferry::test
