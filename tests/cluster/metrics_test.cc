// A server's metrics endpoint (ServerOptions::metrics_bind), scraped over real HTTP on
// 127.0.0.1 the way Prometheus does, while a worker pulls and pushes: per-table rows, bytes,
// requests, rows moved, staleness and hot ids move with the traffic, requests are timed by kind
// (held pulls by their wait too). And the heavy-hitters sketch (ps::HotIds) on its own. The names
// against Prometheus' conventions and promtool, with real processes: tests/e2e/test_metrics_scrape.py.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/metrics/http.h"
#include "internal/table_metrics.h"
#include "support/cluster.h"

namespace ferry::test {
namespace {

// GET `path` from 127.0.0.1:port; returns the status line and the body ("" on a socket error).
std::pair<std::string, std::string> HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buf[65536];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) response.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const size_t line_end = response.find("\r\n"), body = response.find("\r\n\r\n");
  if (line_end == std::string::npos || body == std::string::npos) return {"", ""};
  return {response.substr(0, line_end), response.substr(body + 4)};
}

// The samples of a Prometheus text page: "name{labels}" -> value.
std::map<std::string, double> Samples(const std::string& page) {
  std::map<std::string, double> out;
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

int PortOf(const std::string& url) {
  const size_t colon = url.rfind(':');
  return std::stoi(url.substr(colon + 1));
}

TEST(Metrics, AScrapeShowsEachTableAndMovesWithTheTraffic) {
  ServerOptions so;
  so.metrics_bind = "127.0.0.1:0";
  auto c = LocalCluster::Start(1, /*tcp=*/true, so);
  ASSERT_EQ(c.servers.size(), 1u);
  const std::string url = c.servers[0]->metrics_url();
  ASSERT_NE(url.find("http://127.0.0.1:"), std::string::npos) << url;
  const int port = PortOf(url);

  auto w = c.Connect(0, 1);
  TableSpec emb = SgdSparseTable("user_emb", 4);
  emb.optimizer.learning_rate = 0.1f;
  ASSERT_TRUE(w->Declare(emb).ok());
  TableSpec dense;
  dense.name = "tower_w";
  dense.shape = {1000};
  dense.consistency = Consistency::kAsync;
  ASSERT_TRUE(w->Declare(dense).ok());

  // Steps of 64 ids: id 7 in every one of them (a hot user), the others fresh.
  std::mt19937_64 rng(3);
  auto step = [&](int64_t t) {
    std::vector<int64_t> ids = {7};
    while (ids.size() < 64) ids.push_back(1000 + static_cast<int64_t>(rng() % 1000000));
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::vector<float> rows(ids.size() * 4), grads(ids.size() * 4, 0.5f), w_values(1000), w_grads(1000, 0.1f);
    ASSERT_TRUE(w->PullSparse("user_emb", ids, rows, t).wait().ok());
    ASSERT_TRUE(w->PushSparse("user_emb", ids, grads, t).wait().ok());
    ASSERT_TRUE(w->PullDense("tower_w", w_values, t).wait().ok());
    ASSERT_TRUE(w->PushDense("tower_w", w_grads, t).wait().ok());
  };
  for (int64_t t = 0; t < 10; ++t) step(t);

  const auto [status, page] = HttpGet(port, "/metrics");
  ASSERT_EQ(status, "HTTP/1.1 200 OK") << page;
  auto s = Samples(page);
  const std::string e = "{server=\"0\",table=\"user_emb\"}", d = "{server=\"0\",table=\"tower_w\"}";
  const double rows = s["ferry_table_rows" + e];
  EXPECT_GT(rows, 500);  // 10 steps of 64 ids, 63 of them fresh (a few may repeat)
  EXPECT_LE(rows, 631);
  EXPECT_EQ(s["ferry_table_bytes" + e], rows * (4 * 4 + 24));  // dim 4, SGD: 4 floats + 24 bytes a row
  EXPECT_EQ(s["ferry_table_pull_requests_total" + e], 10);
  EXPECT_EQ(s["ferry_table_push_requests_total" + e], 10);
  EXPECT_EQ(s["ferry_table_rows" + d], 1000);
  EXPECT_EQ(s["ferry_table_pull_requests_total" + d], 10);
  EXPECT_EQ(s["ferry_table_rows_pushed_total" + d], 10 * 1000);
  // Async: every update's staleness was counted (a single worker: 0 each time).
  EXPECT_EQ(s["ferry_table_staleness_versions_count" + e], 10);
  EXPECT_EQ(s["ferry_table_staleness_versions_bucket{server=\"0\",table=\"user_emb\",le=\"0\"}"], 10);
  // The hot id leads the sketch.
  const std::string hot = "ferry_table_hot_id_pulls{server=\"0\",table=\"user_emb\",id=\"7\"}";
  ASSERT_TRUE(s.count(hot)) << page;
  for (const auto& [name, value] : s) {
    if (name.starts_with("ferry_table_hot_id_pulls") && name != hot) {
      EXPECT_LT(value, s[hot]) << name;
    }
  }
  EXPECT_GT(s["ferry_messages_total{server=\"0\"}"], 40);  // the server's own counters are there too
  // Every request answered is timed by its kind: 10 of each kind of the steps (the client sends
  // sparse pulls and pushes as the 1.5 kinds, several tables a message).
  for (const std::string kind : {"PullSparseTables", "PushSparseTables", "PullDense", "PushDense"}) {
    EXPECT_EQ(s["ferry_request_service_seconds_count{server=\"0\",kind=\"" + kind + "\"}"], 10) << kind;
    EXPECT_EQ(s["ferry_request_service_seconds_bucket{server=\"0\",kind=\"" + kind + "\",le=\"+Inf\"}"], 10) << kind;
  }
  // And the process's own series.
  EXPECT_GT(s["process_resident_memory_bytes{server=\"0\"}"], 0);
  EXPECT_GT(s["process_open_fds{server=\"0\"}"], 0);
  EXPECT_TRUE(s.count("process_cpu_seconds_total{server=\"0\"}")) << page;
  // No counter of the server is served without its own name and help.
  EXPECT_EQ(page.find("(no description)"), std::string::npos) << page;

  // More traffic: the numbers move with it.
  for (int64_t t = 10; t < 15; ++t) step(t);
  const auto after = Samples(HttpGet(port, "/metrics").second);
  EXPECT_EQ(after.at("ferry_table_pull_requests_total" + e), 15);
  EXPECT_GT(after.at("ferry_table_rows" + e), rows);
  EXPECT_GE(after.at(hot), s[hot]);
  EXPECT_GT(after.at("ferry_messages_total{server=\"0\"}"), s["ferry_messages_total{server=\"0\"}"]);

  EXPECT_EQ(HttpGet(port, "/other").first.substr(9, 3), "404");
}

// Tables with row lifecycle settings: their admissions and evictions are on the page, and summed
// in the server's Stats.
TEST(Metrics, RowLifecycleCountersAreOnThePageAndInStats) {
  ServerOptions so;
  so.metrics_bind = "127.0.0.1:0";
  auto c = LocalCluster::Start(1, /*tcp=*/true, so);
  const int port = PortOf(c.servers[0]->metrics_url());
  auto w = c.Connect(0, 1);
  TableSpec items;
  items.name = "item_emb";
  items.type = TableType::kSparse;
  items.dim = 4;
  items.consistency = Consistency::kAsync;
  items.admit_after = 2;
  items.evict_after_steps = 3;
  ASSERT_TRUE(w->Declare(items).ok());
  TableSpec users = items;
  users.name = "user_emb";
  users.admit_after = 0;
  users.evict_after_steps = 0;
  users.max_rows = 50;
  ASSERT_TRUE(w->Declare(users).ok());
  // item_emb: push t (clock t + 1) has id 7 and ids [10000 + 20t, 10000 + 20t + 40): each of those
  // is pushed in two pushes running, so from push 1 on 20 ids a push (and 7 once) reach their
  // second push and are admitted: 9 x 20 + 1. A row not touched for more than 3 pushes is evicted
  // by the sweep: at clock 10 those admitted at clocks 2 to 6 (7 is touched every time).
  // user_emb: 30 new ids a push, all admitted; beyond 50 rows each replaces one.
  for (int64_t t = 0; t < 10; ++t) {
    std::vector<int64_t> ids = {7}, fresh;
    for (int64_t k = 0; k < 40; ++k) ids.push_back(10000 + 20 * t + k);
    for (int64_t k = 0; k < 30; ++k) fresh.push_back(20000 + 30 * t + k);
    std::vector<float> rows(ids.size() * 4), grads(ids.size() * 4, 0.5f), fresh_grads(fresh.size() * 4, 0.5f);
    ASSERT_TRUE(w->PullSparse("item_emb", ids, rows, t).wait().ok());
    ASSERT_TRUE(w->PushSparse("item_emb", ids, grads, t).wait().ok());
    ASSERT_TRUE(w->PushSparse("user_emb", fresh, fresh_grads, t).wait().ok());
  }
  auto s = Samples(HttpGet(port, "/metrics").second);
  const std::string i = "{server=\"0\",table=\"item_emb\"}", u = "{server=\"0\",table=\"user_emb\"}";
  EXPECT_EQ(s["ferry_table_rows_admitted_total" + i], 181);
  // Every push of an id without a row that did not make one (7's last 8 pushes found its row).
  EXPECT_EQ(s["ferry_table_rows_not_admitted_total" + i], 10 * 41 - 181 - 8);
  EXPECT_EQ(s["ferry_table_rows_evicted_age_total" + i], 5 * 20);
  EXPECT_EQ(s["ferry_table_rows_evicted_capacity_total" + i], 0);
  EXPECT_EQ(s["ferry_table_rows" + i], 181 - 100);
  EXPECT_EQ(s["ferry_table_rows_admitted_total" + u], 300);
  EXPECT_EQ(s["ferry_table_rows_evicted_capacity_total" + u], 250);
  EXPECT_EQ(s["ferry_table_rows" + u], 50);
  EXPECT_EQ(s["ferry_table_bytes" + u], 50 * (4 * 4 + 24 + 16));  // + a row's id and clock stamp
  const auto counters = c.servers[0]->stats().counters;
  EXPECT_EQ(counters.at("rows_admitted"), 481);
  EXPECT_EQ(counters.at("rows_not_admitted"), 221);
  EXPECT_EQ(counters.at("rows_evicted_age"), 100);
  EXPECT_EQ(counters.at("rows_evicted_capacity"), 250);
}

TEST(Metrics, DiskTierCountersAreOnThePageAndInStats) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ferry-metrics-disk-tier-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ServerOptions so;
  so.metrics_bind = "127.0.0.1:0";
  so.disk_tier_dir = dir.string();
  {
    auto c = LocalCluster::Start(1, /*tcp=*/true, so);
    const int port = PortOf(c.servers[0]->metrics_url());
    auto w = c.Connect(0, 1);
    TableSpec emb;
    emb.name = "emb";
    emb.type = TableType::kSparse;
    emb.dim = 4;
    emb.consistency = Consistency::kAsync;
    emb.max_rows = 10;
    emb.disk_tier = true;
    emb.optimizer.type = OptimizerType::kSgd;
    emb.optimizer.learning_rate = 1.0f;  // a row pushed once with 1s holds -1s
    ASSERT_TRUE(w->Declare(emb).ok());
    // 30 rows pushed one at a time through a RAM tier of 10: each push of a new id looks for it
    // in the store first (30 ids asked, none found); the first 10 fill the tier, and each later
    // one, pushed no more often than the rows there, goes on probation beside it and is demoted by
    // the next push (rows 10-28; 29 still on probation). Then a pull of ids 10-19 reads them back
    // (promotes them, onto probation). All of it from RocksDB's write buffer, without I/O: no read
    // of the disk, nothing held for the disk readers.
    std::vector<int64_t> ids;
    for (int64_t id = 0; id < 30; ++id) ids.push_back(id);
    std::vector<float> grads(4, 1.0f), rows(10 * 4);
    for (int64_t id : ids) ASSERT_TRUE(w->PushSparse("emb", {&id, 1}, grads, 0).wait().ok());
    ASSERT_TRUE(w->PullSparse("emb", std::span(ids).subspan(10, 10), rows, 0).wait().ok());
    for (float v : rows) EXPECT_EQ(-1.0f, v);
    auto s = Samples(HttpGet(port, "/metrics").second);
    const std::string t = "{server=\"0\",table=\"emb\"}", server = "{server=\"0\"}";
    const double demoted = s["ferry_table_rows_demoted_total" + t], promoted = s["ferry_table_rows_promoted_total" + t];
    EXPECT_EQ(demoted, 19);
    EXPECT_EQ(promoted, 10);
    EXPECT_EQ(s["ferry_table_rows" + t], 21);  // the tier's 10, and 11 on probation
    EXPECT_GE(s["ferry_table_disk_rows" + t], 19);
    EXPECT_EQ(1u, s.count("ferry_table_disk_bytes" + t));  // (0 here: the rows are still in the write buffer)
    EXPECT_EQ(s["ferry_disk_tier_reads_total" + server], 0);
    EXPECT_EQ(s["ferry_disk_tier_rows_asked_total" + server], 30 + promoted);
    EXPECT_EQ(s["ferry_disk_tier_rows_found_total" + server], promoted);
    EXPECT_EQ(s["ferry_disk_tier_rows_written_total" + server], demoted);
    EXPECT_EQ(s["ferry_disk_tier_errors_total" + server], 0);
    EXPECT_EQ(s["ferry_disk_tier_read_seconds_count" + server], 0);
    EXPECT_EQ(s["ferry_disk_tier_requests_held_total" + server], 0);
    EXPECT_EQ(s["ferry_disk_tier_rows_read_inline_total" + server], 0);
    EXPECT_EQ(1u, s.count("ferry_disk_tier_requests_waiting" + server));
    const auto counters = c.servers[0]->stats().counters;
    EXPECT_EQ(counters.at("rows_demoted"), demoted);
    EXPECT_EQ(counters.at("rows_promoted"), promoted);
    EXPECT_EQ(counters.at("disk_tier_reads"), 0);
    EXPECT_EQ(counters.at("disk_tier_rows_asked"), 30 + promoted);
  }
  std::filesystem::remove_all(dir);
}

