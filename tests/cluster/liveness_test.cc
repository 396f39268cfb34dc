// Servers notice a worker that fell silent (protocol 1.3 heartbeats, ServerOptions::worker_timeout):
// what waits for it fails at once with UNAVAILABLE naming it, rather than after max_wait; a
// worker that is slow but alive is waited for; a client that promised no heartbeats is never
// called silent. In-process clusters; a worker "dies" when its client is destroyed without
// Finish (its I/O thread, which sends the heartbeats, is gone), as a killed process's would.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/cluster.h"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TableSpec SyncTable(const std::string& name = "w") {
  TableSpec spec;
  spec.name = name;  // not a literal: GCC 12 warns falsely (-Wrestrict) on assigning one at -O3
  spec.shape = {8};
  spec.consistency = Consistency::kSync;
  return spec;
}

// How long a worker's client says it may stay silent (ClientOptions::heartbeat_timeout; it pings
// every quarter of it, and the servers call it silent after the larger of that and their
// worker_timeout). A worker that dies in a test promises little, so that the servers call it
// silent 300 ms after its death; one that lives promises much, so that they never call it
// silent, however long a loaded machine leaves its I/O thread without the CPU (seconds: a
// 50 ms sleep overslept by 335 ms with two busy loops beside a build on 2 cores). A test of
// whether heartbeats keep a worker alive says so and takes its own margin.
constexpr std::chrono::milliseconds kDying = 200ms;
constexpr std::chrono::milliseconds kLiving = 20s;

class Liveness : public testing::Test {
 protected:
  // Servers that call a worker silent after 300 ms (or 4 x its heartbeat promise), and hold a
  // pull for at most 20 s.
  static LocalCluster Servers(int n = 2) {
    ServerOptions so;
    so.worker_timeout = 300ms;
    so.max_wait = 20s;
    return LocalCluster::Start(n, false, so);
  }
  // A worker's client that waits up to 30 s for a reply: a failure that comes as UNAVAILABLE
  // came from the servers' liveness check, not from a timeout.
  static ClientOptions Options(std::chrono::milliseconds heartbeat) {
    ClientOptions o;
    o.heartbeat_timeout = heartbeat;
    o.request_timeout = 30s;
    return o;
  }
  static std::unique_ptr<Client> Worker(const LocalCluster& c, int rank, std::chrono::milliseconds heartbeat = kLiving,
                                        int num_workers = 2) {
    auto w = c.Connect(rank, num_workers, Options(heartbeat));
    EXPECT_TRUE(w && w->Declare(SyncTable()).ok());
    return w;
  }
  // Returns once the servers have called worker `dead` silent, which `probe` (a live worker)
  // learns from a table that needs every worker's push (bounded by the servers' max wait): its
  // pull of step 1 fails naming `dead`. Call it with every other worker but `probe` alive and
  // not yet in table `table`.
  static void AwaitCalledSilent(Client& probe, int dead, const std::string& table = "probe") {
    ASSERT_TRUE(probe.Declare(SyncTable(table)).ok());
    std::vector<float> g(8, 1.0f), out(8);
    ASSERT_TRUE(probe.PushDense(table, g, 0).wait().ok());
    const Status s = probe.PullDense(table, out, 1).wait();
    ASSERT_EQ(s.code(), StatusCode::kUnavailable) << s;
    ASSERT_NE(s.message().find("worker " + std::to_string(dead) + " has sent nothing for"), std::string::npos) << s;
  }
};

TEST_F(Liveness, APullWaitingForADeadWorkerFailsNamingIt) {
  auto c = Servers();
  auto w0 = Worker(c, 0);
  std::vector<float> g(8, 1.0f), out(8);
  {
    auto w1 = Worker(c, 1, kDying);  // connects, then dies before pushing step 0
  }
  ASSERT_TRUE(w0->PushDense("w", g, 0).wait().ok());
  const auto t0 = Clock::now();
  const Status s = w0->PullDense("w", out, 1).wait();
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("the pull failed after %.2f s: %s\n", took, s.ToString().c_str());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("waits for the gradients of worker(s) 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("worker 1 has sent nothing for"), std::string::npos) << s;
  int64_t failed = 0;
  for (const auto& server : c.servers) failed += server->stats().counters.at("failed_for_silent_worker");
  EXPECT_GE(failed, 1);
}

// The lines ClientOptions::on_long_wait was given (it is called on the client's threads).
struct LongWaits {
  std::mutex mu;
  std::vector<std::string> lines;
  void Watch(ClientOptions* o) {
    o->long_wait_every = 200ms;
    o->on_long_wait = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(line);
    };
  }
  std::vector<std::string> Lines() {
    std::lock_guard<std::mutex> lock(mu);
    return lines;
  }
};

