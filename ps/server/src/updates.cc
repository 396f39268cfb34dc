#include "internal/updates.h"

#include <algorithm>
#include <cstring>

#include "internal/optimizer.h"

namespace ferry::ps {
namespace {

// Element `b` of a chunk's optimizer state; null for an optimizer without state (SGD), whose
// empty state has no element to point at (null + b is undefined behaviour).
float* StateAt(DenseChunk& c, int64_t b) { return c.state.empty() ? nullptr : c.state.data() + b; }

// [b, e) of `old` into the chunk's values, when PrepareWrite moved them to a new buffer.
void CopyFrom(const SharedFloats& old, DenseChunk& c, int64_t b, int64_t e) {
  if (old.empty()) return;
  std::memcpy(c.params.data() + b, old.data() + b, static_cast<size_t>(e - b) * sizeof(float));
}

}  // namespace

// The chunk's values are shared with pull replies still being sent: an update writes them in
// place when no reply holds them, and otherwise into a new buffer, copying each range from the
// old one just before updating it (the same pass, from cache).
void Updater::Refused(NotFinite nf, int64_t begin, NotFinite* into) {
  if (!nf.any()) [[likely]] return;
  nf.first += begin;
  MutexLock lock(&refused_mu_);
  into->Merge(nf);
}

NotFinite Updater::ApplyDense(const OptimizerSpec& opt, DenseChunk& c, const float* grad, int64_t step) {
  const SharedFloats old = c.params.PrepareWrite();
  NotFinite refused;
  pool_.ParallelFor(c.size, kGrain, [&](int64_t b, int64_t e) {
    CopyFrom(old, c, b, e);
    Refused(ApplyUpdateChecked(opt, c.params.data() + b, grad + b, StateAt(c, b), static_cast<size_t>(e - b),
                               static_cast<size_t>(c.size), step),
            b, &refused);
  });
  return refused;
}

NotFinite Updater::ApplyDenseAverage(const OptimizerSpec& opt, DenseChunk& c, std::span<const float* const> grads,
                                     int64_t step) {
  const float k = static_cast<float>(grads.size());
  avg_.resize(static_cast<size_t>(c.size));
  const SharedFloats old = c.params.PrepareWrite();
  NotFinite refused;
  pool_.ParallelFor(c.size, kGrain, [&](int64_t b, int64_t e) {
    CopyFrom(old, c, b, e);
    for (int64_t i = b; i < e; ++i) {
      float s = 0.0f;
      for (const float* g : grads) s += g[i];
      avg_[static_cast<size_t>(i)] = s / k;
    }
    Refused(ApplyUpdateChecked(opt, c.params.data() + b, avg_.data() + b, StateAt(c, b), static_cast<size_t>(e - b),
                               static_cast<size_t>(c.size), step),
            b, &refused);
  });
  return refused;
}

void Updater::ReadRows(std::span<const RowRead> reads) {
  starts_.assign(1, 0);
  for (const RowRead& r : reads) starts_.push_back(starts_.back() + r.ids.size());
  const size_t total = starts_.back();
  rows_.resize(total);
  // Calls fn(read, i, position) for positions [b, e) of all the reads together, in order.
  auto each = [&](int64_t b, int64_t e, auto&& fn) {
    size_t t = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), static_cast<size_t>(b)) -
                                   starts_.begin()) -
               1;
    for (size_t p = static_cast<size_t>(b); p < static_cast<size_t>(e); ++p) {
      while (p >= starts_[t + 1]) ++t;
      fn(reads[t], p - starts_[t], p);
    }
  };
  constexpr size_t ahead = SparseShard::kPrefetchAhead;
  // A disk tier's rows of these ids come back to RAM first (each read names a table of its own:
  // promoting one's rows never demotes another's).
  for (const RowRead& r : reads) r.shard->PromoteForPull(r.ids);
  // Existing rows of tables without lifecycle settings are looked up in parallel (a lookup in a
  // table larger than the cache waits on memory: prefetched a few ids ahead). Tables with them
  // stamp every row a pull touches, so theirs are found serially below.
  pool_.ParallelFor(static_cast<int64_t>(total), 4096, [&](int64_t b, int64_t e) {
    each(b, e, [&](const RowRead& r, size_t i, size_t p) {
      if (r.shard->has_lifecycle()) return;
      if (i + ahead < r.ids.size()) r.shard->Prefetch(r.ids[i + ahead]);
      rows_[p] = r.shard->Find(r.ids[i]);
    });
  });
  each(0, static_cast<int64_t>(total), [&](const RowRead& r, size_t i, size_t p) {  // creation is serial
    if (r.shard->has_lifecycle()) {
      rows_[p] = r.shard->FindForPull(r.ids[i]);  // kNoRow: not admitted (yet), or evicted
    } else if (rows_[p] == kNoRow) {
      rows_[p] = r.shard->FindOrCreate(r.ids[i]);
    }
  });
  const int64_t dim = reads.empty() ? 1 : reads[0].shard->dim();
  pool_.ParallelFor(static_cast<int64_t>(total), kGrain / dim + 1, [&](int64_t b, int64_t e) {
    each(b, e, [&](const RowRead& r, size_t i, size_t p) {
      const size_t d = static_cast<size_t>(r.shard->dim());
      if (rows_[p] == kNoRow) {
        r.shard->InitialRow(r.ids[i], r.dst + i * d);
        return;
      }
      if (p + ahead < static_cast<size_t>(e) && i + ahead < r.ids.size() && rows_[p + ahead] != kNoRow) {
        __builtin_prefetch(r.shard->row(rows_[p + ahead]));
      }
      std::memcpy(r.dst + i * d, r.shard->row(rows_[p]), d * sizeof(float));
    });
  });
}

}  // namespace ferry::ps
