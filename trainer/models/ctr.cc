// ctr: per-field embeddings (sum-pooled) + dense features -> tower -> sigmoid cross-entropy.
#include "ferry/trainer/models.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "ferry/data/criteo.h"
#include "ferry/data/metrics.h"
#include "ferry/data/synthetic_ctr.h"
#include "ferry/kernels.h"
#include "ferry/messages/placement.h"
#include "models/tower.h"

namespace ferry::trainer {
namespace models {
namespace {

MlpConfig TowerConfig(const TrainerOptions& options, int fields, int dense) {
  MlpConfig c;
  c.input = int64_t{fields} * options.ctr().emb_dim;
  c.side_input = dense;
  c.hidden = options.hidden;
  c.outputs = 1;
  c.prefix = "ctr/";
  return c;
}

// Field f's embedding table.
TableSpec EmbeddingSpec(const TrainerOptions& options, int f) {
  TableSpec s;
  s.name = "ctr/emb" + std::to_string(f);
  s.type = TableType::kSparse;
  s.dim = options.ctr().emb_dim;
  s.optimizer = options.optimizer;
  s.consistency = options.consistency;
  s.staleness = options.consistency == Consistency::kSsp ? options.staleness : 0;
  s.replicas_to_aggregate = options.consistency == Consistency::kSync ? options.replicas_to_aggregate() : 0;
  s.init = InitType::kUniform;
  s.init_scale = 0.05f;
  s.seed = options.seed;
  return s;
}

// --audit-examples: the table that counts the examples trained on (options.h).
TableSpec AuditSpec(const TrainerOptions& options) {
  TableSpec s;
  s.name = "ctr/audit";
  s.type = TableType::kSparse;
  s.dim = 1;
  s.optimizer.type = OptimizerType::kSgd;
  s.optimizer.learning_rate = 1.0f;
  s.consistency = options.consistency;
  s.staleness = options.consistency == Consistency::kSsp ? options.staleness : 0;
  s.init = InitType::kZeros;
  return s;
}

// An example's audit key: a hash of its label, dense features and ids (non-negative).
int64_t AuditKey(const data::CtrBatch& set, int64_t i) {
  uint64_t h = placement::Mix64(0xA0D17ull ^ (set.labels[static_cast<size_t>(i)] == 1.0f ? 1u : 0u));
  for (const float v : set.dense_row(i)) {
    uint32_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    h = placement::Mix64(h ^ bits);
  }
  for (const int64_t id : set.id_row(i)) h = placement::Mix64(h ^ static_cast<uint64_t>(id));
  return static_cast<int64_t>(h >> 1);
}

class CtrModel final : public Model {
 public:
  CtrModel(Device* device, const TrainerOptions& options, const CtrData* data)
      : device_(device), options_(options), data_(data) {}

