// Push calls in pieces (protocol 1.10): a dense push that touches a sync table and takes several
// messages to one server is held there until its last piece has verified, then applied whole; a
// refused piece leaves nothing of the call applied. And what a peer sending pieces by hand can
// and cannot make a server do (the attack table of messages/PROTOCOL.md).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "support/cluster.h"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kElems = 100000;
constexpr int64_t kChunk = 10000;  // 10 chunks of 40,000 bytes

TableSpec PiecesTable(const std::string& name) {
  TableSpec spec = SgdTable(name, kElems, Consistency::kSync);
  spec.chunk_elems = kChunk;
  return spec;
}

// One chunk a message: 10 pieces to the one server.
ClientOptions OneChunkAMessage() {
  ClientOptions o;
  o.dense_message_bytes = 1;
  return o;
}

// A sync step of one worker closes with its push: before 1.10 the pieces before a refused one
// were applied. Now a refused piece, first or last, leaves every chunk as it was, and the call's
// pieces are answered with the refusal; the step then takes the worker's good push whole, and a
// push+pull in pieces returns what it applied.
TEST(Pieces, ASyncPushInPiecesIsAppliedWholeOrNotAtAll) {
  auto c = LocalCluster::Start(1);
  auto w = c.Connect(0, 1, OneChunkAMessage());
  ASSERT_TRUE(w->Declare(PiecesTable("w")).ok());
  std::vector<float> g(kElems, 1.0f), p(kElems, 7.0f);
  for (int64_t bad : {kElems - 1, int64_t{3}, kElems / 2}) {
    SCOPED_TRACE("NaN at element " + std::to_string(bad));
    g[static_cast<size_t>(bad)] = std::numeric_limits<float>::quiet_NaN();
    const int64_t before = w->stats().requests;
    Status s = w->PushDense("w", g, 0).wait(10s);
    EXPECT_EQ(w->stats().requests - before, 10) << "ten pieces";
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("holds NaN or Inf"), std::string::npos) << s;
    g[static_cast<size_t>(bad)] = 1.0f;
    ASSERT_TRUE(w->PullDense("w", p, 0).wait(10s).ok());
    for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], 0.0f) << "element " << i << " was changed";
  }
  const ServerStats refused = c.servers[0]->stats();
  EXPECT_EQ(refused.counters.at("piece_calls_refused"), 3);

  // The step is still open for this worker: its good push is taken whole.
  ASSERT_TRUE(w->PushDense("w", g, 0).wait(10s).ok());
  ASSERT_TRUE(w->PullDense("w", p, 1).wait(10s).ok());
  for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], -1.0f) << i;
  const DenseIn in{"w", g};
  const DenseOut out{"w", p};
  ASSERT_TRUE(w->PushPullDense(std::span<const DenseIn>(&in, 1), std::span<const DenseOut>(&out, 1), 1).wait(10s).ok());
  for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], -2.0f) << i;
  const ServerStats after = c.servers[0]->stats();
  EXPECT_EQ(after.counters.at("piece_calls_refused"), 3) << "no more refused";
  EXPECT_GE(after.counters.at("pieces_held") - refused.counters.at("pieces_held"), 20) << "two calls of ten";
}

// Two workers, two servers: each server holds its share of a worker's call until its last piece,
// and the job gives the bits of the same job in one message per server.
TEST(Pieces, TwoWorkersInPiecesGiveTheBitsOfOneMessageAServer) {
  std::vector<std::vector<float>> results;
  for (bool pieces : {false, true}) {
    SCOPED_TRACE(pieces ? "pieces" : "one message a server");
    auto c = LocalCluster::Start(2);
    ClientOptions o;
    o.dense_message_bytes = pieces ? 1 : 0;
    auto w0 = c.Connect(0, 2, o), w1 = c.Connect(1, 2, o);
    ASSERT_TRUE(w0->Declare(PiecesTable("w")).ok());
    ASSERT_TRUE(w1->Declare(PiecesTable("w")).ok());
    std::vector<float> g0(kElems), g1(kElems), p0(kElems), p1(kElems);
    for (int64_t step = 0; step < 3; ++step) {
      for (size_t i = 0; i < g0.size(); ++i) {
        g0[i] = std::sin(static_cast<float>(i + step));
        g1[i] = std::cos(static_cast<float>(3 * i + step));
      }
      const DenseIn in0{"w", g0}, in1{"w", g1};
      const DenseOut out0{"w", p0}, out1{"w", p1};
      Handle h0 = w0->PushPullDense(std::span<const DenseIn>(&in0, 1), std::span<const DenseOut>(&out0, 1), step);
      Handle h1 = w1->PushPullDense(std::span<const DenseIn>(&in1, 1), std::span<const DenseOut>(&out1, 1), step);
      ASSERT_TRUE(h0.wait(10s).ok());
      ASSERT_TRUE(h1.wait(10s).ok());
      ASSERT_EQ(p0, p1);
    }
    if (pieces) {
      EXPECT_GT(c.servers[0]->stats().counters.at("pieces_held"), 0);
    }
    results.push_back(p0);
  }
  EXPECT_EQ(results[0], results[1]);
}

