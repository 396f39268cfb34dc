// The verifier refuses truncated, oversized, garbage and mismatched messages before use.
#include <climits>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/messages/kinds.h"
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
    EXPECT_FALSE(VerifyHeader(cut, &h).ok())
        << "accepted a header cut to " << len << " of " << frame.size() << " bytes";
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

zmq::message_t SparseTablesHeader(Kind kind, const std::vector<SparseSlice>& tables) {
  flatbuffers::FlatBufferBuilder fbb;
  auto vec = fbb.CreateVectorOfStructs(tables);
  HeaderBuilder b(fbb);
  b.add_major(kMajor);
  b.add_kind(kind);
  b.add_sparse(vec);
  FinishHeaderBuffer(fbb, b.Finish());
  return ToFrame(fbb);
}

// PullSparseTables carries an id frame per table; PushSparseTables an id frame and a gradient
// frame per table, each sized by its entry.
TEST(Wire, SparseTablesPayloadMustMatchEveryEntry) {
  auto pull = SparseTablesHeader(Kind::PullSparseTables, {SparseSlice(1, 4, 2), SparseSlice(2, 8, 3)});
  const Header* h = nullptr;
  ASSERT_TRUE(VerifyHeader(pull, &h).ok());
  std::vector<zmq::message_t> frames;
  frames.emplace_back(16);
  frames.emplace_back(24);
  EXPECT_TRUE(CheckPayloadShape(*h, frames).ok());
  frames[1] = zmq::message_t(16);
  Status s = CheckPayloadShape(*h, frames);
  EXPECT_NE(s.message().find("table 1 id frame has 16 bytes, the header's count says 24"), std::string::npos) << s;
  frames.pop_back();
  s = CheckPayloadShape(*h, frames);
  EXPECT_NE(s.message().find("PullSparseTables carries 1 payload frames, expected 2"), std::string::npos) << s;

  auto push = SparseTablesHeader(Kind::PushSparseTables, {SparseSlice(1, 4, 2), SparseSlice(2, 8, 0)});
  ASSERT_TRUE(VerifyHeader(push, &h).ok());
  frames.clear();
  for (size_t bytes : {16, 32, 0, 0}) frames.emplace_back(bytes);
  EXPECT_TRUE(CheckPayloadShape(*h, frames).ok());
  frames[1] = zmq::message_t(28);
  s = CheckPayloadShape(*h, frames);
  EXPECT_NE(s.message().find("table 0 gradient frame has 28 bytes, the header's count says 32"), std::string::npos)
      << s;

  auto zero_dim = SparseTablesHeader(Kind::PullSparseTables, {SparseSlice(1, 0, 1)});
  ASSERT_TRUE(VerifyHeader(zero_dim, &h).ok());
  frames.clear();
  frames.emplace_back(8);
  s = CheckPayloadShape(*h, frames);
  EXPECT_NE(s.message().find("table 0: dim 0 is not positive"), std::string::npos) << s;

  auto overflow = SparseTablesHeader(Kind::PushSparseTables, {SparseSlice(1, int64_t{1} << 40, 1 << 24)});
  ASSERT_TRUE(VerifyHeader(overflow, &h).ok());
  frames.clear();
  frames.emplace_back(size_t{1} << 27);
  frames.emplace_back(4);
  EXPECT_FALSE(CheckPayloadShape(*h, frames).ok()) << "num_ids x dim past 2^60 must be refused";

  auto none = SparseTablesHeader(Kind::PullSparseTables, {});
  ASSERT_TRUE(VerifyHeader(none, &h).ok());
  frames.clear();
  s = CheckPayloadShape(*h, frames);
  EXPECT_NE(s.message().find("names no tables"), std::string::npos) << s;

  std::vector<SparseSlice> many(kMaxFrames / 2 + 1, SparseSlice(1, 1, 0));  // one past 4096 payload frames
  auto too_many = SparseTablesHeader(Kind::PushSparseTables, many);
  ASSERT_TRUE(VerifyHeader(too_many, &h).ok());
  s = CheckPayloadShape(*h, frames);
  EXPECT_NE(s.message().find("tables; at most 2048"), std::string::npos) << s;
}

