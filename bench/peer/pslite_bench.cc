// bench/peer/pslite_bench.cc — the operations of bench/client_bench.cc (ferry-client-bench) on
// dmlc/ps-lite, through its public API (ps/ps.h: KVWorker, KVServer, SArray), for comparing
// Ferry with another parameter server on the same machine (bench/peer/run.sh; README.md beside
// it). Our own program: it is compiled against a ps-lite the user built by ps-lite's own
// instructions, and nothing of ps-lite is kept here.
//
// One binary; ps-lite picks the role from its environment (DMLC_ROLE = scheduler, server or
// worker, with DMLC_PS_ROOT_URI/PORT, DMLC_NUM_SERVER/WORKER, DMLC_NODE_HOST):
//   scheduler  ps-lite's rendezvous, nothing else.
//   server     a KVServer whose request handle keeps the tables a ferry-ps keeps for
//              client_bench.cc: dense tensors (zeros when first pushed) and sparse rows of dim 16
//              (zeros when first touched), plain SGD on push (w -= 0.01 * g) and the values
//              copied into the reply on pull, as ferry-ps copies a chunk into its reply frame.
//   worker     Google Benchmark over the same calls with the same payload bytes, named as
//              client_bench.cc names them (so one script reads both JSON files), plus
//              BM_PushPullDense (ps-lite's ZPushPull, Ferry's PushPullDense):
//                BM_PullDense/N, BM_PushDense/N, BM_PushPullDense/N   N = 1024, 262144, 4194304 floats
//                BM_PullSparse, BM_PushSparse   100,000 distinct ids i * 7919 + 13, dim 16
//              Before the benchmarks it checks, on tensors and rows of its own, that a push of
//              ones moves the pulled values by -0.01 (the server's work is the SGD step), and
//              exits 1 saying what differed.
//
//   DMLC_ROLE=worker ... pslite_bench [--benchmark_out=F --benchmark_out_format=json ...]
//
// How a ps-lite user lays tensors on keys (Postoffice::GetServerKeyRanges splits the 64-bit key
// space evenly over the servers):
//   dense   one key per server, the start of that server's key range plus the tensor's index,
//           each with `lens` = its slice of the tensor (n / servers floats, contiguous, the first
//           slices one float longer when n does not divide); values pushed and pulled contiguous,
//           zero-copy (ZPush / ZPull / ZPushPull on SArrays the benchmark keeps).
//   sparse  one key per row: id + the start of server (id % servers)'s range, sorted once before
//           the timing (with one server the keys are the ids themselves, already sorted). The
//           values are rows of 16 floats in key order, and no `lens` travels: ps-lite takes
//           vals.size() / keys.size() floats per key, so the payload is the ids' 8 bytes and the
//           rows' 64 bytes per row, as in Ferry's request. A ps-lite pull reply carries the keys
//           back beside the rows (ps-lite's protocol: the worker matches replies by key).
//
// Errors: ps-lite has no error reply, and it aborts (CHECK) on a reply that does not match the
// request. A request this server cannot serve (a pull of a dense key never pushed, a slice whose
// length changed, rows not of dim 16) is answered without values and named on stderr; the
// worker's ps-lite then aborts on it. bench/peer/run.sh bounds every process in time.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <absl/container/flat_hash_map.h>
#include <benchmark/benchmark.h>

#include "ps/ps.h"

namespace {

constexpr int kAppId = 0;               // the KVServer's and KVWorker's app id (one app)
constexpr int kCustomerId = 0;          // this process's only customer
constexpr int kCmdDense = 1;            // KVMeta::cmd of a dense request
constexpr int kCmdSparse = 2;           // and of a sparse one
constexpr float kLearningRate = 0.01f;  // Ferry's default SGD (OptimizerSpec::learning_rate)

constexpr int64_t kDenseSizes[] = {1024, 262144, 4194304};  // floats: 4 KiB, 1 MiB, 16 MiB
constexpr int64_t kSparseIds = 100000;
constexpr int kDim = 16;

// ---- server ------------------------------------------------------------------------------------

// The server's tables and its request handle. Thread-safety: ps-lite calls the handle on its
// customer thread only (one per KVServer), so the tables take no lock.
class Tables {
 public:
  void Handle(const ps::KVMeta& meta, const ps::KVPairs<float>& req, ps::KVServer<float>* server) {
    ps::KVPairs<float> res;
    const bool ok = meta.cmd == kCmdDense    ? Dense(meta, req, &res)
                    : meta.cmd == kCmdSparse ? Sparse(meta, req, &res)
                                             : Refuse("a request of unknown cmd " + std::to_string(meta.cmd));
    server->Response(meta, ok ? res : ps::KVPairs<float>());
  }

