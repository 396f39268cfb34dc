#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "ferry/cluster.h"
#include "ferry/nearest.h"
#include "ferry/trainer/model_registry.h"
#include "ferry/trainer/options.h"
#include "internal/option_parsing.h"

// ferry-trainer's flags: one table (kFlags) from which ParseTrainerFlags, TrainerUsage (--help)
// and the unknown-flag hint come. The value parsers they share with --table are option_parsing.h's.
namespace ferry::trainer {
namespace {

// "R:50ms" or "R:x2".
Status ParseStraggler(std::string_view value, TrainerOptions* o) {
  const size_t colon = value.find(':');
  if (colon == std::string_view::npos) {
    return InvalidArgumentError("--straggler: '" + std::string(value) + "' is not RANK:DELAY (e.g. 1:50ms or 1:x2)");
  }
  int64_t rank = 0;
  FERRY_RETURN_IF_ERROR(ParseInt("--straggler rank", value.substr(0, colon), 0, 1 << 20, &rank));
  std::string_view d = value.substr(colon + 1);
  o->straggler_rank = static_cast<int>(rank);
  if (!d.empty() && d[0] == 'x') {
    FERRY_RETURN_IF_ERROR(ParseDouble("--straggler factor", d.substr(1), &o->straggler_factor));
    if (o->straggler_factor < 1)
      return InvalidArgumentError("--straggler: the factor x" + std::string(d.substr(1)) + " must be >= 1");
  } else if (d.size() > 2 && d.substr(d.size() - 2) == "ms") {
    FERRY_RETURN_IF_ERROR(ParseDouble("--straggler delay", d.substr(0, d.size() - 2), &o->straggler_delay_ms));
    if (o->straggler_delay_ms < 0) return InvalidArgumentError("--straggler: a negative delay");
  } else {
    return InvalidArgumentError("--straggler: delay '" + std::string(d) + "' is neither like 50ms nor like x2");
  }
  return Status::Ok();
}

// "STEP:drain=K", "STEP:join=K" or "STEP:first", comma-separated, steps increasing.
Status ParseMoveSlots(std::string_view value, TrainerOptions* o) {
  o->move_slots.clear();
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view one = value.substr(0, comma);
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    const size_t colon = one.find(':');
    if (colon == std::string_view::npos || (comma != std::string_view::npos && value.empty())) {
      return InvalidArgumentError("--move-slots: '" + std::string(one) +
                                  "' is not STEP:drain=K, STEP:join=K or STEP:first" +
                                  (colon == std::string_view::npos ? "" : " (a comma with nothing after it)"));
    }
    TrainerOptions::SlotMove move;
    FERRY_RETURN_IF_ERROR(ParseInt("--move-slots step", one.substr(0, colon), 0, INT64_MAX / 2, &move.step));
    const std::string_view to = one.substr(colon + 1);
    if (to.starts_with("drain=")) {
      int64_t rank = 0;
      FERRY_RETURN_IF_ERROR(ParseInt("--move-slots server", to.substr(6), 0, 65535, &rank));
      move.drain = static_cast<int>(rank);
    } else if (to.starts_with("join=")) {
      int64_t rank = 0;
      FERRY_RETURN_IF_ERROR(ParseInt("--move-slots server", to.substr(5), 0, 65535, &rank));
      move.join = static_cast<int>(rank);
    } else if (to != "first") {
      return InvalidArgumentError("--move-slots: '" + std::string(to) + "' is none of drain=K, join=K and first");
    }
    if (!o->move_slots.empty() && move.step <= o->move_slots.back().step) {
      return InvalidArgumentError("--move-slots: step " + std::to_string(move.step) + " after step " +
                                  std::to_string(o->move_slots.back().step) + " (one move a step, in step order)");
    }
    o->move_slots.push_back(move);
  }
  if (o->move_slots.empty()) return InvalidArgumentError("--move-slots: no move given");
  return Status::Ok();
}

// --leave / --join: WORKER@STEP[,...] into `out` (each worker once).
Status ParseWorkerSteps(std::string_view flag, std::string_view value, std::vector<TrainerOptions::WorkerAt>* out) {
  const std::string f(flag);
  out->clear();
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view one = value.substr(0, comma);
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    const size_t at = one.find('@');
    if (at == std::string_view::npos || (comma != std::string_view::npos && value.empty())) {
      return InvalidArgumentError(f + ": '" + std::string(one) + "' is not WORKER@STEP" +
                                  (at == std::string_view::npos ? "" : " (a comma with nothing after it)"));
    }
    TrainerOptions::WorkerAt w;
    int64_t rank = 0;
    FERRY_RETURN_IF_ERROR(ParseInt(f + " worker", one.substr(0, at), 0, 65535, &rank));
    w.rank = static_cast<int>(rank);
    FERRY_RETURN_IF_ERROR(ParseInt(f + " step", one.substr(at + 1), 1, INT64_MAX / 2, &w.step));
    for (const TrainerOptions::WorkerAt& seen : *out) {
      if (seen.rank == w.rank) return InvalidArgumentError(f + ": worker " + std::to_string(w.rank) + " given twice");
    }
    out->push_back(w);
  }
  if (out->empty()) return InvalidArgumentError(f + ": no worker given");
  return Status::Ok();
}