  Status Init() {
    const data::CtrBatch& t = data_->train;
    stream_ = data_->train_stream.get();
    fields_ = stream_ != nullptr ? data::kCriteoFields : t.num_fields;
    dense_ = stream_ != nullptr ? data::kCriteoDense : t.num_dense;
    dim_ = options_.ctr().emb_dim;
    if (fields_ < 1) return InvalidArgumentError("ctr: the data has no categorical field");
    if (stream_ == nullptr && t.empty()) return InvalidArgumentError("ctr: no training examples");
    if (!data_->test.empty() && (data_->test.num_fields != fields_ || data_->test.num_dense != dense_)) {
      return InvalidArgumentError("ctr: the test set's shape differs from the training set's");
    }
    FERRY_RETURN_IF_ERROR(tower_.Build(device_, options_, TowerConfig(options_, fields_, dense_)));
    const int64_t max_rows = std::max(options_.batch, kEvalBatch);
    max_batch_ = MaxBatch(options_);
    for (int f = 0; f < fields_; ++f) emb_specs_.push_back(EmbeddingSpec(options_, f));
    const int64_t bags = max_batch_ * fields_;  // one bag (one id) per example and field
    constexpr int64_t kId = sizeof(int64_t), kPos = sizeof(int32_t);
    // The second batch only when it is read ahead (--pipeline prefetch).
    for (int b = 0; b < (ahead_ ? 2 : 1); ++b) {
      Batch& h = batches_[b];
      h.unique.resize(static_cast<size_t>(fields_));
      h.base.assign(static_cast<size_t>(fields_) + 1, 0);
      FERRY_ASSIGN_OR_RETURN(h.unique_host, device_->AllocHost(bags * kId));
      FERRY_ASSIGN_OR_RETURN(h.emb_host, device_->AllocHost(bags * dim_ * kF));
      FERRY_ASSIGN_OR_RETURN(h.index_host, device_->AllocHost(bags * kPos));
      FERRY_ASSIGN_OR_RETURN(h.dense_host, device_->AllocHost(max_batch_ * std::max<int64_t>(dense_, 1) * kF));
      FERRY_ASSIGN_OR_RETURN(h.labels_host, device_->AllocHost(max_batch_ * kF));
    }
    FERRY_ASSIGN_OR_RETURN(ids_host_, device_->AllocHost(bags * kId));
    FERRY_ASSIGN_OR_RETURN(ids_dev_, device_->Alloc(bags * kId));
    FERRY_ASSIGN_OR_RETURN(unique_dev_, device_->Alloc(bags * kId));
    FERRY_ASSIGN_OR_RETURN(inverse_dev_, device_->Alloc(bags * kPos));
    FERRY_ASSIGN_OR_RETURN(inverse_host_, device_->AllocHost(bags * kPos));
    FERRY_ASSIGN_OR_RETURN(counts_dev_, device_->Alloc(fields_ * kPos));
    FERRY_ASSIGN_OR_RETURN(counts_host_, device_->AllocHost(fields_ * kPos));
    FERRY_ASSIGN_OR_RETURN(emb_dev_, device_->Alloc(bags * dim_ * kF));
    FERRY_ASSIGN_OR_RETURN(emb_grad_dev_, device_->Alloc(bags * dim_ * kF));
    FERRY_ASSIGN_OR_RETURN(emb_grad_host_, device_->AllocHost(bags * dim_ * kF));
    FERRY_ASSIGN_OR_RETURN(index_dev_, device_->Alloc(bags * kPos));
    FERRY_ASSIGN_OR_RETURN(offsets_dev_, device_->Alloc((bags + 1) * kPos));
    FERRY_ASSIGN_OR_RETURN(dense_dev_, device_->Alloc(max_batch_ * std::max<int64_t>(dense_, 1) * kF));
    FERRY_ASSIGN_OR_RETURN(labels_dev_, device_->Alloc(max_batch_ * kF));
    FERRY_ASSIGN_OR_RETURN(pooled_dev_, device_->Alloc(max_rows * fields_ * dim_ * kF));
    FERRY_ASSIGN_OR_RETURN(dpooled_dev_, device_->Alloc(max_rows * fields_ * dim_ * kF));
    FERRY_ASSIGN_OR_RETURN(probs_dev_, device_->Alloc(max_rows * kF));
    FERRY_ASSIGN_OR_RETURN(probs_host_, device_->AllocHost(max_rows * kF));
    FERRY_ASSIGN_OR_RETURN(row_loss_dev_, device_->Alloc(max_rows * kF));
    FERRY_ASSIGN_OR_RETURN(mean_loss_dev_, device_->Alloc(kF));
    FERRY_ASSIGN_OR_RETURN(mean_loss_host_, device_->AllocHost(kF));
    FERRY_ASSIGN_OR_RETURN(dlogits_dev_, device_->Alloc(max_rows * kF));
    // Single-hot bags: bag b is [b, b + 1). Uploaded once; a micro-batch uses a prefix.
    std::vector<int32_t> offsets(static_cast<size_t>(bags) + 1);
    std::iota(offsets.begin(), offsets.end(), 0);
    FERRY_ASSIGN_OR_RETURN(DeviceBuffer staging, device_->AllocHost((bags + 1) * int64_t{sizeof(int32_t)}));
    std::memcpy(staging.data(), offsets.data(), offsets.size() * sizeof(int32_t));
    FERRY_RETURN_IF_ERROR(device_->CopyToDevice(offsets_dev_.data(), staging.data(), staging.bytes()));
    return device_->Synchronize();
  }

