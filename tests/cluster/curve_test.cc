// CURVE (ferry/curve.h, ServerOptions::curve): servers that accept only the job's worker keys.
// Real servers on 127.0.0.1 (CURVE has no inproc:// form), keys from ferry::curve::WriteJobKeys in
// a fresh folder. An authenticated worker trains; a peer without the job's key (none, a foreign
// one, or the servers' public key from another job) cannot pull, push, create a table or stop
// anything, and is told why; a worker's key speaks for its own rank alone.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/client.h"
#include "ferry/curve.h"
#include "ferry/feed.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "ferry/server.h"
#include "support/temp_dir.h"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

TableSpec Table(const std::string& name, Consistency consistency) {
  TableSpec spec;
  spec.name = name;
  spec.shape = {16};
  spec.consistency = consistency;
  spec.optimizer.learning_rate = 0.5f;
  return spec;
}

class Curve : public testing::Test {
 protected:
  void SetUp() override {
    if (!curve::Available()) GTEST_SKIP() << "this libzmq was built without CURVE";
    keys_ = root_ + "/keys";
    ASSERT_TRUE(curve::WriteJobKeys(keys_, 2, /*num_readers=*/1).ok());
    auto server_keys = curve::LoadServerKeys(keys_);
    ASSERT_TRUE(server_keys.ok()) << server_keys.status();
    for (int r = 0; r < 2; ++r) {
      ServerOptions so;
      so.bind = "tcp://127.0.0.1:0";
      so.rank = r;
      so.num_servers = 2;
      so.compute_threads = 1;
      so.curve = *server_keys;
      auto s = Server::Start(so);
      ASSERT_TRUE(s.ok()) << s.status();
      endpoints_.push_back((*s)->endpoint());
      servers_.push_back(std::move(*s));
    }
  }
  void TearDown() override { servers_.clear(); }

