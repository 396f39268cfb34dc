// Every sparse table of a call travels in one message per server (protocol 1.5:
// PullSparseTables / PushSparseTables), with the same results as one request per table.
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <atomic>
#include <map>
#include <thread>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/messages/placement.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "support/cluster.h"
#include "support/old_server.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::LocalCluster;
using test::SgdSparseTable;  // SGD from zeros, learning rate 1: after pushes g, a row is -sum(g)


int64_t Messages(const LocalCluster& c, size_t server) { return c.servers[server]->stats().counters.at("messages"); }

// Three tables of different widths, ids repeating within a table and shared between tables: one
// push and one pull reach each server as one message, and every position gets its id's row.
TEST(SparseTables, EveryTableOfACallTravelsInOneMessagePerServer) {
  auto c = LocalCluster::Start(2);
  auto w = c.Connect(0, 1, test::NoHeartbeats());  // the servers' message counts are the test's own
  const std::vector<TableSpec> specs = {SgdSparseTable("a", 2), SgdSparseTable("b", 3), SgdSparseTable("c", 5)};
  for (const auto& s : specs) ASSERT_TRUE(w->Declare(s).ok());
  std::vector<std::vector<int64_t>> ids = {{1, 2, 3, 2, 1, 40}, {2, 7, 7, 8, 9, 10, 11}, {5, 6, 5, 5}};
  std::vector<std::vector<float>> grads(3), rows(3);
  std::vector<std::map<int64_t, std::vector<float>>> want(3);  // id -> expected row
  for (size_t t = 0; t < 3; ++t) {
    const int64_t dim = specs[t].dim;
    for (size_t p = 0; p < ids[t].size(); ++p) {
      auto& row = want[t][ids[t][p]];
      row.resize(static_cast<size_t>(dim));
      for (int64_t j = 0; j < dim; ++j) {
        const float g = static_cast<float>(t * 100 + p * 10 + static_cast<size_t>(j));
        grads[t].push_back(g);
        row[static_cast<size_t>(j)] -= g;  // repeated ids: their gradients add up
      }
    }
    rows[t].resize(grads[t].size());
  }
  const std::vector<SparseIn> push = {{"a", ids[0], grads[0]}, {"b", ids[1], grads[1]}, {"c", ids[2], grads[2]}};
  const int64_t sent = w->stats().requests, m0 = Messages(c, 0), m1 = Messages(c, 1);
  int64_t parts = 0;  // (table, server) pairs with ids: async tables skip a server without any
  for (const auto& table : ids) {
    bool on[2] = {false, false};
    for (int64_t id : table) on[placement::IdServer(id, 2)] = true;
    parts += on[0] + on[1];
  }
  Handle h = w->PushSparse(push, 0);
  ASSERT_TRUE(h.wait(5s).ok());
  EXPECT_EQ(h.served().used, parts) << "every part applied";
  const std::vector<SparseOut> pull = {{"a", ids[0], rows[0]}, {"b", ids[1], rows[1]}, {"c", ids[2], rows[2]}};
  ASSERT_TRUE(w->PullSparse(pull, 0).wait(5s).ok());
  EXPECT_EQ(w->stats().requests - sent, 4) << "one push and one pull message per server";
  EXPECT_EQ(Messages(c, 0) - m0, 2);
  EXPECT_EQ(Messages(c, 1) - m1, 2);
  for (size_t t = 0; t < 3; ++t) {
    const size_t dim = static_cast<size_t>(specs[t].dim);
    for (size_t p = 0; p < ids[t].size(); ++p) {
      const std::vector<float> got(rows[t].begin() + static_cast<long>(p * dim),
                                   rows[t].begin() + static_cast<long>((p + 1) * dim));
      EXPECT_EQ(got, want[t][ids[t][p]]) << "table " << specs[t].name << ", position " << p;
    }
  }

  // Distinct ids skip the deduplication and give the same rows; on one server they are sent
  // from the caller's buffers.
  std::vector<std::vector<int64_t>> distinct(3);
  for (size_t t = 0; t < 3; ++t) {
    for (const auto& [id, row] : want[t]) distinct[t].push_back(id);
    rows[t].assign(distinct[t].size() * static_cast<size_t>(specs[t].dim), 0.0f);
  }
  const std::vector<SparseOut> pull_distinct = {
      {"a", distinct[0], rows[0]}, {"b", distinct[1], rows[1]}, {"c", distinct[2], rows[2]}};
  ASSERT_TRUE(w->PullSparse(pull_distinct, 0, SparseIds::kDistinct).wait(5s).ok());
  for (size_t t = 0; t < 3; ++t) {
    const size_t dim = static_cast<size_t>(specs[t].dim);
    for (size_t p = 0; p < distinct[t].size(); ++p) {
      const std::vector<float> got(rows[t].begin() + static_cast<long>(p * dim),
                                   rows[t].begin() + static_cast<long>((p + 1) * dim));
      EXPECT_EQ(got, want[t][distinct[t][p]]) << "table " << specs[t].name << ", id " << distinct[t][p];
    }
  }
}