 private:
  static bool Refuse(const std::string& why) {
    std::fprintf(stderr, "pslite_bench server: %s: answered without values\n", why.c_str());
    return false;
  }

  // Floats of key i in a request: lens[i], or vals / keys when no lens travelled.
  static bool Lengths(const ps::KVPairs<float>& req, std::vector<size_t>* out) {
    const size_t keys = req.keys.size();
    out->assign(keys, 0);
    if (keys == 0) return true;
    if (!req.lens.empty()) {
      size_t sum = 0;
      for (size_t i = 0; i < keys; ++i) {
        if (req.lens[i] < 0) return false;
        (*out)[i] = static_cast<size_t>(req.lens[i]);
        sum += (*out)[i];
      }
      return sum == req.vals.size();
    }
    if (req.vals.size() % keys != 0) return false;
    std::fill(out->begin(), out->end(), req.vals.size() / keys);
    return true;
  }

  static void Sgd(float* w, const float* g, size_t n) {
    for (size_t i = 0; i < n; ++i) w[i] -= kLearningRate * g[i];
  }

  // Push: each key's slice, created as zeros on its first push, takes the SGD step. Pull: the
  // slices copied into one new reply array, in key order (with the request's lens when it had
  // them, as ZPushPull expects them back).
  bool Dense(const ps::KVMeta& meta, const ps::KVPairs<float>& req, ps::KVPairs<float>* res) {
    std::vector<size_t> lens;
    if (meta.push) {
      if (!Lengths(req, &lens)) return Refuse("a dense push whose values do not match its lens");
      const float* g = req.vals.data();
      for (size_t i = 0; i < req.keys.size(); ++i) {
        auto [it, made] = dense_.try_emplace(req.keys[i], lens[i], 0.0f);
        if (it->second.size() != lens[i]) return Refuse("a dense push of another length than the key has");
        Sgd(it->second.data(), g, lens[i]);
        g += lens[i];
      }
    }
    if (!meta.pull) return true;
    size_t total = 0;
    std::vector<const std::vector<float>*> slices;
    slices.reserve(req.keys.size());
    for (ps::Key k : req.keys) {
      auto it = dense_.find(k);
      if (it == dense_.end()) return Refuse("a dense pull of a key never pushed");
      slices.push_back(&it->second);
      total += it->second.size();
    }
    float* vals = new float[total];  // not zeroed: every float is written below
    res->vals.reset(vals, total, [](float* p) { delete[] p; });
    for (const auto* s : slices) vals = std::copy(s->begin(), s->end(), vals);
    res->keys = req.keys;
    if (!req.lens.empty()) res->lens = req.lens;
    return true;
  }

  // Rows of kDim floats, created as zeros when first touched (by a push or a pull), as a
  // ferry-ps sparse table with zero init does; pushes take the SGD step per row, pulls copy the
  // rows into one new reply array in key order.
  bool Sparse(const ps::KVMeta& meta, const ps::KVPairs<float>& req, ps::KVPairs<float>* res) {
    const size_t keys = req.keys.size();
    if (meta.push) {
      std::vector<size_t> lens;
      if (!Lengths(req, &lens) || (keys > 0 && req.vals.size() != keys * kDim)) {
        return Refuse("a sparse push whose rows are not of dim 16");
      }
      for (size_t i = 0; i < keys; ++i) Sgd(Row(req.keys[i]), req.vals.data() + i * kDim, kDim);
    }
    if (!meta.pull) return true;
    float* vals = new float[keys * kDim];
    res->vals.reset(vals, keys * kDim, [](float* p) { delete[] p; });
    for (size_t i = 0; i < keys; ++i) std::memcpy(vals + i * kDim, Row(req.keys[i]), kDim * sizeof(float));
    res->keys = req.keys;
    return true;
  }

  float* Row(ps::Key k) {
    auto [it, made] = row_of_.try_emplace(k, rows_.size() / kDim);
    if (made) rows_.resize(rows_.size() + kDim, 0.0f);
    return rows_.data() + it->second * kDim;
  }

