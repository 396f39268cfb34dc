// The parts the server is built from, one at a time: expiry order (transport::Deadlines, shared
// with the client), the job's workers (quorum, readiness), held pulls and collectives, and what
// the connections hold of messages not finished.
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/messages/deadlines.h"
#include "internal/collectives.h"
#include "internal/connections.h"
#include "internal/held.h"
#include "internal/pieces.h"
#include "internal/request.h"
#include "internal/sync.h"
#include "internal/shared_floats.h"
#include "internal/tables.h"
#include "internal/updates.h"
#include "internal/workers.h"

namespace ferry::ps {
namespace {

using std::chrono::milliseconds;

// A request as the server holds it: a verified header of `kind` from `rank` (`more` adds fields),
// with `values` as its one payload frame (all-reduce) when given.
Request MakeRequest(wire::Kind kind, int rank, int64_t barrier_id = 0, std::vector<double> values = {},
                    int64_t step = 0, const std::function<void(wire::HeaderBuilder&)>& more = {}) {
  flatbuffers::FlatBufferBuilder fbb;
  wire::HeaderBuilder b(fbb);
  b.add_major(wire::kMajor);
  b.add_minor(wire::kMinor);
  b.add_kind(kind);
  b.add_rank(rank);
  b.add_step(step);
  b.add_barrier_id(barrier_id);
  b.add_num_ids(static_cast<int64_t>(values.size()));
  if (more) more(b);
  wire::FinishHeaderBuffer(fbb, b.Finish());
  Request r;
  r.header_frame = wire::ToFrame(fbb);
  const wire::Header* h = nullptr;
  EXPECT_TRUE(wire::VerifyHeader(r.header_frame, &h).ok());
  r.verified = true;
  if (!values.empty()) r.payload.emplace_back(values.data(), values.size() * sizeof(double));
  return r;
}

TEST(Deadlines, NextIsTheEarliestAndDueIsAPrefix) {
  transport::Deadlines<int> d;
  const auto t0 = transport::Deadlines<int>::Clock::now();
  EXPECT_FALSE(d.Next().has_value());
  d.Add(t0 + milliseconds(30), 3);
  d.Add(t0 + milliseconds(10), 1);
  d.Add(t0 + milliseconds(20), 2);
  d.Add(t0 + milliseconds(10), 4);  // same deadline, another key: both kept
  EXPECT_EQ(d.Next(), t0 + milliseconds(10));
  d.Remove(t0 + milliseconds(20), 2);
  d.Remove(t0 + milliseconds(99), 3);  // never added with that deadline: ignored
  EXPECT_EQ(d.size(), 3u);
  EXPECT_TRUE(d.TakeDue(t0).empty());
  EXPECT_EQ(d.TakeDue(t0 + milliseconds(25)), (std::vector<int>{1, 4}));
  EXPECT_EQ(d.Next(), t0 + milliseconds(30));
  EXPECT_EQ(d.TakeDue(t0 + milliseconds(30)), (std::vector<int>{3}));
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(transport::Earliest(std::nullopt, t0), t0);
  EXPECT_EQ(transport::Earliest(t0 + milliseconds(1), t0), t0);
}

SyncSlots Slots(int workers, std::initializer_list<int> pushed) {
  SyncSlots s;
  s.Reset(workers, /*sparse=*/false);
  for (int r : pushed) {
    s.by_rank[static_cast<size_t>(r)] = zmq::message_t(4);
    ++s.received;
  }
  return s;
}

TEST(Workers, TheFirstHelloFixesTheCountAndLaterOnesMustAgree) {
  Workers w;
  EXPECT_EQ(w.count(), 0);
  EXPECT_EQ(w.Join(0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Join(3, 3).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.Join(1, 3).ok());
  EXPECT_EQ(w.count(), 3);
  const Status s = w.Join(0, 2);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("says the job has 2 workers, but it has 3"), std::string::npos) << s;
}

TEST(Workers, ASyncStepWaitsForEveryWorkerTakingPart) {
  Workers w;
  ASSERT_TRUE(w.Join(0, 3).ok());
  TableSpec all;  // replicas_to_aggregate 0: every worker
  EXPECT_FALSE(w.StepComplete(all, Slots(3, {}), 0));
  EXPECT_FALSE(w.StepComplete(all, Slots(3, {0, 2}), 0));
  EXPECT_EQ(w.MissingRanks(Slots(3, {0, 2}), 0), "1");
  EXPECT_TRUE(w.StepComplete(all, Slots(3, {0, 1, 2}), 0));
  TableSpec two = all;
  two.replicas_to_aggregate = 2;  // one backup worker
  EXPECT_TRUE(w.StepComplete(two, Slots(3, {0, 2}), 0));
  // A finished worker is not waited for, but its gradient held for the step still counts.
  w.Finish(1);
  EXPECT_TRUE(w.StepComplete(all, Slots(3, {0, 2}), 0));
  EXPECT_EQ(w.MissingRanks(Slots(3, {0}), 0), "2");
  EXPECT_FALSE(w.StepComplete(all, Slots(3, {0}), 0));
  // A Hello from the finished rank makes it take part again.
  ASSERT_TRUE(w.Join(1, 3).ok());
  EXPECT_FALSE(w.StepComplete(all, Slots(3, {0, 2}), 0));
}

TEST(Workers, AWorkerThatJoinsLaterIsWaitedForFromItsStepOn) {
  Workers w;
  ASSERT_TRUE(w.Join(0, 3).ok());
  ASSERT_TRUE(w.Join(1, 3).ok());
  ASSERT_TRUE(w.Join(2, 3, 0, /*joins_at=*/10).ok());  // 1.18: worker 2 takes part from step 10
  EXPECT_EQ(w.joins_at(2), 10);
  TableSpec all;
  EXPECT_TRUE(w.StepComplete(all, Slots(3, {0, 1}), 9));
  EXPECT_EQ(w.MissingRanks(Slots(3, {0}), 9), "1");
  EXPECT_EQ(w.Quorum(all, Slots(3, {0, 1}), 9), 2);
  EXPECT_FALSE(w.StepComplete(all, Slots(3, {0, 1}), 10));
  EXPECT_EQ(w.MissingRanks(Slots(3, {0, 1}), 10), "2");
  EXPECT_EQ(w.Quorum(all, Slots(3, {0, 1}), 10), 3);
  EXPECT_TRUE(w.StepComplete(all, Slots(3, {0, 1, 2}), 12));
  // A new Hello of the rank says again when it joins (0: at once).
  ASSERT_TRUE(w.Join(2, 3, 0, 0).ok());
  EXPECT_FALSE(w.StepComplete(all, Slots(3, {0, 1}), 3));
}

TEST(Workers, SspPullsWaitForTheSlowestClockStillTraining) {
  Workers w;
  ASSERT_TRUE(w.Join(0, 2).ok());
  TableSpec ssp;
  ssp.consistency = Consistency::kSsp;
  ssp.staleness = 1;
  EXPECT_EQ(w.AdvanceClock(0, 5), 5);
  EXPECT_EQ(w.AdvanceClock(0, 3), 5);  // clocks never go back
  EXPECT_EQ(w.AdvanceClock(1, 2), 2);
  EXPECT_TRUE(w.Ready(ssp, 0, 3));   // the slowest clock 2 >= 3 - 1
  EXPECT_FALSE(w.Ready(ssp, 0, 4));  // 2 < 4 - 1
  EXPECT_EQ(w.Behind(4, 1), "1 (clock 2)");
  w.Finish(1);
  EXPECT_TRUE(w.Ready(ssp, 0, 6));  // only rank 0 (clock 5) still trains
  TableSpec sync;
  sync.consistency = Consistency::kSync;
  EXPECT_TRUE(w.Ready(sync, 4, 4));
  EXPECT_FALSE(w.Ready(sync, 3, 4));
}

TEST(HeldPulls, ServeReadyKeepsArrivalOrderAndExpiryTakesOnlyWhatIsDue) {
  HeldPulls held;
  const auto t0 = Clock::now();
  for (int r = 0; r < 4; ++r) held.Hold(MakeRequest(wire::Kind::PullDense, r), t0 + milliseconds(10 * (r + 1)));
  EXPECT_EQ(held.NextDeadline(), t0 + milliseconds(10));
  std::vector<int> offered;
  held.ServeReady([&](Request& req) {
    offered.push_back(req.h()->rank());
    return req.h()->rank() % 2 == 0;  // serve ranks 0 and 2
  });
  EXPECT_EQ(offered, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(held.size(), 2u);
  EXPECT_EQ(held.NextDeadline(), t0 + milliseconds(20));  // rank 0's deadline went with it
  std::vector<Request> expired = held.TakeExpired(t0 + milliseconds(25));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].h()->rank(), 1);
  EXPECT_EQ(held.size(), 1u);
  EXPECT_EQ(held.TakeExpired(t0 + milliseconds(40)).size(), 1u);
  EXPECT_FALSE(held.NextDeadline().has_value());
}

// A piece of push call `call` from `rank`, as the server holds it.
Request MakePiece(int rank, uint64_t call, uint32_t piece, uint32_t pieces) {
  return MakeRequest(wire::Kind::PushDense, rank, 0, {}, 0, [&](wire::HeaderBuilder& b) {
    b.add_call(call);
    b.add_piece(piece);
    b.add_pieces(pieces);
  });
}

// A call's pieces are admitted in order only, each chunk once among a worker's open calls; the
// last piece completes the call, which Take hands over whole (claims released); expiry and a
// worker's Hello take its open calls.
TEST(HeldCalls, PiecesComeInOrderChunksOnceAndACallIsTakenWhole) {
  HeldCalls calls;
  const auto t0 = Clock::now();
  const auto late = t0 + milliseconds(100);
  EXPECT_EQ(calls.Admit(0, 7, 0, 1, late).code(), StatusCode::kInvalidArgument) << "one piece is no call in pieces";
  EXPECT_EQ(calls.Admit(0, 7, 0, HeldCalls::kMaxPieces + 1, late).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(calls.Admit(0, 7, 3, 3, late).code(), StatusCode::kInvalidArgument) << "no piece 3 of 3";
  EXPECT_EQ(calls.Admit(0, 7, 1, 3, late).code(), StatusCode::kInvalidArgument) << "piece 1 of a call not open";
  EXPECT_EQ(calls.calls(), 0u);

  ASSERT_TRUE(calls.Admit(0, 7, 0, 3, late).ok());
  ASSERT_TRUE(calls.Claim(0, 7, 42, 0).ok());
  EXPECT_FALSE(calls.Hold(MakePiece(0, 7, 0, 3)));
  EXPECT_EQ(calls.Admit(0, 7, 0, 3, late).code(), StatusCode::kInvalidArgument) << "the call id is open already";
  EXPECT_EQ(calls.Admit(0, 7, 2, 3, late).code(), StatusCode::kInvalidArgument) << "piece 2 before piece 1";
  ASSERT_TRUE(calls.Admit(0, 7, 1, 3, late).ok());
  EXPECT_EQ(calls.Claim(0, 7, 42, 0).code(), StatusCode::kAlreadyExists) << "chunk 0 of table 42 is held already";
  ASSERT_TRUE(calls.Claim(0, 7, 42, 1).ok());
  EXPECT_FALSE(calls.Hold(MakePiece(0, 7, 1, 3)));
  // Another worker's call may carry the same chunks; this worker's other calls may not.
  ASSERT_TRUE(calls.Admit(1, 7, 0, 2, t0 + milliseconds(50)).ok());
  EXPECT_TRUE(calls.Claim(1, 7, 42, 0).ok());
  EXPECT_FALSE(calls.Hold(MakePiece(1, 7, 0, 2)));
  ASSERT_TRUE(calls.Admit(0, 8, 0, 2, late).ok());
  EXPECT_EQ(calls.Claim(0, 8, 42, 1).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(calls.Take(0, 8)->held.size(), 0u) << "a call refused at its first piece holds nothing";
  EXPECT_EQ(calls.size(), 3u);

  ASSERT_TRUE(calls.Admit(0, 7, 2, 3, late).ok());
  EXPECT_TRUE(calls.Hold(MakePiece(0, 7, 2, 3))) << "the last piece";
  std::optional<HeldCalls::Call> c = calls.Take(0, 7);
  ASSERT_TRUE(c.has_value());
  ASSERT_EQ(c->held.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(c->held[i].h()->piece(), i);
  EXPECT_EQ(calls.size(), 1u);
  EXPECT_FALSE(calls.Take(0, 7).has_value());
  // Its claims went with it.
  ASSERT_TRUE(calls.Admit(0, 9, 0, 2, late).ok());
  EXPECT_TRUE(calls.Claim(0, 9, 42, 0).ok());

  // Worker 1's call expires first; a Hello of worker 0 takes its open call.
  EXPECT_EQ(calls.NextDeadline(), t0 + milliseconds(50));
  std::vector<HeldCalls::Call> expired = calls.TakeExpired(t0 + milliseconds(60));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].rank, 1);
  EXPECT_EQ(expired[0].held.size(), 1u);
  std::vector<HeldCalls::Call> hello = calls.TakeRank(0);
  ASSERT_EQ(hello.size(), 1u);
  EXPECT_EQ(hello[0].id, 9u);
  EXPECT_EQ(calls.calls(), 0u);
  EXPECT_EQ(calls.size(), 0u);
  EXPECT_FALSE(calls.NextDeadline().has_value());
}

// Every one of n workers takes part (none has left).
std::vector<bool> All(int n) { return std::vector<bool>(static_cast<size_t>(n), true); }

TEST(Collectives, AnAllReduceCompletesInRankOrderWithTheSum) {
  Collectives c;
  const auto deadline = Clock::now() + milliseconds(1000);
  ASSERT_TRUE(c.CheckEntry(MakeRequest(wire::Kind::AllReduce, 2, 7, {1.0, 2.0})).ok());
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::AllReduce, 2, 7, {1.0, 2.0}), deadline, All(3)).empty());
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::AllReduce, 0, 7, {10.0, 20.0}), deadline, All(3)).empty());
  EXPECT_EQ(c.size(), 2u);
  // The same rank again, or another kind or length, is refused: it would never complete.
  EXPECT_NE(c.CheckEntry(MakeRequest(wire::Kind::AllReduce, 0, 7, {1.0, 2.0})).message().find("twice"),
            std::string::npos);
  const Status mismatch = c.CheckEntry(MakeRequest(wire::Kind::AllReduce, 1, 7, {1.0}));
  EXPECT_EQ(mismatch.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.message().find("does not match"), std::string::npos) << mismatch;
  EXPECT_TRUE(c.CheckEntry(MakeRequest(wire::Kind::Barrier, 1, 8)).ok());  // another collective
  std::vector<Request> group = c.Enter(MakeRequest(wire::Kind::AllReduce, 1, 7, {100.0, 200.0}), deadline, All(3));
  ASSERT_EQ(group.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(group[static_cast<size_t>(r)].h()->rank(), r);
  EXPECT_EQ(Collectives::Sum(group), (std::vector<double>{111.0, 222.0}));
  EXPECT_EQ(c.size(), 0u);
  EXPECT_FALSE(c.NextDeadline().has_value());
}