// With one server and distinct ids nothing is grouped or copied on the way. A call is cut between
// tables into messages of about sparse_message_bytes (sent as they are built), and never past
// max_message_bytes; every cut gives the same rows.
TEST(SparseTables, CutsBetweenTablesGiveTheSameRows) {
  struct Case {
    int64_t max_message_bytes, sparse_message_bytes, messages;
  };
  // Each table is 200 x (8 + 16) = 4800 bytes.
  for (const Case& k : {Case{int64_t{64} << 20, int64_t{512} << 10, 1}, Case{int64_t{64} << 20, 0, 1},
                        Case{4096, 0, 3}, Case{int64_t{64} << 20, 4096, 3}, Case{int64_t{64} << 20, 9000, 2}}) {
    SCOPED_TRACE("max_message_bytes " + std::to_string(k.max_message_bytes) + ", sparse_message_bytes " +
                 std::to_string(k.sparse_message_bytes));
    auto c = LocalCluster::Start(1);
    ClientOptions o;
    o.max_message_bytes = k.max_message_bytes;
    o.sparse_message_bytes = k.sparse_message_bytes;
    auto w = c.Connect(0, 1, o);
    const std::vector<TableSpec> specs = {SgdSparseTable("x", 4), SgdSparseTable("y", 4), SgdSparseTable("z", 4)};
    for (const auto& s : specs) ASSERT_TRUE(w->Declare(s).ok());
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 200; ++i) ids.push_back(i * 37 % 1000);
    std::vector<float> g(ids.size() * 4);
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i);
    const std::vector<SparseIn> push = {{"x", ids, g}, {"y", ids, g}, {"z", ids, g}};
    const int64_t sent = w->stats().requests;
    ASSERT_TRUE(w->PushSparse(push, 0, SparseIds::kDistinct).wait(5s).ok());
    EXPECT_EQ(w->stats().requests - sent, k.messages);
    std::vector<float> x(g.size()), y(g.size()), z(g.size());
    const std::vector<SparseOut> pull = {{"x", ids, x}, {"y", ids, y}, {"z", ids, z}};
    ASSERT_TRUE(w->PullSparse(pull, 0, SparseIds::kDistinct).wait(5s).ok());
    EXPECT_EQ(w->stats().requests - sent, 2 * k.messages);
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(x[i], -g[i]) << i;
      ASSERT_EQ(y[i], -g[i]) << i;
      ASSERT_EQ(z[i], -g[i]) << i;
    }
  }
}

// A table named in a call that cannot be sent (undeclared here) stops the whole call before any
// of it is sent: the tables before it are not pushed either.
TEST(SparseTables, ACallIsCheckedWholeBeforeAnyOfItIsSent) {
  auto c = LocalCluster::Start(1);
  ClientOptions o;
  o.sparse_message_bytes = 4096;  // every table would be its own message
  auto w = c.Connect(0, 1, o);
  ASSERT_TRUE(w->Declare(SgdSparseTable("x", 4)).ok());
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 200; ++i) ids.push_back(i);
  std::vector<float> g(ids.size() * 4, 1.0f), rows(g.size(), -9.0f);
  const std::vector<SparseIn> push = {{"x", ids, g}, {"undeclared", ids, g}};
  const int64_t sent = w->stats().requests;
  EXPECT_EQ(w->PushSparse(push, 0).wait(5s).code(), StatusCode::kNotFound);
  EXPECT_EQ(w->stats().requests, sent) << "nothing of a call with a mistake is sent";
  ASSERT_TRUE(w->PullSparse("x", ids, rows, 0).wait(5s).ok());
  EXPECT_EQ(rows, std::vector<float>(g.size(), 0.0f));
}

