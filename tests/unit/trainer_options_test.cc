// ferry-trainer's flag parsing and device selection.
#include <cstring>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/kernels.h"
#include "ferry/trainer/device.h"
#include "ferry/trainer/models.h"
#include "ferry/trainer/model_registry.h"
#include "ferry/trainer/options.h"
#include "ferry/trainer/trainer.h"

namespace ferry::trainer {
namespace {

// `tf_config`: the TF_CONFIG value the parse sees (none by default, whatever the environment).
StatusOr<TrainerOptions> Parse(std::vector<std::string> args, const char* tf_config = nullptr) {
  std::vector<const char*> argv = {"ferry-trainer"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseTrainerFlags(static_cast<int>(argv.size()), argv.data(), tf_config);
}

constexpr const char* kTfConfig =
    R"({"cluster": {"ps": ["10.0.0.1:2222", "ps-1:2222"], "chief": ["c:1"], "worker": ["w0:1", "w1:1"]},
        "task": {"type": "worker", "index": 1}})";

TEST(TrainerOptions, TakesTheClusterFromTfConfigWithoutClusterFlags) {
  auto o = Parse({"--steps", "10"}, kTfConfig);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->servers, (std::vector<std::string>{"tcp://10.0.0.1:2222", "tcp://ps-1:2222"}));
  EXPECT_EQ(o->num_workers, 3);  // the chief and two workers
  EXPECT_EQ(o->rank, 2);         // worker 1 comes after the chief and worker 0
  EXPECT_EQ(o->cluster_source, "TF_CONFIG (worker 1)");
}

TEST(TrainerOptions, ClusterFlagsWinOverTfConfig) {
  auto o = Parse({"--servers", "tcp://a:1", "--steps", "10"}, kTfConfig);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->servers, (std::vector<std::string>{"tcp://a:1"}));
  EXPECT_EQ(o->num_workers, 1);
  EXPECT_TRUE(o->cluster_source.empty());
  EXPECT_TRUE(Parse({"--local", "--steps", "10"}, kTfConfig).ok());
}

TEST(TrainerOptions, RefusesTfConfigForAnotherTaskOrMalformed) {
  auto ps = Parse({"--steps", "10"},
                  R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "ps", "index": 0}})");
  EXPECT_EQ(ps.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ps.status().message().find("run ferry-ps there"), std::string::npos) << ps.status();
  auto bad = Parse({"--steps", "10"}, "{not json");
  EXPECT_NE(bad.status().message().find("TF_CONFIG is not JSON"), std::string::npos) << bad.status();
}

TEST(TrainerOptions, ParsesAFullCommandLine) {
  auto o = Parse({"--servers", "tcp://a:1,tcp://b:2", "--rank=1", "--num-workers", "3", "--device", "cpu",
                  "--gpu", "2", "--hidden", "32,16,8", "--optimizer", "adam", "--lr", "0.001", "--consistency",
                  "ssp:4", "--batch", "32", "--steps", "100", "--eval-every", "10", "--metrics-out", "/tmp/x",
                  "--metrics", "127.0.0.1:0", "--no-shuffle"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->servers, (std::vector<std::string>{"tcp://a:1", "tcp://b:2"}));
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->num_workers, 3);
  EXPECT_EQ(o->device, DeviceKind::kCpu);
  EXPECT_EQ(o->gpu, 2);
  EXPECT_EQ(o->hidden, (std::vector<int64_t>{32, 16, 8}));
  EXPECT_EQ(o->optimizer.type, OptimizerType::kAdam);
  EXPECT_FLOAT_EQ(o->optimizer.learning_rate, 0.001f);
  EXPECT_EQ(o->consistency, Consistency::kSsp);
  EXPECT_EQ(o->staleness, 4);
  EXPECT_EQ(o->batch, 32);
  EXPECT_EQ(o->steps, 100);
  EXPECT_EQ(o->eval_every, 10);
  EXPECT_EQ(o->metrics_out, "/tmp/x");
  EXPECT_EQ(o->metrics_bind, "127.0.0.1:0");
  EXPECT_FALSE(o->shuffle);
  EXPECT_FALSE(o->local);
}

