#include "ferry/trainer/options.h"

#include <fnmatch.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "ferry/nearest.h"
#include "ferry/trainer/model_registry.h"
#include "internal/option_parsing.h"

namespace ferry::trainer {

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

// The keys --table takes: these named settings, then SetSpecOption's numbers.
const std::vector<std::string_view>& TableKeys() {
  static const std::vector<std::string_view> keys = [] {
    std::vector<std::string_view> k = {"lr", "optimizer", "consistency", "wire"};
    for (std::string_view n : SpecOptionKeys()) k.push_back(n);
    return k;
  }();
  return keys;
}

namespace {

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

}  // namespace

StatusOr<TableOverride> ParseTableOverride(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("--table '" + std::string(text) + "': " + why);
  };
  const size_t eq = text.find('=');
  const size_t colon = eq == std::string_view::npos ? std::string_view::npos : text.rfind(':', eq);
  if (colon == std::string_view::npos || colon == 0) return bad("not PATTERN:key=value,...");
  TableOverride t;
  t.pattern = std::string(text.substr(0, colon));
  TableSpec scratch;  // each setting is tried here once, so a bad one is named at once
  for (std::string_view kv : SplitComma(text.substr(colon + 1))) {
    const size_t at = kv.find('=');
    if (at == std::string_view::npos || at == 0) return bad(std::string("'").append(kv).append("' is not key=value"));
    const std::string_view key = kv.substr(0, at), value = kv.substr(at + 1);
    if (Status s = ApplyTableSetting(TrainerOptions(), key, value, &scratch); !s.ok()) return bad(s.message());
    t.settings.emplace_back(key, value);
  }
  return t;
}

namespace {
// The options of model `M`, or an abort naming both models (a caller asked for another model's).
template <typename M, typename Variant>
auto& ModelPart(Variant& v, const std::string& model, const char* wanted) {
  auto* part = std::get_if<M>(&v);
  if (part == nullptr) {
    std::fprintf(stderr, "ferry-trainer: the options of model %s asked for in a run of model %s\n", wanted,
                 model.c_str());
    std::abort();
  }
  return *part;
}
}  // namespace

void TrainerOptions::SetModel(std::string_view name) {
  model = std::string(name);
  if (const ModelInfo* m = FindModel(name)) model_options = m->defaults;
}

MlpModelOptions& TrainerOptions::mlp() { return ModelPart<MlpModelOptions>(model_options, model, "mlp"); }
const MlpModelOptions& TrainerOptions::mlp() const { return ModelPart<MlpModelOptions>(model_options, model, "mlp"); }
CtrModelOptions& TrainerOptions::ctr() { return ModelPart<CtrModelOptions>(model_options, model, "ctr"); }
const CtrModelOptions& TrainerOptions::ctr() const { return ModelPart<CtrModelOptions>(model_options, model, "ctr"); }

