// ps/server/internal/connections.h — the server's network connections as its ROUTER socket's
// monitor reports them (tcp:// and ipc://; inproc:// peers have none and are not tracked): how
// many are open, which worker rank each speaks for, and which must be closed.
//
//  - A cap: a connection accepted beyond `max_connections` makes room by closing the oldest
//    connection that has not sent a message yet (with CURVE: not finished its handshake, or a
//    peer without a key, which never can); only when every admitted connection has spoken is the
//    new one refused. A refused one is kept for a short grace (at most kMaxRefusing such at once)
//    so that its first request can be answered with the reason, then closed. So connections that
//    say nothing (a flood of bare TCP connections) cannot lock the job's workers out: a worker
//    speaks within milliseconds of connecting, and its client reconnects if it was closed first.
//  - Idle connections: one that speaks for no worker, has sent nothing for `idle_timeout` and has
//    no request waiting on this server is closed (a Ferry client reconnects by itself when it
//    next sends). A worker's connection is not: there is one per rank, they cannot pile up, and
//    a silent worker is the liveness check's business (ServerOptions::worker_timeout).
//  - One live connection per worker rank: a rank belongs to the connection it last spoke from. A
//    message for that rank from another connection is refused while the owner is open and has
//    been heard within `stale_after` (twice the worker's heartbeat promise); a closed or silent
//    owner hands the rank over, and so does any owner when a later incarnation of the worker
//    says Hello (its restarted process: Workers::CheckIncarnation then refuses the old one).
//    Without CURVE this is what stops a peer from speaking for a worker that is alive; with CURVE
//    the key already binds the rank.
//
// Connections are keyed by their file descriptor, as ZeroMQ gives it in the monitor's ACCEPTED
// and DISCONNECTED events and on every received frame (ZMQ_SRCFD). ZeroMQ reports a connection's
// ACCEPTED before any of its messages, so the caller reads the monitor dry before a message from
// a descriptor it does not Track, and before it refuses a claim (the owner may be reported gone
// by then). A message on a reused descriptor whose end and new start are still unread is taken
// for the old connection until they are read: that can only let a claim through, never refuse
// one.
//
// Thread-safety: none; the server's I/O thread owns it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ferry/status.h"

namespace ferry::ps {

class Connections {
 public:
  using Clock = std::chrono::steady_clock;

  // Connections refused for the cap that are kept, at once, to be told why; and for how long.
  static constexpr size_t kMaxRefusing = 64;
  static constexpr std::chrono::milliseconds kRefuseGrace{2000};

  // `max_connections` >= 1; `idle_timeout` 0: never closed for idleness.
  Connections(size_t max_connections, std::chrono::milliseconds idle_timeout)
      : max_(max_connections), idle_timeout_(idle_timeout) {}

  enum class Admit { kYes, kRefuseLater, kRefuseNow };
  // ACCEPTED: a new connection from `peer` (its address, for logs). kYes: admitted; at the cap,
  // `*evicted` is then the silent connection closed to make room (its fd and why, for the caller
  // to close and log; fd -1: none). kRefuseLater: over the cap, kept for kRefuseGrace to be told
  // why; kRefuseNow: over the cap and too many are being told already: close it at once.
  struct Evicted {
    int fd = -1;
    std::string why;
  };
  Admit Accepted(int fd, std::string peer, Clock::time_point now, Evicted* evicted);

  struct Closed {
    std::string peer;
    int rank = -1;  // the worker it spoke for, if any
    Clock::duration open_for{};
    bool refused = false;      // refused for the cap
    bool closed_here = false;  // this server closed it (Due)
  };
  // DISCONNECTED: the connection is gone; what it was (nullopt: not one this table knew).
  std::optional<Closed> Disconnected(int fd, Clock::time_point now);

  // A message from connection `fd` (ZMQ_SRCFD; < 0: inproc, untracked) with ZeroMQ routing id
  // `routing`. Returns a RESOURCE_EXHAUSTED status to answer it with if the connection was
  // refused for the cap; OK otherwise.
  Status Heard(int fd, std::string_view routing, Clock::time_point now);

  // Connection `fd` speaks for worker `rank`. Refused (ALREADY_EXISTS, saying which connection
  // has the rank) while another connection that is open owns it and was heard within
  // `stale_after` (0: for as long as it is open), unless `owner_closed(owner_fd)` says its peer
  // has closed it already (ZeroMQ has not reported it yet), or `take_over` (the Hello of a later
  // incarnation of the worker: its predecessor was replaced, alive or not). Otherwise the rank is
  // this one's.
  template <typename OwnerClosed>
  Status Claim(int fd, int rank, Clock::time_point now, std::chrono::milliseconds stale_after, bool take_over,
               OwnerClosed&& owner_closed);