// The first line holding `text`, waiting for it (bounded: 20 s); "" if none came.
std::string AwaitLine(LongWaits& waits, const std::string& text) {
  for (int i = 0; i < 200; ++i) {
    for (const std::string& line : waits.Lines()) {
      if (line.find(text) != std::string::npos) return line;
    }
    std::this_thread::sleep_for(100ms);
  }
  return "";
}

TEST_F(Liveness, AStepWaitingForASlowWorkerIsReportedWhileItWaitsNamingTheWorker) {
  auto c = Servers(1);
  LongWaits waits;
  ClientOptions o = Options(kLiving);
  waits.Watch(&o);
  auto w0 = c.Connect(0, 2, o);
  ASSERT_TRUE(w0 && w0->Declare(SyncTable()).ok());
  auto w1 = Worker(c, 1);
  std::vector<float> g(8, 1.0f), out(8);
  ASSERT_TRUE(w0->PushDense("w", g, 0).wait().ok());
  Handle pull = w0->PullDense("w", out, 1);  // held until worker 1 pushes step 0
  // The server, asked what it holds the pull for (Waiting), names worker 1; once a line says so,
  // worker 1 pushes.
  const std::string named = AwaitLine(waits, "waits for the gradients of worker(s) 1");
  ASSERT_TRUE(w1->PushDense("w", g, 0).wait().ok());
  ASSERT_TRUE(pull.wait().ok());
  EXPECT_NE(named.find("for server 0 (" + c.endpoints[0] + ") to answer PullDense; it holds PullDense: table 'w' "
                       "chunk 0 is at step 0 and waits for the gradients of worker(s) 1 (1 of 2 pushed)"),
            std::string::npos)
      << "no line named the missing worker in 20 s; lines: " << testing::PrintToString(waits.Lines());
  // Every line says how long out of how long, and a line before the server's answer came says
  // what such a pull waits for.
  for (const std::string& line : waits.Lines()) {
    EXPECT_EQ(line.rfind("waiting ", 0), 0u) << line;
    EXPECT_NE(line.find(" s (of 30) for server 0"), std::string::npos) << line;
    if (line.find("; it holds ") == std::string::npos) {
      EXPECT_NE(line.find("to answer PullDense (a sync pull waits for every worker's push of the step before"),
                std::string::npos)
          << line;
    }
  }
}

TEST_F(Liveness, ABarrierWaitingForAWorkerIsReportedNamingItAndTheCount) {
  auto c = Servers(1);
  LongWaits waits;
  ClientOptions o = Options(kLiving);
  waits.Watch(&o);
  auto w0 = c.Connect(0, 2, o);
  auto w1 = Worker(c, 1);
  ASSERT_TRUE(w0 && w1);
  std::thread late([&] {
    AwaitLine(waits, "waits for worker(s) 1");
    EXPECT_TRUE(w1->Barrier().ok());
  });
  EXPECT_TRUE(w0->Barrier().ok());
  late.join();
  const std::string named = AwaitLine(waits, "waits for worker(s) 1");
  EXPECT_NE(named.find("to answer Barrier; it holds Barrier 0 waits for worker(s) 1 (1 of 2 arrived)"),
            std::string::npos)
      << "lines: " << testing::PrintToString(waits.Lines());
}

TEST_F(Liveness, AServerThatNeverAnswersIsReportedWhileConnectWaits) {
  LongWaits waits;
  ClientOptions o;
  o.servers = {"ipc:///tmp/ferry-no-server-" + std::to_string(::getpid())};  // nothing listens there
  // Notices every 200 ms while Connect waits 3 s: a notice comes unless the client's thread
  // gets no CPU for 2.8 s.
  o.connect_timeout = 3s;
  waits.Watch(&o);
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded) << c.status();
  const std::vector<std::string> lines = waits.Lines();
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("to answer Hello (is it running, and is this its address?)"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(o.servers[0]), std::string::npos) << lines[0];
}

TEST_F(Liveness, AnAllReduceWaitingForADeadWorkerFailsNamingIt) {
  auto c = Servers(1);
  auto w0 = Worker(c, 0);
  { auto w1 = Worker(c, 1, kDying); }
  const double v[2] = {1.0, 2.0};
  const auto sum = w0->AllReduceSum(v);
  ASSERT_FALSE(sum.ok());
  EXPECT_EQ(sum.status().code(), StatusCode::kUnavailable) << sum.status();
  EXPECT_NE(sum.status().message().find("waits for worker(s) 1"), std::string::npos) << sum.status();
  EXPECT_NE(sum.status().message().find("worker 1 has sent nothing for"), std::string::npos) << sum.status();
}

