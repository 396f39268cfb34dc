// The `ferry` Python module: the C++ client for recommender pipelines, with numpy arrays.
//
//   import ferry, numpy as np
//   c = ferry.Client(["tcp://127.0.0.1:7470"], rank=0, num_workers=1)   # or ferry.Client.from_tf_config()
//   c.declare_dense("w", (784, 10), optimizer="adam", lr=1e-3, consistency="sync")
//   c.declare_dense("big", (4096, 4096), wire="fp16", options={"topk": 0.01})  # compressed pushes
//   w = np.empty((784, 10), np.float32)
//   c.pull_dense("w", w, step=0).wait()          # writes into w
//   c.push_dense("w", grad, step=0).wait()
//   rows = c.pull_sparse("emb", ids, step=0).wait()   # a new (len(ids), dim) array
//
// Arrays that are already C-contiguous float32 (int64 for ids) are used in place: the client
// reads pushed gradients from, and writes pulled values into, the array's own memory. Other
// inputs are converted once (a copy); an output array must be C-contiguous, float32 and
// writable, or the call raises TypeError. Ids must have an integer dtype (any width and sign;
// int_arrays.h): a float array of ids raises TypeError instead of being truncated. A Handle keeps
// every array it uses alive until the
// operation is done, and waits for it if it is dropped before. The GIL is released while the
// client sends, receives and waits. Every failure raises ferry.Error, whose message is the
// client's or the server's text and whose `code` is the status code's name ("ALREADY_EXISTS").
#include <absl/container/flat_hash_map.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/feed.h"
#include "ferry/messages/placement.h"
#include "ferry/cluster.h"
#include "ferry/metrics/worker.h"
#include "ferry/nearest.h"
#include "ferry/optimizers.h"
#include "bags.h"
#include "int_arrays.h"

namespace py = pybind11;

