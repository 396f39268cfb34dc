// Real ferry-ps processes on tcp loopback, driven by in-process workers.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <zmq_addon.hpp>

#include "ferry/client.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "support/ps_process.h"
#include "support/scenarios.h"

namespace ferry::test {
namespace {

struct Processes {
  explicit Processes(int n) {
    for (int s = 0; s < n; ++s) ps.push_back(std::make_unique<PsProcess>(s, n));
    for (auto& p : ps) address.endpoints.push_back(p->endpoint());
  }
  bool ok() const {
    for (auto& e : address.endpoints) {
      if (e.empty()) return false;
    }
    return true;
  }
  std::vector<std::unique_ptr<PsProcess>> ps;
  ClusterAddress address;
};

TEST(Processes, SyncOverTcpMatchesSequentialReferenceBitwise) {
  Processes p(2);
  ASSERT_TRUE(p.ok()) << "ferry-ps did not start (" << FERRY_PS_PATH << ")";
  ExpectSyncMatchesSequential(p.address, 2, OptimizerType::kAdam, 5, "tcp_");
}

// The sparse sync step over real ferry-ps processes: three servers, one id per worker a step.
TEST(Processes, SyncSparseWithFewerIdsThanServersOverTcpMatchesReference) {
  Processes p(3);
  ASSERT_TRUE(p.ok()) << "ferry-ps did not start (" << FERRY_PS_PATH << ")";
  ExpectSyncMatchesSequential(p.address, 2, OptimizerType::kAdam, 200, "tcp_few_ids_", /*ids_per_step=*/1);
}

TEST(Processes, AsyncOverTcpLosesNoUpdate) {
  Processes p(2);
  ASSERT_TRUE(p.ok());
  ExpectAsyncLosesNothing(p.address, 2, 20, "tcp_");
}

TEST(Processes, GarbageOverTcpGetsAnErrorAndTheServerServesOthers) {
  Processes p(1);
  ASSERT_TRUE(p.ok());
  auto ctx = Context::Create(1);
  auto raw = transport::MakeSocket(transport::Zmq(*ctx), zmq::socket_type::dealer);
  ASSERT_TRUE(raw.ok());
  raw->set(zmq::sockopt::rcvtimeo, 10000);
  raw->connect(p.address.endpoints[0]);
  for (int i = 0; i < 20; ++i) {
    std::string junk = "not a ferry message #" + std::to_string(i);
    transport::Frames f;
    f.emplace_back(junk.data(), junk.size());
    f.emplace_back(i);
    ASSERT_TRUE(transport::Send(*raw, f).ok());
    transport::Frames reply;
    ASSERT_TRUE(transport::Recv(*raw, &reply).ok()) << "no reply to garbage " << i;
    const wire::Header* h = nullptr;
    ASSERT_TRUE(wire::VerifyHeader(reply[0], &h).ok());
    EXPECT_EQ(h->kind(), wire::Kind::Error);
  }
  ExpectAsyncLosesNothing(p.address, 2, 5, "after_garbage_");
  auto c = ConnectWorker(p.address, 0, 2);
  ASSERT_NE(c, nullptr);
  auto counters = c->ServerCounters(0);
  ASSERT_TRUE(counters.ok()) << counters.status();
  EXPECT_EQ((*counters)["bad_messages"], 20);
}

TEST(Processes, SigtermStopsTheServerCleanly) {
  Processes p(1);
  ASSERT_TRUE(p.ok());
  const int status = p.ps[0]->Terminate();
  ASSERT_TRUE(WIFEXITED(status)) << "ferry-ps did not exit on SIGTERM (status " << status << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Rank 0 of a 2-worker sync job pushes step 0 and pulls step 1 of a table spread over both
// servers: both hold the pull (rank 1 never pushes), so only a failure can end it. Then
// `hurt(server 1)`. The pull must fail UNAVAILABLE naming server 1, within `bound`, far inside
// the 60 s request timeout (so it is not the timeout that ends it).
Status HeldPullAfter(Processes& p, std::chrono::milliseconds heartbeat, const std::function<void(PsProcess&)>& hurt) {
  ClientOptions o;
  o.servers = p.address.endpoints;
  o.num_workers = 2;
  o.request_timeout = std::chrono::seconds(60);
  o.heartbeat_timeout = heartbeat;
  auto c = Client::Connect(o);
  if (!c.ok()) return c.status();
  TableSpec t;
  t.name = "held";
  t.shape = {64};
  t.chunk_elems = 8;  // 8 chunks: both servers hold some
  t.consistency = Consistency::kSync;
  FERRY_RETURN_IF_ERROR((*c)->Declare(t));
  std::vector<float> grad(64, 1.0f), out(64);
  FERRY_RETURN_IF_ERROR((*c)->PushDense("held", grad, 0).wait());
  Handle pull = (*c)->PullDense("held", out, 1);
  usleep(200000);
  if (pull.done()) return InternalError("the pull was not held");
  hurt(*p.ps[1]);
  return pull.wait(std::chrono::seconds(30));
}

TEST(Processes, AKilledServerFailsTheRequestsInFlightToItAtOnce) {
  Processes p(2);
  ASSERT_TRUE(p.ok());
  const Status s = HeldPullAfter(p, std::chrono::seconds(5), [](PsProcess& ps) { ps.Signal(SIGKILL); });
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("server 1 (" + p.address.endpoints[1] + ") closed the connection"), std::string::npos)
      << s;
}

TEST(Processes, AHungServerIsNoticedByHeartbeats) {
  Processes p(2);
  ASSERT_TRUE(p.ok());
  // 3 s: server 0, which is not stopped, must answer each ping within it, which a loaded
  // machine may delay by a second.
  const Status s = HeldPullAfter(p, std::chrono::seconds(3), [](PsProcess& ps) { ps.Signal(SIGSTOP); });
  p.ps[1]->Signal(SIGCONT);  // so that it can be stopped cleanly
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("server 1 (" + p.address.endpoints[1] + ")"), std::string::npos) << s;
  EXPECT_NE(s.message().find("heartbeats unanswered for 3000 ms"), std::string::npos) << s;
}

}  // namespace
}  // namespace ferry::test
