// ferry-ps: one parameter-server shard. Runs until SIGINT or SIGTERM.
//
//   ferry-ps --bind tcp://0.0.0.0:7000 --rank 0 --num-servers 2
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "ferry/cluster.h"
#include "ferry/server.h"
#include "ferry/messages/placement.h"
#include "ferry/messages/transport.h"
#include "ferry/nearest.h"
#include "internal/bind_endpoint.h"

namespace {

void Usage(std::FILE* out) {
  std::fputs(
      "usage: ferry-ps --bind ENDPOINT [--rank R] [--num-servers N] [--num-workers W]\n"
      "                [--compute-threads T] [--max-message-mb M] [--max-wait-s S] [--worker-timeout-s S]\n"
      "                [--checkpoint-dir DIR [--keep-checkpoints K] [--checkpoint-deltas D]\n"
      "                [--checkpoint-delta-share F] [--restore]] [--active-servers M] [--exit-when-drained]\n"
      "                [--replication 2 --peers EP0,EP1,... [--recover] [--failover-timeout-s S]]\n"
      "                [--curve-keys DIR]\n"
      "                [--max-held-per-peer N] [--memory-budget-mb M] [--max-connections N]\n"
      "                [--idle-timeout-s S] [--metrics [HOST:]PORT] [--disk-tier-dir DIR\n"
      "                [--disk-tier-cache-mb M] [--disk-tier-readers N]]\n"
      "  --bind             tcp://HOST:PORT (PORT 0..65535; 0 or * picks a free one), ipc://PATH\n"
      "                     (default tcp://127.0.0.1:7000); HOST: an IP address, an interface (eth0),\n"
      "                     * or 0.0.0.0 for all, localhost for 127.0.0.1 (not another host name)\n"
      "  --rank             this server's index in the server list (default 0)\n"
      "  --num-servers      servers in the cluster, 1-5040 (default 1)\n"
      "  --num-workers      workers in the job (default: the first worker to connect says, and that\n"
      "                     count then holds for the rest of this server's life: a later job with\n"
      "                     another count needs a restarted server; a line says when it is set so)\n"
      "  --compute-threads  helper threads for large updates and sparse reads, 0..1024 (0: none,\n"
      "                     the I/O thread does all) or auto: cores - 1 (default auto)\n"
      "  --max-message-mb   largest accepted message (default 1024)\n"
      "  --max-wait-s       longest a pull or barrier is held waiting (default 300)\n"
      "  --worker-timeout-s a worker that sent nothing (not even its heartbeats) for this long is\n"
      "                     silent: what waits for it fails at once, naming it (default 10; 0: never)\n"
      "  --checkpoint-dir   folder for checkpoints (the trainer's --checkpoint-every asks for them);\n"
      "                     every server of the job must see the same folder\n"
      "  --keep-checkpoints the newest K checkpoints are kept (default 3); with K >= 2 a server removes its\n"
      "                     shard of the oldest before writing a new one, so a disk that holds K has room\n"
      "  --checkpoint-deltas after a full checkpoint, up to D in a row write only what changed since the one\n"
      "                     before (a chain a restore applies in order), then a full one (default 0: all full)\n"
      "  --checkpoint-delta-share  a full checkpoint instead once the chain's deltas would pass F times its\n"
      "                     full shard's bytes (default 0.5)\n"
      "  --restore          start from the newest checkpoint in --checkpoint-dir that verifies (for\n"
      "                     any number of servers; needs --num-workers); fails if there is none\n"
      "  --active-servers   the job's first map gives slots to servers 0..M-1 alone; the others join\n"
      "                     when a move gives them a share (ferry-trainer --move-slots STEP:join=K).\n"
      "                     Give every server the same M (default: all servers)\n"
      "  --exit-when-drained  leave the job and exit 0 once this server owns no slot (a hand-over, the\n"
      "                     trainer's --move-slots, drained it) and every worker holds that map; at once\n"
      "                     after restoring a map that leaves it none. Server 0 never leaves\n"
      "  --replication      2: keep a replica of server R-1's slots, and answer a push only once server\n"
      "                     R+1 (this one's backup) has applied its updates too (default 1: none). For\n"
      "                     now no row lifecycle, top-k, moves, CURVE or disk tier (README, \"Replicas\")\n"
      "  --peers            with --replication 2: every server's endpoint, by rank, comma-separated\n"
      "  --recover          with --replication 2: start as the replacement of this rank's dead server,\n"
      "                     taking its slots from server R+1's replica and its replica from server R-1\n"
      "                     before it listens; the workers wait for it and go on (README, \"Failover\")\n"
      "  --failover-timeout-s  with --replication 2: how long --recover waits for each peer (default 60);\n"
      "                     a push applied here waits twice that and up to 30 s more for its backup\n"
      "  --memory-budget-mb memory the tables may take; declaring a table or creating sparse rows\n"
      "                     beyond it is refused (default: 80% of the machine's memory, or of its\n"
      "                     cgroup's limit if lower: v1 or v2, its own cgroup and its ancestors);\n"
      "                     a quarter of it more bounds the payloads of requests held while they\n"
      "                     wait (all-reduce values, pieces of pushes)\n"
      "  --disk-tier-dir    a folder on local disk (an SSD) of this server's own for the disk tier:\n"
      "                     the rows of tables declared with disk_tier beyond their max_rows live\n"
      "                     there instead of being evicted (made if missing; emptied at start if an\n"
      "                     earlier ferry-ps left it; a folder holding other files is refused)\n"
      "  --disk-tier-cache-mb  the disk tier's block cache (default 64)\n"
      "  --disk-tier-readers  threads reading the disk tier's rows for requests while the server\n"
      "                     serves others (default 4; 0: the I/O thread reads, serving nothing meanwhile)\n"
      "  --max-held-per-peer  requests one connection may have waiting (held pulls, barriers) at\n"
      "                     once; more are refused (default 4096)\n"
      "  --max-connections  connections open at once; one beyond closes the oldest that has sent\n"
      "                     nothing yet (a bare TCP connection, or one without a CURVE key) to\n"
      "                     take its place; when every one has spoken it is refused, told why, and\n"
      "                     closed\n"
      "                     (default 4096, or fewer if the descriptor limit is lower)\n"
      "  --idle-timeout-s   a connection of no worker that sends nothing for this long is closed;\n"
      "                     clients reconnect by themselves (default 120; 0: never)\n"
      "  --metrics          serve the counters, request latencies, the process's and per-table\n"
      "                     metrics for Prometheus at\n"
      "                     http://HOST:PORT/metrics (PORT 0 picks a free one; the line printed at\n"
      "                     start says where); plain HTTP: bind it to loopback or a trusted network\n"
      "  --curve-keys       a job's key folder (ferry-keys writes one): accept only the job's workers,\n"
      "                     each authenticated by its key (ZeroMQ CURVE), every message encrypted;\n"
      "                     reads DIR/server.key and DIR/workers.pub, and sets --num-workers\n"
      "Without --bind, --rank and --num-servers, the cluster comes from TF_CONFIG when it is set:\n"
      "this task must be a \"ps\" one; it listens at its entry's IPv4 address and port, or on\n"
      "0.0.0.0 at that port when the entry is a host name.\n",
      out);
}

bool ParseInt(std::string_view flag, const char* text, long long lo, long long hi, long long* out) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "ferry-ps: %.*s expects an integer in [%lld, %lld], got '%s'\n",
                 static_cast<int>(flag.size()), flag.data(), lo, hi, text);
    return false;
  }
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ferry::ServerOptions options;
  bool cluster_flags = false;  // --bind, --rank or --num-servers given: TF_CONFIG is not used
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      Usage(stdout);
      return 0;
    }
    if (flag == "--restore") {
      options.restore = true;
      continue;
    }
    if (flag == "--exit-when-drained") {
      options.exit_when_drained = true;
      continue;
    }
    if (flag == "--recover") {
      options.recover = true;
      continue;
    }
    constexpr std::string_view kValueFlags[] = {"--bind", "--rank", "--num-servers", "--compute-threads",
                                                "--max-message-mb", "--max-wait-s", "--num-workers",
                                                "--checkpoint-dir", "--keep-checkpoints", "--worker-timeout-s",
                                                "--checkpoint-deltas", "--checkpoint-delta-share",
                                                "--curve-keys", "--max-held-per-peer", "--memory-budget-mb",
                                                "--max-connections", "--idle-timeout-s", "--metrics",
                                                "--disk-tier-dir", "--disk-tier-cache-mb",
                                                "--disk-tier-readers", "--active-servers",
                                                "--replication", "--peers", "--failover-timeout-s"};
    if (std::find(std::begin(kValueFlags), std::end(kValueFlags), flag) == std::end(kValueFlags)) {
      constexpr std::string_view kOtherFlags[] = {"--help", "--restore", "--exit-when-drained"};
      std::vector<std::string_view> known(std::begin(kValueFlags), std::end(kValueFlags));
      known.insert(known.end(), std::begin(kOtherFlags), std::end(kOtherFlags));
      std::fprintf(stderr, "ferry-ps: unknown flag %s%s\n", argv[i], ferry::DidYouMean(flag, known).c_str());
      Usage(stderr);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "ferry-ps: %s needs a value\n", argv[i]);
      Usage(stderr);
      return 2;
    }
    const char* value = argv[++i];
    long long v = 0;
    if (flag == "--bind" || flag == "--rank" || flag == "--num-servers") cluster_flags = true;
    if (flag == "--bind") {
      if (ferry::Status s = ferry::ps::CheckBindEndpoint(value); !s.ok()) {
        std::fprintf(stderr, "ferry-ps: %s\n", s.message().c_str());
        return 2;
      }
      options.bind = ferry::ps::BindAddress(value);
    } else if (flag == "--rank") {
      if (!ParseInt(flag, value, 0, 65535, &v)) return 2;
      options.rank = static_cast<int>(v);
    } else if (flag == "--num-servers") {
      if (!ParseInt(flag, value, 1, ferry::placement::kSlots, &v)) return 2;
      options.num_servers = static_cast<int>(v);
    } else if (flag == "--compute-threads") {
      if (std::string_view(value) == "auto") {
        options.compute_threads = -1;
      } else {
        if (!ParseInt(flag, value, 0, 1024, &v)) return 2;
        options.compute_threads = static_cast<int>(v);
      }
    } else if (flag == "--max-message-mb") {
      if (!ParseInt(flag, value, 1, 1 << 20, &v)) return 2;
      options.max_message_bytes = v << 20;
    } else if (flag == "--max-wait-s") {
      if (!ParseInt(flag, value, 1, 86400, &v)) return 2;
      options.max_wait = std::chrono::seconds(v);
    } else if (flag == "--worker-timeout-s") {
      if (!ParseInt(flag, value, 0, 86400, &v)) return 2;
      options.worker_timeout = std::chrono::seconds(v);
    } else if (flag == "--num-workers") {
      if (!ParseInt(flag, value, 1, 65536, &v)) return 2;
      options.num_workers = static_cast<int>(v);
    } else if (flag == "--checkpoint-dir") {
      if (*value == '\0') {
        std::fprintf(stderr, "ferry-ps: --checkpoint-dir needs a folder\n");
        return 2;
      }
      options.checkpoint_dir = value;
    } else if (flag == "--failover-timeout-s") {
      if (!ParseInt(flag, value, 1, 86400, &v)) return 2;
      options.failover_timeout = std::chrono::seconds(v);
    } else if (flag == "--replication") {
      if (!ParseInt(flag, value, 1, 2, &v)) return 2;
      options.replication = static_cast<int>(v);
    } else if (flag == "--peers") {
      options.peers.clear();
      for (std::string_view rest = value; !rest.empty();) {
        const size_t comma = rest.find(',');
        options.peers.emplace_back(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      }
    } else if (flag == "--active-servers") {
      if (!ParseInt(flag, value, 1, 5040, &v)) return 2;
      options.active_servers = static_cast<int>(v);
    } else if (flag == "--keep-checkpoints") {
      if (!ParseInt(flag, value, 1, 1000000, &v)) return 2;
      options.keep_checkpoints = static_cast<int>(v);
    } else if (flag == "--checkpoint-deltas") {
      if (!ParseInt(flag, value, 0, 1000000, &v)) return 2;
      options.checkpoint_deltas = static_cast<int>(v);
    } else if (flag == "--checkpoint-delta-share") {
      char* end = nullptr;
      errno = 0;
      const double f = std::strtod(value, &end);
      if (*value == '\0' || *end != '\0' || errno != 0 || !(f > 0.0 && f <= 100.0)) {
        std::fprintf(stderr, "ferry-ps: --checkpoint-delta-share must be a number in (0, 100], not '%s'\n", value);
        return 2;
      }
      options.checkpoint_delta_share = f;
    } else if (flag == "--memory-budget-mb") {
      if (!ParseInt(flag, value, 1, int64_t{1} << 30, &v)) return 2;
      options.memory_budget_bytes = v << 20;
    } else if (flag == "--disk-tier-dir") {
      options.disk_tier_dir = value;
    } else if (flag == "--disk-tier-cache-mb") {
      if (!ParseInt(flag, value, 0, int64_t{1} << 30, &v)) return 2;
      options.disk_tier_cache_bytes = v << 20;
    } else if (flag == "--disk-tier-readers") {
      if (!ParseInt(flag, value, 0, 64, &v)) return 2;
      options.disk_tier_readers = static_cast<int>(v);
    } else if (flag == "--max-held-per-peer") {
      if (!ParseInt(flag, value, 1, 1 << 20, &v)) return 2;
      options.max_held_per_peer = static_cast<size_t>(v);
    } else if (flag == "--max-connections") {
      if (!ParseInt(flag, value, 1, 1 << 20, &v)) return 2;
      options.max_connections = static_cast<size_t>(v);
    } else if (flag == "--metrics") {
      options.metrics_bind = value;
    } else if (flag == "--idle-timeout-s") {
      if (!ParseInt(flag, value, 0, 86400, &v)) return 2;
      options.idle_timeout = std::chrono::seconds(v);
    } else if (flag == "--curve-keys") {
      auto keys = ferry::curve::LoadServerKeys(value);
      if (!keys.ok()) {
        std::fprintf(stderr, "ferry-ps: --curve-keys: %s\n", keys.status().message().c_str());
        return 2;
      }
      options.curve = std::move(*keys);
    } else {
      // Listed in kValueFlags but not handled above: a bug in this function, not the caller's.
      std::fprintf(stderr, "ferry-ps: internal error: flag %s is listed but not handled\n", argv[i - 1]);
      return 70;
    }
  }

  // The cluster from TF_CONFIG when no cluster flag says otherwise (flags win).
  if (!cluster_flags) {
    auto cluster = ferry::ClusterFromEnvironment();
    if (!cluster.ok()) {
      std::fprintf(stderr, "ferry-ps: %s\n", cluster.status().message().c_str());
      return 2;
    }
    if (*cluster) {
      const ferry::ClusterConfig& c = **cluster;
      if (c.task_type != "ps") {
        std::fprintf(stderr, "ferry-ps: TF_CONFIG: this task is %s %d: run ferry-trainer there, not ferry-ps\n",
                     c.task_type.c_str(), c.task_index);
        return 2;
      }
      options.bind = c.bind;
      options.rank = c.rank;
      options.num_servers = static_cast<int>(c.servers.size());
      if (options.num_workers == 0) options.num_workers = c.num_workers;
      std::printf("ferry-ps: cluster from TF_CONFIG (ps %d of %zu)\n", c.task_index, c.servers.size());
    }
  }

  // Block the stop signals before any thread starts, then wait for one of them here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  ferry::transport::TuneAllocatorForLargeMessages();
  // Connections take descriptors: as many as this process may have (the hard limit), so the
  // connection cap, not the soft limit's usual 1024, is what bounds them.
  if (rlimit lim{}; ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, rlim_t{1} << 20);
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  auto server = ferry::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "ferry-ps: %s\n", server.status().ToString().c_str());
    // 3: a replacement that could not take the dead server's place (its launcher falls back to the
    // job's checkpoint rather than trying again).
    return options.recover ? 3 : 1;
  }
  std::printf("ferry-ps rank %d of %d listening on %s%s\n", options.rank, options.num_servers,
              (*server)->endpoint().c_str(), options.curve ? " (CURVE: the job's worker keys only)" : "");
  if (!options.curve && options.bind.starts_with("tcp://") && !options.bind.starts_with("tcp://127.") &&
      !options.bind.starts_with("tcp://localhost:") && !options.bind.starts_with("tcp://[::1]:")) {
    std::fprintf(stderr,
                 "ferry-ps rank %d: warning: listening on %s without CURVE: anyone who can reach this port can "
                 "read and change the model, or stop the job. Pass --curve-keys (ferry-keys makes them), or keep "
                 "the port on a network only the job's hosts reach.\n",
                 options.rank, options.bind.c_str());
  }
  if (!(*server)->metrics_url().empty()) {
    std::printf("ferry-ps rank %d: metrics at %s\n", options.rank, (*server)->metrics_url().c_str());
  }
  if ((*server)->restored_step() >= 0) {
    std::printf("ferry-ps rank %d: restored the checkpoint of step %lld from %s\n", options.rank,
                static_cast<long long>((*server)->restored_step()), options.checkpoint_dir.c_str());
  }
  std::fflush(stdout);
  int sig = 0;
  if (!options.exit_when_drained) {
    sigwait(&stop, &sig);
  } else {  // a server that may leave the job looks every 100 ms whether it has
    const timespec every{0, 100'000'000};
    while (sig <= 0 && !(*server)->left()) sig = sigtimedwait(&stop, nullptr, &every);
  }
  if (sig > 0) {
    std::printf("ferry-ps rank %d: %s, stopping\n", options.rank, sig == SIGINT ? "SIGINT" : "SIGTERM");
  } else {
    std::printf("ferry-ps rank %d: left the job (it owns no slot), stopping\n", options.rank);
  }
  std::fflush(stdout);
  (*server)->Stop();
  if (options.replication == 2) {  // what this server's replication did (pushes still waiting for it are counted)
    const auto c = (*server)->stats().counters;
    std::printf("ferry-ps rank %d: replicas: %lld updates applied here, %lld forwarded to its backup (server %d), "
                "%lld applied to its replica of server %d's slots, %lld replication errors\n",
                options.rank, static_cast<long long>(c.at("updates_applied")),
                static_cast<long long>(c.at("updates_forwarded")), (options.rank + 1) % options.num_servers,
                static_cast<long long>(c.at("replica_updates_applied")),
                (options.rank + options.num_servers - 1) % options.num_servers,
                static_cast<long long>(c.at("replica_errors")));
    std::fflush(stdout);
  }
  // Each dense table's chunks here, and how many updates each took over the job (their versions,
  // which a replacement takes over): an async job's workers' pushes, each once.
  for (const ferry::DenseUpdates& d : (*server)->dense_updates()) {
    std::printf("ferry-ps rank %d: table '%s': %lld dense chunk(s) here, each updated %lld to %lld times\n",
                options.rank, d.table.c_str(), static_cast<long long>(d.chunks), static_cast<long long>(d.least),
                static_cast<long long>(d.most));
  }
  std::fflush(stdout);
  // libzmq leaves an ipc:// socket file behind; the path is ours, remove it.
  const std::string endpoint = (*server)->endpoint();
  if (endpoint.starts_with("ipc://")) ::unlink(endpoint.c_str() + 6);
  return 0;
}
