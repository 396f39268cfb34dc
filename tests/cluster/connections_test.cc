// A server's connections over real tcp sockets on 127.0.0.1 (ps/server/internal/connections.h):
// one live connection per worker rank, a cap on how many are open (a worker beyond it is told
// why), and idle connections closed without harm to real clients.
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <zmq.hpp>

#include "ferry/curve.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "support/cluster.h"
#include "support/raw_zmtp.h"
#include "support/temp_dir.h"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

ClientOptions Worker(const LocalCluster& c, int rank, int num_workers) {
  ClientOptions o;
  o.servers = c.endpoints;
  o.context = c.context;
  o.rank = rank;
  o.num_workers = num_workers;
  o.connect_timeout = 10s;
  o.request_timeout = 10s;
  return o;
}

// A bare DEALER to the server: what a stray or hostile peer has.
zmq::socket_t Raw(const LocalCluster& c) {
  auto s = transport::MakeSocket(transport::Zmq(*c.context), zmq::socket_type::dealer);
  EXPECT_TRUE(s.ok());
  s->set(zmq::sockopt::rcvtimeo, 5000);
  s->connect(c.endpoints[0]);
  return std::move(*s);
}

// Sends one request (header only, or with `payload`) and returns the reply's header status:
// OK for a Reply, the Error's status otherwise.
Status Ask(zmq::socket_t& s, wire::Kind kind, int rank, std::function<void(wire::HeaderBuilder&)> fill = {},
           transport::Frames payload = {}) {
  static uint64_t next_id = 1000;
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<wire::DenseSlice> slices = {wire::DenseSlice(TableId("w"), 0, 4)};
  auto vec = fbb.CreateVectorOfStructs(slices);
  wire::HeaderBuilder b(fbb);
  b.add_major(wire::kMajor);
  b.add_kind(kind);
  b.add_request_id(++next_id);
  b.add_rank(rank);
  if (kind == wire::Kind::PushDense || kind == wire::Kind::PullDense) b.add_slices(vec);
  if (fill) fill(b);
  wire::FinishHeaderBuffer(fbb, b.Finish());
  transport::Frames out;
  out.push_back(wire::ToFrame(fbb));
  for (auto& p : payload) out.push_back(std::move(p));
  if (Status st = transport::Send(s, out); !st.ok()) return st;
  transport::Frames reply;
  if (Status st = transport::Recv(s, &reply); !st.ok()) return st;
  const wire::Header* h = nullptr;
  if (Status st = wire::VerifyHeader(reply[0], &h); !st.ok()) return st;
  EXPECT_EQ(h->request_id(), next_id);
  return h->kind() == wire::Kind::Error ? wire::ErrorStatus(*h) : Status::Ok();
}

void HelloFields(wire::HeaderBuilder& b, int num_workers, int64_t heartbeat_ms) {
  b.add_num_workers(num_workers);
  b.add_num_servers(1);
  b.add_server_rank(0);
  b.add_heartbeat_ms(heartbeat_ms);
}

// Waits (bounded) until the socket's monitor reports its connection closed by the server.
bool ClosedWithin(zmq::socket_t& monitor, std::chrono::milliseconds limit) {
  monitor.set(zmq::sockopt::rcvtimeo, static_cast<int>(limit.count()));
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    zmq::message_t event, addr;
    if (!monitor.recv(event)) return false;
    (void)monitor.recv(addr);
    uint16_t id;
    std::memcpy(&id, event.data(), sizeof id);
    if (id == ZMQ_EVENT_DISCONNECTED) return true;
  }
  return false;
}

zmq::socket_t Watch(const LocalCluster& c, zmq::socket_t& s, const std::string& name) {
  const std::string at = "inproc://connections-test-" + name;
  EXPECT_EQ(zmq_socket_monitor(s.handle(), at.c_str(), ZMQ_EVENT_DISCONNECTED), 0);
  zmq::socket_t m(transport::Zmq(*c.context), zmq::socket_type::pair);
  m.connect(at);
  return m;
}

