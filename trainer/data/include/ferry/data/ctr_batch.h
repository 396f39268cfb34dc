// ferry/data/ctr_batch.h — the example layout of the click-through (ctr) model.
//
// A CtrBatch holds a batch of examples in struct-of-arrays form, row-major, ready to copy to a
// device: a 0/1 label, `num_dense` float features and exactly one int64 id per categorical field.
// Both the Criteo reader and the synthetic generator produce it, so the model consumes either.
//
// Thread-safety: a plain value; no internal synchronisation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ferry::data {

struct CtrBatch {
  int num_dense = 0;   // dense features per example
  int num_fields = 0;  // categorical fields per example (one id each)

  std::vector<float> labels;  // [size()], each 0.0f or 1.0f
  std::vector<float> dense;   // [size() * num_dense], row-major
  std::vector<int64_t> ids;   // [size() * num_fields], row-major: ids[i * num_fields + f]

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  bool empty() const { return labels.empty(); }

  std::span<const float> dense_row(int64_t i) const {
    return std::span<const float>(dense).subspan(i * num_dense, num_dense);
  }
  std::span<const int64_t> id_row(int64_t i) const {
    return std::span<const int64_t>(ids).subspan(i * num_fields, num_fields);
  }

  // Appends every example of `other`, which has the same shape.
  void Append(const CtrBatch& other) {
    labels.insert(labels.end(), other.labels.begin(), other.labels.end());
    dense.insert(dense.end(), other.dense.begin(), other.dense.end());
    ids.insert(ids.end(), other.ids.begin(), other.ids.end());
  }
  // Drops every example; keeps the shape and the capacity.
  void Clear() {
    labels.clear();
    dense.clear();
    ids.clear();
  }
  // Sets the shape and drops every example.
  void Reset(int dense_features, int fields) {
    num_dense = dense_features;
    num_fields = fields;
    Clear();
  }
};

}  // namespace ferry::data
