// The value formats of compressed tables (ferry/messages/codec.h, protocol 1.6): fp16 and bf16
// against the compiler's own conversions and their error bounds, saturation, NaN and Inf; top-k
// selection (exact k, ties by index) and error feedback (sent + new residual == gradient + old
// residual, bit for bit).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/messages/codec.h"

namespace ferry::wire {
namespace {

constexpr uint32_t kSeed = 20261125;

uint16_t F16(float x) {
  uint16_t h = 0;
  EncodeF16(&x, 1, &h);
  return h;
}
float FromF16Bits(uint16_t h) {
  float x = 0;
  DecodeF16(&h, 1, &x);
  return x;
}
uint16_t Bf16(float x) {
  uint16_t h = 0;
  EncodeBf16(&x, 1, &h);
  return h;
}
float FromBf16Bits(uint16_t h) {
  float x = 0;
  DecodeBf16(&h, 1, &x);
  return x;
}

// Magnitudes log-uniform in [lo, hi), random signs.
std::vector<float> LogUniform(size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> e(std::log2(lo), std::log2(hi));
  std::bernoulli_distribution neg(0.5);
  std::vector<float> v(n);
  for (auto& x : v) x = (neg(rng) ? -1.0f : 1.0f) * std::exp2(e(rng));
  return v;
}

TEST(Codec, Fp16DecodesEveryPatternAsTheCompilerDoesAndRoundTripsIt) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = FromF16Bits(static_cast<uint16_t>(h));
#if defined(__FLT16_MAX__)
    _Float16 ref;
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&ref, &bits, 2);
    if (!std::isnan(x)) {
      ASSERT_EQ(std::bit_cast<uint32_t>(x), std::bit_cast<uint32_t>(static_cast<float>(ref))) << std::hex << h;
    }
#endif
    if (std::isnan(x)) {
      EXPECT_TRUE((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) << std::hex << h;
      continue;
    }
    ASSERT_EQ(F16(x), h) << "every fp16 value encodes back to itself: " << std::hex << h;
  }
}

TEST(Codec, Fp16RoundsToNearestEvenWithinHalfAnUlp) {
  std::mt19937 rng(kSeed);
  SCOPED_TRACE("seed " + std::to_string(kSeed));
  const auto normal = LogUniform(200000, 6.103515625e-05f, 65504.0f, rng);  // [2^-14, 65504]
  std::vector<uint16_t> enc(normal.size());
  std::vector<float> dec(normal.size());
  EXPECT_EQ(EncodeF16(normal.data(), static_cast<int64_t>(normal.size()), enc.data()), 0);
  DecodeF16(enc.data(), static_cast<int64_t>(enc.size()), dec.data());
  for (size_t i = 0; i < normal.size(); ++i) {
    const float x = normal[i];
    ASSERT_LE(std::fabs(dec[i] - x), std::ldexp(std::fabs(x), -11)) << x;
    ASSERT_EQ(std::signbit(dec[i]), std::signbit(x));
#if defined(__FLT16_MAX__)
    ASSERT_EQ(enc[i], std::bit_cast<uint16_t>(static_cast<_Float16>(x))) << "differs from GCC's conversion at " << x;
#endif
  }
  // Ties go to the even neighbour: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(F16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(F16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(Codec, Fp16SubnormalsZeroAndSigns) {
  EXPECT_EQ(F16(0.0f), 0x0000);
  EXPECT_EQ(F16(-0.0f), 0x8000);
  EXPECT_TRUE(std::signbit(FromF16Bits(0x8000)));
  const float tiny = std::ldexp(1.0f, -24);  // the smallest fp16 subnormal
  EXPECT_EQ(F16(tiny), 0x0001);
  EXPECT_EQ(F16(-tiny), 0x8001);
  EXPECT_EQ(FromF16Bits(0x0001), tiny);
  EXPECT_EQ(F16(std::ldexp(1.0f, -25)), 0x0000) << "half of the smallest subnormal ties to even: 0";
  EXPECT_EQ(F16(3 * std::ldexp(1.0f, -26)), 0x0001);
  EXPECT_EQ(F16(std::ldexp(1.0f, -15)), 0x0200) << "2^-15 is a subnormal, exactly";
  std::mt19937 rng(kSeed + 1);
  for (float x : LogUniform(20000, 1e-9f, 6.1e-05f, rng)) {
    ASSERT_LE(std::fabs(FromF16Bits(F16(x)) - x), std::ldexp(1.0f, -25)) << "subnormal range: absolute error " << x;
  }
}

