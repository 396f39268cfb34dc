// The verifier refuses truncated, oversized, garbage and mismatched messages before use.
#include <vector>

#include <gtest/gtest.h>

#include "ferry/messages/wire.h"

namespace ferry::wire {
namespace {

zmq::message_t PushHeader(int64_t count, uint16_t major = kMajor) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<DenseSlice> slices = {DenseSlice(1, 0, count)};
  auto vec = fbb.CreateVectorOfStructs(slices);
  HeaderBuilder b(fbb);
  b.add_major(major);
  b.add_kind(Kind::PushDense);
  b.add_request_id(7);
  b.add_slices(vec);
  FinishHeaderBuffer(fbb, b.Finish());
  return ToFrame(fbb);
}

TEST(Wire, AcceptsAWellFormedHeader) {
  auto frame = PushHeader(4);
  const Header* h = nullptr;
  ASSERT_TRUE(VerifyHeader(frame, &h).ok());
  EXPECT_EQ(h->kind(), Kind::PushDense);
  EXPECT_EQ(h->request_id(), 7u);
  std::vector<zmq::message_t> payload;
  payload.emplace_back(16);
  EXPECT_TRUE(CheckPayloadShape(*h, payload).ok());
}

TEST(Wire, RejectsEveryTruncation) {
  auto frame = PushHeader(4);
  const auto* bytes = static_cast<const uint8_t*>(frame.data());
  for (size_t len = 0; len < frame.size(); ++len) {
    zmq::message_t cut(bytes, len);
    const Header* h = nullptr;
    EXPECT_FALSE(VerifyHeader(cut, &h).ok()) << "accepted a header cut to " << len << " of " << frame.size() << " bytes";
  }
}

TEST(Wire, RejectsGarbage) {
  uint64_t x = 88172645463325252ull;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> junk(8 + trial % 200);
    for (auto& b : junk) x ^= x << 13, x ^= x >> 7, x ^= x << 17, b = static_cast<uint8_t>(x);
    if (trial % 2) std::memcpy(junk.data() + 4, "FRY1", 4);  // right identifier, garbage body
    zmq::message_t frame(junk.data(), junk.size());
    const Header* h = nullptr;
    Status s = VerifyHeader(frame, &h);
    if (s.ok()) {
      // The verifier may accept random bytes that happen to form a valid buffer; then the
      // payload check must still hold.
      std::vector<zmq::message_t> none;
      (void)CheckPayloadShape(*h, none);
    } else {
      EXPECT_FALSE(s.message().empty());
    }
  }
}

TEST(Wire, RejectsOversizedHeaderAndWrongVersion) {
  zmq::message_t big(kMaxHeaderBytes + 1);
  const Header* h = nullptr;
  Status s = VerifyHeader(big, &h);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceeds"), std::string::npos);
  auto v2 = PushHeader(4, kMajor + 1);
  s = VerifyHeader(v2, &h);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("protocol version 2.0 is not supported: this side speaks 1."), std::string::npos) << s;
  // Still readable enough to answer: the request it is can be named.
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->major(), kMajor + 1);
  EXPECT_EQ(h->kind(), Kind::PushDense);
}

TEST(Wire, PayloadMustMatchCounts) {
  auto frame = PushHeader(4);
  const Header* h = nullptr;
  ASSERT_TRUE(VerifyHeader(frame, &h).ok());
  std::vector<zmq::message_t> none;
  EXPECT_NE(CheckPayloadShape(*h, none).message().find("0 payload frames, expected 1"), std::string::npos);
  std::vector<zmq::message_t> short_frame;
  short_frame.emplace_back(15);
  EXPECT_NE(CheckPayloadShape(*h, short_frame).message().find("15 bytes"), std::string::npos);
  auto huge = PushHeader(int64_t{1} << 62);
  ASSERT_TRUE(VerifyHeader(huge, &h).ok());
  std::vector<zmq::message_t> one;
  one.emplace_back(16);
  EXPECT_FALSE(CheckPayloadShape(*h, one).ok()) << "a count that overflows count*4 must be refused";
}

TEST(Wire, ErrorRoundTripsCodeAndMessage) {
  auto frame = MakeError(9, Kind::PullDense, NotFoundError("unknown table id 5"));
  const Header* h = nullptr;
  ASSERT_TRUE(VerifyHeader(frame, &h).ok());
  EXPECT_EQ(h->kind(), Kind::Error);
  EXPECT_EQ(h->request_id(), 9u);
  Status s = ErrorStatus(*h);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "unknown table id 5");
}

TEST(Wire, TableSpecRoundTrips) {
  ferry::TableSpec spec;
  spec.name = "emb";
  spec.type = ferry::TableType::kSparse;
  spec.dim = 16;
  spec.optimizer.type = ferry::OptimizerType::kAdam;
  spec.optimizer.beta2 = 0.98f;
  spec.consistency = ferry::Consistency::kSsp;
  spec.staleness = 3;
  spec.init = ferry::InitType::kNormal;
  spec.init_scale = 0.01f;
  spec.seed = 99;
  flatbuffers::FlatBufferBuilder fbb;
  auto off = SpecToWire(fbb, spec);
  fbb.Finish(off);
  ferry::TableSpec back;
  ASSERT_TRUE(SpecFromWire(flatbuffers::GetRoot<TableSpec>(fbb.GetBufferPointer()), &back).ok());
  EXPECT_EQ(back, spec);
}

}  // namespace
}  // namespace ferry::wire