TEST_F(Liveness, ABarrierCompletesWithoutWorkersThatAreSilent) {
  // 3 workers: worker 2 dies; the barrier waits for worker 1 (alive, late), then completes
  // without worker 2 once it is silent. The next collective takes the next id.
  auto c = Servers(1);
  auto w0 = c.Connect(0, 3, Options(kLiving)), w1 = c.Connect(1, 3, Options(kLiving));
  { auto w2 = c.Connect(2, 3, Options(kDying)); }
  Status s0;
  std::thread t([&] { s0 = w0->Barrier(); });
  // Worker 2 is silent now; worker 1 is not in the barrier yet. (No ASSERT: thread t must be
  // joined; worker 1's barrier goes on either way.)
  AwaitCalledSilent(*w1, 2);
  EXPECT_TRUE(w1->Barrier().ok());
  t.join();
  EXPECT_TRUE(s0.ok()) << s0;
  auto w2 = c.Connect(2, 3, Options(kLiving));  // a new process of worker 2 continues at the next collective
  std::vector<Status> s(3);
  std::thread a([&] { s[0] = w0->Barrier(); }), b([&] { s[1] = w1->Barrier(); });
  s[2] = w2->Barrier();
  a.join();
  b.join();
  for (const auto& x : s) EXPECT_TRUE(x.ok()) << x;
}

// Servers that call a worker silent after 1 s, and a worker 1 (its client's `options`) that
// pings every 50 ms: while it computes for 2.5 times the servers' timeout, its heartbeats keep it
// alive, and worker 0's pull waits for it (unless its client's thread gets no CPU for most of a
// second).
void ExpectASlowLiveWorkerWaitedFor(const ClientOptions& options) {
  ServerOptions so;
  so.worker_timeout = 1s;
  so.max_wait = 20s;
  auto c = LocalCluster::Start(2, false, so);
  ClientOptions living;
  living.heartbeat_timeout = kLiving;
  living.request_timeout = 30s;
  auto w0 = c.Connect(0, 2, living);
  auto w1 = c.Connect(1, 2, options);
  for (auto* w : {w0.get(), w1.get()}) ASSERT_TRUE(w->Declare(SyncTable()).ok());
  std::vector<float> g(8, 1.0f), out(8);
  ASSERT_TRUE(w0->PushDense("w", g, 0).wait().ok());
  Handle pull = w0->PullDense("w", out, 1);
  std::this_thread::sleep_for(2500ms);
  EXPECT_FALSE(pull.done()) << pull.wait(0ms);
  ASSERT_TRUE(w1->PushDense("w", g, 0).wait().ok());
  EXPECT_TRUE(pull.wait().ok());
  EXPECT_EQ(pull.served().version, 1);
  for (const auto& server : c.servers) {
    EXPECT_EQ(server->stats().counters.at("failed_for_silent_worker"), 0);
    EXPECT_EQ(server->stats().counters.at("rank_conflicts"), 0);
  }
}

TEST_F(Liveness, ASlowWorkerThatIsAliveIsWaitedFor) { ExpectASlowLiveWorkerWaitedFor(Options(200ms)); }

// The same with worker 1 a restarted process (incarnation 1, as the launcher numbers restarts):
// its heartbeats carry its incarnation. They did not, so the servers refused each as its
// predecessor's and called it silent after 1 s, failing worker 0's pull naming it.
TEST_F(Liveness, ARestartedWorkerThatIsAliveIsWaitedFor) {
  ClientOptions restarted = Options(200ms);
  restarted.incarnation = 1;
  ExpectASlowLiveWorkerWaitedFor(restarted);
}

