#include "ferry/trainer/model_registry.h"

#include <array>
#include <cstdio>

#include "ferry/data/fashion_mnist.h"

namespace ferry::trainer {
namespace {

StatusOr<LoadedData> LoadImages(const TrainerOptions& o) {
  LoadedData d;
  FERRY_ASSIGN_OR_RETURN(data::ImageDataset train,
                         data::LoadFashionMnist(data::FashionMnistSplit::kTrain, o.mlp().data_dir));
  FERRY_ASSIGN_OR_RETURN(data::ImageDataset test,
                         data::LoadFashionMnist(data::FashionMnistSplit::kTest, o.mlp().data_dir));
  d.train = std::move(train);
  d.test = std::move(test);
  return d;
}

StatusOr<std::unique_ptr<Model>> CreateImageClassifier(Device* device, const TrainerOptions& o, const Datasets& data) {
  if (data.train == nullptr || data.train->count == 0) return InvalidArgumentError("RunTraining: no training data");
  return CreateClassifier(device, o, data.train, data.test);
}

StatusOr<LoadedData> LoadCtr(const TrainerOptions& o) {
  LoadedData d;
  FERRY_ASSIGN_OR_RETURN(CtrData ctr, LoadCtrData(o));
  d.lines.push_back("data: " + ctr.source);
  if (ctr.planted_auc >= 0) {
    char line[160];
    std::snprintf(line, sizeof line,
                  "data: the planted model scores test AUC %.4f, log-loss %.4f (the best achievable)", ctr.planted_auc,
                  ctr.planted_log_loss);
    d.lines.push_back(line);
  }
  d.ctr = std::move(ctr);
  return d;
}

StatusOr<std::unique_ptr<Model>> CreateCtr(Device* device, const TrainerOptions& o, const Datasets& data) {
  if (data.ctr == nullptr) return InvalidArgumentError("RunTraining: --model ctr needs ctr data");
  return CreateCtrModel(device, o, data.ctr);
}

const ModelInfo kModels[] = {
    {"mlp", "an MLP classifier of Fashion-MNIST images (--data-dir)", MlpModelOptions{}, ClassifierTableSpecs,
     LoadImages, CreateImageClassifier},
    {"ctr",
     "click-through prediction: an embedding table per categorical field, an MLP tower (synthetic data, "
     "or Criteo files)",
     CtrModelOptions{}, CtrTableSpecs, LoadCtr, CreateCtr},
};

}  // namespace

Datasets LoadedData::view() const {
  Datasets d;
  d.train = train ? &*train : nullptr;
  d.test = test ? &*test : nullptr;
  d.ctr = ctr ? &*ctr : nullptr;
  return d;
}

std::span<const ModelInfo> Models() { return kModels; }

std::span<const std::string_view> ModelNames() {
  static const auto names = [] {
    std::array<std::string_view, std::size(kModels)> n{};
    for (size_t i = 0; i < n.size(); ++i) n[i] = kModels[i].name;
    return n;
  }();
  return names;
}

const ModelInfo* FindModel(std::string_view name) {
  for (const ModelInfo& m : kModels) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

}  // namespace ferry::trainer
