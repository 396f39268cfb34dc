#include "internal/table_metrics.h"

#include <algorithm>
#include <cctype>

namespace ferry::ps {

void HotIds::Count(int64_t id) {
  int free_slot = -1;
  for (int i = 0; i < kHotSlots; ++i) {
    if (counts_[i] > 0 && ids_[i] == id) {
      ++counts_[i];
      return;
    }
    if (counts_[i] == 0 && free_slot < 0) free_slot = i;
  }
  if (free_slot >= 0) {
    ids_[free_slot] = id;
    counts_[free_slot] = 1;
    return;
  }
  for (int64_t& c : counts_) --c;  // Misra-Gries: every counter pays for the id not kept
}

void HotIds::Add(std::span<const int64_t> ids) {
  // The first sampled id of this call: the one at the next multiple of kHotSampleEvery.
  const uint64_t skip = (kHotSampleEvery - position_ % kHotSampleEvery) % kHotSampleEvery;
  for (size_t i = skip; i < ids.size(); i += kHotSampleEvery) Count(ids[i]);
  position_ += ids.size();
}

std::vector<std::pair<int64_t, int64_t>> HotIds::Top(int n) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int i = 0; i < kHotSlots; ++i) {
    if (counts_[i] > 0) out.emplace_back(ids_[i], counts_[i] * kHotSampleEvery);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (static_cast<int>(out.size()) > n) out.resize(static_cast<size_t>(std::max(n, 0)));
  return out;
}

void TableCounters::RecordStaleness(int64_t versions) {
  ++staleness[static_cast<size_t>(std::clamp<int64_t>(versions, 0, kTableStalenessBuckets - 1))];
}

namespace {

// A label value as the text format wants it: backslash, double quote and newline escaped.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// A metric name from a counter's: [a-zA-Z0-9_] kept, anything else '_'.
std::string MetricName(const std::string& s) {
  std::string out = "ferry_";
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  return out;
}

}  // namespace

std::string PrometheusText(int server_rank, const std::map<std::string, int64_t>& counters,
                           const std::vector<TableMetrics>& tables) {
  const std::string server = "server=\"" + std::to_string(server_rank) + "\"";
  std::string out;
  for (const auto& [name, value] : counters) {
    const std::string m = MetricName(name);
    out += "# TYPE " + m + " untyped\n" + m + "{" + server + "} " + std::to_string(value) + "\n";
  }
  struct Column {
    const char* name;
    const char* type;
    const char* help;
    int64_t (*get)(const TableMetrics&);
  };
  static const Column kColumns[] = {
      {"rows", "gauge", "Rows of a sparse table held by this server (dense: elements)",
       [](const TableMetrics& t) { return t.rows; }},
      {"bytes", "gauge", "Bytes the table's values and optimizer state take on this server",
       [](const TableMetrics& t) { return t.bytes; }},
      {"pull_requests", "counter", "Pull requests served", [](const TableMetrics& t) { return t.counters.pull_requests; }},
      {"push_requests", "counter", "Push requests accepted", [](const TableMetrics& t) { return t.counters.push_requests; }},
      {"rows_pulled", "counter", "Rows served (dense: elements)", [](const TableMetrics& t) { return t.counters.rows_pulled; }},
      {"rows_pushed", "counter", "Gradient rows accepted (dense: elements)",
       [](const TableMetrics& t) { return t.counters.rows_pushed; }},
      {"rows_admitted", "counter", "Rows a push made once the admission filter let the id in (row lifecycle)",
       [](const TableMetrics& t) { return t.lifecycle.admitted; }},
      {"rows_not_admitted", "counter", "Pushed rows counted, not stored: not admitted yet, or no room (row lifecycle)",
       [](const TableMetrics& t) { return t.lifecycle.not_admitted; }},
      {"rows_evicted_age", "counter", "Rows evicted after evict_after_steps without a pull or push",
       [](const TableMetrics& t) { return t.lifecycle.evicted_age; }},
      {"rows_evicted_capacity", "counter", "Rows evicted for a new one: max_rows or the memory budget reached",
       [](const TableMetrics& t) { return t.lifecycle.evicted_capacity; }},
  };
  for (const Column& c : kColumns) {
    const std::string m = std::string("ferry_table_") + c.name;
    out += "# HELP " + m + " " + c.help + "\n# TYPE " + m + " " + c.type + "\n";
    for (const TableMetrics& t : tables) {
      out += m + "{" + server + ",table=\"" + Escape(t.name) + "\"} " + std::to_string(c.get(t)) + "\n";
    }
  }
  out += "# HELP ferry_table_staleness Updates applied k versions after the pushing worker's last pull (async, ssp)\n"
         "# TYPE ferry_table_staleness histogram\n";
  for (const TableMetrics& t : tables) {
    const std::string labels = server + ",table=\"" + Escape(t.name) + "\"";
    int64_t cumulative = 0;
    for (size_t k = 0; k + 1 < kTableStalenessBuckets; ++k) {
      cumulative += t.counters.staleness[k];
      out += "ferry_table_staleness_bucket{" + labels + ",le=\"" + std::to_string(k) + "\"} " + std::to_string(cumulative) + "\n";
    }
    cumulative += t.counters.staleness[kTableStalenessBuckets - 1];
    int64_t sum = 0;  // the last bucket's updates counted at its lower bound
    for (size_t k = 0; k < kTableStalenessBuckets; ++k) sum += static_cast<int64_t>(k) * t.counters.staleness[k];
    out += "ferry_table_staleness_bucket{" + labels + ",le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
    out += "ferry_table_staleness_sum{" + labels + "} " + std::to_string(sum) + "\n";
    out += "ferry_table_staleness_count{" + labels + "} " + std::to_string(cumulative) + "\n";
  }
  out += "# HELP ferry_table_hot_id_pulls Estimated pulls of the table's most pulled ids (a sampled heavy-hitters sketch)\n"
         "# TYPE ferry_table_hot_id_pulls gauge\n";
  for (const TableMetrics& t : tables) {
    if (!t.sparse) continue;
    for (const auto& [id, pulls] : t.counters.hot.Top(kHotSlots)) {
      out += "ferry_table_hot_id_pulls{" + server + ",table=\"" + Escape(t.name) + "\",id=\"" + std::to_string(id) + "\"} " +
             std::to_string(pulls) + "\n";
    }
  }
  return out;
}

}  // namespace ferry::ps
