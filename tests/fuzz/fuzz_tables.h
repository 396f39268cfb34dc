// tests/fuzz/fuzz_tables.h — the tables the server fuzzer declares (and the seeds address): a
// sync dense table, an async dense one (Adam), an async sparse one (Adagrad), an ssp sparse one
// that skips rows holding NaN or Inf; 1.6's compressed tables: an async dense one with top-k
// pushes of fp16 values (k = 4 of each 16-element chunk) and an async sparse one in bf16.
#pragma once

#include <vector>

#include "ferry/table_spec.h"

namespace ferry::fuzz {

inline std::vector<TableSpec> FuzzTables() {
  std::vector<TableSpec> t(6);
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
  t[4].name = "dense_topk_fp16";
  t[4].shape = {40};
  t[4].chunk_elems = 16;  // chunks of 16, 16 and 8: k = 4, 4, 2
  t[4].consistency = Consistency::kAsync;
  t[4].wire = WireFormat::kF16;
  t[4].topk_ratio = 0.25f;
  t[5].name = "sparse_bf16";
  t[5].type = TableType::kSparse;
  t[5].dim = 4;
  t[5].consistency = Consistency::kAsync;
  t[5].wire = WireFormat::kBf16;
  for (auto& s : t) s.shape = s.type == TableType::kSparse ? std::vector<int64_t>{} : s.shape;
  return t;
}

}  // namespace ferry::fuzz
