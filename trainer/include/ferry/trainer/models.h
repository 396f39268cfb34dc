// ferry/trainer/models.h — the two models of ferry-trainer (see model.h for the interface):
//
//   mlp  an MLP classifier (mlp.h tower + softmax cross-entropy) on images (Fashion-MNIST).
//   ctr  click-through prediction in the wide-and-deep / DLRM family: one sparse embedding table
//        per categorical field ("ctr/emb<f>", dim E, rows created on first touch on the servers),
//        each example's F embeddings (one id per field, sum-pooled by the embedding-bag op) laid
//        side by side and fed, with the D dense features, to an MLP tower ending in one logit;
//        sigmoid cross-entropy. The tower's first layer takes [pooled | dense] as two input
//        blocks (mlp.h). Per step the ids of each field are deduplicated on the host (the
//        servers route by id, so the ids are on the host anyway); the pulled unique rows of all
//        fields sit in one device table, the bags index into it, and the embedding-bag backward
//        turns the tower's input gradient into one gradient row per unique id, pushed per field.
//
// Thread-safety: as Model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ferry/data/criteo.h"
#include "ferry/data/ctr_batch.h"
#include "ferry/data/fashion_mnist.h"
#include "ferry/trainer/model.h"
#include "ferry/trainer/options.h"

namespace ferry::trainer {

// Examples per evaluation batch.
inline constexpr int64_t kEvalBatch = 512;

// `train` / `test` must outlive the model (test may be null: no evaluation). Batches of up to
// options.batch * options.accumulate examples.
StatusOr<std::unique_ptr<Model>> CreateClassifier(Device* device, const TrainerOptions& options,
                                                  const data::ImageDataset* train, const data::ImageDataset* test);

// The tables each model declares under `options`, known before its data is loaded: what
// CheckSettings checks the user's settings against. The built model declares the same names
// with the same settings (its shapes come from the data).
std::vector<TableSpec> ClassifierTableSpecs(const TrainerOptions& options);
std::vector<TableSpec> CtrTableSpecs(const TrainerOptions& options);

// Click data: synthetic `train` and `test` held in memory; or Criteo files, this worker's part
// of the training files streamed (`train_stream`, `train` empty) and `test` held in memory.
struct CtrData {
  data::CtrBatch train, test;
  // Criteo: advanced by the model, step after step (Model::LoadNextTrainBatch); the rest of
  // CtrData is read-only to it.
  std::unique_ptr<data::CriteoStream> train_stream;
  std::string source;  // what the data is (a line, and a line per bad line of the test files)
  // Synthetic data: the planted model's metrics on `test` (the best a model can do there).
  double planted_auc = -1, planted_log_loss = -1;
};

// Synthetic data per options (examples [0, ctr_train) train, the next ctr_test test), or the
// Criteo files (this worker's files or lines of criteo_train streamed, a pass capped by
// train_limit; all of criteo_test, capped by test_limit).
StatusOr<CtrData> LoadCtrData(const TrainerOptions& options);
StatusOr<std::unique_ptr<Model>> CreateCtrModel(Device* device, const TrainerOptions& options, const CtrData* data);

}  // namespace ferry::trainer
