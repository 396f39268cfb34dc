// Compile-time proof that the two definitions of a table spec agree: ferry::TableSpec (the C++
// API, ferry/table_spec.h) and wire::TableSpec (messages/ferry.fbs). The schema is the protocol;
// the struct is what users write. If a field or an enumerator is added, removed or retyped on one
// side only, this file stops compiling and names the mismatch. That every field is also copied
// both ways by SpecToWire / SpecFromWire (wire.cc) is shown by tests/unit/spec_roundtrip_test.cc,
// which sets every field to a non-default value.
//
// Nothing here runs; the file holds only static_asserts.
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ferry/table_spec.h"
#include "ferry/messages/ferry_generated.h"

namespace ferry::wire {
namespace {

// ---- Enums: same underlying type, same value for every enumerator, nothing extra either side. ----
//
// The schema side: its MAX is the last C++ enumerator. The C++ side: each switch below lists every
// C++ enumerator with no default, and -Wswitch is an error in this file, so a C++ enumerator the
// schema lacks stops the build here.

#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"

template <typename A, typename B>
constexpr bool SameUnderlying = std::is_same_v<std::underlying_type_t<A>, std::underlying_type_t<B>>;

template <typename A, typename B>
constexpr bool Same(A a, B b) {
  return static_cast<std::underlying_type_t<A>>(a) == static_cast<std::underlying_type_t<B>>(b);
}

// true when `c` equals its schema twin.
constexpr bool Agrees(ferry::TableType c) {
  switch (c) {
    case ferry::TableType::kDense: return Same(c, TableType::Dense);
    case ferry::TableType::kSparse: return Same(c, TableType::Sparse) && Same(c, TableType::MAX);
  }
  return false;
}
constexpr bool Agrees(ferry::Consistency c) {
  switch (c) {
    case ferry::Consistency::kSync: return Same(c, ConsistencyType::Sync);
    case ferry::Consistency::kAsync: return Same(c, ConsistencyType::Async);
    case ferry::Consistency::kSsp: return Same(c, ConsistencyType::SSP) && Same(c, ConsistencyType::MAX);
  }
  return false;
}
constexpr bool Agrees(ferry::InitType c) {
  switch (c) {
    case ferry::InitType::kZeros: return Same(c, InitType::Zeros);
    case ferry::InitType::kUniform: return Same(c, InitType::Uniform);
    case ferry::InitType::kNormal: return Same(c, InitType::Normal);
    case ferry::InitType::kConstant: return Same(c, InitType::Constant) && Same(c, InitType::MAX);
  }
  return false;
}

constexpr bool Agrees(ferry::NonFinite c) {
  switch (c) {
    case ferry::NonFinite::kRefuse: return Same(c, NonFinite::Refuse);
    case ferry::NonFinite::kSkipRows: return Same(c, NonFinite::SkipRows) && Same(c, NonFinite::MAX);
  }
  return false;
}

constexpr bool Agrees(ferry::WireFormat c) {
  switch (c) {
    case ferry::WireFormat::kF32: return Same(c, WireFormat::F32);
    case ferry::WireFormat::kF16: return Same(c, WireFormat::F16);
    case ferry::WireFormat::kBf16: return Same(c, WireFormat::BF16) && Same(c, WireFormat::MAX);
  }
  return false;
}

#pragma GCC diagnostic pop

static_assert(SameUnderlying<ferry::TableType, TableType>);
static_assert(Agrees(ferry::TableType::kDense));
static_assert(Agrees(ferry::TableType::kSparse), "TableType: the schema's last value differs");

static_assert(SameUnderlying<ferry::OptimizerType, OptimizerType>);
// The optimizers: the catalogue (ferry/optimizers.h) is indexed by OptimizerType, so the schema's
// enum agrees when it has one value per descriptor.
static_assert(static_cast<size_t>(OptimizerType::MAX) + 1 == ferry::kNumOptimizers,
              "OptimizerType in ferry.fbs and the catalogue kOptimizers (ferry/optimizers.h) differ in size");

static_assert(SameUnderlying<ferry::Consistency, ConsistencyType>);
static_assert(Agrees(ferry::Consistency::kSync));
static_assert(Agrees(ferry::Consistency::kAsync));
static_assert(Agrees(ferry::Consistency::kSsp), "Consistency: the schema's last value differs");

static_assert(SameUnderlying<ferry::InitType, InitType>);
static_assert(Agrees(ferry::InitType::kZeros));
static_assert(Agrees(ferry::InitType::kUniform));
static_assert(Agrees(ferry::InitType::kNormal));
static_assert(Agrees(ferry::InitType::kConstant), "InitType: the schema's last value differs");

static_assert(SameUnderlying<ferry::NonFinite, NonFinite>);
static_assert(Agrees(ferry::NonFinite::kRefuse));
static_assert(Agrees(ferry::NonFinite::kSkipRows), "NonFinite: the schema's last value differs");

static_assert(SameUnderlying<ferry::WireFormat, WireFormat>);
static_assert(Agrees(ferry::WireFormat::kF32));
static_assert(Agrees(ferry::WireFormat::kF16));
static_assert(Agrees(ferry::WireFormat::kBf16), "WireFormat: the schema's last value differs");

// ---- Fields: count and type, in schema order. ----
//
// flatc gives CreateX(fbb, field0, field1, ...) one parameter per (non-deprecated) field in id
// order, so its parameter list is the schema table. The C++ struct's field count comes from
// aggregate initialisation: the largest N for which T{any, any, ...} (N values) compiles.

template <typename F>
struct Params;
template <typename R, typename... A>
struct Params<R (*)(A...)> {
  using type = std::tuple<A...>;
};
// Schema field `i` of the table built by `create` (0-based; the builder argument is skipped).
template <auto create, std::size_t i>
using SchemaField = std::tuple_element_t<i + 1, typename Params<decltype(create)>::type>;
template <auto create>
constexpr std::size_t kSchemaFields = std::tuple_size_v<typename Params<decltype(create)>::type> - 1;

struct AnyField {
  template <typename T>
  operator T() const;  // never defined: only used in unevaluated contexts
};
template <typename T, std::size_t... I>
constexpr bool BraceInitializableWith(std::index_sequence<I...>) {
  return requires { T{(static_cast<void>(I), AnyField{})...}; };
}
template <typename T, std::size_t n = 0>
constexpr std::size_t AggregateFieldCount() {
  if constexpr (BraceInitializableWith<T>(std::make_index_sequence<n + 1>{})) {
    return AggregateFieldCount<T, n + 1>();
  } else {
    return n;
  }
}

template <typename T>
using Offset = flatbuffers::Offset<T>;

// OptimizerSpec: schema ids 0..11: type, learning_rate, the hyperparameters of 1.6 and before (the
// catalogue's `in_schema` ones, in its order), then `hyper` (the others, by key).
constexpr auto kCreateOptimizer = &CreateOptimizerSpec;
static_assert(kSchemaFields<kCreateOptimizer> == 12, "OptimizerSpec in ferry.fbs changed: update this file");
constexpr size_t InSchemaHyperParams() {
  size_t n = 0;
  for (const HyperParam& h : kHyperParams) n += h.in_schema ? 1 : 0;
  return n;
}
static_assert(InSchemaHyperParams() == 9, "a hyperparameter without a schema field must have in_schema false");
using O = ferry::OptimizerSpec;
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 0>, OptimizerType>);  // type
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 1>, decltype(O::learning_rate)>);
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 2>, decltype(O::momentum)>);
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 3>, decltype(O::beta1)>);
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 4>, decltype(O::beta2)>);
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 5>, decltype(O::epsilon)>);
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 6>, decltype(O::initial_accumulator)>);
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 7>, decltype(O::nesterov)>);
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 8>, decltype(O::l1)>);
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 9>, decltype(O::l2)>);
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 10>, decltype(O::beta)>);
static_assert(std::is_same_v<SchemaField<kCreateOptimizer, 11>, Offset<flatbuffers::Vector<Offset<HyperValue>>>>);
static_assert(OptimizerSpec::VT_HYPER == 4 + 2 * 11, "schema OptimizerSpec ids are not 0..11");

