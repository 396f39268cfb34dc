// ferry/server.h — a Ferry parameter server (one shard of every table).
//
// A server binds one endpoint, holds its share of every declared table in CPU memory, applies
// pushed gradients with each table's optimizer and enforces each table's consistency mode
// (sync / async / ssp). The `ferry-ps` binary is a thin main() around this class; tests run
// several servers in one process over inproc:// with a shared Context.
//
// Thread-safety: Start() returns a running server whose work happens on its own threads;
// endpoint(), stats() and Stop() may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/context.h"
#include "ferry/curve.h"
#include "ferry/status.h"

namespace ferry {

struct ServerOptions {
  // Where to listen: tcp://HOST:PORT (port 0 picks a free one), ipc://PATH or inproc://NAME.
  std::string bind = "tcp://127.0.0.1:7000";
  int rank = 0;         // this server's index in the cluster's server list
  int num_servers = 1;  // servers in the cluster (placement is computed from it)
  // Helper threads that share large updates and sparse reads with the I/O thread: 0 = none (the
  // I/O thread does everything), -1 = one per core, minus one. bench/RESULTS.md "The server's
  // helper threads" measures when they pay.
  int compute_threads = -1;
  // Largest message accepted, all frames together; larger ones get an error reply.
  int64_t max_message_bytes = int64_t{1} << 30;
  // Longest a pull (sync / ssp) or barrier is held waiting before it gets a DEADLINE_EXCEEDED reply.
  std::chrono::milliseconds max_wait{std::chrono::minutes(5)};
  // A worker that promised heartbeats (every client does: protocol 1.3) and has sent nothing
  // for longer than this (or 4 x its promised interval, if longer) is silent: dead, stopped or
  // cut off. Pulls and collectives that wait for it then fail at once with UNAVAILABLE naming
  // it, instead of waiting out max_wait; when every worker still training is silent, the server
  // says once that its job looks gone. 0: never.
  // The default is twice the clients' own heartbeat timeout: a worker starved of CPU on a busy
  // host for a few seconds must not be called dead (that fails the job for everyone).
  std::chrono::milliseconds worker_timeout{std::chrono::seconds(10)};
  // Requests held at once (waiting pulls, barriers); beyond that new ones are refused.
  size_t max_held = 1 << 16;
  // Of those, at most this many from one connection: one peer cannot fill the room for the
  // others. The default is a client's own bound on what it has in flight (ClientOptions::
  // max_in_flight), so a well-behaved worker never meets it.
  size_t max_held_per_peer = 4096;
  // Connections (tcp:// and ipc://) open at once. One accepted beyond it is refused: its first
  // request is answered RESOURCE_EXHAUSTED saying so, and it is closed within 2 s. 0: 4096, or
  // fewer if the descriptor limit (RLIMIT_NOFILE) is lower, leaving 128 descriptors for files.
  size_t max_connections = 0;
  // A connection that speaks for no worker (no Hello or request of a rank), sends nothing for
  // this long and has no request waiting here is closed; a Ferry client reconnects by itself
  // when it next sends. Workers' connections are one per rank and never closed for idleness.
  // 0: never.
  std::chrono::milliseconds idle_timeout{std::chrono::minutes(2)};
  // The memory this server's tables may take: a dense shard is charged when it is declared, a
  // sparse row when it is created; what would go over is refused with RESOURCE_EXHAUSTED saying
  // how much was asked and how much is left. 0: 80% of the machine's memory, or of this
  // process's cgroup limit if lower (v1 or v2: the lowest of its own cgroup and its ancestors).
  int64_t memory_budget_bytes = 0;
  // The disk tier's store (README, "The disk tier"): a folder on local disk (an SSD) of this
  // server's own, where the sparse tables declared with disk_tier keep the rows their RAM tier
  // (max_rows) has no room for. Made if missing; a folder an earlier ferry-ps left is emptied
  // (the store is not durable: checkpoints are), and one holding anything else is refused.
  // Empty: tables with disk_tier are refused.
  std::string disk_tier_dir;
  // The store's block cache (RocksDB's: its index and filter blocks, and recently read rows).
  int64_t disk_tier_cache_bytes = int64_t{64} << 20;
  // Threads that read the disk tier's rows for requests while the server serves others (a request
  // that needs rows on disk waits for them; the I/O thread never waits for the disk). 0 to 64; 0:
  // the I/O thread reads them itself, serving nothing meanwhile.
  int disk_tier_readers = 4;
  // Read the store with O_DIRECT: its rows do not go through the page cache (which a memory
  // cgroup counts against the process's limit), only through its block cache.
  bool disk_tier_direct_reads = false;
  // For tests: each read of rows on disk first waits this long (a slow disk).
  std::chrono::milliseconds disk_tier_read_delay{0};
  // Workers in the job; 0: the first Hello says. A Hello that disagrees is refused. Required
  // with `restore` (the restored tables are made for the job's workers).
  int num_workers = 0;
  // Where Checkpoint requests write this server's shard (and CommitCheckpoint the manifest);
  // empty: checkpoints are refused. Every server of a job must see the same folder (one host, or
  // a shared file system), for a restore reads every shard. Format: messages/CHECKPOINT.md.
  std::string checkpoint_dir;
  // Checkpoints kept in checkpoint_dir: the newest this many; older ones are removed.
  int keep_checkpoints = 3;
  // Delta checkpoints (messages/CHECKPOINT.md): after a full shard, up to this many checkpoints
  // in a row write only the dense chunks and sparse rows changed since the one before (and the
  // ids evicted), then a full shard again; 0: every checkpoint writes every row. A delta is
  // written only over this process's own previous shard, when the checkpoint the client
  // committed last is that one (Checkpoint's previous_step).
  int checkpoint_deltas = 0;
  // A full shard instead of a delta once the deltas since the last full shard, this one
  // included, would pass this share of the full shard's bytes.
  double checkpoint_delta_share = 0.5;
  // Start from the newest checkpoint in checkpoint_dir that verifies, re-placed for this server's
  // rank and the server count (which may differ from the one that wrote it). Start fails, naming
  // what is wrong with each, if none does.
  bool restore = false;
  // Leave the job once this server owns no slot of the map it holds (protocol 1.20, PROTOCOL.md
  // "Servers joining and leaving"): after a Placement drained it, as soon as every worker holds
  // that map (its heartbeats say so, or it was answered "moved" here, or it has left, or it is
  // not connected); at once when it restored a map that leaves it nothing. Then left() turns true
  // (ferry-ps exits 0). Server 0 never leaves: it coordinates the collectives and the checkpoints.
  bool exit_when_drained = false;
  // The job's first map gives slots to servers 0..active_servers-1 alone (0: to all); the others
  // own none until a map gives them a share (Client::MoveSlots, the trainer's --move-slots
  // STEP:join=K): they join the job then. Every server of a job must be given the same count, and
  // its clients be of protocol 1.20 or later (an older one is refused at its Hello).
  int active_servers = 0;
  // Copies of each server's slots (protocol 1.21, PROTOCOL.md "Replicas"): 1, none; 2, server r
  // keeps a replica of server r-1's (mod num_servers), and a server forwards every update it
  // applies to its backup, server r+1, answering the push only once the backup has it too
  // (chain replication). A backup that does not answer within 2 x failover_timeout (and half of it
  // more, up to 30 s: the time a replacement may take) fails the pushes
  // that wait for it (UNAVAILABLE, naming it); a replica that misses an update is out of step and
  // refuses later ones. A dead server is replaced by one started with `recover` (1.22), the others
  // and the workers going on; sync tables too (1.23: the backup holds each gradient held for a
  // step, and closes the steps its primary closes). For now: no tables with lifecycle settings, a
  // disk tier or top-k (refused when declared), no moves, no CURVE. The memory budget is
  // then the shard's and the replica's together, half each.
  int replication = 1;
  // With replication 2: every server's endpoint, by rank (num_servers of them), to reach its backup.
  std::vector<std::string> peers;
  // Failover (protocol 1.22, PROTOCOL.md "Failover"; replication 2): start as the replacement of
  // this rank's dead server. Before it binds, it takes its own slots from its backup's replica and
  // its replica from its primary (each within failover_timeout), with every worker's steps there:
  // a push the dead server's backup had, sent again by its worker, is skipped as a replay. The
  // workers' clients wait for it and send again what the dead one had not answered.
  bool recover = false;
  // With replication 2: how long a replacement waits for each peer's image, and a primary's pushes
  // for a backup that does not confirm them (it may be being replaced) before they fail.
  std::chrono::milliseconds failover_timeout{std::chrono::seconds(60)};
  // CURVE (ferry/curve.h): every connection must authenticate with one of `workers`' keys and is
  // encrypted; a key speaks for its worker's rank alone. Unset: no authentication (bind to
  // loopback, or to a network only the job's hosts reach). Needs tcp:// or ipc:// and the
  // server's own Context (ZeroMQ asks one authentication handler per context). Sets num_workers
  // when that is 0; otherwise the two must agree.
  std::optional<CurveServerKeys> curve;
  // Required for inproc://; optional otherwise (a private one is made).
  std::shared_ptr<Context> context;
  // The counters, request latencies, the process's and per-table metrics in the Prometheus text
  // format (README.md, "Seeing the tables"), at http://HOST:PORT/metrics:
  // "PORT" or "HOST:PORT" (port 0 picks a free one; metrics_url() says which). Empty: none.
  // Plain HTTP without authentication: bind it to loopback or a network only operators reach.
  std::string metrics_bind;
};

struct ServerStats {
  // Monotonic counters: messages, bad_messages, errors_sent, late_gradients_dropped, ...; and two
  // levels: memory_budget_bytes and memory_budget_used_bytes.
  std::map<std::string, int64_t> counters;
  // staleness_histogram[k]: updates applied k versions after the pushing worker's last pull
  // (async and ssp tables); the last bucket counts k >= size-1.
  std::vector<int64_t> staleness_histogram;
};

// A dense table's chunks held by one server, and the updates each took (their versions: the
// lowest and highest).
struct DenseUpdates {
  std::string table;
  int64_t chunks = 0, least = 0, most = 0;
};

class Server {
 public:
  // Binds and starts serving. Fails with a clear status if the endpoint cannot be bound.
  static StatusOr<std::unique_ptr<Server>> Start(ServerOptions options);

  virtual ~Server() = default;  // stops the server
  // The bound endpoint (with the actual port when bound to port 0).
  virtual std::string endpoint() const = 0;
  virtual ServerStats stats() const = 0;
  // The step of the checkpoint this server started from (ServerOptions::restore), or -1.
  virtual int64_t restored_step() const = 0;
  // Where the metrics are served (ServerOptions::metrics_bind), or empty.
  virtual std::string metrics_url() const = 0;
  // Whether this server has left the job (ServerOptions::exit_when_drained): it answers on until
  // stopped, but no worker needs it any more.
  virtual bool left() const = 0;
  // Stops serving and joins the threads; requests in flight get no reply. Idempotent.
  virtual void Stop() = 0;
  // Once stopped: each dense table with chunks here (empty while it serves).
  virtual std::vector<DenseUpdates> dense_updates() const = 0;
};

}  // namespace ferry