  // The connections to close now, each with why (for the log): refused ones whose grace is over,
  // and idle ones that speak for no worker (`held(routing)` requests waiting on this server keep a
  // connection open). They
  // stay in the table until ZeroMQ reports them gone. O(connections): call it a few times a
  // second, not per message.
  struct ToClose {
    int fd;
    enum class Why { kRefused, kIdle, kUnfinished } reason;
    std::string why;
  };
  template <typename Held>
  std::vector<ToClose> Due(Clock::time_point now, Held&& held);

  // Bytes of messages ZeroMQ is still receiving, which no budget could charge otherwise: it hands
  // a message over whole, so every frame of a multipart message waits in its buffers until the
  // last one comes, and libzmq bounds a frame's size, not a message's. `taken_in(fd)` says how
  // many bytes ZeroMQ has read from the kernel on connection `fd` (TakenIn, a Taken; nullopt where
  // it cannot tell, as for ipc://): the low end counts what it holds, the high end is the base.
  // What it read since a check that found a new message of that connection handed over is held
  // in its buffers: a message not finished, or one finished that the I/O thread has not read yet.
  // The I/O thread reads what is finished before each check
  // (ZeroMQ takes its connections in turn), so what a connection held at the previous check and
  // still holds, no message of it handed over since, is a message not finished: that is what it
  // is judged by. The bytes read before the first check that found its previous message are not
  // counted, so a message is seen from then on, and never a finished one the server read since.
  // Returns the connections to close (Why::kUnfinished): each judged by more than
  // `per_connection` (unless `drained` says the I/O thread may have left finished messages unread:
  // then only connections of no worker), then, while the connections that speak for no worker and
  // no server are judged by more than `anonymous_total` together, the one of them judged by most.
  // `*held`: what all were judged by, and what came since the previous check (the next one comes
  // sooner while it is much). O(connections), three system calls each: call it a few times a second.
  struct Taken {
    uint64_t low = 0, high = 0;  // what ZeroMQ has read, bounded from below and above (TakenIn)
  };
  struct Holding {
    uint64_t judged = 0;   // what the connections were judged by
    uint64_t arrived = 0;  // what came since the previous check, no message handed over
  };
  template <typename TakenIn>
  std::vector<ToClose> Unfinished(Clock::time_point now, bool drained, uint64_t per_connection,
                                  uint64_t anonymous_total, TakenIn&& taken_in, Holding* held);
  // What the last Unfinished judged the connections that speak for no worker and no server by.
  uint64_t anonymous_held() const { return anonymous_held_; }
  // The connections that speak for no worker and no server that the last Unfinished judged by at
  // least `at_least`, to close (Why::kUnfinished), each with `cause` in its why: for a process short
  // of memory. ZeroMQ keeps a frame of up to 33 bytes in 64 (and a larger one in its size and
  // about 100), so what a connection holds in memory can be up to about 30 times the bytes it sent,
  // for a message of empty frames; Unfinished counts what was sent.
  std::vector<ToClose> AnonymousHolders(Clock::time_point now, uint64_t at_least, const std::string& cause);

  // A verified message of connection `fd` named protocol 1.`minor`, older than this server's
  // (the caller checks): the lowest a connection named is what its client can follow. Any message,
  // not the Hello alone: a client that reconnects after a drop sends no Hello again.
  void SawOldMinor(int fd, uint16_t minor) {
    if (fd < 0) return;
    if (auto it = conns_.find(fd); it != conns_.end() && (it->second.minor < 0 || minor < it->second.minor)) {
      it->second.minor = minor;
    }
  }
  // The peers (for a message) of the open connections that named a minor below `minor`.
  // In-process peers (inproc://) are not tracked.
  std::vector<std::string> PeersBelow(uint16_t minor) const;