TEST(Collectives, ExpiryNamesTheRanksThatNeverCame) {
  Collectives c;
  const auto t0 = Clock::now();
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::Barrier, 1, 3), t0 + milliseconds(10), All(4)).empty());
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::Barrier, 2, 3), t0 + milliseconds(50), All(4)).empty());
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::Barrier, 0, 4), t0 + milliseconds(30), All(4)).empty());
  EXPECT_EQ(c.NextDeadline(), t0 + milliseconds(10));  // the first arrival's
  EXPECT_TRUE(c.TakeExpired(t0, All(4)).empty());
  std::vector<Collectives::Expired> expired = c.TakeExpired(t0 + milliseconds(20), All(4));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].id, 3);
  EXPECT_EQ(expired[0].arrived.size(), 2u);
  EXPECT_EQ(expired[0].missing, "0, 3");
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.NextDeadline(), t0 + milliseconds(30));
  // A rank that never came to collective 3 comes now: it is over, and the others are past it.
  // Before, it began collective 3 again, which no one else would enter, and waited for max_wait.
  const Status late = c.CheckEntry(MakeRequest(wire::Kind::Barrier, 3, 3));
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late;
  EXPECT_NE(late.message().find("Barrier 3 has ended without worker 3 (it failed or expired, or completed while that "
                                "worker was silent): the other workers are at collective 4"),
            std::string::npos)
      << late;
  EXPECT_TRUE(c.CheckEntry(MakeRequest(wire::Kind::Barrier, 3, 4)).ok());  // still waiting: it may come
  EXPECT_TRUE(c.CheckEntry(MakeRequest(wire::Kind::Barrier, 3, 5)).ok());
}