// kinds.h is the one list of kinds: every value of the schema's enum but Invalid has exactly one
// row, no row is newer than this protocol, and a header of each kind (and of no other) verifies.
TEST(Wire, EveryKindHasOneRow) {
  std::vector<int> rows(256, 0);
  for (const KindInfo& k : kKinds) {
    ++rows[static_cast<uint8_t>(k.kind)];
    EXPECT_LE(k.minor, kMinor) << KindName(k.kind);
  }
  for (const Kind kind : EnumValuesKind()) {
    EXPECT_EQ(rows[static_cast<uint8_t>(kind)], kind == Kind::Invalid ? 0 : 1) << KindName(kind);
  }
  for (int k = 0; k < 256; ++k) {
    const Kind kind = static_cast<Kind>(k);
    flatbuffers::FlatBufferBuilder fbb;
    HeaderBuilder b(fbb);
    b.add_major(kMajor);
    b.add_minor(kMinor);
    b.add_kind(kind);
    FinishHeaderBuffer(fbb, b.Finish());
    zmq::message_t frame = ToFrame(fbb);
    const Header* h = nullptr;
    EXPECT_EQ(VerifyHeader(frame, &h).ok(), FindKind(kind) != nullptr) << k;
  }
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

// Found by tests/fuzz/fuzz_wire: a header that passes FlatBuffers' verifier but whose table spec
// holds its int64 shape at an offset that is not a multiple of 8. Reading it would be a
// misaligned load (undefined behaviour); it is refused instead.
TEST(Wire, RefusesAMisalignedVectorFromTheFuzzer) {
  const unsigned char bytes[] = {
  0x28, 0x00, 0x00, 0x00, 0x46, 0x52, 0x59, 0x31, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x1a, 0x00, 0x2a, 0x00, 0x28, 0x00, 0x26, 0x00, 0x25, 0x00,
  0x18, 0x00, 0x14, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x04, 0x00, 0x1a, 0x00, 0x00, 0x00, 0x38, 0x00, 0x00, 0x00,
  0x65, 0x5d, 0xb2, 0xa6, 0xac, 0x3e, 0x3e, 0x58, 0x00, 0x00, 0x00, 0x00,
  0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0x00, 0x01, 0x00, 0x12, 0x00,
  0x26, 0x00, 0x08, 0x00, 0x06, 0x00, 0x0c, 0x00, 0x14, 0x00, 0x1c, 0x00,
  0x10, 0x00, 0x07, 0x00, 0x12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01,
  0x30, 0x00, 0x00, 0x00, 0x28, 0x00, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x00,
  0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x65, 0x5d, 0xb2, 0xa6, 0xac, 0x3e, 0x3e, 0x58,
  0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0x00};
  zmq::message_t frame(bytes, sizeof bytes);
  const Header* h = nullptr;
  const Status s = VerifyHeader(frame, &h);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("misaligned vector"), std::string::npos) << s;
}

// What a builder makes passes, an empty shape (a sparse spec) included.
TEST(Wire, BuiltSpecsPassTheAlignmentCheck) {
  for (bool sparse : {false, true}) {
    ferry::TableSpec spec;
    spec.name = "t";
    if (sparse) {
      spec.type = ferry::TableType::kSparse;
      spec.dim = 4;
    } else {
      spec.shape = {3, 5};
    }
    flatbuffers::FlatBufferBuilder fbb;
    auto off = SpecToWire(fbb, spec);
    HeaderBuilder b(fbb);
    b.add_major(kMajor);
    b.add_kind(Kind::CreateTable);
    b.add_spec(off);
    FinishHeaderBuffer(fbb, b.Finish());
    zmq::message_t frame = ToFrame(fbb);
    const Header* h = nullptr;
    EXPECT_TRUE(VerifyHeader(frame, &h).ok()) << (sparse ? "sparse" : "dense");
  }
}

// Found by tests/fuzz/fuzz_wire: the chunk count of a spec from the network, before Validate
// refuses it, must not overflow.
TEST(Wire, ChunkCountsOfHostileSpecsDoNotOverflow) {
  ferry::TableSpec spec;
  spec.name = "t";
  spec.shape = {10};
  spec.chunk_elems = INT64_MAX;
  EXPECT_EQ(spec.num_chunks(), 1);
  spec.shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_EQ(spec.num_elements(), INT64_MAX);
  EXPECT_FALSE(spec.Validate().ok());
  spec.shape = {-1, 5};
  EXPECT_EQ(spec.num_elements(), INT64_MAX);
  EXPECT_FALSE(spec.Validate().ok());
}

TEST(Wire, PrintableKeepsUtf8AndEscapesEverythingElse) {
  EXPECT_EQ(Printable("table 'emb'\tok\n"), "table 'emb'\tok\n");
  EXPECT_EQ(Printable("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(Printable(std::string("a\0b\x1b\x7f", 5)), "a\\x00b\\x1b\\x7f");
  EXPECT_EQ(Printable("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(Printable("\xc3"), "\\xc3");                      // truncated sequence
  EXPECT_EQ(Printable("\xc0\xaf"), "\\xc0\\xaf");              // overlong '/'
  EXPECT_EQ(Printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");      // a UTF-16 surrogate
  EXPECT_EQ(Printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  // An Error carrying such bytes arrives printable.
  zmq::message_t frame = MakeError(3, Kind::CreateTable, InvalidArgumentError("table '\xff\x01x': bad"));
  const Header* h = nullptr;
  ASSERT_TRUE(VerifyHeader(frame, &h).ok());
  EXPECT_EQ(ErrorStatus(*h).message(), "table '\\xff\\x01x': bad");
}

}  // namespace
}  // namespace ferry::wire
