// Compressed tables (protocol 1.6, issue 17) on a whole cluster in one process: what travels
// (bytes on the wire), what is pulled (the server's float32 rounded to the table's format), what
// a forged frame gets (refused, nothing applied), what an older server gets (no declaration), and
// that sync jobs stay bitwise reproducible.
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/messages/codec.h"
#include "ferry/messages/placement.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "support/cluster.h"
#include "support/old_server.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::LocalCluster;
using test::SgdSparseTable;
using test::SgdTable;

constexpr uint32_t kSeed = 1117;

TableSpec Compressed(TableSpec s, WireFormat w, float topk = 0.0f) {
  s.wire = w;
  s.topk_ratio = topk;
  return s;
}

std::vector<float> Gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// One push and one pull of a 1M-float dense table per format (names of one length, so headers
// are alike): the payload halves for fp16 and bf16, and top-k at ratio r sends k (4 + 4)-byte
// pairs. Sparse rows of a bf16 table halve too (their ids stay 8 bytes).
TEST(Compression, BytesOnTheWireFallByTheExpectedFactor) {
  auto c = LocalCluster::Start(1);
  ClientOptions one_message;  // one header a call: the bytes below are the values' and one header's
  one_message.dense_message_bytes = 0;
  auto w = c.Connect(0, 1, one_message);
  const int64_t n = 1 << 20;
  const float ratio = 0.01f;
  auto table = [&](const char* name) {  // one chunk: top-k picks k of all n
    TableSpec s = SgdTable(name, n, Consistency::kAsync);
    s.chunk_elems = n;
    return s;
  };
  const std::vector<TableSpec> specs = {table("t_f32"), Compressed(table("t_f16"), WireFormat::kF16),
                                        Compressed(table("t_b16"), WireFormat::kBf16),
                                        Compressed(table("t_top"), WireFormat::kF32, ratio)};
  const std::vector<float> g = Gaussian(static_cast<size_t>(n), kSeed);
  std::vector<float> out(static_cast<size_t>(n));
  std::map<std::string, std::pair<int64_t, int64_t>> bytes;  // sent by the push, received by the pull
  for (const auto& s : specs) {
    ASSERT_TRUE(w->Declare(s).ok());
    const ClientStats before = w->stats();
    ASSERT_TRUE(w->PushDense(s.name, g, 0).wait(10s).ok());
    const ClientStats mid = w->stats();
    ASSERT_TRUE(w->PullDense(s.name, out, 0).wait(10s).ok());
    const ClientStats after = w->stats();
    bytes[s.name] = {mid.bytes_sent - before.bytes_sent, after.bytes_received - mid.bytes_received};
  }
  const auto [f32_sent, f32_received] = bytes["t_f32"];
  const int64_t header = f32_sent - n * 4;  // the push's header frame
  ASSERT_GT(header, 0);
  ASSERT_LT(header, 256);
  for (const char* name : {"t_f16", "t_b16"}) {
    SCOPED_TRACE(name);
    EXPECT_NEAR(bytes[name].first, header + n * 2, 16) << "2 bytes a value";
    EXPECT_NEAR(bytes[name].second, f32_received - n * 2, 16);
    EXPECT_NEAR(static_cast<double>(f32_sent) / static_cast<double>(bytes[name].first), 2.0, 0.001);
  }
  const int64_t k = wire::TopKCount(ratio, n);
  EXPECT_EQ(k, 10486);
  EXPECT_NEAR(bytes["t_top"].first, header + k * 8, 16) << "k (index, value) pairs";
  EXPECT_NEAR(static_cast<double>(f32_sent) / static_cast<double>(bytes["t_top"].first), 1.0 / (ratio * 2), 0.5)
      << "1 / (ratio x (4 + 4) / 4)";
  EXPECT_EQ(bytes["t_top"].second, f32_received) << "pulls of an f32 top-k table are unaffected";

  // A top-k table with fp16 values: (4 + 2)-byte pairs, and fp16 pulls.
  ASSERT_TRUE(w->Declare(Compressed(table("t_tph"), WireFormat::kF16, ratio)).ok());
  ClientStats before = w->stats();
  ASSERT_TRUE(w->PushDense("t_tph", g, 0).wait(10s).ok());
  EXPECT_NEAR(w->stats().bytes_sent - before.bytes_sent, header + k * 6, 16);

  // Sparse: 1000 ids of dim 64 in bf16.
  ASSERT_TRUE(w->Declare(SgdSparseTable("s_f32", 64)).ok());
  ASSERT_TRUE(w->Declare(Compressed(SgdSparseTable("s_b16", 64), WireFormat::kBf16)).ok());
  std::vector<int64_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7);
  const std::vector<float> rows = Gaussian(ids.size() * 64, kSeed + 1);
  std::vector<float> back(rows.size());
  std::map<std::string, std::pair<int64_t, int64_t>> sparse;
  for (const char* name : {"s_f32", "s_b16"}) {
    before = w->stats();
    ASSERT_TRUE(w->PushSparse(name, ids, rows, 0).wait(10s).ok());
    const ClientStats mid = w->stats();
    ASSERT_TRUE(w->PullSparse(name, ids, back, 0).wait(10s).ok());
    sparse[name] = {mid.bytes_sent - before.bytes_sent, w->stats().bytes_received - mid.bytes_received};
  }
  EXPECT_NEAR(sparse["s_b16"].first, sparse["s_f32"].first - 1000 * 64 * 2, 16);
  EXPECT_NEAR(sparse["s_b16"].second, sparse["s_f32"].second - 1000 * 64 * 2, 16);
  EXPECT_EQ(w->stats().values_saturated, 0);
}

