// ferry._data: the data readers of trainer/data (ferry/data.h) for Python, with numpy arrays.
//
//   from ferry import _data
//   gen = _data.SyntheticCtr(seed=1, vocab_sizes=[1000] * 8, num_dense=4)
//   order = _data.epoch_indices(1000000, shard_index=0, num_shards=2, epoch=0, shuffle=True, seed=1)
//   labels, dense, ids, true_probs = gen.generate(order[:64])
//   stream = _data.CriteoStream("data/day_*.gz", shard_index=0, num_shards=2)   # passes again and again
//   labels, dense, ids = stream.next(4096)
//   reader = _data.CriteoReader(["a.tsv", "b.tsv.gz"], shard_by="line")            # one pass at a time
//   labels, dense, ids = reader.read(4096)      # fewer at the end of the pass; reader.stats counts it
//   _data.auc(true_probs, labels)
//
// Arrays: a batch is (labels float32 [B], dense float32 [B, num_dense], ids int64 [B, num_fields])
// (plus true_probs float32 [B] from the generator), C-contiguous and writable. Copies: none here.
// The C++ reader or generator fills a CtrBatch's vectors, and each vector is then moved into a
// numpy array that owns it through a capsule (Adopt below): numpy reads the C++ allocation, and
// torch.from_numpy on it shares it too. (Inside C++, CriteoReader parses straight into the batch
// it hands out, while CriteoStream copies the examples as it assembles a batch from its reads:
// criteo.cc's Read and Use append.) Array arguments (indices, scores, labels) are used in place
// when they are C-contiguous of the right dtype, else converted once; indices must have an
// integer dtype (int_arrays.h: a float array raises TypeError instead of being truncated).
//
// Errors raise the C++ Status's text, with the status code's name as the exception's `code`:
//   INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE  ValueError
//   NOT_FOUND                                             FileNotFoundError
//   DATA_LOSS, UNAVAILABLE, PERMISSION_DENIED             OSError (a corrupt gzip, an unreadable file)
//   anything else                                         RuntimeError
//
// The GIL is released while C++ generates, reads, shuffles or measures. Thread-safety: a
// SyntheticCtr is immutable (any number of threads at once); a CriteoReader or CriteoStream
// serializes its calls with a mutex (it is one sequence: share one between threads with care).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ferry/data/criteo.h"
#include "ferry/data/ctr_batch.h"
#include "ferry/data/metrics.h"
#include "ferry/data/shard.h"
#include "ferry/data/synthetic_ctr.h"
#include "ferry/mutex.h"
#include "ferry/status.h"
#include "int_arrays.h"  // ps/client/python: integer arrays for the ferry package

namespace py = pybind11;
namespace data = ferry::data;
using ferry::Status;
using ferry::StatusCode;
using ferry::StatusOr;

