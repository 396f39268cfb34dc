// ps/server/internal/sync.h — sync aggregation. A sync step's gradients are held per worker rank
// in the chunk's (or sparse shard's) SyncSlots until the step has its quorum
// (Workers::StepComplete); then they are summed in rank order, averaged over the gradients held
// and applied once, and the chunk moves to the next step. See PROTOCOL.md, "Sync steps".
//
// Thread-safety: none; the server's I/O thread calls these.
#pragma once

#include <cstdint>

#include <zmq.hpp>

#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "internal/tables.h"
#include "internal/updates.h"

namespace ferry::ps {

// Whether a sync push from `rank` for `step` may go to slots at `version`: refused for a step
// not reached yet, or pushed twice by the rank. A late push (step < version) passes: the caller
// drops it and counts it.
Status CheckSyncPush(const TableSpec& spec, const SyncSlots& sync, int64_t version, int rank, int64_t step);

// True, and the mark taken away, when `rank`'s push for `step` is held already, marked as sent
// (SyncSlots::restored: a replacement's from its backup's image, sent again because its answer was
// lost; or a worker's earlier process's, sent again by its new process). The caller skips it as a
// replay (the gradient held is that push's) and forwards the held one to its backup again.
bool ResentHold(SyncSlots& sync, int64_t version, int rank, int64_t step);

// Holds `rank`'s gradient (and, for a sparse table, its ids) for the current step.
void HoldGradient(SyncSlots& sync, int rank, zmq::message_t grad);
void HoldGradient(SyncSlots& sync, int rank, zmq::message_t ids, zmq::message_t grad);

// Forgets `rank`'s gradient held for the current step, if any (a replica told that its primary
// dropped it). True if one was held.
bool DropGradient(SyncSlots& sync, int rank);

// Marks `rank`'s gradient held for the current step, if any, as sent already (SyncSlots::restored):
// a worker that connects again is a new process, which pushes that step again (ResentHold).
void MarkSent(SyncSlots& sync, int rank);

// Closes the current step: applies the average of the held gradients, moves the version on and
// empties the slots for `num_workers`. Sparse rows are summed per id, ids first seen in rank
// order, and each row updated once. Returns the elements whose update would not have been finite,
// which kept their values (Updater).
NotFinite CloseSyncStep(Updater& updater, const TableSpec& spec, DenseChunk& c, int num_workers);
NotFinite CloseSyncStep(Updater& updater, SparseShard& shard, int num_workers);

}  // namespace ferry::ps
