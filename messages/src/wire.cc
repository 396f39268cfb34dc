#include "ferry/messages/wire.h"

#include "ferry/messages/codec.h"
#include "ferry/messages/kinds.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "ferry/nearest.h"

namespace ferry::wire {
namespace {

// a * b, or false on overflow past `limit`.
bool MulFits(int64_t a, int64_t b, int64_t limit, int64_t* out) {
  if (a < 0 || b < 0) return false;
  if (a != 0 && b > limit / a) return false;
  *out = a * b;
  return *out <= limit;
}

Status FrameSize(std::string_view what, const zmq::message_t& frame, int64_t count, int64_t elem_bytes) {
  int64_t want = 0;
  if (!MulFits(count, elem_bytes, std::numeric_limits<int64_t>::max() / 2, &want)) {
    return InvalidArgumentError(std::string(what) + ": count " + std::to_string(count) + " is out of range");
  }
  if (static_cast<int64_t>(frame.size()) != want) {
    return InvalidArgumentError(std::string(what) + " frame has " + std::to_string(frame.size()) +
                                " bytes, the header's count says " + std::to_string(want));
  }
  return Status::Ok();
}

Status FrameCount(const Header& h, size_t got, size_t want) {
  if (got == want) return Status::Ok();
  return InvalidArgumentError(std::string(KindName(h.kind())) + " carries " + std::to_string(got) +
                              " payload frames, expected " + std::to_string(want));
}

}  // namespace

std::string_view KindName(Kind kind) {
  const char* name = EnumNameKind(kind);
  return (name && *name) ? name : "UnknownKind";
}

Status VerifyHeader(zmq::message_t& frame, const Header** out) {
  if (frame.size() == 0) return InvalidArgumentError("empty header frame");
  if (frame.size() > kMaxHeaderBytes) {
    return InvalidArgumentError("header frame of " + std::to_string(frame.size()) + " bytes exceeds " +
                                std::to_string(kMaxHeaderBytes));
  }
  if (reinterpret_cast<uintptr_t>(frame.data()) % 8 != 0) {
    const size_t padded = (frame.size() + 7) / 8 * 8;
    void* aligned = std::aligned_alloc(8, padded);
    if (aligned == nullptr) return ResourceExhaustedError("out of memory copying a header frame");
    std::memcpy(aligned, frame.data(), frame.size());
    frame = zmq::message_t(aligned, frame.size(), [](void* p, void*) { std::free(p); }, nullptr);
  }
  const auto* data = static_cast<const uint8_t*>(frame.data());
  if (frame.size() < 8 || !flatbuffers::BufferHasIdentifier(data, HeaderIdentifier())) {
    return InvalidArgumentError("header frame is not a Ferry message (file identifier FRY1 missing)");
  }
  flatbuffers::Verifier verifier(data, frame.size(), /*max_depth=*/16, /*max_tables=*/1 << 16);
  if (!VerifyHeaderBuffer(verifier)) {
    return InvalidArgumentError("header frame fails FlatBuffers verification (truncated or corrupt)");
  }
  const Header* h = GetHeader(data);
  // FlatBuffers' verifier checks a vector's length field (4-byte aligned) but not that 8-byte
  // elements are 8-byte aligned; a builder aligns them (an empty vector it may not: nothing is
  // read from it), a forged header need not, and reading one misaligned is undefined behaviour
  // (found by tests/fuzz/fuzz_wire).
  auto aligned = [](const auto* v) {
    return v == nullptr || v->size() == 0 || reinterpret_cast<uintptr_t>(v->Data()) % 8 == 0;
  };
  if (!aligned(h->slices()) || !aligned(h->sparse()) || (h->spec() && !aligned(h->spec()->shape()))) {
    return InvalidArgumentError("header frame has a misaligned vector (not built by FlatBuffers)");
  }
  if (h->major() != kMajor) {
    *out = h;  // readable enough to match and answer (see wire.h)
    return FailedPreconditionError("protocol version " + std::to_string(h->major()) + "." + std::to_string(h->minor()) +
                                   " is not supported: this side speaks " + std::to_string(kMajor) + "." +
                                   std::to_string(kMinor) + " (major versions must match)");
  }
  if (FindKind(h->kind()) == nullptr) {
    return InvalidArgumentError("unknown message kind " + std::to_string(static_cast<int>(h->kind())));
  }
  *out = h;
  return Status::Ok();
}

Status CheckPayloadShape(const Header& h, std::span<const zmq::message_t> payload, const CodingOf& coding) {
  auto coding_of = [&](uint64_t table_id) { return coding ? coding(table_id) : TableCoding(); };
  const KindInfo* kind = FindKind(h.kind());
  switch (kind != nullptr ? kind->payload : Payload::kNone) {
    case Payload::kSliceValues: {
      const auto* slices = h.slices();
      if (!slices || slices->size() == 0)
        return InvalidArgumentError(std::string(KindName(h.kind())) + " has no slices");
      FERRY_RETURN_IF_ERROR(FrameCount(h, payload.size(), slices->size()));
      for (flatbuffers::uoffset_t i = 0; i < slices->size(); ++i) {
        const DenseSlice& sl = *slices->Get(i);
        const TableCoding c = coding_of(sl.table_id());
        const std::string what = "slice " + std::to_string(i);
        if (c.topk_ratio > 0.0f) {
          // k pairs of (uint32 index, value); the count is the chunk's length (checked by the receiver).
          if (sl.count() < 0 || sl.count() > (int64_t{1} << 32)) {
            return InvalidArgumentError(what + ": count " + std::to_string(sl.count()) + " is out of range for top-k");
          }
          FERRY_RETURN_IF_ERROR(FrameSize(what + " (top-k pairs)", payload[i], TopKCount(c.topk_ratio, sl.count()),
                                          4 + ValueBytes(c.wire)));
        } else {
          FERRY_RETURN_IF_ERROR(FrameSize(what, payload[i], sl.count(), ValueBytes(c.wire)));
        }
      }
      return Status::Ok();
    }
    case Payload::kSliceNames: {
      const auto* slices = h.slices();
      if (!slices || slices->size() == 0) {
        return InvalidArgumentError(std::string(KindName(h.kind())) + " has no slices");
      }
      if (slices->size() >= kMaxFrames) {
        return InvalidArgumentError(std::string(KindName(h.kind())) + " names " + std::to_string(slices->size()) +
                                    " slices; at most " + std::to_string(kMaxFrames - 1));
      }
      return FrameCount(h, payload.size(), 0);
    }
    case Payload::kIds:
      FERRY_RETURN_IF_ERROR(FrameCount(h, payload.size(), 1));
      return FrameSize("id", payload[0], h.num_ids(), 8);
    case Payload::kIdsAndRows: {
      FERRY_RETURN_IF_ERROR(FrameCount(h, payload.size(), 2));
      FERRY_RETURN_IF_ERROR(FrameSize("id", payload[0], h.num_ids(), 8));
      int64_t values = 0;
      if (!MulFits(h.num_ids(), h.dim(), std::numeric_limits<int64_t>::max() / 8, &values)) {
        return InvalidArgumentError("num_ids x dim is out of range");
      }
      return FrameSize("gradient", payload[1], values, ValueBytes(coding_of(h.table_id()).wire));
    }
    case Payload::kTablesIds:
    case Payload::kTablesIdsAndRows: {
      const bool push = kind->payload == Payload::kTablesIdsAndRows;
      const auto* tables = h.sparse();
      if (!tables || tables->size() == 0)
        return InvalidArgumentError(std::string(KindName(h.kind())) + " names no tables");
      const size_t per = push ? 2 : 1;
      if (tables->size() * per >= kMaxFrames) {
        return InvalidArgumentError(std::string(KindName(h.kind())) + " names " + std::to_string(tables->size()) +
                                    " tables; at most " + std::to_string((kMaxFrames - 1) / per));
      }
      FERRY_RETURN_IF_ERROR(FrameCount(h, payload.size(), tables->size() * per));
      for (flatbuffers::uoffset_t i = 0; i < tables->size(); ++i) {
        const SparseSlice& t = *tables->Get(i);
        const std::string which = "table " + std::to_string(i);
        FERRY_RETURN_IF_ERROR(FrameSize(which + " id", payload[i * per], t.num_ids(), 8));
        if (t.dim() < 1) return InvalidArgumentError(which + ": dim " + std::to_string(t.dim()) + " is not positive");
        if (!push) continue;
        int64_t values = 0;
        if (!MulFits(t.num_ids(), t.dim(), std::numeric_limits<int64_t>::max() / 8, &values)) {
          return InvalidArgumentError(which + ": num_ids x dim is out of range");
        }
        FERRY_RETURN_IF_ERROR(
            FrameSize(which + " gradient", payload[i * per + 1], values, ValueBytes(coding_of(t.table_id()).wire)));
      }
      return Status::Ok();
    }
    case Payload::kDoubles:
      FERRY_RETURN_IF_ERROR(FrameCount(h, payload.size(), 1));
      return FrameSize("value", payload[0], h.num_ids(), 8);
    case Payload::kUnchecked:
      return Status::Ok();  // the receiver checks replies against its own request
    case Payload::kNone:
      break;
  }
  return FrameCount(h, payload.size(), 0);
}

zmq::message_t ToFrame(const flatbuffers::FlatBufferBuilder& fbb) {
  return zmq::message_t(fbb.GetBufferPointer(), fbb.GetSize());
}

std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char c) {
    static constexpr char kHex[] = "0123456789abcdef";
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
  };
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      if (c < 0x20 && c != '\t' && c != '\n') {
        escape(c);
      } else if (c == 0x7f) {
        escape(c);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // The length of a well-formed sequence starting here (RFC 3629: no overlongs, no
    // surrogates, nothing above U+10FFFF), or 0.
    size_t len = 0;
    auto cont = [&](size_t k) { return i + k < n && (p[i + k] & 0xC0) == 0x80; };
    if (c >= 0xC2 && c <= 0xDF && cont(1)) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF && cont(1) && cont(2)) {
      const unsigned char c1 = p[i + 1];
      if (!(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 > 0x9F)) len = 3;
    } else if (c >= 0xF0 && c <= 0xF4 && cont(1) && cont(2) && cont(3)) {
      const unsigned char c1 = p[i + 1];
      if (!(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 > 0x8F)) len = 4;
    }
    if (len == 0) {
      escape(c);
      ++i;
    } else {
      out.append(text.data() + i, len);
      i += len;
    }
  }
  return out;
}