// The server keeps float32: the same fp16-exact gradients pushed three times into an f32 and an
// fp16 table leave the same float32 values on the server (sums no fp16 holds), and the fp16
// table's pull is exactly those values rounded to fp16. Likewise for a sparse bf16 table.
TEST(Compression, PulledValuesAreTheServersFloat32RoundedToTheTableFormat) {
  auto c = LocalCluster::Start(2);
  auto w = c.Connect(0, 1);
  const int64_t n = 5000;
  TableSpec exact = SgdTable("exact", n, Consistency::kAsync);
  exact.chunk_elems = 1024;  // chunks on both servers
  TableSpec half = Compressed(exact, WireFormat::kF16);
  half.name = "half";
  ASSERT_TRUE(w->Declare(exact).ok());
  ASSERT_TRUE(w->Declare(half).ok());
  for (uint32_t step = 0; step < 3; ++step) {
    std::vector<float> g = Gaussian(static_cast<size_t>(n), kSeed + step);
    for (auto& x : g) x = wire::RoundTrip(WireFormat::kF16, x * 100.0f);  // lossless in fp16
    ASSERT_TRUE(w->PushDense("exact", g, step).wait(5s).ok());
    ASSERT_TRUE(w->PushDense("half", g, step).wait(5s).ok());
  }
  std::vector<float> server(static_cast<size_t>(n)), pulled(static_cast<size_t>(n));
  ASSERT_TRUE(w->PullDense("exact", server, 3).wait(5s).ok());
  ASSERT_TRUE(w->PullDense("half", pulled, 3).wait(5s).ok());
  int64_t rounded = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = wire::RoundTrip(WireFormat::kF16, server[static_cast<size_t>(i)]);
    ASSERT_EQ(std::bit_cast<uint32_t>(pulled[static_cast<size_t>(i)]), std::bit_cast<uint32_t>(want))
        << "element " << i;
    rounded += pulled[static_cast<size_t>(i)] != server[static_cast<size_t>(i)];
  }
  EXPECT_GT(rounded, n / 2) << "the server's sums are not all fp16 values: it holds float32";

  ASSERT_TRUE(w->Declare(SgdSparseTable("rows", 16)).ok());
  ASSERT_TRUE(w->Declare(Compressed(SgdSparseTable("rows_bf16", 16), WireFormat::kBf16)).ok());
  // Distinct ids: a repeated id's gradients are added on the client, and that sum is rounded to bf16.
  const std::vector<int64_t> ids = {3, 9, 12, 1000, 77};
  for (uint32_t step = 0; step < 3; ++step) {
    std::vector<float> g = Gaussian(ids.size() * 16, kSeed + 10 + step);
    for (auto& x : g) x = wire::RoundTrip(WireFormat::kBf16, x);
    ASSERT_TRUE(w->PushSparse("rows", ids, g, step).wait(5s).ok());
    ASSERT_TRUE(w->PushSparse("rows_bf16", ids, g, step).wait(5s).ok());
  }
  std::vector<float> rs(ids.size() * 16), rb(ids.size() * 16);
  ASSERT_TRUE(w->PullSparse("rows", ids, rs, 3).wait(5s).ok());
  ASSERT_TRUE(w->PullSparse("rows_bf16", ids, rb, 3).wait(5s).ok());
  for (size_t i = 0; i < rs.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(rb[i]), std::bit_cast<uint32_t>(wire::RoundTrip(WireFormat::kBf16, rs[i]))) << i;
  }
}

