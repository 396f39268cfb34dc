// The step pipeline of the trainer's ServerStore (param_store.h, Pipeline): what each mode reads
// at each step, how many messages it sends, and how an exchange's failure is reported.
//
// One worker on two tcp servers drives the store as a model does (tower.h): two sets of
// parameter and gradient buffers, step t on set t % 2, pulling ahead into the set of the step
// the store pulls for. The tables are SGD with learning rate 1 from zeros and the gradients
// small multiples of 1/16, so every value read is an exact sum the test computes by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ferry/trainer/param_store.h"
#include "support/cluster.h"

namespace ferry::trainer {
namespace {

constexpr int64_t kW = 20000;  // five chunks of 4096 over the two servers
constexpr int64_t kB = 3;

std::vector<TableSpec> Tables(Consistency c) {
  TableSpec w = test::SgdTable("w", kW, c);
  w.chunk_elems = 4096;
  TableSpec b = test::SgdTable("b", kB, c);
  if (c == Consistency::kSsp) w.staleness = b.staleness = 1;
  return {w, b};
}

// Step t's gradient of element i of table k (0: w, 1: b).
float Grad(int64_t t, int k, int64_t i) { return static_cast<float>((t + 1) * (i % 7 + 1 + k)) / 16.0f; }

// The value of element i of table k after the gradients of steps [0, n).
float After(int64_t n, int k, int64_t i) {
  float v = 0;
  for (int64_t s = 0; s < n; ++s) v -= Grad(s, k, i);
  return v;
}

struct Buffers {
  std::vector<float> params[2][2];  // [set][table]
  std::vector<float> grads[2][2];
  Buffers() {
    for (int s = 0; s < 2; ++s) {
      params[s][0].assign(kW, 0.0f), params[s][1].assign(kB, 0.0f);
      grads[s][0].assign(kW, 0.0f), grads[s][1].assign(kB, 0.0f);
    }
  }
  std::vector<DenseOut> Outs(int64_t step) {
    auto& p = params[step & 1];
    return {{"w", p[0]}, {"b", p[1]}};
  }
  std::vector<DenseIn> Ins(int64_t step) {
    auto& g = grads[step & 1];
    return {{"w", g[0]}, {"b", g[1]}};
  }
};

struct Reads {
  std::vector<std::vector<float>> w_read, b_read;  // per step: what Pull(t) read
  // Messages sent by the first pull, and by all the steps.
  int64_t first_pull_requests = 0;
  int64_t requests = 0;
  StoreProgress progress;
};

// `steps` steps of pull, gradient, push (and EndStep), then Flush. With `parts`, each step sends
// b first (PushPart, as --push-by-layer sends the last layer while backward computes the rest),
// then pushes both tables (the Push sends w only).
Reads Drive(const test::LocalCluster& cluster, Consistency c, Pipeline pipeline, int64_t steps, bool parts = false) {
  Reads run;
  auto client = cluster.Connect(0, 1);
  auto store = CreateServerStore(client.get(), pipeline);
  const auto specs = Tables(c);
  const Status declared = store->Declare(specs);
  EXPECT_TRUE(declared.ok()) << declared;
  Buffers buf;
  const int64_t before = client->stats().requests;  // the handshake and the declarations
  for (int64_t t = 0; t < steps; ++t) {
    const auto outs = buf.Outs(t);
    const Status pulled = store->Pull(outs, {}, t);
    EXPECT_TRUE(pulled.ok()) << pulled;
    if (t == 0) run.first_pull_requests = client->stats().requests - before;
    run.w_read.push_back(buf.params[t & 1][0]);
    run.b_read.push_back(buf.params[t & 1][1]);
    for (int k = 0; k < 2; ++k) {
      auto& g = buf.grads[t & 1][k];
      for (size_t i = 0; i < g.size(); ++i) g[i] = Grad(t, k, static_cast<int64_t>(i));
    }
    if (parts) {
      const auto ins = buf.Ins(t);
      const auto ahead = buf.Outs(t + store->pull_ahead());
      const Status part = store->PushPart(std::span(ins).subspan(1), t, std::span(ahead).subspan(1));
      EXPECT_TRUE(part.ok()) << part;
    }
    const Status pushed = store->Push(buf.Ins(t), {}, t, buf.Outs(t + store->pull_ahead()));
    EXPECT_TRUE(pushed.ok()) << pushed;
    EXPECT_TRUE(store->EndStep(t).ok());
  }
  const Status flushed = store->Flush();
  EXPECT_TRUE(flushed.ok()) << flushed;
  run.requests = client->stats().requests - before;
  run.progress = store->progress();
  return run;
}

// One worker's exchange store on one fresh server, the async tables declared (`declared`).
struct Rig {
  test::LocalCluster cluster;
  std::unique_ptr<Client> client;
  std::unique_ptr<ParamStore> store;
  Status declared;
};
Rig StartRig(bool tcp) {
  Rig rig{test::LocalCluster::Start(1, tcp), nullptr, nullptr, Status::Ok()};
  rig.client = rig.cluster.Connect(0, 1);
  rig.store = CreateServerStore(rig.client.get(), Pipeline::kExchange);
  rig.declared = rig.store->Declare(Tables(Consistency::kAsync));
  return rig;
}

// Pull(t) must have read the tables after the gradients of steps [0, n(t)).
void ExpectReads(const Reads& run, const std::function<int64_t(int64_t)>& n, const std::string& what) {
  for (size_t t = 0; t < run.w_read.size(); ++t) {
    const int64_t applied = n(static_cast<int64_t>(t));
    for (int64_t i = 0; i < kW; i += 997) {
      ASSERT_EQ(run.w_read[t][static_cast<size_t>(i)], After(applied, 0, i))
          << what << ": w[" << i << "] at step " << t;
    }
    ASSERT_EQ(run.w_read[t][kW - 1], After(applied, 0, kW - 1)) << what << ": last element at step " << t;
    for (int64_t i = 0; i < kB; ++i) {
      ASSERT_EQ(run.b_read[t][static_cast<size_t>(i)], After(applied, 1, i))
          << what << ": b[" << i << "] at step " << t;
    }
  }
}

// Exchange reads exactly what separate pulls read, for every consistency, in fewer messages:
// the pulls after the first ride on the pushes.
TEST(Pipeline, ExchangeReadsWhatSeparatePullsReadInOneRoundTripAStep) {
  constexpr int64_t kSteps = 6;
  for (Consistency c : {Consistency::kSync, Consistency::kAsync, Consistency::kSsp}) {
    const std::string what = c == Consistency::kSync ? "sync" : c == Consistency::kAsync ? "async" : "ssp";
    for (Pipeline p : {Pipeline::kNone, Pipeline::kExchange}) {
      auto cluster = test::LocalCluster::Start(2, /*tcp=*/true);
      const Reads run = Drive(cluster, c, p, kSteps);
      const std::string label = what + (p == Pipeline::kNone ? " none" : " exchange");
      ExpectReads(run, [](int64_t t) { return t; }, label);
      // Both tables travel in one message per server a call reaches (w spans both servers).
      const int64_t per_call = run.first_pull_requests;
      ASSERT_EQ(per_call, 2) << label;
      // ssp adds a clock message per server per step.
      const int64_t clocks = c == Consistency::kSsp ? 2 * kSteps : 0;
      if (p == Pipeline::kNone) {
        EXPECT_EQ(run.requests, 2 * kSteps * per_call + clocks) << label;
      } else {
        EXPECT_EQ(run.requests, (1 + kSteps) * per_call + clocks) << label;
      }
      EXPECT_EQ(run.progress.pushes_used, kSteps) << label;
      EXPECT_GT(run.progress.comm_s, 0.0) << label;
    }
  }
}

// Prefetch: step t >= 2 computes on the parameters after step t - 2's gradient (one step more
// of staleness); step 1 reads after step 0's (nothing was pulled ahead for it).
TEST(Pipeline, PrefetchReadsParametersOneStepOlder) {
  for (Consistency c : {Consistency::kAsync, Consistency::kSsp}) {
    auto cluster = test::LocalCluster::Start(2, /*tcp=*/true);
    const Reads run = Drive(cluster, c, Pipeline::kPrefetch, 7);
    ExpectReads(run, [](int64_t t) { return t < 2 ? t : t - 1; }, c == Consistency::kAsync ? "async" : "ssp");
    EXPECT_EQ(run.progress.pushes_used, 7);
  }
}

// A step sent in parts (PushPart, then Push) reads what the step sent whole reads, for every
// consistency and pipeline, and counts as one push: b's part is one more message (b lives on one
// server), w goes with the Push. With --pipeline none PushPart sends nothing.
TEST(Pipeline, AStepSentInPartsReadsWhatItReadsSentWhole) {
  constexpr int64_t kSteps = 6;
  for (Consistency c : {Consistency::kSync, Consistency::kAsync, Consistency::kSsp}) {
    for (Pipeline p : {Pipeline::kNone, Pipeline::kExchange, Pipeline::kPrefetch}) {
      if (c == Consistency::kSync && p == Pipeline::kPrefetch) continue;
      const std::string label =
          std::string(c == Consistency::kSync ? "sync" : c == Consistency::kAsync ? "async" : "ssp") +
          (p == Pipeline::kNone ? " none" : p == Pipeline::kExchange ? " exchange" : " prefetch");
      auto cluster = test::LocalCluster::Start(2, /*tcp=*/true);
      const Reads run = Drive(cluster, c, p, kSteps, /*parts=*/true);
      if (p == Pipeline::kPrefetch) {
        ExpectReads(run, [](int64_t t) { return t < 2 ? t : t - 1; }, label);
      } else {
        ExpectReads(run, [](int64_t t) { return t; }, label);
      }
      const int64_t clocks = c == Consistency::kSsp ? 2 * kSteps : 0;
      if (p == Pipeline::kNone) {
        EXPECT_EQ(run.requests, 4 * kSteps + clocks) << label;  // as whole steps: nothing sent in part
      } else {
        // Prefetch also pulls step 1 itself: nothing was pulled ahead for it.
        const int64_t pulls = p == Pipeline::kPrefetch ? 4 : 2;
        EXPECT_EQ(run.requests, pulls + 3 * kSteps + clocks) << label;
      }
      EXPECT_EQ(run.progress.pushes_used, kSteps) << label;
      EXPECT_EQ(run.progress.pushes_dropped, 0) << label;
    }
  }
}

// Misuse of PushPart is refused, saying what: a table sent twice in a step, a Pull between a
// step's parts and its Push, a Push for another step, a Push that does not pull ahead after
// parts that did. A refused Push has waited for its parts: the store still works.
TEST(Pipeline, PushPartMisuseIsRefused) {
  Rig rig = StartRig(/*tcp=*/false);
  ASSERT_TRUE(rig.declared.ok()) << rig.declared;
  auto& store = rig.store;
  Buffers buf;
  const auto b_in = [&](int64_t t) { return std::vector<DenseIn>{buf.Ins(t)[1]}; };
  const auto b_out = [&](int64_t t) { return std::vector<DenseOut>{buf.Outs(t)[1]}; };
  ASSERT_TRUE(store->Pull(buf.Outs(0), {}, 0).ok());
  ASSERT_TRUE(store->PushPart(b_in(0), 0, b_out(1)).ok());
  Status s = store->PushPart(b_in(0), 0, b_out(1));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'b' was already sent for step 0"), std::string::npos) << s;
  s = store->PushPart(std::vector<DenseIn>{buf.Ins(0)[0]}, 0, b_out(1));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;  // then_pull names another table
  s = store->Pull(buf.Outs(1), {}, 1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("step 0's push was sent in part"), std::string::npos) << s;
  s = store->Push(buf.Ins(1), {}, 1, buf.Outs(0));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("step 0 was sent in part"), std::string::npos) << s;
  // The refused Push ended the part: step 0 is pushed again, whole, and then read.
  ASSERT_TRUE(store->Push(buf.Ins(0), {}, 0, buf.Outs(1)).ok());
  ASSERT_TRUE(store->Pull(buf.Outs(1), {}, 1).ok());
  ASSERT_TRUE(store->PushPart(b_in(1), 1, b_out(0)).ok());
  s = store->Push(buf.Ins(1), {}, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("the Push must too"), std::string::npos) << s;
  // A Push from other buffers than its parts' would send them again.
  ASSERT_TRUE(store->PushPart(b_in(1), 1, b_out(0)).ok());
  s = store->Push(buf.Ins(0), {}, 1, buf.Outs(0));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("names 0 of the 1 tables its parts sent"), std::string::npos) << s;
  // A Push whose then_pull is wrong leaves its parts in flight; Flush ends them.
  ASSERT_TRUE(store->PushPart(b_in(1), 1, b_out(0)).ok());
  const auto outs = buf.Outs(0);
  const std::vector<DenseOut> swapped = {outs[1], outs[0]};
  s = store->Push(buf.Ins(1), {}, 1, swapped);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("does not match the pushed 'w'"), std::string::npos) << s;
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_TRUE(store->Pull(buf.Outs(0), {}, 2).ok());
}