zmq::message_t MakeError(uint64_t request_id, Kind request_kind, const Status& status, uint64_t placement_version,
                         std::span<const uint16_t> owners) {
  flatbuffers::FlatBufferBuilder fbb(256 + status.message().size() + 2 * owners.size());
  flatbuffers::Offset<flatbuffers::Vector<uint16_t>> map;
  if (!owners.empty()) map = fbb.CreateVector(owners.data(), owners.size());
  auto msg = fbb.CreateString(Printable(status.message()));
  HeaderBuilder b(fbb);
  b.add_major(kMajor);
  b.add_minor(kMinor);
  b.add_kind(Kind::Error);
  b.add_request_id(request_id);
  b.add_request_kind(request_kind);
  b.add_error_code(static_cast<int>(status.code()));
  b.add_error_message(msg);
  if (placement_version != 0) b.add_placement_version(placement_version);
  if (!map.IsNull()) b.add_placement(map);
  FinishHeaderBuffer(fbb, b.Finish());
  return ToFrame(fbb);
}

zmq::message_t MakeReply(uint64_t request_id, Kind request_kind, int64_t version) {
  return MakeReply(request_id, request_kind, ReplyInfo{.version = version});
}

zmq::message_t MakeReply(uint64_t request_id, Kind request_kind, const ReplyInfo& info) {
  flatbuffers::FlatBufferBuilder fbb(128);
  HeaderBuilder b(fbb);
  b.add_major(kMajor);
  b.add_minor(kMinor);
  b.add_kind(Kind::Reply);
  b.add_request_id(request_id);
  b.add_request_kind(request_kind);
  b.add_version(info.version);
  b.add_used(info.used);
  b.add_dropped(info.dropped);
  b.add_held_us(info.held_us);
  FinishHeaderBuffer(fbb, b.Finish());
  return ToFrame(fbb);
}

