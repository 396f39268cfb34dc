#include "ferry/optimizers.h"

#include <array>
#include <cmath>
#include <limits>
#include <sstream>

#include "ferry/nearest.h"

namespace ferry {
namespace {

constexpr bool IsHyperKey(std::string_view key) {
  for (const HyperParam& h : kHyperParams) {
    if (h.key == key) return true;
  }
  return false;
}

// The catalogue is indexed by type, and names only hyperparameters it defines.
constexpr bool CatalogueIsConsistent() {
  for (size_t i = 0; i < kNumOptimizers; ++i) {
    if (static_cast<size_t>(kOptimizers[i].type) != i || kOptimizers[i].update == nullptr) return false;
    for (std::string_view key : kOptimizers[i].uses) {
      if (!IsHyperKey(key)) return false;
    }
  }
  for (const HyperParam& h : kHyperParams) {
    if ((h.number == nullptr) == (h.flag == nullptr)) return false;  // exactly one of them
  }
  return true;
}
static_assert(CatalogueIsConsistent(), "kOptimizers must be indexed by OptimizerType and use known hyperparameters");

template <size_t N, typename Get>
constexpr std::array<std::string_view, N> Names(Get get) {
  std::array<std::string_view, N> out{};
  for (size_t i = 0; i < N; ++i) out[i] = get(i);
  return out;
}
constexpr auto kOptimizerNames = Names<kNumOptimizers>([](size_t i) { return kOptimizers[i].name; });
constexpr auto kHyperKeys = Names<std::size(kHyperParams)>([](size_t i) { return kHyperParams[i].key; });

std::string Number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// "[0, 1)", ">= 0".
std::string RangeText(const HyperParam& h) {
  if (h.flag) return "0 or 1";
  if (h.hi >= kUnbounded) return std::string(h.lo_open ? "> " : ">= ") + Number(h.lo);
  return std::string(h.lo_open ? "(" : "[") + Number(h.lo) + ", " + Number(h.hi) + (h.hi_open ? ")" : "]");
}

bool InRange(const HyperParam& h, double v) {
  if (!std::isfinite(v)) return false;
  const bool above = h.lo_open ? v > h.lo : v >= h.lo;
  const bool below = h.hi_open ? v < h.hi : v <= h.hi;
  return above && below;
}

}  // namespace

const OptimizerInfo* FindOptimizer(OptimizerType type) {
  const auto i = static_cast<size_t>(type);
  return i < kNumOptimizers ? &kOptimizers[i] : nullptr;
}

const HyperParam* FindHyperParam(std::string_view key) {
  for (const HyperParam& h : kHyperParams) {
    if (h.key == key) return &h;
  }
  return nullptr;
}

std::span<const std::string_view> OptimizerNames() { return kOptimizerNames; }
std::span<const std::string_view> HyperParamKeys() { return kHyperKeys; }

std::string_view OptimizerName(OptimizerType t) {
  const OptimizerInfo* info = FindOptimizer(t);
  return info ? info->name : "?";
}

Status ParseOptimizerType(std::string_view text, OptimizerType* type) {
  for (const OptimizerInfo& o : kOptimizers) {
    if (text == o.name) {
      *type = o.type;
      return Status::Ok();
    }
  }
  return InvalidArgumentError("optimizer '" + std::string(text) + "'" + DidYouMean(text, OptimizerNames()) +
                              " is not one of: " + JoinNames(OptimizerNames()));
}

double GetHyper(const OptimizerSpec& o, const HyperParam& h) {
  return h.flag ? (o.*h.flag ? 1.0 : 0.0) : static_cast<double>(o.*h.number);
}

Status SetHyper(OptimizerSpec* o, const HyperParam& h, double value) {
  if (!std::isfinite(value)) return InvalidArgumentError(std::string(h.key) + " must be finite");
  if (h.flag) {
    if (value != 0 && value != 1) return InvalidArgumentError(std::string(h.key) + " must be 0 or 1");
    o->*h.flag = value == 1;
  } else {
    o->*h.number = static_cast<float>(value);
  }
  return Status::Ok();
}

Status ValidateOptimizer(const OptimizerSpec& o) {
  const OptimizerInfo* info = FindOptimizer(o.type);
  if (!info) {
    return InvalidArgumentError("unknown optimizer " + std::to_string(static_cast<int>(o.type)) + " (known: " +
                                JoinNames(OptimizerNames()) + ")");
  }
  if (!(o.learning_rate >= 0.0f) || !std::isfinite(o.learning_rate)) {
    return InvalidArgumentError("learning_rate must be finite and >= 0, got " + Number(o.learning_rate));
  }
  for (std::string_view key : info->uses) {
    const HyperParam& h = *FindHyperParam(key);
    const double v = GetHyper(o, h);
    if (!InRange(h, v)) {
      return InvalidArgumentError(std::string(info->name) + "'s " + std::string(key) + " must be " + RangeText(h) +
                                  ", got " + Number(v));
    }
  }
  if (info->refuse) {
    if (std::string_view why = info->refuse(o); !why.empty()) {
      return InvalidArgumentError(std::string(info->name) + " " + std::string(why));
    }
  }
  return Status::Ok();
}

std::string OptimizerToString(const OptimizerSpec& o) {
  std::ostringstream os;
  os << OptimizerName(o.type) << "(lr=" << o.learning_rate;
  if (const OptimizerInfo* info = FindOptimizer(o.type)) {
    for (std::string_view key : info->uses) os << " " << key << "=" << GetHyper(o, *FindHyperParam(key));
  }
  os << ")";
  return os.str();
}

std::string OptimizerMarkdownTable() {
  const OptimizerSpec defaults;
  std::ostringstream os;
  os << "| optimizer | what it does | hyperparameters (default) | state per parameter |\n";
  os << "|---|---|---|---|\n";
  for (const OptimizerInfo& o : kOptimizers) {
    os << "| `" << o.name << "` | " << o.summary << " | `lr` (" << defaults.learning_rate << ")";
    for (std::string_view key : o.uses) os << ", `" << key << "` (" << GetHyper(defaults, *FindHyperParam(key)) << ")";
    os << " | ";
    if (o.slots.empty()) os << "none";
    for (size_t k = 0; k < o.slots.size(); ++k) os << (k ? ", " : "") << o.slots[k].name;
    os << " |\n";
  }
  return os.str();
}

// ---- The update rules (see the header for the formulas). ----
namespace optimizer_rules {
namespace {

// Every rule computes an element's new value and state, then writes them only when all are
// finite (|x| <= FLT_MAX fails for NaN and Inf): an element whose update would not be finite
// keeps its value and state, and is counted. Selects, not branches, so the loops still vectorize.
constexpr float kMax = std::numeric_limits<float>::max();

// The rules are built twice on x86-64 with GCC and glibc (ifunc), for AVX2 and for the baseline,
// and the loader picks one (target_clones). The file is built with -ffp-contract=off (no FMA:
// both clones, and any -march, give the same bits) and -fno-math-errno (std::sqrt vectorizes):
// CMakeLists.txt; bench/RESULTS.md, "What each feature costs", measures them.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define FERRY_RULE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FERRY_RULE_CLONES
#endif
inline bool Finite(float x) { return std::fabs(x) <= kMax; }

// Adam's loop, after weight decay (AdamW) by `keep` when `decay`.
template <bool decay>
FERRY_RULE_CLONES int64_t AdamRule(const OptimizerSpec& opt, float* __restrict params,
                                   const float* __restrict grad, float* __restrict state, size_t n,
                                   size_t slot_stride, int64_t step, float keep) {
  float* __restrict m = state;
  float* __restrict v = state + slot_stride;
  const float b1 = opt.beta1, b2 = opt.beta2, eps = opt.epsilon;
  const double t = static_cast<double>(step < 1 ? 1 : step);
  const float lr_t = static_cast<float>(opt.learning_rate * std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)) /
                                        (1.0 - std::pow(static_cast<double>(b1), t)));
  uint32_t refused = 0;  // n < 2^32
  for (size_t i = 0; i < n; ++i) {
    const float p0 = decay ? params[i] * keep : params[i];
    const float m1 = b1 * m[i] + (1.0f - b1) * grad[i];
    const float v1 = b2 * v[i] + (1.0f - b2) * grad[i] * grad[i];
    const float p1 = p0 - lr_t * m1 / (std::sqrt(v1) + eps);
    const bool ok = Finite(p1) & Finite(m1) & Finite(v1);
    params[i] = ok ? p1 : params[i];
    m[i] = ok ? m1 : m[i];
    v[i] = ok ? v1 : v[i];
    refused += static_cast<uint32_t>(!ok);
  }
  return refused;
}

}  // namespace