TEST(Collectives, ARestartedRankReentersWhereTheJobIs) {
  Collectives c;
  const auto t0 = Clock::now();
  EXPECT_EQ(c.next_id(), 0);
  // Collective 0 of 3 workers completes; in collective 1, ranks 1 (first to arrive) and 0 wait
  // for rank 2 when rank 1's process dies.
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::Barrier, r, 0), t0 + milliseconds(100), All(3)).empty());
  EXPECT_EQ(c.Enter(MakeRequest(wire::Kind::Barrier, 2, 0), t0 + milliseconds(100), All(3)).size(), 3u);
  EXPECT_EQ(c.next_id(), 1);
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::AllReduce, 1, 1, {5.0}), t0 + milliseconds(10), All(3)).empty());
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::AllReduce, 0, 1, {1.0}), t0 + milliseconds(40), All(3)).empty());
  // Its new process connects: the dead one's entry goes, and the collective's deadline becomes
  // that of the first arrival still there.
  c.Forget(1);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.NextDeadline(), t0 + milliseconds(40));
  EXPECT_EQ(c.next_id(), 1);  // the new process continues the sequence here
  ASSERT_TRUE(c.CheckEntry(MakeRequest(wire::Kind::AllReduce, 1, 1, {2.0})).ok());
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::AllReduce, 1, 1, {2.0}), t0 + milliseconds(90), All(3)).empty());
  std::vector<Request> group = c.Enter(MakeRequest(wire::Kind::AllReduce, 2, 1, {4.0}), t0 + milliseconds(90), All(3));
  ASSERT_EQ(group.size(), 3u);
  EXPECT_EQ(Collectives::Sum(group), (std::vector<double>{7.0}));  // the dead process's 5 is not in it
  EXPECT_EQ(c.next_id(), 2);
  EXPECT_FALSE(c.NextDeadline().has_value());
  // Forgetting a rank that waits alone removes the collective and its deadline.
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::Barrier, 0, 2), t0 + milliseconds(10), All(3)).empty());
  c.Forget(0);
  EXPECT_EQ(c.size(), 0u);
  EXPECT_FALSE(c.NextDeadline().has_value());
  EXPECT_TRUE(c.TakeExpired(t0 + milliseconds(1000), All(3)).empty());
}

