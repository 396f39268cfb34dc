#include "bags.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace ferry::python {
namespace {

Status Refuse(std::string_view table, const std::string& what) {
  return InvalidArgumentError("table '" + std::string(table) + "': " + what);
}

}  // namespace

StatusOr<TableBags> TableBags::Make(const BagsView& in, absl::flat_hash_map<int64_t, int32_t>* scratch) {
  const int64_t n = static_cast<int64_t>(in.ids.size());
  const std::span<const int64_t> starts = in.starts;
  if (n > std::numeric_limits<int32_t>::max()) {
    return Refuse(in.table, std::to_string(n) + " ids in one batch, more than " +
                                std::to_string(std::numeric_limits<int32_t>::max()));
  }
  if (in.dim < 1) return Refuse(in.table, "dim must be >= 1, not " + std::to_string(in.dim));
  if (starts.empty() && n > 0) return Refuse(in.table, std::to_string(n) + " ids but no offsets (no bags)");
  if (!starts.empty() && starts[0] != 0) {
    return Refuse(in.table, "offsets must start at 0, not " + std::to_string(starts[0]));
  }
  TableBags t;
  t.dim_ = in.dim;
  t.mean_ = in.mean;
  t.ends_.resize(starts.size());
  for (size_t b = 0; b < starts.size(); ++b) {
    if (b > 0 && starts[b] < starts[b - 1]) {
      return Refuse(in.table, "offsets must not decrease: offsets[" + std::to_string(b) +
                                  "] = " + std::to_string(starts[b]) + " < offsets[" + std::to_string(b - 1) +
                                  "] = " + std::to_string(starts[b - 1]));
    }
    if (b + 1 < starts.size()) t.ends_[b] = static_cast<int32_t>(std::min(starts[b + 1], n));
  }
  if (!starts.empty()) {
    if (starts.back() > n) {
      return Refuse(in.table, "offsets run past the end of the ids: offsets[" + std::to_string(starts.size() - 1) +
                                  "] = " + std::to_string(starts.back()) + " > " + std::to_string(n) + " ids");
    }
    t.ends_.back() = static_cast<int32_t>(n);
  }
  if (in.weights != nullptr) {
    if (in.mean) return Refuse(in.table, "per-sample weights need sum pooling, not mean");
    t.weights_.assign(in.weights, in.weights + n);
    if (!std::all_of(t.weights_.begin(), t.weights_.end(), [](float w) { return std::isfinite(w); })) {
      return Refuse(in.table, "per_sample_weights hold NaN or Inf");
    }
  }
  t.rows_.resize(static_cast<size_t>(n));
  DedupFirstSeen<int32_t>(in.ids, 0, scratch, &t.distinct_, t.rows_.data());
  return t;
}

void TableBags::Pool(const float* rows, float* out) const {
  const int64_t dim = dim_;
  int32_t j = 0;
  for (size_t b = 0; b < ends_.size(); ++b) {
    float* o = out + static_cast<int64_t>(b) * dim;
    std::fill(o, o + dim, 0.0f);
    const int32_t end = ends_[b];
    const int32_t size = end - j;
    for (; j < end; ++j) {
      const float* row = rows + static_cast<int64_t>(rows_[j]) * dim;
      if (weights_.empty()) {
        for (int64_t d = 0; d < dim; ++d) o[d] += row[d];
      } else {
        const float w = weights_[j];
        for (int64_t d = 0; d < dim; ++d) o[d] += w * row[d];
      }
    }
    if (mean_ && size > 0) {
      const float s = static_cast<float>(size);
      for (int64_t d = 0; d < dim; ++d) o[d] /= s;
    }
  }
}

void TableBags::RowGradients(const float* dout, int64_t dout_stride, float* row_grads) const {
  const int64_t dim = dim_;
  std::fill(row_grads, row_grads + static_cast<int64_t>(distinct_.size()) * dim, 0.0f);
  int32_t j = 0;
  for (size_t b = 0; b < ends_.size(); ++b) {
    const float* g = dout + static_cast<int64_t>(b) * dout_stride;
    const int32_t end = ends_[b];
    // Mean: each id's share of the bag's gradient, as torch's backward of a mean gives it.
    const float scale = mean_ && end > j ? 1.0f / static_cast<float>(end - j) : 1.0f;
    for (; j < end; ++j) {
      float* row = row_grads + static_cast<int64_t>(rows_[j]) * dim;
      const float w = weights_.empty() ? scale : weights_[j];
      if (w == 1.0f) {
        for (int64_t d = 0; d < dim; ++d) row[d] += g[d];
      } else {
        for (int64_t d = 0; d < dim; ++d) row[d] += w * g[d];
      }
    }
  }
}

}  // namespace ferry::python
