#include "ferry/table_spec.h"

#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>
#include <type_traits>

#include "ferry/nearest.h"

namespace ferry {

int64_t TableSpec::num_elements() const {
  if (type != TableType::kDense) return 0;
  int64_t n = 1;
  for (int64_t d : shape) {
    // A spec not yet validated (from the network) may hold any shape: no overflow, whatever it is.
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

int64_t TableSpec::num_chunks() const {
  if (type != TableType::kDense || chunk_elems <= 0) return 0;
  const int64_t n = num_elements();
  return n / chunk_elems + (n % chunk_elems != 0 ? 1 : 0);
}

Status TableSpec::Validate() const {
  auto bad = [&](const std::string& what) {
    return InvalidArgumentError("table '" + name + "': " + what);
  };
  if (name.empty()) return InvalidArgumentError("table spec: name is empty");
  if (name.size() > 256) return bad("name is longer than 256 characters");
  if (type == TableType::kDense) {
    if (shape.empty()) return bad("dense table needs a shape");
    __int128 n = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] <= 0) return bad("shape[" + std::to_string(i) + "] = " + std::to_string(shape[i]) + " must be > 0");
      n *= shape[i];
      if (n > (static_cast<__int128>(1) << 40)) return bad("shape has more than 2^40 elements");
    }
    if (chunk_elems <= 0) return bad("chunk_elems must be > 0");
    if (num_chunks() > (int64_t{1} << 24)) return bad("more than 2^24 chunks: raise chunk_elems");
    if (dim != 0) return bad("dim is for sparse tables; dense tables use shape");
  } else if (type == TableType::kSparse) {
    if (dim <= 0 || dim > (1 << 20)) return bad("sparse dim must be in [1, 2^20], got " + std::to_string(dim));
    if (!shape.empty()) return bad("shape is for dense tables; sparse tables use dim");
  } else {
    return bad("unknown table type");
  }
  if (Status o = ValidateOptimizer(optimizer); !o.ok()) return bad(o.message());
  if (static_cast<uint8_t>(consistency) > static_cast<uint8_t>(Consistency::kSsp)) return bad("unknown consistency");
  if (staleness < 0) return bad("staleness must be >= 0");
  if (consistency != Consistency::kSsp && staleness != 0) return bad("staleness is only for ssp tables");
  if (replicas_to_aggregate < 0) return bad("replicas_to_aggregate must be >= 0");
  if (consistency != Consistency::kSync && replicas_to_aggregate != 0)
    return bad("replicas_to_aggregate is only for sync tables");
  if (static_cast<uint8_t>(init) > static_cast<uint8_t>(InitType::kConstant)) return bad("unknown init");
  if (!std::isfinite(init_scale) || (init != InitType::kConstant && init_scale < 0))
    return bad("init_scale must be finite (and >= 0 unless init is constant)");
  if (static_cast<uint8_t>(nonfinite) > static_cast<uint8_t>(NonFinite::kSkipRows)) return bad("unknown nonfinite");
  if (nonfinite == NonFinite::kSkipRows && type != TableType::kSparse) {
    return bad("nonfinite=skip_rows is for sparse tables (a dense push with NaN/Inf is refused whole)");
  }
  if (admit_after < 0 || admit_after > 255)
    return bad("admit_after must be in [0, 255], got " + std::to_string(admit_after));
  if (!(admit_probability > 0.0f && admit_probability <= 1.0f)) {
    return bad("admit_probability must be in (0, 1], got " + std::to_string(admit_probability));
  }
  if (evict_after_steps < 0)
    return bad("evict_after_steps must be >= 0 (0: never), got " + std::to_string(evict_after_steps));
  if (max_rows < 0 || max_rows > (int64_t{1} << 40)) {
    return bad("max_rows must be in [0, 2^40] (0: no bound), got " + std::to_string(max_rows));
  }
  if (has_lifecycle() && type != TableType::kSparse) {
    return bad("admit_after, admit_probability, evict_after_steps and max_rows are for sparse tables");
  }
  if (disk_tier && (type != TableType::kSparse || max_rows <= 0)) {
    return bad("disk_tier is for sparse tables with max_rows (the rows of its RAM tier on each server)");
  }
  if (static_cast<uint8_t>(wire) > static_cast<uint8_t>(WireFormat::kBf16)) {
    return bad("unknown wire format " + std::to_string(static_cast<int>(wire)) + " (known: f32, fp16, bf16)");
  }
  if (!(topk_ratio >= 0.0f && topk_ratio <= 1.0f)) {
    return bad("topk must be in (0, 1] (0: off), got " + std::to_string(topk_ratio));
  }
  if (topk_ratio > 0.0f && type != TableType::kDense) {
    return bad("topk is for dense tables (a sparse push already sends only the rows it touched)");
  }
  if (topk_ratio > 0.0f && chunk_elems > (int64_t{1} << 32)) {
    return bad("topk needs chunk_elems <= 2^32 (its indices travel as uint32), got " + std::to_string(chunk_elems));
  }
  return Status::Ok();
}

