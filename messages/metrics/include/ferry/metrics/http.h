// ferry/metrics/http.h — a small HTTP endpoint (Debian's libmicrohttpd) that serves one page,
// GET /metrics, for a Prometheus scraper: the text a callback returns, or 503 when it returns none
// (the program did not answer in time). Anything else is 404. ferry-ps and ferry-trainer each run
// one (--metrics).
//
// Thread-safety: the callback runs on libmicrohttpd's threads (two), one request at a time each.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ferry/status.h"

namespace ferry::metrics {

class HttpEndpoint {
 public:
  using Render = std::function<std::optional<std::string>()>;

  // Bounds on clients: a connection silent this long is closed; the endpoint keeps at most
  // kConnections open, at most kPerAddress of them from one address (a Prometheus scraper needs
  // one). A slow client from many addresses can still fill kConnections: put the endpoint on
  // loopback or a trusted network (README, "Seeing the tables: metrics for Prometheus").
  static constexpr unsigned kIdleSeconds = 10;
  static constexpr unsigned kConnections = 256;
  static constexpr unsigned kPerAddress = 8;

  // Listens on `bind` ("PORT" or "HOST:PORT"; port 0 picks a free one). UNAVAILABLE naming
  // `bind` and the reason when it cannot.
  static StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& bind, Render render);
  ~HttpEndpoint();  // stops listening and waits for requests in flight
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const { return port_; }
  // http://HOST:PORT/metrics (HOST as bound; this machine's name for a bare port or 0.0.0.0).
  const std::string& url() const { return url_; }

 private:
  HttpEndpoint() = default;
  struct Context;
  std::unique_ptr<Context> ctx_;
  int port_ = 0;
  std::string url_;
};

}  // namespace ferry::metrics
