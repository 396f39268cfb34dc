// ps/server/internal/bind_endpoint.h — checks ferry-ps's --bind endpoint before ZeroMQ sees it.
// ZeroMQ reads a tcp port with strtoul and keeps the low 16 bits, so tcp://h:70000 would bind
// port 4464 and tcp://h:-1 port 65535, with no error; this refuses such endpoints instead. It
// binds an address or an interface, not a host name ("No such device" for tcp://localhost:P):
// localhost is taken for 127.0.0.1, and another name is refused saying what to write.
// Thread-safety: pure functions.
#pragma once

#include <arpa/inet.h>
#include <net/if.h>

#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::ps {

// OK for tcp://HOST:PORT (HOST: an IP address, [IPv6], an interface of this machine, '*' or
// localhost; PORT decimal in [0, 65535], or '*'; 0 and '*' pick a free port) and ipc://PATH (PATH non-empty). Otherwise
// InvalidArgument naming the endpoint and what is wrong with it.
// An IPv4 or [IPv6] literal, or the name of one of this machine's network interfaces (eth0).
inline bool IsAddressOrInterface(std::string_view host) {
  std::string h(host);
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  unsigned char buf[16];
  return inet_pton(AF_INET, h.c_str(), buf) == 1 || inet_pton(AF_INET6, h.c_str(), buf) == 1 ||
         if_nametoindex(h.c_str()) != 0;
}

inline Status CheckBindEndpoint(std::string_view endpoint) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError("--bind '" + std::string(endpoint) + "': " + std::string(why));
  };
  if (endpoint.starts_with("ipc://")) {
    if (endpoint.size() == 6) return bad("empty ipc path");
    return Status::Ok();
  }
  if (!endpoint.starts_with("tcp://")) return bad("want tcp://HOST:PORT or ipc://PATH");
  const std::string_view address = endpoint.substr(6);
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return bad("missing :PORT (want tcp://HOST:PORT)");
  const std::string_view host = address.substr(0, colon), port = address.substr(colon + 1);
  if (host.empty()) return bad("missing HOST (want tcp://HOST:PORT; '*' for all interfaces)");
  if (host != "*" && host != "localhost" && !IsAddressOrInterface(host)) {
    // Appended, not "'" + ...: GCC 12 warns falsely on that (-Wrestrict, GCC bug 105329).
    std::string why(1, '\'');
    why += host;
    why += "' is neither an IP address nor a network interface of this machine (ZeroMQ binds those, not host "
           "names): write tcp://0.0.0.0:PORT for every interface, tcp://127.0.0.1:PORT for this machine only, or "
           "the address of the interface to listen on";
    return bad(why);
  }
  if (port == "*") return Status::Ok();
  if (port.empty()) return bad("missing port number after ':'");
  long value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return bad("port '" + std::string(port) + "' is not a number in [0, 65535]");
    value = value * 10 + (c - '0');
    if (value > 65535) return bad("port " + std::string(port) + " is above 65535");
  }
  return Status::Ok();
}

// The endpoint to bind for a checked one: tcp://localhost:P becomes tcp://127.0.0.1:P.
inline std::string BindAddress(std::string_view endpoint) {
  constexpr std::string_view kLocalhost = "tcp://localhost:";
  if (endpoint.starts_with(kLocalhost)) return "tcp://127.0.0.1:" + std::string(endpoint.substr(kLocalhost.size()));
  return std::string(endpoint);
}

}  // namespace ferry::ps
