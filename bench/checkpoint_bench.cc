// bench/checkpoint_bench.cc — what a checkpoint costs (issue 14): the pause and the write rate,
// each against its own limit measured in the same run. Results and how to run it:
// bench/results/HISTORY.md, "Checkpoints (issue 14)".
//
// Shards (one server's tables, built in this process):
//   dense_adam_64MiB     a dense Adam table of 16M floats (64 MiB of parameters, 128 MiB of state)
//   dense_adam_512MiB    the same with 128M floats (512 MiB of parameters, 1 GiB of state)
//   sparse_adagrad_4Mx16 a sparse Adagrad table of 4,194,304 rows of dim 16 (256 MiB of values,
//                        256 MiB of accumulators; ids spread over 63 bits like hashed features)
//
// Groups, each over every shard:
//   pause/<shard>   ps::SnapshotShard (the server's only stop, on its I/O thread) against a
//                   plain memcpy of the table's data (dense: the chunks' params and state; sparse:
//                   the rows' values and state, contiguous runs as the shard stores them) into
//                   a buffer already faulted in (`memcpy_warm`: the memory-bandwidth limit), and
//                   into fresh memory from the kernel, as the snapshot's image is new memory each
//                   time: 4 KiB pages faulted in one by one (`memcpy_fresh`, what the image gets),
//                   advised to use transparent huge pages (`memcpy_fresh_thp`), or faulted in by
//                   mmap(MAP_POPULATE) (`memcpy_fresh_populate`); each fresh variant's munmap is
//                   timed apart (`*_free_ms`). Sparse shards: `rows_sort_ms` times what the
//                   snapshot does first (every (id, row) pair gathered and sorted by id).
//                   Rates are bytes per second of each copy's own bytes: the image's for the
//                   snapshot, the table data's for the memcpys (the same within 0.001% for dense
//                   tables; a sparse image also holds every row's id and update count, 1/8 more).
//                   `snapshot_vs_memcpy` = snapshot rate / memcpy_warm rate, `snapshot_vs_fresh`
//                   = snapshot rate / memcpy_fresh rate.
//   write/<shard>   ps::WriteShardImage of a snapshot (fills in each block's CRC-32, writes
//                   <name>.tmp, fsync, rename, fsync the folder) against the same bytes written
//                   the same way without any CRC (open, write(), fsync, close, rename, fsync the
//                   folder: the disk's rate as a checkpoint uses it), in the same folder;
//                   `crc_pass_s` is one zlib crc32 pass over the image alone. WriteShardImage
//                   takes the image by value, so its time includes freeing it (see `*_free_ms`).
//                   `ckpt_vs_disk` = checkpoint MB/s / raw MB/s.
//   worker/<shard>  an in-process ferry::Server (tcp://127.0.0.1, its own context, one compute
//                   thread) holding the shard plus a small async table of 1,024 floats (4 KiB);
//                   worker 0 does back-to-back PushPullDense round trips on the small table the
//                   whole time, and worker 1 asks for checkpoints (Client::Checkpoint). Each
//                   iteration is a quiet window and a checkpoint window (the order alternates; a
//                   quiet window lasts as long as the last checkpoint window); round trips are
//                   assigned to the window they end in.
//                   Counters: median, p99 (nearest rank), max latency and the longest gap
//                   between two completions, in each kind of window; in checkpoint windows also
//                   the second longest gap of a window (the longest is the pause; this is the
//                   worst stall besides it), and the server's own pause (CheckpointShard::paused)
//                   and save time (request to durable shard, as worker 1 sees it).
//
// Within a round of pause/ and write/ the compared variants run one after another in an order
// that rotates from round to round (this is a noisy 2-core VM); the counters are medians over the
// rounds, after one untimed warm-up round (its snapshot and checkpoint write are kept apart as
// `*_first`: the first use of memory this process has not touched yet is slow on this VM). Each
// round's figures go to stderr. Time per iteration (manual time) is the snapshot's, the checkpoint
// write's, and the checkpoint window's respectively.
//
// Files: every file goes into a fresh folder made under --dir=PATH (default /tmp: use the
// folder, or a folder on the disk, that checkpoints would go to), removed at exit, and each
// checkpoint file is removed as soon as it has been timed. Peak memory is about 3x the largest
// shard (shard, image, and the memcpy target or raw-write buffer): 4.5 GiB.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "ferry/client.h"
#include "ferry/messages/transport.h"
#include "ferry/server.h"
#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "internal/checkpoint.h"
#include "internal/table_registry.h"

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Bounds on every wait, so that a broken build fails a benchmark instead of hanging the run.
constexpr auto kRequestTimeout = std::chrono::seconds(120);
constexpr auto kWaitTimeout = std::chrono::seconds(150);

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Nearest-rank quantile q in (0, 1] of `v` (sorted here).
double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

