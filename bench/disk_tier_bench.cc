// bench/disk_tier_bench.cc — the disk tier's store (ps/server/internal/disk_tier.h, issue 37)
// against its limits, in one run: lookups of batches of ids read from the store with O_DIRECT
// (what a row that is not in RAM costs: the disk, no page cache), beside the disk's own random
// 4 KiB read rate in the same folder (fio, O_DIRECT, synchronous reads: one job, as one thread
// reading the store; two jobs, as two), and the RAM-only table's lookups (SparseShard::Find and a
// copy of the row, as a pull serves it).
//
// The table: --rows rows of dim --dim with Adam (3 x dim floats a row, and 8 bytes of steps), ids
// spread over 63 bits like hashed features, written in batches of 10,000 and compacted (the store
// as a long-running server's settles). Streams: ids uniform over the rows, and Zipf (s = 1.1) with
// the ranks scattered over the ids; batches of --batch ids drawn before the timing. The block
// cache is --cache-mb (index and filter blocks in it). Two stores hold the rows: data blocks as
// RocksDB lays them (DiskTier's default; arms "disk/") and padded to 4 KiB pages
// ("disk_aligned/"), so the choice is measured in the same run. Reader threads: 1, 2 and 8 (a
// pool of synchronous readers keeps several reads in flight), fio jobs likewise.
//
// Each round runs every arm for --seconds, in an order that rotates from round to round; a round's
// figures go to stderr, and stdout gets JSON with every round and the medians. Needs fio on PATH
// (Debian: fio). Files go into a fresh folder under --dir (default /var/tmp), removed at the end.
//
// --mode shard measures the tier in the shard instead (RunShard, below); --mode server the tier
// in a running server with several workers (RunServer).
//
//   ferry-disk-bench [--rows N] [--dim D] [--batch B] [--seconds S] [--rounds R] [--dir PATH]
//                    [--cache-mb M] [--mode store|shard|server] [--ids zipf1.1|uniform]
//                    [--workers W] > results.json
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/client.h"
#include "ferry/server.h"
#include "ferry/table_spec.h"
#include "internal/disk_tier.h"
#include "internal/optimizer.h"
#include "internal/tables.h"
#include "zipf.h"

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

constexpr uint64_t kTable = 1;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.empty() ? 0.0 : v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Row k's id: spread over 63 bits (SplitMix64's finaliser), distinct for distinct k.
int64_t IdOf(int64_t k) {
  uint64_t z = static_cast<uint64_t>(k) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<int64_t>((z ^ (z >> 31)) >> 1);
}

struct Flags {
  int64_t rows = 2'000'000;
  int64_t dim = 16;
  int64_t batch = 512;
  double seconds = 3;
  int rounds = 3;
  std::string dir = "/var/tmp";
  int64_t cache_mb = 8;
  std::string mode = "store";  // "store": the store against fio; "shard": shards with the tier
  std::string ids = "zipf1.1";  // --mode shard: the steps' ids, "zipf1.1" or "uniform" over the rows
  int workers = 4;              // --mode server: workers taking steps at once
};

// Runs `lookup(thread, batch index)` on `threads` threads for `seconds`; returns ids per second.
double TimeLookups(int threads, double seconds, int64_t batch, const std::function<void(int, size_t)>& lookup) {
  std::atomic<int64_t> batches{0};
  std::vector<std::thread> pool;
  const auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      size_t i = static_cast<size_t>(t) * 7919;
      int64_t n = 0;
      while (Since(t0) < seconds) lookup(t, i++), ++n;
      batches.fetch_add(n);
    });
  }
  for (auto& th : pool) th.join();
  return static_cast<double>(batches.load() * batch) / Since(t0);
}

// fio's random 4 KiB O_DIRECT synchronous reads of `file` for `seconds`, `jobs` jobs: IOPS.
double FioIops(const std::string& file, int64_t bytes, int jobs, double seconds) {
  const std::string cmd =
      "fio --name=disk --filename=" + file + " --size=" + std::to_string(bytes) +
      " --rw=randread --bs=4k --direct=1 --ioengine=psync --iodepth=1 --numjobs=" + std::to_string(jobs) +
      " --group_reporting --time_based --runtime=" + std::to_string(static_cast<int>(seconds + 0.5)) +
      " --output-format=json 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  if (::pclose(p) != 0) {
    std::fprintf(stderr, "fio failed (is it installed? Debian: apt-get install fio)\n");
    std::exit(1);
  }
  const size_t brace = out.find('{');
  const Json j = Json::parse(out.substr(brace == std::string::npos ? 0 : brace));
  return j["jobs"][0]["read"]["iops"].get<double>();
}

