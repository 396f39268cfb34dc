#include "ferry/trainer/options.h"

#include <fnmatch.h>

#include <algorithm>
#include <iterator>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "ferry/cluster.h"
#include "ferry/nearest.h"

namespace ferry::trainer {
namespace {

std::vector<std::string_view> SplitComma(std::string_view s) {
  std::vector<std::string_view> out;
  if (s.empty()) return out;
  size_t at = 0;
  while (true) {
    const size_t comma = s.find(',', at);
    out.push_back(s.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at));
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return out;
}

// Flags that take a value; ParseTrainerFlags handles each (boolean flags are listed there). A flag
// in neither list is unknown, whether or not a value follows it.
constexpr std::string_view kValueFlags[] = {
    "--servers", "--rank", "--num-workers", "--device", "--gpu", "--model", "--emb-dim", "--ctr-fields",
    "--ctr-vocab", "--ctr-dense", "--ctr-train", "--ctr-test", "--ctr-zipf", "--data-seed", "--criteo-train",
    "--criteo-test", "--criteo-shard", "--backup-workers", "--accumulate", "--blas-threads", "--straggler", "--hidden", "--seed", "--optimizer",
    "--lr", "--consistency", "--data-dir", "--batch", "--epochs", "--steps", "--train-limit", "--test-limit",
    "--log-every", "--eval-every", "--metrics-out", "--metrics", "--checkpoint-every",
    "--checkpoint-every-s", "--curve-keys", "--table", "--pipeline", "--connect-timeout-s"};

constexpr std::string_view kBoolFlags[] = {"--local", "--no-shuffle", "--quiet", "--help", "--resume", "--push-by-layer"};

const std::vector<std::string_view>& AllFlags() {
  static const std::vector<std::string_view> flags = [] {
    std::vector<std::string_view> f(std::begin(kValueFlags), std::end(kValueFlags));
    f.insert(f.end(), std::begin(kBoolFlags), std::end(kBoolFlags));
    return f;
  }();
  return flags;
}

Status ParseInt(std::string_view flag, std::string_view text, int64_t min, int64_t max, int64_t* out) {
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return InvalidArgumentError(std::string(flag) + ": '" + std::string(text) + "' is not an integer");
  }
  if (v < min || v > max) {
    return InvalidArgumentError(std::string(flag) + ": " + std::to_string(v) + " is outside [" + std::to_string(min) +
                                ", " + std::to_string(max) + "]");
  }
  *out = v;
  return Status::Ok();
}

Status ParseFloat(std::string_view flag, std::string_view text, float* out) {
  // std::from_chars for float is in libstdc++ >= 11; strtof keeps this portable.
  const std::string s(text);
  char* end = nullptr;
  const float v = std::strtof(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) {
    return InvalidArgumentError(std::string(flag) + ": '" + s + "' is not a finite number");
  }
  *out = v;
  return Status::Ok();
}

Status ParseDouble(std::string_view flag, std::string_view text, double* out) {
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) {
    return InvalidArgumentError(std::string(flag) + ": '" + s + "' is not a finite number");
  }
  *out = v;
  return Status::Ok();
}

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
    if (o->straggler_factor < 1) return InvalidArgumentError("--straggler: the factor x" + std::string(d.substr(1)) + " must be >= 1");
  } else if (d.size() > 2 && d.substr(d.size() - 2) == "ms") {
    FERRY_RETURN_IF_ERROR(ParseDouble("--straggler delay", d.substr(0, d.size() - 2), &o->straggler_delay_ms));
    if (o->straggler_delay_ms < 0) return InvalidArgumentError("--straggler: a negative delay");
  } else {
    return InvalidArgumentError("--straggler: delay '" + std::string(d) + "' is neither like 50ms nor like x2");
  }
  return Status::Ok();
}

}  // namespace