double Max(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

int64_t MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

void Fail(benchmark::State& state, const Status& s) {
  if (!state.error_occurred()) state.SkipWithError(s.ToString().c_str());
}

// ---- the shards --------------------------------------------------------------------------------

struct ShardCase {
  const char* name;
  bool sparse;
  int64_t elems;  // dense: parameters
  int64_t rows;   // sparse: rows of kSparseDim
  int pause_rounds;
  int write_rounds;
  int worker_rounds;
};

constexpr int64_t kSparseDim = 16;
constexpr ShardCase kShards[] = {
    {"dense_adam_64MiB", false, int64_t{16} << 20, 0, 7, 5, 3},
    {"dense_adam_512MiB", false, int64_t{128} << 20, 0, 5, 5, 3},
    {"sparse_adagrad_4Mx16", true, 0, int64_t{4} << 20, 5, 5, 3},
};

// Row i's id: spread over 63 bits (Fibonacci hashing), as hashed feature ids are.
int64_t SparseId(int64_t i) { return static_cast<int64_t>((static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull) >> 1); }

TableSpec SpecOf(const ShardCase& c) {
  TableSpec spec;
  spec.name = c.name;
  spec.consistency = Consistency::kAsync;
  spec.init = InitType::kUniform;
  spec.init_scale = 0.01f;
  spec.seed = 1;
  if (c.sparse) {
    spec.type = TableType::kSparse;
    spec.dim = kSparseDim;
    spec.optimizer.type = OptimizerType::kAdagrad;
  } else {
    spec.type = TableType::kDense;
    spec.shape = {c.elems};
    spec.optimizer.type = OptimizerType::kAdam;
  }
  return spec;
}

// The shard of a one-server job: every chunk and every row is here.
StatusOr<std::unique_ptr<ps::TableRegistry>> BuildShard(const ShardCase& c) {
  auto tables = std::make_unique<ps::TableRegistry>(0, 1);
  const TableSpec spec = SpecOf(c);
  FERRY_RETURN_IF_ERROR(tables->Create(spec, TableId(spec.name), 1));
  if (c.sparse) {
    FERRY_ASSIGN_OR_RETURN(ps::Table * t, tables->Find(TableId(spec.name), TableType::kSparse));
    for (int64_t i = 0; i < c.rows; ++i) t->sparse->FindOrCreate(SparseId(i));
  }
  return tables;
}

// The table data of a shard as contiguous spans (dense: each chunk's params and state; sparse:
// runs of rows that lie next to each other in the shard's blocks, in index order).
std::vector<std::span<const char>> DataSpans(const ps::TableRegistry& tables) {
  std::vector<std::span<const char>> spans;
  auto add = [&](const float* p, size_t floats) {
    const char* b = reinterpret_cast<const char*>(p);
    const size_t n = floats * sizeof(float);
    if (n == 0) return;
    if (!spans.empty() && spans.back().data() + spans.back().size() == b) {
      spans.back() = std::span<const char>(spans.back().data(), spans.back().size() + n);
    } else {
      spans.emplace_back(b, n);
    }
  };
  tables.ForEach([&](const ps::Table& t) {
    if (t.dense) {
      for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
        if (const ps::DenseChunk* ch = t.dense->chunk(i)) {
          add(ch->params.data(), ch->params.size());
          add(ch->state.data(), ch->state.size());
        }
      }
    } else {
      const ps::SparseShard& s = *t.sparse;
      for (ps::RowIndex r = 0; r < s.size(); ++r) add(s.row(r), static_cast<size_t>(s.row_floats()));
    }
  });
  return spans;
}

size_t TotalBytes(const std::vector<std::span<const char>>& spans) {
  size_t n = 0;
  for (const auto& s : spans) n += s.size();
  return n;
}

