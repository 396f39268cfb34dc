// ferry/optimizers.h — the catalogue of server-side optimizers: one descriptor each (name,
// hyperparameters with defaults and ranges, state slots, update rule). Parsing, validation,
// printing, the --table / C / Python keys, help texts, ferry-ckpt's slot names and the README's
// optimizer table all come from here.
//
// Adding an optimizer touches: its enumerator below and in messages/ferry.fbs (OptimizerType); its
// descriptor in kOptimizers and its update function (src/optimizers.cc); a row in kHyperParams and
// a field in OptimizerSpec for each hyperparameter it adds; its test (tests/unit/optimizer_test.cc).
// A new hyperparameter travels on the wire and in checkpoints by its key, with no schema change.
//
// Update rules (g = gradient, p = parameter, t = 1-based update count of this chunk or row); each
// is element-wise, so the result does not depend on how a range is split across threads:
//   sgd:      p -= lr * g
//   momentum: v = momentum * v + g;  p -= lr * v                (nesterov: p -= lr * (g + momentum * v))
//   adagrad:  a += g * g;            p -= lr * g / (sqrt(a) + eps)        (a starts at initial_accumulator)
//   adam:     m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//             p -= lr_t * m / (sqrt(v) + eps),  lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)
//   adamw:    adam with decoupled weight decay (Loshchilov & Hutter, ICLR 2019; torch.optim.AdamW's
//             order): p -= lr * weight_decay * p, then adam's step. weight_decay 0 is adam exactly.
//   ftrl:     FTRL-Proximal (McMahan et al., "Ad click prediction", KDD 2013), alpha = lr:
//             sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z += g - sigma * p;  n += g^2;
//             p = 0 if |z| <= l1, else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)
//             (z starts at 0, n at initial_accumulator)
// Thread-safety: constant data and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry {

enum class OptimizerType : uint8_t { kSgd = 0, kMomentum = 1, kAdagrad = 2, kAdam = 3, kFtrl = 4, kAdamW = 5 };

// An optimizer and its hyperparameters (those `type` does not use are ignored). The initialisers
// are the defaults everywhere (--table, the C and Python APIs, a spec from the wire).
struct OptimizerSpec {
  OptimizerType type = OptimizerType::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.9f;
  bool nesterov = false;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float initial_accumulator = 0.1f;
  float l1 = 0.0f;
  float l2 = 0.0f;
  float beta = 1.0f;
  float weight_decay = 0.01f;

  friend bool operator==(const OptimizerSpec&, const OptimizerSpec&) = default;
};

// One hyperparameter: its key (--table, SetSpecOption, the C and Python APIs), where it lives in an
// OptimizerSpec (a number or a 0/1 switch), the range a spec must respect when its optimizer uses it.
struct HyperParam {
  std::string_view key;
  float OptimizerSpec::*number = nullptr;
  bool OptimizerSpec::*flag = nullptr;
  double lo = 0, hi = 0;               // the valid range; `lo_open` / `hi_open`: excluded ends
  bool lo_open = false, hi_open = false;
  bool in_schema = false;              // has its own field in ferry.fbs (1.6 and before); newer ones travel by key
  std::string_view help;
};

inline constexpr double kUnbounded = 3.4e38;  // no upper bound (finite values only)

inline constexpr HyperParam kHyperParams[] = {
    {"momentum", &OptimizerSpec::momentum, nullptr, 0, kUnbounded, false, false, true, "velocity decay"},
    {"nesterov", nullptr, &OptimizerSpec::nesterov, 0, 1, false, false, true, "1: Nesterov's look-ahead"},
    {"beta1", &OptimizerSpec::beta1, nullptr, 0, 1, false, true, true, "first-moment decay"},
    {"beta2", &OptimizerSpec::beta2, nullptr, 0, 1, false, true, true, "second-moment decay"},
    {"epsilon", &OptimizerSpec::epsilon, nullptr, 0, kUnbounded, false, false, true, "added to the denominator"},
    {"initial_accumulator", &OptimizerSpec::initial_accumulator, nullptr, 0, kUnbounded, false, false, true,
     "the accumulator's first value"},
    {"l1", &OptimizerSpec::l1, nullptr, 0, kUnbounded, false, false, true, "L1 strength"},
    {"l2", &OptimizerSpec::l2, nullptr, 0, kUnbounded, false, false, true, "L2 strength"},
    {"beta", &OptimizerSpec::beta, nullptr, 0, kUnbounded, false, false, true, "added to sqrt(n)"},
    {"weight_decay", &OptimizerSpec::weight_decay, nullptr, 0, kUnbounded, false, false, false,
     "decoupled decay per step, times lr"},
};

// A float of optimizer state kept per parameter; it starts at 0 or at the hyperparameter `starts_at`.
struct StateSlot {
  std::string_view name;
  float OptimizerSpec::*starts_at = nullptr;
};

// Applies one update to params[0, n). Slot k of the state of params[i] is state[k * slot_stride + i]
// (slot_stride >= n; a sub-range of a chunk passes the chunk's size). `step`: the 1-based update count.
// An element whose new value or state would not be finite (finite inputs overflowing: a gradient of
// 3e38, lr = 3e38, g^2 past FLT_MAX) keeps its value and state; returns how many did. n < 2^32
// (ps::ApplyUpdate splits larger ranges).
using UpdateFn = int64_t (*)(const OptimizerSpec& opt, float* params, const float* grad, float* state, size_t n,
                             size_t slot_stride, int64_t step);

