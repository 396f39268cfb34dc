// Failover (protocol 1.22): the image of a registry's slots, and a replacement server's fetch of
// its state from its peers (recovery.h).
#include "internal/recovery.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include <unistd.h>

#include "ferry/messages/kinds.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "internal/byte_reader.h"
#include "internal/checkpoint.h"
#include "internal/sync.h"
#include "internal/workers.h"

namespace ferry::ps {
namespace {

using Clock = std::chrono::steady_clock;

template <typename T>
void Put(std::vector<char>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}


template <typename Fn>
void ForEachUnit(const TableRegistry& tables, Fn&& fn) {
  tables.ForEach([&](const Table& t) {
    if (t.dense) {
      for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
        if (const DenseChunk* c = t.dense->chunk(i)) fn(t, i, c->steps_taken, c->sync);
      }
    } else {
      fn(t, int64_t{-1}, t.sparse->steps_taken, t.sparse->sync);
    }
  });
}

void PutBlock(std::vector<char>& out, const zmq::message_t* m) {
  const size_t n = m != nullptr ? m->size() : 0;
  Put<uint64_t>(out, n);
  if (n > 0) out.insert(out.end(), static_cast<const char*>(m->data()), static_cast<const char*>(m->data()) + n);
}

// A gradient held for a sync step, as the image has it.
struct Held {
  int64_t rank = 0;
  std::span<const char> ids;  // (dense: empty)
  std::span<const char> grads;
};

struct UnitImage {
  std::vector<int64_t> taken;
  std::vector<Held> held;
};

// Puts `held` into `sync` (of a unit of `t`; `floats`: a dense chunk's length, 0 for the sparse
// shard), each marked as restored, once each is checked against the table.
Status RestoreHeld(const Table& t, int64_t floats, const std::vector<Held>& held, int num_workers,
                   SyncSlots& sync, const std::string& where) {
  if (!held.empty() && t.spec.consistency != Consistency::kSync) {
    return DataLossError(where + ": gradients held for table '" + t.spec.name + "', which is not sync");
  }
  if (t.spec.consistency != Consistency::kSync) return Status::Ok();
  const bool sparse = floats == 0;
  sync.Reset(num_workers, sparse);
  sync.restored.assign(static_cast<size_t>(num_workers), false);
  const size_t row_bytes = static_cast<size_t>(t.spec.dim) * sizeof(float);
  for (const Held& h : held) {
    const size_t r = static_cast<size_t>(h.rank);
    const bool fits = sparse ? h.ids.size() % 8 == 0 && row_bytes > 0 && h.grads.size() % row_bytes == 0 &&
                                   h.grads.size() / row_bytes == h.ids.size() / 8
                             : h.ids.empty() && h.grads.size() == static_cast<size_t>(floats) * sizeof(float);
    if (h.rank < 0 || h.rank >= num_workers || sync.by_rank[r] || !fits) {
      return DataLossError(where + ": a gradient held for table '" + t.spec.name + "' that does not fit it (rank " +
                           std::to_string(h.rank) + ", " + std::to_string(h.ids.size()) + " id bytes, " +
                           std::to_string(h.grads.size()) + " gradient bytes)");
    }
    zmq::message_t grads(h.grads.data(), h.grads.size());
    if (sparse) {
      HoldGradient(sync, static_cast<int>(h.rank), zmq::message_t(h.ids.data(), h.ids.size()), std::move(grads));
    } else {
      HoldGradient(sync, static_cast<int>(h.rank), std::move(grads));
    }
    sync.restored[r] = true;
  }
  return Status::Ok();
}

}  // namespace

uint64_t NewProcessEpoch() {
  std::random_device rd;
  uint64_t e = 0;
  while (e == 0) e = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  return e;
}

