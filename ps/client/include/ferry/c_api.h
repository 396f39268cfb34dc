/* ferry/c_api.h — Ferry's client for C, and for other languages through C (ctypes, cgo, JNI).
 *
 * Everything is an opaque handle or a plain C type. Every call that can fail returns a
 * ferry_code (FERRY_OK = 0; the others are the codes of ferry::StatusCode, which a server's
 * error reply carries unchanged), and ferry_last_error() gives the message of the last failed
 * call on the calling thread: what failed and where, as the C++ client says it (a server's own
 * error text included).
 *
 * Operations on tables are asynchronous, like the C++ client's: they return a ferry_handle at
 * once; ferry_wait() gives the operation's result. The caller's buffers must stay valid (and,
 * for pushes, unchanged) until the handle is done; ferry_handle_free() of a handle not yet done
 * waits for it first (bounded by the request timeout), so freeing never leaves the client
 * writing into memory the caller has released.
 *
 * Thread-safety: a ferry_client may be used from several threads at once; a ferry_handle and a
 * ferry_table_spec from one thread at a time. ferry_last_error() is per thread.
 */
#ifndef FERRY_C_API_H_
#define FERRY_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ferry_code {
  FERRY_OK = 0,
  FERRY_CANCELLED = 1,
  FERRY_UNKNOWN = 2,
  FERRY_INVALID_ARGUMENT = 3,
  FERRY_DEADLINE_EXCEEDED = 4,
  FERRY_NOT_FOUND = 5,
  FERRY_ALREADY_EXISTS = 6,
  FERRY_PERMISSION_DENIED = 7,
  FERRY_RESOURCE_EXHAUSTED = 8,
  FERRY_FAILED_PRECONDITION = 9,
  FERRY_ABORTED = 10,
  FERRY_OUT_OF_RANGE = 11,
  FERRY_UNIMPLEMENTED = 12,
  FERRY_INTERNAL = 13,
  FERRY_UNAVAILABLE = 14,
  FERRY_DATA_LOSS = 15
} ferry_code;

typedef struct ferry_client ferry_client;
typedef struct ferry_handle ferry_handle;
typedef struct ferry_table_spec ferry_table_spec;

/* The message of the last call on this thread that did not return FERRY_OK ("" if none since
 * the last successful call). Valid until the next ferry_ call on this thread. */
const char* ferry_last_error(void);
/* "OK", "INVALID_ARGUMENT", ... */
const char* ferry_code_name(ferry_code code);

/* ---- table specs ---------------------------------------------------------------------------
 * A spec starts as a dense table of shape [0] with sgd (learning rate 0.01), async, zeros;
 * set what differs. Setters check their own argument; ferry_declare checks the whole spec. */
ferry_code ferry_spec_new(const char* name, ferry_table_spec** out);
void ferry_spec_free(ferry_table_spec* spec);
ferry_code ferry_spec_set_dense(ferry_table_spec* spec, const int64_t* shape, size_t ndim);
ferry_code ferry_spec_set_sparse(ferry_table_spec* spec, int64_t dim);
/* type: an optimizer of the catalogue (ferry/optimizers.h; the README's "Optimizers" table): "sgd", "momentum",
 * "adagrad", "adam", "adamw", "ftrl" (FTRL-Proximal; learning_rate is its alpha). An unknown one names them all. */
ferry_code ferry_spec_set_optimizer(ferry_table_spec* spec, const char* type, float learning_rate);
/* consistency: "sync", "async" or "ssp:S". */
ferry_code ferry_spec_set_consistency(ferry_table_spec* spec, const char* consistency);
/* init: "zeros", "uniform" ([-scale, scale)), "normal" (stddev scale) or "constant" (scale). */
ferry_code ferry_spec_set_init(ferry_table_spec* spec, const char* init, float scale, uint64_t seed);
/* One of: an optimizer hyperparameter (kHyperParams in ferry/optimizers.h: "momentum", "nesterov" (0 or 1),
 * "beta1", "beta2", "epsilon", "initial_accumulator", "l1", "l2", "beta", "weight_decay"),
 * "chunk_elems", "replicas_to_aggregate", "skip_nonfinite_rows" (0 or 1, sparse tables: a pushed
 * row holding NaN or Inf is dropped instead of the whole push being refused), and a sparse table's row lifecycle:
 * "admit_after", "admit_probability", "evict_after_steps", "max_rows" (README, "Row lifecycle"), "disk_tier" (0 or
 * 1, with max_rows: the rows beyond it kept on the servers' disks; README, "The disk tier"), and gradient
 * compression's "topk" (dense tables: each pushed chunk sends only its ceil(topk * n) largest elements, the rest
 * kept by the client and added to the next push; 0: off, else in (0, 1]; README, "Wire formats"). */