TEST(TrainerOptions, ParsesTheCtrAndExperimentFlags) {
  auto o =
      Parse({"--servers",    "tcp://a:1", "--num-workers",    "4",  "--rank",      "3",      "--model",     "ctr",
             "--emb-dim",    "8",         "--ctr-fields",     "5",  "--ctr-vocab", "77",     "--ctr-dense", "0",
             "--ctr-train",  "1000",      "--ctr-test",       "10", "--ctr-zipf",  "1.3",    "--data-seed", "9",
             "--accumulate", "3",         "--backup-workers", "1",  "--straggler", "3:x2.5", "--pipeline",  "none"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->pipeline, Pipeline::kNone);
  EXPECT_EQ(o->model, "ctr");
  EXPECT_EQ(o->ctr().emb_dim, 8);
  EXPECT_EQ(o->ctr().fields, 5);
  EXPECT_EQ(o->ctr().vocab, 77);
  EXPECT_EQ(o->ctr().dense, 0);
  EXPECT_EQ(o->ctr().train, 1000);
  EXPECT_EQ(o->ctr().test, 10);
  EXPECT_DOUBLE_EQ(o->ctr().zipf, 1.3);
  EXPECT_EQ(o->ctr().data_seed, 9u);
  EXPECT_EQ(o->accumulate, 3);
  EXPECT_EQ(o->backup_workers, 1);
  EXPECT_EQ(o->replicas_to_aggregate(), 3);
  EXPECT_EQ(o->straggler_rank, 3);
  EXPECT_DOUBLE_EQ(o->straggler_factor, 2.5);
  auto d = Parse({"--local", "--straggler", "0:40ms"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_DOUBLE_EQ(d->straggler_delay_ms, 40);
  EXPECT_EQ(d->pipeline, Pipeline::kExchange);  // the default
  auto p = Parse({"--local", "--pipeline", "prefetch"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->pipeline, Pipeline::kPrefetch);
  EXPECT_FALSE(p->push_by_layer);
  EXPECT_EQ(d->replicas_to_aggregate(), 0);
  auto l = Parse({"--servers", "tcp://a:1", "--push-by-layer"});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->push_by_layer);
  auto m = Parse(
      {"--servers", "tcp://a:1,tcp://b:1,tcp://c:1", "--move-slots", "10:drain=2,20:first,35:drain=0,40:join=0"});
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->move_slots.size(), 4u);
  EXPECT_EQ(m->move_slots[3].step, 40);
  EXPECT_EQ(m->move_slots[3].join, 0);
  EXPECT_EQ(m->move_slots[3].drain, -1);
  EXPECT_EQ(m->move_slots[0].join, -1);
  EXPECT_EQ(m->move_slots[0].step, 10);
  EXPECT_EQ(m->move_slots[0].drain, 2);
  EXPECT_EQ(m->move_slots[1].step, 20);
  EXPECT_EQ(m->move_slots[1].drain, -1);
  EXPECT_EQ(m->move_slots[2].step, 35);
  EXPECT_EQ(m->move_slots[2].drain, 0);
  auto v = Parse({"--servers", "tcp://a:1", "--num-workers", "4", "--leave", "3@10,1@2"});
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->leave.size(), 2u);
  EXPECT_EQ(v->LeaveStep(3), 10);
  EXPECT_EQ(v->LeaveStep(1), 2);
  EXPECT_EQ(v->LeaveStep(2), -1);
  EXPECT_EQ(v->LeaveStep(0), -1);
  auto j = Parse({"--servers", "tcp://a:1", "--num-workers", "4", "--join", "2@10", "--leave", "2@30,1@5"});
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->JoinStep(2), 10);
  EXPECT_EQ(j->JoinStep(1), 0);
  EXPECT_FALSE(j->TakesPart(2, 9));
  EXPECT_TRUE(j->TakesPart(2, 10));
  EXPECT_TRUE(j->TakesPart(2, 29));
  EXPECT_FALSE(j->TakesPart(2, 30));
  EXPECT_TRUE(j->TakesPart(1, 4));
  EXPECT_FALSE(j->TakesPart(1, 5));
  EXPECT_TRUE(j->TakesPart(0, 1000));
}