// A part the servers refuse (a NaN in w) is reported by the next Pull, as a whole exchange's
// failure is, naming the step; the Push that sent the rest returned OK.
TEST(Pipeline, ARefusedPartIsReportedByTheNextPull) {
  Rig rig = StartRig(/*tcp=*/true);
  ASSERT_TRUE(rig.declared.ok()) << rig.declared;
  auto& store = rig.store;
  Buffers buf;
  ASSERT_TRUE(store->Pull(buf.Outs(0), {}, 0).ok());
  buf.grads[0][0].assign(kW, 0.5f);
  buf.grads[0][0][777] = std::numeric_limits<float>::quiet_NaN();
  const auto ins = buf.Ins(0);
  const auto ahead = buf.Outs(1);
  ASSERT_TRUE(store->PushPart(std::span(ins).first(1), 0, std::span(ahead).first(1)).ok());
  ASSERT_TRUE(store->Push(ins, {}, 0, ahead).ok());
  const Status s = store->Pull(buf.Outs(1), {}, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("push at step 0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("NaN"), std::string::npos) << s;
  EXPECT_EQ(store->progress().pushes_used, 0);
}

TEST(Pipeline, PrefetchRefusesSyncTables) {
  auto cluster = test::LocalCluster::Start(1);
  auto client = cluster.Connect(0, 1);
  auto store = CreateServerStore(client.get(), Pipeline::kPrefetch);
  const Status s = store->Declare(Tables(Consistency::kSync));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'w' is sync"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--pipeline exchange"), std::string::npos) << s;
}