std::vector<float> Pull(Client& w) {
  std::vector<float> v(4);
  const Status s = w.PullDense("w", v, 0).wait();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return v;
}

// Without CURVE, a peer can still name any rank; but while worker 0's connection is alive, a
// second one speaking for worker 0 (a Hello, a push) is refused, changes nothing, and says which
// connection has the rank. Once worker 0's process ends, its successor connects at once.
TEST(Connections, ASecondConnectionForALiveWorkerIsRefused) {
  auto c = LocalCluster::Start(1, /*tcp=*/true);
  auto w0 = Client::Connect(Worker(c, 0, 2));
  ASSERT_TRUE(w0.ok()) << w0.status().ToString();
  ASSERT_TRUE((*w0)->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());

  ClientOptions twin_options = Worker(c, 0, 2);
  twin_options.connect_timeout = 1s;  // how long it asks again, in case worker 0 is on its way out
  auto twin = Client::Connect(twin_options);
  ASSERT_FALSE(twin.ok());
  EXPECT_EQ(twin.status().code(), StatusCode::kAlreadyExists) << twin.status().ToString();
  EXPECT_NE(twin.status().message().find("worker 0 is connected already, from 127.0.0.1:"), std::string::npos)
      << twin.status().ToString();

  zmq::socket_t raw = Raw(c);
  const std::vector<float> grad = {1, 1, 1, 1};
  transport::Frames payload;
  payload.emplace_back(grad.data(), grad.size() * sizeof(float));
  const Status push = Ask(raw, wire::Kind::PushDense, 0, {}, std::move(payload));
  EXPECT_EQ(push.code(), StatusCode::kAlreadyExists) << push.ToString();
  EXPECT_EQ(Pull(**w0), std::vector<float>(4, 0.0f)) << "the refused push changed the table";
  // Another rank is free to the raw peer (no CURVE: that is what keys are for).
  EXPECT_TRUE(Ask(raw, wire::Kind::PullDense, 1).ok());

  const std::vector<float> mine = {2, 2, 2, 2};
  ASSERT_TRUE((*w0)->PushDense("w", mine, 0).wait().ok());
  EXPECT_EQ(Pull(**w0), std::vector<float>(4, -2.0f));
  EXPECT_GE(c.servers[0]->stats().counters["rank_conflicts"], 2);

  w0->reset();  // worker 0's process ends: its connection closes
  auto next = Client::Connect(Worker(c, 0, 2));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  ASSERT_TRUE((*next)->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());
  EXPECT_EQ(Pull(**next), std::vector<float>(4, -2.0f));
}

// A restarted worker (ferry-launch counts the starts: ClientOptions::incarnation) takes its rank
// over at once, though its predecessor's connection is open and heard from (a stopped process
// whose connection has not closed, a host cut off); from then on every request of the
// predecessor, and any later Hello of its incarnation, is refused and changes nothing.
TEST(Connections, ALaterIncarnationTakesTheRankOverAndFencesTheEarlierOne) {
  auto c = LocalCluster::Start(1, /*tcp=*/true);
  auto first = Client::Connect(Worker(c, 0, 1));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE((*first)->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());
  const std::vector<float> ones = {1, 1, 1, 1};
  ASSERT_TRUE((*first)->PushDense("w", ones, 0).wait().ok());

  // The same incarnation is refused while the first is alive (what a restart met before).
  ClientOptions same = Worker(c, 0, 1);
  same.connect_timeout = 1s;
  auto twin = Client::Connect(same);
  ASSERT_FALSE(twin.ok());
  EXPECT_EQ(twin.status().code(), StatusCode::kAlreadyExists) << twin.status().ToString();

  ClientOptions restarted = Worker(c, 0, 1);
  restarted.incarnation = 1;
  restarted.connect_timeout = 1s;  // no waiting for the first to go silent (heartbeats every 1.25 s)
  auto next = Client::Connect(restarted);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  ASSERT_TRUE((*next)->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());
  EXPECT_EQ(Pull(**next), std::vector<float>(4, -1.0f));

  // The first process's requests are refused, naming its successor, and change nothing.
  const Status fenced = (*first)->PushDense("w", ones, 0).wait();
  EXPECT_EQ(fenced.code(), StatusCode::kFailedPrecondition) << fenced.ToString();
  EXPECT_NE(fenced.message().find("worker 0's process of incarnation 0 was replaced by its incarnation 1"),
            std::string::npos)
      << fenced.ToString();
  std::vector<float> v(4);
  EXPECT_EQ((*first)->PullDense("w", v, 0).wait().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Pull(**next), std::vector<float>(4, -1.0f)) << "a fenced push changed the table";
  ASSERT_TRUE((*next)->PushDense("w", ones, 0).wait().ok());
  EXPECT_EQ(Pull(**next), std::vector<float>(4, -2.0f));

  // Once the successor is gone too, the earlier incarnation still cannot come back (a raw Hello,
  // as a stopped process that resumes would send), but a later one can.
  next->reset();
  zmq::socket_t raw = Raw(c);
  const Status old_hello = Ask(raw, wire::Kind::Hello, 0, [](wire::HeaderBuilder& b) { HelloFields(b, 1, 0); });
  EXPECT_EQ(old_hello.code(), StatusCode::kFailedPrecondition) << old_hello.ToString();
  restarted.incarnation = 2;
  auto third = Client::Connect(restarted);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  ASSERT_TRUE((*third)->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());
  EXPECT_EQ(Pull(**third), std::vector<float>(4, -2.0f));
  EXPECT_GE(c.servers[0]->stats().counters["rank_conflicts"], 4);
}

