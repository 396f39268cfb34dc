// ps/server/internal/init.h — initial parameter values. A value depends only on (seed, table id,
// element index or row id, column), never on which server holds it, so any number of servers
// starts from the same model.
#pragma once

#include <cstdint>

#include "ferry/table_spec.h"

namespace ferry::ps {

// Fills out[0, n) with the initial values of elements first .. first+n-1 of a dense table, or
// of row `id`'s columns 0 .. n-1 of a sparse table (pass first = id * dim, which callers do
// through InitSparseRow).
void InitDense(const TableSpec& spec, uint64_t table_id, int64_t first, float* out, int64_t n);
void InitSparseRow(const TableSpec& spec, uint64_t table_id, int64_t id, float* out);

}  // namespace ferry::ps