  std::vector<TableSpec> TableSpecs() const override {
    std::vector<TableSpec> all = tower_.specs;
    all.insert(all.end(), emb_specs_.begin(), emb_specs_.end());
    if (options_.ctr().audit_examples) all.push_back(AuditSpec(options_));
    return all;
  }
  int64_t train_size() const override { return stream_ != nullptr ? kStreamed : data_->train.size(); }
  int64_t test_size() const override { return data_->test.size(); }
  bool is_binary() const override { return true; }
  std::span<const float> dense_params() const override { return tower_.params(); }

  Status LoadTrainBatch(std::span<const int64_t> indices) override { return Load(data_->train, indices); }
  Status LoadNextTrainBatch(int64_t examples) override {
    if (stream_ == nullptr) return Model::LoadNextTrainBatch(examples);
    FERRY_RETURN_IF_ERROR(stream_->Next(examples, &streamed_));
    if (static_cast<int64_t>(all_.size()) != examples) {
      all_.resize(static_cast<size_t>(examples));
      std::iota(all_.begin(), all_.end(), 0);
    }
    return Load(streamed_, all_);
  }

  Status Pull(ParamStore& store, int64_t step) override {
    FERRY_RETURN_IF_ERROR(store.Pull(tower_.PullsFor(step), cur().pulls, step));
    FERRY_RETURN_IF_ERROR(tower_.Upload());
    return device_->CopyToDevice(emb_dev_.data(), cur().emb_host.data(), num_unique() * dim_ * kF);
  }

  bool ReadsRowsAhead() const override { return ahead_; }
  void LoadIntoNext(bool next) override { load_next_ = next && ahead_; }
  Status PullRowsAhead(ParamStore& store, int64_t step) override {
    if (!ahead_ || !next_loaded_) return FailedPreconditionError("ctr: no next batch loaded to read rows ahead for");
    return store.PullSparseAhead(batches_[cur_ ^ 1].pulls, step);
  }
  Status UseNext() override {
    if (!ahead_ || !next_loaded_) return FailedPreconditionError("ctr: no next batch loaded");
    cur_ ^= 1;
    next_loaded_ = false;
    return Upload(cur());
  }

  Status ComputeGradients(int64_t first, int64_t rows, float scale, bool accumulate, double* loss_sum,
                          int64_t* correct) override {
    if (first < 0 || rows < 1 || first + rows > loaded_)
      return InvalidArgumentError("ComputeGradients: rows outside the batch");
    const float* labels = labels_dev_.as<float>() + first;
    FERRY_RETURN_IF_ERROR(Forward(first, rows));
    FERRY_RETURN_IF_ERROR(device_->SigmoidCrossEntropyForward(tower_.mlp->logits(), labels, rows,
                                                              row_loss_dev_.as<float>(), mean_loss_dev_.as<float>(),
                                                              probs_dev_.as<float>()));
    FERRY_RETURN_IF_ERROR(device_->CopyToHost(probs_host_.data(), probs_dev_.data(), rows * kF));
    FERRY_RETURN_IF_ERROR(device_->CopyToHost(mean_loss_host_.data(), mean_loss_dev_.data(), kF));
    FERRY_RETURN_IF_ERROR(device_->SigmoidCrossEntropyBackward(
        tower_.mlp->logits(), labels, rows, 1.0f / static_cast<float>(rows), dlogits_dev_.as<float>()));
    FERRY_RETURN_IF_ERROR(tower_.Backward(pooled_dev_.as<float>(), side(first), dlogits_dev_.as<float>(), rows,
                                          dpooled_dev_.as<float>(), scale, accumulate));
    const int64_t bags = rows * fields_;
    FERRY_RETURN_IF_ERROR(device_->EmbeddingBagBackward(
        dpooled_dev_.as<float>(), dim_, offsets_dev_.as<int32_t>(), index_dev_.as<int32_t>() + first * fields_, bags,
        bags, num_unique(), kernels::Pooling::kSum, emb_grad_dev_.as<float>()));
    FERRY_RETURN_IF_ERROR(device_->CopyToHost(emb_grad_host_.data(), emb_grad_dev_.data(), num_unique() * dim_ * kF));
    FERRY_RETURN_IF_ERROR(device_->Synchronize());
    tower_.SumGrads();
    emb_grads_.resize(static_cast<size_t>(num_unique() * dim_));
    Accumulate(emb_grads_, std::span<const float>(emb_grad_host_.as<float>(), emb_grads_.size()), scale, accumulate);
    *loss_sum += static_cast<double>(*mean_loss_host_.as<float>()) * static_cast<double>(rows);
    const float* p = probs_host_.as<float>();
    const float* y = cur().labels_host.as<float>() + first;
    for (int64_t r = 0; r < rows; ++r) *correct += (p[r] >= 0.5f) == (y[r] == 1.0f) ? 1 : 0;
    return Status::Ok();
  }

