// Dense pulls without copies: PullDenseView / PushPullDenseView leave the values in the messages
// they came in, and the servers send a chunk's values without copying them (shared_floats.h), so
// over inproc:// a view refers to the server's own buffer. A later update must then leave what a
// view holds as it was pulled (copy-on-write), and every form of the pull must give the same bits.
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/cluster.h"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

std::vector<float> Gradient(size_t n, float scale) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = scale * std::sin(0.01f * static_cast<float>(i) + 0.5f);
  return g;
}

std::vector<float> Whole(const PulledDense& v, size_t t, size_t n) {
  std::vector<float> out(n, std::nanf(""));
  const Status s = v.CopyTo(t, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Over inproc:// and tcp, two servers, a table of several chunks and one of a single chunk: the
// view's pieces cover each tensor in order and hold the copying pull's bits; a single chunk is
// whole(); PushPullDenseView gives what PushPullDense gives on a twin table.
void ViewsGiveTheBitsOfCopies(bool tcp) {
  auto c = LocalCluster::Start(2, tcp);
  auto w = c.Connect(0, 1);
  TableSpec big = SgdTable("big", 1000, Consistency::kAsync);
  big.chunk_elems = 96;  // 11 chunks over 2 servers, the last of 40
  TableSpec big_twin = big;
  big_twin.name = "big_twin";
  TableSpec one = SgdTable("one", 77, Consistency::kAsync);
  for (const TableSpec& s : {big, big_twin, one}) ASSERT_TRUE(w->Declare(s).ok());
  const auto g = Gradient(1000, 0.25f), g1 = Gradient(77, -3.0f);
  ASSERT_TRUE(w->PushDense("big", g, 0).wait(5s).ok());
  ASSERT_TRUE(w->PushDense("big_twin", g, 0).wait(5s).ok());
  ASSERT_TRUE(w->PushDense("one", g1, 0).wait(5s).ok());

  std::vector<float> want(1000), want1(77);
  ASSERT_TRUE(w->PullDense("big", want, 0).wait(5s).ok());
  ASSERT_TRUE(w->PullDense("one", want1, 0).wait(5s).ok());
  const std::string_view names[] = {"one", "big"};
  std::shared_ptr<const PulledDense> v;
  ASSERT_TRUE(w->PullDenseView(names, 0, &v).wait(5s).ok());
  ASSERT_NE(v, nullptr);
  ASSERT_EQ(v->size(), 2u);
  EXPECT_EQ(v->whole(0).size(), 77u);
  EXPECT_TRUE(std::equal(want1.begin(), want1.end(), v->whole(0).begin()));
  const auto pieces = v->pieces(1);
  ASSERT_EQ(pieces.size(), 11u);
  int64_t at = 0;
  for (const auto& p : pieces) {
    EXPECT_EQ(p.offset, at);
    at += static_cast<int64_t>(p.values.size());
  }
  EXPECT_EQ(at, 1000);
  EXPECT_TRUE(v->whole(1).empty());
  EXPECT_EQ(Whole(*v, 1, 1000), want);
  std::vector<float> short_buffer(999);
  EXPECT_EQ(v->CopyTo(1, short_buffer).code(), StatusCode::kInvalidArgument);

  // Push+pull: the view of one table against the copy of its twin, same gradients.
  const DenseIn in{"big", g}, in_twin{"big_twin", g};
  std::vector<float> twin(1000);
  const DenseOut out_twin{"big_twin", twin};
  std::shared_ptr<const PulledDense> pp;
  ASSERT_TRUE(w->PushPullDenseView(std::span(&in, 1), 0, &pp).wait(5s).ok());
  ASSERT_TRUE(w->PushPullDense(std::span(&in_twin, 1), std::span(&out_twin, 1), 0).wait(5s).ok());
  EXPECT_EQ(Whole(*pp, 0, 1000), twin);
  EXPECT_NE(twin, want);  // the push moved them
}

TEST(DenseView, ViewsGiveTheBitsOfCopiesInproc) { ViewsGiveTheBitsOfCopies(false); }
TEST(DenseView, ViewsGiveTheBitsOfCopiesTcp) { ViewsGiveTheBitsOfCopies(true); }

// Over inproc:// a view holds the server's own buffer. Pushes that come while it is held move the
// chunk to a new buffer: the view keeps the values of its pull, and a new pull sees the pushes.
TEST(DenseView, AViewKeepsItsValuesWhileTheServerUpdatesTheTable) {
  auto c = LocalCluster::Start(1);
  auto a = c.Connect(0, 2), b = c.Connect(1, 2);
  TableSpec spec = SgdTable("w", 5000, Consistency::kAsync);
  spec.chunk_elems = 1000;
  spec.optimizer.type = OptimizerType::kAdam;  // state updated in place beside the moved values
  ASSERT_TRUE(a->Declare(spec).ok());
  ASSERT_TRUE(b->Declare(spec).ok());
  const auto g = Gradient(5000, 1.0f);
  ASSERT_TRUE(a->PushDense("w", g, 0).wait(5s).ok());
  const std::string_view name = "w";
  std::shared_ptr<const PulledDense> held;
  ASSERT_TRUE(a->PullDenseView(std::span(&name, 1), 0, &held).wait(5s).ok());
  const std::vector<float> pulled = Whole(*held, 0, 5000);
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(b->PushDense("w", g, 0).wait(5s).ok());
  EXPECT_EQ(Whole(*held, 0, 5000), pulled);  // as pulled, though the table moved on

  std::vector<float> now(5000);
  ASSERT_TRUE(b->PullDense("w", now, 0).wait(5s).ok());
  EXPECT_NE(now, pulled);
  // The server's values are those of four Adam steps, whether or not a view held them: a twin
  // table pushed the same way with nothing held gives the same bits.
  TableSpec twin = spec;
  twin.name = "twin";
  ASSERT_TRUE(b->Declare(twin).ok());
  for (int k = 0; k < 4; ++k) ASSERT_TRUE(b->PushDense("twin", g, 0).wait(5s).ok());
  std::vector<float> want(5000);
  ASSERT_TRUE(b->PullDense("twin", want, 0).wait(5s).ok());
  EXPECT_EQ(now, want);
  held.reset();  // dropping the view releases the server's old buffer (ASan: no leak, no reuse)
  ASSERT_TRUE(b->PushDense("w", g, 0).wait(5s).ok());
}

// A table in float16 on the wire: the view decodes its pieces into memory of its own, as the
// copying pull decodes into the caller's buffer.
TEST(DenseView, SixteenBitValuesAreDecodedLikeTheCopyingPull) {
  auto c = LocalCluster::Start(2);
  auto w = c.Connect(0, 1);
  TableSpec spec = SgdTable("h", 700, Consistency::kAsync);
  spec.chunk_elems = 256;
  spec.wire = WireFormat::kF16;
  ASSERT_TRUE(w->Declare(spec).ok());
  ASSERT_TRUE(w->PushDense("h", Gradient(700, 2.0f), 0).wait(5s).ok());
  std::vector<float> want(700);
  ASSERT_TRUE(w->PullDense("h", want, 0).wait(5s).ok());
  const std::string_view name = "h";
  std::shared_ptr<const PulledDense> v;
  ASSERT_TRUE(w->PullDenseView(std::span(&name, 1), 0, &v).wait(5s).ok());
  EXPECT_EQ(Whole(*v, 0, 700), want);
  EXPECT_NE(want[5], 0.0f);
}

TEST(DenseView, AnUnknownTableFailsTheCallAndSaysWhich) {
  auto c = LocalCluster::Start(1);
  auto w = c.Connect(0, 1);
  const std::string_view name = "nope";
  std::shared_ptr<const PulledDense> v;
  const Status s = w->PullDenseView(std::span(&name, 1), 0, &v).wait(5s);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("nope"), std::string::npos) << s;
  EXPECT_EQ(v, nullptr);
}

}  // namespace
}  // namespace ferry::test
