// ps/server/internal/bind_endpoint.h — checks ferry-ps's --bind endpoint before ZeroMQ sees it.
// ZeroMQ reads a tcp port with strtoul and keeps the low 16 bits, so tcp://h:70000 would bind
// port 4464 and tcp://h:-1 port 65535, with no error; this refuses such endpoints instead.
// Thread-safety: a pure function.
#pragma once

#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::ps {

// OK for tcp://HOST:PORT (HOST non-empty: an address, an interface, '*' or [IPv6]; PORT decimal
// in [0, 65535], or '*'; 0 and '*' pick a free port) and ipc://PATH (PATH non-empty). Otherwise
// InvalidArgument naming the endpoint and what is wrong with it.
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

}  // namespace ferry::ps
