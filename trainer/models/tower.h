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

// A model's dense tower with its tables: the declarations, and two sets of host parameters and
// step gradients (summed over micro-batches) with their pull / push lists. Steps alternate
// between the sets (step % 2), so that a store that pulls ahead (ParamStore::pull_ahead) can
// still be sending step t's gradients and receiving the parameters of step t + 1 or t + 2 into
// one set while the next step works with the other.
struct Tower {
  std::unique_ptr<Mlp> mlp;
  std::vector<TableSpec> specs;

  // The tables a tower of `config` declares under options `o`.
  static std::vector<TableSpec> Specs(const TrainerOptions& o, const MlpConfig& config) {
    return Mlp::PlanTableSpecs(config, o.optimizer, o.consistency, o.staleness, o.replicas_to_aggregate(), o.seed);
  }

  Status Build(Device* device, const TrainerOptions& o, const MlpConfig& config) {
    device_ = device;
    FERRY_ASSIGN_OR_RETURN(mlp, Mlp::Create(device, config, std::max(o.batch, kEvalBatch)));
    specs = Specs(o, config);
    const size_t n = static_cast<size_t>(mlp->num_params());
    for (Set& set : sets_) {
      FERRY_ASSIGN_OR_RETURN(set.params, device->AllocHost(mlp->num_params() * kF));
      std::fill_n(set.params.as<float>(), n, 0.0f);
      set.grads.assign(n, 0.0f);
      for (int i = 0; i < mlp->num_tensors(); ++i) {
        const TableSpec& s = specs[static_cast<size_t>(i)];
        const size_t at = static_cast<size_t>(mlp->tensor_offset(i)), size = static_cast<size_t>(mlp->tensor_size(i));
        set.pulls.push_back(DenseOut{s.name, std::span<float>(set.params.as<float>() + at, size)});
        set.pushes.push_back(DenseIn{s.name, std::span<const float>(set.grads).subspan(at, size)});
      }
    }
    return Status::Ok();
  }

  // The dense tables to pull for `step`, into its set, which becomes the current one.
  std::span<const DenseOut> PullsFor(int64_t step) {
    cur_ = static_cast<size_t>(step & 1);
    return sets_[cur_].pulls;
  }
  // Uploads the current set's parameters.
  Status Upload() { return mlp->UploadParams(sets_[cur_].params.as<float>()); }
  // Pulls the dense tensors for `step` and uploads them.
  Status Pull(ParamStore& store, int64_t step) {
    FERRY_RETURN_IF_ERROR(store.Pull(PullsFor(step), {}, step));
    return Upload();
  }
  // Pushes the current step's gradients (with `sparse`), pulling ahead into the set of the step
  // the store pulls for.
  Status Push(ParamStore& store, std::span<const SparseIn> sparse, int64_t step) {
    const size_t ahead = static_cast<size_t>((step + store.pull_ahead()) & 1);
    return store.Push(sets_[cur_].pushes, sparse, step, sets_[ahead].pulls);
  }

  // --push-by-layer: the next Backward pushes each layer's gradients for `step` as backward
  // yields them (the step's last micro-batch; null: it does not).
  void PushDuringBackward(ParamStore* store, int64_t step) {
    early_ = store;
    early_step_ = step;
  }

  // Layers not sent yet travel together once they hold this much, else with the layer below (or
  // the Push): every message costs each server it reaches a round of work beside its bytes, and
  // a layer of a few KiB (the MLP's last, 128 x 10 floats) has little to hide. It also spares the
  // device a synchronization per small layer.
  static constexpr int64_t kMinPartBytes = int64_t{64} << 10;

