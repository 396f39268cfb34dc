// bench/delta_checkpoint_bench.cc — what a delta checkpoint costs against a full one (issue 36):
// the pause (ps::SnapshotShard, the server's only stop) and the bytes and time of the write
// (ps::WriteShardImage: CRCs, write, fsync, rename), at shares of the rows changed since the
// previous checkpoint of 0.1%, 1%, 10% and 100%, beside the disk's own rate for the full shard's
// bytes (write + fsync, no CRC) in the same folder; and the restore (ps::ReadCheckpoint) of a full
// checkpoint against a full one followed by 10 deltas of 1% each.
//
// The shard: one server's sparse Adagrad table of --rows rows of dim 16 (default 10,000,000: 1.28
// GB of values and accumulators), ids spread over 63 bits like hashed features, every row
// updated once. A "change" is one ApplyRows push of a gradient to the chosen rows (ids drawn with
// a stride, so spread over the table), as training does; tracking is on, as on a server started
// with --checkpoint-deltas.
//
// Each round: a full snapshot and write (which also resets the tracking), then for each share in
// an order that rotates from round to round: the push, a delta snapshot and write. A round's
// figures go to stderr; stdout gets JSON with every round's and the medians. Files go into a
// fresh folder under --dir (default /tmp), each removed once timed. Peak memory: about 3x the
// shard (the table, a full image, and the restore's copy).
//
//   ferry-delta-ckpt-bench [--rows N] [--rounds R] [--dir PATH] > results.json
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/messages/placement.h"
#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "internal/checkpoint.h"
#include "internal/table_registry.h"

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

constexpr int64_t kDim = 16;
constexpr double kShares[] = {0.001, 0.01, 0.1, 1.0};

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.empty() ? 0.0 : v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "ferry-delta-ckpt-bench: %s\n", what.c_str());
  std::exit(1);
}

int64_t RowId(int64_t i) { return static_cast<int64_t>(placement::Mix64(static_cast<uint64_t>(i)) >> 1); }

// Pushes a gradient to `share` of the table's rows: every (1 / share)-th row, from `offset`.
void Change(ps::SparseShard& s, int64_t rows, double share, int64_t offset) {
  const int64_t stride = std::max<int64_t>(1, static_cast<int64_t>(1.0 / share + 0.5));
  std::vector<int64_t> ids;
  std::vector<ps::RowIndex> scratch;
  constexpr size_t kBatch = 65536;
  std::vector<float> grads(kBatch * kDim, 0.01f);
  for (int64_t i = offset % stride; i < rows; i += stride) {
    ids.push_back(RowId(i));
    if (ids.size() == kBatch) {
      s.ApplyRows(ids, grads.data(), &scratch);
      ids.clear();
    }
  }
  if (!ids.empty()) s.ApplyRows(ids, grads.data(), &scratch);
  ++s.version;
}

// The disk's rate as a checkpoint uses it: `bytes` written to a new file, fsynced, renamed.
double RawWriteSeconds(const fs::path& path, const std::vector<char>& data) {
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Die("cannot create " + path.string());
  for (size_t at = 0; at < data.size();) {
    const ssize_t w = ::write(fd, data.data() + at, data.size() - at);
    if (w <= 0) Die("cannot write " + path.string() + ": " + std::strerror(errno));
    at += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) Die("cannot fsync " + path.string());
  const double s = Since(t0);
  fs::remove(path);
  return s;
}

struct Saved {
  double pause_s = 0, write_s = 0;
  uint64_t bytes = 0;
  ps::ShardFile file;
};

Saved Save(const fs::path& dir, int64_t step, ps::TableRegistry& tables, const ps::DeltaOf* delta) {
  Saved out;
  const auto t0 = Clock::now();
  ps::ShardImage image = ps::SnapshotShard(tables, delta, /*track=*/true);
  out.pause_s = Since(t0);
  const auto t1 = Clock::now();
  auto f = ps::WriteShardImage(dir.string(), 0, 1, step, std::move(image));
  out.write_s = Since(t1);
  if (!f.ok()) Die(f.status().ToString());
  out.bytes = f->bytes;
  out.file = *f;
  return out;
}

}  // namespace
}  // namespace ferry::bench