std::vector<char> EncodeImage(const TableRegistry& tables, const std::vector<WorkerState>& workers) {
  ShardImage image = CopyShard(tables);
  std::vector<char> out;
  out.reserve(image.bytes.size() + 64);
  Put<uint64_t>(out, image.bytes.size());
  out.insert(out.end(), image.bytes.begin(), image.bytes.end());
  image = {};
  uint64_t units = 0;
  ForEachUnit(tables, [&](const Table&, int64_t, const StepsTaken&, const SyncSlots&) { ++units; });
  Put<uint64_t>(out, units);
  ForEachUnit(tables, [&](const Table& t, int64_t chunk, const StepsTaken& s, const SyncSlots& sync) {
    Put<uint64_t>(out, t.id);
    Put<int64_t>(out, chunk);
    Put<uint64_t>(out, s.taken.size());
    for (const int64_t v : s.taken) Put<int64_t>(out, v);
    // 1.23: the gradients a sync table holds for its open step.
    uint64_t held = 0;
    for (const auto& g : sync.by_rank) held += g.has_value() ? 1 : 0;
    Put<uint64_t>(out, held);
    for (size_t r = 0; r < sync.by_rank.size(); ++r) {
      if (!sync.by_rank[r]) continue;
      Put<int64_t>(out, static_cast<int64_t>(r));
      PutBlock(out, r < sync.ids_by_rank.size() && sync.ids_by_rank[r] ? &*sync.ids_by_rank[r] : nullptr);
      PutBlock(out, &*sync.by_rank[r]);
    }
  });
  Put<uint64_t>(out, workers.size());
  for (const WorkerState& w : workers) {
    Put<int64_t>(out, w.clock);
    Put<uint8_t>(out, static_cast<uint8_t>((w.finished ? 1 : 0) | (w.left ? 2 : 0)));
  }
  Put<uint32_t>(out, Crc32(0, out.data(), out.size()));
  return out;
}

