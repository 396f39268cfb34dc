// tests/support/raw_zmtp.h: a peer that speaks ZMTP 3.0 itself over a TCP socket, for tests of
// what no ZeroMQ socket would send: the frames of a multipart message that never ends.
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ferry::test {

using namespace std::chrono_literals;

// Reads exactly `n` bytes of `fd` within 10 s.
inline bool ReadExactly(int fd, char* out, size_t n) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  for (size_t got = 0; got < n;) {
    pollfd p{fd, POLLIN, 0};
    if (std::chrono::steady_clock::now() >= until) return false;
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t k = ::recv(fd, out + got, n - got, 0);
    if (k <= 0) return false;
    got += static_cast<size_t>(k);
  }
  return true;
}

// Connects to the server at `ep` (tcp://127.0.0.1:PORT) and shakes hands as a DEALER (NULL
// mechanism). Returns the socket once the server's greeting and READY are read; -1 on error.
inline int RawZmtp(const std::string& ep) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1))));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string greeting(64, '\0');  // signature, version 3.0, "NULL", as client
  greeting[0] = '\xff';
  greeting[9] = '\x7f';
  greeting[10] = 3;
  std::memcpy(&greeting[12], "NULL", 4);
  const std::string body = std::string("\x05READY\x0bSocket-Type", 18) + std::string("\0\0\0\x06", 4) + "DEALER";
  const std::string ready = std::string("\x04", 1) + static_cast<char>(body.size()) + body;  // a short command
  char theirs[64 + 2 + 255];
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::send(fd, greeting.data(), greeting.size(), MSG_NOSIGNAL) != 64 || !ReadExactly(fd, theirs, 64) ||
      ::send(fd, ready.data(), ready.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(ready.size()) ||
      !ReadExactly(fd, theirs + 64, 2) || theirs[64] != '\x04' ||
      !ReadExactly(fd, theirs + 66, static_cast<unsigned char>(theirs[65]))) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `bytes` more of a message on `fd` as frames of 64 KiB (`empty`: frames of no bytes, 2
// bytes each on the wire), none of them its last. The bytes sent: fewer where the server ended the
// connection (its FIN seen), or nothing could be sent for 30 s.
inline size_t SendUnfinished(int fd, size_t bytes, bool empty = false) {
  constexpr size_t kFrame = 64 << 10;
  std::string chunk(9 + kFrame, 'x');
  chunk[0] = '\x03';  // more frames follow; a long size (8 bytes, big-endian)
  for (int i = 0; i < 8; ++i) chunk[1 + i] = static_cast<char>((uint64_t{kFrame} >> (8 * (7 - i))) & 0xff);
  if (empty) {
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = i % 2 == 0 ? '\x01' : '\0';  // more; short size 0
    chunk.resize(kFrame);
  }
  size_t sent = 0;
  auto progress = std::chrono::steady_clock::now();
  while (sent < bytes && std::chrono::steady_clock::now() - progress < 30s) {
    pollfd p{fd, POLLOUT | POLLRDHUP, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (p.revents & (POLLRDHUP | POLLERR | POLLHUP)) break;
    const size_t at = sent % chunk.size();
    const ssize_t n = ::send(fd, chunk.data() + at, chunk.size() - at, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EINTR) break;
    if (n > 0) {
      sent += static_cast<size_t>(n);
      progress = std::chrono::steady_clock::now();
    }
  }
  return sent;
}

// Whether the server ends connection `fd` within `limit` (what it sends meanwhile, its greeting, is
// read and dropped).
inline bool EndedWithin(int fd, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

}  // namespace ferry::test
