#include "ferry/metrics/process.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <limits>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace ferry::metrics {
namespace {

// The fields of /proc/self/stat after the command name (which may hold spaces): fields[0] is the
// state, the 3rd field of proc(5); empty if it cannot be read.
std::vector<std::string> StatFields() {
  std::ifstream in("/proc/self/stat");
  const std::string line((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = line.rfind(')');
  if (name_end == std::string::npos) return {};
  std::istringstream rest(line.substr(name_end + 1));
  return {std::istream_iterator<std::string>(rest), std::istream_iterator<std::string>()};
}

// The boot time in seconds since the epoch (/proc/stat "btime"); -1 if unknown.
double BootTime() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double t = -1;
      in >> t;
      return t;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return -1;
}

}  // namespace

void AddProcessMetrics(Page& page, const Labels& labels) {
  const std::vector<std::string> f = StatFields();
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  // proc(5) numbers the fields from 1; f[0] is field 3. utime 14, stime 15, starttime 22,
  // vsize 23, rss 24 (pages).
  auto field = [&](size_t n) { return std::stod(f[n - 3]); };
  if (f.size() >= 22 && ticks > 0) {
    page.Counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", labels,
                 (field(14) + field(15)) / ticks);
    page.Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", labels, field(23));
    page.Gauge("process_resident_memory_bytes", "Resident memory size in bytes.", labels,
               field(24) * static_cast<double>(::sysconf(_SC_PAGESIZE)));
    if (const double boot = BootTime(); boot >= 0) {
      page.Gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", labels,
                 boot + field(22) / ticks);
    }
  }
  std::error_code error;
  double fds = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", error), end; !error && it != end; it.increment(error)) {
    ++fds;
  }
  if (!error) {
    // The iterator's own descriptor is among those listed: not one of the process's.
    page.Gauge("process_open_fds", "Number of open file descriptors.", labels, fds - 1);
  }
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    page.Gauge("process_max_fds", "Maximum number of open file descriptors.", labels,
               static_cast<double>(limit.rlim_cur));
  }
}

}  // namespace ferry::metrics