TEST(TrainerOptions, EvalEveryEpoch) {
  auto o = Parse({"--local", "--eval-every", "5", "--eval-every", "epoch"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->eval_each_epoch);
  EXPECT_EQ(o->eval_every, 0);  // the last one wins
  o = Parse({"--local", "--eval-every", "epoch", "--eval-every", "5"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->eval_each_epoch);
  EXPECT_EQ(o->eval_every, 5);
}

TEST(TrainerOptions, BlasThreadsAreOpenBlasOwnByDefaultAndBounded) {
  auto o = Parse({"--local"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->blas_threads, 0);  // OpenBLAS's own count (recorded in the metrics)
  o = Parse({"--local", "--blas-threads", "3"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->blas_threads, 3);
  o = Parse({"--local", "--blas-threads", "-1"});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--blas-threads"), std::string::npos) << o.status();
}

TEST(TrainerOptions, CheckpointAndResumeFlags) {
  auto o = Parse({"--servers", "tcp://a:1", "--checkpoint-every", "50", "--resume"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->checkpoint_every, 50);
  EXPECT_TRUE(o->resume);
  auto plain = Parse({"--servers", "tcp://a:1"});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->checkpoint_every, 0);
  EXPECT_FALSE(plain->resume);
  EXPECT_NE(Parse({"--servers", "tcp://a:1", "--checkpoint-every", "-1"}).status().message().find("--checkpoint-every"),
            std::string::npos);
  EXPECT_NE(Parse({"--servers", "tcp://a:1", "--resume=yes"}).status().message().find("takes no value"),
            std::string::npos);
  // Checkpoints are the servers': a --local run has none.
  for (const char* flag : {"--resume", "--checkpoint-every=5"}) {
    const Status s = Parse({"--local", flag}).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << flag;
    EXPECT_NE(s.message().find("need servers"), std::string::npos) << s;
  }
}

TEST(TrainerOptions, LocalNeedsNoServers) {
  auto o = Parse({"--local", "--batch", "8"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->local);
  EXPECT_EQ(o->device, DeviceKind::kAuto);
}

TEST(TrainerOptions, BadValuesNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--batch", "0", "--local"}, "--batch"},
      {{"--batch", "x", "--local"}, "--batch"},
      {{"--lr", "nan", "--local"}, "--lr"},
      {{"--lr", "-1", "--local"}, "--lr"},
      {{"--optimizer", "rmsprop", "--local"}, "--optimizer"},
      {{"--consistency", "ssp:", "--local"}, "--consistency"},
      {{"--device", "tpu", "--local"}, "--device"},
      {{"--hidden", "32,,8", "--local"}, "--hidden"},
      {{"--servers", "a:1", "--rank", "0"}, "--servers"},
      {{"--servers", "tcp://a:1", "--rank", "2", "--num-workers", "2"}, "--rank"},
      {{"--rank", "0"}, "--servers"},
      {{"--local", "--servers", "tcp://a:1"}, "--local"},
      {{"--local", "--rank", "1"}, "--local"},
      {{"--local", "--bogus", "1"}, "--bogus"},
      {{"--local", "--batch"}, "--batch"},
      {{"--model", "cnn", "--local"}, "--model"},
      {{"--local", "--accumulate", "0"}, "--accumulate"},
      {{"--local", "--pipeline", "overlap"}, "--pipeline"},
      {{"--servers", "tcp://a:1", "--pipeline", "none", "--push-by-layer"}, "--push-by-layer"},
      {{"--local", "--push-by-layer=yes"}, "--push-by-layer"},
      {{"--servers", "tcp://a:1", "--num-workers", "2", "--straggler", "1:10ms", "--push-by-layer"}, "--straggler"},
      {{"--local", "--straggler", "1"}, "--straggler"},
      {{"--local", "--move-slots", "10:first"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--move-slots", "10"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--move-slots", "10:drain"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--move-slots", "10:drain=-1"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--move-slots", "10:first,10:drain=1"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--move-slots", "-3:first"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--move-slots", "10:first,"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--move-slots", "10:drain=2"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--move-slots", "10:join=2"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--move-slots", "10:join"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--move-slots", "10:join=x"}, "--move-slots"},
      {{"--servers", "tcp://a:1", "--move-slots", "10:first"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--steps", "10", "--move-slots", "10:first"}, "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--num-workers", "3", "--backup-workers", "1", "--move-slots",
        "10:first"},
       "--move-slots"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--consistency", "async", "--pipeline", "prefetch", "--move-slots",
        "10:first"},
       "--move-slots"},
      {{"--local", "--move-asks-every", "10"}, "--move-asks-every"},
      {{"--servers", "tcp://a:1", "--move-asks-every", "10"}, "--move-asks-every moves slots between servers"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--move-asks-every", "-1"}, "--move-asks-every"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--num-workers", "3", "--backup-workers", "1", "--move-asks-every", "5"},
       "--move-asks-every needs every worker at the move's step"},
      {{"--servers", "tcp://a:1,tcp://b:1", "--consistency", "async", "--pipeline", "prefetch", "--move-asks-every",
        "5"},
       "--move-asks-every needs nothing in flight"},
      {{"--local", "--leave", "1@5"}, "--leave"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--leave", "0@5"},
       "--leave: worker 0 is not one of workers 1 to 2"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--leave", "3@5"}, "--leave: worker 3"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--leave", "1@0"}, "--leave step"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--leave", "1@5,1@7"}, "--leave: worker 1 given twice"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--leave", "1@5,"}, "--leave"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--leave", "1"}, "is not WORKER@STEP"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--steps", "5", "--leave", "1@5"}, "not below --steps 5"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--backup-workers", "1", "--leave", "1@5"},
       "--backup-workers"},
      {{"--local", "--join", "1@5"}, "--join"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--join", "0@5"}, "--join: worker 0 is not one of workers 1"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--join", "1@0"}, "--join step"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--join", "1@5,1@6"}, "--join: worker 1 given twice"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--steps", "5", "--join", "1@5"}, "not below --steps 5"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--join", "1@5", "--leave", "1@5"},
       "it would take part in no step"},
      {{"--servers", "tcp://a:1", "--num-workers", "3", "--backup-workers", "1", "--join", "1@5"}, "--backup-workers"},
      {{"--local", "--straggler", "0:fast"}, "--straggler"},
      {{"--local", "--straggler", "0:x0.5"}, "--straggler"},
      {{"--servers", "tcp://a:1", "--num-workers", "2", "--straggler", "2:10ms"}, "--straggler"},
      {{"--servers", "tcp://a:1", "--num-workers", "2", "--backup-workers", "2"}, "--backup-workers"},
      {{"--servers", "tcp://a:1", "--num-workers", "2", "--backup-workers", "1", "--consistency", "async"},
       "--backup-workers"},
      {{"--local", "--criteo-train", "x.tsv", "--criteo-test", "y.tsv"}, "--model ctr"},
      {{"--local", "--model", "ctr", "--criteo-train", "x.tsv"}, "--criteo-test"},
      {{"--servers", "tcp://a:1", "--num-workers", "2", "--model", "ctr", "--criteo-train", "x", "--criteo-test", "y"},
       "--steps"},
      {{"--local", "--model", "ctr", "--criteo-train", "x", "--criteo-test", "y"}, "--steps"},
      {{"--local", "--model", "ctr", "--criteo-train", "x", "--criteo-test", "y", "--steps", "5", "--criteo-shard",
        "row"},
       "--criteo-shard"},
      {{"--local", "--model", "ctr", "--ctr-zipf", "0"}, "--ctr-zipf"},
      {{"--local", "--model", "ctr", "--emb-dim", "0"}, "--emb-dim"},
      {{"--local", "--eval-every", "epochs"}, "--eval-every"},
      {{"--local", "--eval-every", "-1"}, "--eval-every"},
      {{"--servers", "tcp://a:1", "--num-workers", "2", "--model", "ctr", "--criteo-train", "x", "--criteo-test", "y",
        "--steps", "10", "--eval-every", "epoch"},
       "--eval-every epoch"},
      {{"--local", "--model", "ctr", "--criteo-train", "x", "--criteo-test", "y", "--steps", "10", "--eval-every",
        "epoch"},
       "--eval-every epoch"},
  };
  for (const auto& [args, flag] : cases) {
    auto o = Parse(args);
    ASSERT_FALSE(o.ok()) << "accepted " << testing::PrintToString(args);
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(flag), std::string::npos) << o.status();
  }
}

TEST(TrainerOptions, UnknownFlagIsCalledUnknownWhereverItStands) {
  // Last on the line (it used to say "--bogus needs a value"), followed by a value, with =value.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--local", "--bogus"}, {"--bogus", "--local"}, {"--local", "--bogus", "1"}, {"--local", "--bogus=1"}}) {
    auto o = Parse(args);
    ASSERT_FALSE(o.ok()) << "accepted " << testing::PrintToString(args);
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find("unknown flag --bogus"), std::string::npos) << o.status();
    EXPECT_EQ(o.status().message().find("needs a value"), std::string::npos) << o.status();
  }
}

