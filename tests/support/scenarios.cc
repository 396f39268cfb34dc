#include "support/scenarios.h"

#include <algorithm>
#include <map>
#include <thread>

#include <gtest/gtest.h>

#include "ferry/messages/placement.h"
#include "internal/init.h"
#include "internal/optimizer.h"

namespace ferry::test {

float Noise(uint64_t a, uint64_t b, uint64_t c) {
  using placement::Mix64;
  const uint64_t h = Mix64(Mix64(Mix64(a) ^ b) ^ c);
  return static_cast<float>(h >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

std::unique_ptr<Client> ConnectWorker(const ClusterAddress& cluster, int rank, int num_workers) {
  ClientOptions o;
  o.servers = cluster.endpoints;
  o.rank = rank;
  o.num_workers = num_workers;
  o.context = cluster.context;
  o.request_timeout = std::chrono::seconds(60);
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(c).value() : nullptr;
}

namespace {

constexpr int64_t kSparseIdRange = 40;

// The `count` ids worker `rank` touches at `step`: distinct, in a fixed order, overlapping other
// ranks'.
std::vector<int64_t> StepIds(int rank, int step, int count) {
  std::vector<int64_t> ids;
  for (uint64_t j = 0; ids.size() < static_cast<size_t>(count); ++j) {
    const int64_t id = static_cast<int64_t>(
        placement::Mix64((static_cast<uint64_t>(rank) << 32) ^ (static_cast<uint64_t>(step) << 8) ^ j) %
        kSparseIdRange);
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

// The gradient a worker computes from the values it pulled: depends on the values (so a stale
// or wrong pull changes the result) and on (rank, step, element).
void Gradient(std::span<const float> values, int rank, int step, uint64_t salt, float* out) {
  for (size_t i = 0; i < values.size(); ++i)
    out[i] = 0.5f * values[i] + Noise(static_cast<uint64_t>(rank), static_cast<uint64_t>(step) * 7919u + salt, i);
}

TableSpec SyncDense(const std::string& name, OptimizerType opt) {
  TableSpec s;
  s.name = name;
  s.type = TableType::kDense;
  s.shape = {7, 150};
  s.chunk_elems = 256;  // 5 chunks, spread over the servers
  s.optimizer.type = opt;
  s.optimizer.learning_rate = 0.05f;
  s.consistency = Consistency::kSync;
  s.init = InitType::kUniform;
  s.init_scale = 0.5f;
  s.seed = 11;
  return s;
}

TableSpec SyncSparse(const std::string& name, OptimizerType opt) {
  TableSpec s;
  s.name = name;
  s.type = TableType::kSparse;
  s.dim = 4;
  s.optimizer.type = opt;
  s.optimizer.learning_rate = 0.05f;
  s.consistency = Consistency::kSync;
  s.init = InitType::kNormal;
  s.init_scale = 0.1f;
  s.seed = 12;
  return s;
}

}  // namespace

void ExpectSyncMatchesSequential(const ClusterAddress& cluster, int num_workers, OptimizerType optimizer, int steps,
                                 const std::string& table_prefix, int ids_per_step) {
  const TableSpec dense = SyncDense(table_prefix + "dense", optimizer);
  const TableSpec sparse = SyncSparse(table_prefix + "sparse", optimizer);
  const int64_t n = dense.num_elements();
  const int64_t dim = sparse.dim;

  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < num_workers; ++r) {
    clients.push_back(ConnectWorker(cluster, r, num_workers));
    ASSERT_NE(clients.back(), nullptr);
  }
  std::vector<std::thread> workers;
  for (int r = 0; r < num_workers; ++r) {
    workers.emplace_back([&, r] {
      Client& c = *clients[static_cast<size_t>(r)];
      ASSERT_TRUE(c.Declare(dense).ok());
      ASSERT_TRUE(c.Declare(sparse).ok());
      std::vector<float> p(static_cast<size_t>(n)), g(static_cast<size_t>(n));
      for (int t = 0; t < steps; ++t) {
        const auto ids = StepIds(r, t, ids_per_step);
        std::vector<float> rows(ids.size() * static_cast<size_t>(dim)), rg(rows.size());
        // As a trainer does: a step's pulls in flight together, then its pushes.
        Handle pull_dense = c.PullDense(dense.name, p, t);
        Handle pull_sparse = c.PullSparse(sparse.name, ids, rows, t);
        Status s = pull_dense.wait();
        ASSERT_TRUE(s.ok()) << s;
        s = pull_sparse.wait();
        ASSERT_TRUE(s.ok()) << s;
        Gradient(p, r, t, 1, g.data());
        Gradient(rows, r, t, 2, rg.data());
        Handle push_dense = c.PushDense(dense.name, g, t);
        Handle push_sparse = c.PushSparse(sparse.name, ids, rg, t);
        s = push_dense.wait();
        const Status s2 = push_sparse.wait();
        ASSERT_TRUE(s.ok()) << s;
        ASSERT_TRUE(s2.ok()) << s2;
      }
    });
  }
  for (auto& w : workers) w.join();
  if (::testing::Test::HasFatalFailure()) return;

  // The sequential reference: the same initial values, the rank-ordered average, one update a step.
  const uint64_t did = TableId(dense.name), sid = TableId(sparse.name);
  const int slots = ps::StateSlots(optimizer);
  std::vector<float> p(static_cast<size_t>(n)), st(static_cast<size_t>(n * slots));
  ps::InitDense(dense, did, 0, p.data(), n);
  ps::InitState(dense.optimizer, st.data(), static_cast<size_t>(n));
  struct Row {
    std::vector<float> v, state;
    int64_t steps = 0;
  };
  std::map<int64_t, Row> rows;
  auto row = [&](int64_t id) -> Row& {
    auto [it, inserted] = rows.try_emplace(id);
    if (inserted) {
      it->second.v.resize(static_cast<size_t>(dim));
      it->second.state.resize(static_cast<size_t>(dim * slots));
      ps::InitSparseRow(sparse, sid, id, it->second.v.data());
      ps::InitState(sparse.optimizer, it->second.state.data(), static_cast<size_t>(dim));
    }
    return it->second;
  };
  for (int t = 0; t < steps; ++t) {
    std::vector<float> sum(static_cast<size_t>(n), 0.0f), g(static_cast<size_t>(n));
    std::vector<int64_t> order;
    std::map<int64_t, std::vector<float>> row_sum;
    for (int r = 0; r < num_workers; ++r) {
      Gradient(p, r, t, 1, g.data());
      for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += g[static_cast<size_t>(i)];
      const auto ids = StepIds(r, t, ids_per_step);
      std::vector<float> vals, rg(ids.size() * static_cast<size_t>(dim));
      for (int64_t id : ids) vals.insert(vals.end(), row(id).v.begin(), row(id).v.end());
      Gradient(vals, r, t, 2, rg.data());
      for (size_t k = 0; k < ids.size(); ++k) {
        auto [it, inserted] = row_sum.try_emplace(ids[k], std::vector<float>(static_cast<size_t>(dim), 0.0f));
        if (inserted) order.push_back(ids[k]);
        for (int64_t j = 0; j < dim; ++j)
          it->second[static_cast<size_t>(j)] += rg[k * static_cast<size_t>(dim) + static_cast<size_t>(j)];
      }
    }
    const float k = static_cast<float>(num_workers);
    for (auto& v : sum) v /= k;
    ps::ApplyUpdate(dense.optimizer, p.data(), sum.data(), st.data(), static_cast<size_t>(n), static_cast<size_t>(n),
                    t + 1);
    for (int64_t id : order) {
      auto& s = row_sum[id];
      for (auto& v : s) v /= k;
      Row& rw = row(id);
      ps::ApplyUpdate(sparse.optimizer, rw.v.data(), s.data(), rw.state.data(), static_cast<size_t>(dim),
                      static_cast<size_t>(dim), ++rw.steps);
    }
  }

  // What the servers hold after `steps` steps.
  std::vector<float> got(static_cast<size_t>(n));
  Status s = clients[0]->PullDense(dense.name, got, steps).wait();
  ASSERT_TRUE(s.ok()) << s;
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (got[static_cast<size_t>(i)] != p[static_cast<size_t>(i)] && mismatches++ < 5) {
      ADD_FAILURE() << "dense element " << i << ": server " << got[static_cast<size_t>(i)] << " reference "
                    << p[static_cast<size_t>(i)];
    }
  }
  EXPECT_EQ(mismatches, 0);
  std::vector<int64_t> all_ids;
  for (auto& [id, r] : rows) all_ids.push_back(id);
  std::vector<float> got_rows(all_ids.size() * static_cast<size_t>(dim));
  s = clients[0]->PullSparse(sparse.name, all_ids, got_rows, steps).wait();
  ASSERT_TRUE(s.ok()) << s;
  for (size_t k = 0; k < all_ids.size(); ++k) {
    for (int64_t j = 0; j < dim; ++j) {
      EXPECT_EQ(got_rows[k * static_cast<size_t>(dim) + static_cast<size_t>(j)],
                rows[all_ids[k]].v[static_cast<size_t>(j)])
          << "sparse id " << all_ids[k] << " column " << j;
    }
  }
  // The reference moved away from the initial values, so equality above is not trivially true.
  std::vector<float> init(static_cast<size_t>(n));
  ps::InitDense(dense, did, 0, init.data(), n);
  EXPECT_NE(init, p);
}

void ExpectAsyncLosesNothing(const ClusterAddress& cluster, int num_workers, int steps,
                             const std::string& table_prefix) {
  TableSpec dense;
  dense.name = table_prefix + "async_dense";
  dense.shape = {1000};
  dense.chunk_elems = 300;
  dense.optimizer.learning_rate = 1.0f;
  dense.consistency = Consistency::kAsync;
  TableSpec sparse;
  sparse.name = table_prefix + "async_sparse";
  sparse.type = TableType::kSparse;
  sparse.dim = 3;
  sparse.optimizer.learning_rate = 1.0f;
  sparse.consistency = Consistency::kAsync;

  std::vector<std::thread> workers;
  for (int r = 0; r < num_workers; ++r) {
    workers.emplace_back([&, r] {
      auto c = ConnectWorker(cluster, r, num_workers);
      ASSERT_NE(c, nullptr);
      ASSERT_TRUE(c->Declare(dense).ok());
      ASSERT_TRUE(c->Declare(sparse).ok());
      std::vector<float> g(1000, static_cast<float>(r + 1)), out(1000);
      for (int t = 0; t < steps; ++t) {
        // Half the steps push then pull in one round trip, half push alone.
        Status s = (t % 2 == 0) ? c->PushDense(dense.name, g, t).wait()
                                : c->PushPullDense(std::vector<DenseIn>{{dense.name, g}},
                                                   std::vector<DenseOut>{{dense.name, out}}, t)
                                      .wait();
        ASSERT_TRUE(s.ok()) << s;
        // Ids 0..9 by everyone, id 1000*(r+1)+t by this worker alone; id 3 twice (summed).
        std::vector<int64_t> ids = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1000 * (r + 1) + t, 3};
        std::vector<float> rg(ids.size() * 3, 1.0f);
        s = c->PushSparse(sparse.name, ids, rg, t).wait();
        ASSERT_TRUE(s.ok()) << s;
      }
    });
  }
  for (auto& w : workers) w.join();
  if (::testing::Test::HasFatalFailure()) return;

  auto c = ConnectWorker(cluster, 0, num_workers);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Declare(dense).ok());
  ASSERT_TRUE(c->Declare(sparse).ok());
  std::vector<float> p(1000);
  ASSERT_TRUE(c->PullDense(dense.name, p, 0).wait().ok());
  float expected = 0;
  for (int r = 0; r < num_workers; ++r) expected -= static_cast<float>(steps * (r + 1));
  for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], expected) << "dense element " << i;

  std::vector<int64_t> ids = {0, 3, 9};
  for (int r = 0; r < num_workers; ++r) ids.push_back(1000 * (r + 1) + steps - 1);
  std::vector<float> rows(ids.size() * 3);
  ASSERT_TRUE(c->PullSparse(sparse.name, ids, rows, 0).wait().ok());
  const float shared = -static_cast<float>(num_workers * steps);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(rows[0 * 3 + j], shared);
    EXPECT_EQ(rows[1 * 3 + j], 2 * shared) << "id 3 appears twice per push: its gradients are summed";
    EXPECT_EQ(rows[2 * 3 + j], shared);
    for (int r = 0; r < num_workers; ++r) EXPECT_EQ(rows[(3 + r) * 3 + j], -1.0f);
  }
}

}  // namespace ferry::test