// ---- The flags: one row each (name, value, group, help; the setter holds the type and range;
// the default is TrainerOptions'). Parsing, --help and the unknown-flag hint come from here. ----

// Sets a flag's value (a switch gets "").
using FlagSetter = Status (*)(TrainerOptions& o, std::string_view flag, std::string_view value);
// A flag's default as --help shows it (from a default TrainerOptions).
using FlagShow = std::string (*)(const TrainerOptions& o);

struct Flag {
  std::string_view name;   // "--batch"
  std::string_view arg;    // its value in --help ("B"); "" for a switch, which takes none
  std::string_view group;  // the --help section
  std::string_view help;
  FlagSetter set;
  FlagShow show;           // nullptr: no default shown
  std::string_view model;  // the model it belongs to ("": every model); another model's is refused

  Flag(std::string_view name, std::string_view arg, std::string_view group, std::string_view help, FlagSetter set,
       FlagShow show = nullptr, std::string_view model = {})
      : name(name), arg(arg), group(group), help(help), set(set), show(show), model(model) {}
};

// A flag's field: a member of TrainerOptions, or of a model's options (options.h). The parser
// refuses a model's flag in another model's run before it sets anything (ParseTrainerFlags).
template <typename T>
struct MemberOf;
template <typename C, typename T>
struct MemberOf<T C::*> {
  using Class = C;
  using Type = T;
};
template <auto M>
using FieldType = typename MemberOf<decltype(M)>::Type;

template <auto M>
StatusOr<FieldType<M>*> Field(TrainerOptions& o, std::string_view flag) {
  using C = typename MemberOf<decltype(M)>::Class;
  if constexpr (std::is_same_v<C, TrainerOptions>) {
    return &(o.*M);
  } else {
    C* part = std::get_if<C>(&o.model_options);
    if (part == nullptr) return InternalError(std::string(flag) + " is another model's flag than --model " + o.model);
    return &(part->*M);
  }
}

template <auto M, int64_t Lo, int64_t Hi>
Status Int(TrainerOptions& o, std::string_view flag, std::string_view value) {
  int64_t n = 0;
  FERRY_RETURN_IF_ERROR(ParseInt(flag, value, Lo, Hi, &n));
  FERRY_ASSIGN_OR_RETURN(FieldType<M> * field, Field<M>(o, flag));
  *field = static_cast<FieldType<M>>(n);
  return Status::Ok();
}

// A number in [Lo, Hi] ((Lo, Hi] with LoOpen; Hi kNoBound: none), checked after parsing. The
// bounds are whole numbers: clang 14 takes no floating-point template arguments.
constexpr int64_t kNoBound = INT64_MAX;
template <auto M, int64_t Lo, int64_t Hi, bool LoOpen = false>
Status Real(TrainerOptions& o, std::string_view flag, std::string_view value) {
  double x = 0;
  FERRY_RETURN_IF_ERROR(ParseDouble(flag, value, &x));
  const double lo = static_cast<double>(Lo), hi = static_cast<double>(Hi);
  if ((LoOpen ? x <= lo : x < lo) || (Hi != kNoBound && x > hi)) {
    std::ostringstream os;
    os << flag << " must be ";
    if (Hi == kNoBound) {
      os << (LoOpen ? "> " : ">= ") << Lo;
    } else {
      os << "in " << (LoOpen ? "(" : "[") << Lo << ", " << Hi << "]";
    }
    os << ", got " << x;
    return InvalidArgumentError(os.str());
  }
  FERRY_ASSIGN_OR_RETURN(FieldType<M> * field, Field<M>(o, flag));
  *field = static_cast<FieldType<M>>(x);
  return Status::Ok();
}

