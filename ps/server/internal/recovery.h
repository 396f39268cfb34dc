// ps/server/internal/recovery.h — failover (protocol 1.22, PROTOCOL.md "Failover"): the state a
// replacement server (ServerOptions::recover) takes from its peers before it listens, and the
// image of a registry's slots they send it.
//
// Thread-safety: none; RestoreImage and EncodeImage run on the thread that owns the registry.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "ferry/server.h"
#include "ferry/status.h"
#include "internal/table_registry.h"

namespace ferry::ps {

// A number for this server process, random and never 0 (the Hello reply's `epoch`, 1.22): a client
// that lost its connection tells a replacement from the same process by it.
uint64_t NewProcessEpoch();

// A worker as a server sees it, for its replacement: its clock (ssp), whether it has finished or
// left the job. (An ssp pull on the replacement waits for the workers' clocks: a worker whose last
// Clock the dead server had taken sends no other before that pull.)
struct WorkerState {
  int64_t clock = 0;
  bool finished = false, left = false;
};

// What a replacement took from its peers (Recover); all zero for a server that did not recover.
struct Recovered {
  bool done = false;
  uint32_t incarnation = 0;          // this process's as a primary: its predecessor's + 1
  uint32_t primary_incarnation = 0;  // its primary's, whose replica it took
  uint64_t primary_covers = 0;       // the primary's Replicates (by id) its image holds
  int num_workers = 0;               // the job's, as its peers know it
  std::vector<WorkerState> workers;  // by rank: the highest clock either peer knew, finished or left at either
};

// The image of the slots a registry holds (Snapshot's pages, end to end), little-endian:
//   u64 n; n bytes: CopyShard's image (a full shard, messages/CHECKPOINT.md: every table's
//     declaration, each dense chunk with its version, each sparse row pushed at least once);
//   u64 units; per unit (each dense chunk held, then each sparse shard): u64 table id, i64 chunk
//     (-1: the sparse shard), u64 k, k x i64: by worker rank, one more than the highest step of
//     its pushes the unit applied (StepsTaken::taken); (1.23) u64 g, g x (i64 rank, u64 a, a
//     bytes of ids (dense: 0), u64 b, b bytes of float32 gradients): a sync table's gradients
//     held for its open step, by rank;
//   u64 w; per worker rank: i64 clock, u8 flags (1: finished, 2: left the job);
//   u32: CRC-32 of every byte before.
// Throws std::bad_alloc when memory is short.
std::vector<char> EncodeImage(const TableRegistry& tables, const std::vector<WorkerState>& workers);

// Restores `blob` (EncodeImage's) into `tables`, which is empty and placed as server `rank`'s (of a
// job of `num_workers`): its tables, chunks, rows and versions, and each unit's steps taken, which
// become every worker's replay floor there: a push that the dead server's backup had applied, sent
// again by its worker to the replacement, is skipped as a replay (StepsTaken). `where` names the
// image in errors; DATA_LOSS for an image that does not verify.
// `workers` gets the image's workers.
Status RestoreImage(std::span<const char> blob, int rank, int num_workers, TableRegistry* tables,
                    const std::string& where, std::vector<WorkerState>* workers);

// ServerOptions::recover, before the server binds: asks its backup (server rank+1) for the image
// of its own slots, which that server's replica holds, and its primary (server rank-1) for the
// image of the primary's slots, for its replica (Snapshot, in pages of at most
// options.max_message_bytes), each within options.failover_timeout (saying every 5 s whom it waits
// for), and restores them into `tables` and `replicas`. Errors say which peer and what.
StatusOr<Recovered> Recover(const ServerOptions& options, zmq::context_t& context, TableRegistry* tables,
                            TableRegistry* replicas);

}  // namespace ferry::ps
