// trainer/models/tower.h — what the models share: a dense tower (mlp.h) with its tables and
// gradient buffers, and small helpers for gradients and evaluation state. Private to the models.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "ferry/trainer/models.h"
#include "ferry/trainer/options.h"
#include "ferry/trainer/param_store.h"
#include "models/mlp.h"

namespace ferry::trainer::models {

inline constexpr int64_t kF = sizeof(float);

// dst = (accumulate ? dst : 0) + scale * src.
inline void Accumulate(std::span<float> dst, std::span<const float> src, float scale, bool accumulate) {
  if (accumulate) {
    for (size_t i = 0; i < dst.size(); ++i) dst[i] += scale * src[i];
  } else if (scale == 1.0f) {
    std::copy(src.begin(), src.end(), dst.begin());
  } else {
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = scale * src[i];
  }
}

// Adds a metrics object's state, less its first element (the number of classes or bins: a shape,
// not a sum), into the model's sum-mergeable EvalState (model.h); an empty state is initialised.
inline Status AddEvalState(std::span<const double> metrics_state, std::vector<double>* state) {
  const size_t n = metrics_state.size() - 1;
  if (state->empty()) state->assign(n, 0.0);
  if (state->size() != n) return InvalidArgumentError("Evaluate: state of another model");
  for (size_t i = 0; i < n; ++i) (*state)[i] += metrics_state[i + 1];
  return Status::Ok();
}

// A model's dense tower with its tables: the declarations, the step's gradient (summed over
// micro-batches) and the pull / push lists over the tower's staging and that gradient.
struct Tower {
  std::unique_ptr<Mlp> mlp;
  std::vector<TableSpec> specs;
  std::vector<float> grads;
  std::vector<DenseOut> pulls;  // names point into specs
  std::vector<DenseIn> pushes;

  // Rows per call: a micro-batch or an evaluation batch.
  Status Build(Device* device, const TrainerOptions& o, const MlpConfig& config) {
    FERRY_ASSIGN_OR_RETURN(mlp, Mlp::Create(device, config, std::max(o.batch, kEvalBatch)));
    specs = mlp->TableSpecs(o.optimizer, o.consistency, o.staleness, o.replicas_to_aggregate(), o.seed);
    grads.assign(static_cast<size_t>(mlp->num_params()), 0.0f);
    for (int i = 0; i < mlp->num_tensors(); ++i) {
      const TableSpec& s = specs[static_cast<size_t>(i)];
      pulls.push_back(DenseOut{s.name, mlp->host_param(i)});
      pushes.push_back(DenseIn{s.name, std::span<const float>(grads).subspan(static_cast<size_t>(mlp->tensor_offset(i)),
                                                                             static_cast<size_t>(mlp->tensor_size(i)))});
    }
    return Status::Ok();
  }

  // Pulls the dense tensors for `step` and uploads them.
  Status Pull(ParamStore& store, int64_t step) {
    FERRY_RETURN_IF_ERROR(store.Pull(pulls, {}, step));
    return mlp->UploadParams();
  }
};

// Examples at once: one evaluation batch, or a step's kB (and one more for an epoch's last step on a larger
// shard, trainer.h).
inline int64_t MaxBatch(const TrainerOptions& o) { return std::max(o.batch * o.accumulate + 1, kEvalBatch); }

}  // namespace ferry::trainer::models