  void PushDuringBackward(ParamStore* store, int64_t step) override { tower_.PushDuringBackward(store, step); }
  Status Push(ParamStore& store, int64_t step) override {
    // Reading rows ahead, the store keeps the sparse push in flight until the Pull of step + 2,
    // while the next batch is loaded into the other batch and the next gradient computed: it
    // travels from a copy of its own, one of two alternating by step.
    std::span<const float> grads = emb_grads_;
    PushCopy* copy = ahead_ ? &push_copies_[step & 1] : nullptr;
    if (copy != nullptr) {
      copy->grads.assign(emb_grads_.begin(), emb_grads_.end());
      copy->ids.assign(cur().unique_host.as<int64_t>(), cur().unique_host.as<int64_t>() + loaded_ * fields_);
      grads = copy->grads;
    }
    sparse_pushes_.clear();
    for (int f = 0; f < fields_; ++f) {
      const size_t at = static_cast<size_t>(cur().base[static_cast<size_t>(f)] * dim_);
      std::span<const int64_t> ids = cur().unique[static_cast<size_t>(f)];
      if (copy != nullptr)
        ids = std::span<const int64_t>(copy->ids).subspan(static_cast<size_t>(f * loaded_), ids.size());
      sparse_pushes_.push_back(SparseIn{emb_specs_[static_cast<size_t>(f)].name, ids,
                                        grads.subspan(at, ids.size() * static_cast<size_t>(dim_))});
    }
    if (options_.ctr().audit_examples) {  // each example of the batch counted once on the servers
      std::span<const int64_t> audit_ids = cur().audit_ids;
      std::span<const float> audit_grads = cur().audit_grads;
      if (copy != nullptr) {
        copy->audit_ids.assign(audit_ids.begin(), audit_ids.end());
        copy->audit_grads.assign(audit_grads.begin(), audit_grads.end());
        audit_ids = copy->audit_ids;
        audit_grads = copy->audit_grads;
      }
      sparse_pushes_.push_back(SparseIn{kAuditTable, audit_ids, audit_grads});
    }
    return tower_.Push(store, sparse_pushes_, step);
  }

