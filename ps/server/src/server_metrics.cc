#include "internal/server_metrics.h"

#include <cmath>
#include <limits>
#include <string_view>

#include "ferry/metrics/process.h"

namespace ferry::ps {

void RequestLatencies::Observe(wire::Kind kind, double service_s, double held_s) {
  OfKind& k = kinds_[wire::KindName(kind)];
  k.service.Observe(service_s);
  if (held_s >= 0) {
    k.held.Observe(held_s);
    k.ever_held = true;
  }
}

void RequestLatencies::AddTo(metrics::Page& page, const metrics::Labels& server) const {
  for (const auto& [kind, k] : kinds_) {
    metrics::Labels labels = server;
    labels.emplace_back("kind", std::string(kind));
    page.Histogram("ferry_request_service_seconds",
                   "Time from reading a request to sending its reply, less the time it was held, by kind", labels,
                   k.service.Collect());
  }
  for (const auto& [kind, k] : kinds_) {
    if (!k.ever_held) continue;
    metrics::Labels labels = server;
    labels.emplace_back("kind", std::string(kind));
    page.Histogram("ferry_request_held_seconds",
                   "Time a request waited before it could be answered (sync pulls for their step, ssp pulls for the "
                   "slowest clock, collectives for every worker, declarations for their table), by kind",
                   labels, k.held.Collect());
  }
}

namespace {

// How a ServerStats counter is served. `series` empty: not served (the per-table series hold it).
struct Series {
  const char* counter;
  const char* series;
  bool is_counter;  // else a gauge (a level)
  const char* help;
};

constexpr Series kSeries[] = {
    {"messages", "ferry_messages_total", true, "Messages received"},
    {"bad_messages", "ferry_bad_messages_total", true, "Malformed messages refused with an error"},
    {"errors_sent", "ferry_errors_sent_total", true, "Error replies sent"},
    {"late_gradients_dropped", "ferry_late_gradients_dropped_total", true,
     "Sync gradients that came after their step had closed, dropped"},
    {"updates_applied", "ferry_updates_applied_total", true,
     "Optimizer updates applied: sync steps closed, async and ssp pushes"},
    {"pulls_held", "ferry_pulls_held_total", true, "Pulls held until their step or the staleness bound was reached"},
    {"held_expired", "ferry_held_expired_total", true, "Waiting requests answered with an error at their deadline"},
    {"bytes_in", "ferry_received_bytes_total", true, "Bytes of the messages received"},
    {"bytes_out", "ferry_sent_bytes_total", true, "Bytes of the replies sent"},
    {"checkpoints_saved", "ferry_checkpoints_saved_total", true, "Checkpoints of this server's shard written"},
    {"failed_for_silent_worker", "ferry_failed_for_silent_worker_total", true,
     "Waiting requests failed because a worker they waited for went silent"},
    {"nonfinite_pushes_refused", "ferry_nonfinite_pushes_refused_total", true,
     "Pushes refused whole for NaN or Inf in their gradient"},
    {"nonfinite_rows_skipped", "ferry_nonfinite_rows_skipped_total", true,
     "Sparse gradient rows holding NaN or Inf skipped (nonfinite=skip_rows)"},
    {"curve_refused", "ferry_curve_refused_total", true,
     "Connections refused: their CURVE key is not one of the job's workers'"},
    {"permission_denied", "ferry_permission_denied_total", true,
     "Messages refused for speaking for a worker other than their CURVE key's"},
    {"held_refused", "ferry_held_refused_total", true,
     "Requests refused because the server, or their connection, held the most waiting requests it may"},
    {"connections_refused", "ferry_connections_refused_total", true, "Connections refused over the connection cap"},
    {"connections_idle_closed", "ferry_connections_idle_closed_total", true,
     "Connections closed for saying nothing: after the idle timeout, or to make room at the cap"},
    {"connections_unfinished_closed", "ferry_connections_unfinished_closed_total", true,
     "Connections closed for holding more of a message not finished in ZeroMQ's buffers than their bound"},
    {"rank_conflicts", "ferry_rank_conflicts_total", true,
     "Requests refused for speaking for a worker rank another live connection holds"},
    {"replies_dropped", "ferry_replies_dropped_total", true, "Replies dropped: their peer had too many unread"},
    {"nonfinite_updates_refused", "ferry_nonfinite_updates_refused_total", true,
     "Elements whose update would not have been finite (finite gradients overflowing), kept as they were"},
    {"wire_values_saturated", "ferry_wire_values_saturated_total", true,
     "Pulled values beyond a 16-bit table format's range, sent as its largest"},
    {"pieces_held", "ferry_pieces_held_total", true,
     "Pieces of push calls in pieces held until their call's last piece verified"},
    {"piece_calls_refused", "ferry_piece_calls_refused_total", true,
     "Push calls in pieces refused whole: none of their pieces applied"},
    {"replayed_updates_skipped", "ferry_replayed_updates_skipped_total", true,
     "Parts of pushes replayed after a restore, a failover or a worker's restart, skipped: the restored checkpoint "
     "or image, or the worker's earlier process's push, held them"},
    {"feed_pages", "ferry_feed_pages_total", true, "Pages of the change feed served to readers (Changes requests)"},
    {"feed_rows_sent", "ferry_feed_rows_sent_total", true,
     "Sparse rows and dense chunks the change feed sent to readers"},
    {"memory_budget_refused", "ferry_memory_budget_refused_total", true,
     "Requests refused because their new rows or tables did not fit in the memory budget"},
    {"memory_budget_bytes", "ferry_memory_budget_bytes", false, "The memory budget for the tables"},
    {"memory_budget_used_bytes", "ferry_memory_budget_used_bytes", false, "Bytes of the memory budget in use"},
    {"held_payload_bytes", "ferry_held_payload_bytes", false,
     "Bytes of payload in requests held while they wait (all-reduce values, pieces of pushes)"},
    {"held_payload_limit_bytes", "ferry_held_payload_limit_bytes", false,
     "The bound on held payloads: a quarter of the memory budget"},
    {"connections_open", "ferry_connections_open", false, "Connections open"},
    {"unfinished_message_bytes", "ferry_unfinished_message_bytes", false,
     "Bytes ZeroMQ held of messages it was still receiving, at the last check (a few times a second)"},
    {"tables_being_created", "ferry_tables_being_created", false, "Tables being built aside"},
    {"compute_threads", "ferry_compute_threads", false, "Helper threads of the server's compute pool"},
    {"rows_admitted", "", true, ""},
    {"rows_not_admitted", "", true, ""},
    {"rows_evicted_age", "", true, ""},
    {"rows_evicted_capacity", "", true, ""},
    {"rows_demoted", "", true, ""},
    {"rows_promoted", "", true, ""},
    {"disk_tier_errors", "ferry_disk_tier_errors_total", true,
     "Requests refused because the disk tier's store failed (full, a read error, a corrupt file)"},
    {"disk_tier_reads", "ferry_disk_tier_reads_total", true,
     "Batched reads of the disk tier's store (a pull's or push's rows not in RAM)"},
    {"disk_tier_rows_asked", "ferry_disk_tier_rows_asked_total", true, "Ids looked up in the disk tier's store"},
    {"disk_tier_rows_found", "ferry_disk_tier_rows_found_total", true,
     "Ids looked up in the disk tier's store and found there (promoted to RAM)"},
    {"disk_tier_rows_written", "ferry_disk_tier_rows_written_total", true,
     "Rows written to the disk tier's store (demoted from RAM)"},
    {"disk_tier_rows_erased", "ferry_disk_tier_rows_erased_total", true,
     "Stale rows erased from the disk tier's store (their id aged out of RAM)"},
    {"disk_tier_requests_held", "ferry_disk_tier_requests_held_total", true,
     "Requests held while the disk tier's readers read their rows (or behind such a request of their connection)"},
    {"disk_tier_rows_read_ahead", "ferry_disk_tier_rows_read_ahead_total", true,
     "Ids the disk tier's readers looked up on disk for held requests"},
    {"disk_tier_rows_read_inline", "ferry_disk_tier_rows_read_inline_total", true,
     "Ids the I/O thread looked up on disk itself, serving nothing meanwhile (none read ahead for them)"},
    {"disk_tier_io_thread_waits", "ferry_disk_tier_io_thread_waits_total", true,
     "Times the I/O thread waited for a disk read: the requests held for the disk were at their bound"},
    {"moved_answered", "ferry_moved_answered_total", true,
     "Requests refused as placed by another placement version than the server's (the client re-sends them)"},
    {"updates_forwarded", "ferry_updates_forwarded_total", true,
     "Parts forwarded to this server's backup (replication 2): updates applied here, and sync gradients held "
     "and steps closed"},
    {"replica_updates_applied", "ferry_replica_updates_applied_total", true,
     "Parts a primary forwarded that this server applied to its replica (replication 2): updates, and sync "
     "holds, closes and drops"},
    {"replica_errors", "ferry_replica_errors_total", true,
     "Replication failures (replication 2): pushes applied here whose backup did not confirm them (refused, not "
     "reachable, or silent past the timeout), and updates this server's replica refused or could not apply"},
    {"replica_memory_budget_bytes", "ferry_replica_memory_budget_bytes", false,
     "The memory the replica may take (replication 2: half of --memory-budget-mb, the shard the other half)"},
    {"replica_memory_budget_used_bytes", "ferry_replica_memory_budget_used_bytes", false,
     "The memory the replica's tables take (replication 2)"},
    {"disk_tier_requests_waiting", "ferry_disk_tier_requests_waiting", false,
     "Requests held now while the disk tier's readers read their rows"},
    {"disk_tier_rows_kept", "ferry_disk_tier_rows_kept", false,
     "Rows read from the disk tier's store for requests not yet served, kept beside the memory budget"},
};

// Per worker: "<prefix><rank>" counters (only where non-zero) as one series labelled worker.
struct PerWorker {
  std::string_view prefix;
  const char* series;
  const char* help;
};
constexpr PerWorker kPerWorker[] = {
    {"gradients_used_rank_", "ferry_gradients_used_total", "Push messages of a worker of which a part counted"},
    {"gradients_dropped_rank_", "ferry_gradients_dropped_total", "Push messages of a worker dropped whole as late"},
};

// The tables' series (ServerMetricsText).
void AddTableMetrics(metrics::Page& page, const metrics::Labels& server, const std::vector<TableMetrics>& tables) {
  struct Column {
    const char* name;
    bool counter;  // else a gauge
    const char* help;
    int64_t (*get)(const TableMetrics&);
  };
  static const Column kColumns[] = {
      {"ferry_table_rows", false, "Rows of a sparse table held by this server (dense: elements)",
       [](const TableMetrics& t) { return t.rows; }},
      {"ferry_table_bytes", false, "Bytes the table's values and optimizer state take on this server",
       [](const TableMetrics& t) { return t.bytes; }},
      {"ferry_table_pull_requests_total", true, "Pull requests served",
       [](const TableMetrics& t) { return t.counters.pull_requests; }},
      {"ferry_table_push_requests_total", true, "Push requests accepted",
       [](const TableMetrics& t) { return t.counters.push_requests; }},
      {"ferry_table_rows_pulled_total", true, "Rows served (dense: elements)",
       [](const TableMetrics& t) { return t.counters.rows_pulled; }},
      {"ferry_table_rows_pushed_total", true, "Gradient rows accepted (dense: elements)",
       [](const TableMetrics& t) { return t.counters.rows_pushed; }},
      {"ferry_table_rows_admitted_total", true,
       "Rows a push made once the admission filter let the id in (row lifecycle)",
       [](const TableMetrics& t) { return t.lifecycle.admitted; }},
      {"ferry_table_rows_not_admitted_total", true,
       "Pushed rows counted, not stored: not admitted yet, or no room (row lifecycle)",
       [](const TableMetrics& t) { return t.lifecycle.not_admitted; }},
      {"ferry_table_rows_evicted_age_total", true, "Rows evicted after evict_after_steps without a pull or push",
       [](const TableMetrics& t) { return t.lifecycle.evicted_age; }},
      {"ferry_table_rows_evicted_capacity_total", true,
       "Rows evicted for a new one: max_rows or the memory budget reached",
       [](const TableMetrics& t) { return t.lifecycle.evicted_capacity; }},
  };
  auto labels_of = [&](const TableMetrics& t) {
    metrics::Labels l = server;
    l.emplace_back("table", t.name);
    return l;
  };
  for (const Column& c : kColumns) {
    for (const TableMetrics& t : tables) {
      const double value = static_cast<double>(c.get(t));
      if (c.counter) {
        page.Counter(c.name, c.help, labels_of(t), value);
      } else {
        page.Gauge(c.name, c.help, labels_of(t), value);
      }
    }
  }
  // Async and ssp tables only: a sync table's updates are never stale.
  for (const TableMetrics& t : tables) {
    if (!t.has_staleness) continue;
    prometheus::ClientMetric::Histogram h;
    for (size_t k = 0; k < kTableStalenessBuckets; ++k) {
      h.sample_count += static_cast<uint64_t>(t.counters.staleness[k]);
      // The last bucket's updates are counted at its lower bound.
      h.sample_sum += static_cast<double>(k) * static_cast<double>(t.counters.staleness[k]);
      const bool last = k + 1 == kTableStalenessBuckets;
      h.bucket.push_back({h.sample_count, last ? std::numeric_limits<double>::infinity() : static_cast<double>(k)});
    }
    page.Histogram("ferry_table_staleness_versions",
                   "Updates applied k versions after the pushing worker's last pull (async and ssp tables)",
                   labels_of(t), std::move(h));
  }
  for (const TableMetrics& t : tables) {
    if (!t.disk_tier) continue;
    page.Counter("ferry_table_rows_demoted_total", "Rows written to the disk tier to make room in RAM (not lost)",
                 labels_of(t), static_cast<double>(t.lifecycle.demoted));
    page.Counter("ferry_table_rows_promoted_total",
                 "Rows read back from the disk tier into RAM for a pull or push (RAM tier misses)", labels_of(t),
                 static_cast<double>(t.lifecycle.promoted));
    page.Gauge("ferry_table_disk_rows",
               "Rows of the table in the disk tier's store (an estimate; stale copies of promoted rows count)",
               labels_of(t), static_cast<double>(t.disk_rows));
    page.Gauge("ferry_table_disk_bytes", "Bytes of the table's files in the disk tier's store", labels_of(t),
               static_cast<double>(t.disk_bytes));
  }
  for (const TableMetrics& t : tables) {
    if (!t.sparse) continue;
    for (const auto& [id, pulls] : t.counters.hot.Top(kHotSlots)) {
      metrics::Labels l = labels_of(t);
      l.emplace_back("id", std::to_string(id));
      page.Gauge("ferry_table_hot_id_pulls",
                 "Estimated pulls of the table's most pulled ids (a sampled heavy-hitters sketch)", l,
                 static_cast<double>(pulls));
    }
  }
}

// The disk tier's read latencies (DiskTier::Stats::read_us: bucket b holds reads of [2^(b-1), 2^b) us).
void AddDiskTierMetrics(metrics::Page& page, const metrics::Labels& server, const DiskTier::Stats& disk) {
  prometheus::ClientMetric::Histogram h;
  double sum_us = 0;
  for (int b = 0; b < DiskTier::Stats::kLatencyBuckets; ++b) {
    const int64_t n = disk.read_us[static_cast<size_t>(b)];
    h.sample_count += static_cast<uint64_t>(n);
    // A read is counted at its bucket's middle (the sum is an estimate, the buckets exact).
    sum_us += static_cast<double>(n) * (b == 0 ? 0.5 : 0.75 * std::ldexp(1.0, b));
    const bool last = b + 1 == DiskTier::Stats::kLatencyBuckets;
    h.bucket.push_back({h.sample_count, last ? std::numeric_limits<double>::infinity() : std::ldexp(1.0, b) * 1e-6});
  }
  h.sample_sum = sum_us * 1e-6;
  page.Histogram("ferry_disk_tier_read_seconds",
                 "Time of each batched read of the disk tier's store (the rows a pull or push needed from disk)",
                 server, std::move(h));
}

}  // namespace

std::string ServerMetricsText(int rank, const ServerStats& stats, const RequestLatencies& latencies,
                              const std::vector<TableMetrics>& tables, const DiskTier::Stats* disk) {
  const metrics::Labels server = {{"server", std::to_string(rank)}};
  metrics::Page page;
  for (const auto& [name, value] : stats.counters) {
    const Series* s = nullptr;
    for (const Series& k : kSeries) {
      if (name == k.counter) s = &k;
    }
    const PerWorker* w = nullptr;
    for (const PerWorker& k : kPerWorker) {
      if (std::string_view(name).starts_with(k.prefix)) w = &k;
    }
    if (w != nullptr) {
      metrics::Labels labels = server;
      labels.emplace_back("worker", name.substr(w->prefix.size()));
      page.Counter(w->series, w->help, labels, static_cast<double>(value));
    } else if (s == nullptr) {
      // A counter added to Stats without a line above: served, as a level, until it gets one.
      page.Gauge("ferry_" + name, "Server counter " + name + " (no description)", server, static_cast<double>(value));
    } else if (*s->series == '\0') {
      continue;
    } else if (s->is_counter) {
      page.Counter(s->series, s->help, server, static_cast<double>(value));
    } else {
      page.Gauge(s->series, s->help, server, static_cast<double>(value));
    }
  }
  latencies.AddTo(page, server);
  metrics::AddProcessMetrics(page, server);
  AddTableMetrics(page, server, tables);
  if (disk != nullptr) AddDiskTierMetrics(page, server, *disk);
  return page.Text();
}

}  // namespace ferry::ps