TEST(TrainerOptions, UnknownFlagSuggestsTheNearest) {
  auto o = Parse({"--local", "--lerning-rate", "0.1"});
  EXPECT_NE(o.status().message().find("unknown flag --lerning-rate"), std::string::npos) << o.status();
  auto near = Parse({"--local", "--epoch", "2"});
  EXPECT_NE(near.status().message().find("unknown flag --epoch (did you mean --epochs?)"), std::string::npos)
      << near.status();
  auto flag = Parse({"--local", "--push-by-layers"});
  EXPECT_NE(flag.status().message().find("(did you mean --push-by-layer?)"), std::string::npos) << flag.status();
}

TEST(TrainerOptions, AMisspelledTableKeyIsNamedWithTheNearestAndEveryKey) {
  auto o = Parse({"--local", "--table", "ctr/*:optimiser=ftrl"});
  ASSERT_FALSE(o.ok());
  const std::string m = o.status().message();
  EXPECT_NE(m.find("unknown key 'optimiser' (did you mean optimizer?)"), std::string::npos) << m;
  EXPECT_EQ(m.find("is not a number"), std::string::npos) << m;
  for (const char* key : {" lr,", " optimizer,", " consistency,", " wire,", " l1,", " beta1,", " max_rows,", " topk"}) {
    EXPECT_NE(m.find(key), std::string::npos) << key << " missing from: " << m;
  }
  // --help lists every key too.
  const std::string usage = TrainerUsage();
  for (const char* key : {"lr,", "optimizer,", "consistency,", "admit_probability,", "topk"}) {
    EXPECT_NE(usage.find(key), std::string::npos) << key;
  }
}

// --optimizer, --table and --help take every optimizer and hyperparameter of the catalogue
// (ferry/optimizers.h), AdamW's weight_decay included.
TEST(TrainerOptions, EveryOptimizerOfTheCatalogueIsTakenAndListed) {
  const std::string usage = TrainerUsage();
  for (std::string_view name : OptimizerNames()) {
    auto o = Parse({"--local", "--optimizer", std::string(name)});
    ASSERT_TRUE(o.ok()) << name << ": " << o.status();
    EXPECT_EQ(OptimizerName(o->optimizer.type), name);
    EXPECT_NE(usage.find(std::string(name)), std::string::npos) << name << " missing from --help";
  }
  EXPECT_NE(usage.find("ftrl, adamw (default sgd)"), std::string::npos) << usage;
  auto o = Parse({"--local", "--model", "ctr", "--table", "ctr/emb*:optimizer=adamw,weight_decay=0.05"});
  ASSERT_TRUE(o.ok()) << o.status();
  std::vector<TableSpec> specs(1);
  specs[0].name = "ctr/emb0";
  ASSERT_TRUE(ApplyTableOverrides(*o, &specs).ok());
  EXPECT_EQ(specs[0].optimizer.type, OptimizerType::kAdamW);
  EXPECT_FLOAT_EQ(specs[0].optimizer.weight_decay, 0.05f);
  auto bad = Parse({"--local", "--model", "ctr", "--table", "ctr/emb*:optimizer=adamw,weight_decay=-1"});
  ASSERT_TRUE(bad.ok()) << "the range is checked with the table's optimizer, when its spec is validated";
  std::vector<TableSpec> t(1);
  t[0].name = "ctr/emb0";
  t[0].dim = 4;
  t[0].type = TableType::kSparse;
  ASSERT_TRUE(ApplyTableOverrides(*bad, &t).ok());
  EXPECT_NE(t[0].Validate().message().find("adamw's weight_decay must be >= 0, got -1"), std::string::npos)
      << t[0].Validate();
}

// The flags are one table (options.cc): --help shows each flag's default from TrainerOptions, and
// a number outside a flag's range is refused with the range.
TEST(TrainerOptions, TheFlagTableGivesDefaultsAndRanges) {
  const std::string usage = TrainerUsage();
  for (const char* line :
       {"--batch B                 examples per worker per step (default 64)",
        "--hidden LIST             hidden layer widths, comma-separated (default 256,128)", "(default exchange)",
        "(default auto)",
        "--lr X                    learning rate (> 0) "
        "(default 0.1)",
        "--ctr-vocab V             synthetic: ids per field (default 1000)",  // a model's own
        "--data-dir DIR            the Fashion-MNIST folder (default /usr/share/datasets/fashion-mnist)"}) {
    EXPECT_NE(usage.find(line), std::string::npos) << line << "\n" << usage;
  }
  for (size_t at = 0, end; at < usage.size(); at = end + 1) {
    end = usage.find('\n', at);
    if (end == std::string::npos) end = usage.size();
    EXPECT_LE(end - at, 100u) << usage.substr(at, end - at);
  }
  auto timeout = Parse({"--local", "--connect-timeout-s", "0"});
  EXPECT_EQ(timeout.status().message(), "--connect-timeout-s must be in (0, 86400], got 0");
  auto zipf = Parse({"--local", "--model", "ctr", "--ctr-zipf=-1"});
  EXPECT_EQ(zipf.status().message(), "--ctr-zipf must be > 0, got -1");
  auto batch = Parse({"--local", "--batch", "0"});
  EXPECT_EQ(batch.status().message(), "--batch: 0 is outside [1, 16777216]");
  auto device = Parse({"--local", "--device", "gpu"});
  EXPECT_EQ(device.status().message(), "--device: 'gpu' is not cuda, cpu or auto");
  auto quiet = Parse({"--local", "--quiet=1"});
  EXPECT_EQ(quiet.status().message(), "--quiet takes no value");
}