  Status Evaluate(ParamStore& store, int64_t step, int64_t first, int64_t count, std::vector<double>* state) override {
    const data::CtrBatch& test = data_->test;
    if (first < 0 || count < 0 || first + count > test.size())
      return InvalidArgumentError("Evaluate: examples outside the test set");
    FERRY_RETURN_IF_ERROR(tower_.Pull(store, step));
    data::BinaryMetrics metrics;
    std::vector<int64_t> idx;
    for (int64_t at = first; at < first + count; at += kEvalBatch) {
      const int64_t rows = std::min(kEvalBatch, first + count - at);
      idx.resize(static_cast<size_t>(rows));
      std::iota(idx.begin(), idx.end(), at);
      FERRY_RETURN_IF_ERROR(Load(test, idx));
      FERRY_RETURN_IF_ERROR(store.Pull({}, cur().pulls, step));
      FERRY_RETURN_IF_ERROR(device_->CopyToDevice(emb_dev_.data(), cur().emb_host.data(), num_unique() * dim_ * kF));
      FERRY_RETURN_IF_ERROR(Forward(0, rows));
      FERRY_RETURN_IF_ERROR(device_->SigmoidCrossEntropyForward(tower_.mlp->logits(), labels_dev_.as<float>(), rows,
                                                                row_loss_dev_.as<float>(), mean_loss_dev_.as<float>(),
                                                                probs_dev_.as<float>()));
      FERRY_RETURN_IF_ERROR(device_->CopyToHost(probs_host_.data(), probs_dev_.data(), rows * kF));
      FERRY_RETURN_IF_ERROR(device_->Synchronize());
      FERRY_RETURN_IF_ERROR(
          metrics.Add(std::span<const float>(probs_host_.as<float>(), static_cast<size_t>(rows)),
                      std::span<const float>(cur().labels_host.as<float>(), static_cast<size_t>(rows))));
    }
    return AddEvalState(metrics.State(), state);  // [num_bins, count, positives, correct, loss_sum, pos..., neg...]
  }

  StatusOr<EvalSummary> Summarize(std::span<const double> state) const override {
    std::vector<double> s{static_cast<double>(data::BinaryMetrics::kDefaultBins)};
    s.insert(s.end(), state.begin(), state.end());
    FERRY_ASSIGN_OR_RETURN(data::BinaryMetrics m, data::BinaryMetrics::FromState(s));
    EvalSummary e;
    e.count = m.count();
    e.loss = m.mean_log_loss();
    e.accuracy = m.accuracy();
    auto auc = m.auc();
    e.auc = auc.ok() ? *auc : -1.0;
    return e;
  }

 private:
  // One batch's host side: its examples' labels and dense features, its distinct ids per field
  // and their rows (what the step pulls and pushes), and the bag indices into those rows.
  struct Batch {
    DeviceBuffer unique_host, emb_host, index_host, dense_host, labels_host;
    std::vector<std::span<const int64_t>> unique;  // per field: the batch's distinct ids, ascending (in unique_host)
    std::vector<int64_t> base;                     // field f's rows start at base[f] in the combined table
    std::vector<SparseOut> pulls;                  // every field's rows, into emb_host
    int64_t rows = 0;
    // --audit-examples: the batch's distinct example keys, ascending, and -(times each is in it).
    std::vector<int64_t> audit_ids;
    std::vector<float> audit_grads;
  };
  Batch& cur() { return batches_[cur_]; }
  const Batch& cur() const { return batches_[cur_]; }
  int64_t num_unique() const { return cur().base.back(); }

  // Sends a batch's examples and bag indices to the device: it becomes the loaded batch.
  Status Upload(const Batch& b) {
    FERRY_RETURN_IF_ERROR(device_->CopyToDevice(labels_dev_.data(), b.labels_host.data(), b.rows * kF));
    if (dense_ > 0)
      FERRY_RETURN_IF_ERROR(device_->CopyToDevice(dense_dev_.data(), b.dense_host.data(), b.rows * dense_ * kF));
    FERRY_RETURN_IF_ERROR(
        device_->CopyToDevice(index_dev_.data(), b.index_host.data(), b.rows * fields_ * int64_t{sizeof(int32_t)}));
    loaded_ = b.rows;
    return Status::Ok();
  }
  const float* side(int64_t first) const { return dense_ > 0 ? dense_dev_.as<float>() + first * dense_ : nullptr; }

  // Pools rows [first, first + rows) of the loaded batch and runs the tower.
  Status Forward(int64_t first, int64_t rows) {
    const int64_t bags = rows * fields_;
    FERRY_RETURN_IF_ERROR(device_->EmbeddingBagForward(
        emb_dev_.as<float>(), num_unique(), dim_, offsets_dev_.as<int32_t>(),
        index_dev_.as<int32_t>() + first * fields_, bags, bags, kernels::Pooling::kSum, pooled_dev_.as<float>()));
    return tower_.mlp->Forward(pooled_dev_.as<float>(), side(first), rows);
  }

