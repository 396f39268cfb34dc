// ferry/metrics/process.h — the process's own series, under the names every Prometheus client
// library uses (client_golang's process collector), read from /proc/self at each scrape:
//   process_cpu_seconds_total       user + system CPU time
//   process_resident_memory_bytes   resident set size
//   process_virtual_memory_bytes    virtual memory size
//   process_open_fds                open file descriptors (sockets included: connections, files)
//   process_max_fds                 the limit on them (RLIMIT_NOFILE, soft)
//   process_start_time_seconds      when the process started, in seconds since the Unix epoch
// A value /proc cannot give (not Linux) is left out.
//
// Thread-safety: AddProcessMetrics may run on any thread.
#pragma once

#include "ferry/metrics/page.h"

namespace ferry::metrics {

// Adds the series above to `page`, each with `labels`.
void AddProcessMetrics(Page& page, const Labels& labels);

}  // namespace ferry::metrics