TEST(Collectives, AWorkerThatLeftIsNotWaitedFor) {
  Collectives c;
  const auto t0 = Clock::now();
  // Workers 0 and 2 of 3 wait in an all-reduce and a barrier; worker 1 then leaves (1.18).
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::AllReduce, 2, 5, {4.0}), t0 + milliseconds(1000), All(3)).empty());
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::AllReduce, 0, 5, {1.0}), t0 + milliseconds(1000), All(3)).empty());
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::Barrier, 0, 6), t0 + milliseconds(1000), All(3)).empty());
  EXPECT_TRUE(c.TakeComplete(All(3)).empty());  // nobody left: both still wait for worker 1
  EXPECT_EQ(c.Describe(0, All(3)),
            (std::vector<std::string>{"AllReduce 5 waits for worker(s) 1 (2 of 3 arrived)",
                                      "Barrier 6 waits for worker(s) 1, 2 (1 of 3 arrived)"}));
  const std::vector<bool> part = {true, false, true};
  std::vector<std::vector<Request>> done = c.TakeComplete(part);
  ASSERT_EQ(done.size(), 1u);  // the all-reduce; the barrier still waits for worker 2
  ASSERT_EQ(done[0].size(), 2u);
  EXPECT_EQ(done[0][0].h()->rank(), 0);  // in rank order: the sum adds the same numbers in the same order
  EXPECT_EQ(done[0][1].h()->rank(), 2);
  EXPECT_EQ(Collectives::Sum(done[0]), (std::vector<double>{5.0}));
  EXPECT_EQ(c.next_id(), 6);
  EXPECT_EQ(c.Describe(0, part), (std::vector<std::string>{"Barrier 6 waits for worker(s) 2 (1 of 2 arrived)"}));
  EXPECT_EQ(c.Enter(MakeRequest(wire::Kind::Barrier, 2, 6), t0 + milliseconds(1000), part).size(), 2u);
  // From now on a collective completes without it; expiry does not name it. An entry it made
  // before it left is not counted as one of the workers taking part.
  EXPECT_TRUE(c.Enter(MakeRequest(wire::Kind::Barrier, 1, 7), t0 + milliseconds(10), All(3)).empty());
  EXPECT_EQ(c.Enter(MakeRequest(wire::Kind::Barrier, 0, 7), t0 + milliseconds(10), part).size(), 0u);
  EXPECT_EQ(c.Describe(0, part), (std::vector<std::string>{"Barrier 7 waits for worker(s) 2 (1 of 2 arrived)"}));
  std::vector<Collectives::Expired> expired = c.TakeExpired(t0 + milliseconds(20), part);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].missing, "2");
  EXPECT_EQ(c.size(), 0u);
}