Status RestoreImage(std::span<const char> blob, int rank, int num_workers, TableRegistry* tables,
                    const std::string& where, std::vector<WorkerState>* workers) {
  if (blob.size() < 4) return DataLossError(where + ": " + std::to_string(blob.size()) + " bytes, not an image");
  uint32_t crc = 0;
  std::memcpy(&crc, blob.data() + blob.size() - 4, 4);
  if (Crc32(0, blob.data(), blob.size() - 4) != crc) return DataLossError(where + ": its checksum does not verify");
  Reader c(blob.first(blob.size() - 4), where, "the image");
  uint64_t n = 0;
  std::span<const char> shard;
  FERRY_RETURN_IF_ERROR(c.Get(&n));
  FERRY_RETURN_IF_ERROR(c.GetBytes(&shard, n));
  FERRY_ASSIGN_OR_RETURN(CheckpointData data, ParseShardImage(shard, where));
  FERRY_RETURN_IF_ERROR(RestoreShard(data, rank, num_workers, tables));
  uint64_t units = 0;
  FERRY_RETURN_IF_ERROR(c.Get(&units));
  std::map<std::pair<uint64_t, int64_t>, UnitImage> taken;
  for (uint64_t u = 0; u < units; ++u) {
    uint64_t id = 0, k = 0, held = 0;
    int64_t chunk = 0;
    FERRY_RETURN_IF_ERROR(c.Get(&id));
    FERRY_RETURN_IF_ERROR(c.Get(&chunk));
    FERRY_RETURN_IF_ERROR(c.Get(&k));
    if (k > static_cast<uint64_t>(num_workers) || k > c.left() / 8) {
      return DataLossError(where + ": steps of " + std::to_string(k) + " workers for a job of " +
                           std::to_string(num_workers));
    }
    UnitImage unit;
    unit.taken.resize(static_cast<size_t>(k));
    for (auto& s : unit.taken) FERRY_RETURN_IF_ERROR(c.Get(&s));
    FERRY_RETURN_IF_ERROR(c.Get(&held));
    if (held > static_cast<uint64_t>(num_workers)) {
      return DataLossError(where + ": " + std::to_string(held) + " held gradients for a job of " +
                           std::to_string(num_workers) + " workers");
    }
    unit.held.resize(static_cast<size_t>(held));
    for (Held& g : unit.held) {
      uint64_t n = 0;
      FERRY_RETURN_IF_ERROR(c.Get(&g.rank));
      FERRY_RETURN_IF_ERROR(c.Get(&n));
      FERRY_RETURN_IF_ERROR(c.GetBytes(&g.ids, n));
      FERRY_RETURN_IF_ERROR(c.Get(&n));
      FERRY_RETURN_IF_ERROR(c.GetBytes(&g.grads, n));
    }
    if (!taken.emplace(std::pair(id, chunk), std::move(unit)).second) {
      return DataLossError(where + ": the steps of table " + std::to_string(id) + " part " + std::to_string(chunk) +
                           " twice");
    }
  }
  uint64_t w = 0;
  FERRY_RETURN_IF_ERROR(c.Get(&w));
  if (w != static_cast<uint64_t>(num_workers)) {
    return DataLossError(where + ": the state of " + std::to_string(w) + " workers for a job of " +
                         std::to_string(num_workers));
  }
  workers->assign(static_cast<size_t>(w), {});
  for (WorkerState& ws : *workers) {
    uint8_t flags = 0;
    FERRY_RETURN_IF_ERROR(c.Get(&ws.clock));
    FERRY_RETURN_IF_ERROR(c.Get(&flags));
    if (ws.clock < 0 || ws.clock > kMaxStep || flags > 3) {
      return DataLossError(where + ": a worker's state out of range");
    }
    ws.finished = (flags & 1) != 0;
    ws.left = (flags & 2) != 0;
  }
  if (c.left() != 0) return DataLossError(where + ": " + std::to_string(c.left()) + " bytes after its last field");
  // Every unit held here has its steps in the image, and no other.
  Status missing;
  size_t found = 0;
  auto fill = [&](Table& t, int64_t chunk, int64_t floats, StepsTaken& s, SyncSlots& sync) {
    if (!missing.ok()) return;
    auto it = taken.find(std::pair(t.id, chunk));
    if (it == taken.end()) {
      missing = DataLossError(where + ": no steps for table '" + t.spec.name + "' " +
                              (chunk >= 0 ? "chunk " + std::to_string(chunk) : std::string("rows")));
      return;
    }
    ++found;
    s.taken = it->second.taken;
    s.floor = it->second.taken;  // a push the image holds, sent again, is a replay here
    missing = RestoreHeld(t, floats, it->second.held, num_workers, sync, where);
  };
  tables->ForEach([&](Table& t) {
    if (t.dense) {
      for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
        if (DenseChunk* ch = t.dense->chunk(i)) fill(t, i, ch->size, ch->steps_taken, ch->sync);
      }
    } else {
      fill(t, -1, 0, t.sparse->steps_taken, t.sparse->sync);
    }
  });
  FERRY_RETURN_IF_ERROR(missing);
  // Declared by the job already: the replacement takes no new settings the others would refuse.
  tables->ForEach([](Table& t) { t.settings_open = false; });
  if (found != taken.size()) {
    return DataLossError(where + ": steps of " + std::to_string(taken.size() - found) +
                         " part(s) this server does not hold (another server's image?)");
  }
  return Status::Ok();
}

