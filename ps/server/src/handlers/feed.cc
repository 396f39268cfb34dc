// Handler of Changes: the change feed (PROTOCOL.md, "The change feed"). A reader follows a table
// in rounds: a round's first page (position 0) cuts the table's feed clock, and its pages send
// what changed after the reader's cursor, scanning the table's rows (sparse) or chunks (dense) in
// slot order, each page a bounded piece of work on the I/O thread (kFeedScanWork units of work,
// about max_bytes of values), so training pauses no longer than one page's copy. The next
// round asks from the cut: whatever changed while a round was under way is sent again then.
#include <chrono>
#include <cstring>
#include <random>

#include "internal/server_impl.h"

namespace ferry::ps {
namespace {

// Units of work one sparse page does, at most (about a millisecond of the I/O thread): a slot
// looked at, or a block of SparseShard::kFeedBlock slots passed over as unchanged.
constexpr uint64_t kFeedScanWork = uint64_t{1} << 20;
constexpr int64_t kFeedDefaultBytes = int64_t{4} << 20;
// Dense chunks one page sends, at most (a message has at most wire::kMaxFrames frames).
constexpr int64_t kFeedMaxChunks = 1024;

uint64_t NewEpoch() {
  // One generator a thread: in-process servers' I/O threads start feeds at once.
  thread_local std::mt19937_64 gen{std::random_device{}() ^
                                   static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  uint64_t e = 0;
  while (e == 0) e = gen();
  return e;
}

}  // namespace

Status ServerImpl::OnChanges(Request& req) {
  const Header& h = *req.h();
  const std::string where = "server " + std::to_string(options_.rank);
  const ps::Table* found = tables_.Find(h.table_id());
  if (found == nullptr) {
    return NotFoundError(where + " has no table of id " + std::to_string(h.table_id()) +
                         " (not declared yet, or still being created)");
  }
  FERRY_ASSIGN_OR_RETURN(ps::Table * t, tables_.Find(h.table_id(), found->spec.type));
  if (h.cursor() < -1 || h.position() < 0 || h.max_bytes() < 0) {
    return InvalidArgumentError("cursor " + std::to_string(h.cursor()) + ", position " + std::to_string(h.position()) +
                                " or max_bytes " + std::to_string(h.max_bytes()) + " is negative");
  }
  const bool sparse = t->sparse != nullptr;
  if (t->feed_epoch == 0) {
    if (sparse) FERRY_RETURN_IF_ERROR(t->sparse->StartFeed().WithContext(where));
    t->feed_epoch = NewEpoch();
  }
  const int64_t clock = sparse ? t->sparse->feed_clock() : t->dense->feed_clock;
  int64_t cursor = h.cursor();
  int64_t position = h.position();
  bool full = false;  // this page begins a round of everything
  if ((cursor >= 0 || position > 0) && h.epoch() != t->feed_epoch) {
    full = true;  // another process's round (this server restarted): everything, from the start
  } else if (cursor >= clock) {
    return InvalidArgumentError("cursor " + std::to_string(cursor) + " of table '" + t->spec.name +
                                "' is ahead of its change feed on " + where + " (at " + std::to_string(clock) + ")");
  } else if (cursor >= 0 && position == 0 && sparse && cursor < t->sparse->feed_log_floor()) {
    full = true;  // the evictions since the cursor are no longer all logged
  } else if (cursor < 0 && position == 0) {
    full = true;
  }
  if (full) cursor = -1, position = 0;
  flatbuffers::FlatBufferBuilder fbb(256);
  const auto spec = wire::SpecToWire(fbb, t->spec);
  Frames payload;
  int64_t cut = -1;
  if (position == 0) cut = sparse ? t->sparse->Cut() : t->dense->feed_clock++;
  const int64_t max_bytes = h.max_bytes() > 0 ? h.max_bytes() : kFeedDefaultBytes;
  int64_t next = 0;
  int64_t sent = 0, num_deleted = 0;
  std::vector<wire::DenseSlice> slices;  // dense: the chunks sent
  if (sparse) {
    ps::SparseShard& shard = *t->sparse;
    const int64_t row_bytes = shard.dim() * static_cast<int64_t>(sizeof(float));
    const size_t max_rows = static_cast<size_t>(std::max<int64_t>(1, max_bytes / std::max<int64_t>(row_bytes, 1)));
    std::vector<int64_t> ids, deleted;
    std::vector<float> values;
    next = static_cast<int64_t>(
        shard.ScanChanged(cursor, static_cast<uint64_t>(position), max_rows, kFeedScanWork, &ids, &values));
    if (position == 0 && cursor >= 0) shard.EvictedSince(cursor, &deleted);
    sent = static_cast<int64_t>(ids.size());
    // (an empty frame for an empty list: nothing to hand over)
    auto frame = [](auto&& v) { return v.empty() ? zmq::message_t() : transport::Adopt(std::move(v)); };
    payload.push_back(frame(std::move(ids)));
    payload.push_back(frame(std::move(values)));
    num_deleted = static_cast<int64_t>(deleted.size());
    payload.push_back(frame(std::move(deleted)));
  } else {
    ps::DenseShard& shard = *t->dense;
    int64_t bytes = 0;
    int64_t c = position;
    for (; c < shard.num_chunks(); ++c) {
      const ps::DenseChunk* chunk = shard.chunk(c);
      if (chunk == nullptr || chunk->feed_seq <= cursor) continue;
      const int64_t chunk_bytes = chunk->size * static_cast<int64_t>(sizeof(float));
      if (!slices.empty() && (bytes + chunk_bytes > max_bytes || static_cast<int64_t>(slices.size()) >= kFeedMaxChunks))
        break;
      slices.emplace_back(t->id, c, chunk->size);
      zmq::message_t frame(static_cast<size_t>(chunk_bytes));
      std::memcpy(frame.data(), chunk->params.data(), static_cast<size_t>(chunk_bytes));
      payload.push_back(std::move(frame));
      bytes += chunk_bytes;
    }
    next = c >= shard.num_chunks() ? 0 : c;
    sent = static_cast<int64_t>(slices.size());
  }
  const auto vec = fbb.CreateVectorOfStructs(slices);
  wire::HeaderBuilder b = BeginReply(fbb, Kind::Changes, h.request_id());
  b.add_table_id(t->id);
  b.add_spec(spec);
  b.add_slices(vec);
  if (sparse) {
    b.add_num_ids(sent);
    b.add_dim(t->sparse->dim());
    b.add_num_deleted(num_deleted);
  }
  b.add_cursor(cut);
  b.add_position(next);
  b.add_epoch(t->feed_epoch);
  b.add_full(full);
  wire::FinishHeaderBuffer(fbb, b.Finish());
  Count(kFeedPages);
  Count(kFeedRowsSent, sent);
  Send(req, wire::ToFrame(fbb), std::move(payload));
  return Status::Ok();
}

}  // namespace ferry::ps
