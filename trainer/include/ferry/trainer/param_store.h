// ferry/trainer/param_store.h — where a model's parameters live during training: on Ferry's
// parameter servers (ServerStore, over a Client) or in this process (LocalStore, the --local
// reference). Models talk to a ParamStore only, so the local reference runs exactly the model
// code a worker runs.
//
// LocalStore is a faithful twin of one worker training against the servers in sync mode with
// M = 1: tables are initialised by the servers' own code (ps::InitDense / ps::InitSparseRow, so
// values depend only on (seed, table, index or id)), updated by the servers' optimizer code
// (ps::ApplyUpdate) once per push, sparse rows are created on first touch and keep their own
// optimizer state and step count (ps::SparseShard, the servers' own class).
//
// Thread-safety: a ParamStore is used by one worker thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "ferry/client.h"
#include "ferry/status.h"
#include "ferry/table_spec.h"

namespace ferry::trainer {

// Sparse rows to pull and gradients to push (ferry/client.h); a model's ids are distinct within
// a table.
using ferry::SparseIn;
using ferry::SparseOut;

// Where this worker stands, as the servers reported it.
struct StoreProgress {
  // Sync: the global step — the step the last pull was served at, which the next push counts for
  // (a worker that fell behind, or joined a job in progress, moves to it). Otherwise the last
  // pull's step.
  int64_t step = 0;
  int64_t first_served = -1;  // sync: the step served at the first pull (> 0: joined a job already there)
  int64_t pushes_used = 0;     // pushes (one a step) of which some part counted
  int64_t pushes_dropped = 0;  // pushes dropped whole: their sync step had closed before they came
  // Of the pulls' time so far, the part the servers held them waiting for their step (sync: for
  // the other workers' gradients; ssp: for their clocks): waiting, not transfer.
  double pull_wait_s = 0;
  // The communication so far, as if alone: for each call's requests (in flight together), the
  // longest from the call to its last reply, less the time the servers held it (pull_wait_s).
  // With a pipeline (Pipeline below) it overlaps the worker's compute, so it is not a part of
  // the worker's time but what a step's communication costs.
  double comm_s = 0;
};

// How a ServerStore overlaps a step's communication (trainer flag --pipeline).
enum class Pipeline : uint8_t {
  // Push, wait, and pull the next step's tables in their own round trip (the path before 1.6 of
  // the trainer; kept to measure against).
  kNone,
  // The dense tables' push of step t and their pull for step t + 1 travel in one round trip per
  // server (PushPullDense), and the trainer goes on (loads the next batch) while it travels: the
  // next Pull waits for it. The same parameters as kNone, so sync runs give the same bits.
  kExchange,
  // Async and ssp only: as kExchange, but the parameters that come back are used one step later,
  // so the round trip overlaps the whole next step's compute. Step t computes on parameters
  // read at the end of step t - 2: without its own step t - 1 gradient (one step more of
  // staleness; ssp:S then bounds the staleness at S + 1). A model may also read its next
  // batch's sparse rows a step early (PullSparseAhead), with the same staleness.
  kPrefetch,
};

class ParamStore {
 public:
  virtual ~ParamStore() = default;