namespace {

// One peer's image of server `whose`'s slots, page by page.
struct Fetched {
  std::vector<char> blob;
  uint32_t incarnation = 0;
  uint64_t covers = 0;
  int num_workers = 0;
};

StatusOr<Fetched> FetchImage(const ServerOptions& o, zmq::context_t& context, int peer, int whose,
                             const std::string& who) {
  const std::string& endpoint = o.peers[static_cast<size_t>(peer)];
  const std::string from = "server " + std::to_string(peer) + " (" + endpoint + ")";
  FERRY_ASSIGN_OR_RETURN(zmq::socket_t sock, transport::MakeSocket(context, zmq::socket_type::dealer));
  try {
    sock.set(zmq::sockopt::linger, 0);
    sock.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError(who + ": cannot connect to " + from + ": " + e.what());
  }
  const int64_t page = std::max<int64_t>(o.max_message_bytes / 2, 1 << 20);
  const auto began = Clock::now();
  auto deadline = began + o.failover_timeout;  // for each page: the peer may be slow, never silent
  Fetched out;
  uint64_t epoch = 0, total = 0, request_id = 0;
  int restarts = 0;
  auto next_say = began + std::chrono::seconds(5);
  while (true) {
    flatbuffers::FlatBufferBuilder fbb(256);
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(wire::Kind::Snapshot);
    b.add_request_id(++request_id);
    b.add_server_rank(whose);
    b.add_position(static_cast<int64_t>(out.blob.size()));
    b.add_epoch(epoch);
    b.add_max_bytes(page);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    transport::Frames req;
    req.push_back(wire::ToFrame(fbb));
    FERRY_RETURN_IF_ERROR(transport::Send(sock, req).WithContext(who + ": asking " + from + " for its image"));
    transport::Frames reply;
    while (true) {
      const auto now = Clock::now();
      if (now >= deadline) {
        return DeadlineExceededError(who + ": " + from + " sent no" + (out.blob.empty() ? "" : " more of its") +
                                     " image of server " + std::to_string(whose) + "'s slots within " +
                                     std::to_string(o.failover_timeout.count()) + " ms (--failover-timeout-s; " +
                                     std::to_string(out.blob.size()) + " bytes had come): is it running?");
      }
      if (now >= next_say) {
        next_say = now + std::chrono::seconds(5);
        std::fprintf(stderr, "%s: waiting for %s's image of server %d's slots (%lld of %s bytes so far)\n", who.c_str(),
                     from.c_str(), whose, static_cast<long long>(out.blob.size()),
                     total > 0 ? std::to_string(total).c_str() : "?");
      }
      zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
      const auto wait = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(500));
      if (zmq::poll(&item, 1, std::chrono::duration_cast<std::chrono::milliseconds>(wait)) <= 0) continue;
      FERRY_RETURN_IF_ERROR(transport::Recv(sock, &reply, 2).WithContext(who + ": reading " + from + "'s image"));
      break;
    }
    if (reply.empty()) return DataLossError(who + ": an empty message from " + from);
    const wire::Header* h = nullptr;
    FERRY_RETURN_IF_ERROR(wire::VerifyHeader(reply[0], &h).WithContext(who + ": " + from + "'s reply"));
    if (h->request_id() != request_id || h->request_kind() != wire::Kind::Snapshot) {
      return DataLossError(who + ": " + from + " answered another request");
    }
    if (h->kind() == wire::Kind::Error) {
      const Status refused = wire::ErrorStatus(*h);
      // The image went (another was asked for, or it expired): from the start, a few times.
      if (refused.code() == StatusCode::kFailedPrecondition && epoch != 0 && ++restarts <= 3) {
        std::fprintf(stderr, "%s: %s: asking %s again from the start\n", who.c_str(), refused.message().c_str(),
                     from.c_str());
        out = {};
        epoch = total = 0;
        deadline = Clock::now() + o.failover_timeout;
        continue;
      }
      return refused.WithContext(who + ": " + from + " refused its image of server " + std::to_string(whose) +
                                 "'s slots");
    }
    if (reply.size() != 2 || h->position() != static_cast<int64_t>(out.blob.size()) || h->version() <= 0 ||
        (total > 0 && (static_cast<uint64_t>(h->version()) != total || h->epoch() != epoch)) ||
        reply[1].size() > static_cast<uint64_t>(h->version()) - out.blob.size() ||
        (reply[1].size() == 0 && out.blob.size() < static_cast<uint64_t>(h->version()))) {
      return DataLossError(who + ": " + from + "'s page of its image does not follow the one before");
    }
    if (total == 0) {
      total = static_cast<uint64_t>(h->version());
      epoch = h->epoch();
      out.incarnation = h->incarnation();
      out.covers = h->covers();
      out.num_workers = static_cast<int>(h->num_workers());
    }
    const char* p = static_cast<const char*>(reply[1].data());
    out.blob.insert(out.blob.end(), p, p + reply[1].size());
    deadline = Clock::now() + o.failover_timeout;
    if (out.blob.size() == total) break;
  }
  std::fprintf(stderr, "%s: took server %d's slots from %s: %llu bytes in %.2f s\n", who.c_str(), whose, from.c_str(),
               static_cast<unsigned long long>(total),
               std::chrono::duration<double>(Clock::now() - began).count());
  return out;
}

}  // namespace

