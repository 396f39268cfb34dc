// ps/server/internal/server_metrics.h — a server's metrics page (ServerOptions::metrics_bind):
// its counters and levels (ServerStats) as Prometheus series, how long its requests take per
// kind, the process's own series (ferry/metrics/process.h) and the tables' (table_metrics.h).
// Every series carries server="<rank>"; the names are listed in README.md ("Seeing the tables").
//
// Thread-safety: RequestLatencies is kept by the I/O thread (its histograms lock, so reading them
// elsewhere would be safe too); ServerMetricsText is pure but for reading /proc/self.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/messages/wire.h"
#include "ferry/metrics/page.h"
#include "ferry/server.h"
#include "internal/disk_tier.h"
#include "internal/table_metrics.h"

namespace ferry::ps {

// Per message kind: the server's own time on a request (from reading it to sending its reply,
// less the time it was held) and, for requests that waited, how long (sync pulls for their step,
// ssp pulls for the slowest clock, collectives for every worker, declarations for their table).
class RequestLatencies {
 public:
  // A request of `kind` answered; `held_s` < 0: it never waited.
  void Observe(wire::Kind kind, double service_s, double held_s);
  // ferry_request_service_seconds{kind} and, for the kinds that were ever held,
  // ferry_request_held_seconds{kind} (histograms), labelled `server` too.
  void AddTo(metrics::Page& page, const metrics::Labels& server) const;

 private:
  struct OfKind {
    metrics::LatencyHistogram service, held;
    bool ever_held = false;
  };
  std::map<std::string_view, OfKind> kinds_;  // by wire::KindName (kinds it does not know: one)
};

// The page of server `rank`: `stats`' counters as ferry_*_total counters and its levels as
// gauges (per worker ones labelled worker="<rank>"; the row lifecycle sums are left to the
// per-table series), then `latencies`, the process's series and the tables', each labelled
// table="<name>": ferry_table_{rows,bytes} (gauges), ferry_table_{pull_requests,push_requests,
// rows_pulled,rows_pushed,rows_admitted,rows_not_admitted,rows_evicted_age,
// rows_evicted_capacity}_total, ferry_table_staleness_versions (a histogram, le="0".."63","+Inf";
// tables with has_staleness only) and ferry_table_hot_id_pulls{id="..."} (gauges: the top ids of
// sparse tables). With a disk tier: its tables' ferry_table_rows_{demoted,promoted}_total and
// ferry_table_disk_{rows,bytes}, and the store's `disk` counts: ferry_disk_tier_*_total and
// ferry_disk_tier_read_seconds (a histogram of its batched reads).
std::string ServerMetricsText(int rank, const ServerStats& stats, const RequestLatencies& latencies,
                              const std::vector<TableMetrics>& tables, const DiskTier::Stats* disk = nullptr);

}  // namespace ferry::ps
