#include "trainer/trainer/options.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

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

}  // namespace

std::string TrainerUsage() {
  return R"(usage: ferry-trainer [flags]
cluster:   --servers tcp://h:p,tcp://h:p  --rank R  --num-workers M     (or --local: no servers)
device:    --device cuda|cpu|auto (auto)  --gpu N (0)
model:     --model mlp  --hidden 256,128  --seed S (1)
optimizer: --optimizer sgd|momentum|adagrad|adam (sgd)  --lr X (0.1)
           --consistency sync|async|ssp:S (sync)
data:      --data-dir DIR (/usr/share/datasets/fashion-mnist)  --batch B (64)
           --epochs E (1) | --steps N  --no-shuffle  --train-limit N  --test-limit N
report:    --log-every N (100)  --eval-every N (0: end only)  --metrics-out FILE  --quiet
)";
}

Status TrainerOptions::Validate() const {
  if (model != "mlp") return InvalidArgumentError("--model: '" + model + "' is unknown (known: mlp)");
  if (local) {
    if (!servers.empty()) return InvalidArgumentError("--local takes no --servers");
    if (num_workers != 1 || rank != 0) return InvalidArgumentError("--local runs one worker: no --rank/--num-workers");
  } else {
    if (servers.empty()) return InvalidArgumentError("--servers is required (or pass --local)");
    if (rank < 0 || rank >= num_workers) {
      return InvalidArgumentError("--rank " + std::to_string(rank) + " is outside [0, --num-workers " +
                                  std::to_string(num_workers) + ")");
    }
  }
  if (!(optimizer.learning_rate > 0.0f)) return InvalidArgumentError("--lr must be > 0");
  if (steps == 0 && epochs < 1) return InvalidArgumentError("--epochs must be >= 1 (or give --steps)");
  return Status::Ok();
}

StatusOr<TrainerOptions> ParseTrainerFlags(int argc, const char* const* argv) {
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
    if (flag == "--local" || flag == "--no-shuffle" || flag == "--quiet" || flag == "--help") {
      if (has_value) return InvalidArgumentError(std::string(flag) + " takes no value");
      if (flag == "--local") o.local = true;
      if (flag == "--no-shuffle") o.shuffle = false;
      if (flag == "--quiet") o.quiet = true;
      if (flag == "--help") o.help = true;
      continue;
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
      FERRY_RETURN_IF_ERROR(ParseInt(f, value, 0, INT64_MAX, &o.eval_every));
    } else if (flag == "--metrics-out") {
      if (value.empty()) return InvalidArgumentError("--metrics-out: empty path");
      o.metrics_out = std::string(value);
    } else {
      return InvalidArgumentError("unknown flag '" + std::string(flag) + "' (see --help)");
    }
  }
  if (o.help) return o;
  if (o.local && (saw_rank || saw_workers)) {
    return InvalidArgumentError("--local runs one worker: no --rank/--num-workers");
  }
  FERRY_RETURN_IF_ERROR(o.Validate());
  return o;
}

}  // namespace ferry::trainer
