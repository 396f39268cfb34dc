// tests/fuzz/fuzz_tables.h — the tables the server fuzzer declares (and the seeds address): a
// sync dense table, an async dense one (Adam), an async sparse one (Adagrad), an ssp sparse one
// that skips rows holding NaN or Inf.
#pragma once

#include <vector>

#include "ferry/table_spec.h"

namespace ferry::fuzz {

inline std::vector<TableSpec> FuzzTables() {
  std::vector<TableSpec> t(4);
  t[0].name = "dense_sync";
  t[0].shape = {64};
  t[0].chunk_elems = 16;
  t[0].consistency = Consistency::kSync;
  t[1].name = "dense_async";
  t[1].shape = {32};
  t[1].chunk_elems = 16;
  t[1].consistency = Consistency::kAsync;
  t[1].optimizer.type = OptimizerType::kAdam;
  t[2].name = "sparse";
  t[2].type = TableType::kSparse;
  t[2].dim = 4;
  t[2].consistency = Consistency::kAsync;
  t[2].optimizer.type = OptimizerType::kAdagrad;
  t[3].name = "sparse_skip";
  t[3].type = TableType::kSparse;
  t[3].dim = 2;
  t[3].consistency = Consistency::kSsp;
  t[3].staleness = 1;
  t[3].nonfinite = NonFinite::kSkipRows;
  for (auto& s : t) s.shape = s.type == TableType::kSparse ? std::vector<int64_t>{} : s.shape;
  return t;
}

}  // namespace ferry::fuzz
