// bench/feed_bench.cc — what the change feed (ferry/feed.h) costs training, and how stale its copy
// is (issue 36). Two servers (in this process, tcp on 127.0.0.1) hold a sparse SGD table of --rows
// rows of dim 16; one async worker pushes batches of 4096 ids drawn Zipf (s = 1.1) over the rows,
// as fast as it can, each step also pushing -1 to a marker row (its values count the steps
// applied). Modes, alternating within each round in an order that rotates: "off" (no reader),
// "every-1000ms" and "every-100ms" (a reader polls the table into a TableCopy, then sleeps that
// long), "continuous" (a reader polls back to back). Per mode: the worker's steps/s, and the
// copy's staleness: the age of the oldest step the servers had acknowledged that the copy lacks
// (0 when it lacks none), from the marker row, right after each poll, and just before each poll's
// end (the poll before's staleness plus the time between them: the copy does not change between
// polls while the worker goes on), which is the most a serving copy lags. The reader's copy
// is loaded once before the modes (timed: the initial load) and followed from then on. Reader,
// worker and servers share the machine's cores, so "the cost" includes the reader's own CPU: the
// process's CPU time and the reader thread's are recorded per run.
//
//   ferry-feed-bench [--rows N] [--seconds S] [--rounds R] > results.json
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/client.h"
#include "ferry/feed.h"
#include "ferry/server.h"
#include "zipf.h"

namespace {

using ferry::bench::Zipf;

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
constexpr int64_t kDim = 16;
constexpr int kBatch = 4096;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::min<double>(static_cast<double>(v.size() - 1), p * static_cast<double>(v.size())))];
}