  ClientOptions Options(int rank) const {
    ClientOptions o;
    o.servers = endpoints_;
    o.rank = rank;
    o.num_workers = 2;
    o.connect_timeout = 10s;
    o.request_timeout = 10s;
    o.heartbeat_timeout = 0ms;  // no heartbeats: the servers' message counts are the tests' own
    return o;
  }
  // Worker `rank` with its own key from the job's folder.
  std::unique_ptr<Client> Worker(int rank) const {
    ClientOptions o = Options(rank);
    auto keys = curve::LoadClientKeys(keys_, rank);
    EXPECT_TRUE(keys.ok()) << keys.status();
    if (!keys.ok()) return nullptr;
    o.curve = *keys;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  int64_t Counter(int server, const std::string& name) const {
    return servers_[static_cast<size_t>(server)]->stats().counters.at(name);
  }

  TempDir tmp_{"curve"};
  const std::string root_ = tmp_.path().string();
  std::string keys_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<Server>> servers_;
};

TEST_F(Curve, AuthenticatedWorkersTrainInSyncMode) {
  auto w0 = Worker(0), w1 = Worker(1);
  ASSERT_TRUE(w0 && w1);
  ASSERT_TRUE(w0->Declare(Table("w", Consistency::kSync)).ok());
  ASSERT_TRUE(w1->Declare(Table("w", Consistency::kSync)).ok());
  // Three sync steps: worker r pushes (r + 1) everywhere; the mean, 1.5, times lr 0.5 is
  // subtracted once a step, so the table is -0.75 * steps.
  constexpr int kSteps = 3;
  auto run = [](Client* w, float g, std::vector<float>* last) {
    std::vector<float> grad(16, g), values(16);
    for (int step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(w->PullDense("w", values, step).wait().ok());
      ASSERT_TRUE(w->PushDense("w", grad, step).wait().ok());
    }
    ASSERT_TRUE(w->PullDense("w", values, kSteps).wait().ok());
    *last = values;
  };
  std::vector<float> v0, v1;
  std::thread t1([&] { run(w1.get(), 2.0f, &v1); });
  run(w0.get(), 1.0f, &v0);
  t1.join();
  ASSERT_EQ(v0.size(), 16u);
  for (float x : v0) EXPECT_FLOAT_EQ(x, -0.75f * kSteps);
  EXPECT_EQ(v0, v1);
  EXPECT_EQ(Counter(0, "curve_refused") + Counter(1, "curve_refused"), 0);
}

TEST_F(Curve, AClientWithoutKeysIsToldTheServersMayRequireCurve) {
  const auto t0 = std::chrono::steady_clock::now();
  auto c = Client::Connect(Options(0));
  ASSERT_FALSE(c.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 9s);  // not the connect timeout
  // ZeroMQ reports the mechanism mismatch on the side that reads the other's greeting first; when
  // that is the server, the client sees its connection closed during the handshake.
  const bool mismatch = c.status().code() == StatusCode::kPermissionDenied &&
                        c.status().message().find("requires CURVE") != std::string::npos;
  const bool closed = c.status().code() == StatusCode::kUnavailable &&
                      c.status().message().find("during the handshake: does it require CURVE?") != std::string::npos;
  EXPECT_TRUE(mismatch || closed) << c.status();
  EXPECT_EQ(Counter(0, "messages"), 0);  // nothing it sent reached the server
}

TEST_F(Curve, AForeignKeyIsRefusedCountedAndToldSo) {
  ClientOptions o = Options(0);
  auto keys = curve::LoadClientKeys(keys_, 0);
  ASSERT_TRUE(keys.ok());
  auto foreign = curve::NewKeypair();
  ASSERT_TRUE(foreign.ok());
  keys->client = *foreign;  // the right servers' key, but a key of no worker of this job
  o.curve = *keys;
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
  EXPECT_NE(c.status().message().find("refused this client's CURVE key"), std::string::npos) << c.status();
  EXPECT_GE(Counter(0, "curve_refused"), 1);
  EXPECT_EQ(Counter(0, "messages"), 0);
}

TEST_F(Curve, AnotherJobsServerKeyFailsTheHandshakeWithAReason) {
  const std::string other = root_ + "/other";
  ASSERT_TRUE(curve::WriteJobKeys(other, 2).ok());
  auto keys = curve::LoadClientKeys(other, 0);
  ASSERT_TRUE(keys.ok());
  ClientOptions o = Options(0);
  o.curve = *keys;
  const auto t0 = std::chrono::steady_clock::now();
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  // Not a timeout: the failed handshake itself is reported, long before connect_timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 9s);
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
  EXPECT_NE(c.status().message().find("server.pub"), std::string::npos) << c.status();
  EXPECT_EQ(Counter(0, "messages"), 0);
}

TEST_F(Curve, AWorkersKeySpeaksForItsRankAlone) {
  ClientOptions o = Options(0);
  auto keys = curve::LoadClientKeys(keys_, 1);  // worker 1's key, claiming rank 0
  ASSERT_TRUE(keys.ok());
  o.curve = *keys;
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
  EXPECT_NE(c.status().message().find("CURVE key is worker 1's; it cannot speak for worker 0"), std::string::npos)
      << c.status();
  EXPECT_GE(Counter(0, "permission_denied"), 1);
}

// A reader's key (ferry-keys --readers) follows the change feed, and can say nothing else: its
// Hello as a worker is refused, naming why; a feed with no key gets nothing.
TEST_F(Curve, AReaderKeyReadsTheChangeFeedAndNothingElse) {
  auto w0 = Worker(0);
  ASSERT_TRUE(w0);
  ASSERT_TRUE(w0->Declare(Table("a", Consistency::kAsync)).ok());
  std::vector<float> grad(16, 1.0f), now(16);
  ASSERT_TRUE(w0->PushDense("a", grad, 0).wait().ok());
  ASSERT_TRUE(w0->PullDense("a", now, 1).wait().ok());
  auto reader = curve::LoadReaderKeys(keys_, 0);
  ASSERT_TRUE(reader.ok()) << reader.status();
  FeedOptions fo;
  fo.servers = endpoints_;
  fo.curve = *reader;
  auto feed = ChangeFeed::Connect(fo);
  ASSERT_TRUE(feed.ok()) << feed.status();
  TableChanges c;
  ASSERT_TRUE((*feed)->Poll("a", &c).ok());
  TableCopy copy;
  ASSERT_TRUE(copy.Apply(c, 2).ok());
  EXPECT_EQ(copy.dense(), now);

  ClientOptions o = Options(0);
  o.curve = *reader;
  auto as_worker = Client::Connect(o);
  ASSERT_FALSE(as_worker.ok());
  EXPECT_EQ(as_worker.status().code(), StatusCode::kPermissionDenied) << as_worker.status();
  EXPECT_NE(as_worker.status().message().find("reader 0's: a reader may read"), std::string::npos)
      << as_worker.status();

  fo.curve.reset();
  fo.request_timeout = 1500ms;
  auto keyless = ChangeFeed::Connect(fo);
  ASSERT_TRUE(keyless.ok());
  EXPECT_FALSE((*keyless)->Poll("a", &c).ok());
  std::vector<float> after(16);
  ASSERT_TRUE(w0->PullDense("a", after, 1).wait().ok());
  EXPECT_EQ(after, now);  // nothing the reader did changed the table
}

// A move asked of the job (1.24 MoveAsk) needs a worker's key, speaking for its own rank: a
// reader's key, another rank's, or none is refused, and server 0 keeps nothing of them.
TEST_F(Curve, AMoveIsAskedWithAWorkersKeyForItsOwnRankAlone) {
  auto ask = [&](std::optional<CurveClientKeys> keys, int rank) {
    AskMoveOptions a;
    a.server0 = endpoints_[0];
    a.drain = 1;
    a.rank = rank;
    a.curve = std::move(keys);
    a.timeout = 3s;
    return AskMove(a);
  };
  auto reader = curve::LoadReaderKeys(keys_, 0);
  ASSERT_TRUE(reader.ok()) << reader.status();
  Status s = ask(*reader, 0);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("a reader may read"), std::string::npos) << s;
  auto worker1 = curve::LoadClientKeys(keys_, 1);
  ASSERT_TRUE(worker1.ok()) << worker1.status();
  s = ask(*worker1, 0);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("cannot speak for worker 0"), std::string::npos) << s;
  s = ask(std::nullopt, 0);  // no key: the handshake fails, nothing is read
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  // Nothing was kept: worker 1's own ask is the first.
  s = ask(*worker1, 1);
  EXPECT_TRUE(s.ok()) << s;
  s = ask(*worker1, 1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("a move is asked already (server 1 to leave"), std::string::npos) << s;
}

