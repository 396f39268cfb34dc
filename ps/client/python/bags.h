// A table's bags for ferry.torch's embedding bags, made ready once per forward: the checks, the
// deduplication, the pooling and the pooling's gradient in C++, one call each for every table of
// a step (ferry._ferry.Bags wraps it), instead of several torch calls per table.
//
//   auto t = TableBags::Make({.table = "user", .ids = ids, .starts = starts, .dim = 16}, &scratch);
//   // (t.ok(), else its status names the table and the problem); pull t->distinct()'s rows
//   // into rows [distinct x 16], then
//   t->Pool(rows, out);                   // out [bags x 16], nn.EmbeddingBag's result on the rows
//   t->RowGradients(dout, 16, row_grads); // row_grads [distinct x 16] = d loss / d rows
//
// The layout is nn.EmbeddingBag's: ids [n] and starts [bags] (bag b is ids[starts[b] ..
// starts[b+1]), the last bag runs to n), optional per-sample weights [n] (sum pooling only).
// The result is nn.EmbeddingBag's to float rounding: each bag sums its ids' rows in order, a mean
// divides that sum by the bag's size (an empty bag pools to zeros), and each distinct id's row
// gradient sums its ids' contributions in order. Pool and RowGradients are for any thread; a
// TableBags is not written after Make.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::python {

// One table's bags as the caller gave them. Nothing is copied until Make.
struct BagsView {
  std::string_view table;             // names the table in errors: "table 'user': ..."
  std::span<const int64_t> ids;
  std::span<const int64_t> starts;    // where each bag starts; empty with no bags
  const float* weights = nullptr;     // [ids.size()] per-sample weights, or none
  int64_t dim = 0;
  bool mean = false;                  // mean pooling (else sum)
};

// The distinct ids of ids, in order of first appearance, appended to *distinct; rows[i] = the
// position of ids[i] among them, counted from `base`. scratch is cleared first (a map kept
// between calls saves its allocation). Row: int64_t, or int32_t where every row fits.
template <typename Row>
void DedupFirstSeen(std::span<const int64_t> ids, Row base, absl::flat_hash_map<int64_t, Row>* scratch,
                    std::vector<int64_t>* distinct, Row* rows) {
  scratch->clear();
  scratch->reserve(ids.size());
  const size_t first = distinct->size();
  for (const int64_t id : ids) {
    auto [it, fresh] = scratch->try_emplace(id, static_cast<Row>(distinct->size() - first));
    if (fresh) distinct->push_back(id);
    *rows++ = base + it->second;
  }
}

class TableBags {
 public:
  // INVALID_ARGUMENT naming the table when the starts do not start at 0, decrease or run past the
  // ids, when there are ids but no bags, when a weight is NaN or Inf, when weights come with mean
  // pooling, or when there are more than INT32_MAX ids. scratch: as for DedupFirstSeen.
  static StatusOr<TableBags> Make(const BagsView& in, absl::flat_hash_map<int64_t, int32_t>* scratch);

  int64_t dim() const { return dim_; }
  int64_t num_bags() const { return static_cast<int64_t>(ends_.size()); }
  int64_t num_ids() const { return static_cast<int64_t>(rows_.size()); }
  // The distinct ids, in order of first appearance: the rows Pool reads, in this order.
  const std::vector<int64_t>& distinct() const { return distinct_; }

  // out [num_bags x dim] = each bag pooled from rows [distinct x dim].
  void Pool(const float* rows, float* out) const;
  // row_grads [distinct x dim] = the gradient of the loss with respect to rows, given dout
  // [num_bags x dim], its gradient with respect to Pool's out, whose bag b starts at
  // dout + b * dout_stride (dout_stride >= dim: a column block of a wider gradient, as a
  // concatenation's backward gives it, is read in place).
  void RowGradients(const float* dout, int64_t dout_stride, float* row_grads) const;

 private:
  TableBags() = default;

  int64_t dim_ = 0;
  bool mean_ = false;
  std::vector<int32_t> ends_;     // bag b is rows_[ends_[b-1] .. ends_[b]) (from 0 for b = 0)
  std::vector<int32_t> rows_;     // for each id, its row among distinct_
  std::vector<float> weights_;    // per id, or empty
  std::vector<int64_t> distinct_;
};

}  // namespace ferry::python
