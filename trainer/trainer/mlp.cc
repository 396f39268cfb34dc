#include "trainer/trainer/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ferry/data/metrics.h"

namespace ferry::trainer {

using kernels::Transpose;

Mlp::Mlp(Device* device, MlpConfig config, int64_t max_batch)
    : device_(device), config_(std::move(config)), max_batch_(max_batch) {
  widths_.push_back(config_.input);
  for (int64_t h : config_.hidden) widths_.push_back(h);
  widths_.push_back(config_.classes);
  for (int l = 0; l + 1 < static_cast<int>(widths_.size()); ++l) {
    names_.push_back(config_.prefix + "w" + std::to_string(l));
    sizes_.push_back(widths_[static_cast<size_t>(l)] * widths_[static_cast<size_t>(l) + 1]);
    names_.push_back(config_.prefix + "b" + std::to_string(l));
    sizes_.push_back(widths_[static_cast<size_t>(l) + 1]);
  }
  for (int64_t s : sizes_) {
    offsets_.push_back(num_params_);
    num_params_ += s;
  }
}

StatusOr<std::unique_ptr<Mlp>> Mlp::Create(Device* device, MlpConfig config, int64_t max_batch) {
  if (device == nullptr) return InvalidArgumentError("Mlp: null device");
  if (max_batch < 1) return InvalidArgumentError("Mlp: max_batch must be >= 1");
  if (config.input < 1 || config.classes < 1) return InvalidArgumentError("Mlp: input and classes must be >= 1");
  for (int64_t h : config.hidden) {
    if (h < 1) return InvalidArgumentError("Mlp: hidden sizes must be >= 1");
  }
  std::unique_ptr<Mlp> m(new Mlp(device, std::move(config), max_batch));
  FERRY_RETURN_IF_ERROR(m->Allocate());
  return m;
}

Status Mlp::Allocate() {
  constexpr int64_t f = sizeof(float);
  const int64_t width_max = *std::max_element(widths_.begin(), widths_.end());
  const int64_t classes = config_.classes;
  FERRY_ASSIGN_OR_RETURN(params_host_, device_->AllocHost(num_params_ * f));
  FERRY_ASSIGN_OR_RETURN(grads_host_, device_->AllocHost(num_params_ * f));
  FERRY_ASSIGN_OR_RETURN(x_host_, device_->AllocHost(max_batch_ * config_.input * f));
  FERRY_ASSIGN_OR_RETURN(labels_host_, device_->AllocHost(max_batch_ * int64_t{sizeof(int32_t)}));
  FERRY_ASSIGN_OR_RETURN(probs_host_, device_->AllocHost(max_batch_ * classes * f));
  FERRY_ASSIGN_OR_RETURN(loss_host_, device_->AllocHost(f));
  FERRY_ASSIGN_OR_RETURN(params_dev_, device_->Alloc(num_params_ * f));
  FERRY_ASSIGN_OR_RETURN(grads_dev_, device_->Alloc(num_params_ * f));
  FERRY_ASSIGN_OR_RETURN(x_dev_, device_->Alloc(max_batch_ * config_.input * f));
  FERRY_ASSIGN_OR_RETURN(labels_dev_, device_->Alloc(max_batch_ * int64_t{sizeof(int32_t)}));
  for (int l = 0; l < num_layers(); ++l) {
    FERRY_ASSIGN_OR_RETURN(DeviceBuffer b, device_->Alloc(max_batch_ * widths_[static_cast<size_t>(l) + 1] * f));
    acts_.push_back(std::move(b));
  }
  FERRY_ASSIGN_OR_RETURN(probs_dev_, device_->Alloc(max_batch_ * classes * f));
  FERRY_ASSIGN_OR_RETURN(row_loss_dev_, device_->Alloc(max_batch_ * f));
  FERRY_ASSIGN_OR_RETURN(mean_loss_dev_, device_->Alloc(f));
  FERRY_ASSIGN_OR_RETURN(dz_dev_[0], device_->Alloc(max_batch_ * width_max * f));
  FERRY_ASSIGN_OR_RETURN(dz_dev_[1], device_->Alloc(max_batch_ * width_max * f));
  std::fill(host_params().begin(), host_params().end(), 0.0f);
  return Status::Ok();
}

std::vector<TableSpec> Mlp::TableSpecs(const OptimizerSpec& optimizer, Consistency consistency,
                                       int32_t staleness, uint64_t seed) const {
  std::vector<TableSpec> specs;
  for (int i = 0; i < num_tensors(); ++i) {
    const int l = i / 2;
    const int64_t fan_in = widths_[static_cast<size_t>(l)], fan_out = widths_[static_cast<size_t>(l) + 1];
    TableSpec s;
    s.name = tensor_name(i);
    s.type = TableType::kDense;
    s.shape = (i % 2 == 0) ? std::vector<int64_t>{fan_in, fan_out} : std::vector<int64_t>{fan_out};
    s.chunk_elems = int64_t{1} << 16;  // 256 KiB chunks: a big weight spreads over the servers
    s.optimizer = optimizer;
    s.consistency = consistency;
    s.staleness = consistency == Consistency::kSsp ? staleness : 0;
    if (i % 2 == 0) {
      s.init = InitType::kUniform;
      s.init_scale = static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
    } else {
      s.init = InitType::kZeros;
    }
    s.seed = seed;
    specs.push_back(std::move(s));
  }
  return specs;
}

Status Mlp::UploadParams() {
  FERRY_RETURN_IF_ERROR(device_->CopyToDevice(params_dev_.data(), params_host_.data(), num_params_ * int64_t{sizeof(float)}));
  return device_->Synchronize();
}

Status Mlp::Forward(const float* x, int64_t rows) {
  if (rows < 1 || rows > max_batch_) {
    return InvalidArgumentError("Mlp: rows " + std::to_string(rows) + " outside [1, " + std::to_string(max_batch_) + "]");
  }
  const int64_t xbytes = rows * config_.input * int64_t{sizeof(float)};
  std::memcpy(x_host_.data(), x, static_cast<size_t>(xbytes));
  FERRY_RETURN_IF_ERROR(device_->CopyToDevice(x_dev_.data(), x_host_.data(), xbytes));
  const float* in = x_dev_.as<float>();
  for (int l = 0; l < num_layers(); ++l) {
    const int64_t fan_in = widths_[static_cast<size_t>(l)], fan_out = widths_[static_cast<size_t>(l) + 1];
    float* out = acts_[static_cast<size_t>(l)].as<float>();
    FERRY_RETURN_IF_ERROR(device_->Gemm(Transpose::kNo, Transpose::kNo, rows, fan_out, fan_in, 1.0f, in, fan_in,
                                        dev_param(2 * l), fan_out, 0.0f, out, fan_out));
    FERRY_RETURN_IF_ERROR(device_->BiasAdd(dev_param(2 * l + 1), rows, fan_out, out));
    if (l + 1 < num_layers()) FERRY_RETURN_IF_ERROR(device_->ReluForward(out, rows * fan_out, out));
    in = out;
  }
  return Status::Ok();
}

Status Mlp::TrainStep(const float* x, const int32_t* labels, int64_t rows, float* loss, int64_t* correct) {
  FERRY_RETURN_IF_ERROR(Forward(x, rows));
  const int64_t classes = config_.classes;
  std::memcpy(labels_host_.data(), labels, static_cast<size_t>(rows) * sizeof(int32_t));
  FERRY_RETURN_IF_ERROR(device_->CopyToDevice(labels_dev_.data(), labels_host_.data(), rows * int64_t{sizeof(int32_t)}));
  const float* logits = acts_.back().as<float>();
  FERRY_RETURN_IF_ERROR(device_->SoftmaxCrossEntropyForward(logits, labels_dev_.as<int32_t>(), rows, classes,
                                                            probs_dev_.as<float>(), row_loss_dev_.as<float>(),
                                                            mean_loss_dev_.as<float>()));
  FERRY_RETURN_IF_ERROR(device_->CopyToHost(probs_host_.data(), probs_dev_.data(), rows * classes * int64_t{sizeof(float)}));
  FERRY_RETURN_IF_ERROR(device_->CopyToHost(loss_host_.data(), mean_loss_dev_.data(), int64_t{sizeof(float)}));
  // Gradient of the mean loss over this batch: scale 1 / rows.
  int cur = 0;
  FERRY_RETURN_IF_ERROR(device_->SoftmaxCrossEntropyBackward(probs_dev_.as<float>(), labels_dev_.as<int32_t>(), rows,
                                                             classes, 1.0f / static_cast<float>(rows),
                                                             dz_dev_[cur].as<float>()));
  for (int l = num_layers() - 1; l >= 0; --l) {
    const int64_t fan_in = widths_[static_cast<size_t>(l)], fan_out = widths_[static_cast<size_t>(l) + 1];
    const float* in = l == 0 ? x_dev_.as<float>() : acts_[static_cast<size_t>(l) - 1].as<float>();
    const float* dz = dz_dev_[cur].as<float>();
    // dW = in^T dz  [fan_in x fan_out];  db = column sums of dz.
    FERRY_RETURN_IF_ERROR(device_->Gemm(Transpose::kYes, Transpose::kNo, fan_in, fan_out, rows, 1.0f, in, fan_in, dz,
                                        fan_out, 0.0f, dev_grad(2 * l), fan_out));
    FERRY_RETURN_IF_ERROR(device_->BiasGrad(dz, rows, fan_out, dev_grad(2 * l + 1)));
    if (l > 0) {
      // d(in) = dz W^T [rows x fan_in], then through the ReLU that produced `in`.
      float* din = dz_dev_[1 - cur].as<float>();
      FERRY_RETURN_IF_ERROR(device_->Gemm(Transpose::kNo, Transpose::kYes, rows, fan_in, fan_out, 1.0f, dz, fan_out,
                                          dev_param(2 * l), fan_out, 0.0f, din, fan_in));
      FERRY_RETURN_IF_ERROR(device_->ReluBackward(in, din, rows * fan_in, din));
      cur = 1 - cur;
    }
  }
  FERRY_RETURN_IF_ERROR(device_->CopyToHost(grads_host_.data(), grads_dev_.data(), num_params_ * int64_t{sizeof(float)}));
  FERRY_RETURN_IF_ERROR(device_->Synchronize());
  *loss = *loss_host_.as<float>();
  const std::vector<int32_t> pred = data::ArgMaxRows(
      std::span<const float>(probs_host_.as<float>(), static_cast<size_t>(rows * classes)), static_cast<int>(classes));
  int64_t hits = 0;
  for (int64_t r = 0; r < rows; ++r) hits += pred[static_cast<size_t>(r)] == labels[r] ? 1 : 0;
  *correct = hits;
  return Status::Ok();
}

Status Mlp::Predict(const float* x, int64_t rows, std::vector<float>* logits) {
  FERRY_RETURN_IF_ERROR(Forward(x, rows));
  const int64_t n = rows * config_.classes;
  FERRY_RETURN_IF_ERROR(device_->CopyToHost(probs_host_.data(), acts_.back().data(), n * int64_t{sizeof(float)}));
  FERRY_RETURN_IF_ERROR(device_->Synchronize());
  logits->assign(probs_host_.as<float>(), probs_host_.as<float>() + n);
  return Status::Ok();
}

}  // namespace ferry::trainer
