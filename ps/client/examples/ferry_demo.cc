// ferry-demo: a small cluster job until the full trainer lands. Each worker fits a linear model
// with a per-user bias — y = x.w + b[user] — to synthetic data with a known answer, pulling and
// pushing a dense table (w) and a sparse table (b) through the parameter servers in sync mode.
//
//   ferry-demo --servers tcp://127.0.0.1:7470,tcp://127.0.0.1:7471 --workers 2 --steps 300
//
// The tables live on the servers and outlive the run. A second run against the same servers
// would find them trained and their sync step past its own, so it refuses, saying so: restart
// the servers, or pass --prefix to train a fresh pair of tables beside the old ones.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferry/messages/placement.h"

namespace {

constexpr int kDim = 32, kUsers = 1000, kBatch = 64;

float Hash01(uint64_t a, uint64_t b, uint64_t c) {  // [-1, 1)
  using ferry::placement::Mix64;
  return static_cast<float>(Mix64(Mix64(Mix64(a) ^ b) ^ c) >> 40) / static_cast<float>(1 << 23) - 1.0f;
}
float TrueW(int i) { return Hash01(1, 0, static_cast<uint64_t>(i)); }
float TrueB(int64_t u) { return 0.5f * Hash01(2, 0, static_cast<uint64_t>(u)); }

struct Result {
  float first_loss = 0, last_loss = 0;
  ferry::Status status;
};

void Work(const std::vector<std::string>& servers, const std::string& prefix, int rank, int workers, int steps,
          Result* out) {
  ferry::ClientOptions o;
  o.servers = servers;
  o.rank = rank;
  o.num_workers = workers;
  auto client = ferry::Client::Connect(o);
  if (!client.ok()) {
    out->status = client.status();
    return;
  }
  ferry::Client& c = **client;
  ferry::TableSpec w;
  w.name = prefix + "w";
  w.shape = {kDim};
  w.optimizer.type = ferry::OptimizerType::kAdam;
  w.optimizer.learning_rate = 0.05f;
  w.consistency = ferry::Consistency::kSync;
  ferry::TableSpec b = w;
  b.name = prefix + "user_bias";
  b.type = ferry::TableType::kSparse;
  b.shape.clear();
  b.dim = 1;
  if (!(out->status = c.Declare(w)).ok() || !(out->status = c.Declare(b)).ok()) return;

  std::vector<float> wv(kDim), gw(kDim), x(kBatch * kDim), y(kBatch), bias(kBatch), gb(kBatch);
  std::vector<int64_t> users(kBatch);
  for (int t = 0; t < steps; ++t) {
    // This worker's batch for step t (every worker sees different examples).
    for (int i = 0; i < kBatch; ++i) {
      const uint64_t ex =
          static_cast<uint64_t>(t) * 1000003u + static_cast<uint64_t>(rank) * 7919u + static_cast<uint64_t>(i);
      users[static_cast<size_t>(i)] = static_cast<int64_t>(ferry::placement::Mix64(ex) % kUsers);
      float target = TrueB(users[static_cast<size_t>(i)]) + 0.01f * Hash01(4, ex, 0);
      for (int j = 0; j < kDim; ++j) {
        x[static_cast<size_t>(i * kDim + j)] = Hash01(3, ex, static_cast<uint64_t>(j));
        target += x[static_cast<size_t>(i * kDim + j)] * TrueW(j);
      }
      y[static_cast<size_t>(i)] = target;
    }
    ferry::Handle hw = c.PullDense(w.name, wv, t);
    ferry::Handle hb = c.PullSparse(b.name, users, bias, t);  // both in flight together
    if (!(out->status = hw.wait()).ok() || !(out->status = hb.wait()).ok()) return;
    // Fresh tables start at zero (InitType::kZeros) and no push of step 0 can land before every
    // worker's pull of step 0; anything else is a table trained by an earlier run.
    if (t == 0 && (std::any_of(wv.begin(), wv.end(), [](float v) { return v != 0.0f; }) ||
                   std::any_of(bias.begin(), bias.end(), [](float v) { return v != 0.0f; }))) {
      out->status = ferry::AlreadyExistsError(
          "the servers already hold tables " + w.name + " and " + b.name +
          " trained by an earlier ferry-demo run (step 0 pulled non-zero values), so this run can neither "
          "start from scratch nor push its sync steps; restart the ferry-ps processes, or pass "
          "--prefix NAME/ (now '" + prefix + "') to train new tables beside the old ones");
      return;
    }
    float loss = 0;
    std::fill(gw.begin(), gw.end(), 0.0f);
    for (int i = 0; i < kBatch; ++i) {
      float pred = bias[static_cast<size_t>(i)];
      for (int j = 0; j < kDim; ++j) pred += x[static_cast<size_t>(i * kDim + j)] * wv[static_cast<size_t>(j)];
      const float err = pred - y[static_cast<size_t>(i)];
      loss += err * err / kBatch;
      for (int j = 0; j < kDim; ++j)
        gw[static_cast<size_t>(j)] += 2.0f * err * x[static_cast<size_t>(i * kDim + j)] / kBatch;
      gb[static_cast<size_t>(i)] = 2.0f * err / kBatch;  // repeated users are summed by the client
    }
    if (t == 0) out->first_loss = loss;
    out->last_loss = loss;
    if (rank == 0 && (t % 50 == 0 || t == steps - 1)) std::printf("step %4d  worker 0 batch loss %.5f\n", t, loss);
    ferry::Handle pw = c.PushDense(w.name, gw, t);
    ferry::Handle pb = c.PushSparse(b.name, users, gb, t);
    if (!(out->status = pw.wait()).ok() || !(out->status = pb.wait()).ok()) return;
  }
  if (rank == 0) {
    if (!(out->status = c.PullDense(w.name, wv, steps).wait()).ok()) return;
    double err = 0, norm = 0;
    for (int j = 0; j < kDim; ++j)
      err += std::pow(wv[static_cast<size_t>(j)] - TrueW(j), 2), norm += std::pow(TrueW(j), 2);
    std::printf("relative error of w against the planted model: %.4f\n", std::sqrt(err / norm));
  }
}

}  // namespace