  // Declares (or, locally, creates) the tables. Names must be unique.
  virtual Status Declare(std::span<const TableSpec> specs) = 0;
  // Reads the tables for `step` (the loop's step / ssp clock); every request of one call is in
  // flight together and all are waited for. Sync tables on servers are read at the global step
  // this worker knows (progress().step + 1 after a push): `step` only orders the loop.
  // A dense table an earlier Push pulled ahead for this `step` into the same buffer (then_pull)
  // is not asked for again: the Pull waits for that exchange instead.
  virtual Status Pull(std::span<const DenseOut> dense, std::span<const SparseOut> sparse, int64_t step) = 0;
  // Sends the gradients of `step` (each one optimizer update locally). Sync: they count for the
  // step the last pull was served at (progress().step), whatever the loop's `step`.
  // `then_pull` (empty, or the tables of `dense` in the same order): buffers to pull those tables
  // into for step + pull_ahead() in the same round trip as their push. With pull_ahead() == 1 the
  // call returns once the sparse gradients are answered, the dense exchange still in flight;
  // with 2 (and `then_pull`) the sparse push stays in flight with it. What is in flight must stay
  // untouched (`dense`, `then_pull`, and with 2 the sparse ids and gradients) until a Pull for
  // step + pull_ahead() (or Flush) returns; a later Pull reports its failure.
  virtual Status Push(std::span<const DenseIn> dense, std::span<const SparseIn> sparse, int64_t step,
                      std::span<const DenseOut> then_pull = {}) = 0;
  // Sends part of `step`'s dense gradients ahead of its Push (--push-by-layer: layers as
  // backward yields them), each pulling ahead as the Push's `then_pull` would (the same tables,
  // in order); returns once sent. The Push of `step` then names every table as usual, in the
  // buffers the parts were sent from, and sends only those no part sent; the parts and the Push
  // are one push of the step (counted once), ended and reported as the Push's exchange is. A
  // table goes in one part at most; no Pull may come between a step's parts and its Push; a
  // refused Push ends its parts (what they sent is applied). Stores that do not pull ahead
  // (pull_ahead() == 0) send nothing here: their Push sends it all.
  virtual Status PushPart(std::span<const DenseIn> dense, int64_t step, std::span<const DenseOut> then_pull) {
    (void)dense;
    (void)step;
    (void)then_pull;
    return Status::Ok();
  }
  // Starts reading `sparse`'s rows for `step` and returns (pull_ahead() == 2, async and ssp
  // tables): the Pull for `step` that names the same tables, ids and buffers, in the same order,
  // waits for them instead of asking again (and reports their failure). Until then the ids and
  // rows must stay untouched; a Pull into other buffers leaves them travelling (one that writes
  // into theirs waits for them first, and asks again). One at a time: a second call waits for
  // the first. Stores that do not read ahead return OK and start nothing (the Pull reads them).
  virtual Status PullSparseAhead(std::span<const SparseOut> sparse, int64_t step) {
    (void)sparse;
    (void)step;
    return Status::Ok();
  }
  // Waits for what is still in flight and forgets what was pulled ahead: the next Pull reads
  // every table again (the final parameters, after the other workers finished).
  // Sync: the next pull asks for `step` and the next push counts for it (a worker that joins
  // the job at that step, --join); otherwise the step the servers serve first.
  virtual void JoinAt(int64_t step) { (void)step; }
  virtual Status Flush() = 0;
  // 0: Push does not pull ahead (then_pull is ignored); 1: then_pull is for the next step
  // (Pipeline::kExchange); 2: for the step after it (kPrefetch).
  virtual int pull_ahead() const = 0;
  // The end of `step`: ssp tables advance this worker's clock to step + 1.
  virtual Status EndStep(int64_t step) = 0;

  virtual StoreProgress progress() const = 0;

  // Null for LocalStore.
  virtual Client* client() { return nullptr; }
};

// `client` must outlive the store. Each table is read and written as its own consistency says:
// with any sync table the global step is tracked (sync tables are pulled at it, the others at
// the loop's step); with any ssp table EndStep advances the clock. Pipeline::kPrefetch refuses
// (at Declare) a sync table: a sync step's parameters exist only once the step closed.
std::unique_ptr<ParamStore> CreateServerStore(Client* client, Pipeline pipeline = Pipeline::kExchange);
// That refusal: INVALID_ARGUMENT naming the first sync table when `pipeline` is kPrefetch.
Status CheckPipelineFits(Pipeline pipeline, std::span<const TableSpec> specs);
std::unique_ptr<ParamStore> CreateLocalStore();

}  // namespace ferry::trainer
