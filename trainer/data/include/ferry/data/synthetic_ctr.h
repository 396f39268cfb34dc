// ferry/data/synthetic_ctr.h — click-through data drawn from a planted (known) logistic model.
//
// Example i is a pure function of (options, i), so any worker can generate any example without
// the others (pair with EpochIndices for sharding), and the same seed gives the same data:
//   ids[f]   ~ Zipf(vocab_sizes[f], zipf_exponent): rank k in [1, V_f] with P(k) ∝ k^-s, drawn by
//              rejection-inversion (Hörmann & Derflinger 1996; no per-vocab tables), and mapped
//              to id field_offset(f) + k - 1, so field f owns ids [offset_f, offset_f + V_f) and
//              its most frequent id is offset_f
//   dense[j] ~ N(0, 1)
//   logit    = bias + sum_f id_weight(ids[f]) + sum_j dense_weight(j) * dense[j]
//   label    ~ Bernoulli(sigmoid(logit))
// The planted weights are id_weight(id) = id_weight_stddev * z(seed, id) and
// dense_weight(j) = dense_weight_stddev * z'(seed, j), with z, z' standard normals from a seeded
// hash: they too are known to everyone without communication.
//
// sigmoid(logit) is the true click probability; Generate returns it beside the batch, so the
// planted model's AUC and log-loss on the same examples (the best any model can do in
// expectation) can be measured next to a trained model's.
//
// Reproducibility: the random streams are integer (SplitMix64) and bitwise portable; the Zipf
// and normal draws go through std::log / std::exp, so ids and values are bitwise reproducible
// on one platform and libm, and may differ in rare last-bit cases between libms.
//
// Thread-safety: a SyntheticCtr is immutable after Create; its const methods may be called from
// any number of threads at once. Copies are cheap (shared immutable state).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ferry/data/ctr_batch.h"
#include "ferry/status.h"

namespace ferry::data {

struct SyntheticCtrOptions {
  uint64_t seed = 1;
  // One vocabulary size per categorical field (each >= 1); the number of fields is their count.
  std::vector<int64_t> vocab_sizes = std::vector<int64_t>(8, 10000);
  double zipf_exponent = 1.1;        // s > 0; larger is more skewed
  int num_dense = 4;                 // >= 0
  double id_weight_stddev = 0.5;     // >= 0
  double dense_weight_stddev = 0.5;  // >= 0
  double bias = -1.5;                // the base log-odds (sigmoid(-1.5) ~ 0.18)

  Status Validate() const;
};

class SyntheticCtr {
 public:
  // INVALID_ARGUMENT for bad options (no fields, a vocabulary < 1, s <= 0, a negative stddev, ids
  // not fitting in int64).
  static StatusOr<SyntheticCtr> Create(const SyntheticCtrOptions& options);

  const SyntheticCtrOptions& options() const;
  int num_fields() const;
  int num_dense() const;
  int64_t field_offset(int field) const;  // field f's ids: [field_offset(f), +vocab_sizes[f])
  int64_t total_vocab() const;            // every id lies in [0, total_vocab())

  // Replaces `batch` (reshaped to (num_dense(), num_fields())) with examples `indices`, in that
  // order; if `true_probs` is not null it is replaced with each example's sigmoid(planted logit).
  // Indices may be any int64 (an epoch uses [0, N)).
  void Generate(std::span<const int64_t> indices, CtrBatch* batch,
                std::vector<float>* true_probs) const;
  // Same for examples [first, first + count).
  void GenerateRange(int64_t first, int64_t count, CtrBatch* batch,
                     std::vector<float>* true_probs) const;

  // The planted model.
  double bias() const;
  double id_weight(int64_t id) const;
  double dense_weight(int j) const;
  // bias + sum of id weights + dense dot product for row `row` of a batch of this shape.
  double PlantedLogit(const CtrBatch& batch, int64_t row) const;

 private:
  struct Impl;
  explicit SyntheticCtr(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace ferry::data
