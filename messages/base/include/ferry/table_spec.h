// ferry/table_spec.h — how a table is declared: kind, shape, optimizer, consistency, init.
//
// A TableSpec is plain data. Every worker may declare the same table; the servers accept an
// identical declaration again and refuse a conflicting one with an error naming both specs.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry {

enum class TableType : uint8_t { kDense = 0, kSparse = 1 };
enum class OptimizerType : uint8_t { kSgd = 0, kMomentum = 1, kAdagrad = 2, kAdam = 3, kFtrl = 4 };
enum class Consistency : uint8_t { kSync = 0, kAsync = 1, kSsp = 2 };
enum class InitType : uint8_t { kZeros = 0, kUniform = 1, kNormal = 2, kConstant = 3 };
// What a server does with a pushed gradient that holds NaN or Inf.
enum class NonFinite : uint8_t {
  kRefuse = 0,    // the whole push is refused (INVALID_ARGUMENT naming the element); nothing applied
  kSkipRows = 1,  // sparse tables: the rows that hold one are dropped, the others applied
};

// Server-side optimizer and its hyperparameters (fields not used by `type` are ignored).
struct OptimizerSpec {
  OptimizerType type = OptimizerType::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.9f;             // kMomentum: v = momentum*v + g; p -= lr*v
  bool nesterov = false;             // kMomentum: p -= lr*(g + momentum*v)
  float beta1 = 0.9f;                // kAdam
  float beta2 = 0.999f;              // kAdam
  float epsilon = 1e-8f;             // kAdagrad, kAdam
  float initial_accumulator = 0.1f;  // kAdagrad, kFtrl: accumulator (FTRL's n) starts here
  // kFtrl (FTRL-Proximal; learning_rate is its alpha): L1 and L2 regularisation strengths, and
  // beta, added to sqrt(n) in the per-coordinate learning rate alpha / (beta + sqrt(n)).
  float l1 = 0.0f;
  float l2 = 0.0f;
  float beta = 1.0f;

  friend bool operator==(const OptimizerSpec&, const OptimizerSpec&) = default;
};

struct TableSpec {
  std::string name;
  TableType type = TableType::kDense;
  std::vector<int64_t> shape;        // kDense: tensor shape (product = element count)
  int64_t dim = 0;                   // kSparse: floats per row
  int64_t chunk_elems = 1 << 20;     // kDense: elements per chunk (4 MiB); spreads big tensors
  OptimizerSpec optimizer;
  Consistency consistency = Consistency::kAsync;
  int32_t staleness = 0;             // kSsp: bound s (a pull at clock c waits for all >= c - s)
  int32_t replicas_to_aggregate = 0; // kSync: gradients per step (0 = every worker)
  InitType init = InitType::kZeros;
  float init_scale = 0.0f;           // kUniform: [-scale, scale); kNormal: stddev; kConstant: value
  uint64_t seed = 0;                 // initial values depend only on (seed, table, index or id)
  NonFinite nonfinite = NonFinite::kRefuse;  // gradients holding NaN / Inf (kSkipRows: sparse only)

  // The row lifecycle of a sparse table (all off by default: every row is kept forever). See the
  // README's "Row lifecycle" section. With any of them set, a row is made only by a push: a pull
  // of an id without a row serves its initial values and makes nothing.
  // Admission: a pushed id without a row gets one once it has been pushed `admit_after` times (a
  // counting filter; 0 or 1: at its first push) and then passes a coin of `admit_probability`
  // (tossed at each such push); until then its gradient is counted, not stored.
  int32_t admit_after = 0;          // [0, 255]
  float admit_probability = 1.0f;   // (0, 1]
  // Eviction: a row not pulled or pushed for this many of the table's steps on its server is
  // removed (0: never). Sync tables count steps closed; async and ssp tables count pushes applied
  // divided by the job's workers (each worker pushes once a step).
  int64_t evict_after_steps = 0;
  // Rows one server may hold of this table (0: no bound); a new row over it replaces the least
  // recently used of a sample of rows. The server's memory budget bounds it as well.
  int64_t max_rows = 0;

  // Dense: product of `shape` (INT64_MAX if it overflows or a dimension is negative: a spec from
  // the network before Validate); sparse: 0.
  int64_t num_elements() const;
  // Number of dense chunks (0 for sparse).
  int64_t num_chunks() const;
  // Whether any row lifecycle setting is on (admission, eviction or a row bound).
  bool has_lifecycle() const {
    return admit_after > 1 || admit_probability < 1.0f || evict_after_steps > 0 || max_rows > 0;
  }
  // Checks the spec on its own (names the offending field).
  Status Validate() const;
  // One line that names every field, for logs and conflict errors.
  std::string ToString() const;

  friend bool operator==(const TableSpec&, const TableSpec&) = default;
};

// Parses "sync", "async" or "ssp:<s>" into consistency + staleness.
Status ParseConsistency(std::string_view text, Consistency* consistency, int32_t* staleness);
// Parses "sgd", "momentum", "adagrad", "adam" or "ftrl".
Status ParseOptimizerType(std::string_view text, OptimizerType* type);
// Sets one of the spec's numeric options by name: "momentum", "nesterov" (0 or 1), "beta1",
// "beta2", "epsilon", "initial_accumulator", "l1", "l2", "beta" (ftrl), "chunk_elems",
// "replicas_to_aggregate", "skip_nonfinite_rows" (0 or 1), and the row lifecycle's "admit_after",
// "admit_probability", "evict_after_steps", "max_rows". For the C and Python APIs and --table.
Status SetSpecOption(TableSpec* spec, std::string_view key, double value);
// Parses "refuse" or "skip_rows".
Status ParseNonFinite(std::string_view text, NonFinite* out);
// Parses "zeros", "uniform", "normal" or "constant".
Status ParseInitType(std::string_view text, InitType* type);
std::string_view ConsistencyName(Consistency c);
std::string_view OptimizerName(OptimizerType t);

// The 64-bit id of a table on the wire: FNV-1a of its name (stable across processes and builds).
uint64_t TableId(std::string_view name);

}  // namespace ferry