int main(int argc, char** argv) {
  constexpr const char* kUsage = "usage: ferry-demo --servers E1,E2 [--workers N >= 1] [--steps S >= 1] [--prefix P]\n";
  std::vector<std::string> servers;
  std::string prefix = "demo/";
  int workers = 2, steps = 300;
  for (int i = 1; i < argc; i += 2) {
    std::string_view f = argv[i];
    if (f == "--help" || f == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "ferry-demo: %s needs a value\n%s", argv[i], kUsage);
      return 2;
    }
    if (f == "--servers") {
      std::string_view s = argv[i + 1];
      for (size_t at = 0; at <= s.size();) {
        size_t comma = s.find(',', at);
        if (comma == std::string_view::npos) comma = s.size();
        if (comma > at) servers.emplace_back(s.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (f == "--workers") {
      workers = std::atoi(argv[i + 1]);
    } else if (f == "--steps") {
      steps = std::atoi(argv[i + 1]);
    } else if (f == "--prefix") {
      prefix = argv[i + 1];
    } else {
      std::fprintf(stderr, "ferry-demo: unknown flag %s\n%s", argv[i], kUsage);
      return 2;
    }
  }
  if (servers.empty() || workers < 1 || steps < 1) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::vector<Result> results(static_cast<size_t>(workers));
  std::vector<std::thread> threads;
  for (int r = 0; r < workers; ++r)
    threads.emplace_back(Work, servers, prefix, r, workers, steps, &results[static_cast<size_t>(r)]);
  for (auto& t : threads) t.join();
  for (int r = 0; r < workers; ++r) {
    if (!results[static_cast<size_t>(r)].status.ok()) {
      std::fprintf(stderr, "ferry-demo: worker %d: %s\n", r, results[static_cast<size_t>(r)].status.ToString().c_str());
      return 1;
    }
  }
  const auto& r0 = results[0];
  std::printf("trained %d sync steps on %d workers x %zu servers: loss %.4f -> %.5f\n", steps, workers, servers.size(),
              r0.first_loss, r0.last_loss);
  if (!(r0.last_loss < 0.1f * r0.first_loss)) {
    std::fprintf(stderr, "ferry-demo: the loss did not fall below a tenth of its first value (%.5f -> %.5f): "
                 "training did not converge; try more --steps\n", r0.first_loss, r0.last_loss);
    return 1;
  }
  return 0;
}