void CopySpans(const std::vector<std::span<const char>>& spans, char* out) {
  for (const auto& s : spans) {
    std::memcpy(out, s.data(), s.size());
    out += s.size();
  }
}

// Memory from the kernel (mmap), unmapped when destroyed. kPlain: nothing is touched here, the
// first write to each page faults it in (what a new std::vector of that size gets from glibc
// above its mmap threshold); kHugePages: the same, advised to use transparent huge pages;
// kPopulate: every page faulted in by mmap itself (MAP_POPULATE), in one system call.
class FreshBuffer {
 public:
  enum Kind { kPlain, kHugePages, kPopulate };
  FreshBuffer(size_t bytes, Kind kind) : bytes_(bytes) {
    const int populate = kind == kPopulate ? MAP_POPULATE : 0;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | populate, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<char*>(p);
    if (kind == kHugePages) ::madvise(data_, bytes, MADV_HUGEPAGE);
  }
  ~FreshBuffer() { ::munmap(data_, bytes_); }
  FreshBuffer(const FreshBuffer&) = delete;
  FreshBuffer& operator=(const FreshBuffer&) = delete;
  char* data() const { return data_; }

 private:
  char* data_;
  size_t bytes_;
};

// ---- files -------------------------------------------------------------------------------------

// The folder every file of this run goes into: a fresh one under --dir, removed at exit.
std::string& RunDir() {
  static std::string dir;
  return dir;
}

Status Errno(const std::string& what, const std::string& path) {
  return InternalError(what + " " + path + ": " + std::strerror(errno));
}

struct RawWriteTimes {
  double write_s = 0;  // the write() calls (into the page cache)
  double sync_s = 0;   // fsync of the file, close, rename, fsync of the folder
};

// `data` written as a checkpoint writes a file, without the CRC: <path>.tmp, write(), fsync,
// close, rename to <path>, fsync the folder.
StatusOr<RawWriteTimes> RawWrite(const std::string& path, std::span<const char> data) {
  RawWriteTimes t;
  const std::string tmp = path + ".tmp";
  const auto t0 = Clock::now();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  const char* p = data.data();
  size_t n = data.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      ::close(fd);
      return Errno("cannot write", tmp);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  const auto t1 = Clock::now();
  if (::fsync(fd) != 0) {
    ::close(fd);
    return Errno("cannot fsync", tmp);
  }
  if (::close(fd) != 0) return Errno("cannot close", tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("cannot rename", tmp);
  const std::string dir = fs::path(path).parent_path().string();
  const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return Errno("cannot open", dir);
  const int rc = ::fsync(d);
  ::close(d);
  if (rc != 0) return Errno("cannot fsync", dir);
  const auto t2 = Clock::now();
  t.write_s = Seconds(t1 - t0);
  t.sync_s = Seconds(t2 - t1);
  return t;
}

// zlib's crc32 over `data`, in pieces of at most 1 GiB (as the checkpoint code does).
uint32_t Crc(std::span<const char> data) {
  uint32_t crc = 0;
  const auto* p = reinterpret_cast<const Bytef*>(data.data());
  size_t n = data.size();
  while (n > 0) {
    const uInt piece = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, piece));
    p += piece;
    n -= piece;
  }
  return crc;
}

// Runs the functions of `variants` in an order that rotates with `round`.
void RunRotated(int round, const std::vector<std::function<void()>>& variants) {
  const int n = static_cast<int>(variants.size());
  const int first = ((round % n) + n) % n;
  for (int i = 0; i < n; ++i) variants[static_cast<size_t>((first + i) % n)]();
}

// ---- pause/ ------------------------------------------------------------------------------------