int main(int argc, char** argv) {
  using namespace ferry;
  using namespace ferry::bench;
  int64_t rows = 10'000'000;
  int rounds = 3;
  std::string root = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--rows") rows = std::atoll(argv[i + 1]);
    else if (flag == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (flag == "--dir") root = argv[i + 1];
    else Die("unknown flag " + flag);
  }
  if (rows < 1000 || rounds < 1) Die("--rows >= 1000 and --rounds >= 1");
  const fs::path dir = fs::path(root) / ("ferry-delta-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);

  ps::TableRegistry tables(0, 1);
  TableSpec spec;
  spec.name = "emb";
  spec.type = TableType::kSparse;
  spec.dim = kDim;
  spec.optimizer.type = OptimizerType::kAdagrad;
  if (Status s = tables.Create(spec, TableId(spec.name), 1); !s.ok()) Die(s.ToString());
  ps::SparseShard& shard = *(*tables.Find(TableId(spec.name), TableType::kSparse))->sparse;
  std::fprintf(stderr, "building %lld rows of dim %lld\n", static_cast<long long>(rows), static_cast<long long>(kDim));
  Change(shard, rows, 1.0, 0);  // every row made and updated once

  Json out;
  out["rows"] = rows;
  out["dim"] = kDim;
  out["optimizer"] = "adagrad";
  out["dir"] = root;
  std::map<std::string, std::vector<double>> series;
  int64_t step = 0;
  for (int round = 0; round < rounds; ++round) {
    Json r;
    const Saved full = Save(dir, ++step, tables, nullptr);
    std::vector<char> raw(full.bytes, 'x');
    const double raw_s = RawWriteSeconds(dir / "raw", raw);
    r["full"] = {{"pause_s", full.pause_s}, {"write_s", full.write_s}, {"bytes", full.bytes}};
    r["raw_write_s"] = raw_s;
    series["full_pause_s"].push_back(full.pause_s);
    series["full_write_s"].push_back(full.write_s);
    series["raw_write_s"].push_back(raw_s);
    std::fprintf(stderr, "round %d: full %.1f MB, pause %.3f s, write %.3f s; raw write %.3f s\n", round,
                 static_cast<double>(full.bytes) / 1e6, full.pause_s, full.write_s, raw_s);
    ps::DeltaOf previous{step, full.file};
    fs::path previous_path = dir / full.file.name;
    for (size_t k = 0; k < std::size(kShares); ++k) {
      const double share = kShares[(k + static_cast<size_t>(round)) % std::size(kShares)];
      Change(shard, rows, share, round * 7 + static_cast<int64_t>(k));
      const Saved d = Save(dir, ++step, tables, &previous);
      fs::remove(previous_path);
      previous = {step, d.file};
      previous_path = dir / d.file.name;
      char key[32];
      std::snprintf(key, sizeof key, "%g", share * 100);
      r["delta"][key] = {{"pause_s", d.pause_s}, {"write_s", d.write_s}, {"bytes", d.bytes}};
      series[std::string("delta_") + key + "_pause_s"].push_back(d.pause_s);
      series[std::string("delta_") + key + "_write_s"].push_back(d.write_s);
      series[std::string("delta_") + key + "_bytes"].push_back(static_cast<double>(d.bytes));
      std::fprintf(stderr, "round %d: delta of %s%% of rows: %.1f MB, pause %.3f s, write %.3f s\n", round, key,
                   static_cast<double>(d.bytes) / 1e6, d.pause_s, d.write_s);
    }
    fs::remove(previous_path);
    out["rounds"].push_back(r);
  }

  // Restore: a full checkpoint, then one full + 10 deltas of 1% each, read back whole.
  const fs::path one = dir / "one", chain = dir / "chain";
  {
    Saved base = Save(chain, 100, tables, nullptr);
    if (!ps::WriteManifest(chain.string(), 100, {base.file}, "bench", 100).ok()) Die("manifest");
    ps::DeltaOf previous{100, base.file};
    for (int i = 1; i <= 10; ++i) {
      Change(shard, rows, 0.01, 1000 + i);
      Saved d = Save(chain, 100 + i, tables, &previous);
      auto linked = ps::WithChain(chain.string(), d.file);
      if (!linked.ok()) Die(linked.status().ToString());
      if (!ps::WriteManifest(chain.string(), 100 + i, {*linked}, "bench", 100).ok()) Die("manifest");
      previous = {100 + i, d.file};
    }
    Saved whole = Save(one, 110, tables, nullptr);
    if (!ps::WriteManifest(one.string(), 110, {whole.file}, "bench", 1).ok()) Die("manifest");
  }
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const bool chained = (k + round) % 2 == 1;
      const auto t0 = Clock::now();
      auto c = ps::ReadCheckpoint((chained ? chain : one).string());
      const double s = Since(t0);
      if (!c.ok()) Die(c.status().ToString());
      if (c->step != 110) Die("restored step " + std::to_string(c->step));
      series[chained ? "restore_chain_s" : "restore_full_s"].push_back(s);
      std::fprintf(stderr, "round %d: restore %s: %.3f s\n", round, chained ? "full + 10 deltas" : "full", s);
    }
  }
  for (const auto& [name, v] : series) {
    out["series"][name] = v;
    out["median"][name] = Median(v);
  }
  fs::remove_all(dir);
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}