namespace {

// The keys --table takes: these named settings, then SetSpecOption's numbers.
const std::vector<std::string_view>& TableKeys() {
  static const std::vector<std::string_view> keys = [] {
    std::vector<std::string_view> k = {"lr", "optimizer", "consistency", "wire"};
    for (std::string_view n : SpecOptionKeys()) k.push_back(n);
    return k;
  }();
  return keys;
}

// One setting of a --table flag, applied to `spec` (defaults: `o`'s).
Status ApplyTableSetting(const TrainerOptions& o, std::string_view key, std::string_view value, TableSpec* spec) {
  if (std::ranges::find(TableKeys(), key) == TableKeys().end()) {
    return InvalidArgumentError("unknown key '" + std::string(key) + "'" + DidYouMean(key, TableKeys()) +
                                "; the keys are " + JoinNames(TableKeys()));
  }
  if (key == "consistency") {
    int32_t staleness = 0;
    FERRY_RETURN_IF_ERROR(ParseConsistency(value, &spec->consistency, &staleness));
    spec->staleness = spec->consistency == Consistency::kSsp ? staleness : 0;
    spec->replicas_to_aggregate = spec->consistency == Consistency::kSync ? o.replicas_to_aggregate() : 0;
    return Status::Ok();
  }
  if (key == "optimizer") return ParseOptimizerType(value, &spec->optimizer.type);
  if (key == "wire") return ParseWireFormat(value, &spec->wire);
  const std::string text(value);
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) {
    return InvalidArgumentError(std::string(key) + ": '" + text + "' is not a number");
  }
  if (key == "lr") {
    if (!(x > 0) || !std::isfinite(x)) return InvalidArgumentError("lr must be > 0");
    spec->optimizer.learning_rate = static_cast<float>(x);
    return Status::Ok();
  }
  return SetSpecOption(spec, key, x);
}

StatusOr<TableOverride> ParseTableOverride(std::string_view text) {
  auto bad = [&](const std::string& why) { return InvalidArgumentError("--table '" + std::string(text) + "': " + why); };
  const size_t eq = text.find('=');
  const size_t colon = eq == std::string_view::npos ? std::string_view::npos : text.rfind(':', eq);
  if (colon == std::string_view::npos || colon == 0) return bad("not PATTERN:key=value,...");
  TableOverride t;
  t.pattern = std::string(text.substr(0, colon));
  TableSpec scratch;  // each setting is tried here once, so a bad one is named at once
  for (std::string_view kv : SplitComma(text.substr(colon + 1))) {
    const size_t at = kv.find('=');
    if (at == std::string_view::npos || at == 0) return bad("'" + std::string(kv) + "' is not key=value");
    const std::string_view key = kv.substr(0, at), value = kv.substr(at + 1);
    if (Status s = ApplyTableSetting(TrainerOptions(), key, value, &scratch); !s.ok()) return bad(s.message());
    t.settings.emplace_back(key, value);
  }
  return t;
}

}  // namespace