FERRY_RULE_CLONES int64_t Sgd(const OptimizerSpec& opt, float* __restrict params, const float* __restrict grad,
                              float*, size_t n, size_t, int64_t) {
  const float lr = opt.learning_rate;
  uint32_t refused = 0;  // n < 2^32
  for (size_t i = 0; i < n; ++i) {
    const float p1 = params[i] - lr * grad[i];
    const bool ok = Finite(p1);
    params[i] = ok ? p1 : params[i];
    refused += static_cast<uint32_t>(!ok);
  }
  return refused;
}

FERRY_RULE_CLONES int64_t Momentum(const OptimizerSpec& opt, float* __restrict params,
                                   const float* __restrict grad, float* __restrict state, size_t n, size_t,
                                   int64_t) {
  float* __restrict v = state;
  const float lr = opt.learning_rate, mu = opt.momentum;
  const bool nesterov = opt.nesterov;
  uint32_t refused = 0;  // n < 2^32
  for (size_t i = 0; i < n; ++i) {
    const float v1 = mu * v[i] + grad[i];
    const float p1 = params[i] - lr * (nesterov ? grad[i] + mu * v1 : v1);
    const bool ok = Finite(p1) & Finite(v1);
    params[i] = ok ? p1 : params[i];
    v[i] = ok ? v1 : v[i];
    refused += static_cast<uint32_t>(!ok);
  }
  return refused;
}