template <auto M>
Status Text(TrainerOptions& o, std::string_view flag, std::string_view value) {
  if (value.empty()) return InvalidArgumentError(std::string(flag) + ": empty");
  FERRY_ASSIGN_OR_RETURN(std::string * field, Field<M>(o, flag));
  *field = std::string(value);
  return Status::Ok();
}

template <auto M, bool V>
Status Switch(TrainerOptions& o, std::string_view flag, std::string_view) {
  FERRY_ASSIGN_OR_RETURN(bool* field, Field<M>(o, flag));
  *field = V;
  return Status::Ok();
}

// The default: `o`'s, or (a model's field) that of the model's options as SetModel makes them.
template <auto M>
std::string Show(const TrainerOptions& o) {
  using C = typename MemberOf<decltype(M)>::Class;
  std::ostringstream os;
  if constexpr (std::is_same_v<C, TrainerOptions>) {
    os << o.*M;
  } else {
    os << C{}.*M;
  }
  return os.str();
}

// One of `names` (each row: the text, the value): "--device: 'gpu' is not cuda, cpu or auto".
template <typename T, size_t N>
Status Choice(std::string_view flag, std::string_view value, const std::pair<std::string_view, T> (&names)[N], T* out) {
  std::string list;
  for (size_t i = 0; i < N; ++i) {
    if (value == names[i].first) {
      *out = names[i].second;
      return Status::Ok();
    }
    list += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(names[i].first);
  }
  return InvalidArgumentError(std::string(flag) + ": '" + std::string(value) + "' is not " + list);
}

constexpr std::pair<std::string_view, DeviceKind> kDevices[] = {
    {"cuda", DeviceKind::kCuda}, {"cpu", DeviceKind::kCpu}, {"auto", DeviceKind::kAuto}};
constexpr std::pair<std::string_view, Pipeline> kPipelines[] = {
    {"none", Pipeline::kNone}, {"exchange", Pipeline::kExchange}, {"prefetch", Pipeline::kPrefetch}};

Status SetServers(TrainerOptions& o, std::string_view, std::string_view value) {
  o.servers.clear();
  for (std::string_view s : SplitComma(value)) {
    if (s.empty()) return InvalidArgumentError("--servers: empty endpoint in '" + std::string(value) + "'");
    if (s.find("://") == std::string_view::npos) {
      return InvalidArgumentError("--servers: '" + std::string(s) + "' is not an endpoint like tcp://host:port");
    }
    o.servers.emplace_back(s);
  }
  if (o.servers.empty()) return InvalidArgumentError("--servers: no endpoint given");
  return Status::Ok();
}

Status SetHidden(TrainerOptions& o, std::string_view, std::string_view value) {
  o.hidden.clear();
  for (std::string_view s : SplitComma(value)) {
    int64_t n = 0;
    FERRY_RETURN_IF_ERROR(ParseInt("--hidden", s, 1, 1 << 20, &n));
    o.hidden.push_back(n);
  }
  return Status::Ok();
}

Status SetOptimizer(TrainerOptions& o, std::string_view, std::string_view value) {
  return ParseOptimizerType(value, &o.optimizer.type).WithContext("--optimizer");
}

Status SetConsistency(TrainerOptions& o, std::string_view, std::string_view value) {
  return ParseConsistency(value, &o.consistency, &o.staleness).WithContext("--consistency");
}

Status SetTable(TrainerOptions& o, std::string_view, std::string_view value) {
  FERRY_ASSIGN_OR_RETURN(TableOverride t, ParseTableOverride(value));
  o.tables.push_back(std::move(t));
  return Status::Ok();
}

