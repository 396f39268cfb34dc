// ferry/local_tables.h — one process's whole copy of a set of tables, initialised and updated
// by the servers' own code (initial values, optimizers, sparse rows created on first touch): what
// a single ferry-ps holding every chunk and row would hold. For the trainer's --local reference
// run, and for tools that need the servers' arithmetic without a server.
//
// Thread-safety: none; use one LocalTables from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "ferry/status.h"
#include "ferry/table_spec.h"

namespace ferry::ps {

class LocalTables {
 public:
  static std::unique_ptr<LocalTables> Create();
  virtual ~LocalTables() = default;

  // Adds a table with its initial values (InvalidArgument: an invalid spec; AlreadyExists: a
  // name declared before).
  virtual Status Declare(const TableSpec& spec) = 0;

  // Dense tables: `out` / `grad` hold the table's num_elements() floats. `step` is the 1-based
  // update count (Adam's bias correction), as a server's chunk counts it.
  virtual Status ReadDense(std::string_view table, std::span<float> out) = 0;
  virtual Status ApplyDense(std::string_view table, std::span<const float> grad, int64_t step) = 0;

  // Sparse tables: `rows` / `grads` hold ids.size() x dim floats, row i for ids[i]. A row is
  // created (with its initial value) when first read or updated; each row counts its own updates.
  // A table with row lifecycle settings (TableSpec::has_lifecycle) admits and evicts rows as a
  // server's shard does (its clock: one tick an ApplyRows call).
  virtual Status ReadRows(std::string_view table, std::span<const int64_t> ids, std::span<float> rows) = 0;
  virtual Status ApplyRows(std::string_view table, std::span<const int64_t> ids, std::span<const float> grads) = 0;
};

}  // namespace ferry::ps