// The models are one registry (ferry/trainer/model_registry.h): --model takes each name and
// suggests the nearest, --help lists each, and a flag that belongs to one model is refused in
// another model's run.
TEST(TrainerOptions, ModelsComeFromTheRegistryAndOwnTheirFlags) {
  const std::string usage = TrainerUsage();
  ASSERT_GE(Models().size(), 2u);
  for (const ModelInfo& m : Models()) {
    auto o = Parse({"--local", "--model", std::string(m.name)});
    ASSERT_TRUE(o.ok()) << m.name << ": " << o.status();
    EXPECT_NE(usage.find(std::string(m.name) + ":"), std::string::npos) << m.name;
    EXPECT_FALSE(m.plan_tables(*o).empty()) << m.name << " declares no table";
    EXPECT_EQ(FindModel(m.name), &m);
  }
  auto typo = Parse({"--local", "--model", "ctrr"});
  EXPECT_NE(typo.status().message().find("'ctrr' is unknown (did you mean ctr?) (known: mlp, ctr)"), std::string::npos)
      << typo.status();
  auto mlp_with_ctr_flag = Parse({"--local", "--ctr-vocab", "5"});
  EXPECT_EQ(mlp_with_ctr_flag.status().message(), "--ctr-vocab is a flag of --model ctr, and this run's model is mlp");
  auto ctr_with_mlp_flag = Parse({"--local", "--data-dir", "/tmp", "--model", "ctr"});
  EXPECT_EQ(ctr_with_mlp_flag.status().message(), "--data-dir is a flag of --model mlp, and this run's model is ctr");
  auto early = Parse({"--local", "--emb-dim", "8", "--model", "ctr"});
  ASSERT_TRUE(early.ok()) << "a model's flag may come before --model: " << early.status();
  EXPECT_EQ(early->ctr().emb_dim, 8);
  auto last = Parse({"--local", "--model", "mlp", "--emb-dim", "4", "--model=ctr"});
  ASSERT_TRUE(last.ok()) << "the last --model wins: " << last.status();
  EXPECT_EQ(last->ctr().emb_dim, 4);
  // A run holds its own model's options, and no other model's.
  auto mlp = Parse({"--local"});
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_TRUE(std::holds_alternative<MlpModelOptions>(mlp->model_options));
  EXPECT_TRUE(std::holds_alternative<CtrModelOptions>(early->model_options));
  EXPECT_TRUE(Parse({"--local", "--model", "ctr", "--data-dir", "/tmp", "--help"}).ok()) << "--help skips the check";
  TrainerOptions mixed;  // a program that selects a model by hand and forgets SetModel
  mixed.local = true;
  mixed.model = "ctr";
  EXPECT_EQ(mixed.Validate().code(), StatusCode::kInternal) << mixed.Validate();
  mixed.SetModel("ctr");
  EXPECT_TRUE(mixed.Validate().ok()) << mixed.Validate();
  EXPECT_NE(usage.find("data, --model ctr only:"), std::string::npos);
}