// A peer that sends pieces by hand (speaking for worker 1 of 2) cannot get any of a call applied
// that is not whole and in order, nor hold a server's memory past its deadline.
class HandPieces : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions so;
    so.max_wait = 1500ms;  // the incomplete call below expires within it
    c_ = LocalCluster::Start(1, false, so);
    w0_ = c_.Connect(0, 2);
    TableSpec spec = SgdTable("w", 8, Consistency::kSync);
    spec.chunk_elems = 4;
    ASSERT_TRUE(w0_->Declare(spec).ok());
    auto raw = transport::MakeSocket(transport::Zmq(*c_.context), zmq::socket_type::dealer);
    ASSERT_TRUE(raw.ok());
    raw_ = std::make_unique<zmq::socket_t>(std::move(*raw));
    raw_->set(zmq::sockopt::rcvtimeo, 5000);
    raw_->connect(c_.endpoints[0]);
  }

  // Piece `piece` of `pieces` of `call`: a PushDense of chunk `chunk` (4 ones) for step 0.
  void SendPiece(uint64_t id, uint64_t call, uint32_t piece, uint32_t pieces, int64_t chunk) {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<wire::DenseSlice> slices = {wire::DenseSlice(TableId("w"), chunk, 4)};
    auto vec = fbb.CreateVectorOfStructs(slices);
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(wire::Kind::PushDense);
    b.add_request_id(id);
    b.add_rank(1);
    b.add_step(0);
    b.add_slices(vec);
    b.add_call(call);
    b.add_piece(piece);
    b.add_pieces(pieces);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    transport::Frames f;
    f.push_back(wire::ToFrame(fbb));
    const float ones[4] = {1, 1, 1, 1};
    f.emplace_back(ones, sizeof ones);
    ASSERT_TRUE(transport::Send(*raw_, f).ok());
  }

  // The next reply: its request id and status.
  std::pair<uint64_t, Status> Next() {
    transport::Frames reply;
    Status s = transport::Recv(*raw_, &reply);
    if (!s.ok()) return {0, s};
    const wire::Header* h = nullptr;
    if (Status v = wire::VerifyHeader(reply[0], &h); !v.ok()) return {0, v};
    if (h->kind() != wire::Kind::Error) return {h->request_id(), Status::Ok()};
    return {h->request_id(), wire::ErrorStatus(*h)};
  }

  // Expects the reply to request `id` next, refused with `code` and a message holding `text`.
  void ExpectRefused(uint64_t id, StatusCode code, const std::string& text) {
    auto [got, s] = Next();
    EXPECT_EQ(got, id) << s;
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(text), std::string::npos) << s;
  }

  LocalCluster c_;
  std::unique_ptr<Client> w0_;
  std::unique_ptr<zmq::socket_t> raw_;
};

TEST_F(HandPieces, AMalformedOrIncompleteCallAppliesNothing) {
  SendPiece(1, 5, 0, 1, 0);
  ExpectRefused(1, StatusCode::kInvalidArgument, "a call in pieces has 2 to 65536 of them");
  SendPiece(2, 5, 2, 2, 0);
  ExpectRefused(2, StatusCode::kInvalidArgument, "no such piece");
  SendPiece(3, 5, 1, 2, 0);
  ExpectRefused(3, StatusCode::kInvalidArgument, "the call is not open here");
  // A chunk twice in one call: the call ends, its first piece answered too.
  SendPiece(4, 6, 0, 3, 0);
  SendPiece(5, 6, 1, 3, 0);
  ExpectRefused(4, StatusCode::kAlreadyExists, "piece 0 of 3 of call 6 was not applied, nor any of the call");
  ExpectRefused(5, StatusCode::kAlreadyExists, "is in an open call of worker 1 already");
  SendPiece(6, 6, 2, 3, 1);
  ExpectRefused(6, StatusCode::kInvalidArgument, "the call is not open here");
  // Out of order.
  SendPiece(7, 7, 0, 3, 0);
  SendPiece(8, 7, 2, 3, 1);
  ExpectRefused(7, StatusCode::kInvalidArgument, "was not applied, nor any of the call");
  ExpectRefused(8, StatusCode::kInvalidArgument, "the call expects piece 1 of 3 next");
  // Left incomplete: answered at the server's max_wait, its piece never applied.
  SendPiece(9, 8, 0, 2, 0);
  ExpectRefused(9, StatusCode::kDeadlineExceeded, "1 of its 2 pieces arrived within 1500 ms");

  const ServerStats s = c_.servers[0]->stats();
  EXPECT_EQ(s.counters.at("piece_calls_refused"), 3);
  EXPECT_EQ(s.counters.at("held_expired"), 1);
  // Nothing of worker 1 was applied: step 0 still waits for it, and worker 0's push closes
  // nothing alone.
  std::vector<float> g(8, 2.0f), p(8);
  ASSERT_TRUE(w0_->PushDense("w", g, 0).wait(5s).ok());
  Handle pull = w0_->PullDense("w", p, 1);
  EXPECT_EQ(pull.wait(300ms).code(), StatusCode::kDeadlineExceeded) << "step 0 must wait for worker 1";
  // Worker 1's whole call in pieces closes it with exactly its gradient.
  SendPiece(10, 9, 0, 2, 0);
  SendPiece(11, 9, 1, 2, 1);
  EXPECT_EQ(Next().second, Status::Ok());
  EXPECT_EQ(Next().second, Status::Ok());
  ASSERT_TRUE(pull.wait(5s).ok());
  EXPECT_EQ(p, std::vector<float>(8, -1.5f));  // lr 1, the mean of 2 and 1
}

}  // namespace
}  // namespace ferry::test