// A finite value beyond fp16's range travels as +-65504, never as Inf: a gradient (counted by the
// client) and a parameter the server holds in float32 (counted by the server).
TEST(Compression, Fp16SaturatesInsteadOfSendingInf) {
  auto c = LocalCluster::Start(1);
  auto w = c.Connect(0, 1);
  ASSERT_TRUE(w->Declare(Compressed(SgdTable("big", 4, Consistency::kAsync), WireFormat::kF16)).ok());
  const std::vector<float> g = {1e6f, -7e4f, 1.0f, 65504.0f};
  ASSERT_TRUE(w->PushDense("big", g, 0).wait(5s).ok());
  EXPECT_EQ(w->stats().values_saturated, 2);
  std::vector<float> v(4);
  ASSERT_TRUE(w->PullDense("big", v, 1).wait(5s).ok());
  EXPECT_EQ(v, (std::vector<float>{-65504.0f, 65504.0f, -1.0f, -65504.0f}));
  // The server keeps float32: two more pushes of 65504 leave -196512 in the first element, which
  // its pull sends as -65504 (counted by the server).
  const std::vector<float> max = {65504.0f, 0.0f, 0.0f, 0.0f};
  ASSERT_TRUE(w->PushDense("big", max, 1).wait(5s).ok());
  ASSERT_TRUE(w->PushDense("big", max, 2).wait(5s).ok());
  EXPECT_EQ(c.servers[0]->stats().counters.at("wire_values_saturated"), 0);
  ASSERT_TRUE(w->PullDense("big", v, 3).wait(5s).ok());
  EXPECT_EQ(v[0], -65504.0f);
  EXPECT_EQ(c.servers[0]->stats().counters.at("wire_values_saturated"), 1);
  EXPECT_EQ(w->stats().values_saturated, 2) << "65504 itself is in range";
}