// Raw sockets, as an attacker would use them: valid Ferry requests (create a table, push, pull,
// finish) sent with no key and with a foreign key get no reply, reach no handler, and change
// nothing the job's workers see.
TEST_F(Curve, UnauthenticatedPeersCannotCreatePushPullOrFinish) {
  auto w0 = Worker(0);
  ASSERT_TRUE(w0);
  ASSERT_TRUE(w0->Declare(Table("a", Consistency::kAsync)).ok());
  std::vector<float> before(16), after(16);
  ASSERT_TRUE(w0->PullDense("a", before, 0).wait().ok());
  std::vector<int64_t> messages_before;
  for (int s = 0; s < 2; ++s) messages_before.push_back(Counter(s, "messages"));

  auto header = [](wire::Kind kind, int64_t count) {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<wire::DenseSlice> slices = {wire::DenseSlice(TableId("a"), 0, count)};
    auto vec = fbb.CreateVectorOfStructs(slices);
    flatbuffers::Offset<wire::TableSpec> spec;
    if (kind == wire::Kind::CreateTable) spec = wire::SpecToWire(fbb, Table("evil", Consistency::kAsync));
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(kind);
    b.add_request_id(7);
    b.add_rank(0);
    if (kind == wire::Kind::CreateTable) {
      b.add_spec(spec);
      b.add_table_id(TableId("evil"));
    } else {
      b.add_slices(vec);
    }
    wire::FinishHeaderBuffer(fbb, b.Finish());
    return wire::ToFrame(fbb);
  };
  auto foreign = curve::NewKeypair();
  auto server_pub = curve::LoadClientKeys(keys_, 0);
  ASSERT_TRUE(foreign.ok() && server_pub.ok());
  auto context = Context::Create(1);
  for (bool with_key : {false, true}) {
    SCOPED_TRACE(with_key ? "a foreign key" : "no key");
    for (int s = 0; s < 2; ++s) {
      auto raw = transport::MakeSocket(transport::Zmq(*context), zmq::socket_type::dealer);
      ASSERT_TRUE(raw.ok());
      raw->set(zmq::sockopt::rcvtimeo, 300);
      if (with_key) {
        raw->set(zmq::sockopt::curve_serverkey, server_pub->server_public);
        raw->set(zmq::sockopt::curve_publickey, foreign->public_key);
        raw->set(zmq::sockopt::curve_secretkey, foreign->secret_key);
      }
      raw->connect(endpoints_[static_cast<size_t>(s)]);
      for (auto kind : {wire::Kind::CreateTable, wire::Kind::PushDense, wire::Kind::PushPullDense,
                        wire::Kind::PullDense, wire::Kind::Finish}) {
        transport::Frames frames;
        const bool push = kind == wire::Kind::PushDense || kind == wire::Kind::PushPullDense;
        frames.push_back(header(kind, 16));
        if (push) {
          std::vector<float> g(16, 1000.0f);
          frames.emplace_back(g.data(), g.size() * sizeof(float));
        }
        // Queued, never delivered: the handshake does not complete (a full queue would refuse it).
        transport::Send(*raw, frames, /*dontwait=*/true).IgnoreError();
        transport::Frames reply;
        EXPECT_EQ(transport::Recv(*raw, &reply).code(), StatusCode::kDeadlineExceeded)
            << wire::KindName(kind) << " got a reply";
      }
    }
  }
  for (int s = 0; s < 2; ++s)
    EXPECT_EQ(Counter(s, "messages"), messages_before[static_cast<size_t>(s)]) << "server " << s;
  EXPECT_GE(Counter(0, "curve_refused") + Counter(1, "curve_refused"), 1);
  ASSERT_TRUE(w0->PullDense("a", after, 0).wait().ok());
  EXPECT_EQ(before, after);
  // The worker goes on as before: its push counts.
  std::vector<float> g(16, 1.0f);
  ASSERT_TRUE(w0->PushDense("a", g, 0).wait().ok());
  ASSERT_TRUE(w0->PullDense("a", after, 1).wait().ok());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 0.5f);
}

TEST_F(Curve, ServerOptionsAreChecked) {
  auto keys = curve::LoadServerKeys(keys_);
  ASSERT_TRUE(keys.ok());
  ServerOptions so;
  so.bind = "tcp://127.0.0.1:0";
  so.curve = *keys;
  so.num_workers = 3;  // the folder has keys for 2
  auto s = Server::Start(so);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("2 worker keys for a job of 3 workers"), std::string::npos) << s.status();
  so.num_workers = 0;
  so.context = Context::Create(1);
  s = Server::Start(so);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("own Context"), std::string::npos) << s.status();
  so.context = nullptr;
  so.curve->server.secret_key[0] = so.curve->server.secret_key[0] == 'a' ? 'b' : 'a';
  s = Server::Start(so);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not the secret key's"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace ferry::test