  bool Tracks(int fd) const { return conns_.contains(fd); }
  // Connection `fd` is another server's (1.21: its primary's Replicates, a replacement's Snapshots,
  // taken): never closed for idleness, as a worker's is not (a primary may have nothing to
  // forward for minutes), and held to a message's bound alone (Unfinished). A server has one
  // primary, and a replacement of it or of its backup may ask for images: the connection marked
  // least recently loses the mark when a fourth is marked.
  static constexpr int kMaxServers = 3;
  void FromServer(int fd, Clock::time_point now);
  // Whether an open connection speaks for worker `rank` (it sent a request as that rank, and
  // ZeroMQ has not reported it gone).
  bool HasRank(int rank) const { return rank_owner_.contains(rank); }
  // Whether `fd` is tracked and has spoken with ZeroMQ routing id `routing`: a message of that
  // connection. False for one that has not spoken yet, and for a descriptor reused by a new
  // connection before the old one's DISCONNECTED was read.
  bool Knows(int fd, std::string_view routing) const {
    auto it = conns_.find(fd);
    return it != conns_.end() && it->second.spoke && it->second.routing == routing;
  }
  // The peer of connection `fd` as recorded when it was accepted, for logs.
  std::string PeerOf(int fd) const {
    if (fd < 0) return "an in-process peer";
    auto it = conns_.find(fd);
    return it == conns_.end() ? "an unknown connection" : it->second.peer;
  }
  size_t open() const { return conns_.size(); }
  size_t admitted() const { return conns_.size() - refusing_ - evicting_; }
  size_t max_connections() const { return max_; }

 private:
  struct Conn {
    std::string peer;
    std::string routing;
    Clock::time_point accepted, heard;
    int rank = -1;
    int minor = -1;  // the lowest older protocol minor its messages named (-1: none)
    bool refused = false;
    bool spoke = false;    // sent a message (Heard)
    bool evicted = false;  // closed to make room (Accepted): no longer admitted
    bool closing = false;  // handed out by Due or evicted: not handed out again
    bool server = false;   // another server of the job's (1.21: a primary forwarding to this backup)
    Clock::time_point server_since{};  // when FromServer last marked it
    // For Unfinished: messages heard; their count and TakenIn at the last check that found it
    // changed (0 at the start: the handshake's few bytes are counted); bytes held at the last
    // check, and what it is judged by (what it held at the check before, no message since).
    uint64_t messages = 0, messages_seen = 0, taken_at = 0, holding = 0, judged = 0;
    // Speaks for no worker and no server: idle ones are closed, and unfinished messages share a bound.
    bool anonymous() const { return rank < 0 && !server; }
  };
  // The connection that owns `rank`, if any.
  Conn* Owner(int rank, int* owner_fd);
  // The oldest admitted connection that has not spoken, taken off unheard_; -1 if none.
  int TakeOldestSilent();
  std::string Describe(const Conn& c, Clock::time_point now) const;
  // Why connection `c` is closed for what it holds of a message not finished (`c.judged`).
  std::string HoldingWhy(const Conn& c, Clock::time_point now, const std::string& why) const {
    return Describe(c, now) + ": ZeroMQ holds " + std::to_string(c.judged) +
           " bytes it received of a message not finished, " + why;
  }