// A push refused by the servers (a NaN, with the default refuse policy) inside an exchange: Push
// has returned, so the next Pull reports it, naming the step; nothing of it was applied (one
// server: each server checks its own message whole).
TEST(Pipeline, TheNextPullReportsAFailedExchange) {
  Rig rig = StartRig(/*tcp=*/true);  // one server: one message, refused whole
  ASSERT_TRUE(rig.declared.ok()) << rig.declared;
  auto& store = rig.store;
  Buffers buf;
  ASSERT_TRUE(store->Pull(buf.Outs(0), {}, 0).ok());
  buf.grads[0][0].assign(kW, 0.5f);
  buf.grads[0][0][12345] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(store->Push(buf.Ins(0), {}, 0, buf.Outs(1)).ok());
  const Status s = store->Pull(buf.Outs(1), {}, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("push at step 0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("chunk 3"), std::string::npos) << s;
  // The failed exchange pulled nothing usable: a new pull reads the tables, untouched.
  ASSERT_TRUE(store->Flush().ok());
  buf.params[1][0].assign(kW, 9.0f);
  ASSERT_TRUE(store->Pull(buf.Outs(1), {}, 1).ok());
  for (float v : buf.params[1][0]) ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(store->progress().pushes_used, 0);
}

TEST(Pipeline, ThenPullMustNameThePushedTables) {
  Rig rig = StartRig(/*tcp=*/false);
  ASSERT_TRUE(rig.declared.ok()) << rig.declared;
  auto& store = rig.store;
  Buffers buf;
  ASSERT_TRUE(store->Pull(buf.Outs(0), {}, 0).ok());
  const auto outs = buf.Outs(1);
  const std::vector<DenseOut> swapped = {outs[1], outs[0]};
  const Status s = store->Push(buf.Ins(0), {}, 0, swapped);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("does not match the pushed 'w'"), std::string::npos) << s;
  const Status short_list = store->Push(buf.Ins(0), {}, 0, std::span<const DenseOut>(outs).first(1));
  EXPECT_EQ(short_list.code(), StatusCode::kInvalidArgument) << short_list;
}

// The time a server reports holding a PushPullDense's pull (Served::held: waiting for the other
// workers, which the trainer counts as wait and takes out of comm_s) starts after its own push:
// one sync worker waits for no one, however long the server's update of its push takes (Adam
// over 4M floats here: a large part of the round trip).
TEST(Pipeline, APushPullsOwnUpdateIsNotCountedAsHeld) {
  auto cluster = test::LocalCluster::Start(1);
  auto client = cluster.Connect(0, 1);
  TableSpec spec = test::SgdTable("w", int64_t{4} << 20, Consistency::kSync);
  spec.optimizer.type = OptimizerType::kAdam;
  spec.optimizer.learning_rate = 0.01f;
  ASSERT_TRUE(client->Declare(spec).ok());
  std::vector<float> g(static_cast<size_t>(spec.shape[0]), 0.25f), w(g.size());
  const DenseIn in{"w", g};
  const DenseOut out{"w", w};
  for (int64_t step = 0; step < 3; ++step) {
    Handle h = client->PushPullDense({&in, 1}, {&out, 1}, step);
    ASSERT_TRUE(h.wait().ok());
    EXPECT_LT(h.served().held * 4, h.elapsed()) << "step " << step << ": held " << h.served().held.count()
                                                 << " us of a round trip of " << h.elapsed().count() / 1000 << " us";
  }
}

TEST(Pipeline, HandleElapsedIsTheCallToTheLastReply) {
  auto cluster = test::LocalCluster::Start(1);
  auto client = cluster.Connect(0, 1);
  ASSERT_TRUE(client->Declare(test::SgdTable("w", 8, Consistency::kAsync)).ok());
  EXPECT_EQ(Handle().elapsed().count(), 0);
  std::vector<float> w(8);
  const auto before = std::chrono::steady_clock::now();
  Handle h = client->PullDense("w", w, 0);
  ASSERT_TRUE(h.wait().ok());
  const auto after = std::chrono::steady_clock::now();
  EXPECT_GT(h.elapsed().count(), 0);
  EXPECT_LE(h.elapsed(), after - before);
}

// Rows read ahead (PullSparseAhead, the ctr model's next batch under --pipeline prefetch): the
// read travels ahead of the step's push on each server's connection, so it holds the rows as
// they were before that push, exactly; the Pull for its step that names the same buffers sends
// nothing and waits for it; a Pull into other buffers leaves it travelling; one into its buffers
// for another step waits for it and reads again.
TEST(Pipeline, RowsReadAheadHoldTheRowsBeforeTheStepsPushAndCostNoOtherRequest) {
  auto cluster = test::LocalCluster::Start(2, /*tcp=*/true);
  auto client = cluster.Connect(0, 1);
  auto store = CreateServerStore(client.get(), Pipeline::kPrefetch);
  constexpr int64_t kDim = 4;
  ASSERT_TRUE(store->Declare(std::vector<TableSpec>{test::SgdSparseTable("e", kDim)}).ok());
  const std::vector<int64_t> ids = {1, 5, 9, 1000, 77, 123456789};  // over both servers
  const size_t n = ids.size() * kDim;
  std::vector<float> rows[2] = {std::vector<float>(n, -1.0f), std::vector<float>(n, -1.0f)};
  auto out = [&](int set) { return std::vector<SparseOut>{{"e", ids, rows[set]}}; };
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i % 5 + 1) / 8.0f;
  const std::vector<SparseIn> in = {{"e", ids, g}};

  ASSERT_TRUE(store->Pull({}, out(0), 0).ok());
  for (float v : rows[0]) ASSERT_EQ(v, 0.0f);
  ASSERT_TRUE(store->PullSparseAhead(out(1), 1).ok());
  ASSERT_TRUE(store->Push({}, in, 0).ok());  // after the read on each connection
  int64_t before = client->stats().requests;
  ASSERT_TRUE(store->Pull({}, out(1), 1).ok());
  EXPECT_EQ(client->stats().requests, before) << "the Pull of rows read ahead asked again";
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rows[1][i], 0.0f) << i << ": the read ahead saw the push after it";

  // Into other buffers: the read ahead stays in flight, and is taken by its own Pull.
  ASSERT_TRUE(store->PullSparseAhead(out(1), 2).ok());
  ASSERT_TRUE(store->Pull({}, out(0), 2).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rows[0][i], -g[i]) << i;
  before = client->stats().requests;
  ASSERT_TRUE(store->Pull({}, out(1), 2).ok());
  EXPECT_EQ(client->stats().requests, before);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rows[1][i], -g[i]) << i;

  // Into its buffers for another step: waited for, then read again (after a second push).
  ASSERT_TRUE(store->PullSparseAhead(out(1), 3).ok());
  ASSERT_TRUE(store->Push({}, in, 2).ok());
  before = client->stats().requests;
  ASSERT_TRUE(store->Pull({}, out(1), 4).ok());
  EXPECT_EQ(client->stats().requests, before + 2) << "one sparse request per server";
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rows[1][i], -2.0f * g[i]) << i;
  ASSERT_TRUE(store->Flush().ok());
}