double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 1'000'000;
  double seconds = 5;
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--rows") rows = std::atoll(argv[i + 1]);
    else if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (flag == "--rounds") rounds = std::atoi(argv[i + 1]);
    else return std::fprintf(stderr, "usage: ferry-feed-bench [--rows N] [--seconds S] [--rounds R]\n"), 2;
  }
  std::vector<std::unique_ptr<ferry::Server>> servers;
  std::vector<std::string> endpoints;
  for (int r = 0; r < 2; ++r) {
    ferry::ServerOptions so;
    so.bind = "tcp://127.0.0.1:0";
    so.rank = r;
    so.num_servers = 2;
    so.num_workers = 1;
    auto s = ferry::Server::Start(so);
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.status().message().c_str()), 1;
    endpoints.push_back((*s)->endpoint());
    servers.push_back(std::move(*s));
  }
  ferry::ClientOptions co;
  co.servers = endpoints;
  auto client = ferry::Client::Connect(co);
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().message().c_str()), 1;
  ferry::Client& c = **client;
  ferry::TableSpec spec;
  spec.name = "emb";
  spec.type = ferry::TableType::kSparse;
  spec.dim = kDim;
  spec.consistency = ferry::Consistency::kAsync;
  spec.optimizer.learning_rate = 1.0f;
  if (!c.Declare(spec).ok()) return 1;
  const int64_t marker = rows;  // outside the Zipf range
  {
    std::vector<int64_t> ids;
    std::vector<float> g;
    for (int64_t b = 0; b < rows; b += 65536) {  // every row made first: the table has its size
      ids.clear();
      for (int64_t i = b; i < std::min(rows, b + 65536); ++i) ids.push_back(i);
      g.assign(ids.size() * kDim, 0.001f);
      if (!c.PushSparse("emb", ids, g, 0).wait().ok()) return 1;
    }
  }
  // The reader: one feed and one copy for the whole run, loaded once first (as a serving process
  // starts), then kept up to date by each mode's polls.
  ferry::FeedOptions fo;
  fo.servers = endpoints;
  auto feed = ferry::ChangeFeed::Connect(fo);
  if (!feed.ok()) return std::fprintf(stderr, "%s\n", feed.status().message().c_str()), 1;
  ferry::TableCopy copy;
  Json load;
  {
    const Clock::time_point t0 = Clock::now();
    ferry::TableChanges ch;
    if (!(*feed)->Poll("emb", &ch).ok()) return 1;
    const double poll_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!copy.Apply(ch, 2).ok()) return 1;
    load["poll_s"] = poll_s;
    load["apply_s"] = std::chrono::duration<double>(Clock::now() - t0).count() - poll_s;
    load["rows"] = ch.ids.size();
    load["pages"] = ch.pages;
    load["mb"] = static_cast<double>(ch.rows.size() * sizeof(float) + ch.ids.size() * 8) / 1e6;
    std::fprintf(stderr, "initial load: %zu rows in %lld pages, poll %.2f s, apply %.2f s\n", ch.ids.size(),
                 static_cast<long long>(ch.pages), poll_s, load["apply_s"].get<double>());
  }
  const Zipf zipf(rows, 1.1);
  std::mt19937_64 gen(1);
  int64_t marker_steps = 0;
  Json out;
  out["rows"] = rows;
  out["dim"] = kDim;
  out["batch"] = kBatch;
  out["seconds"] = seconds;
  out["initial_load"] = load;
  const char* modes[] = {"off", "every-1000ms", "every-100ms", "continuous"};
  constexpr int kModes = 4;
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < kModes; ++k) {
      const std::string mode = modes[(k + round) % kModes];
      std::atomic<bool> stop{false};
      std::mutex mu;
      std::vector<Clock::time_point> acked;  // acked[k]: when the marker's (k+1)th step was acknowledged
      acked.reserve(1 << 16);
      std::vector<double> stale;  // right after each poll
      std::vector<double> peak;   // just before each poll's end: the one before's staleness + the time between
      std::vector<double> poll_s;  // each poll's time, Poll and Apply
      int64_t polls = 0;
      double reader_cpu_s = 0;  // the reader thread's own CPU time
      const double process_cpu0 = ProcessCpuSeconds();
      std::thread reader;
      if (mode != "off") {
        reader = std::thread([&] {
          Clock::time_point last_end{};
          while (!stop.load()) {
            ferry::TableChanges ch;
            const Clock::time_point begin = Clock::now();
            if (!(*feed)->Poll("emb", &ch).ok() || !copy.Apply(ch, 2).ok()) return;
            const Clock::time_point t = Clock::now();
            poll_s.push_back(std::chrono::duration<double>(t - begin).count());
            const float* m = copy.row(marker);
            const int64_t seen = m == nullptr ? 0 : static_cast<int64_t>(m[0]);  // SGD at 1 of -1: +1 a step
            {
              std::lock_guard<std::mutex> lock(mu);
              const int64_t first = marker_steps - static_cast<int64_t>(acked.size());  // steps before this mode
              const int64_t missing = seen - first;  // the copy lacks acked[missing] on
              if (!stale.empty()) peak.push_back(stale.back() + std::chrono::duration<double>(t - last_end).count());
              stale.push_back(missing >= 0 && missing < static_cast<int64_t>(acked.size())
                                  ? std::chrono::duration<double>(t - acked[static_cast<size_t>(missing)]).count()
                                  : 0.0);
            }
            last_end = t;
            ++polls;
            if (mode == "every-100ms") std::this_thread::sleep_for(std::chrono::milliseconds(100));
            if (mode == "every-1000ms") std::this_thread::sleep_for(std::chrono::milliseconds(1000));
          }
          reader_cpu_s = ThreadCpuSeconds();
        });
      }
      std::vector<int64_t> ids(kBatch);
      std::vector<float> g(kBatch * kDim);
      const std::vector<int64_t> mid = {marker};
      const std::vector<float> mg(kDim, -1.0f);
      int64_t steps = 0;
      const Clock::time_point t0 = Clock::now();
      while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds) {
        for (auto& id : ids) id = zipf(gen);
        for (auto& v : g) v = std::uniform_real_distribution<float>(-0.01f, 0.01f)(gen);
        // The batch, then the marker (acknowledged after the batch: its count is a lower bound).
        if (!c.PushSparse("emb", ids, g, steps).wait().ok()) return 1;
        if (!c.PushSparse("emb", mid, mg, steps).wait().ok()) return 1;
        {
          std::lock_guard<std::mutex> lock(mu);
          acked.push_back(Clock::now());
          ++marker_steps;
        }
        ++steps;
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
      const double process_cpu_s = ProcessCpuSeconds() - process_cpu0;
      stop = true;
      if (reader.joinable()) reader.join();
      Json r;
      r["round"] = round;
      r["mode"] = mode;
      r["steps_per_s"] = static_cast<double>(steps) / elapsed;
      r["polls"] = polls;
      r["staleness_p50_s"] = Percentile(stale, 0.5);
      r["staleness_p99_s"] = Percentile(stale, 0.99);
      r["staleness_max_s"] = stale.empty() ? 0.0 : *std::max_element(stale.begin(), stale.end());
      r["peak_staleness_p50_s"] = Percentile(peak, 0.5);
      r["peak_staleness_p99_s"] = Percentile(peak, 0.99);
      r["peak_staleness_max_s"] = peak.empty() ? 0.0 : *std::max_element(peak.begin(), peak.end());
      r["process_cpu_s"] = process_cpu_s;  // servers, worker and reader, over the run's seconds
      r["reader_cpu_s"] = reader_cpu_s;    // (to the stop: a poll after it adds a little)
      r["poll_p50_s"] = Percentile(poll_s, 0.5);
      r["poll_p99_s"] = Percentile(poll_s, 0.99);
      std::fprintf(stderr,
                   "round %d %-12s %8.1f steps/s  polls %5lld (p50 %.3f s)  staleness after a poll p50 %.3f s max %.3f "
                   "s, before one p50 %.3f s max %.3f s\n",
                   round, mode.c_str(), static_cast<double>(steps) / elapsed, static_cast<long long>(polls),
                   r["poll_p50_s"].get<double>(), r["staleness_p50_s"].get<double>(),
                   r["staleness_max_s"].get<double>(), r["peak_staleness_p50_s"].get<double>(),
                   r["peak_staleness_max_s"].get<double>());
      out["runs"].push_back(r);
    }
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
