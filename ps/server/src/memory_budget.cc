#include "internal/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

namespace ferry::ps {
namespace {

std::string Mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// The cgroup (v2, then v1) memory limit of this process, or 0 when none is set.
int64_t CgroupLimit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text == "max") continue;
    try {
      const long long v = std::stoll(text);
      if (v > 0 && v < (int64_t{1} << 60)) return v;  // v1 says "no limit" with a huge number
    } catch (...) {
    }
  }
  return 0;
}

}  // namespace

int64_t MemoryBudget::DefaultLimit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t total = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{1} << 32;
  if (const int64_t cgroup = CgroupLimit(); cgroup > 0) total = std::min(total, cgroup);
  return total / 10 * 8;
}

bool MemoryBudget::TryTake(int64_t bytes) {
  int64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ - used) {
      refusals_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

Status MemoryBudget::Take(int64_t bytes, const std::string& what) {
  if (TryTake(bytes)) return Status::Ok();
  return ResourceExhaustedError(Refusal(bytes, what));
}

std::string MemoryBudget::Refusal(int64_t bytes, const std::string& what) const {
  return what + " would take " + Mib(bytes) + "; the server's memory budget (--memory-budget-mb) has " +
         Mib(std::max<int64_t>(0, limit_ - used())) + " of " + Mib(limit_) + " left";
}

}  // namespace ferry::ps
