// The C ABI over ferry::Client: opaque structs that own the C++ objects, each call's Status
// turned into a code (returned) and a message (kept per thread for ferry_last_error), and no
// exception crossing into C.
#include "ferry/c_api.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/client.h"
#include "ferry/cluster.h"
#include "ferry/messages/placement.h"

static_assert(FERRY_PLACEMENT_SLOTS == ferry::placement::kSlots, "c_api.h's slot count is placement.h's");

struct ferry_client {
  std::unique_ptr<ferry::Client> client;
};

struct ferry_handle {
  ferry::Handle handle;
};

struct ferry_table_spec {
  ferry::TableSpec spec;
};

namespace {

thread_local std::string last_error;

ferry_code Fail(const ferry::Status& s) {
  last_error = s.message();
  return static_cast<ferry_code>(s.code());
}

ferry_code Done(const ferry::Status& s) {
  if (s.ok()) {
    last_error.clear();
    return FERRY_OK;
  }
  return Fail(s);
}

ferry_code Invalid(const std::string& what) { return Fail(ferry::InvalidArgumentError(what)); }

// Runs `fn` (returning ferry_code), turning anything thrown into a code and message.
template <typename Fn>
ferry_code Guard(const char* call, Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return Fail(ferry::ResourceExhaustedError(std::string(call) + ": out of memory"));
  } catch (const std::exception& e) {
    return Fail(ferry::InternalError(std::string(call) + ": " + e.what()));
  }
}

// A handle for an operation just started, or the failure to allocate one.
ferry_code Started(ferry::Handle h, ferry_handle** out) {
  *out = new ferry_handle{std::move(h)};
  last_error.clear();
  return FERRY_OK;
}

// Common argument checks: non-null pointers, named.
bool Null(const void* p, const char* call, const char* what, ferry_code* code) {
  if (p != nullptr) return false;
  *code = Invalid(std::string(call) + ": " + what + " is NULL");
  return true;
}

// Connects with `o` and the C caller's timeout (0: the C++ default).
ferry_code ConnectWith(ferry::ClientOptions o, int64_t request_timeout_ms, ferry_client** out) {
  if (request_timeout_ms < 0)
    return Invalid("ferry_connect: request_timeout_ms " + std::to_string(request_timeout_ms) + " < 0");
  // ferry-launch numbers a worker program's starts in FERRY_INCARNATION (ClientOptions::incarnation).
  if (const char* text = std::getenv("FERRY_INCARNATION"); text != nullptr && *text != '\0') {
    uint32_t n = 0;
    const char* end = text + std::strlen(text);
    const auto [at, ec] = std::from_chars(text, end, n);
    if (ec != std::errc() || at != end) {
      return Invalid("ferry_connect: FERRY_INCARNATION is '" + std::string(text) +
                     "', not a count of this rank's starts in [0, 4294967295]");
    }
    o.incarnation = n;
  }
  if (request_timeout_ms > 0) o.request_timeout = std::chrono::milliseconds(request_timeout_ms);
  auto c = ferry::Client::Connect(std::move(o));
  if (!c.ok()) return Fail(c.status());
  *out = new ferry_client{std::move(*c)};
  last_error.clear();
  return FERRY_OK;
}

}  // namespace