TEST(Codec, Fp16SaturatesFiniteValuesBeyondItsRangeAndKeepsNaNAndInf) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {65504.0f, 65519.0f, 65520.0f, 1e10f, -70000.0f, std::numeric_limits<float>::max(),
                                 inf, -inf, std::nanf(""), -std::nanf("")};
  std::vector<uint16_t> out(in.size());
  EXPECT_EQ(EncodeF16(in.data(), static_cast<int64_t>(in.size()), out.data()), 4) << "65520, 1e10, -70000, FLT_MAX";
  EXPECT_EQ(out[0], 0x7bff);
  EXPECT_EQ(out[1], 0x7bff) << "65519 rounds down to 65504";
  EXPECT_EQ(out[2], 0x7bff) << "65520 would round to Inf: saturated";
  EXPECT_EQ(out[3], 0x7bff);
  EXPECT_EQ(out[4], 0xfbff);
  EXPECT_EQ(out[5], 0x7bff);
  EXPECT_EQ(out[6], 0x7c00);
  EXPECT_EQ(out[7], 0xfc00);
  EXPECT_TRUE(std::isnan(FromF16Bits(out[8])));
  EXPECT_TRUE(std::isnan(FromF16Bits(out[9])));
  EXPECT_TRUE(std::signbit(FromF16Bits(out[9])));
  EXPECT_EQ(FromF16Bits(out[6]), inf);
  EXPECT_EQ(FromF16Bits(out[2]), 65504.0f);
}

TEST(Codec, Bf16RoundTripsEveryPatternAndRoundsWithinItsBound) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = FromBf16Bits(static_cast<uint16_t>(h));
    ASSERT_EQ(std::bit_cast<uint32_t>(x), h << 16);
    if (!std::isnan(x)) {
      ASSERT_EQ(Bf16(x), h) << std::hex << h;
    }
  }
  std::mt19937 rng(kSeed + 2);
  for (float x : LogUniform(200000, 1.2e-38f, 3.3e38f, rng)) {
    const float y = FromBf16Bits(Bf16(x));
    ASSERT_LE(std::fabs(y - x), std::ldexp(std::fabs(x), -8)) << x;
  }
  EXPECT_EQ(Bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80) << "a tie goes to the even neighbour (1)";
  EXPECT_EQ(Bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(Bf16(-0.0f), 0x8000);
  EXPECT_EQ(Bf16(std::ldexp(1.0f, -133)), 0x0001) << "float32 subnormals keep their top bits";
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), inf, -inf,
                                 std::nanf("")};
  std::vector<uint16_t> out(in.size());
  EXPECT_EQ(EncodeBf16(in.data(), static_cast<int64_t>(in.size()), out.data()), 2);
  EXPECT_EQ(out[0], 0x7f7f) << "FLT_MAX would round to Inf: saturated to the largest bf16";
  EXPECT_EQ(out[1], 0xff7f);
  EXPECT_EQ(out[2], 0x7f80);
  EXPECT_EQ(out[3], 0xff80);
  EXPECT_TRUE(std::isnan(FromBf16Bits(out[4])));
}

TEST(Codec, TopKCountIsTheCeilingOfRatioTimesLength) {
  EXPECT_EQ(TopKCount(0.3f, 10), 3) << "0.3f is a hair above 0.3; the slack keeps k at 3";
  EXPECT_EQ(TopKCount(0.01f, 1000), 10);
  EXPECT_EQ(TopKCount(0.01f, 1001), 11);
  EXPECT_EQ(TopKCount(0.01f, 1 << 20), 10486);
  EXPECT_EQ(TopKCount(1.0f, 7), 7);
  EXPECT_EQ(TopKCount(1e-9f, 5), 1) << "at least one";
  EXPECT_EQ(TopKCount(0.5f, 0), 0);
  EXPECT_EQ(TopKFrameBytes(ferry::WireFormat::kF32, 0.01f, 1000), 80);
  EXPECT_EQ(TopKFrameBytes(ferry::WireFormat::kF16, 0.01f, 1000), 60);
}