  const size_t max_;
  const std::chrono::milliseconds idle_timeout_;
  absl::flat_hash_map<int, Conn> conns_;  // by descriptor
  absl::flat_hash_map<int, int> rank_owner_;  // rank -> descriptor
  size_t refusing_ = 0;  // conns_ with refused set
  size_t evicting_ = 0;  // conns_ with evicted set
  // Admitted connections in the order they came, while they may not have spoken: (fd, accepted).
  // Entries of connections that spoke, closed, or whose descriptor was reused are dropped when
  // met (and all of them once they outnumber the open connections twice).
  std::deque<std::pair<int, Clock::time_point>> unheard_;
  uint64_t anonymous_held_ = 0;  // Unfinished
};

// Socket helpers for the connections ZeroMQ owns (the descriptors it reports).
// The peer, for logs: "ADDRESS:PORT", or for ipc:// the local process.
std::string PeerName(int fd);
// Whether the peer has closed (or reset) the connection though ZeroMQ has not reported it yet: a
// worker restarted at once may say Hello before its old connection's end is seen.
bool PeerClosed(int fd);
// Closes the connection under ZeroMQ: its engine sees the end and reports DISCONNECTED.
void CloseConnection(int fd);
// The bytes ZeroMQ has read from the kernel on tcp connection `fd`: what the kernel received
// (TCP_INFO) less what waits in its receive queue (FIONREAD), the queue read before and after
// (ZeroMQ's thread reads, and bytes arrive, meanwhile): the low end less the larger, the high end
// less the smaller. nullopt for another kind of socket, or a kernel before 4.1.
std::optional<Connections::Taken> TakenIn(int fd);

// ---- templates ----------------------------------------------------------------------------

template <typename OwnerClosed>
Status Connections::Claim(int fd, int rank, Clock::time_point now, std::chrono::milliseconds stale_after,
                          bool take_over, OwnerClosed&& owner_closed) {
  auto self = conns_.find(fd);
  if (fd < 0 || self == conns_.end()) return Status::Ok();  // inproc, or not reported: untracked
  if (self->second.rank == rank) return Status::Ok();
  int owner_fd = -1;
  if (Conn* owner = Owner(rank, &owner_fd)) {
    const bool silent = stale_after.count() > 0 && now - owner->heard > stale_after;
    if (!take_over && !silent && !owner_closed(owner_fd)) {
      return AlreadyExistsError("worker " + std::to_string(rank) + " is connected already, " + Describe(*owner, now) +
                                "; a second connection for that rank is refused while the first is alive (two "
                                "processes started as worker " + std::to_string(rank) +
                                "? CURVE keys make a rank unforgeable)");
    }
    owner->rank = -1;
  }
  if (self->second.rank >= 0) rank_owner_.erase(self->second.rank);
  self->second.rank = rank;
  rank_owner_[rank] = fd;
  return Status::Ok();
}

template <typename Held>
std::vector<Connections::ToClose> Connections::Due(Clock::time_point now, Held&& held) {
  std::vector<ToClose> out;
  for (auto& [fd, c] : conns_) {
    if (c.closing) continue;
    if (c.refused) {
      if (now - c.accepted >= kRefuseGrace) {
        c.closing = true;
        out.push_back({fd, ToClose::Why::kRefused,
                       "refused (over the limit of " + std::to_string(max_) + " connections): " + Describe(c, now)});
      }
      continue;
    }
    if (idle_timeout_.count() > 0 && c.anonymous() && now - c.heard >= idle_timeout_ &&
        held(c.routing) == 0) {
      c.closing = true;
      out.push_back({fd, ToClose::Why::kIdle,
                     "idle for " + std::to_string(idle_timeout_.count()) + " ms: " + Describe(c, now)});
    }
  }
  return out;
}

template <typename TakenIn>
std::vector<Connections::ToClose> Connections::Unfinished(Clock::time_point now, bool drained,
                                                          uint64_t per_connection, uint64_t anonymous_total,
                                                          TakenIn&& taken_in, Holding* held) {
  std::vector<ToClose> out;
  auto close = [&](int fd, Conn& c, const std::string& why) {
    c.closing = true;
    out.push_back({fd, ToClose::Why::kUnfinished, HoldingWhy(c, now, why)});
  };
  uint64_t anonymous = 0;
  *held = {};
  for (auto& [fd, c] : conns_) {
    const uint64_t before = c.holding;
    c.holding = c.judged = 0;
    if (c.closing) continue;
    const std::optional<Taken> in = taken_in(fd);
    if (!in) continue;
    if (c.messages != c.messages_seen || in->high < c.taken_at) {  // a message, or a new connection
      c.messages_seen = c.messages;
      c.taken_at = in->high;
      continue;
    }
    c.holding = in->low > c.taken_at ? in->low - c.taken_at : 0;
    c.judged = std::min(before, c.holding);
    held->judged += c.judged;
    held->arrived += c.holding - c.judged;
    // Not drained, a worker's or server's finished messages may wait unread (ZeroMQ gives each
    // connection one in turn): only a connection of no worker is held to the bound then.
    if (c.judged > per_connection && (drained || c.anonymous())) {
      close(fd, c,
            "more than the " + std::to_string(per_connection) +
                " a message may have (twice ferry-ps --max-message-mb, as a primary's Replicate, and framing)");
    } else if (c.anonymous()) {
      anonymous += c.judged;
    }
  }
  while (anonymous > anonymous_total) {
    Conn* top = nullptr;
    int top_fd = -1;
    for (auto& [fd, c] : conns_) {
      if (!c.closing && c.anonymous() && c.judged > 0 && (!top || c.judged > top->judged)) {
        top = &c;
        top_fd = fd;
      }
    }
    if (!top) break;
    close(top_fd, *top,
          "the most of the connections that speak for no worker, which hold " + std::to_string(anonymous) +
              " together, more than their bound of " + std::to_string(anonymous_total) +
              " (the bound on held payloads, a quarter of the tables' memory budget, or one message's bound where "
              "that is more)");
    anonymous -= top->judged;
  }
  anonymous_held_ = anonymous;
  return out;
}

}  // namespace ferry::ps
