// The server-side optimizers against values computed by hand.
#include <bit>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "internal/optimizer.h"

namespace ferry::ps {
namespace {

OptimizerSpec Spec(OptimizerType type, float lr) {
  OptimizerSpec o;
  o.type = type;
  o.learning_rate = lr;
  return o;
}

TEST(Optimizer, SgdSubtractsScaledGradient) {
  auto o = Spec(OptimizerType::kSgd, 0.5f);
  std::vector<float> p = {1.0f, -2.0f, 3.0f}, g = {2.0f, 4.0f, -1.0f};
  ApplyUpdate(o, p.data(), g.data(), nullptr, 3, 3, 1);
  EXPECT_EQ(p, (std::vector<float>{0.0f, -4.0f, 3.5f}));
  EXPECT_EQ(StateSlots(OptimizerType::kSgd), 0);
}

TEST(Optimizer, MomentumAccumulatesVelocity) {
  auto o = Spec(OptimizerType::kMomentum, 0.1f);
  o.momentum = 0.5f;
  std::vector<float> p = {1.0f}, g = {2.0f}, v(1);
  InitState(o, v.data(), 1);
  ApplyUpdate(o, p.data(), g.data(), v.data(), 1, 1, 1);  // v = 2, p = 1 - 0.2
  EXPECT_FLOAT_EQ(v[0], 2.0f);
  EXPECT_FLOAT_EQ(p[0], 0.8f);
  ApplyUpdate(o, p.data(), g.data(), v.data(), 1, 1, 2);  // v = 1 + 2 = 3, p = 0.8 - 0.3
  EXPECT_FLOAT_EQ(v[0], 3.0f);
  EXPECT_FLOAT_EQ(p[0], 0.5f);
}

TEST(Optimizer, NesterovMomentumLooksAhead) {
  auto o = Spec(OptimizerType::kMomentum, 0.1f);
  o.momentum = 0.5f;
  o.nesterov = true;
  std::vector<float> p = {1.0f}, g = {2.0f}, v = {0.0f};
  ApplyUpdate(o, p.data(), g.data(), v.data(), 1, 1, 1);  // v = 2; p -= 0.1 * (2 + 0.5*2) = 0.3
  EXPECT_FLOAT_EQ(p[0], 0.7f);
}

TEST(Optimizer, AdagradStartsFromInitialAccumulator) {
  auto o = Spec(OptimizerType::kAdagrad, 1.0f);
  o.initial_accumulator = 5.0f;
  o.epsilon = 0.0f;
  std::vector<float> p = {10.0f, 10.0f}, g = {2.0f, -4.0f}, a(2);
  InitState(o, a.data(), 2);
  EXPECT_EQ(a, (std::vector<float>{5.0f, 5.0f}));
  ApplyUpdate(o, p.data(), g.data(), a.data(), 2, 2, 1);
  // a = 5 + 4 = 9 -> p = 10 - 2/3;  a = 5 + 16 = 21 -> p = 10 + 4/sqrt(21)
  EXPECT_FLOAT_EQ(a[0], 9.0f);
  EXPECT_FLOAT_EQ(p[0], 10.0f - 2.0f / 3.0f);
  EXPECT_FLOAT_EQ(a[1], 21.0f);
  EXPECT_FLOAT_EQ(p[1], 10.0f + 4.0f / std::sqrt(21.0f));
}

TEST(Optimizer, AdamBiasCorrectedFirstStepsMatchHandComputation) {
  auto o = Spec(OptimizerType::kAdam, 0.1f);
  o.beta1 = 0.9f;
  o.beta2 = 0.999f;
  o.epsilon = 1e-8f;
  // Two parameters; state slot 0 (m) at [0, 2), slot 1 (v) at [2, 4).
  std::vector<float> p = {1.0f, -1.0f}, g = {0.5f, -2.0f}, s(4, 0.0f);
  ApplyUpdate(o, p.data(), g.data(), s.data(), 2, 2, 1);
  // Step 1: m = 0.1 g, v = 0.001 g^2, lr_t = 0.1 * sqrt(0.001) / 0.1; update = lr_t * m / sqrt(v)
  //         = 0.1 * sign(g) (up to epsilon).
  EXPECT_FLOAT_EQ(s[0], 0.05f);
  EXPECT_FLOAT_EQ(s[1], -0.2f);
  // (1 - 0.999f) is 0.00099998713 in float, not 0.001: v = that times g^2.
  EXPECT_FLOAT_EQ(s[2], (1.0f - 0.999f) * 0.25f);
  EXPECT_FLOAT_EQ(s[3], (1.0f - 0.999f) * 4.0f);
  EXPECT_NEAR(s[2], 0.00025f, 1e-8);
  EXPECT_NEAR(p[0], 0.9f, 1e-6);
  EXPECT_NEAR(p[1], -0.9f, 1e-6);
  // Step 2 with the same gradient: m = 0.9*0.05 + 0.1*0.5 = 0.095; v = 0.999*0.00025 + 0.001*0.25
  //   = 0.00049975; lr_t = 0.1 * sqrt(1 - 0.999^2) / (1 - 0.9^2) = 0.1 * 0.0447101778 / 0.19.
  ApplyUpdate(o, p.data(), g.data(), s.data(), 2, 2, 2);
  const double lr_t = 0.1 * std::sqrt(1.0 - 0.999 * 0.999) / (1.0 - 0.81);
  const double expect0 = 0.9 - lr_t * 0.095 / (std::sqrt(0.00049975) + 1e-8);
  EXPECT_NEAR(p[0], expect0, 1e-6);
  EXPECT_NEAR(p[0], 0.8f, 1e-5);  // a constant gradient moves Adam by about lr per step
}

TEST(Optimizer, SubRangesWithStrideEqualOneWholeUpdate) {
  // A chunk updated in two pieces (as the server's threads do) equals one update of the whole.
  auto o = Spec(OptimizerType::kAdam, 0.01f);
  const size_t n = 10;
  std::vector<float> p1(n), p2(n), g(n), s1(2 * n, 0.0f), s2(2 * n, 0.0f);
  for (size_t i = 0; i < n; ++i)
    p1[i] = p2[i] = 0.1f * static_cast<float>(i), g[i] = 1.0f - 0.2f * static_cast<float>(i);
  for (int64_t step = 1; step <= 3; ++step) {
    ApplyUpdate(o, p1.data(), g.data(), s1.data(), n, n, step);
    ApplyUpdate(o, p2.data(), g.data(), s2.data(), 4, n, step);
    ApplyUpdate(o, p2.data() + 4, g.data() + 4, s2.data() + 4, n - 4, n, step);
  }
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(s1, s2);
}

}  // namespace
}  // namespace ferry::ps