Status SetCriteoShard(TrainerOptions& o, std::string_view, std::string_view value) {
  auto by = data::ParseCriteoShardBy(value);
  if (!by.ok()) return InvalidArgumentError("--criteo-shard: " + by.status().message());
  o.ctr().criteo_shard = *by;
  return Status::Ok();
}

// --model is read before the other flags (ParseTrainerFlags: the last one wins), so that a
// model's flags find its options whichever comes first; here it is only checked.
Status SetModelFlag(TrainerOptions&, std::string_view flag, std::string_view value) {
  if (value.empty()) return InvalidArgumentError(std::string(flag) + ": empty");
  return Status::Ok();
}

Status SetEvalEvery(TrainerOptions& o, std::string_view flag, std::string_view value) {
  o.eval_each_epoch = value == "epoch";
  o.eval_every = 0;  // the last --eval-every wins
  if (!o.eval_each_epoch && !ParseInt(flag, value, 0, INT64_MAX, &o.eval_every).ok()) {
    return InvalidArgumentError("--eval-every: '" + std::string(value) + "' is neither a step count >= 0 nor 'epoch'");
  }
  return Status::Ok();
}

Status SetMetricsBind(TrainerOptions& o, std::string_view, std::string_view value) {
  if (value.empty()) return InvalidArgumentError("--metrics: empty; want [HOST:]PORT (0: a free port)");
  o.metrics_bind = std::string(value);
  return Status::Ok();
}

Status SetStraggler(TrainerOptions& o, std::string_view, std::string_view value) { return ParseStraggler(value, &o); }
Status SetMoveSlots(TrainerOptions& o, std::string_view, std::string_view value) { return ParseMoveSlots(value, &o); }
Status SetLeave(TrainerOptions& o, std::string_view flag, std::string_view value) {
  return ParseWorkerSteps(flag, value, &o.leave);
}
Status SetJoin(TrainerOptions& o, std::string_view flag, std::string_view value) {
  return ParseWorkerSteps(flag, value, &o.join);
}

Status SetDevice(TrainerOptions& o, std::string_view flag, std::string_view value) {
  return Choice(flag, value, kDevices, &o.device);
}

Status SetPipeline(TrainerOptions& o, std::string_view flag, std::string_view value) {
  return Choice(flag, value, kPipelines, &o.pipeline);
}

Status SetLr(TrainerOptions& o, std::string_view flag, std::string_view value) {
  return ParseFloat(flag, value, &o.optimizer.learning_rate);  // Validate: > 0
}

std::string ShowLr(const TrainerOptions& o) {
  std::ostringstream os;
  os << o.optimizer.learning_rate;
  return os.str();
}
std::string ShowOptimizer(const TrainerOptions& o) { return std::string(OptimizerName(o.optimizer.type)); }
std::string ShowConsistency(const TrainerOptions& o) { return std::string(ConsistencyName(o.consistency)); }
template <typename T, size_t N>
std::string NameOf(T v, const std::pair<std::string_view, T> (&names)[N]) {
  for (const auto& [name, value] : names) {
    if (value == v) return std::string(name);
  }
  return "?";
}
std::string ShowDevice(const TrainerOptions& o) { return NameOf(o.device, kDevices); }
std::string ShowPipeline(const TrainerOptions& o) { return NameOf(o.pipeline, kPipelines); }
std::string ShowHidden(const TrainerOptions& o) {
  std::string s;
  for (int64_t h : o.hidden) {
    if (!s.empty()) s += ',';
    s += std::to_string(h);
  }
  return s;
}

using O = TrainerOptions;
using Mlp = MlpModelOptions;
using Ctr = CtrModelOptions;
constexpr int64_t kMaxCount = int64_t{1} << 34;