// What every mode's JSON opens with: the mode, the flags it ran with, the machine, and the build
// and warm-up times.
Json RunHeader(const Flags& f, double build_s, double warm_s, int64_t fio_bytes) {
  Json j;
  j["mode"] = f.mode;
  j["ids"] = f.ids;
  j["machine_cores"] = std::thread::hardware_concurrency();
  j["rows"] = f.rows;
  j["dim"] = f.dim;
  j["batch"] = f.batch;
  j["seconds"] = f.seconds;
  j["cache_mb"] = f.cache_mb;
  j["build_seconds"] = build_s;
  j["warm_up_seconds"] = warm_s;
  j["fio_file_bytes"] = fio_bytes;
  return j;
}

// The benches' table: sparse, --dim, Adam (two state slots travel with each row).
TableSpec BenchSpec(const Flags& f) {
  TableSpec spec;
  spec.name = "emb";
  spec.type = TableType::kSparse;
  spec.dim = f.dim;
  spec.optimizer.type = OptimizerType::kAdam;
  return spec;
}

int Run(const Flags& f) {
  const fs::path dir = fs::path(f.dir) / ("ferry-disk-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const TableSpec spec = BenchSpec(f);
  const int64_t row_floats = f.dim * (1 + ps::StateSlots(spec.optimizer.type));

  // The RAM-only table and the store hold the same rows.
  std::fprintf(stderr, "building %lld rows of %lld floats in RAM and on disk (%s)\n", static_cast<long long>(f.rows),
               static_cast<long long>(row_floats), dir.c_str());
  ps::SparseShard ram(spec, kTable, 1);
  // One store per block layout (DiskTier::Options::align_blocks), each with its own block cache.
  const std::vector<std::pair<std::string, bool>> layouts = {{"unaligned", false}, {"aligned", true}};
  std::vector<std::unique_ptr<ps::DiskTier>> tiers;
  for (const auto& [name, align] : layouts) {
    ps::DiskTier::Options o;
    o.path = (dir / name).string();
    o.block_cache_bytes = f.cache_mb << 20;
    o.direct_reads = true;
    o.align_blocks = align;
    std::unique_ptr<ps::DiskTier> tier;
    Status s = ps::DiskTier::Open(o, &tier);
    if (s.ok()) s = tier->AddTable(kTable, spec.name, row_floats);
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
    tiers.push_back(std::move(tier));
  }
  const auto build0 = Clock::now();
  constexpr int64_t kWriteBatch = 10'000;
  std::vector<int64_t> ids, steps;
  std::vector<float> rows;
  for (int64_t k0 = 0; k0 < f.rows; k0 += kWriteBatch) {
    ids.clear();
    steps.clear();
    rows.clear();
    for (int64_t k = k0; k < std::min(f.rows, k0 + kWriteBatch); ++k) {
      const int64_t id = IdOf(k);
      const ps::RowIndex r = ram.FindOrCreate(id);
      float* row = ram.row(r);
      for (int64_t e = 0; e < row_floats; ++e) row[e] = static_cast<float>(k) + 0.25f * static_cast<float>(e);
      ids.push_back(id);
      steps.push_back(k);
      rows.insert(rows.end(), row, row + row_floats);
    }
    for (auto& tier : tiers) {
      if (Status s = tier->Write(kTable, ids, steps, rows.data()); !s.ok()) {
        return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
      }
    }
  }
  std::vector<int64_t> store_bytes_of;
  for (auto& tier : tiers) {
    if (Status s = tier->Compact(); !s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
    store_bytes_of.push_back(tier->FileBytes(kTable));
  }
  const double build_s = Since(build0);
  const int64_t store_bytes = store_bytes_of[0];
  std::fprintf(stderr, "built in %.1f s: %.1f MiB of table files (unaligned), %.1f MiB (aligned)\n", build_s,
               static_cast<double>(store_bytes_of[0]) / (1 << 20), static_cast<double>(store_bytes_of[1]) / (1 << 20));

  // The id streams, drawn before any timing.
  std::mt19937_64 g(2026);
  const Zipf zipf(f.rows, 1.1);
  const size_t kBatches = 2048;
  std::map<std::string, std::vector<int64_t>> streams;
  for (const char* dist : {"uniform", "zipf1.1"}) {
    auto& v = streams[dist];
    v.resize(kBatches * static_cast<size_t>(f.batch));
    std::uniform_int_distribution<int64_t> uni(0, f.rows - 1);
    for (auto& id : v) id = IdOf(std::string(dist) == "uniform" ? uni(g) : zipf(g));
  }

  // A file of the store's size for fio, laid out once.
  const std::string fio_file = (dir / "fio.dat").string();
  FioIops(fio_file, store_bytes, 1, 1);

  struct Arm {
    std::string name;
    std::function<double()> run;  // ids (or reads) per second
  };
  std::vector<Arm> arms;
  for (int jobs : {1, 2, 8}) {
    arms.push_back({"fio_randread_4k/j" + std::to_string(jobs),
                    [&, jobs] { return FioIops(fio_file, store_bytes, jobs, f.seconds); }});
  }
  for (const char* dist : {"uniform", "zipf1.1"}) {
    const std::vector<int64_t>& stream = streams[dist];
    auto batch_ids = [&stream, &f, kBatches](size_t i) {
      return std::span<const int64_t>(stream.data() + (i % kBatches) * static_cast<size_t>(f.batch),
                                      static_cast<size_t>(f.batch));
    };
    arms.push_back({std::string("ram/") + dist + "/t1", [&, batch_ids] {
                      std::vector<float> out(static_cast<size_t>(f.batch * row_floats));
                      return TimeLookups(1, f.seconds, f.batch, [&](int, size_t i) {
                        const auto b = batch_ids(i);
                        for (size_t k = 0; k < b.size(); ++k) {
                          const ps::RowIndex r = ram.Find(b[k]);
                          std::memcpy(&out[k * static_cast<size_t>(row_floats)], ram.row(r),
                                      static_cast<size_t>(row_floats) * 4);
                        }
                      });
                    }});
    for (size_t v = 0; v < tiers.size(); ++v)
      for (int threads : {1, 2, 8}) {
        ps::DiskTier* tier = tiers[v].get();
        const std::string layout = v == 0 ? "" : "_" + layouts[v].first;
        arms.push_back(
            {"disk" + layout + "/" + dist + "/t" + std::to_string(threads), [&, batch_ids, threads, tier] {
               const auto n = static_cast<size_t>(threads);
               std::vector<std::vector<float>> out(n, std::vector<float>(static_cast<size_t>(f.batch * row_floats)));
               std::vector<std::vector<int64_t>> st(n, std::vector<int64_t>(static_cast<size_t>(f.batch)));
               std::vector<std::vector<bool>> found(n);
               std::atomic<int64_t> missing{0};
               const double rate = TimeLookups(threads, f.seconds, f.batch, [&](int t, size_t i) {
                 const auto b = batch_ids(i);
                 const auto tt = static_cast<size_t>(t);
                 Status s = tier->Read(kTable, b, out[tt].data(), st[tt].data(), &found[tt]);
                 if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str()), std::exit(1);
                 missing += std::count(found[tt].begin(), found[tt].end(), false);
               });
               if (missing.load() != 0)
                 std::fprintf(stderr, "%lld ids not found\n", static_cast<long long>(missing.load())), std::exit(1);
               return rate;
             }});
      }
  }

  Json out;
  out["machine_cores"] = std::thread::hardware_concurrency();
  out["rows"] = f.rows;
  out["dim"] = f.dim;
  out["row_bytes"] = row_floats * 4 + 8;
  out["batch"] = f.batch;
  out["seconds"] = f.seconds;
  out["cache_mb"] = f.cache_mb;
  out["store_file_bytes"] = store_bytes;
  out["build_seconds"] = build_s;
  std::map<std::string, std::vector<double>> per_arm;
  for (int round = 0; round < f.rounds; ++round) {
    for (size_t k = 0; k < arms.size(); ++k) {
      const Arm& arm = arms[(k + static_cast<size_t>(round)) % arms.size()];
      const double rate = arm.run();
      per_arm[arm.name].push_back(rate);
      std::fprintf(stderr, "round %d %-28s %12.0f /s\n", round, arm.name.c_str(), rate);
    }
  }
  for (const auto& [name, v] : per_arm) {
    out["arms"][name]["per_round"] = v;
    out["arms"][name]["median"] = Median(v);
  }
  out["store_file_bytes_aligned"] = store_bytes_of[1];
  const ps::DiskTier::Stats st = tiers[0]->stats();
  out["store_reads"] = st.reads;
  out["store_read_us_log2_buckets"] = st.read_us;
  std::printf("%s\n", out.dump(1).c_str());
  tiers.clear();
  fs::remove_all(dir);
  return 0;
}

// --mode shard: the tier in the shard (SparseShard::AttachDisk), one thread, as a server's I/O
// thread would use it in this slice (reads and writes synchronous). Every one of --rows ids is
// pushed once (async Adam), into a shard that keeps everything in RAM ("ram"), one with max_rows =
// --rows and no disk ("ram_max_rows": the lifecycle's bookkeeping alone), and into shards
// whose RAM tier holds 100%, 10% and 1% of the rows (max_rows), each with its own store (O_DIRECT
// reads, --cache-mb block cache), compacted; then training steps on batches of --batch ids (--ids:
// Zipf, s = 1.1, or uniform over the rows): a pull (PromoteForPull, then each row copied or its
// initial values) and a push of the same ids (ApplyRows; the lifecycle's clock, which orders rows
// by recency, counts pushes),
// after a warm-up in which each RAM tier turns over twice. Counted per arm: ids/s (of the
// batches), and rows promoted per id (the RAM tier's misses).
int RunShard(const Flags& f) {
  const fs::path dir = fs::path(f.dir) / ("ferry-disk-shard-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  TableSpec base = BenchSpec(f);
  base.init = InitType::kUniform;
  base.init_scale = 0.05f;
  struct Tiered {
    std::string name;
    TableSpec spec;  // outlives the shard
    std::unique_ptr<ps::DiskTier> disk;
    std::unique_ptr<ps::SparseShard> shard;
  };
  std::vector<std::unique_ptr<Tiered>> shards;
  {
    auto ram = std::make_unique<Tiered>();
    ram->name = "ram";
    ram->spec = base;
    ram->shard = std::make_unique<ps::SparseShard>(ram->spec, kTable, 1);
    shards.push_back(std::move(ram));
  }
  {
    // The same lifecycle settings without a disk: what the tier's own work costs at 100%.
    auto capped = std::make_unique<Tiered>();
    capped->name = "ram_max_rows";
    capped->spec = base;
    capped->spec.max_rows = f.rows;
    capped->shard = std::make_unique<ps::SparseShard>(capped->spec, kTable, 1);
    shards.push_back(std::move(capped));
  }
  for (const auto& [name, share] :
       std::vector<std::pair<std::string, double>>{{"tier100", 1.0}, {"tier10", 0.1}, {"tier1", 0.01}}) {
    auto t = std::make_unique<Tiered>();
    t->name = name;
    t->spec = base;
    t->spec.max_rows = std::max<int64_t>(f.batch * 2, static_cast<int64_t>(static_cast<double>(f.rows) * share));
    t->spec.disk_tier = true;
    ps::DiskTier::Options o;
    o.path = (dir / name).string();
    o.block_cache_bytes = f.cache_mb << 20;
    o.direct_reads = true;
    Status s = ps::DiskTier::Open(o, &t->disk);
    t->shard = std::make_unique<ps::SparseShard>(t->spec, kTable, 1);
    if (s.ok()) s = t->shard->AttachDisk(t->disk.get());
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
    shards.push_back(std::move(t));
  }
  const auto build0 = Clock::now();
  std::vector<ps::RowIndex> scratch;
  std::vector<float> grads(static_cast<size_t>(f.batch * f.dim), 0.001f);
  std::vector<int64_t> ids;
  for (int64_t k0 = 0; k0 < f.rows; k0 += f.batch) {
    ids.clear();
    for (int64_t k = k0; k < std::min(f.rows, k0 + f.batch); ++k) ids.push_back(IdOf(k));
    for (auto& t : shards) t->shard->ApplyRows(ids, grads.data(), &scratch);
  }
  for (auto& t : shards) {
    if (t->disk == nullptr) continue;
    if (Status s = t->disk->Compact(); !s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
  }
  const double build_s = Since(build0);
  std::fprintf(stderr, "built %lld rows in each shard in %.1f s\n", static_cast<long long>(f.rows), build_s);
  // The disk's own random 4 KiB reads (fio, one synchronous job) on a file of the 10% tier's store
  // size in the same folder: what the tier's cold reads, one at a time on one thread, can reach.
  int64_t fio_bytes = 0;
  for (auto& t : shards) {
    if (t->name == "tier10") fio_bytes = std::max<int64_t>(t->disk->FileBytes(kTable), int64_t{64} << 20);
  }
  const std::string fio_file = (dir / "fio.dat").string();
  FioIops(fio_file, fio_bytes, 1, 1);  // lays the file out

  std::mt19937_64 g(2026);
  const Zipf zipf(f.rows, 1.1);
  std::uniform_int_distribution<int64_t> uniform(0, f.rows - 1);
  const size_t kBatches = 8192;  // 4M ids at 512: the tiers' arms never wrap round
  std::vector<int64_t> stream(kBatches * static_cast<size_t>(f.batch));
  for (auto& id : stream) id = IdOf(f.ids == "uniform" ? uniform(g) : zipf(g));
  auto batch_ids = [&](size_t i) {
    return std::span<const int64_t>(stream.data() + (i % kBatches) * static_cast<size_t>(f.batch),
                                    static_cast<size_t>(f.batch));
  };
  struct Arm {
    std::string name;
    std::function<double()> run;
    ps::SparseShard* shard;
  };
  std::vector<Arm> arms;
  std::vector<float> out(static_cast<size_t>(f.batch * f.dim));
  // Each shard goes on through the stream where it stopped (warm-up included), so a round does
  // not replay the batches its RAM tier has just seen (the stream repeats after kBatches).
  std::map<ps::SparseShard*, size_t> cursor;
  for (auto& t : shards) {
    ps::SparseShard* shard = t->shard.get();
    arms.push_back({"step/" + t->name,
                    [&, shard] {
                      return TimeLookups(1, f.seconds, f.batch, [&](int, size_t) {
                        const auto b = batch_ids(cursor[shard]++);
                        shard->PromoteForPull(b);
                        for (size_t k = 0; k < b.size(); ++k) {
                          // (as the server's pull does: the index slots a few ids ahead)
                          if (k + ps::SparseShard::kPrefetchAhead < b.size()) {
                            shard->Prefetch(b[k + ps::SparseShard::kPrefetchAhead]);
                          }
                          float* to = &out[k * static_cast<size_t>(f.dim)];
                          if (const ps::RowIndex r = shard->FindForPull(b[k]); r != ps::kNoRow) {
                            std::memcpy(to, shard->row(r), static_cast<size_t>(f.dim) * sizeof(float));
                          } else {
                            shard->InitialRow(b[k], to);
                          }
                        }
                        shard->ApplyRows(b, grads.data(), &scratch);
                      });
                    },
                    shard});
  }

  arms.push_back({"fio_randread_4k/j1", [&] { return FioIops(fio_file, fio_bytes, 1, f.seconds); }, nullptr});

  // Warm-up: each shard's RAM tier turns over twice (2 x max_rows ids of the stream; the ram
  // shard as long as the largest), so the rounds see the tier settled, not its first misses.
  double warm_s = 0;
  for (auto& t : shards) {
    const int64_t ids_to_go = 2 * (t->spec.max_rows > 0 ? t->spec.max_rows : f.rows);
    const auto w0 = Clock::now();
    size_t& i = cursor[t->shard.get()];
    for (; static_cast<int64_t>(i) * f.batch < ids_to_go; ++i) {
      t->shard->PromoteForPull(batch_ids(i));
      t->shard->ApplyRows(batch_ids(i), grads.data(), &scratch);
    }
    warm_s += Since(w0);
  }
  std::fprintf(stderr, "warmed up in %.1f s\n", warm_s);

  Json j = RunHeader(f, build_s, warm_s, fio_bytes);
  for (auto& t : shards) j["max_rows"][t->name] = t->spec.max_rows;
  std::map<std::string, std::vector<double>> rate, promoted_per_id;
  for (int round = 0; round < f.rounds; ++round) {
    for (size_t k = 0; k < arms.size(); ++k) {
      const Arm& arm = arms[(k + static_cast<size_t>(round)) % arms.size()];
      const int64_t promoted0 = arm.shard ? arm.shard->lifecycle().promoted : 0;
      const auto t0 = Clock::now();
      const double r = arm.run();
      const double ids_done = r * Since(t0);
      rate[arm.name].push_back(r);
      promoted_per_id[arm.name].push_back(
          arm.shard ? static_cast<double>(arm.shard->lifecycle().promoted - promoted0) / ids_done : 0.0);
      std::fprintf(stderr, "round %d %-16s %12.0f ids/s, %.4f rows promoted an id\n", round, arm.name.c_str(), r,
                   promoted_per_id[arm.name].back());
    }
  }
  for (const auto& [name, v] : rate) {
    j["arms"][name]["per_round"] = v;
    j["arms"][name]["median"] = Median(v);
    j["arms"][name]["promoted_per_id"] = promoted_per_id[name];
  }
  for (auto& t : shards) {
    j["lifecycle"][t->name] = {{"demoted", t->shard->lifecycle().demoted},
                               {"promoted", t->shard->lifecycle().promoted},
                               {"rows_in_ram", t->shard->size()}};
  }
  std::printf("%s\n", j.dump(1).c_str());
  shards.clear();
  fs::remove_all(dir);
  return 0;
}

// --mode server: the tier in running servers (ferry-ps's library, in this process, on loopback
// TCP), --workers workers (threads, a Client each, as separate worker processes would) taking
// async training steps at once on one table of --rows rows of dim --dim with Adam whose RAM tier
// holds 10% of them: a pull of --batch ids (--ids) and a push of the same ids, each waited for.
// Two servers, each with its own store (O_DIRECT reads, --cache-mb block cache), filled alike:
// "inline" reads the rows not in RAM on its I/O thread (disk_tier_readers 0: every version before
// the disk readers), "readers4" has 4 disk readers (the default). The arms alternate, their order
// rotating by round, after a warm-up in which each RAM tier turns over twice; beside them the
// disk's own random 4 KiB reads (fio, O_DIRECT, synchronous) with 1 and 4 jobs in the same folder.
// Counted per arm: steps' ids/s, rows read back from disk per id (the RAM tier's misses) and per
// second, the rows the I/O thread read itself, and requests held for the disk readers.
int RunServer(const Flags& f) {
  const fs::path dir = fs::path(f.dir) / ("ferry-disk-server-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  TableSpec spec = BenchSpec(f);
  spec.init = InitType::kUniform;
  spec.init_scale = 0.05f;
  spec.consistency = Consistency::kAsync;
  spec.max_rows = std::max<int64_t>(f.batch * 2, f.rows / 10);
  spec.disk_tier = true;
  struct Arm {
    std::string name;
    int readers = 0;
    std::unique_ptr<Server> server;
    std::vector<std::unique_ptr<Client>> workers;
    size_t cursor = 0;  // batches of the stream taken (warm-up included)
  };
  std::vector<std::unique_ptr<Arm>> arms;
  for (const auto& [name, readers] : std::vector<std::pair<std::string, int>>{{"inline", 0}, {"readers4", 4}}) {
    auto a = std::make_unique<Arm>();
    a->name = name;
    a->readers = readers;
    ServerOptions so;
    so.bind = "tcp://127.0.0.1:0";
    so.disk_tier_dir = (dir / name).string();
    so.disk_tier_cache_bytes = f.cache_mb << 20;
    so.disk_tier_direct_reads = true;
    so.disk_tier_readers = readers;
    so.num_workers = f.workers;
    auto server = Server::Start(so);
    if (!server.ok()) return std::fprintf(stderr, "%s\n", server.status().ToString().c_str()), 1;
    a->server = std::move(*server);
    for (int r = 0; r < f.workers; ++r) {
      ClientOptions o;
      o.servers = {a->server->endpoint()};
      o.rank = r;
      o.num_workers = f.workers;
      auto c = Client::Connect(o);
      Status s = c.ok() ? (*c)->Declare(spec) : c.status();
      if (!s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
      a->workers.push_back(std::move(*c));
    }
    arms.push_back(std::move(a));
  }
  // Every row pushed once (batches of 4,096), so that 90% of them are on disk.
  const auto build0 = Clock::now();
  {
    const int64_t fill = 4096;
    std::vector<float> g(static_cast<size_t>(fill * f.dim), 0.001f);
    std::vector<int64_t> ids;
    for (int64_t k0 = 0; k0 < f.rows; k0 += fill) {
      ids.clear();
      for (int64_t k = k0; k < std::min(f.rows, k0 + fill); ++k) ids.push_back(IdOf(k));
      for (auto& a : arms) {
        std::span<const float> grads(g.data(), ids.size() * static_cast<size_t>(f.dim));
        if (Status s = a->workers[0]->PushSparse("emb", ids, grads, 0).wait(); !s.ok()) {
          return std::fprintf(stderr, "filling: %s\n", s.ToString().c_str()), 1;
        }
      }
    }
  }
  const double build_s = Since(build0);
  std::fprintf(stderr, "built %lld rows in each server in %.1f s\n", static_cast<long long>(f.rows), build_s);

  std::mt19937_64 gen(2026);
  const Zipf zipf(f.rows, 1.1);
  std::uniform_int_distribution<int64_t> uniform(0, f.rows - 1);
  const size_t kBatches = 8192;
  std::vector<int64_t> stream(kBatches * static_cast<size_t>(f.batch));
  for (auto& id : stream) id = IdOf(f.ids == "uniform" ? uniform(gen) : zipf(gen));
  auto batch_ids = [&](size_t i) {
    return std::span<const int64_t>(stream.data() + (i % kBatches) * static_cast<size_t>(f.batch),
                                    static_cast<size_t>(f.batch));
  };
  // Steps by every worker of `a` at once, for `seconds` (or, with `batches` > 0, that many
  // batches in all): ids/s.
  auto steps = [&](Arm& a, double seconds, int64_t batches) {
    std::atomic<size_t> next{a.cursor};
    const size_t last = batches > 0 ? a.cursor + static_cast<size_t>(batches) : SIZE_MAX;
    std::atomic<int64_t> done{0};
    std::atomic<bool> failed{false};
    std::vector<std::thread> pool;
    const auto t0 = Clock::now();
    for (int w = 0; w < f.workers; ++w) {
      pool.emplace_back([&, w] {
        std::vector<float> out(static_cast<size_t>(f.batch * f.dim));
        std::vector<float> g(static_cast<size_t>(f.batch * f.dim), 0.001f);
        for (;;) {
          if (batches == 0 && Since(t0) >= seconds) break;
          const size_t i = next.fetch_add(1);
          if (i >= last) break;
          const auto ids = batch_ids(i);
          Status s = a.workers[static_cast<size_t>(w)]->PullSparse("emb", ids, out, 0).wait();
          if (s.ok()) s = a.workers[static_cast<size_t>(w)]->PushSparse("emb", ids, g, 0).wait();
          if (!s.ok()) {
            std::fprintf(stderr, "%s: %s\n", a.name.c_str(), s.ToString().c_str());
            failed = true;
            break;
          }
          done.fetch_add(1);
        }
      });
    }
    for (auto& t : pool) t.join();
    a.cursor = std::min(next.load(), last);
    if (failed) std::exit(1);
    return static_cast<double>(done.load() * f.batch) / Since(t0);
  };
  double warm_s = 0;
  for (auto& a : arms) {
    const auto w0 = Clock::now();
    steps(*a, 0, 2 * spec.max_rows / f.batch + 1);
    warm_s += Since(w0);
  }
  std::fprintf(stderr, "warmed up in %.1f s\n", warm_s);
  int64_t fio_bytes = std::max<int64_t>(int64_t{64} << 20, f.rows * (f.dim * 3 * 4 + 24));
  const std::string fio_file = (dir / "fio.dat").string();
  FioIops(fio_file, fio_bytes, 1, 1);  // lays the file out

  auto counter = [](const Arm& a, const char* name) {
    const auto c = a.server->stats().counters;
    auto it = c.find(name);
    return it == c.end() ? int64_t{0} : it->second;
  };
  Json j = RunHeader(f, build_s, warm_s, fio_bytes);
  j["workers"] = f.workers;
  j["max_rows"] = spec.max_rows;
  std::vector<std::string> order;
  for (auto& a : arms) order.push_back(a->name);
  order.push_back("fio_randread_4k/j1");
  order.push_back("fio_randread_4k/j4");
  std::map<std::string, std::vector<double>> rate, promoted_per_id, inline_rows, held;
  for (int round = 0; round < f.rounds; ++round) {
    for (size_t k = 0; k < order.size(); ++k) {
      const std::string& name = order[(k + static_cast<size_t>(round)) % order.size()];
      if (name.starts_with("fio")) {
        rate[name].push_back(FioIops(fio_file, fio_bytes, name.ends_with("j1") ? 1 : 4, f.seconds));
        std::fprintf(stderr, "round %d %-20s %10.0f IOPS\n", round, name.c_str(), rate[name].back());
        continue;
      }
      Arm& a = **std::find_if(arms.begin(), arms.end(), [&](const auto& x) { return x->name == name; });
      const int64_t p0 = counter(a, "rows_promoted"), i0 = counter(a, "disk_tier_rows_read_inline"),
                    h0 = counter(a, "disk_tier_requests_held");
      const auto t0 = Clock::now();
      const double r = steps(a, f.seconds, 0);
      const double ids_done = r * Since(t0);
      rate[name].push_back(r);
      promoted_per_id[name].push_back(static_cast<double>(counter(a, "rows_promoted") - p0) / ids_done);
      inline_rows[name].push_back(static_cast<double>(counter(a, "disk_tier_rows_read_inline") - i0));
      held[name].push_back(static_cast<double>(counter(a, "disk_tier_requests_held") - h0));
      std::fprintf(stderr, "round %d %-20s %10.0f ids/s, %.4f rows promoted an id, %.0f rows read inline\n", round,
                   name.c_str(), r, promoted_per_id[name].back(), inline_rows[name].back());
    }
  }
  for (const auto& [name, v] : rate) {
    j["arms"][name]["per_round"] = v;
    j["arms"][name]["median"] = Median(v);
    if (name.starts_with("fio")) continue;
    j["arms"][name]["promoted_per_id"] = promoted_per_id[name];
    j["arms"][name]["rows_read_inline"] = inline_rows[name];
    j["arms"][name]["requests_held_for_disk"] = held[name];
  }
  for (auto& a : arms) {
    for (auto& w : a->workers) w->Finish().IgnoreError();
    a->workers.clear();
    a->server->Stop();
  }
  arms.clear();
  std::printf("%s\n", j.dump(1).c_str());
  fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace ferry::bench

int main(int argc, char** argv) {
  ferry::bench::Flags f;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return std::fprintf(stderr, "%s needs a value\n", flag.c_str()), 2;
    const char* v = argv[i + 1];
    if (flag == "--rows") f.rows = std::atoll(v);
    else if (flag == "--dim") f.dim = std::atoll(v);
    else if (flag == "--batch") f.batch = std::atoll(v);
    else if (flag == "--seconds") f.seconds = std::atof(v);
    else if (flag == "--rounds") f.rounds = std::atoi(v);
    else if (flag == "--dir") f.dir = v;
    else if (flag == "--cache-mb") f.cache_mb = std::atoll(v);
    else if (flag == "--mode") f.mode = v;
    else if (flag == "--ids") f.ids = v;
    else if (flag == "--workers") f.workers = std::atoi(v);
    else {
      return std::fprintf(stderr,
                          "usage: ferry-disk-bench [--rows N] [--dim D] [--batch B] [--seconds S] [--rounds R] "
                          "[--dir PATH] [--cache-mb M] [--mode store|shard|server] [--ids zipf1.1|uniform] "
                          "[--workers W]\n"),
             2;
    }
  }
  if (f.rows < 1 || f.dim < 1 || f.batch < 1 || f.seconds <= 0 || f.rounds < 1 || f.cache_mb < 0 || f.workers < 1) {
    return std::fprintf(stderr, "every flag must be positive\n"), 2;
  }
  if (f.mode != "store" && f.mode != "shard" && f.mode != "server") {
    return std::fprintf(stderr, "--mode is store, shard or server\n"), 2;
  }
  if (f.ids != "zipf1.1" && f.ids != "uniform") return std::fprintf(stderr, "--ids is zipf1.1 or uniform\n"), 2;
  if (f.mode == "server") return ferry::bench::RunServer(f);
  return f.mode == "shard" ? ferry::bench::RunShard(f) : ferry::bench::Run(f);
}