// An owner that stopped talking (a stopped or cut-off worker whose connection has not closed)
// hands the rank over once it has been silent for twice its heartbeat promise.
TEST(Connections, ASilentOwnerHandsTheRankOver) {
  auto c = LocalCluster::Start(1, /*tcp=*/true);
  zmq::socket_t stale = Raw(c);
  ASSERT_TRUE(Ask(stale, wire::Kind::Hello, 0, [](wire::HeaderBuilder& b) { HelloFields(b, 1, 50); }).ok());
  std::this_thread::sleep_for(300ms);  // > 2 x 50 ms of silence
  auto w0 = Client::Connect(Worker(c, 0, 1));
  ASSERT_TRUE(w0.ok()) << w0.status().ToString();
  ASSERT_TRUE((*w0)->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());
  // Now the stale connection is the second one.
  EXPECT_EQ(Ask(stale, wire::Kind::PullDense, 0).code(), StatusCode::kAlreadyExists);
}

// Beyond max_connections a new connection is refused: a worker connecting then is told why
// (RESOURCE_EXHAUSTED naming the limit) and its connection is closed; once one closes, it can.
TEST(Connections, BeyondTheCapAWorkerIsToldWhyAndTheConnectionCloses) {
  ServerOptions so;
  so.max_connections = 2;
  auto c = LocalCluster::Start(1, /*tcp=*/true, so);
  zmq::socket_t a = Raw(c), b = Raw(c);
  ASSERT_TRUE(Ask(a, wire::Kind::Stats, 0).ok());
  ASSERT_TRUE(Ask(b, wire::Kind::Stats, 0).ok());

  auto w0 = Client::Connect(Worker(c, 0, 1));
  ASSERT_FALSE(w0.ok());
  EXPECT_EQ(w0.status().code(), StatusCode::kResourceExhausted) << w0.status().ToString();
  EXPECT_NE(w0.status().message().find("--max-connections 2"), std::string::npos) << w0.status().ToString();

  zmq::socket_t third = Raw(c);
  zmq::socket_t watch = Watch(c, third, "cap");
  EXPECT_EQ(Ask(third, wire::Kind::Stats, 0).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(ClosedWithin(watch, 10s)) << "the refused connection was not closed";
  EXPECT_GE(c.servers[0]->stats().counters["connections_refused"], 2);

  b.close();
  for (int i = 0; i < 500 && c.servers[0]->stats().counters["connections_open"] > 2; ++i)
    std::this_thread::sleep_for(10ms);
  // `third` reconnects by itself (ZeroMQ) and may take the free place; `a` and `third` close
  // so that the worker surely has one.
  third.close();
  for (int i = 0; i < 500 && c.servers[0]->stats().counters["connections_open"] > 1; ++i)
    std::this_thread::sleep_for(10ms);
  auto w1 = Client::Connect(Worker(c, 0, 1));
  ASSERT_TRUE(w1.ok()) << w1.status().ToString();
  EXPECT_TRUE((*w1)->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());
}

// Bare TCP connections that never send a byte (no ZMTP greeting; with CURVE, no handshake, as a
// peer without a key) beyond the cap cannot lock the job's workers out: before, once the cap
// was full every new connection was refused, a worker's too (5,000 keyless connections locked a
// CURVE job's valid keys out). Now the oldest silent one is closed to make room.
void SilentConnectionsCannotLockAWorkerOut(bool with_curve) {
  TempDir tmp{"connections"};
  ServerOptions so;
  so.max_connections = 8;
  ClientOptions wo;
  if (with_curve) {
    if (!curve::Available()) GTEST_SKIP() << "this libzmq was built without CURVE";
    const std::string keys = tmp.path().string() + "/keys";
    ASSERT_TRUE(curve::WriteJobKeys(keys, 1).ok());
    auto server_keys = curve::LoadServerKeys(keys);
    auto client_keys = curve::LoadClientKeys(keys, 0);
    ASSERT_TRUE(server_keys.ok() && client_keys.ok());
    so.curve = *server_keys;
    wo.curve = *client_keys;
  }
  auto c = LocalCluster::Start(1, /*tcp=*/true, so);
  const std::string& ep = c.endpoints[0];
  const int port = std::stoi(ep.substr(ep.rfind(':') + 1));
  std::vector<int> silent;
  for (int i = 0; i < 40; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
    silent.push_back(fd);
  }
  // The server has seen them all (bounded wait): 8 admitted, the rest made room or were refused.
  auto counter = [&](const char* name) { return c.servers[0]->stats().counters[name]; };
  for (int i = 0; i < 1000 && counter("connections_idle_closed") + counter("connections_refused") < 32; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_GE(counter("connections_idle_closed"), 32) << "the silent connections did not make room for newer ones";
  ClientOptions o = Worker(c, 0, 1);
  o.curve = wo.curve;
  auto w = Client::Connect(o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());
  const std::vector<float> grad = {1, 1, 1, 1};
  EXPECT_TRUE((*w)->PushDense("w", grad, 0).wait().ok());
  EXPECT_EQ(Pull(**w), std::vector<float>(4, -1.0f));
  EXPECT_LE(counter("connections_open"), 8 + 64) << "the cap, and the refused ones being told so";
  for (int fd : silent) ::close(fd);
}

TEST(Connections, SilentConnectionsCannotLockAWorkerOut) { SilentConnectionsCannotLockAWorkerOut(false); }
TEST(Connections, SilentConnectionsCannotLockAWorkerOutWithCurve) { SilentConnectionsCannotLockAWorkerOut(true); }

// ZeroMQ hands a message over whole, so it keeps every frame of a multipart message until the
// last comes, and bounds only a frame's size: before, a peer could make the server hold any
// amount (two messages of 100,000 frames of 8 KiB left it 800 MB larger while they came) and keep
// it for as long as it liked by never sending the last frame. Now the server counts what ZeroMQ
// took in of each connection since its last message, and ends a connection holding more than a
// message may have (twice the limit, as a primary's Replicate, and 1 MiB for framing: 9 MiB
// here): this one sends 64 MiB of 64 KiB frames and never the last one.
TEST(Connections, AMessageThatNeverEndsIsCutOffAtTheMessageLimit) {
  ServerOptions so;
  so.max_message_bytes = 4 << 20;
  auto c = LocalCluster::Start(1, /*tcp=*/true, so);
  const int fd = RawZmtp(c.endpoints[0]);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const size_t sent = SendUnfinished(fd, size_t{64} << 20);
  EXPECT_TRUE(EndedWithin(fd, 20s)) << "the server kept the connection after " << sent
                                     << " bytes of a message that does not end";
  ::close(fd);
  auto counters = c.servers[0]->stats().counters;
  EXPECT_EQ(counters["connections_unfinished_closed"], 1);
  // The server serves on: a worker connects and trains.
  auto w = c.Connect(0, 1);
  ASSERT_TRUE(w->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());
  const std::vector<float> grad = {1, 1, 1, 1};
  EXPECT_TRUE(w->PushDense("w", grad, 0).wait().ok());
  EXPECT_EQ(Pull(*w), std::vector<float>(4, -1.0f));
}

// The connections that speak for no worker share a bound on what ZeroMQ holds of their messages
// not finished, a quarter of the memory budget (or one message's bound, where that is more): six
// peers that each sent most of a 900 MiB message could otherwise make a server of a 4 GiB budget
// hold 5.4 GB. Past it, the connection holding most is ended, and the others are kept. Here the
// message limit is 4 MiB (a connection's bound 9 MiB, as above) and the budget 32 MiB (so the
// bound is 9 MiB): three peers hold 4.5, 3.5 and 2.5 MiB, 10.5 together.
TEST(Connections, ConnectionsThatSpeakForNoWorkerShareABoundOnUnfinishedMessages) {
  ServerOptions so;
  so.max_message_bytes = 4 << 20;
  so.memory_budget_bytes = 32 << 20;
  auto c = LocalCluster::Start(1, /*tcp=*/true, so);
  std::vector<int> fds;
  for (size_t kib : {4608, 3584, 2560}) {
    fds.push_back(RawZmtp(c.endpoints[0]));
    ASSERT_GE(fds.back(), 0) << std::strerror(errno);
    ASSERT_GE(SendUnfinished(fds.back(), kib << 10), kib << 10) << "the server ended a connection within the bounds";
  }
  EXPECT_TRUE(EndedWithin(fds[0], 20s)) << "the connection holding most was kept";
  // A second of checks (every 250 ms) more: the two others, 6 MiB together, stay.
  EXPECT_FALSE(EndedWithin(fds[1], 1s));
  EXPECT_FALSE(EndedWithin(fds[2], 10ms));
  auto counters = c.servers[0]->stats().counters;
  EXPECT_EQ(counters["connections_unfinished_closed"], 1);
  EXPECT_GE(counters["unfinished_message_bytes"], int64_t{6} << 20);
  for (int fd : fds) ::close(fd);
}

// What a connection sent is not what ZeroMQ takes to keep it: a frame of no bytes is 2 bytes on
// the wire and 64 in memory. So where the connections that speak for no worker hold unfinished
// messages while the server's heap in use beyond its budget's charges is past their bound and 256 MiB,
// they are all ended. Here a peer sends 7 million empty frames (14 MB, within its 17 MiB bound,
// 450 MB in ZeroMQ's queue) and never the last one.
TEST(Connections, UnfinishedMessagesOfSmallFramesAreWeighedByTheMemoryTheyTake) {
  ServerOptions so;
  so.max_message_bytes = 8 << 20;
  so.memory_budget_bytes = 32 << 20;
  auto c = LocalCluster::Start(1, /*tcp=*/true, so);
  const int fd = RawZmtp(c.endpoints[0]);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const size_t sent = SendUnfinished(fd, size_t{14} << 20, /*empty=*/true);
  EXPECT_TRUE(EndedWithin(fd, 20s)) << "the server kept the connection after " << sent
                                     << " bytes of empty frames of a message that does not end";
  ::close(fd);
  EXPECT_EQ(c.servers[0]->stats().counters["connections_unfinished_closed"], 1);
}

// A connection that speaks for no worker and says nothing is closed after idle_timeout; a
// worker's connection is never closed for idleness (there is one per rank: they cannot pile up),
// whether its client sends heartbeats or not.
TEST(Connections, IdleConnectionsCloseButWorkersStay) {
  ServerOptions so;
  so.idle_timeout = 300ms;
  auto c = LocalCluster::Start(1, /*tcp=*/true, so);
  zmq::socket_t idle = Raw(c);
  zmq::socket_t watch = Watch(c, idle, "idle");
  EXPECT_TRUE(ClosedWithin(watch, 10s)) << "an idle connection was not closed";
  EXPECT_GE(c.servers[0]->stats().counters["connections_idle_closed"], 1);
  idle.close();  // or ZeroMQ reconnects it, to be closed again

  ClientOptions quiet = Worker(c, 0, 1);
  quiet.heartbeat_timeout = 0ms;  // no heartbeats: silent between requests
  auto w0 = Client::Connect(quiet);
  ASSERT_TRUE(w0.ok()) << w0.status().ToString();
  ASSERT_TRUE((*w0)->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());
  const int64_t closed_before = c.servers[0]->stats().counters["connections_idle_closed"];
  std::this_thread::sleep_for(1500ms);
  const std::vector<float> grad = {1, 1, 1, 1};
  EXPECT_TRUE((*w0)->PushDense("w", grad, 0).wait().ok());
  EXPECT_EQ(Pull(**w0), std::vector<float>(4, -1.0f));
  EXPECT_EQ(c.servers[0]->stats().counters["connections_idle_closed"], closed_before)
      << "the worker's connection was closed for idleness";
}

// A peer that sends requests and never reads the replies cannot make the server wait or grow
// without bound: once its queue of unread replies is full, newer replies to it are dropped,
// counted and logged, and a real worker is served all the while.
TEST(Connections, APeerThatNeverReadsLosesItsRepliesAndTheServerGoesOn) {
  auto c = LocalCluster::Start(1, /*tcp=*/true);
  auto w0 = Client::Connect(Worker(c, 0, 1));
  ASSERT_TRUE(w0.ok()) << w0.status().ToString();
  ASSERT_TRUE((*w0)->Declare(SgdTable("w", 4, Consistency::kAsync)).ok());

  auto made = transport::MakeSocket(transport::Zmq(*c.context), zmq::socket_type::dealer, 100000);
  ASSERT_TRUE(made.ok());
  zmq::socket_t flood = std::move(*made);
  flood.set(zmq::sockopt::rcvhwm, 1);     // its side holds almost nothing unread...
  flood.set(zmq::sockopt::rcvbuf, 4096);  // ...nor does its kernel
  flood.set(zmq::sockopt::sndtimeo, 10000);
  flood.connect(c.endpoints[0]);
  flatbuffers::FlatBufferBuilder fbb;
  wire::HeaderBuilder b(fbb);
  b.add_major(wire::kMajor);
  b.add_kind(wire::Kind::Stats);
  b.add_request_id(1);
  wire::FinishHeaderBuffer(fbb, b.Finish());
  // Stats replies are about 2 KiB: 30000 of them are far more than the queue (8192) and the
  // kernel's buffers hold.
  int sent = 0;
  for (; sent < 30000 && c.servers[0]->stats().counters["replies_dropped"] == 0; ++sent) {
    transport::Frames out;
    out.push_back(wire::ToFrame(fbb));
    ASSERT_TRUE(transport::Send(flood, out).ok()) << "request " << sent;
    if (sent % 1000 == 0) {
      EXPECT_EQ(Pull(**w0), std::vector<float>(4, 0.0f)) << "the worker was not served";
    }
  }
  for (int i = 0; i < 1000 && c.servers[0]->stats().counters["replies_dropped"] == 0; ++i)
    std::this_thread::sleep_for(10ms);
  std::printf("sent %d requests unread; the server dropped %lld replies\n", sent,
              static_cast<long long>(c.servers[0]->stats().counters["replies_dropped"]));
  EXPECT_GT(c.servers[0]->stats().counters["replies_dropped"], 0);
  EXPECT_GT(sent, 8192) << "replies were dropped before the queue was full";
  const std::vector<float> grad = {1, 1, 1, 1};
  EXPECT_TRUE((*w0)->PushDense("w", grad, 0).wait().ok());
  EXPECT_EQ(Pull(**w0), std::vector<float>(4, -1.0f));
}

}  // namespace
}  // namespace ferry::test
