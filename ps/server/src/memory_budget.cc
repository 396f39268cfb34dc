#include "internal/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ferry::ps {

std::string Mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A limit file's value: bytes, or 0 for none ("max" in v2; v1 says "none" with a number near
// 2^63, rounded down to its page size).
int64_t LimitIn(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return 0;
  try {
    const long long v = std::stoll(text);
    if (v > 0 && v < (int64_t{1} << 60)) return v;
  } catch (...) {
  }
  return 0;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) out.push_back(part);
  return out;
}

// mountinfo escapes a space, tab, newline and backslash in paths as octal (\040).
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto digit = [&](size_t j) { return std::isdigit(static_cast<unsigned char>(s[j])) != 0; };
    if (s[i] == '\\' && i + 3 < s.size() && digit(i + 1) && digit(i + 2) && digit(i + 3)) {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// One cgroup hierarchy this process is in: its path in the hierarchy, and whether it is v2.
struct Membership {
  bool v2 = false;
  std::string path;
};

}  // namespace

int64_t MemoryBudget::CgroupLimit(const std::string& proc_cgroup, const std::string& mountinfo,
                                  const std::string& root) {
  // /proc/self/cgroup: "ID:controllers:path"; v2 is "0::path", v1's memory hierarchy names
  // "memory" among its controllers.
  std::vector<Membership> memberships;
  for (const std::string& line : Split(proc_cgroup, '\n')) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.substr(0, a) == "0" && controllers.empty()) {
      memberships.push_back({true, path});
    } else {
      for (const std::string& c : Split(controllers, ',')) {
        if (c == "memory") memberships.push_back({false, path});
      }
    }
  }
  int64_t limit = 0;
  const auto take = [&limit](int64_t v) {
    if (v > 0) limit = limit == 0 ? v : std::min(limit, v);
  };
  // /proc/self/mountinfo: "ID parent major:minor root mount-point options [optional...] - type
  // source super-options". Each mount of the hierarchy: the process's directory is the mount
  // point plus its path below the mount's root; its ancestors up to the mount point are read too.
  for (const std::string& line : Split(mountinfo, '\n')) {
    const std::vector<std::string> f = Split(line, ' ');
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || dash + 1 == f.end()) continue;
    const std::string& type = *(dash + 1);
    const bool v2 = type == "cgroup2";
    bool v1_memory = false;
    if (type == "cgroup" && f.end() - dash > 3) {
      for (const std::string& o : Split(*(dash + 3), ',')) v1_memory = v1_memory || o == "memory";
    }
    if (!v2 && !v1_memory) continue;
    const std::string mount_root = Unescape(f[3]), mount_point = Unescape(f[4]);
    for (const Membership& m : memberships) {
      if (m.v2 != v2) continue;
      // The process's path below the mount's root ("/" roots hold every path); a path outside it
      // (another namespace's view) reads the mount itself.
      std::string below(1, '/');
      if (mount_root == "/") {
        below = m.path;
      } else if (m.path == mount_root || m.path.rfind(mount_root + "/", 0) == 0) {
        below = m.path.substr(mount_root.size());
      }
      const char* file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
      std::string dir = below;
      while (!dir.empty() && dir.back() == '/') dir.pop_back();
      for (;;) {
        take(LimitIn(root + mount_point + dir + file));
        const size_t slash = dir.rfind('/');
        if (dir.empty() || slash == std::string::npos) break;
        dir.resize(slash);
      }
    }
  }
  return limit;
}

namespace {

// This process's cgroup memory limit (CgroupLimit of the real files), or 0.
int64_t OwnCgroupLimit() {
  return MemoryBudget::CgroupLimit(ReadFile("/proc/self/cgroup"), ReadFile("/proc/self/mountinfo"));
}

}  // namespace

int64_t MemoryBudget::DefaultLimit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t total = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{1} << 32;
  if (const int64_t cgroup = OwnCgroupLimit(); cgroup > 0) total = std::min(total, cgroup);
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
