// Every field of ferry::TableSpec survives SpecToWire -> SpecFromWire. The fixtures give every
// field a value that differs both from the C++ default and from the schema default (which is what
// a reader sees when the writer forgot the field), so a field that wire.cc does not copy in either
// direction comes back different. That the two definitions have the same fields and enumerators is
// checked at compile time in messages/src/spec_check.cc.
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/table_spec.h"
#include "ferry/messages/wire.h"

namespace ferry {
namespace {

// Validate() forbids some combinations (dense tables have no dim, staleness is ssp-only,
// replicas_to_aggregate is sync-only), so two specs together cover every field.
TableSpec DenseWithEveryField() {
  TableSpec s;
  s.name = "dense_every_field";
  s.type = TableType::kDense;
  s.shape = {3, 5, 7};
  s.chunk_elems = 11;
  s.optimizer.type = OptimizerType::kAdam;
  s.optimizer.learning_rate = 0.125f;
  s.optimizer.momentum = 0.375f;
  s.optimizer.nesterov = true;
  s.optimizer.beta1 = 0.5f;
  s.optimizer.beta2 = 0.75f;
  s.optimizer.epsilon = 0.25f;
  s.optimizer.initial_accumulator = 0.625f;
  s.optimizer.l1 = 1.5f;
  s.optimizer.l2 = 0.875f;
  s.optimizer.beta = 3.0f;
  s.optimizer.weight_decay = 0.0625f;  // travels by key (OptimizerSpec.hyper)
  s.consistency = Consistency::kSync;
  s.replicas_to_aggregate = 3;
  s.init = InitType::kConstant;
  s.init_scale = -2.5f;
  s.seed = 0xDEADBEEFCAFE1234ull;
  s.wire = WireFormat::kF16;
  s.topk_ratio = 0.25f;
  return s;
}

TableSpec SparseWithEveryField() {
  TableSpec s;
  s.name = "sparse_every_field";
  s.type = TableType::kSparse;
  s.dim = 9;
  s.chunk_elems = 13;
  s.optimizer.type = OptimizerType::kFtrl;
  s.optimizer.learning_rate = 0.5f;
  s.optimizer.momentum = 0.25f;
  s.optimizer.nesterov = true;
  s.optimizer.beta1 = 0.125f;
  s.optimizer.beta2 = 0.0625f;
  s.optimizer.epsilon = 0.75f;
  s.optimizer.initial_accumulator = 2.0f;
  s.consistency = Consistency::kSsp;
  s.staleness = 4;
  s.init = InitType::kNormal;
  s.init_scale = 0.5f;
  s.seed = 7;
  s.nonfinite = NonFinite::kSkipRows;
  s.admit_after = 3;
  s.admit_probability = 0.25f;
  s.evict_after_steps = 100;
  s.max_rows = 5000;
  s.disk_tier = true;
  s.wire = WireFormat::kBf16;
  return s;
}

TableSpec RoundTrip(const TableSpec& spec) {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(wire::SpecToWire(fbb, spec));
  TableSpec back;
  Status s = wire::SpecFromWire(flatbuffers::GetRoot<wire::TableSpec>(fbb.GetBufferPointer()), &back);
  EXPECT_TRUE(s.ok()) << s;
  return back;
}

void ExpectSameFields(const TableSpec& back, const TableSpec& spec) {
  EXPECT_EQ(back.name, spec.name);
  EXPECT_EQ(back.type, spec.type);
  EXPECT_EQ(back.shape, spec.shape);
  EXPECT_EQ(back.dim, spec.dim);
  EXPECT_EQ(back.chunk_elems, spec.chunk_elems);
  EXPECT_EQ(back.optimizer.type, spec.optimizer.type);
  EXPECT_EQ(back.optimizer.learning_rate, spec.optimizer.learning_rate);
  EXPECT_EQ(back.optimizer.momentum, spec.optimizer.momentum);
  EXPECT_EQ(back.optimizer.nesterov, spec.optimizer.nesterov);
  EXPECT_EQ(back.optimizer.beta1, spec.optimizer.beta1);
  EXPECT_EQ(back.optimizer.beta2, spec.optimizer.beta2);
  EXPECT_EQ(back.optimizer.epsilon, spec.optimizer.epsilon);
  EXPECT_EQ(back.optimizer.initial_accumulator, spec.optimizer.initial_accumulator);
  EXPECT_EQ(back.optimizer.l1, spec.optimizer.l1);
  EXPECT_EQ(back.optimizer.l2, spec.optimizer.l2);
  EXPECT_EQ(back.optimizer.beta, spec.optimizer.beta);
  EXPECT_EQ(back.optimizer.weight_decay, spec.optimizer.weight_decay);
  EXPECT_EQ(back.consistency, spec.consistency);
  EXPECT_EQ(back.staleness, spec.staleness);
  EXPECT_EQ(back.replicas_to_aggregate, spec.replicas_to_aggregate);
  EXPECT_EQ(back.init, spec.init);
  EXPECT_EQ(back.init_scale, spec.init_scale);
  EXPECT_EQ(back.seed, spec.seed);
  EXPECT_EQ(back.nonfinite, spec.nonfinite);
  EXPECT_EQ(back.admit_after, spec.admit_after);
  EXPECT_EQ(back.admit_probability, spec.admit_probability);
  EXPECT_EQ(back.evict_after_steps, spec.evict_after_steps);
  EXPECT_EQ(back.max_rows, spec.max_rows);
  EXPECT_EQ(back.wire, spec.wire);
  EXPECT_EQ(back.topk_ratio, spec.topk_ratio);
  EXPECT_EQ(back.disk_tier, spec.disk_tier);
  EXPECT_TRUE(back == spec) << "a field not listed above differs";
}

TEST(SpecRoundTrip, DenseSpecWithEveryFieldSet) {
  TableSpec spec = DenseWithEveryField();
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  ExpectSameFields(RoundTrip(spec), spec);
}

TEST(SpecRoundTrip, SparseSpecWithEveryFieldSet) {
  TableSpec spec = SparseWithEveryField();
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  ExpectSameFields(RoundTrip(spec), spec);
}

// Guards the fixtures themselves: for every field, one of them holds a value that is neither the
// C++ default nor the schema default (an empty wire table), so a dropped field cannot go unseen.
TEST(SpecRoundTrip, FixturesLeaveNoFieldAtADefault) {
  const TableSpec a = DenseWithEveryField(), b = SparseWithEveryField(), cpp;
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(wire::CreateTableSpec(fbb, 0, wire::TableType::Dense, 0, 0, 0,
                                   wire::CreateOptimizerSpec(fbb)));
  const wire::TableSpec* w = flatbuffers::GetRoot<wire::TableSpec>(fbb.GetBufferPointer());
  const wire::OptimizerSpec* wo = w->optimizer();
  ASSERT_NE(wo, nullptr);
  auto u8 = [](auto e) { return static_cast<uint8_t>(e); };
  // Each check: some fixture differs from the C++ default and from the wire default.
  auto covered = [](auto get, auto cpp_default, auto wire_default, const TableSpec& x, const TableSpec& y) {
    auto fresh = [&](const TableSpec& t) { return get(t) != cpp_default && get(t) != wire_default; };
    return fresh(x) || fresh(y);
  };
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.name; }, cpp.name, std::string(), a, b));
  EXPECT_TRUE(covered([&](const TableSpec& t) { return u8(t.type); }, u8(cpp.type), u8(w->type()), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.shape; }, cpp.shape, std::vector<int64_t>(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.dim; }, cpp.dim, w->dim(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.chunk_elems; }, cpp.chunk_elems, w->chunk_elems(), a, b));
  EXPECT_TRUE(covered([&](const TableSpec& t) { return u8(t.optimizer.type); }, u8(cpp.optimizer.type),
                      u8(wo->type()), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.optimizer.learning_rate; },
                      cpp.optimizer.learning_rate, wo->learning_rate(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.optimizer.momentum; }, cpp.optimizer.momentum,
                      wo->momentum(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.optimizer.nesterov; }, cpp.optimizer.nesterov,
                      wo->nesterov(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.optimizer.beta1; }, cpp.optimizer.beta1, wo->beta1(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.optimizer.beta2; }, cpp.optimizer.beta2, wo->beta2(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.optimizer.epsilon; }, cpp.optimizer.epsilon,
                      wo->epsilon(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.optimizer.initial_accumulator; },
                      cpp.optimizer.initial_accumulator, wo->initial_accumulator(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.optimizer.l1; }, cpp.optimizer.l1, wo->l1(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.optimizer.l2; }, cpp.optimizer.l2, wo->l2(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.optimizer.beta; }, cpp.optimizer.beta, wo->beta(), a, b));
  // Hyperparameters without a schema field travel by key; absent, they keep the C++ default.
  EXPECT_EQ(wo->hyper(), nullptr);
  for (const HyperParam& h : kHyperParams) {
    if (h.in_schema) continue;
    EXPECT_TRUE(covered([&](const TableSpec& t) { return GetHyper(t.optimizer, h); }, GetHyper(cpp.optimizer, h),
                        GetHyper(cpp.optimizer, h), a, b))
        << h.key;
  }
  EXPECT_TRUE(covered([&](const TableSpec& t) { return u8(t.consistency); }, u8(cpp.consistency),
                      u8(w->consistency()), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.staleness; }, cpp.staleness, w->staleness(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.replicas_to_aggregate; }, cpp.replicas_to_aggregate,
                      w->replicas_to_aggregate(), a, b));
  EXPECT_TRUE(covered([&](const TableSpec& t) { return u8(t.init); }, u8(cpp.init), u8(w->init()), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.init_scale; }, cpp.init_scale, w->init_scale(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.seed; }, cpp.seed, w->seed(), a, b));
  EXPECT_TRUE(
      covered([&](const TableSpec& t) { return u8(t.nonfinite); }, u8(cpp.nonfinite), u8(w->nonfinite()), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.admit_after; }, cpp.admit_after, w->admit_after(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.admit_probability; }, cpp.admit_probability,
                      w->admit_probability(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.evict_after_steps; }, cpp.evict_after_steps,
                      w->evict_after_steps(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.max_rows; }, cpp.max_rows, w->max_rows(), a, b));
  EXPECT_TRUE(covered([&](const TableSpec& t) { return u8(t.wire); }, u8(cpp.wire), u8(w->wire()), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.topk_ratio; }, cpp.topk_ratio, w->topk_ratio(), a, b));
  EXPECT_TRUE(covered([](const TableSpec& t) { return t.disk_tier; }, cpp.disk_tier, w->disk_tier(), a, b));
}

