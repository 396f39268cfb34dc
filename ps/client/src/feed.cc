// The change feed's reader (ferry/feed.h): a DEALER socket per server, and per table and server
// the feed epoch and cursor of the last round that completed. A Poll sends every server its
// round's first page at once, then each server's next page as its reply comes, until every
// server's round is complete; every reply is checked whole before any of it is kept.
#include "ferry/feed.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <absl/container/flat_hash_map.h>

#include "ferry/messages/kinds.h"
#include "ferry/messages/placement.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;
using transport::Frames;
using wire::Header;
using wire::Kind;

// One server's part of a round, kept apart until the round is complete (a full page from it
// drops what it sent before).
struct Part {
  int64_t cursor = -1;  // what this round asks after
  int64_t cut = -1;     // this round's cut (its first page's reply)
  uint64_t epoch = 0;
  int64_t position = 0;  // the next page's
  bool full = false;
  bool done = false;
  uint64_t request_id = 0;
  Clock::time_point sent;
  std::vector<int64_t> deleted, ids;
  std::vector<float> rows;
  std::vector<TableChanges::Range> ranges;
  std::vector<float> values;
};

template <typename T>
void Append(std::vector<T>* to, const zmq::message_t& frame) {
  const size_t n = frame.size() / sizeof(T);
  const size_t at = to->size();
  to->resize(at + n);
  if (n > 0) std::memcpy(to->data() + at, frame.data(), n * sizeof(T));
}

class FeedImpl final : public ChangeFeed {
 public:
  explicit FeedImpl(FeedOptions options) : options_(std::move(options)) {}

  Status Open() {
    if (options_.servers.empty()) return InvalidArgumentError("a change feed needs at least one server");
    if (!options_.context) options_.context = Context::Create();
    for (size_t s = 0; s < options_.servers.size(); ++s) {
      FERRY_ASSIGN_OR_RETURN(zmq::socket_t sock, OpenSocket(static_cast<int>(s)));
      sockets_.push_back(std::move(sock));
    }
    return Status::Ok();
  }

  int num_servers() const override { return static_cast<int>(sockets_.size()); }

  Status Poll(std::string_view table, TableChanges* out) override {
    *out = TableChanges{};
    const uint64_t table_id = TableId(table);
    auto& kept = cursors_[std::string(table)];  // per server: (epoch, cursor) of the last round done
    kept.resize(sockets_.size(), {0, -1});
    std::vector<Part> parts(sockets_.size());
    for (size_t s = 0; s < parts.size(); ++s) {
      parts[s].epoch = kept[s].first;
      parts[s].cursor = kept[s].second;
      FERRY_RETURN_IF_ERROR(Ask(static_cast<int>(s), table_id, &parts[s]));
    }
    std::optional<TableSpec> spec;
    size_t open = parts.size();
    std::vector<zmq_pollitem_t> items(sockets_.size());
    while (open > 0) {
      const auto now = Clock::now();
      int wait_ms = static_cast<int>(options_.request_timeout.count());
      for (size_t s = 0; s < parts.size(); ++s) {
        if (parts[s].done) continue;
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(parts[s].sent +
                                                                                 options_.request_timeout - now);
        if (left.count() <= 0) {
          Reset(static_cast<int>(s));  // a late reply must not answer the next Poll's request
          return DeadlineExceededError("change feed: " + ServerName(static_cast<int>(s)) + " sent no page of table '" +
                                       std::string(table) + "' in " + std::to_string(options_.request_timeout.count()) +
                                       " ms");
        }
        wait_ms = std::min<int>(wait_ms, static_cast<int>(left.count()) + 1);
      }
      for (size_t s = 0; s < sockets_.size(); ++s) items[s] = zmq_pollitem_t{sockets_[s].handle(), 0, ZMQ_POLLIN, 0};
      zmq_poll(items.data(), static_cast<int>(items.size()), wait_ms);  // (then every socket is read anyway)
      for (size_t s = 0; s < sockets_.size(); ++s) {
        for (;;) {
          Frames frames;
          bool got = false, truncated = false;
          FERRY_RETURN_IF_ERROR(
              transport::RecvNonBlocking(sockets_[s], &frames, &got, wire::kMaxFrames, &truncated)
                  .WithContext("change feed: " + ServerName(static_cast<int>(s))));
          if (!got) break;
          Part& p = parts[s];
          const Header* h = nullptr;
          if (frames.empty() || !wire::VerifyHeader(frames[0], &h).ok() || truncated) {
            return DataLossError("change feed: " + ServerName(static_cast<int>(s)) + " sent a malformed reply");
          }
          if (p.done || h->request_id() != p.request_id) continue;  // an answer to a request given up on
          if (h->kind() == Kind::Error) {
            return wire::ErrorStatus(*h).WithContext("change feed: " + ServerName(static_cast<int>(s)) +
                                                     ", table '" + std::string(table) + "'");
          }
          const Status taken = Take(table_id, *h, frames, &p, &spec);
          if (!taken.ok()) {
            return taken.WithContext("change feed: " + ServerName(static_cast<int>(s)) + ", table '" +
                                     std::string(table) + "'");
          }
          ++out->pages;
          if (p.position == 0) {
            p.done = true;
            --open;
          } else {
            FERRY_RETURN_IF_ERROR(Ask(static_cast<int>(s), table_id, &p));
          }
        }
      }
    }
    out->spec = *spec;
    for (size_t s = 0; s < parts.size(); ++s) {
      Part& p = parts[s];
      kept[s] = {p.epoch, p.cut};
      if (p.full) out->full_servers.push_back(static_cast<int>(s));
      out->deleted.insert(out->deleted.end(), p.deleted.begin(), p.deleted.end());
      out->ids.insert(out->ids.end(), p.ids.begin(), p.ids.end());
      out->rows.insert(out->rows.end(), p.rows.begin(), p.rows.end());
      out->ranges.insert(out->ranges.end(), p.ranges.begin(), p.ranges.end());
      out->values.insert(out->values.end(), p.values.begin(), p.values.end());
    }
    return Status::Ok();
  }