// A pull held for its sync step: its wait is timed apart from its service; a sync table has no
// staleness histogram; the workers' used gradients are labelled by worker.
TEST(Metrics, AHeldPullIsTimedByItsWaitAndSyncTablesHaveNoStaleness) {
  ServerOptions so;
  so.metrics_bind = "127.0.0.1:0";
  auto c = LocalCluster::Start(1, /*tcp=*/true, so);
  const int port = PortOf(c.servers[0]->metrics_url());
  auto w0 = c.Connect(0, 2), w1 = c.Connect(1, 2);
  TableSpec spec;
  spec.name = "sync_w";
  spec.shape = {10};
  spec.consistency = Consistency::kSync;
  ASSERT_TRUE(w0->Declare(spec).ok());
  ASSERT_TRUE(w1->Declare(spec).ok());
  std::vector<float> v0(10), v1(10), g(10, 0.1f);
  ASSERT_TRUE(w0->PullDense("sync_w", v0, 0).wait().ok());
  ASSERT_TRUE(w1->PullDense("sync_w", v1, 0).wait().ok());
  ASSERT_TRUE(w0->PushDense("sync_w", g, 0).wait().ok());
  // Worker 0's pull of step 1 waits for worker 1's gradient of step 0: held at least 200 ms.
  Handle held = w0->PullDense("sync_w", v0, 1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (c.servers[0]->stats().counters.at("pulls_held") < 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the pull was never held";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(w1->PushDense("sync_w", g, 0).wait().ok());
  ASSERT_TRUE(held.wait().ok());

  const auto [status, page] = HttpGet(port, "/metrics");
  ASSERT_EQ(status, "HTTP/1.1 200 OK") << page;
  auto s = Samples(page);
  const std::string pull = "{server=\"0\",kind=\"PullDense\"}";
  EXPECT_EQ(s["ferry_request_service_seconds_count" + pull], 3);
  EXPECT_EQ(s["ferry_request_held_seconds_count" + pull], 1) << page;
  EXPECT_GE(s["ferry_request_held_seconds_sum" + pull], 0.2);
  EXPECT_EQ(s["ferry_request_service_seconds_count{server=\"0\",kind=\"PushDense\"}"], 2);
  EXPECT_EQ(s["ferry_request_service_seconds_count{server=\"0\",kind=\"CreateTable\"}"], 2);
  // Only the kinds that waited have a held histogram.
  EXPECT_EQ(s.count("ferry_request_held_seconds_count{server=\"0\",kind=\"PushDense\"}"), 0u);
  EXPECT_EQ(page.find("ferry_table_staleness_versions"), std::string::npos) << page;
  EXPECT_EQ(s["ferry_table_push_requests_total{server=\"0\",table=\"sync_w\"}"], 2);
  EXPECT_EQ(s["ferry_gradients_used_total{server=\"0\",worker=\"0\"}"], 1);
  EXPECT_EQ(s["ferry_gradients_used_total{server=\"0\",worker=\"1\"}"], 1);
  EXPECT_EQ(s["ferry_pulls_held_total{server=\"0\"}"], 1);
}

// Slow clients from one address (a slowloris: 300 connections from 127.0.0.2 that each send a
// request line, then a header line now and then, never the end) cannot keep the page from a
// scraper at another address: one address holds at most kPerAddress connections and the rest are
// closed (issue 35). Before, the endpoint took them all (up to its limit of about 1,020; 2,000
// kept the page away for as long as they dripped).
TEST(Metrics, SlowClientsFromOneAddressCannotKeepThePageFromAScraper) {
  ServerOptions so;
  so.metrics_bind = "127.0.0.1:0";
  so.bind = "tcp://127.0.0.1:0";
  auto server = Server::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = PortOf((*server)->metrics_url());
  sockaddr_in to{}, from{};
  to.sin_family = from.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  from.sin_addr.s_addr = htonl(0x7f000002);  // 127.0.0.2, port picked by the kernel
  std::vector<int> slow;
  for (int i = 0; i < 300; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    slow.push_back(fd);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0) << std::strerror(errno);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0) << std::strerror(errno);
    const std::string start = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    ::send(fd, start.data(), start.size(), MSG_NOSIGNAL);
  }
  // Each round: every slow client drips a header line; those the endpoint closed see the end.
  auto still_open = [&] {
    int open = 0;
    for (int fd : slow) {
      const std::string drip = "X-Slow: 1\r\n";
      char c;
      if (::send(fd, drip.data(), drip.size(), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) continue;
      const ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) ++open;
    }
    return open;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int open = still_open();
  while (open > static_cast<int>(metrics::HttpEndpoint::kPerAddress) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    open = still_open();
  }
  EXPECT_LE(open, static_cast<int>(metrics::HttpEndpoint::kPerAddress));
  for (int round = 0; round < 3; ++round) {  // the page, while the slow ones go on dripping
    const auto [status, page] = HttpGet(port, "/metrics");
    EXPECT_EQ(status, "HTTP/1.1 200 OK") << "round " << round;
    EXPECT_NE(page.find("ferry_messages_total"), std::string::npos) << "round " << round;
    still_open();
  }
  for (int fd : slow) ::close(fd);
}

TEST(Metrics, ABindThatCannotBeHadFailsStartNamingIt) {
  ServerOptions so;
  so.metrics_bind = "127.0.0.1:99999";
  so.bind = "tcp://127.0.0.1:0";
  auto server = Server::Start(so);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(server.status().message().find("metrics endpoint: cannot listen on '127.0.0.1:99999'"), std::string::npos)
      << server.status();
}

// Misra-Gries over a skewed stream: with m ids sampled (every 8th) and k = 16 counters, every id
// whose sampled count exceeds m / (k + 1) is kept, and a kept id's count is its sampled count
// less at most m / (k + 1) (reported x 8).
TEST(Metrics, HotIdsKeepTheHeavyHitters) {
  ps::HotIds hot;
  std::mt19937_64 rng(9);
  std::map<int64_t, int64_t> sampled;
  int64_t position = 0, m = 0;
  std::vector<int64_t> batch;
  for (int round = 0; round < 200; ++round) {
    batch.clear();
    for (int i = 0; i < 97; ++i, ++position) {  // 97: batches do not line up with the sampling
      const uint64_t r = rng() % 100;
      const int64_t id = r < 30 ? 1 : r < 45 ? 2 : r < 55 ? 3 : static_cast<int64_t>(100 + rng() % 100000);
      batch.push_back(id);
      if (position % ps::kHotSampleEvery == 0) {
        ++sampled[id];
        ++m;
      }
    }
    hot.Add(batch);
  }
  const int64_t slack = m / (ps::kHotSlots + 1);
  const auto top = hot.Top(ps::kHotSlots);
  std::map<int64_t, int64_t> kept(top.begin(), top.end());
  for (const auto& [id, count] : sampled) {
    if (count > slack) {
      ASSERT_TRUE(kept.count(id)) << "id " << id << " (" << count << " of " << m << ") was not kept";
    }
  }
  for (const auto& [id, est] : kept) {
    EXPECT_EQ(est % ps::kHotSampleEvery, 0);
    EXPECT_LE(est / ps::kHotSampleEvery, sampled[id]) << "id " << id;
    EXPECT_GE(est / ps::kHotSampleEvery, sampled[id] - slack) << "id " << id;
  }
  ASSERT_GE(top.size(), 3u);
  EXPECT_EQ(top[0].first, 1);
  EXPECT_EQ(top[1].first, 2);
  EXPECT_EQ(top[2].first, 3);
  EXPECT_EQ(hot.Top(2).size(), 2u);
}

}  // namespace
}  // namespace ferry::test