std::string_view ConsistencyName(Consistency c) {
  switch (c) {
    case Consistency::kSync: return "sync";
    case Consistency::kAsync: return "async";
    case Consistency::kSsp: return "ssp";
  }
  return "?";
}

static std::string_view InitName(InitType t) {
  switch (t) {
    case InitType::kZeros: return "zeros";
    case InitType::kUniform: return "uniform";
    case InitType::kNormal: return "normal";
    case InitType::kConstant: return "constant";
  }
  return "?";
}

std::string TableSpec::ToString() const {
  std::ostringstream os;
  os << "{name=" << name << " type=" << (type == TableType::kDense ? "dense" : "sparse");
  if (type == TableType::kDense) {
    os << " shape=[";
    for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
    os << "] chunk_elems=" << chunk_elems;
  } else {
    os << " dim=" << dim;
  }
  os << " optimizer=" << OptimizerToString(optimizer);
  os << " consistency=" << ConsistencyName(consistency);
  if (consistency == Consistency::kSsp) os << ":" << staleness;
  if (consistency == Consistency::kSync) os << " replicas_to_aggregate=" << replicas_to_aggregate;
  os << " init=" << InitName(init) << "(" << init_scale << ") seed=" << seed;
  if (nonfinite == NonFinite::kSkipRows) os << " nonfinite=skip_rows";
  if (admit_after != 0) os << " admit_after=" << admit_after;
  if (admit_probability != 1.0f) os << " admit_probability=" << admit_probability;
  if (evict_after_steps != 0) os << " evict_after_steps=" << evict_after_steps;
  if (max_rows != 0) os << " max_rows=" << max_rows;
  if (disk_tier) os << " disk_tier=1";
  if (wire != WireFormat::kF32) os << " wire=" << WireFormatName(wire);
  if (topk_ratio != 0.0f) os << " topk=" << topk_ratio;
  os << "}";
  return os.str();
}

std::string_view WireFormatName(WireFormat w) {
  switch (w) {
    case WireFormat::kF32: return "f32";
    case WireFormat::kF16: return "fp16";
    case WireFormat::kBf16: return "bf16";
  }
  return "?";
}

Status ParseWireFormat(std::string_view text, WireFormat* out) {
  for (auto w : {WireFormat::kF32, WireFormat::kF16, WireFormat::kBf16}) {
    if (text == WireFormatName(w)) { *out = w; return Status::Ok(); }
  }
  return InvalidArgumentError("wire format '" + std::string(text) + "' is not one of: f32, fp16, bf16");
}

Status ParseNonFinite(std::string_view text, NonFinite* out) {
  if (text == "refuse") *out = NonFinite::kRefuse;
  else if (text == "skip_rows") *out = NonFinite::kSkipRows;
  else return InvalidArgumentError("nonfinite '" + std::string(text) + "' is neither refuse nor skip_rows");
  return Status::Ok();
}