// Reference: sort indices by (magnitude descending, index ascending), take k, sort by index.
std::vector<uint32_t> Reference(const std::vector<float>& x, int64_t k) {
  std::vector<uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  auto mag = [&](uint32_t i) { return std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu; };
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return mag(a) > mag(b); });
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

TEST(Codec, TopKSelectsExactlyKAndBreaksTiesByIndex) {
  std::vector<uint32_t> scratch;
  const std::vector<float> x = {1, -3, 3, 2, -3, 0};
  std::vector<uint32_t> idx(3);
  SelectTopK(x.data(), 6, 2, idx.data(), &scratch);
  EXPECT_EQ((std::vector<uint32_t>{idx[0], idx[1]}), (std::vector<uint32_t>{1, 2})) << "ties: the lower indices";
  SelectTopK(x.data(), 6, 3, idx.data(), &scratch);
  EXPECT_EQ(idx, (std::vector<uint32_t>{1, 2, 4}));
  const std::vector<float> flat(9, 0.5f);
  SelectTopK(flat.data(), 9, 3, idx.data(), &scratch);
  EXPECT_EQ(idx, (std::vector<uint32_t>{0, 1, 2}));
  std::mt19937 rng(kSeed + 3);
  SCOPED_TRACE("seed " + std::to_string(kSeed + 3));
  for (int trial = 0; trial < 50; ++trial) {
    const size_t n = 1 + rng() % 5000;
    std::vector<float> v(n);
    std::uniform_int_distribution<int> few(-20, 20);  // many ties
    for (auto& e : v) e = static_cast<float>(few(rng)) * 0.25f;
    if (trial % 5 == 0) v[rng() % n] = std::nanf("");  // NaN ranks above everything: always sent
    const int64_t k = TopKCount(0.05f, static_cast<int64_t>(n));
    std::vector<uint32_t> got(static_cast<size_t>(k));
    SelectTopK(v.data(), static_cast<int64_t>(n), k, got.data(), &scratch);
    ASSERT_EQ(got, Reference(v, k)) << "n " << n;
  }
  // Gaussian values over many magnitude buckets, and a spike (the threshold's bucket far down).
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t k : {1, 37, 1000, 99999}) {
    std::vector<float> v(100000);
    for (auto& e : v) e = normal(rng);
    v[123] = 1e30f;
    std::vector<uint32_t> got(static_cast<size_t>(k));
    SelectTopK(v.data(), static_cast<int64_t>(v.size()), k, got.data(), &scratch);
    ASSERT_EQ(got, Reference(v, k)) << "k " << k;
  }
}