// What ferry-trainer refuses before it loads its data (exit 2).
TEST(TrainerOptions, CheckSettingsRefusesTheUsersSettingsWithoutData) {
  auto ok = Parse({"--servers", "tcp://a:1", "--num-workers", "2", "--model", "ctr", "--table", "ctr/emb*:lr=0.1"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(CheckSettings(*ok).ok()) << CheckSettings(*ok);

  auto none = Parse({"--servers", "tcp://a:1", "--num-workers", "2", "--model", "ctr", "--table", "user/*:lr=0.1"});
  ASSERT_TRUE(none.ok());
  Status s = CheckSettings(*none);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'user/*' matches none of the model's tables (ctr/w0, ctr/w0s, ctr/b0"), std::string::npos)
      << s;
  EXPECT_TRUE(IsSettingsRefusal(s));

  // The classifier's tables are known without Fashion-MNIST.
  auto mlp = Parse({"--servers", "tcp://a:1", "--num-workers", "2", "--hidden", "8", "--table", "mlp/b9:lr=0.1"});
  ASSERT_TRUE(mlp.ok());
  s = CheckSettings(*mlp);
  EXPECT_NE(s.message().find("(mlp/w0, mlp/b0, mlp/w1, mlp/b1)"), std::string::npos) << s;

  // --pipeline prefetch with a sync table, set by --consistency or by --table; async is fine.
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--consistency", "sync"}, {"--consistency", "async", "--table", "ctr/b0:consistency=sync"}}) {
    std::vector<std::string> all = {"--servers", "tcp://a:1", "--num-workers", "2",
                                    "--model",   "ctr",       "--pipeline",    "prefetch"};
    all.insert(all.end(), args.begin(), args.end());
    auto p = Parse(all);
    ASSERT_TRUE(p.ok()) << p.status();
    s = CheckSettings(*p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << testing::PrintToString(args);
    EXPECT_NE(s.message().find("is sync, and --pipeline prefetch"), std::string::npos) << s;
  }
  auto async = Parse({"--servers", "tcp://a:1", "--num-workers", "2", "--model", "ctr", "--pipeline", "prefetch",
                      "--consistency", "async"});
  ASSERT_TRUE(async.ok());
  EXPECT_TRUE(CheckSettings(*async).ok()) << CheckSettings(*async);

  // What a restart may cure is not a refusal.
  EXPECT_FALSE(IsSettingsRefusal(UnavailableError("server 1 stopped answering")));
  EXPECT_FALSE(IsSettingsRefusal(DeadlineExceededError("no reply in 30 s")));
  EXPECT_TRUE(IsSettingsRefusal(AlreadyExistsError("table 'w' is already declared as ...")));
}

// The tables CheckSettings plans are those the built model declares.
// The tables of the ctr model built (on the CPU) from `o` and its data.
void BuiltCtrTables(const TrainerOptions& o, std::vector<TableSpec>* specs) {
  auto data = LoadCtrData(o);
  ASSERT_TRUE(data.ok()) << data.status();
  auto device = CreateDevice(DeviceKind::kCpu, 0);
  ASSERT_TRUE(device.ok()) << device.status();
  auto model = CreateCtrModel(device->get(), o, &*data);
  ASSERT_TRUE(model.ok()) << model.status();
  *specs = (*model)->TableSpecs();
}

TEST(TrainerOptions, PlannedCtrTablesAreTheBuiltModelsTables) {
  auto o = Parse({"--local", "--model", "ctr", "--ctr-fields", "3", "--ctr-dense", "2", "--ctr-train", "64",
                  "--ctr-test", "16", "--hidden", "4", "--emb-dim", "5", "--optimizer", "adam"});
  ASSERT_TRUE(o.ok()) << o.status();
  std::vector<TableSpec> built_specs;
  ASSERT_NO_FATAL_FAILURE(BuiltCtrTables(*o, &built_specs));
  std::vector<std::string> built, planned;
  for (const TableSpec& s : built_specs) built.push_back(s.ToString());
  for (const TableSpec& s : CtrTableSpecs(*o)) planned.push_back(s.ToString());
  EXPECT_EQ(planned, built);
  EXPECT_EQ(planned.size(), 8u);  // w0, w0s, b0, w1, b1 and the 3 fields' embeddings
}

// --audit-examples: the ctr model counts every example it trains on in ctr/audit (the planned
// tables include it); sync is refused (a step averages the workers' gradients).
TEST(TrainerOptions, AuditExamplesAddsTheCountingTableAndNeedsAsyncSspOrLocal) {
  auto o = Parse({"--local", "--model", "ctr", "--ctr-fields", "3", "--ctr-dense", "2", "--ctr-train", "64",
                  "--ctr-test", "16", "--hidden", "4", "--emb-dim", "5", "--audit-examples"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->ctr().audit_examples);
  std::vector<TableSpec> built_specs;
  ASSERT_NO_FATAL_FAILURE(BuiltCtrTables(*o, &built_specs));
  const std::vector<TableSpec>& built = built_specs;
  const std::vector<TableSpec> planned = CtrTableSpecs(*o);
  ASSERT_EQ(built.size(), planned.size());
  EXPECT_EQ(planned.back().name, "ctr/audit");
  EXPECT_EQ(planned.back().dim, 1);
  EXPECT_EQ(built.back().ToString(), planned.back().ToString());
  auto sync = Parse({"--servers", "tcp://a:1", "--model", "ctr", "--consistency", "sync", "--audit-examples"});
  ASSERT_FALSE(sync.ok());
  EXPECT_NE(sync.status().message().find("--audit-examples counts with async, ssp or --local"), std::string::npos)
      << sync.status();
  EXPECT_TRUE(Parse({"--servers", "tcp://a:1", "--model", "ctr", "--consistency", "async", "--audit-examples"}).ok());
  auto mlp = Parse({"--local", "--audit-examples"});  // the mlp model has no such flag
  EXPECT_FALSE(mlp.ok());
}

TEST(TrainerOptions, EveryFlagInTheUsageIsKnown) {
  const std::string usage = TrainerUsage();
  int flags = 0;
  for (size_t at = usage.find("--"); at != std::string::npos; at = usage.find("--", at + 2)) {
    const size_t end = usage.find_first_not_of("abcdefghijklmnopqrstuvwxyz-", at + 2);
    const std::string flag = usage.substr(at, end - at);
    ++flags;
    // Alone and last: a value flag needs its value, a boolean one parses; neither is unknown.
    auto o = Parse({flag});
    if (!o.ok()) {
      EXPECT_EQ(o.status().message().find("unknown flag"), std::string::npos) << flag << ": " << o.status();
      EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << flag << ": " << o.status();
    }
  }
  EXPECT_GE(flags, 35);
}

TEST(TrainerDevice, CpuAndAuto) {
  std::string choice;
  auto cpu = CreateDevice(DeviceKind::kCpu, 0, &choice);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->name(), "cpu");
  auto automatic = CreateDevice(DeviceKind::kAuto, 0, &choice);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  std::printf("--device auto chose: %s\n", choice.c_str());
  EXPECT_NE(choice.find((*automatic)->is_cuda() ? "cuda" : "cpu"), std::string::npos);
  if (!(*automatic)->is_cuda()) {
    auto cuda = CreateDevice(DeviceKind::kCuda, 0, &choice);
    EXPECT_FALSE(cuda.ok()) << "--device cuda succeeded where auto found no GPU";
  }
}

TEST(TrainerDevice, CpuBuffersAndOps) {
  auto dev = CreateCpuDevice();
  auto a = dev->Alloc(4 * sizeof(float));
  auto h = dev->AllocHost(4 * sizeof(float));
  ASSERT_TRUE(a.ok() && h.ok());
  const float in[4] = {-1, 2, -3, 4};
  ASSERT_TRUE(dev->CopyToDevice(a->data(), in, sizeof(in)).ok());
  ASSERT_TRUE(dev->ReluForward(a->as<float>(), 4, a->as<float>()).ok());
  ASSERT_TRUE(dev->CopyToHost(h->data(), a->data(), sizeof(in)).ok());
  ASSERT_TRUE(dev->Synchronize().ok());
  EXPECT_EQ(h->as<float>()[0], 0.0f);
  EXPECT_EQ(h->as<float>()[1], 2.0f);
  EXPECT_EQ(dev->Alloc(-1).status().code(), StatusCode::kInvalidArgument);
}

// Device::Dedup on a backend equals the CPU kernel's outputs exactly (distinct ids ascending, the
// inverse map, the count); ctr's Load deduplicates each field's ids with it once per step.
void ExpectDedupMatchesTheKernel(Device& dev) {
  const std::vector<int64_t> ids = {42, -7, 42, 1LL << 40, 3, -7, 3, 3, 0, 1LL << 40};
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> want_unique(ids.size());
  std::vector<int32_t> want_inverse(ids.size());
  int32_t want_n = 0;
  ASSERT_TRUE(kernels::cpu::Dedup(ids.data(), n, want_unique.data(), want_inverse.data(), &want_n).ok());
  want_unique.resize(static_cast<size_t>(want_n));
  auto in = dev.Alloc(n * 8), unique = dev.Alloc(n * 8), inverse = dev.Alloc(n * 4), count = dev.Alloc(4);
  auto h_in = dev.AllocHost(n * 8), h_unique = dev.AllocHost(n * 8), h_inverse = dev.AllocHost(n * 4),
       h_count = dev.AllocHost(4);
  ASSERT_TRUE(in.ok() && unique.ok() && inverse.ok() && count.ok() && h_in.ok() && h_unique.ok() && h_inverse.ok() &&
              h_count.ok());
  std::memcpy(h_in->data(), ids.data(), ids.size() * 8);
  ASSERT_TRUE(dev.CopyToDevice(in->data(), h_in->data(), n * 8).ok());
  ASSERT_TRUE(
      dev.Dedup(in->as<int64_t>(), n, unique->as<int64_t>(), inverse->as<int32_t>(), count->as<int32_t>()).ok());
  ASSERT_TRUE(dev.CopyToHost(h_unique->data(), unique->data(), n * 8).ok());
  ASSERT_TRUE(dev.CopyToHost(h_inverse->data(), inverse->data(), n * 4).ok());
  ASSERT_TRUE(dev.CopyToHost(h_count->data(), count->data(), 4).ok());
  ASSERT_TRUE(dev.Synchronize().ok());
  const int32_t got_n = *h_count->as<int32_t>();
  ASSERT_EQ(got_n, 5);
  ASSERT_EQ(got_n, want_n);
  EXPECT_EQ(std::vector<int64_t>(h_unique->as<int64_t>(), h_unique->as<int64_t>() + got_n), want_unique);
  EXPECT_EQ(std::vector<int32_t>(h_inverse->as<int32_t>(), h_inverse->as<int32_t>() + n), want_inverse);
  EXPECT_EQ(
      dev.Dedup(in->as<int64_t>(), -1, unique->as<int64_t>(), inverse->as<int32_t>(), count->as<int32_t>()).code(),
      StatusCode::kInvalidArgument);
}

TEST(TrainerDevice, CpuDedupMatchesTheKernel) {
  auto dev = CreateCpuDevice();
  ExpectDedupMatchesTheKernel(*dev);
}

TEST(TrainerDevice, CudaDedupMatchesTheCpuKernel) {
  auto dev = CreateDevice(DeviceKind::kAuto, 0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  if (!(*dev)->is_cuda()) GTEST_SKIP() << "no CUDA GPU here (or a build without CUDA): the CUDA Dedup is not run";
  ExpectDedupMatchesTheKernel(**dev);
}

}  // namespace
// --table PATTERN:key=value,...: parsed and checked at once, applied in order to the tables
// whose names match, with what goes with a consistency.
TEST(TrainerOptions, TableSettingsApplyToTheTablesTheyMatch) {
  auto o = Parse({"--local", "--model", "ctr", "--backup-workers", "0", "--table",
                  "ctr/emb*:consistency=ssp:3,optimizer=ftrl,lr=0.05,l1=1.5", "--table", "ctr/emb1:l1=2"});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->tables.size(), 2u);
  EXPECT_EQ(o->tables[0].ToString(), "ctr/emb*:consistency=ssp:3,optimizer=ftrl,lr=0.05,l1=1.5");
  std::vector<TableSpec> specs(3);
  specs[0].name = "ctr/dense0";
  specs[1].name = "ctr/emb0";
  specs[2].name = "ctr/emb1";
  for (TableSpec& s : specs) {
    s.consistency = Consistency::kSync;
    s.replicas_to_aggregate = 0;
  }
  ASSERT_TRUE(ApplyTableOverrides(*o, &specs).ok());
  EXPECT_EQ(specs[0].consistency, Consistency::kSync);
  EXPECT_EQ(specs[0].optimizer.type, OptimizerType::kSgd);
  for (int i : {1, 2}) {
    EXPECT_EQ(specs[i].consistency, Consistency::kSsp) << i;
    EXPECT_EQ(specs[i].staleness, 3) << i;
    EXPECT_EQ(specs[i].optimizer.type, OptimizerType::kFtrl) << i;
    EXPECT_FLOAT_EQ(specs[i].optimizer.learning_rate, 0.05f) << i;
  }
  EXPECT_FLOAT_EQ(specs[1].optimizer.l1, 1.5f);
  EXPECT_FLOAT_EQ(specs[2].optimizer.l1, 2.0f);  // the later --table wins

  // Sync set per table takes --backup-workers' replicas_to_aggregate.
  auto sync = Parse(
      {"--servers", "tcp://a:1", "--num-workers", "3", "--backup-workers", "1", "--table", "w*:consistency=sync"});
  ASSERT_TRUE(sync.ok()) << sync.status();
  std::vector<TableSpec> w(1);
  w[0].name = "w0";
  w[0].consistency = Consistency::kAsync;
  ASSERT_TRUE(ApplyTableOverrides(*sync, &w).ok());
  EXPECT_EQ(w[0].consistency, Consistency::kSync);
  EXPECT_EQ(w[0].replicas_to_aggregate, 2);

  for (const char* bad : {"ctr/emb*", "ctr/emb*:", ":lr=1", "ctr/emb*:lr", "ctr/emb*:lr=x", "ctr/emb*:lr=-1",
                          "ctr/emb*:consistency=sometimes", "ctr/emb*:optimizer=lbfgs", "ctr/emb*:l3=1"}) {
    auto r = Parse({"--local", "--table", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--table"), std::string::npos) << r.status();
  }
  auto none = Parse({"--local", "--table", "user/*:lr=0.1"});
  ASSERT_TRUE(none.ok());
  const Status s = ApplyTableOverrides(*none, &specs);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("matches none of the model's tables (ctr/dense0, ctr/emb0, ctr/emb1)"), std::string::npos)
      << s;
}

// The row lifecycle of sparse tables goes through --table like any numeric option (SetSpecOption).
TEST(TrainerOptions, TableSettingsTakeTheRowLifecycle) {
  auto o = Parse({"--local", "--model", "ctr", "--table",
                  "ctr/emb*:admit_after=2,admit_probability=0.5,evict_after_steps=500,max_rows=100000"});
  ASSERT_TRUE(o.ok()) << o.status();
  std::vector<TableSpec> specs(2);
  specs[0].name = "ctr/emb0";
  specs[1].name = "ctr/dense0";
  ASSERT_TRUE(ApplyTableOverrides(*o, &specs).ok());
  EXPECT_EQ(specs[0].admit_after, 2);
  EXPECT_EQ(specs[0].admit_probability, 0.5f);
  EXPECT_EQ(specs[0].evict_after_steps, 500);
  EXPECT_EQ(specs[0].max_rows, 100000);
  EXPECT_FALSE(specs[1].has_lifecycle());
  for (const char* bad : {"ctr/emb*:max_rows=-1", "ctr/emb*:admit_after=1.5", "ctr/emb*:admit_probability=0"}) {
    auto r = Parse({"--local", "--table", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--table"), std::string::npos) << r.status();
  }
}

// Gradient compression (issue 17): wire takes a format's name, topk a ratio; a bad value names
// the key, and topk on a sparse table is refused naming the table (when the trainer declares it).
TEST(TrainerOptions, TableSettingsTakeWireFormatsAndTopk) {
  auto o = Parse({"--local", "--table", "mlp/*:wire=fp16,topk=0.01", "--table", "mlp/b*:wire=bf16"});
  ASSERT_TRUE(o.ok()) << o.status();
  std::vector<TableSpec> specs(2);
  specs[0].name = "mlp/w0";
  specs[1].name = "mlp/b0";
  for (auto& s : specs) s.shape = {10};
  ASSERT_TRUE(ApplyTableOverrides(*o, &specs).ok());
  EXPECT_EQ(specs[0].wire, WireFormat::kF16);
  EXPECT_EQ(specs[0].topk_ratio, 0.01f);
  EXPECT_EQ(specs[1].wire, WireFormat::kBf16) << "a later --table wins";
  for (auto [bad, what] : {std::pair{"mlp/*:wire=fp8", "wire format 'fp8' is not one of: f32, fp16, bf16"},
                           {"mlp/*:topk=2", "topk must be in (0, 1]"}}) {
    auto r = Parse({"--local", "--table", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status();
  }
  auto sparse = Parse({"--local", "--table", "ctr/emb*:topk=0.1"});
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  std::vector<TableSpec> emb(1);
  emb[0].name = "ctr/emb0";
  emb[0].type = TableType::kSparse;
  emb[0].dim = 4;
  ASSERT_TRUE(ApplyTableOverrides(*sparse, &emb).ok());
  const Status s = emb[0].Validate();  // what Client::Declare checks first
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("table 'ctr/emb0': topk is for dense tables"), std::string::npos) << s;
}

// --move-slots with checkpoints: worker 0 has the servers read a committed checkpoint ahead for
// the next move only when no other checkpoint is due before that move.
TEST(TrainerOptions, AMoveIsReadAheadFromTheLastCheckpointBeforeIt) {
  TrainerOptions o;
  o.move_slots = {{200, 2}, {300, -1}};
  auto move_at = [&](int64_t step, int64_t now, double pace) {
    const TrainerOptions::SlotMove* m = o.ReadAheadFor(step, now, pace);
    return m == nullptr ? int64_t{-1} : m->step;
  };
  // Checkpoints only on request: the next move, whatever the distance.
  EXPECT_EQ(move_at(10, 12, 0.1), 200);
  EXPECT_EQ(move_at(200, 203, 0.1), 300);
  EXPECT_EQ(move_at(300, 301, 0.1), -1);  // no move after it
  // Every 50 steps: the checkpoint of 150 (the next is 200, the move's), not of 100.
  o.checkpoint_every = 50;
  EXPECT_EQ(move_at(100, 101, 0.1), -1);
  EXPECT_EQ(move_at(150, 152, 0.1), 200);
  // One off the multiples (asked on request, or at a resume): the next is due at the multiple.
  EXPECT_EQ(move_at(140, 141, 0.1), -1);  // 150 comes before 200
  EXPECT_EQ(move_at(163, 165, 0.1), 200);
  o.move_slots = {{280, 2}};
  EXPECT_EQ(move_at(240, 241, 0.1), -1);  // 250 comes first, though 240 + 50 is past 280
  EXPECT_EQ(move_at(250, 251, 0.1), 280);
  // Every 60 s at 0.1 s a step: a move under 600 steps away from where the job is.
  o.checkpoint_every = 0;
  o.checkpoint_every_s = 60;
  o.move_slots = {{200, 2}};
  EXPECT_EQ(move_at(10, 12, 0.1), 200);
  o.move_slots = {{1000, 2}};
  EXPECT_EQ(move_at(10, 12, 0.1), -1);    // 98.8 s away
  EXPECT_EQ(move_at(10, 500, 0.1), 1000);  // the commit came late: 50 s away from where the job is
  EXPECT_EQ(move_at(10, 12, -1.0), -1);    // no pace known yet
}

}  // namespace ferry::trainer