  // Host side of a batch: copies the examples; deduplicates each field's ids once, on the device
  // (the CUDA dedup kernel on a GPU, its CPU twin otherwise); builds the bag indices into the
  // combined table of unique rows; and uploads features, labels and indices (a batch loaded ahead:
  // UseNext does). The distinct ids
  // are what the step pulls and pushes: the client sends them from the batch's unique_host as they are.
  Status Load(const data::CtrBatch& set, std::span<const int64_t> indices) {
    const int64_t rows = static_cast<int64_t>(indices.size());
    if (rows < 1 || rows > max_batch_) return InvalidArgumentError("batch of " + std::to_string(rows) + " examples");
    // Into the other batch while the loop reads the next one ahead; the loaded one stays.
    Batch& b = batches_[load_next_ ? cur_ ^ 1 : cur_];
    float* labels = b.labels_host.as<float>();
    float* dense = b.dense_host.as<float>();
    int64_t* ids = ids_host_.as<int64_t>();  // field f's column at ids + f * rows
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = indices[static_cast<size_t>(r)];
      if (i < 0 || i >= set.size()) return InvalidArgumentError("example " + std::to_string(i) + " is out of range");
      labels[r] = set.labels[static_cast<size_t>(i)];
      std::copy_n(set.dense.begin() + i * dense_, dense_, dense + r * dense_);
      for (int64_t f = 0; f < fields_; ++f) ids[f * rows + r] = set.ids[static_cast<size_t>(i * fields_ + f)];
    }
    const int64_t bags = rows * fields_;
    constexpr int64_t kId = sizeof(int64_t), kPos = sizeof(int32_t);
    FERRY_RETURN_IF_ERROR(device_->CopyToDevice(ids_dev_.data(), ids, bags * kId));
    for (int64_t f = 0; f < fields_; ++f) {
      FERRY_RETURN_IF_ERROR(device_->Dedup(ids_dev_.as<int64_t>() + f * rows, rows,
                                           unique_dev_.as<int64_t>() + f * rows, inverse_dev_.as<int32_t>() + f * rows,
                                           counts_dev_.as<int32_t>() + f));
    }
    FERRY_RETURN_IF_ERROR(device_->CopyToHost(b.unique_host.data(), unique_dev_.data(), bags * kId));
    FERRY_RETURN_IF_ERROR(device_->CopyToHost(inverse_host_.data(), inverse_dev_.data(), bags * kPos));
    FERRY_RETURN_IF_ERROR(device_->CopyToHost(counts_host_.data(), counts_dev_.data(), fields_ * kPos));
    FERRY_RETURN_IF_ERROR(device_->Synchronize());
    int32_t* index = b.index_host.as<int32_t>();
    const int32_t* inverse = inverse_host_.as<int32_t>();
    b.base[0] = 0;
    for (int64_t f = 0; f < fields_; ++f) {
      const int64_t n = counts_host_.as<int32_t>()[f];
      if (n < 1 || n > rows)
        return InternalError("dedup of field " + std::to_string(f) + " gave " + std::to_string(n) + " ids");
      b.unique[static_cast<size_t>(f)] =
          std::span<const int64_t>(b.unique_host.as<int64_t>() + f * rows, static_cast<size_t>(n));
      const int64_t base = b.base[static_cast<size_t>(f)];
      for (int64_t r = 0; r < rows; ++r) index[r * fields_ + f] = static_cast<int32_t>(base + inverse[f * rows + r]);
      b.base[static_cast<size_t>(f) + 1] = base + n;
    }
    b.pulls.clear();
    for (int f = 0; f < fields_; ++f) {
      const std::span<const int64_t> u = b.unique[static_cast<size_t>(f)];
      b.pulls.push_back(SparseOut{emb_specs_[static_cast<size_t>(f)].name, u,
                                  std::span<float>(b.emb_host.as<float>() + b.base[static_cast<size_t>(f)] * dim_,
                                                   u.size() * static_cast<size_t>(dim_))});
    }
    b.rows = rows;
    if (options_.ctr().audit_examples) {
      b.audit_ids.clear();
      b.audit_grads.clear();
      std::vector<int64_t> keys(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) keys[static_cast<size_t>(r)] = AuditKey(set, indices[static_cast<size_t>(r)]);
      std::sort(keys.begin(), keys.end());
      for (const int64_t k : keys) {
        if (!b.audit_ids.empty() && b.audit_ids.back() == k) {
          b.audit_grads.back() -= 1.0f;
        } else {
          b.audit_ids.push_back(k);
          b.audit_grads.push_back(-1.0f);
        }
      }
    }
    if (load_next_) {
      next_loaded_ = true;
      return Status::Ok();
    }
    return Upload(b);
  }