// The residual carries exactly what was not sent: after a push, sent + new residual equals
// gradient + old residual bit for bit (with 16-bit values the residual keeps the rounding error).
TEST(Codec, ErrorFeedbackKeepsExactlyWhatWasNotSent) {
  for (auto w : {ferry::WireFormat::kF32, ferry::WireFormat::kF16, ferry::WireFormat::kBf16}) {
    SCOPED_TRACE(std::string(WireFormatName(w)));
    std::mt19937 rng(kSeed + 4);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t n = 10000;
    const float ratio = 0.01f;
    std::vector<float> residual(n, 0.0f);
    std::vector<uint32_t> scratch;
    for (int step = 0; step < 5; ++step) {
      std::vector<float> g(n);
      for (auto& e : g) e = normal(rng);
      std::vector<float> acc(n), want(n);
      for (int64_t i = 0; i < n; ++i) acc[i] = want[i] = residual[i] + g[i];
      std::vector<unsigned char> frame(static_cast<size_t>(TopKFrameBytes(w, ratio, n)));
      EncodeTopK(w, ratio, acc.data(), n, frame.data(), &scratch);
      std::vector<float> sent(n);
      ASSERT_TRUE(DecodeTopK(w, ratio, frame.data(), frame.size(), n, sent.data()).ok());
      int64_t nonzero = 0;
      for (int64_t i = 0; i < n; ++i) {
        nonzero += sent[i] != 0.0f;
        ASSERT_EQ(std::bit_cast<uint32_t>(sent[i] + acc[i]), std::bit_cast<uint32_t>(want[i])) << "element " << i;
        if (sent[i] != 0.0f && w == ferry::WireFormat::kF32) {
          ASSERT_EQ(acc[i], 0.0f);
        }
      }
      EXPECT_EQ(nonzero, TopKCount(ratio, n));
      // What was sent is the largest of gradient + residual.
      float smallest_sent = INFINITY, largest_kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (sent[i] != 0.0f) smallest_sent = std::min(smallest_sent, std::fabs(want[i]));
        else largest_kept = std::max(largest_kept, std::fabs(want[i]));
      }
      EXPECT_GE(smallest_sent, largest_kept);
      residual = acc;
    }
  }
}

TEST(Codec, ANaNOrInfSentByTopKIsNotCarriedInTheResidual) {
  std::vector<float> acc = {0.5f, std::nanf(""), -INFINITY, 0.25f};
  std::vector<uint32_t> scratch;
  std::vector<unsigned char> frame(static_cast<size_t>(TopKFrameBytes(ferry::WireFormat::kF16, 0.5f, 4)));
  EncodeTopK(ferry::WireFormat::kF16, 0.5f, acc.data(), 4, frame.data(), &scratch);
  std::vector<float> sent(4);
  ASSERT_TRUE(DecodeTopK(ferry::WireFormat::kF16, 0.5f, frame.data(), frame.size(), 4, sent.data()).ok());
  EXPECT_TRUE(std::isnan(sent[1])) << "sent, so that the server applies the table's nonfinite policy";
  EXPECT_EQ(sent[2], -INFINITY);
  EXPECT_EQ(acc, (std::vector<float>{0.5f, 0.0f, 0.0f, 0.25f}));
}

TEST(Codec, DecodeTopKRefusesBadFrames) {
  const int64_t n = 100;  // k = 2 at ratio 0.02
  auto frame = [](std::vector<uint32_t> idx, std::vector<float> vals) {
    std::vector<unsigned char> f(idx.size() * 4 + vals.size() * 4);
    std::memcpy(f.data(), idx.data(), idx.size() * 4);
    std::memcpy(f.data() + idx.size() * 4, vals.data(), vals.size() * 4);
    return f;
  };
  std::vector<float> out(n);
  auto decode = [&](const std::vector<unsigned char>& f) {
    return DecodeTopK(ferry::WireFormat::kF32, 0.02f, f.data(), f.size(), n, out.data());
  };
  ASSERT_TRUE(decode(frame({3, 99}, {1.5f, -2.0f})).ok());
  EXPECT_EQ(out[3], 1.5f);
  EXPECT_EQ(out[99], -2.0f);
  EXPECT_EQ(std::count(out.begin(), out.end(), 0.0f), n - 2);
  Status s = decode(frame({3, 100}, {1, 1}));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("index 100, past the chunk's 100 elements"), std::string::npos) << s;
  s = decode(frame({7, 7}, {1, 1}));
  EXPECT_NE(s.message().find("strictly increasing"), std::string::npos) << s;
  s = decode(frame({9, 2}, {1, 1}));
  EXPECT_NE(s.message().find("strictly increasing"), std::string::npos) << s;
  s = decode(frame({1, 2, 3}, {1, 1, 1}));
  EXPECT_NE(s.message().find("top-k frame has 24 bytes; a chunk of 100 elements sends k = 2 pairs, 16 bytes"),
            std::string::npos)
      << s;
  s = DecodeTopK(ferry::WireFormat::kF32, 0.02f, nullptr, 0, n, out.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::wire