namespace {

// Raises the Python exception for `s` (not OK). Requires the GIL.
[[noreturn]] void Raise(const Status& s) {
  PyObject* type = PyExc_RuntimeError;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange:
      type = PyExc_ValueError;
      break;
    case StatusCode::kNotFound:
      type = PyExc_FileNotFoundError;
      break;
    case StatusCode::kDataLoss:
    case StatusCode::kUnavailable:
    case StatusCode::kPermissionDenied:
      type = PyExc_OSError;
      break;
    default:
      break;
  }
  py::object e = py::reinterpret_borrow<py::object>(type)(s.message());
  e.attr("code") = std::string(ferry::StatusCodeName(s.code()));
  PyErr_SetObject(type, e.ptr());
  throw py::error_already_set();
}

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Take(StatusOr<T>&& r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

// A numpy array of `shape` over `v`'s own memory: the vector moves into a capsule that the array
// keeps as its base and deletes with it. No element is copied.
template <typename T>
py::array_t<T> Adopt(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto owned = std::make_unique<std::vector<T>>(std::move(v));
  T* elements = owned->data();  // null for an empty vector: numpy then allocates its own (0 bytes)
  py::capsule base(owned.get(), [](void* p) { delete static_cast<std::vector<T>*>(p); });
  owned.release();  // the capsule owns it now
  return py::array_t<T>(std::move(shape), elements, base);
}

// (labels [B], dense [B, num_dense], ids [B, num_fields]), moved out of `batch`.
py::tuple BatchArrays(data::CtrBatch&& batch) {
  const py::ssize_t rows = batch.size();
  const py::ssize_t dense = batch.num_dense, fields = batch.num_fields;
  py::array_t<float> labels = Adopt(std::move(batch.labels), {rows});
  py::array_t<float> dense_values = Adopt(std::move(batch.dense), {rows, dense});
  py::array_t<int64_t> ids = Adopt(std::move(batch.ids), {rows, fields});
  return py::make_tuple(labels, dense_values, ids);
}

using FloatIn = py::array_t<float, py::array::c_style | py::array::forcecast>;

std::span<const float> FloatSpan(const FloatIn& a) { return {a.data(), static_cast<size_t>(a.size())}; }

// metric(values, labels) without the GIL (auc, log_loss); its refusal raises ValueError.
template <typename Metric>
double PairMetric(Metric metric, const FloatIn& values, const FloatIn& labels) {
  StatusOr<double> r = ferry::InternalError("not run");
  {
    py::gil_scoped_release release;
    r = metric(FloatSpan(values), FloatSpan(labels));
  }
  return Take(std::move(r));
}

data::ShardSpec Shard(int shard_index, int num_shards) {
  const data::ShardSpec shard{shard_index, num_shards};
  Check(shard.Validate());
  return shard;
}

// ---- Synthetic click-through data ----

class PySyntheticCtr {
 public:
  explicit PySyntheticCtr(const data::SyntheticCtrOptions& options) : gen_(Take(data::SyntheticCtr::Create(options))) {}

  py::tuple Generate(const py::object& indices_in) const {
    const ferry::python::Int64Array indices = ferry::python::IntegerArray(indices_in, "generate: indices");
    const std::span<const int64_t> at(indices.data(), static_cast<size_t>(indices.size()));
    return Run([&](data::CtrBatch* batch, std::vector<float>* probs) { gen_.Generate(at, batch, probs); });
  }
  py::tuple GenerateRange(int64_t first, int64_t count) const {
    if (count < 0 || first > std::numeric_limits<int64_t>::max() - count) {
      Check(ferry::InvalidArgumentError("generate_range: [" + std::to_string(first) + ", +" + std::to_string(count) +
                                        ") is not a range of int64 indices"));
    }
    return Run(
        [&](data::CtrBatch* batch, std::vector<float>* probs) { gen_.GenerateRange(first, count, batch, probs); });
  }

  int64_t FieldOffset(int field) const {
    if (field < 0 || field >= gen_.num_fields()) {
      Check(ferry::OutOfRangeError("field " + std::to_string(field) + " is not in [0, " +
                                   std::to_string(gen_.num_fields()) + ")"));
    }
    return gen_.field_offset(field);
  }
  double DenseWeight(int j) const {
    if (j < 0 || j >= gen_.num_dense()) {
      Check(ferry::OutOfRangeError("dense feature " + std::to_string(j) + " is not in [0, " +
                                   std::to_string(gen_.num_dense()) + ")"));
    }
    return gen_.dense_weight(j);
  }

  const data::SyntheticCtr& gen() const { return gen_; }

 private:
  // Runs `fill(batch, probs)` without the GIL; returns the batch's arrays and the probabilities.
  template <typename Fill>
  py::tuple Run(Fill&& fill) const {
    data::CtrBatch batch;
    std::vector<float> probs;
    {
      py::gil_scoped_release release;
      fill(&batch, &probs);
    }
    const py::ssize_t rows = batch.size();
    py::tuple arrays = BatchArrays(std::move(batch));
    return py::make_tuple(arrays[0], arrays[1], arrays[2], Adopt(std::move(probs), {rows}));
  }

  data::SyntheticCtr gen_;  // immutable
};

// ---- Criteo ----

// The files to read: a string as ExpandCriteoPaths reads it (comma-separated paths and glob
// patterns), or a list of paths taken as they are (no globbing: any file name works).
using PathList = std::variant<std::string, std::vector<std::string>>;

std::vector<std::string> ExpandPaths(const PathList& paths) {
  if (const auto* list = std::get_if<std::vector<std::string>>(&paths)) return *list;
  StatusOr<std::vector<std::string>> files = ferry::InternalError("not run");
  {
    py::gil_scoped_release release;
    files = data::ExpandCriteoPaths(std::get<std::string>(paths));
  }
  return Take(std::move(files));
}

// CriteoReader::Open for Python's arguments: the files of `paths`, this shard's part of them.
std::unique_ptr<data::CriteoReader> OpenReader(const PathList& paths, int shard_index, int num_shards,
                                               const std::string& shard_by, int64_t hash_buckets,
                                               int max_bad_line_records, int64_t read_buffer_bytes,
                                               int64_t max_line_bytes) {
  data::CriteoOptions o;
  o.shard = Shard(shard_index, num_shards);
  o.shard_by = Take(data::ParseCriteoShardBy(shard_by));
  o.hash_buckets = hash_buckets;
  o.max_bad_line_records = max_bad_line_records;
  o.read_buffer_bytes = read_buffer_bytes;
  o.max_line_bytes = max_line_bytes;
  const std::vector<std::string> files = ExpandPaths(paths);
  StatusOr<std::unique_ptr<data::CriteoReader>> reader = ferry::InternalError("not run");
  {
    py::gil_scoped_release release;
    reader = data::CriteoReader::Open(files, o);  // opens every file of the shard once
  }
  return Take(std::move(reader));
}

struct PyCriteoPass {
  int64_t pass = 0;
  data::CriteoStats stats;

  std::vector<std::string> FirstBadLines() const {
    std::vector<std::string> out;
    for (const data::CriteoBadLine& b : stats.first_bad_lines) out.push_back(b.ToString());
    return out;
  }
  std::string Repr() const {
    return "CriteoPass(pass_=" + std::to_string(pass) + ", examples=" + std::to_string(stats.examples) +
           ", bad_lines=" + std::to_string(stats.bad_lines) + ", lines=" + std::to_string(stats.lines) +
           ", bytes=" + std::to_string(stats.bytes) + ", files=" + std::to_string(stats.files) + ")";
  }
};

// One pass at a time over a shard's files: CriteoReader. Calls are serialized by a mutex, taken
// without the GIL (another thread may hold it through a whole read).
class PyCriteoReader {
 public:
  explicit PyCriteoReader(std::unique_ptr<data::CriteoReader> reader)
      : files_(reader->files()), shard_by_(data::CriteoShardByName(reader->shard_by())), reader_(std::move(reader)) {}

  py::tuple Read(int64_t n) {
    data::CtrBatch batch;
    StatusOr<int64_t> got = ferry::InternalError("not run");
    {
      py::gil_scoped_release release;
      ferry::MutexLock lock(&mu_);
      got = reader_->ReadBatch(n, &batch);
    }
    Take(std::move(got));
    return BatchArrays(std::move(batch));
  }
  void Rewind() {
    Status s;
    {
      py::gil_scoped_release release;
      ferry::MutexLock lock(&mu_);
      s = reader_->Rewind();
      if (s.ok()) ++pass_;
    }
    Check(s);
  }
  PyCriteoPass Stats() {
    py::gil_scoped_release release;
    ferry::MutexLock lock(&mu_);
    return {pass_, reader_->stats()};
  }
  const std::vector<std::string>& files() const { return files_; }
  const std::string& shard_by() const { return shard_by_; }

 private:
  const std::vector<std::string> files_;  // this shard's, in reading order
  const std::string shard_by_;            // "file" or "line", as applied
  ferry::Mutex mu_;
  int64_t pass_ ABSL_GUARDED_BY(mu_) = 0;  // rewinds so far
  std::unique_ptr<data::CriteoReader> reader_ ABSL_GUARDED_BY(mu_);
};

// Exactly n examples at a time, passing over the files again: CriteoStream. Calls are serialized
// as PyCriteoReader's are.
class PyCriteoStream {
 public:
  PyCriteoStream(std::unique_ptr<data::CriteoReader> reader, int64_t pass_limit, bool read_ahead)
      : files_(reader->files()), shard_by_(data::CriteoShardByName(reader->shard_by())) {
    if (pass_limit < 0) Check(ferry::InvalidArgumentError("pass_limit " + std::to_string(pass_limit) + " < 0"));
    stream_ = std::make_unique<data::CriteoStream>(std::move(reader), pass_limit, read_ahead);
  }

  py::tuple Next(int64_t n) {
    data::CtrBatch batch;
    Status s;
    {
      py::gil_scoped_release release;
      ferry::MutexLock lock(&mu_);
      s = stream_->Next(n, &batch);
    }
    Check(s);
    return BatchArrays(std::move(batch));
  }
  void Skip(int64_t n) {
    if (n < 0) Check(ferry::InvalidArgumentError("skip: " + std::to_string(n) + " examples < 0"));
    Status s;
    {
      py::gil_scoped_release release;
      ferry::MutexLock lock(&mu_);
      s = stream_->Skip(n);
    }
    Check(s);
  }
  int64_t Pass() {
    py::gil_scoped_release release;
    ferry::MutexLock lock(&mu_);
    return stream_->pass();
  }
  std::vector<PyCriteoPass> TakeFinishedPasses() {
    std::vector<data::CriteoPass> done;
    {
      py::gil_scoped_release release;
      ferry::MutexLock lock(&mu_);
      done = stream_->TakeFinishedPasses();
    }
    std::vector<PyCriteoPass> out;
    for (data::CriteoPass& p : done) out.push_back({p.pass, std::move(p.stats)});
    return out;
  }
  const std::vector<std::string>& files() const { return files_; }
  const std::string& shard_by() const { return shard_by_; }

 private:
  const std::vector<std::string> files_;  // this shard's, in reading order
  const std::string shard_by_;            // "file" or "line", as applied
  ferry::Mutex mu_;
  std::unique_ptr<data::CriteoStream> stream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

PYBIND11_MODULE(_data, m) {
  m.doc() =
      "Ferry's data readers (trainer/data) with numpy arrays: the synthetic click-through generator, "
      "epoch sharding, the streaming Criteo reader and the AUC / log-loss metrics. Errors: ValueError "
      "(INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE), FileNotFoundError (NOT_FOUND), OSError "
      "(DATA_LOSS, UNAVAILABLE, PERMISSION_DENIED), RuntimeError otherwise; each with the C++ message "
      "and the code's name in `code`. Returned arrays own the C++ vectors (no copy).";

  const data::SyntheticCtrOptions defaults;
  py::class_<PySyntheticCtr>(m, "SyntheticCtr",
                             "Click-through examples from a planted logistic model (ferry/data/synthetic_ctr.h): "
                             "example i is a pure function of the options and i. Immutable; thread-safe.")
      .def(py::init([](uint64_t seed, std::vector<int64_t> vocab_sizes, double zipf_exponent, int num_dense,
                       double id_weight_stddev, double dense_weight_stddev, double bias) {
             data::SyntheticCtrOptions o;
             o.seed = seed;
             o.vocab_sizes = std::move(vocab_sizes);
             o.zipf_exponent = zipf_exponent;
             o.num_dense = num_dense;
             o.id_weight_stddev = id_weight_stddev;
             o.dense_weight_stddev = dense_weight_stddev;
             o.bias = bias;
             return PySyntheticCtr(o);
           }),
           py::kw_only(), py::arg("seed") = defaults.seed, py::arg("vocab_sizes") = defaults.vocab_sizes,
           py::arg("zipf_exponent") = defaults.zipf_exponent, py::arg("num_dense") = defaults.num_dense,
           py::arg("id_weight_stddev") = defaults.id_weight_stddev,
           py::arg("dense_weight_stddev") = defaults.dense_weight_stddev, py::arg("bias") = defaults.bias,
           "The defaults are SyntheticCtrOptions' (8 fields of 10000 ids); ferry-trainer --model ctr uses "
           "vocab_sizes=[1000] * 8 (--ctr-fields, --ctr-vocab). ValueError for bad options.")
      .def("generate", &PySyntheticCtr::Generate, py::arg("indices"),
           "Examples `indices` (int64, any values), in that order: (labels float32 [B], dense float32 [B, "
           "num_dense], ids int64 [B, num_fields], true_probs float32 [B]); true_probs is each example's "
           "sigmoid(planted logit).")
      .def("generate_range", &PySyntheticCtr::GenerateRange, py::arg("first"), py::arg("count"),
           "Examples [first, first + count): as generate().")
      .def_property_readonly("num_fields", [](const PySyntheticCtr& g) { return g.gen().num_fields(); })
      .def_property_readonly("num_dense", [](const PySyntheticCtr& g) { return g.gen().num_dense(); })
      .def_property_readonly("total_vocab", [](const PySyntheticCtr& g) { return g.gen().total_vocab(); },
                             "Every id lies in [0, total_vocab).")
      .def_property_readonly("vocab_sizes", [](const PySyntheticCtr& g) { return g.gen().options().vocab_sizes; })
      .def_property_readonly("seed", [](const PySyntheticCtr& g) { return g.gen().options().seed; })
      .def_property_readonly("zipf_exponent", [](const PySyntheticCtr& g) { return g.gen().options().zipf_exponent; })
      .def("field_offset", &PySyntheticCtr::FieldOffset, py::arg("field"),
           "Field f's ids are [field_offset(f), field_offset(f) + vocab_sizes[f]). ValueError outside [0, num_fields).")
      .def_property_readonly("bias", [](const PySyntheticCtr& g) { return g.gen().bias(); },
                             "The planted model's base log-odds.")
      .def("id_weight", [](const PySyntheticCtr& g, int64_t id) { return g.gen().id_weight(id); }, py::arg("id"),
           "The planted weight of id `id`.")
      .def("dense_weight", &PySyntheticCtr::DenseWeight, py::arg("j"), "The planted weight of dense feature j.");

  m.def(
      "shard_size",
      [](int64_t num_examples, int shard_index, int num_shards) {
        return data::ShardSize(std::max<int64_t>(num_examples, 0), Shard(shard_index, num_shards));
      },
      py::arg("num_examples"), py::arg("shard_index") = 0, py::arg("num_shards") = 1,
      "How many examples shard `shard_index` of `num_shards` gets out of `num_examples` (ferry/data/shard.h).");
  m.def(
      "epoch_indices",
      [](int64_t num_examples, int shard_index, int num_shards, int64_t epoch, bool shuffle, uint64_t seed) {
        StatusOr<std::vector<int64_t>> mine = ferry::InternalError("not run");
        {
          py::gil_scoped_release release;
          mine = data::EpochIndices(num_examples, data::ShardSpec{shard_index, num_shards}, epoch, {shuffle, seed});
        }
        std::vector<int64_t> v = Take(std::move(mine));
        const py::ssize_t n = static_cast<py::ssize_t>(v.size());
        return Adopt(std::move(v), {n});
      },
      py::arg("num_examples"), py::arg("shard_index") = 0, py::arg("num_shards") = 1, py::arg("epoch") = 0,
      py::arg("shuffle") = true, py::arg("seed") = 0,
      "The example indices (int64 array) shard `shard_index` of `num_shards` visits in epoch `epoch`, in "
      "order: positions shard_index, shard_index + num_shards, ... of the epoch order, which is [0, "
      "num_examples) shuffled by (seed, epoch) (Fisher-Yates over SplitMix64; the same on every "
      "platform) or ascending when shuffle is False (ferry/data/shard.h EpochIndices). ValueError for a bad "
      "shard or num_examples < 0.");

  py::class_<PyCriteoPass>(m, "CriteoPass", "A finished pass of a CriteoStream over its shard, with its counts.")
      .def_readonly("pass_", &PyCriteoPass::pass, "0-based")
      .def_property_readonly("lines", [](const PyCriteoPass& p) { return p.stats.lines; },
                             "This shard's lines seen (examples + bad_lines).")
      .def_property_readonly("examples", [](const PyCriteoPass& p) { return p.stats.examples; })
      .def_property_readonly("bad_lines", [](const PyCriteoPass& p) { return p.stats.bad_lines; },
                             "Lines skipped as malformed.")
      .def_property_readonly("bytes", [](const PyCriteoPass& p) { return p.stats.bytes; },
                             "Bytes of text read (inflated), this shard's lines and the others'.")
      .def_property_readonly("files", [](const PyCriteoPass& p) { return p.stats.files; }, "Files opened.")
      .def_property_readonly("first_bad_lines", &PyCriteoPass::FirstBadLines,
                             "The first bad lines (max_bad_line_records of them) as 'file:line: reason'.")
      .def("__repr__", &PyCriteoPass::Repr);

  const data::CriteoOptions criteo;
  const char* open_doc =
      "paths: a string of comma-separated paths and glob patterns (globs sorted with their numbers in order, "
      "a file named twice read once), or a list of paths read as they are. shard_by: 'file' (file i is "
      "shard i % num_shards's), 'line' (line k of every file is shard k % num_shards's) or 'auto' (by file "
      "when there are at least as many files as shards). hash_buckets: 0 for 63-bit ids, else field f's ids "
      "are [f * hash_buckets, (f + 1) * hash_buckets). Every file of the shard is opened here: "
      "FileNotFoundError naming a missing one; ValueError for bad options or no file for this shard.";
  py::class_<PyCriteoReader>(m, "CriteoReader",
                             "One pass at a time over a shard of Criteo TSV files (plain or gzipped; "
                             "ferry/data/criteo.h).")
      .def(py::init([](const PathList& paths, int shard_index, int num_shards, const std::string& shard_by,
                       int64_t hash_buckets, int max_bad_line_records, int64_t read_buffer_bytes,
                       int64_t max_line_bytes) {
             return std::make_unique<PyCriteoReader>(OpenReader(paths, shard_index, num_shards, shard_by, hash_buckets,
                                                                max_bad_line_records, read_buffer_bytes,
                                                                max_line_bytes));
           }),
           py::arg("paths"), py::arg("shard_index") = 0, py::arg("num_shards") = 1, py::arg("shard_by") = "auto",
           py::arg("hash_buckets") = 0, py::arg("max_bad_line_records") = criteo.max_bad_line_records,
           py::arg("read_buffer_bytes") = criteo.read_buffer_bytes, py::arg("max_line_bytes") = criteo.max_line_bytes,
           open_doc)
      .def("read", &PyCriteoReader::Read, py::arg("n"),
           "Up to n (>= 1) further examples of this pass: (labels float32 [k], dense float32 [k, 13], ids int64 "
           "[k, 26]); k < n only at the end of the pass, 0 once it is over. Bad lines are skipped and counted. "
           "OSError for a read error (a corrupt or truncated gzip: DATA_LOSS), after which the reader stays failed.")
      .def("rewind", &PyCriteoReader::Rewind, "Back to the first line for another pass; resets the stats.")
      .def_property_readonly("stats", &PyCriteoReader::Stats, "The current pass's counts so far (a CriteoPass).")
      .def_property_readonly("files", &PyCriteoReader::files, "This shard's files, in reading order.")
      .def_property_readonly("shard_by", &PyCriteoReader::shard_by, "'file' or 'line', as applied.");

  py::class_<PyCriteoStream>(
      m, "CriteoStream",
      "Exactly n examples at a time from a shard of Criteo TSV files, passing over them again at their end "
      "(ferry/data/criteo.h CriteoStream: ferry-trainer's --criteo-train source).")
      .def(py::init([](const PathList& paths, int shard_index, int num_shards, const std::string& shard_by,
                       int64_t hash_buckets, bool read_ahead, int64_t pass_limit, int max_bad_line_records,
                       int64_t read_buffer_bytes, int64_t max_line_bytes) {
             return std::make_unique<PyCriteoStream>(OpenReader(paths, shard_index, num_shards, shard_by, hash_buckets,
                                                                max_bad_line_records, read_buffer_bytes,
                                                                max_line_bytes),
                                                     pass_limit, read_ahead);
           }),
           py::arg("paths"), py::arg("shard_index") = 0, py::arg("num_shards") = 1, py::arg("shard_by") = "auto",
           py::arg("hash_buckets") = 0, py::arg("read_ahead") = true, py::arg("pass_limit") = 0,
           py::arg("max_bad_line_records") = criteo.max_bad_line_records,
           py::arg("read_buffer_bytes") = criteo.read_buffer_bytes, py::arg("max_line_bytes") = criteo.max_line_bytes,
           (std::string(open_doc) +
            " pass_limit > 0 ends a pass after that many examples (--train-limit). read_ahead: once next(n) has "
            "handed out a batch, the next n examples are parsed on a thread of the stream's while the caller "
            "uses it (the same examples, order and errors as without).")
               .c_str())
      .def("next", &PyCriteoStream::Next, py::arg("n"),
           "The next n (>= 1) examples (a batch may span two passes): (labels float32 [n], dense float32 [n, "
           "13], ids int64 [n, 26]). OSError for a read error (a corrupt gzip: DATA_LOSS); ValueError when a "
           "whole pass yields no example (naming the first bad lines). After an error the stream stays failed.")
      .def("skip", &PyCriteoStream::Skip, py::arg("n"), "Reads past the next n examples (parsed, not kept).")
      .def_property_readonly("pass_", &PyCriteoStream::Pass,
                             "The pass the last example handed out came from (0-based; 0 before any).")
      .def("take_finished_passes", &PyCriteoStream::TakeFinishedPasses,
           "The passes finished since the last call, oldest first ([CriteoPass]): those the examples handed "
           "out have crossed (a pass is reported with the first example after it).")
      .def_property_readonly("files", &PyCriteoStream::files, "This shard's files, in reading order.")
      .def_property_readonly("shard_by", &PyCriteoStream::shard_by, "'file' or 'line', as applied.");

  m.def("expand_criteo_paths", &ExpandPaths, py::arg("paths"),
        "The files `paths` names, as CriteoReader and CriteoStream read them: a string's comma-separated "
        "paths and glob patterns expanded (FileNotFoundError naming an entry that matches nothing), a list "
        "as it is.");
  m.def(
      "criteo_field_id",
      [](int field, const std::string& value, int64_t hash_buckets) {
        if (field < 0 || hash_buckets < 0 ||
            (hash_buckets > 0 && field + 1 > std::numeric_limits<int64_t>::max() / hash_buckets)) {
          Check(ferry::InvalidArgumentError("criteo_field_id: field " + std::to_string(field) + " with " +
                                            std::to_string(hash_buckets) + " buckets"));
        }
        return data::CriteoFieldId(field, value, hash_buckets);
      },
      py::arg("field"), py::arg("value"), py::arg("hash_buckets") = 0,
      "The id of categorical value `value` (the hex text, '' for missing) in field `field` (0-based: C1 is 0), "
      "as the reader computes it (ferry/data/criteo.h).");

  m.def(
      "auc",
      [](const FloatIn& scores, const FloatIn& labels) { return PairMetric(data::ExactAuc, scores, labels); },
      py::arg("scores"), py::arg("labels"),
      "Exact ROC AUC (ties count one half). labels are 0/1. ValueError for mismatched lengths, a NaN score, a "
      "label not 0/1, or labels without both classes.");
  m.def(
      "log_loss",
      [](const FloatIn& probs, const FloatIn& labels) { return PairMetric(data::LogLoss, probs, labels); },
      py::arg("probs"), py::arg("labels"),
      "Mean binary cross-entropy in nats, p clipped to [1e-7, 1 - 1e-7]. ValueError for mismatched lengths, "
      "bad values or empty input.");
}
