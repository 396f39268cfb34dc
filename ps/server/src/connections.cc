#include "internal/connections.h"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>

#include <arpa/inet.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>

namespace ferry::ps {

Connections::Admit Connections::Accepted(int fd, std::string peer, Clock::time_point now, Evicted* evicted) {
  // A descriptor still in the table was closed without a DISCONNECTED we saw (ZeroMQ reports
  // every engine that ends; this is a guard): the new connection replaces it.
  Disconnected(fd, now);
  evicted->fd = -1;
  Conn c;
  c.peer = std::move(peer);
  c.accepted = c.heard = now;
  Admit verdict = Admit::kYes;
  if (admitted() >= max_) {
    if (const int victim = TakeOldestSilent(); victim >= 0) {
      Conn& v = conns_.at(victim);
      v.evicted = v.closing = true;
      ++evicting_;
      evicted->fd = victim;
      evicted->why = Describe(v, now) + " that has sent nothing, to make room for a new one (the limit: " +
                     "--max-connections " + std::to_string(max_) + ")";
    } else if (refusing_ >= kMaxRefusing) {
      verdict = Admit::kRefuseNow;
      c.closing = true;
    } else {
      verdict = Admit::kRefuseLater;
    }
    if (verdict != Admit::kYes) {
      c.refused = true;
      ++refusing_;
    }
  }
  if (verdict == Admit::kYes) {
    if (unheard_.size() >= 2 * conns_.size() + 64) {
      std::erase_if(unheard_, [&](const auto& e) {
        auto it = conns_.find(e.first);
        return it == conns_.end() || it->second.accepted != e.second || it->second.spoke || it->second.closing;
      });
    }
    unheard_.emplace_back(fd, now);
  }
  conns_.emplace(fd, std::move(c));
  return verdict;
}

int Connections::TakeOldestSilent() {
  while (!unheard_.empty()) {
    const auto [fd, accepted] = unheard_.front();
    unheard_.pop_front();
    auto it = conns_.find(fd);
    if (it != conns_.end() && it->second.accepted == accepted && !it->second.spoke && !it->second.closing &&
        !it->second.refused) {
      return fd;
    }
  }
  return -1;
}

std::optional<Connections::Closed> Connections::Disconnected(int fd, Clock::time_point now) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return std::nullopt;
  const Conn& c = it->second;
  Closed out{c.peer, c.rank, now - c.accepted, c.refused, c.closing};
  if (c.rank >= 0) {
    if (auto o = rank_owner_.find(c.rank); o != rank_owner_.end() && o->second == fd) rank_owner_.erase(o);
  }
  if (c.refused) --refusing_;
  if (c.evicted) --evicting_;
  conns_.erase(it);
  return out;
}

Status Connections::Heard(int fd, std::string_view routing, Clock::time_point now) {
  if (fd < 0) return Status::Ok();
  auto it = conns_.find(fd);
  if (it == conns_.end()) return Status::Ok();
  Conn& c = it->second;
  c.heard = now;
  c.spoke = true;
  ++c.messages;
  if (c.routing != routing) c.routing.assign(routing.data(), routing.size());
  if (!c.refused) return Status::Ok();
  return ResourceExhaustedError("this server has " + std::to_string(admitted()) +
                                " connections open, its limit (ferry-ps --max-connections " + std::to_string(max_) +
                                "): this connection is refused and will be closed; are stray clients holding "
                                "connections open?");
}

void Connections::FromServer(int fd, Clock::time_point now) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  it->second.server_since = now;
  if (it->second.server) return;
  it->second.server = true;
  int marked = 0;
  Conn* least = nullptr;
  for (auto& [other, c] : conns_) {
    if (!c.server) continue;
    ++marked;
    if (!least || c.server_since < least->server_since) least = &c;
  }
  if (marked > kMaxServers) least->server = false;
}

std::vector<Connections::ToClose> Connections::AnonymousHolders(Clock::time_point now, uint64_t at_least,
                                                                const std::string& cause) {
  std::vector<ToClose> out;
  for (auto& [fd, c] : conns_) {
    if (c.closing || !c.anonymous() || c.judged < at_least) continue;
    c.closing = true;
    anonymous_held_ -= std::min(anonymous_held_, c.judged);
    out.push_back({fd, ToClose::Why::kUnfinished, HoldingWhy(c, now, "and " + cause)});
  }
  return out;
}

std::vector<std::string> Connections::PeersBelow(uint16_t minor) const {
  std::vector<std::string> peers;
  for (const auto& [fd, c] : conns_) {
    if (c.minor >= 0 && c.minor < minor) peers.push_back(c.peer + " (1." + std::to_string(c.minor) + ")");
  }
  return peers;
}

Connections::Conn* Connections::Owner(int rank, int* owner_fd) {
  auto it = rank_owner_.find(rank);
  if (it == rank_owner_.end()) return nullptr;
  auto c = conns_.find(it->second);
  if (c == conns_.end() || c->second.rank != rank) {
    rank_owner_.erase(it);
    return nullptr;
  }
  *owner_fd = it->second;
  return &c->second;
}

std::string PeerName(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "? (gone)";
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
    std::string out = "[";  // appended, not "[" + ...: GCC 12 warns falsely (-Wrestrict) on that
    out.append(host).append("]:").append(std::to_string(ntohs(in->sin6_port)));
    return out;
  }
  if (addr.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t clen = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0) {
      return "process " + std::to_string(cred.pid) + " (uid " + std::to_string(cred.uid) + ")";
    }
    return "a local process";
  }
  return "?";
}

bool PeerClosed(int fd) {
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void CloseConnection(int fd) { ::shutdown(fd, SHUT_RDWR); }

std::optional<Connections::Taken> TakenIn(int fd) {
  int before = 0, after = 0;
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::ioctl(fd, FIONREAD, &before) != 0 || ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received ||
      ::ioctl(fd, FIONREAD, &after) != 0 || before < 0 || after < 0) {
    return std::nullopt;
  }
  const uint64_t received = info.tcpi_bytes_received;
  auto less = [&](int queued) {
    return received >= static_cast<uint64_t>(queued) ? received - static_cast<uint64_t>(queued) : 0;
  };
  return Connections::Taken{less(std::max(before, after)), less(std::min(before, after))};
}

std::string Connections::Describe(const Conn& c, Clock::time_point now) const {
  char buf[96];
  std::snprintf(buf, sizeof buf, " (open %.1f s, heard %.1f s ago)",
                std::chrono::duration<double>(now - c.accepted).count(),
                std::chrono::duration<double>(now - c.heard).count());
  return "from " + c.peer + buf;
}

}  // namespace ferry::ps