// TableSpec: schema ids 0..18.
constexpr auto kCreateTable = &CreateTableSpec;
static_assert(std::is_aggregate_v<ferry::TableSpec>);
static_assert(kSchemaFields<kCreateTable> == 20, "TableSpec in ferry.fbs changed: update this file");
static_assert(AggregateFieldCount<ferry::TableSpec>() == kSchemaFields<kCreateTable>,
              "ferry::TableSpec and the schema's TableSpec have different field counts");
using T = ferry::TableSpec;
static_assert(std::is_same_v<decltype(T::name), std::string> &&
              std::is_same_v<SchemaField<kCreateTable, 0>, Offset<flatbuffers::String>>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 1>, TableType>);
static_assert(std::is_same_v<decltype(T::shape), std::vector<int64_t>> &&
              std::is_same_v<SchemaField<kCreateTable, 2>, Offset<flatbuffers::Vector<int64_t>>>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 3>, decltype(T::dim)>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 4>, decltype(T::chunk_elems)>);
static_assert(std::is_same_v<decltype(T::optimizer), ferry::OptimizerSpec> &&
              std::is_same_v<SchemaField<kCreateTable, 5>, Offset<OptimizerSpec>>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 6>, ConsistencyType>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 7>, decltype(T::staleness)>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 8>, decltype(T::replicas_to_aggregate)>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 9>, InitType>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 10>, decltype(T::init_scale)>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 11>, decltype(T::seed)>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 12>, NonFinite>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 13>, decltype(T::admit_after)>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 14>, decltype(T::admit_probability)>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 15>, decltype(T::evict_after_steps)>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 16>, decltype(T::max_rows)>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 17>, WireFormat>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 18>, decltype(T::topk_ratio)>);
static_assert(std::is_same_v<SchemaField<kCreateTable, 19>, decltype(T::disk_tier)>);
static_assert(TableSpec::VT_DISK_TIER == 4 + 2 * 19, "schema TableSpec ids are not 0..19");

}  // namespace
}  // namespace ferry::wire
