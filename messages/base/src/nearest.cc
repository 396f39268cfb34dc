#include "ferry/nearest.h"

#include <algorithm>
#include <vector>

namespace ferry {
namespace {

// Optimal string alignment distance (Damerau-Levenshtein without repeated edits of a substring).
size_t EditDistance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  std::vector<size_t> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (size_t j = 0; j <= m; ++j) prev[j] = j;
  for (size_t i = 1; i <= n; ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[m];
}

}  // namespace

std::string_view Nearest(std::string_view word, std::span<const std::string_view> names) {
  const size_t limit = std::clamp<size_t>(word.size() / 3, 1, 3);
  std::string_view best;
  size_t best_distance = limit + 1;
  for (std::string_view name : names) {
    const size_t d = EditDistance(word, name);
    if (d < best_distance) best = name, best_distance = d;
  }
  return best;
}

std::string DidYouMean(std::string_view word, std::span<const std::string_view> names) {
  const std::string_view near = Nearest(word, names);
  return near.empty() ? std::string() : " (did you mean " + std::string(near) + "?)";
}

std::string JoinNames(std::span<const std::string_view> names) {
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

}  // namespace ferry