extern "C" {

const char* ferry_last_error(void) { return last_error.c_str(); }

const char* ferry_code_name(ferry_code code) {
  if (code < FERRY_OK || code > FERRY_DATA_LOSS) return "UNKNOWN_CODE";
  // The names are string literals: their data() is NUL-terminated.
  return ferry::StatusCodeName(static_cast<ferry::StatusCode>(code)).data();
}

// ---- specs --------------------------------------------------------------------------------------

ferry_code ferry_spec_new(const char* name, ferry_table_spec** out) {
  return Guard("ferry_spec_new", [&] {
    ferry_code code;
    if (Null(name, "ferry_spec_new", "name", &code) || Null(out, "ferry_spec_new", "out", &code)) return code;
    auto* s = new ferry_table_spec;
    s->spec.name = name;
    s->spec.shape = {0};
    *out = s;
    return Done(ferry::Status::Ok());
  });
}

void ferry_spec_free(ferry_table_spec* spec) { delete spec; }

ferry_code ferry_spec_set_dense(ferry_table_spec* spec, const int64_t* shape, size_t ndim) {
  return Guard("ferry_spec_set_dense", [&] {
    ferry_code code;
    if (Null(spec, "ferry_spec_set_dense", "spec", &code)) return code;
    if (ndim > 0 && Null(shape, "ferry_spec_set_dense", "shape", &code)) return code;
    spec->spec.type = ferry::TableType::kDense;
    spec->spec.shape.assign(shape, shape + ndim);
    spec->spec.dim = 0;
    return Done(ferry::Status::Ok());
  });
}

ferry_code ferry_spec_set_sparse(ferry_table_spec* spec, int64_t dim) {
  return Guard("ferry_spec_set_sparse", [&] {
    ferry_code code;
    if (Null(spec, "ferry_spec_set_sparse", "spec", &code)) return code;
    if (dim < 1) return Invalid("ferry_spec_set_sparse: dim " + std::to_string(dim) + " < 1");
    spec->spec.type = ferry::TableType::kSparse;
    spec->spec.shape.clear();
    spec->spec.dim = dim;
    return Done(ferry::Status::Ok());
  });
}

ferry_code ferry_spec_set_optimizer(ferry_table_spec* spec, const char* type, float learning_rate) {
  return Guard("ferry_spec_set_optimizer", [&] {
    ferry_code code;
    if (Null(spec, "ferry_spec_set_optimizer", "spec", &code) ||
        Null(type, "ferry_spec_set_optimizer", "type", &code)) {
      return code;
    }
    ferry::OptimizerType t;
    if (ferry::Status s = ferry::ParseOptimizerType(type, &t); !s.ok()) return Fail(s);
    spec->spec.optimizer.type = t;
    spec->spec.optimizer.learning_rate = learning_rate;
    return Done(ferry::Status::Ok());
  });
}

ferry_code ferry_spec_set_consistency(ferry_table_spec* spec, const char* consistency) {
  return Guard("ferry_spec_set_consistency", [&] {
    ferry_code code;
    if (Null(spec, "ferry_spec_set_consistency", "spec", &code) ||
        Null(consistency, "ferry_spec_set_consistency", "consistency", &code)) {
      return code;
    }
    return Done(ferry::ParseConsistency(consistency, &spec->spec.consistency, &spec->spec.staleness));
  });
}

ferry_code ferry_spec_set_init(ferry_table_spec* spec, const char* init, float scale, uint64_t seed) {
  return Guard("ferry_spec_set_init", [&] {
    ferry_code code;
    if (Null(spec, "ferry_spec_set_init", "spec", &code) || Null(init, "ferry_spec_set_init", "init", &code))
      return code;
    ferry::InitType t;
    if (ferry::Status s = ferry::ParseInitType(init, &t); !s.ok()) return Fail(s);
    spec->spec.init = t;
    spec->spec.init_scale = scale;
    spec->spec.seed = seed;
    return Done(ferry::Status::Ok());
  });
}

ferry_code ferry_spec_set_wire(ferry_table_spec* spec, const char* wire) {
  return Guard("ferry_spec_set_wire", [&] {
    ferry_code code;
    if (Null(spec, "ferry_spec_set_wire", "spec", &code) || Null(wire, "ferry_spec_set_wire", "wire", &code))
      return code;
    return Done(ferry::ParseWireFormat(wire, &spec->spec.wire).WithContext("ferry_spec_set_wire"));
  });
}

ferry_code ferry_spec_set(ferry_table_spec* spec, const char* key, double value) {
  return Guard("ferry_spec_set", [&] {
    ferry_code code;
    if (Null(spec, "ferry_spec_set", "spec", &code) || Null(key, "ferry_spec_set", "key", &code)) return code;
    return Done(ferry::SetSpecOption(&spec->spec, key, value).WithContext("ferry_spec_set"));
  });
}

// ---- the client -----------------------------------------------------------------------------------

ferry_code ferry_connect(const char* const* servers, size_t num_servers, int rank, int num_workers,
                         int64_t request_timeout_ms, ferry_client** out) {
  return ferry_connect_curve(servers, num_servers, rank, num_workers, request_timeout_ms, nullptr, out);
}

ferry_code ferry_connect_curve(const char* const* servers, size_t num_servers, int rank, int num_workers,
                               int64_t request_timeout_ms, const char* curve_keys_dir, ferry_client** out) {
  return Guard("ferry_connect", [&] {
    ferry_code code;
    if (Null(out, "ferry_connect", "out", &code)) return code;
    if (num_servers > 0 && Null(servers, "ferry_connect", "servers", &code)) return code;
    ferry::ClientOptions o;
    for (size_t i = 0; i < num_servers; ++i) {
      if (servers[i] == nullptr) return Invalid("ferry_connect: servers[" + std::to_string(i) + "] is NULL");
      o.servers.emplace_back(servers[i]);
    }
    o.rank = rank;
    o.num_workers = num_workers;
    if (curve_keys_dir != nullptr && *curve_keys_dir != '\0') {
      auto keys = ferry::curve::LoadClientKeys(curve_keys_dir, rank);
      if (!keys.ok()) return Fail(keys.status().WithContext("ferry_connect_curve"));
      o.curve = std::move(*keys);
    }
    return ConnectWith(std::move(o), request_timeout_ms, out);
  });
}

ferry_code ferry_connect_tf_config(int64_t request_timeout_ms, ferry_client** out) {
  return Guard("ferry_connect_tf_config", [&] {
    ferry_code code;
    if (Null(out, "ferry_connect_tf_config", "out", &code)) return code;
    auto cluster = ferry::ClusterFromEnvironment();
    if (!cluster.ok()) return Fail(cluster.status());
    if (!*cluster) return Fail(ferry::NotFoundError("ferry_connect_tf_config: TF_CONFIG is not set"));
    const ferry::ClusterConfig& c = **cluster;
    if (c.task_type == "ps") {
      return Fail(ferry::FailedPreconditionError("TF_CONFIG: this task is ps " + std::to_string(c.task_index) +
                                                 ", not a worker"));
    }
    ferry::ClientOptions o;
    o.servers = c.servers;
    o.rank = c.rank;
    o.num_workers = c.num_workers;
    return ConnectWith(std::move(o), request_timeout_ms, out);
  });
}

void ferry_close(ferry_client* client) { delete client; }

int ferry_rank(const ferry_client* client) { return client ? client->client->rank() : -1; }
int ferry_num_workers(const ferry_client* client) { return client ? client->client->num_workers() : -1; }
int ferry_num_servers(const ferry_client* client) { return client ? client->client->num_servers() : -1; }

ferry_code ferry_declare(ferry_client* client, const ferry_table_spec* spec) {
  return Guard("ferry_declare", [&] {
    ferry_code code;
    if (Null(client, "ferry_declare", "client", &code) || Null(spec, "ferry_declare", "spec", &code)) return code;
    return Done(client->client->Declare(spec->spec));
  });
}

ferry_code ferry_checkpoint(ferry_client* client, int64_t step) {
  return Guard("ferry_checkpoint", [&] {
    ferry_code code;
    if (Null(client, "ferry_checkpoint", "client", &code)) return code;
    return Done(client->client->Checkpoint(step));
  });
}

int64_t ferry_restored_step(const ferry_client* client) {
  return client != nullptr && client->client ? client->client->restored_step() : 0;
}

int64_t ferry_worker_step(const ferry_client* client) {
  return client != nullptr && client->client ? client->client->worker_step() : -1;
}

uint64_t ferry_placement_version(const ferry_client* client) {
  return client != nullptr && client->client ? client->client->placement_version() : 0;
}

namespace {
// n must be the number of slots (the caller's array is that long).
bool CheckSlots(const char* call, size_t n, ferry_code* code) {
  if (n == FERRY_PLACEMENT_SLOTS) return false;
  *code = Invalid(std::string(call) + ": n is " + std::to_string(n) + ", a map has FERRY_PLACEMENT_SLOTS (" +
                  std::to_string(FERRY_PLACEMENT_SLOTS) + ") slots");
  return true;
}
}  // namespace

ferry_code ferry_placement_owners(const ferry_client* client, uint16_t* owners, size_t n) {
  return Guard("ferry_placement_owners", [&] {
    ferry_code code;
    if (Null(client, "ferry_placement_owners", "client", &code) ||
        Null(owners, "ferry_placement_owners", "owners", &code) || CheckSlots("ferry_placement_owners", n, &code)) {
      return code;
    }
    const std::vector<uint16_t> map = client->client->placement_owners();
    std::memcpy(owners, map.data(), map.size() * sizeof(uint16_t));
    return Done(ferry::Status::Ok());
  });
}

ferry_code ferry_move_slots(ferry_client* client, uint64_t version, const uint16_t* owners, size_t n, int64_t step) {
  return Guard("ferry_move_slots", [&] {
    ferry_code code;
    if (Null(client, "ferry_move_slots", "client", &code) || Null(owners, "ferry_move_slots", "owners", &code) ||
        CheckSlots("ferry_move_slots", n, &code)) {
      return code;
    }
    return Done(client->client->MoveSlots(version, {owners, n}, step));
  });
}

ferry_code ferry_prepare_move_slots(ferry_client* client, uint64_t version, const uint16_t* owners, size_t n,
                                    int64_t step) {
  return Guard("ferry_prepare_move_slots", [&] {
    ferry_code code;
    if (Null(client, "ferry_prepare_move_slots", "client", &code) ||
        Null(owners, "ferry_prepare_move_slots", "owners", &code) ||
        CheckSlots("ferry_prepare_move_slots", n, &code)) {
      return code;
    }
    return Done(client->client->PrepareMoveSlots(version, {owners, n}, step).wait());
  });
}

}  // extern "C"