Status ParseConsistency(std::string_view text, Consistency* consistency, int32_t* staleness) {
  if (text == "sync") { *consistency = Consistency::kSync; *staleness = 0; return Status::Ok(); }
  if (text == "async") { *consistency = Consistency::kAsync; *staleness = 0; return Status::Ok(); }
  if (text.starts_with("ssp:")) {
    std::string_view num = text.substr(4);
    int32_t s = -1;
    auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), s);
    if (ec == std::errc() && ptr == num.data() + num.size() && s >= 0) {
      *consistency = Consistency::kSsp;
      *staleness = s;
      return Status::Ok();
    }
  }
  return InvalidArgumentError("consistency '" + std::string(text) +
                              "' is not one of: sync, async, ssp:<s> (s a non-negative integer)");
}

Status ParseInitType(std::string_view text, InitType* type) {
  for (auto t : {InitType::kZeros, InitType::kUniform, InitType::kNormal, InitType::kConstant}) {
    if (text == InitName(t)) { *type = t; return Status::Ok(); }
  }
  return InvalidArgumentError("init '" + std::string(text) + "' is not one of: zeros, uniform, normal, constant");
}

uint64_t TableId(std::string_view name) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace ferry

namespace ferry {

namespace {

template <typename T>
std::string Show(const T& v) {
  std::ostringstream os;
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    os << "[";
    for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
    os << "]";
  } else if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "1" : "0");
  } else if constexpr (std::is_enum_v<T>) {
    os << static_cast<int>(v);
  } else {
    os << v;
  }
  return os.str();
}

}  // namespace

SpecChanges CompareSpecs(const TableSpec& a, const TableSpec& b) {
  SpecChanges c;
  auto note = [](std::string* out, std::string_view field, const std::string& from, const std::string& to) {
    if (from == to) return;
    if (!out->empty()) *out += ", ";
    *out += std::string(field) + " " + from + " -> " + to;
  };
  auto fixed = [&](std::string_view f, const auto& x, const auto& y) {
    if (!(x == y)) note(&c.fixed, f, Show(x), Show(y));
  };
  auto setting = [&](std::string_view f, const auto& x, const auto& y) {
    if (!(x == y)) note(&c.settings, f, Show(x), Show(y));
  };
  const OptimizerSpec &o = a.optimizer, &p = b.optimizer;
  fixed("name", a.name, b.name);
  fixed("type", std::string(a.type == TableType::kDense ? "dense" : "sparse"),
        std::string(b.type == TableType::kDense ? "dense" : "sparse"));
  fixed("shape", a.shape, b.shape);
  fixed("dim", a.dim, b.dim);
  fixed("chunk_elems", a.chunk_elems, b.chunk_elems);
  fixed("optimizer", std::string(OptimizerName(o.type)), std::string(OptimizerName(p.type)));
  fixed("consistency", std::string(ConsistencyName(a.consistency)), std::string(ConsistencyName(b.consistency)));
  fixed("staleness", a.staleness, b.staleness);
  fixed("replicas_to_aggregate", a.replicas_to_aggregate, b.replicas_to_aggregate);
  fixed("init", std::string(InitName(a.init)), std::string(InitName(b.init)));
  fixed("init_scale", a.init_scale, b.init_scale);
  fixed("seed", a.seed, b.seed);
  // A row lifecycle's settings change on resume; whether a table has one does not (its shard keeps
  // per-row clocks only with one).
  fixed("row lifecycle", std::string(a.has_lifecycle() ? "on" : "off"), std::string(b.has_lifecycle() ? "on" : "off"));
  fixed("disk_tier", a.disk_tier, b.disk_tier);
  setting("lr", o.learning_rate, p.learning_rate);
  for (const HyperParam& h : kHyperParams) setting(h.key, GetHyper(o, h), GetHyper(p, h));
  setting("wire", std::string(WireFormatName(a.wire)), std::string(WireFormatName(b.wire)));
  setting("topk", a.topk_ratio, b.topk_ratio);
  setting("skip_nonfinite_rows", a.nonfinite == NonFinite::kSkipRows, b.nonfinite == NonFinite::kSkipRows);
  if (a.has_lifecycle() && b.has_lifecycle()) {
    setting("admit_after", a.admit_after, b.admit_after);
    setting("admit_probability", a.admit_probability, b.admit_probability);
    setting("evict_after_steps", a.evict_after_steps, b.evict_after_steps);
    setting("max_rows", a.max_rows, b.max_rows);
  }
  return c;
}

