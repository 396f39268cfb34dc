#include "models/mlp.h"

#include <algorithm>
#include <cmath>

namespace ferry::trainer {

using kernels::Transpose;

namespace {

// "w0", "b1", ...: appended rather than "w" + std::to_string(l), on which GCC 12 warns falsely
// (-Wrestrict, GCC bug 105329).
std::string TensorName(char kind, int layer) {
  std::string name(1, kind);
  name += std::to_string(layer);
  return name;
}

}  // namespace

Mlp::Mlp(Device* device, MlpConfig config, int64_t max_rows)
    : device_(device), config_(std::move(config)), max_rows_(max_rows) {
  widths_.push_back(config_.input);
  for (int64_t h : config_.hidden) widths_.push_back(h);
  widths_.push_back(config_.outputs);
  auto add = [&](std::string name, int64_t size) {
    names_.push_back(config_.prefix + name);
    sizes_.push_back(size);
    offsets_.push_back(num_params_);
    num_params_ += size;
    return static_cast<int>(names_.size()) - 1;
  };
  for (int l = 0; l < num_layers(); ++l) {
    const int64_t out = widths_[static_cast<size_t>(l) + 1];
    w_.push_back(add(TensorName('w', l), widths_[static_cast<size_t>(l)] * out));
    if (l == 0 && config_.side_input > 0) ws_ = add("w0s", config_.side_input * out);
    b_.push_back(add(TensorName('b', l), out));
  }
  offsets_.push_back(num_params_);  // tensor_offset(num_tensors()): the end
}

StatusOr<std::unique_ptr<Mlp>> Mlp::Create(Device* device, MlpConfig config, int64_t max_rows) {
  if (device == nullptr) return InvalidArgumentError("Mlp: null device");
  if (max_rows < 1) return InvalidArgumentError("Mlp: max_rows must be >= 1");
  if (config.input < 1 || config.outputs < 1 || config.side_input < 0) {
    return InvalidArgumentError("Mlp: input and outputs must be >= 1, side_input >= 0");
  }
  for (int64_t h : config.hidden) {
    if (h < 1) return InvalidArgumentError("Mlp: hidden sizes must be >= 1");
  }
  std::unique_ptr<Mlp> m(new Mlp(device, std::move(config), max_rows));
  FERRY_RETURN_IF_ERROR(m->Allocate());
  return m;
}

Status Mlp::Allocate() {
  constexpr int64_t f = sizeof(float);
  const int64_t width_max = std::max(*std::max_element(widths_.begin(), widths_.end()), config_.side_input);
  FERRY_ASSIGN_OR_RETURN(grads_host_, device_->AllocHost(num_params_ * f));
  FERRY_ASSIGN_OR_RETURN(params_dev_, device_->Alloc(num_params_ * f));
  FERRY_ASSIGN_OR_RETURN(grads_dev_, device_->Alloc(num_params_ * f));
  for (int l = 0; l < num_layers(); ++l) {
    FERRY_ASSIGN_OR_RETURN(DeviceBuffer b, device_->Alloc(max_rows_ * widths_[static_cast<size_t>(l) + 1] * f));
    acts_.push_back(std::move(b));
  }
  FERRY_ASSIGN_OR_RETURN(dz_dev_[0], device_->Alloc(max_rows_ * width_max * f));
  FERRY_ASSIGN_OR_RETURN(dz_dev_[1], device_->Alloc(max_rows_ * width_max * f));
  return Status::Ok();
}

std::vector<TableSpec> Mlp::PlanTableSpecs(const MlpConfig& config, const OptimizerSpec& optimizer,
                                           Consistency consistency, int32_t staleness, int32_t replicas_to_aggregate,
                                           uint64_t seed) {
  return Mlp(nullptr, config, 1).TableSpecs(optimizer, consistency, staleness, replicas_to_aggregate, seed);
}

std::vector<TableSpec> Mlp::TableSpecs(const OptimizerSpec& optimizer, Consistency consistency, int32_t staleness,
                                       int32_t replicas_to_aggregate, uint64_t seed) const {
  std::vector<TableSpec> specs(static_cast<size_t>(num_tensors()));
  for (int l = 0; l < num_layers(); ++l) {
    const int64_t out = widths_[static_cast<size_t>(l) + 1];
    const float glorot = static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in(l) + out)));
    auto set = [&](int i, std::vector<int64_t> shape, bool weight) {
      TableSpec& s = specs[static_cast<size_t>(i)];
      s.name = tensor_name(i);
      s.type = TableType::kDense;
      s.shape = std::move(shape);
      s.chunk_elems = int64_t{1} << 16;  // 256 KiB chunks: a big weight spreads over the servers
      s.optimizer = optimizer;
      s.consistency = consistency;
      s.staleness = consistency == Consistency::kSsp ? staleness : 0;
      s.replicas_to_aggregate = consistency == Consistency::kSync ? replicas_to_aggregate : 0;
      s.init = weight ? InitType::kUniform : InitType::kZeros;
      s.init_scale = weight ? glorot : 0.0f;
      s.seed = seed;
    };
    set(w_[static_cast<size_t>(l)], {widths_[static_cast<size_t>(l)], out}, true);
    if (l == 0 && ws_ >= 0) set(ws_, {config_.side_input, out}, true);
    set(b_[static_cast<size_t>(l)], {out}, false);
  }
  return specs;
}

