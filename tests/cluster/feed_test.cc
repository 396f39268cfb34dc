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
  int64_t pages = 0;  // as the feed counted them
  auto poll = [&](const std::string& table, TableCopy* copy) {
    TableChanges c;
    const Status s = (*feed)->Poll(table, &c);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(copy->Apply(c, (*feed)->num_servers()).ok());
    pages += c.pages;
    return c;
  };
  // The first round, before training: every server sends all it has (nothing yet).
  EXPECT_EQ(poll("emb", &rows).full_servers.size(), static_cast<size_t>(kServers));
  EXPECT_EQ(poll("w", &weights).full_servers.size(), static_cast<size_t>(kServers));
  std::atomic<bool> done{false};
  std::atomic<int64_t> acked{0};
  std::set<int64_t> pushed;
  std::thread train([&] {
    pushed = Train(*worker, "w", 1000, "emb", 8, 5000, 300, 7, &acked);
    done = true;
  });
  int64_t late = 0;  // steps acknowledged before a Poll began that the copy lacked after it
  bool finished_before = false;
  while (!finished_before) {
    finished_before = done.load();  // one more round after training stopped: it holds everything
    const int64_t before = acked.load();
    EXPECT_TRUE(poll("emb", &rows).full_servers.empty());
    for (int64_t k = 0; k < before; ++k) late += rows.row(kStepIds + k) == nullptr;
    EXPECT_TRUE(poll("w", &weights).full_servers.empty());
  }
  train.join();
  EXPECT_EQ(late, 0);  // the bound: a round holds every update acknowledged before it began
  const size_t held = ExpectCopyIsTheServers(*worker, "emb", 8, pushed, rows);
  EXPECT_EQ(held, pushed.size());  // no lifecycle: every id pushed has a row
  std::vector<float> w(1000);
  ASSERT_TRUE(worker->PullDense("w", w, 0).wait().ok());
  EXPECT_EQ(std::memcmp(w.data(), weights.dense().data(), w.size() * sizeof(float)), 0);
  // Nothing changed since: a round brings nothing.
  const TableChanges idle_rows = poll("emb", &rows);
  EXPECT_TRUE(idle_rows.ids.empty() && idle_rows.deleted.empty());
  EXPECT_TRUE(poll("w", &weights).ranges.empty());
  int64_t served = 0;
  for (const auto& server : cluster.servers) served += server->stats().counters.at("feed_pages");
  EXPECT_EQ(served, pages);  // every page the servers counted reached the feed, and no other
  EXPECT_GT(pages, 2 * kServers * 2);  // (pages of 4 rows: the rounds took many)
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
  size_t deleted = 0, refilled = 0;
  auto poll = [&] {
    TableChanges c;
    const Status s = (*feed)->Poll("emb", &c);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(rows.Apply(c, (*feed)->num_servers()).ok());
    deleted += c.deleted.size();
    refilled += c.full_servers.size();
  };
  poll();  // before training: every server sends all (nothing yet)
  refilled = 0;
  std::atomic<bool> done{false};
  std::atomic<int64_t> acked{0};
  std::set<int64_t> pushed;
  std::thread train([&] {
    pushed = Train(*worker, "w", 100, "emb", 4, 1000, 200, 11, &acked);
    done = true;
  });
  bool finished_before = false;
  while (!finished_before) {
    finished_before = done.load();
    poll();
  }
  train.join();
  // Evictions reached the copy as deletions, or (a reader that fell behind the eviction log, on a
  // loaded machine) as a server's full round.
  EXPECT_GT(deleted + refilled, 0u);
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
  // (whichever server answered first)
  EXPECT_TRUE(s.message().find("server 0 (" + cluster.endpoints[0] + ")") != std::string::npos ||
              s.message().find("server 1 (" + cluster.endpoints[1] + ")") != std::string::npos)
      << s;
  EXPECT_NE(s.message().find("table 'nothing'"), std::string::npos) << s;
}

}  // namespace
}  // namespace ferry::test