FERRY_RULE_CLONES int64_t Adagrad(const OptimizerSpec& opt, float* __restrict params,
                                  const float* __restrict grad, float* __restrict state, size_t n, size_t, int64_t) {
  float* __restrict a = state;
  const float lr = opt.learning_rate, eps = opt.epsilon;
  uint32_t refused = 0;  // n < 2^32
  for (size_t i = 0; i < n; ++i) {
    const float a1 = a[i] + grad[i] * grad[i];
    const float p1 = params[i] - lr * grad[i] / (std::sqrt(a1) + eps);
    const bool ok = Finite(p1) & Finite(a1);
    params[i] = ok ? p1 : params[i];
    a[i] = ok ? a1 : a[i];
    refused += static_cast<uint32_t>(!ok);
  }
  return refused;
}

int64_t Adam(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n, size_t slot_stride,
             int64_t step) {
  return AdamRule<false>(opt, params, grad, state, n, slot_stride, step, 1.0f);
}

int64_t AdamW(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n, size_t slot_stride,
              int64_t step) {
  if (opt.weight_decay == 0.0f) return AdamRule<false>(opt, params, grad, state, n, slot_stride, step, 1.0f);
  const float keep = 1.0f - opt.learning_rate * opt.weight_decay;
  return AdamRule<true>(opt, params, grad, state, n, slot_stride, step, keep);
}

FERRY_RULE_CLONES int64_t Ftrl(const OptimizerSpec& opt, float* __restrict params, const float* __restrict grad,
                               float* __restrict state, size_t n, size_t slot_stride, int64_t) {
  float* __restrict z = state;
  float* __restrict acc = state + slot_stride;
  const float l1 = opt.l1, l2 = opt.l2, beta = opt.beta, inv_alpha = 1.0f / opt.learning_rate;
  uint32_t refused = 0;  // n < 2^32
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float n_new = acc[i] + g * g;
    const float sqrt_new = std::sqrt(n_new);
    const float sigma = (sqrt_new - std::sqrt(acc[i])) * inv_alpha;
    const float z1 = z[i] + (g - sigma * params[i]);
    const float p1 =
        std::fabs(z1) <= l1 ? 0.0f : -(z1 - std::copysign(l1, z1)) / ((beta + sqrt_new) * inv_alpha + l2);
    const bool ok = Finite(p1) & Finite(z1) & Finite(n_new);
    params[i] = ok ? p1 : params[i];
    z[i] = ok ? z1 : z[i];
    acc[i] = ok ? n_new : acc[i];
    refused += static_cast<uint32_t>(!ok);
  }
  return refused;
}

std::string_view AdagradRefuses(const OptimizerSpec& o) {
  return o.initial_accumulator > 0.0f || o.epsilon > 0.0f ? "" : "needs initial_accumulator > 0 or epsilon > 0";
}

std::string_view AdamRefuses(const OptimizerSpec& o) {
  // m / (sqrt(v) + 0) is 0 / 0 for an element whose gradients have all been 0.
  return o.epsilon > 0.0f ? "" : "needs epsilon > 0 (an element whose gradients were all 0 would divide 0 by 0)";
}

std::string_view FtrlRefuses(const OptimizerSpec& o) {
  return o.learning_rate > 0.0f ? "" : "needs lr (its alpha) > 0";
}

}  // namespace optimizer_rules
}  // namespace ferry
