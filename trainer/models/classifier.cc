// mlp: images -> tower -> softmax cross-entropy.
#include "ferry/trainer/models.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "ferry/data/metrics.h"
#include "ferry/kernels.h"
#include "models/tower.h"

namespace ferry::trainer {
namespace models {
namespace {

MlpConfig TowerConfig(const TrainerOptions& options, int64_t pixels, int64_t classes) {
  MlpConfig c;
  c.input = pixels;
  c.hidden = options.hidden;
  c.outputs = classes;
  c.prefix = "mlp/";
  return c;
}

class Classifier final : public Model {
 public:
  Classifier(Device* device, const TrainerOptions& options, const data::ImageDataset* train,
             const data::ImageDataset* test)
      : device_(device), options_(options), train_(train), test_(test) {}

  Status Init() {
    const MlpConfig c = TowerConfig(options_, train_->pixels_per_image(), train_->num_classes);
    FERRY_RETURN_IF_ERROR(tower_.Build(device_, options_, c));
    const int64_t max_rows = std::max(options_.batch, kEvalBatch);
    max_batch_ = MaxBatch(options_);
    const int64_t input = c.input, classes = c.outputs;
    FERRY_ASSIGN_OR_RETURN(x_host_, device_->AllocHost(max_batch_ * input * kF));
    FERRY_ASSIGN_OR_RETURN(x_dev_, device_->Alloc(max_batch_ * input * kF));
    FERRY_ASSIGN_OR_RETURN(labels_dev_, device_->Alloc(max_batch_ * int64_t{sizeof(int32_t)}));
    FERRY_ASSIGN_OR_RETURN(labels_host_, device_->AllocHost(max_batch_ * int64_t{sizeof(int32_t)}));
    FERRY_ASSIGN_OR_RETURN(probs_dev_, device_->Alloc(max_rows * classes * kF));
    FERRY_ASSIGN_OR_RETURN(probs_host_, device_->AllocHost(max_rows * classes * kF));
    FERRY_ASSIGN_OR_RETURN(row_loss_dev_, device_->Alloc(max_rows * kF));
    FERRY_ASSIGN_OR_RETURN(mean_loss_dev_, device_->Alloc(kF));
    FERRY_ASSIGN_OR_RETURN(mean_loss_host_, device_->AllocHost(kF));
    FERRY_ASSIGN_OR_RETURN(dlogits_dev_, device_->Alloc(max_rows * classes * kF));
    return Status::Ok();
  }

  std::vector<TableSpec> TableSpecs() const override { return tower_.specs; }
  int64_t train_size() const override { return train_->count; }
  int64_t test_size() const override { return test_ == nullptr ? 0 : test_->count; }
  bool is_binary() const override { return false; }
  std::span<const float> dense_params() const override { return tower_.params(); }

  Status LoadTrainBatch(std::span<const int64_t> indices) override { return Load(*train_, indices); }

  Status Pull(ParamStore& store, int64_t step) override { return tower_.Pull(store, step); }

  Status ComputeGradients(int64_t first, int64_t rows, float scale, bool accumulate, double* loss_sum,
                          int64_t* correct) override {
    if (first < 0 || rows < 1 || first + rows > loaded_)
      return InvalidArgumentError("ComputeGradients: rows outside the batch");
    const int64_t classes = tower_.mlp->config().outputs;
    const float* x = x_dev_.as<float>() + first * tower_.mlp->config().input;
    const int32_t* labels = labels_dev_.as<int32_t>() + first;
    FERRY_RETURN_IF_ERROR(tower_.mlp->Forward(x, nullptr, rows));
    FERRY_RETURN_IF_ERROR(device_->SoftmaxCrossEntropyForward(tower_.mlp->logits(), labels, rows, classes,
                                                              probs_dev_.as<float>(), row_loss_dev_.as<float>(),
                                                              mean_loss_dev_.as<float>()));
    FERRY_RETURN_IF_ERROR(device_->CopyToHost(probs_host_.data(), probs_dev_.data(), rows * classes * kF));
    FERRY_RETURN_IF_ERROR(device_->CopyToHost(mean_loss_host_.data(), mean_loss_dev_.data(), kF));
    // Gradient of the mean loss over these rows: scale 1 / rows.
    FERRY_RETURN_IF_ERROR(device_->SoftmaxCrossEntropyBackward(
        probs_dev_.as<float>(), labels, rows, classes, 1.0f / static_cast<float>(rows), dlogits_dev_.as<float>()));
    FERRY_RETURN_IF_ERROR(tower_.Backward(x, nullptr, dlogits_dev_.as<float>(), rows, nullptr, scale, accumulate));
    FERRY_RETURN_IF_ERROR(device_->Synchronize());
    tower_.SumGrads();
    *loss_sum += static_cast<double>(*mean_loss_host_.as<float>()) * static_cast<double>(rows);
    const std::vector<int32_t> pred =
        data::ArgMaxRows(std::span<const float>(probs_host_.as<float>(), static_cast<size_t>(rows * classes)),
                         static_cast<int>(classes));
    const int32_t* host_labels = labels_host_.as<int32_t>() + first;
    for (int64_t r = 0; r < rows; ++r) *correct += pred[static_cast<size_t>(r)] == host_labels[r] ? 1 : 0;
    return Status::Ok();
  }

