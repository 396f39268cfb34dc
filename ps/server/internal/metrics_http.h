// ps/server/internal/metrics_http.h — a small HTTP endpoint (Debian's civetweb) that serves one
// page, GET /metrics, for a Prometheus scraper: the text a callback returns, or 503 when it
// returns none (the server did not answer in time). Anything else is 404.
//
// Thread-safety: the callback runs on civetweb's threads (two), one request at a time each.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ferry/status.h"

namespace ferry::ps {

class MetricsHttp {
 public:
  using Page = std::function<std::optional<std::string>()>;

  // Listens on `bind` ("PORT" or "HOST:PORT"; port 0 picks a free one). UNAVAILABLE naming
  // `bind` and civetweb's reason when it cannot.
  static StatusOr<std::unique_ptr<MetricsHttp>> Start(const std::string& bind, Page page);
  ~MetricsHttp();  // stops listening and waits for requests in flight
  MetricsHttp(const MetricsHttp&) = delete;
  MetricsHttp& operator=(const MetricsHttp&) = delete;

  int port() const { return port_; }
  // http://HOST:PORT/metrics (HOST as bound; this machine's name for a bare port or 0.0.0.0).
  const std::string& url() const { return url_; }

 private:
  MetricsHttp() = default;
  struct Context;
  std::unique_ptr<Context> ctx_;
  int port_ = 0;
  std::string url_;
};

}  // namespace ferry::ps
