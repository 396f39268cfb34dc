// Sparse-row updates as SparseShard applies them: one update call per row of `dim` floats, rows in
// a shuffled order over a table of 1M rows (cache-missing, as real pushes are). Built twice by
// rows.sh: "before" calls d937474's ps::ApplyUpdate, "after" (-DCHECKED) this tree's
// ps::ApplyUpdateChecked, as SparseShard::UpdateRow now does. Prints ns per row update, the best
// of 5 passes over 2M updates.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "internal/optimizer.h"

using namespace ferry;

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const int type = std::atoi(argv[1]);
  const size_t dim = static_cast<size_t>(std::atoi(argv[2]));
  const size_t rows = 1 << 20, n = 1 << 21;  // 2M row updates
  OptimizerSpec o;
  o.type = static_cast<OptimizerType>(type);
  o.learning_rate = 0.01f;
  const size_t slots = static_cast<size_t>(ps::StateSlots(o.type));
  std::vector<float> p(rows * dim, 0.5f), s(rows * dim * slots, 0.0f), g(dim, 0.25f);
  std::vector<uint32_t> order(n);
  std::mt19937 rng(1);
  for (auto& r : order) r = static_cast<uint32_t>(rng() % rows);
  std::vector<int64_t> steps(rows, 0);
  double best = 1e9;
  int64_t refused = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t r : order) {
#ifdef CHECKED
      refused += ps::ApplyUpdateChecked(o, p.data() + r * dim, g.data(), s.data() + r * dim * slots, dim, dim,
                                        ++steps[r]).count;
#else
      ps::ApplyUpdate(o, p.data() + r * dim, g.data(), s.data() + r * dim * slots, dim, dim, ++steps[r]);
#endif
    }
    const double elapsed = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    const double ns = elapsed / static_cast<double>(n);
    if (ns < best) best = ns;
  }
  std::printf("%.2f\n", best + static_cast<double>(refused));  // refused is 0: keeps the calls
}