void BM_Pause(benchmark::State& state, const ShardCase& c) {
  auto built = BuildShard(c);
  if (!built.ok()) return Fail(state, built.status());
  ps::TableRegistry& tables = **built;
  const std::vector<std::span<const char>> spans = DataSpans(tables);
  const size_t data_bytes = TotalBytes(spans);
  std::vector<char> warm(data_bytes);  // value-initialised: every page faulted in
  CopySpans(spans, warm.data());       // and warmed once
  size_t image_bytes = 0;
  std::vector<double> snap_s, snap_faults, warm_s, sort_s;
  // A copy of the table's data into a fresh buffer of `kind`: the copy (mmap included) and the
  // munmap timed apart.
  struct Fresh {
    Fresh(const std::vector<std::span<const char>>& s, size_t b) : spans(s), bytes(b) {}
    const std::vector<std::span<const char>>& spans;
    size_t bytes;
    std::vector<double> copy_s, free_s, faults;
    void Run(FreshBuffer::Kind kind) {
      const int64_t f0 = MinorFaults();
      const auto t0 = Clock::now();
      auto buffer = std::make_unique<FreshBuffer>(bytes, kind);
      CopySpans(spans, buffer->data());
      benchmark::DoNotOptimize(buffer->data());
      benchmark::ClobberMemory();
      const auto t1 = Clock::now();
      faults.push_back(static_cast<double>(MinorFaults() - f0));
      buffer.reset();
      free_s.push_back(Seconds(Clock::now() - t1));
      copy_s.push_back(Seconds(t1 - t0));
    }
  };
  Fresh fresh(spans, data_bytes), thp(spans, data_bytes), populate(spans, data_bytes);
  // One round: every variant once, in an order that rotates with `round`; returns the snapshot's
  // seconds.
  auto one_round = [&](int round) {
    double this_snap = 0;
    RunRotated(round, {
        [&] {
          const int64_t f0 = MinorFaults();
          const auto t0 = Clock::now();
          ps::ShardImage image = ps::SnapshotShard(tables);
          const auto t1 = Clock::now();
          snap_faults.push_back(static_cast<double>(MinorFaults() - f0));
          image_bytes = image.bytes.size();
          benchmark::DoNotOptimize(image.bytes.data());
          this_snap = Seconds(t1 - t0);
          snap_s.push_back(this_snap);
        },
        [&] {
          const auto t0 = Clock::now();
          CopySpans(spans, warm.data());
          benchmark::ClobberMemory();
          warm_s.push_back(Seconds(Clock::now() - t0));
        },
        [&] { fresh.Run(FreshBuffer::kPlain); },
        [&] { thp.Run(FreshBuffer::kHugePages); },
        [&] { populate.Run(FreshBuffer::kPopulate); },
        [&] {
          if (!c.sparse) return;
          // What SnapshotShard does first for a sparse table: every (id, row) pair, sorted by id.
          const auto t0 = Clock::now();
          tables.ForEach([&](const ps::Table& t) {
            std::vector<std::pair<int64_t, ps::RowIndex>> rows;
            rows.reserve(t.sparse->size());
            t.sparse->ForEachRow([&](int64_t id, ps::RowIndex r) { rows.emplace_back(id, r); });
            std::sort(rows.begin(), rows.end());
            benchmark::DoNotOptimize(rows.data());
          });
          sort_s.push_back(Seconds(Clock::now() - t0));
        },
    });
    std::fprintf(stderr,
                 "pause/%s round %d: snapshot %.1f ms, memcpy warm %.1f, fresh %.1f (free %.1f), thp %.1f, "
                 "populate %.1f, rows sort %.1f (sparse only)\n",
                 c.name, round, snap_s.back() * 1e3, warm_s.back() * 1e3, fresh.copy_s.back() * 1e3,
                 fresh.free_s.back() * 1e3, thp.copy_s.back() * 1e3, populate.copy_s.back() * 1e3,
                 c.sparse ? sort_s.back() * 1e3 : 0.0);
    return this_snap;
  };
  // A warm-up round, not in the medians: the first copies into memory this process has not used
  // yet are much slower on this VM (see RESULTS.md); `snapshot_ms_first` keeps its snapshot.
  const double first_snap = one_round(-1);
  for (auto* v : {&snap_s, &snap_faults, &warm_s, &sort_s, &fresh.copy_s, &fresh.free_s, &fresh.faults, &thp.copy_s,
                  &thp.free_s, &thp.faults, &populate.copy_s, &populate.free_s, &populate.faults}) {
    v->clear();
  }
  int round = 0;
  for (auto _ : state) state.SetIterationTime(one_round(round++));
  const double snap_rate = static_cast<double>(image_bytes) / Median(snap_s);
  const double warm_rate = static_cast<double>(data_bytes) / Median(warm_s);
  auto& k = state.counters;
  k["image_MB"] = static_cast<double>(image_bytes) / 1e6;
  k["data_MB"] = static_cast<double>(data_bytes) / 1e6;
  k["snapshot_ms"] = Median(snap_s) * 1e3;
  k["snapshot_ms_min"] = *std::min_element(snap_s.begin(), snap_s.end()) * 1e3;
  k["snapshot_ms_max"] = Max(snap_s) * 1e3;
  k["snapshot_ms_first"] = first_snap * 1e3;
  k["snapshot_GBps"] = snap_rate / 1e9;
  k["snapshot_faults"] = Median(snap_faults);
  k["memcpy_warm_ms"] = Median(warm_s) * 1e3;
  k["memcpy_warm_GBps"] = warm_rate / 1e9;
  k["snapshot_vs_memcpy"] = snap_rate / warm_rate;
  for (const auto& [name, f] : {std::pair<std::string, const Fresh*>{"memcpy_fresh", &fresh},
                                {"memcpy_fresh_thp", &thp},
                                {"memcpy_fresh_populate", &populate}}) {
    k[name + "_ms"] = Median(f->copy_s) * 1e3;
    k[name + "_GBps"] = static_cast<double>(data_bytes) / Median(f->copy_s) / 1e9;
    k[name + "_faults"] = Median(f->faults);
    k[name + "_free_ms"] = Median(f->free_s) * 1e3;
  }
  k["snapshot_vs_fresh"] = snap_rate / (static_cast<double>(data_bytes) / Median(fresh.copy_s));
  if (c.sparse) k["rows_sort_ms"] = Median(sort_s) * 1e3;
}