  Device* const device_;
  const TrainerOptions options_;
  const CtrData* const data_;
  data::CriteoStream* stream_ = nullptr;  // data_->train_stream's, or none
  data::CtrBatch streamed_;               // the step's examples from the stream
  std::vector<int64_t> all_;              // 0 .. n-1: the indices of all of streamed_
  int64_t fields_ = 0, dense_ = 0, dim_ = 0, max_batch_ = 0, loaded_ = 0;
  Tower tower_;
  std::vector<TableSpec> emb_specs_;
  std::vector<float> emb_grads_;  // the step's embedding gradient, rows in combined-table order
  // The loaded batch (cur_) and, when rows are read ahead, the next one (the other).
  const bool ahead_ = options_.pipeline == Pipeline::kPrefetch && !options_.local;
  Batch batches_[2];
  int cur_ = 0;
  bool load_next_ = false;    // Load fills the other batch
  bool next_loaded_ = false;  // ... and has
  std::vector<SparseIn> sparse_pushes_;
  // Reading rows ahead: what step t's sparse push sends (push_copies_[t & 1]): the batch's
  // distinct ids, field f's at f * rows (as in its unique_host), and their gradient rows.
  struct PushCopy {
    std::vector<int64_t> ids;
    std::vector<float> grads;
    std::vector<int64_t> audit_ids;
    std::vector<float> audit_grads;
  };
  static constexpr char kAuditTable[] = "ctr/audit";
  PushCopy push_copies_[2];
  DeviceBuffer emb_dev_, emb_grad_dev_, emb_grad_host_, index_dev_, offsets_dev_, dense_dev_, labels_dev_, pooled_dev_,
      dpooled_dev_, probs_dev_, probs_host_, row_loss_dev_, mean_loss_dev_, mean_loss_host_, dlogits_dev_;
  // A batch's ids per field (field-major), deduplicated on the device: distinct ids (copied into
  // the batch's unique_host), the inverse map, and the count per field. Scratch of Load.
  DeviceBuffer ids_host_, ids_dev_, unique_dev_, inverse_dev_, inverse_host_, counts_dev_, counts_host_;
};

}  // namespace
}  // namespace models

std::vector<TableSpec> CtrTableSpecs(const TrainerOptions& options) {
  const CtrModelOptions& ctr = options.ctr();
  const bool criteo = !ctr.criteo_train.empty();
  const int fields = criteo ? data::kCriteoFields : ctr.fields;
  std::vector<TableSpec> specs =
      models::Tower::Specs(options, models::TowerConfig(options, fields, criteo ? data::kCriteoDense : ctr.dense));
  for (int f = 0; f < fields; ++f) specs.push_back(models::EmbeddingSpec(options, f));
  if (ctr.audit_examples) specs.push_back(models::AuditSpec(options));
  return specs;
}