std::string TrainerUsage() {
  std::string usage = R"(usage: ferry-trainer [flags]
cluster:   --servers tcp://h:p,tcp://h:p  --rank R  --num-workers M     (or --local: no servers)
           without these flags, from TF_CONFIG if set (ps = servers; chief, then workers = ranks)
           --connect-timeout-s S (30): how long to wait for every server's answer at the start;
           a wait longer than 5 s (this one, or a step's) is reported every 5 s on stderr
device:    --device cuda|cpu|auto (auto)  --gpu N (0)
model:     --model mlp|ctr (mlp)  --hidden 256,128  --seed S (1)  --emb-dim E (16, ctr)
optimizer: --optimizer @OPTIMIZERS@ (sgd)  --lr X (0.1)
           --consistency sync|async|ssp:S (sync)  --backup-workers K (0, sync)
           --accumulate k (1: push every micro-batch of --batch)
           --table PATTERN:key=value,...  (repeatable) per-table settings over the above, for the
           tables matching PATTERN (fnmatch); keys: @KEYS@
           (wire: f32|fp16|bf16, how values travel; topk, dense: the share of each chunk pushed)
           e.g. --table 'ctr/emb*:consistency=async,optimizer=ftrl,lr=0.05,l1=0.1'
                --table 'mlp/*:wire=fp16,topk=0.01'
           --blas-threads N (0: OpenBLAS's own; CPU GEMM threads, recorded: results repeat for one N)
           --pipeline none|exchange|prefetch (exchange): push the dense gradients and pull the next
           step's parameters in one round trip that travels while the next batch loads; prefetch
           (async / ssp only): use those parameters a step later, so the round trip overlaps a
           whole step's compute (one step more of staleness)
           --push-by-layer: with exchange or prefetch, send the layers' gradients (and pull their
           next parameters) as backward yields them, while it computes the layers below (layers
           under 64 KiB go with the next); off by default: it pays when compute leaves a core free
data:      --batch B (64)  --epochs E (1) | --steps N  --no-shuffle  --train-limit N  --test-limit N
  mlp:     --data-dir DIR (/usr/share/datasets/fashion-mnist)
  ctr:     synthetic: --ctr-train N (1000000)  --ctr-test N (20000)  --ctr-fields F (8)
           --ctr-vocab V (1000)  --ctr-dense D (4)  --ctr-zipf S (1.1)  --data-seed S (1)
           or Criteo TSV (plain or .gz): --criteo-train LIST  --criteo-test LIST  (LIST: files and
           globs, comma-separated, e.g. 'day_*.gz'; training streams them and needs --steps)
           --criteo-shard auto|file|line (auto: by file when there are at least as many as workers)
report:    --log-every N (100)  --eval-every N|epoch (0: end only)  --metrics-out FILE ({rank} -> rank)
           --quiet  --metrics [HOST:]PORT: serve step, examples, loss and time per part for Prometheus
           at http://HOST:PORT/metrics (PORT 0 picks a free one; a line at the start says where);
           plain HTTP: bind it to loopback or a trusted network
recovery:  --checkpoint-every N (0: never; worker 0 asks the servers, which need a checkpoint folder)
           --checkpoint-every-s S (0: never; and at the job's end; SIGUSR1 to worker 0: one now)
           --resume (continue the job the servers hold, at their step: servers started from a
           checkpoint, or a restarted worker)
security:  --curve-keys DIR (the job's CURVE key folder from ferry-keys: reads server.pub and
           worker-R.key; needed when the servers run with --curve-keys)
experiment: --straggler R:50ms | R:x2   (slow worker R down by a delay or a factor per step)
)";
  // The --table keys, wrapped to the text's width.
  std::string keys;
  size_t line = 40;  // where "keys: " ends on its line
  for (std::string_view k : TableKeys()) {
    if (line + k.size() + 2 > 100) keys += "\n          ", line = 10;
    keys += ' ';
    keys += k;
    keys += ',';
    line += k.size() + 2;
  }
  keys.pop_back();
  usage.replace(usage.find(" @KEYS@"), 7, keys);
  std::string optimizers;
  for (std::string_view name : OptimizerNames()) optimizers += (optimizers.empty() ? "" : "|") + std::string(name);
  usage.replace(usage.find("@OPTIMIZERS@"), 12, optimizers);
  return usage;
}

Status TrainerOptions::Validate() const {
  if (model != "mlp" && model != "ctr") return InvalidArgumentError("--model: '" + model + "' is unknown (known: mlp, ctr)");
  if (model != "ctr" && (!criteo_train.empty() || !criteo_test.empty())) {
    return InvalidArgumentError("--criteo-train/--criteo-test need --model ctr");
  }
  if (criteo_test.empty() != criteo_train.empty()) {
    return InvalidArgumentError("--criteo-train and --criteo-test go together");
  }
  if (!criteo_train.empty() && steps == 0) {
    return InvalidArgumentError("--criteo-train needs --steps: the files are streamed, not counted first, and each "
                                "worker passes over its own files or lines again at their end");
  }
  if (!criteo_train.empty() && eval_each_epoch) {
    return InvalidArgumentError("--eval-every epoch with --criteo-train: a pass over streamed files ends at no step "
                                "known in advance (and at different steps on different workers); give --eval-every N");
  }
  if (backup_workers > 0) {
    if (consistency != Consistency::kSync) return InvalidArgumentError("--backup-workers needs --consistency sync");
    if (backup_workers >= num_workers) {
      return InvalidArgumentError("--backup-workers " + std::to_string(backup_workers) + " must be below --num-workers " +
                                  std::to_string(num_workers));
    }
  }
  if (straggler_rank >= num_workers) {
    return InvalidArgumentError("--straggler: rank " + std::to_string(straggler_rank) + " is outside [0, --num-workers " +
                                std::to_string(num_workers) + ")");
  }
  if (local) {
    if (!servers.empty()) return InvalidArgumentError("--local takes no --servers");
    if (!curve_keys.empty()) return InvalidArgumentError("--local talks to no server: no --curve-keys");
    if (checkpoint_every > 0 || checkpoint_every_s > 0 || resume) {
      return InvalidArgumentError("--checkpoint-every(-s) and --resume need servers (checkpoints are the servers'), not --local");
    }
    if (num_workers != 1 || rank != 0) return InvalidArgumentError("--local runs one worker: no --rank/--num-workers");
  } else {
    if (servers.empty()) return InvalidArgumentError("--servers is required (or pass --local)");
    if (push_by_layer && straggler_rank >= 0) {
      return InvalidArgumentError(
          "--straggler delays a worker after its backward, and --push-by-layer has sent its layers by then: "
          "use one or the other");
    }
    if (push_by_layer && pipeline == Pipeline::kNone) {
      return InvalidArgumentError(
          "--push-by-layer sends each layer with its pull ahead: it needs --pipeline exchange or prefetch, not none");
    }
    if (rank < 0 || rank >= num_workers) {
      return InvalidArgumentError("--rank " + std::to_string(rank) + " is outside [0, --num-workers " +
                                  std::to_string(num_workers) + ")");
    }
  }
  if (!(optimizer.learning_rate > 0.0f)) return InvalidArgumentError("--lr must be > 0");
  if (steps == 0 && epochs < 1) return InvalidArgumentError("--epochs must be >= 1 (or give --steps)");
  return Status::Ok();
}

StatusOr<TrainerOptions> ParseTrainerFlags(int argc, const char* const* argv, const char* tf_config) {
  TrainerOptions o;
  bool saw_rank = false, saw_workers = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.substr(0, 2) != "--") return InvalidArgumentError("unexpected argument '" + std::string(arg) + "'");
    std::string_view flag = arg, value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); eq != std::string_view::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    // Boolean flags.
    if (std::ranges::find(kBoolFlags, flag) != std::end(kBoolFlags)) {
      if (has_value) return InvalidArgumentError(std::string(flag) + " takes no value");
      if (flag == "--push-by-layer") o.push_by_layer = true;
      if (flag == "--resume") o.resume = true;
      if (flag == "--local") o.local = true;
      if (flag == "--no-shuffle") o.shuffle = false;
      if (flag == "--quiet") o.quiet = true;
      if (flag == "--help") o.help = true;
      continue;
    }
    if (std::ranges::find(kValueFlags, flag) == std::end(kValueFlags)) {
      return InvalidArgumentError("unknown flag " + std::string(flag) + DidYouMean(flag, AllFlags()) + " (see --help)");
    }
    if (!has_value) {
      if (i + 1 >= argc) return InvalidArgumentError(std::string(flag) + " needs a value");
      value = argv[++i];
    }
    int64_t n = 0;
    const std::string f(flag);
    if (flag == "--servers") {
      o.servers.clear();
      for (std::string_view s : SplitComma(value)) {
        if (s.empty()) return InvalidArgumentError("--servers: empty endpoint in '" + std::string(value) + "'");
        if (s.find("://") == std::string_view::npos) {
          return InvalidArgumentError("--servers: '" + std::string(s) + "' is not an endpoint like tcp://host:port");
        }
        o.servers.emplace_back(s);
      }
      if (o.servers.empty()) return InvalidArgumentError("--servers: no endpoint given");
    } else if (flag == "--rank") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, 1 << 20, &n));
      o.rank = static_cast<int>(n);
      saw_rank = true;
    } else if (flag == "--num-workers") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 1, 1 << 20, &n));
      o.num_workers = static_cast<int>(n);
      saw_workers = true;
    } else if (flag == "--device") {
      if (value == "auto") o.device = DeviceKind::kAuto;
      else if (value == "cpu") o.device = DeviceKind::kCpu;
      else if (value == "cuda") o.device = DeviceKind::kCuda;
      else return InvalidArgumentError("--device: '" + std::string(value) + "' is not cuda, cpu or auto");
    } else if (flag == "--gpu") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, 1023, &n));
      o.gpu = static_cast<int>(n);
    } else if (flag == "--model") {
      o.model = std::string(value);
    } else if (flag == "--emb-dim") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 1, 4096, &o.emb_dim));
    } else if (flag == "--ctr-fields") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 1, 1024, &n));
      o.ctr_fields = static_cast<int>(n);
    } else if (flag == "--ctr-vocab") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 1, int64_t{1} << 40, &o.ctr_vocab));
    } else if (flag == "--ctr-dense") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, 4096, &n));
      o.ctr_dense = static_cast<int>(n);
    } else if (flag == "--ctr-train") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 1, int64_t{1} << 34, &o.ctr_train));
    } else if (flag == "--ctr-test") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, int64_t{1} << 34, &o.ctr_test));
    } else if (flag == "--ctr-zipf") {
      FERRY_RETURN_IF_ERROR(ParseDouble(f, value, &o.ctr_zipf));
      if (!(o.ctr_zipf > 0)) return InvalidArgumentError("--ctr-zipf must be > 0");
    } else if (flag == "--data-seed") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, INT64_MAX, &n));
      o.data_seed = static_cast<uint64_t>(n);
    } else if (flag == "--criteo-train") {
      if (value.empty()) return InvalidArgumentError("--criteo-train: empty path");
      o.criteo_train = std::string(value);
    } else if (flag == "--criteo-test") {
      if (value.empty()) return InvalidArgumentError("--criteo-test: empty path");
      o.criteo_test = std::string(value);
    } else if (flag == "--table") {
      FERRY_ASSIGN_OR_RETURN(TableOverride t, ParseTableOverride(value));
      o.tables.push_back(std::move(t));
    } else if (flag == "--criteo-shard") {
      auto by = data::ParseCriteoShardBy(value);
      if (!by.ok()) return InvalidArgumentError("--criteo-shard: " + by.status().message());
      o.criteo_shard = *by;
    } else if (flag == "--pipeline") {
      if (value == "none") {
        o.pipeline = Pipeline::kNone;
      } else if (value == "exchange") {
        o.pipeline = Pipeline::kExchange;
      } else if (value == "prefetch") {
        o.pipeline = Pipeline::kPrefetch;
      } else {
        return InvalidArgumentError("--pipeline: '" + std::string(value) + "' is not none, exchange or prefetch");
      }
    } else if (flag == "--backup-workers") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, 1 << 20, &n));
      o.backup_workers = static_cast<int>(n);
    } else if (flag == "--accumulate") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 1, 1 << 16, &o.accumulate));
    } else if (flag == "--blas-threads") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, 1024, &n));
      o.blas_threads = static_cast<int>(n);
    } else if (flag == "--straggler") {
      FERRY_RETURN_IF_ERROR(ParseStraggler(value, &o));
    } else if (flag == "--hidden") {
      o.hidden.clear();
      for (std::string_view s : SplitComma(value)) {
        FERRY_RETURN_IF_ERROR(ParseInt("--hidden", s, 1, 1 << 20, &n));
        o.hidden.push_back(n);
      }
    } else if (flag == "--seed") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, INT64_MAX, &n));
      o.seed = static_cast<uint64_t>(n);
    } else if (flag == "--optimizer") {
      Status s = ParseOptimizerType(value, &o.optimizer.type);
      if (!s.ok()) return InvalidArgumentError("--optimizer: " + s.message());
    } else if (flag == "--lr") {
      FERRY_RETURN_IF_ERROR(ParseFloat(f, value, &o.optimizer.learning_rate));
    } else if (flag == "--consistency") {
      Status s = ParseConsistency(value, &o.consistency, &o.staleness);
      if (!s.ok()) return InvalidArgumentError("--consistency: " + s.message());
    } else if (flag == "--data-dir") {
      o.data_dir = std::string(value);
    } else if (flag == "--batch") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 1, 1 << 24, &o.batch));
    } else if (flag == "--epochs") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 1, 1 << 20, &o.epochs));
    } else if (flag == "--steps") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 1, INT64_MAX / 2, &o.steps));
    } else if (flag == "--train-limit") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, INT64_MAX, &o.train_limit));
    } else if (flag == "--test-limit") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, INT64_MAX, &o.test_limit));
    } else if (flag == "--log-every") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, INT64_MAX, &o.log_every));
    } else if (flag == "--eval-every") {
      o.eval_each_epoch = value == "epoch";
      o.eval_every = 0;  // the last --eval-every wins
      if (!o.eval_each_epoch && !ParseInt(f, value, 0, INT64_MAX, &o.eval_every).ok()) {
        return InvalidArgumentError("--eval-every: '" + std::string(value) + "' is neither a step count >= 0 nor 'epoch'");
      }
    } else if (flag == "--checkpoint-every-s") {
      FERRY_RETURN_IF_ERROR(ParseDouble(f, value, &o.checkpoint_every_s));
      if (!(o.checkpoint_every_s >= 0)) return InvalidArgumentError("--checkpoint-every-s must be >= 0");
    } else if (flag == "--checkpoint-every") {
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, INT64_MAX / 2, &o.checkpoint_every));
    } else if (flag == "--connect-timeout-s") {
      FERRY_RETURN_IF_ERROR(ParseDouble(f, value, &o.connect_timeout_s));
      if (!(o.connect_timeout_s > 0 && o.connect_timeout_s <= 86400)) {
        return InvalidArgumentError("--connect-timeout-s must be in (0, 86400]");
      }
    } else if (flag == "--curve-keys") {
      if (value.empty()) return InvalidArgumentError("--curve-keys: empty path");
      o.curve_keys = std::string(value);
    } else if (flag == "--metrics-out") {
      if (value.empty()) return InvalidArgumentError("--metrics-out: empty path");
      o.metrics_out = std::string(value);
    } else if (flag == "--metrics") {
      if (value.empty()) return InvalidArgumentError("--metrics: empty; want [HOST:]PORT (0: a free port)");
      o.metrics_bind = std::string(value);
    } else {
      // Listed in kValueFlags but not handled above: a bug in this function.
      return InternalError("flag " + std::string(flag) + " is listed as taking a value but has no parser");
    }
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

std::string TableOverride::ToString() const {
  std::string s = pattern + ":";
  for (size_t i = 0; i < settings.size(); ++i) s += (i > 0 ? "," : "") + settings[i].first + "=" + settings[i].second;
  return s;
}

Status ApplyTableOverrides(const TrainerOptions& options, std::vector<TableSpec>* specs) {
  for (const TableOverride& t : options.tables) {
    bool matched = false;
    for (TableSpec& spec : *specs) {
      if (::fnmatch(t.pattern.c_str(), spec.name.c_str(), 0) != 0) continue;
      matched = true;
      for (const auto& [key, value] : t.settings) {
        FERRY_RETURN_IF_ERROR(ApplyTableSetting(options, key, value, &spec).WithContext("--table " + t.ToString()));
      }
    }
    if (!matched) {
      std::string names;
      for (const TableSpec& spec : *specs) names += (names.empty() ? "" : ", ") + spec.name;
      return InvalidArgumentError("--table " + t.ToString() + ": '" + t.pattern + "' matches none of the model's tables (" +
                                  names + ")");
    }
  }
  return Status::Ok();
}

}  // namespace ferry::trainer