const Flag kFlags[] = {
    {"--servers", "LIST", "cluster",
     "the servers, tcp://h:p,tcp://h:p in rank order (required unless --local); "
     "without --servers, --rank and --num-workers, from TF_CONFIG if set (ps = servers; chief, then workers = ranks)",
     SetServers},
    {"--rank", "R", "cluster", "this worker's rank, in [0, --num-workers)", Int<&O::rank, 0, 1 << 20>, Show<&O::rank>},
    {"--num-workers", "M", "cluster", "workers in the job", Int<&O::num_workers, 1, 1 << 20>, Show<&O::num_workers>},
    {"--incarnation", "N", "cluster",
     "which start of this worker rank this process is: 0, then one more at each restart (ferry-launch "
     "passes it); the servers give the rank to the highest at once and refuse earlier ones",
     Int<&O::incarnation, 0, UINT32_MAX>, Show<&O::incarnation>},
    {"--local", "", "cluster", "one process, no servers: the optimizer runs in the trainer", Switch<&O::local, true>},
    {"--connect-timeout-s", "S", "cluster",
     "how long to wait for every server's answer at the start; a wait longer "
     "than 5 s (this one, or a step's) is reported every 5 s on stderr",
     Real<&O::connect_timeout_s, 0, 86400, true>, Show<&O::connect_timeout_s>},
    {"--device", "cuda|cpu|auto", "device", "where the model computes (auto: cuda if there is a GPU)", SetDevice,
     ShowDevice},
    {"--gpu", "N", "device", "the CUDA device ordinal", Int<&O::gpu, 0, 1023>, Show<&O::gpu>},
    {"--model", "NAME", "model", "@MODELS@", SetModelFlag, Show<&O::model>},
    {"--hidden", "LIST", "model", "hidden layer widths, comma-separated", SetHidden, ShowHidden},
    {"--seed", "S", "model", "parameter initialisation and data shuffle", Int<&O::seed, 0, INT64_MAX>, Show<&O::seed>},
    {"--emb-dim", "E", "model", "floats per embedding row", Int<&Ctr::emb_dim, 1, 4096>, Show<&Ctr::emb_dim>, "ctr"},
    {"--optimizer", "NAME", "optimizer", "the servers' optimizer for every table: @OPTIMIZERS@", SetOptimizer,
     ShowOptimizer},
    {"--lr", "X", "optimizer", "learning rate (> 0)", SetLr, ShowLr},
    {"--consistency", "sync|async|ssp:S", "optimizer", "how workers' steps meet (README, Consistency modes)",
     SetConsistency, ShowConsistency},
    {"--backup-workers", "K", "optimizer", "sync: each step closes with the first M - K workers' gradients",
     Int<&O::backup_workers, 0, 1 << 20>, Show<&O::backup_workers>},
    {"--accumulate", "K", "optimizer", "micro-batches of --batch per push (1: push every one)",
     Int<&O::accumulate, 1, 1 << 16>, Show<&O::accumulate>},
    {"--table", "PATTERN:key=value,...", "optimizer",
     "(repeatable) per-table settings over the above, for the "
     "tables matching PATTERN (fnmatch); keys: @KEYS@ (wire: f32|fp16|bf16, how values travel; topk, dense: the "
     "share of each chunk pushed); e.g. --table 'ctr/emb*:consistency=async,optimizer=ftrl,lr=0.05,l1=0.1' or "
     "--table 'mlp/*:wire=fp16,topk=0.01'",
     SetTable},
    {"--blas-threads", "N", "optimizer", "CPU GEMM threads (0: OpenBLAS's own); recorded: results repeat for one N",
     Int<&O::blas_threads, 0, 1024>, Show<&O::blas_threads>},
    {"--pipeline", "none|exchange|prefetch", "optimizer",
     "exchange: push the dense gradients and pull the next "
     "step's parameters in one round trip that travels while the next batch loads; prefetch (async / ssp only): "
     "use those parameters a step later, so the round trip overlaps a whole step's compute (one step more of "
     "staleness)",
     SetPipeline, ShowPipeline},
    {"--push-by-layer", "", "optimizer",
     "with exchange or prefetch, send the layers' gradients (and pull their "
     "next parameters) as backward yields them, while it computes the layers below (layers under 64 KiB go with "
     "the next); it pays when compute leaves a core free",
     Switch<&O::push_by_layer, true>},
    {"--batch", "B", "data", "examples per worker per step", Int<&O::batch, 1, 1 << 24>, Show<&O::batch>},
    {"--epochs", "E", "data", "passes over the training data (unless --steps)", Int<&O::epochs, 1, 1 << 20>,
     Show<&O::epochs>},
    {"--steps", "N", "data", "steps per worker, instead of --epochs", Int<&O::steps, 1, INT64_MAX / 2>},
    {"--no-shuffle", "", "data", "keep the examples' order", Switch<&O::shuffle, false>},
    {"--train-limit", "N", "data", "use the first N training examples (0: all)", Int<&O::train_limit, 0, INT64_MAX>,
     Show<&O::train_limit>},
    {"--test-limit", "N", "data", "evaluate on the first N test examples (0: all)", Int<&O::test_limit, 0, INT64_MAX>,
     Show<&O::test_limit>},
    {"--data-dir", "DIR", "data", "the Fashion-MNIST folder", Text<&Mlp::data_dir>, Show<&Mlp::data_dir>, "mlp"},
    {"--ctr-train", "N", "data", "synthetic: training examples", Int<&Ctr::train, 1, kMaxCount>, Show<&Ctr::train>,
     "ctr"},
    {"--ctr-test", "N", "data", "synthetic: test examples", Int<&Ctr::test, 0, kMaxCount>, Show<&Ctr::test>, "ctr"},
    {"--ctr-fields", "F", "data", "synthetic: categorical fields", Int<&Ctr::fields, 1, 1024>, Show<&Ctr::fields>,
     "ctr"},
    {"--ctr-vocab", "V", "data", "synthetic: ids per field", Int<&Ctr::vocab, 1, int64_t{1} << 40>, Show<&Ctr::vocab>,
     "ctr"},
    {"--ctr-dense", "D", "data", "synthetic: dense features", Int<&Ctr::dense, 0, 4096>, Show<&Ctr::dense>, "ctr"},
    {"--ctr-zipf", "S", "data", "synthetic: the ids' Zipf exponent", Real<&Ctr::zipf, 0, kNoBound, true>,
     Show<&Ctr::zipf>, "ctr"},
    {"--data-seed", "S", "data", "synthetic: the data and its planted model", Int<&Ctr::data_seed, 0, INT64_MAX>,
     Show<&Ctr::data_seed>, "ctr"},
    {"--criteo-train", "LIST", "data",
     "Criteo TSV files (plain or .gz) and globs, comma-separated, e.g. "
     "'day_*.gz'; training streams them and needs --steps",
     Text<&Ctr::criteo_train>, nullptr, "ctr"},
    {"--criteo-test", "LIST", "data", "the Criteo test files", Text<&Ctr::criteo_test>, nullptr, "ctr"},
    {"--audit-examples", "", "data",
     "count every example trained on in the sparse table ctr/audit (async, ssp, --local), to check that a resumed "
     "job neither repeats nor skips one",
     Switch<&Ctr::audit_examples, true>, nullptr, "ctr"},
    {"--criteo-shard", "auto|file|line", "data",
     "how workers split the Criteo files (auto: by file when there are "
     "at least as many as workers)",
     SetCriteoShard, nullptr, "ctr"},
    {"--log-every", "N", "report", "a progress line every N steps (0: none)", Int<&O::log_every, 0, INT64_MAX>,
     Show<&O::log_every>},
    {"--eval-every", "N|epoch", "report", "evaluate every N steps or every epoch (0: at the end only)", SetEvalEvery,
     Show<&O::eval_every>},
    {"--metrics-out", "FILE", "report", "JSON lines of metrics ({rank}: the rank)", Text<&O::metrics_out>},
    {"--metrics", "[HOST:]PORT", "report",
     "serve step, examples, loss and time per part for Prometheus at "
     "http://HOST:PORT/metrics (PORT 0 picks a free one; a line at the start says where); plain HTTP: bind it to "
     "loopback or a trusted network",
     SetMetricsBind},
    {"--quiet", "", "report", "no progress lines", Switch<&O::quiet, true>},
    {"--checkpoint-every", "N", "recovery",
     "worker 0 asks the servers for a checkpoint every N steps (0: never; "
     "the servers need a checkpoint folder)",
     Int<&O::checkpoint_every, 0, INT64_MAX / 2>, Show<&O::checkpoint_every>},
    {"--checkpoint-every-s", "S", "recovery",
     "the same every S seconds and at the job's end (0: never; SIGUSR1 to "
     "worker 0: one now)",
     Real<&O::checkpoint_every_s, 0, kNoBound>, Show<&O::checkpoint_every_s>},
    {"--max-checkpoint-failures", "N", "recovery",
     "after N checkpoints in a row fail, worker 0 stops the job with the cause (0: it warns "
     "and trains on)",
     Int<&O::max_checkpoint_failures, 0, INT64_MAX / 2>, Show<&O::max_checkpoint_failures>},
    {"--resume", "", "recovery",
     "continue the job the servers hold, at their step (servers started from a "
     "checkpoint, or a restarted worker)",
     Switch<&O::resume, true>},
    {"--move-slots", "STEP:drain=K|STEP:join=K|STEP:first[,...]", "recovery",
     "at STEP every worker waits while worker 0 checkpoints and moves the servers' slots: drain=K "
     "empties server K into the others, join=K gives server K (one that owns no slot: drained, or "
     "left out of the servers' first map) a fair share, first gives every server its share of a "
     "first map of them all (the servers need a checkpoint folder)",
     SetMoveSlots},
    {"--move-asks-every", "N", "recovery",
     "every N steps every worker meets at a barrier to take a move asked of server 0 while the job "
     "runs (the ferry-move tool: join=K or drain=K), and makes it there as a --move-slots move of "
     "that step (0: no asks taken; the servers need a checkpoint folder; a worker restarted at such "
     "a step makes the others restart too, as at a --move-slots step: keep N well above 1); or a "
     "worker's leave asked (leave-worker=W), taken as --leave W@STEP+1",
     Int<&O::move_asks_every, 0, INT64_MAX / 2>, Show<&O::move_asks_every>},
    {"--max-asked-leaves", "N", "recovery",
     "with --move-asks-every, at most N workers may be asked to leave while the job runs (the "
     "batch buffers hold N more absent workers' shares of a step); a leave past it is said and not "
     "made",
     Int<&O::max_asked_leaves, 0, 65535>, Show<&O::max_asked_leaves>},
    {"--rejoin", "", "recovery",
     "with --resume: this is a new process of a worker that left the job (--leave, or a leave "
     "asked); it asks server 0 to take it back, and joins at the step after the job's next move "
     "check (--move-asks-every, as the others'); the servers refuse it for a worker that has not left",
     Switch<&O::rejoin, true>},
    {"--leave", "WORKER@STEP[,...]", "recovery",
     "worker WORKER leaves the job before step STEP and exits; the others train on without it, "
     "splitting its share of each step's examples among them (sync; give every worker the same "
     "list)",
     SetLeave},
    {"--join", "WORKER@STEP[,...]", "recovery",
     "worker WORKER takes part in the job's steps from STEP on (it starts with the others and "
     "meets them at barriers and evaluations); until then the others read its share of each "
     "step's examples (sync; give every worker the same list)",
     SetJoin},
    {"--curve-keys", "DIR", "security",
     "the job's CURVE key folder from ferry-keys (reads server.pub and "
     "worker-R.key; needed when the servers run with --curve-keys)",
     Text<&O::curve_keys>},
    {"--straggler", "R:50ms|R:x2", "experiment", "slow worker R down by a delay or a factor per step", SetStraggler},
    {"--help", "", "", "this text", Switch<&O::help, true>},
};