Status Mlp::UploadParams(const float* params) {
  return device_->CopyToDevice(params_dev_.data(), params, num_params_ * int64_t{sizeof(float)});
}

Status Mlp::DownloadGrads() { return DownloadGrads(0, num_tensors()); }

Status Mlp::DownloadGrads(int first, int end) {
  if (first < 0 || end > num_tensors() || first >= end) return InvalidArgumentError("Mlp: no tensors to download");
  const int64_t at = tensor_offset(first);
  return device_->CopyToHost(grads_host_.as<float>() + at, dev_grad(first),
                             (tensor_offset(end) - at) * int64_t{sizeof(float)});
}

Status Mlp::Forward(const float* x, const float* side, int64_t rows) {
  if (rows < 1 || rows > max_rows_) {
    return InvalidArgumentError("Mlp: rows " + std::to_string(rows) + " outside [1, " + std::to_string(max_rows_) +
                                "]");
  }
  const float* in = x;
  for (int l = 0; l < num_layers(); ++l) {
    const int64_t k = widths_[static_cast<size_t>(l)], out = widths_[static_cast<size_t>(l) + 1];
    float* y = acts_[static_cast<size_t>(l)].as<float>();
    FERRY_RETURN_IF_ERROR(device_->Gemm(Transpose::kNo, Transpose::kNo, rows, out, k, 1.0f, in, k,
                                        dev_param(w_[static_cast<size_t>(l)]), out, 0.0f, y, out));
    if (l == 0 && ws_ >= 0) {
      FERRY_RETURN_IF_ERROR(device_->Gemm(Transpose::kNo, Transpose::kNo, rows, out, config_.side_input, 1.0f, side,
                                          config_.side_input, dev_param(ws_), out, 1.0f, y, out));
    }
    FERRY_RETURN_IF_ERROR(device_->BiasAdd(dev_param(b_[static_cast<size_t>(l)]), rows, out, y));
    if (l + 1 < num_layers()) FERRY_RETURN_IF_ERROR(device_->ReluForward(y, rows * out, y));
    in = y;
  }
  return Status::Ok();
}

Status Mlp::Backward(const float* x, const float* side, const float* dlogits, int64_t rows, float* dx,
                     const LayerDone& layer_done) {
  if (rows < 1 || rows > max_rows_) {
    return InvalidArgumentError("Mlp: rows " + std::to_string(rows) + " outside [1, " + std::to_string(max_rows_) +
                                "]");
  }
  const float* dz = dlogits;
  int next = 0;
  for (int l = num_layers() - 1; l >= 0; --l) {
    const int64_t k = widths_[static_cast<size_t>(l)], out = widths_[static_cast<size_t>(l) + 1];
    const float* in = l == 0 ? x : acts_[static_cast<size_t>(l) - 1].as<float>();
    const float* w = dev_param(w_[static_cast<size_t>(l)]);
    // dW = in^T dz  [k x out];  db = column sums of dz.
    FERRY_RETURN_IF_ERROR(device_->Gemm(Transpose::kYes, Transpose::kNo, k, out, rows, 1.0f, in, k, dz, out, 0.0f,
                                        dev_grad(w_[static_cast<size_t>(l)]), out));
    if (l == 0 && ws_ >= 0) {
      FERRY_RETURN_IF_ERROR(device_->Gemm(Transpose::kYes, Transpose::kNo, config_.side_input, out, rows, 1.0f, side,
                                          config_.side_input, dz, out, 0.0f, dev_grad(ws_), out));
    }
    FERRY_RETURN_IF_ERROR(device_->BiasGrad(dz, rows, out, dev_grad(b_[static_cast<size_t>(l)])));
    if (layer_done) FERRY_RETURN_IF_ERROR(layer_done(l));
    if (l > 0) {
      // d(in) = dz W^T [rows x k], then through the ReLU that produced `in`.
      float* din = dz_dev_[next].as<float>();
      FERRY_RETURN_IF_ERROR(
          device_->Gemm(Transpose::kNo, Transpose::kYes, rows, k, out, 1.0f, dz, out, w, out, 0.0f, din, k));
      FERRY_RETURN_IF_ERROR(device_->ReluBackward(in, din, rows * k, din));
      dz = din;
      next = 1 - next;
    } else if (dx != nullptr) {
      FERRY_RETURN_IF_ERROR(
          device_->Gemm(Transpose::kNo, Transpose::kYes, rows, k, out, 1.0f, dz, out, w, out, 0.0f, dx, k));
    }
  }
  return Status::Ok();
}

}  // namespace ferry::trainer
