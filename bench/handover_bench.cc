// ferry-handover-bench: the pause of a placement hand-over (issue 38, protocol 1.17,
// Client::MoveSlots). Two servers (in this process, tcp on loopback, a shared checkpoint folder)
// hold a dense table (Adam) and a sparse one (Adagrad, dim 16); one sync worker trains. Each
// round: a training step's time (median of 5), the checkpoint the hand-over needs, reading that
// checkpoint whole (ps::ReadCheckpointAt: what every server did in a hand-over before
// HandOverFilter), reading what server 0 reads of it in the hand-over (the shards and slots that
// move to or from it: read_moving_ms), and MoveSlots moving every slot of server 1 to server 0,
// then back after 5 more steps. The pause a worker sees is checkpoint + MoveSlots; it is reported
// as a ratio to the step.
//
//   ferry-handover-bench [--dense-mb M] [--rows R] [--rounds K] [--dir D]
// Prints a table (stdout); bench/results/placement/ keeps a run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/messages/placement.h"
#include "ferry/server.h"
#include "internal/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using ferry::placement::Placement;

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

[[noreturn]] void Die(const std::string& what, const ferry::Status& s) {
  std::fprintf(stderr, "ferry-handover-bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

void Check(const std::string& what, const ferry::Status& s) {
  if (!s.ok()) Die(what, s);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t dense_mb = 64, rows = 1 << 20;
  int rounds = 3;
  std::string dir = "/tmp/ferry-handover-bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dense-mb") dense_mb = std::atoll(argv[i + 1]);
    else if (flag == "--rows") rows = std::atoll(argv[i + 1]);
    else if (flag == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (flag == "--dir") dir = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: ferry-handover-bench [--dense-mb M] [--rows R] [--rounds K] [--dir D]\n");
      return 2;
    }
  }
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::unique_ptr<ferry::Server>> servers;
  std::vector<std::string> endpoints;
  for (int r = 0; r < 2; ++r) {
    ferry::ServerOptions o;
    o.bind = "tcp://127.0.0.1:0";
    o.rank = r;
    o.num_servers = 2;
    o.num_workers = 1;
    o.checkpoint_dir = dir;
    auto s = ferry::Server::Start(o);
    if (!s.ok()) Die("starting server " + std::to_string(r), s.status());
    endpoints.push_back((*s)->endpoint());
    servers.push_back(std::move(*s));
  }
  ferry::ClientOptions co;
  co.servers = endpoints;
  auto client = ferry::Client::Connect(co);
  if (!client.ok()) Die("connecting", client.status());
  ferry::Client& w = **client;

  const int64_t n = dense_mb * (int64_t{1} << 20) / 4;
  ferry::TableSpec dense;
  dense.name = "w";
  dense.type = ferry::TableType::kDense;
  dense.shape = {n};
  dense.chunk_elems = int64_t{1} << 18;  // 1 MiB chunks: on both servers
  dense.consistency = ferry::Consistency::kSync;
  dense.optimizer.type = ferry::OptimizerType::kAdam;
  Check("declaring w", w.Declare(dense));
  constexpr int64_t kDim = 16;
  ferry::TableSpec sparse;
  sparse.name = "emb";
  sparse.type = ferry::TableType::kSparse;
  sparse.dim = kDim;
  sparse.consistency = ferry::Consistency::kSync;
  sparse.optimizer.type = ferry::OptimizerType::kAdagrad;
  Check("declaring emb", w.Declare(sparse));

  std::vector<float> g(static_cast<size_t>(n), 1e-3f), out(static_cast<size_t>(n));
  constexpr int64_t kBatch = 4096;
  std::vector<int64_t> ids(kBatch);
  std::vector<float> rows_in(kBatch * kDim, 1e-3f), rows_out(kBatch * kDim);
  int64_t step = 0;
  // Every row made: pushes of 64k ids in one step each.
  {
    const int64_t chunk = 65536;
    std::vector<int64_t> all(static_cast<size_t>(chunk));
    std::vector<float> grads(static_cast<size_t>(chunk * kDim), 1e-3f);
    for (int64_t from = 0; from < rows; from += chunk, ++step) {
      const int64_t k = std::min(chunk, rows - from);
      for (int64_t i = 0; i < k; ++i) all[static_cast<size_t>(i)] = from + i;
      Check("filling emb", w.PushSparse("emb", {all.data(), static_cast<size_t>(k)},
                                        {grads.data(), static_cast<size_t>(k * kDim)}, step)
                               .wait());
      Check("filling w", w.PushDense("w", g, step).wait());
    }
  }
  auto train = [&](int steps) {
    std::vector<double> ms;
    for (int i = 0; i < steps; ++i, ++step) {
      for (int64_t j = 0; j < kBatch; ++j) ids[static_cast<size_t>(j)] = (step * 7919 + j * 104729) % rows;
      const auto t0 = Clock::now();
      Check("pull w", w.PullDense("w", out, step).wait());
      Check("pull emb", w.PullSparse("emb", ids, rows_out, step).wait());
      Check("push w", w.PushDense("w", g, step).wait());
      Check("push emb", w.PushSparse("emb", ids, rows_in, step).wait());
      ms.push_back(Ms(t0, Clock::now()));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  const Placement first = Placement::First(2);
  const Placement drained = *first.Drain(1);
  uint64_t version = 1;
  std::printf("# ferry-handover-bench: dense %lld MiB (Adam: values + 2 state), sparse %lld rows x %lld (Adagrad), "
              "2 servers in one process (tcp loopback), 1 sync worker; checkpoint folder %s\n",
              static_cast<long long>(dense_mb), static_cast<long long>(rows), static_cast<long long>(kDim),
              dir.c_str());
  std::printf("%-6s %-9s %9s %9s %12s %9s %9s %10s %10s %15s\n", "round", "move", "step_ms", "ckpt_ms", "ckpt_MiB",
              "read_ms", "move_ms", "pause/step", "move/read", "read_moving_ms");
  for (int round = 0; round < rounds; ++round) {
    for (const bool drain : {true, false}) {
      const double step_ms = train(5);
      const auto t0 = Clock::now();
      Check("checkpoint", w.Checkpoint(step));
      const auto t1 = Clock::now();
      auto read = ferry::ps::ReadCheckpointAt(dir, step);
      const auto t2 = Clock::now();
      if (!read.ok()) Die("reading the checkpoint", read.status());
      uint64_t bytes = 0;
      for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name.find("step-" + std::string(20 - std::to_string(step).size(), '0') + std::to_string(step)) == 0) {
          bytes += e.file_size();
        }
      }
      *read = ferry::ps::CheckpointData{};  // (its memory back before the next read)
      const ferry::ps::CheckpointFilter moving = ferry::ps::HandOverFilter(drain ? first : drained,
                                                                           drain ? drained : first, 0);
      double read_moving_ms = 0;
      {
        const auto t5 = Clock::now();
        auto part = ferry::ps::ReadCheckpointAt(dir, step, &moving);
        read_moving_ms = Ms(t5, Clock::now());
        if (!part.ok()) Die("reading what moves", part.status());
      }
      const auto t3 = Clock::now();
      Check("MoveSlots", w.MoveSlots(++version, (drain ? drained : first).Owners(), step));
      const auto t4 = Clock::now();
      const double ckpt_ms = Ms(t0, t1), read_ms = Ms(t1, t2), move_ms = Ms(t3, t4);
      std::printf("%-6d %-9s %9.2f %9.1f %12.1f %9.1f %9.1f %10.1f %10.2f %15.1f\n", round,
                  drain ? "1->0" : "back", step_ms, ckpt_ms, static_cast<double>(bytes) / (1 << 20), read_ms,
                  move_ms, (ckpt_ms + move_ms) / step_ms, move_ms / read_ms, read_moving_ms);
      std::fflush(stdout);
    }
  }
  const double step_ms = train(5);
  std::printf("# after the last move: step %.2f ms (placement version %llu)\n", step_ms,
              static_cast<unsigned long long>(w.placement_version()));
  fs::remove_all(dir);
  return 0;
}
