// ferry-placement-bench: what a change of the server set moves (issue 38). For a server added to
// S (S -> S+1) and one drained (S -> S-1), the share of sparse rows and dense chunks whose server
// changes under Ferry's slot placement (placement::Placement::Grow / Drain), against the ideal
// (1/(S+1) for an added server, 1/S for a drained one) and against the rule of "hash mod S" that
// Ferry used before slots; the largest server's rows over the mean after the change; and the time
// a client spends placing an id (the rule of 1.15, the first map's free function, a map).
//
//   ferry-placement-bench [--ids N] [--max-servers S]
// Prints a table (stdout); bench/results/placement/ keeps a run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ferry/messages/placement.h"

namespace {

using ferry::placement::Mix64;
using ferry::placement::Placement;

struct Moved {
  double rows = 0;      // share of the ids whose server changed
  double chunks = 0;    // share of the dense chunks whose server changed
  double max_load = 0;  // the most rows on one active server, over the mean of the active ones
};

Moved Compare(const std::vector<int64_t>& ids, const std::vector<std::pair<uint64_t, int64_t>>& chunks,
              const Placement& a, const Placement& b) {
  Moved m;
  std::vector<int64_t> load(static_cast<size_t>(b.num_servers()), 0);
  int64_t rows = 0;
  for (int64_t id : ids) {
    const int to = b.IdServer(id);
    rows += a.IdServer(id) != to;
    ++load[static_cast<size_t>(to)];
  }
  int64_t moved_chunks = 0;
  for (const auto& [t, c] : chunks) moved_chunks += a.ChunkServer(t, c) != b.ChunkServer(t, c);
  m.rows = static_cast<double>(rows) / static_cast<double>(ids.size());
  m.chunks = static_cast<double>(moved_chunks) / static_cast<double>(chunks.size());
  const double mean = static_cast<double>(ids.size()) / b.ActiveServers();
  m.max_load = static_cast<double>(*std::max_element(load.begin(), load.end())) / mean;
  return m;
}

// The share of ids whose server changes from "mix64 mod a" to "mix64 mod b".
double ModuloMoved(const std::vector<int64_t>& ids, int a, int b) {
  int64_t moved = 0;
  for (int64_t id : ids) {
    const uint64_t h = Mix64(static_cast<uint64_t>(id));
    moved += h % static_cast<uint64_t>(a) != h % static_cast<uint64_t>(b);
  }
  return static_cast<double>(moved) / static_cast<double>(ids.size());
}

__attribute__((noinline)) int RuleOf115(int64_t id, int n) {
  return static_cast<int>(Mix64(static_cast<uint64_t>(id)) % static_cast<uint64_t>(n));
}
__attribute__((noinline)) int FirstMap(int64_t id, int n) { return ferry::placement::IdServer(id, n); }
__attribute__((noinline)) int Map(const Placement& p, int64_t id) { return p.IdServer(id); }

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 1'000'000;
  int max_servers = 16;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--ids") == 0 && i + 1 < argc) {
      n = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--max-servers") == 0 && i + 1 < argc) {
      max_servers = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: ferry-placement-bench [--ids N] [--max-servers S]\n");
      return 2;
    }
  }
  if (n < 1 || max_servers < 2 || max_servers > ferry::placement::kSlots) {
    std::fprintf(stderr, "ferry-placement-bench: --ids >= 1, --max-servers in [2, %d]\n", ferry::placement::kSlots);
    return 2;
  }
  // Random 64-bit ids (hashed features) and 1,000 dense tables of 1-64 chunks.
  std::mt19937_64 rng(38);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = static_cast<int64_t>(rng());
  std::vector<std::pair<uint64_t, int64_t>> chunks;
  for (uint64_t t = 0; t < 1000; ++t) {
    const int64_t k = 1 + static_cast<int64_t>(rng() % 64);
    for (int64_t c = 0; c < k; ++c) chunks.emplace_back(Mix64(t * 7919 + 1), c);
  }
  std::printf("ids %lld (random 64-bit), dense chunks %zu (1,000 tables of 1-64), slots %d\n\n",
              static_cast<long long>(n), chunks.size(), ferry::placement::kSlots);
  std::printf("%-10s %8s %10s %8s %10s %10s %11s\n", "change", "ideal", "rows", "/ideal", "chunks", "mod S",
              "max load");
  // Grown one server at a time from one; then a job that starts with S and adds one.
  Placement p = Placement::First(1);
  for (int s = 1; s < max_servers; ++s) {
    const Placement next = p.Grow().value();
    const Moved m = Compare(ids, chunks, p, next);
    const double ideal = 1.0 / (s + 1);
    std::printf("%3d -> %-3d %8.4f %10.4f %8.3f %10.4f %10.4f %11.4f\n", s, s + 1, ideal, m.rows, m.rows / ideal,
                m.chunks, ModuloMoved(ids, s, s + 1), m.max_load);
    p = next;
  }
  std::printf("\n%-10s %8s %10s %8s %10s %10s %11s %12s\n", "first map", "ideal", "rows", "/ideal", "chunks", "mod S",
              "max load", "S+1 chunks");
  for (int s = 2; s <= max_servers; ++s) {
    const Placement first = Placement::First(s);
    const Placement next = first.Grow().value();
    const Moved m = Compare(ids, chunks, first, next);
    const double ideal = 1.0 / (s + 1);
    // A table of S+1 chunks: the most of them on one server, the worst of 1,000 tables.
    int most = 0;
    for (uint64_t t = 0; t < 1000; ++t) {
      std::vector<int> on(static_cast<size_t>(s) + 1, 0);
      for (int64_t c = 0; c <= s; ++c) most = std::max(most, ++on[static_cast<size_t>(next.ChunkServer(Mix64(t), c))]);
    }
    std::printf("%3d -> %-3d %8.4f %10.4f %8.3f %10.4f %10.4f %11.4f %12d\n", s, s + 1, ideal, m.rows, m.rows / ideal,
                m.chunks, ModuloMoved(ids, s, s + 1), m.max_load, most);
  }
  // Drains from the first map of S: rank 0, the middle rank, the last.
  std::printf("\n%-16s %8s %10s %8s %10s %10s %11s\n", "drain", "ideal", "rows", "/ideal", "chunks", "mod S",
              "max load");
  for (int s : {2, 3, 4, 8, max_servers}) {
    const Placement first = Placement::First(s);
    std::vector<int> ranks = {0, s / 2, s - 1};
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    for (int rank : ranks) {
      auto drained = first.Drain(rank);
      if (!drained.ok()) {
        std::fprintf(stderr, "ferry-placement-bench: %s\n", drained.status().ToString().c_str());
        return 1;
      }
      const Placement next = *drained;
      const Moved m = Compare(ids, chunks, first, next);
      const double ideal = 1.0 / s;
      std::printf("%3d -> %-3d rank %-2d %8.4f %10.4f %8.3f %10.4f %10.4f %11.4f\n", s, s - 1, rank, ideal, m.rows,
                  m.rows / ideal, m.chunks, ModuloMoved(ids, s, s - 1), m.max_load);
    }
  }
  // What placing an id costs a client, ns an id: 5 rounds, the three in turn.
  const int servers = 3 + (argc > 1000);  // not a constant the compiler can fold
  const Placement map = Placement::First(servers);
  std::printf("\nns to place an id (%d servers), 5 rounds: rule of 1.15 | first map (free function) | map\n", servers);
  for (int round = 0; round < 5; ++round) {
    int64_t sum = 0;
    double ns[3];
    for (int k = 0; k < 3; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t id : ids) sum += k == 0 ? RuleOf115(id, servers) : k == 1 ? FirstMap(id, servers) : Map(map, id);
      ns[k] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
              static_cast<double>(ids.size());
    }
    std::printf("  %.2f | %.2f | %.2f  (checksum %lld)\n", ns[0], ns[1], ns[2], static_cast<long long>(sum));
  }
  return 0;
}