Status TrainerOptions::Validate() const {
  const ModelInfo* info = FindModel(model);
  if (!info) {
    return InvalidArgumentError("--model: '" + model + "' is unknown" + DidYouMean(model, ModelNames()) +
                                " (known: " + JoinNames(ModelNames()) + ")");
  }
  if (model_options.index() != info->defaults.index()) {
    return InternalError("the options held are another model's than --model " + model + "'s (use SetModel)");
  }
  if (const auto* ctr = std::get_if<CtrModelOptions>(&model_options)) {
    if (ctr->criteo_test.empty() != ctr->criteo_train.empty()) {
      return InvalidArgumentError("--criteo-train and --criteo-test go together");
    }
    if (!ctr->criteo_train.empty() && steps == 0) {
      return InvalidArgumentError(
          "--criteo-train needs --steps: the files are streamed, not counted first, and each "
          "worker passes over its own files or lines again at their end");
    }
    if (ctr->audit_examples && consistency == Consistency::kSync && !local) {
      return InvalidArgumentError(
          "--audit-examples counts with async, ssp or --local: a sync step averages the workers' gradients, so a "
          "row would hold its count divided by the workers that pushed that step");
    }
    if (!ctr->criteo_train.empty() && eval_each_epoch) {
      return InvalidArgumentError(
          "--eval-every epoch with --criteo-train: a pass over streamed files ends at no step known in advance (and "
          "at different steps on different workers); give --eval-every N");
    }
  }
  if (backup_workers > 0) {
    if (consistency != Consistency::kSync) return InvalidArgumentError("--backup-workers needs --consistency sync");
    if (backup_workers >= num_workers) {
      return InvalidArgumentError("--backup-workers " + std::to_string(backup_workers) +
                                  " must be below --num-workers " + std::to_string(num_workers));
    }
  }
  if (straggler_rank >= num_workers) {
    return InvalidArgumentError("--straggler: rank " + std::to_string(straggler_rank) +
                                " is outside [0, --num-workers " + std::to_string(num_workers) + ")");
  }
  if (local) {
    if (!servers.empty()) return InvalidArgumentError("--local takes no --servers");
    if (!curve_keys.empty()) return InvalidArgumentError("--local talks to no server: no --curve-keys");
    if (checkpoint_every > 0 || checkpoint_every_s > 0 || resume) {
      return InvalidArgumentError(
          "--checkpoint-every(-s) and --resume need servers (checkpoints are the servers'), not --local");
    }
    if (!move_slots.empty() || move_asks_every > 0) {
      return InvalidArgumentError("--move-slots and --move-asks-every move the servers' slots: not with --local");
    }
    if (!leave.empty() || !join.empty()) {
      return InvalidArgumentError("--leave and --join: --local runs one worker, which takes part in every step");
    }
    if (num_workers != 1 || rank != 0) return InvalidArgumentError("--local runs one worker: no --rank/--num-workers");
  } else {
    if (servers.empty()) return InvalidArgumentError("--servers is required (or pass --local)");
    if (push_by_layer && straggler_rank >= 0) {
      return InvalidArgumentError(
          "--straggler delays a worker after its backward, and --push-by-layer has sent its layers by then: "
          "use one or the other");
    }
    if (!move_slots.empty() || move_asks_every > 0) {
      // A move needs every worker between the same two steps with nothing in flight (PROTOCOL.md,
      // "Placement versions").
      const std::string flag = !move_slots.empty() ? "--move-slots" : "--move-asks-every";
      if (backup_workers > 0) {
        return InvalidArgumentError(flag +
                                    " needs every worker at the move's step: not with --backup-workers (a late "
                                    "worker is at another)");
      }
      if (pipeline == Pipeline::kPrefetch) {
        return InvalidArgumentError(flag +
                                    " needs nothing in flight at the move's step: not with --pipeline prefetch (the "
                                    "step before's pushes are still travelling)");
      }
      if (servers.size() < 2) return InvalidArgumentError(flag + " moves slots between servers: give 2 or more");
      for (const SlotMove& m : move_slots) {
        if (m.drain >= static_cast<int>(servers.size()) || m.join >= static_cast<int>(servers.size())) {
          return InvalidArgumentError("--move-slots: step " + std::to_string(m.step) +
                                      (m.drain >= 0 ? " drains server " + std::to_string(m.drain)
                                                    : " gives server " + std::to_string(m.join) + " slots") +
                                      ", the job has " + std::to_string(servers.size()));
        }
        if (steps > 0 && m.step >= steps) {
          return InvalidArgumentError("--move-slots: step " + std::to_string(m.step) + " is not below --steps " +
                                      std::to_string(steps));
        }
      }
    }
    for (const auto& [flag, list] : {std::pair<std::string_view, const std::vector<WorkerAt>*>{"--leave", &leave},
                                     {"--join", &join}}) {
      for (const WorkerAt& w : *list) {
        // Worker 0 saves the job's checkpoints, moves its slots and reports its evaluation.
        if (w.rank == 0 || w.rank >= num_workers) {
          return InvalidArgumentError(std::string(flag) + ": worker " + std::to_string(w.rank) +
                                      " is not one of workers 1 to " + std::to_string(num_workers - 1) +
                                      " (worker 0 takes part in every step: it checkpoints and reports)");
        }
        if (steps > 0 && w.step >= steps) {
          return InvalidArgumentError(std::string(flag) + ": step " + std::to_string(w.step) +
                                      " is not below --steps " + std::to_string(steps));
        }
        if (backup_workers > 0) {
          return InvalidArgumentError(std::string(flag) +
                                      ": not with --backup-workers (a step's quorum would count a worker absent "
                                      "from it)");
        }
      }
    }
    if (rejoin && (!resume || move_asks_every <= 0 || rank == 0 || backup_workers > 0)) {
      return InvalidArgumentError(
          "--rejoin (a new process of a worker that left, joining again) needs --resume and --move-asks-every "
          "(its join is handed at a move check), a rank above 0 (worker 0 never leaves), and no --backup-workers");
    }
    if (rejoin && JoinStep(rank) > 0) {
      return InvalidArgumentError("--rejoin and --join " + std::to_string(rank) + "@" + std::to_string(JoinStep(rank)) +
                                  ": the step a worker joins again at is server 0's to say");
    }
    for (const WorkerAt& j : join) {
      if (const int64_t l = LeaveStep(j.rank); l >= 0 && l <= j.step) {
        return InvalidArgumentError("--join: worker " + std::to_string(j.rank) + " joins at step " +
                                    std::to_string(j.step) + " and leaves before step " + std::to_string(l) +
                                    ": it would take part in no step");
      }
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
      return InvalidArgumentError("--table " + t.ToString() + ": '" + t.pattern +
                                  "' matches none of the model's tables (" + names + ")");
    }
  }
  return Status::Ok();
}

const TrainerOptions::SlotMove* TrainerOptions::ReadAheadFor(int64_t step, int64_t now,
                                                              double seconds_per_step) const {
  const SlotMove* move = nullptr;
  for (const SlotMove& m : move_slots) {
    if (m.step > step) {
      move = &m;
      break;
    }
  }
  if (move == nullptr) return nullptr;
  if (checkpoint_every > 0 && (step / checkpoint_every + 1) * checkpoint_every < move->step) return nullptr;
  if (checkpoint_every_s > 0 &&
      !(seconds_per_step >= 0 &&
        seconds_per_step * static_cast<double>(std::max<int64_t>(move->step - now, 0)) < checkpoint_every_s)) {
    return nullptr;
  }
  return move;
}

}  // namespace ferry::trainer