Status ErrorStatus(const Header& h) {
  int code = h.error_code();
  if (code <= 0 || code > static_cast<int>(StatusCode::kDataLoss)) code = static_cast<int>(StatusCode::kUnknown);
  std::string msg = h.error_message() ? Printable(h.error_message()->string_view()) : "(no message)";
  return Status(static_cast<StatusCode>(code), std::move(msg));
}

namespace {

// The hyperparameters without a field of their own in the schema (`in_schema` false), by key;
// absent when all of them hold their defaults, so a spec of 1.6's optimizers encodes as 1.6 did.
flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<HyperValue>>> HypersToWire(
    flatbuffers::FlatBufferBuilder& fbb, const ferry::OptimizerSpec& o) {
  const ferry::OptimizerSpec defaults;
  std::vector<flatbuffers::Offset<HyperValue>> out;
  for (const HyperParam& h : kHyperParams) {
    if (h.in_schema || GetHyper(o, h) == GetHyper(defaults, h)) continue;
    out.push_back(CreateHyperValue(fbb, fbb.CreateString(h.key), static_cast<float>(GetHyper(o, h))));
  }
  return out.empty() ? 0 : fbb.CreateVector(out);
}

Status HypersFromWire(const OptimizerSpec& in, ferry::OptimizerSpec* o) {
  if (!in.hyper()) return Status::Ok();
  for (const HyperValue* v : *in.hyper()) {
    const std::string_view key = v->key() ? v->key()->string_view() : std::string_view();
    const HyperParam* h = FindHyperParam(key);
    if (!h) {
      return InvalidArgumentError("optimizer hyperparameter '" + Printable(key) + "' is unknown to this server " +
                                  "(it knows: " + JoinNames(HyperParamKeys()) + ")");
    }
    if (h->in_schema) {
      return InvalidArgumentError("optimizer hyperparameter '" + std::string(h->key) +
                                  "' has its own field; it may not travel by key");
    }
    FERRY_RETURN_IF_ERROR(SetHyper(o, *h, v->value()));
  }
  return Status::Ok();
}

}  // namespace

