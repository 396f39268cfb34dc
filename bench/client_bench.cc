// bench/client_bench.cc — ferry-client-bench: the C++ client's pull and push against servers
// that are already running (separate ferry-ps processes, as users run them), for comparing
// other front ends of the same client with it: bench/python_vs_cpp.py runs this binary and the
// Python module against the same ferry-ps, alternating, and records their ratios in RESULTS.md.
//
//   ferry-client-bench --servers=tcp://127.0.0.1:7470[,...] [--table-prefix=cpp_]
//                      [--rank=R --num-workers=W] [benchmark flags]
//
// Each benchmark is one operation, submitted and waited for: dense pull / push / push+pull of
// 4 KiB, 1 MiB and 16 MiB (tables of that many floats, default chunking), the pull and push+pull
// also with the values left where they arrived (PullDenseView), and sparse pull / push
// of 100,000 distinct ids of dim 16 (ids i * 7919 + 13, the same in every front end), as a
// caller who does not say they are distinct (deduplicated on every call) and one who does. Several
// processes at once (bench/peer/run.sh) each take a rank of their own; every table is async, so
// no worker waits for another.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <benchmark/benchmark.h>

#include "ferry/client.h"

namespace {

std::unique_ptr<ferry::Client> client;
std::string prefix = "cpp_";

constexpr int64_t kSparseIds = 100000;
constexpr int64_t kDim = 16;

std::vector<int64_t> SparseIds() {
  std::vector<int64_t> ids(kSparseIds);
  for (int64_t i = 0; i < kSparseIds; ++i) ids[static_cast<size_t>(i)] = i * 7919 + 13;
  return ids;
}

std::string DenseTable(int64_t floats) { return prefix + "dense_" + std::to_string(floats); }

void Check(benchmark::State& state, const ferry::Status& s) {
  if (!s.ok()) state.SkipWithError(s.ToString().c_str());
}

void BM_PullDense(benchmark::State& state) {
  std::vector<float> out(static_cast<size_t>(state.range(0)));
  const std::string table = DenseTable(state.range(0));
  for (auto _ : state) Check(state, client->PullDense(table, out, 0).wait());
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4);
}

void BM_PushDense(benchmark::State& state) {
  std::vector<float> grad(static_cast<size_t>(state.range(0)), 0.0f);
  const std::string table = DenseTable(state.range(0));
  for (auto _ : state) Check(state, client->PushDense(table, grad, 0).wait());
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4);
}

void BM_PushPullDense(benchmark::State& state) {
  std::vector<float> grad(static_cast<size_t>(state.range(0)), 0.0f), out(grad.size());
  const std::string table = DenseTable(state.range(0));
  const ferry::DenseIn in{table, grad};
  const ferry::DenseOut o{table, out};
  for (auto _ : state) {
    Check(state,
          client->PushPullDense(std::span<const ferry::DenseIn>(&in, 1), std::span<const ferry::DenseOut>(&o, 1), 0)
              .wait());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4 * 2);
}

// The same pulls with the values left where they arrived (PullDenseView, PushPullDenseView): no
// copy into a buffer of the caller's. Each call's values are dropped at the next call.
void BM_PullDenseView(benchmark::State& state) {
  const std::string table = DenseTable(state.range(0));
  const std::string_view name = table;
  std::shared_ptr<const ferry::PulledDense> values;
  for (auto _ : state) Check(state, client->PullDenseView(std::span(&name, 1), 0, &values).wait());
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4);
}

void BM_PushPullDenseView(benchmark::State& state) {
  std::vector<float> grad(static_cast<size_t>(state.range(0)), 0.0f);
  const std::string table = DenseTable(state.range(0));
  const ferry::DenseIn in{table, grad};
  std::shared_ptr<const ferry::PulledDense> values;
  for (auto _ : state) Check(state, client->PushPullDenseView(std::span(&in, 1), 0, &values).wait());
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4 * 2);
}