namespace ferry::ps {
namespace {

// FTRL-Proximal (optimizer.h). alpha = 1, beta = 1, l1 = 1, l2 = 0.5, n from 0.
TEST(Optimizer, FtrlFollowsTheClosedFormAndL1ZeroesSmallWeights) {
  auto o = Spec(OptimizerType::kFtrl, 1.0f);
  o.l1 = 1.0f;
  o.l2 = 0.5f;
  o.beta = 1.0f;
  o.initial_accumulator = 0.0f;
  EXPECT_EQ(StateSlots(OptimizerType::kFtrl), 2);
  std::vector<float> p = {0.0f, 0.0f}, state(4, -1.0f);
  InitState(o, state.data(), 2);
  EXPECT_EQ(state, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));  // z = 0, n = initial_accumulator
  std::vector<float> g = {3.0f, 0.5f};
  ApplyUpdate(o, p.data(), g.data(), state.data(), 2, 2, 1);
  // Element 0: n = 9, sigma = (3 - 0) / 1 = 3, z = 3 - 3 * 0 = 3 > l1:
  //   p = -(3 - 1) / ((1 + 3) / 1 + 0.5) = -4/9.
  EXPECT_FLOAT_EQ(state[0], 3.0f);
  EXPECT_FLOAT_EQ(state[2], 9.0f);
  EXPECT_FLOAT_EQ(p[0], -4.0f / 9.0f);
  // Element 1: n = 0.25, z = 0.5 - 0.5 * 0 = 0.5 <= l1: p = 0 (L1 keeps it at zero).
  EXPECT_FLOAT_EQ(state[1], 0.5f);
  EXPECT_EQ(p[1], 0.0f);
  g = {-4.0f, 0.0f};
  ApplyUpdate(o, p.data(), g.data(), state.data(), 2, 2, 2);
  // Element 0: n = 25, sigma = (5 - 3) / 1 = 2, z = 3 - 4 - 2 * (-4/9) = -1/9, |z| <= l1: p = 0.
  EXPECT_FLOAT_EQ(state[2], 25.0f);
  EXPECT_NEAR(state[0], -1.0f / 9.0f, 1e-6f);
  EXPECT_EQ(p[0], 0.0f);
  // A zero gradient changes nothing.
  EXPECT_FLOAT_EQ(state[1], 0.5f);
  EXPECT_EQ(p[1], 0.0f);
}

// With n from initial_accumulator, alpha = 2, beta = 0 and no regularisation, from p = 1:
// n = 4 + 4 = 8, sigma = (sqrt 8 - 2) / 2 = sqrt 2 - 1, z = 2 - (sqrt 2 - 1) = 3 - sqrt 2,
// p = -(3 - sqrt 2) / (sqrt 8 / 2) = 1 - 3 / sqrt 2.
TEST(Optimizer, FtrlStartsFromTheInitialAccumulatorAndTheCurrentWeight) {
  auto o = Spec(OptimizerType::kFtrl, 2.0f);
  o.beta = 0.0f;
  o.initial_accumulator = 4.0f;
  std::vector<float> p = {1.0f}, g = {2.0f}, state(2);
  InitState(o, state.data(), 1);
  EXPECT_EQ(state, (std::vector<float>{0.0f, 4.0f}));
  ApplyUpdate(o, p.data(), g.data(), state.data(), 1, 1, 1);
  EXPECT_FLOAT_EQ(state[1], 8.0f);
  EXPECT_NEAR(state[0], 3.0f - std::sqrt(2.0f), 1e-6f);
  EXPECT_NEAR(p[0], 1.0f - 3.0f / std::sqrt(2.0f), 1e-6f);
}

}  // namespace
}  // namespace ferry::ps