TEST_F(Liveness, WithBackupWorkersAStepThatCanCloseWithoutTheDeadIsWaitedFor) {
  // 3 workers, each step aggregates 2: worker 2 dies; worker 0's pull waits for worker 1, which
  // is alive and slow: the pull must not fail for worker 2's silence.
  auto c = Servers(1);
  TableSpec spec = SyncTable();
  spec.replicas_to_aggregate = 2;
  std::unique_ptr<Client> w[3];
  for (int r = 0; r < 3; ++r) {
    w[r] = c.Connect(r, 3, Options(r == 2 ? kDying : kLiving));
    ASSERT_TRUE(w[r]->Declare(spec).ok());
  }
  w[2].reset();
  std::vector<float> g(8, 1.0f), out(8);
  ASSERT_TRUE(w[0]->PushDense("w", g, 0).wait().ok());
  Handle pull = w[0]->PullDense("w", out, 1);
  // The servers look at every waiting pull when they call a worker silent: worker 0's was
  // waiting when they called worker 2 silent (its probe failed), and must still wait.
  ASSERT_NO_FATAL_FAILURE(AwaitCalledSilent(*w[1], 2));
  EXPECT_FALSE(pull.done()) << pull.wait(0ms);
  ASSERT_TRUE(w[1]->PushDense("w", g, 0).wait().ok());
  EXPECT_TRUE(pull.wait().ok());
  EXPECT_EQ(c.servers[0]->stats().counters.at("failed_for_silent_worker"), 1);  // the probe's
}

// A process of worker 1 restarted into a sync job in progress that starts over (StartBarrier,
// protocol 1.12), while worker 0 trains: worker 0 may be held on another server, waiting there
// for worker 1's gradient, where this server cannot see it (a SIGKILL between worker 1's pushes
// to two servers). Its start is refused within seconds saying to resume, instead of everyone
// waiting for the servers' max wait; only its own entry: worker 2, finished and waiting at the
// closing barrier, waits on, and meets worker 1's resumed process there. A plain Barrier in the
// place of the start is a meeting like any other: waited for.
TEST_F(Liveness, AStartWhileAnotherWorkerTrainsIsRefusedSayingToResume) {
  auto c = Servers(1);
  // Worker 0 pings every 500 ms: the server hears it after worker 1's start came.
  auto w0 = Worker(c, 0, 2s, 3), w2 = Worker(c, 2, kLiving, 3);
  std::vector<float> g(8, 1.0f);
  {
    auto w1 = Worker(c, 1, kDying, 3);
    for (Client* w : {w0.get(), w1.get(), w2.get()}) ASSERT_TRUE(w->PushDense("w", g, 0).wait().ok());
  }  // worker 1 dies after step 0; worker 0 trains on (it computes, or waits on another server)
  {
    auto w1 = Worker(c, 1, kDying, 3);
    std::atomic<bool> returned{false};
    Status s1;
    std::thread t([&] {
      s1 = w1->Barrier();  // collective 0, as the others' next
      returned = true;
    });
    std::this_thread::sleep_for(3s);  // past the 2 s after which the server refuses a start
    EXPECT_FALSE(returned.load()) << s1;
    std::thread t2([&] { EXPECT_TRUE(w2->Barrier().ok()); });
    EXPECT_TRUE(w0->Barrier().ok());
    t.join();
    t2.join();
    EXPECT_TRUE(s1.ok()) << s1;
  }
  ASSERT_TRUE(w2->Finish().ok());
  Status s2;
  std::thread closing([&] { s2 = w2->Barrier(); });  // worker 2 at the closing barrier: collective 1
  auto w1 = Worker(c, 1, kDying, 3);
  const Status s = w1->StartBarrier();  // collective 1 too: worker 0 will come to it, but not to start
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("Barrier 1 on server 0: worker(s) 1 wait here, but worker 1 waits at the job's start, "
                             "and worker 0 is training already (it pushed to this server since it connected, and "
                             "was heard from since): it will not come to the start. A worker that joins a job in "
                             "progress must be started with --resume"),
            std::string::npos)
      << s;
  w1.reset();
  // Worker 1 resumed (no start): collective 1 is still the job's next, and completes with everyone.
  auto resumed = Worker(c, 1, kLiving, 3);
  std::thread t1([&] { EXPECT_TRUE(resumed->Barrier().ok()); });
  EXPECT_TRUE(w0->Barrier().ok());
  t1.join();
  closing.join();
  EXPECT_TRUE(s2.ok()) << s2;
}

TEST_F(Liveness, AWorkerThatPromisedNoHeartbeatsIsNeverCalledSilent) {
  ServerOptions so;
  so.worker_timeout = 300ms;
  so.max_wait = 1500ms;
  auto c = LocalCluster::Start(1, false, so);
  auto w0 = Worker(c, 0);
  { auto w1 = Worker(c, 1, /*heartbeat=*/0ms); }
  std::vector<float> g(8, 1.0f), out(8);
  ASSERT_TRUE(w0->PushDense("w", g, 0).wait().ok());
  const Status s = w0->PullDense("w", out, 1).wait();
  // It waits out the server's max wait instead.
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("waited 1500 ms"), std::string::npos) << s;
}

}  // namespace
}  // namespace ferry::test