void BM_PullSparse(benchmark::State& state) {
  const std::vector<int64_t> ids = SparseIds();
  std::vector<float> rows(ids.size() * kDim);
  for (auto _ : state) Check(state, client->PullSparse(prefix + "sparse", ids, rows, 0).wait());
  state.SetItemsProcessed(state.iterations() * kSparseIds);
}

void BM_PushSparse(benchmark::State& state) {
  const std::vector<int64_t> ids = SparseIds();
  std::vector<float> grads(ids.size() * kDim, 0.0f);
  for (auto _ : state) Check(state, client->PushSparse(prefix + "sparse", ids, grads, 0).wait());
  state.SetItemsProcessed(state.iterations() * kSparseIds);
}

// The same ids, said to be distinct (SparseIds::kDistinct): no deduplication, and with one server
// the caller's buffers travel as they are.
void BM_PullSparseDistinct(benchmark::State& state) {
  const std::vector<int64_t> ids = SparseIds();
  std::vector<float> rows(ids.size() * kDim);
  const std::string table = prefix + "sparse";
  const ferry::SparseOut t{table, ids, rows};
  for (auto _ : state) {
    Check(state, client->PullSparse(std::span<const ferry::SparseOut>(&t, 1), 0, ferry::SparseIds::kDistinct).wait());
  }
  state.SetItemsProcessed(state.iterations() * kSparseIds);
}

void BM_PushSparseDistinct(benchmark::State& state) {
  const std::vector<int64_t> ids = SparseIds();
  std::vector<float> grads(ids.size() * kDim, 0.0f);
  const std::string table = prefix + "sparse";
  const ferry::SparseIn t{table, ids, grads};
  for (auto _ : state) {
    Check(state, client->PushSparse(std::span<const ferry::SparseIn>(&t, 1), 0, ferry::SparseIds::kDistinct).wait());
  }
  state.SetItemsProcessed(state.iterations() * kSparseIds);
}

// 4 KiB, 1 MiB, 16 MiB of floats.
BENCHMARK(BM_PullDense)->Arg(1024)->Arg(262144)->Arg(4194304)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PushDense)->Arg(1024)->Arg(262144)->Arg(4194304)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PushPullDense)->Arg(1024)->Arg(262144)->Arg(4194304)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PullDenseView)->Arg(1024)->Arg(262144)->Arg(4194304)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PushPullDenseView)->Arg(1024)->Arg(262144)->Arg(4194304)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PullSparse)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PushSparse)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PullSparseDistinct)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PushSparseDistinct)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> servers;
  int rank = 0, num_workers = 1;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.starts_with("--servers=")) {
      std::string list(a.substr(10));
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = list.find(',', at);
        servers.push_back(list.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
    } else if (a.starts_with("--rank=")) {
      rank = std::atoi(argv[i] + 7);
    } else if (a.starts_with("--num-workers=")) {
      num_workers = std::atoi(argv[i] + 14);
    } else if (a.starts_with("--table-prefix=")) {
      prefix = std::string(a.substr(15));
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 2;
  if (servers.empty()) {
    std::fprintf(stderr, "ferry-client-bench: --servers=tcp://host:port[,...] is required\n");
    return 2;
  }
  ferry::ClientOptions o;
  o.servers = servers;
  o.rank = rank;
  o.num_workers = num_workers;
  auto c = ferry::Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "ferry-client-bench: %s\n", c.status().ToString().c_str());
    return 1;
  }
  client = std::move(*c);
  for (int64_t floats : {1024, 262144, 4194304}) {
    ferry::TableSpec t;
    t.name = DenseTable(floats);
    t.shape = {floats};
    if (auto s = client->Declare(t); !s.ok()) return std::fprintf(stderr, "declare: %s\n", s.ToString().c_str()), 1;
  }
  ferry::TableSpec sparse;
  sparse.name = prefix + "sparse";
  sparse.type = ferry::TableType::kSparse;
  sparse.dim = kDim;
  if (auto s = client->Declare(sparse); !s.ok()) return std::fprintf(stderr, "declare: %s\n", s.ToString().c_str()), 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  client.reset();
  return 0;
}