// Sync tables in one message per server close their steps exactly as one request per table does:
// two workers, two servers, Adagrad, random ids (some only on one server), bitwise equal rows.
TEST(SparseTables, SyncStepsMatchOneRequestPerTableBitwise) {
  auto run = [](bool together) {
    auto c = LocalCluster::Start(2);
    std::vector<std::unique_ptr<Client>> w;
    for (int r = 0; r < 2; ++r) w.push_back(c.Connect(r, 2));
    std::vector<TableSpec> specs = {SgdSparseTable("u", 3, Consistency::kSync),
                                    SgdSparseTable("v", 2, Consistency::kSync)};
    for (auto& s : specs) {
      s.optimizer.type = OptimizerType::kAdagrad;
      s.optimizer.learning_rate = 0.5f;
      s.init = InitType::kUniform;
      s.init_scale = 0.1f;
      s.seed = 7;
      for (auto& client : w) EXPECT_TRUE(client->Declare(s).ok());
    }
    std::mt19937_64 rng(42);
    for (int64_t step = 0; step < 6; ++step) {
      std::vector<Handle> pushes;
      std::vector<std::vector<int64_t>> ids(4);
      std::vector<std::vector<float>> grads(4), rows(4);
      for (int r = 0; r < 2; ++r) {
        for (size_t t = 0; t < 2; ++t) {
          auto& id = ids[static_cast<size_t>(r) * 2 + t];
          const size_t n = step == 3 && r == 1 ? 0 : 1 + rng() % 5;  // worker 1 has no ids at step 3
          for (size_t i = 0; i < n; ++i) id.push_back(static_cast<int64_t>(rng() % 12));
          auto& g = grads[static_cast<size_t>(r) * 2 + t];
          for (size_t i = 0; i < n * static_cast<size_t>(specs[t].dim); ++i)
            g.push_back(static_cast<float>(rng() % 100) / 50.0f - 1.0f);
          rows[static_cast<size_t>(r) * 2 + t].resize(g.size());
        }
        Client& client = *w[static_cast<size_t>(r)];
        const size_t a = static_cast<size_t>(r) * 2, b = a + 1;
        // Pull for this step (waits until the last one closed on both servers), then push.
        if (together) {
          const std::vector<SparseOut> pull = {{"u", ids[a], rows[a]}, {"v", ids[b], rows[b]}};
          EXPECT_TRUE(client.PullSparse(pull, step).wait(5s).ok());
          const std::vector<SparseIn> push = {{"u", ids[a], grads[a]}, {"v", ids[b], grads[b]}};
          pushes.push_back(client.PushSparse(push, step));
        } else {
          EXPECT_TRUE(client.PullSparse("u", ids[a], rows[a], step).wait(5s).ok());
          EXPECT_TRUE(client.PullSparse("v", ids[b], rows[b], step).wait(5s).ok());
          pushes.push_back(client.PushSparse("u", ids[a], grads[a], step));
          pushes.push_back(client.PushSparse("v", ids[b], grads[b], step));
        }
      }
      for (auto& h : pushes) EXPECT_TRUE(h.wait(5s).ok());
    }
    std::vector<int64_t> all(12);
    for (int64_t i = 0; i < 12; ++i) all[static_cast<size_t>(i)] = i;
    std::vector<float> u(12 * 3), v(12 * 2);
    EXPECT_TRUE(w[0]->PullSparse("u", all, u, 6).wait(5s).ok());
    EXPECT_TRUE(w[0]->PullSparse("v", all, v, 6).wait(5s).ok());
    u.insert(u.end(), v.begin(), v.end());
    return u;
  };
  const std::vector<float> together = run(true), apart = run(false);
  ASSERT_EQ(together.size(), apart.size());
  for (size_t i = 0; i < together.size(); ++i) {
    ASSERT_EQ(std::memcmp(&together[i], &apart[i], sizeof(float)), 0)
        << "element " << i << ": " << together[i] << " vs " << apart[i];
  }
  EXPECT_NE(together[0], 0.0f);
}