void TakeSettings(const TableSpec& from, TableSpec* into) {
  const OptimizerType type = into->optimizer.type;
  into->optimizer = from.optimizer;
  into->optimizer.type = type;
  into->wire = from.wire;
  into->topk_ratio = from.topk_ratio;
  into->nonfinite = from.nonfinite;
  if (into->has_lifecycle() && from.has_lifecycle()) {
    into->admit_after = from.admit_after;
    into->admit_probability = from.admit_probability;
    into->evict_after_steps = from.evict_after_steps;
    into->max_rows = from.max_rows;
  }
}

namespace {

// The keys SetSpecOption takes besides the optimizer's hyperparameters.
constexpr std::string_view kTableKeys[] = {"chunk_elems", "replicas_to_aggregate", "skip_nonfinite_rows",
                                           "admit_after", "admit_probability", "evict_after_steps", "max_rows",
                                           "disk_tier", "topk"};

constexpr auto kSpecOptionKeys = [] {
  std::array<std::string_view, std::size(kHyperParams) + std::size(kTableKeys)> keys{};
  size_t i = 0;
  for (const HyperParam& h : kHyperParams) keys[i++] = h.key;
  for (std::string_view k : kTableKeys) keys[i++] = k;
  return keys;
}();

}  // namespace

std::span<const std::string_view> SpecOptionKeys() { return kSpecOptionKeys; }

Status SetSpecOption(TableSpec* spec, std::string_view k, double value) {
  auto invalid = [&](const std::string& why) { return InvalidArgumentError(std::string(k) + " " + why); };
  if (!std::isfinite(value)) return invalid("must be finite");
  auto whole = [&](int64_t lo, int64_t hi) {
    return value == std::floor(value) && value >= static_cast<double>(lo) && value <= static_cast<double>(hi);
  };
  TableSpec& s = *spec;
  const float f = static_cast<float>(value);
  if (const HyperParam* h = FindHyperParam(k)) {
    return SetHyper(&s.optimizer, *h, value);
  } else if (k == "chunk_elems") {
    if (!whole(1, int64_t{1} << 40)) return invalid("must be a whole number >= 1");
    s.chunk_elems = static_cast<int64_t>(value);
  } else if (k == "skip_nonfinite_rows") {
    if (!whole(0, 1)) return invalid("must be 0 or 1");
    s.nonfinite = value != 0 ? NonFinite::kSkipRows : NonFinite::kRefuse;
  } else if (k == "replicas_to_aggregate") {
    if (!whole(0, 65536)) return invalid("must be a whole number in [0, 65536]");
    s.replicas_to_aggregate = static_cast<int32_t>(value);
  } else if (k == "admit_after") {
    if (!whole(0, 255)) return invalid("must be a whole number in [0, 255]");
    s.admit_after = static_cast<int32_t>(value);
  } else if (k == "admit_probability") {
    if (!(value > 0 && value <= 1)) return invalid("must be in (0, 1]");
    s.admit_probability = f;
  } else if (k == "evict_after_steps") {
    if (!whole(0, int64_t{1} << 52)) return invalid("must be a whole number >= 0 (0: never)");
    s.evict_after_steps = static_cast<int64_t>(value);
  } else if (k == "max_rows") {
    if (!whole(0, int64_t{1} << 40)) return invalid("must be a whole number in [0, 2^40] (0: no bound)");
    s.max_rows = static_cast<int64_t>(value);
  } else if (k == "disk_tier") {
    if (!whole(0, 1)) return invalid("must be 0 or 1");
    s.disk_tier = value != 0;
  } else if (k == "topk") {
    if (!(value == 0 || (value > 0 && value <= 1))) return invalid("must be in (0, 1] (0: off)");
    s.topk_ratio = f;
  } else {
    return InvalidArgumentError("unknown key '" + std::string(k) + "'" + DidYouMean(k, SpecOptionKeys()) +
                                "; the keys are " + JoinNames(SpecOptionKeys()));
  }
  return Status::Ok();
}

}  // namespace ferry