 private:
  std::string ServerName(int s) const {
    return "server " + std::to_string(s) + " (" + options_.servers[static_cast<size_t>(s)] + ")";
  }

  // Sends server s its next page's request.
  Status Ask(int s, uint64_t table_id, Part* p) {
    flatbuffers::FlatBufferBuilder fbb(128);
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(Kind::Changes);
    p->request_id = next_request_id_++;
    b.add_request_id(p->request_id);
    b.add_table_id(table_id);
    b.add_cursor(p->cursor);
    b.add_position(p->position);
    b.add_epoch(p->epoch);
    b.add_max_bytes(options_.page_bytes);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    Frames frames;
    frames.push_back(wire::ToFrame(fbb));
    p->sent = Clock::now();
    return transport::Send(sockets_[static_cast<size_t>(s)], frames, /*dontwait=*/true)
        .WithContext("change feed: sending to " + ServerName(s));
  }

  // Checks one page whole, then keeps it in `p`.
  static Status Take(uint64_t table_id, const Header& h, const Frames& frames, Part* p,
                     std::optional<TableSpec>* spec) {
    if (h.kind() != Kind::Reply || h.request_kind() != Kind::Changes || h.table_id() != table_id) {
      return DataLossError("the reply is not the Changes page of this table");
    }
    TableSpec got;
    FERRY_RETURN_IF_ERROR(wire::SpecFromWire(h.spec(), &got));
    if (spec->has_value() && ((*spec)->type != got.type || (*spec)->dim != got.dim || (*spec)->shape != got.shape ||
                              (*spec)->chunk_elems != got.chunk_elems)) {
      return FailedPreconditionError("the servers disagree on the table's shape");
    }
    *spec = got;
    if (h.full()) {  // everything this server holds, from its start: drop what it sent before
      p->full = true;
      p->cursor = -1;
      p->deleted.clear(), p->ids.clear(), p->rows.clear(), p->ranges.clear(), p->values.clear();
    }
    if (h.cursor() >= 0) p->cut = h.cursor();  // a round's first page
    if (h.position() < 0 || (h.position() > 0 && h.position() <= p->position && !h.full())) {
      return DataLossError("the next page's position " + std::to_string(h.position()) + " does not move on from " +
                           std::to_string(p->position));
    }
    p->epoch = h.epoch();
    const size_t payload = frames.size() - 1;
    if (got.type == TableType::kSparse) {
      const int64_t n = h.num_ids(), m = h.num_deleted(), dim = got.dim;
      if (payload != 3 || n < 0 || m < 0 || h.dim() != dim || frames[1].size() != static_cast<size_t>(n) * 8 ||
          frames[2].size() != static_cast<size_t>(n) * static_cast<size_t>(dim) * 4 ||
          frames[3].size() != static_cast<size_t>(m) * 8) {
        return DataLossError("a sparse page's frames do not match its counts");
      }
      Append(&p->ids, frames[1]);
      Append(&p->rows, frames[2]);
      Append(&p->deleted, frames[3]);
    } else {
      const auto* slices = h.slices();
      const size_t k = slices == nullptr ? 0 : slices->size();
      if (payload != k) return DataLossError("a dense page's frames do not match its chunks");
      int64_t total = 1;
      for (int64_t d : got.shape) total *= d;
      const int64_t per = got.chunk_elems > 0 ? got.chunk_elems : total;
      for (size_t i = 0; i < k; ++i) {
        const wire::DenseSlice* sl = slices->Get(static_cast<flatbuffers::uoffset_t>(i));
        if (per <= 0 || sl->chunk() < 0 || sl->chunk() >= (total + per - 1) / per) {
          return DataLossError("chunk " + std::to_string(sl->chunk()) + " of a dense page is not the table's");
        }
        const int64_t begin = sl->chunk() * per;
        if (sl->count() != std::min(per, total - begin) ||
            frames[i + 1].size() != static_cast<size_t>(sl->count()) * 4) {
          return DataLossError("chunk " + std::to_string(sl->chunk()) + " of a dense page does not fit the table");
        }
        p->ranges.push_back({begin, begin + sl->count()});
        Append(&p->values, frames[i + 1]);
      }
    }
    p->position = h.position();
    return Status::Ok();
  }