const std::vector<std::string_view>& AllFlags() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> n;
    for (const Flag& f : kFlags) n.push_back(f.name);
    return n;
  }();
  return names;
}

const Flag* FindFlag(std::string_view name) {
  for (const Flag& f : kFlags) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// `text` wrapped to 100 columns, starting at column `indent`, each later line indented by as much.
std::string Wrap(std::string_view text, size_t indent) {
  std::string out;
  size_t column = indent;
  while (!text.empty()) {
    const size_t space = text.find(' ');
    const std::string_view word = text.substr(0, space);
    if (!out.empty() && column + 1 + word.size() > 100) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
    } else if (!out.empty()) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    text = space == std::string_view::npos ? std::string_view() : text.substr(space + 1);
  }
  return out;
}

}  // namespace

std::string TrainerUsage() {
  // The lists a help text names, from their catalogues.
  std::string models;
  for (const ModelInfo& m : Models())
    models += (models.empty() ? "" : "; ") + std::string(m.name) + ": " + std::string(m.summary);
  const std::pair<std::string_view, std::string> lists[] = {{"@KEYS@", JoinNames(TableKeys())},
                                                            {"@OPTIMIZERS@", JoinNames(OptimizerNames())},
                                                            {"@MODELS@", models}};
  std::string usage =
      "usage: ferry-trainer [flags]   (a value follows its flag, or an '=': --batch 64, --batch=64)\n";
  std::string_view group = "-", model;
  for (const Flag& f : kFlags) {
    if (f.group != group || f.model != model) {
      group = f.group;
      model = f.model;
      usage += '\n';
      usage += group.empty() ? std::string_view("other") : group;
      if (!model.empty()) usage.append(", --model ").append(model).append(" only");
      usage += ":\n";
    }
    std::string head = "  " + std::string(f.name);
    if (!f.arg.empty()) head.append(" ").append(f.arg);
    std::string help(f.help);
    for (const auto& [mark, list] : lists) {
      if (const size_t at = help.find(mark); at != std::string::npos) help.replace(at, mark.size(), list);
    }
    if (f.show) {
      const std::string d = f.show(TrainerOptions());
      if (!d.empty()) help += " (default\x01" + d + ")";  // \x01: a space Wrap does not break at
    }
    constexpr size_t kHelpColumn = 28;
    if (head.size() + 2 > kHelpColumn) {
      usage += head + "\n" + std::string(kHelpColumn, ' ');
    } else {
      usage += head + std::string(kHelpColumn - head.size(), ' ');
    }
    std::string wrapped = Wrap(help, kHelpColumn);
    std::replace(wrapped.begin(), wrapped.end(), '\x01', ' ');
    usage += wrapped + "\n";
  }
  return usage;
}