namespace {

// ferry.Error, set at import; a leaked strong reference (a py::object here would be released
// after the interpreter has shut down).
PyObject* error_type = nullptr;

[[noreturn]] void Raise(const ferry::Status& s) {
  py::gil_scoped_acquire gil;
  py::object type = py::reinterpret_borrow<py::object>(error_type);
  py::object e = type(s.message());
  e.attr("code") = std::string(ferry::StatusCodeName(s.code()));
  PyErr_SetObject(error_type, e.ptr());
  throw py::error_already_set();
}

void Check(const ferry::Status& s) {
  if (!s.ok()) Raise(s);
}

using FloatIn = py::array_t<float, py::array::c_style | py::array::forcecast>;
// Ids: any integer dtype, as int64 (int_arrays.h: anything else raises TypeError naming the argument).
using IdsIn = ferry::python::Int64Array;
using ferry::python::IntegerArray;

// An output array the client may write into directly.
py::array_t<float> Writable(const py::object& out, const char* what) {
  if (!py::isinstance<py::array>(out)) throw py::type_error(std::string(what) + " must be a numpy array");
  auto a = py::reinterpret_borrow<py::array>(out);
  if (!py::isinstance<py::array_t<float>>(a)) {
    throw py::type_error(std::string(what) + " must be float32, not " + std::string(py::str(a.dtype())));
  }
  if (!(a.flags() & py::array::c_style)) throw py::type_error(std::string(what) + " must be C-contiguous");
  if (!a.writeable()) throw py::type_error(std::string(what) + " is read-only");
  return py::reinterpret_borrow<py::array_t<float>>(a);
}

std::chrono::milliseconds Millis(double seconds, const char* what) {
  if (!std::isfinite(seconds) || seconds < 0)
    throw py::value_error(std::string(what) + " must be a finite number >= 0");
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

// An operation in flight, and the arrays it reads or writes.
class PyHandle {
 public:
  PyHandle(ferry::Handle h, std::vector<py::object> keep, py::object result)
      : handle_(std::move(h)), keep_(std::move(keep)), result_(std::move(result)) {}
  PyHandle(const PyHandle&) = delete;
  PyHandle& operator=(const PyHandle&) = delete;

  ~PyHandle() {
    // The client may still write into the arrays: wait (without the GIL) before letting them go.
    // (done() too may send: an operation answered "moved" goes again by the new placement.)
    py::gil_scoped_release release;
    if (!handle_.done()) handle_.wait().IgnoreError();
  }

  // Waits (timeout in seconds; None: until done, bounded by the client's request timeout) and
  // returns the pulled array (pulls) or None; raises ferry.Error on failure or timeout.
  py::object Wait(std::optional<double> timeout) {
    ferry::Status s;
    {
      py::gil_scoped_release release;
      s = timeout ? handle_.wait(Millis(*timeout, "timeout")) : handle_.wait();
    }
    Check(s);
    return result_;
  }
  bool Done() const {
    py::gil_scoped_release release;  // it may send (an operation answered "moved" goes again)
    return handle_.done();
  }
  // Once done: the lowest table version the servers reported (a sync pull: the step served).
  int64_t Version() const { return handle_.served().version; }
  int64_t Used() const { return handle_.served().used; }
  int64_t Dropped() const { return handle_.served().dropped; }
  double Held() const { return std::chrono::duration<double>(handle_.served().held).count(); }
  double Elapsed() const { return std::chrono::duration<double>(handle_.elapsed()).count(); }

 private:
  ferry::Handle handle_;
  std::vector<py::object> keep_;
  py::object result_;
};

ferry::TableSpec Spec(const std::string& name, const std::string& optimizer, float lr, const std::string& consistency,
                      const std::string& init, float init_scale, uint64_t seed, int replicas_to_aggregate,
                      const std::string& wire, const std::map<std::string, double>& options) {
  ferry::TableSpec s;
  s.name = name;
  Check(ferry::ParseWireFormat(wire, &s.wire).WithContext("wire"));
  Check(ferry::ParseOptimizerType(optimizer, &s.optimizer.type));
  s.optimizer.learning_rate = lr;
  Check(ferry::ParseConsistency(consistency, &s.consistency, &s.staleness));
  Check(ferry::ParseInitType(init, &s.init));
  s.init_scale = init_scale;
  s.seed = seed;
  s.replicas_to_aggregate = replicas_to_aggregate;
  for (const auto& [key, value] : options) Check(ferry::SetSpecOption(&s, key, value).WithContext("options"));
  return s;
}

// Entry i of a multi-table call: a tuple or list of `width` items; TypeError naming the call, the
// entry and the form wanted otherwise.
py::sequence Entry(const py::handle& item, size_t width, const char* call, const char* form, size_t i) {
  if (!(py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) || py::len(item) != width) {
    throw py::type_error(std::string(call) + ": entry " + std::to_string(i) + " must be " + form);
  }
  if (!py::isinstance<py::str>(item[py::int_(0)])) {
    throw py::type_error(std::string(call) + ": entry " + std::to_string(i) + ": the table name must be a str");
  }
  return py::reinterpret_borrow<py::sequence>(item);
}

py::array_t<int64_t> Int64s(const std::vector<int64_t>& v) {
  py::array_t<int64_t> a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

// Deduplicates the ids of several tables in one call, with the GIL released (for callers who
// pool rows themselves; ferry.torch uses Bags below). For each table: its distinct ids in the
// order they first appear. And for every id of every table, in order, the row of its distinct id
// counted over all tables: table t's rows follow the distinct ids of tables 0..t-1, so one
// embedding_bag over the tables' rows stacked in that order pools every table. Returns
// (distinct: [int64 arrays], rows: int64 array of the total id count).
py::tuple Dedup(const py::list& tables) {
  std::vector<IdsIn> ids;
  ids.reserve(tables.size());
  size_t total = 0;
  for (size_t i = 0; i < tables.size(); ++i) {
    IdsIn a = IntegerArray(tables[i], "dedup: entry " + std::to_string(i));
    if (a.ndim() != 1) throw py::value_error("dedup: entry " + std::to_string(i) + " must be 1-D");
    total += static_cast<size_t>(a.size());
    ids.push_back(std::move(a));
  }
  py::array_t<int64_t> rows(static_cast<py::ssize_t>(total));
  std::vector<std::vector<int64_t>> distinct(ids.size());
  {
    py::gil_scoped_release release;
    absl::flat_hash_map<int64_t, int64_t> seen;
    int64_t* out = rows.mutable_data();
    int64_t base = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const std::span<const int64_t> in(ids[t].data(), static_cast<size_t>(ids[t].size()));
      ferry::python::DedupFirstSeen<int64_t>(in, base, &seen, &distinct[t], out);
      out += in.size();
      base += static_cast<int64_t>(distinct[t].size());
    }
  }
  py::list out;
  for (const std::vector<int64_t>& d : distinct) out.append(Int64s(d));
  return py::make_tuple(out, rows);
}

// ferry._ferry.Bags: the bags of every table of one ferry.torch forward, checked and
// deduplicated in one call (bags.h), with a row buffer per table for the pull to write, pooled in
// one call and turned into row gradients in one call. The GIL is released while it computes.
class PyBags {
 public:
  // entries: [(table, ids, starts, weights or None, dim, mean)]; ids and starts integer arrays
  // (int_arrays.h), weights float32 (converted once otherwise). ValueError naming the table.
  explicit PyBags(const py::list& entries) {
    const size_t count = entries.size();
    std::vector<ferry::python::BagsView> views(count);
    std::vector<IdsIn> keep;  // the converted arrays, alive until Make has copied what it needs
    std::vector<py::array_t<float, py::array::c_style | py::array::forcecast>> weights(count);
    std::vector<std::string> names(count);
    keep.reserve(2 * count);
    for (size_t i = 0; i < count; ++i) {
      auto entry = Entry(entries[i], 6, "Bags", "(table, ids, starts, weights or None, dim, mean)", i);
      names[i] = entry[0].cast<std::string>();
      const std::string where = "Bags: table '" + names[i] + "': ";
      keep.push_back(IntegerArray(entry[1], where + "ids"));
      keep.push_back(IntegerArray(entry[2], where + "offsets"));
      const IdsIn& ids = keep[keep.size() - 2];
      const IdsIn& starts = keep.back();
      if (ids.ndim() != 1 || starts.ndim() != 1) throw py::value_error(where + "ids and offsets must be 1-D");
      ferry::python::BagsView& v = views[i];
      v.table = names[i];
      v.ids = {ids.data(), static_cast<size_t>(ids.size())};
      v.starts = {starts.data(), static_cast<size_t>(starts.size())};
      if (!entry[3].is_none()) {
        weights[i] = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(entry[3]);
        if (!weights[i] || weights[i].size() != ids.size()) {
          throw py::value_error(where + "per_sample_weights must be numbers, one per id");
        }
        v.weights = weights[i].data();
      }
      v.dim = entry[4].cast<int64_t>();
      v.mean = entry[5].cast<bool>();
    }
    ferry::Status failed;
    {
      py::gil_scoped_release release;
      absl::flat_hash_map<int64_t, int32_t> scratch;
      tables_.reserve(count);
      for (const ferry::python::BagsView& v : views) {
        auto t = ferry::python::TableBags::Make(v, &scratch);
        if (!t.ok()) {
          failed = t.status();
          break;
        }
        tables_.push_back(*std::move(t));
      }
    }
    if (!failed.ok()) throw py::value_error(failed.message());
    for (const ferry::python::TableBags& t : tables_) {
      distinct_.append(Int64s(t.distinct()));
      rows_.append(
          py::array_t<float>({static_cast<py::ssize_t>(t.distinct().size()), static_cast<py::ssize_t>(t.dim())}));
    }
  }

  // New lists of the arrays (the arrays themselves are shared): a caller that changes a list
  // cannot put something other than this object's float32 buffers where Pool reads.
  py::list Distinct() const { return Copy(distinct_); }
  py::list Rows() const { return Copy(rows_); }

  // Takes the row buffers of `other`, which pulled the same distinct ids of the same tables (rows
  // read ahead for another forward's equal bags).
  void TakeRows(const PyBags& other) {
    if (other.tables_.size() != tables_.size()) throw py::value_error("Bags.take_rows: another table count");
    for (size_t i = 0; i < tables_.size(); ++i) {
      if (other.tables_[i].distinct() != tables_[i].distinct() || other.tables_[i].dim() != tables_[i].dim()) {
        throw py::value_error("Bags.take_rows: table " + std::to_string(i) + " has other distinct ids");
      }
    }
    rows_ = other.rows_;
  }

  // [bags x dim] float32 per table: nn.EmbeddingBag's result on the rows.
  py::list Pool() const {
    std::vector<py::array_t<float>> out;
    std::vector<const float*> rows;
    out.reserve(tables_.size());
    for (size_t i = 0; i < tables_.size(); ++i) {
      out.emplace_back(std::vector<py::ssize_t>{tables_[i].num_bags(), tables_[i].dim()});
      rows.push_back(rows_[i].cast<py::array_t<float>>().data());
    }
    {
      py::gil_scoped_release release;
      for (size_t i = 0; i < tables_.size(); ++i) tables_[i].Pool(rows[i], out[i].mutable_data());
    }
    py::list result;
    for (auto& a : out) result.append(std::move(a));
    return result;
  }

  // grads: per table, d loss / d pooled [bags x dim] or None; returns per table its distinct
  // rows' gradient [distinct x dim], or None where the grad was None. A float32 grad whose rows
  // are contiguous is read in place (a column block of a concatenation's gradient too); others
  // are converted once.
  py::list RowGradients(const py::list& grads) const {
    if (grads.size() != tables_.size()) {
      throw py::value_error("Bags.row_gradients: " + std::to_string(grads.size()) + " gradients for " +
                            std::to_string(tables_.size()) + " tables");
    }
    std::vector<py::array_t<float>> in(tables_.size()), out(tables_.size());
    std::vector<int64_t> stride(tables_.size(), 0);
    std::vector<char> given(tables_.size(), 0);  // (a default py::array_t is an empty array, not a null)
    for (size_t i = 0; i < tables_.size(); ++i) {
      if (grads[i].is_none()) continue;
      given[i] = 1;
      const ferry::python::TableBags& t = tables_[i];
      in[i] = RowsInPlace(grads[i]);
      if (!in[i] || in[i].ndim() != 2 || in[i].shape(0) != t.num_bags() || in[i].shape(1) != t.dim()) {
        throw py::value_error("Bags.row_gradients: gradient " + std::to_string(i) + " must be float [" +
                              std::to_string(t.num_bags()) + ", " + std::to_string(t.dim()) + "]");
      }
      stride[i] = t.num_bags() > 1 ? in[i].strides(0) / static_cast<py::ssize_t>(sizeof(float)) : t.dim();
      out[i] = py::array_t<float>({static_cast<py::ssize_t>(t.distinct().size()), static_cast<py::ssize_t>(t.dim())});
    }
    {
      py::gil_scoped_release release;
      for (size_t i = 0; i < tables_.size(); ++i) {
        if (given[i]) tables_[i].RowGradients(in[i].data(), stride[i], out[i].mutable_data());
      }
    }
    py::list result;
    for (size_t i = 0; i < tables_.size(); ++i) {
      if (given[i]) {
        result.append(std::move(out[i]));
      } else {
        result.append(py::none());
      }
    }
    return result;
  }

 private:
  static py::list Copy(const py::list& from) {
    py::list out;
    for (const py::handle& item : from) out.append(item);
    return out;
  }

  // obj as a float32 array whose rows are each contiguous, with a non-negative row stride that is
  // a whole number of floats at least a row long: obj itself when it is one, else a C-contiguous
  // copy (a null array when obj is not numbers).
  static py::array_t<float> RowsInPlace(const py::handle& obj) {
    if (py::isinstance<py::array_t<float>>(obj)) {
      auto a = py::reinterpret_borrow<py::array_t<float>>(obj);
      if (a.ndim() == 2 && (a.shape(1) <= 1 || a.strides(1) == sizeof(float)) &&
          (a.shape(0) <= 1 || (a.strides(0) >= a.shape(1) * static_cast<py::ssize_t>(sizeof(float)) &&
                               a.strides(0) % static_cast<py::ssize_t>(sizeof(float)) == 0))) {
        return a;
      }
    }
    return py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(obj);
  }

  std::vector<ferry::python::TableBags> tables_;
  py::list distinct_;  // int64 [distinct] per table
  py::list rows_;      // float32 [distinct x dim] per table: the pull writes them
};

class PyClient {
 public:
  PyClient(std::vector<std::string> servers, int rank, int num_workers, double request_timeout, double connect_timeout,
           std::optional<std::string> curve_keys, double heartbeat_timeout, double long_wait_every,
           uint32_t incarnation, bool resumes = false, int64_t joins_at = 0) {
    ferry::ClientOptions o;
    o.resumes = resumes;
    if (joins_at < 0) throw py::value_error("joins_at is " + std::to_string(joins_at) + ": want a step >= 0");
    o.joins_at = joins_at;
    o.servers = std::move(servers);
    o.rank = rank;
    o.num_workers = num_workers;
    o.incarnation = incarnation;
    o.request_timeout = Millis(request_timeout, "request_timeout");
    o.connect_timeout = Millis(connect_timeout, "connect_timeout");
    o.heartbeat_timeout = Millis(heartbeat_timeout, "heartbeat_timeout");
    // Long waits are said on stderr (C's: called on the client's threads, without the GIL).
    o.long_wait_every = Millis(long_wait_every, "long_wait_every");
    if (o.long_wait_every.count() > 0) {
      o.on_long_wait = [rank](const std::string& line) {
        std::fprintf(stderr, "ferry: worker %d %s\n", rank, line.c_str());
        std::fflush(stderr);
      };
    }
    if (curve_keys && !curve_keys->empty()) {
      auto keys = ferry::curve::LoadClientKeys(*curve_keys, rank);
      if (!keys.ok()) Raise(keys.status().WithContext("curve_keys"));
      o.curve = std::move(*keys);
    }
    ferry::StatusOr<std::unique_ptr<ferry::Client>> c = ferry::InternalError("not connected");
    {
      py::gil_scoped_release release;
      c = ferry::Client::Connect(std::move(o));
    }
    if (!c.ok()) Raise(c.status());
    client_ = std::move(*c);
  }

  static std::unique_ptr<PyClient> FromTfConfig(double request_timeout, double connect_timeout,
                                                std::optional<std::string> curve_keys, double heartbeat_timeout,
                                                double long_wait_every, uint32_t incarnation) {
    auto cluster = ferry::ClusterFromEnvironment();
    Check(cluster.status());
    if (!*cluster) Raise(ferry::NotFoundError("TF_CONFIG is not set"));
    const ferry::ClusterConfig& c = **cluster;
    if (c.task_type == "ps") {
      Raise(ferry::FailedPreconditionError("TF_CONFIG: this task is ps " + std::to_string(c.task_index) +
                                           ", not a worker"));
    }
    return std::make_unique<PyClient>(c.servers, c.rank, c.num_workers, request_timeout, connect_timeout,
                                      std::move(curve_keys), heartbeat_timeout, long_wait_every, incarnation);
  }

  int rank() { return client().rank(); }
  int num_workers() { return client().num_workers(); }
  int num_servers() { return client().num_servers(); }
  int64_t restored_step() { return client().restored_step(); }
  int64_t worker_step() { return client().worker_step(); }

  void DeclareDense(const std::string& name, std::vector<int64_t> shape, const std::string& optimizer, float lr,
                    const std::string& consistency, const std::string& init, float init_scale, uint64_t seed,
                    int replicas_to_aggregate, const std::string& wire, const std::map<std::string, double>& options) {
    ferry::TableSpec s = Spec(name, optimizer, lr, consistency, init, init_scale, seed, replicas_to_aggregate, wire,
                              options);
    s.type = ferry::TableType::kDense;
    s.shape = std::move(shape);
    Declare(s);
  }

  void DeclareSparse(const std::string& name, int64_t dim, const std::string& optimizer, float lr,
                     const std::string& consistency, const std::string& init, float init_scale, uint64_t seed,
                     int replicas_to_aggregate, bool skip_nonfinite_rows, const std::string& wire,
                     const std::map<std::string, double>& options) {
    ferry::TableSpec s = Spec(name, optimizer, lr, consistency, init, init_scale, seed, replicas_to_aggregate, wire,
                              options);
    s.type = ferry::TableType::kSparse;
    s.dim = dim;
    s.nonfinite = skip_nonfinite_rows ? ferry::NonFinite::kSkipRows : ferry::NonFinite::kRefuse;
    Declare(s);
  }

  std::unique_ptr<PyHandle> PullDense(const std::string& table, const py::object& out, int64_t step) {
    py::array_t<float> a = Writable(out, "out");
    std::span<float> data(a.mutable_data(), static_cast<size_t>(a.size()));
    ferry::Handle h;
    ferry::Client& c = client();
    {
      py::gil_scoped_release release;
      h = c.PullDense(table, data, step);
    }
    return std::make_unique<PyHandle>(std::move(h), std::vector<py::object>{a}, a);
  }

  std::unique_ptr<PyHandle> PushDense(const std::string& table, const FloatIn& grad, int64_t step) {
    std::span<const float> data(grad.data(), static_cast<size_t>(grad.size()));
    ferry::Handle h;
    ferry::Client& c = client();
    {
      py::gil_scoped_release release;
      h = c.PushDense(table, data, step);
    }
    return std::make_unique<PyHandle>(std::move(h), std::vector<py::object>{grad}, py::none());
  }

  std::unique_ptr<PyHandle> PushPullDense(const std::string& table, const FloatIn& grad, const py::object& out,
                                          int64_t step) {
    py::array_t<float> a = Writable(out, "out");
    const ferry::DenseIn in{table, std::span<const float>(grad.data(), static_cast<size_t>(grad.size()))};
    const ferry::DenseOut o{table, std::span<float>(a.mutable_data(), static_cast<size_t>(a.size()))};
    ferry::Handle h;
    ferry::Client& c = client();
    {
      py::gil_scoped_release release;
      h = c.PushPullDense(std::span<const ferry::DenseIn>(&in, 1), std::span<const ferry::DenseOut>(&o, 1), step);
    }
    return std::make_unique<PyHandle>(std::move(h), std::vector<py::object>{grad, a}, a);
  }

  // Pulls rows for `ids` into `out` (shape (len(ids), dim), float32), or into a new array.
  std::unique_ptr<PyHandle> PullSparse(const std::string& table, const py::object& ids_in, int64_t step,
                                       const py::object& out) {
    IdsIn ids = IntegerArray(ids_in, "pull_sparse: ids");
    py::array_t<float> a;
    if (out.is_none()) {
      a = py::array_t<float>({static_cast<py::ssize_t>(ids.size()), static_cast<py::ssize_t>(Dim(table))});
    } else {
      a = Writable(out, "out");
    }
    std::span<const int64_t> id_span(ids.data(), static_cast<size_t>(ids.size()));
    std::span<float> rows(a.mutable_data(), static_cast<size_t>(a.size()));
    ferry::Handle h;
    ferry::Client& c = client();
    {
      py::gil_scoped_release release;
      h = c.PullSparse(table, id_span, rows, step);
    }
    return std::make_unique<PyHandle>(std::move(h), std::vector<py::object>{ids, a}, a);
  }

  std::unique_ptr<PyHandle> PushSparse(const std::string& table, const py::object& ids_in, const FloatIn& grads,
                                       int64_t step) {
    IdsIn ids = IntegerArray(ids_in, "push_sparse: ids");
    std::span<const int64_t> id_span(ids.data(), static_cast<size_t>(ids.size()));
    std::span<const float> g(grads.data(), static_cast<size_t>(grads.size()));
    ferry::Handle h;
    ferry::Client& c = client();
    {
      py::gil_scoped_release release;
      h = c.PushSparse(table, id_span, g, step);
    }
    return std::make_unique<PyHandle>(std::move(h), std::vector<py::object>{ids, grads}, py::none());
  }

  // Several tables in one call (the C++ client's multi-table calls): each server gets one message
  // (or a few, cut between tables, for a large share), every server in flight together. Every
  // entry is converted and checked before anything is sent; a bad entry raises naming it.
  //   tables: [(name, ids, out or None)]; wait() returns the list of row arrays, in order.
  std::unique_ptr<PyHandle> PullSparseTables(const py::list& tables, int64_t step, bool distinct) {
    std::vector<py::object> keep;
    std::vector<std::string> names;
    std::vector<ferry::SparseOut> outs;
    py::list results;
    names.reserve(tables.size());
    for (size_t i = 0; i < tables.size(); ++i) {
      auto entry = Entry(tables[i], 3, "pull_sparse_tables", "(table, ids, out or None)", i);
      names.push_back(py::cast<std::string>(entry[0]));
      IdsIn ids = IntegerArray(entry[1], "pull_sparse_tables: entry " + std::to_string(i) + ": ids");
      py::array_t<float> a;
      if (entry[2].is_none()) {
        a = py::array_t<float>({static_cast<py::ssize_t>(ids.size()), static_cast<py::ssize_t>(Dim(names.back()))});
      } else {
        a = Writable(entry[2], "out");
      }
      outs.push_back({{}, std::span<const int64_t>(ids.data(), static_cast<size_t>(ids.size())),
                      std::span<float>(a.mutable_data(), static_cast<size_t>(a.size()))});
      keep.push_back(ids);
      keep.push_back(a);
      results.append(a);
    }
    for (size_t i = 0; i < outs.size(); ++i) outs[i].table = names[i];
    ferry::Handle h;
    ferry::Client& c = client();
    {
      py::gil_scoped_release release;
      h = c.PullSparse(outs, step, distinct ? ferry::SparseIds::kDistinct : ferry::SparseIds::kMayRepeat);
    }
    return std::make_unique<PyHandle>(std::move(h), std::move(keep), std::move(results));
  }

  //   tables: [(name, ids, grads)], grads of len(ids) x dim.
  std::unique_ptr<PyHandle> PushSparseTables(const py::list& tables, int64_t step, bool distinct) {
    std::vector<py::object> keep;
    std::vector<std::string> names;
    std::vector<ferry::SparseIn> ins;
    names.reserve(tables.size());
    for (size_t i = 0; i < tables.size(); ++i) {
      auto entry = Entry(tables[i], 3, "push_sparse_tables", "(table, ids, grads)", i);
      names.push_back(py::cast<std::string>(entry[0]));
      IdsIn ids = IntegerArray(entry[1], "push_sparse_tables: entry " + std::to_string(i) + ": ids");
      FloatIn grads = FloatIn::ensure(entry[2]);
      if (!grads)
        throw py::type_error("push_sparse_tables: entry " + std::to_string(i) + ": grads must be an array of numbers");
      ins.push_back({{}, std::span<const int64_t>(ids.data(), static_cast<size_t>(ids.size())),
                     std::span<const float>(grads.data(), static_cast<size_t>(grads.size()))});
      keep.push_back(ids);
      keep.push_back(grads);
    }
    for (size_t i = 0; i < ins.size(); ++i) ins[i].table = names[i];
    ferry::Handle h;
    ferry::Client& c = client();
    {
      py::gil_scoped_release release;
      h = c.PushSparse(ins, step, distinct ? ferry::SparseIds::kDistinct : ferry::SparseIds::kMayRepeat);
    }
    return std::make_unique<PyHandle>(std::move(h), std::move(keep), py::none());
  }

  // Dense tables, several in one call: [(name, out)], [(name, grad)], [(name, grad, out)].
  std::unique_ptr<PyHandle> DenseTables(const py::list& tables, int64_t step, bool push, bool pull) {
    const char* call = push ? (pull ? "push_pull_dense_tables" : "push_dense_tables") : "pull_dense_tables";
    const char* form = push ? (pull ? "(table, grad, out)" : "(table, grad)") : "(table, out)";
    const size_t width = 1 + (push ? 1 : 0) + (pull ? 1 : 0);
    std::vector<py::object> keep;
    std::vector<std::string> names;
    std::vector<ferry::DenseIn> ins;
    std::vector<ferry::DenseOut> outs;
    py::list results;
    names.reserve(tables.size());
    for (size_t i = 0; i < tables.size(); ++i) {
      auto entry = Entry(tables[i], width, call, form, i);
      names.push_back(py::cast<std::string>(entry[0]));
      if (push) {
        FloatIn grad = FloatIn::ensure(entry[1]);
        if (!grad)
          throw py::type_error(std::string(call) + ": entry " + std::to_string(i) +
                               ": grad must be an array of numbers");
        ins.push_back({{}, std::span<const float>(grad.data(), static_cast<size_t>(grad.size()))});
        keep.push_back(grad);
      }
      if (pull) {
        py::array_t<float> a = Writable(entry[width - 1], "out");
        outs.push_back({{}, std::span<float>(a.mutable_data(), static_cast<size_t>(a.size()))});
        keep.push_back(a);
        results.append(a);
      }
    }
    for (size_t i = 0; i < names.size(); ++i) {
      if (push) ins[i].table = names[i];
      if (pull) outs[i].table = names[i];
    }
    ferry::Handle h;
    ferry::Client& c = client();
    {
      py::gil_scoped_release release;
      h = push ? (pull ? c.PushPullDense(ins, outs, step) : c.PushDense(ins, step)) : c.PullDense(outs, step);
    }
    return std::make_unique<PyHandle>(std::move(h), std::move(keep), pull ? py::object(results) : py::none());
  }

  // The dim of a declared sparse table (ValueError naming it otherwise).
  int64_t SparseDim(const std::string& table) const { return Dim(table); }

  // Runs a blocking call of the client with the GIL released; raises its failure.
  template <typename Call>
  void Blocking(Call&& call) {
    ferry::Status s;
    ferry::Client& c = client();
    {
      py::gil_scoped_release release;
      s = call(c);
    }
    Check(s);
  }

  void Barrier() {
    Blocking([](ferry::Client& c) { return c.Barrier(); });
  }

  void Checkpoint(int64_t step) {
    Blocking([step](ferry::Client& c) { return c.Checkpoint(step); });
  }

  // None, or ("join", K) / ("drain", K): the move asked of server 0 that this barrier hands over.
  py::object BarrierTakingMoves(int64_t step) {
    ferry::Client::AskedMove asked;
    Blocking([&asked, step](ferry::Client& c) -> ferry::Status {
      FERRY_ASSIGN_OR_RETURN(asked, c.BarrierTakingMoves(step));
      return ferry::Status::Ok();
    });
    if (!asked.asked()) return py::none();
    if (asked.leave_worker >= 0) return py::make_tuple("leave_worker", asked.leave_worker);
    if (asked.rejoin_worker >= 0) return py::make_tuple("rejoin_worker", asked.rejoin_worker);
    return py::make_tuple(asked.join >= 0 ? "join" : "drain", asked.join >= 0 ? asked.join : asked.drain);
  }

  std::map<int, int64_t> WorkersLeft() { return client().workers_left(); }
  uint64_t placement_version() { return client().placement_version(); }
  std::vector<int> ServersInJob() { return client().servers_in_job(); }
  py::array_t<uint16_t> PlacementOwners() {
    const std::vector<uint16_t> map = client().placement_owners();
    py::array_t<uint16_t> out(static_cast<py::ssize_t>(map.size()));
    std::copy(map.begin(), map.end(), out.mutable_data());
    return out;
  }
  // owners: any integer array of one server per slot; a value that is no uint16 raises ValueError
  // (the servers check the rest: length, ranks).
  static std::vector<uint16_t> Owners(const py::handle& owners_in, const std::string& what) {
    const IdsIn owners = IntegerArray(owners_in, what + ": owners");
    std::vector<uint16_t> map(static_cast<size_t>(owners.size()));
    for (size_t i = 0; i < map.size(); ++i) {
      const int64_t o = owners.data()[i];
      if (o < 0 || o > 0xffff) {
        throw py::value_error(what + ": owners[" + std::to_string(i) + "] is " + std::to_string(o) +
                              ", not a server rank");
      }
      map[i] = static_cast<uint16_t>(o);
    }
    return map;
  }
  void MoveSlots(uint64_t version, const py::handle& owners_in, int64_t step) {
    const std::vector<uint16_t> map = Owners(owners_in, "move_slots");
    Blocking([&](ferry::Client& c) { return c.MoveSlots(version, map, step); });
  }
  void PrepareMoveSlots(uint64_t version, const py::handle& owners_in, int64_t step) {
    const std::vector<uint16_t> map = Owners(owners_in, "prepare_move_slots");
    Blocking([&](ferry::Client& c) { return c.PrepareMoveSlots(version, map, step).wait(); });
  }

  py::array_t<double> AllReduceSum(const py::array_t<double, py::array::c_style | py::array::forcecast>& values) {
    std::span<const double> v(values.data(), static_cast<size_t>(values.size()));
    ferry::StatusOr<std::vector<double>> sum = ferry::InternalError("not run");
    ferry::Client& c = client();
    {
      py::gil_scoped_release release;
      sum = c.AllReduceSum(v);
    }
    if (!sum.ok()) Raise(sum.status());
    py::array_t<double> out(static_cast<py::ssize_t>(sum->size()));
    std::copy(sum->begin(), sum->end(), out.mutable_data());
    return out.reshape(std::vector<py::ssize_t>(values.shape(), values.shape() + values.ndim()));
  }

  // wait: returns once every server has the clock (None); otherwise returns its Handle at once.
  py::object AdvanceClock(int64_t clock, bool wait) {
    ferry::Handle h;
    ferry::Client& c = client();
    ferry::Status s;
    {
      py::gil_scoped_release release;
      h = c.AdvanceClock(clock);
      if (wait) s = h.wait();
    }
    if (!wait) return py::cast(std::make_unique<PyHandle>(std::move(h), std::vector<py::object>{}, py::none()));
    Check(s);
    return py::none();
  }

  void Finish() {
    Blocking([](ferry::Client& c) { return c.Finish(); });
  }

  void Leave(int64_t at) {
    Blocking([at](ferry::Client& c) { return c.Leave(at); });
  }

  std::map<std::string, int64_t> ServerCounters(int server) {
    ferry::Client& c = client();
    ferry::StatusOr<std::map<std::string, int64_t>> counters = ferry::InternalError("not run");
    {
      py::gil_scoped_release release;
      counters = c.ServerCounters(server);
    }
    if (!counters.ok()) Raise(counters.status());
    return *counters;
  }

  // This client's own counters (ferry::ClientStats).
  std::map<std::string, int64_t> Stats() {
    const ferry::ClientStats st = client().stats();
    return {{"requests", st.requests},
            {"bytes_sent", st.bytes_sent},
            {"bytes_received", st.bytes_received},
            {"values_saturated", st.values_saturated}};
  }

  void Close() {
    py::gil_scoped_release release;
    client_.reset();
  }

  // The end of a `with` block. A normal exit (clean: no exception) finishes, then closes: the job
  // stops waiting for this worker and the servers do not take it for one that vanished. An exit
  // by exception only closes, so the servers still log a worker that left without finishing.
  // A client closed inside the block is left alone.
  void Exit(bool clean) {
    if (!client_) return;
    ferry::Status s;
    {
      py::gil_scoped_release release;
      if (clean) s = client_->Finish();
      client_.reset();
    }
    Check(s);
  }

 private:
  ferry::Client& client() {
    if (!client_) Raise(ferry::FailedPreconditionError("the client is closed"));
    return *client_;
  }

  void Declare(const ferry::TableSpec& s) {
    ferry::Client& c = client();
    ferry::Status st;
    {
      py::gil_scoped_release release;
      st = c.Declare(s);
    }
    Check(st);
    dims_[s.name] = s.dim;
  }

  int64_t Dim(const std::string& table) const {
    auto it = dims_.find(table);
    if (it == dims_.end() || it->second == 0) {
      Raise(ferry::NotFoundError("sparse table '" + table + "' was not declared by this client"));
    }
    return it->second;
  }

  std::unique_ptr<ferry::Client> client_;
  std::map<std::string, int64_t> dims_;  // declared tables: dim (0 for dense)
};

// ferry._ferry.WorkerMetrics: a Python worker's series for Prometheus, with the names and labels
// ferry-trainer --metrics serves (ferry/metrics/worker.h), so one dashboard shows both kinds of
// worker. ferry.torch's Session keeps one when FERRY_METRICS (or init(metrics=)) asks for it.
class PyWorkerMetrics {
 public:
  PyWorkerMetrics(const std::string& bind, int rank) {
    auto m = ferry::metrics::WorkerEndpoint::Start(bind, rank);
    if (!m.ok()) Raise(m.status());
    endpoint_ = std::move(*m);
  }

  void Update(int64_t step, int64_t examples, double loss, double pull_s, double push_s, double compute_s,
              double wait_s, double eval_s, int64_t bytes_sent, int64_t bytes_received) {
    if (!endpoint_) Raise(ferry::FailedPreconditionError("the metrics endpoint is closed"));
    endpoint_->Update({.step = step, .examples = examples, .loss = loss, .pull_s = pull_s, .push_s = push_s,
                       .compute_s = compute_s, .wait_s = wait_s, .eval_s = eval_s, .bytes_sent = bytes_sent,
                       .bytes_received = bytes_received});
  }

  std::string Url() const { return endpoint_ ? endpoint_->url() : std::string(); }

  void Close() {
    py::gil_scoped_release release;  // waits for a scrape in flight, whose page needs no Python
    endpoint_.reset();
  }

 private:
  std::unique_ptr<ferry::metrics::WorkerEndpoint> endpoint_;
};

// The change feed (ferry/feed.h): a reader's polls as numpy arrays.
class PyChangeFeed {
 public:
  PyChangeFeed(std::vector<std::string> servers, std::optional<std::string> curve_keys, int reader,
               double request_timeout, int64_t page_bytes) {
    ferry::FeedOptions o;
    o.servers = std::move(servers);
    o.request_timeout = Millis(request_timeout, "request_timeout");
    if (page_bytes < 0) throw py::value_error("page_bytes must be >= 0");
    o.page_bytes = page_bytes;
    if (curve_keys && !curve_keys->empty()) {
      auto keys = ferry::curve::LoadReaderKeys(*curve_keys, reader);
      if (!keys.ok()) Raise(keys.status().WithContext("curve_keys"));
      o.curve = std::move(*keys);
    }
    auto f = ferry::ChangeFeed::Connect(std::move(o));
    if (!f.ok()) Raise(f.status());
    feed_ = std::move(*f);
  }

  int num_servers() const { return feed_->num_servers(); }

  py::dict Poll(const std::string& table) {
    ferry::TableChanges c;
    ferry::Status s;
    {
      py::gil_scoped_release release;
      s = feed_->Poll(table, &c);
    }
    Check(s);
    auto ints = [](const std::vector<int64_t>& v) {
      py::array_t<int64_t> a(static_cast<py::ssize_t>(v.size()));
      if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(int64_t));
      return a;
    };
    py::dict out;
    out["table"] = c.spec.name;
    out["full_servers"] = c.full_servers;
    out["pages"] = c.pages;
    if (c.spec.type == ferry::TableType::kSparse) {
      out["type"] = "sparse";
      out["deleted"] = ints(c.deleted);
      out["ids"] = ints(c.ids);
      py::array_t<float> rows({static_cast<py::ssize_t>(c.ids.size()), static_cast<py::ssize_t>(c.spec.dim)});
      if (!c.rows.empty()) std::memcpy(rows.mutable_data(), c.rows.data(), c.rows.size() * sizeof(float));
      out["rows"] = rows;
    } else {
      out["type"] = "dense";
      out["shape"] = c.spec.shape;
      py::array_t<int64_t> ranges({static_cast<py::ssize_t>(c.ranges.size()), py::ssize_t{2}});
      for (size_t i = 0; i < c.ranges.size(); ++i) {
        ranges.mutable_at(static_cast<py::ssize_t>(i), 0) = c.ranges[i].begin;
        ranges.mutable_at(static_cast<py::ssize_t>(i), 1) = c.ranges[i].end;
      }
      out["ranges"] = ranges;
      py::array_t<float> values(static_cast<py::ssize_t>(c.values.size()));
      if (!c.values.empty()) std::memcpy(values.mutable_data(), c.values.data(), c.values.size() * sizeof(float));
      out["values"] = values;
    }
    return out;
  }

 private:
  std::unique_ptr<ferry::ChangeFeed> feed_;
};

}  // namespace