TEST(SpecRoundTrip, ADiskTierIsForSparseTablesWithMaxRowsAndForLife) {
  TableSpec t = SparseWithEveryField();
  t.disk_tier = false;
  ASSERT_TRUE(SetSpecOption(&t, "disk_tier", 1).ok());
  EXPECT_TRUE(t.disk_tier);
  EXPECT_TRUE(t.Validate().ok()) << t.Validate();
  EXPECT_NE(t.ToString().find("max_rows=5000 disk_tier=1"), std::string::npos) << t.ToString();
  EXPECT_FALSE(SetSpecOption(&t, "disk_tier", 0.5).ok());
  EXPECT_FALSE(SetSpecOption(&t, "disk_tier", 2).ok());
  TableSpec unbounded = t;
  unbounded.max_rows = 0;
  Status s = unbounded.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("disk_tier is for sparse tables with max_rows"), std::string::npos) << s;
  TableSpec dense = DenseWithEveryField();
  dense.disk_tier = true;
  EXPECT_EQ(dense.Validate().code(), StatusCode::kInvalidArgument);
  // A resumed job may not turn it on or off (its rows would be lost, or have nowhere to go).
  TableSpec off = t;
  off.disk_tier = false;
  const SpecChanges c = CompareSpecs(t, off);
  EXPECT_NE(c.fixed.find("disk_tier 1 -> 0"), std::string::npos) << c.fixed;
  EXPECT_TRUE(c.settings.empty()) << c.settings;
}