  absl::flat_hash_map<ps::Key, std::vector<float>> dense_;  // a tensor's slice on this server, by key
  absl::flat_hash_map<ps::Key, size_t> row_of_;             // sparse key -> row index in rows_
  std::vector<float> rows_;                                 // row r: [r * kDim, (r + 1) * kDim)
};

// ---- worker ------------------------------------------------------------------------------------

ps::KVWorker<float>* worker = nullptr;  // the worker's, set before the benchmarks run

// A tensor or a set of rows as keys: the keys (sorted) and, for dense tensors, each key's length.
struct Keys {
  ps::SArray<ps::Key> keys;
  ps::SArray<int> lens;
};

// Dense tensor `index` of n floats: one key per server (see the file comment).
Keys DenseKeys(int index, int64_t n) {
  const auto& ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  const int64_t servers = static_cast<int64_t>(ranges.size());
  Keys k;
  for (int64_t s = 0; s < servers && s < n; ++s) {
    k.keys.push_back(ranges[static_cast<size_t>(s)].begin() + static_cast<ps::Key>(index));
    k.lens.push_back(static_cast<int>(n / servers + (s < n % servers ? 1 : 0)));
  }
  return k;
}

// Sparse ids as keys on their servers, sorted (see the file comment).
ps::SArray<ps::Key> SparseKeys(const std::vector<int64_t>& ids) {
  const auto& ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  std::vector<ps::Key> keys;
  keys.reserve(ids.size());
  for (int64_t id : ids) {
    keys.push_back(ranges[static_cast<size_t>(id) % ranges.size()].begin() + static_cast<ps::Key>(id));
  }
  std::sort(keys.begin(), keys.end());
  return ps::SArray<ps::Key>(keys);
}

std::vector<int64_t> BenchIds() {
  std::vector<int64_t> ids(kSparseIds);
  for (int64_t i = 0; i < kSparseIds; ++i) ids[static_cast<size_t>(i)] = i * 7919 + 13;
  return ids;
}

// The benchmark tensors' indices: 0, 1, 2 for kDenseSizes (CheckServer's is 16 + the worker's rank).
int DenseIndex(int64_t floats) {
  return static_cast<int>(std::find(std::begin(kDenseSizes), std::end(kDenseSizes), floats) - std::begin(kDenseSizes));
}

void BM_PullDense(benchmark::State& state) {
  const Keys k = DenseKeys(DenseIndex(state.range(0)), state.range(0));
  ps::SArray<float> out(static_cast<size_t>(state.range(0)));
  for (auto _ : state) worker->Wait(worker->ZPull(k.keys, &out, nullptr, kCmdDense));
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4);
}

void BM_PushDense(benchmark::State& state) {
  const Keys k = DenseKeys(DenseIndex(state.range(0)), state.range(0));
  const ps::SArray<float> grad(static_cast<size_t>(state.range(0)), 0.0f);
  for (auto _ : state) worker->Wait(worker->ZPush(k.keys, grad, k.lens, kCmdDense));
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4);
}

// Payload bytes counted once per direction, as bench/ferry_bench.cc counts a push+pull.
void BM_PushPullDense(benchmark::State& state) {
  Keys k = DenseKeys(DenseIndex(state.range(0)), state.range(0));
  const ps::SArray<float> grad(static_cast<size_t>(state.range(0)), 0.0f);
  ps::SArray<float> out(static_cast<size_t>(state.range(0)));
  for (auto _ : state) worker->Wait(worker->ZPushPull(k.keys, grad, &out, &k.lens, kCmdDense));
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4 * 2);
}

void BM_PullSparse(benchmark::State& state) {
  const ps::SArray<ps::Key> keys = SparseKeys(BenchIds());
  ps::SArray<float> rows(keys.size() * kDim);
  for (auto _ : state) worker->Wait(worker->ZPull(keys, &rows, nullptr, kCmdSparse));
  state.SetItemsProcessed(state.iterations() * kSparseIds);
}

void BM_PushSparse(benchmark::State& state) {
  const ps::SArray<ps::Key> keys = SparseKeys(BenchIds());
  const ps::SArray<float> grads(keys.size() * kDim, 0.0f);
  for (auto _ : state) worker->Wait(worker->ZPush(keys, grads, {}, kCmdSparse));
  state.SetItemsProcessed(state.iterations() * kSparseIds);
}

// The order and units of client_bench.cc; push+pull last, so the first nine run as there.
BENCHMARK(BM_PullDense)->Arg(1024)->Arg(262144)->Arg(4194304)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PushDense)->Arg(1024)->Arg(262144)->Arg(4194304)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PullSparse)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PushSparse)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PushPullDense)->Arg(1024)->Arg(262144)->Arg(4194304)->UseRealTime()->Unit(benchmark::kMicrosecond);

// How many of `got` differ from `want` (exactly: one SGD step from zeros is exact in float).
size_t Mismatches(const ps::SArray<float>& got, float want) {
  return static_cast<size_t>(std::count_if(got.begin(), got.end(), [want](float v) { return v != want; }));
}