namespace {

// The checks every table operation shares; false (with *code set) when one fails.
bool CheckOp(const char* call, ferry_client* client, const char* table, const void* a, const char* a_name, size_t a_len,
             ferry_handle** handle, ferry_code* code) {
  if (Null(client, call, "client", code) || Null(table, call, "table", code) || Null(handle, call, "handle", code)) {
    return false;
  }
  if (a_len > 0 && Null(a, call, a_name, code)) return false;
  return true;
}

}  // namespace

extern "C" {

ferry_code ferry_pull_dense(ferry_client* client, const char* table, float* out, size_t n, int64_t step,
                            ferry_handle** handle) {
  return Guard("ferry_pull_dense", [&] {
    ferry_code code;
    if (!CheckOp("ferry_pull_dense", client, table, out, "out", n, handle, &code)) return code;
    return Started(client->client->PullDense(table, std::span<float>(out, n), step), handle);
  });
}

ferry_code ferry_push_dense(ferry_client* client, const char* table, const float* grad, size_t n, int64_t step,
                            ferry_handle** handle) {
  return Guard("ferry_push_dense", [&] {
    ferry_code code;
    if (!CheckOp("ferry_push_dense", client, table, grad, "grad", n, handle, &code)) return code;
    return Started(client->client->PushDense(table, std::span<const float>(grad, n), step), handle);
  });
}

ferry_code ferry_push_pull_dense(ferry_client* client, const char* table, const float* grad, float* out, size_t n,
                                 int64_t step, ferry_handle** handle) {
  return Guard("ferry_push_pull_dense", [&] {
    ferry_code code;
    if (!CheckOp("ferry_push_pull_dense", client, table, grad, "grad", n, handle, &code)) return code;
    if (n > 0 && Null(out, "ferry_push_pull_dense", "out", &code)) return code;
    const ferry::DenseIn in{table, std::span<const float>(grad, n)};
    const ferry::DenseOut o{table, std::span<float>(out, n)};
    return Started(client->client->PushPullDense(std::span<const ferry::DenseIn>(&in, 1),
                                                 std::span<const ferry::DenseOut>(&o, 1), step),
                   handle);
  });
}

ferry_code ferry_pull_sparse(ferry_client* client, const char* table, const int64_t* ids, size_t num_ids, float* rows,
                             size_t rows_len, int64_t step, ferry_handle** handle) {
  return Guard("ferry_pull_sparse", [&] {
    ferry_code code;
    if (!CheckOp("ferry_pull_sparse", client, table, ids, "ids", num_ids, handle, &code)) return code;
    if (rows_len > 0 && Null(rows, "ferry_pull_sparse", "rows", &code)) return code;
    return Started(client->client->PullSparse(table, std::span<const int64_t>(ids, num_ids),
                                              std::span<float>(rows, rows_len), step),
                   handle);
  });
}

ferry_code ferry_push_sparse(ferry_client* client, const char* table, const int64_t* ids, size_t num_ids,
                             const float* grads, size_t grads_len, int64_t step, ferry_handle** handle) {
  return Guard("ferry_push_sparse", [&] {
    ferry_code code;
    if (!CheckOp("ferry_push_sparse", client, table, ids, "ids", num_ids, handle, &code)) return code;
    if (grads_len > 0 && Null(grads, "ferry_push_sparse", "grads", &code)) return code;
    return Started(client->client->PushSparse(table, std::span<const int64_t>(ids, num_ids),
                                              std::span<const float>(grads, grads_len), step),
                   handle);
  });
}

ferry_code ferry_wait(ferry_handle* handle, int64_t timeout_ms) {
  return Guard("ferry_wait", [&] {
    ferry_code code;
    if (Null(handle, "ferry_wait", "handle", &code)) return code;
    return Done(timeout_ms < 0 ? handle->handle.wait() : handle->handle.wait(std::chrono::milliseconds(timeout_ms)));
  });
}

int ferry_done(const ferry_handle* handle) { return handle == nullptr || handle->handle.done() ? 1 : 0; }

int64_t ferry_served_version(const ferry_handle* handle) { return handle ? handle->handle.served().version : -1; }

void ferry_handle_free(ferry_handle* handle) {
  if (handle == nullptr) return;
  // The client may still write into the caller's buffers until the operation ends.
  if (!handle->handle.done()) handle->handle.wait().IgnoreError();
  delete handle;
}

ferry_code ferry_barrier(ferry_client* client) {
  return Guard("ferry_barrier", [&] {
    ferry_code code;
    if (Null(client, "ferry_barrier", "client", &code)) return code;
    return Done(client->client->Barrier());
  });
}

ferry_code ferry_all_reduce_sum(ferry_client* client, const double* values, double* out, size_t n) {
  return Guard("ferry_all_reduce_sum", [&] {
    ferry_code code;
    if (Null(client, "ferry_all_reduce_sum", "client", &code)) return code;
    if (n > 0 &&
        (Null(values, "ferry_all_reduce_sum", "values", &code) || Null(out, "ferry_all_reduce_sum", "out", &code))) {
      return code;
    }
    auto sum = client->client->AllReduceSum(std::span<const double>(values, n));
    if (!sum.ok()) return Fail(sum.status());
    std::copy(sum->begin(), sum->end(), out);
    return Done(ferry::Status::Ok());
  });
}

ferry_code ferry_advance_clock(ferry_client* client, int64_t clock) {
  return Guard("ferry_advance_clock", [&] {
    ferry_code code;
    if (Null(client, "ferry_advance_clock", "client", &code)) return code;
    return Done(client->client->AdvanceClock(clock).wait());
  });
}

ferry_code ferry_finish(ferry_client* client) {
  return Guard("ferry_finish", [&] {
    ferry_code code;
    if (Null(client, "ferry_finish", "client", &code)) return code;
    return Done(client->client->Finish());
  });
}

ferry_code ferry_leave(ferry_client* client) {
  return Guard("ferry_leave", [&] {
    ferry_code code;
    if (Null(client, "ferry_leave", "client", &code)) return code;
    return Done(client->client->Leave());
  });
}

}  // extern "C"