// ---- write/ ------------------------------------------------------------------------------------

void BM_Write(benchmark::State& state, const ShardCase& c) {
  auto built = BuildShard(c);
  if (!built.ok()) return Fail(state, built.status());
  ps::TableRegistry& tables = **built;
  const std::string dir = RunDir() + "/write-" + c.name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Fail(state, InternalError("cannot create " + dir + ": " + ec.message()));
  // The raw writes' bytes: a snapshot's (checksums zero), written from memory already faulted in.
  decltype(ps::ShardImage::bytes) raw;
  {
    ps::ShardImage first = ps::SnapshotShard(tables);
    raw = std::move(first.bytes);
  }
  std::vector<double> ckpt_s, raw_s, raw_write_s, raw_sync_s, crc_s;
  int64_t step = 0;
  // One round: a snapshot (untimed: the pause is pause/'s), then the checkpoint write, the raw
  // write and the CRC pass in an order that rotates with `round`; returns the checkpoint write's
  // seconds.
  auto one_round = [&](int round) -> StatusOr<double> {
    ps::ShardImage image = ps::SnapshotShard(tables);
    double this_ckpt = 0;
    Status failed;
    RunRotated(round, {
        [&] {
          const auto t0 = Clock::now();
          auto f = ps::WriteShardImage(dir, 0, 1, ++step, std::move(image));
          this_ckpt = Seconds(Clock::now() - t0);
          if (!f.ok()) {
            failed = f.status();
            return;
          }
          ckpt_s.push_back(this_ckpt);
          fs::remove(fs::path(dir) / f->name, ec);
        },
        [&] {
          const std::string path = dir + "/raw";
          auto t = RawWrite(path, raw);
          if (!t.ok()) {
            failed = t.status();
            return;
          }
          raw_s.push_back(t->write_s + t->sync_s);
          raw_write_s.push_back(t->write_s);
          raw_sync_s.push_back(t->sync_s);
          fs::remove(path, ec);
        },
        [&] {
          const auto t0 = Clock::now();
          benchmark::DoNotOptimize(Crc(raw));
          crc_s.push_back(Seconds(Clock::now() - t0));
        },
    });
    if (!failed.ok()) return failed;
    std::fprintf(stderr, "write/%s round %d: checkpoint %.3f s, raw %.3f s (write() %.3f, fsync %.3f), crc %.3f s\n",
                 c.name, round, this_ckpt, raw_s.back(), raw_write_s.back(), raw_sync_s.back(), crc_s.back());
    return this_ckpt;
  };
  // A warm-up round, not in the medians (`ckpt_write_s_first` keeps its checkpoint write).
  auto first = one_round(-1);
  if (!first.ok()) {
    fs::remove_all(dir, ec);
    return Fail(state, first.status());
  }
  for (auto* v : {&ckpt_s, &raw_s, &raw_write_s, &raw_sync_s, &crc_s}) v->clear();
  int round = 0;
  for (auto _ : state) {
    auto t = one_round(round++);
    if (!t.ok()) {
      Fail(state, t.status());
      break;
    }
    state.SetIterationTime(*t);
  }
  fs::remove_all(dir, ec);
  if (state.error_occurred()) return;
  const double bytes = static_cast<double>(raw.size());
  auto& k = state.counters;
  k["image_MB"] = bytes / 1e6;
  k["ckpt_write_s"] = Median(ckpt_s);
  k["ckpt_write_s_min"] = *std::min_element(ckpt_s.begin(), ckpt_s.end());
  k["ckpt_write_s_max"] = Max(ckpt_s);
  k["ckpt_write_s_first"] = *first;
  k["ckpt_MBps"] = bytes / Median(ckpt_s) / 1e6;
  k["disk_write_s"] = Median(raw_s);
  k["disk_write_s_min"] = *std::min_element(raw_s.begin(), raw_s.end());
  k["disk_write_s_max"] = Max(raw_s);
  k["disk_MBps"] = bytes / Median(raw_s) / 1e6;
  k["disk_write_call_s"] = Median(raw_write_s);
  k["disk_fsync_s"] = Median(raw_sync_s);
  k["crc_pass_s"] = Median(crc_s);
  k["crc_GBps"] = bytes / Median(crc_s) / 1e9;
  k["ckpt_vs_disk"] = Median(raw_s) / Median(ckpt_s);
}

