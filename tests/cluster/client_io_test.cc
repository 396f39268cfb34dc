// Who reads a client's replies (client.cc): a caller waiting for its operation reads them itself,
// one caller at a time; other waiting callers are told by whoever completes their operation; the
// client's I/O thread reads them when no caller waits. These tests use that from several threads
// of one client, with operations nobody waits for, and with a client closed under a waiting
// caller: each operation must get its own reply, exactly once, and no wait may outlast its bound.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/cluster.h"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

// Threads of one client each run their own push+pull loop on their own table. With SGD at
// learning rate 1 from zeros, after k pushes of g = (t + 1) the table holds -k (t + 1): every
// pull tells whether that thread got its own reply, and all of its pushes were applied once.
TEST(ClientIo, ThreadsSharingAClientEachGetTheirOwnReplies) {
  for (const bool tcp : {false, true}) {
    SCOPED_TRACE(tcp ? "tcp" : "inproc");
    auto c = LocalCluster::Start(2, tcp);
    auto w = c.Connect(0, 1);
    constexpr int kThreads = 4, kSteps = 150, kN = 1000;
    for (int t = 0; t < kThreads; ++t) {
      TableSpec spec = SgdTable(std::string("t").append(std::to_string(t)), kN, Consistency::kAsync);
      spec.chunk_elems = 300;  // several chunks on each of the two servers
      ASSERT_TRUE(w->Declare(spec).ok());
    }
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const std::string name = std::string("t").append(std::to_string(t));
        std::vector<float> g(kN, static_cast<float>(t + 1)), p(kN, 0.0f);
        for (int k = 1; k <= kSteps; ++k) {
          const DenseIn in[] = {{name, g}};
          const DenseOut out[] = {{name, p}};
          Status s = w->PushPullDense(in, out, k).wait(30s);
          const float want = -static_cast<float>(k) * static_cast<float>(t + 1);
          if (!s.ok() || p.front() != want || p.back() != want) {
            std::fprintf(stderr, "thread %d step %d: %s, got %g..%g, want %g\n", t, k, s.ToString().c_str(), p.front(),
                         p.back(), want);
            ++wrong;
            return;
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0);
  }
}

// An operation that nobody waits for still completes (the I/O thread reads its replies): one
// started after another caller's wait has ended, and one started before it and left in flight.
// Without heartbeats the I/O thread has no timer of its own to wake it: it must be told.
TEST(ClientIo, OperationsNobodyWaitsForCompleteInTheBackground) {
  auto c = LocalCluster::Start(2, /*tcp=*/true);
  ClientOptions o;
  o.heartbeat_timeout = 0ms;
  auto w = c.Connect(0, 1, o);
  ASSERT_TRUE(w->Declare(SgdTable("a", 5000, Consistency::kAsync)).ok());
  ASSERT_TRUE(w->Declare(SgdTable("b", 5000, Consistency::kAsync)).ok());
  std::vector<float> g(5000, 1.0f), pa(5000), pb(5000);
  constexpr int kRounds = 20;
  for (int round = 0; round < kRounds; ++round) {
    Handle before = w->PushDense("a", g, round);
    ASSERT_TRUE(w->PushDense("b", g, round).wait(10s).ok());
    Handle after = w->PushDense("a", g, round);
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!(before.done() && after.done()) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(100us);
    }
    ASSERT_TRUE(before.done() && after.done()) << "round " << round << ": a push nobody waited for never completed";
    ASSERT_TRUE(before.wait(0ms).ok());
    ASSERT_TRUE(after.wait(0ms).ok());
  }
  ASSERT_TRUE(w->PullDense("a", pa, kRounds).wait(10s).ok());
  ASSERT_TRUE(w->PullDense("b", pb, kRounds).wait(10s).ok());
  EXPECT_EQ(pa.front(), -2.0f * kRounds);
  EXPECT_EQ(pa.back(), -2.0f * kRounds);
  EXPECT_EQ(pb.back(), -1.0f * kRounds);
}

// A caller waiting (and reading the sockets) for a reply that will not come for minutes: a sync
// pull of a step the other worker never pushes. Closing the client from another thread ends that
// wait at once with the reason, and the closing does not wait for the server either.
TEST(ClientIo, ClosingTheClientEndsAnotherThreadsWait) {
  for (const bool tcp : {false, true}) {
    SCOPED_TRACE(tcp ? "tcp" : "inproc");
    auto c = LocalCluster::Start(1, tcp);
    auto w = c.Connect(0, 2);
    ASSERT_TRUE(w->Declare(SgdTable("s", 100, Consistency::kSync)).ok());
    std::vector<float> g(100, 1.0f), p(100);
    ASSERT_TRUE(w->PushDense("s", g, 0).wait(10s).ok());  // worker 1 never pushes: step 1 never comes
    Status got;
    std::atomic<bool> waiting{false};
    std::thread waiter([&] {
      Handle h = w->PullDense("s", p, 1);
      waiting = true;
      got = h.wait(120s);
    });
    while (!waiting) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(200ms);  // the waiter is inside its wait, reading the socket
    const auto start = std::chrono::steady_clock::now();
    w.reset();
    waiter.join();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
    EXPECT_EQ(got.code(), StatusCode::kCancelled) << got;
    EXPECT_NE(got.message().find("client closed"), std::string::npos) << got;
  }
}

}  // namespace
}  // namespace ferry::test