struct OptimizerInfo {
  OptimizerType type;
  std::string_view name;
  std::string_view summary;                   // one line for help texts and the README
  std::span<const std::string_view> uses;     // its hyperparameters' keys besides lr, in print order
  std::span<const StateSlot> slots;
  UpdateFn update;
  // Rules across hyperparameters beyond their ranges: why `o` is refused, or "" (nullptr: none).
  std::string_view (*refuse)(const OptimizerSpec& o) = nullptr;
};

namespace optimizer_rules {
int64_t Sgd(const OptimizerSpec&, float*, const float*, float*, size_t, size_t, int64_t);
int64_t Momentum(const OptimizerSpec&, float*, const float*, float*, size_t, size_t, int64_t);
int64_t Adagrad(const OptimizerSpec&, float*, const float*, float*, size_t, size_t, int64_t);
int64_t Adam(const OptimizerSpec&, float*, const float*, float*, size_t, size_t, int64_t);
int64_t Ftrl(const OptimizerSpec&, float*, const float*, float*, size_t, size_t, int64_t);
int64_t AdamW(const OptimizerSpec&, float*, const float*, float*, size_t, size_t, int64_t);
std::string_view AdagradRefuses(const OptimizerSpec& o);  // needs initial_accumulator or epsilon > 0
std::string_view FtrlRefuses(const OptimizerSpec& o);     // needs lr (alpha) > 0
std::string_view AdamRefuses(const OptimizerSpec& o);     // needs epsilon > 0

inline constexpr std::string_view kMomentumUses[] = {"momentum", "nesterov"};
inline constexpr std::string_view kAdagradUses[] = {"initial_accumulator", "epsilon"};
inline constexpr std::string_view kAdamUses[] = {"beta1", "beta2", "epsilon"};
inline constexpr std::string_view kAdamWUses[] = {"beta1", "beta2", "epsilon", "weight_decay"};
inline constexpr std::string_view kFtrlUses[] = {"l1", "l2", "beta", "initial_accumulator"};
inline constexpr StateSlot kMomentumSlots[] = {{"velocity"}};
inline constexpr StateSlot kAdagradSlots[] = {{"accumulator", &OptimizerSpec::initial_accumulator}};
inline constexpr StateSlot kAdamSlots[] = {{"m (first moment)"}, {"v (second moment)"}};
inline constexpr StateSlot kFtrlSlots[] = {{"z"},
                                           {"n (accumulated squared gradients)", &OptimizerSpec::initial_accumulator}};
}  // namespace optimizer_rules

// Indexed by OptimizerType.
inline constexpr OptimizerInfo kOptimizers[] = {
    {OptimizerType::kSgd, "sgd", "p -= lr * g", {}, {}, &optimizer_rules::Sgd},
    {OptimizerType::kMomentum, "momentum", "heavy-ball or Nesterov momentum", optimizer_rules::kMomentumUses,
     optimizer_rules::kMomentumSlots, &optimizer_rules::Momentum},
    {OptimizerType::kAdagrad, "adagrad", "per-coordinate lr / sqrt(sum of g^2)", optimizer_rules::kAdagradUses,
     optimizer_rules::kAdagradSlots, &optimizer_rules::Adagrad, &optimizer_rules::AdagradRefuses},
    {OptimizerType::kAdam, "adam", "bias-corrected first and second moments", optimizer_rules::kAdamUses,
     optimizer_rules::kAdamSlots, &optimizer_rules::Adam, &optimizer_rules::AdamRefuses},
    {OptimizerType::kFtrl, "ftrl", "FTRL-Proximal, sparse weights (lr is its alpha)", optimizer_rules::kFtrlUses,
     optimizer_rules::kFtrlSlots, &optimizer_rules::Ftrl, &optimizer_rules::FtrlRefuses},
    {OptimizerType::kAdamW, "adamw", "adam with decoupled weight decay", optimizer_rules::kAdamWUses,
     optimizer_rules::kAdamSlots, &optimizer_rules::AdamW, &optimizer_rules::AdamRefuses},
};

inline constexpr size_t kNumOptimizers = std::size(kOptimizers);

// The descriptor of `type`; nullptr for a value outside the catalogue (a spec from the network
// before Validate).
const OptimizerInfo* FindOptimizer(OptimizerType type);
// The hyperparameter `key`; nullptr if there is none.
const HyperParam* FindHyperParam(std::string_view key);
// Every optimizer's name, in the catalogue's order ("sgd", "momentum", ...).
std::span<const std::string_view> OptimizerNames();
// Every hyperparameter's key, in the catalogue's order.
std::span<const std::string_view> HyperParamKeys();

std::string_view OptimizerName(OptimizerType t);  // "?" outside the catalogue
// Parses an optimizer's name; an unknown one is refused naming the nearest and listing them all.
Status ParseOptimizerType(std::string_view text, OptimizerType* type);
// Checks `o` against its optimizer's descriptor: a known type, lr finite and >= 0 (> 0 where it
// divides), each hyperparameter it uses finite and in range (the message names the optimizer, the
// key, its range and the value), and the descriptor's `refuse` rules.
Status ValidateOptimizer(const OptimizerSpec& o);
// "adam(lr=0.001 beta1=0.9 beta2=0.999 epsilon=1e-08)": the hyperparameters the optimizer uses.
std::string OptimizerToString(const OptimizerSpec& o);
// A hyperparameter's value as a double (a switch: 0 or 1), and setting it (a switch takes 0 or 1).
double GetHyper(const OptimizerSpec& o, const HyperParam& h);
Status SetHyper(OptimizerSpec* o, const HyperParam& h, double value);
// The catalogue as a Markdown table (the README's "Optimizers" table is this, checked by a test).
std::string OptimizerMarkdownTable();

}  // namespace ferry
