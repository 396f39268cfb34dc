#include "internal/updates.h"

#include <cstring>

#include "internal/optimizer.h"

namespace ferry::ps {

void Updater::ApplyDense(const OptimizerSpec& opt, DenseChunk& c, const float* grad, int64_t step) {
  pool_.ParallelFor(c.size, kGrain, [&](int64_t b, int64_t e) {
    ApplyUpdate(opt, c.params.data() + b, grad + b, c.state.data() + b, static_cast<size_t>(e - b),
                static_cast<size_t>(c.size), step);
  });
}

void Updater::ApplyDenseAverage(const OptimizerSpec& opt, DenseChunk& c, std::span<const float* const> grads,
                                int64_t step) {
  const float k = static_cast<float>(grads.size());
  avg_.resize(static_cast<size_t>(c.size));
  pool_.ParallelFor(c.size, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float s = 0.0f;
      for (const float* g : grads) s += g[i];
      avg_[static_cast<size_t>(i)] = s / k;
    }
    ApplyUpdate(opt, c.params.data() + b, avg_.data() + b, c.state.data() + b, static_cast<size_t>(e - b),
                static_cast<size_t>(c.size), step);
  });
}

void Updater::ReadDense(const DenseChunk& c, float* dst) {
  const float* src = c.params.data();
  pool_.ParallelFor(c.size, kGrain, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b, src + b, static_cast<size_t>(e - b) * sizeof(float));
  });
}

void Updater::ReadRows(SparseShard& shard, std::span<const int64_t> ids, float* dst) {
  const int64_t dim = shard.dim();
  rows_.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) rows_[i] = shard.FindForPull(ids[i]);  // creation is serial
  pool_.ParallelFor(static_cast<int64_t>(ids.size()), kGrain / dim + 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const RowIndex r = rows_[static_cast<size_t>(i)];
      if (r == kNoRow) {
        shard.InitialRow(ids[static_cast<size_t>(i)], dst + i * dim);  // not admitted (yet), or evicted
      } else {
        std::memcpy(dst + i * dim, shard.row(r), static_cast<size_t>(dim) * sizeof(float));
      }
    }
  });
}

}  // namespace ferry::ps