StatusOr<TrainerOptions> ParseTrainerFlags(int argc, const char* const* argv, const char* tf_config) {
  TrainerOptions o;
  // The model first (the last --model wins), so that its options are there for its flags.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--model" && i + 1 < argc) o.SetModel(argv[++i]);
    if (arg.starts_with("--model=")) o.SetModel(arg.substr(8));
    if (arg == "--help") o.help = true;
  }
  // A model's flag in another model's run is refused; with an unknown model (Validate refuses
  // it) or --help, skipped.
  const bool known_model = FindModel(o.model) != nullptr;
  bool saw_rank = false, saw_workers = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.substr(0, 2) != "--") return InvalidArgumentError("unexpected argument '" + std::string(arg) + "'");
    std::string_view name = arg, value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    const Flag* flag = FindFlag(name);
    if (!flag)
      return InvalidArgumentError("unknown flag " + std::string(name) + DidYouMean(name, AllFlags()) + " (see --help)");
    if (flag->arg.empty()) {
      if (has_value) return InvalidArgumentError(std::string(name) + " takes no value");
    } else if (!has_value) {
      if (i + 1 >= argc) return InvalidArgumentError(std::string(name) + " needs a value");
      value = argv[++i];
    }
    if (!flag->model.empty() && flag->model != o.model) {
      if (!known_model || o.help) continue;
      return InvalidArgumentError(std::string(flag->name) + " is a flag of --model " + std::string(flag->model) +
                                  ", and this run's model is " + o.model);
    }
    FERRY_RETURN_IF_ERROR(flag->set(o, name, value));
    saw_rank |= name == "--rank";
    saw_workers |= name == "--num-workers";
  }
  if (o.help) return o;
  if (o.local && (saw_rank || saw_workers)) {
    return InvalidArgumentError("--local runs one worker: no --rank/--num-workers");
  }
  // The cluster from TF_CONFIG when no cluster flag says otherwise (flags win).
  if (!o.local && o.servers.empty() && !saw_rank && !saw_workers && tf_config != nullptr && *tf_config != '\0') {
    FERRY_ASSIGN_OR_RETURN(ClusterConfig c, ParseTfConfig(tf_config));
    if (c.task_type == "ps") {
      return InvalidArgumentError("TF_CONFIG: this task is ps " + std::to_string(c.task_index) +
                                  ": run ferry-ps there, not ferry-trainer");
    }
    o.servers = c.servers;
    o.rank = c.rank;
    o.num_workers = c.num_workers;
    o.cluster_source = "TF_CONFIG (" + c.task_type + " " + std::to_string(c.task_index) + ")";
  }
  FERRY_RETURN_IF_ERROR(o.Validate());
  return o;
}

}  // namespace ferry::trainer
