#include "ferry/data/zipf.h"
#include "ferry/data/synthetic_ctr.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include "random.h"

namespace ferry::data {
namespace {


// Vocabularies above this would lose ranks to double rounding in the sampler.
constexpr int64_t kMaxVocab = int64_t{1} << 52;

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

Status SyntheticCtrOptions::Validate() const {
  auto bad = [](const std::string& what) { return InvalidArgumentError("SyntheticCtrOptions: " + what); };
  if (vocab_sizes.empty()) return bad("vocab_sizes is empty; need at least one categorical field");
  int64_t total = 0;
  for (size_t f = 0; f < vocab_sizes.size(); ++f) {
    const int64_t v = vocab_sizes[f];
    if (v < 1 || v > kMaxVocab) {
      return bad("vocab_sizes[" + std::to_string(f) + "] = " + std::to_string(v) + " is not in [1, 2^52]");
    }
    if (total > std::numeric_limits<int64_t>::max() - v) return bad("the vocabularies add up past INT64_MAX");
    total += v;
  }
  if (!(zipf_exponent > 0.0) || !std::isfinite(zipf_exponent)) {
    return bad("zipf_exponent " + std::to_string(zipf_exponent) + " must be finite and > 0");
  }
  if (num_dense < 0) return bad("num_dense " + std::to_string(num_dense) + " < 0");
  if (!(id_weight_stddev >= 0.0) || !std::isfinite(id_weight_stddev) || !(dense_weight_stddev >= 0.0) ||
      !std::isfinite(dense_weight_stddev)) {
    return bad("weight standard deviations must be finite and >= 0");
  }
  if (!std::isfinite(bias)) return bad("bias must be finite");
  return Status::Ok();
}

struct SyntheticCtr::Impl {
  SyntheticCtrOptions options;
  std::vector<int64_t> offsets;  // field f's first id
  int64_t total_vocab = 0;
  std::vector<ZipfSampler> samplers;  // one per field
  std::vector<double> dense_weights;
  uint64_t example_key = 0;  // seeds example i's stream
  uint64_t weight_key = 0;   // seeds the per-id weights
};

SyntheticCtr::SyntheticCtr(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

StatusOr<SyntheticCtr> SyntheticCtr::Create(const SyntheticCtrOptions& options) {
  FERRY_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->example_key = internal::HashPair(options.seed, 1);
  impl->weight_key = internal::HashPair(options.seed, 2);
  const uint64_t dense_key = internal::HashPair(options.seed, 3);
  for (int64_t v : options.vocab_sizes) {
    impl->offsets.push_back(impl->total_vocab);
    impl->total_vocab += v;
    impl->samplers.emplace_back(v, options.zipf_exponent);
  }
  for (int j = 0; j < options.num_dense; ++j) {
    impl->dense_weights.push_back(options.dense_weight_stddev *
                                  internal::NormalFromKey(internal::HashPair(dense_key, static_cast<uint64_t>(j))));
  }
  return SyntheticCtr(std::move(impl));
}

const SyntheticCtrOptions& SyntheticCtr::options() const { return impl_->options; }
int SyntheticCtr::num_fields() const { return static_cast<int>(impl_->offsets.size()); }
int SyntheticCtr::num_dense() const { return impl_->options.num_dense; }
int64_t SyntheticCtr::field_offset(int field) const { return impl_->offsets[static_cast<size_t>(field)]; }
int64_t SyntheticCtr::total_vocab() const { return impl_->total_vocab; }
double SyntheticCtr::bias() const { return impl_->options.bias; }
double SyntheticCtr::dense_weight(int j) const { return impl_->dense_weights[static_cast<size_t>(j)]; }

double SyntheticCtr::id_weight(int64_t id) const {
  return impl_->options.id_weight_stddev *
         internal::NormalFromKey(internal::HashPair(impl_->weight_key, static_cast<uint64_t>(id)));
}

double SyntheticCtr::PlantedLogit(const CtrBatch& batch, int64_t row) const {
  double logit = bias();
  for (int64_t id : batch.id_row(row)) logit += id_weight(id);
  const std::span<const float> dense = batch.dense_row(row);
  for (size_t j = 0; j < dense.size(); ++j) logit += impl_->dense_weights[j] * dense[j];
  return logit;
}

void SyntheticCtr::Generate(std::span<const int64_t> indices, CtrBatch* batch, std::vector<float>* true_probs) const {
  const Impl& d = *impl_;
  const int fields = num_fields();
  batch->Reset(d.options.num_dense, fields);
  batch->labels.reserve(indices.size());
  batch->dense.reserve(indices.size() * static_cast<size_t>(d.options.num_dense));
  batch->ids.reserve(indices.size() * static_cast<size_t>(fields));
  if (true_probs != nullptr) {
    true_probs->clear();
    true_probs->reserve(indices.size());
  }
  for (int64_t index : indices) {
    internal::SplitMix64 rng(internal::HashPair(d.example_key, static_cast<uint64_t>(index)));
    for (int f = 0; f < fields; ++f) {
      batch->ids.push_back(d.offsets[static_cast<size_t>(f)] +
                           d.samplers[static_cast<size_t>(f)].Sample([&] { return rng.Uniform(); }) - 1);
    }
    for (int j = 0; j < d.options.num_dense; ++j) {
      batch->dense.push_back(static_cast<float>(internal::NormalFromKey(rng.Next())));
    }
    // The model sees the float features, so the planted logit is computed from them too.
    batch->labels.push_back(0.0f);
    const int64_t row = batch->size() - 1;
    const double p = Sigmoid(PlantedLogit(*batch, row));
    batch->labels.back() = rng.Uniform() < p ? 1.0f : 0.0f;
    if (true_probs != nullptr) true_probs->push_back(static_cast<float>(p));
  }
}

void SyntheticCtr::GenerateRange(int64_t first, int64_t count, CtrBatch* batch, std::vector<float>* true_probs) const {
  std::vector<int64_t> indices(static_cast<size_t>(std::max<int64_t>(count, 0)));
  std::iota(indices.begin(), indices.end(), first);
  Generate(indices, batch, true_probs);
}

}  // namespace ferry::data