TEST(SpecRoundTrip, RowLifecycleSettingsAreCheckedAndForSparseTablesOnly) {
  TableSpec dense = DenseWithEveryField();
  dense.max_rows = 10;
  Status s = dense.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("are for sparse tables"), std::string::npos) << s;
  auto refused = [](void (*change)(TableSpec&), const char* field) {
    TableSpec t = SparseWithEveryField();
    change(t);
    const Status v = t.Validate();
    EXPECT_EQ(v.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(v.message().find(field), std::string::npos) << v;
  };
  refused([](TableSpec& t) { t.admit_after = 256; }, "admit_after");
  refused([](TableSpec& t) { t.admit_after = -1; }, "admit_after");
  refused([](TableSpec& t) { t.admit_probability = 0.0f; }, "admit_probability");
  refused([](TableSpec& t) { t.admit_probability = 1.5f; }, "admit_probability");
  refused([](TableSpec& t) { t.evict_after_steps = -2; }, "evict_after_steps");
  refused([](TableSpec& t) { t.max_rows = -1; }, "max_rows");
  TableSpec t = SparseWithEveryField();
  for (auto [key, value] : {std::pair{"admit_after", 2.0}, {"admit_probability", 0.5}, {"evict_after_steps", 7.0},
                            {"max_rows", 1000.0}}) {
    EXPECT_TRUE(SetSpecOption(&t, key, value).ok()) << key;
  }
  EXPECT_EQ(t.admit_after, 2);
  EXPECT_EQ(t.admit_probability, 0.5f);
  EXPECT_EQ(t.evict_after_steps, 7);
  EXPECT_EQ(t.max_rows, 1000);
  EXPECT_FALSE(SetSpecOption(&t, "admit_after", 1.5).ok());
  EXPECT_FALSE(SetSpecOption(&t, "admit_probability", 0).ok());
  EXPECT_FALSE(SetSpecOption(&t, "max_rows", -3).ok());
  EXPECT_NE(t.ToString().find("admit_after=2 admit_probability=0.5 evict_after_steps=7 max_rows=1000"),
            std::string::npos)
      << t.ToString();
  EXPECT_FALSE(TableSpec().has_lifecycle());
}