TEST(Sync, ARestartedRanksHeldGradientIsDroppedSoItsNewProcessCanPushTheStep) {
  SyncSlots sync;
  sync.Reset(2, /*sparse=*/true);
  const float g[2] = {1.0f, 2.0f};
  const int64_t ids[1] = {7};
  HoldGradient(sync, 1, zmq::message_t(ids, sizeof ids), zmq::message_t(g, sizeof g));
  EXPECT_EQ(sync.received, 1);
  EXPECT_FALSE(DropGradient(sync, 0));  // nothing held for rank 0
  EXPECT_TRUE(DropGradient(sync, 1));
  EXPECT_EQ(sync.received, 0);
  EXPECT_FALSE(sync.by_rank[1].has_value());
  EXPECT_FALSE(sync.ids_by_rank[1].has_value());
  EXPECT_FALSE(DropGradient(sync, 1));
  EXPECT_FALSE(DropGradient(sync, 5));  // out of range: nothing
}

TEST(Workers, SilenceFollowsThePromiseAndAHostilePromiseCannotOverflow) {
  Workers w;
  ASSERT_TRUE(w.SetCount(3).ok());
  const auto t0 = Workers::Clock::now();
  w.Promise(0, 100, t0);                  // every 100 ms: silent after max(1 s, 400 ms)
  w.Promise(1, INT64_MAX, t0);            // clamped to an hour
  w.Promise(2, 0, t0);                    // no promise: never silent
  EXPECT_TRUE(w.Silent(t0 + std::chrono::milliseconds(900), std::chrono::seconds(1)).empty());
  EXPECT_EQ(w.Silent(t0 + std::chrono::milliseconds(1100), std::chrono::seconds(1)), std::vector<int>{0});
  EXPECT_EQ(w.Silent(t0 + std::chrono::hours(5), std::chrono::seconds(1)), (std::vector<int>{0, 1}));
  w.Heard(0, t0 + std::chrono::hours(5));
  EXPECT_EQ(w.Silent(t0 + std::chrono::hours(5), std::chrono::seconds(1)), std::vector<int>{1});
}