  // A socket connected to server s, with this feed's CURVE keys.
  StatusOr<zmq::socket_t> OpenSocket(int s) {
    FERRY_ASSIGN_OR_RETURN(zmq::socket_t sock,
                           transport::MakeSocket(transport::Zmq(*options_.context), zmq::socket_type::dealer));
    if (options_.curve) {
      FERRY_RETURN_IF_ERROR(curve::SetClientKeys(sock.handle(), *options_.curve).WithContext("change feed"));
    }
    try {
      sock.connect(options_.servers[static_cast<size_t>(s)]);
    } catch (const zmq::error_t& e) {
      return InvalidArgumentError("change feed: cannot connect to " + ServerName(s) + ": " + e.what());
    }
    return sock;
  }

  // A new socket to server s: what the old one had queued (a late reply) goes with it.
  void Reset(int s) {
    if (auto sock = OpenSocket(s); sock.ok()) sockets_[static_cast<size_t>(s)] = std::move(*sock);
  }

  FeedOptions options_;
  std::vector<zmq::socket_t> sockets_;
  std::map<std::string, std::vector<std::pair<uint64_t, int64_t>>, std::less<>> cursors_;
  uint64_t next_request_id_ = 1;
};

}  // namespace

struct TableCopy::Impl {
  std::optional<TableSpec> spec;
  absl::flat_hash_map<int64_t, size_t> slot;  // sparse: id -> its row's first value in `values`
  std::vector<float> values;                  // sparse rows; dense: the tensor
  std::vector<size_t> free;                   // sparse: slots of rows deleted
};

TableCopy::TableCopy() : impl_(std::make_unique<Impl>()) {}
TableCopy::~TableCopy() = default;
TableCopy::TableCopy(TableCopy&&) noexcept = default;
TableCopy& TableCopy::operator=(TableCopy&&) noexcept = default;

