// ferry/trainer/model.h — what the training loop (trainer.h) needs from a model: its tables,
// one step's exchange with the parameters (through a ParamStore) and compute, and evaluation.
//
// One step t of a worker, as RunTraining drives it:
//   LoadTrainBatch(indices)          host: gather the examples, deduplicate their sparse ids
//   (or LoadNextTrainBatch(n)        the same for the next n of a streamed training set)
//   Pull(store, t)                   dense tensors + the batch's sparse rows, uploaded
//   ComputeGradients(...) x k        k micro-batches (--accumulate k) of the loaded batch; the
//                                    gradient of each micro-batch's MEAN loss, scaled by 1/k and
//                                    summed, so the step's gradient is that of the mean over kB
//   Push(store, t)                   the summed gradients (sparse: one row per unique id)
// Evaluate(store, t, ...) pulls what it needs itself (dense tensors at t, sparse rows per eval
// batch), so it may run at any point between steps.
//
// Evaluation results are sum-mergeable: EvalState is a vector of doubles (counts and sums) that
// adds up element-wise across test-set shards and workers; Summarize turns it into metrics.
//
// Thread-safety: a Model drives one Device and is used by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "ferry/trainer/device.h"
#include "ferry/trainer/param_store.h"

namespace ferry::trainer {

struct EvalSummary {
  int64_t count = 0;     // test examples
  double loss = 0;       // mean cross-entropy (nats): softmax for mlp, binary (log-loss) for ctr
  double accuracy = 0;   // mlp: top-1; ctr: at threshold 0.5
  double auc = -1;       // ctr only (-1: not applicable or undefined)
};

class Model {
 public:
  virtual ~Model() = default;

  virtual std::vector<TableSpec> TableSpecs() const = 0;
  // The training examples, or kStreamed: read as a stream, batch after batch, of no size known.
  static constexpr int64_t kStreamed = -1;
  virtual int64_t train_size() const = 0;
  virtual int64_t test_size() const = 0;
  virtual bool is_binary() const = 0;  // ctr: AUC and log-loss

  // Host side of a step: the training examples `indices` (1 .. max batch of the model).
  virtual Status LoadTrainBatch(std::span<const int64_t> indices) = 0;
  // A streamed training set (train_size() == kStreamed): the next `examples` of it.
  virtual Status LoadNextTrainBatch(int64_t examples) {
    (void)examples;
    return UnimplementedError("this model's training set is not streamed");
  }
  virtual Status Pull(ParamStore& store, int64_t step) = 0;
  // Forward + backward on rows [first, first + rows) of the loaded batch; accumulates scale x the
  // gradient of their mean loss (accumulate = false: overwrites instead). Adds the rows' summed
  // loss to *loss_sum and their correct predictions to *correct.
  virtual Status ComputeGradients(int64_t first, int64_t rows, float scale, bool accumulate, double* loss_sum,
                                  int64_t* correct) = 0;
  virtual Status Push(ParamStore& store, int64_t step) = 0;
  // --push-by-layer: set (store not null) before the step's last ComputeGradients, cleared
  // (null) after it. That call sends the dense gradients layer by layer as backward yields them
  // (ParamStore::PushPart, last layer first; layers under 64 KiB wait to go with the next); the
  // step's Push sends the rest. A model that cannot ignores it: its Push sends everything, with
  // the same result.
  virtual void PushDuringBackward(ParamStore* store, int64_t step) {
    (void)store;
    (void)step;
  }

  // Reading the next batch's sparse rows ahead (the loop does so with --pipeline prefetch, async
  // and ssp): a model that holds two batches says so. During step t, after its Pull, the loop
  // calls LoadIntoNext(true), loads step t + 1's examples (they go into the other batch; the
  // loaded one stays as it is), LoadIntoNext(false), then PullRowsAhead(store, t + 1): that
  // batch's rows travel while step t computes and pushes, so they do not hold step t's own
  // gradient (one step more of staleness, as for the dense tables). At step t + 1 the loop calls
  // UseNext() instead of loading, then Pull(store, t + 1), which waits for those rows.
  virtual bool ReadsRowsAhead() const { return false; }
  virtual void LoadIntoNext(bool next) { (void)next; }
  virtual Status PullRowsAhead(ParamStore& store, int64_t step) {
    (void)store;
    (void)step;
    return UnimplementedError("this model does not read rows ahead");
  }
  virtual Status UseNext() { return UnimplementedError("this model does not read rows ahead"); }

  // The dense parameters from the last Pull (all tensors back to back, in TableSpecs order).
  virtual std::span<const float> dense_params() const = 0;

  // Evaluates test examples [first, first + count) with the parameters of `step`; adds into
  // *state (an empty state is initialised).
  virtual Status Evaluate(ParamStore& store, int64_t step, int64_t first, int64_t count,
                          std::vector<double>* state) = 0;
  virtual StatusOr<EvalSummary> Summarize(std::span<const double> state) const = 0;
};

}  // namespace ferry::trainer