PYBIND11_MODULE(_ferry, m) {
  m.doc() = "Ferry's parameter-server client: dense and sparse tables with numpy arrays";
  static py::exception<std::runtime_error> error(m, "Error", PyExc_RuntimeError);
  error.attr("code") = "UNKNOWN";
  error_type = error.ptr();
  Py_INCREF(error_type);
  m.attr("PLACEMENT_SLOTS") = ferry::placement::kSlots;  // slots of a placement map (client.placement_owners)

  py::class_<PyHandle>(m, "Handle", "An operation in flight; wait() returns the pulled array (or None).")
      .def("wait", &PyHandle::Wait, py::arg("timeout") = py::none(),
           "Waits (seconds; None: until done, bounded by the request timeout); raises ferry.Error on failure.")
      .def("done", &PyHandle::Done)
      .def_property_readonly("version", &PyHandle::Version, "The lowest table version served (sync pull: the step).")
      .def_property_readonly("used", &PyHandle::Used, "Pushes, once done: parts whose gradient counted.")
      .def_property_readonly("dropped", &PyHandle::Dropped, "Pushes, once done: parts dropped as late.")
      .def_property_readonly("held", &PyHandle::Held, "Pulls, once done: seconds a server held it for its step.")
      .def_property_readonly("elapsed", &PyHandle::Elapsed, "Seconds from the call to its last reply (0 until done).");

  // Kept alive for the module's life: pybind11 keeps the pointer.
  static const std::string opt_doc =
      "optimizer: " + ferry::JoinNames(ferry::OptimizerNames()) + " (ferry.optimizers() describes each; ftrl's lr "
      "is its alpha); consistency: sync, async or ssp:S; init: zeros, uniform, normal or constant (with "
      "init_scale); options: the optimizer's other hyperparameters by name (" +
      ferry::JoinNames(ferry::HyperParamKeys()) + "), chunk_elems, a sparse table's row lifecycle (admit_after, "
      "admit_probability, evict_after_steps, max_rows; with max_rows, disk_tier=1 keeps the rows beyond it on the "
      "servers' disks), and a dense table's topk (each pushed chunk sends only its "
      "ceil(topk * n) largest elements; the rest is kept and added to the next push); wire: f32, fp16 or bf16, how "
      "the table's gradients and values travel (2 bytes a value for fp16 and bf16; the servers keep float32; needs "
      "servers of protocol 1.6)";
  py::class_<PyClient>(m, "Client")
      .def(py::init<std::vector<std::string>, int, int, double, double, std::optional<std::string>, double, double,
                    uint32_t, bool, int64_t>(),
           py::arg("servers"), py::arg("rank") = 0, py::arg("num_workers") = 1, py::arg("request_timeout") = 360.0,
           py::arg("connect_timeout") = 30.0, py::arg("curve_keys") = py::none(), py::arg("heartbeat_timeout") = 5.0,
           py::arg("long_wait_every") = 5.0, py::arg("incarnation") = 0, py::arg("resumes") = false,
           py::arg("joins_at") = 0,
           "Connects to every server (endpoints like tcp://host:7470, in server-rank order). curve_keys: the "
           "job's CURVE key folder (ferry-keys writes one), needed when the servers run with --curve-keys. "
           "heartbeat_timeout: seconds a server may stay silent before its requests fail with UNAVAILABLE (0: "
           "no heartbeats; a closed connection is still noticed). long_wait_every: a request that has waited "
           "this long for its reply is reported on stderr every as long ('ferry: worker 0 waiting 10 s (of 360) "
           "for server 1 (...) to answer PullDense (...)'); 0: silent. incarnation: which start of this worker's "
           "rank this process is (0, then one more per restart; ferry-launch sets FERRY_INCARNATION): the servers "
           "give the rank to the highest at once and refuse an earlier one's requests. resumes: this process "
           "resumes its rank's training at worker_step (its predecessor dead): the servers skip its async and ssp "
           "pushes of steps they had taken of the rank (leave it False for a program that does not count steps). "
           "joins_at: the first sync step this worker takes part in (servers of protocol 1.18): no earlier step "
           "waits for its gradient or takes one; 0: every step from now on.")
      .def_static("from_tf_config", &PyClient::FromTfConfig, py::arg("request_timeout") = 360.0,
                  py::arg("connect_timeout") = 30.0, py::arg("curve_keys") = py::none(),
                  py::arg("heartbeat_timeout") = 5.0, py::arg("long_wait_every") = 5.0, py::arg("incarnation") = 0,
                  "Connects as the worker TF_CONFIG describes (see the README).")
      .def_property_readonly("rank", &PyClient::rank)
      .def_property_readonly("num_workers", &PyClient::num_workers)
      .def_property_readonly("num_servers", &PyClient::num_servers)
      .def("declare_dense", &PyClient::DeclareDense, py::arg("name"), py::arg("shape"), py::kw_only(),
           py::arg("optimizer") = "sgd", py::arg("lr") = 0.01f, py::arg("consistency") = "async",
           py::arg("init") = "zeros", py::arg("init_scale") = 0.0f, py::arg("seed") = 0,
           py::arg("replicas_to_aggregate") = 0, py::arg("wire") = "f32",
           py::arg("options") = std::map<std::string, double>(), opt_doc.c_str())
      .def("declare_sparse", &PyClient::DeclareSparse, py::arg("name"), py::arg("dim"), py::kw_only(),
           py::arg("optimizer") = "sgd", py::arg("lr") = 0.01f, py::arg("consistency") = "async",
           py::arg("init") = "zeros", py::arg("init_scale") = 0.0f, py::arg("seed") = 0,
           py::arg("replicas_to_aggregate") = 0, py::arg("skip_nonfinite_rows") = false, py::arg("wire") = "f32",
           py::arg("options") = std::map<std::string, double>(), opt_doc.c_str())
      .def("pull_dense", &PyClient::PullDense, py::arg("table"), py::arg("out"), py::arg("step") = 0)
      .def("push_dense", &PyClient::PushDense, py::arg("table"), py::arg("grad"), py::arg("step") = 0)
      .def("push_pull_dense", &PyClient::PushPullDense, py::arg("table"), py::arg("grad"), py::arg("out"),
           py::arg("step") = 0)
      .def("pull_sparse", &PyClient::PullSparse, py::arg("table"), py::arg("ids"), py::arg("step") = 0,
           py::arg("out") = py::none())
      .def("push_sparse", &PyClient::PushSparse, py::arg("table"), py::arg("ids"), py::arg("grads"),
           py::arg("step") = 0)
      .def("pull_sparse_tables", &PyClient::PullSparseTables, py::arg("tables"), py::arg("step") = 0,
           py::arg("distinct") = false,
           "Pulls rows of several sparse tables in one message per server: tables = [(name, ids, out or "
           "None)]; wait() returns the row arrays in order. distinct=True: no id repeats within a table "
           "(sent as they are).")
      .def("push_sparse_tables", &PyClient::PushSparseTables, py::arg("tables"), py::arg("step") = 0,
           py::arg("distinct") = false,
           "Pushes row gradients of several sparse tables in one message per server: tables = [(name, ids, "
           "grads)]; a repeated id's gradients are summed unless distinct=True.")
      .def(
          "pull_dense_tables",
          [](PyClient& c, const py::list& t, int64_t step) { return c.DenseTables(t, step, false, true); },
          py::arg("tables"), py::arg("step") = 0,
          "Pulls several dense tables in one message per server: [(name, out)].")
      .def(
          "push_dense_tables",
          [](PyClient& c, const py::list& t, int64_t step) { return c.DenseTables(t, step, true, false); },
          py::arg("tables"), py::arg("step") = 0,
          "Pushes several dense gradients in one message per server: [(name, grad)].")
      .def(
          "push_pull_dense_tables",
          [](PyClient& c, const py::list& t, int64_t step) { return c.DenseTables(t, step, true, true); },
          py::arg("tables"), py::arg("step") = 0,
          "Pushes gradients for `step` and pulls the same tables for step + 1, one round trip per server: "
          "[(name, grad, out)].")
      .def("sparse_dim", &PyClient::SparseDim, py::arg("table"), "The row width of a sparse table declared here.")
      .def("barrier", &PyClient::Barrier)
      .def("barrier_taking_moves", &PyClient::BarrierTakingMoves, py::arg("step") = -1,
           "A barrier at which the workers take the move asked of server 0 since (ferry.ask_move; servers of\n"
           "protocol 1.24): every worker must call it (not barrier) for server 0 to hand the move over, and\n"
           "each then gets the same answer: None, or ('join', K) / ('drain', K), the move to make now (worker\n"
           "0: checkpoint, then move_slots with placement_owners changed so; the others wait at a barrier), or\n"
           "('leave_worker', W) (1.26): worker W leaves after this step (it calls leave(at=the next step)), or\n"
           "('rejoin_worker', W) (1.27): worker W, which left, takes part again from the next step (its\n"
           "share of the examples is its own again), and every worker calls barrier() once more now.\n"
           "step (1.26): the step every worker is at, which a leave handed over here is kept with.")
      .def("all_reduce_sum", &PyClient::AllReduceSum, py::arg("values"))
      .def("advance_clock", &PyClient::AdvanceClock, py::arg("clock"), py::arg("wait") = true,
           "Advances this worker's clock to `clock` on every server (ssp). wait=False: returns its Handle at "
           "once (a later request of this client reaches each server after it).")
      .def("finish", &PyClient::Finish)
      .def("leave", &PyClient::Leave, py::arg("at") = -1,
           "Leaves the job while the other workers train on (servers of protocol 1.18): as finish(), and no "
           "barrier or all_reduce_sum waits for this worker any more. Call it between steps, with no push in "
           "flight. at (1.26): the first step it takes no part in, which the servers tell workers that connect "
           "later (workers_left).")
      .def_property_readonly(
          "workers_left", &PyClient::WorkersLeft,
          "{rank: step}: the workers that had left the job when this client connected, each with the step it "
          "left before (protocol 1.26; leaves whose step was not said are not listed).")
      .def("checkpoint", &PyClient::Checkpoint, py::arg("step"),
           "Has every server save its shard of every table as of `step` in its checkpoint folder\n"
           "(ferry-ps --checkpoint-dir), then server 0 write the manifest; returns once it exists.\n"
           "For sync tables `step` must be the global step every server is at.")
      .def_property_readonly("placement_version", &PyClient::placement_version,
                             "The placement version this client places its requests by (protocol 1.17).")
      .def_property_readonly("servers_in_job", &PyClient::ServersInJob,
                             "The servers this client speaks to, by rank (protocol 1.20): server 0 and those its map "
                             "gives slots; one that owns none may have left the job (ferry-ps --exit-when-drained).")
      .def_property_readonly("placement_owners", &PyClient::PlacementOwners,
                             "That version's map: the server of each slot (numpy uint16, ferry.PLACEMENT_SLOTS "
                             "long). A map for move_slots is a copy with the slots to move given their new server.")
      .def("move_slots", &PyClient::MoveSlots, py::arg("version"), py::arg("owners"), py::arg("step"),
           "Moves slots between the job's servers: every server adopts `owners` as placement version `version`\n"
           "(above placement_version), taking over what it gains from the job's committed checkpoint of `step`\n"
           "and dropping what it gives up. Call it between steps (other workers waiting, e.g. at a barrier),\n"
           "with nothing pushed since that checkpoint; a refusal changes nothing. Requests placed by the old\n"
           "map are answered 'moved' and sent again by the new one.")
      .def("prepare_move_slots", &PyClient::PrepareMoveSlots, py::arg("version"), py::arg("owners"), py::arg("step"),
           "Makes a later move_slots to this map pause the job for less (servers of protocol 1.19): the servers\n"
           "whose slots it moves read the committed checkpoint of `step` now, while the job trains, and the\n"
           "move's hand-over then reads only the files written since (a later checkpoint's deltas, with\n"
           "ferry-ps --checkpoint-deltas). Checks and changes nothing; returns once every server has read.\n"
           "A server refuses it while it writes a checkpoint, and a checkpoint while it reads.")
      .def_property_readonly("restored_step", &PyClient::restored_step,
                             "The step of the checkpoint the servers started from (0 if none).")
      .def_property_readonly("worker_step", &PyClient::worker_step,
                             "The steps this worker's rank has done as the servers knew at the handshake (its "
                             "predecessor's pushes they took, or the restored checkpoint's record of it; the lowest "
                             "over the servers that know; 0 if none does): where a restarted async worker resumes. -1 "
                             "if a server is older than 1.11.")
      .def("server_counters", &PyClient::ServerCounters, py::arg("server"))
      .def("stats", &PyClient::Stats,
           "This client's counters: requests (messages sent), bytes_sent, bytes_received, values_saturated.")
      .def("close", &PyClient::Close, "Closes the connections (without finish(): the servers log a worker that left)")
      .def(
          "__enter__", [](PyClient& c) -> PyClient& { return c; }, py::return_value_policy::reference)
      .def(
          "__exit__",
          [](PyClient& c, const py::object& exc_type, const py::object&, const py::object&) {
            c.Exit(exc_type.is_none());
          },
          "A normal exit calls finish() then close(); an exit by exception only close(), so the servers log a "
          "worker that left without finishing.");

  py::class_<PyChangeFeed>(m, "ChangeFeed",
                           "The change feed (README, 'Serving a table as it trains'): a reader that is no worker "
                           "follows tables as a job trains them.")
      .def(py::init<std::vector<std::string>, std::optional<std::string>, int, double, int64_t>(), py::arg("servers"),
           py::kw_only(), py::arg("curve_keys") = py::none(), py::arg("reader") = 0, py::arg("request_timeout") = 30.0,
           py::arg("page_bytes") = 0,
           "servers: every server's endpoint, in rank order. curve_keys: the job's key folder, for reader `reader`'s "
           "key (ferry-keys --readers): the servers let it read and nothing else. request_timeout: seconds one page "
           "may take. page_bytes: about the most value bytes a page carries (0: the servers' 4 MiB).")
      .def_property_readonly("num_servers", &PyChangeFeed::num_servers)
      .def("poll", &PyChangeFeed::Poll, py::arg("table"),
           "One round over every server: what changed in `table` since this feed's previous poll of it (the first: "
           "everything), as a dict. Sparse: ids (int64), rows (float32 [n, dim]), deleted (int64: evicted since; "
           "apply first). Dense: shape, ranges (int64 [k, 2]: [begin, end) of the flattened tensor), values "
           "(float32, the ranges' values in order). full_servers: servers that sent all they hold (drop what you "
           "hold from them first: ferry.id_server). pages: replies it took.");
  m.def(
      "id_server",
      [](const py::object& obj, int num_servers) {
        if (num_servers < 1 || num_servers > ferry::placement::kSlots) {
          throw py::value_error("num_servers must be in [1, " + std::to_string(ferry::placement::kSlots) + "]");
        }
        const IdsIn ids = IntegerArray(obj, "id_server: ids");
        py::array_t<int32_t> out(ids.size());
        int32_t* o = out.mutable_data();
        for (py::ssize_t i = 0; i < ids.size(); ++i) o[i] = ferry::placement::IdServer(ids.data()[i], num_servers);
        return out;
      },
      py::arg("ids"), py::arg("num_servers"), "The server each sparse id lives on (int32), as the servers place them.");
  m.def(
      "optimizers",
      [] {
        py::dict out;
        const ferry::OptimizerSpec defaults;
        for (const ferry::OptimizerInfo& o : ferry::kOptimizers) {
          py::dict hypers, d;
          hypers["lr"] = defaults.learning_rate;
          for (std::string_view key : o.uses)
            hypers[py::str(key)] = ferry::GetHyper(defaults, *ferry::FindHyperParam(key));
          py::list slots;
          for (const ferry::StateSlot& slot : o.slots) slots.append(py::str(slot.name));
          d["summary"] = py::str(o.summary);
          d["hyperparameters"] = hypers;
          d["state_slots"] = slots;
          out[py::str(o.name)] = d;
        }
        return out;
      },
      "The servers' optimizers (ferry/optimizers.h): {name: {'summary', 'hyperparameters': {key: default}, "
      "'state_slots': [...]}} in the catalogue's order.");
  m.def(
      "table_option_keys",
      [] { return std::vector<std::string>(ferry::SpecOptionKeys().begin(), ferry::SpecOptionKeys().end()); },
      "The keys declare_dense / declare_sparse take in options= (and --table takes besides lr, optimizer, "
      "consistency and wire).");
  py::class_<PyBags>(m, "Bags",
                     "Bags(entries): the bags of every table of one forward, entries [(table, ids, offsets, weights or "
                     "None, dim, mean)] in nn.EmbeddingBag's layout, checked (ValueError naming the table) and "
                     "deduplicated; distinct() and rows() give each table's distinct ids and the row buffer a pull "
                     "writes, pool() the pooled [bags, dim] arrays, row_gradients(grads) the distinct rows' "
                     "gradients. The GIL is released while it computes.")
      .def(py::init<const py::list&>(), py::arg("entries"))
      .def("distinct", &PyBags::Distinct, "Each table's distinct ids (int64), in order of first appearance.")
      .def("rows", &PyBags::Rows, "Each table's row buffer (float32 [distinct, dim]) for a pull to write.")
      .def("take_rows", &PyBags::TakeRows, py::arg("other"),
           "Uses the row buffers of `other`, Bags of the same distinct ids of the same tables.")
      .def("pool", &PyBags::Pool, "Each table's bags pooled from its rows: float32 [bags, dim] arrays.")
      .def("row_gradients", &PyBags::RowGradients, py::arg("grads"),
           "grads: per table the gradient of its pooled array (float32 [bags, dim]) or None; returns per table "
           "the gradient of its distinct rows (float32 [distinct, dim]) or None.");
  py::class_<PyWorkerMetrics>(m, "WorkerMetrics",
                              "WorkerMetrics(bind, rank): serves a worker's series for Prometheus at "
                              "http://HOST:PORT/metrics (bind 'HOST:PORT' or 'PORT'; port 0 picks a free one), the "
                              "names ferry-trainer --metrics serves; ferry.Error if it cannot listen.")
      .def(py::init<const std::string&, int>(), py::arg("bind"), py::arg("rank"))
      .def_property_readonly("url", &PyWorkerMetrics::Url)
      .def("update", &PyWorkerMetrics::Update, py::kw_only(), py::arg("step"), py::arg("examples"), py::arg("loss"),
           py::arg("pull_s"), py::arg("push_s"), py::arg("compute_s"), py::arg("wait_s") = 0.0,
           py::arg("eval_s") = 0.0, py::arg("bytes_sent") = 0, py::arg("bytes_received") = 0,
           "Sets what the page shows: steps done, examples processed, the last loss, seconds by part "
           "(cumulative), the client's bytes.")
      .def("close", &PyWorkerMetrics::Close, "Stops serving.");
  m.def(
      "ask_move",
      [](const std::string& server0, std::optional<int> join, std::optional<int> drain, int rank,
         std::optional<std::string> curve_keys, double timeout_s, std::optional<int> leave_worker) {
        ferry::AskMoveOptions o;
        o.server0 = server0;
        if (join.has_value() + drain.has_value() + leave_worker.has_value() != 1 || (join && *join < 0) ||
            (drain && *drain < 0) || (leave_worker && *leave_worker < 0)) {
          throw py::value_error("ask_move: give one server rank, join=K or drain=K, or one worker, leave_worker=W");
        }
        o.join = join.value_or(-1);
        o.drain = drain.value_or(-1);
        o.leave_worker = leave_worker.value_or(-1);
        o.rank = rank;
        if (!(timeout_s > 0)) throw py::value_error("ask_move: timeout_s must be positive");
        o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
        if (curve_keys && !curve_keys->empty()) {
          auto keys = ferry::curve::LoadClientKeys(*curve_keys, rank);
          if (!keys.ok()) Raise(keys.status().WithContext("curve_keys"));
          o.curve = std::move(*keys);
        }
        ferry::Status s;
        {
          py::gil_scoped_release release;
          s = ferry::AskMove(o);
        }
        Check(s);
      },
      py::arg("server0"), py::kw_only(), py::arg("join") = py::none(), py::arg("drain") = py::none(),
      py::arg("rank") = 0, py::arg("curve_keys") = py::none(), py::arg("timeout_s") = 10.0,
      py::arg("leave_worker") = py::none(),
      "Asks a running job (server 0 at the endpoint server0; protocol 1.24) to make server `join` join or\n"
      "server `drain` leave, or (1.26) worker `leave_worker` leave the job: server 0 checks it, keeps it\n"
      "(one at a time) and hands it to the workers at their next barrier_taking_moves (ferry-trainer\n"
      "--move-asks-every). With CURVE, the job's key folder and a worker's rank. ferry.Error: refused\n"
      "(FAILED_PRECONDITION: one is kept already, the map cannot make that move, or the worker has left)\n"
      "or no answer within timeout_s (DEADLINE_EXCEEDED).");
  m.def("dedup", &Dedup, py::arg("tables"),
        "dedup([ids, ...]) -> ([distinct ids per table], rows): each table's distinct ids in order of first "
        "appearance, and for every id, in order, the row of its distinct id counted over all tables (table t's "
        "rows follow the distinct ids of the tables before it). The GIL is released.");
  m.def(
      "cluster_from_tf_config",
      [](const std::optional<std::string>& text) -> py::object {
        ferry::StatusOr<std::optional<ferry::ClusterConfig>> c = std::optional<ferry::ClusterConfig>();
        if (text) {
          auto parsed = ferry::ParseTfConfig(*text);
          if (!parsed.ok()) Raise(parsed.status());
          c = std::optional<ferry::ClusterConfig>(*parsed);
        } else {
          c = ferry::ClusterFromEnvironment();
        }
        if (!c.ok()) Raise(c.status());
        if (!*c) return py::none();
        const ferry::ClusterConfig& k = **c;
        py::dict d;
        d["servers"] = k.servers;
        d["num_workers"] = k.num_workers;
        d["task_type"] = k.task_type;
        d["task_index"] = k.task_index;
        d["rank"] = k.rank;
        d["bind"] = k.bind;
        return d;
      },
      py::arg("tf_config") = py::none(),
      "The cluster a TF_CONFIG value (default: the environment's) describes, as a dict; None if unset.");
}