StatusOr<CtrData> LoadCtrData(const TrainerOptions& options) {
  const CtrModelOptions& ctr = options.ctr();
  CtrData d;
  if (!ctr.criteo_train.empty()) {
    auto train_files = data::ExpandCriteoPaths(ctr.criteo_train);
    if (!train_files.ok()) return train_files.status().WithContext("--criteo-train");
    auto test_files = data::ExpandCriteoPaths(ctr.criteo_test);
    if (!test_files.ok()) return test_files.status().WithContext("--criteo-test");
    data::CriteoOptions co;
    co.shard = options.local ? data::ShardSpec{} : data::ShardSpec{options.rank, options.num_workers};
    co.shard_by = ctr.criteo_shard;
    FERRY_ASSIGN_OR_RETURN(auto train, data::CriteoReader::Open(*train_files, co));
    d.source = "Criteo files, streamed: this worker's " + std::to_string(train->files().size()) + " of " +
               std::to_string(train_files->size()) + " training file(s) (" + train->files()[0] +
               (train->files().size() > 1 ? " .. " + train->files().back() : std::string()) + ")";
    if (co.shard.num_shards > 1) {
      d.source += std::string(", sharded by ") + data::CriteoShardByName(train->shard_by());
    }
    d.source += "\n";
    // Read ahead: the next step's examples are parsed while this step computes.
    d.train_stream = std::make_unique<data::CriteoStream>(std::move(train), options.train_limit, /*read_ahead=*/true);

    // The test set is held (about 270 bytes an example; --test-limit caps it).
    FERRY_ASSIGN_OR_RETURN(auto test, data::CriteoReader::Open(*test_files));
    d.test.Reset(data::kCriteoDense, data::kCriteoFields);
    data::CtrBatch chunk;
    const int64_t limit = options.test_limit;
    while (limit <= 0 || d.test.size() < limit) {
      const int64_t want = limit > 0 ? std::min<int64_t>(65536, limit - d.test.size()) : 65536;
      FERRY_ASSIGN_OR_RETURN(int64_t got, test->ReadBatch(want, &chunk));
      if (got == 0) break;
      d.test.Append(chunk);
    }
    const data::CriteoStats& st = test->stats();
    d.source += "test: " + std::to_string(d.test.size()) + " examples from " + std::to_string(st.files) +
                " file(s), " + std::to_string(st.bad_lines) + " bad lines skipped";
    for (const auto& bad : st.first_bad_lines) d.source += "\n  " + bad.ToString();
    d.source += "\n";
    if (d.test.empty()) return InvalidArgumentError(ctr.criteo_test + ": no usable test example");
    return d;
  }
  data::SyntheticCtrOptions so;
  so.seed = ctr.data_seed;
  so.vocab_sizes.assign(static_cast<size_t>(ctr.fields), ctr.vocab);
  so.num_dense = ctr.dense;
  so.zipf_exponent = ctr.zipf;
  FERRY_ASSIGN_OR_RETURN(data::SyntheticCtr gen, data::SyntheticCtr::Create(so));
  gen.GenerateRange(0, ctr.train, &d.train, nullptr);
  std::vector<float> true_probs;
  gen.GenerateRange(ctr.train, ctr.test, &d.test, &true_probs);
  if (!d.test.empty()) {
    auto auc = data::ExactAuc(true_probs, d.test.labels);
    auto ll = data::LogLoss(true_probs, d.test.labels);
    if (auc.ok()) d.planted_auc = *auc;
    if (ll.ok()) d.planted_log_loss = *ll;
  }
  d.source = "synthetic ctr data (seed " + std::to_string(ctr.data_seed) + "): " + std::to_string(ctr.fields) +
             " fields x " + std::to_string(ctr.vocab) + " ids (Zipf " + std::to_string(ctr.zipf).substr(0, 4) + "), " +
             std::to_string(ctr.dense) + " dense; " + std::to_string(d.train.size()) + " train / " +
             std::to_string(d.test.size()) + " test examples";
  return d;
}

StatusOr<std::unique_ptr<Model>> CreateCtrModel(Device* device, const TrainerOptions& options, const CtrData* data) {
  if (device == nullptr || data == nullptr) return InvalidArgumentError("CreateCtrModel: null device or data");
  auto m = std::make_unique<models::CtrModel>(device, options, data);
  FERRY_RETURN_IF_ERROR(m->Init());
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace ferry::trainer