// Frames a hostile peer may forge for compressed tables: sizes that do not match the table's
// format, top-k indices out of range or not increasing, NaN in 16 bits. Each is refused with an
// error saying what, and nothing is applied; a well-formed one is.
TEST(Compression, TheServerRefusesForgedCompressedFrames) {
  auto c = LocalCluster::Start(1);
  auto w = c.Connect(0, 2);  // the forger speaks for worker 1
  const int64_t n = 100;
  ASSERT_TRUE(w->Declare(Compressed(SgdTable("tk", n, Consistency::kAsync), WireFormat::kF32, 0.02f)).ok());  // k = 2
  ASSERT_TRUE(w->Declare(Compressed(SgdTable("hf", n, Consistency::kAsync), WireFormat::kF16)).ok());
  ASSERT_TRUE(w->Declare(Compressed(SgdSparseTable("sb", 4), WireFormat::kBf16)).ok());
  auto raw = transport::MakeSocket(transport::Zmq(*c.context), zmq::socket_type::dealer);
  ASSERT_TRUE(raw.ok());
  raw->set(zmq::sockopt::rcvtimeo, 5000);
  raw->connect(c.endpoints[0]);
  auto send = [&](wire::Kind kind, const std::string& table, int64_t count,
                  std::vector<std::vector<unsigned char>> payload) -> Status {
    flatbuffers::FlatBufferBuilder fbb;
    flatbuffers::Offset<flatbuffers::Vector<const wire::DenseSlice*>> slices;
    flatbuffers::Offset<flatbuffers::Vector<const wire::SparseSlice*>> sparse;
    if (kind == wire::Kind::PushDense) {
      std::vector<wire::DenseSlice> s = {wire::DenseSlice(TableId(table), 0, count)};
      slices = fbb.CreateVectorOfStructs(s);
    } else {
      std::vector<wire::SparseSlice> s = {wire::SparseSlice(TableId(table), 4, count)};
      sparse = fbb.CreateVectorOfStructs(s);
    }
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(kind);
    b.add_request_id(91);
    b.add_rank(1);
    if (kind == wire::Kind::PushDense) b.add_slices(slices);
    else b.add_sparse(sparse);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    transport::Frames f;
    f.push_back(wire::ToFrame(fbb));
    for (auto& p : payload) f.emplace_back(p.data(), p.size());
    if (Status s = transport::Send(*raw, f); !s.ok()) return s;
    transport::Frames reply;
    if (Status s = transport::Recv(*raw, &reply); !s.ok()) return s;
    const wire::Header* h = nullptr;
    if (Status s = wire::VerifyHeader(reply[0], &h); !s.ok()) return s;
    return h->kind() == wire::Kind::Error ? wire::ErrorStatus(*h) : Status::Ok();
  };
  auto topk = [](std::vector<uint32_t> idx, std::vector<float> v) {
    std::vector<unsigned char> f(idx.size() * 4 + v.size() * 4);
    std::memcpy(f.data(), idx.data(), idx.size() * 4);
    std::memcpy(f.data() + idx.size() * 4, v.data(), v.size() * 4);
    return f;
  };
  auto expect_refused = [](const Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
  };
  const int64_t bad_before = c.servers[0]->stats().counters.at("bad_messages");
  expect_refused(send(wire::Kind::PushDense, "tk", n, {topk({1, 2, 3}, {1, 1, 1})}),
                 "slice 0 (top-k pairs) frame has 24 bytes, the header's count says 16");
  expect_refused(send(wire::Kind::PushDense, "tk", n, {std::vector<unsigned char>(n * 4)}),
                 "frame has 400 bytes, the header's count says 16");
  // A bad top-k frame is logged as other malformed messages are, naming the peer (after the
  // server's one-line-a-second log limit let the refusals above through).
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  testing::internal::CaptureStderr();
  expect_refused(send(wire::Kind::PushDense, "tk", n, {topk({5, 100}, {1, 1})}),
                 "table 'tk' chunk 0 from worker 1, nothing of the push applied: top-k pair 1 has index 100, past the "
                 "chunk's 100 elements");
  const std::string logged = testing::internal::GetCapturedStderr();
  EXPECT_NE(logged.find("refused a message from an in-process peer: table 'tk' chunk 0 from worker 1"),
            std::string::npos)
      << logged;
  expect_refused(send(wire::Kind::PushDense, "tk", n, {topk({5, 5}, {1, 1})}), "indices must be strictly increasing");
  expect_refused(send(wire::Kind::PushDense, "tk", n, {topk({9, 4}, {1, 1})}), "indices must be strictly increasing");
  expect_refused(send(wire::Kind::PushDense, "tk", n, {topk({1, 4}, {1, NAN})}), "holds NaN or Inf");
  expect_refused(send(wire::Kind::PushDense, "hf", n, {std::vector<unsigned char>(n * 4)}),
                 "slice 0 frame has 400 bytes, the header's count says 200");
  std::vector<unsigned char> nan_half(n * 2, 0);
  nan_half[10] = 0x00, nan_half[11] = 0x7e;  // element 5: an fp16 NaN
  expect_refused(send(wire::Kind::PushDense, "hf", n, {nan_half}), "holds NaN or Inf (element 5)");
  std::vector<unsigned char> id(8, 0);
  id[0] = 3;
  expect_refused(send(wire::Kind::PushSparseTables, "sb", 1, {id, std::vector<unsigned char>(16)}),
                 "table 0 gradient frame has 16 bytes, the header's count says 8");
  EXPECT_GE(c.servers[0]->stats().counters.at("bad_messages") - bad_before, 7);

  std::vector<float> v(n);
  ASSERT_TRUE(w->PullDense("tk", v, 0).wait(5s).ok());
  EXPECT_EQ(v, std::vector<float>(n, 0.0f)) << "nothing of a refused message is applied";
  ASSERT_TRUE(w->PullDense("hf", v, 0).wait(5s).ok());
  EXPECT_EQ(v, std::vector<float>(n, 0.0f));
  std::vector<float> row(4, -9.0f);
  const std::vector<int64_t> three = {3};
  ASSERT_TRUE(w->PullSparse("sb", three, row, 0).wait(5s).ok());
  EXPECT_EQ(row, std::vector<float>(4, 0.0f));

  ASSERT_TRUE(send(wire::Kind::PushDense, "tk", n, {topk({5, 99}, {2.5f, -1})}).ok());
  ASSERT_TRUE(w->PullDense("tk", v, 0).wait(5s).ok());
  std::vector<float> want(n, 0.0f);
  want[5] = -2.5f, want[99] = 1.0f;
  EXPECT_EQ(v, want) << "a well-formed top-k frame is applied: the sent values into a zero gradient";
  std::vector<unsigned char> bf(8, 0);  // bf16 1.0 = 0x3f80, little-endian
  for (size_t j = 0; j < 4; ++j) bf[j * 2 + 1] = 0x3f, bf[j * 2] = 0x80;
  ASSERT_TRUE(send(wire::Kind::PushSparseTables, "sb", 1, {id, bf}).ok());
  ASSERT_TRUE(w->PullSparse("sb", three, row, 1).wait(5s).ok());
  EXPECT_EQ(row, std::vector<float>(4, -1.0f));
}