// ---- AdamW and the catalogue (ferry/optimizers.h). ----
#include <fstream>
#include <sstream>
#include <string>

namespace ferry::ps {
namespace {

TEST(Optimizer, AdamWWithoutWeightDecayIsAdamBitForBit) {
  auto adam = Spec(OptimizerType::kAdam, 0.01f);
  auto adamw = Spec(OptimizerType::kAdamW, 0.01f);
  adamw.weight_decay = 0.0f;
  const size_t n = 7;
  std::vector<float> p1(n), p2(n), g(n), s1(2 * n, 0.0f), s2(2 * n, 0.0f);
  for (size_t i = 0; i < n; ++i)
    p1[i] = p2[i] = 0.3f * static_cast<float>(i) - 1.0f, g[i] = 0.7f - 0.25f * static_cast<float>(i);
  for (int64_t step = 1; step <= 5; ++step) {
    ApplyUpdate(adam, p1.data(), g.data(), s1.data(), n, n, step);
    ApplyUpdate(adamw, p2.data(), g.data(), s2.data(), n, n, step);
  }
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(StateSlots(OptimizerType::kAdamW), 2);
}

// Decoupled: with a zero gradient Adam's step is 0, so AdamW only shrinks p by (1 - lr*wd) a step
// (an L2 term added to the gradient would instead be normalised by Adam to about lr a step).
TEST(Optimizer, AdamWDecaysWeightsIndependentlyOfTheGradientScale) {
  auto o = Spec(OptimizerType::kAdamW, 0.1f);
  o.weight_decay = 0.5f;
  std::vector<float> p = {2.0f, -4.0f}, g = {0.0f, 0.0f}, s(4, 0.0f);
  float expect0 = 2.0f, expect1 = -4.0f;
  const float keep = 1.0f - 0.1f * 0.5f;
  for (int64_t step = 1; step <= 3; ++step) {
    ApplyUpdate(o, p.data(), g.data(), s.data(), 2, 2, step);
    expect0 *= keep, expect1 *= keep;
    EXPECT_EQ(p[0], expect0) << "step " << step;
    EXPECT_EQ(p[1], expect1) << "step " << step;
  }
  // One step with a gradient: decay first (torch.optim.AdamW's order), then Adam's step of about
  // lr * sign(g) at t = 1.
  std::vector<float> q = {1.0f}, h = {0.5f}, t(2, 0.0f);
  ApplyUpdate(o, q.data(), h.data(), t.data(), 1, 1, 1);
  EXPECT_NEAR(q[0], 1.0f * keep - 0.1f, 1e-6);
}

TEST(OptimizerCatalogue, EveryOptimizerParsesByNameAndValidatesWithDefaults) {
  ASSERT_EQ(OptimizerNames().size(), kNumOptimizers);
  for (const OptimizerInfo& info : kOptimizers) {
    OptimizerType t{};
    ASSERT_TRUE(ParseOptimizerType(info.name, &t).ok()) << info.name;
    EXPECT_EQ(t, info.type);
    EXPECT_EQ(OptimizerName(t), info.name);
    OptimizerSpec o;
    o.type = t;
    EXPECT_TRUE(ValidateOptimizer(o).ok()) << info.name << ": " << ValidateOptimizer(o);
    EXPECT_EQ(StateSlots(t), static_cast<int>(info.slots.size()));
    EXPECT_NE(OptimizerToString(o).find(std::string(info.name) + "(lr="), std::string::npos);
  }
  OptimizerType t{};
  const Status s = ParseOptimizerType("adamm", &t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("did you mean adam"), std::string::npos) << s;
  EXPECT_NE(s.message().find("adamw"), std::string::npos) << "the list names every optimizer: " << s;
  EXPECT_FALSE(ValidateOptimizer(OptimizerSpec{static_cast<OptimizerType>(kNumOptimizers)}).ok());
}

// Each hyperparameter an optimizer uses is checked against its range, and the refusal names the
// optimizer, the key, the range and the value; a hyperparameter it does not use is not checked.
TEST(OptimizerCatalogue, OutOfRangeHyperparametersAreRefusedNamingOptimizerAndKey) {
  for (const OptimizerInfo& info : kOptimizers) {
    for (std::string_view key : info.uses) {
      const HyperParam& h = *FindHyperParam(key);
      if (h.flag) continue;  // a switch holds 0 or 1: SetHyper refuses anything else
      OptimizerSpec o;
      o.type = info.type;
      const double bad = h.lo_open ? h.lo : h.lo - 1.0;
      o.*h.number = static_cast<float>(bad);
      const Status s = ValidateOptimizer(o);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << info.name << " " << key;
      EXPECT_NE(s.message().find(std::string(info.name) + "'s " + std::string(key) + " must be"), std::string::npos)
          << s;
    }
  }
  OptimizerSpec adam;
  adam.type = OptimizerType::kAdam;
  adam.beta1 = 1.0f;
  EXPECT_NE(ValidateOptimizer(adam).message().find("adam's beta1 must be [0, 1), got 1"), std::string::npos)
      << ValidateOptimizer(adam);
  OptimizerSpec sgd;
  sgd.beta1 = 7.0f;  // sgd does not use it
  EXPECT_TRUE(ValidateOptimizer(sgd).ok());
  OptimizerSpec ftrl;
  ftrl.type = OptimizerType::kFtrl;
  ftrl.learning_rate = 0.0f;
  EXPECT_NE(ValidateOptimizer(ftrl).message().find("ftrl needs lr (its alpha) > 0"), std::string::npos);
  OptimizerSpec adagrad;
  adagrad.type = OptimizerType::kAdagrad;
  adagrad.initial_accumulator = 0.0f;
  adagrad.epsilon = 0.0f;
  EXPECT_NE(ValidateOptimizer(adagrad).message().find("adagrad needs initial_accumulator > 0 or epsilon > 0"),
            std::string::npos);
  for (OptimizerType type : {OptimizerType::kAdam, OptimizerType::kAdamW}) {
    OptimizerSpec adam;
    adam.type = type;
    adam.epsilon = 0.0f;  // 0 / (sqrt(0) + 0) for an element whose gradients were all 0
    EXPECT_NE(ValidateOptimizer(adam).message().find("needs epsilon > 0"), std::string::npos);
  }
}

TEST(OptimizerCatalogue, StateSlotsStartAtTheirHyperparameter) {
  OptimizerSpec o;
  o.type = OptimizerType::kFtrl;
  o.initial_accumulator = 0.75f;
  std::vector<float> state(6, -1.0f);
  InitState(o, state.data(), 3);
  EXPECT_EQ(state, (std::vector<float>{0, 0, 0, 0.75f, 0.75f, 0.75f}));  // z at 0, n at initial_accumulator
  o.type = OptimizerType::kAdamW;
  InitState(o, state.data(), 3);
  EXPECT_EQ(state, (std::vector<float>(6, 0.0f)));
}

// The rules as they were before they checked their results (d937474), written out plainly: for
// finite results every rule must give these bits, whichever clone the loader picked (the sync
// mode's bitwise repeatability rests on it). Random values across magnitudes, denormals and
// zeros, 4 steps, n not a multiple of a vector's width.
namespace reference {
void Update(const OptimizerSpec& o, float* p, const float* g, float* s, size_t n, size_t stride, int64_t step) {
  switch (o.type) {
    case OptimizerType::kSgd:
      for (size_t i = 0; i < n; ++i) p[i] -= o.learning_rate * g[i];
      return;
    case OptimizerType::kMomentum:
      for (size_t i = 0; i < n; ++i) {
        s[i] = o.momentum * s[i] + g[i];
        p[i] -= o.learning_rate * (o.nesterov ? g[i] + o.momentum * s[i] : s[i]);
      }
      return;
    case OptimizerType::kAdagrad:
      for (size_t i = 0; i < n; ++i) {
        s[i] += g[i] * g[i];
        p[i] -= o.learning_rate * g[i] / (std::sqrt(s[i]) + o.epsilon);
      }
      return;
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW: {
      if (o.type == OptimizerType::kAdamW && o.weight_decay != 0.0f) {
        const float keep = 1.0f - o.learning_rate * o.weight_decay;
        for (size_t i = 0; i < n; ++i) p[i] *= keep;
      }
      float* m = s;
      float* v = s + stride;
      const double t = static_cast<double>(step < 1 ? 1 : step);
      const float lr_t = static_cast<float>(o.learning_rate * std::sqrt(1.0 - std::pow(double{o.beta2}, t)) /
                                            (1.0 - std::pow(double{o.beta1}, t)));
      for (size_t i = 0; i < n; ++i) {
        m[i] = o.beta1 * m[i] + (1.0f - o.beta1) * g[i];
        v[i] = o.beta2 * v[i] + (1.0f - o.beta2) * g[i] * g[i];
        p[i] -= lr_t * m[i] / (std::sqrt(v[i]) + o.epsilon);
      }
      return;
    }
    case OptimizerType::kFtrl: {
      float* z = s;
      float* acc = s + stride;
      const float inv_alpha = 1.0f / o.learning_rate;
      for (size_t i = 0; i < n; ++i) {
        const float n_new = acc[i] + g[i] * g[i];
        const float sqrt_new = std::sqrt(n_new);
        const float sigma = (sqrt_new - std::sqrt(acc[i])) * inv_alpha;
        z[i] += g[i] - sigma * p[i];
        acc[i] = n_new;
        p[i] = std::fabs(z[i]) <= o.l1 ? 0.0f
                                       : -(z[i] - std::copysign(o.l1, z[i])) / ((o.beta + sqrt_new) * inv_alpha + o.l2);
      }
      return;
    }
  }
}
}  // namespace reference

TEST(Optimizer, FiniteResultsAreTheBitsOfTheRulesBeforeTheyWereChecked) {
  constexpr size_t n = 1003;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-40, 8);
  auto value = [&] {
    const int e = exponent(rng);
    return e == -40 ? 0.0f : std::ldexp(unit(rng), e);  // zeros, denormals' neighbours, up to 2^8
  };
  for (const OptimizerInfo& info : kOptimizers) {
    for (const bool nesterov : {false, true}) {
      if (nesterov && info.type != OptimizerType::kMomentum) continue;
      SCOPED_TRACE(std::string(info.name) + (nesterov ? " nesterov" : ""));
      OptimizerSpec o = Spec(info.type, 0.05f);
      o.nesterov = nesterov;
      o.l1 = 0.01f;
      o.l2 = 0.001f;
      const size_t slots = static_cast<size_t>(StateSlots(info.type));
      std::vector<float> p(n), state(slots * n);
      for (float& x : p) x = value();
      InitState(o, state.data(), n);
      std::vector<float> rp = p, rstate = state;
      for (int64_t step = 1; step <= 4; ++step) {
        std::vector<float> g(n);
        for (float& x : g) x = value();
        EXPECT_EQ(ApplyUpdate(o, p.data(), g.data(), state.data(), n, n, step), 0);
        reference::Update(o, rp.data(), g.data(), rstate.data(), n, n, step);
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(p[i]), std::bit_cast<uint32_t>(rp[i])) << "element " << i;
      }
      for (size_t i = 0; i < slots * n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(state[i]), std::bit_cast<uint32_t>(rstate[i])) << "state " << i;
      }
    }
  }
}