StatusOr<Recovered> Recover(const ServerOptions& o, zmq::context_t& context, TableRegistry* tables,
                            TableRegistry* replicas) {
  const std::string who = "ferry-ps rank " + std::to_string(o.rank) + " (--recover)";
  const int backup = (o.rank + 1) % o.num_servers;
  const int primary = (o.rank + o.num_servers - 1) % o.num_servers;
  Recovered r;
  // Its own slots first, from the backup's replica (which fences the dead one's late updates);
  // then the primary's, whose image answers the pushes that waited for the dead backup.
  auto workers_of = [&](const Fetched& f, int peer) -> Status {
    if (f.num_workers <= 0 || f.num_workers > 65536 || (o.num_workers > 0 && f.num_workers != o.num_workers) ||
        (r.num_workers > 0 && f.num_workers != r.num_workers)) {
      return FailedPreconditionError(who + ": server " + std::to_string(peer) + " knows a job of " +
                                     std::to_string(f.num_workers) + " workers" +
                                     (o.num_workers > 0 ? ", this one " + std::to_string(o.num_workers) : ""));
    }
    r.num_workers = f.num_workers;
    return Status::Ok();
  };
  // Each worker as the peers saw it: the highest clock either knew (a Clock the dead server had
  // taken reached them too, or is sent again to the replacement), finished or left at either.
  auto merge = [&](const std::vector<WorkerState>& seen) {
    if (r.workers.empty()) r.workers.resize(seen.size());
    for (size_t w = 0; w < seen.size() && w < r.workers.size(); ++w) {
      r.workers[w].clock = std::max(r.workers[w].clock, seen[w].clock);
      r.workers[w].finished = r.workers[w].finished || seen[w].finished;
      r.workers[w].left = r.workers[w].left || seen[w].left;
    }
  };
  FERRY_ASSIGN_OR_RETURN(Fetched own, FetchImage(o, context, backup, o.rank, who));
  FERRY_RETURN_IF_ERROR(workers_of(own, backup));
  try {
    std::vector<WorkerState> seen;
    FERRY_RETURN_IF_ERROR(RestoreImage(own.blob, o.rank, r.num_workers, tables,
                                       who + ": server " + std::to_string(backup) + "'s image of its slots", &seen));
    merge(seen);
    own.blob = {};
    FERRY_ASSIGN_OR_RETURN(Fetched theirs, FetchImage(o, context, primary, primary, who));
    FERRY_RETURN_IF_ERROR(workers_of(theirs, primary));
    FERRY_RETURN_IF_ERROR(RestoreImage(theirs.blob, primary, r.num_workers, replicas,
                                       who + ": server " + std::to_string(primary) + "'s image of its slots", &seen));
    merge(seen);
    r.primary_incarnation = theirs.incarnation;
    r.primary_covers = theirs.covers;
  } catch (const BudgetExceeded& e) {
    return ResourceExhaustedError(who + ": " + e.what());
  }
  r.incarnation = std::max(own.incarnation, own.incarnation + 1);  // (as the backup's fence: saturated)
  r.done = true;
  return r;
}

}  // namespace ferry::ps
