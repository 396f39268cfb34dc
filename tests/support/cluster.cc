#include "support/cluster.h"

#include <atomic>

#include <gtest/gtest.h>

namespace ferry::test {

TableSpec SgdTable(const std::string& name, int64_t n, Consistency consistency) {
  TableSpec spec;
  spec.name = name;
  spec.shape = {n};
  spec.optimizer.learning_rate = 1.0f;
  spec.consistency = consistency;
  return spec;
}

TableSpec SgdSparseTable(const std::string& name, int64_t dim, Consistency consistency) {
  TableSpec spec;
  spec.name = name;
  spec.type = TableType::kSparse;
  spec.dim = dim;
  spec.optimizer.learning_rate = 1.0f;
  spec.consistency = consistency;
  return spec;
}

LocalCluster LocalCluster::Start(int num_servers, bool tcp, ServerOptions base) {
  static std::atomic<int> next_cluster{0};
  const int id = next_cluster++;
  LocalCluster c;
  c.context = Context::Create(1);
  auto inproc = [&](int s) { return "inproc://ferry-test-" + std::to_string(id) + "-ps" + std::to_string(s); };
  // Replication 2 over inproc: every server's endpoint is known before it binds (a backup is
  // connected to before it is started).
  if (base.replication > 1 && base.peers.empty() && !tcp) {
    for (int s = 0; s < num_servers; ++s) base.peers.push_back(inproc(s));
  }
  for (int s = 0; s < num_servers; ++s) {
    ServerOptions o = base;
    o.bind = tcp ? "tcp://127.0.0.1:0" : inproc(s);
    if (!base.peers.empty() && !base.peers[static_cast<size_t>(s)].starts_with("inproc://")) o.bind = base.peers[s];
    o.rank = s;
    o.num_servers = num_servers;
    if (!o.curve) o.context = c.context;  // a CURVE server has its own (for its ZAP handler)
    if (o.compute_threads < 0) o.compute_threads = 1;  // unless a test asks: 0 is none
    if (!o.disk_tier_dir.empty()) o.disk_tier_dir += "/server-" + std::to_string(s);  // a store each
    auto server = Server::Start(o);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return c;
    c.endpoints.push_back((*server)->endpoint());
    c.servers.push_back(std::move(server).value());
  }
  return c;
}

std::unique_ptr<Client> LocalCluster::Connect(int rank, int num_workers, ClientOptions base) const {
  base.servers = endpoints;
  base.rank = rank;
  base.num_workers = num_workers;
  base.context = context;
  auto client = Client::Connect(base);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  return std::move(client).value();
}

}  // namespace ferry::test
