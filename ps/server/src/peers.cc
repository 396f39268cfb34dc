// Who may speak to the server: CURVE keys (the ZAP handler), the connections ZeroMQ reports
// (admitted up to max_connections, closed when idle), and which connection speaks for a worker.
#include "internal/server_impl.h"

#include <algorithm>
#include <cstdio>

namespace ferry::ps {

void ServerImpl::OnZapRequest(Frames& frames) {
  auto text = [&](size_t i) { return i < frames.size() ? frames[i].to_string() : std::string(); };
  std::string code = "400", status = "not one of this job's worker or reader keys", user;
  int rank = -1, reader = -1;
  if (frames.size() >= 7 && text(5) == "CURVE") {
    if (auto it = worker_keys_.find(text(6)); it != worker_keys_.end()) rank = it->second;
    if (auto it = reader_keys_.find(text(6)); it != reader_keys_.end()) reader = it->second;
  }
  if (rank >= 0) {
    code = "200", status = "OK", user = std::to_string(rank);
  } else if (reader >= 0) {
    code = "200", status = "OK", user = "reader-" + std::to_string(reader);  // KeyRank: -2 - reader
  } else {
    Count(kCurveRefused);
    const std::string key = frames.size() >= 7 ? curve::Encode(text(6)) : std::string();
    LogRateLimited("refused a connection from " + text(3) + ": its CURVE key " +
                   (key.empty() ? std::string("(none)") : key) + " is not one of this job's workers'");
  }
  Frames reply;
  for (const std::string& f : {std::string("1.0"), text(1), code, status, user, std::string()}) {
    reply.emplace_back(f.data(), f.size());
  }
  transport::Send(sockets_[kZap], reply).IgnoreError();
}

Status ServerImpl::ClaimRank(const Request& req, int rank, bool take_over) {
  const auto stale_after = 2 * workers_.promised(rank);
  auto claim = [&] { return connections_.Claim(req.fd, rank, req.arrived, stale_after, take_over, ps::PeerClosed); };
  Status s = claim();
  if (!s.ok()) {
    // Before refusing: what ZeroMQ has reported since (the owner may be gone already).
    DrainMonitor();
    s = claim();
  }
  if (!s.ok()) {
    Count(kRankConflicts);
    LogRateLimited("refused a request for worker " + std::to_string(rank) + ": " + s.message());
  }
  return s;
}

Status ServerImpl::CheckIncarnation(const Request& req, int rank) {
  Status s = workers_.CheckIncarnation(rank, req.h()->incarnation());
  if (!s.ok()) {
    Count(kRankConflicts);
    LogRateLimited("refused a " + std::string(wire::KindName(req.h()->kind())) + " from " +
                   connections_.PeerOf(req.fd) + ": " + s.message());
  }
  return s;
}

void ServerImpl::DrainMonitor() {
  Frames frames;
  while (true) {
    frames.clear();
    bool got = false, truncated = false;
    if (!transport::RecvNonBlocking(sockets_[kMonitor], &frames, &got, 4, &truncated).ok() || !got) return;
    OnMonitorEvent(frames);
  }
}

void ServerImpl::OnMonitorEvent(Frames& frames) {
  const auto e = transport::ReadMonitorEvent(frames);
  if (!e) return;
  const int fd = static_cast<int>(e->value);
  const auto now = Clock::now();
  if (e->event == ZMQ_EVENT_ACCEPTED) {
    std::string peer = ps::PeerName(fd);
    ps::Connections::Evicted evicted;
    const auto admit = connections_.Accepted(fd, peer, now, &evicted);
    if (evicted.fd >= 0) {
      Count(kConnectionsIdleClosed);
      LogRateLimited("closing a connection: " + evicted.why);
      ps::CloseConnection(evicted.fd);
    }
    if (admit != ps::Connections::Admit::kYes) {
      Count(kConnectionsRefused);
      LogRateLimited("refused a connection from " + peer + ": " + std::to_string(connections_.admitted()) +
                     " are open, the limit (--max-connections " + std::to_string(connections_.max_connections()) + ")" +
                     (admit == ps::Connections::Admit::kRefuseNow ? "; closed" : "; its first request is told so"));
      if (admit == ps::Connections::Admit::kRefuseNow) ps::CloseConnection(fd);
    }
  } else if (e->event == ZMQ_EVENT_DISCONNECTED) {
    auto gone = connections_.Disconnected(fd, now);
    // One this server closed (an unfinished message's, say) has had what ZeroMQ held of it freed.
    if (gone && gone->closed_here) TrimSoon(now);
    // Lost connections are logged, but not the expected ones: a finished worker's, and those
    // this server refused or closed itself (logged when it did).
    if (gone && !gone->refused && !gone->closed_here && !stopping_.load() && !workers_.finished(gone->rank)) {
      char open_for[32];
      std::snprintf(open_for, sizeof open_for, "%.1f s", std::chrono::duration<double>(gone->open_for).count());
      LogRateLimited(
          (gone->rank >= 0 ? "worker " + std::to_string(gone->rank) + "'s connection" : std::string("a connection")) +
          " from " + gone->peer + " closed after " + open_for +
          (gone->rank >= 0 ? " before the worker finished (killed, or cut off?)" : ""));
    }
  }
  connections_open_.store(static_cast<int64_t>(connections_.open()), std::memory_order_relaxed);
}

std::optional<Clock::time_point> ServerImpl::NextConnectionCheck() const {
  if (connections_.open() == 0) return std::nullopt;
  // Sooner while much of messages not finished came since the last check (CheckUnfinished).
  return last_connection_check_ + std::chrono::milliseconds(unfinished_arriving_ ? 50 : 250);
}

void ServerImpl::CheckConnections() {
  const auto now = Clock::now();
  const auto next = NextConnectionCheck();
  if (!next || now < *next) return;
  last_connection_check_ = now;
  DrainMonitor();
  for (const auto& c : connections_.Due(now, [&](std::string_view routing) { return peer_load_.held(routing); })) {
    if (c.reason == ps::Connections::ToClose::Why::kIdle) Count(kConnectionsIdleClosed);
    LogRateLimited("closing a connection " + c.why);
    ps::CloseConnection(c.fd);
  }
  CheckUnfinished(now);
}

void ServerImpl::CheckUnfinished(Clock::time_point now) {
  // Judged only once the I/O thread has read every finished message (Connections::Unfinished's
  // premise; the loop reads at most EventLoop::kBatch of a socket's at a time), or a second on
  // regardless (a server always behind its messages).
  int events = 0;
  size_t size = sizeof events;
  const bool drained = zmq_getsockopt(sockets_[kMain].handle(), ZMQ_EVENTS, &events, &size) == 0 &&
                       (events & ZMQ_POLLIN) == 0;
  if (!drained && now - last_unfinished_check_ < std::chrono::seconds(1)) return;
  last_unfinished_check_ = now;
  // What ZeroMQ holds of messages it is still receiving: no connection more than the largest
  // message (a primary's Replicate, twice the limit), and the connections that speak for no
  // worker (or server) the bound on held payloads together, or one such message if that is more.
  const uint64_t message = 2 * static_cast<uint64_t>(options_.max_message_bytes) + kFramingAllowance;
  const uint64_t anonymous = std::max<uint64_t>(message, static_cast<uint64_t>(held_payloads_.limit()));
  ps::Connections::Holding held;
  auto to_close = connections_.Unfinished(now, drained, message, anonymous, ps::TakenIn, &held);
  // Their bytes count what was sent; in memory, a message of many small frames weighs up to about
  // 30 times that. So where they hold a message's bytes while the heap's memory no budget covers
  // is past their bound and kMemorySlack, they are all closed.
  if (connections_.anonymous_held() >= kHoldingSome) {
    const int64_t in_use = transport::HeapInUseBytes();
    const int64_t accounted = heap_base_ + TablesUsed() + held_payloads_.used() +
                              (image_ ? static_cast<int64_t>(image_->blob.size()) : 0);
    if (in_use - accounted > static_cast<int64_t>(anonymous + kMemorySlack)) {
      char cause[192];
      std::snprintf(cause, sizeof cause,
                    "this server's heap is %.0f MiB past what it had at its start, its tables, held payloads and "
                    "image, more than %.0f MiB",
                    static_cast<double>(in_use - accounted) / (1 << 20),
                    static_cast<double>(anonymous + kMemorySlack) / (1 << 20));
      auto more = connections_.AnonymousHolders(now, kHoldingSome, cause);
      to_close.insert(to_close.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    }
  }
  for (const auto& c : to_close) {
    Count(kConnectionsUnfinishedClosed);
    LogRateLimited("closing a connection " + c.why);
    ps::CloseConnection(c.fd);
    TrimSoon(now);  // give back the memory its frames took
  }
  unfinished_bytes_.store(static_cast<int64_t>(held.judged), std::memory_order_relaxed);
  unfinished_arriving_ = held.arrived >= kArrivingMuch;
}

int64_t ServerImpl::TablesUsed() const {
  return tables_.budget().used() + (replicas_ ? replicas_->budget().used() : 0);
}

void ServerImpl::NoteRefused(int64_t bytes, bool truncated, Clock::time_point now) {
  if (truncated || bytes >= (int64_t{1} << 20)) TrimSoon(now);
}

void ServerImpl::TrimSoon(Clock::time_point now) {
  if (next_heap_check_) return;
  // A second on, once the memory is freed; 5 s after the last trim at the earliest.
  next_heap_check_ = std::max(now + std::chrono::seconds(1), last_heap_trim_ + std::chrono::seconds(5));
}

void ServerImpl::CheckHeap(Clock::time_point now) {
  if (!next_heap_check_ || now < *next_heap_check_) return;
  next_heap_check_.reset();
  last_heap_trim_ = now;
  if (const int64_t returned = transport::GiveFreeMemoryBack(); returned >= (int64_t{16} << 20)) {
    LogRateLimited("gave " + std::to_string(returned >> 20) +
                   " MiB of freed memory back to the system (large messages were refused)");
  }
}

}  // namespace ferry::ps