// ---- worker/ -----------------------------------------------------------------------------------

// Worker 0's back-to-back round trips on a small table, on a thread of its own, until stopped.
// Thread-safety: construct, Stop() and read trips() from one thread; the loop thread owns
// everything else until Stop() has joined it.
class Load {
 public:
  struct Trip {
    Clock::time_point start, end;
  };

  Load(Client& client, std::string table, int64_t elems)
      : client_(client), table_(std::move(table)), grad_(static_cast<size_t>(elems), 1e-6f),
        out_(static_cast<size_t>(elems)) {
    trips_.reserve(size_t{1} << 22);
    thread_ = std::thread([this] { Run(); });
  }
  ~Load() { Stop().IgnoreError(); }

  // Stops and joins; the status of the first failed round trip, if any.
  Status Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  const std::vector<Trip>& trips() const { return trips_; }  // after Stop

 private:
  void Run() {
    const DenseIn in{table_, grad_};
    const DenseOut out{table_, out_};
    int64_t step = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
      const auto t0 = Clock::now();
      Status s = client_.PushPullDense({&in, 1}, {&out, 1}, step++).wait(kWaitTimeout);
      const auto t1 = Clock::now();
      if (!s.ok()) {
        status_ = s;
        return;
      }
      trips_.push_back({t0, t1});
    }
  }

  Client& client_;
  std::string table_;
  std::vector<float> grad_, out_;
  std::atomic<bool> stop_{false};
  Status status_;            // written by the thread; read after the join
  std::vector<Trip> trips_;  // written by the thread; read after the join
  std::thread thread_;
};

StatusOr<std::unique_ptr<Client>> ConnectWorker(const std::string& endpoint, int rank) {
  ClientOptions o;
  o.servers = {endpoint};
  o.rank = rank;
  o.num_workers = 2;
  o.request_timeout = kRequestTimeout;
  return Client::Connect(std::move(o));
}