// A read ahead that fails (a table the servers do not have) is reported by the Pull that takes
// it, naming the step; and a store without --pipeline prefetch starts nothing ahead.
TEST(Pipeline, ARowsReadAheadFailureIsReportedAndOnlyPrefetchReadsAhead) {
  auto cluster = test::LocalCluster::Start(1, /*tcp=*/true);
  auto client = cluster.Connect(0, 1);
  const std::vector<int64_t> ids = {3, 4};
  std::vector<float> rows(2 * 4);
  const std::vector<SparseOut> nope = {{"nope", ids, rows}};
  {
    auto store = CreateServerStore(client.get(), Pipeline::kPrefetch);
    ASSERT_TRUE(store->PullSparseAhead(nope, 7).ok());
    const Status s = store->Pull({}, nope, 7);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("nope"), std::string::npos) << s;
    EXPECT_NE(s.message().find("step 7"), std::string::npos) << s;
  }
  auto store = CreateServerStore(client.get(), Pipeline::kExchange);
  ASSERT_TRUE(store->Declare(std::vector<TableSpec>{test::SgdSparseTable("e", 4)}).ok());
  const std::vector<SparseOut> e = {{"e", ids, rows}};
  const int64_t before = client->stats().requests;
  ASSERT_TRUE(store->PullSparseAhead(e, 0).ok());
  EXPECT_EQ(client->stats().requests, before);
  ASSERT_TRUE(store->Pull({}, e, 0).ok());
  EXPECT_EQ(client->stats().requests, before + 1);
}