// A server of protocol 1.5 would read 16-bit or top-k frames as float32: the client, told the
// server's minor in its Hello reply, refuses to declare a compressed table there, saying why, and
// sends it nothing. An f32 table is declared as before. The 1.5 server is a bare ROUTER.
TEST(Compression, AServerOfProtocol15IsNotSentACompressedTable) {
  auto context = Context::Create();
  test::OldServer old_server(context, "inproc://compression-old-server", /*minor=*/5);
  {
    auto w = old_server.Connect();
    ASSERT_TRUE(w.ok()) << w.status();
    Status s = (*w)->Declare(Compressed(SgdTable("h", 8, Consistency::kAsync), WireFormat::kF16));
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("table 'h' is declared with wire=fp16, but server 0 speaks protocol 1.5"),
              std::string::npos)
        << s;
    s = (*w)->Declare(Compressed(SgdTable("k", 8, Consistency::kAsync), WireFormat::kF32, 0.5f));
    EXPECT_NE(s.message().find("table 'k' is declared with topk, but server 0 speaks protocol 1.5"), std::string::npos)
        << s;
    EXPECT_TRUE((*w)->Declare(SgdTable("plain", 8, Consistency::kAsync)).ok());
  }
  old_server.Stop();
  EXPECT_EQ(old_server.kinds()[wire::Kind::CreateTable], 1) << "only the f32 table reached the old server";
}

