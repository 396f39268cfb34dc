// ferry-criteo-bench: how fast the Criteo reader turns text into examples, beside what the
// machine can read (issue 16). Results: bench/results/HISTORY.md, "Reading Criteo files".
//
// One generated file of Criteo-format text (40 columns, 8-hex-digit categorical values, about
// 280 bytes a line, --mb of it; 256 by default) and its gzip (level 6, like the public files),
// in --dir (default: the system's temporary folder), removed at exit. Every figure is bytes of
// text per second on one core (a reader is one thread):
//   disk/cold      read(2) of the plain file in 1 MiB calls after posix_fadvise(DONTNEED) dropped
//                  it from the page cache: the disk's rate (where the file system honours the
//                  advice: compare with cache/read)
//   cache/read     the same from the page cache: memory's rate through read(2)
//   gzip/inflate   gzread of the gzipped file from the cache, no parsing: zlib's rate
//   parse/plain    CriteoReader over the plain file from the cache (batches of 4096)
//   parse/gzip     CriteoReader over the gzipped file from the cache
//   parse/cold     CriteoReader over the plain file after dropping it from the cache
// The reported ratios are in RESULTS.md; each run prints them (parse/plain over disk/cold and over
// cache/read, parse/gzip over gzip/inflate).
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "ferry/data/criteo.h"

namespace {

std::string g_plain, g_gz;
int64_t g_text_bytes = 0;

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void Drop(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

int64_t ReadAll(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  std::vector<char> buf(1 << 20);
  int64_t total = 0;
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) total += n;
  ::close(fd);
  return total;
}

void Generate(const std::string& dir, int64_t mb) {
  g_plain = dir + "/ferry_criteo_bench_" + std::to_string(::getpid()) + ".tsv";
  g_gz = g_plain + ".gz";
  std::mt19937_64 rng(7);
  std::FILE* plain = std::fopen(g_plain.c_str(), "w");
  gzFile gz = gzopen(g_gz.c_str(), "wb6");
  if (plain == nullptr || gz == nullptr) {
    std::fprintf(stderr, "cannot write in %s\n", dir.c_str());
    std::exit(2);
  }
  std::string line;
  char hex[16];
  while (g_text_bytes < mb << 20) {
    line.clear();
    line += (rng() % 4 == 0) ? '1' : '0';
    for (int j = 0; j < 13; ++j) {
      line += '\t';
      if (rng() % 5 != 0) line += std::to_string(rng() % (j < 4 ? 100 : 100000));
    }
    for (int f = 0; f < 26; ++f) {
      line += '\t';
      if (rng() % 20 == 0) continue;  // a missing value
      std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(rng() % (1u << (8 + f % 16))));
      line += hex;
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), plain);
    gzwrite(gz, line.data(), static_cast<unsigned>(line.size()));
    g_text_bytes += static_cast<int64_t>(line.size());
  }
  std::fclose(plain);
  gzclose(gz);
}

// read(2) of the plain file: dropped from the page cache first (`cold`: the disk), or cached.
void BM_Read(benchmark::State& state, bool cold) {
  if (!cold) ReadAll(g_plain);
  for (auto _ : state) {
    if (cold) Drop(g_plain);
    const double t0 = Now();
    benchmark::DoNotOptimize(ReadAll(g_plain));
    state.SetIterationTime(Now() - t0);
  }
  state.SetBytesProcessed(state.iterations() * g_text_bytes);
}

void BM_Inflate(benchmark::State& state) {
  ReadAll(g_gz);
  std::vector<char> buf(1 << 20);
  for (auto _ : state) {
    const double t0 = Now();
    gzFile gz = gzopen(g_gz.c_str(), "rb");
    gzbuffer(gz, 1 << 17);
    int64_t total = 0;
    for (int n; (n = gzread(gz, buf.data(), static_cast<unsigned>(buf.size()))) > 0;) total += n;
    gzclose(gz);
    if (total != g_text_bytes) state.SkipWithError("inflated size differs");
    state.SetIterationTime(Now() - t0);
  }
  state.SetBytesProcessed(state.iterations() * g_text_bytes);
}

void Parse(benchmark::State& state, const std::string& path, bool cold) {
  ferry::data::CtrBatch batch;
  int64_t examples = 0;
  for (auto _ : state) {
    if (cold) Drop(path);
    else ReadAll(path);
    const double t0 = Now();
    auto reader = ferry::data::CriteoReader::Open(path);
    if (!reader.ok()) {
      state.SkipWithError(reader.status().ToString().c_str());
      return;
    }
    for (;;) {
      auto n = (*reader)->ReadBatch(4096, &batch);
      if (!n.ok() || *n == 0) break;
    }
    examples = (*reader)->stats().examples;
    if ((*reader)->stats().bytes != g_text_bytes) state.SkipWithError("the reader read a different number of bytes");
    state.SetIterationTime(Now() - t0);
  }
  state.counters["examples"] = static_cast<double>(examples);
  state.counters["examples_per_s"] = benchmark::Counter(
      static_cast<double>(examples) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(state.iterations() * g_text_bytes);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::filesystem::temp_directory_path().string();
  int64_t mb = 256;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--dir=", 0) == 0) {
      dir = a.substr(6);
    } else if (a.rfind("--mb=", 0) == 0) {
      mb = std::atoll(a.c_str() + 5);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (mb < 1) {
    std::fprintf(stderr, "--mb must be at least 1\n");
    return 2;
  }
  Generate(dir, mb);
  std::fprintf(stderr, "%lld bytes of text, %lld gzipped, in %s\n", static_cast<long long>(g_text_bytes),
               static_cast<long long>(std::filesystem::file_size(g_gz)), dir.c_str());
  benchmark::RegisterBenchmark("disk/cold", [](benchmark::State& s) { BM_Read(s, true); })
      ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
  benchmark::RegisterBenchmark("cache/read", [](benchmark::State& s) { BM_Read(s, false); })
      ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
  benchmark::RegisterBenchmark("gzip/inflate", BM_Inflate)
      ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
  benchmark::RegisterBenchmark("parse/plain", [](benchmark::State& s) { Parse(s, g_plain, false); })
      ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
  benchmark::RegisterBenchmark("parse/gzip", [](benchmark::State& s) { Parse(s, g_gz, false); })
      ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
  benchmark::RegisterBenchmark("parse/cold", [](benchmark::State& s) { Parse(s, g_plain, true); })
      ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::filesystem::remove(g_plain);
  std::filesystem::remove(g_gz);
  return 0;
}