ferry_code ferry_spec_set(ferry_table_spec* spec, const char* key, double value);
/* wire: "f32" (the default), "fp16" or "bf16": how the table's pushed gradients and pulled values
 * travel (2 bytes a value for fp16 and bf16; the servers keep float32). Needs servers of protocol
 * 1.6 or later: ferry_declare fails with FERRY_FAILED_PRECONDITION on an older one. */
ferry_code ferry_spec_set_wire(ferry_table_spec* spec, const char* wire);

/* ---- the client ---------------------------------------------------------------------------- */

/* Connects to every server (endpoints like "tcp://host:7470", in server-rank order) as worker
 * `rank` of `num_workers`, handshaking with each. request_timeout_ms: the longest any request
 * waits for its reply (0: the C++ default, 6 minutes). Every ferry_connect* reads
 * FERRY_INCARNATION from the environment when set (ferry-launch numbers a restarted worker's
 * starts there; ClientOptions::incarnation): a later start takes the rank over at once, even
 * while an earlier one still looks alive, and the earlier one is refused from then on. */
ferry_code ferry_connect(const char* const* servers, size_t num_servers, int rank, int num_workers,
                         int64_t request_timeout_ms, ferry_client** out);
/* ferry_connect with CURVE: authenticates as worker `rank` with the keys in `curve_keys_dir`, a
 * job's key folder (ferry-keys writes one; reads server.pub and worker-RANK.key) and encrypts
 * every message. Needed when the servers run with --curve-keys; NULL or "": no CURVE. */
ferry_code ferry_connect_curve(const char* const* servers, size_t num_servers, int rank, int num_workers,
                               int64_t request_timeout_ms, const char* curve_keys_dir, ferry_client** out);
/* The same, with servers, rank and worker count from the TF_CONFIG environment variable
 * (see ferry/cluster.h); FERRY_NOT_FOUND when TF_CONFIG is not set. */
ferry_code ferry_connect_tf_config(int64_t request_timeout_ms, ferry_client** out);
/* Closes the client; what is still in flight fails with FERRY_CANCELLED. NULL is ignored. */
void ferry_close(ferry_client* client);

int ferry_rank(const ferry_client* client);
int ferry_num_workers(const ferry_client* client);
int ferry_num_servers(const ferry_client* client);

/* Declares a table on every server (idempotent; a conflicting declaration fails with
 * FERRY_ALREADY_EXISTS and a message naming both specs). */
ferry_code ferry_declare(ferry_client* client, const ferry_table_spec* spec);

/* Dense tables: `n` is the table's element count. */
ferry_code ferry_pull_dense(ferry_client* client, const char* table, float* out, size_t n, int64_t step,
                            ferry_handle** handle);
ferry_code ferry_push_dense(ferry_client* client, const char* table, const float* grad, size_t n, int64_t step,
                            ferry_handle** handle);
/* Pushes `grad` for `step` and pulls the table for `step + 1` into `out`, in one round trip. */
ferry_code ferry_push_pull_dense(ferry_client* client, const char* table, const float* grad, float* out, size_t n,
                                 int64_t step, ferry_handle** handle);
/* Sparse tables: `rows` / `grads` hold num_ids x dim floats (row i for ids[i]); rows_len is
 * their length in floats. */
ferry_code ferry_pull_sparse(ferry_client* client, const char* table, const int64_t* ids, size_t num_ids,
                             float* rows, size_t rows_len, int64_t step, ferry_handle** handle);