// A push is checked whole before any of it is applied: a non-finite gradient in one table leaves
// the other tables of the message untouched.
TEST(SparseTables, ARefusedTableRefusesTheWholeMessage) {
  auto c = LocalCluster::Start(1);
  auto w = c.Connect(0, 1);
  ASSERT_TRUE(w->Declare(SgdSparseTable("good", 2)).ok());
  ASSERT_TRUE(w->Declare(SgdSparseTable("bad", 2)).ok());
  const std::vector<int64_t> ids = {1, 2};
  std::vector<float> g = {1, 1, 1, 1}, nan = {1, std::numeric_limits<float>::quiet_NaN(), 1, 1};
  const std::vector<SparseIn> push = {{"good", ids, g}, {"bad", ids, nan}};
  const Status s = w->PushSparse(push, 0).wait(5s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("table 'bad': the gradient of worker 0 holds NaN or Inf (id 1)"), std::string::npos) << s;
  std::vector<float> rows(4, -9.0f);
  ASSERT_TRUE(w->PullSparse("good", ids, rows, 0).wait(5s).ok());
  EXPECT_EQ(rows, std::vector<float>(4, 0.0f)) << "the finite table of the refused message must not be applied";
}

TEST(SparseTables, CallerMistakesAreNamed) {
  auto c = LocalCluster::Start(1);
  auto w = c.Connect(0, 1);
  ASSERT_TRUE(w->Declare(SgdSparseTable("e", 2)).ok());
  const std::vector<int64_t> ids = {1};
  std::vector<float> row(2), wide(3);
  const std::vector<SparseOut> twice = {{"e", ids, row}, {"e", ids, row}};
  Status s = w->PullSparse(twice, 0).wait(5s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("table 'e' appears twice in one call"), std::string::npos) << s;
  const std::vector<SparseOut> misfit = {{"e", ids, wide}};
  s = w->PullSparse(misfit, 0).wait(5s);
  EXPECT_NE(s.message().find("PullSparse 'e': output has 3 floats, ids x dim is 2"), std::string::npos) << s;
  const std::vector<SparseIn> unknown = {{"e", ids, row}, {"nope", ids, row}};
  s = w->PushSparse(unknown, 0).wait(5s);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  EXPECT_TRUE(w->PullSparse(std::span<const SparseOut>(), 0).wait(5s).ok()) << "no tables: nothing to do";
}

// What a hostile peer may forge: the same table twice, or a dim that is not the table's. Both
// are refused, naming the table, and nothing is applied.
TEST(SparseTables, TheServerRefusesAForgedMessage) {
  auto c = LocalCluster::Start(1);
  auto w = c.Connect(0, 2);  // the forger speaks for worker 1
  ASSERT_TRUE(w->Declare(SgdSparseTable("e", 2)).ok());
  auto raw = transport::MakeSocket(transport::Zmq(*c.context), zmq::socket_type::dealer);
  ASSERT_TRUE(raw.ok());
  raw->set(zmq::sockopt::rcvtimeo, 5000);
  raw->connect(c.endpoints[0]);
  auto forge = [&](std::vector<wire::SparseSlice> tables) -> Status {
    flatbuffers::FlatBufferBuilder fbb;
    auto vec = fbb.CreateVectorOfStructs(tables);
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(wire::Kind::PushSparseTables);
    b.add_request_id(77);
    b.add_rank(1);
    b.add_sparse(vec);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    transport::Frames f;
    f.push_back(wire::ToFrame(fbb));
    for (const auto& t : tables) {
      std::vector<int64_t> ids(static_cast<size_t>(t.num_ids()), 5);
      std::vector<float> g(static_cast<size_t>(t.num_ids() * t.dim()), 1.0f);
      f.emplace_back(ids.data(), ids.size() * sizeof(int64_t));
      f.emplace_back(g.data(), g.size() * sizeof(float));
    }
    if (Status s = transport::Send(*raw, f); !s.ok()) return s;
    transport::Frames reply;
    if (Status s = transport::Recv(*raw, &reply); !s.ok()) return s;
    const wire::Header* h = nullptr;
    if (Status s = wire::VerifyHeader(reply[0], &h); !s.ok()) return s;
    return h->kind() == wire::Kind::Error ? wire::ErrorStatus(*h) : Status::Ok();
  };
  Status s = forge({wire::SparseSlice(TableId("e"), 2, 1), wire::SparseSlice(TableId("e"), 2, 1)});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("table 'e' appears twice in one request"), std::string::npos) << s;
  s = forge({wire::SparseSlice(TableId("e"), 3, 1)});
  EXPECT_NE(s.message().find("table 'e' has dim 2, the request says 3"), std::string::npos) << s;
  s = forge({wire::SparseSlice(TableId("e"), 2, 1), wire::SparseSlice(12345, 2, 1)});
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  std::vector<float> row(2, -9.0f);
  const std::vector<int64_t> five = {5};
  ASSERT_TRUE(w->PullSparse("e", five, row, 0).wait(5s).ok());
  EXPECT_EQ(row, std::vector<float>(2, 0.0f)) << "nothing of a refused message is applied";
  ASSERT_TRUE(forge({wire::SparseSlice(TableId("e"), 2, 1)}).ok());
  ASSERT_TRUE(w->PullSparse("e", five, row, 0).wait(5s).ok());
  EXPECT_EQ(row, std::vector<float>(2, -1.0f)) << "a well-formed one is";
}