// A finite gradient whose update would not be finite (3e38 times lr 1e3; 3e38 squared in the
// accumulators of adagrad, adam and ftrl): every optimizer keeps that element's value and state
// exactly, says which element it was, and gives every other element what an update of it alone
// gives, bit for bit.
TEST(Optimizer, AnUpdateThatWouldNotBeFiniteKeepsTheElementAndNamesIt) {
  constexpr size_t n = 37;  // past a vector's width, with a tail
  for (const OptimizerInfo& info : kOptimizers) {
    SCOPED_TRACE(std::string(info.name));
    OptimizerSpec o = Spec(info.type, 1e3f);
    const size_t slots = static_cast<size_t>(StateSlots(info.type));
    std::vector<float> p(n), g(n), state(slots * n);
    for (size_t i = 0; i < n; ++i) {
      p[i] = 0.25f * static_cast<float>(i) - 3.0f;
      g[i] = 0.01f * static_cast<float>(i % 7) - 0.02f;
    }
    InitState(o, state.data(), n);
    for (int step = 1; step <= 2; ++step) ApplyUpdate(o, p.data(), g.data(), state.data(), n, n, step);
    const std::vector<float> p0 = p, state0 = state;
    g[21] = 3e38f;
    g[30] = -3e38f;
    const NotFinite nf = ApplyUpdateChecked(o, p.data(), g.data(), state.data(), n, n, 3);
    EXPECT_EQ(nf.count, 2);
    EXPECT_EQ(nf.first, 21);
    EXPECT_TRUE(nf.exact);
    EXPECT_EQ(nf.value, p0[21]);
    EXPECT_EQ(nf.grad, 3e38f);
    for (size_t i = 0; i < n; ++i) {
      float want = p0[i];
      std::vector<float> s(slots);
      for (size_t k = 0; k < slots; ++k) s[k] = state0[k * n + i];
      const int64_t kept = ApplyUpdate(o, &want, &g[i], s.data(), 1, 1, 3);
      EXPECT_EQ(kept, i == 21 || i == 30 ? 1 : 0) << "element " << i;
      EXPECT_EQ(p[i], want) << "element " << i;
      EXPECT_TRUE(std::isfinite(p[i])) << "element " << i;
      for (size_t k = 0; k < slots; ++k) {
        EXPECT_EQ(state[k * n + i], s[k]) << "element " << i << " slot " << k;
        EXPECT_TRUE(std::isfinite(state[k * n + i])) << "element " << i << " slot " << k;
      }
    }
    EXPECT_EQ(DescribeNotFinite(o, nf, "element 21"),
              "the updates of 2 elements, the first element 21, would not be finite (" + std::string(info.name) +
                  ", lr 1000; it is " + [&] {
                    char b[40];
                    std::snprintf(b, sizeof b, "%.9g", static_cast<double>(p0[21]));
                    return std::string(b);
                  }() + ", its gradient 3.00000001e+38)");
  }
}

// The README's optimizer table is the catalogue's: adding an optimizer fails here until the
// README shows it (the message holds the table to paste).
TEST(OptimizerCatalogue, TheReadmeTableIsTheCatalogue) {
  std::ifstream in(FERRY_SOURCE_DIR "/README.md");
  ASSERT_TRUE(in) << "cannot read " FERRY_SOURCE_DIR "/README.md";
  std::stringstream text;
  text << in.rdbuf();
  const std::string table = OptimizerMarkdownTable();
  EXPECT_NE(text.str().find(table), std::string::npos) << "README.md's optimizer table should read:\n" << table;
}

}  // namespace
}  // namespace ferry::ps