TEST(Workers, TheConfiguredCountIsFixedBeforeAnyHello) {
  Workers w;
  ASSERT_TRUE(w.SetCount(3).ok());
  EXPECT_EQ(w.count(), 3);
  const Status s = w.Join(0, 2);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("says the job has 2 workers, but it has 3"), std::string::npos) << s;
  EXPECT_TRUE(w.Join(2, 3).ok());
  EXPECT_EQ(w.SetCount(3).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Workers().SetCount(0).code(), StatusCode::kInvalidArgument);
}

TEST(SharedFloats, AFrameSendsTheValuesThemselvesAndAWriteWhileItIsOutMovesTheChunk) {
  SharedFloats v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u);
  EXPECT_TRUE(v.Unique());
  EXPECT_TRUE(v.PrepareWrite().empty());  // no frame out: written in place

  const float* before = v.data();
  std::optional<zmq::message_t> frame(v.Frame());
  EXPECT_EQ(frame->data(), static_cast<const void*>(before));  // no copy
  EXPECT_EQ(frame->size(), 1000 * sizeof(float));
  EXPECT_FALSE(v.Unique());

  // A write while the frame is out: the chunk moves to a new buffer; the frame keeps the old one.
  SharedFloats old = v.PrepareWrite();
  ASSERT_EQ(old.data(), before);
  EXPECT_NE(v.data(), before);
  EXPECT_TRUE(v.Unique());
  for (size_t i = 0; i < v.size(); ++i) v[i] = -1.0f;
  EXPECT_EQ(static_cast<const float*>(frame->data())[999], 999.0f);
  old = SharedFloats();  // the frame is the old buffer's last holder now
  EXPECT_EQ(static_cast<const float*>(frame->data())[5], 5.0f);

  // The frame released on another thread, as ZeroMQ's I/O thread does once it has sent it.
  std::optional<zmq::message_t> second(v.Frame());
  EXPECT_FALSE(v.Unique());
  std::thread([&] {
    frame.reset();
    second.reset();
  }).join();
  EXPECT_TRUE(v.Unique());
  EXPECT_TRUE(v.PrepareWrite().empty());

  v.Assign(std::vector<float>{1.0f, 2.0f});
  EXPECT_EQ(v.size(), 2u);
  EXPECT_EQ(v[1], 2.0f);
  EXPECT_TRUE(SharedFloats().Frame().size() == 0);
}

