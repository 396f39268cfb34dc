// trainer/models/mlp.h — a dense tower: Linear -> ReLU -> ... -> Linear, run on a Device. The
// models (model.h) put a loss on top: softmax cross-entropy for the `mlp` classifier, sigmoid
// cross-entropy for `ctr`, whose tower also takes the pooled embeddings.
//
// Input: x [rows x input] and, when side_input > 0, a second block s [rows x side_input]; the
// first layer computes x W0 + s W0s + b0 (the same as one Linear over the concatenation [x | s],
// without materialising it). Backward can return d x, the gradient flowing into the input (the
// `ctr` model sends it on to the embeddings).
//
// Parameters: one dense table per tensor, in this order: "<prefix>w0" [input x out0],
// ("<prefix>w0s" [side_input x out0] when side_input > 0), "<prefix>b0" [out0], "<prefix>w1",
// "<prefix>b1", ... Weights are row-major [fan_in x fan_out] (y = x W + b), Glorot-uniform
// initialised (init_scale = sqrt(6 / (fan_in + fan_out)), fan_in counting both input blocks);
// biases start at zero. All tensors live back to back in one device buffer, uploaded from a host
// buffer of the caller's (the models keep two, tower.h) with one copy; gradients come back the
// same way, into host_grads().
//
// Thread-safety: not thread-safe (it drives one Device).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "ferry/trainer/device.h"

namespace ferry::trainer {

struct MlpConfig {
  int64_t input = 784;
  int64_t side_input = 0;  // a second input block (0: none)
  std::vector<int64_t> hidden = {256, 128};
  int64_t outputs = 10;
  std::string prefix = "mlp/";  // table names start with it
};

class Mlp {
 public:
  // `device` must outlive the model. max_rows >= 1 bounds the rows of every call.
  static StatusOr<std::unique_ptr<Mlp>> Create(Device* device, MlpConfig config, int64_t max_rows);

  // The table declarations of an MLP of `config`, without building one (no device, no memory).
  static std::vector<TableSpec> PlanTableSpecs(const MlpConfig& config, const OptimizerSpec& optimizer,
                                               Consistency consistency, int32_t staleness,
                                               int32_t replicas_to_aggregate, uint64_t seed);
  // The table declarations (same order as the tensors).
  std::vector<TableSpec> TableSpecs(const OptimizerSpec& optimizer, Consistency consistency, int32_t staleness,
                                    int32_t replicas_to_aggregate, uint64_t seed) const;

  const MlpConfig& config() const { return config_; }
  int num_tensors() const { return static_cast<int>(names_.size()); }
  const std::string& tensor_name(int i) const { return names_[static_cast<size_t>(i)]; }
  // Where tensor i begins in the flat parameters; tensor_offset(num_tensors()) == num_params().
  int64_t tensor_offset(int i) const { return offsets_[static_cast<size_t>(i)]; }
  int64_t tensor_size(int i) const { return sizes_[static_cast<size_t>(i)]; }
  int64_t num_params() const { return num_params_; }
  int num_layers() const { return static_cast<int>(widths_.size()) - 1; }
  // Layer l's tensors, [first, end): its weight, side weight (layer 0) and bias, back to back.
  std::pair<int, int> layer_tensors(int l) const {
    return {w_[static_cast<size_t>(l)], b_[static_cast<size_t>(l)] + 1};
  }

  // Host staging for gradients (valid for the model's life): DownloadGrads() fills it.
  std::span<const float> host_grads() const { return {grads_host_.as<float>(), static_cast<size_t>(num_params_)}; }

  // Copies num_params() floats of host memory (all tensors back to back; pinned on CUDA, from
  // Device::AllocHost) to the device parameters (enqueued: `params` must stay unchanged until
  // the device is synchronized).
  Status UploadParams(const float* params);
  // Copies the device gradients to host_grads() (enqueued: valid after device->Synchronize()):
  // all of them, or those of tensors [first, end).
  Status DownloadGrads();
  Status DownloadGrads(int first, int end);

  // Forward on device inputs x [rows x input] and side [rows x side_input] (null when
  // side_input == 0), 1 <= rows <= max_rows. The result is logits() [rows x outputs].
  Status Forward(const float* x, const float* side, int64_t rows);
  const float* logits() const { return acts_.back().as<float>(); }

  // Backward after Forward on the same inputs: dlogits [rows x outputs] (device) is the gradient of
  // the loss with respect to logits(). Overwrites the device gradients of every tensor and, when
  // dx is not null, writes the gradient with respect to x into dx [rows x input] (device).
  // `layer_done`, when set, is called with l as soon as layer l's gradients are enqueued (last
  // layer first), before the layer below is computed; an error it returns ends Backward.
  using LayerDone = std::function<Status(int layer)>;
  Status Backward(const float* x, const float* side, const float* dlogits, int64_t rows, float* dx,
                  const LayerDone& layer_done = nullptr);

 private:
  Mlp(Device* device, MlpConfig config, int64_t max_rows);
  Status Allocate();
  int64_t fan_in(int l) const { return widths_[static_cast<size_t>(l)] + (l == 0 ? config_.side_input : 0); }
  const float* dev_param(int i) const { return params_dev_.as<float>() + tensor_offset(i); }
  float* dev_grad(int i) const { return grads_dev_.as<float>() + tensor_offset(i); }

  Device* const device_;
  const MlpConfig config_;
  const int64_t max_rows_;
  std::vector<int64_t> widths_;  // input, hidden..., outputs
  std::vector<int> w_, b_;       // tensor index of layer l's weight / bias
  int ws_ = -1;                  // tensor index of the side weight (-1: none)
  std::vector<std::string> names_;
  std::vector<int64_t> offsets_, sizes_;
  int64_t num_params_ = 0;

  DeviceBuffer grads_host_;
  DeviceBuffer params_dev_, grads_dev_;
  std::vector<DeviceBuffer> acts_;  // acts_[l]: output of layer l (after ReLU for hidden layers)
  DeviceBuffer dz_dev_[2];
};

}  // namespace ferry::trainer
