// ferry/table_spec.h — how a table is declared: kind, shape, optimizer, consistency, init.
//
// A TableSpec is plain data. Every worker may declare the same table; the servers accept an
// identical declaration again and refuse a conflicting one with an error naming both specs.
// The optimizers and their hyperparameters are in ferry/optimizers.h. Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/optimizers.h"
#include "ferry/status.h"

namespace ferry {

enum class TableType : uint8_t { kDense = 0, kSparse = 1 };
enum class Consistency : uint8_t { kSync = 0, kAsync = 1, kSsp = 2 };
enum class InitType : uint8_t { kZeros = 0, kUniform = 1, kNormal = 2, kConstant = 3 };
// What a server does with a pushed gradient that holds NaN or Inf.
enum class NonFinite : uint8_t {
  kRefuse = 0,    // the whole push is refused (INVALID_ARGUMENT naming the element); nothing applied
  kSkipRows = 1,  // sparse tables: the rows that hold one are dropped, the others applied
};

// How a table's values travel on the wire (its pushed gradients and pulled parameters); the
// server keeps float32 whatever the format. See the README's "Wire formats" section.
enum class WireFormat : uint8_t {
  kF32 = 0,   // 4 bytes a value, exact
  kF16 = 1,   // IEEE binary16: relative error <= 2^-11 in [2^-14, 65504]; finite values beyond +-65504
              // travel as +-65504 (saturated), NaN and Inf as themselves
  kBf16 = 2,  // bfloat16 (the upper half of a float32, rounded to nearest even): relative error <= 2^-8,
              // float32's range (a finite value that would round past it travels as the largest bf16)
};

struct TableSpec {
  std::string name;
  TableType type = TableType::kDense;
  std::vector<int64_t> shape;        // kDense: tensor shape (product = element count)
  int64_t dim = 0;                   // kSparse: floats per row
  // kDense: elements per chunk (1 MiB): a table's unit of placement over the servers, and of a
  // dense call's pieces (ClientOptions::dense_message_bytes). A table that exists keeps its own:
  // a client of 1.9 or later takes it from the servers when it declares the table.
  int64_t chunk_elems = 1 << 18;
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
  // The disk tier (sparse tables with max_rows; README, "The disk tier"): a row that the RAM tier
  // (max_rows rows a server) has no room for is written to the server's store on local disk
  // (ferry-ps --disk-tier-dir) instead of being evicted, and read back when pulled or pushed, so
  // no row is lost. A table keeps it for its life.
  bool disk_tier = false;

  // Gradient compression (issue 17). `wire`: the element format of the table's pushed gradients
  // and pulled values. `topk_ratio` (dense tables, (0, 1]; 0: off): each pushed chunk of n
  // elements sends only its k = ceil(topk_ratio * n) largest-magnitude elements (index + value);
  // the client keeps the rest as a residual it adds to the table's next gradient (error feedback).
  WireFormat wire = WireFormat::kF32;
  float topk_ratio = 0.0f;

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

// How declaration `to` differs from `from`, field by field ("lr 0.1 -> 0.05, dim 16 -> 32"; ""
// when they are equal). `settings`: the differences in the settings a resumed job may change (the
// optimizer's hyperparameters, not its type; wire; topk; nonfinite; a row lifecycle's settings,
// between two specs that both have one); `fixed`: in the rest (name, type, shape, dim, chunking,
// optimizer type, consistency, init, seed, whether it has a row lifecycle).
struct SpecChanges {
  std::string settings, fixed;
};
SpecChanges CompareSpecs(const TableSpec& from, const TableSpec& to);
// `into` with the settings CompareSpecs calls changeable taken from `from`.
void TakeSettings(const TableSpec& from, TableSpec* into);

// Parses "sync", "async" or "ssp:<s>" into consistency + staleness.
Status ParseConsistency(std::string_view text, Consistency* consistency, int32_t* staleness);
// Sets one of the spec's numeric options by name: an optimizer hyperparameter (kHyperParams in
// ferry/optimizers.h: "momentum", "nesterov" (0 or 1), "beta1", ...), "chunk_elems",
// "replicas_to_aggregate", "skip_nonfinite_rows" (0 or 1), and the row lifecycle's "admit_after",
// "admit_probability", "evict_after_steps", "max_rows", the disk tier's "disk_tier" (0 or 1), and
// gradient compression's "topk" (topk_ratio: 0, or in (0, 1]). For the C and Python APIs and --table.
// An unknown key is refused naming the nearest known one and listing them all.
Status SetSpecOption(TableSpec* spec, std::string_view key, double value);
// The keys SetSpecOption takes, in that order.
std::span<const std::string_view> SpecOptionKeys();
// Parses "f32", "fp16" or "bf16" (what --table wire=, ferry_spec_set_wire and Python's wire= take).
Status ParseWireFormat(std::string_view text, WireFormat* out);
std::string_view WireFormatName(WireFormat w);
// Parses "refuse" or "skip_rows".
Status ParseNonFinite(std::string_view text, NonFinite* out);
// Parses "zeros", "uniform", "normal" or "constant".
Status ParseInitType(std::string_view text, InitType* type);
std::string_view ConsistencyName(Consistency c);

// The 64-bit id of a table on the wire: FNV-1a of its name (stable across processes and builds).
uint64_t TableId(std::string_view name);

}  // namespace ferry