Status TableCopy::Apply(const TableChanges& c, int num_servers) {
  Impl& m = *impl_;
  if (m.spec && (m.spec->name != c.spec.name || m.spec->type != c.spec.type || m.spec->dim != c.spec.dim ||
                 m.spec->shape != c.spec.shape || m.spec->chunk_elems != c.spec.chunk_elems)) {
    return InvalidArgumentError("changes of table '" + c.spec.name + "' applied to a copy of '" + m.spec->name +
                                "', or of another shape");
  }
  const size_t dim = static_cast<size_t>(c.spec.dim);
  int64_t elements = 1;  // dense
  for (int64_t d : c.spec.shape) elements *= d;
  // Checked whole before anything changes (a TableChanges a program built itself may be wrong).
  if (c.spec.type == TableType::kSparse) {
    if (c.rows.size() != c.ids.size() * dim) {
      return InvalidArgumentError("changes of '" + c.spec.name + "': " + std::to_string(c.rows.size()) +
                                  " row values for " + std::to_string(c.ids.size()) + " ids of dim " +
                                  std::to_string(dim));
    }
  } else {
    size_t total = 0;
    for (const TableChanges::Range& r : c.ranges) {
      if (r.begin < 0 || r.begin > r.end || r.end > elements) {
        return InvalidArgumentError("changes of '" + c.spec.name + "': range [" + std::to_string(r.begin) + ", " +
                                    std::to_string(r.end) + ") is not within the tensor");
      }
      total += static_cast<size_t>(r.end - r.begin);
    }
    if (total != c.values.size()) {
      return InvalidArgumentError("changes of '" + c.spec.name + "': " + std::to_string(c.values.size()) +
                                  " values for ranges of " + std::to_string(total));
    }
  }
  if (!m.spec) {
    m.spec = c.spec;
    if (c.spec.type == TableType::kDense) m.values.assign(static_cast<size_t>(elements), 0.0f);
  }
  auto erase = [&](int64_t id) {
    if (auto it = m.slot.find(id); it != m.slot.end()) {
      m.free.push_back(it->second);
      m.slot.erase(it);
    }
  };
  if (c.spec.type == TableType::kSparse) {
    for (int s : c.full_servers) {
      std::vector<int64_t> gone;
      for (const auto& [id, at] : m.slot) {
        if (placement::IdServer(id, num_servers) == s) gone.push_back(id);
      }
      for (int64_t id : gone) erase(id);
    }
    for (int64_t id : c.deleted) erase(id);
    for (size_t i = 0; i < c.ids.size(); ++i) {
      auto [it, fresh] = m.slot.try_emplace(c.ids[i], 0);
      if (fresh) {
        if (!m.free.empty()) {
          it->second = m.free.back();
          m.free.pop_back();
        } else {
          it->second = m.values.size();
          m.values.resize(m.values.size() + dim);
        }
      }
      std::memcpy(m.values.data() + it->second, c.rows.data() + i * dim, dim * sizeof(float));
    }
    return Status::Ok();
  }
  // Dense: a full server's chunks are all in its ranges (a dense chunk is never deleted).
  size_t at = 0;
  for (const TableChanges::Range& r : c.ranges) {
    const size_t n = static_cast<size_t>(r.end - r.begin);
    std::memcpy(m.values.data() + r.begin, c.values.data() + at, n * sizeof(float));
    at += n;
  }
  return Status::Ok();
}

const TableSpec& TableCopy::spec() const {
  static const TableSpec kNone;
  return impl_->spec ? *impl_->spec : kNone;
}
size_t TableCopy::size() const { return impl_->slot.size(); }
const float* TableCopy::row(int64_t id) const {
  auto it = impl_->slot.find(id);
  return it == impl_->slot.end() ? nullptr : impl_->values.data() + it->second;
}
std::vector<int64_t> TableCopy::ids() const {
  std::vector<int64_t> out;
  out.reserve(impl_->slot.size());
  for (const auto& [id, at] : impl_->slot) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}
const std::vector<float>& TableCopy::dense() const { return impl_->values; }

StatusOr<std::unique_ptr<ChangeFeed>> ChangeFeed::Connect(FeedOptions options) {
  auto feed = std::make_unique<FeedImpl>(std::move(options));
  FERRY_RETURN_IF_ERROR(feed->Open());
  return std::unique_ptr<ChangeFeed>(std::move(feed));
}

}  // namespace ferry
