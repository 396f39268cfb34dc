// trainer/trainer/mlp.h — the `mlp` model: Linear -> ReLU -> ... -> Linear -> softmax
// cross-entropy, run on a Device.
//
// Parameters: one dense table per tensor, in this order: "<prefix>w0" [in0 x out0],
// "<prefix>b0" [out0], "<prefix>w1", ... Weights are row-major [fan_in x fan_out] (y = x W + b),
// Glorot-uniform initialised (init_scale = sqrt(6 / (fan_in + fan_out))); biases start at zero.
// All tensors live back to back in one host staging buffer (host_params(), pinned on CUDA) and
// one device buffer, so a step pulls every table into host_params() in one PullDense and uploads
// it with one copy; gradients come back the same way in host_grads().
//
// Thread-safety: not thread-safe (it drives one Device).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "trainer/trainer/device.h"

namespace ferry::trainer {

struct MlpConfig {
  int64_t input = 784;
  std::vector<int64_t> hidden = {256, 128};
  int64_t classes = 10;
  std::string prefix = "mlp/";  // table names start with it
};

class Mlp {
 public:
  // `device` must outlive the model. max_batch >= 1 bounds the rows of every call.
  static StatusOr<std::unique_ptr<Mlp>> Create(Device* device, MlpConfig config, int64_t max_batch);

  // The table declarations (same order as the tensors), with the given optimizer, consistency and
  // init seed; chunk_elems spreads big weights over servers.
  std::vector<TableSpec> TableSpecs(const OptimizerSpec& optimizer, Consistency consistency,
                                    int32_t staleness, uint64_t seed) const;

  int num_tensors() const { return static_cast<int>(names_.size()); }
  const std::string& tensor_name(int i) const { return names_[static_cast<size_t>(i)]; }
  int64_t tensor_offset(int i) const { return offsets_[static_cast<size_t>(i)]; }
  int64_t tensor_size(int i) const { return sizes_[static_cast<size_t>(i)]; }
  int64_t num_params() const { return num_params_; }

  // Host staging (valid for the model's life). Write parameters into host_params(), then
  // UploadParams(); TrainStep leaves the gradients in host_grads().
  std::span<float> host_params() { return {params_host_.as<float>(), static_cast<size_t>(num_params_)}; }
  std::span<const float> host_grads() const { return {grads_host_.as<float>(), static_cast<size_t>(num_params_)}; }
  std::span<float> host_param(int i) { return host_params().subspan(static_cast<size_t>(tensor_offset(i)), static_cast<size_t>(tensor_size(i))); }
  std::span<const float> host_grad(int i) const { return host_grads().subspan(static_cast<size_t>(tensor_offset(i)), static_cast<size_t>(tensor_size(i))); }

  // Copies host_params() to the device (synchronous).
  Status UploadParams();

  // Forward + backward on `rows` (1..max_batch) examples: x [rows x input], labels [rows], host
  // memory. Leaves the gradients of the MEAN loss over the rows in host_grads(); `*loss` gets that
  // mean loss (nats) and `*correct` the number of rows whose argmax is the label.
  Status TrainStep(const float* x, const int32_t* labels, int64_t rows, float* loss, int64_t* correct);

  // Forward only; `logits` (host) gets [rows x classes].
  Status Predict(const float* x, int64_t rows, std::vector<float>* logits);

 private:
  Mlp(Device* device, MlpConfig config, int64_t max_batch);
  Status Allocate();
  Status Forward(const float* x, int64_t rows);  // into logits_
  int num_layers() const { return static_cast<int>(widths_.size()) - 1; }
  const float* dev_param(int i) const { return params_dev_.as<float>() + tensor_offset(i); }
  float* dev_grad(int i) const { return grads_dev_.as<float>() + tensor_offset(i); }

  Device* const device_;
  const MlpConfig config_;
  const int64_t max_batch_;
  std::vector<int64_t> widths_;  // input, hidden..., classes
  std::vector<std::string> names_;
  std::vector<int64_t> offsets_, sizes_;
  int64_t num_params_ = 0;

  DeviceBuffer params_host_, grads_host_, x_host_, labels_host_, probs_host_, loss_host_;
  DeviceBuffer params_dev_, grads_dev_, x_dev_, labels_dev_;
  std::vector<DeviceBuffer> acts_;  // acts_[l]: output of layer l (after ReLU for hidden layers)
  DeviceBuffer probs_dev_, row_loss_dev_, mean_loss_dev_, dz_dev_[2];
};

}  // namespace ferry::trainer