ferry_code ferry_push_sparse(ferry_client* client, const char* table, const int64_t* ids, size_t num_ids,
                             const float* grads, size_t grads_len, int64_t step, ferry_handle** handle);

/* Waits at most timeout_ms (< 0: until the operation ends, bounded by the request timeout);
 * returns the operation's result, or FERRY_DEADLINE_EXCEEDED if it is still running (wait
 * again later). */
ferry_code ferry_wait(ferry_handle* handle, int64_t timeout_ms);
/* 1 when the operation has ended (and the client no longer touches its buffers), else 0. */
int ferry_done(const ferry_handle* handle);
/* Once done: the lowest table version the servers reported (for a sync pull, the step served);
 * -1 if none. */
int64_t ferry_served_version(const ferry_handle* handle);
/* Frees the handle, first waiting for the operation if it is still running. NULL is ignored. */
void ferry_handle_free(ferry_handle* handle);

/* Collectives and the worker's lifecycle (synchronous). */
ferry_code ferry_barrier(ferry_client* client);
/* out[i] = the sum of values[i] over every worker, added in rank order (same bits everywhere). */
ferry_code ferry_all_reduce_sum(ferry_client* client, const double* values, double* out, size_t n);
ferry_code ferry_advance_clock(ferry_client* client, int64_t clock);
ferry_code ferry_finish(ferry_client* client);
/* Leaves the job while the others train on (protocol 1.18): as ferry_finish, and no barrier or
 * all-reduce waits for this worker any more. Between steps, with no push in flight. */
ferry_code ferry_leave(ferry_client* client);

/* Checkpoints (messages/CHECKPOINT.md): every server saves its shard of every table as of `step`
 * in its checkpoint folder (ferry-ps --checkpoint-dir), then server 0 writes the manifest; returns
 * once the checkpoint exists. For sync tables `step` must be the global step every server is at
 * (FERRY_FAILED_PRECONDITION otherwise). */
ferry_code ferry_checkpoint(ferry_client* client, int64_t step);
/* The step of the checkpoint the servers started from (ferry-ps --restore); 0 if none. */
int64_t ferry_restored_step(const ferry_client* client);
/* The steps this worker's rank has done as the servers knew at the handshake (protocol 1.11;
 * Client::worker_step): where a restarted async worker resumes. -1 if a server is older. */
int64_t ferry_worker_step(const ferry_client* client);

/* Placement versions (protocol 1.17; PROTOCOL.md "Placement versions"): which server holds each
 * of FERRY_PLACEMENT_SLOTS slots of sparse ids and dense chunks can change while the job runs.
 * The version this client places its requests by, and its map: owners[slot] = server (n must be
 * FERRY_PLACEMENT_SLOTS). */
#define FERRY_PLACEMENT_SLOTS 5040
uint64_t ferry_placement_version(const ferry_client* client);
ferry_code ferry_placement_owners(const ferry_client* client, uint16_t* owners, size_t n);
/* Moves slots between the job's servers (Client::MoveSlots): every server adopts `owners` (n =
 * FERRY_PLACEMENT_SLOTS) as placement version `version` (above the client's), taking over what it
 * gains from the job's committed checkpoint of `step` and dropping what it gives up. Call it
 * between steps, with nothing pushed since that checkpoint; a refusal changes nothing. */
ferry_code ferry_move_slots(ferry_client* client, uint64_t version, const uint16_t* owners, size_t n, int64_t step);
/* Makes a later ferry_move_slots to the same map pause the job for less (Client::PrepareMoveSlots,
 * servers of protocol 1.19): the servers whose slots it moves read the committed checkpoint of
 * `step` now, while the job trains, and the move then reads only the files written since. Checks
 * and changes nothing; returns once every server has read. FERRY_FAILED_PRECONDITION for a version
 * not above the client's or the servers' map, or servers without a checkpoint folder;
 * FERRY_UNAVAILABLE while a server writes a checkpoint; FERRY_RESOURCE_EXHAUSTED when a server's
 * memory budget has no room to keep what it read. */
ferry_code ferry_prepare_move_slots(ferry_client* client, uint64_t version, const uint16_t* owners, size_t n,
                                    int64_t step);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FERRY_C_API_H_ */
