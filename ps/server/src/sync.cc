#include "internal/sync.h"

#include <string>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "internal/request.h"

namespace ferry::ps {

Status CheckSyncPush(const TableSpec& spec, const SyncSlots& sync, int64_t version, int rank, int64_t step) {
  if (step > version) {
    return FailedPreconditionError("table '" + spec.name + "': push for step " + std::to_string(step) +
                                   " but the table is at step " + std::to_string(version));
  }
  const size_t r = static_cast<size_t>(rank);
  if (step == version && sync.by_rank[r] && !(r < sync.restored.size() && sync.restored[r])) {
    return FailedPreconditionError("table '" + spec.name + "': rank " + std::to_string(rank) + " pushed step " +
                                   std::to_string(step) + " twice");
  }
  return Status::Ok();
}

bool ResentHold(SyncSlots& sync, int64_t version, int rank, int64_t step) {
  const size_t r = static_cast<size_t>(rank);
  if (step != version || r >= sync.restored.size() || !sync.restored[r] || !sync.by_rank[r]) return false;
  sync.restored[r] = false;
  return true;
}

void MarkSent(SyncSlots& sync, int rank) {
  const size_t r = static_cast<size_t>(rank);
  if (r >= sync.by_rank.size() || !sync.by_rank[r]) return;
  if (sync.restored.size() < sync.by_rank.size()) sync.restored.resize(sync.by_rank.size(), false);
  sync.restored[r] = true;
}

void HoldGradient(SyncSlots& sync, int rank, zmq::message_t grad) {
  sync.by_rank[static_cast<size_t>(rank)] = std::move(grad);
  ++sync.received;
}

void HoldGradient(SyncSlots& sync, int rank, zmq::message_t ids, zmq::message_t grad) {
  sync.ids_by_rank[static_cast<size_t>(rank)] = std::move(ids);
  HoldGradient(sync, rank, std::move(grad));
}

bool DropGradient(SyncSlots& sync, int rank) {
  const size_t r = static_cast<size_t>(rank);
  if (r >= sync.by_rank.size() || !sync.by_rank[r]) return false;
  sync.by_rank[r].reset();
  if (r < sync.ids_by_rank.size()) sync.ids_by_rank[r].reset();
  if (r < sync.restored.size()) sync.restored[r] = false;
  --sync.received;
  return true;
}

NotFinite CloseSyncStep(Updater& updater, const TableSpec& spec, DenseChunk& c, int num_workers) {
  std::vector<const float*> grads;
  std::vector<std::vector<float>> scratch(c.sync.by_rank.size());
  for (size_t r = 0; r < c.sync.by_rank.size(); ++r) {
    if (c.sync.by_rank[r]) grads.push_back(View<float>(*c.sync.by_rank[r], scratch[r]).data());
  }
  const NotFinite refused = updater.ApplyDenseAverage(spec.optimizer, c, grads, c.version + 1);
  ++c.version;
  c.sync.Reset(num_workers, /*sparse=*/false);
  return refused;
}

NotFinite CloseSyncStep(Updater& updater, SparseShard& shard, int num_workers) {
  const int64_t dim = shard.dim();
  absl::flat_hash_map<int64_t, uint32_t> slot_of;
  std::vector<int64_t> ids;
  std::vector<float> sum;
  int k = 0;
  for (size_t r = 0; r < shard.sync.by_rank.size(); ++r) {
    if (!shard.sync.by_rank[r]) continue;
    ++k;
    std::vector<int64_t> id_scratch;
    std::vector<float> g_scratch;
    auto rids = View<int64_t>(*shard.sync.ids_by_rank[r], id_scratch);
    const float* g = View<float>(*shard.sync.by_rank[r], g_scratch).data();
    for (size_t i = 0; i < rids.size(); ++i) {
      auto [it, inserted] = slot_of.try_emplace(rids[i], static_cast<uint32_t>(ids.size()));
      if (inserted) {
        ids.push_back(rids[i]);
        sum.resize(sum.size() + static_cast<size_t>(dim), 0.0f);
      }
      float* s = sum.data() + static_cast<size_t>(it->second) * static_cast<size_t>(dim);
      for (int64_t j = 0; j < dim; ++j) s[j] += g[static_cast<int64_t>(i) * dim + j];
    }
  }
  const float kf = static_cast<float>(k);
  for (float& v : sum) v /= kf;
  // Every push of the step was checked against the memory budget when it came; the step they
  // make is applied whole even if together they go past it (by at most the other workers' new rows).
  const NotFinite refused = updater.ApplyRows(shard, ids, sum.data(), /*over_budget_ok=*/true);
  ++shard.version;
  shard.sync.Reset(num_workers, /*sparse=*/true);
  return refused;
}

}  // namespace ferry::ps