// A server of protocol 1.4 knows no PullSparseTables: the client, told the server's minor in its
// Hello reply, sends it one PullSparse / PushSparse per table instead. The 1.4 server here is a
// bare ROUTER that answers as one would: rows whose values are id + column / 8, and an error for
// a kind it does not know.
TEST(SparseTables, AServerOfProtocol14GetsOneMessagePerTable) {
  auto context = Context::Create();
  test::OldServer old_server(
      context, "inproc://sparse-tables-old-server", /*minor=*/4,
      [](const wire::Header& h, transport::Frames& in, wire::HeaderBuilder& b, transport::Frames& payload) {
        if (h.kind() != wire::Kind::Hello && h.kind() != wire::Kind::CreateTable &&
            h.kind() != wire::Kind::PushSparse && h.kind() != wire::Kind::PullSparse) {
          b.add_kind(wire::Kind::Error);
          b.add_error_code(static_cast<int>(StatusCode::kInvalidArgument));
          return;
        }
        b.add_kind(wire::Kind::Reply);
        if (h.kind() == wire::Kind::PushSparse) b.add_used(1);
        if (h.kind() != wire::Kind::PullSparse) return;
        std::vector<float> rows;
        const auto* ids = static_cast<const int64_t*>(in[2].data());
        for (int64_t i = 0; i < h.num_ids(); ++i) {
          for (int64_t j = 0; j < h.dim(); ++j) rows.push_back(static_cast<float>(ids[i]) + static_cast<float>(j) / 8);
        }
        payload.emplace_back(rows.data(), rows.size() * sizeof(float));
      });
  {
    auto w = old_server.Connect();
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Declare(SgdSparseTable("p", 2)).ok());
    ASSERT_TRUE((*w)->Declare(SgdSparseTable("q", 3)).ok());
    const std::vector<int64_t> p_ids = {4, 9, 4}, q_ids = {7};
    std::vector<float> p(6), q(3), gp(6, 1.0f), gq(3, 1.0f);
    const std::vector<SparseOut> pull = {{"p", p_ids, p}, {"q", q_ids, q}};
    ASSERT_TRUE((*w)->PullSparse(pull, 0).wait(5s).ok());
    EXPECT_EQ(p, (std::vector<float>{4, 4.125f, 9, 9.125f, 4, 4.125f}));
    EXPECT_EQ(q, (std::vector<float>{7, 7.125f, 7.25f}));
    const std::vector<SparseIn> push = {{"p", p_ids, gp}, {"q", q_ids, gq}};
    Handle h = (*w)->PushSparse(push, 0);
    ASSERT_TRUE(h.wait(5s).ok());
    EXPECT_EQ(h.served().used, 2);
  }
  old_server.Stop();
  auto& kinds = old_server.kinds();
  EXPECT_EQ(kinds[wire::Kind::PullSparse], 2);
  EXPECT_EQ(kinds[wire::Kind::PushSparse], 2);
  EXPECT_EQ(kinds[wire::Kind::PullSparseTables] + kinds[wire::Kind::PushSparseTables], 0);
}

}  // namespace
}  // namespace ferry