  // Backward through the tower (Mlp::Backward), its gradients then summed into grads() as
  // scale x the gradient (accumulate = false: overwriting). The copies to the host are enqueued
  // and SumGrads() sums them once the device synchronized. With a store set by
  // PushDuringBackward, each layer's copy is enqueued as soon as backward wrote it; once the
  // layers not sent yet hold kMinPartBytes, the device is synchronized, they are summed and sent
  // (ParamStore::PushPart, with their pull ahead as Push does) before the layer below is
  // computed. SumGrads() then sums the rest, and the step's Push sends it.
  Status Backward(const float* x, const float* side, const float* dlogits, int64_t rows, float* dx, float scale,
                  bool accumulate) {
    scale_ = scale;
    accumulate_ = accumulate;
    unsummed_end_ = mlp->num_tensors();
    if (early_ == nullptr) {
      FERRY_RETURN_IF_ERROR(mlp->Backward(x, side, dlogits, rows, dx));
      return mlp->DownloadGrads();
    }
    // Tensors [first of the layers not sent, unsummed_end_) wait to be sent.
    return mlp->Backward(x, side, dlogits, rows, dx, [&](int l) -> Status {
      const auto [first, end] = mlp->layer_tensors(l);
      FERRY_RETURN_IF_ERROR(mlp->DownloadGrads(first, end));
      if ((mlp->tensor_offset(unsummed_end_) - mlp->tensor_offset(first)) * kF < kMinPartBytes) return Status::Ok();
      FERRY_RETURN_IF_ERROR(device_->Synchronize());
      SumRange(first, unsummed_end_);
      const size_t ahead = static_cast<size_t>((early_step_ + early_->pull_ahead()) & 1);
      const auto tensors = [&, first = first](const auto& list) {
        return std::span(list).subspan(static_cast<size_t>(first), static_cast<size_t>(unsummed_end_ - first));
      };
      FERRY_RETURN_IF_ERROR(early_->PushPart(tensors(sets_[cur_].pushes), early_step_, tensors(sets_[ahead].pulls)));
      unsummed_end_ = first;
      return Status::Ok();
    });
  }
  // After the device synchronized: sums what Backward copied and did not sum itself.
  void SumGrads() {
    if (unsummed_end_ > 0) SumRange(0, unsummed_end_);
    unsummed_end_ = 0;
  }

  std::span<const float> params() const {
    return {sets_[cur_].params.as<float>(), static_cast<size_t>(mlp->num_params())};
  }
  std::span<float> grads() { return sets_[cur_].grads; }

 private:
  struct Set {
    DeviceBuffer params;  // host (pinned on CUDA)
    std::vector<float> grads;
    std::vector<DenseOut> pulls;  // names point into specs
    std::vector<DenseIn> pushes;
  };
  // grads()[tensors first..end) (+)= scale_ x the host copy of their gradients.
  void SumRange(int first, int end) {
    const size_t at = static_cast<size_t>(mlp->tensor_offset(first)),
                 stop = static_cast<size_t>(mlp->tensor_offset(end));
    Accumulate(grads().subspan(at, stop - at), mlp->host_grads().subspan(at, stop - at), scale_, accumulate_);
  }

  Device* device_ = nullptr;
  Set sets_[2];
  size_t cur_ = 0;
  ParamStore* early_ = nullptr;  // PushDuringBackward
  int64_t early_step_ = 0;
  float scale_ = 1;
  bool accumulate_ = false;
  int unsummed_end_ = 0;  // tensors [0, unsummed_end_) of the last Backward are not summed yet
};

// Examples at once: one evaluation batch, or a step's kB (and one more for an epoch's last step on a larger
// shard, trainer.h), and with --leave or --join a part of each absent worker's step too
// (data::StepBatch: at most ceil(slice / the workers present) of a slice of at most kB + 1). With
// --move-asks-every, --max-asked-leaves more (1.26: leaves asked while the job runs); worker 0 stays.
// The absent workers a step's batch buffers hold the shares of: --leave's and --join's, and
// --max-asked-leaves more with --move-asks-every; worker 0 is never absent.
inline int64_t MaxAbsent(const TrainerOptions& o) {
  return std::min<int64_t>(
      std::max<int64_t>(o.num_workers - 1, 0),
      static_cast<int64_t>(o.leave.size() + o.join.size()) + (o.move_asks_every > 0 ? o.max_asked_leaves : 0));
}
inline int64_t MaxBatch(const TrainerOptions& o) {
  const int64_t step = o.batch * o.accumulate + 1;
  const int64_t absent = MaxAbsent(o);
  const int64_t present = std::max<int64_t>(1, o.num_workers - absent);
  return std::max(step + absent * ((step + present - 1) / present), kEvalBatch);
}

}  // namespace ferry::trainer::models
