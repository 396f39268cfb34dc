// tests/support/cluster.h — a whole Ferry cluster in one process: servers on inproc:// (or tcp
// loopback) sharing one Context, and one client per worker.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/server.h"

namespace ferry::test {

// A dense table of `n` floats from zeros, SGD with learning rate 1 (after one push of g its
// values are -g: easy to check by hand), of the given consistency.
TableSpec SgdTable(const std::string& name, int64_t n, Consistency consistency);
// A sparse table of rows of `dim` floats from zeros, SGD with learning rate 1 (after pushes g, a
// row is -sum(g)), of the given consistency.
TableSpec SgdSparseTable(const std::string& name, int64_t dim, Consistency consistency = Consistency::kAsync);

// Client options with no heartbeats: a test that counts the servers' messages counts only its own.
inline ClientOptions NoHeartbeats() {
  ClientOptions o;
  o.heartbeat_timeout = std::chrono::milliseconds(0);
  return o;
}

struct LocalCluster {
  // Starts `num_servers` servers; endpoints are unique per cluster. `tcp` binds 127.0.0.1:0.
  // They share `context`, but for servers with CURVE (base.curve), which have their own. With
  // base.disk_tier_dir, server s keeps its store in disk_tier_dir/server-s. With base.replication 2
  // on inproc, base.peers are the servers' own endpoints (tcp: the test gives them); peers given on
  // tcp or ipc are the endpoints the servers bind.
  static LocalCluster Start(int num_servers, bool tcp = false, ServerOptions base = {});

  // A connected client for worker `rank` of `num_workers` (fails the test on error).
  std::unique_ptr<Client> Connect(int rank, int num_workers, ClientOptions base = {}) const;

  std::shared_ptr<Context> context;
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::string> endpoints;
};

}  // namespace ferry::test