  void PushDuringBackward(ParamStore* store, int64_t step) override { tower_.PushDuringBackward(store, step); }
  Status Push(ParamStore& store, int64_t step) override { return tower_.Push(store, {}, step); }

  Status Evaluate(ParamStore& store, int64_t step, int64_t first, int64_t count, std::vector<double>* state) override {
    if (test_ == nullptr || first < 0 || count < 0 || first + count > test_->count) {
      return InvalidArgumentError("Evaluate: examples outside the test set");
    }
    FERRY_RETURN_IF_ERROR(tower_.Pull(store, step));
    const int classes = static_cast<int>(tower_.mlp->config().outputs);
    data::ClassificationMetrics metrics(classes);
    std::vector<int64_t> idx;
    std::vector<float> logits;
    for (int64_t at = first; at < first + count; at += kEvalBatch) {
      const int64_t rows = std::min(kEvalBatch, first + count - at);
      idx.resize(static_cast<size_t>(rows));
      std::iota(idx.begin(), idx.end(), at);
      FERRY_RETURN_IF_ERROR(Load(*test_, idx));
      FERRY_RETURN_IF_ERROR(tower_.mlp->Forward(x_dev_.as<float>(), nullptr, rows));
      FERRY_RETURN_IF_ERROR(device_->CopyToHost(probs_host_.data(), tower_.mlp->logits(), rows * classes * kF));
      FERRY_RETURN_IF_ERROR(device_->Synchronize());
      logits.assign(probs_host_.as<float>(), probs_host_.as<float>() + rows * classes);
      FERRY_RETURN_IF_ERROR(
          metrics.Add(logits, std::span<const int32_t>(labels_host_.as<int32_t>(), static_cast<size_t>(rows))));
    }
    return AddEvalState(metrics.State(), state);  // [num_classes, count, correct, loss_sum]
  }

  StatusOr<EvalSummary> Summarize(std::span<const double> state) const override {
    std::vector<double> s{static_cast<double>(tower_.mlp->config().outputs)};
    s.insert(s.end(), state.begin(), state.end());
    FERRY_ASSIGN_OR_RETURN(data::ClassificationMetrics m, data::ClassificationMetrics::FromState(s));
    EvalSummary e;
    e.count = m.count();
    e.loss = m.mean_cross_entropy();
    e.accuracy = m.accuracy();
    return e;
  }

 private:
  // Copies examples `indices` of `set` to the device (x, labels; host copies kept).
  Status Load(const data::ImageDataset& set, std::span<const int64_t> indices) {
    const int64_t rows = static_cast<int64_t>(indices.size());
    if (rows < 1 || rows > max_batch_) return InvalidArgumentError("batch of " + std::to_string(rows) + " examples");
    FERRY_RETURN_IF_ERROR(set.Gather(indices, &xs_, &ys_));
    const int64_t input = tower_.mlp->config().input;
    std::memcpy(x_host_.data(), xs_.data(), static_cast<size_t>(rows * input * kF));
    std::memcpy(labels_host_.data(), ys_.data(), static_cast<size_t>(rows) * sizeof(int32_t));
    FERRY_RETURN_IF_ERROR(device_->CopyToDevice(x_dev_.data(), x_host_.data(), rows * input * kF));
    FERRY_RETURN_IF_ERROR(
        device_->CopyToDevice(labels_dev_.data(), labels_host_.data(), rows * int64_t{sizeof(int32_t)}));
    loaded_ = rows;
    return Status::Ok();
  }

  Device* const device_;
  const TrainerOptions options_;
  const data::ImageDataset* const train_;
  const data::ImageDataset* const test_;
  int64_t max_batch_ = 0, loaded_ = 0;
  Tower tower_;
  std::vector<float> xs_;
  std::vector<int32_t> ys_;
  DeviceBuffer x_host_, x_dev_, labels_host_, labels_dev_, probs_dev_, probs_host_, row_loss_dev_, mean_loss_dev_,
      mean_loss_host_, dlogits_dev_;
};
}  // namespace
}  // namespace models

StatusOr<std::unique_ptr<Model>> CreateClassifier(Device* device, const TrainerOptions& options,
                                                  const data::ImageDataset* train, const data::ImageDataset* test) {
  if (device == nullptr || train == nullptr) return InvalidArgumentError("CreateClassifier: null device or data");
  auto m = std::make_unique<models::Classifier>(device, options, train, test);
  FERRY_RETURN_IF_ERROR(m->Init());
  return std::unique_ptr<Model>(std::move(m));
}

std::vector<TableSpec> ClassifierTableSpecs(const TrainerOptions& options) {
  // Fashion-MNIST's 28 x 28 images (the tables' names and settings do not depend on the shape).
  return models::Tower::Specs(options, models::TowerConfig(options, 28 * 28, data::kFashionMnistClasses));
}

}  // namespace ferry::trainer