// Untimed, on a tensor and rows no benchmark touches (this worker's own, so that workers do not
// see each other's steps): zeros at first, -0.01 after one push of ones. Returns what differed,
// or "" when the server did the SGD step.
std::string CheckServer(int rank) {
  constexpr int64_t kCheckFloats = 1000;
  Keys dense = DenseKeys(16 + rank, kCheckFloats);
  ps::SArray<float> zeros(kCheckFloats, 0.0f), ones(kCheckFloats, 1.0f), out(kCheckFloats);
  worker->Wait(worker->ZPush(dense.keys, zeros, dense.lens, kCmdDense));  // creates the tensor
  worker->Wait(worker->ZPull(dense.keys, &out, nullptr, kCmdDense));
  if (size_t bad = Mismatches(out, 0.0f)) return "dense: " + std::to_string(bad) + " values not 0 after a zero push";
  worker->Wait(worker->ZPushPull(dense.keys, ones, &out, &dense.lens, kCmdDense));
  if (size_t bad = Mismatches(out, -kLearningRate)) {
    return "dense: " + std::to_string(bad) + " values not -0.01 after a push of ones (push+pull)";
  }
  // Rows past every benchmark id, one per worker rank and a few apart.
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 8; ++i) ids.push_back(int64_t{1} << 40 | (int64_t{rank} << 8) | i);
  const ps::SArray<ps::Key> keys = SparseKeys(ids);
  ps::SArray<float> rows(keys.size() * kDim), grads(keys.size() * kDim, 1.0f);
  worker->Wait(worker->ZPull(keys, &rows, nullptr, kCmdSparse));
  if (size_t bad = Mismatches(rows, 0.0f)) return "sparse: " + std::to_string(bad) + " values not 0 in new rows";
  worker->Wait(worker->ZPush(keys, grads, {}, kCmdSparse));
  worker->Wait(worker->ZPull(keys, &rows, nullptr, kCmdSparse));
  if (size_t bad = Mismatches(rows, -kLearningRate)) {
    return "sparse: " + std::to_string(bad) + " values not -0.01 after a push of ones";
  }
  return "";
}

int RunWorker() {
  ps::KVWorker<float> kv(kAppId, kCustomerId);
  worker = &kv;
  // The tensors exist once pushed (a pull carries no lengths): zeros pushed once, as Declare
  // creates Ferry's tables with zeros.
  for (int64_t n : kDenseSizes) {
    const Keys k = DenseKeys(DenseIndex(n), n);
    kv.Wait(kv.ZPush(k.keys, ps::SArray<float>(static_cast<size_t>(n), 0.0f), k.lens, kCmdDense));
  }
  const int rank = ps::MyRank();
  if (const std::string bad = CheckServer(rank); !bad.empty()) {
    std::fprintf(stderr, "pslite_bench worker %d: the server's SGD check failed: %s\n", rank, bad.c_str());
    worker = nullptr;
    return 1;
  }
  benchmark::AddCustomContext("pslite_servers", std::to_string(ps::NumServers()));
  benchmark::AddCustomContext("pslite_workers", std::to_string(ps::NumWorkers()));
  benchmark::AddCustomContext("pslite_worker_rank", std::to_string(rank));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  worker = nullptr;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Flags first (a worker's are Google Benchmark's; the other roles take none), so that a bad
  // flag fails before this node joins; ps-lite's own configuration is its environment.
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  // Every node joins, each server sets its request handle, and only then does anyone go on: with
  // a plain ps::Start a worker can reach a server whose handle is not set yet, which ps-lite
  // aborts on (seen with 2 servers and 2 workers).
  ps::StartAsync(kCustomerId, argv[0]);
  ps::Postoffice::Get()->Barrier(kCustomerId, ps::kScheduler + ps::kServerGroup + ps::kWorkerGroup);
  std::unique_ptr<Tables> tables;
  std::unique_ptr<ps::KVServer<float>> server;
  if (ps::IsServer()) {
    tables = std::make_unique<Tables>();
    server = std::make_unique<ps::KVServer<float>>(kAppId);
    server->set_request_handle([t = tables.get()](const ps::KVMeta& meta, const ps::KVPairs<float>& req,
                                                  ps::KVServer<float>* s) { t->Handle(meta, req, s); });
  }
  ps::Postoffice::Get()->Barrier(kCustomerId, ps::kScheduler + ps::kServerGroup + ps::kWorkerGroup);
  int rc = 0;
  if (ps::IsServer()) {
    ps::Finalize(kCustomerId, true);  // serves until every node finalizes
    return 0;
  }
  if (ps::IsWorker()) rc = RunWorker();
  ps::Finalize(kCustomerId, true);
  return rc;
}
