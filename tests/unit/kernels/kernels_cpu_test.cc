// The CPU twins on small hand-computed cases, their argument checks, and finite-difference checks
// of the loss gradients. Needs no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ferry/kernels.h"
#include "test_util.h"

namespace ferry::kernels {
namespace {

using ::ferry::kernels::testing::AllClose;
using ::ferry::kernels::testing::Tolerance;

constexpr Tolerance kExact{0.0f, 0.0f};
constexpr Tolerance kTight{1e-6f, 1e-6f};

// ---- GEMM --------------------------------------------------------------------------------------

// A = [[1 2 3] [4 5 6]] (2x3), B = [[7 8] [9 10] [11 12]] (3x2): A B = [[58 64] [139 154]].
const std::vector<float> kA = {1, 2, 3, 4, 5, 6};
const std::vector<float> kAt = {1, 4, 2, 5, 3, 6};  // A^T stored (3x2).
const std::vector<float> kB = {7, 8, 9, 10, 11, 12};
const std::vector<float> kBt = {7, 9, 11, 8, 10, 12};  // B^T stored (2x3).
const std::vector<float> kAB = {58, 64, 139, 154};

TEST(CpuGemm, AllTransposeCombinations) {
  struct Case {
    Transpose ta, tb;
    const std::vector<float>& a;
    int64_t lda;
    const std::vector<float>& b;
    int64_t ldb;
  };
  const Case cases[] = {
      {Transpose::kNo, Transpose::kNo, kA, 3, kB, 2},
      {Transpose::kYes, Transpose::kNo, kAt, 2, kB, 2},
      {Transpose::kNo, Transpose::kYes, kA, 3, kBt, 3},
      {Transpose::kYes, Transpose::kYes, kAt, 2, kBt, 3},
  };
  for (const Case& c : cases) {
    std::vector<float> out(4, std::numeric_limits<float>::quiet_NaN());  // beta = 0: not read.
    ASSERT_TRUE(cpu::Gemm(c.ta, c.tb, 2, 2, 3, 1.0f, c.a.data(), c.lda, c.b.data(), c.ldb, 0.0f,
                          out.data(), 2)
                    .ok());
    EXPECT_TRUE(AllClose(out, kAB, kExact))
        << "trans_a=" << static_cast<int>(c.ta) << " trans_b=" << static_cast<int>(c.tb);
  }
}

TEST(CpuGemm, AlphaBetaAndStrides) {
  // C lives in a 2x3 buffer with ldc = 3; the third column must stay untouched.
  std::vector<float> c = {1, 2, -1, 3, 4, -1};
  ASSERT_TRUE(cpu::Gemm(Transpose::kNo, Transpose::kNo, 2, 2, 3, 2.0f, kA.data(), 3, kB.data(), 2,
                        0.5f, c.data(), 3)
                  .ok());
  EXPECT_TRUE(AllClose(c, {116.5f, 129.0f, -1, 279.5f, 310.0f, -1}, kExact));
}

TEST(CpuGemm, EmptyInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4};
  ASSERT_TRUE(
      cpu::Gemm(Transpose::kNo, Transpose::kNo, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 3.0f,
                c.data(), 2)
          .ok());
  EXPECT_TRUE(AllClose(c, {3, 6, 9, 12}, kExact));
  c.assign(4, std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(
      cpu::Gemm(Transpose::kNo, Transpose::kNo, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f,
                c.data(), 2)
          .ok());
  EXPECT_TRUE(AllClose(c, {0, 0, 0, 0}, kExact));
}

TEST(CpuGemm, RejectsBadArguments) {
  std::vector<float> c(4);
  Status s = cpu::Gemm(Transpose::kNo, Transpose::kNo, 2, 2, 3, 1.0f, kA.data(), 2, kB.data(), 2,
                       0.0f, c.data(), 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lda"), std::string::npos) << s;
  s = cpu::Gemm(Transpose::kNo, Transpose::kNo, -1, 2, 3, 1.0f, kA.data(), 3, kB.data(), 2, 0.0f,
                c.data(), 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = cpu::Gemm(Transpose::kNo, Transpose::kNo, 2, 2, 3, 1.0f, nullptr, 3, kB.data(), 2, 0.0f,
                c.data(), 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = cpu::Gemm(Transpose::kNo, Transpose::kNo, int64_t{1} << 31, 2, 3, 1.0f, kA.data(), 3,
                kB.data(), 2, 0.0f, c.data(), 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

// ---- Bias --------------------------------------------------------------------------------------

TEST(CpuBias, AddBroadcastsOverRows) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const std::vector<float> bias = {10, 20, 30};
  ASSERT_TRUE(cpu::BiasAdd(bias.data(), 2, 3, x.data()).ok());
  EXPECT_TRUE(AllClose(x, {11, 22, 33, 14, 25, 36}, kExact));
}

TEST(CpuBias, GradSumsColumnsAndOverwrites) {
  const std::vector<float> dy = {1, 2, 3, 4, 5, 6};
  std::vector<float> dbias = {100, 100, 100};
  ASSERT_TRUE(cpu::BiasGrad(dy.data(), 2, 3, dbias.data()).ok());
  EXPECT_TRUE(AllClose(dbias, {5, 7, 9}, kExact));
  ASSERT_TRUE(cpu::BiasGrad(nullptr, 0, 3, dbias.data()).ok());
  EXPECT_TRUE(AllClose(dbias, {0, 0, 0}, kExact));
  EXPECT_EQ(cpu::BiasGrad(dy.data(), 2, 3, nullptr).code(), StatusCode::kInvalidArgument);
}

// ---- ReLU --------------------------------------------------------------------------------------

TEST(CpuRelu, ForwardAndBackward) {
  const std::vector<float> x = {-1.5f, 0.0f, 2.0f, -0.0f, 3.25f};
  std::vector<float> y(5);
  ASSERT_TRUE(cpu::ReluForward(x.data(), 5, y.data()).ok());
  EXPECT_TRUE(AllClose(y, {0, 0, 2, 0, 3.25f}, kExact));
  std::vector<float> dy = {1, 2, 3, 4, 5};
  ASSERT_TRUE(cpu::ReluBackward(y.data(), dy.data(), 5, dy.data()).ok());  // In place.
  EXPECT_TRUE(AllClose(dy, {0, 0, 3, 0, 5}, kExact));
}

TEST(CpuRelu, ForwardInPlace) {
  std::vector<float> x = {-1, 1};
  ASSERT_TRUE(cpu::ReluForward(x.data(), 2, x.data()).ok());
  EXPECT_TRUE(AllClose(x, {0, 1}, kExact));
  EXPECT_EQ(cpu::ReluForward(nullptr, 2, x.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(cpu::ReluForward(nullptr, 0, nullptr).ok());
}

// ---- Softmax cross-entropy ---------------------------------------------------------------------

TEST(CpuSoftmaxCrossEntropy, ForwardHandComputed) {
  // Row 0: logits (0, 0) -> probs (1/2, 1/2), label 0: loss ln 2.
  // Row 1: logits (0, ln 3) -> probs (1/4, 3/4), label 1: loss -ln(3/4).
  // Row 2: logits (1000, 1000, 1000) (overflows a naive exp) -> 1/3 each, label 2: loss ln 3.
  // Rows of different widths do not mix, so the three rows run as two calls.
  const std::vector<float> logits = {0, 0, 0, std::log(3.0f)};
  const std::vector<int32_t> labels = {0, 1};
  std::vector<float> probs(4), row_loss(2), mean(1);
  ASSERT_TRUE(cpu::SoftmaxCrossEntropyForward(logits.data(), labels.data(), 2, 2, probs.data(),
                                              row_loss.data(), mean.data())
                  .ok());
  EXPECT_TRUE(AllClose(probs, {0.5f, 0.5f, 0.25f, 0.75f}, kTight));
  EXPECT_TRUE(AllClose(row_loss, {std::log(2.0f), -std::log(0.75f)}, kTight));
  EXPECT_TRUE(AllClose(mean, {(std::log(2.0f) - std::log(0.75f)) / 2}, kTight));

  const std::vector<float> big = {1000, 1000, 1000};
  const std::vector<int32_t> label2 = {2};
  std::vector<float> p3(3), l3(1), m3(1);
  ASSERT_TRUE(
      cpu::SoftmaxCrossEntropyForward(big.data(), label2.data(), 1, 3, p3.data(), l3.data(),
                                      m3.data())
          .ok());
  EXPECT_TRUE(AllClose(p3, {1 / 3.0f, 1 / 3.0f, 1 / 3.0f}, kTight));
  EXPECT_TRUE(AllClose(l3, {std::log(3.0f)}, kTight));
  EXPECT_TRUE(AllClose(m3, {std::log(3.0f)}, kTight));
}

TEST(CpuSoftmaxCrossEntropy, BackwardIsScaledProbsMinusOneHot) {
  const std::vector<float> probs = {0.5f, 0.5f, 0.25f, 0.75f};
  const std::vector<int32_t> labels = {0, 1};
  std::vector<float> d(4);
  ASSERT_TRUE(
      cpu::SoftmaxCrossEntropyBackward(probs.data(), labels.data(), 2, 2, 0.5f, d.data()).ok());
  EXPECT_TRUE(AllClose(d, {-0.25f, 0.25f, 0.125f, -0.125f}, kExact));
}

TEST(CpuSoftmaxCrossEntropy, RejectsLabelOutOfRangeWithoutWriting) {
  const std::vector<float> logits = {0, 0, 0, 0};
  const std::vector<int32_t> labels = {0, 2};
  std::vector<float> probs(4, -7), row_loss(2, -7), mean(1, -7);
  const Status s = cpu::SoftmaxCrossEntropyForward(logits.data(), labels.data(), 2, 2,
                                                   probs.data(), row_loss.data(), mean.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("labels[1]"), std::string::npos) << s;
  EXPECT_TRUE(AllClose(probs, {-7, -7, -7, -7}, kExact));
  EXPECT_EQ(cpu::SoftmaxCrossEntropyForward(logits.data(), labels.data(), 2, 0, probs.data(),
                                            row_loss.data(), mean.data())
                .code(),
            StatusCode::kInvalidArgument);
}

// d mean_loss / d logits by central differences, against the backward with scale = 1 / rows.
TEST(CpuSoftmaxCrossEntropy, BackwardMatchesFiniteDifferences) {
  std::vector<float> logits = {0.3f, -1.2f, 2.0f, 0.7f, 0.1f, -0.4f, 1.5f, -2.0f};
  const std::vector<int32_t> labels = {2, 0};
  const int64_t rows = 2, classes = 4;
  std::vector<float> probs(8), row_loss(2), mean(1), d(8);
  ASSERT_TRUE(cpu::SoftmaxCrossEntropyForward(logits.data(), labels.data(), rows, classes,
                                              probs.data(), row_loss.data(), mean.data())
                  .ok());
  ASSERT_TRUE(cpu::SoftmaxCrossEntropyBackward(probs.data(), labels.data(), rows, classes,
                                               1.0f / rows, d.data())
                  .ok());
  const float eps = 1e-2f;
  for (size_t i = 0; i < logits.size(); ++i) {
    float up = 0, down = 0;
    const float saved = logits[i];
    logits[i] = saved + eps;
    ASSERT_TRUE(cpu::SoftmaxCrossEntropyForward(logits.data(), labels.data(), rows, classes,
                                                probs.data(), row_loss.data(), &up)
                    .ok());
    logits[i] = saved - eps;
    ASSERT_TRUE(cpu::SoftmaxCrossEntropyForward(logits.data(), labels.data(), rows, classes,
                                                probs.data(), row_loss.data(), &down)
                    .ok());
    logits[i] = saved;
    EXPECT_NEAR(d[i], (up - down) / (2 * eps), 2e-3f) << "logit " << i;
  }
}

// ---- Sigmoid cross-entropy ---------------------------------------------------------------------

TEST(CpuSigmoidCrossEntropy, ForwardHandComputedAndStable) {
  const std::vector<float> x = {0.0f, std::log(3.0f), -100.0f, 100.0f, -100.0f};
  const std::vector<float> t = {1.0f, 0.0f, 0.0f, 0.0f, 1.0f};
  std::vector<float> loss(5), mean(1), probs(5);
  ASSERT_TRUE(
      cpu::SigmoidCrossEntropyForward(x.data(), t.data(), 5, loss.data(), mean.data(),
                                      probs.data())
          .ok());
  // s(0) = 1/2, t = 1: ln 2. s(ln 3) = 3/4, t = 0: -ln(1/4) = ln 4. x = -100, t = 0: ~e^-100.
  // x = 100, t = 0: 100. x = -100, t = 1: 100.
  const std::vector<float> want = {std::log(2.0f), std::log(4.0f), 0.0f, 100.0f, 100.0f};
  EXPECT_TRUE(AllClose(loss, want, kTight));
  EXPECT_TRUE(AllClose(mean, {(std::log(2.0f) + std::log(4.0f) + 200.0f) / 5}, {1e-5f, 1e-6f}));
  EXPECT_TRUE(AllClose(probs, {0.5f, 0.75f, 0.0f, 1.0f, 0.0f}, kTight));
  std::vector<float> loss2(5), mean2(1);
  ASSERT_TRUE(cpu::SigmoidCrossEntropyForward(x.data(), t.data(), 5, loss2.data(), mean2.data(),
                                              /*probs=*/nullptr)
                  .ok());
  EXPECT_TRUE(AllClose(loss2, loss, kExact));
}

TEST(CpuSigmoidCrossEntropy, BackwardIsScaledSigmoidMinusTarget) {
  const std::vector<float> x = {0.0f, std::log(3.0f), -100.0f};
  const std::vector<float> t = {1.0f, 0.0f, 0.25f};
  std::vector<float> d(3);
  ASSERT_TRUE(cpu::SigmoidCrossEntropyBackward(x.data(), t.data(), 3, 2.0f, d.data()).ok());
  EXPECT_TRUE(AllClose(d, {-1.0f, 1.5f, -0.5f}, kTight));
}

TEST(CpuSigmoidCrossEntropy, BackwardMatchesFiniteDifferences) {
  std::vector<float> x = {0.3f, -1.2f, 2.0f, 0.7f, -3.0f};
  const std::vector<float> t = {1.0f, 0.0f, 0.5f, 0.0f, 1.0f};
  const int64_t n = 5;
  std::vector<float> loss(5), d(5);
  ASSERT_TRUE(cpu::SigmoidCrossEntropyBackward(x.data(), t.data(), n, 1.0f / n, d.data()).ok());
  const float eps = 1e-2f;
  for (int64_t i = 0; i < n; ++i) {
    float up = 0, down = 0;
    const float saved = x[i];
    x[i] = saved + eps;
    ASSERT_TRUE(
        cpu::SigmoidCrossEntropyForward(x.data(), t.data(), n, loss.data(), &up, nullptr).ok());
    x[i] = saved - eps;
    ASSERT_TRUE(
        cpu::SigmoidCrossEntropyForward(x.data(), t.data(), n, loss.data(), &down, nullptr).ok());
    x[i] = saved;
    EXPECT_NEAR(d[i], (up - down) / (2 * eps), 1e-3f) << "logit " << i;
  }
}

// ---- Embedding bag -----------------------------------------------------------------------------

// table rows r0 = (1 2), r1 = (3 4), r2 = (5 6), r3 = (7 8).
// bag 0 = {r0, r3}, bag 1 = {}, bag 2 = {r1, r1, r2}.
const std::vector<float> kTable = {1, 2, 3, 4, 5, 6, 7, 8};
const std::vector<int32_t> kOffsets = {0, 2, 2, 5};
const std::vector<int32_t> kIndices = {0, 3, 1, 1, 2};

TEST(CpuEmbeddingBag, ForwardSumAndMean) {
  std::vector<float> out(6, -1);
  ASSERT_TRUE(cpu::EmbeddingBagForward(kTable.data(), 4, 2, kOffsets.data(), kIndices.data(), 3,
                                       5, Pooling::kSum, out.data())
                  .ok());
  EXPECT_TRUE(AllClose(out, {8, 10, 0, 0, 11, 14}, kExact));
  ASSERT_TRUE(cpu::EmbeddingBagForward(kTable.data(), 4, 2, kOffsets.data(), kIndices.data(), 3,
                                       5, Pooling::kMean, out.data())
                  .ok());
  EXPECT_TRUE(AllClose(out, {4, 5, 0, 0, 11 / 3.0f, 14 / 3.0f}, kTight));
}

TEST(CpuEmbeddingBag, BackwardPerUniqueRow) {
  // The indices above are the inverse map into 5 unique rows; row 4 is never used.
  const std::vector<float> dout = {1, 1, 2, 2, 3, -3};
  std::vector<float> grads(10, -1);
  ASSERT_TRUE(cpu::EmbeddingBagBackward(dout.data(), 2, kOffsets.data(), kIndices.data(), 3, 5,
                                        5, Pooling::kSum, grads.data())
                  .ok());
  EXPECT_TRUE(AllClose(grads, {1, 1, 6, -6, 3, -3, 1, 1, 0, 0}, kExact));
  ASSERT_TRUE(cpu::EmbeddingBagBackward(dout.data(), 2, kOffsets.data(), kIndices.data(), 3, 5,
                                        5, Pooling::kMean, grads.data())
                  .ok());
  EXPECT_TRUE(AllClose(grads, {0.5f, 0.5f, 2, -2, 1, -1, 0.5f, 0.5f, 0, 0}, kTight));
}

TEST(CpuEmbeddingBag, RejectsBadCsrAndIndices) {
  std::vector<float> out(6, -1);
  const std::vector<int32_t> bad_index = {0, 3, 1, 4, 2};
  Status s = cpu::EmbeddingBagForward(kTable.data(), 4, 2, kOffsets.data(), bad_index.data(), 3,
                                      5, Pooling::kSum, out.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("indices[3]"), std::string::npos) << s;
  EXPECT_TRUE(AllClose(out, {-1, -1, -1, -1, -1, -1}, kExact));  // Nothing written.

  const std::vector<int32_t> short_offsets = {0, 2, 2, 4};  // Ends before nnz = 5.
  s = cpu::EmbeddingBagForward(kTable.data(), 4, 2, short_offsets.data(), kIndices.data(), 3, 5,
                               Pooling::kSum, out.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> decreasing = {0, 3, 2, 5};
  s = cpu::EmbeddingBagForward(kTable.data(), 4, 2, decreasing.data(), kIndices.data(), 3, 5,
                               Pooling::kSum, out.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = cpu::EmbeddingBagForward(kTable.data(), 4, 2, kOffsets.data(), kIndices.data(), 3, 5,
                               static_cast<Pooling>(7), out.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);

  std::vector<float> grads(8);
  const std::vector<float> dout(6, 1.0f);
  s = cpu::EmbeddingBagBackward(dout.data(), 2, kOffsets.data(), kIndices.data(), 3, 5,
                                /*num_unique=*/3, Pooling::kSum, grads.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("inverse[1]"), std::string::npos) << s;
}

// ---- Dedup -------------------------------------------------------------------------------------

TEST(CpuDedup, SortedUniqueAndInverse) {
  const std::vector<int64_t> ids = {5, -3, 5, 7, -3, 5};
  std::vector<int64_t> unique(6, 0);
  std::vector<int32_t> inverse(6, -1);
  int32_t u = -1;
  ASSERT_TRUE(cpu::Dedup(ids.data(), 6, unique.data(), inverse.data(), &u).ok());
  ASSERT_EQ(u, 3);
  EXPECT_EQ(std::vector<int64_t>(unique.begin(), unique.begin() + u),
            (std::vector<int64_t>{-3, 5, 7}));
  EXPECT_EQ(inverse, (std::vector<int32_t>{1, 0, 1, 2, 0, 1}));
}

TEST(CpuDedup, ExtremesAndEmpty) {
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> ids = {hi, lo, 0, hi};
  std::vector<int64_t> unique(4);
  std::vector<int32_t> inverse(4);
  int32_t u = -1;
  ASSERT_TRUE(cpu::Dedup(ids.data(), 4, unique.data(), inverse.data(), &u).ok());
  ASSERT_EQ(u, 3);
  EXPECT_EQ(std::vector<int64_t>(unique.begin(), unique.begin() + 3),
            (std::vector<int64_t>{lo, 0, hi}));
  EXPECT_EQ(inverse, (std::vector<int32_t>{2, 0, 1, 2}));
  ASSERT_TRUE(cpu::Dedup(nullptr, 0, nullptr, nullptr, &u).ok());
  EXPECT_EQ(u, 0);
  EXPECT_EQ(cpu::Dedup(ids.data(), 4, unique.data(), inverse.data(), nullptr).code(),
            StatusCode::kInvalidArgument);
}

// Dedup then EmbeddingBag: the trainer's sparse path on one field, against a direct computation.
TEST(CpuPipeline, DedupFeedsEmbeddingBag) {
  const std::vector<int64_t> ids = {42, 7, 42, 1000, 7};  // Bags {42, 7} and {42, 1000, 7}.
  const std::vector<int32_t> offsets = {0, 2, 5};
  std::vector<int64_t> unique(5);
  std::vector<int32_t> inverse(5);
  int32_t u = 0;
  ASSERT_TRUE(cpu::Dedup(ids.data(), 5, unique.data(), inverse.data(), &u).ok());
  ASSERT_EQ(u, 3);
  // "Pulled" rows for unique ids 7, 42, 1000: row = (id, -id).
  std::vector<float> rows;
  for (int i = 0; i < u; ++i) rows.insert(rows.end(), {float(unique[i]), -float(unique[i])});
  std::vector<float> out(4);
  ASSERT_TRUE(cpu::EmbeddingBagForward(rows.data(), u, 2, offsets.data(), inverse.data(), 2, 5,
                                       Pooling::kSum, out.data())
                  .ok());
  EXPECT_TRUE(AllClose(out, {49, -49, 1049, -1049}, kExact));
}

}  // namespace
}  // namespace ferry::kernels
