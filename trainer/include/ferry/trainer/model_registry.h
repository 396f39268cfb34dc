// ferry/trainer/model_registry.h — the models ferry-trainer knows, one row each: name, what it
// is, the tables it declares (known from the options alone, before its data: CheckSettings), how
// its data is loaded, and how it is built. --model, --help, the trainer, CheckSettings and
// ferry-trainer's main read this table; a model's own flags say which model they belong to in
// options.cc's flag table (a flag of another model is refused). Adding a model: its files under
// trainer/models/, its options (ModelOptions, options.h) and a row in kModels (models/registry.cc).
// Thread-safety: constant data.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/trainer/models.h"
#include "ferry/trainer/trainer.h"

namespace ferry::trainer {

// A model's data, owned; `view()` is what the trainer reads.
struct LoadedData {
  std::optional<data::ImageDataset> train, test;
  std::optional<CtrData> ctr;
  std::vector<std::string> lines;  // what it is, for the log ("data: ...")

  Datasets view() const;
};

struct ModelInfo {
  std::string_view name;
  std::string_view summary;  // for --help
  ModelOptions defaults;     // its own options (TrainerOptions::SetModel), at their defaults
  std::vector<TableSpec> (*plan_tables)(const TrainerOptions& options);
  StatusOr<LoadedData> (*load_data)(const TrainerOptions& options);
  StatusOr<std::unique_ptr<Model>> (*create)(Device* device, const TrainerOptions& options, const Datasets& data);
};

std::span<const ModelInfo> Models();
std::span<const std::string_view> ModelNames();
// nullptr when no model has that name.
const ModelInfo* FindModel(std::string_view name);

}  // namespace ferry::trainer