// An update while a pull's reply still holds the chunk's values gives the bits of the update in
// place, leaves the reply's values as they were, and the next update is in place again.
TEST(SharedFloats, AnUpdateUnderAReplyInFlightGivesTheBitsOfOneInPlace) {
  ThreadPool pool(2);
  Updater updater(pool);
  TableSpec spec;
  spec.name = "w";
  spec.type = TableType::kDense;
  spec.shape = {3 * Updater::kGrain + 5};  // several ranges for the pool
  spec.chunk_elems = spec.num_elements();
  spec.optimizer.type = OptimizerType::kAdam;
  spec.init = InitType::kUniform;
  spec.init_scale = 0.1f;
  const placement::Placement one = placement::Placement::First(1);
  DenseShard in_place(spec, 1, 0, one, 1), shared(spec, 1, 0, one, 1);
  DenseChunk& a = *in_place.chunk(0);
  DenseChunk& b = *shared.chunk(0);
  ASSERT_EQ(a.params, b.params);
  std::vector<float> grad(static_cast<size_t>(a.size));
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = std::sin(static_cast<float>(i)) * 1e-2f;

  const std::vector<float> sent(b.params.begin(), b.params.end());
  const zmq::message_t reply = b.params.Frame();
  updater.ApplyDense(spec.optimizer, a, grad.data(), 1);
  updater.ApplyDense(spec.optimizer, b, grad.data(), 1);
  EXPECT_NE(static_cast<const void*>(b.params.data()), reply.data());  // moved
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.state, b.state);
  EXPECT_NE(a.params[1], sent[1]);
  EXPECT_EQ(0, std::memcmp(reply.data(), sent.data(), sent.size() * sizeof(float)));  // as it was made

  const float* now = b.params.data();
  const float* grads[] = {grad.data(), grad.data()};
  updater.ApplyDenseAverage(spec.optimizer, a, grads, 2);
  updater.ApplyDenseAverage(spec.optimizer, b, grads, 2);
  EXPECT_EQ(b.params.data(), now);  // nothing held it: in place
  EXPECT_EQ(a.params, b.params);
}

