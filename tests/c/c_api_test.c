/* The C ABI (ferry/c_api.h) from a C program, against real ferry-ps processes whose endpoints
 * are the arguments: connect, declare, push and pull dense and sparse tables, collectives, and
 * errors arriving as a code plus the text (a server's own refusal included).
 *
 *   c_api_test tcp://127.0.0.1:PORT0 tcp://127.0.0.1:PORT1   (tests/e2e/test_c_api.py runs it)
 *
 * It ends by restarting worker 0 (FERRY_INCARNATION=1), after which the servers refuse worker 0's
 * incarnation 0: give it servers of its own.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/c_api.h"

static int failures = 0;

#define CHECK(cond)                                                                    \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, \
              #cond, ferry_last_error());                                              \
      ++failures;                                                                      \
    }                                                                                  \
  } while (0)

/* Expects `code` from a call, and `text` in its message. */
static void expect_error(ferry_code got, ferry_code want, const char* text, int line) {
  if (got != want) {
    fprintf(stderr, "line %d: got %s, want %s (%s)\n", line, ferry_code_name(got), ferry_code_name(want),
            ferry_last_error());
    ++failures;
  } else if (strstr(ferry_last_error(), text) == NULL) {
    fprintf(stderr, "line %d: '%s' not in the message: %s\n", line, text, ferry_last_error());
    ++failures;
  }
}
#define EXPECT_ERROR(call, code, text) expect_error((call), (code), (text), __LINE__)

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SERVER_ENDPOINT...\n", argv[0]);
    return 2;
  }
  const char* const* servers = (const char* const*)(argv + 1);
  const size_t num_servers = (size_t)(argc - 1);

  /* Refusals before anything is sent. */
  ferry_client* client = NULL;
  EXPECT_ERROR(ferry_connect(servers, 0, 0, 1, 0, &client), FERRY_INVALID_ARGUMENT, "servers is empty");
  CHECK(client == NULL);
  EXPECT_ERROR(ferry_connect(servers, num_servers, 1, 1, 0, &client), FERRY_INVALID_ARGUMENT, "rank 1");
  CHECK(strcmp(ferry_code_name(FERRY_ALREADY_EXISTS), "ALREADY_EXISTS") == 0);
  EXPECT_ERROR(ferry_connect_curve(servers, num_servers, 0, 1, 0, "/nonexistent-ferry-keys", &client), FERRY_NOT_FOUND,
               "ferry_connect_curve: cannot open /nonexistent-ferry-keys/server.pub");
  CHECK(client == NULL);

  CHECK(ferry_connect(servers, num_servers, 0, 1, 20000, &client) == FERRY_OK);
  if (client == NULL) return 1;
  CHECK(ferry_last_error()[0] == '\0');
  CHECK(ferry_rank(client) == 0 && ferry_num_workers(client) == 1);
  CHECK(ferry_num_servers(client) == (int)num_servers);

  /* A dense 4 x 3 table of ones, sgd with learning rate 0.5, spread over the servers in
   * chunks of 5. */
  ferry_table_spec* w = NULL;
  const int64_t shape[2] = {4, 3};
  CHECK(ferry_spec_new("w", &w) == FERRY_OK);
  CHECK(ferry_spec_set_dense(w, shape, 2) == FERRY_OK);
  CHECK(ferry_spec_set_optimizer(w, "sgd", 0.5f) == FERRY_OK);
  CHECK(ferry_spec_set_init(w, "constant", 1.0f, 7) == FERRY_OK);
  CHECK(ferry_spec_set(w, "chunk_elems", 5) == FERRY_OK);
  EXPECT_ERROR(ferry_spec_set(w, "bogus", 1), FERRY_INVALID_ARGUMENT, "unknown key 'bogus'");
  EXPECT_ERROR(ferry_spec_set(w, "skip_nonfinite_rows", 2), FERRY_INVALID_ARGUMENT, "0 or 1");
  EXPECT_ERROR(ferry_spec_set_optimizer(w, "lbfgs", 0.1f), FERRY_INVALID_ARGUMENT, "lbfgs");
  EXPECT_ERROR(ferry_spec_set_consistency(w, "ssp:x"), FERRY_INVALID_ARGUMENT, "ssp:x");
  /* Gradient compression (1.6): a wire format by name, top-k by ratio. */
  EXPECT_ERROR(ferry_spec_set_wire(w, "fp8"), FERRY_INVALID_ARGUMENT, "'fp8' is not one of: f32, fp16, bf16");
  EXPECT_ERROR(ferry_spec_set(w, "topk", 1.5), FERRY_INVALID_ARGUMENT, "topk must be in (0, 1]");
  CHECK(ferry_declare(client, w) == FERRY_OK);
  CHECK(ferry_declare(client, w) == FERRY_OK); /* idempotent */

  float values[12], grad[12];
  for (int i = 0; i < 12; ++i) grad[i] = (float)i;
  ferry_handle* h = NULL;
  CHECK(ferry_push_dense(client, "w", grad, 12, 0, &h) == FERRY_OK);
  CHECK(ferry_wait(h, -1) == FERRY_OK);
  CHECK(ferry_done(h) == 1);
  ferry_handle_free(h);
  CHECK(ferry_pull_dense(client, "w", values, 12, 1, &h) == FERRY_OK);
  CHECK(ferry_wait(h, 10000) == FERRY_OK);
  CHECK(ferry_served_version(h) == 1); /* every chunk applied one update */
  ferry_handle_free(h);
  for (int i = 0; i < 12; ++i) CHECK(values[i] == 1.0f - 0.5f * (float)i);
  /* Push and pull in one round trip. */
  CHECK(ferry_push_pull_dense(client, "w", grad, values, 12, 1, &h) == FERRY_OK);
  CHECK(ferry_wait(h, -1) == FERRY_OK);
  ferry_handle_free(h);
  for (int i = 0; i < 12; ++i) CHECK(values[i] == 1.0f - 1.0f * (float)i);
  /* The wrong size is refused when the handle is waited on, with the table named. */
  CHECK(ferry_pull_dense(client, "w", values, 11, 1, &h) == FERRY_OK);
  EXPECT_ERROR(ferry_wait(h, -1), FERRY_INVALID_ARGUMENT, "'w'");
  ferry_handle_free(h);

  /* A sparse table of dim 4, adagrad. Rows are created on first touch (zeros). */
  ferry_table_spec* emb = NULL;
  CHECK(ferry_spec_new("emb", &emb) == FERRY_OK);
  CHECK(ferry_spec_set_sparse(emb, 4) == FERRY_OK);
  CHECK(ferry_spec_set_optimizer(emb, "sgd", 1.0f) == FERRY_OK);
  CHECK(ferry_declare(client, emb) == FERRY_OK);
  const int64_t ids[3] = {3, 1000003, 3};
  float rows[12], rgrad[12];
  for (int i = 0; i < 12; ++i) rgrad[i] = 1.0f;
  CHECK(ferry_push_sparse(client, "emb", ids, 3, rgrad, 12, 0, &h) == FERRY_OK);
  CHECK(ferry_wait(h, -1) == FERRY_OK);
  ferry_handle_free(h);
  CHECK(ferry_pull_sparse(client, "emb", ids, 3, rows, 12, 1, &h) == FERRY_OK);
  CHECK(ferry_wait(h, -1) == FERRY_OK);
  ferry_handle_free(h);
  /* id 3 appeared twice: its gradients were summed (2), id 1000003's once (1). */
  for (int j = 0; j < 4; ++j) {
    CHECK(rows[j] == -2.0f && rows[8 + j] == -2.0f);
    CHECK(rows[4 + j] == -1.0f);
  }

  /* A server's refusal reaches C as its code and its text: "emb" declared again with another
   * dim, and every server names the field that differs. */
  ferry_table_spec* wide = NULL;
  CHECK(ferry_spec_new("emb", &wide) == FERRY_OK);
  CHECK(ferry_spec_set_sparse(wide, 8) == FERRY_OK);
  EXPECT_ERROR(ferry_declare(client, wide), FERRY_ALREADY_EXISTS, "table 'emb' cannot change its dim 4 -> 8");
  /* A second client for worker 0 while this one is alive is refused (asked again for the
   * connect timeout, 1 s here). */
  ferry_client* other = NULL;
  EXPECT_ERROR(ferry_connect(servers, num_servers, 0, 1, 1000, &other), FERRY_ALREADY_EXISTS,
               "worker 0 is connected already");
  CHECK(other == NULL);
  /* A table this client never declared. */
  CHECK(ferry_pull_sparse(client, "nope", ids, 3, rows, 12, 1, &h) == FERRY_OK);
  EXPECT_ERROR(ferry_wait(h, -1), FERRY_NOT_FOUND, "'nope' was not declared");
  ferry_handle_free(h);
  EXPECT_ERROR(ferry_pull_dense(NULL, "w", values, 12, 0, &h), FERRY_INVALID_ARGUMENT, "client is NULL");

  /* Collectives with one worker: the sum is the worker's own values. */
  const double in[3] = {1.5, -2.0, 1e300};
  double out[3] = {0, 0, 0};
  CHECK(ferry_barrier(client) == FERRY_OK);
  CHECK(ferry_all_reduce_sum(client, in, out, 3) == FERRY_OK);
  CHECK(out[0] == 1.5 && out[1] == -2.0 && out[2] == 1e300);
  CHECK(ferry_advance_clock(client, 5) == FERRY_OK);
  CHECK(ferry_finish(client) == FERRY_OK);
  EXPECT_ERROR(ferry_leave(NULL), FERRY_INVALID_ARGUMENT, "client is NULL");

  /* Checkpoints: these servers were started without a checkpoint folder, and say so. */
  CHECK(ferry_restored_step(client) == 0);
  CHECK(ferry_worker_step(client) >= 0); /* servers of 1.11 say (0 unless rank 0 pushed before it connected) */
  CHECK(ferry_worker_step(NULL) == -1);
  EXPECT_ERROR(ferry_checkpoint(client, 0), FERRY_FAILED_PRECONDITION, "--checkpoint-dir");
  EXPECT_ERROR(ferry_checkpoint(NULL, 0), FERRY_INVALID_ARGUMENT, "client is NULL");

  /* Placement versions: the job's first map (slot s on server s mod 2); moving slots takes a
   * checkpoint, which these servers cannot write, and a whole map. */
  static uint16_t owners[FERRY_PLACEMENT_SLOTS];
  CHECK(ferry_placement_version(client) == 1);
  CHECK(ferry_placement_version(NULL) == 0);
  CHECK(ferry_placement_owners(client, owners, FERRY_PLACEMENT_SLOTS) == FERRY_OK);
  CHECK(owners[0] == 0 && owners[1] == 1 && owners[FERRY_PLACEMENT_SLOTS - 1] == 1);
  EXPECT_ERROR(ferry_placement_owners(client, owners, 10), FERRY_INVALID_ARGUMENT, "n is 10, a map has");
  EXPECT_ERROR(ferry_placement_owners(client, NULL, FERRY_PLACEMENT_SLOTS), FERRY_INVALID_ARGUMENT,
               "owners is NULL");
  owners[1] = 0;
  EXPECT_ERROR(ferry_move_slots(client, 2, owners, FERRY_PLACEMENT_SLOTS, 0), FERRY_FAILED_PRECONDITION,
               "--checkpoint-dir");
  EXPECT_ERROR(ferry_move_slots(client, 2, owners, 3, 0), FERRY_INVALID_ARGUMENT, "n is 3");
  EXPECT_ERROR(ferry_move_slots(NULL, 2, owners, FERRY_PLACEMENT_SLOTS, 0), FERRY_INVALID_ARGUMENT,
               "client is NULL");
  EXPECT_ERROR(ferry_prepare_move_slots(client, 2, owners, FERRY_PLACEMENT_SLOTS, 0), FERRY_FAILED_PRECONDITION,
               "--checkpoint-dir");
  EXPECT_ERROR(ferry_prepare_move_slots(client, 1, owners, FERRY_PLACEMENT_SLOTS, 0), FERRY_FAILED_PRECONDITION,
               "this client is at 1 already");
  EXPECT_ERROR(ferry_prepare_move_slots(client, 2, NULL, FERRY_PLACEMENT_SLOTS, 0), FERRY_INVALID_ARGUMENT,
               "owners is NULL");
  EXPECT_ERROR(ferry_prepare_move_slots(client, 2, owners, 3, 0), FERRY_INVALID_ARGUMENT, "n is 3");
  EXPECT_ERROR(ferry_prepare_move_slots(NULL, 2, owners, FERRY_PLACEMENT_SLOTS, 0), FERRY_INVALID_ARGUMENT,
               "client is NULL");
  CHECK(ferry_placement_version(client) == 1);

  /* A compressed table: fp16 values, top-k 0.5 (2 of its 4 elements a push), sgd from zeros with
   * learning rate 1. The push sends -3 and 2; the rest waits in the client's residual and goes
   * with the next push (0.1 as fp16: 0.0999755859375). */
  ferry_table_spec* half = NULL;
  const int64_t four[1] = {4};
  CHECK(ferry_spec_new("half", &half) == FERRY_OK);
  CHECK(ferry_spec_set_dense(half, four, 1) == FERRY_OK);
  CHECK(ferry_spec_set_optimizer(half, "sgd", 1.0f) == FERRY_OK);
  CHECK(ferry_spec_set_wire(half, "fp16") == FERRY_OK);
  CHECK(ferry_spec_set(half, "topk", 0.5) == FERRY_OK);
  CHECK(ferry_declare(client, half) == FERRY_OK);
  const float hgrad[4] = {1.0f, -3.0f, 0.1f, 2.0f}, zeros[4] = {0, 0, 0, 0};
  float hv[4];
  CHECK(ferry_push_dense(client, "half", hgrad, 4, 0, &h) == FERRY_OK);
  CHECK(ferry_wait(h, -1) == FERRY_OK);
  ferry_handle_free(h);
  CHECK(ferry_pull_dense(client, "half", hv, 4, 0, &h) == FERRY_OK);
  CHECK(ferry_wait(h, -1) == FERRY_OK);
  ferry_handle_free(h);
  CHECK(hv[0] == 0.0f && hv[1] == 3.0f && hv[2] == 0.0f && hv[3] == -2.0f);
  CHECK(ferry_push_dense(client, "half", zeros, 4, 0, &h) == FERRY_OK);
  CHECK(ferry_wait(h, -1) == FERRY_OK);
  ferry_handle_free(h);
  CHECK(ferry_pull_dense(client, "half", hv, 4, 0, &h) == FERRY_OK);
  CHECK(ferry_wait(h, -1) == FERRY_OK);
  ferry_handle_free(h);
  CHECK(hv[0] == -1.0f && hv[1] == 3.0f && hv[2] == -0.0999755859375f && hv[3] == -2.0f);

  /* A restart under ferry-launch: FERRY_INCARNATION=N (the launcher's count of this rank's starts)
   * makes the new process take the rank over at once, while the earlier one is still connected,
   * which is refused from then on. A value that is not such a count is refused. */
  ferry_client* again = NULL;
  setenv("FERRY_INCARNATION", "one", 1);
  EXPECT_ERROR(ferry_connect(servers, num_servers, 0, 1, 20000, &again), FERRY_INVALID_ARGUMENT,
               "FERRY_INCARNATION is 'one'");
  setenv("FERRY_INCARNATION", "1", 1);
  CHECK(ferry_connect(servers, num_servers, 0, 1, 20000, &again) == FERRY_OK);
  unsetenv("FERRY_INCARNATION");
  if (again != NULL) {
    EXPECT_ERROR(ferry_barrier(client), FERRY_FAILED_PRECONDITION, "replaced by its incarnation 1");
    CHECK(ferry_barrier(again) == FERRY_OK);
    ferry_close(again);
  }

  ferry_spec_free(half);
  ferry_spec_free(w);
  ferry_spec_free(emb);
  ferry_spec_free(wide);
  ferry_close(client);
  ferry_close(NULL);
  ferry_handle_free(NULL);
  if (failures != 0) {
    fprintf(stderr, "c_api_test: %d check(s) failed\n", failures);
    return 1;
  }
  printf("c_api_test: OK\n");
  return 0;
}