TEST(SpecRoundTrip, SkippingNonFiniteRowsIsForSparseTablesOnly) {
  TableSpec dense = DenseWithEveryField();
  dense.nonfinite = NonFinite::kSkipRows;
  const Status s = dense.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("skip_rows is for sparse tables"), std::string::npos) << s;
  NonFinite n = NonFinite::kRefuse;
  EXPECT_TRUE(ParseNonFinite("skip_rows", &n).ok());
  EXPECT_EQ(n, NonFinite::kSkipRows);
  EXPECT_FALSE(ParseNonFinite("skip", &n).ok());
  EXPECT_NE(SparseWithEveryField().ToString().find("nonfinite=skip_rows"), std::string::npos);
}


// Gradient compression (issue 17): wire formats by name, topk in (0, 1] for dense tables only;
// every refusal names the table and the key.
TEST(SpecRoundTrip, WireFormatAndTopkAreCheckedAndNamed) {
  ferry::WireFormat w = ferry::WireFormat::kF32;
  EXPECT_TRUE(ParseWireFormat("fp16", &w).ok());
  EXPECT_EQ(w, ferry::WireFormat::kF16);
  EXPECT_TRUE(ParseWireFormat("bf16", &w).ok());
  EXPECT_EQ(w, ferry::WireFormat::kBf16);
  EXPECT_TRUE(ParseWireFormat("f32", &w).ok());
  EXPECT_EQ(w, ferry::WireFormat::kF32);
  const Status bad_name = ParseWireFormat("fp8", &w);
  EXPECT_EQ(bad_name.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_name.message().find("'fp8' is not one of: f32, fp16, bf16"), std::string::npos) << bad_name;

  TableSpec t = DenseWithEveryField();
  EXPECT_TRUE(SetSpecOption(&t, "topk", 0.01).ok());
  EXPECT_EQ(t.topk_ratio, 0.01f);
  EXPECT_TRUE(SetSpecOption(&t, "topk", 0).ok());
  EXPECT_EQ(t.topk_ratio, 0.0f);
  for (double v : {-0.5, 1.5}) {
    const Status s = SetSpecOption(&t, "topk", v);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("topk must be in (0, 1]"), std::string::npos) << s;
  }
  auto refused = [](TableSpec t, const char* what) {
    const Status v = t.Validate();
    EXPECT_EQ(v.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(v.message().find("table '" + t.name + "'"), std::string::npos) << v;
    EXPECT_NE(v.message().find(what), std::string::npos) << v;
  };
  TableSpec sparse = SparseWithEveryField();
  sparse.topk_ratio = 0.5f;
  refused(sparse, "topk is for dense tables");
  TableSpec dense = DenseWithEveryField();
  dense.topk_ratio = 2.0f;
  refused(dense, "topk must be in (0, 1]");
  dense.topk_ratio = -1.0f;
  refused(dense, "topk must be in (0, 1]");
  dense.topk_ratio = std::nanf("");
  refused(dense, "topk must be in (0, 1]");
  dense = DenseWithEveryField();
  dense.shape = {int64_t{1} << 33};
  dense.chunk_elems = int64_t{1} << 33;
  refused(dense, "topk needs chunk_elems <= 2^32");
  dense = DenseWithEveryField();
  dense.wire = static_cast<ferry::WireFormat>(7);
  refused(dense, "unknown wire format 7");
  EXPECT_NE(DenseWithEveryField().ToString().find("wire=fp16 topk=0.25"), std::string::npos)
      << DenseWithEveryField().ToString();
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

// The keyed hyperparameters (protocol 1.7): a spec whose newer hyperparameters hold their defaults
// encodes as 1.6 did (no `hyper` list), and a list with a key the receiver does not know, or with
// a key that has its own field, is refused naming it.
TEST(SpecRoundTrip, KeyedHyperparametersAreOmittedAtDefaultsAndRefusedWhenUnknown) {
  TableSpec spec;
  spec.name = "w";
  spec.shape = {4};
  spec.optimizer.type = OptimizerType::kAdamW;
  {
    flatbuffers::FlatBufferBuilder fbb;
    fbb.Finish(wire::SpecToWire(fbb, spec));
    EXPECT_EQ(flatbuffers::GetRoot<wire::TableSpec>(fbb.GetBufferPointer())->optimizer()->hyper(), nullptr);
  }
  auto decode_with = [&](const char* key, float value) {
    flatbuffers::FlatBufferBuilder fbb;
    auto name = fbb.CreateString("w");
    auto shape = fbb.CreateVector(std::vector<int64_t>{4});
    std::vector<flatbuffers::Offset<wire::HyperValue>> list = {
        wire::CreateHyperValue(fbb, fbb.CreateString(key), value)};
    auto opt = wire::CreateOptimizerSpec(fbb, wire::OptimizerType::AdamW, 0.5f, 0.9f, 0.9f, 0.999f, 1e-8f, 0.1f,
                                         false, 0, 0, 1, fbb.CreateVector(list));
    fbb.Finish(wire::CreateTableSpec(fbb, name, wire::TableType::Dense, shape, 0, 16, opt));
    TableSpec back;
    Status s = wire::SpecFromWire(flatbuffers::GetRoot<wire::TableSpec>(fbb.GetBufferPointer()), &back);
    return std::pair{s, back};
  };
  auto [ok, back] = decode_with("weight_decay", 0.25f);
  ASSERT_TRUE(ok.ok()) << ok;
  EXPECT_EQ(back.optimizer.weight_decay, 0.25f);
  auto [unknown, _] = decode_with("weight_decya", 0.25f);
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("'weight_decya' is unknown to this server"), std::string::npos) << unknown;
  auto [named, __] = decode_with("momentum", 0.5f);
  EXPECT_NE(named.message().find("'momentum' has its own field"), std::string::npos) << named;
  auto [negative, ___] = decode_with("weight_decay", -1.0f);  // out of range: Validate names it
  EXPECT_NE(negative.message().find("adamw's weight_decay must be >= 0, got -1"), std::string::npos) << negative;
}

}  // namespace
}  // namespace ferry