void BM_Worker(benchmark::State& state, const ShardCase& c) {
  const std::string dir = RunDir() + "/worker-" + c.name;
  Status st;
  enum Kind { kQuiet = 0, kCkpt = 1, kSpin = 2 };
  struct Window {
    Clock::time_point start, end;
    Kind kind;
    Clock::time_point saved;  // kCkpt: when SaveCheckpoint returned (the shard durable)
    double pause_ms = 0;      // kCkpt: the server's own figure
  };
  std::vector<Window> windows;
  std::vector<Load::Trip> trips;
  struct RemoveDir {
    const std::string& dir;
    ~RemoveDir() {
      std::error_code e;
      fs::remove_all(dir, e);
    }
  } remove_dir{dir};
  {
    ServerOptions so;
    so.bind = "tcp://127.0.0.1:0";
    so.compute_threads = 1;
    so.checkpoint_dir = dir;
    so.keep_checkpoints = 1;
    auto server = Server::Start(so);
    if (!server.ok()) return Fail(state, server.status());
    auto a = ConnectWorker((*server)->endpoint(), 0);
    if (!a.ok()) return Fail(state, a.status());
    auto b = ConnectWorker((*server)->endpoint(), 1);
    if (!b.ok()) return Fail(state, b.status());
    Client& worker = **a;
    Client& saver = **b;
    st = worker.Declare(SpecOf(c));
    TableSpec small;
    small.name = "small";
    small.shape = {1024};
    small.consistency = Consistency::kAsync;
    small.optimizer.learning_rate = 1e-3f;
    if (st.ok()) st = worker.Declare(small);
    if (st.ok() && c.sparse) {  // create every row
      constexpr int64_t kBatch = 262144;
      std::vector<int64_t> ids(kBatch);
      std::vector<float> rows(static_cast<size_t>(kBatch * kSparseDim));
      for (int64_t b0 = 0; st.ok() && b0 < c.rows; b0 += kBatch) {
        const int64_t n = std::min(kBatch, c.rows - b0);
        for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = SparseId(b0 + i);
        st = worker.PullSparse(c.name, std::span(ids).first(static_cast<size_t>(n)),
                               std::span(rows).first(static_cast<size_t>(n * kSparseDim)), 0)
                 .wait(kWaitTimeout);
      }
    }
    int64_t step = 0;
    // One checkpoint window: Save (pause + write), then Commit (manifest, CURRENT, and removal of
    // the previous checkpoint, keep_checkpoints = 1).
    auto checkpoint = [&](Window* w) -> Status {
      std::vector<CheckpointShard> shards(1);
      w->start = Clock::now();
      FERRY_RETURN_IF_ERROR(saver.SaveCheckpoint(++step, shards).wait(kWaitTimeout));
      w->saved = Clock::now();
      w->pause_ms = static_cast<double>(shards[0].paused.count()) / 1e3;
      Status s = saver.CommitCheckpoint(step, shards);
      w->end = Clock::now();
      return s;
    };
    // Warm-up, untimed: one checkpoint (the first quiet window is as long as it took).
    double last_window = 0;
    if (st.ok()) {
      Window w{};
      st = checkpoint(&w);
      last_window = Seconds(w.end - w.start);
    }
    if (!st.ok()) return Fail(state, st);
    Load load(worker, "small", 1024);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the load under way
    int round = 0;
    for (auto _ : state) {
      auto quiet = [&] {
        const auto t0 = Clock::now();
        std::this_thread::sleep_for(std::chrono::duration<double>(last_window));
        windows.push_back({t0, Clock::now(), kQuiet, {}, 0});
      };
      // A control: one core kept busy (a spinning thread, no memory traffic), nothing else.
      auto spin = [&] {
        const auto t0 = Clock::now();
        const auto until = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(last_window));
        std::thread spinner([until] {
          while (Clock::now() < until) {
          }
        });
        spinner.join();
        windows.push_back({t0, Clock::now(), kSpin, {}, 0});
      };
      auto ckpt = [&] {
        Window w{};
        w.kind = kCkpt;
        if (Status s = checkpoint(&w); !s.ok() && st.ok()) st = s;
        windows.push_back(w);
        last_window = Seconds(w.end - w.start);
      };
      RunRotated(round++, {quiet, ckpt, spin});
      state.SetIterationTime(last_window);
      if (!st.ok()) break;
    }
    if (Status s = load.Stop(); !s.ok() && st.ok()) st = s;
    trips = load.trips();
  }
  if (!st.ok()) return Fail(state, st);
  // Each round trip, and the gap since the previous one ended, counts in the window it ends in.
  struct Gap {
    double us = 0;
    Clock::time_point end;
  };
  std::vector<double> lat[3], gap[3];
  std::vector<std::vector<Gap>> window_gaps(windows.size());
  for (size_t i = 1; i < trips.size(); ++i) {
    for (size_t wi = 0; wi < windows.size(); ++wi) {
      const Window& w = windows[wi];
      if (trips[i].end >= w.start && trips[i].end < w.end) {
        const double g = Seconds(trips[i].end - trips[i - 1].end) * 1e6;
        lat[w.kind].push_back(Seconds(trips[i].end - trips[i].start) * 1e6);
        gap[w.kind].push_back(g);
        window_gaps[wi].push_back({g, trips[i].end});
        break;
      }
    }
  }
  // In each checkpoint window the longest gap should be the pause; the second longest is the
  // worst stall besides it (`ckpt_second_gap_us`: the largest over the windows). Where each lies
  // in its window goes to stderr.
  std::vector<double> pause_ms, save_s, window_s;
  double second_gap = 0;
  for (size_t wi = 0; wi < windows.size(); ++wi) {
    const Window& w = windows[wi];
    if (w.kind != kCkpt) continue;
    pause_ms.push_back(w.pause_ms);
    save_s.push_back(Seconds(w.saved - w.start));
    window_s.push_back(Seconds(w.end - w.start));
    auto& g = window_gaps[wi];
    if (g.size() < 2) continue;
    std::partial_sort(g.begin(), g.begin() + 2, g.end(), [](const Gap& x, const Gap& y) { return x.us > y.us; });
    second_gap = std::max(second_gap, g[1].us);
    std::fprintf(stderr,
                 "worker/%s checkpoint: server pause %.1f ms, saved at +%.3f s, window %.3f s; longest gap %.1f ms "
                 "ending at +%.3f s, second %.1f ms ending at +%.3f s\n",
                 c.name, w.pause_ms, Seconds(w.saved - w.start), Seconds(w.end - w.start), g[0].us / 1e3,
                 Seconds(g[0].end - w.start), g[1].us / 1e3, Seconds(g[1].end - w.start));
  }
  auto& k = state.counters;
  const char* names[3] = {"quiet", "ckpt", "spin"};
  for (int w = 0; w < 3; ++w) {
    const std::string n = names[w];
    k[n + "_trips"] = static_cast<double>(lat[w].size());
    k[n + "_median_us"] = Median(lat[w]);
    k[n + "_p99_us"] = Quantile(lat[w], 0.99);
    k[n + "_max_us"] = Max(lat[w]);
    k[n + "_max_gap_us"] = Max(gap[w]);
  }
  k["ckpt_second_gap_us"] = second_gap;
  k["server_pause_ms"] = Median(pause_ms);
  k["server_pause_ms_max"] = Max(pause_ms);
  k["save_s"] = Median(save_s);  // request to durable shard (pause + write), as worker 1 sees it
  k["ckpt_window_s"] = Median(window_s);  // save + commit
  k["max_gap_vs_pause"] = Max(gap[kCkpt]) / 1e3 / Max(pause_ms);
}