// Sync with 2 workers x 2 servers, a top-k + fp16 dense table and a bf16 sparse table, Adam:
// two runs give the same bits (encoding is deterministic and the server's sums keep rank order).
TEST(Compression, SyncStaysBitwiseReproducible) {
  auto run = [] {
    auto c = LocalCluster::Start(2);
    std::vector<std::unique_ptr<Client>> w;
    for (int r = 0; r < 2; ++r) w.push_back(c.Connect(r, 2));
    TableSpec dense = Compressed(SgdTable("d", 3000, Consistency::kSync), WireFormat::kF16, 0.05f);
    dense.chunk_elems = 1000;
    TableSpec sparse = Compressed(SgdSparseTable("s", 8, Consistency::kSync), WireFormat::kBf16);
    for (TableSpec* s : {&dense, &sparse}) {
      s->optimizer.type = OptimizerType::kAdam;
      s->optimizer.learning_rate = 0.01f;
      s->init = InitType::kUniform;
      s->init_scale = 0.1f;
      s->seed = 5;
      for (auto& client : w) EXPECT_TRUE(client->Declare(*s).ok());
    }
    std::mt19937 rng(kSeed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t step = 0; step < 6; ++step) {
      std::vector<Handle> pushes;
      std::vector<std::vector<float>> params(2, std::vector<float>(3000)), grads(2, std::vector<float>(3000));
      std::vector<std::vector<int64_t>> ids(2);
      std::vector<std::vector<float>> rows(2), rgrads(2);
      for (int r = 0; r < 2; ++r) {
        Client& client = *w[static_cast<size_t>(r)];
        EXPECT_TRUE(client.PullDense("d", params[static_cast<size_t>(r)], step).wait(5s).ok());
        for (size_t i = 0; i < 3000; ++i) {  // a gradient that depends on the pulled values
          grads[static_cast<size_t>(r)][i] = params[static_cast<size_t>(r)][i] * 0.5f + normal(rng);
        }
        for (int i = 0; i < 20; ++i) ids[static_cast<size_t>(r)].push_back(static_cast<int64_t>(rng() % 50));
        rows[static_cast<size_t>(r)].resize(ids[static_cast<size_t>(r)].size() * 8);
        EXPECT_TRUE(
            client.PullSparse("s", ids[static_cast<size_t>(r)], rows[static_cast<size_t>(r)], step).wait(5s).ok());
        for (float x : rows[static_cast<size_t>(r)]) rgrads[static_cast<size_t>(r)].push_back(x + normal(rng));
        pushes.push_back(client.PushDense("d", grads[static_cast<size_t>(r)], step));
        pushes.push_back(client.PushSparse("s", ids[static_cast<size_t>(r)], rgrads[static_cast<size_t>(r)], step));
      }
      for (auto& h : pushes) EXPECT_TRUE(h.wait(5s).ok());
    }
    std::vector<float> d(3000), s(50 * 8);
    std::vector<int64_t> all(50);
    for (int64_t i = 0; i < 50; ++i) all[static_cast<size_t>(i)] = i;
    EXPECT_TRUE(w[0]->PullDense("d", d, 6).wait(5s).ok());
    EXPECT_TRUE(w[0]->PullSparse("s", all, s, 6).wait(5s).ok());
    d.insert(d.end(), s.begin(), s.end());
    return d;
  };
  const std::vector<float> a = run(), b = run();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "two runs differ";
  int64_t moved = 0;
  for (float x : a) moved += std::fabs(x) > 0.1f;
  EXPECT_GT(moved, 0) << "the tables trained (some values left the initial range)";
}

}  // namespace
}  // namespace ferry