// Prefetch: a step's sparse push travels with its dense exchange and ends with it (by the Pull
// of step + 2). On each server's connection it goes before the rows read ahead for step + 2, so
// those rows hold it, and after the rows read ahead for step + 1, which do not; its failure is
// reported by the Pull of step + 2, naming the step.
TEST(Pipeline, PrefetchSendsTheSparsePushWithTheExchangeInOrder) {
  auto cluster = test::LocalCluster::Start(2, /*tcp=*/true);
  auto client = cluster.Connect(0, 1);
  auto store = CreateServerStore(client.get(), Pipeline::kPrefetch);
  constexpr int64_t kDim = 4;
  std::vector<TableSpec> specs = Tables(Consistency::kAsync);
  specs.push_back(test::SgdSparseTable("e", kDim));
  ASSERT_TRUE(store->Declare(specs).ok());
  Buffers buf;
  const std::vector<int64_t> ids = {2, 11, 4096, 31337};
  const size_t n = ids.size() * kDim;
  std::vector<float> rows[2] = {std::vector<float>(n), std::vector<float>(n)};
  auto out = [&](int64_t step) { return std::vector<SparseOut>{{"e", ids, rows[step & 1]}}; };
  std::vector<float> g[2] = {std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) g[0][i] = g[1][i] = static_cast<float>(i % 3 + 1) / 4.0f;
  auto in = [&](int64_t step) { return std::vector<SparseIn>{{"e", ids, g[step & 1]}}; };

  ASSERT_TRUE(store->Pull(buf.Outs(0), out(0), 0).ok());
  ASSERT_TRUE(store->PullSparseAhead(out(1), 1).ok());
  ASSERT_TRUE(store->Push(buf.Ins(0), in(0), 0, buf.Outs(2)).ok());
  ASSERT_TRUE(store->Pull(buf.Outs(1), out(1), 1).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rows[1][i], 0.0f) << i << ": read ahead before step 0's push";
  ASSERT_TRUE(store->PullSparseAhead(out(2), 2).ok());
  ASSERT_TRUE(store->Push(buf.Ins(1), in(1), 1, buf.Outs(3)).ok());
  ASSERT_TRUE(store->Pull(buf.Outs(2), out(2), 2).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rows[0][i], -g[0][i]) << i << ": step 0's push, not step 1's";
  ASSERT_TRUE(store->Flush().ok());
  ASSERT_TRUE(store->Pull({}, out(0), 3).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rows[0][i], -2.0f * g[0][i]) << i;

  // A sparse push the servers refuse (a NaN) is reported by the Pull of step + 2.
  g[1][5] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(store->Push(buf.Ins(3), in(3), 3, buf.Outs(5)).ok());
  ASSERT_TRUE(store->Pull(buf.Outs(4), out(4), 4).ok());
  const Status s = store->Pull(buf.Outs(5), out(5), 5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("push at step 3"), std::string::npos) << s;
}

}  // namespace
}  // namespace ferry::trainer