// What ZeroMQ holds of a connection's message not finished (Connections::Unfinished), with the
// bytes it took in given by the test: a connection whose messages keep being handed over is never
// judged, however much it sends between checks (a worker streaming pushes); one is judged by what
// it held at the previous check and still holds, no message of it handed over since (bytes that
// came since the previous check may be a finished message the I/O thread has not read yet); a
// worker's connection is held to a message's bound alone; the connections of no worker share
// theirs, the one judged by most closed first; one whose bytes cannot be told (ipc://) is never
// judged.
TEST(Connections, UnfinishedMessagesAreJudgedByWhatTheyStillHoldFromThePreviousCheck) {
  using Why = Connections::ToClose::Why;
  Connections conns(16, milliseconds(0));
  const auto now = Connections::Clock::now();
  Connections::Evicted evicted;
  for (int fd : {5, 6, 7, 8, 9}) ASSERT_EQ(conns.Accepted(fd, "peer" + std::to_string(fd), now, &evicted),
                                           Connections::Admit::kYes);
  ASSERT_TRUE(conns.Heard(9, "w", now).ok());
  ASSERT_TRUE(conns.Claim(9, 0, now, milliseconds(0), false, [](int) { return false; }).ok());  // a worker's
  std::map<int, uint64_t> in;
  auto taken_in = [&](int fd) -> std::optional<Connections::Taken> {
    if (fd == 8) return std::nullopt;  // ipc://
    return Connections::Taken{in[fd], in[fd]};
  };
  constexpr uint64_t kBound = 1000, kShared = 1500;
  Connections::Holding held;
  bool drained = true;
  auto check = [&] { return conns.Unfinished(now, drained, kBound, kShared, taken_in, &held); };

  // Connection 5 sends far past the bound between checks, but a message of it is handed over
  // each time: never judged.
  for (int i = 0; i < 5; ++i) {
    in[5] += 10 * kBound;
    ASSERT_TRUE(conns.Heard(5, "a", now).ok());
    EXPECT_TRUE(check().empty()) << "check " << i;
  }
  // Then it stops handing messages over: the next check counts what came since the last one that
  // found a message, the one after judges it by that.
  in[5] += kBound + 1;
  EXPECT_TRUE(check().empty());
  EXPECT_EQ(held.arrived, kBound + 1);
  EXPECT_EQ(held.judged, 0u);
  auto closed = check();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].fd, 5);
  EXPECT_EQ(closed[0].reason, Why::kUnfinished);
  EXPECT_NE(closed[0].why.find("more than the 1000 a message may have"), std::string::npos) << closed[0].why;
  EXPECT_TRUE(check().empty()) << "handed out twice";

  // Connections 6 and 7 (no worker), silent for many checks, hold 900 and 700, each within the
  // bound, 1600 together: not at the first check after they came (a finished message may wait
  // there for the I/O thread), at the next the one judged by more is closed. The worker's 9 holds
  // 1000, within its bound, and shares no bound with them. The ipc connection 8 is never judged.
  in[6] = 900;
  in[7] = 700;
  in[9] = 1000;
  EXPECT_TRUE(check().empty());
  EXPECT_EQ(conns.anonymous_held(), 0u);
  closed = check();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].fd, 6);
  EXPECT_NE(closed[0].why.find("hold 1600 together, more than their bound of 1500"), std::string::npos)
      << closed[0].why;
  EXPECT_EQ(conns.anonymous_held(), 700u);
  EXPECT_TRUE(check().empty());

  // Short of memory: the connections of no worker judged holding at least 500 are closed (7); the
  // worker's is not.
  closed = conns.AnonymousHolders(now, 500, "short of memory");
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].fd, 7);
  EXPECT_NE(closed[0].why.find("short of memory"), std::string::npos);
  EXPECT_TRUE(conns.AnonymousHolders(now, 1, "again").empty()) << "closed twice, or the ipc one (never judged)";

  // While the I/O thread has not read every finished message (not drained), a worker's
  // connection past its bound may only have them waiting: it is kept; later, drained, it is not.
  in[9] = 5 * kBound;
  drained = false;
  EXPECT_TRUE(check().empty());
  EXPECT_TRUE(check().empty());
  drained = true;
  closed = check();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].fd, 9);
}

}  // namespace
}  // namespace ferry::ps