flatbuffers::Offset<wire::TableSpec> SpecToWire(flatbuffers::FlatBufferBuilder& fbb, const ferry::TableSpec& s) {
  auto name = fbb.CreateString(s.name);
  auto shape = fbb.CreateVector(s.shape);
  const auto& o = s.optimizer;
  auto hyper = HypersToWire(fbb, o);
  auto opt = CreateOptimizerSpec(fbb, static_cast<OptimizerType>(o.type), o.learning_rate, o.momentum, o.beta1,
                                 o.beta2, o.epsilon, o.initial_accumulator, o.nesterov, o.l1, o.l2, o.beta, hyper);
  return CreateTableSpec(fbb, name, static_cast<TableType>(s.type), shape, s.dim, s.chunk_elems, opt,
                         static_cast<ConsistencyType>(s.consistency), s.staleness, s.replicas_to_aggregate,
                         static_cast<InitType>(s.init), s.init_scale, s.seed, static_cast<NonFinite>(s.nonfinite),
                         s.admit_after, s.admit_probability, s.evict_after_steps, s.max_rows,
                         static_cast<wire::WireFormat>(s.wire), s.topk_ratio, s.disk_tier);
}

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::TableSteps>>> TableStepsToWire(
    flatbuffers::FlatBufferBuilder& fbb, const std::map<uint64_t, std::vector<int64_t>>& table_steps) {
  if (table_steps.empty()) return 0;
  std::map<std::vector<int64_t>, std::vector<uint64_t>> by_record;  // the tables of each record
  for (const auto& [table_id, steps] : table_steps) by_record[steps].push_back(table_id);
  std::vector<flatbuffers::Offset<wire::TableSteps>> records;
  for (const auto& [steps, ids] : by_record) {
    records.push_back(CreateTableSteps(fbb, fbb.CreateVector(ids), fbb.CreateVector(steps)));
  }
  return fbb.CreateVector(records);
}

Status SpecFromWire(const wire::TableSpec* in, ferry::TableSpec* out) {
  if (!in) return InvalidArgumentError("CreateTable without a spec");
  if (!in->name()) return InvalidArgumentError("table spec without a name");
  ferry::TableSpec s;
  s.name = in->name()->str();
  s.type = static_cast<ferry::TableType>(in->type());
  if (in->shape()) s.shape.assign(in->shape()->begin(), in->shape()->end());
  s.dim = in->dim();
  s.chunk_elems = in->chunk_elems();
  if (const auto* o = in->optimizer()) {
    s.optimizer.type = static_cast<ferry::OptimizerType>(o->type());
    s.optimizer.learning_rate = o->learning_rate();
    s.optimizer.momentum = o->momentum();
    s.optimizer.beta1 = o->beta1();
    s.optimizer.beta2 = o->beta2();
    s.optimizer.epsilon = o->epsilon();
    s.optimizer.initial_accumulator = o->initial_accumulator();
    s.optimizer.nesterov = o->nesterov();
    s.optimizer.l1 = o->l1();
    s.optimizer.l2 = o->l2();
    s.optimizer.beta = o->beta();
    FERRY_RETURN_IF_ERROR(HypersFromWire(*o, &s.optimizer));
  }
  s.consistency = static_cast<ferry::Consistency>(in->consistency());
  s.staleness = in->staleness();
  s.replicas_to_aggregate = in->replicas_to_aggregate();
  s.init = static_cast<ferry::InitType>(in->init());
  s.init_scale = in->init_scale();
  s.seed = in->seed();
  s.nonfinite = static_cast<ferry::NonFinite>(in->nonfinite());
  s.admit_after = in->admit_after();
  s.admit_probability = in->admit_probability();
  s.evict_after_steps = in->evict_after_steps();
  s.max_rows = in->max_rows();
  s.wire = static_cast<ferry::WireFormat>(in->wire());
  s.topk_ratio = in->topk_ratio();
  s.disk_tier = in->disk_tier();
  FERRY_RETURN_IF_ERROR(s.Validate());
  *out = std::move(s);
  return Status::Ok();
}

}  // namespace ferry::wire