// ---- registration ------------------------------------------------------------------------------

void RegisterAll() {
  for (const ShardCase& c : kShards) {
    benchmark::RegisterBenchmark((std::string("pause/") + c.name).c_str(),
                                 [&c](benchmark::State& st) { BM_Pause(st, c); })
        ->Iterations(c.pause_rounds)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const ShardCase& c : kShards) {
    benchmark::RegisterBenchmark((std::string("write/") + c.name).c_str(),
                                 [&c](benchmark::State& st) { BM_Write(st, c); })
        ->Iterations(c.write_rounds)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const ShardCase& c : kShards) {
    benchmark::RegisterBenchmark((std::string("worker/") + c.name).c_str(),
                                 [&c](benchmark::State& st) { BM_Worker(st, c); })
        ->Iterations(c.worker_rounds)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace ferry::bench

int main(int argc, char** argv) {
  // As ferry-ps does: allocations of 32 MiB and more come straight from the kernel.
  ferry::transport::TuneAllocatorForLargeMessages();
  // --dir=PATH (this program's own flag, taken out before Google Benchmark sees the rest).
  std::string parent = "/tmp";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.starts_with("--dir=")) {
      parent = a.substr(6);
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::string tmpl = parent + "/ferry-ckpt-bench-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "ferry-ckpt-bench: cannot make a folder under %s: %s\n", parent.c_str(), std::strerror(errno));
    return 1;
  }
  ferry::bench::RunDir() = tmpl;
  std::fprintf(stderr, "ferry-ckpt-bench: files go to %s (removed at exit)\n", tmpl.c_str());
  benchmark::AddCustomContext("ckpt_dir", tmpl);
  ferry::bench::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
  return 0;
}
